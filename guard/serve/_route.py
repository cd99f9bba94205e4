"""How a route that takes a body reads it: token, queue place, body, strict JSON, then FastAPI.

FastAPI reads a typed body (and validates it against its pydantic model) *before* it solves a
route's dependencies. The sidecar needs some things to happen before the body is read, and
the body's text parsed more strictly than ``json.loads``; :class:`BodyRoute` (the FastAPI way:
a custom ``APIRoute`` and ``Request``) does them in order, then hands the request to FastAPI:

1. the bearer token is checked (a caller without it makes the server read nothing);
2. for a route that judges scenes (:class:`ScenesRoute`), the request takes its place in the
   model queue (503 ``queue_full`` when there is none), so the bodies held at once are
   bounded by the queue;
3. the body is read (bounded in size and time by the app's middlewares: 413, 408);
4. a route with a JSON model refuses any other Content-Type (415) and parses the text with
   :func:`~spotstop.guard.serve._parse.parse_json` (duplicate keys, ``NaN``, invalid UTF-8 and
   lone surrogates are refused, naming the field); FastAPI's ``request.json()`` then returns
   that object, and FastAPI validates it against the model (422 naming the field).

Errors of steps 1–4 are :class:`~spotstop.guard.serve._errors.SidecarError`\\ s raised outside
FastAPI's body reader (which would turn any exception into a plain 400), so the app's
handlers answer them with the sidecar's error body. A queue place that never reached the
models is given back when the request ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from spotstop.guard.serve._parse import parse_json, require_json
from spotstop.guard.serve._runner import Ticket
from spotstop.guard.serve._state import Sidecar, bearer, require_token
from starlette.concurrency import run_in_threadpool

__all__ = ["Admission", "AdmissionDep", "BodyRoute", "ScenesRoute", "StrictJSONRequest"]


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`~spotstop.guard.serve._parse.parse_json` (in a
    worker thread: a body may hold megabytes of base64), parsed once."""

    _strict: Any = None
    _parsed = False

    async def json(self) -> Any:
        if not self._parsed:
            self._strict = await run_in_threadpool(parse_json, await self.body())
            self._parsed = True
        return self._strict


@dataclass
class Admission:
    """A scenes route's place in the model queue and its times (``time.monotonic()``)."""

    ticket: Ticket
    received: float
    """When the request began: the caller's budget runs from here, upload included."""
    arrived: float
    """When the body was in: the sidecar's deadline runs from here."""


def _admission(request: Request) -> Admission:
    admission: Admission = request.state.admission  # set by ScenesRoute before the body
    return admission


AdmissionDep = Annotated[Admission, Depends(_admission)]


class BodyRoute(APIRoute):
    """A route that reads a body: token first, then the body, then strict JSON for a route
    whose body is a model (FastAPI validates the model after)."""

    admits_scenes = False

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        validate = super().get_route_handler()
        typed = self.body_field is not None

        async def handler(request: Request) -> Response:
            request = StrictJSONRequest(request.scope, request.receive)
            sidecar: Sidecar = request.app.state.sidecar
            require_token(sidecar, await bearer(request))
            received = time.monotonic()
            ticket = sidecar.runner.reserve(1) if self.admits_scenes else None
            try:
                if typed:  # (a route that reads the body itself checks its own media type)
                    require_json(request.headers.get("content-type", ""))
                await request.body()
                if ticket is not None:
                    request.state.admission = Admission(ticket, received, time.monotonic())
                if typed:
                    await request.json()
                return await validate(request)
            finally:
                if ticket is not None and not ticket.handed_over:  # never reached the models
                    ticket.release()

        return handler


class ScenesRoute(BodyRoute):
    """A route that judges scenes: it takes its queue place before its body is read."""

    admits_scenes = True
