"""spotstop's local HTTP sidecar: the guard behind FastAPI, for a planner on the robot.

``spotstop serve --bundle DIR`` runs it; :func:`create_app` builds the app (for tests or an
own ASGI server); :class:`ServeSettings` holds the bind address, token and limits. The client
side is :class:`spotstop.guard.client.GuardClient`.

Endpoints: ``POST /v1/check`` (multipart or JSON), ``POST /v1/check/batch``,
``GET /v1/situations/{id}``, ``POST /v1/labels``, ``POST /v1/policy/reload`` (also SIGHUP),
``GET /healthz``, ``GET /readyz``, ``GET /metrics``, ``/openapi.json``, ``/docs``.

Needs the ``serve`` extra (fastapi, uvicorn, prometheus-client, python-multipart). Importing
this package loads no model.
"""

from spotstop.guard.serve._app import create_app, load_guard, serve
from spotstop.guard.serve._errors import (
    ImageInputError,
    InputError,
    InsecureBindError,
    Overloaded,
    PayloadTooLarge,
    PolicyReloadError,
    SettingsError,
    SidecarError,
    Unauthorized,
    UnknownDecision,
    UnsupportedMediaType,
)
from spotstop.guard.serve._metrics import reason_kind
from spotstop.guard.serve._settings import (
    DEFAULT_PORT,
    DEFAULT_TOKEN_ENV,
    ServeSettings,
    is_loopback,
    resolve_token,
)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TOKEN_ENV",
    "ImageInputError",
    "InputError",
    "InsecureBindError",
    "Overloaded",
    "PayloadTooLarge",
    "PolicyReloadError",
    "ServeSettings",
    "SettingsError",
    "SidecarError",
    "Unauthorized",
    "UnknownDecision",
    "UnsupportedMediaType",
    "create_app",
    "is_loopback",
    "load_guard",
    "reason_kind",
    "resolve_token",
    "serve",
]
