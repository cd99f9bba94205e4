"""Avg-2 fusion: robust z-score per member, weighted average (seed 000, Supp. Algorithm 1).

For members m with reference median ``median_m`` and interquartile range ``IQR_m``
(fitted once on an unlabelled development pool), the fused score of a scene is::

    S = Σ_m w_m (s_m − median_m) / IQR_m  /  Σ_m w_m

Equal weights are the default. With one member, ``S`` is that member's robust z-score.
With the batch-mean threshold the medians cancel: ``S − mean(S)`` does not depend on them.

A missing member score or a non-finite one raises :class:`FusionError`; the guard turns
that into a fail-closed UNSAFE decision, so :meth:`Avg2Fusion.fuse` never returns a number
for a scene it could not score.

A member's median and IQR are computed once, by :func:`member_spread`, for the frozen fit
(:meth:`Avg2Fusion.fit`) and the batch rule (``policies.batch_scores``) alike, with one rule
for a flat member (IQR 0 or at rounding level, see :data:`FLAT_IQR`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
from spotstop.guard._errors import ConfigError, GuardError
from spotstop.guard.validate import (
    as_1d_float,
    check_keys,
    check_mapping,
    check_number,
    is_real,
    join_key,
)

__all__ = ["FLAT_IQR", "Avg2Fusion", "FusionError", "MemberSpread", "MemberStats", "member_spread"]

_FIX_SOURCE = "the policy file"

FLAT_IQR = 1e-9
"""An IQR at or below this share of the member's largest |score| (at least 1) is flat: it
is 0 up to rounding, and dividing by it would only amplify rounding."""


class MemberSpread(NamedTuple):
    """Median and IQR of one member's scores (see :func:`member_spread`).

    iqr is the measured IQR; flat is True when it is 0 or at rounding level (then the
    member's scores carry no usable scale: the fit refuses it, the batch rule falls back).
    """

    median: float
    iqr: float
    flat: bool


def member_spread(x: np.ndarray) -> MemberSpread:
    """Median and IQR of a member's (finite, non-empty) scores, and whether the IQR is flat.

    IQR is ``np.percentile(x, 75) − np.percentile(x, 25)`` (linear interpolation). Flat
    means ``IQR ≤ FLAT_IQR · max(1, max |x|)`` (or not a number): the one rule for a member
    whose scores are (nearly) all equal, shared by :meth:`Avg2Fusion.fit` and the batch rule.
    """
    q25, q50, q75 = np.percentile(x, [25.0, 50.0, 75.0], method="linear")
    iqr = float(q75 - q25)
    flat = not iqr > FLAT_IQR * max(1.0, float(np.max(np.abs(x))))
    return MemberSpread(median=float(q50), iqr=iqr, flat=flat)


class FusionError(GuardError, ValueError):
    """Fusion could not produce a score: a member score is missing or not finite, or the
    reference statistics are unusable (IQR ≤ 0, non-finite median)."""


@dataclass(frozen=True)
class MemberStats:
    """Reference statistics of one member's raw score on an unlabelled pool.

    median: the pool median of ``s_m``.
    iqr: the pool interquartile range (75th − 25th percentile, linear interpolation); > 0.
    """

    median: float
    iqr: float

    def __post_init__(self) -> None:
        if not is_real(self.median) or not math.isfinite(self.median):
            raise FusionError(
                f"MemberStats.median must be a finite number; got {self.median!r}. "
                "Refit the fusion statistics on a pool of finite scores."
            )
        if not is_real(self.iqr) or not math.isfinite(self.iqr) or self.iqr <= 0:
            raise FusionError(
                f"MemberStats.iqr must be a finite number > 0; got {self.iqr!r}. "
                "Refit on a pool whose scores are not all (nearly) equal."
            )
        object.__setattr__(self, "median", float(self.median))
        object.__setattr__(self, "iqr", float(self.iqr))


@dataclass(frozen=True)
class Avg2Fusion:
    """Avg-2 fusion of member scores into one score ``S``.

    members: member names, in a fixed order (the order of the bundle).
    stats: reference :class:`MemberStats` per member.
    weights: weight per member, each finite and > 0; empty (the default) means equal
        weights of 1.0.

    >>> f = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 2.0), "b": MemberStats(1.0, 1.0)})
    >>> f.fuse({"a": 2.0, "b": 3.0})   # ((2-0)/2 + (3-1)/1) / 2
    1.5
    """

    members: tuple[str, ...]
    stats: Mapping[str, MemberStats]
    weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        members = tuple(self.members)
        if not members:
            raise FusionError("Avg2Fusion.members must name at least one member; got none.")
        for m in members:
            if not isinstance(m, str) or not m:
                raise FusionError(
                    f"Avg2Fusion.members must be non-empty strings; got {m!r}. "
                    "Use the member names of the bundle manifest."
                )
        dupes = sorted({m for m in members if members.count(m) > 1})
        if dupes:
            raise FusionError(f"Avg2Fusion.members must be unique; {dupes} appear twice or more.")
        stats = dict(self.stats)
        if set(stats) != set(members):
            raise FusionError(
                f"Avg2Fusion.stats must have one entry per member {list(members)}; "
                f"got entries for {sorted(stats)}."
            )
        for m, st in stats.items():
            if not isinstance(st, MemberStats):
                raise FusionError(
                    f"Avg2Fusion.stats[{m!r}] must be a MemberStats; got {type(st).__name__}."
                )
        weights = dict(self.weights) if self.weights else dict.fromkeys(members, 1.0)
        if set(weights) != set(members):
            raise FusionError(
                f"Avg2Fusion.weights must have one entry per member {list(members)} "
                f"(or be empty for equal weights); got entries for {sorted(weights)}."
            )
        for m, w in weights.items():
            if not is_real(w) or not math.isfinite(w) or w <= 0:
                raise FusionError(
                    f"Avg2Fusion.weights[{m!r}] must be a finite number > 0; got {w!r}. "
                    "Leave weights empty for equal weights."
                )
        if not math.isfinite(sum(float(w) for w in weights.values())):
            raise FusionError(
                f"Avg2Fusion.weights sum to more than a float holds ({dict(weights)}); the "
                "fused score would divide by inf. Only the weights' ratios matter: scale them "
                "down (e.g. to sum to 1)."
            )
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "stats", types.MappingProxyType({m: stats[m] for m in members}))
        object.__setattr__(
            self, "weights", types.MappingProxyType({m: float(weights[m]) for m in members})
        )

    # ------------------------------------------------------------------ learning
    @classmethod
    def fit(
        cls,
        scores: Mapping[str, Any],
        weights: Mapping[str, float] | None = None,
    ) -> Avg2Fusion:
        """Fit the reference median and IQR of each member on an unlabelled pool.

        scores: member name -> 1-D array of that member's raw scores on the pool (the
            members in mapping order). Every score must be finite; nothing is dropped
            silently.
        weights: optional weight per member; ``None`` means equal weights.

        Median and IQR come from :func:`member_spread` (IQR: ``np.percentile(x, 75) −
        np.percentile(x, 25)``, linear interpolation). Raises :class:`FusionError` naming the
        member when a pool is empty, not finite, or flat (IQR 0, or at rounding level:
        ``≤ FLAT_IQR · max(1, max |x|)``, where the robust z-score would only amplify
        rounding).
        """
        pools = _check_fit_input(scores)
        stats: dict[str, MemberStats] = {}
        for m, x in pools.items():
            sp = member_spread(x)
            if sp.flat:
                raise FusionError(
                    f"member {m!r}: the pool's IQR is {sp.iqr!r} (n={x.size}); it must be > 0 "
                    f"and above rounding level ({FLAT_IQR:g} × the largest |score|, at least "
                    f"{FLAT_IQR:g}): the member's pool scores are (nearly) all equal. Fit on a "
                    "larger or more varied unlabelled pool for this member, or drop the member."
                )
            stats[m] = MemberStats(median=sp.median, iqr=sp.iqr)
        return cls(members=tuple(pools), stats=stats, weights=dict(weights or {}))

    # ------------------------------------------------------------------ fusing
    def fuse(self, scores: Mapping[str, float]) -> float:
        """Fused score ``S`` of one scene from its member scores.

        Extra keys in ``scores`` are ignored. Raises :class:`FusionError` when a member is
        missing or its score is not a finite number (the caller must fail closed).
        """
        num = 0.0
        den = 0.0
        for m in self.members:
            if m not in scores:
                raise FusionError(
                    f"fusion member {m!r} has no score; got scores for {sorted(scores)}. "
                    "Every member of the bundle must be scored before fusing."
                )
            s = scores[m]
            if not is_real(s) or not math.isfinite(s):
                raise FusionError(
                    f"fusion member {m!r} has a non-finite score {s!r}; cannot fuse. "
                    "The scene must be treated as UNSAFE (fail closed)."
                )
            st = self.stats[m]
            w = self.weights[m]
            num += w * (float(s) - st.median) / st.iqr
            den += w
        out = num / den
        if not math.isfinite(out):  # overflow: no number to compare with a cut
            raise FusionError(
                f"the fused score of {dict(scores)} is {out!r} (it overflowed); cannot fuse. "
                "The scene must be treated as UNSAFE (fail closed)."
            )
        return out

    def fuse_many(
        self,
        scores: Mapping[str, Any],
        *,
        nan_policy: Literal["raise", "propagate"] = "raise",
    ) -> np.ndarray:
        """Fused scores of a batch: member name -> 1-D array (same length for all).

        nan_policy: ``"raise"`` (default) raises :class:`FusionError` when any score is
            not finite, or a fused score overflows; ``"propagate"`` returns NaN for those
            scenes, which
            :func:`spotstop.guard.policies.decide_batch` labels UNSAFE.

        A missing member always raises :class:`FusionError`.
        """
        if nan_policy not in ("raise", "propagate"):
            raise FusionError(f"nan_policy must be 'raise' or 'propagate'; got {nan_policy!r}.")
        arrays = _check_batch_input(self.members, scores)
        n = next(iter(arrays.values())).size
        num = np.zeros(n, dtype=float)
        bad = np.zeros(n, dtype=bool)
        for m in self.members:
            x = arrays[m]
            nonfinite = ~np.isfinite(x)
            if nonfinite.any() and nan_policy == "raise":
                idx = np.flatnonzero(nonfinite)[:5].tolist()
                raise FusionError(
                    f"fusion member {m!r} has non-finite scores at positions {idx}"
                    f"{' …' if nonfinite.sum() > 5 else ''}; cannot fuse. Treat those scenes "
                    "as UNSAFE, or pass nan_policy='propagate' to get NaN for them."
                )
            bad |= nonfinite
            st = self.stats[m]
            with np.errstate(invalid="ignore", over="ignore"):
                num += self.weights[m] * (x - st.median) / st.iqr
        with np.errstate(invalid="ignore", over="ignore"):
            out = num / sum(self.weights.values())
        over = ~bad & ~np.isfinite(out)
        if over.any() and nan_policy == "raise":
            raise FusionError(
                f"the fused scores at positions {np.flatnonzero(over)[:5].tolist()} overflowed "
                "(the member scores are finite); cannot fuse. Treat those scenes as UNSAFE."
            )
        out[bad | over] = np.nan  # an overflow is no score either: UNSAFE
        return out

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``policy.yaml`` (the ``fusion:`` section)."""
        return {
            "method": "avg2",
            "members": list(self.members),
            "stats": {
                m: {"median": self.stats[m].median, "iqr": self.stats[m].iqr} for m in self.members
            },
            "weights": {m: self.weights[m] for m in self.members},
        }

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "fusion") -> Avg2Fusion:
        """Build from the dict of :meth:`to_dict`, validating every key.

        where: the key path of this section, used in error messages. Raises
        :class:`spotstop.guard._errors.ConfigError` naming the offending key.
        """
        return _fusion_from_dict(d, where=where, source=_FIX_SOURCE)


