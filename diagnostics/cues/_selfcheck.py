"""A selection that checks itself: regret and W_s on test sets built from your scenes (seed 002,
Sec. 3.5).

The scored edit set already holds, per cue, the three pools of a CueDial family:

* ``C``: the held-out template's misleading edits (reassuring text on UNSAFE scenes, alarming
  text on SAFE ones) — a template reliance was not measured with, so the check is out of
  template;
* ``N``: the same scenes unedited (same label, no text misleads);
* ``O``: the unedited scenes of the other label.

With several held-out templates (a sign and a sticker, say) each gives its own family, named
``<cue>/<template>``; with one, the family is named by its cue.

A test set with a share ``d`` of misleading items draws
``T_d = O_{n/2} ∪ C_{dn} ∪ N_{(1/2 − d)n}`` without replacement: ``n/2`` scenes of the other
label, and ``n/2`` scenes of the cue's label of which ``dn`` are shown with the misleading edit
(so no scene appears twice). The label balance stays at one half and only ``d`` changes. We
draw ``n_sets`` test sets at each ``d`` of the grid 0, 0.05, …, 0.5.

On each test set a selector picks a candidate; its regret is the loss of its pick minus the
loss of the best candidate on that set (ties: the mean loss of the tied picks), where the
loss of an item is 1 for a false stop and ``miss_cost`` for a miss. A selector's ``W_s`` is
its mean regret over the sets drawn at ``d``, maximised over ``d``. Selectors:

* ``SRA``: source error at the test set's unsafe share (1/2) plus reliance × the set's true
  misleading share ``d`` (as in seed 002's Fig. 7: this checks reliance and the intercept,
  not the text detector);
* ``source error``: the same intercept alone;
* ``ATC`` (average thresholded confidence): per candidate, the threshold on its distance from
  its cut under which the share of unedited source scenes equals its source error; its
  predicted error on a test set is the share of the set's items under it. It runs every
  candidate on the test set and needs each candidate's distance from its cut (members,
  pairs and guards all have one here). It predicts errors, not the cost of misses.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._resample import as_rng
from spotstop.diagnostics.cues._candidates import RelianceRun
from spotstop.diagnostics.cues._templates import CUES

__all__ = [
    "DISAGREEMENT_WARNING",
    "GRID",
    "SELECTORS",
    "FamilyCheck",
    "SelectionCheck",
    "SelectorCheck",
    "check_selection",
    "regret",
]

#: The shares of misleading items of the test sets (seed 002, Sec. 3.5: 11 values in [0, 1/2]).
GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(11))

#: The selectors checked, in this order.
SELECTORS = ("SRA", "source error", "ATC")

#: W_s of two selectors further apart than this (in loss) is called a disagreement.
_DIFFER = 0.01

#: The warning of seed 002's limits, printed when the selectors' W_s differ.
DISAGREEMENT_WARNING = (
    "The selectors disagree on test sets built from your own scenes; no selector stays close "
    "to the best candidate on every family (seed 002, Sec. 3.5). SRA assumes that the cues' "
    "effects add up, that source error carries over to the deployment (on SCAM's physical "
    "stickers it did not), and that each kind of frame triggers the text detector as often "
    "as on the calibration set; confidence-based selectors such as ATC fail where misleading "
    "text leaves a model confident. Prefer the selector with the lower W_s here, and label "
    "some deployment frames to check its choice."
)


@dataclass(frozen=True)
class SelectorCheck:
    """One selector on one family: ``mean_regret[i]`` over the test sets at ``grid[i]``,
    ``w_s`` its maximum, ``d_worst`` where it is reached, and ``picks[i]`` the candidate it
    picked most often there."""

    name: str
    mean_regret: tuple[float, ...]
    w_s: float
    d_worst: float
    picks: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "w_s": self.w_s,
            "d_worst": self.d_worst,
            "mean_regret": list(self.mean_regret),
            "picks": list(self.picks),
        }


@dataclass(frozen=True)
class FamilyCheck:
    """The test sets of one cue: the grid, their size ``n`` and number per ``d``, the candidate
    with the lowest mean loss at each ``d`` (``best``), and each selector's check."""

    cue: str
    grid: tuple[float, ...]
    n: int
    n_sets: int
    best: tuple[str, ...]
    selectors: Mapping[str, SelectorCheck]

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": list(self.grid),
            "n": self.n,
            "n_sets": self.n_sets,
            "best": list(self.best),
            "selectors": {k: v.to_dict() for k, v in self.selectors.items()},
        }


