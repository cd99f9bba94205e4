"""``spotstop demo``: the guard end to end on the tiny TEST pair trained on the toy world.

Writes the trained tiny pair if absent (:mod:`spotstop.export.train`: the committed weights),
writes a bundle, fits the frozen reference statistics and cut on an unlabelled pool of
toy-world scenes, then checks twelve held-out world scenes (:mod:`spotstop.export.world`) —
several of one room, to show situation recentering taking over from the frozen cut once
enough references exist — and prints the decisions beside the world's rule, and where the
log is.

The demo crosses every room (export builds the pair and the bundle, calibrate fits the
policy, guard checks), so it lives in the composition root, which may import them all; it
imports them when it runs. The world is drawn shapes labelled by a rule table: the decisions
show the method working on that world, never anything about real safety.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DemoLogRun",
    "add_demo_parser",
    "demo_command",
    "make_demo_bundle",
    "run_demo",
    "write_demo_log",
]


def add_demo_parser(sub: Any) -> None:
    """``spotstop demo``."""
    p = sub.add_parser(
        "demo",
        help="run the guard end to end on the tiny TEST pair trained on the toy world",
        description=(
            "Write the tiny test pair trained on the toy world (`spotstop world --rules`) if "
            "absent, write a bundle, fit the frozen reference statistics and cut on an "
            "unlabelled pool of world scenes, then check twelve held-out world scenes (several "
            "from one room, to show situation recentering) and print the decisions beside the "
            "world's rule, and where the log is. A toy world of drawn shapes: the decisions "
            "show the method, never anything about real safety."
        ),
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="working folder (default: $SPOTSTOP_HOME/demo, ~/.cache/spotstop/demo; with "
        "--write-card-log: where the pair, bundle and policy state go, default a temporary "
        "folder)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the demo world's scenes (default 0; with --write-card-log: "
        f"{DEMO_LOG_SEED}, the packaged log's)",
    )
    p.add_argument(
        "--write-card-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="maintainers: instead of the demo, write the labelled decision log that `spotstop "
        "card --demo` reads (the packaged one is diagnostics/data/demo_log.sqlite, with "
        "demo_log.json beside it) by running the guard on the trained tiny TEST pair over a "
        "held-out toy world; the same seed gives the same decisions",
    )
    p.set_defaults(func=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    """Run ``spotstop demo``."""
    from spotstop.guard import spotstop_home

    if args.write_card_log is not None:
        seed = DEMO_LOG_SEED if args.seed is None else args.seed
        run = write_demo_log(args.write_card_log, seed=seed, work_dir=args.dir, progress=True)
        print(run.summary())
        return 0
    root = args.dir or spotstop_home() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    run_demo(root, seed=0 if args.seed is None else args.seed)
    return 0


def _demo_members(root: Path) -> list[Path]:
    """The trained tiny pair under ``root/tiny-trained`` (written from the committed weights if
    absent or altered)."""
    from spotstop.export.train import TRAINING, build_trained_pair, trained_pair_ready

    folder = root / "tiny-trained"
    if not trained_pair_ready(folder):
        print(f"writing the trained tiny TEST pair in {folder} …")
        build_trained_pair(folder)
    return [folder / r.member for r in TRAINING]


def make_demo_bundle(
    root: Path,
    *,
    pool_size: int = 24,
    seed: int = 0,
    members: Sequence[Path] | None = None,
) -> Path:
    """The demo's bundle, without checking anything: returns its folder, ``root/bundle``.

    Pair → bundle → frozen fit on an unlabelled pool of ``pool_size`` toy-world scenes (world
    seed ``seed + 1000``) → situation policy.yaml (window 8, at least 3 references).
    ``members``: the member folders (default: the trained tiny TEST pair, written under
    ``root`` when absent). A bundle already at ``root/bundle`` is replaced. Its decisions mean
    something on the toy world only. Needs the extras ``spotstop demo`` needs (export, diag).
    """
    from spotstop.calibrate import fit_pool_policy
    from spotstop.export.bundle import write_bundle
    from spotstop.export.world import WorldOptions, case_scene, world_cases
    from spotstop.guard.policies import dump_policy

    folders = list(members) if members is not None else _demo_members(root)
    bdir = root / "bundle"
    if bdir.exists():
        shutil.rmtree(bdir)
    write_bundle(folders, bdir, name="tiny-demo")
    opts = WorldOptions(rooms=max(1, pool_size // 4), contrasts_per_room=2, offsets=_OFFSETS)
    # no situation ids: the pool's rooms are not the checked ones, so they seed no window
    pool = [case_scene(c, opts, situation=False) for c in world_cases(seed + 1000, opts)]
    pool = pool[:pool_size]
    # fusion statistics and the frozen cut t0 on the pool; situation recentering on top
    fit = fit_pool_policy(bdir, pool, kind="situation", settings={"window": 8, "min_refs": 3})
    dump_policy(
        replace(
            fit,
            fitted_on={
                **dict(fit.fitted_on),
                "what": "unlabelled pool of toy-world scenes (`spotstop world`, TEST pair)",
                "seed": seed + 1000,
            },
        ),
        bdir / "policy.yaml",
    )
    return bdir


#: the demo world's lighting offsets: rooms lit differently enough to shift the scores
_OFFSETS = 0.6


def demo_cases(seed: int) -> tuple[list[Any], list[Any], Any]:
    """The demo's twelve toy-world cases, their scenes and the world's options: three contrasts
    in one room, one in a second, and two contrasts checked without a situation id."""
    from spotstop.export.world import WorldOptions, case_scene, world_cases

    opts = WorldOptions(rooms=3, contrasts_per_room=3, offsets=_OFFSETS)
    cases = world_cases(seed, opts)
    by_room = [[c for c in cases if c.room.room_id == f"room-{i:03d}"] for i in range(3)]
    chosen = by_room[0][:6] + by_room[1][:2] + by_room[2][:4]
    scenes = [case_scene(c, opts, situation=i < 8) for i, c in enumerate(chosen)]
    return chosen, scenes, opts


def run_demo(root: Path, *, seed: int = 0, out: Any = print) -> Path:
    """``spotstop demo`` as a function: build the bundle (:func:`make_demo_bundle`), check
    the twelve held-out world scenes and write their decisions to ``root/decisions.sqlite``
    (replaced). ``out`` receives each line of the report (``print`` by default); returns the
    decision log's path. Needs the extras ``spotstop demo`` needs (export, diag).
    """
    from spotstop.guard import Guard

    bdir = make_demo_bundle(root, seed=seed)
    log_path = root / "decisions.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(str(log_path) + suffix).unlink(missing_ok=True)
    shutil.rmtree(root / "state", ignore_errors=True)  # the situation windows of a past run
    cases, scenes, _ = demo_cases(seed)
    with Guard(bdir, log=log_path, variants=("scene", "gray")) as guard:
        # one call per scene, as a robot asks before each action
        decisions = [guard.check(s) for s in scenes]
        names = guard.bundle_member_names
    out("")
    out("spotstop demo — the tiny TEST pair trained on a TOY WORLD (`spotstop world --rules`):")
    out("drawn shapes labelled by a rule table. The decisions show the method on that world,")
    out("never anything about real safety.")
    out(f"bundle {guard.bundle_id}   policy: situation recentering (window 8, ≥3 references),")
    out("falling back to the frozen cut t0 fitted on an unlabelled pool of 24 world scenes.")
    out(f"policy version {guard.policy_config.version_id}: every decision logs it, with its kind")
    out("and the fusion fingerprint, so `spotstop card` can replay what decided.")
    out("")
    short = [n.replace("tiny-", "") for n in names]
    head = f"{'#':>2}  {'situation':<9} {'request':<34} " + " ".join(f"{s:>8}" for s in short)
    head += f" {'S':>6} {'thresh':>6}  {'rule':<10} {'label':<6} {'world':<6}"
    out(head)
    out("-" * len(head))
    agree = 0
    for i, (c, s, d) in enumerate(zip(cases, scenes, decisions, strict=True), 1):
        req = s.request if len(s.request) <= 34 else s.request[:31] + "..."
        ms = " ".join(f"{d.member_scores.get(n, float('nan')):>+8.2f}" for n in names)
        truth = "UNSAFE" if c.label else "SAFE"
        agree += d.label == truth
        mark = "" if d.label == truth else "  ✗"
        flag = f"  (fail-closed: {d.fail_reason})" if d.fail_closed else ""
        out(
            f"{i:>2}  {s.situation_id or '-':<9} {req:<34} {ms} {d.fused_score:>+6.2f} "
            f"{d.threshold:>+6.2f}  {d.deciding_kind or '-':<10} {d.label:<6} {truth:<6}{mark}{flag}"
        )
    out("")
    out(f"The guard's answers follow the world's rule on {agree} of {len(cases)} scenes (✗: not).")
    pol = guard.policy_config.policy
    kappa = getattr(pol, "prior_weight", 0.0)
    out("Scenes 1–3 of room-000 use the frozen cut; from scene 4 on, the threshold is the mean S")
    if kappa > 0:
        out(f"of the room's earlier scenes and {kappa:g} pseudo-scenes at t0 (recentering, shrunk")
        out("towards t0 while the room has few scenes). Scenes without a situation use t0.")
    else:
        out("of the room's earlier scenes (recentering). Scenes without a situation use t0.")
    out(
        f"decision log: {log_path}  ({len(decisions)} rows; read it with spotstop.guard.DecisionLog)"
    )
    return log_path


# -- the labelled demo log that `spotstop card --demo` reads ---------------------------------

#: the packaged demo log's world seed: one the training never used (it draws seed 0's world)
DEMO_LOG_SEED = 2025
#: the packaged demo log's world: rooms × contrasts × 2 scenes, rooms lit apart, a file cue
DEMO_LOG_ROOMS = 24
DEMO_LOG_CONTRASTS_PER_ROOM = 10
DEMO_LOG_FILE_CUE = 0.3
#: the share of the scenes checked under the situation policy before the reviewers' labels so
#: far are used to recalibrate a conformal cut (then activated for the rest)
DEMO_LOG_RECALIBRATE_AFTER = 0.5
#: the conformal cut's miss-rate target (marginal guarantee: one unsafe case per room)
DEMO_LOG_ALPHA = 0.1
#: the reviewer name the labels carry
DEMO_LOG_REVIEWER = "the toy world's rule (spotstop world)"


@dataclass(frozen=True)
class DemoLogRun:
    """What :func:`write_demo_log` wrote: the log, its description (``demo_log.json`` beside
    it) and the counts."""

    path: Path
    meta_path: Path
    meta: Mapping[str, Any]

    def summary(self) -> str:
        m = self.meta
        return (
            f"wrote {self.path} ({m['n_decisions']} decisions, {m['n_labelled']} labelled, "
            f"{m['bytes']:,} bytes) and {self.meta_path.name}: the trained tiny TEST pair on a "
            f"toy world (seed {m['seed']}); the guard's answers follow the world's rule on "
            f"{m['n_agree']} of {m['n_decisions']}. Policy versions: "
            + ", ".join(f"{v['kind']} ({v['n']})" for v in m["policy_versions"])
        )


def demo_log_options(
    rooms: int = DEMO_LOG_ROOMS, contrasts_per_room: int = DEMO_LOG_CONTRASTS_PER_ROOM
) -> Any:
    """The held-out toy world of the demo log (:class:`spotstop.export.world.WorldOptions`)."""
    from spotstop.export.world import WorldOptions

    return WorldOptions(
        rooms=rooms,
        contrasts_per_room=contrasts_per_room,
        offsets=_OFFSETS,
        file_cue=DEMO_LOG_FILE_CUE,
    )


def _remove_log(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _label_decisions(guard: Any, checked: Sequence[tuple[Any, Any]]) -> None:
    """Attach the world's label and contrast to each (decision, case), as reviewers do."""
    guard.flush_pending()
    guard.log.set_labels(
        [
            (d.decision_id, "unsafe" if c.label else "safe", c.contrast_id, DEMO_LOG_REVIEWER)
            for d, c in checked
        ]
    )