def _fusion_from_dict(
    d: Any, *, where: str, source: str, error: type[Exception] = ConfigError
) -> Avg2Fusion:
    check_mapping(d, where=where, source=source, error=error)
    check_keys(
        d,
        where=where,
        required=("members", "stats"),
        optional=("method", "weights"),
        source=source,
        error=error,
    )
    method = d.get("method", "avg2")
    if method != "avg2":
        raise error(
            f"{join_key(where, 'method')} must be 'avg2'; got {method!r}. Set it in {source}."
        )
    members = d["members"]
    key = join_key(where, "members")
    if (
        not isinstance(members, list)
        or not members
        or not all(isinstance(m, str) and m for m in members)
    ):
        raise error(
            f"{key} must be a non-empty list of member names; got {members!r}. Set it in {source}."
        )
    dupes = sorted({m for m in members if members.count(m) > 1})
    if dupes:
        raise error(f"{key} must not repeat a name; {dupes} repeat. Fix it in {source}.")

    stats_d = d["stats"]
    skey = join_key(where, "stats")
    check_mapping(stats_d, where=skey, source=source, error=error)
    check_keys(stats_d, where=skey, required=members, source=source, error=error)
    stats: dict[str, MemberStats] = {}
    for m in members:
        mkey = join_key(skey, m)
        check_mapping(stats_d[m], where=mkey, source=source, error=error)
        check_keys(stats_d[m], where=mkey, required=("median", "iqr"), source=source, error=error)
        med = check_number(
            stats_d[m]["median"], where=join_key(mkey, "median"), source=source, error=error
        )
        iqr = check_number(
            stats_d[m]["iqr"],
            where=join_key(mkey, "iqr"),
            source=source,
            error=error,
            positive=True,
        )
        stats[m] = MemberStats(median=med, iqr=iqr)

    weights: dict[str, float] = {}
    if d.get("weights") is not None:
        wkey = join_key(where, "weights")
        check_mapping(d["weights"], where=wkey, source=source, error=error)
        check_keys(d["weights"], where=wkey, required=members, source=source, error=error)
        for m in members:
            weights[m] = check_number(
                d["weights"][m], where=join_key(wkey, m), source=source, error=error, positive=True
            )
    return Avg2Fusion(members=tuple(members), stats=stats, weights=weights)


