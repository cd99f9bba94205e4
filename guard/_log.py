"""The guard's decision log: one row per decision in a SQLite file, read back as records or arrays.

The log is the hinge between the robot and the offline rooms: the guard appends one
:class:`DecisionRecord` per decision, reviewers attach labels, and ``calibrate`` /
``diagnostics`` read it back with :meth:`DecisionLog.to_arrays` or an export.

Storage
-------
* SQLite in WAL mode. :meth:`DecisionLog.append` returns only after its transaction has
  committed; that return is the acknowledgement. A committed write survives a SIGKILL of
  the writing process (see ``_SYNCHRONOUS`` below for the power-loss story).
* Thread-safe (one connection per thread) and multi-process safe: several processes may
  append to the same file; a busy database is waited on (``busy_timeout``) and retried with
  bounded backoff up to ``timeout_s``, then a :class:`LogError` says so.
* Versioned: a ``meta`` table records the ``schema_version``; a log written by a newer
  spotstop is refused instead of misread.
* NaN stays NaN: scores are stored as JSON with non-finite values spelled ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"`` (JSON itself has no NaN), and the scalar columns map a
  NaN to SQL ``NULL`` (SQLite stores NaN as NULL) and back.
* Images (off by default) are kept in an ``images`` table keyed by SHA-256 and pruned on
  every write, by age and by total size, oldest first.

Times are seconds since the Unix epoch (UTC) as ``float``; ``DecisionRecord.time_utc``
gives the ISO-8601 spelling.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import hashlib
import json
import math
import numbers
import os
import random
import sqlite3
import threading
import time as _time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import numpy as np
from spotstop.guard._errors import GuardError

__all__ = [
    "SCHEMA_VERSION",
    "DecisionLog",
    "DecisionRecord",
    "LogArrays",
    "LogError",
    "RecordError",
]

SCHEMA_VERSION: Final = 1
"""Version of the decision-log schema this module writes and reads."""

_T = TypeVar("_T")

# In WAL mode, synchronous=NORMAL already makes a committed transaction survive a crash of
# the *process* (SIGKILL, segfault, OOM kill): COMMIT returns only after the transaction's
# frames have been write()n to the -wal file, i.e. handed to the operating system, and the
# OS keeps them whatever happens to the process. What NORMAL gives up is durability across
# an OS crash or power loss: the last transactions before the cut may roll back (the file
# stays consistent, never corrupt). FULL adds an fsync of the WAL on every commit, which
# closes that gap at the cost of one fsync per decision (milliseconds on SD/eMMC storage).
# The default is NORMAL; pass synchronous="FULL" on robots that lose power abruptly.
_SYNCHRONOUS: Final = "NORMAL"

_LABELS: Final = ("SAFE", "UNSAFE")
_REVIEW_LABELS: Final = ("safe", "unsafe")
_NONFINITE_TO_JSON: Final = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_JSON_TO_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_DEFAULT_RETENTION_BYTES: Final = 1 << 30  # 1 GiB
_DEFAULT_RETENTION_DAYS: Final = 30.0
_PAGE_ROWS: Final = 1000


class LogError(GuardError, RuntimeError):
    """The decision log could not be opened, read or written (schema, lock, closed, I/O)."""


class RecordError(GuardError, ValueError):
    """A record, label or argument handed to the decision log is invalid."""


# --------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------


def _new_decision_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class DecisionRecord:
    """One guard decision as it is logged (schema_version 1).

    All fields are keyword-only. ``time`` and ``decision_id`` default to now and a fresh
    uuid4. A record is validated when it is built; an invalid one raises
    :class:`RecordError` naming the field.
    """

    time: float = field(default_factory=_time.time)
    """Decision time, seconds since the Unix epoch (UTC), finite. See ``time_utc``."""

    decision_id: str = field(default_factory=_new_decision_id)
    """Unique id of the decision (uuid4 hex by default); the log's primary key."""

    situation_id: str | None = None
    """Deployment situation (place, task, camera) the scene belongs to; None if unknown."""

    request: str
    """What the robot was asked to do, verbatim (any unicode)."""

    image_sha256: str | None = None
    """SHA-256 hex digest of the encoded image bytes; None when no image was given."""

    width: int | None = None
    """Decoded image width in pixels; None if no image or decoding failed."""

    height: int | None = None
    """Decoded image height in pixels; None if no image or decoding failed."""

    n_bytes: int | None = None
    """Size of the encoded image file in bytes; None if no image."""

    image_format: str | None = None
    """Encoded image format as decoded (e.g. ``"JPEG"``, ``"PNG"``); None if unknown."""

    member_scores: dict[str, float]
    """Per member: scene score ``log p(UNSAFE) - log p(SAFE)``; NaN where the member failed."""

    member_scores_gray: dict[str, float] | None = None
    """Per member: score on the content-free gray image with the same request; None if not run."""

    member_scores_text: dict[str, float] | None = None
    """Per member: request-only score (no image); None if that pass was not run."""

    fused_score: float
    """Fused score S (Avg-2 robust z average); NaN when fusion could not be computed."""

    threshold: float
    """Threshold the policy applied to ``fused_score``; NaN when none applied (fail closed)."""

    policy: str
    """Name of the threshold policy: direct, frozen, batch, situation or conformal."""

    label: Literal["SAFE", "UNSAFE"]
    """The guard's answer: ``"SAFE"`` or ``"UNSAFE"``."""

    fail_closed: bool
    """True when the guard answered UNSAFE because something failed, not because of the score."""

    fail_reason: str | None = None
    """Why the guard failed closed (error class and message); None otherwise."""

    latency_ms: dict[str, float]
    """Wall time per stage in milliseconds (e.g. ``decode``, member names, ``total``)."""

    bundle_id: str
    """Id of the model bundle that scored the scene."""

    prompt_hash: str
    """Hash of the prompt template the bundle used; with ``bundle_id`` it keys the policy."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record's schema; always ``SCHEMA_VERSION`` for records written now."""

    def __post_init__(self) -> None:
        _check_record(self)

    @property
    def time_utc(self) -> str:
        """``time`` as ISO-8601 UTC, e.g. ``2025-01-31T12:00:00.123456+00:00``."""
        return _dt.datetime.fromtimestamp(self.time, tz=_dt.UTC).isoformat()


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _check_scores(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Mapping):
        allowed = "a dict of name -> float" + (" or None" if optional else "")
        raise RecordError(
            f"DecisionRecord.{name} must be {allowed}; got {type(value).__name__}. "
            "Pass e.g. {'member_a': 1.25}."
        )
    for key, score in value.items():
        if not isinstance(key, str) or not key:
            raise RecordError(
                f"DecisionRecord.{name} keys must be non-empty strings; got {key!r}. "
                "Use the member or stage name as key."
            )
        if not _is_real(score):
            raise RecordError(
                f"DecisionRecord.{name}[{key!r}] must be a real number (NaN allowed); "
                f"got {score!r} ({type(score).__name__}). Use float('nan') for a missing score."
            )


