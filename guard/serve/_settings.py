"""The sidecar's settings: bind address, auth token, limits, deadline, queue, the log's keeping.

:class:`ServeSettings` is validated when it is built (every option named in its message), so
a bad configuration is refused before anything is loaded or bound. :func:`load_serve_config`
reads the same keys from a YAML file (``spotstop serve --config``), naming any unknown key.
The token is resolved from a file or an environment variable by :func:`resolve_token`; it
never appears in ``repr`` or in logs (nor in the YAML file: name ``token_file`` or
``token_env`` there).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spotstop.guard._call import check_deadline
from spotstop.guard._errors import GuardError
from spotstop.guard._image import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_CONTRAST,
    DEFAULT_MIN_SIDE,
    check_min_contrast,
)
from spotstop.guard._log_options import DEFAULT_MIN_FREE_BYTES, LogOptions, parse_bytes
from spotstop.guard._prompt import MAX_REQUEST_CHARS
from spotstop.guard._types import VARIANTS, Variant
from spotstop.guard.serve._errors import InsecureBindError, SettingsError
from spotstop.guard.validate import CSV_ENCODING, MAX_SITUATION_CHARS, is_real, load_yaml

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TOKEN_ENV",
    "MIN_TOKEN_CHARS",
    "ServeSettings",
    "is_loopback",
    "load_serve_config",
    "resolve_token",
]

DEFAULT_PORT: Final[int] = 8750
DEFAULT_TOKEN_ENV: Final[str] = "SPOTSTOP_TOKEN"
"""Environment variable read for the bearer token when no token file is given."""
MIN_TOKEN_CHARS: Final[int] = 16
"""Shortest accepted bearer token (e.g. ``openssl rand -hex 32`` gives 64)."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def resolve_token(
    token_file: str | os.PathLike[str] | None = None,
    token_env: str | None = DEFAULT_TOKEN_ENV,
) -> str | None:
    """The bearer token from ``token_file`` (first; surrounding whitespace stripped) or
    the environment variable ``token_env``; None when neither gives one.

    Raises :class:`SettingsError` for an unreadable or empty token file.
    """
    if token_file is not None:
        path = Path(token_file)
        try:
            text = path.read_text(encoding=CSV_ENCODING)  # (a byte-order mark is no token's)
        except (OSError, UnicodeDecodeError) as e:
            raise SettingsError(
                f"--token-file {str(path)!r} cannot be read ({e}). Point it at a UTF-8 text "
                "file holding the bearer token."
            ) from e
        token = text.strip()
        if not token:
            raise SettingsError(
                f"--token-file {str(path)!r} is empty. Write a token into it, e.g. "
                "`openssl rand -hex 32 > FILE`."
            )
        return token
    if token_env:
        value = os.environ.get(token_env, "").strip()
        return value or None
    return None


