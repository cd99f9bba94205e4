"""``POST /v1/labels``: attach reviewed labels (and contrast ids) to logged decisions.

The body is the :class:`LabelsRequest` model (FastAPI validates and documents it; a
:class:`~spotstop.guard.serve._route.BodyRoute` checks the token and parses the JSON strictly
first). The count limit (``max_labels``) and one label per decision are checked here.
"""

from __future__ import annotations

from fastapi import APIRouter
from spotstop.guard._log import LogError, RecordError
from spotstop.guard.serve._errors import InputError, LabelsNotWritten, UnknownDecision
from spotstop.guard.serve._route import BodyRoute
from spotstop.guard.serve._schemas import LabelsOut, LabelsRequest
from spotstop.guard.serve._state import Sidecar, SidecarDep
from spotstop.guard.serve.routers._common import AUTH, INPUT, err
from starlette.concurrency import run_in_threadpool

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["labels"], route_class=BodyRoute)


def _write(sidecar: Sidecar, req: LabelsRequest) -> int:
    limit = sidecar.settings.max_labels
    if len(req.labels) > limit:
        raise InputError(
            f"labels has {len(req.labels)} items; the limit is {limit}. Send them in parts.",
            field="labels",
            code="too_many_labels",
        )
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
            if log.get(item.decision_id, raw=True) is None:  # is it there; not what it says
                raise UnknownDecision(
                    f"labels[{i}].decision_id {item.decision_id!r} is not in the decision log; "
                    "no labels were written.",
                    field=f"labels[{i}].decision_id",
                ) from None
        raise InputError(str(e), field="labels", code="invalid_value") from None
    except LogError as e:  # busy or not writable: nothing was written, and it may pass
        raise LabelsNotWritten(
            f"the labels were not written: {e}. Send them again.",
            retry_after_s=max(1, round(sidecar.settings.log_retry_s)),
        ) from None
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
        503: err(
            "The decision log is busy or cannot take writes (code labels_not_written, with "
            "Retry-After). Nothing was written; send the labels again."
        ),
    },
    description=(
        "Labels are lower case `safe`/`unsafe`; `contrast_id` pairs a safe and an unsafe "
        "scene. All labels are written in one transaction, or none; a decision that already "
        "has a label gets the new one."
    ),
)
async def labels(body: LabelsRequest, sidecar: SidecarDep) -> LabelsOut:
    n = await run_in_threadpool(_write, sidecar, body)
    return LabelsOut(written=n)
