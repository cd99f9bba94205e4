"""What the request models cannot do: the multipart form, strict JSON text, the field rules.

Runs in a worker thread (decoding is CPU work). Nothing here touches the models or the log:
a body that fails here makes no decision. The JSON bodies themselves are pydantic models
(:mod:`spotstop.guard.serve._schemas`) that FastAPI validates and documents; this module keeps:

* **Strict JSON text** (:func:`parse_json`, the sidecar's ``Request.json``): parsed with the
  standard library so that problems can be named by field: invalid UTF-8 and lone surrogates
  (``"\\ud800"``) are found in the string that holds them; duplicate keys (which would let a
  body say two requests at once) and the non-standard constants ``NaN``/``Infinity`` are
  refused. The models then validate the parsed object strictly.
* **Multipart** is parsed with ``python-multipart`` directly (not Starlette's form parser, which
  falls back to latin-1 on invalid UTF-8): ``image`` must be a file part, ``request`` and
  ``situation_id`` text parts in UTF-8; unknown or repeated parts are refused; a body that
  ends before its closing boundary is refused as truncated.
* **The field rules** every way in shares (:func:`check_text`, :func:`check_situation_id`):
  the models call them too, so a situation id the path or the form refuses, JSON refuses.
  The limits that are settings (text lengths) are checked here, after the model.
* Parsing gives :class:`ParsedScene` objects that still hold the *encoded* image: images
  are decoded later by :meth:`ParsedScene.decode` (:func:`spotstop.guard._image.decode_image`,
  limits from the settings), after the request was admitted to the model queue, on the
  model thread, one request at a time, so decoded frames never pile up in memory ahead of
  the queue. A refused image is a 422 whose ``code`` is ``image_<kind>``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from python_multipart.multipart import (
    MultipartParser,
    MultipartState,
    parse_options_header,
)
from spotstop.guard._errors import RequestError
from spotstop.guard._image import (
    DEFAULT_MIN_CONTRAST,
    DEFAULT_MIN_SIDE,
    DecodedImage,
    ImageRefused,
    decode_image,
)
from spotstop.guard._types import Scene
from spotstop.guard.serve._errors import (
    ImageInputError,
    InputError,
    UnsupportedMediaType,
    field_path,
)
from spotstop.guard.validate import is_blank, situation_id_problem

if TYPE_CHECKING:
    from spotstop.guard.serve._schemas import CheckJSON

__all__ = [
    "SITUATION_ID_PATTERN",
    "Limits",
    "ParsedScene",
    "check_situation_id",
    "check_text",
    "is_json",
    "media_type",
    "parse_json",
    "require_json",
    "scene_from_json",
    "scene_from_multipart",
]

#: Multipart parts a check accepts.
_PARTS = ("image", "request", "situation_id")
_MAX_PARTS = 16


@dataclass(frozen=True)
class Limits:
    """What the parser enforces (from :class:`~spotstop.guard.serve.ServeSettings`)."""

    max_image_bytes: int
    max_pixels: int
    max_request_chars: int
    max_situation_chars: int
    check_request: Callable[[str], object] = field(default=lambda s: s)
    """The guard's own request check (control tokens etc.); raises RequestError."""
    min_side: int = DEFAULT_MIN_SIDE
    """Smallest accepted image width and height (pixels)."""
    min_contrast: float = DEFAULT_MIN_CONTRAST
    """Smallest accepted contrast of the decoded frame (``image_blank`` below it)."""


@dataclass(frozen=True)
class ParsedScene:
    """A scene whose fields passed their checks and whose image is still encoded."""

    image: bytes
    field: str
    """Where the image came from, for errors (``image``, ``scenes[2].image_base64``)."""
    request: str
    situation_id: str | None

    def decode(self, limits: Limits) -> Scene:
        """The scene with its image decoded, or :class:`ImageInputError` naming the field."""
        return Scene(_decode(self.image, self.field, limits), self.request, self.situation_id)


