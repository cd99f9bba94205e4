"""The conformal estimator: ``ConformalCalibrator(alpha, delta).fit(unsafe, situations)``.

The rule itself — the marginal and PAC ranks, the one-case-per-situation reduction and the
guarantees they carry — is written once in :mod:`spotstop.guard.policies._conformal_rule`
(:func:`~spotstop.guard.policies.conformal_cut`); this module adds the scikit-learn style
estimator around it: settings in the constructor, inputs validated apart from the algorithm,
``fit`` learns both guarantees' cuts, learned state ends in ``_``, and a refusal says how many
unsafe situations are still needed.

>>> import numpy as np
>>> cal = ConformalCalibrator(alpha=0.1, delta=0.1).fit(np.arange(30.0))
>>> cal.marginal_.k, cal.pac_.k, cal.threshold_
(3, 1, 0.0)
"""

from __future__ import annotations

from typing import Any, Literal, Self

import numpy as np
from spotstop.guard.policies import (
    ConformalFit,
    ConformalPolicy,
    CutChoice,
    NotFittedError,
    PolicyError,
    binom_cdf,
    conformal_cut,
)
from spotstop.guard.validate import as_1d_float

__all__ = ["ConformalCalibrator", "CutChoice", "binom_cdf"]

Guarantee = Literal["marginal", "pac"]
ClusterRule = Literal["min", "random"]


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
        fit = conformal_cut(
            scores, sids, alpha=alpha, delta=delta, cluster_rule=self.cluster_rule, rng=self.rng
        )
        self._fit = fit
        if refuse and not fit.chosen(self.guarantee).feasible:
            raise PolicyError(fit.refusal(self.guarantee))
        return self

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
    def fit_(self) -> ConformalFit:
        """Both cuts and the one-case-per-situation note, as the rule module returns them."""
        fit: ConformalFit = self._fitted("_fit")
        return fit

    @property
    def marginal_(self) -> CutChoice:
        """The cut with the marginal guarantee, ``k = ⌊α(n+1)⌋``."""
        return self.fit_.marginal

    @property
    def pac_(self) -> CutChoice:
        """The cut with the PAC guarantee, the largest k with ``P(Bin(n, α) ≤ k−1) ≤ δ``."""
        return self.fit_.chosen("pac")

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
        return self.fit_.n_cases

    @property
    def n_situations_(self) -> int:
        """Distinct situations among the unsafe calibration cases."""
        return self.fit_.n_situations

    @property
    def cluster_note_(self) -> str:
        """What the one-per-situation rule did, in words."""
        return self.fit_.note

    def to_policy(self) -> ConformalPolicy:
        """The chosen cut as a :class:`ConformalPolicy` (``delta`` set for PAC)."""
        c = self.chosen_
        if not c.feasible:
            raise PolicyError(self.fit_.refusal(self.guarantee))
        return ConformalPolicy(alpha=c.alpha, n=c.n, k=c.k, threshold=c.threshold, delta=c.delta)

    def __repr__(self) -> str:
        head = (
            f"ConformalCalibrator(alpha={self.alpha!r}, delta={self.delta!r}, "
            f"guarantee={self.guarantee!r}, cluster_rule={self.cluster_rule!r}"
        )
        if not hasattr(self, "_fit"):
            return head + "; not fitted)"
        return (
            f"{head}; n_={self.n_}, k_={self.k_}, threshold_={self.threshold_:.6g}, "
            f"marginal k={self.marginal_.k}, pac k={self.pac_.k})"
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
    scores = as_1d_float(unsafe_scores, what="unsafe_scores", error=PolicyError)
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
