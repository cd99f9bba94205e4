"""Ranking and labelling metrics and the Spot-Stop decomposition (seed 000, Sec. 3, Supp. C).

Conventions (chosen where the paper is silent, and tested):

* A score ``s`` is answered UNSAFE when ``s > cut`` (the direct cut is 0, so a score of exactly
  0 is answered SAFE, as the model's own answer is UNSAFE only when p(UNSAFE) > p(SAFE)).
* AUROC counts ties as one half; the paper's ranking rate ``R`` counts a tied contrast as
  *not* ordered (Supp. C) and is reported as such.  The decomposition counts ties as one half
  on both sides: with ``T`` the share of tied contrasts, ``R½ = R + T/2`` and the label-swap
  null is ``E[G0] = (1 - C - T)/2`` (a tied pair is ordered in neither orientation), so
  ``G - E[G0] = R½ - A = threshold + overlap + within`` exactly, with ties, and the paper's
  ``R - A = tie_part + threshold + overlap + within`` with ``tie_part = R - R½ = -T/2``.
  Without ties ``R½ = R`` and every formula is the paper's.
* All Spot-Stop terms are computed on the *paired cases*, each case weighted by the number of
  pairs it belongs to (see :mod:`spotstop.diagnostics._data`); with one-to-one contrasts every weight is
  1.  Under this weighting ``A = 1/2 + L - C/2`` is the balanced accuracy of the direct answer,
  ``A*`` the best balanced accuracy of any single cut (so ``A* >= A``), and the identity
  ``R½ - A = (A* - A) + (AUROC - A*) + (R½ - AUROC)`` holds exactly.
* Degenerate input (one class, no pairs) gives :class:`UndefinedMetricWarning` and NaN.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr, ndtri
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.guard.validate import is_real

__all__ = [
    "TIES_COMMON",
    "BestCut",
    "DPrimeOfAuroc",
    "KernelReference",
    "PairRates",
    "SignalDetection",
    "SpotStop",
    "TiedScoresWarning",
    "auroc",
    "auroc_unchecked",
    "balanced_accuracy",
    "best_ba_unchecked",
    "best_balanced_accuracy",
    "d_prime_of_auroc",
    "direct_answer",
    "flag_rates",
    "g_auroc",
    "kernel_reference",
    "pair_rates",
    "signal_detection",
    "spot_stop",
    "ties_message",
]

#: a tied share of contrasts at or above this is "common" (the card says what it means)
TIES_COMMON = 0.05


class TiedScoresWarning(UndefinedMetricWarning):
    """Many contrasts are tied (both scenes score equal): the paper's ``R`` and ``R - A`` are
    pulled down by half the tied share; read the tie-consistent ``R½ - A``."""


def ties_message(tied_share: float, tie_part: float, r_half_minus_a: float) -> str:
    """The card's words for common ties (the text of :class:`TiedScoresWarning`)."""
    return (
        f"ties: {100 * tied_share:.1f} % of the contrasts score exactly equal on both scenes "
        "(the score takes few distinct values: discrete or hard-label scores). The paper's R "
        f"counts them as not ordered, so R − A carries tie_part = {100 * tie_part:+.1f} points "
        "that are no cut or overlap problem; the tie-consistent R½ − A = "
        f"{100 * r_half_minus_a:+.1f} splits into threshold + overlap + within. A finer "
        "readout of the score (more distinct values, e.g. log-probabilities instead of "
        "rounded labels) would resolve the ties; a different cut would not."
    )


