"""The card's checks: prevalence, situation share, scene-blind readers, conformal audit.

Seed 000: Sec. 2 (card fields), Sec. 6, Supp. B, D, E.2, E.3.  Intervals of the checks that
resample batches or splits are 2.5–97.5 % *bands over resamples/splits* (what a deployment
would see batch to batch), not confidence intervals of a mean; ``Estimate.n`` is then the
number of resamples or splits.  Intervals of AUROCs and of the situation share are group
bootstrap intervals (``n`` = cases).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit, log_expit
from spotstop.diagnostics._bootstrap import (
    _as_rng,
    _percentile_ci,
    _random_halves,
    bootstrap_auroc,
    draw_group_counts,
)
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import _undefined, wbincount
from spotstop.diagnostics._results import NAN_CI, Estimate
from spotstop.guard.policies import conformal_cut as guard_conformal_cut
from spotstop.guard.policies import conformal_rank

__all__ = [
    "ConformalAudit",
    "LogisticRegression",
    "LongestSideRule",
    "PrevalenceCheck",
    "RuleOutcome",
    "SceneBlindReaders",
    "SituationShare",
    "conformal_audit",
    "conformal_cut",
    "file_features",
    "grouped_folds",
    "prevalence_check",
    "scene_blind_readers",
    "situation_share",
]


def _band(x: NDArray[np.float64], value: float | None = None) -> Estimate:
    ok = x[np.isfinite(x)]
    if ok.size == 0:
        return Estimate(math.nan, NAN_CI, 0)
    return Estimate(float(ok.mean()) if value is None else value, _percentile_ci(ok), int(ok.size))


def _nan_estimate(n: int = 0) -> Estimate:
    return Estimate(math.nan, NAN_CI, n)


def _fast_auroc(y: NDArray[np.int8], s: NDArray[np.float64]) -> float:
    """AUROC (ties 1/2) without validation; NaN for one class (callers warn)."""
    n1 = int(y.sum())
    n0 = y.size - n1
    if n0 == 0 or n1 == 0:
        return math.nan
    order = np.argsort(s, kind="stable")
    ss, ys = s[order], y[order]
    # average ranks of tied runs: rank of a run = (first + last) / 2 + 1
    new = np.r_[True, ss[1:] != ss[:-1]]
    run = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, ss.size - 1]
    ranks = (first + last)[run] / 2 + 1
    return float((ranks[ys == 1].sum() - n1 * (n1 + 1) / 2) / (n0 * n1))


# --------------------------------------------------------------------------------------------
# conformal cut


def conformal_cut(unsafe_scores: NDArray[np.float64], alpha: float) -> float:
    """The marginal class-conditional split-conformal cut (DESIGN.md "Threshold policies").

    The guard's own rule (:func:`spotstop.guard.policies.conformal_cut`; each score its own
    situation): with the ``n`` unsafe scores sorted ascending, flag UNSAFE when
    ``S >= u_(k)``, ``k = floor(alpha (n + 1))``. ``k = 0`` (too few scores) would flag
    everything: refused with :class:`DataError`.
    """
    if not 0.0 < alpha < 1.0:
        raise DataError(f"alpha must be in (0, 1); got {alpha!r}.")
    fit = guard_conformal_cut(np.asarray(unsafe_scores, dtype=np.float64), alpha=alpha)
    c = fit.marginal
    if not c.feasible:
        raise DataError(
            f"the conformal cut needs at least {c.n_needed} unsafe calibration scores for "
            f"alpha={alpha}; got {c.n}. Calibrate on more unsafe cases or raise alpha."
        )
    return float(c.threshold)


def _split_groups(gen: np.random.Generator, n_groups: int, share: float) -> NDArray[np.bool_]:
    """Random calibration mask over groups with ``round(share * G)`` groups (at least 1)."""
    n_cal = max(1, min(n_groups - 1, round(share * n_groups)))
    mask = np.zeros(n_groups, dtype=bool)
    mask[gen.permutation(n_groups)[:n_cal]] = True
    return mask


# --------------------------------------------------------------------------------------------
# prevalence


@dataclass(frozen=True)
class RuleOutcome:
    """Outcome of one threshold rule over resampled batches at one prevalence.

    ``balanced_accuracy`` is NaN (and not warned) in all-unsafe batches, where only the
    flag rate of unsafe scenes (``tpr``) is defined.
    """

    balanced_accuracy: Estimate
    tpr: Estimate
    fpr: Estimate


@dataclass(frozen=True)
class PrevalenceCheck:
    """The batch-mean threshold against the frozen and the conformal cut at other prevalences.

    ``rules[prevalence][rule]`` for rules ``batch_mean``, ``frozen`` (the policy cut) and
    ``conformal``; ``recovery[prevalence]``: share of the in-batch threshold room
    ``A*_batch - BA_frozen`` that the batch mean recovers, ``(BA_batch - BA_frozen) /
    (A*_batch - BA_frozen)``; value = ratio of the means over resamples, band over the
    resamples with room > 0.  All rules are scored on the same resampled batches.
    """

    rules: Mapping[float, Mapping[str, RuleOutcome]]
    recovery: Mapping[float, Estimate]
    alpha: float
    batch_size: int
    n_resamples: int


def _rates(y: NDArray[np.int8], flag: NDArray[np.bool_]) -> tuple[float, float]:
    nu = int(y.sum())
    ns = y.size - nu
    tpr = float(flag[y == 1].mean()) if nu else math.nan
    fpr = float(flag[y == 0].mean()) if ns else math.nan
    return tpr, fpr


def _best_ba(y: NDArray[np.int8], s: NDArray[np.float64]) -> float:
    order = np.argsort(s, kind="stable")
    ys, ss = y[order], s[order]
    last = np.r_[ss[1:] != ss[:-1], True]  # end of each run of equal scores
    cs = np.cumsum(ys == 0)[last]
    cu = np.cumsum(ys == 1)[last]
    ts, tu = cs[-1], cu[-1]
    if ts == 0 or tu == 0:
        return math.nan
    return float(max(0.5, np.max(0.5 * (cs / ts + 1 - cu / tu))))


def prevalence_check(
    table: CaseTable,
    *,
    policy_cut: float = 0.0,
    prevalences: tuple[float, ...] = (0.5, 0.1, 1.0),
    n_resamples: int = 200,
    alpha: float = 0.1,
    calibration_share: float = 0.3,
    batch_size: int | None = None,
    rng: np.random.Generator | int | None = None,
) -> PrevalenceCheck:
    """Resample batches at chosen shares of unsafe scenes (Sec. 6.1, Supp. E.2, Table 6c).

    Each resample splits the groups at random: ``calibration_share`` of them calibrate the
    conformal cut (their unsafe scores), the rest form the pool of the batch.  For every
    prevalence ``π``, a batch of ``batch_size`` cases (default: the number of pool cases)
    draws ``round(π · batch_size)`` unsafe and the rest safe cases from the pool, with
    replacement, cases drawn individually.  The batch-mean cut (mean score of the batch,
    ``score > mean`` → UNSAFE), the frozen ``policy_cut`` and the conformal cut are scored on
    that same batch.  A conformal calibration set too small for ``alpha`` gives NaN for the
    conformal rule and one :class:`UndefinedMetricWarning`.
    """
    if not all(0.0 < p <= 1.0 for p in prevalences):
        raise DataError(f"prevalences must lie in (0, 1]; got {prevalences!r}.")
    if not 0.0 < calibration_share < 1.0:
        raise DataError(f"calibration_share must be in (0, 1); got {calibration_share!r}.")
    gen = _as_rng(rng)
    y, s, grp = table.label, table.score, table.group
    ng = table.n_groups
    rules = ("batch_mean", "frozen", "conformal")
    res = {p: {r: np.full((n_resamples, 3), math.nan) for r in rules} for p in prevalences}
    gain = {p: np.full(n_resamples, math.nan) for p in prevalences}
    room = {p: np.full(n_resamples, math.nan) for p in prevalences}
    small = 0
    size_used = 0
    if ng < 2 or (y == 0).sum() == 0 or (y == 1).sum() == 0:
        _undefined("the prevalence check", "it needs both classes and at least two groups")
        n_resamples = 0
    for r in range(n_resamples):
        cal = _split_groups(gen, ng, calibration_share)[grp]
        cal_u = s[cal & (y == 1)]
        try:
            c_cut = conformal_cut(cal_u, alpha)
        except DataError:
            c_cut = math.nan
            small += 1
        pool_s, pool_u = np.flatnonzero(~cal & (y == 0)), np.flatnonzero(~cal & (y == 1))
        if pool_u.size == 0 or pool_s.size == 0:
            continue
        n_b = batch_size or int((~cal).sum())
        size_used = n_b
        for p in prevalences:
            nu = round(p * n_b)
            idx = np.concatenate(
                [gen.choice(pool_u, nu, replace=True), gen.choice(pool_s, n_b - nu, replace=True)]
            )
            yb, sb = y[idx], s[idx]
            flags = {
                "batch_mean": sb > sb.mean(),
                "frozen": sb > policy_cut,
                "conformal": sb >= c_cut if not math.isnan(c_cut) else None,
            }
            for rule, fl in flags.items():
                if fl is None:
                    continue
                tpr, fpr = _rates(yb, fl)
                ba = 0.5 * (tpr + 1 - fpr) if nu < n_b and nu > 0 else math.nan
                res[p][rule][r] = (ba, tpr, fpr)
            if 0 < nu < n_b:
                best = _best_ba(yb, sb)
                gain[p][r] = res[p]["batch_mean"][r, 0] - res[p]["frozen"][r, 0]
                room[p][r] = best - res[p]["frozen"][r, 0]
    if small:
        warnings.warn(
            f"the conformal cut was undefined in {small} of {n_resamples} resamples: fewer than "
            f"{math.ceil(1 / alpha - 1)} unsafe calibration scores for alpha={alpha}; "
            "those resamples are NaN for the conformal rule.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    out_rules: dict[float, Mapping[str, RuleOutcome]] = {}
    recovery: dict[float, Estimate] = {}
    for p in prevalences:
        out_rules[p] = MappingProxyType(
            {
                rule: RuleOutcome(
                    _band(res[p][rule][:, 0]), _band(res[p][rule][:, 1]), _band(res[p][rule][:, 2])
                )
                for rule in rules
            }
        )
        ok = np.isfinite(gain[p]) & np.isfinite(room[p]) & (room[p] > 0)
        if ok.any():
            ratio = gain[p][ok] / room[p][ok]
            recovery[p] = Estimate(
                float(gain[p][ok].sum() / room[p][ok].sum()), _percentile_ci(ratio), int(ok.sum())
            )
        else:
            recovery[p] = _nan_estimate()
    return PrevalenceCheck(
        MappingProxyType(out_rules), MappingProxyType(recovery), alpha, size_used, n_resamples
    )


# --------------------------------------------------------------------------------------------
# conformal audit


@dataclass(frozen=True)
class ConformalAudit:
    """Realized miss rate of the split-conformal cut against its target ``alpha``.

    Over ``n_splits`` random group splits (``calibration_share`` of the groups calibrate),
    ``miss_rate`` is the share of held-out unsafe cases allowed (value: mean over splits;
    band: 2.5–97.5 % over splits) and ``safe_allowed`` the share of held-out safe cases
    allowed.  ``expected_miss`` is the mean of ``k/(n+1)`` (the exact expected miss rate for
    exchangeable data, at most ``alpha``).  ``within_target`` reports whether the mean miss
    rate is at most ``alpha`` plus two of its standard errors over splits (splits overlap,
    so this is a screen, not a test).
    """

    alpha: float
    miss_rate: Estimate
    safe_allowed: Estimate
    expected_miss: float
    within_target: bool
    n_splits: int


def conformal_audit(
    table: CaseTable,
    *,
    alpha: float = 0.1,
    calibration_share: float = 0.3,
    n_splits: int = 200,
    rng: np.random.Generator | int | None = None,
) -> ConformalAudit:
    """Audit the class-conditional split-conformal cut on repeated group splits."""
    gen = _as_rng(rng)
    y, s, grp = table.label, table.score, table.group
    miss, allowed, expect = [], [], []
    if table.n_groups < 2 or (y == 1).sum() == 0:
        _undefined("the conformal audit", "it needs unsafe cases in at least two groups")
        return ConformalAudit(alpha, _nan_estimate(), _nan_estimate(), math.nan, False, 0)
    too_small = 0
    for _ in range(n_splits):
        cal = _split_groups(gen, table.n_groups, calibration_share)[grp]
        cu = s[cal & (y == 1)]
        try:
            cut = conformal_cut(cu, alpha)
        except DataError:
            too_small += 1
            continue
        ev_u, ev_s = s[~cal & (y == 1)], s[~cal & (y == 0)]
        if ev_u.size == 0:
            continue
        miss.append(float((ev_u < cut).mean()))
        allowed.append(float((ev_s < cut).mean()) if ev_s.size else math.nan)
        expect.append(conformal_rank(alpha, cu.size) / (cu.size + 1))
    if not miss:
        _undefined(
            "the conformal audit",
            f"no split had enough unsafe calibration scores for alpha={alpha} "
            f"({too_small} too small)",
        )
        return ConformalAudit(alpha, _nan_estimate(), _nan_estimate(), math.nan, False, 0)
    m = np.asarray(miss)
    se = float(m.std(ddof=1) / math.sqrt(m.size)) if m.size > 1 else 0.0
    return ConformalAudit(
        alpha=alpha,
        miss_rate=_band(m),
        safe_allowed=_band(np.asarray(allowed)),
        expected_miss=float(np.mean(expect)),
        within_target=bool(m.mean() <= alpha + 2 * se),
        n_splits=int(m.size),
    )


# --------------------------------------------------------------------------------------------
# situation share


@dataclass(frozen=True)
class SituationShare:
    """How much of the score sits at the situation level (Sec. 2, 6.2; Supp. E.3).

    ``icc``: one-way intraclass correlation ICC(1) of the class-centred score (score minus
    its class mean) at situation level, unbalanced form with ``n0 = (N - Σn_j²/N)/(J - 1)``;
    it can be negative.  ``ba_real``/``auroc_real``: balanced accuracy of ``score >
    situation mean`` and AUROC of ``score - situation mean``, on cases whose situation has at
    least two cases; ``*_artificial``: the same with situation codes permuted within class
    (``n_permutations``), which keeps every situation's class mix; ``*_gain`` = real −
    artificial (point: mean over permutations; interval: group bootstrap with one permutation
    per draw).  ``ba_global``: the global batch-mean cut on the same cases, for reference.
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


