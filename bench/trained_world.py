"""Benchmark: issue 25's acceptance, measured -- the trained tiny TEST pair on held-out toy worlds.

Run: ``python bench/trained_world.py [--quick] [--n-boot N] [--no-export] [--only-export]
[--results]`` (``--only-export``: item 6 alone; with ``--results`` its rows replace item 6's in
the section, which then says when and under what load item 6 ran again).

The pair: ``spotstop tiny --trained`` (the committed weights of ``export/trained/``, trained on
world seed 0). A TEST pair on a TOY world of drawn shapes: these figures show the method
working where the answer is known, never anything about real safety. Every world below is
drawn from a seed the training never used, so its rooms, layouts and lighting are new.

Every statistic is the project's own: the Avg-2 fusion and the frozen cut of
:func:`spotstop.calibrate.fit_frozen` (on an unlabelled pool of another seed), the guard's
policies (:mod:`spotstop.guard.policies`: frozen, situation, cascade, conformal; decisions by
``decide_batch`` / ``replay``), :func:`spotstop.diagnostics.group_bootstrap` (AUROC, Spot-Stop,
batch recovery), the group-bootstrap sums of :func:`spotstop.diagnostics.group_sum_draws`, the cue
analysis of :mod:`spotstop.diagnostics.cues` (reliance, shift with the real OCR detector,
select), ``spotstop export`` / ``spotstop verify-bundle`` and ``spotstop demo``.

Intervals: 95 % percentile intervals of a group bootstrap whose groups are the rooms (all
contrasts of a room together: the card's default ``situation`` unit), ``--n-boot`` draws.

Items (issue 25, "Acceptance"):

1. AUROC of the Avg-2 pair (frozen statistics) and of each member.
2. The SAFE-leaning member's Spot-Stop decomposition at cut 0 and the batch-mean recovery.
3. Situation recentering against the frozen cut in a world with strong room offsets.
4. Reliance on text (seed 002 Eq. 2) on a sign-free source set.
5. ``select`` on a deployment whose signs mislead on half the frames, and on one without.
6. ``verify-bundle`` of int8 and int4 exports (its own scenes, and held-out world scenes: the
   goal's world and two more), exported as by default and calibrated on the pool world's
   frames (``--calibration-frames``).
7. The cascade's share and accuracy; the conformal cut's miss rate on a fresh seed.
8. ``spotstop demo``'s agreement with the world's rule.

``--results`` writes section ``trained-world`` of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

SECTION = "trained-world"

#: world seeds; the training drew seed 0 only
SEEDS = {
    "pool": 101,  # unlabelled pool: fusion statistics and the frozen cut t0
    "eval": 202,  # held-out scenes: AUROC, Spot-Stop, cascade, conformal check
    "cal": 303,  # labelled unsafe calibration scenes of the conformal cut
    "off_pool": 404,  # unlabelled pool of the strong-offset world
    "off_eval": 505,  # the strong-offset world: situation against frozen
    "source": 606,  # the sign-free source set of the reliance run
    "signs": 707,  # deployment: every frame signed, half of the signs mislead
    "plain": 808,  # deployment: no signs
    "ocr_cal": 909,  # the text detector's calibration set
    "verify": 1010,  # the scene table verify-bundle checks the exported pair on
}
#: two more held-out verify worlds (same size): how far one world's max |ds| is from another's
VERIFY_AGAIN = (1111, 1212)

#: room lighting offsets: moderate in the main worlds; item 3 sweeps strong ones, and its goal
#: is read at the world's full scale (1.0: brightness 0.4-1.25, tint up to 25 levels)
OFFSETS = 0.3
SITUATION_OFFSETS = (0.8, 1.0)
ALPHA, DELTA = 0.1, 0.1  # the conformal cut's miss rate and PAC confidence
CASCADE_SHARE = 0.9  # the paper's operating point


@dataclass(frozen=True)
class Sizes:
    """How big each world is (rooms x contrasts per room; two scenes per contrast)."""

    pool: tuple[int, int]
    eval: tuple[int, int]
    cal: tuple[int, int]
    off_pool: tuple[int, int]
    off_eval: tuple[int, int]
    source: tuple[int, int]
    deploy: tuple[int, int]
    ocr_cal: tuple[int, int]
    world_spearman: int
    verify: tuple[int, int]
    n_boot: int
    precisions: tuple[str, ...]
    quantizer: str


FULL = Sizes(
    pool=(24, 4),
    eval=(48, 8),
    cal=(64, 2),
    off_pool=(24, 4),
    # 192 rooms: at 48 (its first 48) the situation gain's interval was as wide as the gain
    off_eval=(192, 8),
    source=(24, 1),
    deploy=(24, 2),
    ocr_cal=(32, 2),
    world_spearman=128,
    verify=(8, 2),
    n_boot=10_000,
    precisions=("int8", "int4"),
    quantizer="gptq",
)
QUICK = Sizes(
    pool=(16, 2),
    eval=(32, 3),
    cal=(32, 1),
    off_pool=(16, 2),
    off_eval=(32, 6),
    source=(8, 1),
    deploy=(8, 2),
    ocr_cal=(12, 2),
    world_spearman=32,
    verify=(4, 2),
    n_boot=500,
    precisions=("int8",),
    quantizer="gptq",
)


# ---------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Row:
    """One line of the table: item, what was measured, its value, n, the goal and whether the
    measurement meets it (None: no goal, reported only)."""

    item: str
    what: str
    value: str
    n: str
    goal: str
    met: bool | None


def fmt(e: Any, signed: bool = False) -> str:
    """An :class:`~spotstop.diagnostics.Estimate` as ``value [low, high]``."""
    from spotstop.diagnostics import fmt_estimate

    return fmt_estimate(e, signed=signed)


def at_least(e: Any, x: float) -> bool:
    return bool(math.isfinite(e.value) and e.value >= x)


def interval_above(e: Any, x: float = 0.0) -> bool:
    """The whole interval lies above ``x``."""
    return bool(math.isfinite(e.ci.low) and e.ci.low > x)


def interval_covers(e: Any, x: float = 0.0) -> bool:
    return bool(math.isfinite(e.ci.low) and math.isfinite(e.ci.high) and e.ci.contains(x))


def verdict(met: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[met]


def render(rows: Sequence[Row]) -> list[str]:
    """The table, one line per row, columns aligned."""
    head = Row("#", "measure", "value [95% CI]", "n", "goal", None)
    cells = [
        (r.item, r.what, r.value, r.n, r.goal, "met" if r is head else verdict(r.met))
        for r in (head, *rows)
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(6)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(6)).rstrip() for c in cells]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def demo_agreement(lines: Sequence[str]) -> tuple[int, int] | None:
    """(k, n) from the demo's line "... follow the world's rule on k of n scenes", or None."""
    for line in lines:
        m = re.search(r"follow the world's rule on (\d+) of (\d+) scenes", line)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def arrival_order(situation_ids: Sequence[str], seed: int) -> np.ndarray:
    """The order a robot meets the scenes: room after room (first appearance), the scenes of
    a room in a random order drawn from ``seed`` (not the CSV's safe/unsafe alternation)."""
    rng = np.random.default_rng(seed)
    sids = np.asarray(situation_ids, dtype=object)
    rooms = list(dict.fromkeys(sids.tolist()))
    return np.concatenate([rng.permutation(np.flatnonzero(sids == r)) for r in rooms])