def direct_answer(score: ArrayLike, cut: float = 0.0) -> NDArray[np.bool_]:
    """The paper's direct answer, written once for the diagnostics: ``score > cut`` is UNSAFE.

    (A member's own answer is UNSAFE only when p(UNSAFE) > p(SAFE), so at the cut itself it is
    SAFE; the guard's rule, ``S ≥ t`` with ties UNSAFE, is
    :func:`spotstop.guard.policies.unsafe_mask`.) A non-finite score is UNSAFE: no answer is
    read off a score that does not exist.
    """
    s = np.asarray(score, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(s) | (s > cut)


NAN = math.nan


def _undefined(what: str, why: str) -> float:
    warnings.warn(
        f"{what} is undefined: {why}; returning NaN.", UndefinedMetricWarning, stacklevel=3
    )
    return NAN


# --------------------------------------------------------------------------------------------
# input validation (one helper per public entry point shape)


def _check_scored(
    y: ArrayLike, score: ArrayLike, sample_weight: ArrayLike | None
) -> tuple[NDArray[np.int8], NDArray[np.float64], NDArray[np.float64]]:
    ya = np.asarray(y)
    sa = np.asarray(score, dtype=np.float64)
    if ya.ndim != 1 or sa.shape != ya.shape:
        raise DataError(
            f"y and score must be 1-d arrays of one length; got shapes {ya.shape} and {sa.shape}."
        )
    if not np.all(np.isin(ya, (0, 1))):
        raise DataError("y must hold 0 (safe) or 1 (unsafe) only.")
    if not np.all(np.isfinite(sa)):
        raise DataError("score must be finite; drop or impute NaN/inf scores first.")
    if sample_weight is None:
        wa = np.ones(sa.shape, dtype=np.float64)
    else:
        wa = np.asarray(sample_weight, dtype=np.float64)
        if wa.shape != sa.shape or np.any(wa < 0) or not np.all(np.isfinite(wa)):
            raise DataError("sample_weight must be finite, non-negative and shaped like score.")
    return ya.astype(np.int8), sa, wa


# --------------------------------------------------------------------------------------------
# the weighted-curve core, shared with the bootstrap (rows = draws, columns = unique scores)


def unique_class_weights(
    y: NDArray[np.int8], score: NDArray[np.float64], w: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.intp]]:
    """Sorted unique scores ``v`` and the safe / unsafe weight at each (``wS``, ``wU``).

    Also returns the column index of every case (``score[i] == v[col[i]]``).
    """
    v, col = np.unique(score, return_inverse=True)
    col = col.reshape(-1)
    ws = wbincount(col, w * (y == 0), v.size)
    wu = wbincount(col, w * (y == 1), v.size)
    return np.asarray(v, dtype=np.float64), ws, wu, np.asarray(col, dtype=np.intp)


def wbincount(idx: NDArray[np.intp], weights: NDArray[Any], minlength: int) -> NDArray[np.float64]:
    """``np.bincount`` with float weights, typed as float64."""
    return np.asarray(np.bincount(idx, weights=weights, minlength=minlength), dtype=np.float64)


def curve_auroc(ws: NDArray[np.float64], wu: NDArray[np.float64]) -> NDArray[np.float64]:
    """AUROC (ties = 1/2) from per-unique-score class weights; works on the last axis."""
    tot_s = ws.sum(axis=-1)
    tot_u = wu.sum(axis=-1)
    below = np.cumsum(ws, axis=-1) - ws
    num = (wu * (below + 0.5 * ws)).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(num / (tot_s * tot_u), dtype=np.float64)


