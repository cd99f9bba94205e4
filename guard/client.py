"""``GuardClient``: the planner's side of the spotstop HTTP sidecar (``spotstop serve``).

The same fail-closed rule as :class:`spotstop.guard.Guard`, on the caller's side:
:meth:`GuardClient.check` and :meth:`GuardClient.check_batch` never raise for a problem of
a scene, the network or the server and never answer SAFE unless the server answered SAFE. A
scene the client cannot send (e.g. a request holding a lone surrogate), a timeout, a
connection error, a 5xx (including 503 "queue full"), a refused input (4xx) or a malformed
reply all give ``Decision(label="UNSAFE", fail_closed=True)`` with the cause in
``fail_reason`` — such a decision was made *here*, was not logged by the server, and has an
empty ``decision_id`` and ``policy == "client"``::

    from spotstop.guard import Scene
    from spotstop.guard.client import GuardClient

    with GuardClient("http://127.0.0.1:8750", timeout_s=2.0) as guard:
        d = guard.check(Scene("cam.jpg", "open the door", situation_id="hall-2"))
        if d.label == "SAFE":
            open_door()

The other methods (labels, situations, reload, readiness) raise :class:`SidecarHTTPError`
(or :class:`SidecarUnavailable`) instead. Needs ``httpx`` (the ``serve`` extra).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx
from spotstop.guard._call import MAX_DEADLINE_S
from spotstop.guard._errors import GuardError
from spotstop.guard._image import DecodedImage, read_image_bytes
from spotstop.guard._record import Decision
from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER, Scene
from spotstop.guard.policies._rule import is_unsafe
from spotstop.guard.validate import is_real

__all__ = [
    "DEFAULT_URL",
    "MAX_REPLY_BYTES",
    "GuardClient",
    "SidecarHTTPError",
    "SidecarUnavailable",
    "decision_from_dict",
]

DEFAULT_URL = "http://127.0.0.1:8750"

#: the longest reply the client reads (a batch of 16 scenes answers in well under 1 MB)
MAX_REPLY_BYTES = 16 << 20

#: how many decision ids a client remembers to refuse a reply it was already given
_REMEMBERED_IDS = 65536


class SidecarHTTPError(GuardError):
    """The sidecar answered an error. ``status``, ``code`` and ``field`` come from its
    JSON error body (``field`` names the request field at fault)."""

    def __init__(
        self, message: str, *, status: int | None, code: str | None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field


class SidecarUnavailable(SidecarHTTPError):
    """The sidecar could not be reached or did not answer in time."""


class _Overdue(Exception):
    """The whole call (connect, send, wait, read) did not finish within ``timeout_s``;
    ``reading``: it was still reading the scenes, nothing was sent."""

    def __init__(self, message: str, *, reading: bool = False) -> None:
        super().__init__(message)
        self.reading = reading


class _NotSent(Exception):
    """A scene the client cannot send (its message is the fail-closed reason)."""


class _BadReply(Exception):
    """A reply the client does not read: compressed, or longer than :data:`MAX_REPLY_BYTES`."""


def _untrusted_safe(d: Mapping[str, Any]) -> str | None:
    """Why a reply's SAFE cannot be trusted, or None: a SAFE must show a logged decision
    (a non-empty ``decision_id``; a field left out would take a made-up default), not failed
    closed, whose finite ``policy_score`` the one rule (:func:`is_unsafe`) labels SAFE
    against its finite ``threshold``."""
    if d.get("fail_closed") is not False:
        return f"fail_closed is {d.get('fail_closed')!r}, not false"
    did = d.get("decision_id")
    if not isinstance(did, str) or not did:
        return f"decision_id is {did!r}: no logged decision"
    score, thr = d.get("policy_score"), d.get("threshold")
    if not (is_real(score) and is_real(thr)) or is_unsafe(score, thr):
        return f"policy_score {score!r} against threshold {thr!r} is not SAFE by the rule"
    return None


def _not_for_these_scenes(
    decisions: Sequence[Decision], sids: list[str | None], reqs: list[str], shas: list[str]
) -> str | None:
    """Why the reply's rows are not the scenes sent, in order (None when they are): each row
    must name the request, situation and image (sha256 of the bytes sent) of its scene, and no
    two rows one decision id. A row the sidecar could not read the image of has no sha256; it
    is then UNSAFE."""
    ids = [d.decision_id for d in decisions]
    if len(set(ids)) != len(ids):
        return "two of its rows carry the same decision_id"
    for i, d in enumerate(decisions):
        if d.request != reqs[i]:
            return f"row {i} is for the request {d.request!r:.80}, not {reqs[i]!r:.80}"
        if d.situation_id != sids[i]:
            return f"row {i} is for situation {d.situation_id!r:.80}, not {sids[i]!r:.80}"
        if d.image_sha256 != shas[i] and (d.image_sha256 is not None or d.label == "SAFE"):
            return f"row {i} is for the image with sha256 {d.image_sha256!r}, not {shas[i]}"
    return None


def decision_from_dict(d: Mapping[str, Any]) -> Decision:
    """A :class:`Decision` from the sidecar's JSON (:meth:`Decision.from_json`; null → NaN).

    Raises ``ValueError`` when a field is missing or of the wrong type. A SAFE label is kept
    only when the reply itself shows a logged decision that the rule labels SAFE
    (:func:`_untrusted_safe`); any other SAFE becomes a fail-closed UNSAFE that says why.
    """
    if isinstance(d, Mapping) and d.get("label") == "SAFE":
        why = _untrusted_safe(d)
        if why is not None:
            d = {
                **d,
                "label": "UNSAFE",
                "fail_closed": True,
                "fail_reason": f"sidecar reply: its SAFE is not trusted ({why})",
            }
    return Decision.from_json(d)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ValueError(f"the JSON object names {dup!r} twice")
    return dict(pairs)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"the JSON holds {name}, which the sidecar never sends (it sends null)")


def _strict_json(text: str | bytes) -> Any:
    """The reply's JSON, refusing what the sidecar never writes: a key twice (the last one
    would win), ``NaN``/``Infinity``."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_refuse_constant)