def shown_args(argv: Sequence[str]) -> list[str]:
    """The command line as RESULTS.md shows it: without the local paths of --work/--json."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--work", "--json"):
            skip = True
        elif not a.startswith(("--work=", "--json=")):
            out.append(a)
    return out


def calibration_cue(sign_cue: str) -> str:
    """A world scene's cue in the detector's calibration set: the claim its sign makes
    (``reassuring``/``alarming``), or ``none`` (no sign, or a neutral one)."""
    return sign_cue if sign_cue in ("reassuring", "alarming") else "none"


def ranks_follow_source_error(ranking: Sequence[Any]) -> bool:
    """Whether every candidate's rank equals its rank by the source-error intercept alone."""
    return all(p.rank == p.rank_by_source_error for p in ranking)


# ---------------------------------------------------------------------------------------------
# worlds and scores


@dataclass
class Scored:
    """Scenes of one world with every member's raw score, in CSV order."""

    tag: str
    cases: list[Any]
    scores: dict[str, np.ndarray]

    @property
    def label(self) -> np.ndarray:
        return np.array([c.label for c in self.cases], dtype=np.int8)

    @property
    def sids(self) -> list[str]:
        return [f"{self.tag}/{c.room.room_id}" for c in self.cases]

    @property
    def room_codes(self) -> np.ndarray:
        _, codes = np.unique(np.asarray(self.sids), return_inverse=True)
        return np.asarray(codes.reshape(-1), dtype=np.intp)

    def table(self, score: np.ndarray) -> Any:
        from spotstop.diagnostics import CaseTable

        return CaseTable(
            case_id=[f"{self.tag}/{c.case_id}" for c in self.cases],
            label=self.label,
            score=score,
            contrast_id=[f"{self.tag}/{c.contrast_id}" for c in self.cases],
            situation_id=self.sids,
            member_scores=self.scores,
        )


def world_options(size: tuple[int, int], **kw: Any) -> Any:
    from spotstop.export.world import WorldOptions

    return WorldOptions(rooms=size[0], contrasts_per_room=size[1], test_share=1.0, **kw)


def score_world(
    members: Mapping[str, Any],
    tag: str,
    seed: int,
    opts: Any,
    *,
    chunk: int = 32,
    limit: int | None = None,
) -> Scored:
    """Every member's score of the world's scenes (its first ``limit``, None: all)."""
    from spotstop.export.world import case_scene, world_cases
    from tqdm import tqdm

    cases = world_cases(seed, opts)[:limit]
    scenes = [case_scene(c, opts) for c in tqdm(cases, desc=f"drawing {tag}", unit="scene")]
    scores = {}
    for name, m in members.items():
        vals: list[float] = []
        with tqdm(total=len(scenes), desc=f"{name} on {tag}", unit="scene") as bar:
            for i in range(0, len(scenes), chunk):
                vals += [r.score for r in m.score(scenes[i : i + chunk])]
                bar.update(min(chunk, len(scenes) - i))
        scores[name] = np.asarray(vals, dtype=np.float64)
    return Scored(tag, cases, scores)


# ---------------------------------------------------------------------------------------------
# the items


def auroc_estimate(table: Any, n_boot: int, rng: int) -> Any:
    """The group-bootstrap AUROC of ``table`` (:func:`~spotstop.diagnostics.group_bootstrap`;
    its batch-recovery ratio, undefined for a score without a threshold part, is not read)."""
    from spotstop.diagnostics import UnboundedRatioWarning, group_bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedRatioWarning)
        return group_bootstrap(table, n_boot=n_boot, rng=rng)["auroc"]


def item_auroc(fit: Any, ev: Scored, names: Sequence[str], n_boot: int) -> tuple[list[Row], Any]:

    fused = fit.fusion.fuse_many(ev.scores)
    n = f"{len(ev.cases)} scenes, {len(set(ev.sids))} rooms"
    pair = auroc_estimate(ev.table(fused), n_boot, rng=1)
    rows = [
        Row(
            "1",
            "pair AUROC (Avg-2, frozen statistics)",
            fmt(pair),
            n,
            ">= 0.9",
            at_least(pair, 0.9),
        )
    ]
    for m in names:
        e = auroc_estimate(ev.table(ev.scores[m]), n_boot, rng=1)
        rows.append(Row("1", f"{m} AUROC", fmt(e), n, "> 0.8", bool(e.value > 0.8)))
    return rows, fused


def item_spot_stop(ev: Scored, member: str, n_boot: int) -> list[Row]:
    from spotstop.diagnostics import UnboundedRatioWarning, group_bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedRatioWarning)  # the row says it instead
        b = group_bootstrap(ev.table(ev.scores[member]), cut=0.0, n_boot=n_boot, rng=2)
    n = f"{b['A'].n} contrasts"
    thr, rec, gain = b["threshold_part"], b["batch_recovery"], b["batch_gain"]
    rows = [
        Row("2", f"{member} A (direct answer, cut 0)", fmt(b["A"]), n, "", None),
        Row("2", f"{member} A* (best single cut)", fmt(b["A_star"]), n, "", None),
        Row(
            "2",
            f"{member} threshold part A*-A",
            fmt(thr, True),
            n,
            "> 0, CI above 0",
            bool(thr.value > 0 and interval_above(thr)),
        ),
        Row("2", f"{member} A_batch (batch-mean cut)", fmt(b["A_batch"]), n, "", None),
        Row("2", f"{member} at cut 0: hit rate", fmt(b["hit_rate"]), n, "", None),
        Row("2", f"{member} at cut 0: false-alarm rate", fmt(b["false_alarm_rate"]), n, "", None),
    ]
    if math.isfinite(rec.value):
        rows.append(
            Row("2", "batch recovery (A_batch-A)/(A*-A)", fmt(rec), n, ">= 0.5", at_least(rec, 0.5))
        )
    else:
        rows.append(
            Row(
                "2",
                "batch recovery undefined (A*-A CI reaches 0); gain A_batch-A",
                fmt(gain, True),
                n,
                ">= 0.5 of A*-A",
                False,
            )
        )
    return rows


