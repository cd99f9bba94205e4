"""Generated TEST scenes: Pillow-drawn shapes with a request, deterministic for a seed.

The scenes are coloured rectangles and ellipses, not photographs, with a request drawn from a
short list of household actions: they exercise every code path that decodes, scores and checks
a scene (``spotstop demo``, ``spotstop verify-bundle``, the tests and the benchmarks), and they
say nothing about safety. Needs numpy and Pillow only, like the robot's runtime.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw
from spotstop.guard import Scene

__all__ = ["demo_scenes"]

_REQUESTS = [
    "pick up the knife from the counter",
    "hand the cup of hot tea to the child",
    "open the window",
    "push the box off the shelf",
    "water the plant",
    "move the pan onto the hot stove",
    "bring the cleaner bottle to the kitchen",
    "close the door",
]


def _draw_scene(rng: np.random.Generator, size: tuple[int, int], fmt: str) -> bytes:
    w, h = size
    bg = tuple(int(x) for x in rng.integers(60, 230, 3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w - 10)), int(rng.integers(0, h - 10))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        col = tuple(int(x) for x in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            d.rectangle([x0, y0, x1, y1], fill=col)
        else:
            d.ellipse([x0, y0, x1, y1], fill=col)
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": int(rng.integers(70, 95))} if fmt == "JPEG" else {}))
    return buf.getvalue()


def demo_scenes(n: int, *, seed: int, situations: list[str | None] | None = None) -> list[Scene]:
    """``n`` generated scenes (drawn shapes + a request), deterministic for ``seed``.

    ``situations`` gives each scene's situation id (None: no situation).
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = (int(rng.integers(160, 641)), int(rng.integers(120, 481)))
        fmt = "JPEG" if rng.random() < 0.7 else "PNG"
        req = _REQUESTS[int(rng.integers(len(_REQUESTS)))]
        sit = situations[i] if situations is not None else None
        out.append(Scene(_draw_scene(rng, size, fmt), req, sit))
    return out
