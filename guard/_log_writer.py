"""The guard's log writer: every decision reaches the log, whatever the disk does.

:class:`LogWriter` stands between the guard's pipeline and its :class:`DecisionLog`:

* **Write, or keep.** A call's rows are written in one transaction after whatever is still
  waiting (oldest first); :meth:`LogWriter.commit` does it within the call's deadline and
  returns the rows as they may be answered. When the log cannot take them they become
  fail-closed UNSAFE and are kept (:meth:`LogWriter.keep`): they wait in memory, at most
  ``max_pending_bytes`` of them (8 MiB by default) and at most ``spill_after_s`` seconds
  (5 s), then are *spilled* to the journal (``_journal.py``), a second place on disk. When the
  journal cannot take them either and memory is at its bound, the writer stops
  :attr:`~LogWriter.accepting`: the guard then makes no decision at all (the sidecar answers
  503) rather than one it could not keep.
* **Recover by itself.** :meth:`LogWriter.flush` (the sidecar calls it every second while
  anything waits, and every write calls it first) imports the journal, writes what waits in
  memory and the pending amendments, or probes the log when nothing waits: the first success
  makes the log writable again, with no operator action.
* **Late is UNSAFE.** A SAFE row whose write finished after the call's deadline is answered
  fail-closed UNSAFE and amended in the log (:meth:`LogWriter.amend_late`; kept and retried
  when even that fails).
* **Say why.** Each failure is classified (``disk_full``, ``read_only``, ``locked``,
  ``io_error``, ...; :data:`~spotstop.guard._log_schema.FAULT_KINDS`), counted, and kept in
  :meth:`LogWriter.status` with the time it began. Free disk space below ``min_free_bytes``
  (32 MiB by default) counts as a full disk *before* SQLite meets it.
* **Set aside what can never be stored.** A batch whose write fails for a reason of its
  own, not the log's (a text with no UTF-8 encoding, a policy document with a NaN: any error
  but an :class:`OSError`, a :class:`LogError` or SQLite's operational ones), would fail
  again on every retry and keep every later row out of the log. Its storable rows are
  written one by one; the others are appended, fsynced, to the dead letter beside the log
  (:class:`~spotstop.guard._journal.DeadLetter`), counted in :meth:`LogWriter.status`, and
  the rows after them are written as usual. Those rows were already answered fail-closed
  UNSAFE when their own write failed (nothing is acknowledged before it is logged); setting
  them aside never changes an answer. When even the dead letter cannot take them they wait
  in memory (then in the journal), passed over by the writes after them, and are retried.
* **Within the call's time.** A write with a deadline (``timeout_s``) spends at most that
  time on the whole log stage: the waits for a busy log, the free-space checkpoint, the
  journal's lock (tried without blocking until the time is up; a held lock leaves what
  waits where it is) and the older batches written first (when the time runs out between
  them, the call's own rows wait after them, fail-closed). Tending the WAL after a write
  never waits for readers on a call's time.
* **Close without loss.** :meth:`LogWriter.close` writes what waits, or spills it to the
  journal; the log imports the journal on the next start.
* **Retention.** With a :class:`~spotstop.guard._log_archive.Retention`, a pass runs in a
  background thread at most every ``retention_every_s`` seconds after a successful write,
  while nothing waits, never moving the rows the guard still needs (pending amendments, the
  active policy's situation windows, rows under review).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from spotstop.guard._journal import (
    DeadLetter,
    Journal,
    JournalEntry,
    JournalError,
    amendments_of,
    default_dead_letter_path,
    default_journal_path,
    encodable_text,
)
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_archive import Protect, RetentionResult
from spotstop.guard._log_options import LogOptions, LogStatus
from spotstop.guard._log_schema import (
    ArchiveAmendError,
    FaultKind,
    LogError,
    RecordError,
    fault_kind,
)
from spotstop.guard._record import DecisionRecord

__all__ = ["Committed", "Deadline", "LogWriter"]

_log = logging.getLogger("spotstop.guard")


class Deadline(Protocol):
    """The budget of one guard call, as :meth:`LogWriter.commit` reads it (the guard's
    ``_Clock``)."""

    def remaining(self) -> float | None:
        """Seconds left (≥ 0), or None without a deadline."""
        ...

    def lock_timeout(self) -> float:
        """``threading.Lock.acquire`` timeout: -1 waits forever."""
        ...

    def expired(self) -> bool: ...

    def reason(self, stage: str) -> str:
        """Why a decision past the deadline fails closed, naming ``stage``."""
        ...


@dataclass(frozen=True)
class Committed:
    """What :meth:`LogWriter.commit` made of one call's rows.

    ``records``: the rows as they may be answered, in order (a row the log did not take, or a
    SAFE one written after the deadline, is a fail-closed UNSAFE). ``error``: why the rows are
    not in the log (they are kept and written first by the next write); None when written.
    """

    records: list[DecisionRecord]
    error: str | None


@dataclass
class _Batch:
    records: list[DecisionRecord]
    policy: PolicyRow | None
    images: list[bytes | None] | None
    n_bytes: int
    since: float = field(default_factory=time.monotonic)
    aside: str | None = None
    """Why the log can never store these rows, once met; they wait only for the dead letter."""


@dataclass(frozen=True)
class _Stored:
    """What became of one batch: rows ``added`` to the log, and the rows the log cannot store
    (``aside``; after :meth:`LogWriter._store`, only those the dead letter could not take
    yet: they wait in memory)."""

    added: int
    aside: _Batch | None = None


def _batch_bytes(records: Sequence[DecisionRecord], images: Sequence[bytes | None] | None) -> int:
    rows = sum(len(str(r.request)) + 1024 for r in records)  # a row is about 1 KiB + its text
    return rows + sum(len(b) for b in images or () if b is not None)


def _permanent(exc: BaseException) -> bool:
    """True when ``exc`` is a fault of the rows written, not of the log: writing the same rows
    again fails the same way (a text with no UTF-8 encoding, a NaN where JSON has none, a
    value of a type the log does not know, an invalid record). A fault of the log or the disk
    (:class:`OSError`, :class:`LogError`, which carries SQLite's errors with their kind, a
    busy or full database) passes, and is retried instead."""
    if isinstance(exc, OSError | LogError | MemoryError | _OutOfTime):
        return False
    if isinstance(exc, sqlite3.Error):  # raw from the driver: only a value it cannot bind
        return isinstance(exc, sqlite3.InterfaceError | sqlite3.ProgrammingError)
    return isinstance(exc, Exception)


def _why(exc: BaseException) -> str:
    return encodable_text(f"{type(exc).__name__}: {exc}")


class _OutOfTime(Exception):
    """The write's time ran out between two waiting batches (``written`` of them went in)."""

    def __init__(self, written: int = 0) -> None:
        super().__init__("out of time")
        self.written = written