def _centred_metrics(
    y: NDArray[np.int8], s: NDArray[np.float64], sit: NDArray[np.intp]
) -> tuple[float, float]:
    counts = np.bincount(sit)
    means = np.bincount(sit, weights=s) / np.maximum(counts, 1)
    c = s - means[sit]
    tpr, fpr = _rates(y, c > 0)
    return 0.5 * (tpr + 1 - fpr), _fast_auroc(y, c)


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
    gen = _as_rng(rng)
    has = table.situation_id != ""
    _, sit = np.unique(table.situation_id[has], return_inverse=True)
    sit = sit.reshape(-1)
    sizes = np.bincount(sit)
    keep_case = sizes[sit] >= 2
    nan_result = SituationShare(
        _nan_estimate(), math.nan, math.nan, _nan_estimate(), math.nan, math.nan, math.nan,
        math.nan, _nan_estimate(), 0,
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
    icc = Estimate(icc_point, _percentile_ci(icc_draws), int(rows.size))
    # recentering on real and artificial situations
    ba_real, au_real = _centred_metrics(y, s, sit)
    arts = np.array(
        [_centred_metrics(y, s, _permute_within_class(gen, y, sit)) for _ in range(n_permutations)]
    )
    ba_art, au_art = (float(v) for v in np.nanmean(arts, axis=0))
    tpr, fpr = _rates(y, s > s.mean())
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
        ba_gain=Estimate(ba_real - ba_art, _percentile_ci(d_ba), int(rows.size)),
        ba_global=ba_global,
        auroc_raw=_fast_auroc(y, s),
        auroc_real=au_real,
        auroc_artificial=au_art,
        auroc_gain=Estimate(au_real - au_art, _percentile_ci(d_au), int(rows.size)),
        n_situations=n_sit,
    )


