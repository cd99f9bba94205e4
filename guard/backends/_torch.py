"""The torch reference backend: the member's own transformers model, teacher-forced.

The reference against which every exported graph is checked. It runs one forward pass per
continuation row of the :class:`~spotstop.guard._prompt.ScorePlan` (usually one) over
``prompt + answer context``, right-padded: every layer type of both architectures is causal,
so padding after a sequence cannot change its scores, and a scene's score does not depend
on its batch-mates. Only the needed positions of the last hidden state go through the
output layer, and at the shared first position only the answers' rows of it. The rule runs in
float32 whatever the model's dtype; a bf16 or fp16 output layer is turned into float32 only
where it is read (the answers' rows; for a later answer token the vocabulary, a chunk of rows
at a time, one pass for every later token of the batch), never as a whole copy: that copy was
2 GiB for Qwen3.5-2B (peak RSS of a bf16 scene on CPU 6.55 GiB before, 4.73 GiB after).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from spotstop.guard._errors import MemberLoadError, ScoringError
from spotstop.guard._hf import MemberFolder
from spotstop.guard._prompt import ScorePlan

__all__ = ["TorchBackend"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchBackend:
    """Scores with ``AutoModelForImageTextToText`` on ``device`` in ``dtype``."""

    name = "torch"

    def __init__(
        self,
        folder: MemberFolder,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> None:
        from transformers import AutoModelForImageTextToText

        if dtype not in _DTYPES:
            raise MemberLoadError(f"dtype must be one of {sorted(_DTYPES)}; got {dtype!r}.")
        self.folder = folder
        self.device = torch.device(device)
        if threads is not None:  # torch's intra-op pool is process-wide: the last setting wins
            torch.set_num_threads(threads)
        try:
            model: Any = AutoModelForImageTextToText.from_pretrained(
                str(folder.path), dtype=_DTYPES[dtype], revision=folder.revision
            )
        except Exception as e:  # surface any loading failure with the folder named
            raise MemberLoadError(
                f"transformers could not load the member at {folder.path}: {type(e).__name__}: {e}"
            ) from e
        self.model: Any = model.to(self.device).eval()
        head = self.model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise MemberLoadError("members with an output-layer bias are not supported.")
        self._head_weight = head.weight
        self.model_type = folder.model_type

    # -- inputs ----------------------------------------------------------------------------
    def _vision_inputs(self, pixels: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
        """The images' preprocessed inputs stacked along their leading axis; pixels (the float
        arrays) in the model's dtype, the grid descriptions as they are."""
        out: dict[str, Any] = {}
        for key in pixels[0]:
            t = torch.from_numpy(np.concatenate([p[key] for p in pixels]))
            dtype = self._head_weight.dtype if t.is_floating_point() else None
            out[key] = t.to(self.device, dtype)
        return out

    def hidden_states(
        self,
        sequences: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
    ) -> torch.Tensor:
        """Last hidden states (float32, right-padded) of a batch of token sequences."""
        n = len(sequences)
        length = max(len(s) for s in sequences)
        ids = torch.zeros((n, length), dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[i, : len(s)] = 1
        kwargs: dict[str, Any] = {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
        }
        if pixels is not None:
            kwargs.update(self._vision_inputs(pixels))
        extra = self.folder.arch.text_inputs(
            ids.numpy(), self.folder.image_token_id, with_image=pixels is not None
        )
        kwargs.update({k: torch.from_numpy(v).to(self.device) for k, v in extra.items()})
        out = self.model.model(**kwargs, use_cache=False)
        return out.last_hidden_state.float()

    # -- the score -------------------------------------------------------------------------
    @torch.inference_mode()
    def score(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> np.ndarray:
        try:
            scores = self.score_tensor(prompts, pixels, plan)
        except Exception as e:  # a forward-pass failure is a scoring failure, with its cause
            raise ScoringError(
                f"{self.model_type} forward pass failed: {type(e).__name__}: {e}"
            ) from e
        return scores.double().numpy()

    def score_tensor(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> torch.Tensor:
        """The scores ``s = log p(UNSAFE) − log p(SAFE)`` as a float32 tensor, one per prompt.

        Differentiable when called outside :func:`torch.inference_mode` (the trained test pair
        is trained through it, so training and scoring share one rule); :meth:`score` is this
        under inference mode.
        """
        return self.scores_from_hidden(
            self.plan_hidden_states(prompts, pixels, plan), prompts, plan
        )

    def plan_hidden_states(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> torch.Tensor:
        """Last hidden states of every ``prompt + row`` of ``plan`` (prompt-major order)."""
        sequences = [list(p) + list(row) for p in prompts for row in plan.rows]
        seq_pixels = None if pixels is None else [px for px in pixels for _ in plan.rows]
        return self.hidden_states(sequences, seq_pixels)

    def scores_from_hidden(
        self, hidden: torch.Tensor, prompts: Sequence[Sequence[int]], plan: ScorePlan
    ) -> torch.Tensor:
        """The scores read from :meth:`plan_hidden_states`' output (the scoring rule)."""
        n_rows = len(plan.rows)
        w = self._head_weight
        first_idx = {t: k for k, t in enumerate(plan.first_ids)}
        w_first = w[list(plan.first_ids)].float()  # only the answers' rows at the shared position
        last = torch.stack([hidden[i * n_rows, len(p) - 1] for i, p in enumerate(prompts)])
        first = last @ w_first.T  # (prompts, answers' first tokens)
        scores = first[:, first_idx[plan.unsafe_ids[0]]] - first[:, first_idx[plan.safe_ids[0]]]
        # later answer tokens: every read of every prompt in ONE pass over the output layer
        reads = [
            (i, sign, i * n_rows + r, len(p) - 1 + j, tok)
            for i, p in enumerate(prompts)
            for sign, answer in ((1.0, plan.unsafe_ids), (-1.0, plan.safe_ids))
            for r, j, tok in plan.continuation_reads(answer)
        ]
        if reads:
            hs = torch.stack([hidden[row, pos] for _, _, row, pos, _ in reads])
            logp = torch.log_softmax(_logits(hs, w), dim=-1)
            picked = logp[torch.arange(len(reads)), torch.tensor([t for *_, t in reads])]
            signs = torch.tensor([s for _, s, *_ in reads], dtype=picked.dtype)
            owner = torch.tensor([i for i, *_ in reads], device=picked.device)
            scores = scores.index_add(0, owner, (signs.to(picked.device) * picked))
        return scores.cpu()


#: output-layer rows turned to float32 at a time for a continuation read (64 MiB at width 2048)
_HEAD_CHUNK = 8192


def _logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h @ w.T`` in float32 (``h`` float32 (..., D), ``w`` the output layer (V, D) in the
    model's dtype), its rows turned to float32 a chunk at a time: the same values as
    ``h @ w.float().T`` without a float32 copy of the whole layer (2 GiB for Qwen3.5-2B's
    248K x 2048 in bf16)."""
    if w.dtype == torch.float32:
        return h @ w.T
    return torch.cat(
        [h @ w[k : k + _HEAD_CHUNK].float().T for k in range(0, w.shape[0], _HEAD_CHUNK)],
        dim=-1,
    )
