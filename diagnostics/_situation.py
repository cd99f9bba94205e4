"""Situation share: how much of the score sits at the situation level, and what recentering
on the situation gains over artificial situations; and its card check (seed 000, Sec. 2, 6.2;
Supp. E.3).  Intervals are group-bootstrap intervals (``n`` = cases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._metrics import _undefined, auroc_unchecked, flag_rates, wbincount
from spotstop.diagnostics._resample import (
    MIN_GROUPS,
    as_rng,
    draw_group_counts,
    nan_estimate,
    percentile_ci,
)
from spotstop.diagnostics._results import Estimate
from spotstop.guard.policies import mean_cut, unsafe_mask

__all__ = ["SituationShare", "SituationShareCheck", "situation_reading", "situation_share"]


@dataclass(frozen=True)
class SituationShare:
    """How much of the score sits at the situation level (Sec. 2, 6.2; Supp. E.3).

    ``icc``: one-way intraclass correlation ICC(1) of the class-centred score (score minus
    its class mean) at situation level, unbalanced form with ``n0 = (N - Σn_j²/N)/(J - 1)``;
    it can be negative.  ``ba_real``/``auroc_real``: balanced accuracy of the guard's rule
    ``score ≥ situation mean`` and AUROC of ``score - situation mean``, on cases whose situation has at
    least two cases; ``*_artificial``: the same with situation codes permuted within class
    (``n_permutations``), which keeps every situation's class mix; ``*_gain`` = real −
    artificial (point: mean over permutations; interval: group bootstrap with one permutation
    per draw).  ``ba_global``: the global batch-mean cut (``score ≥ mean``) on the same cases, for
    reference.
    """

    icc: Estimate
    ba_real: float
    ba_artificial: float
    ba_gain: Estimate
    ba_global: float
    auroc_raw: float
    auroc_real: float
    auroc_artificial: float
    auroc_gain: Estimate
    n_situations: int


def _icc_from_sums(
    m: NDArray[np.float64],
    n_jc: NDArray[np.float64],
    s_jc: NDArray[np.float64],
    q_jc: NDArray[np.float64],
) -> NDArray[np.float64]:
    """ICC(1) of class-centred scores for situation multiplicities ``m`` (draws, J)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = (m @ s_jc) / (m @ n_jc)  # (draws, 2) class means
        n_j = n_jc.sum(axis=1)
        rs = s_jc.sum(axis=1)[None, :] - mu @ n_jc.T  # residual sums (draws, J)
        rq = q_jc.sum(axis=1)[None, :] - 2 * mu @ s_jc.T + (mu**2) @ n_jc.T
        big_n = m @ n_j
        j = m.sum(axis=1)
        between = (m * rs**2 / n_j).sum(axis=1)
        rbar = (m * rs).sum(axis=1) / big_n
        ssb = between - big_n * rbar**2
        ssw = (m * rq).sum(axis=1) - between
        msb = ssb / (j - 1)
        msw = ssw / (big_n - j)
        n0 = (big_n - (m @ n_j**2) / big_n) / (j - 1)
        return np.asarray((msb - msw) / (msb + (n0 - 1) * msw), dtype=np.float64)


def _situation_cuts(s: NDArray[np.float64], sit: NDArray[np.intp]) -> NDArray[np.float64]:
    """Each situation's mean as the guard's cut (:func:`spotstop.guard.policies.mean_cut`:
    a score equal to the exact mean is a tie, UNSAFE). The float means decide, except in a
    situation where a score lies within rounding of its mean: there the exact rule does."""
    counts = np.bincount(sit)
    means = np.bincount(sit, weights=s) / np.maximum(counts, 1)
    scale = np.bincount(sit, weights=np.abs(s)) / np.maximum(counts, 1)
    near = np.abs(s - means[sit]) <= 1e-9 * scale[sit]
    for j in np.unique(sit[near]).tolist():
        means[j] = mean_cut(s[sit == j])
    return np.asarray(means, dtype=np.float64)


