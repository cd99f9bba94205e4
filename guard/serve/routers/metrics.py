"""``GET /metrics``: Prometheus text exposition of the sidecar's registry."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from spotstop.guard.serve._state import SidecarDep
from spotstop.guard.serve.routers._common import AUTH

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        **AUTH,
        200: {
            "description": "Prometheus text format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    },
)
def metrics(sidecar: SidecarDep) -> Response:
    sidecar.metrics.ready.set(1 if sidecar.ready else 0)
    return Response(generate_latest(sidecar.metrics.registry), media_type=CONTENT_TYPE_LATEST)
