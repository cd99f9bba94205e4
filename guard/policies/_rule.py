"""The decision rule: when a score is UNSAFE. Written once; every room calls it.

A scene is UNSAFE when ``score ≥ threshold`` — a tie is UNSAFE (fail-safe) — and also when
the score or the threshold is not a finite number (NaN never yields SAFE). The guard labels
with it, calibrate fits cuts for it, the diagnostics replay it and the card reports what it
did. The paper's direct-answer statistics (``s > cut`` is the answer UNSAFE) are a different,
named convention of the diagnostics; they differ from this rule only on exact ties.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, Literal

import numpy as np

__all__ = [
    "Label",
    "exact_sum",
    "float_at_or_above",
    "is_unsafe",
    "label_of",
    "mean_cut",
    "n_safe",
    "unsafe_mask",
]

Label = Literal["SAFE", "UNSAFE"]


def is_unsafe(score: float, threshold: float) -> bool:
    """True when ``score ≥ threshold`` or either is not finite (ties and NaN are UNSAFE)."""
    s, t = float(score), float(threshold)
    return not (math.isfinite(s) and math.isfinite(t)) or s >= t


def label_of(score: float, threshold: float) -> Label:
    """``"UNSAFE"`` when :func:`is_unsafe`, else ``"SAFE"``."""
    return "UNSAFE" if is_unsafe(score, threshold) else "SAFE"


def unsafe_mask(score: Any, threshold: Any) -> np.ndarray:
    """:func:`is_unsafe` elementwise (numpy broadcasting); a bool array."""
    s = np.asarray(score, dtype=float)
    t = np.asarray(threshold, dtype=float)
    with np.errstate(invalid="ignore"):
        return ~(np.isfinite(s) & np.isfinite(t)) | (s >= t)


def n_safe(sorted_scores: Any, threshold: Any) -> np.ndarray:
    """How many of ``sorted_scores`` (ascending, finite) the rule labels SAFE, per threshold:
    ``(~unsafe_mask(sorted_scores, t)).sum()`` by binary search (the flagged ones are a
    suffix). A threshold that is not finite flags every score (0 SAFE)."""
    v = np.asarray(sorted_scores, dtype=float)
    t = np.asarray(threshold, dtype=float)
    with np.errstate(invalid="ignore"):
        k = np.searchsorted(v, np.where(np.isfinite(t), t, -np.inf), side="left")
    return np.asarray(np.where(np.isfinite(t), k, 0), dtype=np.intp)


def mean_cut(values: Any, *, prior_weight: float = 0.0, prior_threshold: float = 0.0) -> float:
    """The mean of ``values`` as a threshold of the rule: the smallest float at or above
    their EXACT mean (with a prior, of ``(Σ values + prior_weight·prior_threshold) /
    (n + prior_weight)``), so that ``score ≥ mean_cut(...)`` holds exactly when the score is
    at or above the mean. A score equal to the mean is a tie, UNSAFE, whatever the float
    rounding of the sum would give: ``np.mean([0.1] * 3)`` is ``0.10000000000000002``, which
    would answer three equal scores SAFE. The batch and situation cuts (guard and
    diagnostics) all take their mean here. NaN (every score UNSAFE) when there is no value
    or one is not finite.
    """
    v = np.asarray(values, dtype=float).ravel()
    if not np.isfinite(v).all() or not (math.isfinite(prior_weight) and prior_weight >= 0):
        return math.nan
    if prior_weight > 0 and not math.isfinite(prior_threshold):
        return math.nan
    n = Fraction(int(v.size)) + Fraction(prior_weight)
    if n == 0:
        return math.nan
    total = exact_sum(v.tolist())
    if prior_weight > 0:
        total += Fraction(prior_weight) * Fraction(prior_threshold)
    return float_at_or_above(total / n)


def exact_sum(values: Iterable[float]) -> Fraction:
    """The exact sum of finite floats, as a :class:`~fractions.Fraction` (binary fractions:
    one common power-of-two denominator)."""
    ratios = [float(v).as_integer_ratio() for v in values]
    d = max((q for _, q in ratios), default=1)
    return Fraction(sum(p * (d // q) for p, q in ratios), d)


def float_at_or_above(x: Fraction) -> float:
    """The smallest float ``t ≥ x``: for a float score ``s``, ``s ≥ t`` exactly when ``s ≥ x``."""
    t = float(x)  # correctly rounded; one step up when it rounded below x
    return math.nextafter(t, math.inf) if Fraction(t) < x else t