def _recalibrate_conformal(guard: Any, bdir: Path, log_path: Path, seed: int) -> str:
    """Fit a conformal cut on the labelled log so far (the fusion kept), write it as the next
    policy version, activate it and reload the guard; returns the new version's name."""
    from spotstop.calibrate import Recalibrator, activate_policy_version, write_policy_version
    from spotstop.calibrate._logdata import read_log_for_bundle

    data = read_log_for_bundle(log_path, guard.bundle)
    rec = Recalibrator(
        "conformal",
        alpha=DEMO_LOG_ALPHA,
        guarantee="marginal",
        refit_fusion=False,
        rng=seed,
    ).fit(data, guard.policy_config)
    version = write_policy_version(bdir, rec.to_config())
    activate_policy_version(bdir, version.number)
    guard.reload_policy()
    return version.name


def write_demo_log(
    out_path: str | Path,
    *,
    seed: int = DEMO_LOG_SEED,
    rooms: int = DEMO_LOG_ROOMS,
    contrasts_per_room: int = DEMO_LOG_CONTRASTS_PER_ROOM,
    work_dir: str | Path | None = None,
    progress: bool = True,
) -> DemoLogRun:
    """Write the labelled decision log of ``spotstop card --demo`` to ``out_path``.

    The trained tiny TEST pair (:func:`_demo_members`) and its bundle with the situation policy
    fitted on an unlabelled pool (:func:`make_demo_bundle`) check every scene of a held-out toy
    world (:func:`demo_log_options`, ``seed``; each scene with its room as the situation), one
    scene per call in a shuffled order, through the real :class:`~spotstop.guard._guard.Guard`
    with the gray and request-only passes. After the first half, the scenes so far get the
    world's labels and contrasts in the log's labels table (:meth:`DecisionLog.set_labels`, as
    reviewers do), a conformal cut is recalibrated from them (``spotstop recalibrate``'s
    :class:`~spotstop.calibrate._recalibrate.Recalibrator`, fusion kept) and activated; the
    second half runs under it and is labelled too. The log is then compacted (VACUUM) and
    ``<out_path stem>.json`` written beside it (seed, world options, counts, sha256).

    ``work_dir``: where the pair, the bundle and the policy state go (default: a temporary
    folder, removed after). The same seed and library versions give the same decisions.
    """
    import hashlib
    import json
    import sqlite3
    import tempfile

    import numpy as np
    from spotstop.export.world import case_scene, world_cases
    from spotstop.guard import Guard

    out = Path(out_path)
    if out.suffix != ".sqlite":
        raise ValueError(f"the demo log is a SQLite file: name it *.sqlite; got {str(out)!r}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    opts = demo_log_options(rooms, contrasts_per_room)
    cases = world_cases(seed, opts)
    order = np.random.default_rng(seed).permutation(len(cases))
    n_first = round(len(cases) * DEMO_LOG_RECALIBRATE_AFTER)
    with tempfile.TemporaryDirectory(prefix="spotstop-demo-log-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        bdir = make_demo_bundle(root, seed=seed, members=_demo_members(root))
        shutil.rmtree(root / "state", ignore_errors=True)
        _remove_log(out)
        bar: Any = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(cases), desc="checking the demo world", unit="scene")
        checked: list[tuple[Any, Any]] = []
        with Guard(
            bdir, log=out, variants=("scene", "gray", "text"), state_dir=root / "state"
        ) as guard:
            first_version = guard.policy_config.version_id
            for i, k in enumerate(order):
                if i == n_first:
                    _label_decisions(guard, checked)
                    _recalibrate_conformal(guard, bdir, out, seed)
                case = cases[int(k)]
                checked.append((guard.check(case_scene(case, opts)), case))
                if bar is not None:
                    bar.update(1)
            _label_decisions(guard, checked[n_first:])
            bundle_id = guard.bundle_id
            names = list(guard.bundle_member_names)
        if bar is not None:
            bar.close()
    conn = sqlite3.connect(out, isolation_level=None)  # one self-contained, compact file
    try:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("VACUUM")
    finally:
        conn.close()
    versions: dict[str, dict[str, Any]] = {}
    for d, _ in checked:
        v = versions.setdefault(str(d.policy_version), {"kind": d.policy_kind, "n": 0})
        v["n"] += 1
    meta = {
        "what": (
            "spotstop card --demo: the decision log of the trained tiny TEST pair on a TOY "
            "WORLD (drawn shapes labelled by a rule table, `spotstop world --rules`); the "
            "numbers show the method on that world, never anything about real safety"
        ),
        "regenerate": f"spotstop demo --write-card-log PATH/{out.name} --seed {seed}",
        "seed": seed,
        "world": {**asdict(opts), "size": list(opts.size)},
        "order": "shuffled with numpy default_rng(seed); one scene per check() call",
        "policies": (
            "situation recentering (frozen fallback) fitted on an unlabelled pool, then a "
            f"conformal cut (alpha {DEMO_LOG_ALPHA}, marginal) recalibrated from the first "
            f"{n_first} labelled decisions and activated"
        ),
        "policy_versions": [{"version": k, **v} for k, v in versions.items()],
        "first_policy_version": first_version,
        "bundle_id": bundle_id,
        "members": names,
        "variants": ["scene", "gray", "text"],
        "n_decisions": len(checked),
        "n_labelled": len(checked),
        "n_unsafe": int(sum(c.label for _, c in checked)),
        "n_agree": int(sum((d.label == "UNSAFE") == bool(c.label) for d, c in checked)),
        "n_fail_closed": int(sum(bool(d.fail_closed) for d, _ in checked)),
        "labels": DEMO_LOG_REVIEWER,
        "bytes": out.stat().st_size,
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
    }
    meta_path = out.with_suffix(".json")
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return DemoLogRun(out, meta_path, meta)
