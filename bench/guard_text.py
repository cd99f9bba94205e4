"""Benchmark: what reading the text in the scene at decision time costs ``Guard.check``.

Run: ``python bench/guard_text.py [--n 20] [--size 640x480]``.

Builds (once) the demo bundle on the tiny TEST pair under ``$SPOTSTOP_HOME/bench`` (its
decisions mean nothing; its cost is real scoring through the torch backend), draws ``--n``
scenes, half of them with a sign ("ALL CLEAR" / "DANGER HIGH VOLTAGE") pasted in, and
measures, one phase after the other on the same scenes:

1. ``Guard.check`` with the demo policy (no text detection);
2. the OCR detector alone on each frame (``RapidOcrDetector.detect``);
3. ``Guard.check`` with the same policy plus ``text_in_scene: {detect: true}`` — the
   detector runs on its own thread beside the members.

It prints p50 latencies, the ratio of (3) to (1), and how much of the OCR time the parallel
run hides: ``hidden = (t1 + t2 − t3) / t2`` (1: fully overlapped, 0: serial). Needs the
``cues`` extra (rapidocr). On 2 CPU cores the members and the OCR compete for the same
cores, so expect little overlap there; on a Jetson the members run on the GPU.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from spotstop.guard.validate import dump_yaml, load_yaml


def _bundle() -> Path:
    from spotstop.guard import spotstop_home

    root = spotstop_home() / "bench"
    if not (root / "bundle" / "policy.yaml").is_file():
        from spotstop.cli import make_demo_bundle

        root.mkdir(parents=True, exist_ok=True)
        print(f"building the demo bundle (tiny TEST pair) in {root} …", file=sys.stderr)
        make_demo_bundle(root)
    return root / "bundle"


def _scenes(n: int, size: tuple[int, int]) -> list[bytes]:
    from matplotlib import font_manager
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(0)
    font = ImageFont.truetype(font_manager.findfont("DejaVu Sans:bold"), size[1] // 14)
    out = []
    for i in range(n):
        img = Image.new("RGB", size, tuple(int(x) for x in rng.integers(40, 200, 3)))
        d = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, size[0] - 40)), int(rng.integers(0, size[1] - 40))
            d.rectangle(
                [x0, y0, x0 + 60, y0 + 40], fill=tuple(int(x) for x in rng.integers(0, 256, 3))
            )
        if i % 2 == 0:
            text = "ALL CLEAR" if i % 4 == 0 else "DANGER HIGH VOLTAGE"
            d.text((size[0] // 10, size[1] // 2), text, fill=(250, 240, 30), font=font)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _p50(xs: list[float]) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, 50))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="scenes per phase (default 20)")
    ap.add_argument("--size", default="640x480", help="frame size WxH (default 640x480)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per backend")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.lower().split("x"))

    from spotstop.guard import Guard, Scene
    from spotstop.guard.cues import RapidOcrDetector

    src = _bundle()
    images = _scenes(args.n, (w, h))
    scenes = [Scene(img, "open the cabinet", None) for img in images]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        shutil.copytree(src, bundle, ignore=shutil.ignore_patterns("*.sqlite*", "state"))
        doc = load_yaml((bundle / "policy.yaml").read_text(), source="policy.yaml")

        def run(guard: Guard) -> list[float]:
            guard.check(scenes[0])  # warm up
            lat = []
            for s in scenes:
                t = time.perf_counter()
                guard.check(s)
                lat.append(time.perf_counter() - t)
            return lat

        with Guard(bundle, log=Path(tmp) / "off.sqlite", threads=args.threads) as g:
            off = run(g)
        det = RapidOcrDetector(threads=args.threads).load()
        ocr = []
        flagged = 0
        for img in images:
            t = time.perf_counter()
            r = det.detect(img)
            ocr.append(time.perf_counter() - t)
            flagged += int(r.reassuring or r.alarming)
        doc["text_in_scene"] = {"detect": True}
        (bundle / "policy.yaml").write_text(dump_yaml(doc))
        with Guard(
            bundle, log=Path(tmp) / "on.sqlite", threads=args.threads, text_detector=det
        ) as g:
            on = run(g)
            measured = list(g.log.records())[1:]  # the first row is the warm-up call
            flags = sum(bool(r.cue_flags and any(r.cue_flags.values())) for r in measured)

    t1, t2, t3 = _p50(off), _p50(ocr), _p50(on)
    print(f"tiny TEST pair, {args.n} frames {w}x{h} (half with a sign), p50 per call:")
    print(f"  Guard.check, no text detection      {t1:8.1f} ms")
    print(f"  OCR detector alone                  {t2:8.1f} ms   ({flagged}/{args.n} flagged)")
    print(f"  Guard.check, text_in_scene.detect   {t3:8.1f} ms   ({flags} decisions flagged)")
    print(f"  ratio with / without detection      x{t3 / t1:.2f}")
    print(f"  OCR time hidden by running it beside the members: {(t1 + t2 - t3) / t2:+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
