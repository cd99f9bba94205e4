"""Shift-Reliance Alignment: rank candidates for a deployment (seed 002, Eq. 1 and Sec. 3.5).

For candidate f, with the misleading share ``m_j`` of each cue in the deployment::

    E_f = source_error_f + Σ_j reliance_fj · m_j

Each candidate's error is linear in the shares (Sec. A.1), so two candidates' lines cross at
most once and the best candidate changes only at such a crossing: along the line from zero
shift to the deployment's shares, candidates a and b cross at the scale
``t* = (E_a(0) − E_b(0)) / (slope_b − slope_a)`` with ``slope_f = Σ_j reliance_fj · m_j``
(:func:`crossing_scale`).

Members, Avg-2 pairs and guards are compared on one scale: the hard-answer error (wrong
answers or decisions; a member's probability error has no counterpart for a pair or a guard).
The interval of ``E_f`` combines the reliance draws (source scenes resampled) with the shift
draws (calibration scenes and frames resampled, independently), draw by draw.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._resample import nan_estimate
from spotstop.diagnostics._resample import percentile_ci as _percentile_ci
from spotstop.diagnostics._results import Estimate, fmt_estimate
from spotstop.diagnostics.cues._results import RelianceResult
from spotstop.diagnostics.cues._selfcheck import SelectionCheck
from spotstop.diagnostics.cues._shift import BASIS_LABELS, ShiftResult
from spotstop.diagnostics.cues._templates import CUES
from spotstop.guard.validate import is_real

__all__ = [
    "WEIGHTINGS",
    "Prediction",
    "SelectionResult",
    "crossing_scale",
    "predicted_error",
    "select",
]

SELECT_SCHEMA_VERSION = 2  # 2: weighting, basis, assumption, dropped_cues, check, operating points


def predicted_error(
    source_error: float, reliance: Mapping[str, float], shares: Mapping[str, float]
) -> float:
    """Eq. 1 for one candidate: ``source_error + Σ_j reliance[j] · shares[j]``."""
    return float(source_error + sum(reliance[c] * shares[c] for c in shares))


def crossing_scale(source_a: float, slope_a: float, source_b: float, slope_b: float) -> float:
    """Where the error lines ``E_a(t) = source_a + slope_a·t`` and ``E_b(t)`` cross
    (``t`` scales the shift; with one cue and ``slope = reliance`` it is the misleading share
    at which the two swap, Sec. 3.5). Parallel lines never cross: NaN with a warning."""
    if slope_a == slope_b:
        warnings.warn(
            "the two error lines are parallel (same reliance term), so they never cross; "
            "returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return math.nan
    return (source_a - source_b) / (slope_b - slope_a)


#: How the intercept of Eq. 1 is weighted (``select.json``'s ``weighting.intercept``).
WEIGHTINGS = ("deployment", "source")


@dataclass(frozen=True)
class Prediction:
    """One candidate's SRA prediction for the deployment.

    predicted_error: Eq. 1 with its interval (``n`` = source scenes): the intercept plus the
    reliance terms of the cues whose misleading share is defined (in units of a false stop:
    with ``miss_cost`` 1 it is an error rate). intercept: the source error weighted to the
    deployment's unsafe share (and the miss cost) — see :func:`select`. source_error: the
    plain error on the unedited source scenes. reliance: hard-answer reliance per cue.
    extra_error: per cue ``cost · reliance · misleading share`` (NaN for a dropped cue).
    rank / rank_by_source_error: 1 = best, by the prediction and by the intercept alone.
    operating_point: the cut this candidate's answers were measured at, and how it was set.
    """

    name: str
    kind: str
    predicted_error: Estimate
    source_error: Estimate
    reliance: Mapping[str, Estimate]
    extra_error: Mapping[str, float]
    rank: int
    rank_by_source_error: int
    intercept: Estimate = field(default_factory=lambda: nan_estimate(0))
    operating_point: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self, basis: str = BASIS_LABELS) -> dict[str, Any]:
        pe = self.predicted_error.to_dict()
        return {
            "name": self.name,
            "kind": self.kind,
            "predicted_error": {"value": pe["value"], "ci": pe["ci"], "basis": basis},
            "intercept": self.intercept.to_dict(),
            "source_error": self.source_error.to_dict(),
            "rank": self.rank,
            "rank_by_source_error": self.rank_by_source_error,
            "reliance": {c: e.to_dict() for c, e in self.reliance.items()},
            "extra_error": {c: (None if math.isnan(v) else v) for c, v in self.extra_error.items()},
            "operating_point": dict(self.operating_point),
        }


@dataclass(frozen=True)
class SelectionResult:
    """Candidates in SRA rank order, the shares used, and what SRA changed and why.

    weighting: how the intercept was weighted (``intercept``: ``deployment`` or ``source``;
    ``prevalence`` and its source; ``miss_cost``; ``units``). dropped_cues: cues whose
    misleading share is undefined, left out of every prediction. basis / assumption: whether
    the misleading shares come from labelled frames or rest on the independence assumption
    (then ``assumption`` states it). check: the selection's own check (regret and W_s on test
    sets from the scored edits), when one was run.
    """

    ranking: tuple[Prediction, ...]
    shares: Mapping[str, Estimate]
    explanation: str
    provenance: Mapping[str, Any] = field(repr=False, default_factory=dict)
    weighting: Mapping[str, Any] = field(repr=False, default_factory=dict)
    dropped_cues: tuple[str, ...] = ()
    basis: str = BASIS_LABELS
    assumption: str | None = field(repr=False, default=None)
    check: SelectionCheck | None = field(repr=False, default=None)

    def __repr__(self) -> str:
        rows = ", ".join(f"{p.rank}. {p.name} {p.predicted_error!r}" for p in self.ranking)
        return f"SelectionResult({rows})"

    @property
    def best(self) -> Prediction:
        return self.ranking[0]

    def to_dict(self) -> dict[str, Any]:
        """The content of ``select.json``."""
        by_source = sorted(self.ranking, key=lambda p: p.rank_by_source_error)
        return {
            "schema_version": SELECT_SCHEMA_VERSION,
            "error": "hard",
            "candidates": [p.to_dict(self.basis) for p in self.ranking],
            "ranking_by_source_error": [p.name for p in by_source],
            "misleading_share": {
                c: {**e.to_dict(), "basis": self.basis} for c, e in self.shares.items()
            },
            "misleading_share_basis": self.basis,
            "assumption": self.assumption,
            "weighting": dict(self.weighting),
            "dropped_cues": list(self.dropped_cues),
            "check": None if self.check is None else self.check.to_dict(),
            "explanation": self.explanation,
            "provenance": dict(self.provenance),
        }

    def summary(self) -> str:
        """The first choice and where SRA departs from source error alone, and why."""
        p = self.best
        if math.isnan(p.predicted_error.value):
            return self.explanation
        mark = " †" if self.assumption else ""
        return (
            f"SRA ranks {p.name} first (predicted {self.weighting.get('units', 'error')} "
            f"{fmt_estimate(p.predicted_error)}{mark}). {self.explanation}"
        )

    def table(self) -> str:
        mark = " †" if self.assumption else ""
        head = (
            f"{'rank':>4}  {'candidate':<40} {'kind':<6} {'predicted' + mark:<26} "
            f"{'intercept':<26} {'rank by intercept':>17}  operating point"
        )
        lines = [head, "-" * len(head)]
        for p in self.ranking:
            op = p.operating_point
            cut = "" if op.get("cut") is None else f" {op['cut']:+.3f}"
            lines.append(
                f"{p.rank:>4}  {p.name[:40]:<40} {p.kind:<6} {fmt_estimate(p.predicted_error):<26} "
                f"{fmt_estimate(p.intercept):<26} {p.rank_by_source_error:>17}  "
                f"{str(op.get('rule', '?')).split(':')[0]}{cut}"
            )
        lines += ["", f"weighting: {self.weighting.get('description', '')}"]
        if self.assumption:
            lines.append(f"† {self.assumption}")
        if self.check is not None:
            lines += ["", self.check.table()]
        return "\n".join([*lines, "", self.explanation])


def _order(values: list[tuple[float, float, str]]) -> list[int]:
    """1-based ranks by the first value, then the second (NaN after numbers in each), then the
    name: a deterministic order that never falls back to the input order."""

    def key(i: int) -> tuple[bool, float, bool, float, str]:
        v, w, name = values[i]
        nv, nw = math.isnan(v), math.isnan(w)
        return (nv, 0.0 if nv else v, nw, 0.0 if nw else w, name)

    ranks = [0] * len(values)
    for r, i in enumerate(sorted(range(len(values)), key=key), start=1):
        ranks[i] = r
    return ranks


def _tied(a: float, b: float) -> bool:
    """Whether two source errors (intercepts) are the same number up to rounding: both are
    ratios of sums of the same draws' weights, so equal counts can differ in the last bits."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _reordered(preds: Sequence[Prediction]) -> int:
    """How many candidates SRA ranks otherwise than source error does, where source error
    orders them: candidates tied on source error (``rank_by_source_error`` then goes by
    name) count as in SRA's order among themselves, so a swap of names is no reorder."""

    def cmp(p: Prediction, q: Prediction) -> int:
        for a, b in (
            (p.intercept.value, q.intercept.value),
            (p.source_error.value, q.source_error.value),
        ):
            if not (math.isnan(a) or math.isnan(b) or _tied(a, b)):
                return -1 if a < b else 1
        return p.rank - q.rank  # tied on source error: SRA's order

    by_source = sorted(preds, key=functools.cmp_to_key(cmp))
    return sum(p.rank != i for i, p in enumerate(by_source, start=1))


