"""Shared response declarations for the routers' OpenAPI."""

from __future__ import annotations

from typing import Any

from spotstop.guard.serve._schemas import ErrorOut

__all__ = ["AUTH", "INPUT", "OVERLOAD", "err"]


def err(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


AUTH: dict[int | str, dict[str, Any]] = {
    401: err("Missing or wrong bearer token (only when the server has a token).")
}
INPUT: dict[int | str, dict[str, Any]] = {
    413: err("The body is larger than max_body_bytes. No decision was made."),
    415: err("Unsupported Content-Type. No decision was made."),
    422: err(
        "A field is missing, extra, of the wrong type, over its limit, not UTF-8, not base64, "
        "or the image was refused (code image_<kind>); `field` names it. No decision was made."
    ),
}
OVERLOAD: dict[int | str, dict[str, Any]] = {
    503: {
        "model": ErrorOut,
        "description": "The model queue is full or the deadline was spent waiting in it. No "
        "decision was made: treat as UNSAFE and retry after `Retry-After` seconds.",
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before retrying.",
                "schema": {"type": "integer"},
            }
        },
    }
}
