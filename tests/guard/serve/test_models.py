"""The sidecar's JSON bodies are pydantic models that FastAPI validates and documents.

* every model refuses an unknown key, a wrong type and a value out of its range with the
  sidecar's own error body (``code``, ``message``, ``field``, ``errors``; never FastAPI's
  ``detail``), naming the field, and makes no decision;
* the strict JSON text rules (duplicate keys, ``NaN``), the 415 and the token still come
  before the model, and a scenes route takes its queue place before its body is read;
* ``/openapi.json`` states the models' own schemas (plus this server's limits), and the
  response's decision is field for field :class:`~spotstop.guard.DecisionRecord`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from spotstop.guard import DecisionRecord  # noqa: E402
from spotstop.guard._record import json_field_types  # noqa: E402
from spotstop.guard._types import BUDGET_HEADER  # noqa: E402
from spotstop.guard.serve import load_guard  # noqa: E402
from spotstop.guard.serve._errors import input_error  # noqa: E402
from spotstop.guard.serve._schemas import (  # noqa: E402
    BatchRequest,
    CheckJSON,
    DecisionOut,
    LabelItem,
    LabelsRequest,
)

from tests._support.serve import (  # noqa: E402
    TOKEN,
    Live,
    jpeg,
    live_server,
    settings_for,
    stand_in,
)

MAX_BATCH, MAX_LABELS, MAX_SITUATION = 2, 3, 12


@pytest.fixture(scope="module")
def bundle(runtime_bundle: Path) -> Path:
    return runtime_bundle


@pytest.fixture(scope="module")
def live(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    s = settings_for(
        bundle,
        tmp_path_factory.mktemp("models"),
        warmup=False,
        max_batch=MAX_BATCH,
        max_labels=MAX_LABELS,
        max_situation_chars=MAX_SITUATION,
    )
    with live_server(s, stand_in(load_guard(s))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live: Live) -> Iterator[httpx.Client]:
    with live.client() as c:
        yield c


B64 = base64.b64encode(jpeg()).decode()


def scene(**kw: Any) -> dict[str, Any]:
    return {"image_base64": B64, "request": "open the door", **kw}


def label(**kw: Any) -> dict[str, Any]:
    return {"decision_id": "d" * 32, "label": "safe", **kw}


# (id, path, json body, code, field): each model × unknown key / wrong type / out of range
_REFUSED: list[tuple[str, str, Any, str, str]] = [
    # CheckJSON, on /v1/check
    ("check-unknown", "/v1/check", scene(robot="r2"), "extra_field", "robot"),
    ("check-type-image", "/v1/check", scene(image_base64=5), "wrong_type", "image_base64"),
    ("check-type-request", "/v1/check", scene(request=["a"]), "wrong_type", "request"),
    ("check-type-sid", "/v1/check", scene(situation_id=3), "wrong_type", "situation_id"),
    ("check-coerce", "/v1/check", scene(situation_id=True), "wrong_type", "situation_id"),
    ("check-missing", "/v1/check", {"image_base64": B64}, "missing_field", "request"),
    ("check-image-empty", "/v1/check", scene(image_base64=""), "invalid_value", "image_base64"),
    ("check-request-blank", "/v1/check", scene(request=" \t"), "empty_field", "request"),
    ("check-request-empty", "/v1/check", scene(request=""), "empty_field", "request"),
    ("check-request-unseen", "/v1/check", scene(request="\ufeff\u200b"), "empty_field", "request"),
    ("check-sid-blank", "/v1/check", scene(situation_id="  "), "empty_field", "situation_id"),
    (
        "check-sid-control",
        "/v1/check",
        scene(situation_id="a\x85"),
        "invalid_value",
        "situation_id",
    ),
    ("check-sid-long", "/v1/check", scene(situation_id="s" * 13), "text_too_long", "situation_id"),
    ("check-request-long", "/v1/check", scene(request="x" * 4001), "text_too_long", "request"),
    ("check-not-object", "/v1/check", "scene", "wrong_type", "body"),
    # BatchRequest (and CheckJSON inside it), on /v1/check/batch
    ("batch-unknown", "/v1/check/batch", {"scenes": [scene()], "x": 1}, "extra_field", "x"),
    (
        "batch-unknown-in-scene",
        "/v1/check/batch",
        {"scenes": [scene(), scene(robot="r2")]},
        "extra_field",
        "scenes[1].robot",
    ),
    ("batch-type", "/v1/check/batch", {"scenes": scene()}, "wrong_type", "scenes"),
    ("batch-type-item", "/v1/check/batch", {"scenes": ["a"]}, "wrong_type", "scenes[0]"),
    ("batch-empty", "/v1/check/batch", {"scenes": []}, "invalid_value", "scenes"),
    ("batch-missing", "/v1/check/batch", {}, "missing_field", "scenes"),
    ("batch-not-object", "/v1/check/batch", [scene()], "wrong_type", "body"),
    (
        "batch-too-many",
        "/v1/check/batch",
        {"scenes": [scene()] * (MAX_BATCH + 1)},
        "too_many_scenes",
        "scenes",
    ),
    (
        "batch-sid-control",
        "/v1/check/batch",
        {"scenes": [scene(situation_id="a\x01")]},
        "invalid_value",
        "scenes[0].situation_id",
    ),
    (
        "batch-request-long",
        "/v1/check/batch",
        {"scenes": [scene(), scene(request="x" * 4001)]},
        "text_too_long",
        "scenes[1].request",
    ),
    # LabelsRequest and LabelItem, on /v1/labels
    ("labels-unknown", "/v1/labels", {"labels": [label()], "x": 1}, "extra_field", "x"),
    (
        "labels-unknown-in-item",
        "/v1/labels",
        {"labels": [label(note="n")]},
        "extra_field",
        "labels[0].note",
    ),
    ("labels-type", "/v1/labels", {"labels": label()}, "wrong_type", "labels"),
    (
        "labels-type-id",
        "/v1/labels",
        {"labels": [label(decision_id=7)]},
        "wrong_type",
        "labels[0].decision_id",
    ),
    (
        "labels-label",
        "/v1/labels",
        {"labels": [label(label="SAFE")]},
        "invalid_value",
        "labels[0].label",
    ),
    ("labels-empty", "/v1/labels", {"labels": []}, "invalid_value", "labels"),
    (
        "labels-id-empty",
        "/v1/labels",
        {"labels": [label(decision_id="")]},
        "invalid_value",
        "labels[0].decision_id",
    ),
    (
        "labels-id-long",
        "/v1/labels",
        {"labels": [label(decision_id="d" * 129)]},
        "invalid_value",
        "labels[0].decision_id",
    ),
    (
        "labels-contrast-long",
        "/v1/labels",
        {"labels": [label(contrast_id="c" * 257)]},
        "invalid_value",
        "labels[0].contrast_id",
    ),
    (
        "labels-too-many",
        "/v1/labels",
        {"labels": [label(decision_id=str(i)) for i in range(MAX_LABELS + 1)]},
        "too_many_labels",
        "labels",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "code", "field"),
    [pytest.param(p, b, c, f, id=i) for i, p, b, c, f in _REFUSED],
)
def test_each_model_refuses_with_the_sidecars_error_body_naming_the_field(
    client: httpx.Client, live: Live, path: str, body: Any, code: str, field: str
) -> None:
    before = live.guard.log.count()
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    got = r.json()
    assert set(got) == {"code", "message", "field", "errors"}, got  # not FastAPI's {"detail"}
    assert (got["code"], got["field"]) == (code, field), got
    assert field in got["message"] or field == "body", got
    assert got["errors"] and got["errors"][0]["field"] == field, got
    assert all(set(e) == {"field", "message", "type"} for e in got["errors"]), got
    assert B64 not in r.text  # the refused values are never echoed
    assert live.guard.log.count() == before  # no decision was made


def test_header_and_path_errors_have_the_same_body(client: httpx.Client, live: Live) -> None:
    before = live.guard.log.count()
    for bad in ("abc", "0", "-1", "nan", "inf"):
        r = client.post("/v1/check/batch", json={"scenes": [scene()]}, headers={BUDGET_HEADER: bad})
        assert r.status_code == 422, (bad, r.text)
        assert (r.json()["code"], r.json()["field"]) == ("invalid_value", BUDGET_HEADER), r.text
    r = client.post("/v1/check/batch", json={"scenes": [scene(situation_id="room/3")]})
    assert r.status_code == 200, r.text  # an id with "/" is an id, and can be looked up
    for path in ("room/3", "room%2F3"):
        looked = client.get(f"/v1/situations/{path}")
        assert looked.status_code == 200 and looked.json()["situation_id"] == "room/3", looked.text
    before = live.guard.log.count()
    for sid, code in (
        ("a%01b", "invalid_value"),
        ("%20%20", "empty_field"),
        ("s" * 13, "text_too_long"),
    ):
        r = client.get(f"/v1/situations/{sid}")
        assert r.status_code == 422, r.text
        assert (r.json()["code"], r.json()["field"]) == (code, "situation_id"), r.text
    assert live.guard.log.count() == before


def test_strict_json_and_media_type_come_before_the_model(client: httpx.Client, live: Live) -> None:
    before = live.guard.log.count()
    cases = [
        (b'{"scenes": [], "scenes": [1]}', "application/json", 422, "duplicate_field", "scenes"),
        (
            b'{"labels": [{"decision_id": "a", "label": NaN}]}',
            "application/json",
            422,
            "json_invalid",
            "body",
        ),
        (
            b'{"labels": [{"decision_id": "a\\udc00", "label": "safe"}]}',
            "application/json",
            422,
            "invalid_unicode",
            "labels[0].decision_id",
        ),
        (b"", "application/json", 422, "body_missing", "body"),
        (b'{"labels": []}', "text/plain", 415, "unsupported_media_type", "Content-Type"),
        # an integer past Python's conversion limit (4300 digits) was a 500
        (b'{"x": ' + b"9" * 5000 + b"}", "application/json", 422, "json_invalid", "body"),
    ]
    for path in ("/v1/check/batch", "/v1/labels"):
        for content, ctype, status, code, field in cases:
            r = client.post(path, content=content, headers={"content-type": ctype})
            assert r.status_code == status, (path, content, r.text)
            assert (r.json()["code"], r.json()["field"]) == (code, field), (path, r.text)
    assert live.guard.log.count() == before


def test_valid_bodies_still_decide_and_label(client: httpx.Client, live: Live) -> None:
    r = client.post("/v1/check/batch", json={"scenes": [scene(situation_id="hall-2"), scene()]})
    assert r.status_code == 200, r.text
    ids = [d["decision_id"] for d in r.json()["decisions"]]
    assert all(live.guard.log.get(i) is not None for i in ids)
    r = client.post("/v1/labels", json={"labels": [label(decision_id=ids[0], label="unsafe")]})
    assert r.status_code == 200 and r.json() == {"written": 1}


def _raw(url: str, head: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(head.encode())
    return s


def _status(s: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1])


def test_a_typed_body_is_read_only_after_the_token_and_the_queue_place(
    bundle: Path, tmp_path: Path
) -> None:
    """FastAPI reads a model's body before it solves dependencies; the sidecar's route checks
    the token and takes the queue place first, so neither a caller without the token nor one
    past the queue makes the server hold a body."""
    s = settings_for(
        bundle, tmp_path, warmup=False, token=TOKEN, queue_size=1, max_batch=1, upload_timeout_s=60
    )
    head = (
        "POST /v1/check/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000\r\n{auth}\r\n"
    )
    with live_server(s, stand_in(load_guard(s))) as srv, contextlib.ExitStack() as open_:
        t = time.monotonic()
        no_token = open_.enter_context(_raw(srv.url, head.format(auth="")))  # the body never comes
        assert _status(no_token) == 401
        auth = f"Authorization: Bearer {TOKEN}\r\n"
        open_.enter_context(_raw(srv.url, head.format(auth=auth)))  # holds the only place
        ok = {"Authorization": f"Bearer {TOKEN}"}
        with srv.client() as c:
            while "spotstop_queue_depth 1.0" not in c.get("/metrics", headers=ok).text:
                assert time.monotonic() - t < 20, "the holder never took its place"
                time.sleep(0.05)
            r = c.post(
                "/v1/check/batch",
                json={"scenes": [scene()]},
                headers=ok,
            )
        assert r.status_code == 503 and r.json()["code"] == "queue_full", r.text
        assert time.monotonic() - t < 30  # answered at once, not after an upload timeout
        assert srv.guard.log.count() == 0


# ------------------------------------------------------------------------------- schema


#: Keys the comparison leaves out: the limits the app writes from its settings, and what
#: FastAPI's generator writes otherwise (it leaves out ``default: null`` and null examples).
_NOT_COMPARED = ("maxLength", "maxItems", "default", "examples")


def _without_limits(schema: Any) -> Any:
    """A schema without the keys the app writes from its settings (and :data:`_NOT_COMPARED`)."""
    if isinstance(schema, dict):
        return {k: _without_limits(v) for k, v in schema.items() if k not in _NOT_COMPARED}
    if isinstance(schema, list):
        return [_without_limits(v) for v in schema]
    return schema


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_openapi_request_bodies_are_the_models(client: httpx.Client, live: Live) -> None:
    spec = client.get("/openapi.json").json()
    comps = spec["components"]["schemas"]
    ref = "#/components/schemas/{model}"
    for model in (CheckJSON, BatchRequest, LabelItem, LabelsRequest, DecisionOut):
        own = model.model_json_schema(ref_template=ref)
        own.pop("$defs", None)
        assert _without_limits(comps[model.__name__]) == _without_limits(own), model.__name__
    paths = spec["paths"]
    for path, model in (("/v1/check/batch", BatchRequest), ("/v1/labels", LabelsRequest)):
        body = paths[path]["post"]["requestBody"]
        assert body["required"] is True
        assert body["content"] == {
            "application/json": {"schema": {"$ref": ref.format(model=model.__name__)}}
        }
    check = paths["/v1/check"]["post"]["requestBody"]["content"]
    assert check["application/json"]["schema"] == {"$ref": ref.format(model="CheckJSON")}
    assert check["multipart/form-data"]["schema"]["required"] == ["image", "request"]
    # this server's limits are written in
    assert comps["BatchRequest"]["properties"]["scenes"]["maxItems"] == MAX_BATCH
    assert comps["LabelsRequest"]["properties"]["labels"]["maxItems"] == MAX_LABELS
    sid = next(a for a in comps["CheckJSON"]["properties"]["situation_id"]["anyOf"] if "type" in a)
    assert sid["maxLength"] == MAX_SITUATION and sid["pattern"]
    # every route states its responses; a route that takes a body states it; no ref dangles
    for path, ops in paths.items():
        for method, op in ops.items():
            assert "200" in op["responses"], (method, path)
            if method == "post" and path != "/v1/policy/reload":
                assert op["requestBody"]["content"], (method, path)
            for code, resp in op["responses"].items():
                assert resp.get("content"), (method, path, code)
    for r in _refs(spec):
        assert r.removeprefix("#/components/schemas/") in comps, r
    assert "HTTPValidationError" not in comps  # the 422s are the sidecar's ErrorOut


def test_the_response_model_is_the_decision_record() -> None:
    fields = [f.name for f in dataclasses.fields(DecisionRecord)]
    assert list(DecisionOut.model_fields) == fields
    types = json_field_types()
    for name, info in DecisionOut.model_fields.items():
        assert info.annotation == types[name][0], name
        assert info.is_required(), name


def test_input_error_keeps_the_first_field_and_lists_every_error() -> None:
    e = input_error(
        [
            {"type": "extra_forbidden", "loc": ("body", "scenes", 0, "x"), "msg": "no"},
            {"type": "string_type", "loc": ("body", "scenes", 1, "request"), "msg": "str"},
            {"type": "missing", "loc": ("body",), "msg": "missing"},
        ]
    )
    assert (e.status, e.code, e.field) == (422, "extra_field", "scenes[0].x")
    assert [x["field"] for x in e.errors] == ["scenes[0].x", "scenes[1].request", "body"]
    assert "scenes[1].request" in e.message
    assert input_error([{"type": "missing", "loc": ("body",), "msg": "m"}]).code == "body_missing"
    header = input_error([{"type": "greater_than", "loc": ("header", BUDGET_HEADER), "msg": "m"}])
    assert (header.code, header.field) == ("invalid_value", BUDGET_HEADER)
