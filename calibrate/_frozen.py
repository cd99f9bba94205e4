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
from spotstop.guard import Avg2Fusion
from spotstop.guard.policies import MIN_FROZEN_POOL, FitContext, FrozenPolicy, Policy

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

    def context(
        self,
        member_scores: Mapping[str, Any],
        *,
        label: Any = None,
        situation_id: Any = None,
        member_text: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        current: Policy | None = None,
        rng: np.random.Generator | None = None,
        guard_situation_id: Any = None,
    ) -> FitContext:
        """The :class:`~spotstop.guard.policies.FitContext` a policy kind fits from.

        member_scores: usable decisions' raw scores per member, in log order (fused here
        with this fit's fusion). label: 1/0/-1 per decision (None: all unlabelled).
        situation_id: per decision, "" or None for none. guard_situation_id: the same for the
        ids the guard was given, where a labels file regrouped them (None: ``situation_id``).
        """
        arrays = {m: np.asarray(member_scores[m], dtype=np.float64) for m in self.fusion.members}
        n = next(iter(arrays.values())).shape[0]

        def ids(given: Any) -> np.ndarray:
            return np.array(
                ["" if s is None else str(s) for s in (given if given is not None else [""] * n)],
                dtype=object,
            )

        sids = ids(situation_id)
        return FitContext(
            fusion=self.fusion,
            frozen_t0=self.policy.threshold,
            fused=self.fusion.fuse_many(arrays),
            label=np.full(n, -1, np.int8) if label is None else np.asarray(label, np.int8),
            situation_id=sids,
            member_scores=arrays,
            member_text=None
            if member_text is None
            else {m: np.asarray(v, dtype=np.float64) for m, v in member_text.items()},
            settings=dict(settings or {}),
            current=current,
            rng=rng if rng is not None else np.random.default_rng(0),
            guard_situation_id=None if guard_situation_id is None else ids(guard_situation_id),
        )


def fit_frozen(
    pool_scores: Mapping[str, Any],
    *,
    weights: Mapping[str, float] | None = None,
    min_n: int = MIN_FROZEN_POOL,
) -> FrozenFit:
    """Fit per-member median/IQR and the cut t₀ = mean fused score on an unlabelled pool.

    The rule is the guard's :meth:`~spotstop.guard.policies.FrozenPolicy.fit_pool` (its
    errors: ``ConfigError`` for an empty, ragged, too small or non-finite pool,
    ``FusionError`` for a flat member).
    """
    fusion, policy = FrozenPolicy.fit_pool(pool_scores, weights=weights, min_n=min_n)
    n = int(np.asarray(next(iter(pool_scores.values()))).shape[0])
    return FrozenFit(fusion=fusion, policy=policy, n=n)
