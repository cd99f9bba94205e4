"""``frozen``: a fixed cut ``t0`` on the fused score (seed 000, Supp. Algorithm 1, frozen).

The reference statistics and ``t0`` (the mean fused score of an unlabelled pool: the batch-mean
cut, frozen) are fitted once, so single scenes can be labelled. Caveat: it carries the pool's
scale to new scenes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
)
from spotstop.guard.validate import is_real

__all__ = ["FrozenPolicy"]


@dataclass(frozen=True)
class FrozenPolicy(Policy):
    """A fixed cut ``t0`` on the fused score: UNSAFE when ``S ≥ threshold``."""

    kind: ClassVar[str] = "frozen"
    summary: ClassVar[str] = "fixed cut t0 on S (the mean S of an unlabelled pool)"
    threshold: float

    def __post_init__(self) -> None:
        if not is_real(self.threshold) or not math.isfinite(self.threshold):
            raise PolicyError(
                f"FrozenPolicy.threshold must be a finite number; got {self.threshold!r}."
            )
        object.__setattr__(self, "threshold", float(self.threshold))

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("threshold",), ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> FrozenPolicy:
        return cls(threshold=ctx.number(d, "threshold"))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "threshold": self.threshold}

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: ``S``; threshold: ``t0``."""
        return Thresholds.constant(
            x.fused, self.threshold, "frozen", f"fixed cut {self.threshold:.6g}"
        )

    @classmethod
    def fit(cls, ctx: FitContext) -> FrozenPolicy:
        """``t0`` = the frozen cut of the context (mean fused score of the unlabelled pool)."""
        return cls(threshold=ctx.frozen_t0)
