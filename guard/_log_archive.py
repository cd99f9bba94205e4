"""Retention: old decisions leave the live log for Parquet archives beside it, and come back.

A robot that checks every action fills its disk over weeks. :class:`Retention` gives the log a
budget (``max_bytes`` for the pages the live database uses, ``keep_days`` for the age of its
rows); :meth:`DecisionLog.apply_retention <spotstop.guard.DecisionLog.apply_retention>` moves
the oldest decisions over it into Parquet files in ``<log>.archive/``, then deletes them from
the live table:

1. the rows to move are chosen oldest first, never one that :class:`Protect` names (a row
   whose fail-closed amendment is still pending, the rows of the active policy's situation
   windows, a row under review: its image is still stored and it has no label yet);
2. they are written to a new Parquet file (temp file, fsync, rename, fsync of the folder) as
   the robot received them: a fail-closed amendment the log could not take, waiting in the
   journal or set aside for good in the dead letter, is applied to its row in the file
   (``_log_pending.py``, the rule of ``_log_amend.py``), so that an archive read on its own
   (a fleet's collected archives) never says SAFE for a decision answered UNSAFE;
3. one transaction registers the file in the ``archives`` table (name, rows, time span, size,
   sha256) and deletes exactly those rows. Before that commit the rows are live and the file
   is an orphan that no reader reads (the next pass removes it); after it, they are archived.

An amendment that comes after its row was archived (``DecisionLog.mark_fail_closed``) cannot
change that file (its sha256 is registered; copies of it are read alone): the archive is
written again whole with the row amended, registered in the old file's place in one
transaction, and the old file removed (:meth:`ArchiveStore.amend_archived`; its metadata
``spotstop.replaces`` names the files it supersedes). Each registration keeps a Bloom filter of
its archive's decision ids (``id_filter``, ``_log_id_filter.py``): a lookup by id reads only
the archives that may hold it.

So a decision is in the live table or in exactly one registered archive, never both, never
neither: the one rule of which rows count, which every reader of the log applies
(:class:`~spotstop.guard._log_read.LogReader`). An archive holds the live table's columns as
they are (same codecs: NaN as null, JSON text for the dict fields) plus ``log_seq``, the row's
position in the log, so reading it back gives the very records that were written; DuckDB and
pyarrow read the files as they are. Labels stay in the live ``labels`` table, which may name an
archived decision. Stored images are not archived: they follow the image retention.

Parquet needs pyarrow (a base dependency: retention runs on the robot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import logging
import math
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spotstop.guard._files import fsync_dir
from spotstop.guard._log_amend import amend_row
from spotstop.guard._log_id_filter import build as build_id_filter
from spotstop.guard._log_id_filter import may_hold
from spotstop.guard._log_schema import (
    ADDED_COLUMNS,
    ARCHIVE_FILTER_COLUMN,
    COLUMNS,
    ID_COLUMN,
    LOG_SCHEMA_VERSION,
    LogError,
    PolicyRow,
    RecordError,
    upgrade_columns,
)
from spotstop.guard._record import sql_columns
from spotstop.guard.validate import is_int, is_real

__all__ = [
    "ARCHIVE_SUFFIX",
    "MIN_ARCHIVE_AGE_S",
    "SEQ_COLUMN",
    "ArchiveFile",
    "ArchiveInfo",
    "Protect",
    "Retention",
    "RetentionResult",
    "archive_folder",
    "check_present",
    "read_archive",
    "read_archive_file",
    "write_archive",
]

ARCHIVE_SUFFIX: Final = ".archive"
"""The archive folder is the log's path plus this suffix (``decisions.sqlite.archive/``)."""

MIN_ARCHIVE_AGE_S: Final = 600.0
"""Retention never archives a decision younger than this by default (10 minutes)."""

SEQ_COLUMN: Final = "log_seq"
"""The archive column that keeps each row's position in the log (its SQLite rowid)."""

REPLACES_KEY: Final = "spotstop.replaces"
"""The archive metadata key naming the files a rewritten archive supersedes (a JSON list)."""

_log = logging.getLogger("spotstop.guard")

_ARROW_TYPE: Final = {"TEXT": "string", "REAL": "float64", "INTEGER": "int64"}


def archive_folder(log_path: Path) -> Path:
    """Where the archives of the log at ``log_path`` live."""
    return log_path.with_name(log_path.name + ARCHIVE_SUFFIX)


