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
  spotstop is refused instead of misread, and an older log (schema 1 to 4) is migrated in
  place when it is opened (new columns added with documented values for old rows; nothing is dropped).
* One shape: the ``decisions`` columns and the row mapping derive from
  :class:`~spotstop.guard._record.DecisionRecord`'s field list.
* The log says who decided: every row carries the ``policy_version``, ``policy_kind`` and
  ``fusion_key`` of the policy that made it and the ``deciding_kind`` (the kind whose
  threshold it met), and the ``policies`` table keeps each such policy file whole
  (:meth:`DecisionLog.policies`), so readers can replay it.
* NaN stays NaN: scores are stored as JSON with non-finite values spelled ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"`` (JSON itself has no NaN), and the scalar columns map a
  NaN to SQL ``NULL`` (SQLite stores NaN as NULL) and back.
* Images (off by default) are kept in an ``images`` table keyed by SHA-256 and pruned on
  every write, by age and by total size, oldest first.

Times are seconds since the Unix epoch (UTC) as ``float``; ``DecisionRecord.time_utc``
gives the ISO-8601 spelling.

Files: this module is the store (connections, retries, writes, labels, images); the tables,
migrations and input checks are in ``_log_schema.py``; reading back (records, arrays,
CSV/Parquet) is in ``_log_read.py``; the record itself in ``_record.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sqlite3
import tempfile
import threading
import time as _time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

from spotstop.guard._log_amend import amend_sql
from spotstop.guard._log_archive import (
    ArchiveInfo,
    ArchiveStore,
    Protect,
    Retention,
    RetentionResult,
    read_archive,
)
from spotstop.guard._log_dead_letter import DeadLetterApplied, apply_dead_letter
from spotstop.guard._log_read import LogArrays, LogReader
from spotstop.guard._log_schema import (
    ID_COLUMN,
    INSERT,
    INSERT_AT,
    LOG_SCHEMA_VERSION,
    SCHEMA_SQL,
    ArchiveAmendError,
    LogError,
    PolicyRow,
    add_archive_filter,
    check_append,
    check_labels,
    check_log_args,
    fault_kind,
    migrate,
)
from spotstop.guard._record import (
    SCHEMA_VERSION,
    DecisionRecord,
    RecordError,
    record_to_row,
)

__all__ = [
    "SCHEMA_VERSION",
    "ArchiveInfo",
    "DeadLetterApplied",
    "DecisionLog",
    "DecisionRecord",
    "LogArrays",
    "LogError",
    "PolicyRow",
    "Protect",
    "RecordError",
    "Retention",
    "RetentionResult",
]

_log = logging.getLogger("spotstop.guard")
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

REVIEW_LABELS: Final = ("safe", "unsafe")
_DEFAULT_RETENTION_BYTES: Final = 1 << 30  # 1 GiB
_DEFAULT_RETENTION_DAYS: Final = 30.0
_WAL_LIMIT_BYTES: Final = 4 << 20
_DEAD_LETTER_WAIT_S: Final = 1.0  # opening never waits longer for the dead letter's work
ROBOT_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""What a robot id may be: it names a robot in a fleet card and in file names."""


def _check_robot_id(robot_id: object) -> None:
    if not isinstance(robot_id, str) or not ROBOT_ID.fullmatch(robot_id):
        raise RecordError(
            f"robot_id must be 1-64 characters of letters, digits, '.', '_' or '-'; got "
            f"{robot_id!r}. Name the robot as the fleet knows it, e.g. 'arm-07'."
        )


def _schema_found(conn: sqlite3.Connection, path: Path) -> int | None:
    """The ``schema_version`` of the log at ``path`` (None: a database with no tables yet);
    :class:`LogError` for a database that is not a decision log, or one of a newer spotstop."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if tables and "meta" not in tables:
        raise LogError(
            f"{str(path)!r} is a SQLite database but not a spotstop decision log (it has "
            f"tables {sorted(tables)} and no 'meta' table). Choose another path for the log."
        )
    if "meta" not in tables:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    found = int(row[0]) if row is not None else None
    if found is not None and found > LOG_SCHEMA_VERSION:
        raise LogError(
            f"decision log {str(path)!r} has schema_version {found}, but this spotstop reads "
            f"schema_version {LOG_SCHEMA_VERSION} at most. Upgrade spotstop to read it, or "
            "open a different log file."
        )
    if found is not None and found < 1:
        raise LogError(
            f"decision log {str(path)!r} has an invalid schema_version {found}; expected "
            f"1..{LOG_SCHEMA_VERSION}."
        )
    return found


def _check_readable(found: int | None, path: Path) -> None:
    if found is None:
        raise LogError(
            f"{str(path)!r} holds no decision log (an empty database). Pass the guard's SQLite "
            "log file."
        )


def _set_up_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the log's tables, or migrate an older log's, in the caller's transaction."""
    found = _schema_found(conn, path)
    if found is not None and found < LOG_SCHEMA_VERSION:
        migrate(conn, found)
    for statement in SCHEMA_SQL.split(";"):
        if statement.strip():
            conn.execute(statement)
    add_archive_filter(conn)
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
        (str(LOG_SCHEMA_VERSION),),
    )
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('created', ?)", (repr(_time.time()),)
    )
    if found is not None and found < LOG_SCHEMA_VERSION:
        conn.execute(
            f"INSERT OR REPLACE INTO meta (key, value) VALUES ('migrated_from_{found}', ?)",
            (repr(_time.time()),),
        )