def replay_flags(policy: Any, fusion: Any, sc: Scored, order: np.ndarray) -> np.ndarray:
    """The guard's decisions on ``sc``'s scenes met in ``order``, one scene per check (the
    policy's state threaded through), mapped back to CSV order: True = UNSAFE."""
    from spotstop.guard.policies import batch_inputs, replay

    sids = np.asarray(sc.sids, dtype=object)[order].tolist()
    x = batch_inputs(fusion, {m: v[order] for m, v in sc.scores.items()}, sids)
    flags = np.empty(len(order), dtype=bool)
    flags[order] = replay(policy, x, state=None).unsafe
    return flags


def ba_draws(
    y: np.ndarray, flags: Sequence[np.ndarray], group: np.ndarray, n_boot: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Balanced accuracy of each flag vector (points (k,), draws (B, k)) from one set of
    group-bootstrap draws (:func:`spotstop.diagnostics.group_sum_draws`)."""
    from spotstop.diagnostics import group_sum_draws

    parts = [y == 1, y == 0]
    for f in flags:
        parts += [f & (y == 1), f & (y == 0)]
    point, draws = group_sum_draws(
        np.stack(parts).astype(float), group, n_boot=n_boot, rng=np.random.default_rng(seed)
    )

    def ba(s: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.stack(
                [
                    0.5 * (s[..., 2 + 2 * k] / s[..., 0] + 1 - s[..., 3 + 2 * k] / s[..., 1])
                    for k in range(len(flags))
                ],
                axis=-1,
            )

    return ba(point), ba(draws)


def room_shift(sc: Scored) -> dict[str, tuple[float, float]]:
    """Per member: the spread of the room means of its score (how far situations move it)
    over the gap between the mean UNSAFE and the mean SAFE score."""
    codes, y = sc.room_codes, sc.label
    out = {}
    for m, s in sc.scores.items():
        means = np.array([s[codes == k].mean() for k in range(int(codes.max()) + 1)])
        out[m] = (float(means.std(ddof=1)), float(s[y == 1].mean() - s[y == 0].mean()))
    return out


def item_situation(
    off_pool: Scored, off_eval: Scored, n_boot: int, offsets: float, goal: bool
) -> list[Row]:
    from spotstop.calibrate import fit_frozen
    from spotstop.diagnostics import Estimate, percentile_ci, situation_share
    from spotstop.guard.policies import SituationPolicy

    fit = fit_frozen(off_pool.scores)
    # the guard's defaults: window 8, 3 references, the prior's weight fitted on the pool's rooms
    situation = SituationPolicy.fit(fit.context(off_pool.scores, situation_id=off_pool.sids))
    # seed 000's rule as written: the plain mean of the references (no prior)
    paper = SituationPolicy.fit(
        fit.context(off_pool.scores, situation_id=off_pool.sids, settings={"prior_weight": 0.0})
    )
    order = arrival_order(off_eval.sids, seed=SEEDS["off_eval"])
    flags = [replay_flags(p, fit.fusion, off_eval, order) for p in (situation, paper, fit.policy)]
    y = off_eval.label
    point, draws = ba_draws(y, flags, off_eval.room_codes, n_boot, seed=3)
    n = len(y)
    est = [Estimate(float(point[k]), percentile_ci(draws[:, k]), n) for k in range(3)]

    def minus_frozen(k: int) -> Estimate:
        return Estimate(float(point[k] - point[2]), percentile_ci(draws[:, k] - draws[:, 2]), n)

    diff, diff_paper = minus_frozen(0), minus_frozen(1)
    nr = f"{n} scenes, {len(set(off_eval.sids))} rooms"
    rule = (
        f"window {situation.window}, >= {situation.min_refs} refs, "
        f"prior {situation.prior_weight:.2f} at t0"
    )
    shift = ", ".join(f"{m} {sd:.2f} / {gap:.2f}" for m, (sd, gap) in room_shift(off_eval).items())
    at = f"offsets {offsets:g}"
    # the card's situation statistics on the fused score: how much of it sits at room level,
    # and what recentering on ALL of a room's scenes (seed 000 Sec. 6.2, offline) gains over the
    # same rule on artificial rooms (the online guard sees only the scenes before each one)
    share = situation_share(
        off_eval.table(np.asarray(fit.fusion.fuse_many(off_eval.scores))),
        n_boot=min(n_boot, 1000),
        rng=4,
    )
    return [
        Row("3", f"{at}: room-mean sd / UNSAFE-SAFE gap", shift, nr, "", None),
        Row("3", f"{at}: fused score's situation share (ICC)", fmt(share.icc), nr, "", None),
        Row(
            "3",
            f"{at}: all of a room's scenes (offline) - artificial rooms: bal. acc.",
            fmt(share.ba_gain, True),
            nr,
            "",
            None,
        ),
        Row(
            "3",
            f"{at}: all of a room's scenes (offline) - artificial rooms: AUROC",
            fmt(share.auroc_gain, True),
            nr,
            "",
            None,
        ),
        Row(
            "3",
            f"{at}: frozen cut t0={fit.policy.threshold:+.3f}: balanced acc.",
            fmt(est[2]),
            nr,
            "",
            None,
        ),
        Row(
            "3", f"{at}: situation, plain mean (no prior): balanced acc.", fmt(est[1]), nr, "", None
        ),
        Row("3", f"{at}:   its gain over frozen", fmt(diff_paper, True), nr, "", None),
        Row("3", f"{at}: situation ({rule}): balanced acc.", fmt(est[0]), nr, "", None),
        Row(
            "3",
            f"{at}: situation - frozen",
            fmt(diff, True),
            nr,
            "CI above 0" if goal else "",
            interval_above(diff) if goal else None,
        ),
    ]


def sign_styles() -> int:
    """The world's ``sign_styles`` of the sign-trusting member's training signs (0: all)."""
    from spotstop.export.train import TRAINING

    return next(r.sign_styles for r in TRAINING if r.signs == "agreeing")


def matched_templates(styles: int) -> tuple[Any, ...]:
    """The cue templates whose look the world's first ``styles`` sign styles share (the
    world's i-th wording, font and colours are the i-th sign template's); all of them for 0."""
    from spotstop.diagnostics.cues import SIGN_TEMPLATES, TEMPLATES

    return TEMPLATES if not 0 < styles <= len(SIGN_TEMPLATES) else SIGN_TEMPLATES[:styles]


def item_reliance(
    folders: Mapping[str, Path],
    work: Path,
    sz: Sizes,
    n_boot: int,
    sign_member: str,
    lean_member: str,
) -> tuple[list[Row], Any]:
    """Reliance with the templates of the sign member's signs' look (the goal) and, beside
    it, with every template (how far its reading carries to looks it never saw)."""
    from spotstop.diagnostics.cues import load_candidates, measure_reliance, read_source_set
    from spotstop.export.world import build_world

    src = build_world(
        work / "source", seed=SEEDS["source"], options=world_options(sz.source, offsets=OFFSETS)
    )
    source = read_source_set(src.root)
    cands = load_candidates([str(folders[m]) for m in folders], threads=2)
    templates = matched_templates(sign_styles())
    run = measure_reliance(
        cands, source, n_boot=n_boot, rng=4, cache_dir=None, progress=True, templates=templates
    )
    every = measure_reliance(cands, source, n_boot=n_boot, rng=4, cache_dir=None, progress=True)
    res = run.result
    n = f"{res.n_sources} sources, {res.n_scenes} scenes"
    names = ", ".join(t.name for t in templates)
    rows = []
    for m in folders:
        r = res.candidates[m].cues["reassuring"]
        if m == sign_member:
            goal, met = (
                ">= 0.2, CI above 0",
                at_least(r.reliance, 0.2) and interval_above(r.reliance),
            )
        elif m == lean_member:
            goal, met = "CI covers 0", interval_covers(r.reliance)
        else:
            goal, met = "", None
        rows.append(
            Row(
                "4",
                f"{m} reliance, reassuring (P(wrong)), {names}",
                fmt(r.reliance, True),
                n,
                goal,
                met,
            )
        )
        e = every.result.candidates[m].cues["reassuring"]
        ne = f"{every.result.n_sources} sources, {every.result.n_scenes} scenes"
        rows.append(Row("4", "  every template", fmt(e.reliance, True), ne, "", None))
        fams = getattr(e, "families", {}) or {}
        for fam, fr in fams.items():
            rows.append(Row("4", f"    {fam} templates", fmt(fr.reliance, True), ne, "", None))
        hard = res.candidates[m].as_hard().cues["reassuring"]
        rows.append(
            Row("4", "  hard answer at its operating point", fmt(hard.reliance, True), n, "", None)
        )
        a = res.candidates[m].cues["alarming"]
        rows.append(
            Row("4", f"{m} reliance, alarming (P(wrong))", fmt(a.reliance, True), n, "", None)
        )
        if r.placebo_moves or a.placebo_moves:
            rows.append(Row("4", f"  {m}: the placebo edit moves the answers", "", n, "", None))
    return rows, run


def _frames(world: Any) -> Any:
    """A written world's images as deployment frames, labelled, grouped by room."""
    from spotstop.diagnostics.cues import DeploymentFrames

    paths = [world.root / c.image_name for c in world.cases]
    return DeploymentFrames(
        items=tuple((str(p), p.read_bytes) for p in paths),
        labels=np.array([c.label for c in world.cases], dtype=np.int8),
        groups=tuple(c.room.room_id for c in world.cases),
        source={"frames": str(world.root), "n_images": len(paths), "world_seed": world.seed},
    )


