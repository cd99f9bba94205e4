"""Scene images made up for tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def make_scene_array(seed: int, size: tuple[int, int] = (80, 48)) -> np.ndarray:
    """A made-up scene, (height, width, 3) uint8 (width, height = size), the same from a seed.

    A wall and a floor of two colours (one dark, one light), three boxes of other colours and
    pixel noise of ±40 levels: content that covers the frame, as a camera's frame does, and
    distinct bytes for every seed. (Pure per-pixel noise is no scene: averaged over the cells
    of :func:`~spotstop.guard._image.image_contrast` it is blank, and the guard refuses it.)
    """
    w, h = size
    rng = np.random.default_rng(seed)
    arr = np.empty((h, w, 3), dtype=np.int16)
    horizon = int(h * rng.uniform(0.35, 0.65))
    arr[:horizon] = rng.integers(0, 110, 3)  # the wall
    arr[horizon:] = rng.integers(150, 256, 3)  # the floor
    for _ in range(3):  # boxes of 20-45 % of each side
        bw, bh = (max(1, int(n * rng.uniform(0.2, 0.45))) for n in (w, h))
        x, y = int(rng.integers(0, max(1, w - bw))), int(rng.integers(0, max(1, h - bh)))
        arr[y : y + bh, x : x + bw] = rng.integers(0, 256, 3)
    arr += rng.integers(-40, 41, arr.shape, dtype=np.int16)
    return np.clip(arr, 0, 255).astype(np.uint8)


def make_image_bytes(seed: int, size: tuple[int, int] = (80, 48), fmt: str = "PNG") -> bytes:
    """:func:`make_scene_array`, encoded."""
    buf = io.BytesIO()
    Image.fromarray(make_scene_array(seed, size)).save(buf, fmt)
    return buf.getvalue()
