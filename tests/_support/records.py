"""Decision records made up for tests, and their comparison (NaN equals NaN)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from spotstop.guard._log import (
    DecisionRecord,
)


def make_record(i: int = 0, **overrides: Any) -> DecisionRecord:
    fields: dict[str, Any] = {
        "time": 1_700_000_000.0 + i,
        "situation_id": f"sit-{i % 3}",
        "request": f"pick up the knife {i}",
        "member_scores": {"qwen": 0.5 + i, "smol": -1.25},
        "fused_score": 0.25 * i,
        "threshold": 0.1,
        "policy": "frozen",
        "label": "UNSAFE" if i % 2 else "SAFE",
        "fail_closed": False,
        "latency_ms": {"decode": 1.5, "total": 20.0},
        "bundle_id": "bundle-1",
        "prompt_hash": "abc123",
    }
    fields.update(overrides)
    return DecisionRecord(**fields)


def _same(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN (also inside dicts)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def assert_same_record(a: DecisionRecord, b: DecisionRecord) -> None:
    for f in dataclasses.fields(DecisionRecord):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        assert _same(va, vb), f"{f.name}: {va!r} != {vb!r}"