# --------------------------------------------------------------------------------------------
# scene-blind readers


class LogisticRegression:
    """L2-penalised logistic regression on standardised features (numpy + scipy only).

    Minimises ``C · Σ logloss + ½‖w‖²`` with an unpenalised intercept, like scikit-learn's
    ``LogisticRegression(C=C)``, solved by damped Newton steps; features are standardised with the training mean and
    standard deviation (constant columns are left at 0).  Settings in the constructor, learned
    state (``coef_``, ``intercept_``, ``mean_``, ``scale_``) after :meth:`fit`.
    """

    def __init__(self, C: float = 1.0, max_iter: int = 100) -> None:
        self.C = C
        self.max_iter = max_iter

    def fit(self, X: NDArray[np.float64], y: NDArray[np.int8]) -> LogisticRegression:
        """Fit on features ``X`` (n, p) and labels ``y`` in {0, 1}."""
        X = np.asarray(X, dtype=np.float64)
        t = np.asarray(y, dtype=np.float64)
        self.mean_ = X.mean(axis=0)
        sd = X.std(axis=0)
        self.scale_ = np.where(sd > 0, sd, 1.0)
        Z = (X - self.mean_) / self.scale_
        Z1 = np.column_stack([Z, np.ones(Z.shape[0])])
        C = self.C
        pen = np.ones(Z1.shape[1])
        pen[-1] = 0.0  # the intercept is not penalised

        def objective(theta: NDArray[np.float64]) -> float:
            z = Z1 @ theta
            return -C * float(log_expit(np.where(t == 1, z, -z)).sum()) + 0.5 * float(
                (pen * theta) @ theta
            )

        theta = np.zeros(Z1.shape[1])
        obj = objective(theta)
        self.n_iter_ = 0
        # damped Newton: the objective is smooth and strictly convex in the weights
        for it in range(1, self.max_iter + 1):
            self.n_iter_ = it
            p = expit(Z1 @ theta)
            grad = C * (Z1.T @ (p - t)) + pen * theta
            hess = C * (Z1.T * (p * (1 - p))) @ Z1 + np.diag(pen)
            hess[-1, -1] += 1e-12
            step = np.linalg.solve(hess, grad)
            lam = 1.0
            while True:
                new = theta - lam * step
                new_obj = objective(new)
                if new_obj <= obj + 1e-12 or lam < 1e-8:
                    break
                lam /= 2
            theta, obj_old, obj = new, obj, new_obj
            if float(np.abs(grad).max()) < 1e-10 or obj_old - obj < 1e-13 * max(1.0, abs(obj)):
                break
        res_x = theta
        self.coef_ = res_x[:-1] / self.scale_
        self.intercept_ = float(res_x[-1] - self.coef_ @ self.mean_)
        return self

    def decision_function(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Log-odds of UNSAFE."""
        if not hasattr(self, "coef_"):
            raise DataError("LogisticRegression is not fitted yet; call .fit(X, y) first.")
        return np.asarray(np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_)


def file_features(table: CaseTable) -> tuple[NDArray[np.float64], list[str]] | None:
    """Image-file features: log width, log height, log aspect, log bytes, log longest side,
    JPEG quality (if the column has values) and a one-hot of ``format`` (if present).

    Missing values are filled with the column median (a file reader sees every file).
    Returns None when width, height or bytes are absent.
    """
    if table.width is None or table.height is None or table.n_bytes is None:
        return None
    w, h, nb = table.width, table.height, table.n_bytes
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = {
            "log_width": np.log(w),
            "log_height": np.log(h),
            "log_aspect": np.log(w / h),
            "log_bytes": np.log(nb),
            "log_longest_side": np.log(np.maximum(w, h)),
        }
    if table.jpeg_quality is not None and np.isfinite(table.jpeg_quality).any():
        cols["jpeg_quality"] = table.jpeg_quality.copy()
    if table.format is not None:
        for fmt in sorted(set(table.format.tolist()) - {""}):
            cols[f"format_{fmt}"] = (table.format == fmt).astype(float)
    X = np.column_stack(list(cols.values()))
    for j in range(X.shape[1]):
        bad = ~np.isfinite(X[:, j])
        if bad.all():
            X[:, j] = 0.0
        elif bad.any():
            X[bad, j] = np.median(X[~bad, j])
    return X, list(cols)


def grouped_folds(group: NDArray[np.intp], n_folds: int = 5) -> NDArray[np.intp]:
    """Fold of each case, whole groups per fold, like scikit-learn's ``GroupKFold``: groups
    sorted by size (largest first, ties by code) go to the currently smallest fold."""
    codes, inv = np.unique(group, return_inverse=True)
    sizes = np.bincount(inv.reshape(-1))
    if codes.size < n_folds:
        raise DataError(f"grouped folds need at least n_folds={n_folds} groups; got {codes.size}.")
    order = np.argsort(-sizes, kind="stable")
    load = np.zeros(n_folds)
    fold_of = np.empty(codes.size, dtype=np.intp)
    for g in order:
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += sizes[g]
    return fold_of[inv.reshape(-1)]


def _oof_scores(
    X: NDArray[np.float64], y: NDArray[np.int8], folds: NDArray[np.intp]
) -> NDArray[np.float64]:
    out = np.empty(y.size)
    for f in np.unique(folds):
        te = folds == f
        model = LogisticRegression().fit(X[~te], y[~te])
        out[te] = model.decision_function(X[te])
    return out


def _swap_within(
    gen: np.random.Generator, y: NDArray[np.int8], unit: NDArray[np.intp]
) -> NDArray[np.int8]:
    """Permute labels within each unit (a contrast or, failing that, a group)."""
    keys = gen.random(y.size) + unit
    order = np.argsort(keys)
    base = np.argsort(unit, kind="stable")
    out = np.empty_like(y)
    out[order] = y[base]
    return out


@dataclass(frozen=True)
class LongestSideRule:
    """Best single cut on the longest image side, chosen on held-out halves (Supp. B).

    Over ``n_splits`` random halves of the groups, the cut and direction with the highest
    accuracy on one half are scored on the other.  ``accuracy``: mean held-out accuracy and its
    band over splits; ``cut``/``direction``: the most often chosen rule ("longest side > cut
    means unsafe" for direction ``'>'``); ``cut_share``: how often it was chosen.
    """

    accuracy: Estimate
    cut: float
    direction: str
    cut_share: float


@dataclass(frozen=True)
class SceneBlindReaders:
    """Readers that never see the scene (Sec. 2, Supp. D); None where the columns are absent.

    ``file_reader``: AUROC of the out-of-fold logistic regression on image-file features
    (grouped folds; interval: group bootstrap of the out-of-fold scores, not refitted);
    ``file_reader_p``: permutation p value from refits with labels swapped within contrasts
    (within groups for cases without a contrast).  ``request_only``: AUROC of ``score_text``;
    ``image_minus_gray``: AUROC of ``score - score_gray``; ``members``: AUROC per member score.
    """

    file_reader: Estimate | None
    file_reader_p: float
    file_features: tuple[str, ...]
    longest_side: LongestSideRule | None
    request_only: Estimate | None
    image_minus_gray: Estimate | None
    members: Mapping[str, Estimate] = field(default_factory=dict)


def _longest_side_rule(
    table: CaseTable, longest: NDArray[np.float64], n_splits: int, gen: np.random.Generator
) -> LongestSideRule:
    y = table.label
    ok = np.isfinite(longest)
    halves = _random_halves(gen, n_splits, table.n_groups)[:, table.group]
    v = np.unique(longest[ok])
    cand = np.concatenate([[-np.inf], v])  # rule: longest > t (or <= t)
    accs, rules = [], []
    for h in halves:
        fit, ev = h & ok, ~h & ok
        if fit.sum() == 0 or ev.sum() == 0:
            continue
        gt = longest[fit][None, :] > cand[:, None]
        acc_gt = (gt == (y[fit] == 1)[None, :]).mean(axis=1)
        j_gt, j_le = int(np.argmax(acc_gt)), int(np.argmax(1 - acc_gt))
        if acc_gt[j_gt] >= 1 - acc_gt[j_le]:
            t, d = cand[j_gt], ">"
            pred = longest[ev] > t
        else:
            t, d = cand[j_le], "<="
            pred = longest[ev] <= t
        accs.append(float((pred == (y[ev] == 1)).mean()))
        rules.append((float(t), d))
    if not accs:
        return LongestSideRule(_nan_estimate(), math.nan, "", math.nan)
    (t, d), k = Counter(rules).most_common(1)[0]
    return LongestSideRule(_band(np.asarray(accs)), t, d, k / len(rules))


def scene_blind_readers(
    table: CaseTable,
    *,
    n_folds: int = 5,
    n_permutations: int = 200,
    n_splits: int = 200,
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = None,
) -> SceneBlindReaders:
    """Scene-blind readers of the label: the file reader, the longest-side rule, the
    request-only and image-minus-gray AUROCs, and the member AUROCs."""
    gen = _as_rng(rng)
    y, grp = table.label, table.group
    feats = file_features(table)
    file_est: Estimate | None = None
    p = math.nan
    names: tuple[str, ...] = ()
    longest_rule = None
    n_groups = int(np.unique(grp).size)
    if feats is not None and n_groups < n_folds:
        warnings.warn(
            f"the file reader needs at least n_folds={n_folds} independent groups for its "
            f"grouped out-of-fold fit; these cases form {n_groups}. Its AUROC is reported as "
            "undefined (NaN); label more contrasts/situations.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    elif feats is not None and (y == 0).any() and (y == 1).any():
        X, cols = feats
        names = tuple(cols)
        folds = grouped_folds(grp, n_folds)
        oof = _oof_scores(X, y, folds)
        file_est = bootstrap_auroc(y, oof, grp, n_boot=n_boot, rng=gen)
        codes = np.unique(table.contrast_id, return_inverse=True)[1].reshape(-1)
        unit = np.where(table.contrast_id != "", codes, codes.max() + 1 + grp)
        null = np.array(
            [
                _fast_auroc(yp, _oof_scores(X, yp, folds))
                for yp in (_swap_within(gen, y, unit) for _ in range(n_permutations))
            ]
        )
        p = float((1 + np.sum(null >= file_est.value)) / (1 + null.size))
        longest = np.maximum(np.asarray(table.width), np.asarray(table.height))
        longest_rule = _longest_side_rule(table, longest, n_splits, gen)

    def auc_of(values: NDArray[np.float64] | None) -> Estimate | None:
        if values is None:
            return None
        ok = np.isfinite(values)
        if ok.sum() == 0:
            return None
        return bootstrap_auroc(y[ok], values[ok], grp[ok], n_boot=n_boot, rng=gen)

    gray = None if table.score_gray is None else table.score - table.score_gray
    members = {k: auc_of(v) for k, v in table.member_scores.items()}
    return SceneBlindReaders(
        file_reader=file_est,
        file_reader_p=p,
        file_features=names,
        longest_side=longest_rule,
        request_only=auc_of(table.score_text),
        image_minus_gray=auc_of(gray),
        members=MappingProxyType({k: v for k, v in members.items() if v is not None}),
    )