def sign_subsets(cases: Sequence[Any]) -> dict[str, np.ndarray]:
    """Masks of a world's scenes whose sign misleads, and whose sign claims the truth."""
    claim = np.array([c.sign_cue in ("reassuring", "alarming") for c in cases])
    mis = np.array([c.sign_misleading for c in cases], dtype=bool)
    return {"misleading": claim & mis, "agreeing": claim & ~mis}


def sign_following(members: Mapping[str, Any], dep: Any) -> list[Row]:
    """Each member's AUROC on the deployment's frames whose sign misleads and whose sign
    agrees (the world's own signs): a member that follows signs ranks the misleading ones
    backwards. A diagnostic beside item 5, not one of the acceptance goals."""
    from spotstop.diagnostics import auroc

    sc = score_world(members, "signs-frames", dep.seed, dep.options)
    y = sc.label
    rows = []
    for m in members:
        parts = []
        for key, mask in sign_subsets(sc.cases).items():
            if 0 < int(y[mask].sum()) < int(mask.sum()):
                parts.append(
                    f"{key} {auroc(y[mask], sc.scores[m][mask]):.3f} (n {int(mask.sum())})"
                )
        rows.append(
            Row(
                "5",
                f"  {m} AUROC on frames whose sign ...",
                ", ".join(parts),
                f"{len(y)} frames",
                "",
                None,
            )
        )
    return rows


