"""Benchmark: the contrast of frames that show a scene and of frames that show nothing.

Run: ``python bench/blank_frames.py``. Measures :func:`spotstop.guard._image.image_contrast`
(what ``min_image_contrast`` is compared with) on

* the test world's scenes (``spotstop.export.world``: four worlds, among them one at 64x64 and
  one at 640x480, with the rooms' lighting moved as far as ``--offsets 1`` moves it);
* generated demo scenes (``spotstop.export.scenes.demo_scenes``, 10,000 of them);
* a real photograph (matplotlib's ``grace_hopper.jpg``, when matplotlib is installed) at its
  own exposure and darkened to 20 %, 10 %, 5 % and 3 % of it (a dim room: at 5 % its
  brightest pixel is about 12 of 255), with and without noise (sigma 3);
* frames that show nothing: black (0 and 16), mid gray, white and one colour, each with
  Gaussian sensor noise of sigma 4, 10 and 20 levels, independent per pixel or grainy (each
  pixel the mean of a 2x2 block of noise of twice the sigma, as demosaicing spreads it), the
  same noise on every channel or not, saved as PNG and as JPEG (quality 85), at 32x32 up to
  1920x1080.

It prints the smallest contrast of each group of scenes and the largest of each group of
blank frames; the default of ``min_image_contrast`` (``DEFAULT_MIN_CONTRAST``) must lie
between them. Its docstring quotes this script's output.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import numpy as np
from PIL import Image
from spotstop.export import world as W
from spotstop.export.scenes import demo_scenes
from spotstop.guard._image import DEFAULT_MIN_CONTRAST, decode_image, image_contrast

SIZES = ((32, 32), (64, 48), (160, 120), (320, 240), (640, 480), (1280, 720), (1920, 1080))
BASES: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "black 16": (16, 16, 16),
    "gray": (128, 128, 128),
    "white": (255, 255, 255),
    "colour": (200, 40, 90),
}
SIGMAS = (4, 10, 20)


def contrast(data: bytes) -> float:
    return image_contrast(decode_image(data).image)


def encode(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buf.getvalue()


def scenes() -> Iterator[tuple[str, float]]:
    worlds = [
        (0, W.WorldOptions()),
        (1, W.WorldOptions(offsets=1.0, signs=0.5, file_cue=0.3, occluded=0.3)),
        (2, W.WorldOptions(offsets=1.0, size=(64, 64), file_cue=0.5)),
        (3, W.WorldOptions(offsets=1.0, size=(640, 480), rooms=8, contrasts_per_room=6)),
    ]
    for seed, opts in worlds:
        name = f"world seed {seed}, {opts.size[0]}x{opts.size[1]}, offsets {opts.offsets:g}"
        for case in W.world_cases(seed, opts):
            yield name, contrast(W.case_image(case, opts))
    for seed in range(50):
        for s in demo_scenes(200, seed=seed):
            assert isinstance(s.image, bytes)
            yield "demo_scenes (10,000)", contrast(s.image)
    try:
        import matplotlib
    except ImportError:
        return
    path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    photo = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
    rng = np.random.default_rng(0)
    for share in (1.0, 0.2, 0.1, 0.05, 0.03):
        for sigma in (0, 3):
            arr = photo * share + rng.normal(0, sigma, photo.shape)
            arr8 = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
            yield f"photo at {share:.0%} exposure, noise {sigma}", contrast(encode(arr8, "JPEG"))


def blank_frames() -> Iterator[tuple[str, str, float]]:
    rng = np.random.default_rng(1)
    for w, h in SIZES:
        for base in BASES.values():
            for sigma in SIGMAS:
                for grainy in (False, True):
                    for chroma in (False, True):
                        for fmt in ("PNG", "JPEG"):
                            shape = (h, w, 3 if chroma else 1)
                            noise = rng.normal(0, sigma * (2 if grainy else 1), shape)
                            if grainy:  # each pixel the mean of a 2x2 block
                                shifted = (np.roll(noise, s, (0, 1)) for s in ((1, 0), (0, 1)))
                                diagonal = np.roll(noise, (1, 1), (0, 1))
                                noise = (noise + sum(shifted) + diagonal) / 4
                            arr = np.asarray(base, dtype=np.float64) + noise
                            arr8 = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
                            arr8 = np.broadcast_to(arr8, (h, w, 3)).copy()
                            key = f"sigma {sigma:2d}, {'grainy' if grainy else 'per pixel'}"
                            yield key, f"{w}x{h}", contrast(encode(arr8, fmt))
                # the same frame without noise (a fill from a broken pipeline)
                flat = np.broadcast_to(np.asarray(base, dtype=np.uint8), (h, w, 3)).copy()
                yield "no noise", f"{w}x{h}", contrast(encode(flat, "PNG"))


def main() -> int:
    print(f"image_contrast (levels 0..255); DEFAULT_MIN_CONTRAST = {DEFAULT_MIN_CONTRAST:g}\n")
    print("frames that show a scene: the smallest contrast of each group")
    got: dict[str, list[float]] = {}
    for name, c in scenes():
        got.setdefault(name, []).append(c)
    for name, cs in got.items():
        print(f"  {name:48s} n={len(cs):5d}  min {min(cs):6.1f}")
    print("\nframes that show nothing: the largest contrast, by noise and frame size")
    blank: dict[str, dict[str, float]] = {}
    for key, size, c in blank_frames():
        row = blank.setdefault(key, {})
        row[size] = max(row.get(size, 0.0), c)
    sizes = [f"{w}x{h}" for w, h in SIZES]
    print(f"  {'':24s}" + "".join(f"{s:>10s}" for s in sizes))
    for key, row in blank.items():
        print(f"  {key:24s}" + "".join(f"{row[s]:10.1f}" for s in sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
