"""Scene images made up for tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def make_image_bytes(seed: int, size: tuple[int, int] = (80, 48), fmt: str = "PNG") -> bytes:
    """A random RGB image, encoded (width, height = size)."""
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt)
    return buf.getvalue()