class _NeedArchivedIds(Exception):
    """A write met ids that are not live; it reads the archives that may hold them and tries
    again."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(ids)
        self.ids = ids


class _ArchivedIds:
    """Which of the ids a write met that are not live the log's registered archives hold,
    read only when a write meets such ids (:meth:`not_archived` raises
    :class:`_NeedArchivedIds`, and :meth:`write` reads them and runs the write's body again),
    and read again when the registrations changed since (a retention pass, an amended
    archive) or other ids are asked. Only the archives whose id filter may hold one of those
    ids are read (``_log_id_filter.py``; an archive registered without one is read)."""

    def __init__(self, log: DecisionLog) -> None:
        self._log = log
        self._ids: set[str] = set()  # the asked ids the archives read hold
        self._asked: set[str] = set()  # the ids the archives were read for
        self._registered: set[str] | None = None  # the registrations they were chosen from

    def not_archived(self, conn: sqlite3.Connection, not_live: list[str]) -> list[str]:
        """Those of ``not_live`` that no registered archive holds (inside a write's body)."""
        if not not_live:
            return []
        if self._registered is None or not set(not_live) <= self._asked:
            raise _NeedArchivedIds(not_live)
        if {r[0] for r in conn.execute("SELECT name FROM archives")} != self._registered:
            raise _NeedArchivedIds(not_live)  # an archive was written or replaced since
        return [i for i in not_live if i not in self._ids]

    def write(
        self,
        body: Callable[[sqlite3.Connection], None],
        what: str,
        timeout_s: Callable[[], float | None] = lambda: None,
    ) -> None:
        """``log._write(body)``, reading the archives' ids whenever the body asks for them."""
        while True:
            try:
                self._log._write(body, what=what, timeout_s=timeout_s())
                return
            except _NeedArchivedIds as need:
                infos = self._log.archives()
                folder = self._log.archive_folder
                asked = set(need.ids)
                self._registered = {a.name for a in infos}
                self._asked = asked
                self._ids = {
                    row[ID_COLUMN]
                    for a in infos
                    if a.may_hold(asked)
                    for _, row in read_archive(folder, a)
                } & asked


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


# --------------------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------------------


class LogChangedError(LogError):
    """A log opened read-only with no writer was written while it was read: open it again
    (a writer now holds it, and it is read in place with SQLite's locks)."""


def _file_id(path: Path) -> tuple[int, int] | None:
    """The identity (device, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _file_size(path: Path) -> int | None:
    """The size of the file at ``path``, or None when there is none."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _files_at(path: Path) -> list[tuple[int, int] | None]:
    """The identities of the log's file and of its ``-wal`` and ``-shm`` beside it."""
    return [_file_id(path), *(_file_id(path.with_name(path.name + s)) for s in ("-wal", "-shm"))]


def _still_at(
    held: list[tuple[int, int] | None], now: list[tuple[int, int] | None], *, note: bool
) -> bool:
    """Whether the files ``now`` at the log's path (:func:`_files_at`) are the ``held`` ones a
    connection writes: the log's file the same, and its -wal and -shm the same where they
    were noted. ``note``: a -wal or -shm not noted yet is noted now (in ``held``), as a
    write transaction, which SQLite holds them open for, does."""
    if now[0] is None or now[0] != held[0]:
        return False
    for i in (1, 2):
        if held[i] is None and note and now[i] is not None:
            held[i] = now[i]
        elif held[i] is not None and now[i] != held[i]:
            return False
    return True


class DecisionLog(LogReader, ArchiveStore):
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
    robot_id:
        The robot this log belongs to, kept in the log (``meta.robot_id``) so that a fleet
        card tells robots apart. Stored when the log has none; a log of another robot is
        refused. None: leave the log's as it is.
    read_only:
        Open an existing log for reading only: nothing in its file or folder changes (no
        schema migration, no WAL switch, no stored key); every write raises
        :class:`LogError` (kind ``read_only``). A log of an older schema, or one whose
        folder cannot take SQLite's shared-memory file (a read-only copy), is read through a
        private copy in a temporary folder (migrated there, removed on :meth:`close`), so
        the rows a -wal file holds are read too. A log no connection holds (no -shm file
        beside it) is read in place without SQLite's locks, so that no -shm or -wal file is
        created beside it (owned by the reader, they would keep a guard running as another
        user from opening its log); a read after a writer has written it since raises
        :class:`LogChangedError` (open it again); one a dead writer left with a -wal is read
        through the private copy. The card, ``calibrate`` and the cue tools read logs this
        way: reviewing a robot's log never rewrites it nor adds a file beside it.
    journal:
        The guard's journal (``--journal``), where a fail-closed amendment the log could not
        take yet waits: the log's reads (:meth:`records`, :meth:`get`, :meth:`to_arrays`,
        the exports) and its retention apply what waits there and in the dead letter beside
        the log (``_log_pending.py``). None: the default journal of the log
        (``$XDG_STATE_HOME/spotstop/journal/``); a guard's writer sets its own.
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
        robot_id: str | None = None,
        read_only: bool = False,
        journal: str | os.PathLike[str] | None = None,
    ) -> None:
        # absolute: a connection opened later (another thread, or after the file was
        # replaced) opens the same file when the process has changed its working folder
        self._path = Path(
            os.path.abspath(
                check_log_args(
                    path, image_retention_bytes, image_retention_days, timeout_s, synchronous
                )
            )
        )
        self._store_images = bool(store_images)
        # the journal whose waiting amendments reads apply (None: the log's default one)
        self._journal = None if journal is None else Path(os.path.abspath(journal))
        self._retention_bytes = image_retention_bytes
        self._retention_days = image_retention_days
        self._timeout_s = float(timeout_s)
        self._synchronous = synchronous
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[int, sqlite3.Connection]] = []
        # the thread each connection belongs to, by id(connection): one whose thread has
        # ended is closed when another is opened (_close_ended)
        self._threads: dict[int, threading.Thread] = {}
        self._closed = False
        self._retention_mutex = threading.Lock()  # one retention pass at a time
        self._rng = random.Random()  # backoff jitter only; results never depend on it
        self._read_only = bool(read_only)
        # the files the last write went to (files_in_place); None: no write yet
        self._written_files: tuple[tuple[int, int] | None, ...] | None = None
        self._open_path = self._path  # the file connections open (a private copy, read-only)
        # read-only with no writer: the log's state when opened (see _open_read_only)
        self._unwatched: tuple[int, int, int] | None = None
        self._private: tempfile.TemporaryDirectory[str] | None = None
        # a writer's robot id, claimed again in a file put at its path later (_adopt)
        self._robot_id: str | None = None
        if robot_id is not None:
            _check_robot_id(robot_id)  # bad input changes nothing: checked before the file
        if self._read_only:
            if robot_id is not None:
                raise RecordError(
                    "DecisionLog robot_id stores the robot's id in the log, a write; a log "
                    "opened with read_only=True cannot take it. Open it without read_only, or "
                    "leave robot_id out and read DecisionLog.robot_id."
                )
            try:
                self._open_read_only()
            except BaseException:
                self.close()
                raise
            self._seq_floor: int | None = None  # positions matter only to a writer
            return
        self._init_schema()
        if robot_id is not None:
            try:
                self._claim_robot(robot_id)
            except BaseException:
                self.close()
                raise
        # Positions never repeat (guard/_log_read.py): a log whose older retention archived
        # its newest rows gives its next row a position above every archived one. Best
        # effort: a log whose archives cannot be read now still takes decisions.
        try:
            self._seq_floor = self.seq_floor()
        except (LogError, OSError, ValueError) as exc:
            _log.warning("decision log %s: archived positions not read (%s)", self._path, exc)
            self._seq_floor = None
        # Amendments an older version set aside in the dead letter whose rows the log holds
        # (an archived row above all: its archive read alone said SAFE) are applied to them
        # now. Best effort, never waiting long: a log that cannot do it now still opens, and
        # the next opening or retention pass tries again.
        try:
            self.apply_dead_letter(timeout_s=min(self._timeout_s, _DEAD_LETTER_WAIT_S))
        except Exception as exc:  # any fault here (a malformed entry too) must not keep the
            # log from opening: the guard could then never start until someone edited the file
            _log.warning(
                "decision log %s: the dead letter's amendments not applied now (%s)",
                self._path,
                exc,
            )

    # -- connections ---------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    def _connect(self, timeout_s: float | None = None) -> sqlite3.Connection:
        """A configured connection. ``timeout_s`` bounds the wait for a busy database while it
        is opened (a write on a call's deadline opens its thread's connection on the call's
        time); None: the log's ``timeout_s``. The connection keeps the log's ``timeout_s``."""
        wait = self._timeout_s if timeout_s is None else max(0.0, float(timeout_s))
        target: str | Path = self._open_path
        if self._read_only:  # SQLite opens the file read-only; nothing it does can write it
            target = "file:" + urllib.parse.quote(str(self._open_path.resolve())) + "?mode=ro"
            if self._unwatched is not None and self._open_path == self._path:
                target += "&immutable=1"  # no writer: read without -wal/-shm (see below)
        try:
            conn = sqlite3.connect(
                target,
                timeout=wait,  # sets SQLite's busy_timeout
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # only so close() may close it from another thread
                uri=self._read_only,
            )
        except sqlite3.Error as exc:
            raise LogError(
                f"cannot open decision log {str(self._path)!r}: {exc}. Check that the folder "
                "exists and is writable.",
                fault_kind(exc),
            ) from exc
        try:
            self._retry(
                lambda: self._configure(conn, wait), what="configure the connection", timeout_s=wait
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: sqlite3.Connection, busy_s: float) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
        if self._read_only:
            conn.execute("PRAGMA query_only = ON")  # a write on it raises, whatever asks
            conn.execute("PRAGMA temp_store = MEMORY")
            return
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            # A new log gives the pages retention frees back to the file system (incremental
            # vacuum); this can be set only before the first table exists, outside a
            # transaction. An older log keeps its pages for its next rows instead.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LogError(
                f"decision log {str(self._path)!r} could not be put in WAL mode (journal_mode "
                f"is {mode!r}). Put the log on a local file system that supports shared "
                "memory (not a network share)."
            )
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA temp_store = MEMORY")  # retention's temp table needs no disk
        # After a checkpoint the -wal file is cut back to this size, so a WAL that grew once
        # (a burst of writes, a full disk) does not keep its space.
        conn.execute(f"PRAGMA journal_size_limit = {_WAL_LIMIT_BYTES}")

    @property
    def synchronous(self) -> str:
        """How this log's commits reach the disk: ``"NORMAL"`` or ``"FULL"`` (fsynced)."""
        return self._synchronous

    @contextlib.contextmanager
    def durable_commits(self) -> Iterator[None]:
        """Every commit of this thread's connection inside the block is fsynced
        (``synchronous=FULL``), whatever the log's setting: for a write that must survive a
        power cut before what it copies is deleted (the journal's import, which empties the
        journal after it)."""
        conn = self._conn()
        if self._synchronous == "FULL":
            yield
            return
        conn.execute("PRAGMA synchronous = FULL")
        try:
            yield
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")

    def _conn(self, timeout_s: float | None = None) -> sqlite3.Connection:
        """This thread's connection, opened now if it has none (``timeout_s``: see
        :meth:`_connect`)."""
        if self._closed:
            raise LogError(
                f"decision log {str(self._path)!r} is closed. Open a new DecisionLog to use it.",
                "closed",
            )
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if (
            conn is not None
            and not self._read_only
            and getattr(self._local, "pid", None) == pid
            and not self._same_files()
        ):  # the files it opened were removed or replaced: open the path again
            self._forget(conn)
            self._local.moved = True
            conn = None
        if conn is None or getattr(self._local, "pid", None) != pid:
            # A connection inherited across fork() must not be used (SQLite's rule); it is
            # abandoned, not closed, so the parent's locks are left alone.
            self._close_ended(pid)
            conn = self._connect(timeout_s)
            self._local.conn = conn
            self._local.pid = pid
            # the files it writes: the log's, its -wal and -shm (SQLite made them when it
            # read an existing log; for a new one, the first write does: noted then)
            self._local.files = _files_at(self._open_path)
            with self._lock:
                self._connections.append((pid, conn))
                self._threads[id(conn)] = threading.current_thread()
            if getattr(self._local, "moved", False):
                self._adopt(conn)
        return conn

    def _adopt(self, conn: sqlite3.Connection) -> None:
        """Set up the file now at the log's path, which is not the one this log set up (that
        one was removed or replaced while the log was open): its schema, and the robot id
        this log claimed. A file that cannot be set up (another robot's log) is not used."""
        _log.warning(
            "decision log %s: the file at this path (or its -wal or -shm) is not the one "
            "opened before (it was removed or replaced); writing to the file there now",
            self._path,
        )
        try:
            self._init_schema(close=False)
            if self._robot_id is not None:
                self._claim_robot(self._robot_id)
        except BaseException:
            self._forget(conn)
            raise
        self._local.moved = False

    def _close_ended(self, pid: int) -> None:
        """Close this process's connections whose thread has ended. Each thread keeps its own
        connection (its file handles) until the log is closed: a caller that checks from a new
        thread each time would otherwise hold two more descriptors per check, until the
        process can open no file (every write then failing closed, for good)."""
        with self._lock:
            ended = [
                c
                for o, c in self._connections
                if o == pid and id(c) in self._threads and not self._threads[id(c)].is_alive()
            ]
            for c in ended:
                del self._threads[id(c)]
            self._connections = [(o, c) for o, c in self._connections if c not in ended]
        for c in ended:
            with contextlib.suppress(sqlite3.Error):
                c.close()

    def _forget(self, conn: sqlite3.Connection) -> None:
        """Close this thread's connection ``conn``; the next use opens the log's path again.
        When the log's file is still the one it opened (its -wal was removed), what its -wal
        holds is first copied into that file (a checkpoint that waits for nobody)."""
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        if _file_id(self._path) == getattr(self._local, "files", [None])[0]:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        with self._lock:
            self._connections = [(o, c) for o, c in self._connections if c is not conn]
            self._threads.pop(id(conn), None)
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    def _same_files(self, *, writing: bool = False) -> bool:
        """Whether the log's path, its -wal and its -shm still name the files this thread's
        connection opened (:func:`_still_at`). ``writing``: inside a write transaction, where
        SQLite holds the -wal and -shm open; the first such check notes them."""
        return _still_at(self._local.files, _files_at(self._path), note=writing)

    def files_in_place(self) -> bool:
        """Whether the log's path, its -wal and its -shm still name the files its last write
        went to (the rule a write checks before it commits, :func:`_still_at`): three
        ``stat`` calls, no write. False when they were removed, their folder removed or
        moved, or other files put in their place: the next write opens the path again, and
        fails when nothing can be opened there. True for a log opened ``read_only``, not
        written yet, or with no connection open (closed: SQLite removes the -wal and -shm
        with the last one; the next write opens the path as a new log would)."""
        held = self._written_files
        if held is None or self._closed:
            return True
        pid = os.getpid()
        with self._lock:
            if not any(owner == pid for owner, _ in self._connections):
                return True
        return _still_at(list(held), _files_at(self._path), note=False)

    def _check_same_file(self, conn: sqlite3.Connection, what: str) -> None:
        """Raise :class:`LogError` (``io_error``) when the log's path (or its -wal or -shm)
        no longer names the file ``conn`` writes: it was deleted, its folder removed or moved,
        or another file put in its place while the log was open. SQLite would go on writing
        the file it holds open, which no reader of the path ever sees: a decision
        acknowledged there is lost. The connection is forgotten, so the next write opens the
        path again."""
        if self._same_files(writing=True):
            if _file_size(self._path) == 0:  # a WAL log's file holds at least its first page
                raise LogError(
                    f"decision log {str(self._path)!r}: could not {what}: its file was emptied "
                    "in place while it was open (logrotate's copytruncate, or `: >`): what it "
                    "held is gone and rows written now would be in no readable log. Move the "
                    "log's file and its -wal and -shm away: the next write starts a new log "
                    "there.",
                    "io_error",
                )
            return
        self._local.conn = None  # closed by _write once its transaction is rolled back
        self._local.moved = True
        there = "no file is there now" if _file_id(self._path) is None else "the file there now"
        raise LogError(
            f"decision log {str(self._path)!r}: could not {what}: the file this log wrote, or "
            f"its -wal or -shm, was removed or replaced while it was open ({there}); rows "
            "written to it would be in no log. The next write opens the file at that path "
            "again (a new log if none is there); keep the log's folder and files in place.",
            "io_error",
        )

    def _retry(self, fn: Callable[[], _T], *, what: str, timeout_s: float | None = None) -> _T:
        """Run ``fn``, retrying on SQLITE_BUSY/LOCKED with bounded backoff up to ``timeout_s``
        (default: the log's ``timeout_s``). At least one attempt is made."""
        wait = self._timeout_s if timeout_s is None else max(0.0, float(timeout_s))
        deadline = _time.monotonic() + wait
        delay = 0.001
        while True:
            try:
                out = fn()
                self._check_unwatched()
                return out
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    self._check_unwatched()  # a read torn by a writer: say that, not "malformed"
                    raise self._error(what, exc) from exc
                if _time.monotonic() >= deadline:
                    raise LogError(
                        f"decision log {str(self._path)!r} stayed busy for {wait:g} s while "
                        f"trying to {what} ({exc}). Another process holds a long write lock; "
                        "raise timeout_s or find the process that holds the file.",
                        kind="locked",
                    ) from exc
                _time.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, 0.1)
            except sqlite3.DatabaseError as exc:
                self._check_unwatched()  # (as above)
                raise self._error(what, exc) from exc

    def _file_state(self) -> tuple[int, int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _check_unwatched(self) -> None:
        """A log read with no writer (``immutable``, :meth:`_open_read_only`) is read without
        SQLite's locks: a read is answered only while the file is as it was when opened."""
        if self._unwatched is None or self._open_path != self._path:
            return
        if self._file_state() != self._unwatched:
            raise LogChangedError(
                f"decision log {str(self._path)!r} changed while it was read: it had no writer "
                "when it was opened (so it was read without SQLite's locks, leaving nothing "
                "beside it), and a writer has since written it. Open it again."
            )

    def _error(self, what: str, exc: sqlite3.Error) -> LogError:
        kind = fault_kind(exc)
        hint = {
            "disk_full": " The file system is full: free space (or lower the log's budget).",
            "read_only": " The log's file or file system is read-only: make it writable.",
        }.get(kind, "")
        if "not a database" in str(exc):
            hint = " The file is not a SQLite database; choose another path for the log."
        return LogError(
            f"decision log {str(self._path)!r}: could not {what}: {exc} ({kind}).{hint}", kind
        )

    def _write(
        self,
        body: Callable[[sqlite3.Connection], None],
        *,
        what: str,
        timeout_s: float | None = None,
    ) -> None:
        """Run ``body`` in one BEGIN IMMEDIATE … COMMIT transaction (with retries).

        ``timeout_s`` bounds the wait for a busy database for this write only (SQLite's
        busy handler and the retries); None: the log's ``timeout_s``. A write refused for a
        full disk is tried once more after a WAL checkpoint that truncates the -wal file
        (the space a grown WAL holds is often what the write needs).
        """
        if self._read_only:
            raise LogError(
                f"decision log {str(self._path)!r} was opened read-only (read_only=True) and "
                f"cannot {what}. Open it without read_only to write to it.",
                "read_only",
            )
        wait = None if timeout_s is None else max(0.0, float(timeout_s))
        conn = self._conn(wait)

        def attempt() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                body(conn)
                self._check_same_file(conn, what)  # never commit to a file no one reads
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    # SQLite may have rolled back itself already; the first error counts
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
            # removed between the check and the commit: the caller learns it was not logged
            self._check_same_file(conn, what)

        def run() -> None:
            try:
                self._retry(attempt, what=what, timeout_s=wait)
            except LogError as e:
                if e.kind != "disk_full" or not self._reclaim_wal(conn):
                    raise
                self._retry(attempt, what=what, timeout_s=wait)
            self._written_files = tuple(self._local.files)  # files_in_place() checks them

        try:
            if wait is None:
                run()
                return
            conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
            try:
                run()
            finally:
                conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        finally:
            if getattr(self._local, "conn", None) is not conn:  # its file is gone (see above)
                self._forget(conn)

    def checkpoint(self, *, timeout_s: float | None = None) -> bool:
        """Move the WAL's pages into the database and truncate the -wal file, giving its
        space back; True when done (False: a reader or writer held it, or it failed).

        ``timeout_s`` bounds the wait for readers and writers that hold the WAL (SQLite's
        busy handler); None: the log's ``timeout_s``. With 0 it never waits: it copies what
        it can without blocking (as a PASSIVE checkpoint does) and truncates only when nobody
        holds the WAL, which is what a guard call on a deadline may afford."""
        if self._read_only:
            return False  # a reader never moves the writer's pages
        try:
            conn = self._conn(timeout_s)
        except LogError:
            return False
        if timeout_s is None:
            return self._reclaim_wal(conn)
        wait = max(0.0, float(timeout_s))
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
        except sqlite3.Error:
            return False
        try:
            return self._reclaim_wal(conn)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")

    def _reclaim_wal(self, conn: sqlite3.Connection) -> bool:
        """Checkpoint the WAL into the database and truncate it; True when it was done."""
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        return int(busy) == 0

    def _init_schema(self, *, close: bool = True) -> None:
        try:
            self._write(
                lambda conn: _set_up_schema(conn, self._path), what="create or check the schema"
            )
        except BaseException:
            if close:
                self.close()
            raise

    def _open_read_only(self) -> None:
        """Check the log for :class:`DecisionLog` ``read_only``: read it in place when SQLite
        can and its schema is this spotstop's, else through a private migrated copy."""
        if not self._path.is_file():
            raise LogError(
                f"decision log {str(self._path)!r} does not exist; a log opened read-only is "
                "never created. Pass the guard's SQLite log file."
            )
        wal = self._path.with_name(self._path.name + "-wal")
        shm = self._path.with_name(self._path.name + "-shm")
        if not shm.exists():
            # No connection holds the log (SQLite's WAL mode keeps a -shm file beside it while
            # one does). Read in place, SQLite would create -shm and -wal files here, owned by
            # the reader: a guard running as another user could then not open its own log. So
            # a log with leftover -wal rows is read through a copy, and one without is read
            # in place without locks (immutable), each read checked against the file's state.
            if wal.exists():
                self._copy_files("a -wal file without its -shm: no connection holds the log")
                return
            self._unwatched = self._file_state()
        try:
            conn = self._conn()
            self._retry(lambda: conn.execute("SELECT 1 FROM sqlite_master").fetchall(), what="read")
        except LogError as exc:
            if exc.kind in ("locked", "closed") or "not a SQLite database" in str(exc):
                raise
            # SQLite reads a WAL log only with its shared-memory file, which it could neither
            # open nor create here (a read-only folder): read a copy of the files instead
            self._copy_files(str(exc))
            return
        found = self._retry(lambda: _schema_found(conn, self._path), what="read the schema")
        _check_readable(found, self._path)
        if found is not None and found < LOG_SCHEMA_VERSION:
            self._copy_snapshot(conn)

    def read_a_still_copy(self) -> None:
        """From now on read a private copy of a log read in place with no writer (the first
        read of it raised :class:`LogChangedError`): the copy is taken while the file stays as
        it was, so no writer can change what is read next. A log a writer holds (read with
        its locks) or one read through a copy already is left as it is. :class:`LogError` when
        the file kept changing for the log's ``timeout_s``."""
        if self._unwatched is None or self._open_path != self._path:
            return
        copy = self._private_folder()
        deadline = _time.monotonic() + self._timeout_s
        while True:
            before = self._file_state()
            try:
                shutil.copyfile(self._path, copy)
            except OSError as exc:
                raise LogError(
                    f"cannot copy decision log {str(self._path)!r} to read the copy ({exc}). "
                    "Copy it to a writable folder and read that.",
                    fault_kind(exc),
                ) from exc
            if before is not None and self._file_state() == before:
                break
            if _time.monotonic() >= deadline:
                raise LogError(
                    f"decision log {str(self._path)!r} kept changing while it was copied to be "
                    f"read, for {self._timeout_s:g} s. Read it again, or while the guard is "
                    "stopped.",
                    "locked",
                )
            _time.sleep(0.01 * (0.5 + self._rng.random()))
        self._use_copy(copy)

    def _private_folder(self) -> Path:
        self._private = tempfile.TemporaryDirectory(prefix="spotstop-log-")
        return Path(self._private.name) / self._path.name

    def _copy_snapshot(self, conn: sqlite3.Connection) -> None:
        """Read an older schema's log through a migrated copy of one snapshot of it (SQLite's
        backup of the read-only connection: the live writer, if any, is not disturbed)."""
        copy = self._private_folder()
        dst = sqlite3.connect(copy)
        try:
            conn.backup(dst)
        finally:
            dst.close()
        self._use_copy(copy)

    def _copy_files(self, cause: str) -> None:
        """Read a log SQLite could not open read-only in place through a copy of its file and
        its -wal file, whose rows the copy reads (no writer can hold a folder it cannot
        write either)."""
        copy = self._private_folder()
        try:
            shutil.copyfile(self._path, copy)
            wal = self._path.with_name(self._path.name + "-wal")
            if wal.is_file():
                shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        except OSError as exc:
            raise LogError(
                f"cannot read decision log {str(self._path)!r} read-only ({cause}), nor copy "
                f"it to read the copy ({exc}). Copy it to a writable folder and read that.",
                fault_kind(exc),
            ) from exc
        self._use_copy(copy)

    def _use_copy(self, copy: Path) -> None:
        for conn in self._take_connections():
            conn.close()
        conn = sqlite3.connect(copy, isolation_level=None)
        try:
            found = _schema_found(conn, self._path)
            _check_readable(found, self._path)
            if found is not None and found < LOG_SCHEMA_VERSION:
                # migrated as a guard migrates its log, but not by opening the copy as one: a
                # writer's opening reads the archives beside it, which the copy has not
                conn.execute("BEGIN IMMEDIATE")
                _set_up_schema(conn, self._path)
                conn.execute("COMMIT")
        finally:
            conn.close()
        self._open_path = copy

    @property
    def read_only(self) -> bool:
        """Whether this log was opened for reading only (``read_only=True``)."""
        return self._read_only

    @property
    def robot_id(self) -> str | None:
        """The robot this log belongs to (``meta.robot_id``), or None when it was never set."""
        row = self._retry(
            lambda: (
                self._conn().execute("SELECT value FROM meta WHERE key = 'robot_id'").fetchone()
            ),
            what="read the robot id",
        )
        return None if row is None else str(row[0])

    def _claim_robot(self, robot_id: str) -> None:
        _check_robot_id(robot_id)

        def body(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT value FROM meta WHERE key = 'robot_id'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta (key, value) VALUES ('robot_id', ?)", (robot_id,))
            elif row[0] != robot_id:
                raise LogError(
                    f"decision log {str(self._path)!r} belongs to robot {row[0]!r}, not "
                    f"{robot_id!r}: one log per robot. Give this robot its own log file (or "
                    "its own --robot-id)."
                )

        self._write(body, what="record the robot id")
        self._robot_id = robot_id  # claimed again in a file put at the path later (_adopt)

    # -- writing -------------------------------------------------------------------

    def append(
        self,
        record: DecisionRecord,
        image_bytes: bytes | None = None,
        *,
        policy: PolicyRow | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Append one decision; returns only after the write has committed.

        The return is the acknowledgement: the row survives a kill of this process from
        then on. ``image_bytes`` (the encoded image) is stored only when the log was opened
        with ``store_images=True``; its SHA-256 must equal ``record.image_sha256``.
        ``policy``: the policy that decided, kept in the ``policies`` table (once per
        version) in the same transaction. ``timeout_s``: how long this write may wait for a
        busy database (default: the log's ``timeout_s``); then :class:`LogError`.
        """
        self.append_many([record], images=[image_bytes], policy=policy, timeout_s=timeout_s)

    def append_many(
        self,
        records: Iterable[DecisionRecord],
        *,
        images: Sequence[bytes | None] | None = None,
        policy: PolicyRow | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Append several decisions in one transaction: all of them are written, or none.

        ``images``: one encoded image (or None) per record, stored as :meth:`append` stores
        one, in the same transaction. ``policy`` and ``timeout_s``: as for :meth:`append`.
        """
        self._append(list(records), images, policy, timeout_s, skip_present=False)

    def import_batch(
        self,
        records: Sequence[DecisionRecord],
        *,
        images: Sequence[bytes | None] | None = None,
        policy: PolicyRow | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Append the records that are not in the log yet, in one transaction; returns how
        many were added.

        For rows kept elsewhere while the log could not be written (the guard's journal): a
        row imported once is skipped when its batch is imported again (after a crash between
        the import and the journal's truncation), so importing twice is importing once.
        """
        return self._append(list(records), images, policy, timeout_s, skip_present=True)

    def _append(
        self,
        records: list[DecisionRecord],
        images: Sequence[bytes | None] | None,
        policy: PolicyRow | None,
        timeout_s: float | None,
        *,
        skip_present: bool,
    ) -> int:
        """The one write path of decisions (rows, their images, the deciding policy)."""
        imgs: list[bytes | None] = [None] * len(records) if images is None else list(images)
        if len(imgs) != len(records):
            raise RecordError(
                f"{'import_batch' if skip_present else 'append_many'} got {len(imgs)} images "
                f"for {len(records)} records; pass one image (or None) per record."
            )
        for r, img in zip(records, imgs, strict=True):
            check_append(r, img)
        if not records:
            return 0
        pairs = list(zip(records, imgs, strict=True))
        added = 0
        archived: set[str] = set()
        if skip_present:  # an archived row is in the log too (archives overlapping in time
            # whose id filter may hold one of the batch's ids)
            lo, hi = min(r.time for r in records), max(r.time for r in records)
            batch_ids = {r.decision_id for r in records}
            for info in self.archives():
                if info.first_time <= hi and info.last_time >= lo and info.may_hold(batch_ids):
                    archived |= {
                        row[ID_COLUMN] for _, row in read_archive(self.archive_folder, info)
                    }

        def body(conn: sqlite3.Connection) -> None:
            nonlocal added
            todo = pairs
            if skip_present:
                ids = [r.decision_id for r in records]
                q = ", ".join("?" * len(ids))
                present = {
                    row[0]
                    for row in conn.execute(
                        f"SELECT decision_id FROM decisions WHERE decision_id IN ({q})", ids
                    )
                } | archived
                todo = [(r, img) for r, img in pairs if r.decision_id not in present]
            self._insert_policy(conn, policy, min(r.time for r in records))
            self._insert(conn, [record_to_row(r) for r, _ in todo], self._first_position(conn))
            for r, img in todo:
                image = self._image_row(r, img)
                if image is not None:
                    self._store_image(conn, *image)
            added = len(todo)

        self._write(
            body,
            what="import decisions" if skip_present else "append decisions",
            timeout_s=timeout_s,
        )
        return added

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

    def _first_position(self, conn: sqlite3.Connection) -> int | None:
        """The position the next row must take when SQLite's own (one above the largest
        live) would repeat an archived one; None when SQLite's is right."""
        floor = self._seq_floor
        if floor is None:
            return None
        top = conn.execute("SELECT MAX(rowid) FROM decisions").fetchone()[0]
        if top is not None and int(top) >= floor:
            self._seq_floor = None  # retention keeps the newest row from now on
            return None
        return floor + 1

    def _insert(
        self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]], first: int | None = None
    ) -> None:
        try:
            if first is not None and rows:
                conn.execute(INSERT_AT, (first, *rows[0]))
                rows = rows[1:]
            conn.executemany(INSERT, rows)
        except sqlite3.IntegrityError as exc:
            ids = [r[ID_COLUMN] for r in rows]
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

    def probe(self, *, timeout_s: float | None = None) -> None:
        """Write one small row now (``meta.probe``), to learn whether the log takes writes.

        Raises :class:`LogError` (with its ``kind``) when it does not.
        """

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)",
                (repr(_time.time()),),
            )

        self._write(body, what="write a probe row", timeout_s=timeout_s)

    def mark_fail_closed(
        self,
        decision_ids: Sequence[str],
        reason: str,
        *,
        timeout_s: float | None = None,
        skip_unknown: bool = False,
    ) -> tuple[str, ...]:
        """Turn logged SAFE decisions into fail-closed UNSAFE ones, with ``reason``.

        The only change the log allows to a written decision, and only towards safety: the
        guard uses it when a decision's write finished after the call's deadline, so the
        row says what the caller was told. Rows already UNSAFE are left as they are. A
        decision already archived is amended in its archive
        (:meth:`~spotstop.guard._log_archive.ArchiveStore.amend_archived`: the file is
        written again and registered in the old one's place), after the live rows' commit.
        An id in no row of the log, live or archived, raises :class:`RecordError` and
        changes nothing, unless ``skip_unknown``: then the others are amended and those ids
        are returned (in the order given), for the caller to set aside (the guard's writer
        dead-letters only those). What it changes is declared once
        (:func:`~spotstop.guard._log_amend.amendment`); readers apply the same rule to rows
        whose amendment still waits in the journal or the dead letter. Raises
        :class:`LogError` when the log or an archive cannot take it now (live rows it
        committed stay amended; applying it again is harmless); with ``skip_unknown``, a
        failure on the archives' side is an :class:`ArchiveAmendError` that names the ids not
        amended and why (``kind``), the live rows amended.
        """
        ids = list(decision_ids)
        if not all(isinstance(i, str) and i for i in ids) or not isinstance(reason, str):
            raise RecordError(
                "mark_fail_closed expects decision ids (non-empty str) and a reason (str); "
                f"got {ids!r}, {reason!r}."
            )
        if not ids:
            return ()
        deadline = None if timeout_s is None else _time.monotonic() + max(0.0, timeout_s)

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - _time.monotonic())

        not_live: list[str] = []
        archived = _ArchivedIds(self)

        def body(conn: sqlite3.Connection) -> None:
            q = ", ".join("?" * len(ids))
            known = {
                row[0]
                for row in conn.execute(
                    f"SELECT decision_id FROM decisions WHERE decision_id IN ({q})", ids
                )
            }
            not_live[:] = [i for i in ids if i not in known]
            if not skip_unknown:  # all or nothing: the archives' ids first
                unknown = archived.not_archived(conn, not_live)
                if unknown:
                    raise RecordError(
                        f"mark_fail_closed: unknown decision_id {unknown[0]!r}; nothing "
                        "changed (it is in no row of the log, live or archived)."
                    )
            hit = [i for i in ids if i in known]
            if hit:
                conn.execute(*amend_sql(hit, reason))  # the one rule (_log_amend.py)

        archived.write(body, "mark decisions fail-closed", left)
        if not not_live:
            return ()
        try:  # the live rows are committed; the archives hold the others, or no row does
            found = self.amend_archived(not_live, reason, timeout_s=left())
        except (LogError, OSError) as e:
            if not skip_unknown:
                raise
            raise ArchiveAmendError(
                f"mark_fail_closed: the live rows were amended, but not the archives that may "
                f"hold {not_live!r}: {e}",
                fault_kind(e),
                tuple(not_live),
            ) from e
        return tuple(i for i in not_live if i not in found)

    def apply_dead_letter(self, *, timeout_s: float | None = None) -> DeadLetterApplied:
        """Apply the fail-closed amendments lying in the dead letter beside the log to the
        rows the log holds, live or archived (:meth:`mark_fail_closed`: an archived row's
        archive is written again), then remove them from the dead letter; ids in no row of
        the log stay there. Run when the log opens for writing and by each retention pass;
        cheap when nothing changed since the last run (``_log_dead_letter.py``)."""
        if self._read_only:
            raise LogError(
                f"decision log {str(self._path)!r} was opened read-only (read_only=True) and "
                "cannot apply its dead letter. Open it without read_only to write to it.",
                "read_only",
            )
        return apply_dead_letter(self, timeout_s=timeout_s)

    def set_labels(self, labels: Iterable[tuple[str, str, str | None, str | None]]) -> None:
        """Attach reviewer labels: items ``(decision_id, "safe"|"unsafe", contrast_id, reviewer)``.

        All items are validated first and written in one transaction; a label that exists
        is replaced (upsert) and its time set to now. An unknown decision id or a bad label
        raises :class:`RecordError` and writes nothing.
        """
        items = check_labels(labels)
        if not items:
            return
        now = _time.time()
        archived = _ArchivedIds(self)

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
            unknown = archived.not_archived(conn, [i for i in ids if i not in known])
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

        archived.write(body, "set labels")

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection this log opened; further use raises :class:`LogError`."""
        self._closed = True
        for conn in self._take_connections():
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        if self._private is not None:
            self._private.cleanup()
            self._private = None

    def _take_connections(self) -> list[sqlite3.Connection]:
        """The connections this process opened, forgotten here (closing them is the
        caller's). Connections of another process (inherited by fork) are not ours."""
        with self._lock:
            conns, self._connections = self._connections, []
            self._threads = {}
        self._local = threading.local()
        pid = os.getpid()
        return [conn for owner, conn in conns if owner == pid]

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
        mode = ", read_only" if self._read_only else ""
        return f"DecisionLog({str(self._path)!r}, store_images={self._store_images}{mode}, {state})"