@dataclass(frozen=True)
class Retention:
    """The log's disk budget.

    max_bytes:
        Most bytes of database pages the live log may use (its rows, indexes, labels, stored
        images). Over it, the oldest unprotected decisions are archived until the log is
        back under ``low_water · max_bytes``. The WAL file adds up to about 4 MiB on top.
        None: no size budget.
    keep_days:
        Decisions older than this many days are archived. None: no age limit.
    low_water:
        The fraction of ``max_bytes`` a size-driven pass trims down to (so that the next
        decisions do not start a pass each).
    """

    max_bytes: int | None = None
    keep_days: float | None = None
    low_water: float = 0.9

    def __post_init__(self) -> None:
        if self.max_bytes is not None and (not is_int(self.max_bytes) or self.max_bytes <= 0):
            raise RecordError(
                f"retention max_bytes (--log-max-bytes, log_max_bytes) must be a positive "
                f"number of bytes or None; got {self.max_bytes!r}."
            )
        if self.keep_days is not None and (
            not is_real(self.keep_days) or not math.isfinite(self.keep_days) or self.keep_days <= 0
        ):
            raise RecordError(
                f"retention keep_days (--log-keep-days, log_keep_days) must be a positive "
                f"number of days or None; got {self.keep_days!r}."
            )
        if not is_real(self.low_water) or not 0 < self.low_water <= 1:
            raise RecordError(f"retention low_water must be in (0, 1]; got {self.low_water!r}.")

    @property
    def active(self) -> bool:
        """Whether this retention ever archives anything."""
        return self.max_bytes is not None or self.keep_days is not None


@dataclass(frozen=True)
class Protect:
    """What retention must leave in the live log.

    decision_ids: these decisions (e.g. a SAFE row whose fail-closed amendment is pending).
    windows: policy version id → window: per situation, the last ``window`` decisions that
        entered that policy (finite ``policy_score``), which make its live state.
    review: keep each decision whose image is still stored and that has no label yet.
    min_age_s: keep every decision younger than this (seconds before the pass's ``now``; 10
        minutes by default): a late answer's fail-closed amendment may still be on its way
        to it. 0: no age protection.
    """

    decision_ids: frozenset[str] = frozenset()
    windows: Mapping[str, int] = field(default_factory=dict)
    review: bool = True
    min_age_s: float = MIN_ARCHIVE_AGE_S


@dataclass(frozen=True)
class ArchiveInfo:
    """One registered archive file (a row of the log's ``archives`` table)."""

    name: str
    n_rows: int
    first_time: float
    last_time: float
    n_bytes: int
    sha256: str
    created: float
    id_filter: bytes | None = field(default=None, repr=False)
    """A Bloom filter of the archive's decision ids (``_log_id_filter.py``); None: not known
    (registered before it existed, or by an older spotstop), the archive may hold any id."""

    def may_hold(self, decision_ids: Collection[str]) -> bool:
        """Whether this archive may hold one of ``decision_ids`` (False: certainly none)."""
        return may_hold(self.id_filter, decision_ids)

    def __repr__(self) -> str:
        span = f"{_utc(self.first_time)} .. {_utc(self.last_time)}"
        return f"ArchiveInfo({self.name!r}, n_rows={self.n_rows}, {span}, {self.n_bytes} B)"


@dataclass(frozen=True)
class RetentionResult:
    """What one retention pass did.

    ``bytes_before``/``bytes_after``: database pages in use before and after; ``over_budget``:
    still over ``max_bytes`` after the pass (what is left cannot be archived: protected rows,
    labels, policies, stored images, the tables themselves);
    ``protected_rows``: rows the pass had to leave.
    """

    archived_rows: int
    files: tuple[str, ...]
    bytes_before: int
    bytes_after: int
    max_bytes: int | None
    protected_rows: int
    over_budget: bool

    def __repr__(self) -> str:
        budget = "no size budget" if self.max_bytes is None else f"budget {self.max_bytes} B"
        over = ", OVER BUDGET (what is left cannot be archived)" if self.over_budget else ""
        return (
            f"RetentionResult(archived {self.archived_rows} rows in {len(self.files)} file(s), "
            f"{self.bytes_before} -> {self.bytes_after} B, {budget}, "
            f"protected {self.protected_rows}{over})"
        )


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # a base dependency; a broken install says so
        raise LogError(
            "log archives are Parquet files and need pyarrow, a base dependency of spotstop "
            "that is not importable here. Reinstall spotstop (`pip install spotstop`)."
        ) from exc
    return pa, pq


