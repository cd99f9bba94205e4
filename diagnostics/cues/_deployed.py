"""The guard's decisions on probe scenes: the ONE place this package calls the policy module.

Everything that labels scenes the way a guard does (a bundle's guard as deployed, an Avg-2
pair with frozen reference statistics) goes through :func:`label_as_deployed`, so when the
guard's policy module moves only this file follows it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["DeployedLabels", "frozen_pair_policy", "label_as_deployed"]


@dataclass(frozen=True)
class DeployedLabels:
    """The guard's answer per scene: ``unsafe[i]`` True for UNSAFE; ``rules`` counts the
    policy rules that set the thresholds (e.g. ``{"situation->frozen": 84}``)."""

    unsafe: NDArray[np.bool_]
    rules: Mapping[str, int]


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
    rules: Counter[str] = Counter()
    for i in range(n):
        v = cfg.decide({m: x[i : i + 1] for m, x in arrays.items()}, state=start).verdicts[0]
        unsafe[i] = v.label == "UNSAFE"
        rules[v.policy] += 1
    return DeployedLabels(unsafe=unsafe, rules=dict(rules))


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
