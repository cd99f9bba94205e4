"""One shape per decision: the record, its SQL row, its JSON, the sidecar schema, the client.

Every representation derives from :class:`DecisionRecord`'s field list; these tests check
that a decision survives each trip unchanged and that no representation has a field the
record lacks (or the other way round).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import pytest
from spotstop.guard._record import (
    Decision,
    DecisionRecord,
    RecordError,
    json_field_types,
    record_from_row,
    record_to_row,
    sql_columns,
)


def _decision(**kw: Any) -> Decision:
    base: dict[str, Any] = {
        "batch_id": "b" * 32,
        "situation_id": "kitchen-1",
        "request": "pick up the knife 🔪",
        "image_sha256": "ab" * 32,
        "width": 640,
        "height": 480,
        "n_bytes": 1234,
        "image_format": "JPEG",
        "member_scores": {"qwen": 1.25, "lfm": math.nan},
        "member_scores_gray": {"qwen": -0.5, "lfm": math.inf},
        "member_scores_text": None,
        "fused_score": math.nan,
        "policy_score": 0.75,
        "threshold": -math.inf,
        "policy": "situation->frozen",
        "policy_kind": "situation",
        "policy_version": "v0002+3f9a1c2b",
        "fusion_key": "0123456789abcdef",
        "label": "UNSAFE",
        "fail_closed": True,
        "fail_reason": "member lfm produced a non-finite score (nan)",
        "detail": "situation 'kitchen-1' has 1 < min_refs 3 references",
        "cue_flags": {"reassuring": True, "alarming": False},
        "cue_text": "ALL CLEAR",
        "latency_ms": {"total_ms": 42.0},
        "bundle_id": "tiny-demo-1a2b3c4d",
        "prompt_hash": "9f8e7d6c5b4a",
        "test_pair": True,
    }
    base.update(kw)
    return Decision(**base)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _assert_same(a: DecisionRecord, b: DecisionRecord, *, nonfinite_as_nan: bool = False) -> None:
    for f in dataclasses.fields(DecisionRecord):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if nonfinite_as_nan:  # JSON has no infinity: a non-finite number is null, read as NaN
            va = _nan_for_inf(va)
        assert _same(va, vb), f"{f.name}: {va!r} != {vb!r}"


def _nan_for_inf(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return math.nan
    if isinstance(v, dict):
        return {k: _nan_for_inf(x) for k, x in v.items()}
    return v


def test_sql_row_round_trip_keeps_nan_and_inf() -> None:
    d = _decision()
    cols = [c for c, _ in sql_columns()]
    assert cols == [f.name for f in dataclasses.fields(DecisionRecord)]
    back = record_from_row(record_to_row(d))
    _assert_same(d, back)


def test_json_round_trip_through_the_sidecar_schema_and_the_client() -> None:
    pytest.importorskip("pydantic")
    from spotstop.guard.client import decision_from_dict
    from spotstop.guard.serve._schemas import DecisionOut

    d = _decision()
    body = json.loads(json.dumps(d.to_json(), allow_nan=False))  # what goes over the wire
    assert set(DecisionOut.model_fields) == {f.name for f in dataclasses.fields(DecisionRecord)}
    validated = DecisionOut.model_validate(body).model_dump()
    assert validated == body  # the response schema accepts exactly the record's JSON
    back = decision_from_dict(body)
    assert isinstance(back, Decision)
    _assert_same(d, back, nonfinite_as_nan=True)
    assert Decision.from_json(d.to_json()).to_json() == d.to_json()


def test_json_types_cover_every_field_once() -> None:
    types = json_field_types()
    assert list(types) == [f.name for f in dataclasses.fields(DecisionRecord)]


def test_client_never_trusts_a_safe_that_failed_closed() -> None:
    from spotstop.guard.client import decision_from_dict

    body = _decision(label="UNSAFE", fail_closed=True).to_json()
    body["label"] = "SAFE"  # a server that says SAFE and fail_closed in one breath
    assert decision_from_dict(body).label == "UNSAFE"


def _safe_body() -> dict[str, Any]:
    """A complete, logged SAFE decision as the sidecar sends it."""
    return _decision(
        member_scores={"qwen": -1.0, "lfm": -2.0},
        fused_score=-0.5,
        policy_score=-0.5,
        threshold=0.25,
        label="SAFE",
        fail_closed=False,
        fail_reason=None,
    ).to_json()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"decision_id": None}, "no logged decision"),  # left out: from_json would invent one
        ({"decision_id": ""}, "no logged decision"),
        ({"policy_score": None}, "not SAFE by the rule"),
        ({"threshold": None}, "not SAFE by the rule"),
        ({"policy_score": 0.25}, "not SAFE by the rule"),  # a tie is UNSAFE
        ({"policy_score": 3.0}, "not SAFE by the rule"),
        ({"fail_closed": None}, "fail_closed is None"),
    ],
)
def test_the_client_trusts_a_safe_only_with_a_logged_decision_the_rule_calls_safe(
    change: dict[str, Any], why: str
) -> None:
    from spotstop.guard.client import decision_from_dict

    assert decision_from_dict(_safe_body()).label == "SAFE"  # the test can pass SAFE
    body = _safe_body()
    for k, v in change.items():
        if v is None and k in ("decision_id", "fail_closed"):
            del body[k]
        else:
            body[k] = v
    d = decision_from_dict(body)
    assert d.label == "UNSAFE" and d.fail_closed, d
    assert "not trusted" in (d.fail_reason or "") and why in (d.fail_reason or "")


def test_the_client_refuses_a_reply_with_a_key_twice_or_a_nan_constant() -> None:
    import httpx
    from spotstop.guard import Scene
    from spotstop.guard.client import GuardClient

    from tests._support.images import make_image_bytes

    unsafe_then_safe = {**_safe_body(), "label": "UNSAFE"}
    replies = {
        "good": json.dumps(_safe_body()),
        "twice": json.dumps(unsafe_then_safe)[:-1] + ', "label": "SAFE"}',
        "nan": json.dumps({**_safe_body(), "fused_score": math.nan}),  # writes NaN
    }
    assert "NaN" in replies["nan"]
    for name, text in replies.items():
        image = make_image_bytes(0, fmt="JPEG")  # the scene the replies are for
        body = json.loads(text.replace("NaN", "null"))
        text = text.replace(body["image_sha256"], hashlib.sha256(image).hexdigest())

        def reply(request: httpx.Request, text: str = text) -> httpx.Response:
            return httpx.Response(200, content=text.encode(), headers={"content-type": "json"})

        with GuardClient("http://sidecar", transport=httpx.MockTransport(reply)) as gc:
            d = gc.check(Scene(image, body["request"], body["situation_id"]))
        if name == "good":
            assert d.label == "SAFE" and not d.fail_closed, d
        else:
            assert d.label == "UNSAFE" and "malformed" in (d.fail_reason or ""), (name, d)


def test_from_json_names_the_bad_field() -> None:
    body = _decision().to_json()
    with pytest.raises(RecordError, match="'member_scores' must be an object of numbers"):
        Decision.from_json({**body, "member_scores": [1.0]})
    with pytest.raises(RecordError, match="field 'label' is missing"):
        Decision.from_json({k: v for k, v in body.items() if k != "label"})
    with pytest.raises(RecordError, match="'fused_score' must be a number or null"):
        Decision.from_json({**body, "fused_score": "1.0"})
    with pytest.raises(RecordError, match=r"label must be one of"):
        Decision.from_json({**body, "label": "maybe"})


def test_decision_repr_is_short_and_says_fail_closed() -> None:
    r = repr(_decision())
    assert r.startswith("Decision(UNSAFE") and "FAIL-CLOSED" in r and "TEST PAIR" in r
    assert len(r) < 300
