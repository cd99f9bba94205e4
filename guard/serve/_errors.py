"""The sidecar's exception hierarchy and the JSON error body every 4xx/5xx carries.

Every error the sidecar raises on purpose derives from :class:`SidecarError` (itself a
:class:`~spotstop.guard._errors.GuardError`) and carries the HTTP ``status`` it maps to, a stable
machine-readable ``code`` and, for input errors, the ``field`` that was wrong::

    SidecarError(GuardError)                         any status; code, field, headers
    ├── SettingsError(SidecarError, ConfigError)     refused at startup (a bad option)
    │   └── InsecureBindError                        non-loopback bind without a token
    ├── InputError(SidecarError, ValueError)         422: a field of the request is wrong
    │   ├── ImageInputError                          422: the image was refused (``kind``)
    │   ├── PayloadTooLarge                          413: body over ``max_body_bytes``
    │   └── UnsupportedMediaType                     415: neither JSON nor multipart
    ├── Unauthorized(SidecarError)                   401: missing or wrong bearer token
    ├── UnknownDecision(SidecarError, LookupError)   422: a label names an unknown decision
    ├── Overloaded(SidecarError)                     503 + Retry-After: queue full / budget spent
    ├── NotLogged(SidecarError)                      503 + Retry-After: the log could not be
    │                                                written within the deadline
    ├── LabelsNotWritten(SidecarError)               503 + Retry-After: the log is busy or
    │                                                cannot be written; no label was written
    ├── UploadTimeout(SidecarError)                  408: the body did not arrive in time
    └── PolicyReloadError(SidecarError)              409 mismatch / 422 invalid policy file

An input error means **no decision was made and nothing was logged**: the request never
reached the models. A scene that reached the models yields a logged Decision (which may be a fail-closed UNSAFE), answered
200 only once its row is in the log. A 503 or 408 also means no decision was acknowledged; a
client must treat it as UNSAFE (``spotstop.guard.client.GuardClient`` does).

The JSON body of every error response is :class:`~spotstop.guard.serve._schemas.ErrorOut`:
``{"code": ..., "message": ..., "field": ..., "errors": [{"field", "message", "type"}]}``.
What FastAPI's validation refuses (a request model, the budget header, a path parameter)
becomes an :class:`InputError` by :func:`input_error`, so it answers in the same body.

This module imports nothing from FastAPI, so the CLI can use it before the server starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotstop.guard._errors import ConfigError, GuardError

__all__ = [
    "SIDECAR_CODES",
    "ImageInputError",
    "InputError",
    "InsecureBindError",
    "LabelsNotWritten",
    "NotLogged",
    "Overloaded",
    "PayloadTooLarge",
    "PolicyReloadError",
    "SettingsError",
    "SidecarError",
    "Unauthorized",
    "UnknownDecision",
    "UnsupportedMediaType",
    "UploadTimeout",
    "field_path",
    "input_error",
]


class SidecarError(GuardError):
    """Base class of every error the sidecar raises on purpose.

    ``status`` is the HTTP status it answers with, ``code`` a stable identifier for clients,
    ``field`` the request field at fault (dotted path, e.g. ``scenes[2].image_base64``) or
    None, ``errors`` further per-field details, ``headers`` extra response headers.
    """

    status: int = 500
    code: str = "sidecar_error"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        status: int | None = None,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.errors = errors if errors is not None else []
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON error body (see :class:`~spotstop.guard.serve._schemas.ErrorOut`)."""
        errors = self.errors or (
            [{"field": self.field, "message": self.message, "type": self.code}]
            if self.field is not None
            else []
        )
        return {"code": self.code, "message": self.message, "field": self.field, "errors": errors}


class SettingsError(SidecarError, ConfigError):
    """A sidecar option is invalid; the message names the option. Raised before serving."""

    code = "settings_invalid"


class InsecureBindError(SettingsError):
    """A non-loopback bind address was asked for without a bearer token."""

    code = "insecure_bind"


class InputError(SidecarError, ValueError):
    """A request field is missing, extra, of the wrong type or out of its limits (422)."""

    status = 422
    code = "invalid_input"


class ImageInputError(InputError):
    """The image was refused by the decoder; ``kind`` is the :data:`spotstop.guard._image.RefusalKind`
    (or ``bad_base64``) and ``code`` is ``image_<kind>``."""

    def __init__(self, message: str, *, field: str, kind: str) -> None:
        super().__init__(message, field=field, code=f"image_{kind}")
        self.kind = kind