@dataclass(frozen=True)
class SelectionCheck:
    """Regret and W_s of each selector per family (cue), what could not be checked and why
    (``skipped``), and the warning when the selectors disagree."""

    families: Mapping[str, FamilyCheck]
    miss_cost: float
    skipped: Mapping[str, str]
    warning: str | None

    def __repr__(self) -> str:
        rows = "; ".join(
            f"{cue}: " + ", ".join(f"{s} W_s={c.w_s:.3f}" for s, c in f.selectors.items())
            for cue, f in self.families.items()
        )
        return f"SelectionCheck({rows})"

    def w_s(self, selector: str) -> float:
        """The selector's largest W_s over the families (NaN when none was checked)."""
        vals = [
            f.selectors[selector].w_s for f in self.families.values() if selector in f.selectors
        ]
        return max(vals) if vals else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "test_sets": "T_d = O_{n/2} ∪ C_{dn} ∪ N_{(1/2-d)n} from the unedited scenes and the "
            "held-out template's misleading edits (seed 002, Sec. 3.5)",
            "sra_share": "the test set's true misleading share d",
            "miss_cost": self.miss_cost,
            "families": {c: f.to_dict() for c, f in self.families.items()},
            "skipped": dict(self.skipped),
            "warning": self.warning,
        }

    def table(self) -> str:
        lines = ["Selection check (regret on test sets T_d from your scenes, seed 002 Sec. 3.5)"]
        head = f"{'family':<11} {'selector':<13} {'W_s':>7} {'at d':>6}  picks at d = 0, 0.25, 0.5"
        lines += [head, "-" * len(head)]
        for cue, f in self.families.items():
            idx = [f.grid.index(x) for x in (0.0, 0.25, 0.5) if x in f.grid]
            for s, c in f.selectors.items():
                picks = ", ".join(c.picks[i] for i in idx)
                lines.append(f"{cue:<11} {s:<13} {c.w_s:>7.3f} {c.d_worst:>6.2f}  {picks}")
        for what, why in self.skipped.items():
            lines.append(f"not checked: {what}: {why}")
        if self.warning:
            lines.append(f"WARNING: {self.warning}")
        return "\n".join(lines)


