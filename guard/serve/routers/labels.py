"""``POST /v1/labels``: attach reviewed labels (and contrast ids) to logged decisions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from spotstop.guard._log import RecordError
from spotstop.guard.serve._errors import InputError, UnknownDecision
from spotstop.guard.serve._parse import parse_json, require_json, validate_model
from spotstop.guard.serve._schemas import LabelsOut, LabelsRequest
from spotstop.guard.serve._state import Sidecar, SidecarDep
from spotstop.guard.serve.routers._common import AUTH, INPUT, err
from starlette.concurrency import run_in_threadpool

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["labels"])


def _write(sidecar: Sidecar, body: bytes, content_type: str) -> int:
    require_json(content_type)
    obj = parse_json(body)
    limit = sidecar.settings.max_labels
    if isinstance(obj, dict) and isinstance(obj.get("labels"), list) and len(obj["labels"]) > limit:
        raise InputError(
            f"labels has {len(obj['labels'])} items; the limit is {limit}. Send them in parts.",
            field="labels",
            code="too_many_labels",
        )
    req = validate_model(LabelsRequest, obj)
    seen: dict[str, int] = {}
    for i, item in enumerate(req.labels):
        if item.decision_id in seen:
            raise InputError(
                f"labels[{i}].decision_id repeats labels[{seen[item.decision_id]}]; give each "
                "decision one label per call.",
                field=f"labels[{i}].decision_id",
                code="duplicate_decision_id",
            )
        seen[item.decision_id] = i
    log = sidecar.guard.log
    items = [(x.decision_id, x.label, x.contrast_id, x.reviewer) for x in req.labels]
    try:
        log.set_labels(items)
    except RecordError as e:
        for i, item in enumerate(req.labels):
            if log.get(item.decision_id) is None:
                raise UnknownDecision(
                    f"labels[{i}].decision_id {item.decision_id!r} is not in the decision log; "
                    "no labels were written.",
                    field=f"labels[{i}].decision_id",
                ) from None
        raise InputError(str(e), field="labels", code="invalid_value") from None
    return len(items)


@router.post(
    "/labels",
    summary="Attach reviewed labels to decisions",
    response_model=LabelsOut,
    responses={
        **AUTH,
        **INPUT,
        422: err(
            "A field is wrong, or a decision id is not in the log (code unknown_decision_id). "
            "Nothing was written."
        ),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/LabelsRequest"}}
            },
        }
    },
    description=(
        "Labels are lower case `safe`/`unsafe`; `contrast_id` pairs a safe and an unsafe "
        "scene. All labels are written in one transaction, or none; a decision that already "
        "has a label gets the new one."
    ),
)
async def labels(request: Request, sidecar: SidecarDep) -> LabelsOut:
    body = await request.body()
    n = await run_in_threadpool(_write, sidecar, body, request.headers.get("content-type", ""))
    return LabelsOut(written=n)
