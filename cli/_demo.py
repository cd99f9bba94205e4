"""``spotstop demo``: the guard end to end on the tiny TEST pair.

Builds the tiny pair if absent, writes a bundle, fits the frozen reference statistics and
cut on an unlabelled pool of generated scenes, then checks a dozen generated scenes — among
them several scenes of one situation, to show situation recentering taking over from the
frozen cut once enough references exist — prints a table and says where the log is.

The demo crosses every room (export builds the pair and the bundle, calibrate fits the
policy, guard checks), so it lives in the composition root, which may import them all; it
imports them when it runs. The scenes are drawn with Pillow
(:func:`spotstop.export.scenes.demo_scenes`: coloured shapes, not photographs) and the pair
has random weights: the decisions show the machinery, not safety.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

__all__ = ["add_demo_parser", "demo_command", "make_demo_bundle", "run_demo"]


def add_demo_parser(sub: Any) -> None:
    """``spotstop demo``."""
    p = sub.add_parser(
        "demo",
        help="run the guard end to end on the tiny TEST pair",
        description=(
            "Build the tiny test pair if absent, write a bundle, fit the frozen reference "
            "statistics and cut on an unlabelled pool of generated scenes, then check a dozen "
            "generated scenes (several from one situation, to show situation recentering) and "
            "print the decisions and where the log is. The pair has random weights: the "
            "decisions show the machinery, not safety."
        ),
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="working folder (default: $SPOTSTOP_HOME/demo, ~/.cache/spotstop/demo)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    p.set_defaults(func=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    """Run ``spotstop demo``."""
    from spotstop.guard._config import spotstop_home

    root = args.dir or spotstop_home() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    run_demo(root, seed=args.seed)
    return 0


def make_demo_bundle(root: Path, *, pool_size: int = 24, seed: int = 0) -> Path:
    """Tiny pair → bundle → frozen fit on an unlabelled pool → situation policy.yaml."""
    from spotstop.calibrate._pool import fit_pool_policy
    from spotstop.export.bundle import write_bundle
    from spotstop.export.scenes import demo_scenes
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
    from spotstop.export.scenes import demo_scenes
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
    out(f"policy version {guard.policy_config.version_id}: every decision logs it, with its kind")
    out("and the fusion fingerprint, so `spotstop card` can replay what decided.")
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
