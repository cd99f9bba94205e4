"""``spotstop demo``: the guard end to end on the tiny TEST pair.

Builds the tiny pair if absent, writes a bundle, fits the frozen reference statistics and
cut on an unlabelled pool of generated scenes, then checks a dozen generated scenes — among
them several scenes of one situation, to show situation recentering taking over from the
frozen cut once enough references exist — prints a table and says where the log is.

The scenes are drawn with Pillow (coloured shapes, not photographs) and the pair has random
weights: the decisions show the machinery, not safety.
"""

from __future__ import annotations

import io
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from spotstop.guard._types import Scene

__all__ = ["demo_scenes", "run_demo"]

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
    """``n`` generated scenes (drawn shapes + a request), deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = (int(rng.integers(160, 641)), int(rng.integers(120, 481)))
        fmt = "JPEG" if rng.random() < 0.7 else "PNG"
        req = _REQUESTS[int(rng.integers(len(_REQUESTS)))]
        sit = situations[i] if situations is not None else None
        out.append(Scene(_draw_scene(rng, size, fmt), req, sit))
    return out


def make_demo_bundle(root: Path, *, pool_size: int = 24, seed: int = 0) -> Path:
    """Tiny pair → bundle → frozen fit on an unlabelled pool → situation policy.yaml."""
    from spotstop.calibrate._pool import fit_pool_policy
    from spotstop.export.bundle import write_bundle
    from spotstop.export.tiny import TINY_MEMBERS, build_tiny_pair
    from spotstop.guard.policies import dump_policy

    tiny = root / "tiny"
    if not all((tiny / m / "model.safetensors").is_file() for m in TINY_MEMBERS):
        print(f"building the tiny TEST pair in {tiny} …")
        build_tiny_pair(tiny, seed=0)
    bdir = root / "bundle"
    if bdir.exists():
        shutil.rmtree(bdir)
    write_bundle([tiny / m for m in TINY_MEMBERS], bdir, name="tiny-demo")
    pool = demo_scenes(pool_size, seed=seed + 1000)
    # fusion statistics and the frozen cut t0 on the pool; situation recentering on top
    fit = fit_pool_policy(bdir, pool, kind="situation", settings={"window": 8, "min_refs": 3})
    dump_policy(
        replace(
            fit,
            fitted_on={
                **dict(fit.fitted_on),
                "what": "unlabelled pool of generated demo scenes (TEST pair: meaningless)",
                "seed": seed + 1000,
            },
        ),
        bdir / "policy.yaml",
    )
    return bdir


def run_demo(root: Path, *, seed: int = 0, out: Any = print) -> Path:
    """Run the demo under ``root``; returns the decision log's path."""
    from spotstop.guard._guard import Guard

    bdir = make_demo_bundle(root, seed=seed)
    log_path = root / "decisions.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(str(log_path) + suffix).unlink(missing_ok=True)
    shutil.rmtree(root / "state", ignore_errors=True)  # the situation windows of a past run
    sits: list[str | None] = ["kitchen-1"] * 6 + ["garage-2"] * 2 + [None] * 4
    scenes = demo_scenes(len(sits), seed=seed, situations=sits)
    with Guard(bdir, log=log_path, variants=("scene", "gray")) as guard:
        # one call per scene, as a robot asks before each action
        decisions = [guard.check(s) for s in scenes]
        names = guard.bundle_member_names
    out("")
    out("spotstop demo — TINY TEST PAIR: random weights, so these decisions mean nothing.")
    out(f"bundle {guard.bundle_id}   policy: situation recentering (window 8, ≥3 references),")
    out("falling back to the frozen cut t0 fitted on an unlabelled pool of 24 generated scenes.")
    out("")
    short = [n.replace("tiny-", "") for n in names]
    head = f"{'#':>2}  {'situation':<10} {'request':<38} " + " ".join(f"{s:>9}" for s in short)
    head += f" {'S':>7} {'thresh':>7}  {'rule':<18} label"
    out(head)
    out("-" * len(head))
    for i, (s, d) in enumerate(zip(scenes, decisions, strict=True), 1):
        req = s.request if len(s.request) <= 38 else s.request[:35] + "..."
        ms = " ".join(f"{d.member_scores.get(n, float('nan')):>+9.3f}" for n in names)
        flag = f"  (fail-closed: {d.fail_reason})" if d.fail_closed else ""
        out(
            f"{i:>2}  {s.situation_id or '-':<10} {req:<38} {ms} {d.fused_score:>+7.3f} "
            f"{d.threshold:>+7.3f}  {d.policy:<18} {d.label}{flag}"
        )
    out("")
    out("Scenes 1–3 of kitchen-1 use the frozen cut; from scene 4 on, the threshold is the mean S")
    out("of the situation's earlier scenes (recentering). Scenes without a situation use t0.")
    out(
        f"decision log: {log_path}  ({len(decisions)} rows; read it with spotstop.guard.DecisionLog)"
    )
    return log_path
