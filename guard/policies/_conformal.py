"""``conformal``: the class-conditional split-conformal cut on unsafe calibration scores.

UNSAFE when ``S ≥ u(k)``; the rank ``k`` comes from :mod:`._conformal_rule` (marginal
``⌊α(n+1)⌋`` or the PAC rank for δ), so a file whose ``k`` disagrees with its ``alpha``, ``n``
and ``delta`` is refused. Needs labelled unsafe cases; how many safe scenes it allows depends
on how well the score ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
)
from spotstop.guard.policies._conformal_rule import (
    conformal_cut,
    conformal_min_n,
    conformal_pac_min_n,
    conformal_pac_rank,
    conformal_rank,
)
from spotstop.guard.validate import is_int, is_real

__all__ = ["ConformalPolicy", "check_alpha", "check_delta"]


def check_alpha(alpha: Any, *, where: str, source: str) -> float:
    """α in (0, 1), or a :class:`PolicyError` naming ``where``."""
    if not is_real(alpha) or not (0 < alpha < 1):
        raise PolicyError(f"{where} must be in (0, 1); got {alpha!r}. Set it in {source}.")
    return float(alpha)


def check_delta(delta: Any, *, where: str, source: str) -> float:
    """δ in (0, 1), or a :class:`PolicyError` naming ``where``."""
    if not is_real(delta) or not (0 < delta < 1):
        raise PolicyError(
            f"{where} must be in (0, 1) (or absent for the marginal guarantee); got {delta!r}. "
            f"Set it in {source}."
        )
    return float(delta)


def _rank(alpha: float, delta: float | None, n: int, where: str) -> tuple[int, str]:
    """The rank the file must hold, and the rule's name; refuses k = 0."""
    if delta is None:
        k = conformal_rank(alpha, n)
        if k == 0:
            need = conformal_min_n(alpha)
            raise PolicyError(
                f"{where}: {n} unsafe calibration case(s) are too few for alpha={alpha!r}: "
                f"k = floor(alpha*(n+1)) = 0 would flag everything. At least {need} unsafe "
                f"calibration cases are needed (n ≥ ceil(1/alpha) − 1 = {need}); collect more "
                "unsafe cases or raise alpha."
            )
        return k, "floor(alpha*(n+1))"
    k = conformal_pac_rank(alpha, delta, n)
    if k == 0:
        need = conformal_pac_min_n(alpha, delta)
        raise PolicyError(
            f"{where}: {n} unsafe calibration case(s) are too few for the training-conditional "
            f"guarantee with alpha={alpha!r}, delta={delta!r}: no rank k ≥ 1 has "
            f"P(Binomial(n, alpha) ≤ k−1) ≤ delta, so the cut would flag everything. At least "
            f"{need} unsafe calibration cases are needed ((1−alpha)^n ≤ delta); collect more "
            "unsafe cases, raise alpha or delta, or use the marginal guarantee."
        )
    return k, f"the PAC rank for delta={delta!r}"