class PayloadTooLarge(InputError):
    """The request body is larger than ``max_body_bytes`` (413)."""

    status = 413
    code = "body_too_large"


class UnsupportedMediaType(InputError):
    """The body is neither ``application/json`` nor ``multipart/form-data`` (415)."""

    status = 415
    code = "unsupported_media_type"


class Unauthorized(SidecarError):
    """The bearer token is missing or wrong (401, with ``WWW-Authenticate: Bearer``)."""

    status = 401
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="spotstop"'})


class UnknownDecision(SidecarError, LookupError):
    """A label refers to a decision id that is not in the decision log (422)."""

    status = 422
    code = "unknown_decision_id"


class Overloaded(SidecarError):
    """No decision was made: the model queue is full, or the request's deadline was spent
    waiting in it (503 with ``Retry-After`` in whole seconds). Treat as UNSAFE."""

    status = 503
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int, code: str = "queue_full") -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(int(retry_after_s))})
        self.retry_after_s = int(retry_after_s)


class NotLogged(SidecarError):
    """The call's decisions could not be written to the decision log within the request's
    deadline (503 with ``Retry-After``): nothing was acknowledged. Treat as UNSAFE. The rows
    (fail-closed UNSAFE) are kept by the guard and written as soon as the log takes them."""

    status = 503
    code = "decision_not_logged"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(int(retry_after_s))})


class LabelsNotWritten(SidecarError):
    """The labels could not be written: the decision log is busy (another connection holds
    it) or cannot take writes (503 with ``Retry-After``). No label was written; send them
    again."""

    status = 503
    code = "labels_not_written"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, field="labels", headers={"Retry-After": str(int(retry_after_s))})


class UploadTimeout(SidecarError):
    """The request body did not arrive within ``upload_timeout_s`` (408; the connection is
    closed). No decision was made."""

    status = 408
    code = "upload_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="body", headers={"Connection": "close"})


class PolicyReloadError(SidecarError):
    """A policy reload was refused; the old policy stays in force.

    409 (``policy_mismatch``) when the file was fitted for another bundle or prompt, 422
    (``policy_invalid``) when the file is missing or does not validate.
    """

    status = 422
    code = "policy_invalid"


# ------------------------------------------------------------ validation errors → the body

#: Codes the request models raise themselves (``PydanticCustomError(code, ...)``, from the
#: same field rules the multipart form and the path use); :func:`input_error` keeps them.
SIDECAR_CODES = frozenset({"empty_field", "invalid_value", "text_too_long"})

#: Where a validation error's location starts with where FastAPI found the value.
_SOURCES = frozenset({"body", "header", "path", "query", "cookie"})


def field_path(loc: Sequence[object]) -> str:
    """``("scenes", 0, "image_base64")`` → ``"scenes[0].image_base64"``; ``()`` → ``"body"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def _code(err_type: str, where: str) -> str:
    if err_type in SIDECAR_CODES:
        return err_type
    if err_type == "extra_forbidden":
        return "extra_field"
    if err_type == "missing":
        return "body_missing" if where == "body" else "missing_field"
    if err_type.endswith("_type") or err_type in ("model_type", "model_attributes_type"):
        return "wrong_type"
    return "invalid_value"


def _message(err: Mapping[str, Any]) -> str:
    t = err["type"]
    if t == "extra_forbidden":
        return "unknown field; remove it"
    if t == "missing":
        return "field required"
    return str(err["msg"])


def input_error(errors: Iterable[Mapping[str, Any]]) -> InputError:
    """Pydantic's validation errors (as FastAPI's ``RequestValidationError.errors()`` gives
    them, ``loc`` led by ``body``/``header``/``path``) → one :class:`InputError` (422) whose
    ``field`` and ``code`` are those of the first error and whose ``errors`` list them all.
    The values that failed are never echoed (an image may be megabytes of base64)."""
    items = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if loc and loc[0] in _SOURCES:
            loc = loc[1:]
        items.append({"field": field_path(loc), "message": _message(err), "type": str(err["type"])})
    if not items:  # (pydantic always names at least one; keep the body's shape regardless)
        return InputError("invalid request.", field="body")
    first = items[0]
    msg = "; ".join(f"{x['field']}: {x['message']}" for x in items[:5])
    more = f" (and {len(items) - 5} more)" if len(items) > 5 else ""
    return InputError(
        f"invalid request: {msg}{more}.",
        field=first["field"],
        code=_code(first["type"], first["field"]),
        errors=items,
    )
