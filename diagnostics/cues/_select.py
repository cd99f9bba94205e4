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

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._resample import percentile_ci as _percentile_ci
from spotstop.diagnostics._results import Estimate
from spotstop.diagnostics.cues._results import RelianceResult, fmt_estimate
from spotstop.diagnostics.cues._shift import ShiftResult
from spotstop.diagnostics.cues._templates import CUES

__all__ = ["Prediction", "SelectionResult", "crossing_scale", "predicted_error", "select"]

SELECT_SCHEMA_VERSION = 1


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


@dataclass(frozen=True)
class Prediction:
    """One candidate's SRA prediction for the deployment.

    predicted_error: Eq. 1 with its interval (``n`` = source scenes). source_error: error on
    the unedited source scenes. reliance: hard-answer reliance per cue. extra_error: per cue
    ``reliance · misleading share`` (the part of the prediction the deployment adds).
    rank / rank_by_source_error: 1 = best, by the prediction and by source error alone.
    """

    name: str
    kind: str
    predicted_error: Estimate
    source_error: Estimate
    reliance: Mapping[str, Estimate]
    extra_error: Mapping[str, float]
    rank: int
    rank_by_source_error: int

    def to_dict(self) -> dict[str, Any]:
        pe = self.predicted_error.to_dict()
        return {
            "name": self.name,
            "kind": self.kind,
            "predicted_error": {"value": pe["value"], "ci": pe["ci"]},
            "source_error": self.source_error.to_dict(),
            "rank": self.rank,
            "rank_by_source_error": self.rank_by_source_error,
            "reliance": {c: e.to_dict() for c, e in self.reliance.items()},
            "extra_error": {c: (None if math.isnan(v) else v) for c, v in self.extra_error.items()},
        }


@dataclass(frozen=True)
class SelectionResult:
    """Candidates in SRA rank order, the shares used, and what SRA changed and why."""

    ranking: tuple[Prediction, ...]
    shares: Mapping[str, Estimate]
    explanation: str
    provenance: Mapping[str, Any] = field(repr=False, default_factory=dict)

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
            "candidates": [p.to_dict() for p in self.ranking],
            "ranking_by_source_error": [p.name for p in by_source],
            "misleading_share": {c: e.to_dict() for c, e in self.shares.items()},
            "explanation": self.explanation,
            "provenance": dict(self.provenance),
        }

    def summary(self) -> str:
        """The first choice and where SRA departs from source error alone, and why."""
        p = self.best
        return f"SRA ranks {p.name} first (predicted error {fmt_estimate(p.predicted_error)}). " + (
            self.explanation
        )

    def table(self) -> str:
        head = (
            f"{'rank':>4}  {'candidate':<40} {'kind':<6} {'predicted error':<26} "
            f"{'source error':<26} {'rank by source error':>20}"
        )
        lines = [head, "-" * len(head)]
        for p in self.ranking:
            lines.append(
                f"{p.rank:>4}  {p.name[:40]:<40} {p.kind:<6} {fmt_estimate(p.predicted_error):<26} "
                f"{fmt_estimate(p.source_error):<26} {p.rank_by_source_error:>20}"
            )
        return "\n".join([*lines, "", self.explanation])


def _order(values: list[tuple[float, float, str]]) -> list[int]:
    """1-based ranks: NaN last, then by the tie-breakers in the tuple."""
    key = sorted(range(len(values)), key=lambda i: (math.isnan(values[i][0]), *values[i]))
    ranks = [0] * len(values)
    for r, i in enumerate(key, start=1):
        ranks[i] = r
    return ranks


def select(reliance: RelianceResult, shift: ShiftResult) -> SelectionResult:
    """Rank every candidate of ``reliance`` for the deployment measured by ``shift``."""
    if not reliance.candidates:
        raise DataError("no candidate to rank; measure at least one member or guard.")
    n = min(reliance.n_boot, shift.n_boot)
    shares = {c: shift.cues[c].misleading_share for c in CUES}
    share_draws = {c: np.asarray(shift.draws[c])[:n] for c in CUES}
    undefined = [c for c in CUES if math.isnan(shares[c].value)]
    if undefined:
        warnings.warn(
            f"the misleading share of {', '.join(undefined)} text is undefined, so every "
            "predicted error is NaN; see shift.json for why.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    rows = []
    for name, cand in reliance.candidates.items():
        h = cand.as_hard()
        rel = {c: h.cues[c].reliance for c in CUES}
        extra = {c: rel[c].value * shares[c].value for c in CUES}
        value = predicted_error(
            h.source_error.value,
            {c: rel[c].value for c in CUES},
            {c: shares[c].value for c in CUES},
        )
        d = np.asarray(reliance.draws[(name, "hard", "all", "source_error")])[:n].copy()
        for c in CUES:
            d += np.asarray(reliance.draws[(name, "hard", c, "reliance")])[:n] * share_draws[c]
        est = Estimate(value, _percentile_ci(d), h.source_error.n)
        rows.append((name, cand.kind, est, h.source_error, rel, extra))
    rank = _order([(r[2].value, r[3].value, r[0]) for r in rows])
    rank_src = _order([(r[3].value, 0.0, r[0]) for r in rows])
    preds = sorted(
        (
            Prediction(name, kind, est, src, rel, extra, rank[i], rank_src[i])
            for i, (name, kind, est, src, rel, extra) in enumerate(rows)
        ),
        key=lambda p: p.rank,
    )
    return SelectionResult(
        ranking=tuple(preds),
        shares=shares,
        explanation=_explain(preds, shares),
        provenance={"n_boot": n, "prevalence_source": shift.prevalence_source},
    )


def _explain(preds: list[Prediction], shares: Mapping[str, Estimate]) -> str:
    """Where SRA's ranking differs from source error alone, and why (Sec. 3.5)."""
    if any(math.isnan(shares[c].value) for c in CUES):
        return "SRA cannot rank: a cue's misleading share is undefined (see shift.json)."
    sra = preds[0]
    src = min(preds, key=lambda p: p.rank_by_source_error)
    moved = sum(p.rank != p.rank_by_source_error for p in preds)
    share_txt = ", ".join(f"{100 * shares[c].value:.1f}% {c}" for c in CUES)
    if sra.name == src.name:
        return (
            f"SRA keeps {sra.name}, which also has the lowest source error "
            f"({sra.source_error.value:.3f}); at this deployment's misleading shares ({share_txt}) "
            f"its text terms add {sum(sra.extra_error.values()):+.3f}. SRA reorders {moved} of "
            f"{len(preds)} candidates below it."
        )
    cue = max(CUES, key=lambda c: src.extra_error[c] - sra.extra_error[c])
    slope_sra, slope_src = sum(sra.extra_error.values()), sum(src.extra_error.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        t = crossing_scale(src.source_error.value, slope_src, sra.source_error.value, slope_sra)
    return (
        f"SRA picks {sra.name} where source error alone picks {src.name}: {src.name} errs less "
        f"on the source scenes ({src.source_error.value:.3f} against "
        f"{sra.source_error.value:.3f}), but it follows {cue} text more (hard-answer reliance "
        f"{src.reliance[cue].value:+.3f} against {sra.reliance[cue].value:+.3f}), and "
        f"{100 * shares[cue].value:.1f}% of this deployment's frames carry {cue} text that "
        f"misleads, which adds {src.extra_error[cue]:+.3f} to its error against "
        f"{sra.extra_error[cue]:+.3f}. Their error lines cross at {t:.2f}× this deployment's "
        f"misleading shares ({share_txt}): below that, {src.name} would be the better choice. "
        f"SRA reorders {moved} of {len(preds)} candidates."
    )
