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
  spotstop is refused instead of misread, and a schema-1 log is migrated in place when it is
  opened (new columns added with documented values for old rows; nothing is dropped).
* One shape: the ``decisions`` columns and the row mapping derive from
  :class:`~spotstop.guard._record.DecisionRecord`'s field list.
* The log says who decided: every row carries the ``policy_version``, ``policy_kind`` and
  ``fusion_key`` of the policy that made it, and the ``policies`` table keeps each such
  policy file whole (:meth:`DecisionLog.policies`), so readers can replay it.
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

from spotstop.guard._errors import GuardError
from spotstop.guard._log_read import LogArrays, log_arrays, write_csv, write_parquet
from spotstop.guard._record import (
    SCHEMA_VERSION,
    DecisionRecord,
    RecordError,
    _is_real,
    record_from_row,
    record_to_row,
    sql_columns,
)

__all__ = [
    "SCHEMA_VERSION",
    "DecisionLog",
    "DecisionRecord",
    "LogArrays",
    "LogError",
    "PolicyRow",
    "RecordError",
]

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

_REVIEW_LABELS: Final = ("safe", "unsafe")
_DEFAULT_RETENTION_BYTES: Final = 1 << 30  # 1 GiB
_DEFAULT_RETENTION_DAYS: Final = 30.0
_PAGE_ROWS: Final = 1000


class LogError(GuardError, RuntimeError):
    """The decision log could not be opened, read or written (schema, lock, closed, I/O)."""


_POLICIES_SQL: Final = """
CREATE TABLE IF NOT EXISTS policies (
    policy_version TEXT PRIMARY KEY,
    policy_kind TEXT NOT NULL,
    fusion_key TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    prompt_hash TEXT NOT NULL,
    created TEXT NOT NULL,
    document TEXT NOT NULL,
    first_time REAL NOT NULL
)"""


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
# The log
# --------------------------------------------------------------------------------------

