"""Qwen3.5 (``model_type`` ``qwen3_5``) as the runtime sees it: image grid, pixels, prompt text.

The Qwen3.5 vision tower cuts the image into 16x16 patches and merges 2x2 of them into one
visual token (``vision_config.spatial_merge_size``); the chat template writes
``<|image_pad|>`` inside a vision span, and the processor repeats it once per visual token.
Reasoning is off with ``enable_thinking=False``. The paper's low-resolution rule: 256 visual
tokens (512x512 pixels, 16x16 tokens). The export side of the architecture (export config, cost
model, mixed-precision roles, the recorded real member) is ``export/archs/qwen3_5.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from spotstop.guard.archs._base import ArchSpec, ImageGeometry, config_value, to_normalized_chw

__all__ = ["SPEC", "Qwen35Spec"]


@dataclass(frozen=True)
class Qwen35Spec(ArchSpec):
    """Qwen3.5: Qwen2-VL-style patches (temporal patch 2, 2x2 merge blocks) and M-RoPE."""

    def _merge(self, config: Mapping[str, Any]) -> int:
        return int(config_value(config.get("vision_config") or {}, "spatial_merge_size", 2))

    def preprocess(self, image: Image.Image, g: ImageGeometry) -> dict[str, np.ndarray]:
        # Same layout as transformers' Qwen2VLImageProcessor: the frame repeated over the
        # temporal patch, then patches grouped by merge blocks, flattened (C, T, P, P).
        chw = to_normalized_chw(image, g)
        tps = 2
        c = chw.shape[0]
        gh, gw, p, m = g.height // g.patch_size, g.width // g.patch_size, g.patch_size, g.merge
        frames = np.broadcast_to(chw[None], (tps, c, g.height, g.width))
        x = frames.reshape(1, tps, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = np.ascontiguousarray(x.reshape(gh * gw, c * tps * p * p), dtype=np.float32)
        return {
            "pixel_values": flat,
            "image_grid_thw": np.asarray([[1, gh, gw]], dtype=np.int64),
        }

    def text_inputs(
        self, input_ids: np.ndarray, image_token_id: int, with_image: bool
    ) -> dict[str, np.ndarray]:
        # transformers' Qwen3.5 places its M-RoPE positions by token type (1: image token)
        is_image = input_ids == image_token_id if with_image else np.zeros(input_ids.shape, bool)
        return {"mm_token_type_ids": is_image.astype(np.int32)}


#: the registered spec (guard/archs/__init__.py)
SPEC = Qwen35Spec(
    model_type="qwen3_5",
    template_image_placeholder="<|image_pad|>",
    image_token="<|image_pad|>",
    chat_template_kwargs={"enable_thinking": False},
    default_visual_tokens=256,  # 512x512 pixels, 16x16 tokens
    resample=int(Image.Resampling.BICUBIC),
)
