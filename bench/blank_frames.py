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
  1920x1080;
* frames that show (almost) nothing of the scene, as a camera with a burned-in overlay sends
  them (black, video black at 16 and 32, mid gray and white with sensor noise of sigma 0, 4
  and 10, per pixel or grainy; JPEG; 160x120 to 1920x1080): a timestamp in white with a black outline,
  with a camera name on a second line, on a dark box, at 3, 5 and 8 % of the frame's
  height in three places; a crosshair across the frame and a reticle; a logo (a disc with a
  square) of 0.25, 0.5 and 1 % of the frame; a covered lens with a light leak (linear ramps
  and glows from a corner, an edge, the centre, of 40 to 200 levels), alone and with a
  timestamp; a lens covered but for a corner of 0.5 to 1.5 % of the frame that shows a
  scene (a 640x480 world scene, the photograph);
* a covered, fogged or blown-out lens (gray 128, light gray 200, white; noise as above;
  160x120 to 1920x1080) on a camera that draws its on-screen display on a filled box: a dark,
  semi-transparent or lightly shading box of the text's height, as wide as the text, half
  or all the frame, along the top or bottom edge, a timestamp on it with or without an
  outline;
* scenes with that box drawn on them (the test world at 640x480 and 160x120, demo scenes,
  the photograph at its exposure and at 10 %), which must pass;
* for comparison, not a limit: a lens covered but for a corner of 3 to 10 % of the frame.