def item_select(
    run: Any,
    work: Path,
    sz: Sizes,
    n_boot: int,
    sign_member: str,
    lean_member: str,
    members: Mapping[str, Any] | None = None,
) -> list[Row]:
    from spotstop.diagnostics.cues import measure_shift, select
    from spotstop.export.world import build_world
    from spotstop.guard.cues import RapidOcrDetector

    look = sign_styles()  # the deployment's signs look like those the sign member reads
    cal = build_world(
        work / "ocr-cal",
        seed=SEEDS["ocr_cal"],
        options=world_options(
            sz.ocr_cal, offsets=OFFSETS, signs=0.75, misleading=0.5, sign_styles=look
        ),
    )
    lines = ["image,cue"] + [f"{c.image_name},{calibration_cue(c.sign_cue)}" for c in cal.cases]
    (cal.root / "calibration.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    detector = RapidOcrDetector(threads=2).load()
    rows = []
    for key, kw in (
        ("signs", {"signs": 1.0, "misleading": 0.5, "sign_styles": look}),
        ("plain", {}),
    ):
        dep = build_world(
            work / f"deploy-{key}",
            seed=SEEDS[key],
            options=world_options(sz.deploy, offsets=OFFSETS, **kw),
        )
        shift = measure_shift(
            detector,
            _frames(dep),
            cal.root / "calibration.csv",
            n_boot=n_boot,
            rng=5,
            progress=True,
            # the world's stated unsafe share (each contrast: one safe, one unsafe scene), used
            # where fewer than 30 frames of a class are labelled (the quick run)
            prior=0.5,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an undefined cue: the row says so
            sel = select(run.result, shift)
        n = f"{len(dep.cases)} frames, {len(cal.cases)} cal."
        shares = ", ".join(f"{c} {fmt(shift.cues[c].misleading_share)}" for c in shift.cues)
        rows.append(Row("5", f"deployment '{key}': misleading shares", shares, n, "", None))
        if key == "signs":
            det = ", ".join(
                f"{c} sens {shift.cues[c].sens.value:.2f} fpr {shift.cues[c].fpr.value:.2f}"
                for c in shift.cues
            )
            rows.append(Row("5", "  the detector on its calibration set", det, n, "", None))
            if members is not None:
                rows += sign_following(members, dep)
        order = " > ".join(f"{p.name} {p.predicted_error.value:.3f}" for p in sel.ranking)
        if sel.dropped_cues:
            order += f" (dropped: {', '.join(sel.dropped_cues)})"
        if key == "signs":
            rows.append(
                Row(
                    "5",
                    "  the same order as by source error alone",
                    "yes" if ranks_follow_source_error(sel.ranking) else "no",
                    n,
                    "",
                    None,
                )
            )
            rows.append(
                Row(
                    "5",
                    "  select's ranking (predicted error)",
                    order,
                    n,
                    f"{lean_member} first",
                    sel.ranking[0].name == lean_member,
                )
            )
        else:
            rows.append(
                Row(
                    "5",
                    "  select's ranking (predicted error)",
                    order,
                    n,
                    "= ranking by source error",
                    ranks_follow_source_error(sel.ranking),
                )
            )
    return rows


def _cli(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spotstop.cli", *args]
    return subprocess.run(cmd, text=True, stdout=subprocess.PIPE if capture else None, check=False)


def write_world(out: Path, seed: int, size: tuple[int, int]) -> Path:
    """A held-out world written by ``spotstop world`` (as a user would); its ``world.csv``."""
    args = ["world", "--out", str(out), "--seed", str(seed), "--rooms", str(size[0])]
    args += ["--contrasts-per-room", str(size[1]), "--offsets", str(OFFSETS)]
    if _cli(*args, capture=True).returncode != 0:
        raise RuntimeError(f"`spotstop {' '.join(args)}` failed")
    return out / "world.csv"


def item_export(
    folders: Mapping[str, Path], work: Path, sz: Sizes, ev: Scored, opts: Any
) -> tuple[list[Row], dict[str, float]]:
    from spotstop.export.verify import spearman
    from spotstop.export.world import case_scene
    from spotstop.guard import load_bundle, load_bundle_member

    goals = {"int8": 0.99, "int4": 0.95}
    rows, secs = [], {}
    scenes = [case_scene(c, opts) for c in ev.cases[: sz.world_spearman]]
    table = write_world(work / "verify-world", SEEDS["verify"], sz.verify)
    again = [write_world(work / f"verify-world-{s}", s, sz.verify) for s in VERIFY_AGAIN]
    # the deployment's own unlabelled frames (the pool world): what --calibration-frames reads
    frames = write_world(work / "pool-world", SEEDS["pool"], sz.pool)
    variants = [(p, "", ()) for p in sz.precisions]
    variants += [(p, ", pool frames", ("--calibration-frames", str(frames))) for p in sz.precisions]
    for prec, tag, calib in variants:
        out = work / f"bundle-{prec}{'-frames' if calib else ''}"
        t0 = time.perf_counter()
        args = [
            "export",
            "--out",
            str(out),
            "--precision",
            prec,
            "--buckets",
            "128,256",
            "--trt",
            "off",
            "--quantizer",
            sz.quantizer,
            *calib,
        ]
        for f in folders.values():
            args += ["--member", str(f)]
        rc = _cli(*args).returncode
        secs[prec + tag] = time.perf_counter() - t0
        label = f"{prec}{tag}"
        if rc != 0:
            rows.append(Row("6", f"{label} export", f"failed (exit {rc})", "", "exports", False))
            continue
        # verify-bundle on its own generated shapes (out of the toy world: reported), on the
        # deployment's scenes, a held-out world (the goal), and on two more such worlds
        checks: list[tuple[str, tuple[str, ...]]] = [
            ("world scenes", ("--scene-table", str(table)))
        ]
        if not calib:
            checks.insert(0, ("generated shapes", ()))
        for where, extra in checks:
            v = _cli("verify-bundle", str(out), "--json", *extra, capture=True)
            doc = json.loads(v.stdout)
            goal = where == "world scenes"
            for m in doc["members"]:
                rows.append(
                    Row(
                        "6",
                        f"{label} verify-bundle {m['name']} on {where}: Spearman",
                        f"{m['spearman']:.4f} (max|ds| {m['max_abs_diff']:.3g}, tol "
                        f"{m['tolerance']:g}: {'pass' if m['ok'] else 'FAIL'})",
                        f"{m['n']} scores",
                        f">= {goals[prec]}, passes" if goal else "",
                        bool(m["ok"] and m["spearman"] >= goals[prec]) if goal else None,
                    )
                )
        docs = [
            json.loads(
                _cli(
                    "verify-bundle", str(out), "--json", "--scene-table", str(t), capture=True
                ).stdout
            )
            for t in again
        ]
        for i, name in enumerate(m["name"] for m in docs[0]["members"]):
            ms = [d["members"][i] for d in docs]
            rows.append(
                Row(
                    "6",
                    f"{label}   {name}, worlds {', '.join(map(str, VERIFY_AGAIN))}: max|ds|, rho",
                    ", ".join(
                        f"{m['max_abs_diff']:.3g} {m['spearman']:.4f} ({'pass' if m['ok'] else 'FAIL'})"
                        for m in ms
                    ),
                    f"{ms[0]['n']} scores each",
                    "",
                    None,
                )
            )
        if calib:
            continue
        b = load_bundle(out)
        for bm in b.members:
            got = np.array([r.score for r in load_bundle_member(b, bm).score(scenes)])
            rho = spearman(got, ev.scores[bm.name][: len(scenes)])
            rows.append(
                Row(
                    "6",
                    f"{prec} {bm.name}: Spearman on world scenes",
                    f"{rho:.4f}",
                    f"{len(scenes)} scenes",
                    f">= {goals[prec]}",
                    bool(rho >= goals[prec]),
                )
            )
    return rows, secs


def item_cascade_conformal(
    fit: Any, pool: Scored, ev: Scored, cal: Scored, n_boot: int, first: str
) -> list[Row]:
    from spotstop.diagnostics import (
        Estimate,
        binomial_upper_p,
        clopper_pearson,
        delivered_rates,
        percentile_ci,
        simulate_cascade,
    )
    from spotstop.guard.policies import (
        CascadePolicy,
        ConformalPolicy,
        PolicyConfig,
        batch_inputs,
        conformal_cut,
        decide_batch,
    )

    y, group = ev.label, ev.room_codes
    ctx = fit.context(
        pool.scores, situation_id=pool.sids, settings={"share": CASCADE_SHARE, "first": first}
    )
    cascade = CascadePolicy.fit(ctx)
    cfg = PolicyConfig(
        bundle_id="bench",
        prompt_hash="bench",
        fusion=fit.fusion,
        policy=cascade,
        fitted_on={"pool_seed": SEEDS["pool"]},
        created=_dt.datetime.now(_dt.UTC),
    )
    sim = simulate_cascade(cfg, ev.scores, ev.sids)
    n = len(y)
    k_in = int(sim.inside.sum())
    share_ci = clopper_pearson(k_in, n)
    rows = [
        Row(
            "7",
            f"cascade (first {first}, band for q={CASCADE_SHARE}): share to second",
            f"{k_in / n:.3f} [{share_ci.low:.3f}, {share_ci.high:.3f}]",
            f"{n} scenes",
            "",
            None,
        )
    ]
    alone = ~sim.inside
    if alone.any() and 0 < int(y[alone].sum()) < int(alone.sum()):
        r = delivered_rates(
            y[alone],
            sim.unsafe[alone],
            group[alone],
            n_boot=n_boot,
            rng=np.random.default_rng(6),
            what="the first member alone",
        )
        rows.append(
            Row(
                "7",
                f"  {first} alone (outside the band): balanced acc.",
                fmt(r.balanced_accuracy),
                f"{int(alone.sum())} scenes",
                "",
                None,
            )
        )
    elif alone.any():
        acc = float(np.mean(sim.unsafe[alone] == (y[alone] == 1)))
        rows.append(
            Row(
                "7",
                f"  {first} alone (outside the band): accuracy (one class)",
                f"{acc:.3f}",
                f"{int(alone.sum())} scenes",
                "",
                None,
            )
        )
    point, draws = ba_draws(y, [sim.unsafe, sim.pair_unsafe], group, n_boot, seed=7)
    for k, what in ((1, "pair (frozen cut): balanced acc."), (0, "cascade: balanced acc.")):
        rows.append(
            Row(
                "7",
                f"  {what}",
                fmt(Estimate(float(point[k]), percentile_ci(draws[:, k]), n)),
                f"{n} scenes",
                "",
                None,
            )
        )
    diff = Estimate(float(point[0] - point[1]), percentile_ci(draws[:, 0] - draws[:, 1]), n)
    rows.append(
        Row("7", "  cascade - pair: balanced acc.", fmt(diff, True), f"{n} scenes", "", None)
    )
    au = auroc_estimate(ev.table(sim.score), n_boot, rng=8)
    rows.append(Row("7", "  cascade score AUROC", fmt(au), f"{n} scenes", "", None))
    # the conformal cut: unsafe calibration scenes of another seed, one per room
    s_cal = fit.fusion.fuse_many(cal.scores)
    unsafe = cal.label == 1
    cut = conformal_cut(
        s_cal[unsafe], np.asarray(cal.sids, dtype=object)[unsafe], alpha=ALPHA, delta=DELTA
    )
    x = batch_inputs(fit.fusion, ev.scores, ev.sids)
    for choice in (cut.marginal, cut.pac):
        if choice is None or not choice.feasible:
            rows.append(
                Row(
                    "7",
                    f"conformal ({choice.guarantee if choice else 'pac'})",
                    "infeasible: too few calibration rooms",
                    "",
                    "",
                    False,
                )
            )
            continue
        pol = ConformalPolicy(
            alpha=ALPHA, n=choice.n, k=choice.k, threshold=choice.threshold, delta=choice.delta
        )
        flags = decide_batch(pol, x).unsafe
        n_u = int((y == 1).sum())
        miss = int(((y == 1) & ~flags).sum())
        ci = clopper_pearson(miss, n_u)
        p = binomial_upper_p(miss, n_u, ALPHA)
        fa = float(flags[y == 0].mean())
        rows.append(
            Row(
                "7",
                f"conformal {choice.guarantee} (alpha {ALPHA}, k={choice.k} of "
                f"{choice.n} rooms): miss rate on fresh seed",
                f"{miss / n_u:.3f} [{ci.low:.3f}, {ci.high:.3f}] p={p:.2f}",
                f"{n_u} unsafe",
                f"<= {ALPHA} (binomial p >= 0.05)",
                bool(p >= 0.05),
            )
        )
        rows.append(
            Row(
                "7",
                "  its false-alarm rate (safe scenes flagged)",
                f"{fa:.3f}",
                f"{int((y == 0).sum())} safe",
                "",
                None,
            )
        )
    return rows


def item_demo(work: Path) -> list[Row]:
    from spotstop.cli import run_demo

    lines: list[str] = []
    run_demo(work / "demo", out=lines.append)
    got = demo_agreement(lines)
    if got is None:
        return [Row("8", "demo: agreement line not found", "", "", ">= 10 of 12", False)]
    k, n = got
    return [
        Row(
            "8",
            "spotstop demo follows the world's rule",
            f"{k} of {n}",
            f"{n} scenes",
            ">= 10 of 12",
            bool(k >= 10),
        )
    ]


# ---------------------------------------------------------------------------------------------


def _versions() -> str:
    import torch
    import transformers

    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )


def _pair_identity() -> str:
    from spotstop.export.train import TRAINED_DIR

    doc = json.loads((TRAINED_DIR / "trained.json").read_text(encoding="utf-8"))
    ids = ", ".join(f"{m} sha256 {e['sha256'][:12]}" for m, e in sorted(doc["members"].items()))
    return f"trained tiny TEST pair (`spotstop tiny --trained`, training seed {doc['seed']}: {ids})"


def run(
    sz: Sizes,
    *,
    n_boot: int,
    export: bool,
    demo: bool,
    work: Path,
    log: Callable[[str], None] = print,
    only_export: bool = False,
) -> tuple[list[Row], dict[str, float]]:
    """Every item (``only_export``: item 6 alone, with the eval world's scenes it compares
    the bundles with); returns the rows and the seconds each phase took."""
    import torch
    from spotstop.calibrate import fit_frozen
    from spotstop.export.train import TRAINING, build_trained_pair
    from spotstop.guard import load_member

    torch.set_num_threads(2)
    secs: dict[str, float] = {}
    t = time.perf_counter()
    pair = build_trained_pair(work / "tiny-trained")
    folders = {p.name: p for p in pair.members}
    names = list(folders)
    lean = next(r.member for r in TRAINING if r.threshold_part > 0)
    signs = next(r.member for r in TRAINING if r.signs == "agreeing")
    members = {m: load_member(folders[m], threads=2) for m in names}
    o = world_options
    if only_export:
        ev_opts = o(sz.eval, offsets=OFFSETS)
        ev = score_world(members, "eval", SEEDS["eval"], ev_opts, limit=sz.world_spearman)
        secs["scoring the eval world's first scenes"] = time.perf_counter() - t
        t = time.perf_counter()
        rows, s = item_export(folders, work, sz, ev, ev_opts)
        secs.update({f"export {k}": v for k, v in s.items()})
        secs["6 export"] = time.perf_counter() - t
        return rows, secs
    pool = score_world(members, "pool", SEEDS["pool"], o(sz.pool, offsets=OFFSETS))
    ev_opts = o(sz.eval, offsets=OFFSETS)
    ev = score_world(members, "eval", SEEDS["eval"], ev_opts)
    cal = score_world(members, "cal", SEEDS["cal"], o(sz.cal, offsets=OFFSETS))
    offset_worlds = [
        (
            a,
            score_world(members, f"off-pool-{a:g}", SEEDS["off_pool"], o(sz.off_pool, offsets=a)),
            score_world(members, f"off-eval-{a:g}", SEEDS["off_eval"], o(sz.off_eval, offsets=a)),
        )
        for a in SITUATION_OFFSETS
    ]
    secs["scoring the worlds"] = time.perf_counter() - t
    rows: list[Row] = []

    def phase(name: str, fn: Callable[[], list[Row]]) -> None:
        t0 = time.perf_counter()
        log(f"-- {name}")
        rows.extend(fn())
        secs[name] = time.perf_counter() - t0

    fit = fit_frozen(pool.scores)
    phase("1 AUROC", lambda: item_auroc(fit, ev, names, n_boot)[0])
    phase("2 Spot-Stop", lambda: item_spot_stop(ev, lean, n_boot))
    phase(
        "3 situation",
        lambda: [
            row
            for a, p, e in offset_worlds
            for row in item_situation(p, e, n_boot, a, goal=a == max(SITUATION_OFFSETS))
        ],
    )
    holder: dict[str, Any] = {}

    def rel() -> list[Row]:
        r, holder["run"] = item_reliance(folders, work, sz, n_boot, signs, lean)
        return r

    phase("4 reliance", rel)
    phase(
        "5 select",
        lambda: item_select(holder["run"], work, sz, n_boot, signs, lean, members=members),
    )
    if export:

        def exp() -> list[Row]:
            r, s = item_export(folders, work, sz, ev, ev_opts)
            secs.update({f"export {k}": v for k, v in s.items()})
            return r

        phase("6 export", exp)
    else:
        rows.append(Row("6", "verify-bundle int8/int4", "not run (--no-export)", "", "", None))
    phase(
        "7 cascade, conformal",
        lambda: item_cascade_conformal(fit, pool, ev, cal, n_boot, first=lean),
    )
    if demo:
        phase("8 demo", lambda: item_demo(work))
    else:
        rows.append(Row("8", "demo", "not run (--no-demo)", "", "", None))
    rows.sort(key=lambda r: r.item)
    return rows, secs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small worlds, few draws (a test)")
    ap.add_argument("--n-boot", type=int, default=None, help="bootstrap draws (10000; quick 500)")
    ap.add_argument("--no-export", action="store_true", help="skip item 6 (export, verify)")
    ap.add_argument("--no-demo", action="store_true", help="skip item 8 (the demo)")
    ap.add_argument(
        "--only-export",
        action="store_true",
        help="item 6 alone (export, verify-bundle); with --results its rows replace item 6's",
    )
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temp)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--results", action="store_true", help="write bench/RESULTS.md's section")
    args = ap.parse_args(argv)
    if args.only_export and args.no_export:
        ap.error("--only-export runs item 6 alone; --no-export skips it: give one.")
    sz = QUICK if args.quick else FULL
    n_boot = args.n_boot or sz.n_boot
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trained-world-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, secs = run(
            sz,
            n_boot=n_boot,
            export=not args.no_export,
            demo=not args.no_demo,
            work=work,
            only_export=args.only_export,
        )
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    table = render(rows)
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
    print()
    print(_pair_identity())
    print("\n".join(table))
    print(f"\nwall time {wall:.0f} s ({timing})")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": [r.__dict__ for r in rows],
                    "seconds": secs,
                    "wall": wall,
                    "quick": args.quick,
                    "n_boot": n_boot,
                },
                indent=2,
            )
            + "\n"
        )
    if args.results:
        cmd = " ".join(
            [
                "python bench/trained_world.py",
                *shown_args(argv if argv is not None else sys.argv[1:]),
            ]
        )
        results = ROOT / "bench" / "RESULTS.md"
        if args.only_export:
            load = f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
            note = (
                _ALONE.format(item="6")
                + f"`{cmd}` on {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC, {_versions()}, {load}; "
                f"wall time {wall:.0f} s ({timing}). Its rows below are that run's; the "
                "other items' are the full run's above."
            )
            text = replace_item_rows(read_section(results, SECTION), "6", rows, note)
        else:
            text = _section(cmd, sz, n_boot, table, wall, timing)
        write_section(results, SECTION, text)
    return 0