def _centred_metrics(
    y: NDArray[np.int8], s: NDArray[np.float64], sit: NDArray[np.intp]
) -> tuple[float, float]:
    cuts = _situation_cuts(s, sit)[sit]
    c = s - cuts
    tpr, fpr = flag_rates(y, unsafe_mask(s, cuts))  # the guard's rule: S ≥ mean
    return 0.5 * (tpr + 1 - fpr), auroc_unchecked(y, c)


def _permute_within_class(
    gen: np.random.Generator, y: NDArray[np.int8], sit: NDArray[np.intp]
) -> NDArray[np.intp]:
    out = sit.copy()
    for cls in (0, 1):
        idx = np.flatnonzero(y == cls)
        out[idx] = sit[idx[gen.permutation(idx.size)]]
    return out


def situation_share(
    table: CaseTable,
    *,
    n_boot: int = 1000,
    n_permutations: int = 200,
    rng: np.random.Generator | int | None = None,
) -> SituationShare:
    """Situation-level share of the score and the gain of recentering on the situation."""
    gen = as_rng(rng)
    has = table.situation_id != ""
    _, sit = np.unique(table.situation_id[has], return_inverse=True)
    sit = sit.reshape(-1)
    sizes = np.bincount(sit)
    keep_case = sizes[sit] >= 2
    nan_result = SituationShare(
        nan_estimate(), math.nan, math.nan, nan_estimate(), math.nan, math.nan, math.nan,
        math.nan, nan_estimate(), 0,
    )  # fmt: skip
    y_all = table.label[has]
    if keep_case.sum() < 3 or len(set(y_all[keep_case].tolist())) < 2:
        _undefined("the situation share", "no two-case situations with both classes")
        return nan_result
    rows = np.flatnonzero(has)[keep_case]
    y, s = table.label[rows], table.score[rows]
    _, sit = np.unique(sit[keep_case], return_inverse=True)
    sit = sit.reshape(-1)
    n_sit = int(sit.max()) + 1
    grp_case = table.group[rows]
    sit_group = np.zeros(n_sit, dtype=np.intp)
    sit_group[sit] = grp_case
    _, sit_group = np.unique(sit_group, return_inverse=True)
    sit_group = sit_group.reshape(-1)
    ng = int(sit_group.max()) + 1
    # ICC with vectorized group bootstrap
    n_jc = np.stack([wbincount(sit, (y == c).astype(float), n_sit) for c in (0, 1)], 1)
    s_jc = np.stack([wbincount(sit, s * (y == c), n_sit) for c in (0, 1)], 1)
    q_jc = np.stack([wbincount(sit, s**2 * (y == c), n_sit) for c in (0, 1)], 1)
    icc_point = float(_icc_from_sums(np.ones((1, n_sit)), n_jc, s_jc, q_jc)[0])
    icc_draws = np.concatenate(
        [
            _icc_from_sums(c[:, sit_group], n_jc, s_jc, q_jc)
            for c in draw_group_counts(ng, n_boot, gen)
        ]
    )
    icc = Estimate(icc_point, percentile_ci(icc_draws), int(rows.size))
    # recentering on real and artificial situations
    ba_real, au_real = _centred_metrics(y, s, sit)
    arts = np.array(
        [_centred_metrics(y, s, _permute_within_class(gen, y, sit)) for _ in range(n_permutations)]
    )
    ba_art, au_art = (float(v) for v in np.nanmean(arts, axis=0))
    tpr, fpr = flag_rates(y, unsafe_mask(s, mean_cut(s)))
    ba_global = 0.5 * (tpr + 1 - fpr)
    # bootstrap of the gains: materialize each draw, one permutation per draw
    case_group = np.unique(grp_case, return_inverse=True)[1].reshape(-1)
    members = [np.flatnonzero(case_group == g) for g in range(ng)]
    d_ba, d_au = np.empty(n_boot), np.empty(n_boot)
    for b, counts in enumerate(
        row for chunk in draw_group_counts(ng, n_boot, gen, 1000) for row in chunk
    ):
        pick = np.repeat(np.arange(ng), counts.astype(np.intp))
        idx = np.concatenate([members[g] for g in pick])
        copy = np.repeat(np.arange(pick.size), [members[g].size for g in pick])
        sit_b = np.unique(copy * n_sit + sit[idx], return_inverse=True)[1].reshape(-1)
        yb, sb = y[idx], s[idx]
        r_ba, r_au = _centred_metrics(yb, sb, sit_b)
        a_ba, a_au = _centred_metrics(yb, sb, _permute_within_class(gen, yb, sit_b))
        d_ba[b], d_au[b] = r_ba - a_ba, r_au - a_au
    return SituationShare(
        icc=icc,
        ba_real=ba_real,
        ba_artificial=ba_art,
        ba_gain=Estimate(ba_real - ba_art, percentile_ci(d_ba), int(rows.size)),
        ba_global=ba_global,
        auroc_raw=auroc_unchecked(y, s),
        auroc_real=au_real,
        auroc_artificial=au_art,
        auroc_gain=Estimate(au_real - au_art, percentile_ci(d_au), int(rows.size)),
        n_situations=n_sit,
    )


