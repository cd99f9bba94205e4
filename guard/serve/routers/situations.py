"""``GET /v1/situations/{situation_id}``: the recentering state of one situation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from spotstop.guard.serve._parse import check_situation_id
from spotstop.guard.serve._schemas import SituationId, SituationOut
from spotstop.guard.serve._state import SidecarDep
from spotstop.guard.serve.routers._common import AUTH, err

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["situations"])


@router.get(
    "/situations/{situation_id:path}",  # an id may hold "/" (percent-encoded or not)
    summary="Recentering state of a situation",
    response_model=SituationOut,
    responses={
        **AUTH,
        422: err("The situation id is empty, too long or holds control characters."),
    },
    description=(
        "The situation's reference scores, the rule in force and the threshold a new scene "
        "of this situation would meet now. Under a policy other than `situation` (or a cascade "
        "whose cut is `situation`) the "
        "references are empty and the threshold is null. An unknown situation has no "
        "references (it is not an error)."
    ),
)
def situation(
    situation_id: Annotated[SituationId, PathParam()], sidecar: SidecarDep
) -> JSONResponse:
    # the same rule as the checks' situation_id (the type's), and the same length limit
    check_situation_id(situation_id, "situation_id", sidecar.settings.max_situation_chars)
    info = sidecar.guard.situation(situation_id).to_dict()
    info["references"] = [
        r if r == r and abs(r) != float("inf") else None for r in info["references"]
    ]
    return JSONResponse(info)