def _fail_closed(
    reason: str, *, situation_id: str | None, request: str, ms: float, detail: str = ""
) -> Decision:
    return Decision.unlogged(
        reason,
        made_by="client",
        request=request,
        situation_id=situation_id,
        latency_ms={"client_ms": ms},
        detail=detail,
    )


def _request_of(scene: object) -> str:
    req = scene.request if isinstance(scene, Scene) else None
    return req if isinstance(req, str) else ""


def _situation_of(scene: object) -> str | None:
    sid = scene.situation_id if isinstance(scene, Scene) else None
    return sid if isinstance(sid, str) else None


class _Unsendable(ValueError):
    """A scene the client cannot put on the wire; the message says what is wrong."""


def _text(name: str, value: object) -> str:
    """``value`` when it is text that encodes as UTF-8 (what the sidecar reads); raises
    :class:`_Unsendable` naming the field otherwise."""
    if not isinstance(value, str):
        kind = "a string or None" if name == "situation_id" else "a string"
        raise _Unsendable(f"{name} must be {kind}; got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Unsendable(
            f"{name} is not valid text: it holds the lone surrogate {value[e.start]!r} at "
            f"position {e.start}, which does not encode as UTF-8"
        ) from None
    return value


def _scene_fields(scene: object) -> tuple[bytes, dict[str, str]]:
    """The image's bytes and the text fields (``request``, ``situation_id`` when set) of a
    scene to send; raises (:class:`_Unsendable`, ``TypeError``, ``OSError``, ...) when it
    cannot be sent."""
    if not isinstance(scene, Scene):
        raise _Unsendable(f"expected a Scene, got {type(scene).__name__}")
    fields = {"request": _text("request", scene.request)}
    if scene.situation_id is not None:
        fields["situation_id"] = _text("situation_id", scene.situation_id)
    return _image_bytes(scene.image), fields