def _check_optional_str(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise RecordError(
            f"DecisionRecord.{name} must be a str or None; got {type(value).__name__} {value!r}."
        )


def _check_record(r: DecisionRecord) -> None:
    if not _is_real(r.time) or not math.isfinite(float(r.time)):
        raise RecordError(
            f"DecisionRecord.time must be a finite float (seconds since the Unix epoch, UTC); "
            f"got {r.time!r}. Use time.time()."
        )
    if not isinstance(r.decision_id, str) or not r.decision_id:
        raise RecordError(
            f"DecisionRecord.decision_id must be a non-empty str; got {r.decision_id!r}. "
            "Leave it out to get a fresh uuid4 hex."
        )
    for name in ("request", "policy", "bundle_id", "prompt_hash"):
        if not isinstance(getattr(r, name), str):
            raise RecordError(
                f"DecisionRecord.{name} must be a str; got "
                f"{type(getattr(r, name)).__name__} {getattr(r, name)!r}."
            )
    for name in ("situation_id", "image_sha256", "image_format", "fail_reason"):
        _check_optional_str(name, getattr(r, name))
    for name in ("width", "height", "n_bytes"):
        v = getattr(r, name)
        if v is not None and (
            not isinstance(v, numbers.Integral) or isinstance(v, bool | np.bool_) or v < 0
        ):
            raise RecordError(
                f"DecisionRecord.{name} must be a non-negative int or None; got {v!r}."
            )
    _check_scores("member_scores", r.member_scores, optional=False)
    _check_scores("member_scores_gray", r.member_scores_gray, optional=True)
    _check_scores("member_scores_text", r.member_scores_text, optional=True)
    _check_scores("latency_ms", r.latency_ms, optional=False)
    for name in ("fused_score", "threshold"):
        if not _is_real(getattr(r, name)):
            raise RecordError(
                f"DecisionRecord.{name} must be a float (NaN allowed); got "
                f"{getattr(r, name)!r}. Use float('nan') when there is none."
            )
    if r.label not in _LABELS:
        raise RecordError(
            f"DecisionRecord.label must be one of {list(_LABELS)}; got {r.label!r}. "
            "Labels of the guard are upper case; reviewer labels go to DecisionLog.set_labels."
        )
    if not isinstance(r.fail_closed, bool | np.bool_):
        raise RecordError(f"DecisionRecord.fail_closed must be a bool; got {r.fail_closed!r}.")
    if r.schema_version != SCHEMA_VERSION:
        raise RecordError(
            f"DecisionRecord.schema_version must be {SCHEMA_VERSION} (the version this "
            f"spotstop writes); got {r.schema_version!r}. Leave it at its default."
        )


# --------------------------------------------------------------------------------------
# Encoding helpers
# --------------------------------------------------------------------------------------


def _encode_float(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return _NONFINITE_TO_JSON[repr(x)]


def _decode_float(x: float | int | str) -> float:
    if isinstance(x, str):
        return _JSON_TO_NONFINITE[x]
    return float(x)


def _scores_to_json(scores: Mapping[str, float] | None) -> str | None:
    if scores is None:
        return None
    return json.dumps(
        {k: _encode_float(v) for k, v in scores.items()},
        allow_nan=False,
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _scores_from_json(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    raw = json.loads(text)
    return {k: _decode_float(v) for k, v in raw.items()}


def _real_to_sql(x: float) -> float | None:
    # SQLite turns a NaN REAL into NULL; do it explicitly so the mapping is documented.
    x = float(x)
    return None if math.isnan(x) else x


def _real_from_sql(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _opt_int(x: int | None) -> int | None:
    return None if x is None else int(x)


def _to_epoch(name: str, value: float | _dt.datetime | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise RecordError(
                f"{name} is a naive datetime ({value!r}); the log's times are UTC. Pass an "
                "aware datetime (e.g. datetime.now(timezone.utc)) or seconds since the epoch."
            )
        return value.timestamp()
    if not _is_real(value) or math.isnan(float(value)):
        raise RecordError(
            f"{name} must be seconds since the Unix epoch (float), an aware datetime or None; "
            f"got {value!r}."
        )
    return float(value)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


# --------------------------------------------------------------------------------------
# Arrays for calibrate / diagnostics
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class LogArrays:
    """The log as aligned numpy arrays, one entry per decision, in log order.

    Every array has length ``n``; index i of every array refers to the same decision.
    """

    decision_id: np.ndarray
    """Decision ids (object array of str)."""

    time: np.ndarray
    """Decision times, seconds since the Unix epoch (float64)."""

    situation_id: np.ndarray
    """Situation ids (object array of str or None)."""

    request: np.ndarray
    """Requests (object array of str)."""

    fused: np.ndarray
    """Fused scores S (float64, NaN kept)."""

    threshold: np.ndarray
    """Thresholds the policy applied (float64, NaN kept)."""

    member_scores: dict[str, np.ndarray]
    """Member name -> scene scores (float64; NaN where the member has no score)."""

    member_scores_gray: dict[str, np.ndarray]
    """Member name -> gray-image scores (float64; NaN where not run)."""

    member_scores_text: dict[str, np.ndarray]
    """Member name -> request-only scores (float64; NaN where not run)."""

    guard_label: np.ndarray
    """The guard's answer as int8: 1 UNSAFE, 0 SAFE."""

    label: np.ndarray
    """Reviewer label from the labels table as int8: 1 unsafe, 0 safe, -1 unlabelled."""

    contrast_id: np.ndarray
    """Contrast id from the labels table (object array of str or None)."""

    width: np.ndarray
    """Image width in pixels (float64; NaN where missing)."""

    height: np.ndarray
    """Image height in pixels (float64; NaN where missing)."""

    n_bytes: np.ndarray
    """Encoded image size in bytes (float64; NaN where missing)."""

    image_format: np.ndarray
    """Image format (object array of str or None)."""

    fail_closed: np.ndarray
    """Whether the guard failed closed (bool)."""

    policy: np.ndarray
    """Policy names (object array of str)."""

    bundle_id: np.ndarray
    """Bundle ids (object array of str)."""

    prompt_hash: np.ndarray
    """Prompt hashes (object array of str)."""

    @property
    def n(self) -> int:
        """Number of decisions."""
        return int(self.decision_id.shape[0])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        labelled = int(np.count_nonzero(self.label >= 0))
        return (
            f"LogArrays(n={self.n}, members={sorted(self.member_scores)}, "
            f"labelled={labelled}, fail_closed={int(np.count_nonzero(self.fail_closed))})"
        )


# --------------------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------------------

_SCHEMA_SQL: Final = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY,
    time REAL NOT NULL,
    situation_id TEXT,
    request TEXT NOT NULL,
    image_sha256 TEXT,
    width INTEGER,
    height INTEGER,
    n_bytes INTEGER,
    image_format TEXT,
    member_scores TEXT NOT NULL,
    member_scores_gray TEXT,
    member_scores_text TEXT,
    fused_score REAL,
    threshold REAL,
    policy TEXT NOT NULL,
    label TEXT NOT NULL CHECK (label IN ('SAFE', 'UNSAFE')),
    fail_closed INTEGER NOT NULL,
    fail_reason TEXT,
    latency_ms TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    prompt_hash TEXT NOT NULL,
    schema_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time);
CREATE INDEX IF NOT EXISTS decisions_situation ON decisions (situation_id, time);
CREATE TABLE IF NOT EXISTS labels (
    decision_id TEXT PRIMARY KEY REFERENCES decisions (decision_id),
    label TEXT NOT NULL CHECK (label IN ('safe', 'unsafe')),
    contrast_id TEXT,
    reviewer TEXT,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    n_bytes INTEGER NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS images_time ON images (time);
"""

_COLUMNS: Final = (
    "decision_id",
    "time",
    "situation_id",
    "request",
    "image_sha256",
    "width",
    "height",
    "n_bytes",
    "image_format",
    "member_scores",
    "member_scores_gray",
    "member_scores_text",
    "fused_score",
    "threshold",
    "policy",
    "label",
    "fail_closed",
    "fail_reason",
    "latency_ms",
    "bundle_id",
    "prompt_hash",
    "schema_version",
)
_SELECT: Final = "SELECT " + ", ".join(f"d.{c}" for c in _COLUMNS)
_INSERT: Final = (
    f"INSERT INTO decisions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)


def _record_to_row(r: DecisionRecord) -> tuple[Any, ...]:
    return (
        r.decision_id,
        float(r.time),
        r.situation_id,
        r.request,
        r.image_sha256,
        _opt_int(r.width),
        _opt_int(r.height),
        _opt_int(r.n_bytes),
        r.image_format,
        _scores_to_json(r.member_scores),
        _scores_to_json(r.member_scores_gray),
        _scores_to_json(r.member_scores_text),
        _real_to_sql(r.fused_score),
        _real_to_sql(r.threshold),
        r.policy,
        r.label,
        int(bool(r.fail_closed)),
        r.fail_reason,
        _scores_to_json(r.latency_ms),
        r.bundle_id,
        r.prompt_hash,
        int(r.schema_version),
    )


def _row_to_record(row: Sequence[Any]) -> DecisionRecord:
    v = dict(zip(_COLUMNS, row, strict=False))
    return DecisionRecord(
        decision_id=v["decision_id"],
        time=float(v["time"]),
        situation_id=v["situation_id"],
        request=v["request"],
        image_sha256=v["image_sha256"],
        width=v["width"],
        height=v["height"],
        n_bytes=v["n_bytes"],
        image_format=v["image_format"],
        member_scores=_scores_from_json(v["member_scores"]) or {},
        member_scores_gray=_scores_from_json(v["member_scores_gray"]),
        member_scores_text=_scores_from_json(v["member_scores_text"]),
        fused_score=_real_from_sql(v["fused_score"]),
        threshold=_real_from_sql(v["threshold"]),
        policy=v["policy"],
        label=v["label"],
        fail_closed=bool(v["fail_closed"]),
        fail_reason=v["fail_reason"],
        latency_ms=_scores_from_json(v["latency_ms"]) or {},
        bundle_id=v["bundle_id"],
        prompt_hash=v["prompt_hash"],
        schema_version=int(v["schema_version"]),
    )


def _check_log_args(
    path: str | os.PathLike[str],
    image_retention_bytes: int | None,
    image_retention_days: float | None,
    timeout_s: float,
    synchronous: str,
) -> Path:
    if str(path) in ("", ":memory:") or str(path).startswith("file:"):
        raise RecordError(
            f"DecisionLog path must be a file path; got {str(path)!r}. The log opens one "
            "connection per thread and process, so an in-memory database cannot be shared. "
            "Pass e.g. 'decisions.sqlite'."
        )
    if image_retention_bytes is not None and (
        not isinstance(image_retention_bytes, numbers.Integral)
        or isinstance(image_retention_bytes, bool)
        or image_retention_bytes < 0
    ):
        raise RecordError(
            "DecisionLog image_retention_bytes must be a non-negative int or None (no size "
            f"limit); got {image_retention_bytes!r}."
        )
    if image_retention_days is not None and (
        not _is_real(image_retention_days) or not float(image_retention_days) > 0
    ):
        raise RecordError(
            "DecisionLog image_retention_days must be a positive number or None (no age "
            f"limit); got {image_retention_days!r}."
        )
    if not _is_real(timeout_s) or not (0 < float(timeout_s) < math.inf):
        raise RecordError(
            f"DecisionLog timeout_s must be a positive finite number of seconds; got {timeout_s!r}."
        )
    if synchronous not in ("NORMAL", "FULL"):
        raise RecordError(
            f"DecisionLog synchronous must be 'NORMAL' or 'FULL'; got {synchronous!r}. "
            "NORMAL survives a process kill; FULL also survives power loss."
        )
    return Path(path)


class DecisionLog:
    """Append-only log of guard decisions in one SQLite file (WAL mode).

    Parameters
    ----------
    path:
        The SQLite file; created with its schema if absent.
    store_images:
        Keep the encoded image bytes passed to :meth:`append` (off by default).
    image_retention_bytes:
        Keep at most this many image bytes in total; the oldest images are pruned first on
        every write. None: no size limit. Default 1 GiB.
    image_retention_days:
        Prune images whose decision is older than this many days. None: no age limit.
        Default 30 days.
    timeout_s:
        How long a write or read waits for a busy database (other writers) before
        :class:`LogError` is raised.
    synchronous:
        ``"NORMAL"`` (default): an acknowledged write survives a kill of the process.
        ``"FULL"``: it also survives an OS crash or power loss (one fsync per commit).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        store_images: bool = False,
        image_retention_bytes: int | None = _DEFAULT_RETENTION_BYTES,
        image_retention_days: float | None = _DEFAULT_RETENTION_DAYS,
        timeout_s: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = _SYNCHRONOUS,
    ) -> None:
        self._path = _check_log_args(
            path, image_retention_bytes, image_retention_days, timeout_s, synchronous
        )
        self._store_images = bool(store_images)
        self._retention_bytes = image_retention_bytes
        self._retention_days = image_retention_days
        self._timeout_s = float(timeout_s)
        self._synchronous = synchronous
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[int, sqlite3.Connection]] = []
        self._closed = False
        self._rng = random.Random()  # backoff jitter only; results never depend on it
        self._init_schema()

    # -- connections ---------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self._timeout_s,  # sets SQLite's busy_timeout
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # only so close() may close it from another thread
            )
        except sqlite3.Error as exc:
            raise LogError(
                f"cannot open decision log {str(self._path)!r}: {exc}. Check that the folder "
                "exists and is writable."
            ) from exc
        try:
            self._retry(lambda: self._configure(conn), what="configure the connection")
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LogError(
                f"decision log {str(self._path)!r} could not be put in WAL mode (journal_mode "
                f"is {mode!r}). Put the log on a local file system that supports shared "
                "memory (not a network share)."
            )
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise LogError(
                f"decision log {str(self._path)!r} is closed. Open a new DecisionLog to use it."
            )
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != pid:
            # A connection inherited across fork() must not be used (SQLite's rule); it is
            # abandoned, not closed, so the parent's locks are left alone.
            conn = self._connect()
            self._local.conn = conn
            self._local.pid = pid
            with self._lock:
                self._connections.append((pid, conn))
        return conn

    def _retry(self, fn: Callable[[], _T], *, what: str) -> _T:
        """Run ``fn``, retrying on SQLITE_BUSY/LOCKED with bounded backoff up to timeout_s."""
        deadline = _time.monotonic() + self._timeout_s
        delay = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise self._error(what, exc) from exc
                if _time.monotonic() >= deadline:
                    raise LogError(
                        f"decision log {str(self._path)!r} stayed busy for {self._timeout_s:g} "
                        f"s while trying to {what} ({exc}). Another process holds a long "
                        "write lock; raise timeout_s or find the process that holds the file."
                    ) from exc
                _time.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, 0.1)
            except sqlite3.DatabaseError as exc:
                raise self._error(what, exc) from exc

    def _error(self, what: str, exc: sqlite3.Error) -> LogError:
        hint = ""
        if "not a database" in str(exc):
            hint = " The file is not a SQLite database; choose another path for the log."
        return LogError(f"decision log {str(self._path)!r}: could not {what}: {exc}.{hint}")

    def _write(self, body: Callable[[sqlite3.Connection], None], *, what: str) -> None:
        """Run ``body`` in one BEGIN IMMEDIATE … COMMIT transaction (with retries)."""
        conn = self._conn()

        def attempt() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        self._retry(attempt, what=what)

    def _init_schema(self) -> None:
        def body(conn: sqlite3.Connection) -> None:
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if tables and "meta" not in tables:
                raise LogError(
                    f"{str(self._path)!r} is a SQLite database but not a spotstop decision "
                    f"log (it has tables {sorted(tables)} and no 'meta' table). Choose "
                    "another path for the log."
                )
            if "meta" in tables:
                row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                found = int(row[0]) if row is not None else None
                if found is not None and found > SCHEMA_VERSION:
                    raise LogError(
                        f"decision log {str(self._path)!r} has schema_version {found}, but "
                        f"this spotstop reads schema_version {SCHEMA_VERSION} at most. "
                        "Upgrade spotstop to read it, or open a different log file."
                    )
                if found is not None and found < 1:
                    raise LogError(
                        f"decision log {str(self._path)!r} has an invalid schema_version "
                        f"{found}; expected 1..{SCHEMA_VERSION}."
                    )
            for statement in _SCHEMA_SQL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('created', ?)",
                (repr(_time.time()),),
            )

        try:
            self._write(body, what="create or check the schema")
        except BaseException:
            self.close()
            raise

    # -- writing -------------------------------------------------------------------

    def append(self, record: DecisionRecord, image_bytes: bytes | None = None) -> None:
        """Append one decision; returns only after the write has committed.

        The return is the acknowledgement: the row survives a kill of this process from
        then on. ``image_bytes`` (the encoded image) is stored only when the log was opened
        with ``store_images=True``; its SHA-256 must equal ``record.image_sha256``.
        """
        _check_append(record, image_bytes)
        image = self._image_row(record, image_bytes)
        row = _record_to_row(record)

        def body(conn: sqlite3.Connection) -> None:
            self._insert(conn, [row])
            if image is not None:
                self._store_image(conn, *image)

        self._write(body, what="append a decision")

    def append_many(self, records: Iterable[DecisionRecord]) -> None:
        """Append several decisions in one transaction: all of them are written, or none."""
        records = list(records)
        for i, r in enumerate(records):
            if not isinstance(r, DecisionRecord):
                raise RecordError(
                    f"append_many expects DecisionRecord items; item {i} is {type(r).__name__}."
                )
        rows = [_record_to_row(r) for r in records]
        if rows:
            self._write(lambda conn: self._insert(conn, rows), what="append decisions")

    def _insert(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        try:
            conn.executemany(_INSERT, rows)
        except sqlite3.IntegrityError as exc:
            ids = [r[0] for r in rows]
            placeholders = ", ".join("?" * len(ids))
            taken = [
                row[0]
                for row in conn.execute(
                    f"SELECT decision_id FROM decisions WHERE decision_id IN ({placeholders})",
                    ids,
                )
            ]
            dup = taken[:1] or [i for i in ids if ids.count(i) > 1][:1]
            raise RecordError(
                f"decision_id {dup[0] if dup else '?'!r} is already in the log ({exc}); "
                "every decision needs a fresh id. Leave decision_id out to get a uuid4."
            ) from exc

    def _image_row(
        self, record: DecisionRecord, image_bytes: bytes | None
    ) -> tuple[str, bytes, float] | None:
        if image_bytes is None or not self._store_images:
            return None
        digest = hashlib.sha256(image_bytes).hexdigest()
        if record.image_sha256 != digest:
            raise RecordError(
                f"image_bytes hash to sha256 {digest}, but record.image_sha256 is "
                f"{record.image_sha256!r}. Set image_sha256 to hashlib.sha256(image_bytes)"
                ".hexdigest() in the record."
            )
        return digest, bytes(image_bytes), float(record.time)

    def _store_image(self, conn: sqlite3.Connection, sha: str, data: bytes, t: float) -> None:
        conn.execute(
            "INSERT INTO images (sha256, data, n_bytes, time) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (sha256) DO UPDATE SET time = max(time, excluded.time)",
            (sha, data, len(data), t),
        )
        self._prune_images(conn)

    def _prune_images(self, conn: sqlite3.Connection) -> None:
        if self._retention_days is not None:
            cutoff = _time.time() - float(self._retention_days) * 86400.0
            conn.execute("DELETE FROM images WHERE time < ?", (cutoff,))
        if self._retention_bytes is not None:
            # Keep the newest images whose running total fits; delete the rest (oldest first).
            conn.execute(
                "DELETE FROM images WHERE sha256 IN ("
                " SELECT sha256 FROM ("
                "  SELECT sha256, SUM(n_bytes) OVER (ORDER BY time DESC, rowid DESC) AS total"
                "  FROM images)"
                " WHERE total > ?)",
                (int(self._retention_bytes),),
            )

    def mark_fail_closed(self, decision_ids: Sequence[str], reason: str) -> None:
        """Turn logged SAFE decisions into fail-closed UNSAFE ones, with ``reason``.

        The only change the log allows to a written decision, and only towards safety: the
        guard uses it when a decision's write finished after the call's deadline, so the
        row says what the caller was told. Rows already UNSAFE are left as they are; an
        unknown id raises :class:`RecordError` and changes nothing.
        """
        ids = list(decision_ids)
        if not all(isinstance(i, str) and i for i in ids) or not isinstance(reason, str):
            raise RecordError(
                "mark_fail_closed expects decision ids (non-empty str) and a reason (str); "
                f"got {ids!r}, {reason!r}."
            )
        if not ids:
            return

        def body(conn: sqlite3.Connection) -> None:
            q = ", ".join("?" * len(ids))
            known = {
                row[0]
                for row in conn.execute(
                    f"SELECT decision_id FROM decisions WHERE decision_id IN ({q})", ids
                )
            }
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise RecordError(
                    f"mark_fail_closed: unknown decision_id {unknown[0]!r}; nothing changed."
                )
            conn.execute(
                "UPDATE decisions SET label = 'UNSAFE', fail_closed = 1, fail_reason = ? "
                f"WHERE decision_id IN ({q}) AND label = 'SAFE'",
                [reason, *ids],
            )

        self._write(body, what="mark decisions fail-closed")

    def set_labels(self, labels: Iterable[tuple[str, str, str | None, str | None]]) -> None:
        """Attach reviewer labels: items ``(decision_id, "safe"|"unsafe", contrast_id, reviewer)``.

        All items are validated first and written in one transaction; a label that exists
        is replaced (upsert) and its time set to now. An unknown decision id or a bad label
        raises :class:`RecordError` and writes nothing.
        """
        items = _check_labels(labels)
        if not items:
            return
        now = _time.time()

        def body(conn: sqlite3.Connection) -> None:
            ids = [it[0] for it in items]
            known: set[str] = set()
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                q = ", ".join("?" * len(chunk))
                known.update(
                    row[0]
                    for row in conn.execute(
                        f"SELECT decision_id FROM decisions WHERE decision_id IN ({q})", chunk
                    )
                )
            unknown = [i for i in ids if i not in known]
            if unknown:
                shown = ", ".join(repr(u) for u in unknown[:5])
                more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
                raise RecordError(
                    f"set_labels: unknown decision_id {shown}{more}; a label must refer to a "
                    "decision in this log. No labels were written; check the ids (and the log "
                    "file)."
                )
            conn.executemany(
                "INSERT INTO labels (decision_id, label, contrast_id, reviewer, time) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (decision_id) DO UPDATE SET "
                "label = excluded.label, contrast_id = excluded.contrast_id, "
                "reviewer = excluded.reviewer, time = excluded.time",
                [(*it, now) for it in items],
            )

        self._write(body, what="set labels")

    # -- reading -------------------------------------------------------------------

    def _where(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        t0 = _to_epoch("since", since)
        t1 = _to_epoch("until", until)
        if t0 is not None:
            clauses.append("d.time >= ?")
            params.append(t0)
        if t1 is not None:
            clauses.append("d.time < ?")
            params.append(t1)
        if situation_id is not None:
            if not isinstance(situation_id, str):
                raise RecordError(
                    f"situation_id must be a str or None; got {type(situation_id).__name__}."
                )
            clauses.append("d.situation_id = ?")
            params.append(situation_id)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        return where, params

    def records(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
    ) -> Iterator[DecisionRecord]:
        """Yield decisions with ``since <= time < until`` (and of one situation), in time order.

        ``since``/``until`` are seconds since the epoch or aware datetimes; None: open end.
        """
        where, params = self._where(since, until, situation_id)  # checked now, not lazily
        return self._iter_records(where, params)

    def _fetchall(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._retry(lambda: self._conn().execute(sql, params).fetchall(), what="read")

    def _iter_records(self, where: str, params: list[Any]) -> Iterator[DecisionRecord]:
        # Read in pages keyed on (time, rowid): no cursor stays open between yields, so a
        # slow consumer never pins a read snapshot (which would stall WAL checkpoints).
        base = f"{_SELECT}, d.rowid FROM decisions AS d{where}"
        joiner = " AND " if where else " WHERE "
        order = f" ORDER BY d.time, d.rowid LIMIT {_PAGE_ROWS}"
        rows = self._fetchall(base + order, params)
        while True:
            for row in rows:
                yield _row_to_record(row[:-1])
            if len(rows) < _PAGE_ROWS:
                return
            last_time, last_rowid = rows[-1][1], rows[-1][-1]
            rows = self._fetchall(
                base + joiner + "(d.time, d.rowid) > (?, ?)" + order,
                [*params, last_time, last_rowid],
            )

    def get(self, decision_id: str) -> DecisionRecord | None:
        """The decision with this id, or None if the log has none."""
        sql = f"{_SELECT} FROM decisions AS d WHERE d.decision_id = ?"
        row = self._retry(lambda: self._conn().execute(sql, (decision_id,)).fetchone(), what="read")
        return None if row is None else _row_to_record(row)

    def count(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
    ) -> int:
        """Number of decisions (with the same filters as :meth:`records`)."""
        where, params = self._where(since, until, situation_id)
        sql = f"SELECT COUNT(*) FROM decisions AS d{where}"
        row = self._retry(lambda: self._conn().execute(sql, params).fetchone(), what="count")
        return int(row[0])

    def image(self, sha256: str) -> bytes | None:
        """The stored image bytes with this SHA-256, or None if not stored (or pruned)."""
        row = self._retry(
            lambda: (
                self._conn()
                .execute("SELECT data FROM images WHERE sha256 = ?", (sha256,))
                .fetchone()
            ),
            what="read an image",
        )
        return None if row is None else bytes(row[0])

    def _joined_rows(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
    ) -> list[tuple[DecisionRecord, tuple[Any, ...]]]:
        where, params = self._where(since, until, situation_id)
        sql = (
            f"{_SELECT}, l.label, l.contrast_id, l.reviewer, l.time FROM decisions AS d "
            f"LEFT JOIN labels AS l ON l.decision_id = d.decision_id{where} "
            "ORDER BY d.time, d.rowid"
        )

        def read() -> list[Any]:
            # One read transaction: rows and labels form one consistent snapshot.
            return self._conn().execute(sql, params).fetchall()

        rows = self._retry(read, what="read")
        n = len(_COLUMNS)
        return [(_row_to_record(row[:n]), tuple(row[n:])) for row in rows]

    def to_arrays(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
    ) -> LogArrays:
        """The decisions (same filters as :meth:`records`) as aligned arrays with labels."""
        joined = self._joined_rows(since, until, situation_id)
        recs = [r for r, _ in joined]
        n = len(recs)

        def obj(values: Iterable[Any]) -> np.ndarray:
            out = np.empty(n, dtype=object)
            out[:] = list(values)
            return out

        def flt(values: Iterable[float | int | None]) -> np.ndarray:
            return np.array(
                [math.nan if v is None else float(v) for v in values], dtype=np.float64
            ).reshape(n)

        def scores(get: Callable[[DecisionRecord], dict[str, float] | None]) -> dict[str, Any]:
            names: dict[str, None] = {}
            for r in recs:
                names.update(dict.fromkeys(get(r) or {}))
            out: dict[str, np.ndarray] = {}
            for name in names:
                out[name] = flt((get(r) or {}).get(name, math.nan) for r in recs)
            return out

        review = [lab for _, lab in joined]
        label_code = {"unsafe": 1, "safe": 0, None: -1}
        return LogArrays(
            decision_id=obj(r.decision_id for r in recs),
            time=flt(r.time for r in recs),
            situation_id=obj(r.situation_id for r in recs),
            request=obj(r.request for r in recs),
            fused=flt(r.fused_score for r in recs),
            threshold=flt(r.threshold for r in recs),
            member_scores=scores(lambda r: r.member_scores),
            member_scores_gray=scores(lambda r: r.member_scores_gray),
            member_scores_text=scores(lambda r: r.member_scores_text),
            guard_label=np.array([r.label == "UNSAFE" for r in recs], dtype=np.int8).reshape(n),
            label=np.array([label_code[lab[0]] for lab in review], dtype=np.int8).reshape(n),
            contrast_id=obj(lab[1] for lab in review),
            width=flt(r.width for r in recs),
            height=flt(r.height for r in recs),
            n_bytes=flt(r.n_bytes for r in recs),
            image_format=obj(r.image_format for r in recs),
            fail_closed=np.array([r.fail_closed for r in recs], dtype=bool).reshape(n),
            policy=obj(r.policy for r in recs),
            bundle_id=obj(r.bundle_id for r in recs),
            prompt_hash=obj(r.prompt_hash for r in recs),
        )

    # -- export --------------------------------------------------------------------

    def _export_columns(self) -> list[tuple[str, str, list[Any]]]:
        """Flat columns ``(name, kind, values)``; kind is str, float, int or bool."""
        joined = self._joined_rows(None, None, None)
        recs = [r for r, _ in joined]
        cols: list[tuple[str, str, list[Any]]] = []
        plain: list[tuple[str, str]] = [
            ("decision_id", "str"),
            ("time", "float"),
            ("time_utc", "str"),
            ("situation_id", "str"),
            ("request", "str"),
            ("image_sha256", "str"),
            ("width", "int"),
            ("height", "int"),
            ("n_bytes", "int"),
            ("image_format", "str"),
            ("fused_score", "float"),
            ("threshold", "float"),
            ("policy", "str"),
            ("label", "str"),
            ("fail_closed", "bool"),
            ("fail_reason", "str"),
            ("bundle_id", "str"),
            ("prompt_hash", "str"),
            ("schema_version", "int"),
        ]
        for name, kind in plain:
            cols.append((name, kind, [getattr(r, name) for r in recs]))
        for prefix, attr in (
            ("score", "member_scores"),
            ("score_gray", "member_scores_gray"),
            ("score_text", "member_scores_text"),
            ("latency_ms", "latency_ms"),
        ):
            names: dict[str, None] = {}
            for r in recs:
                names.update(dict.fromkeys(getattr(r, attr) or {}))
            for name in names:
                values = [(getattr(r, attr) or {}).get(name, math.nan) for r in recs]
                cols.append((f"{prefix}.{name}", "float", [float(v) for v in values]))
        for i, name, kind in (
            (0, "review_label", "str"),
            (1, "review_contrast_id", "str"),
            (2, "review_reviewer", "str"),
            (3, "review_time", "float"),
        ):
            values = [lab[i] for _, lab in joined]
            if kind == "float":
                values = [math.nan if v is None else float(v) for v in values]
            cols.append((name, kind, values))
        return cols

    def export_csv(self, path: str | os.PathLike[str]) -> None:
        """Write every decision (with reviewer labels) to a CSV file, one column per score.

        Score columns are ``score.<member>``, ``score_gray.<member>``, ``score_text.<member>``
        and ``latency_ms.<stage>``; reviewer columns start with ``review_``. Floats are
        written with ``repr`` (exact), NaN as ``nan`` and infinities as ``inf``/``-inf``
        (``float()`` reads all of them back); None is an empty cell.
        """
        cols = self._export_columns()
        n = len(cols[0][2]) if cols else 0
        with Path(path).open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow([name for name, _, _ in cols])
            for i in range(n):
                writer.writerow([_csv_cell(kind, values[i]) for _, kind, values in cols])

    def export_parquet(self, path: str | os.PathLike[str]) -> None:
        """Write every decision (with reviewer labels) to a Parquet file; needs pyarrow.

        Same columns as :meth:`export_csv`; scores are float64 with NaN kept as NaN (not
        null), missing ints and strings are nulls. The file's schema metadata carries
        ``spotstop.schema_version``.
        """
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise LogError(
                "export_parquet needs pyarrow, which is not installed. Install it with "
                "`pip install pyarrow`, or use export_csv."
            ) from exc
        types = {"str": pa.string(), "float": pa.float64(), "int": pa.int64(), "bool": pa.bool_()}
        arrays = []
        names = []
        for name, kind, values in self._export_columns():
            if kind == "float":
                arrays.append(pa.array(np.asarray(values, dtype=np.float64), type=types[kind]))
            else:
                arrays.append(pa.array(values, type=types[kind]))
            names.append(name)
        table = pa.Table.from_arrays(arrays, names=names)
        table = table.replace_schema_metadata(
            {"spotstop.schema_version": str(SCHEMA_VERSION), "spotstop.table": "decisions"}
        )
        pq.write_table(table, str(path))

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection this log opened; further use raises :class:`LogError`."""
        self._closed = True
        with self._lock:
            conns, self._connections = self._connections, []
        pid = os.getpid()
        for owner, conn in conns:
            # Connections of another process (inherited by fork) are not ours to close.
            if owner == pid:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"DecisionLog({str(self._path)!r}, store_images={self._store_images}, {state})"


def _csv_cell(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "float":
        return repr(float(value))
    if kind == "bool":
        return "true" if value else "false"
    return str(value)


def _check_append(record: object, image_bytes: object) -> None:
    if not isinstance(record, DecisionRecord):
        raise RecordError(
            f"append expects a DecisionRecord; got {type(record).__name__}. Build one with "
            "DecisionRecord(request=..., member_scores=..., ...)."
        )
    if image_bytes is not None and not isinstance(image_bytes, bytes | bytearray | memoryview):
        raise RecordError(
            f"append image_bytes must be bytes or None; got {type(image_bytes).__name__}."
        )


def _check_labels(labels: object) -> list[tuple[str, str, str | None, str | None]]:
    if isinstance(labels, str | bytes) or not isinstance(labels, Iterable):
        raise RecordError(
            "set_labels expects a list of (decision_id, label, contrast_id, reviewer) tuples; "
            f"got {type(labels).__name__}."
        )
    out: list[tuple[str, str, str | None, str | None]] = []
    seen: set[str] = set()
    for i, item in enumerate(labels):
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 4:
            raise RecordError(
                f"set_labels item {i} must be a 4-tuple (decision_id, label, contrast_id, "
                f"reviewer); got {item!r}. Use None for a missing contrast_id or reviewer."
            )
        decision_id, label, contrast_id, reviewer = item
        if not isinstance(decision_id, str) or not decision_id:
            raise RecordError(
                f"set_labels item {i}: decision_id must be a non-empty str; got {decision_id!r}."
            )
        if label not in _REVIEW_LABELS:
            raise RecordError(
                f"set_labels item {i} (decision_id {decision_id!r}): label must be one of "
                f"{list(_REVIEW_LABELS)}; got {label!r}. Reviewer labels are lower case."
            )
        for name, v in (("contrast_id", contrast_id), ("reviewer", reviewer)):
            if v is not None and not isinstance(v, str):
                raise RecordError(
                    f"set_labels item {i} (decision_id {decision_id!r}): {name} must be a str "
                    f"or None; got {v!r}."
                )
        if decision_id in seen:
            raise RecordError(
                f"set_labels: decision_id {decision_id!r} appears twice in one call; give "
                "each decision one label per call."
            )
        seen.add(decision_id)
        out.append((decision_id, label, contrast_id, reviewer))
    return out