def _positive_seconds(name: str, value: object, alternative: str = "") -> None:
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        raise SettingsError(
            f"{name} must be a positive number of seconds{alternative}; got {value!r}."
        )


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingsError(f"{name} must be a positive integer; got {value!r}.")
    return value


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """Everything ``spotstop serve`` needs. All limits are checked at construction.

    Attributes
    ----------
    bundle:
        The bundle folder (members, ``policy.yaml``).
    host, port:
        Bind address. Loopback (the default ``127.0.0.1``) needs no token; any other
        address needs ``token``, otherwise :class:`InsecureBindError` is raised.
    token:
        The bearer token every ``/v1/*`` and ``/metrics`` request must carry (compared in
        constant time). None: no auth (loopback only). Hidden from ``repr``.
    log:
        Decision log path (default ``<bundle>/decisions.sqlite``).
    deadline_s:
        Budget of one check request from the moment its body is in: queue wait, image
        decoding, scoring, policy and the log write. Spent before the guard call → 503 and no
        decision; spent while scoring → a logged fail-closed UNSAFE; the log not written
        within it → 503 ``decision_not_logged`` (never a 200 without a row). None: no
        deadline.
    upload_timeout_s:
        Most seconds the request body may take to arrive, from the request's headers. Past
        it → 408 ``upload_timeout`` and the connection is closed (a stalled half-sent body
        holds nothing longer). Not part of ``deadline_s``.
    max_body_bytes:
        Largest request body (413 above it, checked from ``Content-Length`` and while reading).
    max_image_bytes, max_pixels:
        Largest encoded image and largest ``width * height`` (checked from the header).
    min_image_side:
        Smallest accepted image width and height in pixels (422 ``image_too_small`` below
        it; checked from the header): a smaller frame cannot show a scene.
    min_image_contrast:
        Smallest :func:`~spotstop.guard._image.image_contrast` of a decoded frame, in levels
        0..255 (default 8; 0 turns the check off): a frame below it shows nothing (a covered
        lens, a frame blown out to white, a gray or one-colour fill) and is refused (422
        ``image_blank``) rather than judged from its request alone.
    max_request_chars:
        Longest request text (the members' own limit also applies).
    max_situation_chars:
        Longest situation id.
    max_batch:
        Most scenes in one ``/v1/check/batch`` call (at most ``queue_size``).
    queue_size:
        Most scenes admitted to the model queue at once (running + waiting); beyond it a
        check is answered 503 with ``Retry-After``.
    max_labels:
        Most labels in one ``/v1/labels`` call.
    variants:
        Passes the guard runs per scene (``scene`` always; ``gray``/``text`` for diagnostics).
    state_dir:
        Where the guard keeps a stateful policy's live state (default: ``state/`` next to
        the log).
    device:
        Device of the members' backend.
    backend:
        Run every member on this backend instead of the one the manifest names (e.g.
        ``tensorrt`` with device ``cuda``: the engines built on the device by the bundle's
        ``trt/build.sh``). None: as the manifest says.
    threads:
        CPU threads of the members' backend (intra-op). None: the library default (all
        cores). ``spotstop serve`` defaults to all cores but one, so the HTTP side and the
        planner keep a core: on 2 cores the tiny pair scored in 66 ms per scene with 2
        threads inside the server and 36 ms with 1 (measured here, see the CHANGELOG).
    warmup:
        Score one generated image with every member at startup (not logged: it is not a
        decision); ``/readyz`` answers 200 only after it succeeded.
    sighup:
        Reload the policy on SIGHUP (only where the server runs in the main thread).
    journal:
        Where decisions wait on disk while the log cannot be written (default
        ``$XDG_STATE_HOME/spotstop/journal/``); put it on another file system than the log.
    log_max_bytes, log_keep_days:
        The log's disk budget: older decisions are archived as Parquet beside the log, then
        removed from it (None: no budget).
    log_min_free_bytes:
        Free space the log's file system must keep (default 32 MiB); below it the log counts
        as full: checks fail closed (503) and ``/readyz`` says so, before SQLite fills it.
    log_retry_s:
        While the log cannot be written or decisions wait, the sidecar retries it this often
        (default 1 s): once it takes writes again, checks are answered again without a restart.
    robot_id:
        The robot the log belongs to, kept in the log for the fleet card (None: as the log
        says).
    log_synchronous:
        ``"FULL"`` (default): a 200 is sent only once its row is fsynced (it survives a power
        cut); ``"NORMAL"``: it survives a crash of the process only.
    """

    bundle: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = field(default=None, repr=False)
    log: Path | None = None
    deadline_s: float | None = 10.0
    upload_timeout_s: float = 10.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_image_bytes: int = 12 * 1024 * 1024
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_image_side: int = DEFAULT_MIN_SIDE
    min_image_contrast: float = DEFAULT_MIN_CONTRAST
    max_request_chars: int = MAX_REQUEST_CHARS
    max_situation_chars: int = 256
    max_batch: int = 16
    queue_size: int = 32
    max_labels: int = 10_000
    variants: tuple[Variant, ...] = ("scene",)
    state_dir: Path | None = None
    device: str = "cpu"
    backend: str | None = None
    threads: int | None = None
    warmup: bool = True
    sighup: bool = True
    journal: Path | None = None
    log_max_bytes: int | None = None
    log_keep_days: float | None = None
    log_min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    log_retry_s: float = 1.0
    robot_id: str | None = None
    log_synchronous: str = "FULL"

    def __post_init__(self) -> None:
        _check_settings(self)

    @property
    def log_options(self) -> LogOptions:
        """How the guard keeps its log (journal, budget, free-space floor)."""
        return LogOptions(
            journal=self.journal,
            max_bytes=self.log_max_bytes,
            keep_days=self.log_keep_days,
            min_free_bytes=self.log_min_free_bytes,
            robot_id=self.robot_id,
            synchronous="NORMAL" if self.log_synchronous == "NORMAL" else "FULL",
        )

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def auth(self) -> bool:
        """Whether requests must carry the bearer token."""
        return self.token is not None