# ------------------------------------------------------------------------------- JSON


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise InputError(
                f"the JSON object has the key {k!r} twice; send each field once.",
                field=k,
                code="duplicate_field",
            )
        d[k] = v
    return d


def _refuse_constant(name: str) -> Any:
    raise InputError(
        f"the JSON body holds {name}, which is not JSON; send numbers as finite decimals.",
        field="body",
        code="json_invalid",
    )


def _has_surrogate(s: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in s)


def _find_bad_string(obj: Any, loc: tuple[object, ...] = ()) -> tuple[object, ...] | None:
    """Location of the first string (key or value) holding a surrogate, or None."""
    if isinstance(obj, str):
        return loc if _has_surrogate(obj) else None
    if isinstance(obj, dict):
        for k, v in obj.items():
            if _has_surrogate(k):
                return (*loc, k.encode("utf-8", "replace").decode("utf-8"))
            found = _find_bad_string(v, (*loc, k))
            if found is not None:
                return found
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            found = _find_bad_string(v, (*loc, i))
            if found is not None:
                return found
    return None


def parse_json(body: bytes) -> Any:
    """Parse a JSON body; every problem is an :class:`InputError` naming the field."""
    if not body:
        raise InputError(
            "the request body is empty; send a JSON object.", field="body", code="body_missing"
        )
    bad_utf8 = False
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "surrogateescape")  # keep going to name the field
        bad_utf8 = True
    try:
        obj = json.loads(
            text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant
        )
    except json.JSONDecodeError as e:
        raise InputError(
            f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}.",
            field="body",
            code="json_invalid",
        ) from None
    except RecursionError:
        raise InputError(
            "the JSON body is nested too deeply.", field="body", code="json_invalid"
        ) from None
    except InputError:  # a duplicate key or a NaN constant, named by its hook
        raise
    except ValueError as e:  # e.g. an integer longer than Python converts (4300 digits)
        raise InputError(
            f"the JSON body holds a value that cannot be read: {e}.",
            field="body",
            code="json_invalid",
        ) from None
    loc = _find_bad_string(obj)
    if loc is not None:
        where = field_path(loc)
        if bad_utf8:
            msg = f"{where} is not valid UTF-8; send text as UTF-8."
            code = "invalid_utf8"
        else:
            msg = (
                f"{where} holds a lone surrogate escape (e.g. \\ud800), which is not Unicode text."
            )
            code = "invalid_unicode"
        raise InputError(msg, field=where, code=code)
    if bad_utf8:  # invalid bytes outside any string (e.g. in whitespace)
        raise InputError("the JSON body is not valid UTF-8.", field="body", code="invalid_utf8")
    return obj


# --------------------------------------------------------------------------- scenes


def check_text(
    value: str, *, field_name: str, what: str, limit: int | None = None, visible: bool = False
) -> str:
    """Not empty nor only whitespace (``empty_field``; with ``visible``, a request: nor only
    control and format characters, the guard's rule :func:`~spotstop.guard.validate.is_blank`)
    and, with ``limit``, at most ``limit`` characters (``text_too_long``); else an
    :class:`InputError` naming ``field_name``."""
    if not value.strip() or (visible and is_blank(value)):
        unseen = " (it holds no visible character)" if value.strip() else ""
        raise InputError(
            f"{field_name} is empty{unseen}; pass {what}.", field=field_name, code="empty_field"
        )
    if limit is not None and len(value) > limit:
        raise InputError(
            f"{field_name} has {len(value)} characters; the limit is {limit}. Shorten it "
            "(or raise the server's limit).",
            field=field_name,
            code="text_too_long",
        )
    return value


#: What the ``request`` field is, for the messages of :func:`check_text`.
REQUEST_WHAT = "the instruction the robot was given"


def _check_request(request: str, field_name: str, limits: Limits) -> str:
    check_text(
        request,
        field_name=field_name,
        limit=limits.max_request_chars,
        what=REQUEST_WHAT,
        visible=True,
    )
    try:
        limits.check_request(request)
    except RequestError as e:
        raise InputError(f"{field_name}: {e}", field=field_name, code="request_refused") from None
    return request


