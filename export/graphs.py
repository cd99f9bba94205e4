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
    (:func:`spotstop.export.weights.tie_output_layer`). The first-token rows are a separate small buffer.

The decoder's position ids are computed inside the graph from ``input_ids`` for the fixed
grid, by the architecture's export config (:meth:`spotstop.export.configs.ExportConfig.position_ids`:
Qwen3.5's M-RoPE places text, then the image's (t, h, w) grid, then text again offset by the
grid's longest side), so both graphs of every architecture take the same inputs and the
runtime needs no architecture-specific code. The grid tensors of the vision graph are the
preprocessing's own (:meth:`spotstop.guard._arch.ArchSpec.preprocess`), passed to the model's
``get_image_features`` by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from spotstop.export.configs import ExportConfig
from spotstop.guard._arch import ImageGeometry
from torch import nn

__all__ = ["DecoderGraph", "VisionGraph", "build_graphs"]


class VisionGraph(nn.Module):
    """One image → its visual tokens, at a fixed grid (the grid tensors are constants)."""

    def __init__(self, model: Any, pixels: Mapping[str, np.ndarray]) -> None:
        super().__init__()
        self.inner = model.model
        self.grid_names = [k for k in pixels if k != "pixel_values"]
        for k in self.grid_names:
            self.register_buffer(k, torch.from_numpy(pixels[k]).long())

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        grid = {k: getattr(self, k) for k in self.grid_names}
        out = self.inner.get_image_features(pixel_values=pixel_values, **grid, return_dict=True)
        return out.pooler_output[0].unsqueeze(0)


class DecoderGraph(nn.Module):
    """Token ids (+ visual tokens) → the answer logits and log-probabilities the score reads."""

    def __init__(
        self,
        model: Any,
        config: type[ExportConfig],
        *,
        image_token_id: int,
        first_ids: Sequence[int],
        token_grid: tuple[int, int],
    ) -> None:
        super().__init__()
        self.export_config = config
        self.image_token_id = int(image_token_id)
        self.embed = model.get_input_embeddings()
        self.language_model = model.model.language_model
        head = model.get_output_embeddings().weight
        self.head = head
        # The output layer sliced to the answers' first tokens: the only rows read at the
        # last prompt position.
        self.register_buffer("w_first", head.detach()[list(first_ids)].clone())
        self.token_grid = token_grid  # (rows, columns) of visual tokens

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
        pos = self.export_config.position_ids(input_ids, is_img, self.token_grid)
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
    config: type[ExportConfig],
    *,
    image_token_id: int,
    first_ids: Sequence[int],
    gray_pixels: Mapping[str, np.ndarray],
    geometry: ImageGeometry,
) -> tuple[VisionGraph, DecoderGraph]:
    """Both scoring graphs of a loaded ``*ForConditionalGeneration`` model, in eval mode."""
    vision = VisionGraph(model, gray_pixels).eval()
    decoder = DecoderGraph(
        model,
        config,
        image_token_id=image_token_id,
        first_ids=first_ids,
        token_grid=geometry.token_grid,
    ).eval()
    return vision, decoder