@dataclass(frozen=True)
class ConformalPolicy(Policy):
    """Class-conditional split-conformal cut: UNSAFE when ``S ≥ u(k)``.

    alpha: the allowed miss rate. n: unsafe calibration situations (one case each). k: the
    rank of the cut. threshold: ``u(k)``. delta: None for the marginal guarantee
    (``P(miss) ≤ α`` on average over calibrations); a number for the PAC guarantee (the miss
    rate exceeds α for at most a share δ of calibration sets). Build it with
    ``calibrate.ConformalCalibrator(...).fit(...).to_policy()`` or ``ConformalPolicy.fit``.
    """

    kind: ClassVar[str] = "conformal"
    summary: ClassVar[str] = "conformal cut on labelled unsafe cases: miss rate ≤ alpha"
    label_free: ClassVar[bool] = False
    alpha: float
    n: int
    k: int
    threshold: float
    delta: float | None = None

    def __post_init__(self) -> None:
        alpha = check_alpha(self.alpha, where="ConformalPolicy.alpha", source="the caller")
        if not is_int(self.n) or self.n < 1:
            raise PolicyError(f"ConformalPolicy.n must be an integer ≥ 1; got {self.n!r}.")
        delta = (
            None
            if self.delta is None
            else check_delta(self.delta, where="ConformalPolicy.delta", source="the caller")
        )
        k, rule = _rank(alpha, delta, int(self.n), "ConformalPolicy")
        if not is_int(self.k) or self.k != k:
            raise PolicyError(
                f"ConformalPolicy.k must be {rule} = {k} for alpha={alpha!r}, n={self.n}; got "
                f"{self.k!r}. The value was edited by hand or is corrupt; refit with "
                "`spotstop recalibrate --policy conformal`."
            )
        if not is_real(self.threshold) or not math.isfinite(self.threshold):
            raise PolicyError(
                f"ConformalPolicy.threshold must be a finite number; got {self.threshold!r}."
            )
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "threshold", float(self.threshold))

    @property
    def guarantee(self) -> Literal["marginal", "pac"]:
        """``"pac"`` when ``delta`` is set, else ``"marginal"``."""
        return "marginal" if self.delta is None else "pac"

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("alpha", "n", "k", "threshold"), ("delta",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> ConformalPolicy:
        alpha = check_alpha(d["alpha"], where=ctx.key("alpha"), source=ctx.source)
        n = ctx.integer(d, "n", low=1)
        delta = (
            None
            if d.get("delta") is None
            else check_delta(d["delta"], where=ctx.key("delta"), source=ctx.source)
        )
        try:
            k, rule = _rank(alpha, delta, n, ctx.key("n"))
        except PolicyError as e:
            raise PolicyError(f"{e} Refit for {ctx.source}.") from None
        if not is_int(d["k"]) or d["k"] != k:
            raise PolicyError(
                f"{ctx.key('k')} must be {rule} = {k} for alpha={alpha!r}, n={n}; got "
                f"{d['k']!r}. The file was edited by hand or is corrupt; refit {ctx.source}."
            )
        return cls(alpha=alpha, n=n, k=k, threshold=ctx.number(d, "threshold"), delta=delta)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "alpha": self.alpha,
            "n": self.n,
            "k": self.k,
            "threshold": self.threshold,
        }
        if self.delta is not None:
            d["delta"] = self.delta
        return d

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: ``S``; threshold: ``u(k)``."""
        pac = "" if self.delta is None else f", delta={self.delta:g} (PAC)"
        return Thresholds.constant(
            x.fused,
            self.threshold,
            "conformal",
            f"u({self.k}) of {self.n} unsafe calibration situations, alpha={self.alpha:g}{pac}",
        )

    @classmethod
    def fit(cls, ctx: FitContext) -> ConformalPolicy:
        """The cut on the context's labelled unsafe fused scores, one case per situation.

        Settings: ``alpha`` (0.1), ``delta`` (0.1), ``guarantee`` (``"pac"``), ``cluster_rule``
        (``"min"``). Refuses, naming how many unsafe situations are needed, when too few.
        """
        alpha = float(ctx.setting("alpha", 0.1))
        delta = float(ctx.settings.get("delta") or 0.1)
        guarantee: Literal["marginal", "pac"] = (
            "marginal" if ctx.settings.get("guarantee") == "marginal" else "pac"
        )
        unsafe = (ctx.label == 1) & np.isfinite(ctx.fused)
        fit = conformal_cut(
            ctx.fused[unsafe],
            ctx.situation_id[unsafe],
            alpha=alpha,
            delta=delta,
            cluster_rule=ctx.settings.get("cluster_rule") or "min",
            rng=ctx.rng,
        )
        c = fit.chosen(guarantee)
        if not c.feasible:
            raise PolicyError(fit.refusal(guarantee))
        return cls(alpha=c.alpha, n=c.n, k=c.k, threshold=c.threshold, delta=c.delta)