class SituationShareCheck(CardCheck):
    """:func:`situation_share` on the card's cases."""

    name: ClassVar[str] = "situation_share"
    title: ClassVar[str] = "Situation share"
    explanation: ClassVar[str] = (
        "Share of the label-adjusted score variance at situation level (ICC) and the "
        "balanced-accuracy gain of recentering on real over artificial situations; the last "
        "row reads these numbers and says what to do."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        sit = situation_share(ctx.table, n_boot=ctx.n_boot, rng=ctx.rng)
        n = sit.icc.n
        data: dict[str, object] = {
            "icc": sit.icc,
            "ba_gain_vs_artificial": sit.ba_gain,
            "auroc_gain_vs_artificial": sit.auroc_gain,
            "ba_situation": Estimate.point(sit.ba_real, n),
            "ba_artificial": Estimate.point(sit.ba_artificial, n),
            "ba_global_batch_mean": Estimate.point(sit.ba_global, n),
            "auroc_centred": Estimate.point(sit.auroc_real, n),
            "auroc_centred_artificial": Estimate.point(sit.auroc_artificial, n),
            "n_situations": sit.n_situations,
        }
        rows = (
            ("ICC at situation level", fmt(sit.icc, pct=False)),
            ("balanced accuracy gain of recentering vs artificial situations", fmt(sit.ba_gain)),
            ("AUROC gain of the centred score vs artificial", fmt(sit.auroc_gain, pct=False)),
            ("situations with two or more cases", str(sit.n_situations)),
            ("what to do", situation_reading(sit)),
        )
        data["reading"] = rows[-1][1]
        return CheckResult(data, rows, result=sit)


def situation_reading(sit: SituationShare) -> str:
    """The situation section's "what to do" line, chosen from its computed values."""
    g = sit.ba_gain
    few = (
        f" Only {sit.n_situations} situations: the interval is optimistic (fewer than "
        f"{MIN_GROUPS} groups)."
        if 0 < sit.n_situations < MIN_GROUPS
        else ""
    )
    if not math.isfinite(g.value):
        return "not measured: the cases need situations with both classes; give situation_id." + few
    if math.isfinite(g.ci.low) and g.ci.low > 0:
        return (
            f"recentering on the situation gains {fmt(g)} points over artificial situations "
            "(interval above 0) → the situation policy can use it, where situations repeat." + few
        )
    if math.isfinite(g.ci.high) and g.ci.high < 0:
        return (
            f"recentering on the situation loses {fmt(g)} points against artificial "
            "situations (interval below 0) → do not recentre on the situation." + few
        )
    return (
        f"recentering on the situation gains {fmt(g)} points over artificial situations, an "
        "interval that includes 0 → no evidence that the situation policy helps here." + few
    )
