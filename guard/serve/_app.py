"""The app factory: ``create_app(settings)`` → a FastAPI app; ``serve(settings)`` runs it.

The guard (members, policy, decision log) is loaded in the app's ``lifespan`` — or handed
in already loaded (``create_app(settings, guard=...)``, which the CLI uses so that a bad
bundle is reported before the port is bound) — then warmed up; it is closed on shutdown
after the model queue has drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from spotstop.guard._guard import Guard
from spotstop.guard.serve._errors import (
    PayloadTooLarge,
    SidecarError,
    UploadTimeout,
    input_error,
)
from spotstop.guard.serve._metrics import SidecarMetrics
from spotstop.guard.serve._parse import Limits
from spotstop.guard.serve._runner import ModelRunner
from spotstop.guard.serve._settings import ServeSettings
from spotstop.guard.serve._state import AuthDep, Sidecar
from spotstop.guard.serve.routers import checks, health, labels, policy, situations
from spotstop.guard.serve.routers import metrics as metrics_routes
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

__all__ = ["create_app", "load_guard", "serve"]

log = logging.getLogger("spotstop.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DESCRIPTION = """\
The spotstop guard as a local HTTP sidecar. A planner asks `POST /v1/check` before each
action and acts only on `"label": "SAFE"`.

* **Fail closed.** A 200 is a logged Decision (its row is in the log before the answer is
  sent); it is SAFE only when every stage finished within the deadline. Any 4xx means the
  input was refused and *no decision was made* (nothing was logged; 408: the body did not
  arrive within the upload timeout); a 503 means the queue was full, the deadline was spent
  before the models, or the decision could not be logged within it: no decision was
  acknowledged. Treat anything but a 200 SAFE as UNSAFE
  (`spotstop.guard.client.GuardClient` does).
* **Errors** are JSON (`ErrorOut`): a stable `code`, a `message` that says what to change,
  and the `field` at fault.
* **Auth.** On a non-loopback address every `/v1/*` and `/metrics` call needs
  `Authorization: Bearer <token>`; `/healthz`, `/readyz`, `/docs`, `/openapi.json` are open.
"""


def load_guard(settings: ServeSettings) -> Guard:
    """Load the bundle as ``settings`` say (members, policy, decision log)."""
    return Guard(
        settings.bundle,
        log=settings.log,
        deadline_s=settings.deadline_s,
        variants=settings.variants,
        state_dir=settings.state_dir,
        device=settings.device,
        threads=settings.threads,
        backend=settings.backend,
        min_image_side=settings.min_image_side,
        min_image_contrast=settings.min_image_contrast,
        log_options=settings.log_options,
    )


def _error_response(e: SidecarError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class _BodyLimit:
    """Refuse bodies over ``max_bytes`` with 413: from ``Content-Length`` before reading,
    and while reading (chunked bodies), so an oversize body is never held in memory."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: SidecarMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    def _too_large(self, n: int | None) -> PayloadTooLarge:
        got = f"{n} bytes" if n is not None else f"more than {self.max_bytes} bytes"
        return PayloadTooLarge(
            f"the body has {got}; the limit is {self.max_bytes} bytes (max_body_bytes). Send "
            "a smaller image or raise --max-body-bytes.",
            field="body",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    n = -1
                if n > self.max_bytes:  # answered here: counted as the handler counts
                    e = self._too_large(n)
                    self.metrics.input_refused.labels(code=e.code).inc()
                    await _error_response(e)(scope, receive, send)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large(None)
            return msg

        await self.app(scope, limited, send)


class _UploadDeadline:
    """Bound the arrival of a request body by ``timeout_s`` from the request's start.

    Each read of the body waits at most for the rest of that budget; past it the read raises
    :class:`UploadTimeout` (408, ``Connection: close``), so a stalled or trickled body never
    holds the server, its queue place or its memory for longer. Reads after the body is
    complete pass through. The upload's time is not part of the check's deadline.
    """

    def __init__(self, app: ASGIApp, timeout_s: float, metrics: SidecarMetrics) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        due = time.monotonic() + self.timeout_s
        complete = False
        received = 0

        async def bounded() -> Message:
            nonlocal complete, received
            if complete:
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, due - time.monotonic()))
            except TimeoutError:
                self.metrics.uploads_aborted.labels(reason="upload_timeout").inc()
                raise UploadTimeout(
                    f"the request body did not arrive within {self.timeout_s:g} s "
                    f"(upload_timeout_s; {received} bytes came). No decision was made; send "
                    "the whole body promptly."
                ) from None
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                complete = not msg.get("more_body", False)
            return msg

        await self.app(scope, bounded, send)