def _weighted(
    pi: float | NDArray[np.float64],
    unsafe: float | NDArray[np.float64],
    safe: float | NDArray[np.float64],
    miss_cost: float,
) -> NDArray[np.float64]:
    """``miss_cost · π · unsafe + (1 − π) · safe``, a term with weight 0 counting 0 (an error
    on a class the deployment does not have is no error)."""
    pi_a = np.asarray(pi, dtype=np.float64)
    u = np.where(pi_a > 0, miss_cost * pi_a * np.asarray(unsafe), 0.0)
    s = np.where(pi_a < 1, (1 - pi_a) * np.asarray(safe), 0.0)
    return np.asarray(u + s, dtype=np.float64)


def select(
    reliance: RelianceResult,
    shift: ShiftResult,
    *,
    miss_cost: float = 1.0,
    weighting: str = "deployment",
    check: SelectionCheck | None = None,
) -> SelectionResult:
    """Rank every candidate of ``reliance`` for the deployment measured by ``shift``.

    The intercept of Eq. 1 is the source error weighted to an unsafe share π (seed 002,
    Sec. A: the error is linear in the item mix)::

        intercept = miss_cost · π · err_UNSAFE + (1 − π) · err_SAFE

    with err_UNSAFE / err_SAFE the errors on the unedited UNSAFE / SAFE source scenes, and π
    the deployment's unsafe share π̂ (``weighting="deployment"``) or the source set's own
    (``"source"``: the plain source error when ``miss_cost`` is 1). Reassuring text causes
    misses and alarming text false stops, so its term is weighted by ``miss_cost`` and 1.
    A cue whose misleading share is undefined drops out of every prediction (said in the
    explanation); ``check`` (from :func:`check_selection`) is reported alongside.
    """
    if not reliance.candidates:
        raise DataError("no candidate to rank; measure at least one member or guard.")
    if weighting not in WEIGHTINGS:
        raise DataError(f"weighting must be one of {', '.join(WEIGHTINGS)}; got {weighting!r}.")
    if not (is_real(miss_cost) and math.isfinite(miss_cost) and miss_cost > 0):
        raise DataError(
            f"miss_cost is the cost of a missed hazard relative to a false stop, a number > 0; "
            f"got {miss_cost!r}."
        )
    n = min(reliance.n_boot, shift.n_boot)
    shares = {c: shift.cues[c].misleading_share for c in CUES}
    dropped = tuple(c for c in CUES if math.isnan(shares[c].value))
    used = [c for c in CUES if c not in dropped]
    if dropped:
        warnings.warn(
            f"the misleading share of {', '.join(dropped)} text is undefined, so it drops out "
            "of every predicted error (see shift.json for why); the ranking rests on "
            + (", ".join(f"{c} text" for c in used) + " and " if used else "")
            + "source error alone.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    cost = {"reassuring": float(miss_cost), "alarming": 1.0}
    share_draws = {c: np.asarray(shift.draws[c])[:n] for c in used}
    n_src, n_unsafe = _source_mix(reliance)
    if weighting == "deployment":
        pi: float = shift.prevalence.value
        pi_draws = np.asarray(shift.prevalence_draws)[:n]
        if pi_draws.size < n:
            pi_draws = np.full(n, pi)
        where = f"the deployment's unsafe share π̂ = {pi:.3f} ({shift.prevalence_source})"
    else:
        pi = n_unsafe / n_src if n_src else math.nan
        pi_draws = np.full(n, pi)
        where = f"the source set's own unsafe share {pi:.3f}"
    rows = []
    for name, cand in reliance.candidates.items():
        h = cand.as_hard()
        rel = {c: h.cues[c].reliance for c in CUES}
        src_u, src_s = h.cues["reassuring"].source_error, h.cues["alarming"].source_error
        extra = {c: (cost[c] * rel[c].value * shares[c].value if c in used else math.nan)
                 for c in CUES}  # fmt: skip
        icpt_value = float(_weighted(pi, src_u.value, src_s.value, miss_cost))
        dr = reliance.draws
        icpt_d = _weighted(
            pi_draws,
            np.asarray(dr[(name, "hard", "reassuring", "source_error")])[:n],
            np.asarray(dr[(name, "hard", "alarming", "source_error")])[:n],
            miss_cost,
        )
        d = icpt_d.copy()
        for c in used:
            d = d + cost[c] * np.asarray(dr[(name, "hard", c, "reliance")])[:n] * share_draws[c]
        value = icpt_value + sum(extra[c] for c in used)
        est = Estimate(value, _percentile_ci(d), h.source_error.n)
        if math.isnan(value):
            est = nan_estimate(h.source_error.n)
        icpt = Estimate(icpt_value, _percentile_ci(icpt_d), h.source_error.n)
        op = dict(cand.notes.get("operating_point") or _legacy_point(cand))
        rows.append((name, cand.kind, est, h.source_error, rel, extra, icpt, op))
    rank = _order([(r[2].value, r[6].value, r[0]) for r in rows])
    rank_src = _order([(r[6].value, r[3].value, r[0]) for r in rows])
    preds = sorted(
        (
            Prediction(name, kind, est, src, rel, extra, rank[i], rank_src[i], icpt, op)
            for i, (name, kind, est, src, rel, extra, icpt, op) in enumerate(rows)
        ),
        key=lambda p: p.rank,
    )
    units = (
        "error" if miss_cost == 1 else f"cost per frame (a false stop = 1, a miss = {miss_cost:g})"
    )
    desc = (
        f"intercept = source error weighted to {where}"
        + ("" if miss_cost == 1 else f", misses counted {miss_cost:g} times a false stop")
        + f"; predictions in units of {units}"
    )
    return SelectionResult(
        ranking=tuple(preds),
        shares=shares,
        explanation=_explain(preds, shares, dropped),
        provenance={"n_boot": n, "prevalence_source": shift.prevalence_source},
        weighting={
            "intercept": weighting,
            "prevalence": pi,
            "prevalence_source": shift.prevalence_source
            if weighting == "deployment"
            else "source set",
            "miss_cost": float(miss_cost),
            "units": units,
            "description": desc,
        },
        dropped_cues=dropped,
        basis=shift.basis,
        assumption=shift.assumption,
        check=check,
    )


def _source_mix(reliance: RelianceResult) -> tuple[int, int]:
    """The number of source scenes and of UNSAFE ones (reassuring text misleads on those)."""
    any_cand = next(iter(reliance.candidates.values())).as_hard()
    return reliance.n_sources, any_cand.cues["reassuring"].source_error.n


def _legacy_point(cand: Any) -> dict[str, Any]:
    """The operating point of a candidate measured without one noted (direct callers of
    estimate_reliance): a member's hard answer is ``s > 0``, a pair's its frozen cut."""
    if cand.kind == "member":
        return {"rule": "the member's own answer, s > 0 (no deployed cut)", "cut": 0.0}
    if cand.kind == "pair":
        return {"rule": "frozen cut: mean Avg-2 score of the unedited source scenes",
                "cut": cand.notes.get("frozen_t0")}  # fmt: skip
    return {"rule": "its own policy", "cut": None}


def _explain(
    preds: list[Prediction], shares: Mapping[str, Estimate], dropped: tuple[str, ...]
) -> str:
    """Where SRA's ranking differs from source error alone, and why (Sec. 3.5)."""
    used = [c for c in CUES if c not in dropped]
    note = ""
    if dropped:
        rest = " and ".join(f"{c} text" for c in used) or "no text cue"
        note = (
            f"The misleading share of {', '.join(dropped)} text is undefined (the detector does "
            f"not separate it: sens <= fpr), so it drops out: the ranking falls back to source "
            f"error and {rest}. "
        )
    if all(math.isnan(p.predicted_error.value) for p in preds):
        return note + (
            "SRA cannot rank: every candidate's predicted error is undefined (a source error "
            "or reliance is undefined; see reliance.json). The order is by name."
        )
    sra = preds[0]
    src = min(preds, key=lambda p: p.rank_by_source_error)
    moved = _reordered(preds)
    share_txt = ", ".join(f"{100 * shares[c].value:.1f}% {c}" for c in used) or "none"
    if sra.name == src.name or not used:
        return note + (
            f"SRA keeps {sra.name}, which also has the lowest source error at this deployment's "
            f"mix ({sra.intercept.value:.3f}); at its misleading shares ({share_txt}) its text "
            f"terms add {sum(sra.extra_error[c] for c in used):+.3f}. SRA reorders {moved} of "
            f"{len(preds)} candidates below it."
        )
    cue = max(used, key=lambda c: src.extra_error[c] - sra.extra_error[c])
    if _tied(src.intercept.value, sra.intercept.value):
        # source error does not order them (its rank between them is by name): no crossing
        return note + (
            f"SRA picks {sra.name}; {sra.name} and {src.name} are tied on source error at this "
            f"deployment's mix ({sra.intercept.value:.3f}), and SRA separates them by "
            f"reliance: {src.name} follows {cue} text more (hard-answer reliance "
            f"{src.reliance[cue].value:+.3f} against {sra.reliance[cue].value:+.3f}), and "
            f"{100 * shares[cue].value:.1f}% of this deployment's frames carry {cue} text that "
            f"misleads, which adds {src.extra_error[cue]:+.3f} to its error against "
            f"{sra.extra_error[cue]:+.3f}. SRA reorders {moved} of {len(preds)} candidates."
        )
    slope_sra = sum(sra.extra_error[c] for c in used)
    slope_src = sum(src.extra_error[c] for c in used)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        t = crossing_scale(src.intercept.value, slope_src, sra.intercept.value, slope_sra)
    return note + (
        f"SRA picks {sra.name} where source error alone picks {src.name}: {src.name} errs less "
        f"on the source scenes at this deployment's mix ({src.intercept.value:.3f} against "
        f"{sra.intercept.value:.3f}), but it follows {cue} text more (hard-answer reliance "
        f"{src.reliance[cue].value:+.3f} against {sra.reliance[cue].value:+.3f}), and "
        f"{100 * shares[cue].value:.1f}% of this deployment's frames carry {cue} text that "
        f"misleads, which adds {src.extra_error[cue]:+.3f} to its error against "
        f"{sra.extra_error[cue]:+.3f}. Their error lines cross at {t:.2f}× this deployment's "
        f"misleading shares ({share_txt}): below that, {src.name} would be the better choice. "
        f"SRA reorders {moved} of {len(preds)} candidates."
    )
