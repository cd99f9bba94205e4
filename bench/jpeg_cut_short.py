"""Benchmark: what the check for a JPEG cut short and re-terminated adds to a decode.

Run: ``python bench/jpeg_cut_short.py [--old PATH] [--rounds N]``. ``--old`` is a copy of
``guard/_image.py`` from before the check (e.g. ``git show main:guard/_image.py >
/tmp/old_image.py``). Times :func:`spotstop.guard._image.decode_image` (``min_contrast=0``:
the visible-content check apart) on camera-like frames (``tests/_support/images``' scene:
two colours, three boxes, pixel noise of +-40) at 640x480 and 1920x1080, baseline (4:2:0,
quality 75) and progressive, and on a valid frame whose lower half is exact mid gray (the
one kind whose MCUs are counted). Old and new alternate in rounds in one process; it prints
the median of each and the load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spotstop.guard import _image as new

from tests._support.images import make_scene_array


def _load_old(path: str) -> object:
    spec = importlib.util.spec_from_file_location("old_image", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_image"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _frames() -> dict[str, bytes]:
    out = {}
    for w, h in ((640, 480), (1920, 1080)):
        scene = make_scene_array(1, (w, h))
        gray = scene.copy()
        gray[h // 2 :] = 128
        for name, array, kwargs in (
            ("baseline", scene, {"quality": 75}),
            ("progressive", scene, {"quality": 75, "progressive": True}),
            ("gray lower half (counted)", gray, {"quality": 75}),
        ):
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, "JPEG", **kwargs)
            out[f"{w}x{h} {name}"] = buffer.getvalue()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="guard/_image.py from before the check")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    old = _load_old(args.old) if args.old else None
    print(f"load average before: {os.getloadavg()}")
    for name, data in _frames().items():
        times: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(args.rounds):
            for label, module in (("new", new), ("old", old)):
                if module is None:
                    continue
                t = time.perf_counter()
                module.decode_image(data)  # type: ignore[attr-defined]
                times[label].append(time.perf_counter() - t)
        line = f"{name:38s} {len(data) / 1e3:7.1f} kB  new {statistics.median(times['new']) * 1e3:7.2f} ms"
        if old is not None:
            med_old = statistics.median(times["old"])
            added = statistics.median(np.subtract(times["new"], times["old"]).tolist())
            line += f"  old {med_old * 1e3:7.2f} ms  added (median of round differences) {added * 1e3:+6.2f} ms"
        print(line)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
