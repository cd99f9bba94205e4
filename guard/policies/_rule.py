"""The decision rule: when a score is UNSAFE. Written once; every room calls it.

A scene is UNSAFE when ``score ≥ threshold`` — a tie is UNSAFE (fail-safe) — and also when
the score or the threshold is not a finite number (NaN never yields SAFE). The guard labels
with it, calibrate fits cuts for it, the diagnostics replay it and the card reports what it
did. The paper's direct-answer statistics (``s > cut`` is the answer UNSAFE) are a different,
named convention of the diagnostics; they differ from this rule only on exact ties.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

__all__ = ["Label", "is_unsafe", "label_of", "n_safe", "unsafe_mask"]

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
