"""``batch_frozen_iqr``: the batch-mean cut on ``S`` scaled by the pool's frozen statistics.

The threshold of every scene is the mean of the batch's finite fused scores ``S`` — ``S``
computed with the policy file's FROZEN medians and IQRs (fitted on an unlabelled pool), so
only the centre is refitted on the batch, not the scale (compare ``batch``, the paper's rule,
which refits both). With Avg-2 the frozen medians cancel in ``S − mean(S)``. Scenes with a
non-finite ``S`` are UNSAFE and left out of the mean; batches with fewer than ``min_batch``
finite scores use the ``fallback``. Caveat: labels about half of any batch UNSAFE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
    check_fallback,
)
from spotstop.guard.policies._frozen import FrozenPolicy
from spotstop.guard.policies._rule import mean_cut
from spotstop.guard.validate import is_int

__all__ = ["BatchFrozenIqrPolicy"]


@dataclass(frozen=True)
class BatchFrozenIqrPolicy(Policy):
    """Cut at the batch mean of ``S`` under the frozen fusion (see the module docstring)."""

    kind: ClassVar[str] = "batch_frozen_iqr"
    summary: ClassVar[str] = (
        "batch mean of S with the pool's frozen IQRs (centre refitted, not scale)"
    )
    single_scene: ClassVar[bool] = False
    fallback: Policy
    min_batch: int = 2

    def __post_init__(self) -> None:
        check_fallback(self.fallback, "BatchFrozenIqrPolicy")
        if not is_int(self.min_batch) or self.min_batch < 2:
            raise PolicyError(
                f"BatchFrozenIqrPolicy.min_batch must be an integer ≥ 2; got {self.min_batch!r} "
                "(a batch of one is its own mean and carries no label)."
            )

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("fallback",), ("min_batch",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> BatchFrozenIqrPolicy:
        return cls(
            fallback=ctx.parse_fallback(d["fallback"], ctx.key("fallback")),
            min_batch=ctx.integer(d, "min_batch", low=2, default=2),
        )

    def inner(self) -> tuple[Policy, ...]:
        return (self.fallback,)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "min_batch": self.min_batch, "fallback": self.fallback.to_dict()}

    def members_needed(self) -> tuple[str, ...]:
        return self.fallback.members_needed()

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: ``S``; threshold: the batch mean of the finite ``S`` (or the fallback's)."""
        finite = np.isfinite(x.fused)
        n_ok = int(finite.sum())
        if n_ok < self.min_batch:
            return self.fallback.thresholds(x, None).prefixed(
                "batch_frozen_iqr",
                f"batch has {n_ok} finite score(s) < min_batch {self.min_batch}; "
                f"fallback {self.fallback.kind}",
            )
        mean = mean_cut(x.fused[finite])
        return Thresholds.constant(
            x.fused, mean, "batch_frozen_iqr", f"mean of {n_ok} finite scores in the batch"
        )

    @classmethod
    def fit(cls, ctx: FitContext) -> BatchFrozenIqrPolicy:
        """Frozen fallback t0; setting ``min_batch`` (2)."""
        return cls(
            fallback=FrozenPolicy(threshold=ctx.frozen_t0),
            min_batch=int(ctx.setting("min_batch", 2)),
        )
