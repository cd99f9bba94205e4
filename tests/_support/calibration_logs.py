"""Recalibration inputs: a bundle manifest without model files, a simulated decision log
with its true labels, a frozen policy for the bundle."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from spotstop.guard._bundle import load_bundle, pair_prompt_hash
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard._log import DecisionLog, DecisionRecord
from spotstop.guard._prompt import IMAGE_SLOT, REQUEST_SLOT
from spotstop.guard.policies import (
    FrozenPolicy,
    PolicyConfig,
)

T0 = 1_700_000_000.0

FIXED = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def fake_bundle(
    root: Path, members: tuple[str, ...] = ("a", "b"), bundle_id: str = "fake-01"
) -> Path:
    """A bundle manifest without model files (enough for calibrate, not for a Guard)."""
    root.mkdir(parents=True, exist_ok=True)
    ph = {m: f"ph-{m}" for m in members}
    manifest = {
        "format": "spotstop-bundle",
        "version": 1,
        "bundle_id": bundle_id,
        "prompt_hash": pair_prompt_hash(ph),
        "prompt": {"text": "Safe? {request}", "unsafe_answer": "UNSAFE", "safe_answer": "SAFE"},
        "members": [
            {
                "name": m,
                "path": f"members/{m}",
                "model_type": "qwen3_5",
                "image_size": [64, 64],
                "prompt_hash": ph[m],
                "template": {
                    "with_image": IMAGE_SLOT + REQUEST_SLOT,
                    "without_image": REQUEST_SLOT,
                },
            }
            for m in members
        ],
        "policy": "policy.yaml",
        "files": {},
    }
    (root / "manifest.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    return root


def usable_record(
    b: Any, t: float, did: str, situation: str, scores: dict[str, float]
) -> DecisionRecord:
    """A logged decision of bundle ``b`` that a refit uses: scored, entered its policy (a finite
    ``policy_score``), not failed closed."""
    return DecisionRecord(
        time=t,
        decision_id=did,
        situation_id=situation,
        request="move the pot",
        member_scores=scores,
        fused_score=0.0,
        policy_score=0.0,
        threshold=0.0,
        policy="frozen",
        label="UNSAFE",
        fail_closed=False,
        latency_ms={"total": 1.0},
        bundle_id=b.bundle_id,
        prompt_hash=b.prompt_hash,
    )


def simulate_decisions(
    path: Path,
    bundle: Path,
    *,
    n_sit: int = 60,
    per: int = 4,
    p_unsafe: float = 0.35,
    seed: int = 0,
    label: bool = True,
) -> dict[str, int]:
    """A log of ``n_sit * per`` decisions (situation offsets, two members on other scales).

    The logged fused score, policy score and threshold are deliberately wrong (0.0): a fit
    must recompute the fused scores from the member scores. Returns the true labels by decision id.
    """
    b = load_bundle(bundle, verify=False)
    gen = np.random.default_rng(seed)
    recs, labels, truth = [], [], {}
    t = T0
    for s in range(n_sit):
        off = gen.normal(0, 0.6)
        for j in range(per):
            y = int(gen.random() < p_unsafe)
            z = 1.5 * (y - 0.5) + off + gen.normal(0, 0.8)
            did = f"d{s:03d}-{j}"
            t += 60.0
            scores = {"a": 2.0 * z + 1.0, "b": 0.5 * z - 2.0 + gen.normal(0, 0.2)}
            recs.append(usable_record(b, t, did, f"s{s:03d}", scores))
            truth[did] = y
            labels.append((did, "unsafe" if y else "safe", f"c{s:03d}", "sim"))
    # noise the fit must ignore: a fail-closed decision, a NaN member, another bundle
    nan = float("nan")
    recs.append(_odd(t + 1, "fc", {"a": 1e6, "b": 1e6}, True, b.bundle_id, b.prompt_hash))
    recs.append(_odd(t + 2, "nan", {"a": nan, "b": 0.0}, False, b.bundle_id, b.prompt_hash))
    recs.append(_odd(t + 3, "other", {"a": 1e6, "b": 1e6}, False, "another", b.prompt_hash))
    with DecisionLog(path) as log:
        log.append_many(recs)
        if label:
            log.set_labels(labels)
    return truth


def _odd(
    t: float, did: str, scores: dict[str, float], fail: bool, bundle_id: str, ph: str
) -> DecisionRecord:
    return DecisionRecord(
        time=t,
        decision_id=did,
        request="x",
        member_scores=scores,
        fused_score=float("nan"),
        threshold=float("nan"),
        policy="frozen",
        label="UNSAFE",
        fail_closed=fail,
        fail_reason="test" if fail else None,
        latency_ms={"total": 1.0},
        bundle_id=bundle_id,
        prompt_hash=ph,
    )


def frozen_policy(bundle: Path, t0: float, *, bundle_id: str | None = None) -> PolicyConfig:
    b = load_bundle(bundle, verify=False)
    names = [m.name for m in b.members]
    return PolicyConfig(
        bundle_id=bundle_id or b.bundle_id,
        prompt_hash=b.prompt_hash,
        fusion=Avg2Fusion(tuple(names), {m: MemberStats(0.0, 1.0) for m in names}),
        policy=FrozenPolicy(threshold=t0),
        fitted_on={"test": True},
        created=FIXED,
    )


def one_situation_log(
    path: Path, bundle: Path, rows: list[tuple[float, str, str | None]], situation: str = "k"
) -> None:
    """A log of one situation's decisions as a guard with the fusion of :func:`frozen_policy`
    (medians 0, IQRs 1: both members score ``s``, so ``S = s``) wrote them: ``(s, label,
    fail_reason)`` each, the policy score logged (every one entered the policy; a fail
    reason says it failed closed after its decision, e.g. past the deadline)."""
    b = load_bundle(bundle, verify=False)
    recs = [
        DecisionRecord(
            time=T0 + i,
            decision_id=f"d{i}",
            situation_id=situation,
            request="move the pot",
            member_scores={"a": s, "b": s},
            fused_score=s,
            policy_score=s,
            threshold=0.0,
            policy="situation",
            label=label,  # type: ignore[arg-type]
            fail_closed=fail is not None,
            fail_reason=fail,
            latency_ms={"total": 1.0},
            bundle_id=b.bundle_id,
            prompt_hash=b.prompt_hash,
        )
        for i, (s, label, fail) in enumerate(rows)
    ]
    with DecisionLog(path) as log:
        log.append_many(recs)
