"""``POST /v1/check`` and ``POST /v1/check/batch``: scenes in, logged decisions out.

Both are :class:`~spotstop.guard.serve._route.ScenesRoute`\\ s: the request takes its queue
place before its body is read. The batch's body is the :class:`BatchRequest` model, which
FastAPI validates and documents. ``/v1/check`` takes one scene as JSON (the
:class:`CheckJSON` model, validated here because the same route also takes a multipart form)
or as a multipart form (parsed by hand: :func:`~spotstop.guard.serve._parse.scene_from_multipart`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from spotstop.guard._call import MAX_DEADLINE_S
from spotstop.guard._record import Decision
from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER
from spotstop.guard.serve._errors import InputError, UnsupportedMediaType, input_error
from spotstop.guard.serve._parse import (
    SITUATION_ID_PATTERN,
    Limits,
    ParsedScene,
    is_json,
    media_type,
    parse_json,
    scene_from_json,
    scene_from_multipart,
)
from spotstop.guard.serve._route import Admission, AdmissionDep, ScenesRoute
from spotstop.guard.serve._schemas import BatchOut, BatchRequest, CheckJSON, DecisionOut
from spotstop.guard.serve._state import Sidecar, SidecarDep
from spotstop.guard.serve.routers._common import AUTH, INPUT, OVERLOAD
from starlette.concurrency import run_in_threadpool

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["checks"], route_class=ScenesRoute)

#: The caller's budget (GuardClient sends it): validated and documented by FastAPI.
CallerBudget = Annotated[
    float | None,
    Header(
        alias=BUDGET_HEADER,
        gt=0,
        le=MAX_DEADLINE_S,
        allow_inf_nan=False,
        description=(
            "Seconds the caller waits for this answer, counted from its request. The request's "
            "deadline is the earlier of this and the sidecar's own; past it no decision is "
            "acknowledged (503) or a late one is a fail-closed UNSAFE, so the log never holds "
            "a SAFE the caller did not get. Leave it out to use the sidecar's deadline."
        ),
    ),
]

#: When the caller's budget ends, Unix time (GuardClient sends it with the budget).
CallerDue = Annotated[
    float | None,
    Header(
        alias=DUE_HEADER,
        gt=0,
        allow_inf_nan=False,
        description=(
            "When the caller stops waiting, as Unix time in seconds. The budget header counts "
            "from the request's arrival; this one also counts the time before it (a connect "
            "retried, a full accept queue) on a sidecar whose clock agrees with the caller's. "
            "The request's deadline is the earliest of the sidecar's own and the caller's."
        ),
    ),
]

#: The multipart form: parsed by hand (:func:`scene_from_multipart`), so described by hand.
#: Its text fields follow the JSON model's rules; the app writes this server's length limits.
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
            "description": "What the robot was asked to do (UTF-8, not only whitespace, "
            "control or format characters).",
        },
        "situation_id": {
            "type": "string",
            "minLength": 1,
            "pattern": SITUATION_ID_PATTERN,
            "description": "Place/task of the scene, for situation recentering.",
        },
    },
}

_CHECK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "One scene, as multipart (a file upload) or as JSON (base64 image).",
        "content": {
            "multipart/form-data": {
                "schema": _MULTIPART_SCHEMA,
                "encoding": {"image": {"contentType": "image/jpeg, image/png, image/webp"}},
            },
            # the model's own schema (FastAPI lists it under components: BatchRequest uses it)
            "application/json": {"schema": {"$ref": "#/components/schemas/CheckJSON"}},
        },
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
async def check(
    request: Request,
    sidecar: SidecarDep,
    admission: AdmissionDep,
    budget_s: CallerBudget = None,
    due_unix: CallerDue = None,
) -> JSONResponse:
    body = await request.body()  # (read by the route, within the upload bounds)
    ctype = request.headers.get("content-type", "")
    [decision] = await _judge(
        sidecar,
        admission,
        _caller_due(admission, budget_s, due_unix),
        lambda: [_scene(body, ctype, sidecar.limits)],
    )
    return JSONResponse(decision.to_dict())


def _scene(body: bytes, content_type: str, limits: Limits) -> ParsedScene:
    """``/v1/check``'s body, JSON or multipart → one scene (image still encoded)."""
    if media_type(content_type) == "multipart/form-data":
        return scene_from_multipart(body, content_type, limits)
    if is_json(content_type):
        try:
            item = CheckJSON.model_validate(parse_json(body))
        except ValidationError as e:  # the same error body as FastAPI's validation gives
            errors = e.errors(include_url=False, include_input=False)
            raise input_error([{**err, "loc": ("body", *err["loc"])} for err in errors]) from None
        return scene_from_json(item, limits)
    raise UnsupportedMediaType(
        "Content-Type must be multipart/form-data (fields image, request, situation_id) or "
        "application/json (image_base64, request, situation_id); got "
        f"{media_type(content_type) or 'none'!r}.",
        field="Content-Type",
    )


def _caller_due(
    admission: Admission, budget_s: float | None, due_unix: float | None
) -> float | None:
    """When the caller stops waiting, on the monotonic clock: the earlier of its budget
    (counted from the request's arrival) and its due time (Unix time, moved onto the
    monotonic clock now); None when it sent neither."""
    dues = [] if budget_s is None else [admission.received + budget_s]
    if due_unix is not None:
        dues.append(time.monotonic() + (due_unix - time.time()))
    return min(dues) if dues else None


async def _judge(
    sidecar: Sidecar,
    admission: Admission,
    caller_due: float | None,
    parse: Callable[[], list[ParsedScene]],
) -> list[Decision]:
    """Parse (in a worker thread), then decode and judge on the model thread. The deadline
    runs from when the body was in; the caller's from when it said (:func:`_caller_due`)."""
    t = time.perf_counter()
    scenes = await run_in_threadpool(parse)
    sidecar.metrics.stage.labels(stage="parse").observe(time.perf_counter() - t)
    return await sidecar.runner.check(
        scenes,
        arrived=admission.arrived,
        ticket=admission.ticket,
        limits=sidecar.limits,
        caller_due=caller_due,
    )


def _batch_scenes(req: BatchRequest, sidecar: Sidecar) -> list[ParsedScene]:
    max_batch = sidecar.settings.max_batch
    if len(req.scenes) > max_batch:
        raise InputError(
            f"scenes has {len(req.scenes)} items; the limit is {max_batch} (max_batch). Split "
            "the batch.",
            field="scenes",
            code="too_many_scenes",
        )
    return [
        scene_from_json(item, sidecar.limits, prefix=f"scenes[{i}].")
        for i, item in enumerate(req.scenes)
    ]


@router.post(
    "/check/batch",
    summary="Judge several scenes in one guard call",
    response_model=BatchOut,
    responses={**AUTH, **INPUT, **OVERLOAD},
    description=(
        "All scenes are validated first; one bad scene refuses the whole batch with a 422 "
        "naming it (e.g. `scenes[2].image_base64`) and no decision is made. Valid batches "
        "are judged in one guard call (one model batch per member; the `batch` policy cuts "
        "at this batch's mean) and every decision is logged."
    ),
)
async def check_batch(
    body: BatchRequest,
    sidecar: SidecarDep,
    admission: AdmissionDep,
    budget_s: CallerBudget = None,
    due_unix: CallerDue = None,
) -> JSONResponse:
    due = _caller_due(admission, budget_s, due_unix)
    decisions = await _judge(sidecar, admission, due, lambda: _batch_scenes(body, sidecar))
    return JSONResponse({"decisions": [d.to_dict() for d in decisions]})