class _Budget:
    """The time one write or flush may spend, from its start: ``timeout_s`` None is no bound.

    :meth:`step` is called before each waiting batch: the first always runs (so every write
    makes progress), a later one only while time is left."""

    def __init__(self, timeout_s: float | None) -> None:
        self.due = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        self._stepped = False

    @property
    def bounded(self) -> bool:
        return self.due is not None

    def left(self) -> float | None:
        """Seconds left (≥ 0), None without a bound."""
        return None if self.due is None else max(0.0, self.due - time.monotonic())

    def step(self) -> None:
        if self._stepped and self.due is not None and time.monotonic() >= self.due:
            raise _OutOfTime
        self._stepped = True


class LogWriter:
    """Writes the guard's decisions to its log, keeping what the log cannot take yet."""

    def __init__(
        self,
        log: DecisionLog,
        options: LogOptions | None = None,
        *,
        windows: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.log = log
        self.options = options if options is not None else LogOptions()
        opts = self.options
        self.journal = Journal(
            opts.journal or default_journal_path(log.path), owner=str(log.path.resolve())
        )
        if opts.journal is not None and log._journal is None:
            log._journal = self.journal.path  # the log's reads apply what waits there
        self.dead_letter = DeadLetter(default_dead_letter_path(log.path), log=str(log.path))
        self._windows = windows
        self._pending: collections.deque[_Batch] = collections.deque()
        # SAFE rows to amend to fail-closed UNSAFE: (ids, reason, monotonic time kept)
        self._amendments: list[tuple[list[str], str, float]] = []
        self._mutex = threading.Lock()  # the queues and counters (held briefly)
        self._write_lock = threading.Lock()  # one log write at a time
        self._fault: FaultKind | None = None
        self._reason: str | None = None
        self._since: float | None = None
        self._journal_ok = True
        self._journal_fault: str | None = None
        self._journal_rows = 0
        self._journal_entries = 0
        self._spilled = 0
        self._imported = 0
        self._rejected = 0
        self._archived = 0
        self._dead_rows = 0
        self._dead_amendments = 0
        self._dead_fault: str | None = None
        self._floor_since: float | None = None  # status(): free space first seen below floor
        self._moved_since: float | None = None  # status(): the log's files first seen moved
        self._over_budget = False
        self._faults: collections.Counter[str] = collections.Counter()
        self._last_retention = -math.inf
        self._retention_thread: threading.Thread | None = None
        self._closed = False
        self._warn_if_shared()
        try:
            read = self.journal.read()
            self._journal_rows, self._journal_entries = read.n_rows, len(read.entries)
            self._rejected += read.rejected  # a crash's torn line, set aside by the read
            if read.rejected:
                _log.error("%s", read.rejected_message(self.journal.path))
        except LogError as e:
            self._journal_fault = str(e)
            _log.error("journal %s cannot be read: %s", self.journal.path, e)
        if self._journal_entries:
            _log.warning(
                "%d journal entries (%d decisions) wait in %s; importing them into %s",
                self._journal_entries,
                self._journal_rows,
                self.journal.path,
                log.path,
            )
            # a failure is in status(); the next write or flush retries
            with contextlib.suppress(LogError):
                self.flush()

    def _warn_if_shared(self) -> None:
        try:
            parent = self.journal.path.parent
            while not parent.exists():
                parent = parent.parent
            same = parent.stat().st_dev == self.log.path.parent.stat().st_dev
        except OSError:
            return
        if same:
            _log.info(
                "the journal %s is on the same file system as the log %s: a full disk stops "
                "both (name another place with --journal)",
                self.journal.path,
                self.log.path,
            )

    # -- state -----------------------------------------------------------------------------
    def _free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.log.path.parent).free
        except OSError:
            return None

    def _check_floor(self, budget: _Budget) -> None:
        free = self._free_bytes()
        floor = self.options.min_free_bytes
        # the checkpoint waits for readers at most for the call's time left, never the log's
        # own busy timeout (30 s by default)
        if free is not None and free < floor and self.log.checkpoint(timeout_s=budget.left()):
            free = self._free_bytes()  # a grown WAL may have held what was missing
        if free is not None and free < floor:
            raise LogError(
                f"decision log {str(self.log.path)!r}: only {free} bytes are free on its file "
                f"system, below the floor of {floor} (min_free_bytes); the log stops before "
                "SQLite fills the disk. Free space there, set a budget (--log-max-bytes), or "
                "lower --log-min-free-bytes.",
                "disk_full",
            )

    def _tend_wal(self, budget: _Budget) -> None:
        """Checkpoint and truncate the WAL when it holds more than half the free space.

        SQLite checkpoints on its own only every 1000 pages (about 4 MiB); on a nearly full
        file system the WAL would take the last free bytes, and a WAL that holds the whole
        database cannot be checkpointed without room for the pages it copies back. On a
        call's time it never waits for readers (it copies what it can and truncates when
        nobody holds the WAL): housekeeping must not turn a decision written in time into a
        late one. Without a deadline it waits as the log does.
        """
        try:
            wal = os.path.getsize(f"{self.log.path}-wal")
        except OSError:
            return
        free = self._free_bytes()
        if free is not None and wal > free // 2:
            self.log.checkpoint(timeout_s=0.0 if budget.bounded else None)

    def _failed(self, e: BaseException) -> str:
        kind = fault_kind(e)
        reason = f"decision log ({kind}): {type(e).__name__}: {e}"
        with self._mutex:
            self._faults[kind] += 1
            first = self._fault is None
            self._fault, self._reason = kind, reason
            if first:
                self._since = time.time()
        if first:
            _log.error(
                "the decision log cannot be written (%s): %s Decisions fail closed and wait "
                "in memory, then in the journal %s, until it can.",
                kind,
                e,
                self.journal.path,
            )
        return reason

    def _succeeded(self) -> None:
        with self._mutex:
            was, since = self._fault, self._since
            self._fault = self._reason = self._since = None
        if was is not None:
            _log.warning(
                "the decision log %s is writable again after %.1f s (%s)",
                self.log.path,
                time.time() - (since or time.time()),
                was,
            )

    @property
    def pending(self) -> int:
        """Rows waiting in memory."""
        with self._mutex:
            return sum(len(b.records) for b in self._pending)

    @property
    def accepting(self) -> bool:
        """False when memory is at its bound and the journal cannot take more."""
        with self._mutex:
            return self._journal_ok or self._pending_bytes() < self.options.max_pending_bytes

    def _pending_bytes(self) -> int:
        return sum(b.n_bytes for b in self._pending)

    def status(self) -> LogStatus:
        """Where the log stands now (the free-space floor is checked now)."""
        free = self._free_bytes()
        floor = self.options.min_free_bytes
        in_place = self.log.files_in_place()  # the rule a write checks before its commit
        with self._mutex:
            fault, reason, since = self._fault, self._reason, self._since
            low = fault is None and free is not None and free < floor
            if not low:
                self._floor_since = None
            elif self._floor_since is None:  # when the floor was first seen crossed
                self._floor_since = time.time()
            moved = fault is None and not low and not in_place
            if not moved:
                self._moved_since = None
            elif self._moved_since is None:
                self._moved_since = time.time()
            if low:
                fault, since = "disk_full", self._floor_since
                reason = (
                    f"decision log (disk_full): {free} bytes free on its file system, below "
                    f"the floor of {floor} (min_free_bytes)"
                )
            elif moved:
                fault, since = "io_error", self._moved_since
                reason = (
                    f"decision log (io_error): {self.log.path} (or its -wal or -shm) is no "
                    "longer the file the guard last wrote: it, or its folder, was removed or "
                    "replaced. The next write (the sidecar probes every second) opens the "
                    "path again, a new log if the folder is there; keep the log's folder and "
                    "files in place"
                )
            return LogStatus(
                log=str(self.log.path),
                writable=fault is None,
                fault=fault,
                reason=reason,
                since=since,
                pending_rows=sum(len(b.records) for b in self._pending),
                pending_bytes=self._pending_bytes(),
                pending_amendments=len(self._amendments),
                max_pending_bytes=self.options.max_pending_bytes,
                journal=str(self.journal.path),
                journal_rows=self._journal_rows,
                journal_entries=self._journal_entries,
                journal_fault=self._journal_fault,
                spilled_rows=self._spilled,
                imported_rows=self._imported,
                rejected_lines=self._rejected,
                archived_rows=self._archived,
                over_budget=self._over_budget,
                faults=dict(self._faults),
                free_bytes=free,
                min_free_bytes=floor,
                accepting=self._accepting_locked(),
                dead_letter=str(self.dead_letter.path),
                dead_letter_rows=self._dead_rows,
                dead_letter_amendments=self._dead_amendments,
                dead_letter_fault=self._dead_fault,
            )

    def _accepting_locked(self) -> bool:
        return self._journal_ok or self._pending_bytes() < self.options.max_pending_bytes

    # -- writing ---------------------------------------------------------------------------
    def write(
        self,
        records: list[DecisionRecord],
        *,
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        timeout_s: float | None,
        lock_timeout_s: float = -1,
    ) -> str | None:
        """Write what waits, then ``records`` (one transaction, images included); None when
        written, else why not (the caller fails them closed and hands them to :meth:`keep`).
        ``timeout_s`` bounds the wait for a busy log; ``lock_timeout_s`` the wait for another
        write of this guard (-1: no bound)."""
        return self._write(
            records,
            images=images,
            policy=policy,
            timeout_s=timeout_s,
            lock_timeout_s=lock_timeout_s,
        )[0]

    def _write(
        self,
        records: list[DecisionRecord],
        *,
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        timeout_s: float | None,
        lock_timeout_s: float = -1,
    ) -> tuple[str | None, bool]:
        """:meth:`write`, and whether the log may hold the rows all the same: a fault other
        than a busy log (an I/O error at the commit's fsync, a full disk) leaves the
        transaction's outcome unknown, and a crash may bring it back as it was written."""
        budget = _Budget(timeout_s)
        if not self._write_lock.acquire(timeout=lock_timeout_s):
            return "decision log: another write held the log past the deadline", False
        error: Exception | None = None
        waits: str | None = None
        writing = False  # past the free-space floor's check: a transaction may have begun
        try:
            try:
                self._check_floor(budget)
                writing = True
                self._flush_locked(budget)
                self.log.append_many(records, images=images, policy=policy, timeout_s=budget.left())
            except _OutOfTime:  # not a fault of the log: older rows took the call's time
                waits = (
                    "decision log: the call's time ran out while older waiting decisions "
                    "were written first; this call's rows wait after them"
                )
            except Exception as e:  # the caller fails these closed and keeps them
                error = e
            else:  # committed: nothing after this may report the write failed
                self._tend_wal(budget)
        finally:
            self._write_lock.release()
        if waits is not None:
            self._spill(force=False, timeout_s=budget.left())
            return waits, False
        if error is not None:
            # sure only when refused before a byte was written: under the free-space floor, or
            # a busy, read-only or closed log
            unsure = writing and fault_kind(error) not in ("locked", "read_only", "closed")
            return self._failed(error), unsure
        self._succeeded()
        # what keep() could not spill while this write held the lock
        self._spill(force=False, timeout_s=budget.left())
        self._maybe_retain()
        return None, False

    def commit(
        self,
        records: list[DecisionRecord],
        *,
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        clock: Deadline,
    ) -> Committed:
        """Write one call's ``records`` within its deadline and say what may be answered.

        Written in time: the rows as they are. Written after the deadline: each SAFE row
        becomes a fail-closed UNSAFE, amended in the log (:meth:`amend_late`). Not written
        (a fault, or a busy log past the deadline): every row not already fail-closed becomes
        a fail-closed UNSAFE that says why, and all of them are kept (:meth:`keep`) for the
        next write. Never raises for a log fault.

        When the fault leaves the commit's outcome unknown (anything but a busy log: an I/O
        error at its fsync may have written it all the same, and a crash would bring back the
        row as it was decided), the fail-closed copies go to the journal at once, not after
        ``spill_after_s``: its import amends such a row. A late SAFE's amendment that the log
        does not take at once goes to the journal at once too; if neither takes it, ``error``
        says so (the answer is UNSAFE either way).
        """
        error, unsure = self._write(
            records,
            images=images,
            policy=policy,
            timeout_s=clock.remaining(),
            lock_timeout_s=clock.lock_timeout(),
        )
        if error is None:
            return self._late(records, clock)
        # never SAFE without a log row; keep the rows for the next write
        failed = [
            r if r.fail_closed else replace(r, label="UNSAFE", fail_closed=True, fail_reason=error)
            for r in records
        ]
        self.keep(failed, images=images, policy=policy, timeout_s=clock.remaining(), at_once=unsure)
        return Committed(failed, error)

    def _late(self, records: list[DecisionRecord], clock: Deadline) -> Committed:
        """SAFE rows whose write finished after the deadline become fail-closed UNSAFE.

        The row is amended in the log first (SAFE → UNSAFE only); if that fails, the amendment
        goes to the journal at once and is retried before the next write; if the journal
        cannot take it either, it waits in memory and ``error`` says so. The answer is UNSAFE
        in every case.
        """
        if not clock.expired():
            return Committed(records, None)
        reason = clock.reason("writing the decision log")
        late = [r for r in records if r.label == "SAFE"]
        if not late:
            return Committed(records, None)
        kept = self.amend_late([r.decision_id for r in late], reason, timeout_s=clock.remaining())
        out = [
            replace(r, label="UNSAFE", fail_closed=True, fail_reason=reason)
            if r.label == "SAFE"
            else r
            for r in records
        ]
        error = None
        if not kept:
            error = (
                "decision log: the row of a decision written after the deadline still says "
                "SAFE; its fail-closed amendment could not be written to the log or the journal "
                "and waits in memory"
            )
        return Committed(out, error)

    def keep(
        self,
        records: list[DecisionRecord],
        *,
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        timeout_s: float | None = None,
        at_once: bool = False,
    ) -> None:
        """Hold rows the log could not take (in memory, spilled to the journal past the
        bounds, or ``at_once`` with everything that waits before them); they are written
        first by the next write or flush. ``timeout_s`` bounds the wait for the journal's lock
        when they spill (None: no bound); a journal held longer leaves them in memory."""
        batch = _Batch(list(records), policy, images, _batch_bytes(records, images))
        with self._mutex:
            self._pending.append(batch)
        self._spill(force=at_once, timeout_s=timeout_s)

    def amend_late(self, ids: list[str], reason: str, *, timeout_s: float | None = None) -> bool:
        """Turn logged SAFE rows into fail-closed UNSAFE ones (their write finished after the
        deadline): one attempt now, else kept and spilled to the journal at once (waiting at
        most ``timeout_s`` for its lock), and retried before the next write. True when the
        change is in the log or the journal; False when it waits in memory only."""
        try:  # one attempt (the deadline is spent): a busy log gets the change on the next write
            self.log.mark_fail_closed(ids, reason, timeout_s=0.0)
            return True
        except Exception:  # the answer is UNSAFE either way; retry the row change later
            # dated as if it had waited its time: any later spill takes it
            entry = (list(ids), reason, time.monotonic() - self.options.spill_after_s)
            with self._mutex:
                self._amendments.append(entry)
            # the answer goes out now: the change must outlive a crash, so the journal takes
            # it now (another write holding the lock spills it when that write is done)
            self._spill(force=True, timeout_s=timeout_s)
            with self._mutex:
                return not any(a is entry for a in self._amendments)

    def flush(self, timeout_s: float | None = None) -> int:
        """Import the journal, write the rows and amendments that wait, or probe the log when
        nothing waits. Returns the rows written; raises :class:`LogError` when the log still
        cannot be written (everything stays where it was, spilled if it waited too long).
        ``timeout_s`` bounds the whole flush (None: the log's own waits); when it runs out
        between two waiting batches, the rest waits for the next flush."""
        budget = _Budget(timeout_s)
        lock = -1 if timeout_s is None else max(0.0, timeout_s)
        if not self._write_lock.acquire(timeout=lock):
            raise LogError(
                f"decision log {str(self.log.path)!r}: another write held it for {timeout_s:g} "
                "s; retry later.",
                "locked",
            )
        error: Exception | None = None
        written = 0
        try:
            try:
                self._check_floor(budget)
                written = self._flush_locked(budget)
                if not written and (self._fault is not None or not self.log.files_in_place()):
                    self.log.probe(timeout_s=budget.left())  # reopens a moved log's path
                self._tend_wal(budget)
            except _OutOfTime as e:  # the rest waits for the next flush; the log took rows
                written = e.written
            except Exception as e:
                error = e
        finally:
            self._write_lock.release()
        self._spill(force=False, timeout_s=budget.left())  # what waited too long
        if error is not None:
            self._failed(error)
            if isinstance(error, LogError):
                raise error
            raise LogError(str(error), fault_kind(error)) from error
        self._succeeded()
        self._maybe_retain()
        return written

    def _flush_locked(self, budget: _Budget) -> int:
        """Journal first (its rows are the oldest), then memory, then amendments. A batch set
        aside that the dead letter cannot take yet is passed over: it never holds the rows
        after it back."""
        written = 0
        try:
            written = self._import_journal(budget)
            passed: set[int] = set()  # id() of the batches passed over (they stay queued)
            while True:
                with self._mutex:
                    batch = next((b for b in self._pending if id(b) not in passed), None)
                if batch is None:
                    break
                budget.step()
                stored = self._store(batch, budget)
                with self._mutex:  # by identity: only a lock holder moves batches
                    if stored.aside is None:
                        self._pending.remove(batch)
                    else:
                        self._pending[self._pending.index(batch)] = stored.aside
                        passed.add(id(stored.aside))
                written += stored.added
                self._tend_wal(budget)
            with self._mutex:
                amendments = list(self._amendments)
            for item in amendments:
                budget.step()
                self._amend(item[0], item[1], budget)
                with self._mutex:
                    self._amendments.remove(item)
        except _OutOfTime as e:
            e.written = written
            raise
        return written

    def _store(self, batch: _Batch, budget: _Budget) -> _Stored:
        """Write one waiting batch, or set it aside when the log can never store it.

        A permanent fault (:func:`_permanent`) of a batch of several rows is narrowed down:
        each row is written alone, and only those that fail again are set aside. Setting
        aside is appending them, fsynced, to the dead letter; when it cannot take them they
        come back as ``aside`` (marked, so they are not written again) to wait in memory.
        A fault of the log itself raises: the batch stays where it is."""
        stored = _Stored(0, batch if batch.aside is not None else None)
        if stored.aside is None:
            try:
                stored = _Stored(self._rewrite(batch.records, batch.images, batch.policy, budget))
            except Exception as e:
                if not _permanent(e):
                    raise
                stored = self._narrow(batch, _why(e), budget)
        if stored.aside is None or self._file(stored.aside):
            return _Stored(stored.added)
        return stored

    def _narrow(self, batch: _Batch, why: str, budget: _Budget) -> _Stored:
        """Write each row of ``batch`` alone; the rows that fail for a reason of their own
        again come back as ``aside`` (marked with the first such reason)."""
        if len(batch.records) == 1:
            return _Stored(0, replace(batch, aside=why))
        n = len(batch.records)
        images = batch.images if batch.images is not None and len(batch.images) == n else [None] * n
        added, bad = 0, []
        for r, img in zip(batch.records, images, strict=True):
            try:
                added += self._rewrite([r], [img], batch.policy, budget)
            except Exception as e:
                if not _permanent(e):
                    raise
                bad.append((r, img, _why(e)))
        if not bad:
            return _Stored(added)
        recs, imgs = [r for r, _, _ in bad], [i for _, i, _ in bad]
        aside = _Batch(
            recs,
            batch.policy,
            None if batch.images is None else imgs,
            _batch_bytes(recs, imgs),
            since=batch.since,
            aside=bad[0][2],
        )
        return _Stored(added, aside)

    def _file(self, batch: _Batch) -> bool:
        """Append a batch set aside to the dead letter (fsynced); False when it cannot take
        it now (the batch then waits, and the fault is in :meth:`status`)."""
        why = batch.aside or "set aside"
        try:
            self.dead_letter.append(
                "rows",
                error=why,
                records=batch.records,
                policy=batch.policy,
                images=batch.images,
            )
        except Exception as e:  # a full or read-only disk, most likely: keep it and retry
            with self._mutex:
                first = self._dead_fault is None
                self._dead_fault = _why(e)
            if first:
                _log.error(
                    "%d decision(s) the log cannot store (%s) cannot be set aside in %s "
                    "either (%s); they wait in memory, then in the journal, and are retried",
                    len(batch.records),
                    why,
                    self.dead_letter.path,
                    e,
                )
            return False
        with self._mutex:
            self._dead_rows += len(batch.records)
            self._dead_fault = None
        _log.error(
            "%d decision(s) cannot be stored in the log %s (%s); they were answered "
            "fail-closed UNSAFE and are set aside in %s (never imported): mend the cause, and "
            "log them again by hand if they are needed",
            len(batch.records),
            self.log.path,
            why,
            self.dead_letter.path,
        )
        return True

    def _amend(self, ids: list[str], reason: str, budget: _Budget) -> None:
        """Apply one fail-closed amendment. One the log cannot store as it is (a reason with
        no UTF-8 encoding) is applied with its text made storable; one that still fails for
        a reason of its own is set aside in the dead letter, never retried before the rows.
        The live rows are amended, then the archived ones (in their archives); only ids in no
        row of the log are set aside, and those an archive that is missing or changed keeps
        from being amended (trying again would not mend it, and would hold up the log)."""
        try:  # the known rows are amended; only ids the log does not hold are set aside
            unknown = self.log.mark_fail_closed(
                ids, reason, timeout_s=budget.left(), skip_unknown=True
            )
            self._set_aside_unknown(unknown, reason)
            return
        except ArchiveAmendError as e:
            self._archives_not_amended(e, reason)
            return
        except RecordError as e:  # an amendment the log cannot take at all: never block on it
            self._unamendable(ids, reason, e)
            return
        except Exception as e:
            if not _permanent(e):
                raise
        safe_ids, safe_reason = [encodable_text(i) for i in ids], encodable_text(reason)
        try:
            unknown = self.log.mark_fail_closed(
                safe_ids, safe_reason, timeout_s=budget.left(), skip_unknown=True
            )
        except ArchiveAmendError as e:
            self._archives_not_amended(e, safe_reason)
            return
        except Exception as e:
            if not _permanent(e):
                raise
            self._unamendable(safe_ids, safe_reason, e)
            return
        self._set_aside_unknown(unknown, safe_reason)

    def _archives_not_amended(self, e: ArchiveAmendError, reason: str) -> None:
        """The live rows were amended; the archives were not. A retention pass holding them,
        a full disk, an I/O error: kept and tried again, as any log fault. An archive missing
        or changed (kind ``other``): the ids it may hold are set aside in the dead letter,
        which every reader through the log applies."""
        if e.kind != "other":
            raise e
        self._unamendable(list(e.ids), reason, e)

    def _set_aside_unknown(self, unknown: tuple[str, ...], reason: str) -> None:
        """Dead-letter the ids of an amendment that no row of the log holds, live or archived
        (its other rows, live and archived, were amended in the same call, before this).
        The log cannot say SAFE for a decision it does not hold: every reader of the log
        applies the dead letter, should such a row come in later."""
        if not unknown:
            return
        _log.warning(
            "a fail-closed amendment names decision(s) %s that the log %s holds neither live "
            "nor archived (its other decisions were amended); set aside in %s, which every "
            "reader of the log applies should such a row come in later: %s",
            [encodable_text(i) for i in unknown],
            self.log.path,
            self.dead_letter.path,
            encodable_text(reason),
        )
        e = RecordError(
            f"mark_fail_closed: decision_id(s) {list(unknown)!r} in no row of the log, live or "
            "archived; the other ids of the amendment were applied."
        )
        self._dead_letter_amendment(list(unknown), reason, e)

    def _unamendable(self, ids: list[str], reason: str, e: BaseException) -> None:
        _log.error(
            "a fail-closed amendment of %s cannot be applied (%s); the log may say SAFE "
            "for a decision its caller was answered UNSAFE: %s",
            [encodable_text(i) for i in ids],
            _why(e),
            encodable_text(reason),
        )
        self._dead_letter_amendment(ids, reason, e)

    def _dead_letter_amendment(self, ids: list[str], reason: str, e: BaseException) -> None:
        try:
            self.dead_letter.append("amend", error=_why(e), amend_ids=ids, amend_reason=reason)
        except Exception as dead:  # the amendment is in the server log above; go on
            _log.critical(
                "the amendment of %s could not be set aside in %s either (%s)",
                [encodable_text(i) for i in ids],
                self.dead_letter.path,
                dead,
            )
            return
        with self._mutex:
            self._dead_amendments += 1

    def _rewrite(
        self,
        records: list[DecisionRecord],
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        budget: _Budget,
    ) -> int:
        """Write kept rows (each a fail-closed UNSAFE, as answered); returns how many were
        added. A row already in the log is not written twice: a write reported failed may
        have committed (a crash between an import and the journal's truncation, an error
        after COMMIT). Such a row is made to say what its caller was told: if it went in as
        SAFE, it is amended to the fail-closed UNSAFE that was answered."""
        added = self.log.import_batch(
            records, images=images, policy=policy, timeout_s=budget.left()
        )
        if added < len(records):
            for ids, reason in amendments_of((r.decision_id, r.fail_reason) for r in records):
                self._amend(list(ids), reason, budget)
        return added

    def _import_journal(self, budget: _Budget) -> int:
        """Import this log's journal entries. A journal that cannot be read, or whose lock
        another process holds past half the call's time, does not stop the log: its rows
        stay where they are, the fault is in :meth:`status` (``journal_fault``) and the
        memory's rows are written meanwhile. An entry the log can never store is set aside
        like a batch in memory; when the dead letter cannot take it, it stays in the journal
        (an entry leaves the journal only into the log or the dead letter: in memory alone a
        crash would lose it)."""
        if not self.journal.path.exists():  # a stat: an empty journal is no file at all
            return 0
        left = budget.left()
        imported = 0
        try:
            # half the time at most: the journal's rows are old, the call's own are not. The
            # import's commits are fsynced whatever the log's setting: the journal is emptied
            # after them, and a power cut must not take both copies.
            with (
                self.log.durable_commits(),
                self.journal.draining(timeout_s=None if left is None else left / 2) as read,
            ):
                for entry in read.entries:
                    budget.step()
                    if entry.kind == "rows":
                        images = None if entry.images is None else list(entry.images)
                        recs = list(entry.records)
                        batch = _Batch(recs, entry.policy, images, _batch_bytes(recs, images))
                        stored = self._store(batch, budget)
                        imported += stored.added
                        if stored.aside is not None:  # the dead letter could not take it
                            read.keep(entry)  # (its stored rows are skipped next time)
                        self._tend_wal(budget)
                    else:
                        for ids, reason in entry.amendments:
                            self._amend(list(ids), reason, budget)
        except JournalError as e:
            with self._mutex:
                first = self._journal_fault is None
                self._journal_fault = str(e)
                self._imported += imported  # in the log (the journal, not emptied, holds them
                # too: the next import skips them)
            if first:
                _log.error("%s; the log goes on taking decisions meanwhile", e)
            return imported
        with self._mutex:
            self._journal_fault = None
            self._rejected += read.rejected
            self._imported += imported
            self._journal_rows = sum(e.n_rows for e in read.kept)
            self._journal_entries = len(read.kept)
        if read.rejected:
            _log.error("%s", read.rejected_message(self.journal.path))
        if imported:
            _log.warning("imported %d decision(s) from the journal %s", imported, self.journal.path)
        return imported

    def _spill(self, *, force: bool, timeout_s: float | None = None) -> None:
        """Move batches and amendments that waited too long, or beyond the memory bound, to
        the journal, waiting at most ``timeout_s`` for its lock (None: no bound). Only while
        holding the write lock (never while a batch is being written): when another thread
        holds it, that thread spills when it is done."""
        if not self._write_lock.acquire(blocking=False):
            return
        try:
            self._spill_locked(force, timeout_s)
        finally:
            self._write_lock.release()

    def _spill_locked(self, force: bool, timeout_s: float | None) -> None:
        now = time.monotonic()
        after = self.options.spill_after_s
        with self._mutex:
            out: list[_Batch] = []
            left = list(self._pending)
            total = self._pending_bytes()
            while left and (
                force or total > self.options.max_pending_bytes or now - left[0].since >= after
            ):
                b = left.pop(0)
                out.append(b)
                total -= b.n_bytes
            amend = [a for a in self._amendments if force or now - a[2] >= after]
        if not out and not amend:
            return
        try:
            out = self._set_aside_unjournalable(out)
            self._journal_locked(out, amend, timeout_s)
        except Exception as e:  # broad on purpose: the journal is the fallback of a failed
            # write and runs on the call path; whatever it meets, the rows stay where they are
            # (in memory, counted) and the answer stays the fail-closed one
            with self._mutex:
                self._journal_ok = False
                self._journal_fault = _why(e)
            _log.error("spilling to the journal %s failed: %s", self.journal.path, _why(e))

    def _set_aside_unjournalable(self, out: list[_Batch]) -> list[_Batch]:
        """The batches of ``out`` the journal can encode; one it cannot (a permanent fault of
        its rows: the log could not store it either) is set aside in the dead letter now, or
        left in memory when the dead letter cannot take it."""
        keep: list[_Batch] = []
        for b in out:
            try:
                images = None if b.images is None else tuple(b.images)
                JournalEntry("rows", tuple(b.records), b.policy, images).to_line()
            except Exception as e:  # what the journal's encoding raises for these rows
                b.aside = b.aside or _why(e)
                if self._file(b):
                    with self._mutex:
                        self._pending.remove(b)
                continue
            keep.append(b)
        return keep

    def _journal_locked(
        self,
        out: list[_Batch],
        amend: list[tuple[list[str], str, float]],
        timeout_s: float | None,
    ) -> None:
        if not out and not amend:
            return
        entries = [
            JournalEntry(
                "rows", tuple(b.records), b.policy, None if b.images is None else tuple(b.images)
            )
            for b in out
        ] + [JournalEntry("amend", amend_ids=tuple(i), amend_reason=r) for i, r, _ in amend]
        try:
            self.journal.append(entries, timeout_s=timeout_s)
        except JournalError as e:
            with self._mutex:
                first = self._journal_ok
                self._journal_ok = False
                self._journal_fault = str(e)
            if first:
                _log.error("the journal cannot take the waiting decisions either: %s", e)
            return
        n = sum(len(b.records) for b in out)
        with self._mutex:
            self._journal_ok = True
            self._journal_fault = None  # it took them: it can be written
            for b in out:
                self._pending.remove(b)
            for a in amend:
                self._amendments.remove(a)
            self._journal_rows += n
            self._journal_entries += len(entries)
            self._spilled += n
        _log.warning(
            "spilled %d waiting decision(s) and %d amendment(s) to the journal %s",
            n,
            len(amend),
            self.journal.path,
        )

    # -- retention -------------------------------------------------------------------------
    def _maybe_retain(self) -> None:
        retention = self.options.retention
        if not retention.active or self._closed:
            return
        now = time.monotonic()
        with self._mutex:
            busy = self._retention_thread is not None and self._retention_thread.is_alive()
            due = now - self._last_retention >= self.options.retention_every_s
            idle = not self._pending and not self._journal_entries and not self._amendments
            if busy or not due or not idle:
                return
            self._last_retention = now
            t = threading.Thread(
                target=self._retain_quietly, name="spotstop-retention", daemon=True
            )
            self._retention_thread = t
        t.start()

    def _retain_quietly(self) -> None:
        try:
            self.apply_retention()
        except Exception as e:  # the next pass retries; say so in the server log
            _log.error("log retention failed: %s", e)

    def apply_retention(self, *, now: float | None = None) -> RetentionResult:
        """One retention pass now (the background thread's work), protecting what the guard
        needs: every decision something still waits to change (an amendment or a row waiting
        in memory or in the journal: a SAFE row archived before its fail-closed amendment
        lands would stay SAFE in the archive), the active policy's situation windows, rows
        under review, and every decision younger than 10 minutes (:class:`Protect`). The
        result is also counted in :meth:`status`. Raises :class:`JournalError` (nothing
        archived) when the journal cannot be read: what it holds cannot be protected."""
        with self._mutex:
            ids = {i for batch, _, _ in self._amendments for i in batch}
            ids |= {r.decision_id for b in self._pending for r in b.records}
        read = self.journal.read()
        if read.rejected:  # torn or altered lines it set aside now
            with self._mutex:
                self._rejected += read.rejected
            _log.error(
                "%d journal line(s) could not be read (torn or altered); kept in %s.rejected",
                read.rejected,
                self.journal.path,
            )
        for entry in read.entries:  # this log's entries
            ids |= set(entry.amend_ids) | {r.decision_id for r in entry.records}
        protect = Protect(decision_ids=frozenset(ids), windows=dict(self._windows()))
        result = self.log.apply_retention(self.options.retention, protect, now=now)
        with self._mutex:
            self._archived += result.archived_rows
            self._over_budget = result.over_budget
        if result.archived_rows:
            _log.info("retention: %r", result)
        if result.over_budget:
            _log.warning(
                "the decision log is over its budget after retention (%d > %s bytes): what is "
                "left cannot be archived (protected rows, labels, stored images); raise the "
                "budget or shorten the image retention",
                result.bytes_after,
                result.max_bytes,
            )
        return result

    # -- lifetime --------------------------------------------------------------------------
    def close(self, timeout_s: float | None = 5.0) -> None:
        """Write what waits (waiting at most ``timeout_s`` for a busy log), else spill it to
        the journal; then wait for a retention pass to end. Nothing waiting is dropped: what
        neither the log nor the journal took is reported loudly with its count."""
        self._closed = True
        with contextlib.suppress(LogError):  # what is left goes to the journal below
            self.flush(timeout_s)
        self._spill(force=True)
        t = self._retention_thread
        if t is not None:
            t.join()
        left = self.pending
        if left:
            _log.critical(
                "%d decision(s) could be written neither to the log %s nor to the journal %s "
                "before closing: %s",
                left,
                self.log.path,
                self.journal.path,
                self._reason,
            )