def _check_settings(s: ServeSettings) -> None:
    if not isinstance(s.bundle, Path):
        object.__setattr__(s, "bundle", Path(s.bundle))
    if s.log is not None and not isinstance(s.log, Path):
        object.__setattr__(s, "log", Path(s.log))
    if s.state_dir is not None and not isinstance(s.state_dir, Path):
        object.__setattr__(s, "state_dir", Path(s.state_dir))
    if s.journal is not None and not isinstance(s.journal, Path):
        object.__setattr__(s, "journal", Path(s.journal))
    _positive_seconds("log_retry_s", s.log_retry_s)
    if s.log_max_bytes is not None:
        _positive_int("log_max_bytes", s.log_max_bytes)
    if s.log_keep_days is not None and (
        isinstance(s.log_keep_days, bool)
        or not isinstance(s.log_keep_days, int | float)
        or not math.isfinite(s.log_keep_days)
        or s.log_keep_days <= 0
    ):
        raise SettingsError(
            f"log_keep_days must be a positive number of days or None; got {s.log_keep_days!r}."
        )
    if (
        isinstance(s.log_min_free_bytes, bool)
        or not isinstance(s.log_min_free_bytes, int)
        or (s.log_min_free_bytes < 0)
    ):
        raise SettingsError(
            f"log_min_free_bytes must be a non-negative integer; got {s.log_min_free_bytes!r}."
        )
    if s.log_synchronous not in ("FULL", "NORMAL"):
        raise SettingsError(
            f"log_synchronous must be 'FULL' or 'NORMAL'; got {s.log_synchronous!r}."
        )
    if s.robot_id is not None:
        from spotstop.guard._log import ROBOT_ID

        if not isinstance(s.robot_id, str) or not ROBOT_ID.fullmatch(s.robot_id):
            raise SettingsError(
                f"robot_id must be 1-64 characters of letters, digits, '.', '_' or '-'; got "
                f"{s.robot_id!r}."
            )
    for name in ("warmup", "sighup"):  # a YAML 'false' in quotes is a string, and truthy
        if not isinstance(getattr(s, name), bool):
            raise SettingsError(f"{name} must be true or false; got {getattr(s, name)!r}.")
    if not isinstance(s.device, str) or not s.device:
        raise SettingsError(
            f"device must be a device name such as 'cpu', 'cuda' or 'cuda:0'; got {s.device!r}."
        )
    if not isinstance(s.host, str) or not s.host:
        raise SettingsError(f"host must be a non-empty string; got {s.host!r}.")
    if isinstance(s.port, bool) or not isinstance(s.port, int) or not 0 <= s.port <= 65535:
        raise SettingsError(f"port must be an integer in [0, 65535]; got {s.port!r}.")
    try:  # the guard's own rule for a call's deadline
        check_deadline(s.deadline_s)
    except GuardError as e:
        raise SettingsError(str(e)) from None
    _positive_seconds("upload_timeout_s", s.upload_timeout_s)
    try:  # the guard's own rule for the setting
        object.__setattr__(s, "min_image_contrast", check_min_contrast(s.min_image_contrast))
    except GuardError as e:
        raise SettingsError(str(e)) from None
    for name in (
        "max_body_bytes",
        "min_image_side",
        "max_image_bytes",
        "max_pixels",
        "max_request_chars",
        "max_situation_chars",
        "max_batch",
        "queue_size",
        "max_labels",
    ):
        _positive_int(name, getattr(s, name))
    if s.max_situation_chars > MAX_SITUATION_CHARS:
        raise SettingsError(
            f"max_situation_chars must be at most {MAX_SITUATION_CHARS} (the library's own "
            f"limit on a situation id); got {s.max_situation_chars}."
        )
    if s.threads is not None:
        _positive_int("threads", s.threads)
    if s.backend is not None:
        from spotstop.guard.backends import BACKENDS

        if s.backend not in BACKENDS:
            raise SettingsError(
                f"backend must be one of {sorted(BACKENDS)} or None; got {s.backend!r}."
            )
    if s.max_batch > s.queue_size:
        raise SettingsError(
            f"max_batch ({s.max_batch}) must not exceed queue_size ({s.queue_size}): a batch "
            "larger than the queue could never be admitted. Raise --queue-size or lower "
            "--max-batch."
        )
    variants = tuple(s.variants)
    if "scene" not in variants or any(v not in VARIANTS for v in variants):
        raise SettingsError(
            f"variants must include 'scene' and only {list(VARIANTS)}; got {list(variants)}."
        )
    object.__setattr__(s, "variants", variants)
    if s.token is not None:
        if not isinstance(s.token, str) or len(s.token) < MIN_TOKEN_CHARS:
            raise SettingsError(
                f"the bearer token must have at least {MIN_TOKEN_CHARS} characters; got "
                f"{len(s.token) if isinstance(s.token, str) else type(s.token).__name__}. "
                "Make one with `openssl rand -hex 32`."
            )
        if not s.token.isascii() or not s.token.isprintable() or " " in s.token:
            raise SettingsError(
                "the bearer token must be printable ASCII without spaces (it travels in an "
                "HTTP header). Make one with `openssl rand -hex 32`."
            )
    if not is_loopback(s.host) and s.token is None:
        raise InsecureBindError(
            f"refusing to bind {s.host!r} without a bearer token: only loopback addresses "
            f"(127.0.0.1, ::1, localhost) may serve without auth. Set ${DEFAULT_TOKEN_ENV} or "
            "pass --token-file FILE (e.g. `openssl rand -hex 32 > FILE`), or bind 127.0.0.1."
        )


