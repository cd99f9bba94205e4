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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from spotstop.guard._journal import Journal, JournalEntry, JournalError, default_journal_path
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_archive import Protect, RetentionResult
from spotstop.guard._log_options import LogOptions, LogStatus
from spotstop.guard._log_schema import FaultKind, LogError, RecordError, fault_kind
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


def _batch_bytes(records: Sequence[DecisionRecord], images: Sequence[bytes | None] | None) -> int:
    rows = sum(len(str(r.request)) + 1024 for r in records)  # a row is about 1 KiB + its text
    return rows + sum(len(b) for b in images or () if b is not None)


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
        self._over_budget = False
        self._faults: collections.Counter[str] = collections.Counter()
        self._last_retention = -math.inf
        self._retention_thread: threading.Thread | None = None
        self._closed = False
        self._warn_if_shared()
        try:
            read = self.journal.read()
            self._journal_rows, self._journal_entries = read.n_rows, len(read.entries)
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

    def _check_floor(self) -> None:
        free = self._free_bytes()
        floor = self.options.min_free_bytes
        if free is not None and free < floor and self.log.checkpoint():
            free = self._free_bytes()  # a grown WAL may have held what was missing
        if free is not None and free < floor:
            raise LogError(
                f"decision log {str(self.log.path)!r}: only {free} bytes are free on its file "
                f"system, below the floor of {floor} (min_free_bytes); the log stops before "
                "SQLite fills the disk. Free space there, set a budget (--log-max-bytes), or "
                "lower --log-min-free-bytes.",
                "disk_full",
            )

    def _tend_wal(self) -> None:
        """Checkpoint and truncate the WAL when it holds more than half the free space.

        SQLite checkpoints on its own only every 1000 pages (about 4 MiB); on a nearly full
        file system the WAL would take the last free bytes, and a WAL that holds the whole
        database cannot be checkpointed without room for the pages it copies back.
        """
        try:
            wal = os.path.getsize(f"{self.log.path}-wal")
        except OSError:
            return
        free = self._free_bytes()
        if free is not None and wal > free // 2:
            self.log.checkpoint()

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
        with self._mutex:
            fault, reason, since = self._fault, self._reason, self._since
            if fault is None and free is not None and free < floor:
                fault, since = "disk_full", time.time()
                reason = (
                    f"decision log (disk_full): {free} bytes free on its file system, below "
                    f"the floor of {floor} (min_free_bytes)"
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
        if not self._write_lock.acquire(timeout=lock_timeout_s):
            return "decision log: another write held the log past the deadline"
        error: Exception | None = None
        try:
            try:
                self._check_floor()
                self._flush_locked(timeout_s)
                self.log.append_many(records, images=images, policy=policy, timeout_s=timeout_s)
            except Exception as e:  # the caller fails these closed and keeps them
                error = e
            else:  # committed: nothing after this may report the write failed
                self._tend_wal()
        finally:
            self._write_lock.release()
        if error is not None:
            return self._failed(error)
        self._succeeded()
        self._spill(force=False)  # what keep() could not spill while this write held the lock
        self._maybe_retain()
        return None

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
        """
        error = self.write(
            records,
            images=images,
            policy=policy,
            timeout_s=clock.remaining(),
            lock_timeout_s=clock.lock_timeout(),
        )
        if error is None:
            return Committed(self._late(records, clock), None)
        # never SAFE without a log row; keep the rows for the next write
        failed = [
            r if r.fail_closed else replace(r, label="UNSAFE", fail_closed=True, fail_reason=error)
            for r in records
        ]
        self.keep(failed, images=images, policy=policy)
        return Committed(failed, error)

    def _late(self, records: list[DecisionRecord], clock: Deadline) -> list[DecisionRecord]:
        """SAFE rows whose write finished after the deadline become fail-closed UNSAFE.

        The row is amended in the log first (SAFE → UNSAFE only); if even that fails, the
        amendment is kept and retried before the next write, and the answer is UNSAFE anyway.
        """
        if not clock.expired():
            return records
        reason = clock.reason("writing the decision log")
        late = [r for r in records if r.label == "SAFE"]
        if not late:
            return records
        self.amend_late([r.decision_id for r in late], reason)
        return [
            replace(r, label="UNSAFE", fail_closed=True, fail_reason=reason)
            if r.label == "SAFE"
            else r
            for r in records
        ]

    def keep(
        self,
        records: list[DecisionRecord],
        *,
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
    ) -> None:
        """Hold rows the log could not take (in memory, spilled to the journal past the
        bounds); they are written first by the next write or flush."""
        batch = _Batch(list(records), policy, images, _batch_bytes(records, images))
        with self._mutex:
            self._pending.append(batch)
        self._spill(force=False)

    def amend_late(self, ids: list[str], reason: str) -> None:
        """Turn logged SAFE rows into fail-closed UNSAFE ones (their write finished after the
        deadline): one attempt now, else kept (spilled to the journal like rows) and retried
        before the next write."""
        try:  # one attempt (the deadline is spent): a busy log gets the change on the next write
            self.log.mark_fail_closed(ids, reason, timeout_s=0.0)
        except Exception:  # the answer is UNSAFE either way; retry the row change later
            with self._mutex:
                self._amendments.append((list(ids), reason, time.monotonic()))
            self._spill(force=False)

    def flush(self, timeout_s: float | None = None) -> int:
        """Import the journal, write the rows and amendments that wait, or probe the log when
        nothing waits. Returns the rows written; raises :class:`LogError` when the log still
        cannot be written (everything stays where it was, spilled if it waited too long)."""
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
                self._check_floor()
                written = self._flush_locked(timeout_s)
                if not written and self._fault is not None:
                    self.log.probe(timeout_s=timeout_s)
                self._tend_wal()
            except Exception as e:
                error = e
        finally:
            self._write_lock.release()
        self._spill(force=False)  # what waited too long goes to the journal meanwhile
        if error is not None:
            self._failed(error)
            if isinstance(error, LogError):
                raise error
            raise LogError(str(error), fault_kind(error)) from error
        self._succeeded()
        self._maybe_retain()
        return written

    def _flush_locked(self, timeout_s: float | None) -> int:
        """Journal first (its rows are the oldest), then memory, then amendments."""
        written = self._import_journal(timeout_s)
        while True:
            with self._mutex:
                if not self._pending:
                    break
                batch = self._pending[0]
            added = self._rewrite(batch.records, batch.images, batch.policy, timeout_s)
            with self._mutex:
                self._pending.remove(batch)  # by identity: only a lock holder moves batches
            written += added
            self._tend_wal()
        while True:
            with self._mutex:
                if not self._amendments:
                    break
                item = self._amendments[0]
            self._amend(item[0], item[1], timeout_s)
            with self._mutex:
                self._amendments.remove(item)
        return written

    def _amend(self, ids: list[str], reason: str, timeout_s: float | None) -> None:
        try:
            self.log.mark_fail_closed(ids, reason, timeout_s=timeout_s)
        except RecordError as e:  # ids the live log does not hold: say so, never block on it
            _log.error(
                "a fail-closed amendment of %s cannot be applied (%s); the log may say SAFE "
                "for a decision its caller was answered UNSAFE: %s",
                ids,
                e,
                reason,
            )

    def _rewrite(
        self,
        records: list[DecisionRecord],
        images: list[bytes | None] | None,
        policy: PolicyRow | None,
        timeout_s: float | None,
    ) -> int:
        """Write kept rows (each a fail-closed UNSAFE, as answered); returns how many were
        added. A row already in the log is not written twice: a write reported failed may
        have committed (a crash between an import and the journal's truncation, an error
        after COMMIT). Such a row is made to say what its caller was told: if it went in as
        SAFE, it is amended to the fail-closed UNSAFE that was answered."""
        added = self.log.import_batch(records, images=images, policy=policy, timeout_s=timeout_s)
        if added < len(records):
            for reason in {r.fail_reason or "" for r in records}:
                ids = [r.decision_id for r in records if (r.fail_reason or "") == reason]
                self._amend(ids, reason, timeout_s)
        return added

    def _import_journal(self, timeout_s: float | None) -> int:
        """Import this log's journal entries. A journal that cannot be read does not stop the
        log: its rows stay where they are, the fault is in :meth:`status` (``journal_fault``)
        and the memory's rows are written meanwhile."""
        if not self.journal.path.exists():  # a stat: an empty journal is no file at all
            return 0
        imported = 0
        try:
            with self.journal.draining() as read:
                for entry in read.entries:
                    if entry.kind == "rows":
                        imported += self._rewrite(
                            list(entry.records),
                            None if entry.images is None else list(entry.images),
                            entry.policy,
                            timeout_s,
                        )
                        self._tend_wal()
                    else:
                        self._amend(list(entry.amend_ids), entry.amend_reason, timeout_s)
        except JournalError as e:
            with self._mutex:
                first = self._journal_fault is None
                self._journal_fault = str(e)
            if first:
                _log.error("%s; the log goes on taking decisions meanwhile", e)
            return imported
        with self._mutex:
            self._journal_fault = None
            self._rejected += read.rejected
            self._imported += imported
            self._journal_rows = self._journal_entries = 0
        if read.rejected:
            _log.error(
                "%d journal line(s) could not be read (torn or altered); kept in %s.rejected",
                read.rejected,
                self.journal.path,
            )
        if imported:
            _log.warning("imported %d decision(s) from the journal %s", imported, self.journal.path)
        return imported

    def _spill(self, *, force: bool) -> None:
        """Move batches and amendments that waited too long, or beyond the memory bound, to
        the journal. Only while holding the write lock (never while a batch is being
        written): when another thread holds it, that thread spills when it is done."""
        if not self._write_lock.acquire(blocking=False):
            return
        try:
            self._spill_locked(force)
        finally:
            self._write_lock.release()

    def _spill_locked(self, force: bool) -> None:
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
        entries = [
            JournalEntry(
                "rows", tuple(b.records), b.policy, None if b.images is None else tuple(b.images)
            )
            for b in out
        ] + [JournalEntry("amend", amend_ids=tuple(i), amend_reason=r) for i, r, _ in amend]
        try:
            self.journal.append(entries)
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
        needs: pending amendments, the active policy's situation windows, rows under review,
        and every decision younger than 10 minutes (:class:`Protect`). The result is also counted in :meth:`status`."""
        with self._mutex:
            ids = frozenset(i for batch, _, _ in self._amendments for i in batch)
        protect = Protect(decision_ids=ids, windows=dict(self._windows()))
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
        try:
            self.flush(timeout_s)
        except LogError:
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
