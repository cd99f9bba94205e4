"""The call's deadline bounds the log stage too: WAL checkpoints and the journal's lock.

Before the fix a call with a 0.5 s deadline could take the log's whole ``busy_timeout``
(30 s by default) in a ``wal_checkpoint(TRUNCATE)`` while a reader held a snapshot, and as
long as another process held the journal's lock (a blocking ``flock``). The bounds asserted
here are loose (seconds, not the deadline itself): machines are slow and noisy; the faults
injected would hold a call for 8 s or more without the fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from spotstop.guard._journal import Journal, JournalEntry, JournalError
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_writer import LogWriter

from tests._support.records import make_record

HELD_S = 8.0  # how long an injected fault holds, at most (the log's busy timeout too)


class Clock:
    """A real deadline ``seconds`` from now (``LogWriter.commit``'s clock)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.due = time.monotonic() + seconds

    def remaining(self) -> float | None:
        return max(0.0, self.due - time.monotonic())

    def lock_timeout(self) -> float:
        return max(0.0, self.due - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.due

    def reason(self, stage: str) -> str:
        return f"deadline exceeded: the call took longer than {self.seconds:g} s ({stage})"


def _policy() -> PolicyRow:
    return PolicyRow("v1", "frozen", "fk", "bundle-1", "abc123", "2026-01-01", {"kind": "frozen"})


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[LogWriter]:
    log = DecisionLog(tmp_path / "log.sqlite", timeout_s=HELD_S)
    w = LogWriter(
        log,
        LogOptions(
            journal=tmp_path / "elsewhere" / "decisions.journal",
            min_free_bytes=0,
            spill_after_s=3600.0,
        ),
    )
    yield w
    w.close(timeout_s=1.0)
    log.close()


@pytest.fixture
def reader(writer: LogWriter) -> Iterator[sqlite3.Connection]:
    """Another connection holding a read snapshot (a card or metrics query in progress): a
    TRUNCATE checkpoint waits for it."""
    for i in range(3):  # frames in the WAL
        writer.log.append(make_record(100 + i))
    r = sqlite3.connect(writer.log.path, isolation_level=None)
    r.execute("BEGIN")
    r.execute("SELECT count(*) FROM decisions").fetchone()
    yield r
    r.execute("COMMIT")
    r.close()


@contextlib.contextmanager
def held_lock(journal: Journal) -> Iterator[Callable[[], None]]:
    """The journal's lock file held by someone else (another open file: ``flock`` excludes
    it even in this process) for at most ``HELD_S``; the context gives a function that lets
    it go earlier."""
    lock = journal.path.with_name(journal.path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    release = threading.Event()

    def hold() -> None:
        release.wait(HELD_S)
        os.close(fd)  # closing the descriptor releases the lock

    t = threading.Thread(target=hold, daemon=True)
    t.start()

    def let_go() -> None:
        release.set()
        t.join()

    try:
        yield let_go
    finally:
        let_go()


def test_a_checkpoint_under_the_free_space_floor_waits_no_longer_than_the_call(
    writer: LogWriter, reader: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer.options = replace(writer.options, min_free_bytes=10_000_000)
    monkeypatch.setattr(writer, "_free_bytes", lambda: 1000)  # the disk is nearly full
    rec = make_record(0, label="SAFE")
    t = time.monotonic()
    done = writer.commit([rec], images=None, policy=_policy(), clock=Clock(0.5))
    took = time.monotonic() - t
    assert took < 3.0, f"a 0.5 s call took {took:.1f} s in the log stage"
    assert done.error is not None and "below the floor" in done.error
    assert done.records[0].label == "UNSAFE" and writer.pending == 1  # kept, failed closed


def test_tending_the_wal_after_a_write_never_spends_the_call_s_time(
    writer: LogWriter, reader: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "_free_bytes", lambda: 1000)  # the WAL holds "half the disk"
    rec = make_record(0, label="SAFE")
    t = time.monotonic()
    done = writer.commit([rec], images=None, policy=_policy(), clock=Clock(2.0))
    took = time.monotonic() - t
    assert took < 5.0, f"a 2 s call took {took:.1f} s in the log stage"
    # a housekeeping checkpoint that waited out the deadline would turn this SAFE late
    assert done.error is None and done.records == [rec]


def test_a_held_journal_lock_does_not_hold_the_write(writer: LogWriter) -> None:
    # a guard of another log shares the journal, and its rows wait there
    other = Journal(writer.journal.path, owner="/another/robot/log.sqlite")
    other.append([JournalEntry("rows", (make_record(50),), None)])
    rec = make_record(0, label="SAFE")
    with held_lock(writer.journal):
        t = time.monotonic()
        done = writer.commit([rec], images=None, policy=_policy(), clock=Clock(1.0))
        took = time.monotonic() - t
    assert took < 4.0, f"a 1 s call took {took:.1f} s waiting for the journal's lock"
    assert done.error is None or writer.pending == 1  # written or kept: never lost
    st = writer.status()
    assert st.journal_fault is not None and "lock" in st.journal_fault
    writer.flush(2.0)  # the lock is free again: the journal is read, the other's row stays
    assert writer.log.get(rec.decision_id) is not None
    assert writer.status().journal_fault is None and other.read().n_rows == 1


def test_a_spill_waits_for_the_journal_s_lock_no_longer_than_the_call(
    writer: LogWriter,
) -> None:
    writer.options = replace(writer.options, spill_after_s=0.0)  # kept rows spill at once
    writer.log._conn().execute("PRAGMA query_only = 1")
    rec = make_record(0, label="SAFE")
    with held_lock(writer.journal) as let_go:
        t = time.monotonic()
        done = writer.commit([rec], images=None, policy=_policy(), clock=Clock(0.5))
        took = time.monotonic() - t
        st = writer.status()
        let_go()
    assert took < 3.0, f"a 0.5 s call took {took:.1f} s waiting for the journal's lock"
    assert done.error is not None and done.records[0].label == "UNSAFE"
    assert st.pending_rows == 1 and st.journal_rows == 0  # waits in memory: not lost
    assert st.journal_fault is not None and "lock" in st.journal_fault
    writer.log._conn().execute("PRAGMA query_only = 0")
    assert writer.flush(2.0) == 1 and writer.log.get(rec.decision_id) is not None


def test_the_journal_s_lock_is_waited_on_only_as_long_as_asked(tmp_path: Path) -> None:
    j = Journal(tmp_path / "decisions.journal")
    j.append([JournalEntry("rows", (make_record(0),), None)])
    with held_lock(j) as let_go:
        t = time.monotonic()
        with pytest.raises(JournalError, match=r"lock .*held") as e:
            j.append([JournalEntry("rows", (make_record(0),), None)], timeout_s=0.2)
        assert e.value.kind == "locked" and time.monotonic() - t < 3.0
        with pytest.raises(JournalError, match=r"lock .*held"), j.draining(timeout_s=0.0):
            pass
        let_go()
        j.append([JournalEntry("rows", (make_record(1),), None)], timeout_s=HELD_S)
    assert j.read().n_rows == 2


def test_opening_a_connection_on_a_new_thread_waits_no_longer_than_the_call(
    writer: LogWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each thread opens its own connection on its first write (a sidecar worker, a
    planner's new thread), and configuring it reads the database: while another process
    holds the file locked, that waited for the log's whole busy timeout, not the call's."""
    real = DecisionLog._configure
    held_until = time.monotonic() + HELD_S

    def busy(self: DecisionLog, conn: sqlite3.Connection, *a: object, **k: object) -> None:
        if time.monotonic() < held_until:
            conn.execute("PRAGMA busy_timeout = 0")
            time.sleep(min(0.05, max(0.0, held_until - time.monotonic())))
            raise sqlite3.OperationalError("database is locked")
        real(self, conn, *a, **k)

    monkeypatch.setattr(DecisionLog, "_configure", busy)
    out: dict[str, object] = {}

    def call() -> None:  # a thread that never wrote: no connection yet
        t = time.monotonic()
        out["done"] = writer.commit(
            [make_record(0, label="SAFE")], images=None, policy=_policy(), clock=Clock(0.5)
        )
        out["took"] = time.monotonic() - t

    th = threading.Thread(target=call)
    th.start()
    th.join(HELD_S * 3)
    took = out["took"]
    assert isinstance(took, float) and took < 3.0, f"a 0.5 s call took {took:.1f} s"
    done = out["done"]
    assert done.records[0].label == "UNSAFE" and done.records[0].fail_closed  # type: ignore[attr-defined]
    assert writer.pending == 1  # kept, and written once the file is free
    monkeypatch.undo()
    writer.flush()
    assert writer.pending == 0 and writer.log.count() == 1