_COLUMNS: Final = tuple(name for name, _ in sql_columns())
_ID: Final = _COLUMNS.index("decision_id")
_TIME: Final = _COLUMNS.index("time")
_SELECT: Final = "SELECT " + ", ".join(f"d.{c}" for c in _COLUMNS)
_INSERT: Final = (
    f"INSERT INTO decisions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)

_SCHEMA_SQL: Final = (
    """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
"""
    + ",\n".join(f"    {name} {sql}" for name, sql in sql_columns())
    + """
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
    + _POLICIES_SQL
)

# Schema 1 -> 2: the columns schema 2 added, with what schema-1 rows get. A schema-1 row's
# ``fused_score`` was the score its policy compared, so it becomes ``policy_score`` too; its
# kind is the rule's first part ("situation->frozen" -> "situation"). Nothing is dropped.
_MIGRATE_1_TO_2: Final = (
    "ALTER TABLE decisions ADD COLUMN batch_id TEXT",
    "ALTER TABLE decisions ADD COLUMN policy_score REAL",
    "ALTER TABLE decisions ADD COLUMN policy_kind TEXT",
    "ALTER TABLE decisions ADD COLUMN policy_version TEXT",
    "ALTER TABLE decisions ADD COLUMN fusion_key TEXT",
    "ALTER TABLE decisions ADD COLUMN detail TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE decisions ADD COLUMN cue_flags TEXT",
    "ALTER TABLE decisions ADD COLUMN cue_text TEXT",
    "ALTER TABLE decisions ADD COLUMN test_pair INTEGER NOT NULL DEFAULT 0",
    "UPDATE decisions SET policy_score = fused_score, policy_kind = CASE "
    "WHEN instr(policy, '->') > 0 THEN substr(policy, 1, instr(policy, '->') - 1) "
    "ELSE policy END",
    _POLICIES_SQL,
    "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
)


@dataclass(frozen=True)
class PolicyRow:
    """A policy as the log keeps it, so that readers can replay what decided.

    version_id / kind / fusion_key: as in the decisions' columns. bundle_id, prompt_hash,
    created: from the policy file. document: the whole ``policy.yaml`` as a JSON object.
    first_time: when the log first saw a decision of it.
    """

    version_id: str
    kind: str
    fusion_key: str
    bundle_id: str
    prompt_hash: str
    created: str
    document: Mapping[str, Any]
    first_time: float = 0.0


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
            found: int | None = None
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
            if found == 1:
                for statement in _MIGRATE_1_TO_2:
                    conn.execute(statement)
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
            if found == 1:
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('migrated_from_1', ?)",
                    (repr(_time.time()),),
                )

        try:
            self._write(body, what="create or check the schema")
        except BaseException:
            self.close()
            raise

    # -- writing -------------------------------------------------------------------

    def append(
        self,
        record: DecisionRecord,
        image_bytes: bytes | None = None,
        *,
        policy: PolicyRow | None = None,
    ) -> None:
        """Append one decision; returns only after the write has committed.

        The return is the acknowledgement: the row survives a kill of this process from
        then on. ``image_bytes`` (the encoded image) is stored only when the log was opened
        with ``store_images=True``; its SHA-256 must equal ``record.image_sha256``.
        ``policy``: the policy that decided, kept in the ``policies`` table (once per
        version) in the same transaction.
        """
        _check_append(record, image_bytes)
        image = self._image_row(record, image_bytes)
        row = record_to_row(record)

        def body(conn: sqlite3.Connection) -> None:
            self._insert_policy(conn, policy, record.time)
            self._insert(conn, [row])
            if image is not None:
                self._store_image(conn, *image)

        self._write(body, what="append a decision")

    def append_many(
        self, records: Iterable[DecisionRecord], *, policy: PolicyRow | None = None
    ) -> None:
        """Append several decisions in one transaction: all of them are written, or none.

        ``policy``: as for :meth:`append`.
        """
        records = list(records)
        for r in records:
            _check_append(r, None)
        rows = [record_to_row(r) for r in records]
        if rows:
            t0 = min(r.time for r in records)

            def body(conn: sqlite3.Connection) -> None:
                self._insert_policy(conn, policy, t0)
                self._insert(conn, rows)

            self._write(body, what="append decisions")

    def _insert_policy(self, conn: sqlite3.Connection, p: PolicyRow | None, t: float) -> None:
        if p is None:
            return
        if not isinstance(p, PolicyRow):
            raise RecordError(f"policy must be a PolicyRow; got {type(p).__name__}.")
        conn.execute(
            "INSERT OR IGNORE INTO policies (policy_version, policy_kind, fusion_key, bundle_id, "
            "prompt_hash, created, document, first_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                p.version_id,
                p.kind,
                p.fusion_key,
                p.bundle_id,
                p.prompt_hash,
                p.created,
                json.dumps(p.document, sort_keys=True, allow_nan=False, default=str),
                float(t),
            ),
        )

    def policies(self) -> dict[str, PolicyRow]:
        """Every policy that decided something in this log, by version id (first seen first)."""
        rows = self._fetchall(
            "SELECT policy_version, policy_kind, fusion_key, bundle_id, prompt_hash, created, "
            "document, first_time FROM policies ORDER BY first_time, policy_version",
            [],
        )
        return {
            r[0]: PolicyRow(
                version_id=r[0],
                kind=r[1],
                fusion_key=r[2],
                bundle_id=r[3],
                prompt_hash=r[4],
                created=r[5],
                document=json.loads(r[6]),
                first_time=float(r[7]),
            )
            for r in rows
        }

    def _insert(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        try:
            conn.executemany(_INSERT, rows)
        except sqlite3.IntegrityError as exc:
            ids = [r[_ID] for r in rows]
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
                yield record_from_row(row[:-1])
            if len(rows) < _PAGE_ROWS:
                return
            last_time, last_rowid = rows[-1][_TIME], rows[-1][-1]
            rows = self._fetchall(
                base + joiner + "(d.time, d.rowid) > (?, ?)" + order,
                [*params, last_time, last_rowid],
            )

    def get(self, decision_id: str) -> DecisionRecord | None:
        """The decision with this id, or None if the log has none."""
        sql = f"{_SELECT} FROM decisions AS d WHERE d.decision_id = ?"
        row = self._retry(lambda: self._conn().execute(sql, (decision_id,)).fetchone(), what="read")
        return None if row is None else record_from_row(row)

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
        return [(record_from_row(row[:n]), tuple(row[n:])) for row in rows]

    def to_arrays(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
    ) -> LogArrays:
        """The decisions (same filters as :meth:`records`) as aligned arrays with labels."""
        return log_arrays(self._joined_rows(since, until, situation_id))

    # -- export --------------------------------------------------------------------

    def export_csv(self, path: str | os.PathLike[str]) -> None:
        """Write every decision (with reviewer labels) to a CSV file, one column per field.

        Dict fields are expanded to ``score.<member>``, ``score_gray.<member>``,
        ``score_text.<member>``, ``latency_ms.<stage>`` and ``cue.<cue>``; reviewer columns
        start with ``review_``. Floats are written with ``repr`` (exact), NaN as ``nan`` and
        infinities as ``inf``/``-inf``; None is an empty cell.
        """
        write_csv(self._joined_rows(None, None, None), path)

    def export_parquet(self, path: str | os.PathLike[str]) -> None:
        """Write every decision (with reviewer labels) to a Parquet file; needs pyarrow.

        Same columns as :meth:`export_csv`; scores are float64 with NaN kept as NaN (not
        null); the schema metadata carries ``spotstop.schema_version``.
        """
        write_parquet(self._joined_rows(None, None, None), path, LogError)

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


def _check_append(record: object, image_bytes: object) -> None:
    if not isinstance(record, DecisionRecord):
        raise RecordError(
            f"append expects a DecisionRecord; got {type(record).__name__}. Build one with "
            "DecisionRecord(request=..., member_scores=..., ...)."
        )
    if not record.decision_id:
        raise RecordError(
            "DecisionRecord.decision_id must be a non-empty str to be logged; leave it out to "
            "get a fresh uuid4."
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
