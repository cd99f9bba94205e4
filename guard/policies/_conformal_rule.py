"""The conformal cut, written once: its rank (marginal and PAC) and the one-case-per-situation rule.

Class-conditional split conformal (DESIGN.md, "Threshold policies"): with n unsafe
calibration scores sorted ascending ``u(1) ≤ … ≤ u(n)``, flag UNSAFE when ``S ≥ u(k)``.

marginal
    ``k = ⌊α (n + 1)⌋``. For a new unsafe scene exchangeable with the calibration cases,
    ``P(miss) = k / (n + 1) ≤ α``, over calibration set *and* scene: on average over
    calibrations; a given calibration set may well miss more than α.
training-conditional (PAC)
    the largest ``k`` with ``P(Binomial(n, α) ≤ k − 1) ≤ δ``. Given the calibration set the
    miss rate is ``F(u(k)) ~ Beta(k, n − k + 1)`` for continuous scores, and
    ``P(Beta(k, n−k+1) > α) = P(Binomial(n, α) ≤ k − 1)``; so the miss rate exceeds α for at
    most a share δ of calibration sets (Vovk 2012; Angelopoulos & Bates, "A Gentle
    Introduction to Conformal Prediction"). Ties in the scores only lower the miss rate.

Situations
    Cases of one situation share an offset and are not exchangeable; ONE unsafe case per
    situation is kept and n counts situations. ``"min"`` (default) keeps each situation's
    lowest unsafe score — deterministic and conservative (the cut is at most what one random
    case per situation would give); ``"random"`` keeps one drawn with ``rng`` (exact). A case
    without a situation id is its own situation. The guarantee is for scenes of *new*
    situations drawn like the calibration ones.

:func:`conformal_cut` fits both guarantees on unsafe scores; the guard's ``conformal``
policy, ``calibrate``'s :class:`~spotstop.calibrate.ConformalCalibrator` and the card's
conformal audit all call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np

__all__ = [
    "ClusterRule",
    "ConformalFit",
    "CutChoice",
    "Guarantee",
    "binom_cdf",
    "conformal_cut",
    "conformal_min_n",
    "conformal_pac_min_n",
    "conformal_pac_rank",
    "conformal_rank",
    "one_per_situation",
]

Guarantee = Literal["marginal", "pac"]
ClusterRule = Literal["min", "random"]


def conformal_rank(alpha: float, n: int) -> int:
    """``k = ⌊α (n + 1)⌋``, the rank of the conformal cut among n sorted unsafe scores.

    α is read as the decimal it prints as (``Fraction(repr(alpha))``), so that e.g.
    ``α = 0.29, n = 99`` gives k = 29, not 28 from ``0.29 * 100 = 28.999…``. Then
    ``P(miss) = k / (n + 1) ≤ α`` holds exactly for that decimal α.
    """
    return math.floor(Fraction(repr(float(alpha))) * (n + 1))


def conformal_min_n(alpha: float) -> int:
    """The fewest unsafe calibration scores for which ``k ≥ 1``: ``⌈1/α⌉ − 1``."""
    return math.ceil(1 / Fraction(repr(float(alpha)))) - 1


_PAC_EXACT_MAX_N = 20_000  # above this, the binomial tail is summed in floating point


def conformal_pac_rank(alpha: float, delta: float, n: int) -> int:
    """The training-conditional (PAC) rank: the largest k with ``P(Binomial(n, α) ≤ k−1) ≤ δ``.

    With continuous scores the miss rate of the cut ``u(k)`` given the calibration set is
    ``F(u(k)) ~ Beta(k, n−k+1)``, and ``P(Beta(k, n−k+1) > α) = P(Binomial(n, α) ≤ k−1)``
    (at most k−1 of n uniforms fall below α). So this k gives ``P(miss > α) ≤ δ`` over
    calibration sets (Vovk 2012, "training-conditional" validity). Returns 0 when even
    k = 1 fails, i.e. ``(1−α)^n > δ``. α and δ are read as the decimals they print as;
    up to n = 20,000 the tail is summed exactly in integers, above it in floating point.
    """
    a_frac, d_frac = Fraction(repr(float(alpha))), Fraction(repr(float(delta)))
    if n > _PAC_EXACT_MAX_N:
        la, lb = math.log(float(a_frac)), math.log1p(-float(a_frac))
        ld = math.log(float(d_frac))
        acc = -math.inf
        for i in range(n + 1):
            lt = (
                math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * la + (n - i) * lb
            )  # fmt: skip
            acc = max(acc, lt) + math.log1p(math.exp(-abs(acc - lt)))
            if acc > ld:
                return i
        return n
    a, b = a_frac.numerator, a_frac.denominator  # α = a/b
    c, d = d_frac.numerator, d_frac.denominator  # δ = c/d
    bound = c * b**n  # compare d·Σ C(n,i) a^i (b−a)^(n−i) with c·b^n: all integers
    term = (b - a) ** n  # C(n,0) a^0 (b−a)^n
    acc = 0
    for i in range(n + 1):
        acc += term
        if acc * d > bound:
            return i  # CDF(i) > δ, so k − 1 = i − 1 is the last that holds
        term = term * (n - i) * a // ((i + 1) * (b - a))
    return n


def conformal_pac_min_n(alpha: float, delta: float) -> int:
    """The fewest unsafe calibration scores for which the PAC rank is ≥ 1: ``(1−α)^n ≤ δ``,
    decided as :func:`conformal_pac_rank` decides it: exactly up to n = 20,000, in floating
    point above (the exact power of a small α's decimal runs to millions of digits)."""
    a = Fraction(repr(float(alpha)))
    d = Fraction(repr(float(delta)))
    la, ld = math.log1p(-float(a)), math.log(float(d))
    n = max(1, math.floor(ld / la) - 1)
    if n > _PAC_EXACT_MAX_N:  # k ≥ 1 there when log P(Bin(n, α) ≤ 0) = n·log(1−α) ≤ log δ
        while n * la > ld:
            n += 1
        return n
    while (1 - a) ** n > d:
        n += 1
    return n


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) ≤ k)`` in floating point (log-space sum); 0 for k < 0, 1 for k ≥ n."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    logs = [
        base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k + 1)
    ]
    m = max(logs)
    return min(1.0, math.exp(m) * math.fsum(math.exp(v - m) for v in logs))


