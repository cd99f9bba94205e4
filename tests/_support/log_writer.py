"""Writing decision logs in tests.

As a script (used by tests/guard/test_log.py): append decisions forever, printing each id once
acknowledged.  Usage: ``python -m tests._support.log_writer DB_PATH`` from the repository's
root.  Each line on stdout is a
decision id whose ``DecisionLog.append`` has returned, i.e. whose write the log acknowledged.
The parent test kills this process with SIGKILL at a random point and checks that every
printed id is in the database.

As a module (used by tests/diagnostics/): :func:`policy_config` builds a real
``policy.yaml`` (``PolicyConfig``) around a policy kind, and :func:`segment_records` decides
scenes with it exactly as the guard does (``spotstop.guard.policies.replay``: its fusion, its
rule ``S ≥ t``, its state threaded batch by batch) and returns the records, which
:func:`write_log` appends together with each policy's :class:`PolicyRow`.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard._log import DecisionLog, DecisionRecord, PolicyRow
from spotstop.guard.policies import ConformalPolicy, Policy, PolicyConfig, batch_inputs, replay

BUNDLE = "bundle-1"
PROMPT = "p1"


def unit_fusion(members: Sequence[str] = ("a", "b")) -> Avg2Fusion:
    """Median 0, IQR 1, equal weights: ``S`` is the mean of the member scores."""
    return Avg2Fusion(tuple(members), {m: MemberStats(0.0, 1.0) for m in members})


def policy_config(
    policy: Policy,
    *,
    version: int = 1,
    created: float = 1_600_000_000.0,
    fusion: Avg2Fusion | None = None,
    state_seed: Any = None,
) -> PolicyConfig:
    """A ``policy.yaml`` for the test bundle: ``policy`` over ``fusion`` (default
    :func:`unit_fusion`), version ``version``, created at epoch ``created``."""
    return PolicyConfig(
        bundle_id=BUNDLE,
        prompt_hash=PROMPT,
        fusion=fusion or unit_fusion(),
        policy=policy,
        fitted_on={"version": version, "source": "tests"},
        created=dt.datetime.fromtimestamp(created, tz=dt.UTC),
        state_seed=state_seed,
    )


def policy_row(cfg: PolicyConfig) -> PolicyRow:
    """The log's row of a policy, as the guard writes it."""
    return cfg.log_row()


@dataclass
class Segment:
    """Scenes decided by one policy: member scores (name -> array), one situation id or None
    per scene, the first decision time, scenes per guard call (batch), optional gray and
    request-only member scores, per-scene record overrides (e.g. width, cue_flags)."""

    cfg: PolicyConfig
    members: Mapping[str, np.ndarray]
    situation_id: Sequence[str | None]
    t0: float
    batch_size: int = 1
    gray: Mapping[str, np.ndarray] | None = None
    text: Mapping[str, np.ndarray] | None = None
    extra: Sequence[Mapping[str, Any]] = field(default_factory=list)


def segment_records(seg: Segment, prefix: str) -> list[DecisionRecord]:
    """Decide the segment's scenes with its policy as the guard does; one record each."""
    n = len(seg.situation_id)
    x = batch_inputs(seg.cfg.fusion, seg.members, list(seg.situation_id), seg.text)
    batches = [f"{prefix}b{i // seg.batch_size}" for i in range(n)]
    d = replay(seg.cfg.policy, x, batch_ids=batches, state=seg.cfg.initial_state())
    out = []
    for i, v in enumerate(d.verdicts):
        fields: dict[str, Any] = {
            "time": seg.t0 + i,
            "decision_id": f"{prefix}{i:05d}",
            "batch_id": batches[i],
            "situation_id": seg.situation_id[i],
            "request": f"request {i}",
            "member_scores": {m: float(s[i]) for m, s in seg.members.items()},
            "member_scores_gray": None
            if seg.gray is None
            else {m: float(s[i]) for m, s in seg.gray.items()},
            "member_scores_text": None
            if seg.text is None
            else {m: float(s[i]) for m, s in seg.text.items()},
            "fused_score": float(x.fused[i]),
            "policy_score": v.score,
            "threshold": v.threshold,
            "policy": v.policy,
            "policy_kind": seg.cfg.kind,
            "deciding_kind": v.kind,
            "policy_version": seg.cfg.version_id,
            "fusion_key": seg.cfg.fusion_key,
            "label": v.label,
            "fail_closed": False,
            "detail": v.detail,
            "latency_ms": {"total": 10.0},
            "bundle_id": BUNDLE,
            "prompt_hash": PROMPT,
        }
        if i < len(seg.extra):
            fields.update(seg.extra[i])
        out.append(DecisionRecord(**fields))
    return out


def write_log(
    path: Path,
    segments: Sequence[tuple[Segment, str]],
    labels: Sequence[tuple[str, str, str | None, str | None]] = (),
    more: Sequence[DecisionRecord] = (),
) -> dict[str, list[DecisionRecord]]:
    """Append every segment (with its policy row), then ``more`` records, then ``labels``
    ``(decision_id, "safe"|"unsafe", contrast_id, reviewer)``; returns the records per prefix."""
    out = {}
    with DecisionLog(path) as log:
        for seg, prefix in segments:
            recs = segment_records(seg, prefix)
            log.append_many(recs, policy=policy_row(seg.cfg))
            out[prefix] = recs
        if more:
            log.append_many(list(more))
        if labels:
            log.set_labels(list(labels))
    return out


#: a conformal policy row, for logs whose policy is not the subject
CONFORMAL_CONFIG = policy_config(ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.6))


def main(path: str) -> None:
    with DecisionLog(path) as log:
        i = 0
        while True:
            record = DecisionRecord(
                request=f"crash-test request {i}",
                member_scores={"a": float(i), "b": math.nan},
                fused_score=0.1 * i,
                threshold=0.0,
                policy="frozen",
                label="SAFE",
                fail_closed=False,
                latency_ms={"total": 1.0},
                bundle_id="bundle-crash",
                prompt_hash="p0",
            )
            log.append(record)
            sys.stdout.write(record.decision_id + "\n")
            sys.stdout.flush()
            i += 1


if __name__ == "__main__":
    main(sys.argv[1])
