"""LFM2-VL (``model_type`` ``lfm2_vl``) as the runtime sees it: image grid, pixels, prompt text.

The SigLIP2 NaFlex vision tower cuts the image into 16x16 patches; the projector's pixel
unshuffle merges 2x2 of them into one visual token (``downsample_factor``). spotstop scores
one image without tiling. The chat template writes a bare ``<image>``, which the processor
expands to ``<|image_start|>``, one ``<image>`` per visual token and ``<|image_end|>``. No
reasoning switch. The paper's low-resolution rule: 64 visual tokens (256x256 pixels, 8x8
tokens). The export side of the architecture (export config, cost model, mixed-precision
roles, the recorded real member) is ``export/archs/lfm2_vl.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from spotstop.guard.archs._base import ArchSpec, ImageGeometry, config_value, to_normalized_chw

__all__ = ["SPEC", "Lfm2VlSpec"]


@dataclass(frozen=True)
class Lfm2VlSpec(ArchSpec):
    """LFM2-VL without tiling: row-major patches, every patch valid."""

    def _merge(self, config: Mapping[str, Any]) -> int:
        return int(config_value(config, "downsample_factor", 2))

    def preprocess(self, image: Image.Image, g: ImageGeometry) -> dict[str, np.ndarray]:
        # Same layout as transformers' Lfm2VlImageProcessor without tiling: (H/P·W/P, P·P·C)
        # patches in row-major order, every patch valid.
        chw = to_normalized_chw(image, g)
        c = chw.shape[0]
        nh, nw, p = g.height // g.patch_size, g.width // g.patch_size, g.patch_size
        x = chw.reshape(c, nh, p, nw, p).transpose(1, 3, 2, 4, 0)
        patches = np.ascontiguousarray(x.reshape(1, nh * nw, p * p * c), dtype=np.float32)
        return {
            "pixel_values": patches,
            "pixel_attention_mask": np.ones((1, nh * nw), dtype=np.int64),
            "spatial_shapes": np.asarray([[nh, nw]], dtype=np.int64),
        }


#: the registered spec (guard/archs/__init__.py)
SPEC = Lfm2VlSpec(
    model_type="lfm2_vl",
    template_image_placeholder="<image>",
    image_token="<image>",
    chat_template_kwargs={},
    default_visual_tokens=64,  # without tiling: 256x256 pixels, 8x8 tokens
    resample=int(Image.Resampling.BILINEAR),
    image_prefix="<|image_start|>",
    image_suffix="<|image_end|>",
)