@dataclass(frozen=True)
class CutChoice:
    """One guarantee's cut on the calibration set.

    guarantee: ``"marginal"`` or ``"pac"``. alpha, delta: the targets (delta ``None`` for
    marginal). n: calibration cases used (one per situation). k: the rank (0 when the set
    is too small: then ``threshold`` is NaN and ``feasible`` is False). n_needed: the fewest
    calibration situations for which ``k ≥ 1``.
    expected_miss: ``k/(n+1)``, the miss rate averaged over calibrations (continuous scores).
    p_miss_above_alpha: ``P(Binomial(n, α) ≤ k−1)``, the share of calibration sets whose
    miss rate exceeds α.
    """

    guarantee: Guarantee
    alpha: float
    delta: float | None
    n: int
    k: int
    threshold: float
    feasible: bool
    n_needed: int
    expected_miss: float
    p_miss_above_alpha: float

    @property
    def statement(self) -> str:
        """The guarantee in words."""
        if not self.feasible:
            return (
                f"{self.guarantee}: not available, {self.n} calibration situation(s) < "
                f"{self.n_needed} needed"
            )
        if self.guarantee == "marginal":
            return (
                f"marginal: P(miss) = k/(n+1) = {self.k}/{self.n + 1} = "
                f"{self.expected_miss:.4f} ≤ alpha = {self.alpha:g} on average over "
                f"calibrations; P(miss rate > alpha) = {self.p_miss_above_alpha:.3f}"
            )
        return (
            f"PAC: P(miss rate > alpha = {self.alpha:g}) = {self.p_miss_above_alpha:.4f} ≤ "
            f"delta = {self.delta:g} over calibrations; expected miss "
            f"{self.expected_miss:.4f}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for ``policy.yaml`` provenance and JSON output (NaN as None)."""
        return {
            "guarantee": self.guarantee,
            "alpha": self.alpha,
            "delta": self.delta,
            "n": self.n,
            "k": self.k,
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "feasible": self.feasible,
            "n_needed": self.n_needed,
            "expected_miss": self.expected_miss,
            "p_miss_above_alpha": self.p_miss_above_alpha,
        }


def _choice(guarantee: Guarantee, alpha: float, delta: float | None, u: np.ndarray) -> CutChoice:
    n = int(u.size)
    if guarantee == "marginal":
        k = conformal_rank(alpha, n) if n else 0
        need = conformal_min_n(alpha)
    else:
        assert delta is not None  # checked by the caller
        k = conformal_pac_rank(alpha, delta, n) if n else 0
        need = conformal_pac_min_n(alpha, delta)
    return CutChoice(
        guarantee=guarantee,
        alpha=alpha,
        delta=delta if guarantee == "pac" else None,
        n=n,
        k=k,
        threshold=float(u[k - 1]) if k >= 1 else math.nan,
        feasible=k >= 1,
        n_needed=need,
        expected_miss=k / (n + 1) if n else math.nan,
        p_miss_above_alpha=binom_cdf(k - 1, n, alpha) if n else math.nan,
    )


@dataclass(frozen=True)
class ConformalFit:
    """Both guarantees' cuts on one calibration set (see :func:`conformal_cut`).

    marginal, pac: the :class:`CutChoice` of each (pac is None without delta).
    n_cases: unsafe cases given; n_situations: distinct situations (= n of the cuts);
    note: what the one-case-per-situation rule did, in words.
    """

    marginal: CutChoice
    pac: CutChoice | None
    n_cases: int
    n_situations: int
    note: str

    def chosen(self, guarantee: Guarantee) -> CutChoice:
        """The cut of one guarantee (``"pac"`` needs delta)."""
        if guarantee == "pac":
            if self.pac is None:
                raise ValueError("this fit has no PAC cut: it was fitted without delta")
            return self.pac
        return self.marginal

    def refusal(self, guarantee: Guarantee) -> str:
        """Why the cut of ``guarantee`` is not available, and how many situations it needs."""
        c = self.chosen(guarantee)
        other = self.pac if guarantee == "marginal" else self.marginal
        alt = (
            f" The {other.guarantee} guarantee would be available (needs {other.n_needed})."
            if other is not None and other.feasible
            else ""
        )
        which = (
            f"the PAC guarantee (alpha={c.alpha:g}, delta={c.delta:g}; (1−alpha)^n ≤ delta)"
            if c.guarantee == "pac"
            else f"the marginal guarantee (alpha={c.alpha:g}; n ≥ ceil(1/alpha) − 1)"
        )
        return (
            f"too few unsafe calibration cases for {which}: {self.n_cases} labelled unsafe "
            f"case(s) from {c.n} situation(s) (one case per situation is used); at least "
            f"{c.n_needed} unsafe situations are needed, so {c.n_needed - c.n} more. Label "
            "more unsafe decisions (from new situations), raise alpha or delta, or choose "
            f"another guarantee or policy.{alt}"
        )


def conformal_cut(
    unsafe_scores: Any,
    situation_ids: Any = None,
    *,
    alpha: float,
    delta: float | None = None,
    cluster_rule: ClusterRule = "min",
    rng: np.random.Generator | int | None = 0,
) -> ConformalFit:
    """Fit the conformal cut on unsafe calibration scores, one case per situation.

    Scores must be finite: a NaN would count in n and, under the ``"min"`` rule, wipe out
    its situation's other cases, so non-finite scores raise :class:`ValueError` (callers
    drop fail-closed cases first). The other inputs are trusted to be checked by the caller
    (1-D scores, one id or None per score, α and δ in (0, 1)): see
    ``calibrate.ConformalCalibrator`` for the validating estimator. Infeasible cuts (too few
    situations) come back with ``feasible=False``.
    """
    scores = np.asarray(unsafe_scores, dtype=float)
    bad = ~np.isfinite(scores)
    if bad.any():
        idx = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(
            f"conformal_cut: {int(bad.sum())} of {scores.size} unsafe calibration scores are "
            f"not finite (positions {idx}{' …' if bad.sum() > 5 else ''}). Drop the cases "
            "that failed closed (no finite fused score) before fitting the cut."
        )
    if situation_ids is None:
        sids = [""] * scores.size
    else:
        sids = ["" if s is None else str(s) for s in list(situation_ids)]
    u, n_sit, note = one_per_situation(scores, sids, cluster_rule, rng)
    u = np.sort(u)
    return ConformalFit(
        marginal=_choice("marginal", alpha, None, u),
        pac=None if delta is None else _choice("pac", alpha, delta, u),
        n_cases=int(scores.size),
        n_situations=n_sit,
        note=note,
    )


def one_per_situation(
    scores: np.ndarray, sids: list[str], rule: ClusterRule, rng: Any
) -> tuple[np.ndarray, int, str]:
    """One score per situation (``""`` = no situation: its own); returns (scores, n, note)."""
    ids = np.asarray(sids, dtype=object)
    has = ids != ""
    singles = scores[~has]
    keys, inverse, counts = np.unique(ids[has].astype(str), return_inverse=True, return_counts=True)
    grouped = scores[has]
    if rule == "min":
        per_sit = np.full(keys.size, np.inf)
        np.minimum.at(per_sit, inverse, grouped)
    else:  # one case per situation at random; keys sorted, so log order does not matter
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        order = np.lexsort((gen.random(grouped.size), inverse))
        first = np.r_[0, np.cumsum(counts)[:-1]]
        per_sit = grouped[order][first] if keys.size else np.zeros(0)
    kept = np.concatenate([singles, per_sit])
    n_sit = int(kept.size)
    shared = int((counts > 1).sum())
    if shared:
        how = "its lowest score" if rule == "min" else "one drawn at random"
        note = (
            f"{scores.size} unsafe cases come from {n_sit} situations ({shared} situation(s) "
            f"hold several); cases of one situation are not exchangeable, so one case per "
            f"situation was used ({how}), n = {n_sit}."
        )
    else:
        note = f"{scores.size} unsafe cases, each from its own situation; n = {n_sit}."
    return kept.astype(float), n_sit, note