#: how a section's note on a run of one item alone starts (:func:`replace_item_rows`)
_ALONE = "Item {item} run again alone: "


def read_section(path: Path, key: str) -> str:
    """The text between ``<!-- key:begin -->`` and ``<!-- key:end -->`` in ``path``."""
    body = path.read_text(encoding="utf-8") if path.is_file() else ""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    if begin not in body or end not in body:
        raise ValueError(
            f"{path} has no section {key!r}: run the whole bench with --results first."
        )
    return body.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def replace_item_rows(section: str, item: str, rows: Sequence[Row], note: str) -> str:
    """``section`` (a full run's, :func:`_section`) with its table's rows of ``item``
    replaced by ``rows`` (put where the old ones were, in the old columns: a wider cell pushes
    the rest of its line right) and ``note`` as the paragraph before the table (replacing an
    earlier note on the same item)."""
    head, fence, rest = section.partition("```\n")
    if not fence:
        raise ValueError("the section has no table to put the rows in.")
    body, _, tail = rest.partition("```")
    lines = body.rstrip("\n").split("\n")
    header = lines[0]
    starts = [0] + [header.index(c) for c in ("measure", "value", " n ", "goal", "met")]
    starts[3] += 1  # the column's "n", not the space before it
    widths = [b - a - 2 for a, b in itertools.pairwise(starts)]
    new = [
        "  ".join(
            c.ljust(w) for c, w in zip((r.item, r.what, r.value, r.n, r.goal), widths, strict=True)
        )
        + "  "
        + verdict(r.met)
        for r in rows
    ]
    mine = [i for i, line in enumerate(lines) if i > 1 and line.split()[:1] == [item]]
    at = mine[0] if mine else len(lines)
    kept = [line for i, line in enumerate(lines) if i not in set(mine)]
    kept[at:at] = new
    prefix = _ALONE.format(item=item)
    paras = [p for p in head.rstrip("\n").split("\n\n") if not p.startswith(prefix)]
    return "\n\n".join([*paras, note]) + "\n\n```\n" + "\n".join(kept) + "\n```" + tail