It prints the smallest contrast of each group of scenes and the largest of each group of
frames that show nothing; the default of ``min_image_contrast`` (``DEFAULT_MIN_CONTRAST``)
must lie between them. Its docstring quotes this script's output. Last, it times
:func:`~spotstop.guard._image.image_contrast` at 640x480 and 1920x1080.
"""

from __future__ import annotations

import io
import itertools
import os
import time
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from spotstop.export import world as W
from spotstop.export.scenes import demo_scenes
from spotstop.guard._image import DEFAULT_MIN_CONTRAST, decode_image, image_contrast

SIZES = ((32, 32), (64, 48), (160, 120), (320, 240), (640, 480), (1280, 720), (1920, 1080))
BASES: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "black 16": (16, 16, 16),
    "black 32": (32, 32, 32),
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


OVERLAY_SIZES = ((160, 120), (640, 480), (1280, 720), (1920, 1080))
NOISES = ((0, False), (4, False), (10, False), (10, True))  # (sigma, grainy)
TEXT_HEIGHTS = (0.03, 0.05, 0.08)  # of the frame's height
PLACES = ("tl", "br", "bc")  # top left, bottom right, bottom centre
LOGO_SHARES = (0.0025, 0.005, 0.01)  # of the frame's area
RAMPS = ("horizontal", "vertical", "diagonal", "corner glow", "edge glow", "centre glow")
CORNER_SHARES = (0.005, 0.01, 0.015)  # of the frame's area, the scene left by a hand
STAMP = "2026-12-05 23:55:01"


def noise_field(
    rng: np.random.Generator, shape: tuple[int, int], sigma: float, grainy: bool
) -> np.ndarray:
    """Sensor noise: independent per pixel, or grainy (each pixel the mean of a 2x2 block)."""
    noise = rng.normal(0, sigma * (2 if grainy else 1), (*shape, 3))
    if grainy:
        noise = (
            noise + np.roll(noise, 1, 0) + np.roll(noise, 1, 1) + np.roll(noise, 1, (0, 1))
        ) / 4
    return noise


def ramp(kind: str, amplitude: float, size: tuple[int, int]) -> np.ndarray:
    """A light leak: a smooth ramp of ``amplitude`` levels, no detail."""
    w, h = size
    ys, xs = np.mgrid[0:h, 0:w]
    x, y = xs / (w - 1), ys / (h - 1) * h / w  # (distances in widths)
    shape = {
        "horizontal": lambda: x,
        "vertical": lambda: y * w / h,
        "diagonal": lambda: (x + y * w / h) / 2,
        "corner glow": lambda: np.exp(-np.hypot(x, y) / 0.5),
        "edge glow": lambda: np.exp(-y / 0.3),
        "centre glow": lambda: np.exp(-((x - 0.5) ** 2 + (y - 0.5 * h / w) ** 2) / 0.18),
    }[kind]()
    return amplitude * shape


def draw_overlay(image: Image.Image, kind: str, height: float, place: str) -> None:
    """Burn an overlay into ``image``, as a camera's on-screen display does."""
    w, h = image.size
    d = ImageDraw.Draw(image)
    px = max(6, round(height * h))
    margin = max(2, h // 60)

    def at(bw: int, bh: int) -> tuple[int, int]:
        x = {"l": margin, "r": w - bw - margin, "c": (w - bw) // 2}[place[1]]
        y = {"t": margin, "b": h - bh - margin, "c": (h - bh) // 2}[place[0]]
        return x, y

    if kind in ("timestamp", "timestamp and name", "timestamp on a box"):
        font = ImageFont.load_default(size=px)
        lines = [STAMP, *(["CAM 03  LOADING DOCK"] if kind == "timestamp and name" else [])]
        for i, line in enumerate(lines):
            left, top, right, bottom = (round(v) for v in d.textbbox((0, 0), line, font=font))
            x, y = at(right - left, bottom - top)
            if i == 1:  # the name at the other end
                y = h - (bottom - top) - margin if place[0] == "t" else margin
            if kind == "timestamp on a box":
                box = [x - 3, y - 3, x + right - left + 3, y + bottom - top + 3]
                d.rectangle(box, fill=(20, 20, 20))
            d.text(
                (x - left, y - top),
                line,
                font=font,
                fill=(255, 255, 255),
                stroke_width=max(1, px // 12),
                stroke_fill=(0, 0, 0),
            )
    elif kind == "crosshair":
        t = max(1, round(height * h / 6))
        d.line([(0, h // 2), (w, h // 2)], fill=(255, 255, 255), width=t)
        d.line([(w // 2, 0), (w // 2, h)], fill=(255, 255, 255), width=t)
    elif kind == "reticle":
        s, t = round(height * 4 * h), max(1, round(height * h / 6))
        cx, cy = w // 2, h // 2
        d.line([(cx - s, cy), (cx + s, cy)], fill=(0, 255, 0), width=t)
        d.line([(cx, cy - s), (cx, cy + s)], fill=(0, 255, 0), width=t)
        d.ellipse(
            [cx - s // 2, cy - s // 2, cx + s // 2, cy + s // 2], outline=(0, 255, 0), width=t
        )
    else:
        raise ValueError(kind)


def draw_logo(image: Image.Image, share: float, place: str) -> None:
    """A disc with a red square, of ``share`` of the frame's area."""
    w, h = image.size
    s = max(2, round(2 * np.sqrt(share * w * h / np.pi)))
    m = max(2, h // 60)
    x = {"l": m, "r": w - s - m, "c": (w - s) // 2}[place[1]]
    y = {"t": m, "b": h - s - m, "c": (h - s) // 2}[place[0]]
    d = ImageDraw.Draw(image)
    d.ellipse([x, y, x + s, y + s], fill=(230, 230, 230))
    d.rectangle([x + s // 4, y + s // 4, x + 3 * s // 4, y + 3 * s // 4], fill=(200, 30, 30))


def covered_frames() -> Iterator[tuple[str, str, float]]:
    """Frames a camera with an overlay sends through a covered lens: (group, size, contrast)."""
    rng = np.random.default_rng(2)
    for w, h in OVERLAY_SIZES:
        size = f"{w}x{h}"
        for base in ("black", "black 16", "black 32", "gray", "white"):
            for sigma, grainy in NOISES:
                level = np.asarray(BASES[base], np.float64)
                arr = np.clip(np.rint(level + noise_field(rng, (h, w), sigma, grainy)), 0, 255)
                plain = arr.astype(np.uint8)
                kinds = ("timestamp", "timestamp and name", "timestamp on a box")
                for kind, height, place in itertools.product(
                    (*kinds, "crosshair", "reticle"), TEXT_HEIGHTS, PLACES
                ):
                    if kind in ("crosshair", "reticle") and place != "tl":
                        continue  # (centred)
                    image = Image.fromarray(plain)
                    draw_overlay(image, kind, height, place)
                    yield f"{kind} on {base}", size, contrast(encode(np.asarray(image), "JPEG"))
                for share, place in itertools.product(LOGO_SHARES, PLACES):
                    image = Image.fromarray(plain)
                    draw_logo(image, share, place)
                    yield f"logo on {base}", size, contrast(encode(np.asarray(image), "JPEG"))
        for kind, amplitude, sigma in itertools.product(RAMPS, (40, 100, 200), (0, 4, 10)):
            leak = ramp(kind, amplitude, (w, h))[..., None] + noise_field(rng, (h, w), sigma, False)
            arr8 = np.clip(np.rint(leak), 0, 255).astype(np.uint8)
            yield f"light leak: {kind}", size, contrast(encode(arr8, "JPEG"))
            image = Image.fromarray(arr8)
            draw_overlay(image, "timestamp and name", 0.05, "tl")
            c = contrast(encode(np.asarray(image), "JPEG"))
            yield f"light leak: {kind}, timestamp", size, c


OSD_BASES = {"gray": 128, "fog": 200, "white": 255}
OSD_WIDTHS = ("text", "half", "full")  # the box: as wide as the text, half or all the frame
OSD_BOXES = {"dark": 0.92, "semi-transparent": 0.5, "light shade": 0.3}  # (darkening)


def draw_osd(
    image: Image.Image, height: float, width: str, place: str, shade: float, outline: bool
) -> None:
    """An on-screen display on a filled box: a box of the text's height (plus 3 px above and
    below) along the top or bottom edge (``place`` "t" or "b"), as wide as the text, half
    or all the frame, that darkens what is under it by ``shade`` (0.92: a dark box; 0.5: a
    semi-transparent one), and a white timestamp on it, with or without a black outline."""
    w, h = image.size
    px = max(6, round(height * h))
    font = ImageFont.load_default(size=px)
    d = ImageDraw.Draw(image)
    left, top, right, bottom = (round(v) for v in d.textbbox((0, 0), STAMP, font=font))
    tw, th = right - left, bottom - top
    margin = max(2, h // 60)
    bw = {"text": tw + 6, "half": w // 2, "full": w}[width]
    bh = th + 6
    x0 = {"text": margin, "half": 0, "full": 0}[width]
    y0 = 0 if place == "t" else h - bh
    if width == "text" and place == "b":
        x0 = w - bw - margin
    arr = np.asarray(image).astype(np.float64)
    arr[y0 : y0 + bh, x0 : x0 + bw] *= 1.0 - shade
    image.paste(Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)))
    d = ImageDraw.Draw(image)
    d.text(
        (x0 + 3 - left, y0 + 3 - top),
        STAMP,
        font=font,
        fill=(255, 255, 255),
        stroke_width=max(1, px // 12) if outline else 0,
        stroke_fill=(0, 0, 0),
    )


def osd_frames() -> Iterator[tuple[str, str, float]]:
    """A covered, fogged or blown-out lens (gray, light gray, white) on a camera that draws its
    on-screen display on a filled box: (group, size, contrast)."""
    rng = np.random.default_rng(6)
    for w, h in OVERLAY_SIZES:
        for (base, level), (sigma, grainy) in itertools.product(OSD_BASES.items(), NOISES):
            arr = np.clip(np.rint(level + noise_field(rng, (h, w), sigma, grainy)), 0, 255)
            plain = arr.astype(np.uint8)
            for (box, shade), width, height, place, outline in itertools.product(
                OSD_BOXES.items(), OSD_WIDTHS, TEXT_HEIGHTS, "tb", (True, False)
            ):
                image = Image.fromarray(plain)
                draw_osd(image, height, width, place, shade, outline)
                c = contrast(encode(np.asarray(image), "JPEG"))
                yield f"{box} box ({width} width) on {base}", f"{w}x{h}", c


def osd_scenes() -> Iterator[tuple[str, float]]:
    """Frames that show a scene with an on-screen display on a box (must pass)."""
    opts = W.WorldOptions(offsets=1.0, size=(640, 480), rooms=8, contrasts_per_room=6)
    sources = []
    for case in W.world_cases(3, opts)[:12]:
        sources.append(
            ("a 640x480 world scene", np.asarray(decode_image(W.case_image(case, opts)).image))
        )
    opts = W.WorldOptions(offsets=1.0)
    for case in W.world_cases(1, opts)[:12]:
        sources.append(
            (
                f"a {opts.size[0]}x{opts.size[1]} world scene",
                np.asarray(decode_image(W.case_image(case, opts)).image),
            )
        )
    for s in demo_scenes(24, seed=7):
        assert isinstance(s.image, bytes)
        sources.append(("a demo scene", np.asarray(decode_image(s.image).image)))
    try:
        import matplotlib

        path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
        photo = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
        for share in (1.0, 0.1):
            sources.append(
                (
                    f"the photograph at {share:.0%}",
                    np.clip(np.rint(photo * share), 0, 255).astype(np.uint8),
                )
            )
    except ImportError:
        pass
    for name, src in sources:
        for (box, shade), width, place in itertools.product(OSD_BOXES.items(), OSD_WIDTHS, "tb"):
            image = Image.fromarray(src)
            draw_osd(image, 0.05, width, place, shade, True)
            yield f"{name}, {box} box ({width})", contrast(encode(np.asarray(image), "JPEG"))


def corner_frames(shares: tuple[float, ...]) -> Iterator[tuple[str, float]]:
    """A lens covered (black, noise sigma 0 or 10) but for a corner of ``share`` of the frame."""
    rng = np.random.default_rng(3)
    opts = W.WorldOptions(offsets=1.0, size=(640, 480), rooms=8, contrasts_per_room=6)
    scene = np.asarray(decode_image(W.case_image(W.world_cases(3, opts)[0], opts)).image)
    sources = [("a world scene", scene)]
    try:
        import matplotlib

        path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
        sources.append(("the photograph", np.asarray(Image.open(path).convert("RGB"))))
    except ImportError:
        pass
    for (name, src), share, corner, sigma in itertools.product(
        sources, shares, PLACES[:2], (0, 10)
    ):
        h, w = src.shape[:2]
        arr = noise_field(rng, (h, w), sigma, False)
        cw, ch = round(w * np.sqrt(share)), round(h * np.sqrt(share))
        rows = slice(0, ch) if corner[0] == "t" else slice(h - ch, h)
        cols = slice(0, cw) if corner[1] == "l" else slice(w - cw, w)
        arr[rows, cols] = src[rows, cols]
        arr8 = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
        yield f"{share:.1%} of {name}", contrast(encode(arr8, "JPEG"))


def timing() -> None:
    rng = np.random.default_rng(4)
    for w, h in ((640, 480), (1920, 1080)):
        arr = np.clip(rng.normal(100, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        image = Image.fromarray(arr)
        image_contrast(image)
        n = 50
        t = time.perf_counter()
        for _ in range(n):
            image_contrast(image)
        print(f"  {w}x{h}: {1000 * (time.perf_counter() - t) / n:.2f} ms a frame")


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
    print("\nframes that show (almost) nothing of the scene: the largest contrast, by frame size")
    covered: dict[str, dict[str, float]] = {}
    for key, size, c in covered_frames():
        row = covered.setdefault(key, {})
        row[size] = max(row.get(size, 0.0), c)
    sizes = [f"{w}x{h}" for w, h in OVERLAY_SIZES]
    print(f"  {'':34s}" + "".join(f"{s:>10s}" for s in sizes))
    for key, row in covered.items():
        print(f"  {key:34s}" + "".join(f"{row[s]:10.1f}" for s in sizes))
    print("\na covered, fogged or blown-out lens with an on-screen display on a filled box:")
    osd: dict[str, dict[str, float]] = {}
    for key, size, c in osd_frames():
        row = osd.setdefault(key, {})
        row[size] = max(row.get(size, 0.0), c)
    print(f"  {'':44s}" + "".join(f"{s:>10s}" for s in sizes))
    for key, row in osd.items():
        print(f"  {key:44s}" + "".join(f"{row[s]:10.1f}" for s in sizes))
    corners: dict[str, list[float]] = {}
    for key, c in corner_frames(CORNER_SHARES):
        corners.setdefault(key, []).append(c)
    print("  a lens covered but for a corner (640x480 and the photograph's 512x600): the largest")
    for key, cs in corners.items():
        print(f"    {key:32s} {max(cs):8.1f}")
    print("\nfor comparison: a lens covered but for a larger corner: the smallest")
    corners = {}
    for key, c in corner_frames((0.03, 0.05, 0.1)):
        corners.setdefault(key, []).append(c)
    for key, cs in corners.items():
        print(f"    {key:32s} {min(cs):8.1f}")
    print("\nframes that show a scene with an on-screen display on a box: the smallest")
    with_box: dict[str, list[float]] = {}
    for key, c in osd_scenes():
        with_box.setdefault(key, []).append(c)
    for key, cs in with_box.items():
        print(f"    {key:56s} n={len(cs):3d}  min {min(cs):6.1f}")
    print("\nimage_contrast's time (noise frames; one core):")
    timing()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
