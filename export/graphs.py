"""Scoring graphs: a member's transformers model cut into what the score needs, as torch modules.

Two graphs per member, no KV cache, no generation:

``vision``
    one image's preprocessed pixels at the member's FIXED grid (exactly what
    :meth:`spotstop.guard._arch.ArchSpec.preprocess` returns, without the grid tensors, which are
    constants of the graph) → ``image_embeds`` (1, n_image_tokens, hidden): the visual tokens
    as the decoder sees them (after the Qwen merger / the LFM2-VL pixel-unshuffle projector).

``decoder``
    ``input_ids`` (B, L), right-padded to a length bucket (every layer type is causal, so the
    padding after a sequence cannot change its outputs); ``image_embeds`` (B, N, hidden),
    scattered into the image-token positions in order (ignored where a row has no image token:
    the request-only pass); ``last_index`` (B,), the last prompt position; ``read_index`` and
    ``read_token`` (B, K), continuation positions and the answer token read at each.
    Outputs ``first_logits`` (B, F): the output layer's rows of the answers' first tokens at
    ``last_index`` (the shared normaliser cancels in the score, so only these rows are
    computed), and ``read_logprob`` (B, K): the full log-softmax at ``read_index`` taken at
    ``read_token``. The backend turns these into ``s = log p(UNSAFE) − log p(SAFE)`` with the
    member's :class:`spotstop.guard._prompt.ScorePlan`. With tied word embeddings the output layer IS
    the embedding table (the same parameter); the exported graph keeps one copy of it
    (:func:`spotstop.export.onnx.tie_output_layer`). The first-token rows are a separate small buffer.

Qwen3.5's M-RoPE positions (text, then the image's (t, h, w) grid, then text again offset by
the grid's longest side) are computed inside the decoder graph from ``input_ids`` for the
fixed grid, so both graphs of both architectures take the same inputs and the runtime needs no
architecture-specific code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

__all__ = ["DecoderGraph", "VisionGraph", "build_graphs"]


class VisionGraph(nn.Module):
    """One image → its visual tokens, at a fixed grid (the grid tensors are constants)."""

    def __init__(self, model: Any, model_type: str, pixels: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.inner = model.model
        self.model_type = model_type
        if model_type == "qwen3_5":
            self.register_buffer("grid_thw", torch.from_numpy(pixels["image_grid_thw"]).long())
        else:
            self.register_buffer(
                "pixel_attention_mask", torch.from_numpy(pixels["pixel_attention_mask"]).long()
            )
            self.register_buffer(
                "spatial_shapes", torch.from_numpy(pixels["spatial_shapes"]).long()
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.model_type == "qwen3_5":
            out = self.inner.get_image_features(pixel_values, self.grid_thw, return_dict=True)
        else:
            out = self.inner.get_image_features(
                pixel_values=pixel_values,
                spatial_shapes=self.spatial_shapes,
                pixel_attention_mask=self.pixel_attention_mask,
                return_dict=True,
            )
        return out.pooler_output[0].unsqueeze(0)


class DecoderGraph(nn.Module):
    """Token ids (+ visual tokens) → the answer logits and log-probabilities the score reads."""

    def __init__(
        self,
        model: Any,
        model_type: str,
        *,
        image_token_id: int,
        first_ids: Sequence[int],
        llm_grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.model_type = model_type
        self.image_token_id = int(image_token_id)
        self.embed = model.get_input_embeddings()
        self.language_model = model.model.language_model
        head = model.get_output_embeddings().weight
        self.head = head
        # The output layer sliced to the answers' first tokens: the only rows read at the
        # last prompt position.
        self.register_buffer("w_first", head.detach()[list(first_ids)].clone())
        self.llm_grid = llm_grid  # (h, w) visual-token grid of Qwen's M-RoPE

    def _positions(self, input_ids: torch.Tensor, is_img: torch.Tensor) -> torch.Tensor:
        """Qwen3.5 M-RoPE (3, B, L) positions for at most one image of the fixed grid."""
        assert self.llm_grid is not None
        gh, gw = self.llm_grid
        b, length = input_ids.shape
        idx = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(b, length)
        count = torch.cumsum(is_img.long(), dim=1)  # image tokens up to and including here
        k = count - 1  # rank of an image token within the image
        start = idx - k  # the image's first position (valid on image tokens)
        text = idx - count + torch.where(count > 0, max(gh, gw), 0)
        t = torch.where(is_img, start, text)
        h = torch.where(is_img, start + torch.div(k, gw, rounding_mode="floor"), text)
        w = torch.where(is_img, start + torch.remainder(k, gw), text)
        return torch.stack([t, h, w], dim=0)

    def forward(
        self,
        input_ids: torch.Tensor,
        image_embeds: torch.Tensor,
        last_index: torch.Tensor,
        read_index: torch.Tensor,
        read_token: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.embed(input_ids)
        hidden = emb.shape[-1]
        is_img = input_ids == self.image_token_id
        n_img = image_embeds.shape[1]
        slot = torch.clamp(torch.cumsum(is_img.long(), dim=1) - 1, 0, n_img - 1)
        visual = torch.gather(
            image_embeds.to(emb.dtype), 1, slot.unsqueeze(-1).expand(-1, -1, hidden)
        )
        emb = torch.where(is_img.unsqueeze(-1), visual, emb)
        if self.model_type == "qwen3_5":
            pos = self._positions(input_ids, is_img)
        else:
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        # An all-ones mask: the padding is after every sequence and every layer is causal; it
        # also keeps transformers from probing position_ids for packed sequences (aten::diff,
        # which the legacy exporter lacks).
        ones = torch.ones_like(input_ids)
        out = self.language_model(
            inputs_embeds=emb, attention_mask=ones, position_ids=pos, use_cache=False
        )
        h = out.last_hidden_state
        h_last = torch.gather(h, 1, last_index.view(-1, 1, 1).expand(-1, 1, hidden)).squeeze(1)
        first_logits = (h_last @ cast(torch.Tensor, self.w_first).T).float()
        h_read = torch.gather(h, 1, read_index.unsqueeze(-1).expand(-1, -1, hidden))
        logp = torch.log_softmax((h_read @ cast(torch.Tensor, self.head).T).float(), dim=-1)
        read_logprob = torch.gather(logp, 2, read_token.unsqueeze(-1)).squeeze(-1)
        return first_logits, read_logprob


def build_graphs(
    model: Any,
    model_type: str,
    *,
    image_token_id: int,
    first_ids: Sequence[int],
    gray_pixels: dict[str, np.ndarray],
    merge: int,
) -> tuple[VisionGraph, DecoderGraph]:
    """Both scoring graphs of a loaded ``*ForConditionalGeneration`` model, in eval mode."""
    llm_grid = None
    if model_type == "qwen3_5":
        _, gh, gw = (int(x) for x in gray_pixels["image_grid_thw"][0])
        llm_grid = (gh // merge, gw // merge)
    vision = VisionGraph(model, model_type, gray_pixels).eval()
    decoder = DecoderGraph(
        model,
        model_type,
        image_token_id=image_token_id,
        first_ids=first_ids,
        llm_grid=llm_grid,
    ).eval()
    return vision, decoder