#: The situation id's rule as a JSON-Schema pattern (the request models carry it into the
#: OpenAPI schema): no control character (Unicode category Cc) and at least one non-space
#: character. It states what :func:`check_situation_id` checks; a test holds the two together.
SITUATION_ID_PATTERN: str = (
    r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f]"
    r"[^\u0000-\u001f\u007f-\u009f]*$"
)


def check_situation_id(sid: str | None, field_name: str, limit: int | None = None) -> str | None:
    """The sidecar's validator of situation ids (checks, batches, ``/v1/situations/{id}``, the
    JSON models): the guard's rule (:func:`~spotstop.guard.validate.situation_id_problem`) and,
    with ``limit``, at most ``limit`` characters."""
    if sid is None:
        return None
    check_text(sid, field_name=field_name, limit=limit, what="a situation id")
    problem = situation_id_problem(sid)  # the guard's rule (guard/validate.py)
    if problem is not None:
        raise InputError(f"{field_name} {problem}.", field=field_name, code="invalid_value")
    return sid


def _nonempty(data: bytes, field_name: str) -> bytes:
    if not data:
        raise ImageInputError(
            f"{field_name} has zero bytes; send the camera frame (JPEG, PNG or WebP).",
            field=field_name,
            kind="empty",
        )
    return data


def _decode(data: bytes, field_name: str, limits: Limits) -> DecodedImage:
    _nonempty(data, field_name)
    try:
        return decode_image(
            data,
            max_pixels=limits.max_pixels,
            max_bytes=limits.max_image_bytes,
            min_side=limits.min_side,
            min_contrast=limits.min_contrast,
        )
    except ImageRefused as e:
        msg = str(e) if field_name == "image" else f"{field_name}: {e}"  # "image has ..."
        raise ImageInputError(msg, field=field_name, kind=e.kind) from None
    except Exception as e:  # any other decoder fault on untrusted bytes is a corrupt image
        raise ImageInputError(
            f"{field_name} could not be decoded ({type(e).__name__}: {e}); send an intact "
            "JPEG, PNG or WebP file.",
            field=field_name,
            kind="corrupt",
        ) from None


def _b64(data: str, field_name: str, limits: Limits) -> bytes:
    if len(data) > (limits.max_image_bytes + 2) // 3 * 4:
        raise ImageInputError(
            f"{field_name} encodes more than {limits.max_image_bytes} bytes (max_image_bytes); "
            "send a smaller frame.",
            field=field_name,
            kind="too_large_bytes",
        )
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(
            f"{field_name} is not valid base64 ({e}); send standard base64 (RFC 4648, "
            "alphabet A-Z a-z 0-9 + /, '=' padding, no line breaks).",
            field=field_name,
            kind="bad_base64",
        ) from None


def scene_from_json(item: CheckJSON, limits: Limits, *, prefix: str = "") -> ParsedScene:
    """A validated JSON scene → a :class:`ParsedScene` (image base64-decoded, not decoded)."""
    request = _check_request(item.request, f"{prefix}request", limits)
    sid = check_situation_id(item.situation_id, f"{prefix}situation_id", limits.max_situation_chars)
    name = f"{prefix}image_base64"
    return ParsedScene(_nonempty(_b64(item.image_base64, name, limits), name), name, request, sid)


# -------------------------------------------------------------------------- multipart


@dataclass
class _Part:
    name: str | None = None
    filename: str | None = None
    content_type: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)


def _bad_multipart(message: str) -> InputError:
    return InputError(
        f"the multipart body is malformed: {message}", field="body", code="multipart_invalid"
    )