def write_archive(
    folder: Path,
    seqs: list[int],
    rows: list[tuple[Any, ...]],
    *,
    robot_id: str | None = None,
    policies: Mapping[str, PolicyRow] | None = None,
    log_id: str | None = None,
    replaces: Sequence[str] = (),
) -> ArchiveInfo:
    """Write ``rows`` (rows of the ``decisions`` table, in log order) to a new Parquet file.

    The file is complete and synced under its final name when this returns; its name carries
    its time span and the start of its sha256. Registering it (and deleting the rows from the
    live table) is the caller's transaction. ``robot_id`` and the ``policies`` that decided
    the rows go into the file's metadata, so that a copy of the archive alone (a fleet's
    collected archives) still says whose decisions these are and what decided them; so does
    ``log_id`` (the log's creation stamp), which says which log's positions ``log_seq`` holds.
    ``replaces``: the names of the files this one supersedes (an archive rewritten to take a
    late fail-closed amendment, :meth:`ArchiveStore.amend_archived`), so that a collector that
    copied both reads only this one.
    """
    pa, pq = _pyarrow()
    if not rows:
        raise LogError("write_archive: no rows to archive.")
    folder.mkdir(parents=True, exist_ok=True)
    arrays = [pa.array(seqs, type=pa.int64())]
    names = [SEQ_COLUMN]
    for i, (name, sql) in enumerate(sql_columns()):
        kind = _ARROW_TYPE[sql.split()[0]]
        arrays.append(pa.array([r[i] for r in rows], type=getattr(pa, kind)()))
        names.append(name)
    versions = {r[COLUMNS.index("policy_version")] for r in rows}
    used = {v: dataclasses.asdict(p) for v, p in (policies or {}).items() if v in versions}
    meta = {
        "spotstop.table": "decisions",
        "spotstop.log_schema_version": str(LOG_SCHEMA_VERSION),
        "spotstop.policies": json.dumps(used, sort_keys=True, default=str),
    }
    if robot_id is not None:
        meta["spotstop.robot_id"] = robot_id
    if log_id is not None:
        meta["spotstop.log_id"] = log_id
    if replaces:
        meta[REPLACES_KEY] = json.dumps(list(replaces))
    table = pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(meta)
    times = [float(r[COLUMNS.index("time")]) for r in rows]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".archive-", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        data = Path(tmp).read_bytes()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        sha = hashlib.sha256(data).hexdigest()
        stamp = _utc(min(times)).replace(":", "").replace("-", "")
        # unique per pass (a random part): two passes never write, or remove, one file
        name = f"decisions-{stamp}-{len(rows)}-{sha[:12]}-{secrets.token_hex(4)}.parquet"
        os.replace(tmp, folder / name)
        fsync_dir(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return ArchiveInfo(
        name=name,
        n_rows=len(rows),
        first_time=min(times),
        last_time=max(times),
        n_bytes=len(data),
        sha256=sha,
        created=_dt.datetime.now(_dt.UTC).timestamp(),
        id_filter=build_id_filter(str(r[ID_COLUMN]) for r in rows),
    )


def check_present(folder: Path, infos: list[ArchiveInfo]) -> None:
    """Every registered archive is there with its registered size (a cheap check; reading
    one also checks its sha256); :class:`LogError` names the first that is not."""
    for info in infos:
        path = folder / info.name
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise LogError(
                f"log archive {str(path)!r} is registered in the log but cannot be read "
                f"({exc}). Put the archive folder back beside the log (it holds decisions no "
                "longer in the live table)."
            ) from exc
        if size != info.n_bytes:
            raise LogError(
                f"log archive {str(path)!r} has {size} bytes, but the log registered "
                f"{info.n_bytes}: the file changed since it was written. Restore it from a copy."
            )


@dataclass(frozen=True)
class ArchiveFile:
    """An archive read on its own (not through its log): its rows, in log order, with their
    ``log_seq``, the policies that decided them and the robot, from the file's metadata."""

    path: Path
    seqs: tuple[int, ...]
    rows: tuple[tuple[Any, ...], ...]
    policies: Mapping[str, PolicyRow]
    robot_id: str | None
    log_id: str | None = None  # which log's positions seqs are (None: an older archive)
    replaces: tuple[str, ...] = ()  # the names of the files this one supersedes (REPLACES_KEY)


def _missing(table: Any) -> list[str]:
    """The columns an archive must have but lacks (a column a later log schema added is
    filled in from the others: :func:`upgrade_columns`)."""
    have = set(table.column_names)
    return [c for c in (SEQ_COLUMN, *COLUMNS) if c not in have and c not in ADDED_COLUMNS]


def _columns(table: Any) -> list[list[Any]]:
    """The archive's ``decisions`` columns in :data:`COLUMNS` order, those an older archive
    lacks filled in as the log's migration fills them."""
    have = set(table.column_names)
    cols = upgrade_columns({c: table.column(c).to_pylist() for c in COLUMNS if c in have})
    return [cols[c] for c in COLUMNS]


def read_archive_file(path: str | os.PathLike[str]) -> ArchiveFile:
    """Read one archive file without its log (no sha256 to check it against: a copy)."""
    pa, pq = _pyarrow()
    p = Path(path)
    try:
        table = pq.read_table(p)
    except (OSError, pa.ArrowInvalid) as exc:
        raise LogError(f"{str(p)!r} cannot be read as a log archive (Parquet): {exc}") from exc
    return _archive_file(p, table)


def _archive_file(p: Path, table: Any) -> ArchiveFile:
    """The Parquet ``table`` read from ``p`` as an archive (its metadata checked)."""
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    missing = _missing(table)
    if meta.get("spotstop.table") != "decisions" or missing:
        raise LogError(
            f"{str(p)!r} is not a spotstop log archive (metadata table "
            f"{meta.get('spotstop.table')!r}, missing columns {missing})."
        )
    version = int(meta.get("spotstop.log_schema_version", "0"))
    if version > LOG_SCHEMA_VERSION:
        raise LogError(
            f"log archive {str(p)!r} has log schema {version}; this spotstop reads "
            f"{LOG_SCHEMA_VERSION} at most. Upgrade spotstop to read it."
        )
    policies = {
        v: PolicyRow(**d) for v, d in json.loads(meta.get("spotstop.policies", "{}")).items()
    }
    seqs = table.column(SEQ_COLUMN).to_pylist()
    cols = _columns(table)
    order = sorted(range(len(seqs)), key=seqs.__getitem__)  # log order, as read_archive
    rows = tuple(tuple(c[i] for c in cols) for i in order)
    return ArchiveFile(
        p,
        tuple(int(seqs[i]) for i in order),
        rows,
        policies,
        meta.get("spotstop.robot_id"),
        meta.get("spotstop.log_id"),
        tuple(json.loads(meta.get(REPLACES_KEY, "[]"))),
    )


def read_archive(folder: Path, info: ArchiveInfo) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(log_seq, row)`` of every decision in a registered archive, in log order (by
    ``log_seq``, the row's position in the log).

    The file must be the one registered: present, with the registered sha256 and row count;
    otherwise :class:`LogError` says which file and what to do (a card on part of a log would
    be a false statement, so a missing archive is never skipped).
    """
    table = _read_registered(folder, info)
    seqs = table.column(SEQ_COLUMN).to_pylist()
    cols = _columns(table)
    # in position order: an archive written before the log's order was its positions holds
    # its rows by time, which a stepped clock may have put in another order
    for i in sorted(range(len(seqs)), key=seqs.__getitem__):
        yield int(seqs[i]), tuple(c[i] for c in cols)


def _read_registered(folder: Path, info: ArchiveInfo) -> Any:
    """The Parquet table of a registered archive, checked against its registration (see
    :func:`read_archive`)."""
    pa, pq = _pyarrow()
    path = folder / info.name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogError(
            f"log archive {str(path)!r} is registered in the log but cannot be read ({exc}). "
            "If a fail-closed amendment replaced it while it was being read (the log names "
            "another file now), read again; otherwise put the archive folder back beside the "
            "log (it holds decisions no longer in the live table)."
        ) from exc
    sha = hashlib.sha256(data).hexdigest()
    if sha != info.sha256:
        raise LogError(
            f"log archive {str(path)!r} has sha256 {sha}, but the log registered "
            f"{info.sha256}: the file changed since it was written. Restore it from a copy."
        )
    table = pq.read_table(pa.BufferReader(data))
    missing = _missing(table)
    if missing or table.num_rows != info.n_rows:
        raise LogError(
            f"log archive {str(path)!r} does not hold what the log registered ({info.n_rows} "
            f"rows; it has {table.num_rows}, missing columns {missing}). Restore it from a copy."
        )
    return table


#: the ``meta`` key a retention pass writes before it reads the registrations to remove
#: orphans (the commit makes what it read final; its value is the time of the last check)
ORPHAN_CHECK_KEY: Final = "orphan_check"
#: the ``meta`` key holding the largest position any archive of the log holds
SEQ_FLOOR_KEY: Final = "archived_seq_max"


def _raise_seq_floor(conn: Any, seq: int) -> None:
    """``meta.archived_seq_max`` = max(itself, ``seq``), in the caller's transaction."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (SEQ_FLOOR_KEY,)).fetchone()
    top = max(int(seq), int(row[0])) if row is not None else int(seq)
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (SEQ_FLOOR_KEY, str(top))
    )


# --------------------------------------------------------------------------------------
# The log's side (mixed into DecisionLog, which provides the connection and the writes)
# --------------------------------------------------------------------------------------

_KEEP_SQL: Final = "CREATE TEMP TABLE IF NOT EXISTS _spotstop_keep (r INTEGER PRIMARY KEY)"


class ArchiveStore:
    """Archives and retention of :class:`~spotstop.guard.DecisionLog` (mixed into it)."""

    _path: Path
    _retry: Any
    _conn: Any
    _write: Any
    robot_id: Any
    policies: Any
    pending_changes: Any
    apply_dead_letter: Any
    _retention_mutex: threading.Lock

    @property
    def archive_folder(self) -> Path:
        """The folder beside the log that holds its archives (``<log>.archive/``)."""
        return archive_folder(self._path)

    def log_id(self) -> str | None:
        """The log's identity (``meta.created``, the stamp of its creation), written into its
        archives: a fleet tells one log's positions from another's by it."""
        row = self._retry(
            lambda: self._conn().execute("SELECT value FROM meta WHERE key = 'created'").fetchone(),
            what="read the log's identity",
        )
        return None if row is None else str(row[0])

    def seq_floor(self) -> int | None:
        """The largest position any registered archive holds (``meta.archived_seq_max``), or
        None for a log without archives. A log whose archives predate the key has it
        computed once from their ``log_seq`` columns and stored. The next row's position
        must be above it (guard/_log_read.py: positions never repeat)."""

        def read() -> Any:
            return (
                self._conn()
                .execute("SELECT value FROM meta WHERE key = ?", (SEQ_FLOOR_KEY,))
                .fetchone()
            )

        row = self._retry(read, what="read the archived positions' floor")
        if row is not None:
            return int(row[0])
        infos = self.archives()
        if not infos:
            return None
        _, pq = _pyarrow()
        top = max(
            (
                max(pq.read_table(self.archive_folder / i.name, columns=[SEQ_COLUMN])
                    .column(SEQ_COLUMN).to_pylist(), default=0)
                for i in infos
            ),
            default=0,
        )  # fmt: skip
        self._write(lambda conn: _raise_seq_floor(conn, top), what="store the positions' floor")
        return int(top)

    def archives(self) -> list[ArchiveInfo]:
        """The registered archive files, oldest first (with their id filters where the
        registry has them: a log of this schema an older spotstop created has no column for
        them until it is opened for writing)."""

        def read() -> tuple[list[str], list[Any]]:
            cur = self._conn().execute("SELECT * FROM archives ORDER BY first_time, name")
            return [c[0] for c in cur.description], cur.fetchall()

        names, rows = self._retry(read, what="read the archives table")
        at = {n: i for i, n in enumerate(names)}
        f = at.get(ARCHIVE_FILTER_COLUMN)
        return [
            ArchiveInfo(
                r[at["name"]],
                int(r[at["n_rows"]]),
                r[at["first_time"]],
                r[at["last_time"]],
                int(r[at["n_bytes"]]),
                r[at["sha256"]],
                r[at["created"]],
                None if f is None or r[f] is None else bytes(r[f]),
            )
            for r in rows
        ]

    def used_bytes(self) -> int:
        """Bytes of database pages in use (what :class:`Retention` budgets; the WAL is apart)."""

        def read() -> int:
            c = self._conn()
            size = c.execute("PRAGMA page_size").fetchone()[0]
            count = c.execute("PRAGMA page_count").fetchone()[0]
            free = c.execute("PRAGMA freelist_count").fetchone()[0]
            return int((count - free) * size)

        return int(self._retry(read, what="measure the log"))

    def file_bytes(self) -> int:
        """Bytes of the log's files on disk now (database, WAL and shared-memory file)."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(str(self._path) + suffix)
        return total

    def apply_retention(
        self,
        retention: Retention,
        protect: Protect | None = None,
        *,
        now: float | None = None,
        max_rows_per_file: int = 50_000,
    ) -> RetentionResult:
        """Archive the oldest unprotected decisions over ``retention``'s budget (see module).

        Rows older than ``keep_days`` (relative to ``now``, default the clock) are archived;
        while the pages in use exceed ``max_bytes``, the oldest unprotected rows are archived
        until they are under ``low_water · max_bytes``, each as the robot received it (an
        amendment waiting in the log's journal or dead letter applied). Raises
        :class:`LogError` when the archive or the log cannot be written, or when the journal
        or the dead letter cannot be read (nothing is archived then: what waits there could
        not be applied); what was registered before stays archived and the rest stays live.
        """
        if not isinstance(retention, Retention):
            raise RecordError(
                f"apply_retention expects a Retention; got {type(retention).__name__}."
            )
        # first the dead letter's amendments of rows the log holds (an opening that could not
        # apply them, a retention pass holding the archives then); best effort: the pass
        # archives rows as answered whatever the dead letter still holds
        try:
            self.apply_dead_letter()
        except Exception as exc:  # (whatever it is, the pass archives rows as answered)
            _log.warning("retention: the dead letter's amendments not applied now (%s)", exc)
        with self._retention_lock():
            return self._apply_retention(retention, protect, now, max_rows_per_file)

    @contextlib.contextmanager
    def _retention_lock(self, timeout_s: float | None = None) -> Iterator[None]:
        """One pass at a time: in this process (a lock per log object) and across processes
        (``flock`` on ``<log>.archive/.lock``), from the orphan clean-up to the last commit.
        ``timeout_s``: wait at most that long for a pass under way (None: as long as it
        takes), then raise :class:`LogError` (kind ``locked``)."""
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)

        def busy() -> LogError:
            return LogError(
                f"the archives of {str(self.archive_folder)!r} are held by a retention pass "
                f"under way (waited {timeout_s:g} s); try again when it has ended.",
                "locked",
            )

        if not self._retention_mutex.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise busy()
        try:
            folder = self.archive_folder
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                        break
                    except BlockingIOError:
                        if deadline is None or time.monotonic() >= deadline:
                            raise busy() from None
                        time.sleep(0.01)
                yield
            finally:
                os.close(fd)
        finally:
            self._retention_mutex.release()

    def amend_archived(
        self, decision_ids: Collection[str], reason: str, *, timeout_s: float | None = None
    ) -> frozenset[str]:
        """Apply a fail-closed amendment to decisions that are already archived.

        An archive file cannot be changed in place (its sha256 is registered, and a copy of it
        may be read alone: a fleet's collected archives), so each registered archive that
        holds a row the amendment changes (a SAFE one: the rule of
        :func:`~spotstop.guard._log_amend.amend_row`) is written again whole, as a new file
        (same rows, positions, robot, policies and log id; ``spotstop.replaces`` names the
        files it supersedes), then one transaction registers it in the old one's place, then
        the old file is removed. A crash before that commit leaves the new file an orphan
        (the next pass removes it); after it, the old one (removed likewise). Every reader of
        the archive, with its log or alone, then reads the row as the robot received it.

        Returns the ids found in the archives (amended, or already UNSAFE). Raises
        :class:`LogError` when a retention pass holds the archives past ``timeout_s``, or an
        archive cannot be read or written; what was committed before stays.
        """
        ids = set(decision_ids)
        if not ids:
            return frozenset()
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        found: set[str] = set()
        with self._retention_lock(left()):
            folder = self.archive_folder
            for info in self.archives():
                if not info.may_hold(ids):  # its id filter: none of them is in it
                    continue
                path = folder / info.name
                held = _archive_file(path, _read_registered(folder, info))
                here = {r[ID_COLUMN] for r in held.rows} & ids
                if not here:
                    continue
                found |= here
                rows = [
                    (amend_row(r, reason) if r[ID_COLUMN] in here else None) or r for r in held.rows
                ]
                if rows == list(held.rows):  # already UNSAFE: nothing to change
                    continue
                new = write_archive(
                    folder,
                    list(held.seqs),
                    rows,
                    robot_id=held.robot_id,
                    policies=held.policies,
                    log_id=held.log_id,
                    replaces=(*held.replaces, info.name),
                )
                self._replace(info, new, left())
        return frozenset(found)

    def _replace(self, old: ArchiveInfo, new: ArchiveInfo, timeout_s: float | None) -> None:
        """One transaction: ``new`` is registered in ``old``'s place (only if ``old`` is still
        registered as it was read); then ``old``'s file is removed."""
        reached_commit: list[bool] = []

        def body(conn: Any) -> None:
            reached_commit.clear()
            cur = conn.execute(
                "UPDATE archives SET name = ?, n_bytes = ?, sha256 = ?, id_filter = ? "
                "WHERE name = ? AND sha256 = ?",
                (new.name, new.n_bytes, new.sha256, new.id_filter, old.name, old.sha256),
            )
            if cur.rowcount != 1:
                raise LogError(
                    f"log archive {old.name!r} left the log's registrations while it was being "
                    "amended; nothing was changed. Apply the amendment again."
                )
            reached_commit.append(True)

        try:
            self._write(body, what="register an amended archive", timeout_s=timeout_s)
        except BaseException:
            if not reached_commit:  # as _register: a file no registration names
                with contextlib.suppress(OSError):
                    (self.archive_folder / new.name).unlink()
            raise
        with contextlib.suppress(OSError):  # else an orphan the next pass removes
            (self.archive_folder / old.name).unlink()
            fsync_dir(self.archive_folder)

    def _apply_retention(
        self,
        retention: Retention,
        protect: Protect | None,
        now: float | None,
        max_rows_per_file: int,
    ) -> RetentionResult:
        protect = Protect() if protect is None else protect
        now = _dt.datetime.now(_dt.UTC).timestamp() if now is None else float(now)
        pending = self.pending_changes()
        if pending.faults:
            raise LogError(
                f"retention archived nothing: {'; '.join(pending.faults)} could not be read, so "
                "the fail-closed amendments waiting there could not be applied to the rows "
                "archived. Let the guard's user read them (or move them back), then run again."
            )
        self._remove_orphans()
        before = used = self.used_bytes()
        cutoff = None if retention.keep_days is None else now - retention.keep_days * 86400.0
        budget = retention.max_bytes
        target = None if budget is None else int(budget * retention.low_water)
        files: list[str] = []
        archived = 0
        while True:
            if budget is not None and target is not None and used > (target if files else budget):
                n = self._rows_to_free(used - target)
                older_than = None
            elif cutoff is not None:
                n, older_than = max_rows_per_file, cutoff
            else:
                break
            seqs, rows = self._candidates(protect, now, min(n, max_rows_per_file), older_than)
            if not rows:
                break
            info = write_archive(
                self.archive_folder,
                seqs,
                pending.amend_rows(rows)[0],  # as answered; the log's rows are left as they are
                robot_id=self.robot_id,
                policies=self.policies(),
                log_id=self.log_id(),
            )
            self._register(info, seqs, rows)  # a failed one removes its file when it can
            files.append(info.name)
            archived += len(rows)
            used = self.used_bytes()
        if files:
            self._give_back_pages()
        after = self.used_bytes()
        protected = self._protect(protect, now)
        return RetentionResult(
            archived_rows=archived,
            files=tuple(files),
            bytes_before=before,
            bytes_after=after,
            max_bytes=budget,
            protected_rows=protected,
            over_budget=budget is not None and after > budget,
        )

    def _rows_to_free(self, excess: int) -> int:
        """Rows to archive to free about ``excess`` bytes (at least one)."""

        def read() -> tuple[int, int]:
            c = self._conn()
            n = c.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
            img = c.execute("SELECT COALESCE(SUM(n_bytes), 0) FROM images").fetchone()[0]
            return int(n), int(img)

        n, image_bytes = self._retry(read, what="measure the log")
        per_row = max(1.0, (self.used_bytes() - image_bytes) / max(1, n))
        return max(1, math.ceil(excess / per_row))

    def _protect(self, protect: Protect, now: float) -> int:
        """Fill the connection's temp table of protected rowids; returns how many."""

        def fill() -> int:
            c = self._conn()
            c.execute(_KEEP_SQL)
            c.execute("DELETE FROM temp._spotstop_keep")
            ids = sorted(protect.decision_ids)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                c.execute(
                    "INSERT OR IGNORE INTO temp._spotstop_keep SELECT rowid FROM decisions "
                    f"WHERE decision_id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                )
            for version, window in protect.windows.items():
                c.execute(
                    "INSERT OR IGNORE INTO temp._spotstop_keep SELECT r FROM (SELECT rowid AS r, "
                    "ROW_NUMBER() OVER (PARTITION BY situation_id ORDER BY rowid DESC) AS n "
                    "FROM decisions WHERE policy_version = ? AND situation_id IS NOT NULL AND "
                    "policy_score IS NOT NULL) WHERE n <= ?",
                    (version, int(window)),
                )
            if protect.min_age_s > 0:
                c.execute(
                    "INSERT OR IGNORE INTO temp._spotstop_keep SELECT rowid FROM decisions "
                    "WHERE time > ?",
                    (now - float(protect.min_age_s),),
                )
            if protect.review:
                c.execute(
                    "INSERT OR IGNORE INTO temp._spotstop_keep SELECT d.rowid FROM decisions "
                    "AS d JOIN images AS i ON i.sha256 = d.image_sha256 WHERE NOT EXISTS "
                    "(SELECT 1 FROM labels AS l WHERE l.decision_id = d.decision_id)"
                )
            return int(c.execute("SELECT COUNT(*) FROM temp._spotstop_keep").fetchone()[0])

        return int(self._retry(fill, what="mark the rows retention keeps"))

    def _candidates(
        self, protect: Protect, now: float, n: int, older_than: float | None
    ) -> tuple[list[int], list[tuple[Any, ...]]]:
        """The ``n`` first unprotected rows in log order (older than ``older_than`` when
        given). The newest row is never one: the next rowid SQLite gives is one above the
        largest in the table, so keeping it keeps every position unique (guard/_log_read.py)."""
        self._protect(protect, now)
        where = (
            "WHERE rowid NOT IN (SELECT r FROM temp._spotstop_keep) "
            "AND rowid < (SELECT MAX(rowid) FROM decisions)"
        )
        params: list[Any] = []
        if older_than is not None:
            where += " AND time < ?"
            params.append(older_than)
        sql = f"SELECT rowid, {', '.join(COLUMNS)} FROM decisions {where} ORDER BY rowid LIMIT ?"
        rows = self._retry(
            lambda: self._conn().execute(sql, [*params, int(n)]).fetchall(),
            what="choose rows to archive",
        )
        return [int(r[0]) for r in rows], [tuple(r[1:]) for r in rows]

    def _register(self, info: ArchiveInfo, seqs: list[int], rows: list[tuple[Any, ...]]) -> None:
        """One transaction: the archive is registered and exactly its rows leave the table,
        only if each is still as it was chosen (``rows``: as the table held them; an
        amendment made meanwhile, e.g. a late answer turned fail-closed UNSAFE, rolls the
        pass back: the next one archives it as it is now)."""
        id_col = COLUMNS.index("decision_id")
        reached_commit: list[bool] = []

        def body(conn: Any) -> None:
            reached_commit.clear()  # a retried attempt starts again
            _raise_seq_floor(conn, max(seqs))
            conn.execute(
                "INSERT INTO archives (name, n_rows, first_time, last_time, n_bytes, sha256, "
                "created, id_filter) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.name,
                    info.n_rows,
                    info.first_time,
                    info.last_time,
                    info.n_bytes,
                    info.sha256,
                    info.created,
                    info.id_filter,
                ),
            )
            want = {int(q): tuple(r) for q, r in zip(seqs, rows, strict=True)}
            cols = ", ".join(COLUMNS)
            for start in range(0, len(seqs), 500):
                chunk = seqs[start : start + 500]
                q = ", ".join("?" * len(chunk))
                now = conn.execute(
                    f"SELECT rowid, {cols} FROM decisions WHERE rowid IN ({q})", chunk
                ).fetchall()
                changed = [r[0] for r in now if tuple(r[1:]) != want[int(r[0])]]
                if len(now) != len(chunk) or changed:
                    raise LogError(
                        f"retention: rows chosen for {info.name} changed or left the log "
                        "meanwhile; the pass was rolled back and the next one archives them "
                        "as they are now."
                    )
                conn.executemany(
                    "DELETE FROM decisions WHERE rowid = ? AND decision_id = ?",
                    [(q_, want[int(q_)][id_col]) for q_ in chunk],
                )
            reached_commit.append(True)

        try:
            self._write(body, what="register an archive")
        except BaseException:
            if not reached_commit:  # rolled back before its COMMIT: the file names nothing
                with contextlib.suppress(OSError):
                    (self.archive_folder / info.name).unlink()
            # else the COMMIT itself failed: it may have been written all the same (an I/O
            # error at its fsync leaves valid frames a crash's recovery replays), so the file
            # stays for a later pass's _remove_orphans to judge
            raise

    def _remove_orphans(self) -> None:
        """Delete archive files no registration names (a pass stopped before its commit, or
        whose commit reported an error: their rows are still live).

        The registrations are read in a write transaction that commits first: a commit that
        reported an error may have left its frames in the WAL, and a crash before the next
        commit would replay it, registering a file deleted here. A commit that succeeds
        after it overwrites those frames, so what it read is final. If it cannot commit, no
        file is deleted."""
        folder = self.archive_folder
        if not folder.is_dir():
            return
        names: list[str] = []

        def body(conn: Any) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                (ORPHAN_CHECK_KEY, str(time.time())),
            )
            names.extend(r[0] for r in conn.execute("SELECT name FROM archives").fetchall())

        try:
            self._write(body, what="check the archive folder for orphans")
        except LogError:  # not final: leave every file for a later pass
            return
        known = set(names)
        for p in folder.iterdir():
            orphan = p.suffix == ".parquet" and p.name not in known
            if orphan or (p.name.startswith(".archive-") and p.suffix == ".tmp"):
                with contextlib.suppress(OSError):
                    p.unlink()

    def _give_back_pages(self) -> None:
        """Return freed pages to the file system (logs created with incremental vacuum) and
        cut the WAL back; a busy log keeps them for now (its next rows reuse them)."""

        def run() -> None:
            c = self._conn()
            c.executescript("PRAGMA incremental_vacuum;")
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        with contextlib.suppress(LogError):
            self._retry(run, what="give freed pages back")
