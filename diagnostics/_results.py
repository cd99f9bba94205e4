"""Result objects shared by the metrics, the bootstrap and the checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ConfidenceInterval", "Estimate", "bound_mark", "fmt_estimate"]


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4g}"


@dataclass(frozen=True)
class ConfidenceInterval:
    """A two-sided interval ``[low, high]`` (95 % percentile interval unless stated)."""

    low: float
    high: float

    def __repr__(self) -> str:
        return f"ConfidenceInterval(low={_fmt(self.low)}, high={_fmt(self.high)})"

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the closed interval (False when either end is NaN)."""
        return bool(self.low <= x <= self.high)

    def excludes(self, x: float) -> bool:
        """Whether both ends are finite and ``x`` lies outside the closed interval (False
        for an interval with a NaN or infinite end: it says nothing either way)."""
        finite = math.isfinite(self.low) and math.isfinite(self.high)
        return bool(finite and (self.low > x or self.high < x))


@dataclass(frozen=True)
class Estimate:
    """A point value with its interval and the number of units it was computed on.

    ``n`` counts the units of the statistic: contrasts (pairs) for ``R``, ``L``, ``A`` and
    the parts; cases for AUROC and balanced accuracy; resamples or splits for the checks
    (each check's docstring says which).  A NaN value means "undefined on this data",
    never "zero".  ``bound``: ``"lower"`` when the estimate is larger than ``value`` (an
    estimate that is infinite on this data, such as d′ at AUROC 1, given by the finite value
    it exceeds; its statistic's explanation says which), ``"upper"`` when smaller, None when
    ``value`` is the estimate.
    """

    value: float
    ci: ConfidenceInterval
    n: int
    bound: Literal["lower", "upper"] | None = None

    def __repr__(self) -> str:
        bound = "" if self.bound is None else f", bound={self.bound!r}"
        return (
            f"Estimate(value={_fmt(self.value)}, "
            f"ci=[{_fmt(self.ci.low)}, {_fmt(self.ci.high)}], n={self.n}{bound})"
        )

    def to_dict(self) -> dict[str, object]:
        """``{"value", "ci": [low, high], "n"}`` with NaN (and ±inf) as ``None`` (valid JSON),
        and ``"bound"`` when ``value`` is a bound."""

        def f(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        out: dict[str, object] = {
            "value": f(self.value),
            "ci": [f(self.ci.low), f(self.ci.high)],
            "n": int(self.n),
        }
        if self.bound is not None:
            out["bound"] = self.bound
        return out

    @classmethod
    def point(
        cls, value: float, n: int, bound: Literal["lower", "upper"] | None = None
    ) -> Estimate:
        """A value without an interval (e.g. a p value or a statistic of the full data)."""
        return cls(float(value), NAN_CI, int(n), bound)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Estimate:
        """The inverse of :meth:`to_dict` (``None`` as NaN; ``n`` 0 when absent)."""

        def f(x: Any) -> float:
            return math.nan if x is None else float(x)

        ci = d.get("ci") or [None, None]
        bound = d.get("bound")
        return cls(
            f(d.get("value")),
            ConfidenceInterval(f(ci[0]), f(ci[1])),
            int(d.get("n") or 0),
            bound if bound in ("lower", "upper") else None,
        )


NAN_CI = ConfidenceInterval(math.nan, math.nan)


def fmt_estimate(e: Estimate, signed: bool = False) -> str:
    """An estimate as ``value [low, high]`` with three decimals, for tables and reports;
    ``signed``: always a sign (for differences). ``nan`` where undefined.

    >>> fmt_estimate(Estimate(0.1234, ConfidenceInterval(0.05, 0.2), 40), signed=True)
    '+0.123 [+0.050, +0.200]'
    >>> fmt_estimate(Estimate.point(0.5, 10))
    '0.500 [nan, nan]'
    """

    def f(x: float) -> str:
        return "nan" if math.isnan(x) else (f"{x:+.3f}" if signed else f"{x:.3f}")

    return f"{bound_mark(e)}{f(e.value)} [{f(e.ci.low)}, {f(e.ci.high)}]"


def bound_mark(e: Estimate) -> str:
    """``"> "`` before a lower bound, ``"< "`` before an upper one, else ``""``."""
    return {"lower": "> ", "upper": "< "}.get(e.bound or "", "")
