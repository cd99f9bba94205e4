"""Benchmark: the text detector's OCR rate next to a tiny-pair member's scoring rate.

Run: ``python bench/cues_ocr.py [--n 10] [--threads 2] [--sizes 640x480,1280x720]``.

Frames: the demo scenes (drawn shapes) scaled to each size, each with a sticker whose text is
one of a few claims of both cues or a neutral label (DejaVu, from matplotlib), JPEG-encoded as
a camera sends them. In one run, one phase after the other (never two at once):

1. the text detector (:class:`spotstop.guard.cues.RapidOcrDetector`, RapidOCR PP-OCRv6 on
   onnxruntime, ``--threads`` intra-op threads): load time, then ``detect`` on each frame
   (decode + OCR + lexicon), one frame per call;
2. one member of the tiny TEST pair (torch backend, the same thread cap; built once under
   ``$SPOTSTOP_HOME/tiny`` when absent) scoring the same frames with a request, one scene per
   call. The tiny pair is small and its scores mean nothing: its rate is an upper bound on
   what a real member scores, so the ratio says how much OCR adds at the very least.

"flags right" counts frames whose flags equal the sticker's claim (a check that the OCR read
what was timed).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# (sticker text, the flags it should raise: reassuring, alarming)
_STICKERS = [
    ("DANGER HIGH VOLTAGE", (False, True)),
    ("ALL CLEAR", (True, False)),
    ("DO NOT TOUCH", (False, True)),
    ("Checked – OK to use", (True, False)),
    ("ROOM 4", (False, False)),
]


def _size(text: str) -> tuple[int, int]:
    w, h = (int(v) for v in text.lower().split("x"))
    return w, h


def _frames(n: int, size: tuple[int, int], seed: int) -> list[tuple[bytes, tuple[bool, bool]]]:
    """``n`` JPEG frames of ``size`` with a text sticker each, and the flags each should raise."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont
    from spotstop.export.scenes import demo_scenes

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    faces = ["DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono-Bold.ttf"]
    rng = np.random.default_rng(seed)
    out = []
    for i, scene in enumerate(demo_scenes(n, seed=seed)):
        img = Image.open(io.BytesIO(bytes(scene.image))).convert("RGB").resize(size)  # type: ignore[arg-type]
        text, flags = _STICKERS[i % len(_STICKERS)]
        face = ImageFont.truetype(str(fonts / faces[i % len(faces)]), max(14, size[1] // 16))
        draw = ImageDraw.Draw(img)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=face)
        x = int(rng.integers(8, max(9, size[0] - (right - left) - 8)))
        y = int(rng.integers(8, max(9, size[1] - (bottom - top) - 8)))
        pad = (bottom - top) // 3
        draw.rectangle((x - pad, y - pad, x + right - left + pad, y + bottom - top + pad), "white")
        draw.text((x - left, y - top), text, font=face, fill=(170, 0, 0) if flags[1] else "black")
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        out.append((buf.getvalue(), flags))
    return out


def _per_call(fn, items) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(calls per second over the phase, median seconds per call)."""
    times = []
    t0 = time.perf_counter()
    for item in items:
        t = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - t)
    return len(items) / (time.perf_counter() - t0), statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10, help="frames per size (default 10)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--sizes", default="640x480,1280x720", help="frame sizes WxH, comma-separated")
    ap.add_argument("--member", default="tiny-qwen3_5", help="tiny member folder name")
    ap.add_argument("--tiny", type=Path, default=None, help="tiny pair folder (built if absent)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # bench/diagnostics.py would shadow the diagnostics package: drop this folder from the path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]

    from spotstop.export.tiny import TINY_MEMBERS, build_tiny_pair, default_tiny_dir
    from spotstop.guard import Scene, load_member
    from spotstop.guard.cues import RapidOcrDetector

    sizes = [_size(s) for s in args.sizes.split(",")]
    frames = {size: _frames(args.n, size, args.seed) for size in sizes}

    # -- 1. OCR ---------------------------------------------------------------------------------
    t = time.perf_counter()
    detector = RapidOcrDetector(threads=args.threads).load()
    load_s = time.perf_counter() - t
    detector.detect(frames[sizes[0]][0][0])  # warm-up beyond load: first real-size frame
    ocr: dict[tuple[int, int], tuple[float, float, int]] = {}
    for size in sizes:
        right = 0

        def read(item: tuple[bytes, tuple[bool, bool]]) -> None:
            nonlocal right
            reading = detector.detect(item[0])
            right += (reading.reassuring, reading.alarming) == item[1]

        rate, median = _per_call(read, frames[size])
        ocr[size] = (rate, median, right)

    # -- 2. one tiny-pair member ---------------------------------------------------------------
    tiny = args.tiny or default_tiny_dir()
    if not all((tiny / m / "config.json").is_file() for m in TINY_MEMBERS):
        print(f"building the tiny TEST pair in {tiny} …", file=sys.stderr)
        build_tiny_pair(tiny)
    member = load_member(tiny / args.member, threads=args.threads)
    request = "pick up the box in front of you"
    member.score([Scene(frames[sizes[0]][0][0], request)])  # warm-up
    score: dict[tuple[int, int], tuple[float, float]] = {}
    for size in sizes:
        scenes = [Scene(data, request) for data, _ in frames[size]]
        score[size] = _per_call(lambda s: member.score([s]), scenes)

    print(
        f"spotstop text detector benchmark — {args.n} JPEG frames per size, {args.threads} "
        f"threads, {os.cpu_count()} CPUs; {detector.model}"
    )
    print(f"OCR load (sessions + warm-up frame): {load_s:.2f} s")
    print(
        f"{'frame':<10} {'OCR frames/s':>12} {'OCR p50 ms':>11} {'flags right':>12} "
        f"{'member scenes/s':>16} {'member p50 ms':>14} {'OCR/member time':>16}"
    )
    for size in sizes:
        rate, median, right = ocr[size]
        m_rate, m_median = score[size]
        print(
            f"{size[0]}x{size[1]:<6} {rate:>12.2f} {median * 1e3:>11.0f} "
            f"{f'{right}/{args.n}':>12} {m_rate:>16.2f} {m_median * 1e3:>14.1f} "
            f"{f'×{m_rate / rate:.1f}':>16}"
        )
    print(
        f"member: {args.member} (tiny TEST pair, torch backend); the OCR/member column is how "
        "many member scorings fit in one OCR pass."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
