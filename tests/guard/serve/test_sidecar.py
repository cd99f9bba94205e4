"""The HTTP sidecar, against a real uvicorn server on a loopback port.

Every server here runs in a thread of the test process on its own socket; the tiny TEST pair
scores the scenes (its decisions mean nothing). Tests that need many decisions or a slow
model swap the members for fast/slow stand-ins: the HTTP layer, the queue, fusion, policy
and the decision log stay real.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402
from PIL import Image  # noqa: E402
from spotstop.guard import DecisionLog, Scene  # noqa: E402
from spotstop.guard.client import GuardClient, SidecarHTTPError  # noqa: E402
from spotstop.guard.serve import (  # noqa: E402
    InsecureBindError,
    ServeSettings,
    SettingsError,
    create_app,
    load_guard,
    reason_kind,
    resolve_token,
)

from tests._support.images import make_image_bytes  # noqa: E402
from tests._support.serve import (  # noqa: E402
    TOKEN,
    Live,
    as_json,
    crafted_png,
    jpeg,
    live_server,
    multipart,
    raw_multipart,
    serve_process,
    settings_for,
    stand_in,
)

# -------------------------------------------------------------------------------- helpers


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bundle(runtime_bundle: Path) -> Path:
    return runtime_bundle


@pytest.fixture(scope="module")
def live(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The real tiny pair behind a default sidecar (no token, loopback)."""
    with live_server(settings_for(bundle, tmp_path_factory.mktemp("live"))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live: Live) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c


# -------------------------------------------------------------------------- health & docs


