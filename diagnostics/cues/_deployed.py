"""The guard's decisions on probe scenes: the ONE place this package calls the policy module.

Everything that labels scenes the way a guard does (a bundle's guard as deployed, an Avg-2
pair with frozen reference statistics) goes through :func:`label_as_deployed`, so when the
guard's policy module moves only this file follows it.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DeployedLabels",
    "fitted_cut_policy",
    "frozen_pair_policy",
    "label_as_deployed",
    "source_pool",
    "stated_cut_policy",
]


@dataclass(frozen=True)
class DeployedLabels:
    """The guard's answer per scene: ``unsafe[i]`` True for UNSAFE; ``rules`` counts the
    policy rules that set the thresholds (e.g. ``{"situation->frozen": 84}``); ``margin[i]``
    the compared score minus the threshold applied to it (NaN where either is not finite:
    the scene failed closed), the distance from the cut that a confidence-based selector
    reads."""

    unsafe: NDArray[np.bool_]
    rules: Mapping[str, int]
    margin: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))


def label_as_deployed(
    policy: str | os.PathLike[str] | Mapping[str, Any],
    member_scores: Mapping[str, NDArray[np.float64]],
) -> DeployedLabels:
    """Label each scene as the guard labels one ``check`` of it: the policy file's Avg-2
    fusion, then its policy and the guard's one decision rule (UNSAFE when ``S ≥ threshold``,
    and whenever a score or the threshold is not finite).

    policy: a ``policy.yaml`` path or its parsed dict.
    member_scores: member name -> raw scores, one per scene (NaN: that member failed, so the
        scene fails closed, as on the robot).

    Probe scenes come one at a time, without a situation id, each from the policy file's
    fitted starting state: a ``batch`` policy labels them with its fallback (a batch of
    one), a ``situation`` policy with its fallback (no situation), exactly as the guard does
    for such a scene; no probe becomes a reference for another.
    """
    from spotstop.guard.policies import load_policy

    cfg = load_policy(policy)
    start = cfg.initial_state()
    arrays = {m: np.asarray(x, dtype=np.float64) for m, x in member_scores.items()}
    n = next(iter(arrays.values())).shape[0] if arrays else 0
    unsafe = np.empty(n, dtype=bool)
    margin = np.empty(n, dtype=np.float64)
    rules: Counter[str] = Counter()
    for i in range(n):
        v = cfg.decide({m: x[i : i + 1] for m, x in arrays.items()}, state=start).verdicts[0]
        unsafe[i] = v.label == "UNSAFE"
        margin[i] = v.score - v.threshold
        rules[v.policy] += 1
    return DeployedLabels(unsafe=unsafe, rules=dict(rules), margin=margin)


def fitted_cut_policy(
    pool: Mapping[str, NDArray[np.float64]], *, name: str, what: str
) -> tuple[dict[str, Any], float]:
    """The frozen operating point of a member (one score) or an Avg-2 pair (two), fitted on
    an unlabelled pool: the fusion's reference statistics and the cut ``t0`` = the mean fused
    score of the pool (the guard's ``frozen`` policy, seed 000). Returns the policy dict for
    :func:`label_as_deployed` and ``t0``. ``what`` names the pool (recorded as ``fitted_on``).

    One rule for every candidate that has no policy file of its own: a member is measured at
    the cut it would be deployed at, not at ``s > 0``. The fit is the guard's
    :meth:`~spotstop.guard.policies.FrozenPolicy.fit_pool`, so a pool the guard's calibration
    refuses (fewer than its minimum of scenes, a flat member) is refused here too, as a
    :class:`~spotstop.diagnostics._errors.DataError`.
    """
    from spotstop.diagnostics._errors import DataError
    from spotstop.guard import ConfigError, FusionError
    from spotstop.guard.policies import FrozenPolicy

    try:
        fusion, frozen = FrozenPolicy.fit_pool(pool)
    except (FusionError, ConfigError) as e:
        raise DataError(f"cannot fit the frozen cut of {name} on {what}: {e}") from e
    t0 = frozen.threshold
    return frozen_pair_policy(fusion, t0, name=name, fitted_on={"what": f"{what} (no labels)"}), t0


def source_pool(table: Any, names: Sequence[str], *, name: str) -> dict[str, NDArray[np.float64]]:
    """The unedited source scenes' scores of members ``names`` (a :class:`ScoreTable`), the
    pool :func:`fitted_cut_policy` fits candidate ``name``'s frozen cut on: the scenes where
    every one of them has a finite score. A scene a member failed on (a NaN score: the guard
    fails it closed) is left out of the fit with a warning naming the member and the source
    rows; its decisions still count, as UNSAFE, wherever the cut is applied."""
    recs = [r for r in table.edits.records if r.kind == "source"]
    idx = np.array([r.index for r in recs], dtype=np.intp)
    pool = {m: np.asarray(table.scores[m], dtype=np.float64)[idx] for m in names}
    keep = np.logical_and.reduce([np.isfinite(v) for v in pool.values()])
    if keep.all():
        return pool
    for m, v in pool.items():
        bad = [recs[i].source_row for i in np.flatnonzero(~np.isfinite(v))]
        if bad:
            shown = ", ".join(map(str, bad[:10])) + (
                f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            )
            warnings.warn(
                f"member {m!r} has no finite score on {len(bad)} of the {len(recs)} unedited "
                f"source scenes (source rows {shown}): the frozen cut of {name} is fitted on "
                f"the other {int(keep.sum())}; those scenes fail closed (UNSAFE) and count so "
                "in its errors. Rescore them, or check the member on those images.",
                UserWarning,
                stacklevel=3,
            )
    return {m: v[keep] for m, v in pool.items()}


def stated_cut_policy(member: str, cut: float) -> dict[str, Any]:
    """A member at a cut the user states on its raw score ``s`` (UNSAFE when ``s ≥ cut``):
    reference statistics of median 0 and IQR 1, so the fused score is ``s`` itself."""
    from spotstop.guard import Avg2Fusion, MemberStats

    fusion = Avg2Fusion((member,), {member: MemberStats(0.0, 1.0)})
    return frozen_pair_policy(fusion, cut, name=member, fitted_on={"what": "stated by the user"})


def frozen_pair_policy(
    fusion: Any, threshold: float, *, name: str, fitted_on: Mapping[str, Any]
) -> dict[str, Any]:
    """A ``policy.yaml`` dict for an Avg-2 ``fusion`` (a :class:`spotstop.guard.Avg2Fusion`)
    with a frozen cut ``threshold``, for :func:`label_as_deployed`. ``name`` stands in for
    the bundle id; the file is never written."""
    from spotstop.guard.policies import POLICY_SCHEMA_VERSION

    return {
        "version": POLICY_SCHEMA_VERSION,
        "bundle_id": name,
        "prompt_hash": name,
        "created": datetime.now(UTC).isoformat(),
        "fusion": fusion.to_dict(),
        "policy": {"kind": "frozen", "threshold": float(threshold)},
        "fitted_on": dict(fitted_on),
    }
