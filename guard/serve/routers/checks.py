"""``POST /v1/check`` and ``POST /v1/check/batch``: scenes in, logged decisions out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from spotstop.guard._record import Decision
from spotstop.guard._types import BUDGET_HEADER
from spotstop.guard.serve._errors import InputError
from spotstop.guard.serve._parse import (
    ParsedScene,
    caller_budget_s,
    parse_check_body,
    parse_json,
    require_json,
    scene_from_json,
    validate_model,
)
from spotstop.guard.serve._schemas import BatchOut, BatchRequest, DecisionOut
from spotstop.guard.serve._state import Sidecar, SidecarDep
from spotstop.guard.serve.routers._common import AUTH, INPUT, OVERLOAD
from starlette.concurrency import run_in_threadpool

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["checks"])

_MULTIPART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["image", "request"],
    "additionalProperties": False,
    "properties": {
        "image": {
            "type": "string",
            "format": "binary",
            "description": "The camera frame: a JPEG, PNG or WebP file upload.",
        },
        "request": {
            "type": "string",
            "minLength": 1,
            "description": "What the robot was asked to do (UTF-8).",
        },
        "situation_id": {
            "type": "string",
            "minLength": 1,
            "description": "Place/task of the scene, for situation recentering.",
        },
    },
}

#: The caller's budget header (GuardClient sends it), as the OpenAPI schema states it.
_BUDGET_PARAMETER: dict[str, Any] = {
    "name": BUDGET_HEADER,
    "in": "header",
    "required": False,
    "description": (
        "Seconds the caller waits for this answer, counted from its request. The request's "
        "deadline is the earlier of this and the sidecar's own; past it no decision is "
        "acknowledged (503) or a late one is a fail-closed UNSAFE, so the log never holds a "
        "SAFE the caller did not get."
    ),
    "schema": {"type": "number", "exclusiveMinimum": 0},
}

_CHECK_BODY: dict[str, Any] = {
    "parameters": [_BUDGET_PARAMETER],
    "requestBody": {
        "required": True,
        "description": "One scene, as multipart (a file upload) or as JSON (base64 image).",
        "content": {
            "multipart/form-data": {
                "schema": _MULTIPART_SCHEMA,
                "encoding": {"image": {"contentType": "image/jpeg, image/png, image/webp"}},
            },
            "application/json": {
                "schema": {"$ref": "#/components/schemas/CheckJSON"},
            },
        },
    },
}

_BATCH_BODY: dict[str, Any] = {
    "parameters": [_BUDGET_PARAMETER],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BatchRequest"}}},
    },
}


@router.post(
    "/check",
    summary="Judge one scene",
    response_model=DecisionOut,
    responses={**AUTH, **INPUT, **OVERLOAD},
    openapi_extra=_CHECK_BODY,
    description=(
        "Score the image and request with the bundle's members, fuse, apply the policy, log "
        "and return the Decision. A 200 is always a logged decision (its row is written before "
        "the answer); `label` is SAFE only when every stage finished within the deadline, "
        "otherwise UNSAFE with `fail_closed` and `fail_reason`. A 4xx means the input was "
        "refused and **no decision was made** (nothing logged); a 503 that none was "
        "acknowledged (queue full, deadline spent, or the log not written in time).\n\n"
        "Multipart: `curl -F image=@cam.jpg -F request='open the door' -F situation_id=hall-2 "
        'http://127.0.0.1:8750/v1/check`.\n\nJSON: `{"image_base64": ..., "request": ..., '
        '"situation_id": ...}`.'
    ),
)
async def check(request: Request, sidecar: SidecarDep) -> JSONResponse:
    [decision] = await _judge(request, sidecar, _parse_one)
    return JSONResponse(decision.to_dict())


async def _judge(
    request: Request,
    sidecar: Sidecar,
    parse: Callable[[bytes, str, Sidecar], list[ParsedScene]],
) -> list[Decision]:
    """Admit, read, parse, then decode and judge on the model thread.

    The request takes its queue place before its body is read (so waiting bodies, and the
    memory they hold, are bounded by the queue); its deadline starts once the body is in.
    """
    received = time.monotonic()  # the caller's budget runs from its request, upload included
    caller_s = caller_budget_s(request.headers.get(BUDGET_HEADER))
    ticket = sidecar.runner.reserve(1)
    try:
        body = await request.body()  # bounded by the upload timeout (middleware)
        arrived = time.monotonic()
        t = time.perf_counter()
        scenes = await run_in_threadpool(
            parse, body, request.headers.get("content-type", ""), sidecar
        )
        sidecar.metrics.stage.labels(stage="parse").observe(time.perf_counter() - t)
        return await sidecar.runner.check(
            scenes,
            arrived=arrived,
            ticket=ticket,
            limits=sidecar.limits,
            caller_due=None if caller_s is None else received + caller_s,
        )
    finally:
        if not ticket.handed_over:  # never reached the models: give the places back now
            ticket.release()


def _parse_one(body: bytes, content_type: str, sidecar: Sidecar) -> list[ParsedScene]:
    return [parse_check_body(body, content_type, sidecar.limits)]


def _parse_batch(body: bytes, content_type: str, sidecar: Sidecar) -> list[ParsedScene]:
    require_json(content_type)
    obj = parse_json(body)
    max_batch = sidecar.settings.max_batch
    if isinstance(obj, dict) and isinstance(obj.get("scenes"), list):
        n = len(obj["scenes"])
        if n > max_batch:
            raise InputError(
                f"scenes has {n} items; the limit is {max_batch} (max_batch). Split the batch.",
                field="scenes",
                code="too_many_scenes",
            )
    req = validate_model(BatchRequest, obj)
    return [
        scene_from_json(item, sidecar.limits, prefix=f"scenes[{i}].")
        for i, item in enumerate(req.scenes)
    ]


@router.post(
    "/check/batch",
    summary="Judge several scenes in one guard call",
    response_model=BatchOut,
    responses={**AUTH, **INPUT, **OVERLOAD},
    openapi_extra=_BATCH_BODY,
    description=(
        "All scenes are validated first; one bad scene refuses the whole batch with a 422 "
        "naming it (e.g. `scenes[2].image_base64`) and no decision is made. Valid batches "
        "are judged in one guard call (one model batch per member; the `batch` policy cuts "
        "at this batch's mean) and every decision is logged."
    ),
)
async def check_batch(request: Request, sidecar: SidecarDep) -> JSONResponse:
    decisions = await _judge(request, sidecar, _parse_batch)
    return JSONResponse({"decisions": [d.to_dict() for d in decisions]})