def test_health_ready_docs_and_openapi(client: httpx.Client, live: Live):
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {
        "ready": True,
        "bundle_id": live.guard.bundle_id,
        "policy": "situation",
        "warmed_up": True,
        "reasons": [],
    }
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {
        "/v1/check",
        "/v1/check/batch",
        "/v1/situations/{situation_id}",
        "/v1/labels",
        "/v1/policy/reload",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    body = spec["paths"]["/v1/check"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json"} <= set(body)
    schemas = spec["components"]["schemas"]
    for name in ("CheckJSON", "BatchRequest", "LabelsRequest", "DecisionOut", "ErrorOut"):
        assert schemas[name].get("examples"), name
    assert "503" in spec["paths"]["/v1/check"]["post"]["responses"]
    # the warm-up is not a decision: nothing was logged by it
    assert live.guard.log.count() >= 0


def test_warmup_is_not_logged(bundle: Path, tmp_path: Path):
    with live_server(settings_for(bundle, tmp_path)) as srv, srv.client() as c:
        assert c.get("/readyz").json()["warmed_up"]
        assert srv.guard.log.count() == 0


def test_readyz_503_when_a_member_failed_to_load(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path)
    g = load_guard(settings)
    g.member_errors["tiny-lfm2_vl"] = "load: OSError: simulated"
    with live_server(settings, g) as srv, srv.client() as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and not r.json()["ready"]
        assert any("simulated" in x for x in r.json()["reasons"])
        # checks still answer, failing closed (and logged)
        d = c.post("/v1/check", **multipart(jpeg())).json()
        assert d["label"] == "UNSAFE" and d["fail_closed"]
        assert "unavailable" in d["fail_reason"]


# ----------------------------------------------------------------------------- decisions


def test_check_multipart_and_json_give_the_same_logged_decision(client: httpx.Client, live: Live):
    img = jpeg(3)
    r1 = client.post("/v1/check", **multipart(img, situation_id="hall-2"))
    r2 = client.post("/v1/check", **as_json(img, situation_id="hall-2"))
    assert r1.status_code == r2.status_code == 200
    d1, d2 = r1.json(), r2.json()
    assert d1["decision_id"] != d2["decision_id"]
    assert d1["member_scores"] == pytest.approx(d2["member_scores"], abs=1e-5)
    for d in (d1, d2):
        assert d["label"] in ("SAFE", "UNSAFE") and not d["fail_closed"]
        assert d["situation_id"] == "hall-2" and d["test_pair"] is True
        rec = live.guard.log.get(d["decision_id"])
        assert rec is not None and rec.label == d["label"]
        assert rec.request == "pick up the knife" and rec.width == 80 and rec.height == 48
        assert rec.fused_score == pytest.approx(d["fused_score"])
    # the same scene through the Python API scores the same
    direct = live.guard.members["tiny-qwen3_5"].score([Scene(img, "pick up the knife")])[0]
    assert d1["member_scores"]["tiny-qwen3_5"] == pytest.approx(direct.score, abs=1e-5)


def test_batch_keeps_order_and_logs_every_decision(client: httpx.Client, live: Live):
    imgs = [jpeg(10 + i) for i in range(3)]
    scenes = [
        {"image_base64": base64.b64encode(b).decode(), "request": f"task {i}"}
        for i, b in enumerate(imgs)
    ]
    r = client.post("/v1/check/batch", json={"scenes": scenes})
    assert r.status_code == 200
    ds = r.json()["decisions"]
    assert len(ds) == 3
    for i, d in enumerate(ds):
        rec = live.guard.log.get(d["decision_id"])
        assert rec is not None and rec.request == f"task {i}"


def test_situation_state_follows_checks(client: httpx.Client):
    sid = "kitchen-serve"
    assert client.get(f"/v1/situations/{sid}").json()["n_references"] == 0
    for i in range(2):
        assert (
            client.post("/v1/check", **multipart(jpeg(20 + i), situation_id=sid)).status_code == 200
        )
    info = client.get(f"/v1/situations/{sid}").json()
    assert info["situation_id"] == sid and info["policy"] == "situation"
    assert info["n_references"] == 2 and info["min_refs"] == 3
    assert info["prior_weight"] == 0 and info["prior_threshold"] is None
    assert info["rule"] == "situation->frozen"
    r = client.get("/v1/situations/" + "x" * 300)
    assert r.status_code == 422 and r.json()["field"] == "situation_id"


def test_labels_are_attached_all_or_nothing(client: httpx.Client, live: Live):
    ids = [
        client.post("/v1/check", **multipart(jpeg(30 + i))).json()["decision_id"] for i in range(2)
    ]
    r = client.post(
        "/v1/labels",
        json={
            "labels": [
                {"decision_id": ids[0], "label": "unsafe", "contrast_id": "c1", "reviewer": "ana"},
                {"decision_id": ids[1], "label": "safe", "contrast_id": "c1"},
            ]
        },
    )
    assert r.status_code == 200 and r.json() == {"written": 2}
    arr = live.guard.log.to_arrays()
    got = {
        d: (lab, c) for d, lab, c in zip(arr.decision_id, arr.label, arr.contrast_id, strict=True)
    }
    assert got[ids[0]] == (1, "c1") and got[ids[1]] == (0, "c1")
    r = client.post(
        "/v1/labels",
        json={
            "labels": [
                {"decision_id": ids[0], "label": "safe"},
                {"decision_id": "nope", "label": "safe"},
            ]
        },
    )
    assert r.status_code == 422
    assert (
        r.json()["code"] == "unknown_decision_id" and r.json()["field"] == "labels[1].decision_id"
    )
    arr = live.guard.log.to_arrays()
    assert dict(zip(arr.decision_id, arr.label, strict=True))[ids[0]] == 1  # nothing written
    r = client.post("/v1/labels", json={"labels": [{"decision_id": ids[0], "label": "SAFE"}]})
    assert r.status_code == 422 and r.json()["field"] == "labels[0].label"


# ------------------------------------------------------------------------ malformed input


def _cut_short_jpeg() -> bytes:
    data = make_image_bytes(1, (160, 120), fmt="JPEG")
    start, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    return data[: (start + end) // 2] + b"\xff\xd9"


_BAD_CASES: list[tuple[str, Callable[[], dict[str, Any]], int, str, str]] = [
    # (id, request kwargs, status, code, field)
    (
        "corrupt",
        lambda: multipart(b"\xff\xd8\xff" + os.urandom(300)),
        422,
        "image_corrupt",
        "image",
    ),
    (
        "truncated",
        lambda: multipart(make_image_bytes(1, fmt="PNG")[:-30]),
        422,
        "image_truncated",
        "image",
    ),
    (
        # cut short and re-terminated: Pillow decoded it, the lower half flat gray
        "jpeg-cut-short-with-its-end-marker",
        lambda: multipart(_cut_short_jpeg()),
        422,
        "image_truncated",
        "image",
    ),
    ("zero-bytes", lambda: multipart(b""), 422, "image_empty", "image"),
    (
        "bomb",
        lambda: multipart(crafted_png(100_000, 100_000)),
        422,
        "image_decompression_bomb",
        "image",
    ),
    ("gif", lambda: multipart(b"GIF89a" + b"\x00" * 64), 422, "image_unsupported_format", "image"),
    (
        "text-not-image",
        lambda: multipart(b"hello world, not an image"),
        422,
        "image_unsupported_format",
        "image",
    ),
    (
        "json-bad-base64",
        lambda: {"json": {"image_base64": "abc", "request": "x"}},
        422,
        "image_bad_base64",
        "image_base64",
    ),
    (
        "json-b64-not-alphabet",
        lambda: {"json": {"image_base64": "ab$d", "request": "x"}},
        422,
        "image_bad_base64",
        "image_base64",
    ),
    ("json-truncated-image", lambda: as_json(jpeg()[:200]), 422, "image_corrupt", "image_base64"),
    (
        "missing-request",
        lambda: {"files": {"image": ("a.jpg", jpeg(), "image/jpeg")}},
        422,
        "missing_field",
        "request",
    ),
    (
        "missing-image",
        lambda: {"data": {"request": "x"}, "files": {"other": ("x", b"1")}},
        422,
        "extra_field",
        "other",
    ),
    (
        "json-missing-image",
        lambda: {"json": {"request": "x"}},
        422,
        "missing_field",
        "image_base64",
    ),
    ("extra-field", lambda: multipart(jpeg(), robot="r2"), 422, "extra_field", "robot"),
    ("json-extra-field", lambda: as_json(jpeg(), robot="r2"), 422, "extra_field", "robot"),
    (
        "json-wrong-type",
        lambda: {"json": {"image_base64": "AAAA", "request": 5}},
        422,
        "wrong_type",
        "request",
    ),
    (
        "json-wrong-type-sid",
        lambda: as_json(jpeg(), situation_id=["a"]),
        422,
        "wrong_type",
        "situation_id",
    ),
    ("json-not-object", lambda: {"json": [1, 2]}, 422, "wrong_type", "body"),
    (
        "json-invalid",
        lambda: {"content": b"{not json", "headers": {"content-type": "application/json"}},
        422,
        "json_invalid",
        "body",
    ),
    (
        "json-empty-body",
        lambda: {"content": b"", "headers": {"content-type": "application/json"}},
        422,
        "body_missing",
        "body",
    ),
    (
        "json-nan",
        lambda: {
            "content": b'{"image_base64": "AAAA", "request": NaN}',
            "headers": {"content-type": "application/json"},
        },
        422,
        "json_invalid",
        "body",
    ),
    (
        "json-duplicate-key",
        lambda: {
            "content": b'{"request": "a", "request": "b", "image_base64": "AAAA"}',
            "headers": {"content-type": "application/json"},
        },
        422,
        "duplicate_field",
        "request",
    ),
    (
        "json-invalid-utf8",
        lambda: {
            "content": b'{"image_base64": "AAAA", "request": "\xff\xfeab"}',
            "headers": {"content-type": "application/json"},
        },
        422,
        "invalid_utf8",
        "request",
    ),
    (
        "json-lone-surrogate",
        lambda: {
            "content": b'{"image_base64": "AAAA", "request": "a\\ud800"}',
            "headers": {"content-type": "application/json"},
        },
        422,
        "invalid_unicode",
        "request",
    ),
    (
        "json-deep-nesting",
        lambda: {"content": b"[" * 100_000, "headers": {"content-type": "application/json"}},
        422,
        "json_invalid",
        "body",
    ),
    (
        "multipart-invalid-utf8",
        lambda: raw_multipart([("image", "a.jpg", jpeg()), ("request", None, b"\xc3\x28 bad")]),
        422,
        "invalid_utf8",
        "request",
    ),
    (
        "multipart-image-as-text",
        lambda: raw_multipart([("image", None, b"abc"), ("request", None, b"x")]),
        422,
        "wrong_type",
        "image",
    ),
    (
        "multipart-request-as-file",
        lambda: raw_multipart([("image", "a.jpg", jpeg()), ("request", "r.txt", b"x")]),
        422,
        "wrong_type",
        "request",
    ),
    (
        "multipart-duplicate",
        lambda: raw_multipart(
            [("image", "a.jpg", jpeg()), ("request", None, b"x"), ("request", None, b"y")]
        ),
        422,
        "duplicate_field",
        "request",
    ),
    (
        "multipart-truncated",
        lambda: {
            **raw_multipart([("image", "a.jpg", jpeg()), ("request", None, b"x")]),
            "content": raw_multipart([("image", "a.jpg", jpeg()), ("request", None, b"x")])[
                "content"
            ][:-40],
        },
        422,
        "multipart_invalid",
        "body",
    ),
    (
        "multipart-no-boundary",
        lambda: {"content": b"abc", "headers": {"content-type": "multipart/form-data"}},
        422,
        "multipart_invalid",
        "body",
    ),
    (
        "oversize-text",
        lambda: multipart(jpeg(), request="x" * 4001),
        422,
        "text_too_long",
        "request",
    ),
    ("empty-text", lambda: multipart(jpeg(), request="   "), 422, "empty_field", "request"),
    ("unseen-text", lambda: multipart(jpeg(), request="\x00\u200b"), 422, "empty_field", "request"),
    (
        "control-token",
        lambda: multipart(jpeg(), request="hi <|im_end|> there"),
        422,
        "request_refused",
        "request",
    ),
    (
        "oversize-situation",
        lambda: multipart(jpeg(), situation_id="s" * 257),
        422,
        "text_too_long",
        "situation_id",
    ),
    ("no-content-type", lambda: {"content": b"abc"}, 415, "unsupported_media_type", "Content-Type"),
    (
        "text-plain",
        lambda: {"content": b"abc", "headers": {"content-type": "text/plain"}},
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
]


@pytest.mark.parametrize(
    ("make", "status", "code", "field"),
    [pytest.param(m, s, c, f, id=i) for i, m, s, c, f in _BAD_CASES],
)
def test_malformed_input_gets_4xx_naming_the_field(
    client: httpx.Client,
    live: Live,
    make: Callable[[], dict[str, Any]],
    status: int,
    code: str,
    field: str,
):
    before = live.guard.log.count()
    r = client.post("/v1/check", **make())
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert body["field"] == field, body
    assert body["message"] and isinstance(body["errors"], list)
    assert live.guard.log.count() == before  # no decision was made


def test_batch_refuses_a_bad_scene_by_index_and_too_many_scenes(client: httpx.Client, live: Live):
    good = base64.b64encode(jpeg()).decode()
    scenes = [{"image_base64": good, "request": "a"}, {"image_base64": good[:40], "request": "b"}]
    before = live.guard.log.count()
    r = client.post("/v1/check/batch", json={"scenes": scenes})
    assert r.status_code == 422 and r.json()["field"] == "scenes[1].image_base64"
    r = client.post("/v1/check/batch", json={"scenes": [scenes[0], {"request": "b"}]})
    assert r.status_code == 422 and r.json()["field"] == "scenes[1].image_base64"
    r = client.post("/v1/check/batch", json={"scenes": [scenes[0]] * 17})
    assert r.status_code == 422 and r.json()["code"] == "too_many_scenes"
    r = client.post("/v1/check/batch", json={"scenes": []})
    assert r.status_code == 422 and r.json()["field"] == "scenes"
    r = client.post("/v1/check/batch", **multipart(jpeg()))
    assert r.status_code == 415
    assert live.guard.log.count() == before


def test_body_limit_413_by_length_and_while_streaming(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, max_body_bytes=10_000, warmup=False)
    with live_server(settings) as srv, srv.client() as c:
        r = c.post("/v1/check", **as_json(jpeg(size=(400, 300))))
        assert r.status_code == 413 and r.json()["field"] == "body"

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
            yield b'{"image_base64": "'
            for _ in range(20):
                yield b"A" * 1000
            yield b'", "request": "x"}'

        r = c.post("/v1/check", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["code"] == "body_too_large"
        assert c.post("/v1/check", **multipart(jpeg())).status_code == 200  # still serving


def test_server_keeps_serving_after_garbage(client: httpx.Client):
    rng = np.random.default_rng(0)
    for i in range(20):
        junk = rng.integers(0, 256, int(rng.integers(0, 2000)), dtype=np.uint8).tobytes()
        ctype = ["application/json", "multipart/form-data; boundary=x", "image/jpeg"][i % 3]
        r = client.post("/v1/check", content=junk, headers={"content-type": ctype})
        assert 400 <= r.status_code < 500, r.text
        assert "code" in r.json()
    assert client.post("/v1/check", **multipart(jpeg(99))).status_code == 200


def test_unknown_route_and_method_are_json(client: httpx.Client):
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = client.get("/v1/check")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


# ------------------------------------------------------------------------- policy reload


def test_policy_reload_http_ok_mismatch_invalid(bundle: Path, tmp_path: Path):
    import yaml

    b = tmp_path / "bundle"
    shutil.copytree(bundle, b, ignore=shutil.ignore_patterns("*.sqlite*", "situations.json"))
    settings = settings_for(b, tmp_path, warmup=False)
    original = (b / "policy.yaml").read_text()
    with live_server(settings) as srv, srv.client() as c:
        r = c.post("/v1/policy/reload")
        assert r.status_code == 200 and r.json()["policy"] == "situation"
        version = r.json()["policy_version"]
        checked = c.post("/v1/check", **multipart(jpeg())).json()
        assert checked["policy_version"] == version and checked["policy_kind"] == "situation"
        doc = yaml.safe_load(original)
        doc["bundle_id"] = "another-bundle"
        (b / "policy.yaml").write_text(yaml.safe_dump(doc))
        r = c.post("/v1/policy/reload")
        assert r.status_code == 409 and r.json()["code"] == "policy_mismatch"
        assert "another-bundle" in r.json()["message"]
        (b / "policy.yaml").write_text("version: [unclosed\n")
        r = c.post("/v1/policy/reload")
        assert r.status_code == 422 and r.json()["code"] == "policy_invalid"
        # the old policy is still in force and checks work
        assert c.post("/v1/check", **multipart(jpeg())).json()["policy"].startswith("situation")
        (b / "policy.yaml").write_text(original)
        assert c.post("/v1/policy/reload").status_code == 200
        m = c.get("/metrics").text
        assert 'spotstop_policy_reloads_total{result="ok",trigger="http"} 2.0' in m
        assert 'spotstop_policy_reloads_total{result="refused",trigger="http"} 2.0' in m


# ------------------------------------------------------------------------------- metrics


def test_metrics_count_decisions_fail_closed_stages_and_queue(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, warmup=False)
    g = load_guard(settings)
    with live_server(settings, g) as srv, srv.client() as c:
        assert c.post("/v1/check", **multipart(jpeg())).status_code == 200
        stand_in(g, error=RuntimeError("simulated member fault"))
        d = c.post("/v1/check", **multipart(jpeg(1))).json()
        assert d["label"] == "UNSAFE" and d["fail_closed"]
        assert reason_kind(d["fail_reason"]) == "member_error"
        c.post("/v1/check", **multipart(b""))
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        m = r.text
    assert 'spotstop_fail_closed_total{reason="member_error"} 1.0' in m
    assert 'spotstop_decisions_total{label="UNSAFE",policy="situation' in m
    assert 'spotstop_input_refused_total{code="image_empty"} 1.0' in m
    for stage in ("parse", "queue_wait", "score_tiny-qwen3_5_scene", "decide", "log", "total"):
        assert f'spotstop_stage_seconds_count{{stage="{stage}"}}' in m, stage
    assert "spotstop_queue_depth 0.0" in m and "spotstop_queue_capacity 32.0" in m
    assert 'spotstop_http_request_seconds_count{route="/v1/check",status="200"}' in m
    assert 'spotstop_bundle_info{bundle_id="' in m


def test_reason_kinds():
    assert reason_kind("input: RequestError: x") == "input"
    assert reason_kind("member a unavailable: load: OSError") == "member_unavailable"
    assert reason_kind("deadline exceeded: scoring took longer than 1 s") == "deadline"
    assert reason_kind("member a produced a non-finite score (nan)") == "non_finite"
    assert reason_kind("member a (scene): RuntimeError: x") == "member_error"
    assert reason_kind("decision log: LogError: x") == "log"
    assert reason_kind("policy: x") == "policy" and reason_kind(None) == "other"


# ----------------------------------------------------------------------- queue & deadline


def test_full_queue_answers_503_with_retry_after_not_timeouts(bundle: Path, tmp_path: Path):
    settings = settings_for(
        bundle, tmp_path, queue_size=2, max_batch=2, deadline_s=None, warmup=False
    )
    g = stand_in(load_guard(settings))
    # The first check holds the model thread until the test lets it go. Two requests are
    # admitted (the held one and one waiting: queue_size 2); each of the six others must be
    # answered while the model thread is still held, i.e. refused at once, not after waiting
    # for a place. An order of events, not a time: arrival timing on a loaded machine
    # changes nothing.
    real = g.check_batch
    held, release = threading.Event(), threading.Event()

    def hold_first(scenes: Any, **kw: Any) -> Any:
        if not held.is_set():
            held.set()
            release.wait(60)
        return real(scenes, **kw)

    g.check_batch = hold_first  # type: ignore[method-assign]
    n, admitted = 8, settings.queue_size
    with live_server(settings, g) as srv:

        def one(i: int) -> tuple[int, dict[str, str]]:
            with srv.client(timeout=60.0) as c:
                r = c.post("/v1/check", **multipart(jpeg(i)))
            return r.status_code, dict(r.headers)

        with ThreadPoolExecutor(n) as ex:
            futures = [ex.submit(one, i) for i in range(n)]
            try:
                t0 = time.monotonic()
                while sum(f.done() for f in futures) < n - admitted and time.monotonic() - t0 < 30:
                    time.sleep(0.02)
                while_held = [f.result() for f in futures if f.done()]
            finally:
                release.set()
            results = [f.result() for f in futures]
        with srv.client() as c:
            m = c.get("/metrics").text
        n_logged = srv.guard.log.count()
    assert held.is_set()
    assert [s for s, _ in while_held] == [503] * (n - admitted)  # refused while held
    codes = [s for s, _ in results]
    assert sorted(codes) == [200] * admitted + [503] * (n - admitted)
    for status, headers in results:
        if status == 503:
            assert int(headers["retry-after"]) >= 1
    assert n_logged == admitted
    assert 'spotstop_queue_rejected_total{reason="queue_full"}' in m


def test_deadline_spent_in_queue_is_503_and_overrun_fails_closed(bundle: Path, tmp_path: Path):
    settings = settings_for(
        bundle, tmp_path, queue_size=8, max_batch=8, deadline_s=0.3, warmup=False
    )
    g = stand_in(load_guard(settings), delay_s=0.2)  # two members: 0.4 s > deadline
    # The first check also holds the model thread for 1 s before scoring, so every other
    # request surely waits past its 0.3 s deadline in the queue (without this the test
    # depended on sub-second arrival timing and flaked on a loaded machine).
    real = g.check_batch
    first = threading.Event()

    def hold_first(scenes: Any, **kw: Any) -> Any:
        if not first.is_set():
            first.set()
            time.sleep(1.0)
        return real(scenes, **kw)

    g.check_batch = hold_first  # type: ignore[method-assign]
    with live_server(settings, g) as srv:

        def one(i: int) -> httpx.Response:
            with srv.client(timeout=10.0) as c:
                return c.post("/v1/check", **multipart(jpeg(i)))

        with ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(one, range(4)))
    ok = [r.json() for r in rs if r.status_code == 200]
    late = [r.json() for r in rs if r.status_code == 503]
    assert ok and all(d["label"] == "UNSAFE" and d["fail_closed"] for d in ok)
    assert all(reason_kind(d["fail_reason"]) == "deadline" for d in ok)
    assert late and all(x["code"] == "deadline_exceeded_in_queue" for x in late)
    assert len(ok) + len(late) == 4


def test_load_8_clients_no_5xx_and_no_decision_lost(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, queue_size=64, warmup=False)
    g = stand_in(load_guard(settings))
    n_clients, n_each = 8, 50
    imgs = [jpeg(i) for i in range(16)]
    with live_server(settings, g) as srv:

        def worker(k: int) -> list[tuple[int, str | None]]:
            out = []
            with srv.client(timeout=30.0) as c:
                for j in range(n_each):
                    kw = multipart if j % 2 else as_json
                    r = c.post("/v1/check", **kw(imgs[(k + j) % 16], situation_id=f"s{k % 3}"))
                    out.append((r.status_code, r.json().get("decision_id")))
            return out

        with ThreadPoolExecutor(n_clients) as ex:
            results = [x for chunk in ex.map(worker, range(n_clients)) for x in chunk]
    assert len(results) == n_clients * n_each
    assert all(status == 200 for status, _ in results), {s for s, _ in results}
    ids = [i for _, i in results]
    assert len(set(ids)) == len(ids)
    with DecisionLog(settings.log) as lg:  # type: ignore[arg-type]
        assert lg.count() == len(ids)
        assert all(lg.get(i) is not None for i in ids)


@pytest.mark.slow
def test_load_real_models_8x200(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, queue_size=64, deadline_s=None)
    with live_server(settings) as srv:

        def worker(k: int) -> list[tuple[int, str]]:
            with srv.client(timeout=120.0) as c:
                return [
                    (r.status_code, r.json()["decision_id"])
                    for r in (
                        c.post("/v1/check", **multipart(jpeg(k * 1000 + j))) for j in range(200)
                    )
                ]

        with ThreadPoolExecutor(8) as ex:
            results = [x for chunk in ex.map(worker, range(8)) for x in chunk]
    assert all(s == 200 for s, _ in results)
    with DecisionLog(settings.log) as lg:  # type: ignore[arg-type]
        assert lg.count() == 1600 and all(lg.get(i) for _, i in results)


# ---------------------------------------------------------------------------------- auth


def test_non_loopback_without_token_refuses_to_start(bundle: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SPOTSTOP_TOKEN", raising=False)
    for host in ("0.0.0.0", "192.168.1.20", "::", "robot.local"):
        with pytest.raises(InsecureBindError, match="without a bearer token"):
            ServeSettings(bundle=bundle, host=host)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert ServeSettings(bundle=bundle, host=host).loopback
    assert ServeSettings(bundle=bundle, host="0.0.0.0", token=TOKEN).auth
    with pytest.raises(SettingsError, match="at least 16"):
        ServeSettings(bundle=bundle, token="short")
    assert TOKEN not in repr(ServeSettings(bundle=bundle, host="0.0.0.0", token=TOKEN))


def test_token_from_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    monkeypatch.setenv("SPOTSTOP_TOKEN", "from-env-0123456789abcdef")
    assert resolve_token(f) == TOKEN
    assert resolve_token(None) == "from-env-0123456789abcdef"
    monkeypatch.delenv("SPOTSTOP_TOKEN")
    assert resolve_token(None) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="empty"):
        resolve_token(tmp_path / "empty")
    with pytest.raises(SettingsError, match="cannot be read"):
        resolve_token(tmp_path / "missing")
    # a file saved as "UTF-8 with BOM": the token was refused as not printable ASCII
    f.write_text(TOKEN + "\n", encoding="utf-8-sig")
    assert resolve_token(f) == TOKEN
    assert ServeSettings(bundle=tmp_path, host="0.0.0.0", token=resolve_token(f)).auth


def test_wrong_or_missing_token_is_401(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, token=TOKEN, warmup=False)
    with live_server(settings) as srv, srv.client() as c:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": f"Bearer {TOKEN}x"},
        ):
            for method, path in (
                ("POST", "/v1/check"),
                ("GET", "/metrics"),
                ("GET", "/v1/situations/a"),
                ("POST", "/v1/labels"),
                ("POST", "/v1/policy/reload"),
            ):
                r = c.request(method, path, headers=headers)
                assert r.status_code == 401, (headers, path)
                assert r.json()["code"] == "unauthorized"
                assert r.headers["www-authenticate"].startswith("Bearer")
        assert srv.guard.log.count() == 0
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/v1/check", headers=ok, **multipart(jpeg())).status_code == 200
        assert c.get("/metrics", headers=ok).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        spec = c.get("/openapi.json").json()
        assert "HTTPBearer" in spec["components"]["securitySchemes"]


# -------------------------------------------------------------------------------- client


def test_client_check_matches_the_server_and_the_log(live: Live):
    img = jpeg(42)
    with GuardClient(live.url, timeout_s=30) as gc:
        assert gc.healthy() and gc.ready()
        d = gc.check(Scene(img, "water the plant", "garden"))
        assert not d.fail_closed and d.decision_id and d.situation_id == "garden"
        rec = live.guard.log.get(d.decision_id)
        assert rec is not None and rec.label == d.label
        assert d.fused_score == pytest.approx(rec.fused_score)
        [a, b] = gc.check_batch([Scene(img, "a"), Scene(jpeg(43), "b", "garden")])
        assert a.decision_id != b.decision_id and b.situation_id == "garden"
        assert gc.set_labels([(d.decision_id, "safe", None, "bob")]) == 1
        with pytest.raises(SidecarHTTPError) as e:
            gc.set_labels([("no-such-id", "safe", None, None)])
        assert e.value.status == 422 and e.value.field == "labels[0].decision_id"
        assert gc.situation("garden")["n_references"] >= 1
        assert gc.reload_policy()["policy"] == "situation"
        bad = gc.check(Scene(b"not an image", "x"))
        assert bad.label == "UNSAFE" and bad.fail_closed and bad.decision_id == ""
        assert "422" in (bad.fail_reason or "") and "field image" in (bad.fail_reason or "")
        missing = gc.check(Scene(Path("/no/such/file.jpg"), "x"))
        assert missing.fail_closed and "does not exist" in (missing.fail_reason or "")


def test_client_trusts_a_reply_only_for_the_scenes_it_sent(live: Live):
    """A reply must name each scene's request, situation and image (sha256 of the bytes sent),
    in order, each with its own decision id: a stale, misrouted or reordered SAFE is UNSAFE."""
    water, knife = Scene(jpeg(5), "water the plant\r\n  ", "garden"), Scene(jpeg(6), "ünï ✓")
    with GuardClient(live.url, timeout_s=30) as gc:  # the real sidecar: its rows bind
        a = gc.check(water)
        b, c = gc.check_batch([knife, water])
    assert not any(d.fail_closed for d in (a, b, c)), [d.fail_reason for d in (a, b, c)]
    assert (a.request, b.request, c.request) == (water.request, knife.request, water.request)
    rows = {d.request: d.to_dict() for d in (a, b)}
    for r in rows.values():  # the test can pass SAFE: every row reads as SAFE by the rule
        r.update(label="SAFE", policy_score=-1.0, threshold=0.0)

    def replying(single: dict[str, Any], batch: list[dict[str, Any]]) -> GuardClient:
        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/check":
                return httpx.Response(200, json=single)
            return httpx.Response(200, json={"decisions": batch})

        return GuardClient("http://sidecar", transport=httpx.MockTransport(handler))

    w, k = rows[water.request], rows[knife.request]
    with replying(w, [k, w]) as gc:  # control: the right rows are trusted
        assert gc.check(water).label == "SAFE"
    with replying(w, [k, w]) as gc:  # (a client refuses a decision id it was already given)
        assert [d.label for d in gc.check_batch([knife, water])] == ["SAFE", "SAFE"]
    other_image = {**w, "image_sha256": k["image_sha256"]}
    other_sid = {**w, "situation_id": None}
    no_image = {**w, "image_sha256": None}
    cases = [
        (w, [w, k], "row 0 is for the request"),  # reordered
        (k, [k, {**k, "decision_id": "other"}], "row 1 is for the request"),  # misrouted
        (other_image, [k, {**w, "decision_id": k["decision_id"]}], "same decision_id"),
        (other_sid, [k, other_sid], "situation"),
        (no_image, [k, no_image], "image with sha256 None"),
    ]
    for single, batch, why in cases:
        with replying(single, batch) as gc:
            d = gc.check(water) if single is not w else gc.check(knife)
            assert d.label == "UNSAFE" and d.fail_closed
            assert "not for the scenes sent" in (d.fail_reason or ""), d.fail_reason
            ds = gc.check_batch([knife, water])
            assert all(x.label == "UNSAFE" and x.fail_closed for x in ds)
            assert why in (ds[0].fail_reason or ""), ds[0].fail_reason


def test_client_fails_closed_on_timeout_connection_error_and_5xx(bundle: Path, tmp_path: Path):
    # connection refused: a port nobody listens on
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with GuardClient(f"http://127.0.0.1:{port}", timeout_s=1.0) as gc:
        d = gc.check(Scene(jpeg(), "x"))
        assert d.label == "UNSAFE" and d.fail_closed and "unreachable" in (d.fail_reason or "")
        assert not gc.healthy()
        assert [
            x.fail_closed for x in gc.check_batch([Scene(jpeg(), "a"), Scene(jpeg(), "b")])
        ] == [True, True]
    settings = settings_for(
        bundle, tmp_path, queue_size=1, max_batch=1, deadline_s=None, warmup=False
    )
    g = stand_in(load_guard(settings), delay_s=0.4)
    with live_server(settings, g) as srv:
        with GuardClient(srv.url, timeout_s=0.3) as gc:
            t = time.monotonic()
            d = gc.check(Scene(jpeg(), "x"))
            assert time.monotonic() - t < 2.0
            assert d.label == "UNSAFE" and d.fail_closed and "timeout" in (d.fail_reason or "")
        time.sleep(0.9)  # let the abandoned check finish
        with GuardClient(srv.url, timeout_s=5.0) as slow, ThreadPoolExecutor(3) as ex:
            ds = list(ex.map(lambda i: slow.check(Scene(jpeg(i), "x")), range(3)))
        refused = [d for d in ds if d.decision_id == ""]
        assert refused and all(
            "503" in (d.fail_reason or "") and d.label == "UNSAFE" for d in refused
        )

    def boom(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/check":
            return httpx.Response(500, text="oops")
        return httpx.Response(200, json={"label": "SAFE"})  # a malformed decision

    with GuardClient("http://sidecar", transport=httpx.MockTransport(boom)) as gc:
        d = gc.check(Scene(jpeg(), "x"))
        assert d.label == "UNSAFE" and d.fail_closed and "500" in (d.fail_reason or "")
        [d] = gc.check_batch([Scene(jpeg(), "x")])
        assert d.label == "UNSAFE" and "malformed" in (d.fail_reason or "")


@pytest.mark.parametrize("bad", [0, -1.0, 3601, float("nan"), float("inf"), None, True, "2"])
def test_client_refuses_a_timeout_the_sidecar_would_refuse(bad: object):
    """Past 3600 s the sidecar refuses the budget header (422): every check failed closed."""
    from spotstop.guard import GuardError

    with pytest.raises(GuardError, match=r"timeout_s must be a number of seconds in \(0, 3600\]"):
        GuardClient("http://sidecar", timeout_s=bad)  # type: ignore[arg-type]
    assert GuardClient("http://sidecar", timeout_s=3600).timeout_s == 3600.0


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("127.0.0.1:8750", "not an http(s) URL with a host"),
        ("localhost", "not an http(s) URL with a host"),
        ("ftp://sidecar", "not an http(s) URL with a host"),
        ("http://", "not an http(s) URL with a host"),
        ("http://[::1", "is not a URL"),
        (8750, "must be the sidecar's URL"),
    ],
)
def test_client_refuses_a_url_it_cannot_reach_the_sidecar_by(bad: object, why: str):
    """``127.0.0.1:8750`` (no scheme) was taken, and every check then failed closed with a
    protocol error; ``http://[::1`` raised httpx's InvalidURL. Both are refused by name."""
    from spotstop.guard import GuardError

    with pytest.raises(GuardError, match=re.escape(why)) as e:
        GuardClient(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(e.value) and "http://127.0.0.1:8750" in str(e.value)
    for good in ("http://127.0.0.1:8750/", "https://robot.local:8750", "http://[::1]:8750"):
        with GuardClient(good) as gc:
            assert gc.base_url == good.rstrip("/")


def test_client_never_trusts_safe_with_fail_closed():
    from spotstop.guard.client import decision_from_dict

    body = {
        "decision_id": "x",
        "request": "open the door",
        "label": "SAFE",
        "fused_score": None,
        "threshold": 0.1,
        "policy": "frozen",
        "member_scores": {"a": None},
        "fail_closed": True,
        "fail_reason": "?",
        "latency_ms": {},
        "bundle_id": "b",
        "prompt_hash": "p",
        "situation_id": None,
    }
    d = decision_from_dict(body)
    assert d.label == "UNSAFE" and np.isnan(d.fused_score) and np.isnan(d.member_scores["a"])


@pytest.mark.parametrize(
    ("scene", "why"),
    [
        (Scene(jpeg(), "open \ud800 door"), "request is not valid text"),
        (Scene(jpeg(), b"open the door"), "request must be a string; got bytes"),  # type: ignore[arg-type]
        (Scene(jpeg(), None), "request must be a string; got NoneType"),  # type: ignore[arg-type]
        (Scene(jpeg(), "open", "hall \udc80"), "situation_id is not valid text"),
        (Scene(jpeg(), "open", 7), "situation_id must be a string or None; got int"),  # type: ignore[arg-type]
        (Scene("cam\x00.jpg", "open"), "ValueError"),
        (Scene("cam\ud800.jpg", "open"), "UnicodeEncodeError"),
    ],
)
def test_client_fails_closed_on_a_scene_it_cannot_send(scene: Scene, why: str):
    sent: list[httpx.Request] = []

    def never(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500, text="the client should not have sent this")

    with GuardClient("http://sidecar", transport=httpx.MockTransport(never)) as gc:
        d = gc.check(scene)
        assert d.label == "UNSAFE" and d.fail_closed and d.decision_id == ""
        assert d.policy == "client" and why in (d.fail_reason or ""), d.fail_reason
        # one bad scene and the batch is not sent: every scene fails closed, naming it
        out = gc.check_batch([Scene(jpeg(), "water the plant"), scene])
        assert [x.label for x in out] == ["UNSAFE", "UNSAFE"]
        for x in out:
            assert x.fail_closed and x.decision_id == "" and x.policy == "client"
            assert "scene 1" in (x.fail_reason or "") and why in (x.fail_reason or "")
    assert sent == []


def test_client_fails_closed_on_any_fault_while_talking_to_the_sidecar():
    def raising(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("transport broke")

    def deep(request: httpx.Request) -> httpx.Response:
        status = 200 if request.url.path.startswith("/v1/check") else 500
        return httpx.Response(
            status, content=b"[" * 100_000, headers={"content-type": "application/json"}
        )

    for handler, why in [(raising, "RuntimeError: transport broke"), (deep, "RecursionError")]:
        with GuardClient("http://sidecar", transport=httpx.MockTransport(handler)) as gc:
            d = gc.check(Scene(jpeg(), "open the door"))
            assert d.label == "UNSAFE" and d.fail_closed and why in (d.fail_reason or "")
            out = gc.check_batch([Scene(jpeg(), "a"), Scene(jpeg(), "b")])
            assert [x.label for x in out] == ["UNSAFE", "UNSAFE"]
            assert all(x.fail_closed and why in (x.fail_reason or "") for x in out)

    def error_reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            500, content=b"[" * 100_000, headers={"content-type": "application/json"}
        )

    with GuardClient("http://sidecar", transport=httpx.MockTransport(error_reply)) as gc:
        d = gc.check(Scene(jpeg(), "open the door"))
        assert d.label == "UNSAFE" and d.fail_closed and "500" in (d.fail_reason or "")


def test_client_check_batch_takes_any_iterable_of_scenes():
    def boom(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="oops")

    with GuardClient("http://sidecar", transport=httpx.MockTransport(boom)) as gc:
        out = gc.check_batch(Scene(jpeg(i), "x", f"s{i}") for i in range(2))  # type: ignore[arg-type]
        assert [(x.label, x.situation_id) for x in out] == [("UNSAFE", "s0"), ("UNSAFE", "s1")]
        assert all("500" in (x.fail_reason or "") for x in out)


# ------------------------------------------------------------------------ CLI and SIGHUP


def test_cli_refuses_insecure_bind_before_loading(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from spotstop import cli

    monkeypatch.delenv("SPOTSTOP_TOKEN", raising=False)
    monkeypatch.setattr(
        "spotstop.guard.serve.load_guard", lambda *_: pytest.fail("loaded the bundle")
    )
    assert cli.main(["serve", "--bundle", str(bundle), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "InsecureBindError" in err and "SPOTSTOP_TOKEN" in err
    assert cli.main(["serve", "--bundle", str(bundle), "--queue-size", "0"]) == 2
    assert "queue_size must be a positive integer" in capsys.readouterr().err
    assert cli.main(["serve", "--bundle", str(bundle / "nope")]) == 2
    assert "not a bundle" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_sighup_reloads_the_policy(bundle: Path, tmp_path: Path):
    """The server runs in the main thread (signal handlers need it); a helper thread talks."""
    import asyncio

    settings = settings_for(bundle, tmp_path, warmup=False)
    app = create_app(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    seen: dict[str, str] = {}
    before = signal.getsignal(signal.SIGHUP)

    def drive() -> None:
        try:
            while not server.started:
                time.sleep(0.02)
            with httpx.Client(base_url=url, timeout=10) as c:
                assert c.post("/v1/check", **multipart(jpeg())).status_code == 200
                os.kill(os.getpid(), signal.SIGHUP)
                t0 = time.monotonic()
                while time.monotonic() - t0 < 10:
                    seen["metrics"] = c.get("/metrics").text
                    if 'trigger="sighup"' in seen["metrics"]:
                        break
                    time.sleep(0.05)
        finally:
            server.should_exit = True

    helper = threading.Thread(target=drive)
    helper.start()
    asyncio.run(server.serve(sockets=[sock]))
    helper.join()
    sock.close()
    assert 'spotstop_policy_reloads_total{result="ok",trigger="sighup"} 1.0' in seen["metrics"]
    assert signal.getsignal(signal.SIGHUP) == before  # handler removed, the previous one back


def test_cli_serve_subprocess_sighup_and_sigterm(bundle: Path, tmp_path: Path):
    with serve_process(bundle, tmp_path) as (url, proc):
        with httpx.Client(base_url=url, timeout=5) as c:
            assert c.post("/v1/check", **multipart(jpeg())).status_code == 200
            proc.send_signal(signal.SIGHUP)
            t0 = time.monotonic()
            while 'trigger="sighup"} 1.0' not in c.get("/metrics").text:
                assert time.monotonic() - t0 < 10, "SIGHUP did not reload"
                time.sleep(0.05)
            assert proc.poll() is None  # SIGHUP did not kill it
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises SIGTERM
        assert proc.wait(30) in (0, -signal.SIGTERM)
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        assert lg.count() == 1


def test_json_response_is_json_safe(client: httpx.Client):
    r = client.post("/v1/check", **multipart(jpeg(7)))
    json.loads(r.text)  # no NaN/Infinity tokens
    assert "NaN" not in r.text


def test_png_and_webp_uploads_are_accepted(client: httpx.Client):
    for fmt in ("PNG", "WEBP"):
        buf = io.BytesIO()
        image = Image.new("RGB", (64, 40), (200, 10, 10))
        image.paste((20, 30, 220), (0, 0, 32, 40))  # two halves (one colour shows nothing)
        image.save(buf, fmt)
        r = client.post("/v1/check", **multipart(buf.getvalue()))
        assert r.status_code == 200, r.text


def test_unexpected_server_fault_is_a_json_500_and_the_client_fails_closed(
    bundle: Path, tmp_path: Path
):
    settings = settings_for(bundle, tmp_path, warmup=False)
    g = load_guard(settings)
    real = g.check_batch

    def broken(scenes: Any, **kw: Any) -> Any:
        if scenes[0].request == "boom":
            raise RuntimeError("simulated bug")
        return real(scenes, **kw)

    g.check_batch = broken  # type: ignore[method-assign]
    with live_server(settings, g) as srv, srv.client() as c:
        r = c.post("/v1/check", **multipart(jpeg(), request="boom"))
        assert r.status_code == 500 and r.json()["code"] == "internal_error"
        with GuardClient(srv.url, timeout_s=10) as gc:
            d = gc.check(Scene(jpeg(), "boom"))
            assert d.label == "UNSAFE" and d.fail_closed and "500" in (d.fail_reason or "")
        assert c.post("/v1/check", **multipart(jpeg())).status_code == 200


def test_threads_setting_is_validated(tmp_path: Path) -> None:
    from spotstop.guard.serve import ServeSettings
    from spotstop.guard.serve._errors import SettingsError

    with pytest.raises(SettingsError, match="threads"):
        ServeSettings(bundle=tmp_path, threads=0)
    assert ServeSettings(bundle=tmp_path, threads=1).threads == 1