def parse_multipart(body: bytes, content_type: str) -> list[_Part]:
    """Split a ``multipart/form-data`` body into its parts (names, filenames, bytes)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise _bad_multipart("the Content-Type header has no boundary parameter.")
    parts: list[_Part] = []
    hdr_field = bytearray()
    hdr_value = bytearray()

    def on_part_begin() -> None:
        if len(parts) >= _MAX_PARTS:
            raise _bad_multipart(f"more than {_MAX_PARTS} parts.")
        parts.append(_Part())

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1].data += data[start:end]

    def on_header_field(data: bytes, start: int, end: int) -> None:
        hdr_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        hdr_value.extend(data[start:end])

    def on_header_end() -> None:
        parts[-1].headers.append((bytes(hdr_field).lower(), bytes(hdr_value)))
        hdr_field.clear()
        hdr_value.clear()

    try:
        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": on_part_begin,
                "on_part_data": on_part_data,
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
            },
        )
        parser.write(body)
        parser.finalize()
    except InputError:
        raise
    except Exception as e:  # python-multipart's parse errors (several classes) → 422
        raise _bad_multipart(f"{e}.") from None
    if parser.state != MultipartState.END:
        raise _bad_multipart("it ends before its closing boundary (truncated body?).")
    for p in parts:
        for name, value in p.headers:
            if name == b"content-disposition":
                kind, opts = parse_options_header(value)
                if kind != b"form-data":
                    raise _bad_multipart("a part's Content-Disposition is not form-data.")
                raw = opts.get(b"name")
                try:
                    p.name = raw.decode("utf-8") if raw is not None else None
                    fn = opts.get(b"filename")
                    p.filename = fn.decode("utf-8", "replace") if fn is not None else None
                except UnicodeDecodeError:
                    raise _bad_multipart("a part name is not valid UTF-8.") from None
            elif name == b"content-type":
                p.content_type = value.decode("latin-1")
        if p.name is None:
            raise _bad_multipart("a part has no Content-Disposition name.")
    return parts


def _text_part(p: _Part) -> str:
    name = p.name or "?"
    if p.filename is not None:
        raise InputError(
            f"{name} must be a text field, not a file upload.", field=name, code="wrong_type"
        )
    try:
        return bytes(p.data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{name} is not valid UTF-8 (byte {e.start}); send text as UTF-8.",
            field=name,
            code="invalid_utf8",
        ) from None


def scene_from_multipart(body: bytes, content_type: str, limits: Limits) -> ParsedScene:
    parts = parse_multipart(body, content_type)
    by_name: dict[str, _Part] = {}
    for p in parts:
        if p.name not in _PARTS:  # (parse_multipart made sure every part has a name)
            raise InputError(
                f"unknown field {p.name!r}; a multipart check takes {list(_PARTS)}.",
                field=str(p.name),
                code="extra_field",
            )
        if p.name in by_name:
            raise InputError(
                f"field {p.name!r} appears twice; send it once.",
                field=p.name,
                code="duplicate_field",
            )
        by_name[p.name] = p
    for required in ("image", "request"):
        if required not in by_name:
            raise InputError(
                f"field {required!r} is required.", field=required, code="missing_field"
            )
    image_part = by_name["image"]
    if image_part.filename is None:
        raise InputError(
            "image must be a file upload (a part with a filename), e.g. curl -F image=@cam.jpg.",
            field="image",
            code="wrong_type",
        )
    request = _check_request(_text_part(by_name["request"]), "request", limits)
    sid_part = by_name.get("situation_id")
    sid = check_situation_id(
        _text_part(sid_part) if sid_part else None, "situation_id", limits.max_situation_chars
    )
    if len(image_part.data) > limits.max_image_bytes:
        raise ImageInputError(
            f"image has {len(image_part.data)} bytes; the limit is {limits.max_image_bytes} "
            "(max_image_bytes). Send a smaller frame.",
            field="image",
            kind="too_large_bytes",
        )
    return ParsedScene(_nonempty(bytes(image_part.data), "image"), "image", request, sid)


# ------------------------------------------------------------------------------ entry


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    mt = media_type(content_type)
    return mt == "application/json" or mt.endswith("+json")


def require_json(content_type: str) -> None:
    """415 unless the body is JSON (``application/json`` or ``…+json``)."""
    if not is_json(content_type):
        mt = media_type(content_type)
        raise UnsupportedMediaType(
            f"Content-Type must be application/json; got {mt or 'none'!r}.",
            field="Content-Type",
        )