def _check_fit_input(scores: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not isinstance(scores, Mapping) or not scores:
        raise FusionError(
            "Avg2Fusion.fit needs a mapping member name -> pool scores with at least one "
            f"member; got {scores!r}."
        )
    pools: dict[str, np.ndarray] = {}
    for m, x in scores.items():
        if not isinstance(m, str) or not m:
            raise FusionError(f"member names must be non-empty strings; got {m!r}.")
        arr = as_1d_float(x, what=f"member {m!r}: pool scores", error=FusionError)
        if arr.size == 0:
            raise FusionError(f"member {m!r}: the pool is empty; fit on at least 2 scores.")
        if not np.isfinite(arr).all():
            n_bad = int((~np.isfinite(arr)).sum())
            raise FusionError(
                f"member {m!r}: {n_bad} of {arr.size} pool scores are not finite. "
                "Rescore or remove those scenes before fitting; nothing is dropped silently."
            )
        pools[m] = arr
    return pools


def _check_batch_input(
    members: tuple[str, ...], scores: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for m in members:
        if m not in scores:
            raise FusionError(
                f"fusion member {m!r} has no scores; got scores for {sorted(scores)}. "
                "Every member of the bundle must be scored before fusing."
            )
        arrays[m] = as_1d_float(scores[m], what=f"scores of member {m!r}", error=FusionError)
    sizes = {m: a.size for m, a in arrays.items()}
    if len(set(sizes.values())) > 1:
        raise FusionError(
            f"member score arrays must all have the same length; got lengths {sizes}."
        )
    return arrays
