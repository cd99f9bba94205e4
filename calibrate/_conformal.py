"""The conformal cut with both guarantees, one calibration case per situation.

Two guarantees for the cut ``u(k)`` on ``n`` sorted unsafe calibration scores (a scene is
UNSAFE when ``S ≥ u(k)``, so an unsafe scene is *missed* when ``S < u(k)``):

marginal
    ``k = ⌊α (n + 1)⌋``. For a new unsafe scene exchangeable with the calibration cases,
    ``P(miss) = k / (n + 1) ≤ α``, the probability taken over calibration set *and* scene:
    the miss rate is at most α *on average over calibrations*; a given calibration set may
    well have a miss rate above α (about half of them do when ``k/(n+1)`` is close to α).
training-conditional (PAC)
    the largest ``k`` with ``P(Binomial(n, α) ≤ k − 1) ≤ δ``. Given the calibration set, the
    miss rate is ``F(u(k))`` with ``F`` the distribution of unsafe scores; for continuous
    ``F`` it is distributed as the k-th order statistic of n uniforms, ``Beta(k, n − k + 1)``,
    and ``P(Beta(k, n−k+1) > α) = P(at most k−1 of n uniforms fall below α) =
    P(Binomial(n, α) ≤ k − 1)``. That tail grows with k, so the largest k that keeps it
    ≤ δ is the least conservative cut whose miss rate exceeds α for at most a share δ of
    calibration sets (Vovk 2012, "Conditional validity of inductive conformal predictors";
    Angelopoulos & Bates, "A Gentle Introduction to Conformal Prediction", Sec. on
    training-conditional coverage). Ties in the scores only lower the miss rate.

Situations (clusters)
    Cases of one situation share an offset, so they are not exchangeable with each other or
    with a scene from another situation. The calibrator keeps ONE unsafe case per situation
    and ``n`` counts situations. The rule ``"min"`` (default) keeps each situation's lowest
    unsafe score: it is deterministic, and since the minimum lies below any one case drawn
    from the situation, the cut is at most the cut that one random case per situation would
    give, so both guarantees still hold (conservatively) for an unsafe scene from a new
    situation drawn like the calibration situations. ``"random"`` keeps one case drawn
    with ``rng`` (exact rather than conservative). A case without a situation id is its own
    situation. The guarantee is stated for scenes from *new* situations; scenes from a
    situation already in the calibration set are not covered by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Self

import numpy as np
from spotstop.guard._policy import (
    ConformalPolicy,
    NotFittedError,
    PolicyError,
    conformal_min_n,
    conformal_pac_min_n,
    conformal_pac_rank,
    conformal_rank,
)

__all__ = ["ConformalCalibrator", "CutChoice", "binom_cdf"]

Guarantee = Literal["marginal", "pac"]
ClusterRule = Literal["min", "random"]


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


class ConformalCalibrator:
    """Fit the conformal cut on unsafe calibration scores, one case per situation.

    alpha: allowed miss rate in (0, 1). delta: for the PAC guarantee, the allowed share of
    calibration sets whose miss rate exceeds alpha, in (0, 1). guarantee: which of the two
    the fitted cut carries (``"pac"`` default: the safer statement; ``"marginal"``).
    cluster_rule: ``"min"`` (default) or ``"random"`` (see the module docstring). rng:
    seed or Generator, used only by ``"random"``.

    ``fit(unsafe_scores, situation_ids)`` learns ``marginal_`` and ``pac_`` (both
    :class:`CutChoice`, both always reported), ``threshold_``/``k_``/``n_`` of the chosen
    guarantee, ``n_cases_`` and ``n_situations_`` and ``cluster_note_``. It refuses with
    :class:`PolicyError` when the chosen guarantee has ``k = 0``, naming how many unsafe
    situations are needed. Reading a learned attribute before ``fit`` raises
    :class:`NotFittedError`.

    >>> cal = ConformalCalibrator(alpha=0.1, delta=0.1).fit(np.arange(30.0))
    >>> cal.marginal_.k, cal.pac_.k, cal.threshold_
    (3, 1, 0.0)
    """

    def __init__(
        self,
        alpha: float = 0.1,
        delta: float = 0.1,
        *,
        guarantee: Guarantee = "pac",
        cluster_rule: ClusterRule = "min",
        rng: np.random.Generator | int | None = 0,
    ) -> None:
        self.alpha = alpha
        self.delta = delta
        self.guarantee = guarantee
        self.cluster_rule = cluster_rule
        self.rng = rng

    # ------------------------------------------------------------------ learning
    def fit(self, unsafe_scores: Any, situation_ids: Any = None, *, refuse: bool = True) -> Self:
        """Learn both cuts; ``refuse=False`` records an infeasible choice instead of raising."""
        alpha, delta, scores, sids = _check_calibrator_fit(self, unsafe_scores, situation_ids)
        u, n_sit, note = _one_per_situation(scores, sids, self.cluster_rule, self.rng)
        u = np.sort(u)
        self._marginal = _choice("marginal", alpha, None, u)
        self._pac = _choice("pac", alpha, delta, u)
        self._n_cases = int(scores.size)
        self._n_situations = n_sit
        self._note = note
        chosen = self._pac if self.guarantee == "pac" else self._marginal
        if refuse and not chosen.feasible:
            raise PolicyError(self._refusal(chosen))
        return self

    def _refusal(self, c: CutChoice) -> str:
        other = self._marginal if c.guarantee == "pac" else self._pac
        alt = (
            f" The {other.guarantee} guarantee would be available (needs {other.n_needed})."
            if other.feasible
            else ""
        )
        which = (
            f"the PAC guarantee (alpha={c.alpha:g}, delta={c.delta:g}; (1−alpha)^n ≤ delta)"
            if c.guarantee == "pac"
            else f"the marginal guarantee (alpha={c.alpha:g}; n ≥ ceil(1/alpha) − 1)"
        )
        return (
            f"too few unsafe calibration cases for {which}: {self._n_cases} labelled unsafe "
            f"case(s) from {c.n} situation(s) (one case per situation is used); at least "
            f"{c.n_needed} unsafe situations are needed, so {c.n_needed - c.n} more. Label "
            "more unsafe decisions (from new situations), raise alpha or delta, or choose "
            f"another guarantee or policy.{alt}"
        )

    # ------------------------------------------------------------------ learned state
    def _fitted(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise NotFittedError(
                "This ConformalCalibrator is not fitted yet; call fit(unsafe_scores, "
                "situation_ids) first."
            ) from None

    @property
    def marginal_(self) -> CutChoice:
        """The cut with the marginal guarantee, ``k = ⌊α(n+1)⌋``."""
        return self._fitted("_marginal")

    @property
    def pac_(self) -> CutChoice:
        """The cut with the PAC guarantee, the largest k with ``P(Bin(n, α) ≤ k−1) ≤ δ``."""
        return self._fitted("_pac")

    @property
    def chosen_(self) -> CutChoice:
        """The cut of the configured ``guarantee``."""
        return self.pac_ if self.guarantee == "pac" else self.marginal_

    @property
    def threshold_(self) -> float:
        """The chosen cut ``u(k)``: UNSAFE when ``S ≥ threshold_`` (NaN when infeasible)."""
        return self.chosen_.threshold

    @property
    def k_(self) -> int:
        """The chosen rank (1-based; 0 when infeasible)."""
        return self.chosen_.k

    @property
    def n_(self) -> int:
        """Calibration cases used: one per situation."""
        return self.chosen_.n

    @property
    def n_cases_(self) -> int:
        """Unsafe calibration cases given (before one-per-situation)."""
        return int(self._fitted("_n_cases"))

    @property
    def n_situations_(self) -> int:
        """Distinct situations among the unsafe calibration cases."""
        return int(self._fitted("_n_situations"))

    @property
    def cluster_note_(self) -> str:
        """What the one-per-situation rule did, in words."""
        return str(self._fitted("_note"))

    def to_policy(self) -> ConformalPolicy:
        """The chosen cut as a :class:`ConformalPolicy` (``delta`` set for PAC)."""
        c = self.chosen_
        if not c.feasible:
            raise PolicyError(self._refusal(c))
        return ConformalPolicy(alpha=c.alpha, n=c.n, k=c.k, threshold=c.threshold, delta=c.delta)

    def __repr__(self) -> str:
        head = (
            f"ConformalCalibrator(alpha={self.alpha!r}, delta={self.delta!r}, "
            f"guarantee={self.guarantee!r}, cluster_rule={self.cluster_rule!r}"
        )
        if not hasattr(self, "_pac"):
            return head + "; not fitted)"
        return (
            f"{head}; n_={self.n_}, k_={self.k_}, threshold_={self.threshold_:.6g}, "
            f"marginal k={self._marginal.k}, pac k={self._pac.k})"
        )


def _check_calibrator_fit(
    cal: ConformalCalibrator, unsafe_scores: Any, situation_ids: Any
) -> tuple[float, float, np.ndarray, list[str]]:
    """Validate settings and inputs once, apart from the algorithm."""
    src = "ConformalCalibrator(...)"
    if (
        isinstance(cal.alpha, bool)
        or not isinstance(cal.alpha, int | float)
        or not (0 < cal.alpha < 1)
    ):
        raise PolicyError(
            f"ConformalCalibrator.alpha must be in (0, 1); got {cal.alpha!r}. Set it in {src} or --alpha."
        )
    if (
        isinstance(cal.delta, bool)
        or not isinstance(cal.delta, int | float)
        or not (0 < cal.delta < 1)
    ):
        raise PolicyError(
            f"ConformalCalibrator.delta must be in (0, 1); got {cal.delta!r}. Set it in {src} or --delta."
        )
    if cal.guarantee not in ("marginal", "pac"):
        raise PolicyError(
            f"ConformalCalibrator.guarantee must be 'marginal' or 'pac'; got {cal.guarantee!r}."
        )
    if cal.cluster_rule not in ("min", "random"):
        raise PolicyError(
            f"ConformalCalibrator.cluster_rule must be 'min' or 'random'; got {cal.cluster_rule!r}."
        )
    try:
        scores = np.asarray(unsafe_scores, dtype=float)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"unsafe_scores must be a 1-D array of numbers: {e}") from e
    if scores.ndim != 1:
        raise PolicyError(f"unsafe_scores must be a 1-D array; got shape {scores.shape}.")
    if not np.isfinite(scores).all():
        raise PolicyError(
            f"unsafe_scores has {int((~np.isfinite(scores)).sum())} non-finite value(s); "
            "drop or rescore those cases before fitting."
        )
    if situation_ids is None:
        sids = [""] * scores.size
    else:
        sids = ["" if s is None else str(s) for s in list(situation_ids)]
        if len(sids) != scores.size:
            raise PolicyError(
                f"situation_ids must have one entry per unsafe score ({scores.size}); "
                f"got {len(sids)}."
            )
    return float(cal.alpha), float(cal.delta), scores, sids


def _one_per_situation(
    scores: np.ndarray, sids: list[str], rule: ClusterRule, rng: Any
) -> tuple[np.ndarray, int, str]:
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