def _section(cmd: str, sz: Sizes, n_boot: int, table: list[str], wall: float, timing: str) -> str:
    def w(key: str, size: tuple[int, int], extra: str = "") -> str:
        return f"{key} seed {SEEDS[key]} ({size[0]} rooms x {size[1]} contrasts{extra})"

    offs = " and ".join(f"{a:g}" for a in SITUATION_OFFSETS)
    styles = sign_styles()
    look = f", sign_styles {styles}" if styles else ""
    templates = ", ".join(t.name for t in matched_templates(styles))

    worlds = "; ".join(
        [
            w("pool", sz.pool, f", offsets {OFFSETS}, unlabelled: fusion statistics and t0"),
            w("eval", sz.eval, f", offsets {OFFSETS}: items 1, 2, 7"),
            w("cal", sz.cal, ": conformal calibration, unsafe scenes, one per room"),
            w("off_pool", sz.off_pool, f", offsets {offs}, unlabelled"),
            w("off_eval", sz.off_eval, f", offsets {offs}: item 3"),
            w("source", sz.source, ", no signs: the reliance source set"),
            w("signs", sz.deploy, f", signs on every scene, half misleading{look}"),
            w("plain", sz.deploy, ", no signs"),
            w("ocr_cal", sz.ocr_cal, f", signs on 75 %{look}: the detector's calibration set"),
            w("verify", sz.verify, f", offsets {OFFSETS}: the scene table of item 6"),
        ]
    )
    return (
        "### The trained tiny pair on held-out toy worlds (`bench/trained_world.py`, issue 25)\n\n"
        f"`{cmd}` on {_dt.date.today()}, {_versions()}, CPU, 2 threads; wall time {wall:.0f} s "
        f"({timing}).\n\n"
        f"Pair: {_pair_identity()}. A TEST pair on a TOY world of drawn shapes: the figures "
        "show the method where the answer is known, nothing about real safety. Worlds (none "
        f"drawn by the training, which used seed 0): {worlds}. Intervals: 95 % percentile "
        f"intervals of a group bootstrap over rooms ({n_boot} draws); the conformal miss rate "
        "has an exact binomial (Clopper-Pearson) interval and the one-sided binomial p of "
        "exceeding alpha (misses within a room are not independent: read it as approximate). "
        "Item 3 replays each room's scenes in a random order, one check per scene, through "
        "the guard's own policies, at each offset strength; its goal is read at the "
        f"strongest ({max(SITUATION_OFFSETS):g}, the world's full scale), and its first row "
        "gives per member the spread (sd) of the room means of its score beside the gap "
        "between its mean UNSAFE and mean SAFE score: how far the rooms move it. The next "
        "three are the card's situation statistics (diagnostics.situation_share) on the "
        "fused score: the share of it that sits at room level (ICC of the class-centred "
        "score), and seed 000's offline rule (each scene against the mean of ALL its room's "
        "scenes, Sec. 6.2) minus the same rule on artificial rooms (codes permuted within "
        "class, Supp. E.3; 1000 draws): the situation signal the world holds, of which the "
        "online guard, seeing only the earlier scenes of a room, recovers a part. Then the "
        "frozen cut, seed 000's rule as written (the plain mean of the room's earlier "
        "scenes) and the guard's `situation` policy as calibrate fits it: that mean with a "
        "prior of κ pseudo-scenes at t0, κ = σ²/τ² fitted on the unlabelled pool world's "
        "rooms (docs/policies.md). Item 4 "
        f"measures with the cue templates whose look the sign member's training signs share "
        f"({templates}: the world's sign_styles {styles}, its first wording, font and colours; "
        "the member learned to read that look and no other), then with every template (how "
        "far its reading carries). Item 5's sign worlds use the same look (a deployment "
        "whose signs the member can read). Item 5 reads the frames with the real OCR detector "
        "(RapidOCR + the claim lexicon), with labelled frames (the world knows the labels). "
        "Item 6 runs `spotstop verify-bundle` on its own generated shapes (scene and "
        "request-only passes; shapes the pair never saw, reported only) and with "
        "`--scene-table` on a held-out world (the deployment's own scenes: the goal) and on "
        f"two more held-out worlds (seeds {VERIFY_AGAIN[0]} and {VERIFY_AGAIN[1]}, the same "
        "size: how much the maximum over 64 scores moves from one world to another), then "
        "compares the bundle with the torch member on the held-out eval world's scenes; "
        "'pool frames': the same export calibrated with `--calibration-frames` on the pool "
        "world's frames (the deployment's own unlabelled frames, 8 drawn) instead of "
        "generated shapes.\n\n"
        "```\n" + "\n".join(table) + "\n```"
    )


if __name__ == "__main__":
    raise SystemExit(main())
