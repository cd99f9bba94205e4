"""Frozen reference statistics from an unlabelled pool (seed 000, Supp. Algorithm 1).

Medians and IQRs per member are fixed once on an unlabelled development pool, so single
scenes can be labelled later; the frozen cut t₀ is the mean fused score of that pool (the
batch-mean cut, frozen). No labels are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from spotstop.guard._errors import ConfigError
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard._policy import FrozenPolicy

__all__ = ["FrozenFit", "fit_frozen"]


@dataclass(frozen=True)
class FrozenFit:
    """The fitted fusion and frozen cut, with the pool size they came from."""

    fusion: Avg2Fusion
    policy: FrozenPolicy
    n: int

    def __repr__(self) -> str:
        stats = ", ".join(
            f"{m}: median {self.fusion.stats[m].median:+.4f}, IQR {self.fusion.stats[m].iqr:.4f}"
            for m in self.fusion.members
        )
        return f"FrozenFit(n={self.n}, t0={self.policy.threshold:+.4f}; {stats})"


def fit_frozen(
    pool_scores: Mapping[str, Any], *, weights: Mapping[str, float] | None = None, min_n: int = 8
) -> FrozenFit:
    """Fit per-member median/IQR and the cut t₀ = mean fused score on an unlabelled pool."""
    arrays = {m: np.asarray(v, dtype=np.float64) for m, v in pool_scores.items()}
    if not arrays:
        raise ConfigError("fit_frozen needs the scores of at least one member.")
    sizes = {m: a.shape for m, a in arrays.items()}
    if len({s for s in sizes.values()}) != 1 or len(next(iter(sizes.values()))) != 1:
        raise ConfigError(f"pool scores must be 1-D arrays of one length per member; got {sizes}.")
    n = next(iter(arrays.values())).shape[0]
    if n < min_n:
        raise ConfigError(f"the unlabelled pool has {n} scenes; at least {min_n} are needed.")
    for m, a in arrays.items():
        if not np.all(np.isfinite(a)):
            raise ConfigError(
                f"pool scores of member {m!r} hold non-finite values; drop those scenes."
            )
    fusion = Avg2Fusion.fit(arrays, weights=weights)
    fused = fusion.fuse_many(arrays)
    return FrozenFit(fusion=fusion, policy=FrozenPolicy(threshold=float(np.mean(fused))), n=n)
