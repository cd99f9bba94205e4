"""``POST /v1/policy/reload``: swap in the bundle's policy.yaml (also on SIGHUP)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from spotstop.guard.serve._schemas import ReloadOut
from spotstop.guard.serve._state import SidecarDep
from spotstop.guard.serve.routers._common import AUTH, err
from starlette.concurrency import run_in_threadpool

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["policy"])


@router.post(
    "/policy/reload",
    summary="Reload policy.yaml",
    response_model=ReloadOut,
    responses={
        **AUTH,
        409: err("The file was fitted for another bundle or prompt; the old policy stays."),
        422: err("The file is missing or does not validate; the old policy stays."),
    },
    description=(
        "Re-read the bundle's `policy.yaml`, check it (schema, bundle id, prompt hash) and "
        "swap it in between two guard calls. On any error the old policy stays in force. "
        "`kill -HUP <pid>` does the same."
    ),
)
async def reload_policy(sidecar: SidecarDep) -> JSONResponse:
    out = await run_in_threadpool(sidecar.reload_policy, "http")
    return JSONResponse(jsonable_encoder(out))
