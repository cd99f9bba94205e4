"""``GET /healthz`` (alive) and ``GET /readyz`` (bundle loaded, members loaded, warmed up).

Both are open without a token: they say nothing about scenes or decisions.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from spotstop.guard.serve._schemas import HealthOut, ReadyOut
from spotstop.guard.serve._state import SidecarDep

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness", response_model=HealthOut)
async def healthz() -> HealthOut:
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    summary="Readiness",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "Not ready; `reasons` says why."}},
)
async def readyz(sidecar: SidecarDep) -> JSONResponse:
    reasons = sidecar.not_ready_reasons()
    sidecar.metrics.ready.set(0 if reasons else 1)
    body = ReadyOut(
        ready=not reasons,
        bundle_id=sidecar.guard.bundle_id,
        policy=sidecar.guard.policy_config.policy.kind,
        warmed_up=sidecar.warmed_up,
        reasons=reasons,
    )
    return JSONResponse(body.model_dump(), status_code=503 if reasons else 200)