_NOT_IN_FILE: Final = ("token",)  # the token itself never sits in a config file
_FILE_ONLY: Final = ("token_file", "token_env")
_BYTE_KEYS: Final = (
    "log_max_bytes",
    "log_min_free_bytes",
    "max_body_bytes",
    "max_image_bytes",
)
_PATH_KEYS: Final = ("bundle", "log", "state_dir", "journal", "token_file")


def load_serve_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The keys of a serve config file (YAML mapping of :class:`ServeSettings` fields, plus
    ``token_file``/``token_env``), checked by name; values are checked when the settings are
    built. Relative paths are taken from the file's folder; byte sizes may carry a unit
    (``log_max_bytes: 2G``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"serve config {str(p)!r} cannot be read: {e}") from e
    raw = load_yaml(text, source=f"serve config {str(p)!r}", error=SettingsError)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SettingsError(
            f"serve config {str(p)!r} must be a YAML mapping of settings; got {type(raw).__name__}."
        )
    allowed = sorted(
        {f.name for f in dataclasses.fields(ServeSettings)} - set(_NOT_IN_FILE) | set(_FILE_ONLY)
    )
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            why = " (name token_file or token_env instead)" if key in _NOT_IN_FILE else ""
            raise SettingsError(
                f"serve config {str(p)!r}: {key!r} is not a known key{why}; allowed: "
                f"{allowed}.{hint}"
            )
        if key in _BYTE_KEYS and value is not None:
            try:
                value = parse_bytes(value, f"serve config {str(p)!r}: {key}")
            except ValueError as e:
                raise SettingsError(str(e)) from e
        if key == "token_env" and value is not None and (not isinstance(value, str) or not value):
            raise SettingsError(
                f"serve config {str(p)!r}: token_env must name an environment variable (e.g. "
                f"{DEFAULT_TOKEN_ENV}); got {value!r}."
            )
        if key in _PATH_KEYS and value is not None:
            if not isinstance(value, str):
                raise SettingsError(
                    f"serve config {str(p)!r}: {key} must be a path (string); got {value!r}."
                )
            value = Path(value) if Path(value).is_absolute() else p.parent / value
        if key == "variants" and isinstance(value, list):
            value = tuple(value)
        out[key] = value
    return out