class _HttpMetrics:
    """Latency and status of every request, labelled by route template (bounded)."""

    def __init__(self, app: ASGIApp, metrics: SidecarMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t = time.perf_counter()
        status = 500

        async def sending(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
            await send(msg)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.http.labels(route=route, status=str(status)).observe(
                time.perf_counter() - t
            )


def _install_handlers(app: FastAPI, metrics: SidecarMetrics) -> None:
    async def sidecar_error(_request: Request, e: Exception) -> JSONResponse:
        e = cast(SidecarError, e)  # registered for SidecarError only
        if 400 <= e.status < 500 and not isinstance(e, UploadTimeout):  # (counted apart)
            metrics.input_refused.labels(code=e.code).inc()
        return _error_response(e)

    async def client_disconnect(_request: Request, _e: Exception) -> JSONResponse:
        # The client went away before its body was in: nobody waits for an answer, nothing
        # was decided, nothing failed on our side (499, as nginx counts it; never a 5xx).
        metrics.uploads_aborted.labels(reason="client_disconnect").inc()
        log.info("client disconnected before its request body arrived; no decision made")
        return JSONResponse(
            {
                "code": "client_disconnect",
                "message": "the client disconnected before the request body arrived; no "
                "decision was made.",
                "field": "body",
                "errors": [],
            },
            status_code=499,
        )

    async def validation_error(request: Request, e: Exception) -> JSONResponse:
        # a body, header or path that does not validate against its model: the sidecar's
        # own error body (a 422 naming the field, its code), never FastAPI's default shape
        return await sidecar_error(request, input_error(cast(RequestValidationError, e).errors()))

    async def http_error(_request: Request, e: Exception) -> JSONResponse:
        e = cast(StarletteHTTPException, e)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return JSONResponse(
            {"code": code, "message": str(e.detail), "field": None, "errors": []},
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    async def internal_error(_request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error while serving a request", exc_info=e)
        return JSONResponse(
            {
                "code": "internal_error",
                "message": f"internal error ({type(e).__name__}); no decision was made. Treat "
                "as UNSAFE. The server log has the traceback.",
                "field": None,
                "errors": [],
            },
            status_code=500,
        )

    app.add_exception_handler(SidecarError, sidecar_error)
    app.add_exception_handler(ClientDisconnect, client_disconnect)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


def _openapi(app: FastAPI, settings: ServeSettings) -> Callable[[], dict[str, Any]]:
    """FastAPI's schema (the request and response models, the multipart form, the header and
    the security scheme), with this server's limits written in: they are settings, which no
    model declared at import time can know."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        _write_limits(schema, settings)
        app.openapi_schema = schema
        return schema

    return build


def _write_limits(schema: dict[str, Any], s: ServeSettings) -> None:
    comps = schema["components"]["schemas"]
    multipart = schema["paths"]["/v1/check"]["post"]["requestBody"]["content"][
        "multipart/form-data"
    ]["schema"]["properties"]
    for props in (comps["CheckJSON"]["properties"], multipart):
        props["request"]["maxLength"] = s.max_request_chars
        sid = props["situation_id"]
        for alt in sid.get("anyOf", [sid]):
            if alt.get("type") == "string":
                alt["maxLength"] = s.max_situation_chars
    comps["BatchRequest"]["properties"]["scenes"]["maxItems"] = s.max_batch
    comps["LabelsRequest"]["properties"]["labels"]["maxItems"] = s.max_labels
    for p in schema["paths"]["/v1/situations/{situation_id}"]["get"]["parameters"]:
        if p["name"] == "situation_id":
            p["schema"]["maxLength"] = s.max_situation_chars


def _install_sighup(sidecar: Sidecar) -> Callable[[], None]:
    """Reload the policy on SIGHUP; returns the uninstaller (a no-op where not possible)."""
    if not sidecar.settings.sighup or not hasattr(signal, "SIGHUP"):
        return lambda: None
    loop = asyncio.get_running_loop()

    async def reload() -> None:
        try:
            out = await run_in_threadpool(sidecar.reload_policy, "sighup")
            log.info("SIGHUP: policy reloaded (%s)", out["policy"])
        except SidecarError as e:
            log.error("SIGHUP: %s", e)

    def on_hup() -> None:
        task = loop.create_task(reload())
        sidecar.background.add(task)
        task.add_done_callback(sidecar.background.discard)

    previous = signal.getsignal(signal.SIGHUP)
    try:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread / platform
        log.info("SIGHUP reload not installed (the server does not run in the main thread)")
        return lambda: None

    def uninstall() -> None:
        loop.remove_signal_handler(signal.SIGHUP)  # this sets the default action (exit):
        if previous is not None:  # give back what was there (`spotstop serve`: ignore)
            signal.signal(signal.SIGHUP, previous)

    return uninstall


def create_app(
    settings: ServeSettings, *, guard: Guard | None = None, close_guard: bool | None = None
) -> FastAPI:
    """The sidecar's FastAPI app.

    guard: an already loaded guard; None loads one from ``settings`` in the lifespan.
    close_guard: close the guard on shutdown (after the queue drained); default: only a
        guard the app loaded itself.
    """
    metrics = SidecarMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owns = guard is None if close_guard is None else close_guard
        g = guard if guard is not None else await run_in_threadpool(load_guard, settings)
        limits = Limits(
            max_image_bytes=settings.max_image_bytes,
            max_pixels=settings.max_pixels,
            max_request_chars=settings.max_request_chars,
            max_situation_chars=settings.max_situation_chars,
            check_request=_request_checker(g),
            min_side=settings.min_image_side,
            min_contrast=settings.min_image_contrast,
        )
        runner = ModelRunner(
            g, capacity=settings.queue_size, deadline_s=settings.deadline_s, metrics=metrics
        )
        sidecar = Sidecar(
            settings=settings,
            guard=g,
            runner=runner,
            metrics=metrics,
            limits=limits,
            owns_guard=owns,
        )
        app.state.sidecar = sidecar
        metrics.set_bundle(g.bundle_id, g.policy_config.policy.kind)
        if settings.warmup:
            try:
                await runner.call(sidecar.warm_up)
                log.info("warm-up scored every member in %.0f ms", sidecar.warmup_ms or 0.0)
            except Exception as e:  # not ready: /readyz says why; checks still fail closed
                sidecar.warmup_error = f"{type(e).__name__}: {e}"
                log.error("warm-up failed: %s", sidecar.warmup_error)
        metrics.watch_log(g.log_status)
        metrics.ready.set(1 if sidecar.ready else 0)
        uninstall = _install_sighup(sidecar)
        watch = asyncio.create_task(_watch_log(sidecar))
        try:
            yield
        finally:
            uninstall()
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await run_in_threadpool(runner.shutdown)  # every admitted check answered and logged
            if owns:
                g.close()  # what the log could not take goes to the journal

    app = FastAPI(
        title="spotstop sidecar",
        version=_version(),
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    deps = [AuthDep] if settings.auth else []
    app.include_router(health.router)
    for r in (
        checks.router,
        situations.router,
        labels.router,
        policy.router,
        metrics_routes.router,
    ):
        app.include_router(r, dependencies=deps)
    _install_handlers(app, metrics)
    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes, metrics=metrics)
    app.add_middleware(_UploadDeadline, timeout_s=settings.upload_timeout_s, metrics=metrics)
    app.add_middleware(_HttpMetrics, metrics=metrics)
    app.openapi = _openapi(app, settings)  # type: ignore[method-assign]
    return app


async def _watch_log(sidecar: Sidecar) -> None:
    """While the decision log cannot be written or decisions wait, retry it every
    ``log_retry_s`` on the model thread (between checks): the first write that succeeds
    writes what waits and makes the sidecar ready again, with no restart. A warm-up that
    failed, or that ran before every member had loaded, is run again on the same tick once
    every member is loaded (the guard loads a member that failed to load again by itself)."""
    g, every = sidecar.guard, sidecar.settings.log_retry_s
    while True:
        await asyncio.sleep(every)
        if g.ready and (  # a warm-up that failed, or one that ran before a member loaded
            sidecar.warmup_error is not None
            or (sidecar.settings.warmup and sidecar.warmed != frozenset(g.members))
        ):
            try:
                await sidecar.runner.call(sidecar.warm_up)
                sidecar.warmup_error = None
                log.info("warm-up scored every member in %.0f ms", sidecar.warmup_ms or 0.0)
            except Exception as e:  # still failing: /readyz says why; retry next tick
                sidecar.warmup_error = f"{type(e).__name__}: {e}"
        status = g.log_status()
        if status.writable and not status.waiting:
            continue
        try:
            await sidecar.runner.call(lambda: g.flush_pending(timeout_s=min(1.0, every)))
        except Exception as e:  # still failing: status and /readyz say why; retry next tick
            log.debug("decision log still not writable: %s", e)


def _request_checker(g: Guard) -> Callable[[str], object]:
    def check(request: str) -> object:
        # the members loaded now: one that failed to load at start joins when it loads
        for m in list(g.members.values()):
            m.encoder.check_request(request)
        return request

    return check


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spotstop")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def serve(settings: ServeSettings, *, guard: Guard | None = None, log_level: str = "info") -> int:
    """Run the sidecar with uvicorn until SIGINT/SIGTERM; returns an exit status.

    The guard (given or loaded) is closed on shutdown. Uvicorn re-raises a caught SIGTERM
    or SIGINT after its graceful shutdown, so the process then ends by that signal.
    """
    import uvicorn

    app = create_app(settings, guard=guard, close_guard=True)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        lifespan="on",
        server_header=False,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