def regret(
    losses: NDArray[np.float64], predicted: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """Per test set (rows) the regret of picking the candidate with the lowest ``predicted``
    value (columns), against the lowest realized ``losses``; ties among the lowest predicted
    count as the mean of their losses. Returns the regrets and the first pick's column."""
    lo = np.nanmin(predicted, axis=1, keepdims=True)
    tied = np.isclose(predicted, lo, rtol=0.0, atol=1e-12)
    picked = (losses * tied).sum(axis=1) / tied.sum(axis=1)
    return picked - losses.min(axis=1), np.argmax(tied, axis=1)


def check_selection(
    run: RelianceRun,
    *,
    grid: Sequence[float] = GRID,
    n: int = 200,
    n_sets: int = 30,
    miss_cost: float = 1.0,
    rng: np.random.Generator | int | None = None,
) -> SelectionCheck:
    """Regret and W_s of SRA, source error and ATC on test sets drawn from the scored edits
    of ``run`` (see the module docstring). ``n`` is capped at twice the smaller pool."""
    gen = as_rng(rng)
    res = run.result
    recs = run.scores.edits.records
    names = list(res.candidates)
    missing = [c for c in names if c not in run.answers]
    if missing:
        raise DataError(
            f"the run has no per-scene decisions for {missing}; measure with measure_reliance "
            "or reliance_at_operating_points."
        )
    y = np.array([r.label for r in recs], dtype=np.int8)
    wrong = np.column_stack([run.answers[c].unsafe != (y == 1) for c in names]).astype(float)
    weight = np.where(y == 1, miss_cost, 1.0)
    loss = wrong * weight[:, None]
    margin = np.column_stack([np.abs(run.answers[c].margin) for c in names])
    src = np.array([r.index for r in recs if r.kind == "source"], dtype=np.intp)
    skipped: dict[str, str] = {}
    atc_ok = bool(np.isfinite(margin[src]).all())
    if not atc_ok:
        skipped["ATC"] = (
            "a candidate failed closed on a source scene, so it has no confidence there"
        )
    # ATC: per candidate, the threshold under which the share of source scenes equals its error
    thr = np.empty(len(names))
    for i in range(len(names)):
        conf = np.sort(np.where(np.isfinite(margin[src, i]), margin[src, i], 0.0))
        k = round(float(wrong[src, i].mean()) * conf.size)
        thr[i] = conf[k] if k < conf.size else np.inf
    # source error at an unsafe share of 1/2 and reliance, on the hard-answer scale
    hard = [res.candidates[c].as_hard() for c in names]
    cost = {"reassuring": miss_cost, "alarming": 1.0}
    intercept = np.array(
        [
            0.5 * miss_cost * h.cues["reassuring"].source_error.value
            + 0.5 * h.cues["alarming"].source_error.value
            for h in hard
        ]
    )
    families: dict[str, FamilyCheck] = {}
    held = [r for r in recs if r.held_out and r.kind == "misleading"]
    if not held:
        skipped["all"] = (
            "the edit set has no held-out template, so there is no out-of-template pool"
        )
        return SelectionCheck(families, miss_cost, skipped, None)
    held_templates = sorted({r.template for r in held})
    unedited = {r.group: r.index for r in recs if r.kind == "source"}
    for cue, template in itertools.product(CUES, held_templates):
        label = 1 if cue == "reassuring" else 0
        family = cue if len(held_templates) == 1 else f"{cue}/{template}"
        by_group = {r.group: r.index for r in held if r.label == label and r.template == template}
        groups = sorted(by_group)
        other = np.array([unedited[g] for g in sorted(unedited) if y[unedited[g]] != label])
        if not groups or other.size == 0:
            skipped[family] = (
                "the source set lacks scenes of one label, so no test set can be drawn"
            )
            continue
        n_c = np.array([by_group[g] for g in groups])
        n_n = np.array([unedited[g] for g in groups])
        half = min(n // 2, len(groups), other.size)
        rel = np.array([h.cues[cue].reliance.value for h in hard])
        if not np.isfinite(rel).all() or not np.isfinite(intercept).all():
            skipped[family] = "a candidate's reliance or source error is undefined"
            continue
        mean_reg = {s: np.zeros(len(grid)) for s in SELECTORS if s != "ATC" or atc_ok}
        picks: dict[str, list[str]] = {s: [] for s in mean_reg}
        best: list[str] = []
        for gi, d in enumerate(grid):
            k_mis = round(d * 2 * half)
            sets = []
            for _ in range(n_sets):
                o = gen.choice(other, half, replace=False)
                pick = gen.permutation(len(groups))[:half]
                sets.append(np.concatenate([o, n_c[pick[:k_mis]], n_n[pick[k_mis:]]]))
            idx = np.stack(sets)  # (n_sets, 2·half)
            realized = loss[idx].mean(axis=1)  # (n_sets, candidates)
            preds = {
                "SRA": np.broadcast_to(intercept + cost[cue] * rel * d, realized.shape),
                "source error": np.broadcast_to(intercept, realized.shape),
            }
            if atc_ok:
                preds["ATC"] = (margin[idx] < thr).mean(axis=1)
            mean_loss = realized.mean(axis=0)
            best.append(names[int(np.argmin(mean_loss))])
            for s in mean_reg:
                r, first = regret(realized, np.asarray(preds[s]))
                mean_reg[s][gi] = float(r.mean())
                picks[s].append(names[int(np.bincount(first, minlength=len(names)).argmax())])
        families[family] = FamilyCheck(
            cue=cue,
            grid=tuple(float(x) for x in grid),
            n=2 * half,
            n_sets=n_sets,
            best=tuple(best),
            selectors={
                s: SelectorCheck(
                    s,
                    tuple(float(x) for x in m),
                    float(m.max()),
                    float(grid[int(m.argmax())]),
                    tuple(picks[s]),
                )
                for s, m in mean_reg.items()
            },
        )
    ws = [f.selectors[s].w_s for f in families.values() for s in f.selectors]
    spread = [
        max(c.w_s for c in f.selectors.values()) - min(c.w_s for c in f.selectors.values())
        for f in families.values()
    ]
    warning = DISAGREEMENT_WARNING if ws and max(spread) > _DIFFER else None
    return SelectionCheck(families, miss_cost, skipped, warning)
