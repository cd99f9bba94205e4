"""A real decision log over three policy versions (frozen, conformal, situation), schema-1-like
rows and fail-closed decisions, for the card's replay and verdict tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard._log import DecisionRecord
from spotstop.guard.policies import (
    ConformalPolicy,
    FrozenPolicy,
    SituationPolicy,
    conformal_cut,
)

from tests._support.log_writer import Segment, policy_config, write_log

N_SIT = 60  # situations per segment, each one safe + one unsafe scene (a contrast)

T1, T2, T3 = 1_700_000_000.0, 1_700_100_000.0, 1_700_200_000.0


def replay_scenes(rng: np.random.Generator, n_sit: int, prefix: str, shift: float = 0.0):
    """Two scenes per situation (safe, unsafe), members a and b; labels and contrasts."""
    y = np.tile([0, 1], n_sit)
    sit = np.repeat([f"{prefix}s{i}" for i in range(n_sit)], 2)
    offset = np.repeat(rng.normal(0, 0.7, n_sit), 2)
    base = 1.6 * (y - 0.5) + offset + shift
    members = {"a": base + rng.normal(0, 0.6, y.size), "b": 0.5 * base + rng.normal(0, 0.4, y.size)}
    gray = {"a": offset + rng.normal(0, 0.3, y.size), "b": offset + rng.normal(0, 0.3, y.size)}
    text = {"a": rng.normal(0, 1, y.size), "b": rng.normal(0, 1, y.size)}
    return y, sit, members, gray, text


def fitted_conformal(rng: np.random.Generator, fusion: Avg2Fusion, shift: float) -> ConformalPolicy:
    """The guard's PAC cut fitted on unsafe calibration scores (``shift`` moves them)."""
    y, sit, members, _, _ = replay_scenes(rng, 120, "cal", shift)
    s = fusion.fuse_many(members)
    fit = conformal_cut(s[y == 1], sit[y == 1], alpha=0.1, delta=0.1).pac
    assert fit is not None and fit.feasible
    return ConformalPolicy(alpha=0.1, n=fit.n, k=fit.k, threshold=fit.threshold, delta=0.1)


def build_log(path: Path, *, conformal_shift: float = 0.0, seed: int = 0) -> dict:
    """Frozen v1, conformal v2 (its own fusion), situation v3, then schema-1-like rows; labels
    for all but a few decisions; two labelled fail-closed decisions."""
    rng = np.random.default_rng(seed)
    fusion2 = Avg2Fusion(("a", "b"), {"a": MemberStats(0.1, 2.0), "b": MemberStats(-0.2, 0.8)})
    cfgs = [
        policy_config(FrozenPolicy(threshold=0.0), version=1, created=T1 - 10),
        policy_config(
            fitted_conformal(rng, fusion2, conformal_shift),
            version=2,
            created=T2 - 10,
            fusion=fusion2,
        ),
        policy_config(
            SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(threshold=0.0)),
            version=3,
            created=T3 - 10,
        ),
    ]
    segments, labels, truth = [], [], {}
    for k, (cfg, t0) in enumerate(zip(cfgs, (T1, T2, T3), strict=True)):
        prefix = f"v{k + 1}-"
        y, sit, members, gray, text = replay_scenes(rng, N_SIT, prefix)
        seg = Segment(cfg, members, list(sit), t0, batch_size=4, gray=gray, text=text)
        segments.append((seg, prefix))
        for i in range(y.size):
            did = f"{prefix}{i:05d}"
            truth[did] = int(y[i])
            if i % 37 != 5:  # a few stay unlabelled
                labels.append((did, "unsafe" if y[i] else "safe", f"{prefix}c{i // 2}", "rev"))
    old = [  # rows that do not say which policy decided (as migrated schema-1 rows read)
        DecisionRecord(
            time=T3 + 50_000 + i,
            decision_id=f"old-{i}",
            situation_id=f"old-s{i // 2}",
            request="r",
            member_scores={"a": float(i % 2) - 0.3, "b": 0.0},
            fused_score=float(i % 2) - 0.3,
            threshold=0.0,
            policy="frozen",
            label="UNSAFE" if i % 3 else "SAFE",
            fail_closed=False,
            latency_ms={"total": 1.0},
            bundle_id="bundle-1",
            prompt_hash="p1",
        )
        for i in range(12)
    ]
    fail = [  # made under v1 while it was deployed (the log's last decisions are v3's)
        DecisionRecord(
            time=T1 + 50_000 + i,
            decision_id=f"fail-{i}",
            situation_id=None,
            request="r",
            member_scores={"a": math.nan, "b": 0.0},
            fused_score=math.nan,
            threshold=math.nan,
            policy="frozen",
            policy_kind="frozen",
            policy_version=cfgs[0].version_id,
            fusion_key=cfgs[0].fusion_key,
            label="UNSAFE",
            fail_closed=True,
            fail_reason="ScoringError: test",
            latency_ms={"total": 1.0},
            bundle_id="bundle-1",
            prompt_hash="p1",
        )
        for i in range(2)
    ]
    labels += [
        (f"old-{i}", "unsafe" if i % 2 else "safe", f"oldc{i // 2}", "rev") for i in range(12)
    ]
    labels += [(f"fail-{i}", "unsafe", None, "rev") for i in range(2)]
    write_log(path, segments[:1], more=fail)
    write_log(path, segments[1:], labels, more=old)
    return {"cfgs": cfgs, "truth": truth}