def _unsendable_reason(e: Exception) -> str:
    return str(e) if isinstance(e, _Unsendable) else f"{type(e).__name__}: {e}"


def _error_text(resp: httpx.Response) -> tuple[str | None, str | None, str]:
    """(code, field, message) from an error response (JSON body or plain text)."""
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        return None, None, resp.text[:500]
    if not isinstance(body, dict):
        return None, None, str(body)[:500]
    code = body.get("code") if isinstance(body.get("code"), str) else None
    field = body.get("field") if isinstance(body.get("field"), str) else None
    return code, field, str(body.get("message", body))[:2000]


def _image_bytes(image: object) -> bytes:
    if isinstance(image, bytes | bytearray | memoryview | str | os.PathLike):
        # the guard's own reader: a file read once and at most DEFAULT_MAX_BYTES of it (a path
        # to a 300 MB file was read whole into memory, /dev/zero until the process ran out)
        return read_image_bytes(image)
    if isinstance(image, DecodedImage):
        raise TypeError(
            "GuardClient sends the encoded file; pass the image bytes or a path, not a "
            "DecodedImage."
        )
    raise TypeError(f"scene.image must be bytes or a path; got {type(image).__name__}")


def _checked_url(base_url: object) -> str:
    """``base_url`` without its trailing ``/``; GuardError unless it is an http(s) URL with a
    host (``127.0.0.1:8750`` without its scheme was taken, and every check then failed closed
    with a protocol error)."""
    example = f"e.g. {DEFAULT_URL!r}"
    if not isinstance(base_url, str):
        raise GuardError(f"base_url must be the sidecar's URL, {example}; got {base_url!r}.")
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise GuardError(
            f"base_url {base_url!r} is not a URL ({e}); give the sidecar's, {example}."
        ) from e
    if url.scheme not in ("http", "https") or not url.host:
        raise GuardError(
            f"base_url {base_url!r} is not an http(s) URL with a host; give the sidecar's, "
            f"{example} (with its http://)."
        )
    return base_url.rstrip("/")