def curve_balanced_accuracy(
    ws: NDArray[np.float64], wu: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Balanced accuracy at every cut index ``k = 0..m`` (last axis has ``m + 1`` entries).

    Cut index ``k`` answers UNSAFE for the unique scores ``v[k:]``: ``k = 0`` flags everything,
    ``k = m`` nothing; the cut value ``t`` has index ``searchsorted(v, t, 'right')``.
    """
    pad = [(0, 0)] * (ws.ndim - 1) + [(1, 0)]
    cs = np.pad(np.cumsum(ws, axis=-1), pad)
    cu = np.pad(np.cumsum(wu, axis=-1), pad)
    tot_s = cs[..., -1:]
    tot_u = cu[..., -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(0.5 * (cs / tot_s + 1.0 - cu / tot_u), dtype=np.float64)


def flag_rates(y: NDArray[np.int8], flag: NDArray[np.bool_]) -> tuple[float, float]:
    """(hit rate, false-alarm rate) of boolean flags, unweighted and unvalidated; NaN for a
    missing class (the caller warns)."""
    nu = int((y == 1).sum())
    ns = int(y.size - nu)
    tpr = float(flag[y == 1].mean()) if nu else NAN
    fpr = float(flag[y == 0].mean()) if ns else NAN
    return tpr, fpr


def auroc_unchecked(y: NDArray[np.int8], score: NDArray[np.float64]) -> float:
    """AUROC (ties 1/2) without validation, for resampling loops; NaN for one class."""
    _, ws, wu, _ = unique_class_weights(y, score, np.ones(score.shape))
    if ws.sum() <= 0 or wu.sum() <= 0:
        return NAN
    return float(curve_auroc(ws, wu))


def best_ba_unchecked(y: NDArray[np.int8], score: NDArray[np.float64]) -> float:
    """``A*`` (best balanced accuracy of ``score > cut`` over all cuts) without validation;
    NaN for one class."""
    _, ws, wu, _ = unique_class_weights(y, score, np.ones(score.shape))
    if ws.sum() <= 0 or wu.sum() <= 0:
        return NAN
    return _first_best(ws, wu)[1]


# --------------------------------------------------------------------------------------------
# case-level metrics


@dataclass(frozen=True)
class BestCut:
    """Best balanced accuracy of any single cut and the cut that reaches it.

    The rule is ``score > cut`` → UNSAFE.  Within the optimal gap between two observed
    scores, the cut is placed at the lower one (the highest score still answered SAFE), the
    most cautious placement; ``-inf`` when flagging everything is best.  Of several equally
    good cuts the lowest is reported; ties are resolved exactly (integer arithmetic for
    integer weights).
    """

    value: float
    cut: float


def auroc(y: ArrayLike, score: ArrayLike, *, sample_weight: ArrayLike | None = None) -> float:
    """Area under the ROC curve of ``score`` for ``y == 1``; ties count one half.

    Equals :func:`sklearn.metrics.roc_auc_score` (also with ``sample_weight``).  One class →
    :class:`UndefinedMetricWarning` and NaN.
    """
    ya, sa, wa = _check_scored(y, score, sample_weight)
    _, ws, wu, _ = unique_class_weights(ya, sa, wa)
    if ws.sum() <= 0 or wu.sum() <= 0:
        return _undefined("AUROC", "only one class is present")
    return float(curve_auroc(ws, wu))


def balanced_accuracy(
    y: ArrayLike, score: ArrayLike, cut: float = 0.0, *, sample_weight: ArrayLike | None = None
) -> float:
    """Balanced accuracy of the rule ``score > cut`` → UNSAFE (mean of TPR and TNR).

    A NaN ``cut`` is a :class:`DataError` (it would answer every case SAFE).
    """
    _check_cut(cut)
    ya, sa, wa = _check_scored(y, score, sample_weight)
    ws, wu = wa * (ya == 0), wa * (ya == 1)
    if ws.sum() <= 0 or wu.sum() <= 0:
        return _undefined("balanced accuracy", "only one class is present")
    flag = direct_answer(sa, cut)
    return float(0.5 * (wu[flag].sum() / wu.sum() + ws[~flag].sum() / ws.sum()))


def best_balanced_accuracy(
    y: ArrayLike, score: ArrayLike, *, sample_weight: ArrayLike | None = None
) -> BestCut:
    """``A*``: the best balanced accuracy over all cuts (labels needed: a diagnostic)."""
    ya, sa, wa = _check_scored(y, score, sample_weight)
    v, ws, wu, _ = unique_class_weights(ya, sa, wa)
    if ws.sum() <= 0 or wu.sum() <= 0:
        return BestCut(_undefined("A*", "only one class is present"), NAN)
    k, value = _first_best(ws, wu)
    return BestCut(value, -math.inf if k == 0 else float(v[k - 1]))


def _first_best(ws: NDArray[np.float64], wu: NDArray[np.float64]) -> tuple[int, float]:
    """First cut index maximising ``D_k = cs_k tu - cu_k ts`` and the balanced accuracy."""
    cs = np.concatenate(([0.0], np.cumsum(ws)))
    cu = np.concatenate(([0.0], np.cumsum(wu)))
    ts, tu = cs[-1], cu[-1]
    d = cs * tu - cu * ts
    k = int(np.argmax(d))
    return k, float(0.5 + d[k] / (2 * ts * tu))


@dataclass(frozen=True)
class SignalDetection:
    """Hit and false-alarm rates of the rule ``score > cut`` and the equal-variance
    sensitivity ``d_prime = z(H) - z(F)`` and criterion ``c = -(z(H) + z(F)) / 2``.

    Rates of exactly 0 or 1 are clipped to ``1/(2n)`` and ``1 - 1/(2n)`` before ``z``
    (Macmillan & Kaplan's 1/(2N) rule), ``n`` the number of cases of that class; the reported
    ``hit_rate``/``false_alarm_rate`` are the unclipped rates.
    """

    hit_rate: float
    false_alarm_rate: float
    d_prime: float
    criterion: float


def signal_detection(
    y: ArrayLike, score: ArrayLike, cut: float = 0.0, *, sample_weight: ArrayLike | None = None
) -> SignalDetection:
    """Signal-detection summary of the direct answer at ``cut`` (Supp. Table S12).

    A NaN ``cut`` is a :class:`DataError` (it would answer every case SAFE).
    """
    _check_cut(cut)
    ya, sa, wa = _check_scored(y, score, sample_weight)
    n_u, n_s = int((ya == 1).sum()), int((ya == 0).sum())
    wu, ws = wa * (ya == 1), wa * (ya == 0)
    if n_u == 0 or n_s == 0 or wu.sum() <= 0 or ws.sum() <= 0:
        nan = _undefined("d' and c", "only one class is present")
        return SignalDetection(nan, nan, nan, nan)
    flag = direct_answer(sa, cut)
    h = float(wu[flag].sum() / wu.sum())
    f = float(ws[flag].sum() / ws.sum())
    hc = min(max(h, 1 / (2 * n_u)), 1 - 1 / (2 * n_u))
    fc = min(max(f, 1 / (2 * n_s)), 1 - 1 / (2 * n_s))
    zh, zf = float(ndtri(hc)), float(ndtri(fc))
    return SignalDetection(h, f, zh - zf, -(zh + zf) / 2)


@dataclass(frozen=True)
class DPrimeOfAuroc:
    """The sensitivity an AUROC implies, ``√2 Φ⁻¹(AUROC)`` (equal-variance binormal).

    ``value``: that number where it is finite. At AUROC 1 (every unsafe case above every
    safe one) it is +∞, which no sample supports as a number: ``value`` is then the d′ of
    the AUROC half a comparison below 1, ``1 - 1/(2 n_unsafe n_safe)`` (the 1/(2N) rule of
    the ``d_prime`` field, per comparison), and ``bound`` is ``"lower"``: the estimate is
    larger than ``value``. At AUROC 0 the mirror image, ``bound="upper"``. NaN stays NaN.
    """

    value: float
    bound: Literal["lower", "upper"] | None


def d_prime_of_auroc(auroc_value: float, n_unsafe: int, n_safe: int) -> DPrimeOfAuroc:
    """``√2 Φ⁻¹(auroc_value)``, or the bound it exceeds at AUROC 0 or 1 from ``n_unsafe`` and
    ``n_safe`` cases (see :class:`DPrimeOfAuroc`).

    >>> d_prime_of_auroc(0.5, 10, 10)
    DPrimeOfAuroc(value=0.0, bound=None)
    >>> d = d_prime_of_auroc(1.0, 10, 10); (round(d.value, 3), d.bound)
    (3.643, 'lower')
    """
    if math.isnan(auroc_value) or 0.0 < auroc_value < 1.0:
        return DPrimeOfAuroc(math.sqrt(2.0) * float(ndtri(auroc_value)), None)
    half = 1.0 / (2.0 * max(n_unsafe, 1) * max(n_safe, 1))
    top = auroc_value >= 1.0
    clipped = 1.0 - half if top else half
    return DPrimeOfAuroc(math.sqrt(2.0) * float(ndtri(clipped)), "lower" if top else "upper")


def g_auroc(auroc_value: float) -> float:
    """Binormal reference of the overlap part: ``g = AUROC - Φ(Φ⁻¹(AUROC)/√2)``.

    For an equal-variance binormal score with sensitivity ``d'``, ``AUROC = Φ(d'/√2)`` and the
    best balanced accuracy is ``Φ(d'/2)``, so ``g = Φ(d'/√2) - Φ(d'/2)``.  NaN stays NaN.
    """
    if math.isnan(auroc_value):
        return NAN
    return float(auroc_value - ndtr(ndtri(auroc_value) / math.sqrt(2.0)))


@dataclass(frozen=True)
class KernelReference:
    """Kernel-smoothed ROC: its AUROC, best balanced accuracy and their difference (the
    overlap part a smooth score of this shape would show), with the two class bandwidths."""

    auroc: float
    best_balanced_accuracy: float
    overlap: float
    bandwidth_safe: float
    bandwidth_unsafe: float


def _weighted_quantile(x: NDArray[np.float64], w: NDArray[np.float64], q: float) -> float:
    """Weighted quantile, linear interpolation of the empirical CDF at mid-points
    (equals ``np.quantile(..., method='linear')`` for unit weights)."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    keep = ws > 0
    xs, ws = xs[keep], ws[keep]
    cw = np.cumsum(ws)
    total = cw[-1]
    # position of the weighted order statistic h = q (N - 1) on the 'expanded' sample
    pos = q * (total - 1.0)
    starts = cw - ws  # expanded index of the first copy of each value
    i = int(np.searchsorted(starts, pos, side="right") - 1)
    i = max(i, 0)
    if pos <= cw[i] - 1 or i + 1 >= xs.size:
        return float(xs[i])
    frac = pos - (cw[i] - 1)
    return float(xs[i] + frac * (xs[i + 1] - xs[i]))


def _bandwidth(x: NDArray[np.float64], w: NDArray[np.float64]) -> float:
    n = float(w.sum())
    mean = float((w * x).sum() / n)
    sd = math.sqrt(float((w * (x - mean) ** 2).sum() / (n - 1))) if n > 1 else 0.0
    iqr = _weighted_quantile(x, w, 0.75) - _weighted_quantile(x, w, 0.25)
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    return 0.9 * spread * n ** (-0.2)


def kernel_reference(
    y: ArrayLike, score: ArrayLike, *, sample_weight: ArrayLike | None = None, n_grid: int = 400
) -> KernelReference:
    """Kernel-smoothed reference for the overlap part (Supp. C.2).

    Each class gets a Gaussian kernel density with bandwidth ``0.9 min(s, IQR/1.34) n^(-1/5)``
    (Silverman's rule; ``s`` the class standard deviation, ``n`` the class size, the weighted
    versions when weights are given; when the IQR is 0 the standard deviation is used).  The
    smoothed ROC is evaluated on ``n_grid`` points from three (larger) bandwidths below the
    lowest score to three above the highest; its AUROC is the trapezoid area (with the corners
    (0,0) and (1,1)) and its best balanced accuracy the maximum over the grid.  A class with a
    zero bandwidth (all scores equal) → :class:`UndefinedMetricWarning` and NaN.
    """
    ya, sa, wa = _check_scored(y, score, sample_weight)
    s_mask, u_mask = (ya == 0) & (wa > 0), (ya == 1) & (wa > 0)
    if s_mask.sum() < 2 or u_mask.sum() < 2:
        nan = _undefined("kernel reference", "a class has fewer than two cases")
        return KernelReference(nan, nan, nan, nan, nan)
    hs = _bandwidth(sa[s_mask], wa[s_mask])
    hu = _bandwidth(sa[u_mask], wa[u_mask])
    if not (hs > 0 and hu > 0):
        nan = _undefined("kernel reference", "a class has zero spread")
        return KernelReference(nan, nan, nan, hs, hu)
    h = max(hs, hu)
    grid = np.linspace(sa.min() - 3 * h, sa.max() + 3 * h, n_grid)
    fs = ndtr((grid[:, None] - sa[None, s_mask]) / hs) @ wa[s_mask] / wa[s_mask].sum()
    fu = ndtr((grid[:, None] - sa[None, u_mask]) / hu) @ wa[u_mask] / wa[u_mask].sum()
    tpr = np.concatenate(([1.0], 1.0 - fu, [0.0]))
    fpr = np.concatenate(([1.0], 1.0 - fs, [0.0]))
    area = float(np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2))
    best = float(np.max(0.5 * (tpr + 1.0 - fpr)))
    return KernelReference(area, best, area - best, hs, hu)


# --------------------------------------------------------------------------------------------
# pair-level metrics


@dataclass(frozen=True)
class PairRates:
    """Pair-level rates at one cut (Supp. C, "Null-corrected gap").

    ``R``: share of pairs whose unsafe case scores higher (ties: not ordered, the paper's
    rate); ``T``: share of pairs whose two scores are equal; ``R_half = R + T/2`` (ties count
    one half, as in AUROC); ``L``: both cases labelled correctly; ``W``: both wrong;
    ``C = L + W``; ``A = 1/2 + L - C/2`` the accuracy of the direct answer on the paired cases;
    ``G = R - L`` the Spot-Stop gap; ``null_gap = E[G0] = (1 - C - T)/2`` its mean under a
    label swap inside each pair (a tied pair is ordered in neither orientation; the paper's
    ``(1 - C)/2`` assumes no ties); hence ``G - null_gap = R_half - A``.  ``R_minus_A`` is the
    paper's ``R - A = R_half_minus_A - T/2``.
    """

    R: float
    L: float
    W: float
    C: float
    A: float
    G: float
    null_gap: float
    R_minus_A: float
    n: int
    T: float = 0.0
    R_half: float = NAN
    R_half_minus_A: float = NAN


def _pair_rates_from_sums(
    ordered: float, lab: float, wrong: float, n: float, tied: float = 0.0
) -> PairRates:
    R, L, W, T = ordered / n, lab / n, wrong / n, tied / n
    C = L + W
    A = 0.5 + L - C / 2
    r_half = R + T / 2
    return PairRates(R, L, W, C, A, R - L, (1 - C - T) / 2, R - A, int(n), T, r_half, r_half - A)


def pair_rates(safe_scores: ArrayLike, unsafe_scores: ArrayLike, cut: float = 0.0) -> PairRates:
    """``R``, ``T``, ``R½``, ``L``, ``W``, ``C``, ``A``, ``G``, ``E[G0]`` from the two scores
    of each pair."""
    ss = np.asarray(safe_scores, dtype=np.float64)
    su = np.asarray(unsafe_scores, dtype=np.float64)
    if ss.ndim != 1 or ss.shape != su.shape:
        raise DataError(
            f"safe_scores and unsafe_scores must be 1-d of one length (one entry per pair); "
            f"got shapes {ss.shape} and {su.shape}."
        )
    if ss.size == 0:
        nan = _undefined("pair rates", "there are no contrasts (safe/unsafe pairs)")
        return PairRates(nan, nan, nan, nan, nan, nan, nan, nan, 0, nan, nan, nan)
    ordered = float(np.sum(su > ss))
    tied = float(np.sum(su == ss))
    au, as_ = direct_answer(su, cut), direct_answer(ss, cut)
    lab = float(np.sum(au & ~as_))
    wrong = float(np.sum(~au & as_))
    return _pair_rates_from_sums(ordered, lab, wrong, float(ss.size), tied)


# --------------------------------------------------------------------------------------------
# the decomposition on a table


@dataclass(frozen=True)
class SpotStop:
    """The Spot-Stop terms of a table at the direct ``cut`` (all rates as fractions).

    ``G - null_gap = R_half - A = threshold_part + overlap_part + within_part`` with
    ``threshold_part = A* - A`` (what one shared cut can still fix: recalibrate),
    ``overlap_part = AUROC - A*`` (safe and unsafe scores overlap: only a better score helps;
    compare with ``g_auroc`` and the kernel reference) and ``within_part = R_half - AUROC``
    (order that holds only inside a contrast: a reference from the same situation can use
    it); ties count one half throughout (``R_half = R + tied_share/2``).  The paper's
    ``R - A = tie_part + threshold_part + overlap_part + within_part`` with
    ``tie_part = R - R_half = -tied_share/2`` (discrete scores: a coarse readout, not a cut
    problem).  ``excess_beyond_g = R_half - A - g_auroc``.  ``auroc``, ``A_star`` and the rates
    of the signal-detection summary are pair-weighted over the paired cases.
    ``d_prime_auroc = √2 Φ⁻¹(auroc)`` (:func:`d_prime_of_auroc`): at AUROC 1 (0) it is
    infinite, given as the finite value it exceeds (falls below) with
    ``d_prime_auroc_bound`` ``"lower"`` (``"upper"``); None otherwise.
    """

    cut: float
    R: float
    L: float
    W: float
    C: float
    A: float
    G: float
    null_gap: float
    R_minus_A: float
    tied_share: float
    R_half: float
    R_half_minus_A: float
    tie_part: float
    auroc: float
    A_star: float
    cut_star: float
    threshold_part: float
    overlap_part: float
    within_part: float
    g_auroc: float
    excess_beyond_g: float
    hit_rate: float
    false_alarm_rate: float
    d_prime: float
    criterion: float
    d_prime_auroc: float
    n_pairs: int
    n_paired_cases: int
    d_prime_auroc_bound: Literal["lower", "upper"] | None = None


def spot_stop(table: CaseTable, cut: float = 0.0) -> SpotStop:
    """Compute the Spot-Stop decomposition of ``table`` with the direct answer ``score > cut``.

    No contrasts → :class:`UndefinedMetricWarning` and NaN in every field.
    """
    _check_cut(cut)
    pairs = table.pairs
    if pairs.n == 0:
        _undefined("the Spot-Stop decomposition", "the table has no contrasts")
        nan = NAN
        return SpotStop(cut, *([nan] * 25), 0, 0)  # type: ignore[arg-type, call-arg]
    s = table.score
    pr = pair_rates(s[pairs.safe], s[pairs.unsafe], cut)
    paired = pairs.weight > 0
    y, sc, w = table.label[paired], s[paired], pairs.weight[paired]
    au = auroc(y, sc, sample_weight=w)
    best = best_balanced_accuracy(y, sc, sample_weight=w)
    sd = signal_detection(y, sc, cut, sample_weight=w)
    dpa = d_prime_of_auroc(au, int((y == 1).sum()), int((y == 0).sum()))
    return SpotStop(
        cut=cut,
        R=pr.R,
        L=pr.L,
        W=pr.W,
        C=pr.C,
        A=pr.A,
        G=pr.G,
        null_gap=pr.null_gap,
        R_minus_A=pr.R_minus_A,
        tied_share=pr.T,
        R_half=pr.R_half,
        R_half_minus_A=pr.R_half_minus_A,
        tie_part=pr.R - pr.R_half,
        auroc=au,
        A_star=best.value,
        cut_star=best.cut,
        threshold_part=best.value - pr.A,
        overlap_part=au - best.value,
        within_part=pr.R_half - au,
        g_auroc=g_auroc(au),
        excess_beyond_g=pr.R_half_minus_A - g_auroc(au),
        hit_rate=sd.hit_rate,
        false_alarm_rate=sd.false_alarm_rate,
        d_prime=sd.d_prime,
        criterion=sd.criterion,
        d_prime_auroc=dpa.value,
        n_pairs=pairs.n,
        n_paired_cases=int(paired.sum()),
        d_prime_auroc_bound=dpa.bound,
    )


def _check_cut(cut: float) -> None:
    if not is_real(cut) or math.isnan(cut):
        raise DataError(f"cut must be a number (the direct cut is 0.0); got {cut!r}.")
