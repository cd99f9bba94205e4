"""``frozen``: a fixed cut ``t0`` on the fused score (seed 000, Supp. Algorithm 1, frozen).

The reference statistics and ``t0`` (the mean fused score of an unlabelled pool: the batch-mean
cut, frozen) are fitted once, so single scenes can be labelled. Caveat: it carries the pool's
scale to new scenes.

:meth:`FrozenPolicy.fit_pool` is that fit, written once: ``calibrate.fit_frozen`` and the cue
diagnostics' operating points both call it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
)
from spotstop.guard.policies._rule import mean_cut
from spotstop.guard.validate import is_real

__all__ = ["MIN_FROZEN_POOL", "FrozenPolicy"]

MIN_FROZEN_POOL = 8
"""The fewest unlabelled pool scenes :meth:`FrozenPolicy.fit_pool` fits medians, IQRs and t0 on."""


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
    def fit_pool(
        cls,
        pool_scores: Mapping[str, Any],
        *,
        weights: Mapping[str, float] | None = None,
        min_n: int = MIN_FROZEN_POOL,
        fusion: Avg2Fusion | None = None,
    ) -> tuple[Avg2Fusion, FrozenPolicy]:
        """The frozen rule on an unlabelled pool: Avg-2 reference statistics and ``t0``.

        pool_scores: member name -> 1-D raw scores, one per pool scene (same length, all
        finite). weights: optional Avg-2 weight per member (None: equal). min_n: the fewest
        pool scenes accepted. fusion: keep these reference statistics instead of fitting
        them (``t0`` alone is fitted; ``weights`` must then be None).

        Returns ``(fusion, policy)``: ``fusion = Avg2Fusion.fit(pool)`` (per-member median and
        IQR) and ``policy.threshold = t0``, the mean fused score of the pool (the batch-mean
        cut, frozen: :func:`~spotstop.guard.policies.mean_cut`, so a scene at the pool's exact
        mean is a tie, UNSAFE, as in the batch rule). No labels are used. Raises :class:`PolicyError` (a ``ConfigError``)
        when the pool is empty, ragged, smaller than ``min_n`` or not finite, and
        :class:`~spotstop.guard._fusion.FusionError` naming the member when a member is flat
        on the pool.
        """
        arrays = {m: np.asarray(v, dtype=np.float64) for m, v in pool_scores.items()}
        if not arrays:
            raise PolicyError(
                "the frozen fit needs the scores of at least one member; pass member name -> "
                "pool scores."
            )
        sizes = {m: a.shape for m, a in arrays.items()}
        if len(set(sizes.values())) != 1 or len(next(iter(sizes.values()))) != 1:
            raise PolicyError(
                f"pool scores must be 1-D arrays of one length per member; got {sizes}."
            )
        n = next(iter(arrays.values())).shape[0]
        if n < min_n:
            raise PolicyError(
                f"the unlabelled pool has {n} scenes; at least {min_n} are needed. Score more "
                "unlabelled scenes for the pool."
            )
        for m, a in arrays.items():
            if not np.all(np.isfinite(a)):
                raise PolicyError(
                    f"pool scores of member {m!r} hold non-finite values; drop those scenes."
                )
        if fusion is None:
            fusion = Avg2Fusion.fit(arrays, weights=weights)
        elif weights is not None:
            raise PolicyError("weights are a fit's; a given fusion keeps its own.")
        return fusion, cls(threshold=mean_cut(fusion.fuse_many(arrays)))

    @classmethod
    def fit(cls, ctx: FitContext) -> FrozenPolicy:
        """``t0`` = the frozen cut of the context (mean fused score of the unlabelled pool)."""
        return cls(threshold=ctx.frozen_t0)