class GuardClient:
    """Client of the spotstop sidecar.

    base_url: where ``spotstop serve`` listens (default ``http://127.0.0.1:8750``).
    token: the bearer token, when the server has one (default: ``$SPOTSTOP_TOKEN`` if set).
    timeout_s: the most one call may take, connect + send + wait + read; past it
        :meth:`check` answers a fail-closed UNSAFE.
    transport: an ``httpx`` transport (tests).

    The client talks to the sidecar directly: proxy variables of the environment
    (``HTTP_PROXY``, ``ALL_PROXY``, set on a robot for its uplink) are ignored, so no proxy
    sees the token and the scene or answers for the sidecar.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not (is_real(timeout_s) and 0 < timeout_s <= MAX_DEADLINE_S):
            raise GuardError(  # past it the sidecar refuses the budget: every check fails closed
                f"timeout_s must be a number of seconds in (0, {MAX_DEADLINE_S:g}] (the "
                f"sidecar's longest budget); got {timeout_s!r}."
            )
        token = token if token is not None else (os.environ.get("SPOTSTOP_TOKEN") or None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = _checked_url(base_url)
        self.timeout_s = float(timeout_s)
        self._answered: dict[str, None] = {}  # decision ids already in a reply (oldest first)
        self._answered_lock = threading.Lock()
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            transport=transport,
            # never a proxy from the environment: it would get the token and the scene, and
            # its answer (a SAFE, even with the sidecar down) would be taken as the sidecar's
            trust_env=False,
        )

    def __repr__(self) -> str:
        return f"<GuardClient {self.base_url} timeout={self.timeout_s:g}s>"

    # -- decisions (never raise for server/network faults) -----------------------------------
    def check(self, scene: Scene) -> Decision:
        """Judge one scene on the sidecar; any fault → fail-closed UNSAFE (never raises).

        A scene the client cannot send (not a :class:`Scene`, a request or ``situation_id``
        that is not text encoding as UTF-8, an image it cannot read) is not sent: it fails
        closed here, the reason saying what is wrong. Reading the image is part of the call:
        one that has not been read within ``timeout_s`` (a path on a hung mount, a FIFO) fails
        closed too."""
        t = time.perf_counter()
        sid = _situation_of(scene)
        req = _request_of(scene)
        sha: list[str] = []

        def prepare() -> dict[str, Any]:
            try:
                image, data = _scene_fields(scene)
            except Exception as e:  # a scene it cannot send fails closed (in _decide)
                raise _NotSent(f"client: {_unsendable_reason(e)}") from e
            sha.append(hashlib.sha256(image).hexdigest())
            return {"files": {"image": ("scene", image, "application/octet-stream")}, "data": data}

        return self._decide("/v1/check", t, [sid], [req], sha, prepare)[0]

    def check_batch(self, scenes: Sequence[Scene]) -> list[Decision]:
        """Judge scenes in one guard call on the sidecar; any fault → every scene fails
        closed (never raises for a scene or the sidecar; a ``scenes`` that is not iterable
        raises ``TypeError``, as there is then no list of scenes to answer).

        The batch is one call: when one scene cannot be sent (as in :meth:`check`), none is,
        and every scene fails closed with a reason naming that scene (``scene i``, from 0).
        Reading the images is part of the call, as in :meth:`check`."""
        t = time.perf_counter()
        scenes = list(scenes)
        sids = [_situation_of(s) for s in scenes]
        reqs = [_request_of(s) for s in scenes]
        if not scenes:
            return []
        shas: list[str] = []

        def prepare() -> dict[str, Any]:
            items = []
            for i, s in enumerate(scenes):
                try:
                    image, item = _scene_fields(s)
                except Exception as e:  # the whole batch fails closed (in _decide)
                    raise _NotSent(
                        f"client: the batch was not sent: scene {i}: {_unsendable_reason(e)}"
                    ) from e
                items.append({"image_base64": base64.b64encode(image).decode("ascii"), **item})
                shas.append(hashlib.sha256(image).hexdigest())
            return {"json": {"scenes": items}}

        return self._decide("/v1/check/batch", t, sids, reqs, shas, prepare)

    def _within(
        self,
        t: float,
        method: str,
        path: str,
        prepare: Callable[[], dict[str, Any]] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        """The whole exchange, bounded by ``timeout_s`` from ``t`` (``perf_counter``).

        ``prepare`` (reading the scenes: a path may block) runs first on the helper thread,
        within the same budget; what it returns is added to the request's arguments.

        httpx's timeouts bound each connect, write and read, not the call: a server that
        trickles its answer a byte at a time keeps every read short and the call long. So
        the exchange runs on a helper thread that reads the body chunk by chunk and gives up
        (closing the connection) once the budget is spent, and this thread waits for it at
        most the budget; an answer that completes after it is never returned (raises
        :class:`_Overdue`).
        """
        due = t + self.timeout_s
        done = threading.Event()
        abandon = threading.Event()
        box: dict[str, Any] = {}

        def exchange() -> None:
            try:
                if prepare is not None:
                    box["preparing"] = True
                    kw.update(prepare())
                    box["preparing"] = False
                left = due - time.perf_counter()
                if left <= 0:
                    raise _Overdue("the budget was spent before the request was sent")
                headers = {
                    **kw.pop("headers", {}),
                    # the sidecar never compresses: a body that would inflate is never read
                    "Accept-Encoding": "identity",
                    BUDGET_HEADER: f"{left:.3f}",
                    # also counts what the budget cannot: the time before the sidecar has
                    # the request (a connect retried, a full accept queue)
                    DUE_HEADER: f"{time.time() + left:.3f}",
                }
                req = self._http.build_request(
                    method, path, timeout=httpx.Timeout(left), headers=headers, **kw
                )
                resp = self._http.send(req, stream=True)
                try:
                    coding = resp.headers.get("content-encoding", "identity").strip().lower()
                    if coding not in ("", "identity"):
                        raise _BadReply(
                            f"the reply is compressed (Content-Encoding: {coding:.40}); the "
                            "sidecar never compresses"
                        )
                    body = bytearray()
                    # (a transport that hands over a body already read, e.g. httpx's
                    # MockTransport, has nothing left to stream)
                    chunks = [resp.content] if resp.is_stream_consumed else resp.iter_raw()
                    for chunk in chunks:
                        if abandon.is_set() or time.perf_counter() > due:
                            raise _Overdue(f"the answer was still arriving ({len(body)} bytes)")
                        body += chunk
                        if len(body) > MAX_REPLY_BYTES:
                            raise _BadReply(
                                f"the reply has more than {MAX_REPLY_BYTES} bytes "
                                "(MAX_REPLY_BYTES); the sidecar's are far shorter"
                            )
                finally:
                    resp.close()
                box["resp"] = httpx.Response(
                    resp.status_code, headers=resp.headers, content=bytes(body), request=req
                )
            except BaseException as e:  # handed to the caller's thread below
                box["error"] = e
            finally:
                done.set()

        worker = threading.Thread(target=exchange, name="spotstop-client", daemon=True)
        worker.start()
        finished = done.wait(max(0.0, due - time.perf_counter()))
        if not finished or time.perf_counter() > due:
            abandon.set()
            raise _Overdue(
                f"{time.perf_counter() - t:.3g} s elapsed", reading=bool(box.get("preparing"))
            )
        if "error" in box:
            raise box["error"]
        resp_out: httpx.Response = box["resp"]
        return resp_out

    def _decide(
        self,
        path: str,
        t: float,
        sids: list[str | None],
        reqs: list[str],
        shas: list[str],
        prepare: Callable[[], dict[str, Any]],
    ) -> list[Decision]:
        """Send what ``prepare`` reads (it fills ``shas``, the sha256 of each image sent) and
        read the decisions; any fault fails every scene closed."""

        def fail(reason: str, detail: str = "") -> list[Decision]:
            ms = (time.perf_counter() - t) * 1e3
            return [
                _fail_closed(reason, situation_id=s, request=r, ms=ms, detail=detail)
                for s, r in zip(sids, reqs, strict=True)
            ]

        try:
            resp = self._within(t, "POST", path, prepare)
        except _NotSent as e:
            return fail(str(e))
        except (_Overdue, httpx.TimeoutException) as e:
            if isinstance(e, _Overdue) and e.reading:
                return fail(
                    f"client: the scene's image was not read within {self.timeout_s:g} s "
                    f"({e}); nothing was sent"
                )
            return fail(
                f"sidecar timeout: no complete answer within {self.timeout_s:g} s "
                f"({type(e).__name__}: {e}); whatever arrives later is ignored"
            )
        except httpx.HTTPError as e:
            return fail(f"sidecar unreachable: {type(e).__name__}: {e}")
        except _BadReply as e:
            return fail(f"sidecar reply malformed: {e}")
        except Exception as e:  # check/check_batch never raise (the contract): fail closed
            return fail(f"client: the exchange with the sidecar failed: {type(e).__name__}: {e}")
        if resp.status_code != 200:
            code, field, message = _error_text(resp)
            where = f", field {field}" if field else ""
            kind = "refused the request" if 400 <= resp.status_code < 500 else "failed"
            return fail(
                f"sidecar {kind} ({resp.status_code} {code or resp.reason_phrase}{where}): "
                f"{message}",
                detail=resp.text[:2000],
            )
        try:
            body = _strict_json(resp.content)
            rows = [body] if path == "/v1/check" else body["decisions"]
            if not isinstance(rows, list) or len(rows) != len(sids):
                raise ValueError(f"expected {len(sids)} decisions, got {rows!r:.100}")
            decisions = [decision_from_dict(r) for r in rows]
        except Exception as e:  # never raises (the contract): any unreadable reply is malformed
            return fail(f"sidecar reply malformed: {type(e).__name__}: {e}")
        why = _not_for_these_scenes(decisions, sids, reqs, shas)
        if why is not None:  # a stale, misrouted or reordered reply: none of it is trusted
            return fail(f"sidecar reply is not for the scenes sent: {why}", detail=resp.text[:2000])
        again = self._already_answered(decisions)
        if again is not None:  # e.g. an answer sent twice, its copy left on a kept-alive socket
            return fail(
                f"sidecar reply is not for this call: decision_id {again!r} was already "
                "answered to an earlier call (a stale reply)",
                detail=resp.text[:2000],
            )
        return decisions

    def _already_answered(self, decisions: Sequence[Decision]) -> str | None:
        """A decision id of ``decisions`` that an earlier reply to this client carried (the
        sidecar never gives one twice), or None; remembers the ids (the last
        ``_REMEMBERED_IDS``)."""
        ids = [d.decision_id for d in decisions if d.decision_id]
        with self._answered_lock:
            again = next((i for i in ids if i in self._answered), None)
            for i in ids:
                self._answered[i] = None
            while len(self._answered) > _REMEMBERED_IDS:
                del self._answered[next(iter(self._answered))]
        return again

    # -- everything else (raises) ----------------------------------------------------------
    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._within(time.perf_counter(), method, path, **kw)
        except (_Overdue, httpx.TimeoutException) as e:
            raise SidecarUnavailable(
                f"{method} {path}: no answer within {self.timeout_s:g} s ({type(e).__name__}).",
                status=None,
                code="timeout",
            ) from e
        except httpx.HTTPError as e:
            raise SidecarUnavailable(
                f"{method} {path}: {type(e).__name__}: {e}", status=None, code="unreachable"
            ) from e
        except _BadReply as e:
            raise SidecarHTTPError(f"{method} {path}: {e}.", status=None, code=None) from e
        if resp.status_code >= 400:
            code, field, message = _error_text(resp)
            raise SidecarHTTPError(
                f"{method} {path}: {resp.status_code} {code or ''}: {message}",
                status=resp.status_code,
                code=code,
                field=field,
            )
        try:
            return resp.json()
        except json.JSONDecodeError as e:
            raise SidecarHTTPError(
                f"{method} {path}: reply is not JSON.", status=resp.status_code, code=None
            ) from e

    def healthy(self) -> bool:
        """True when ``/healthz`` answers 200 (never raises)."""
        try:
            return self._within(time.perf_counter(), "GET", "/healthz").status_code == 200
        except Exception:  # never raises (the contract): a client closed, a reply it refused
            return False

    def ready(self) -> bool:
        """True when ``/readyz`` answers 200 (never raises)."""
        try:
            return self._within(time.perf_counter(), "GET", "/readyz").status_code == 200
        except Exception:  # never raises (the contract): a client closed, a reply it refused
            return False

    def situation(self, situation_id: str) -> dict[str, Any]:
        """The recentering state of a situation (``GET /v1/situations/{id}``)."""
        from urllib.parse import quote

        out: dict[str, Any] = self._call("GET", f"/v1/situations/{quote(situation_id, safe='')}")
        return out

    def set_labels(self, labels: Iterable[tuple[str, str, str | None, str | None]]) -> int:
        """Attach reviewer labels ``(decision_id, "safe"|"unsafe", contrast_id, reviewer)``;
        all or none are written. Returns how many."""
        items = [
            {"decision_id": i, "label": lab, "contrast_id": c, "reviewer": r}
            for i, lab, c, r in labels
        ]
        return int(self._call("POST", "/v1/labels", json={"labels": items})["written"])

    def reload_policy(self) -> dict[str, Any]:
        """Ask the sidecar to reload its policy.yaml; raises on 409/422 (old policy stays)."""
        out: dict[str, Any] = self._call("POST", "/v1/policy/reload")
        return out

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GuardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
