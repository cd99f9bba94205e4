"""``LogWriter.commit``: one guard call's rows written within its deadline, or answered
fail-closed and kept; a SAFE row whose write ended after the deadline is amended in the log.

The clock is passed in (``Deadline``): a fake one says when the deadline has passed, so each
case is exact without sleeping."""

from __future__ import annotations

from pathlib import Path

import pytest
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_writer import LogWriter

from tests._support.records import make_record


class FakeClock:
    """A deadline that has passed (``expired``) or not; no time limit on the waits."""

    def __init__(self, expired: bool) -> None:
        self._expired = expired

    def remaining(self) -> float | None:
        return None

    def lock_timeout(self) -> float:
        return -1

    def expired(self) -> bool:
        return self._expired

    def reason(self, stage: str) -> str:
        return f"deadline exceeded: the call took longer than 0.5 s ({stage})"


def _policy() -> PolicyRow:
    return PolicyRow("v1", "frozen", "fk", "bundle-1", "abc123", "2026-01-01", {"kind": "frozen"})


@pytest.fixture
def writer(tmp_path: Path):
    log = DecisionLog(tmp_path / "log.sqlite")
    w = LogWriter(
        log, LogOptions(journal=tmp_path / "elsewhere" / "decisions.journal", spill_after_s=3600.0)
    )
    yield w
    w.close()
    log.close()


def test_written_in_time_answers_the_rows_as_they_are(writer: LogWriter) -> None:
    recs = [make_record(i) for i in range(3)]  # SAFE, UNSAFE, SAFE
    done = writer.commit(recs, images=None, policy=_policy(), clock=FakeClock(expired=False))
    assert done.error is None and done.records == recs
    assert [writer.log.get(r.decision_id).label for r in recs] == ["SAFE", "UNSAFE", "SAFE"]


def test_written_after_the_deadline_a_safe_row_is_amended_unsafe(writer: LogWriter) -> None:
    recs = [make_record(i) for i in range(3)]
    done = writer.commit(recs, images=None, policy=_policy(), clock=FakeClock(expired=True))
    assert done.error is None
    assert [r.label for r in done.records] == ["UNSAFE"] * 3
    assert [r.fail_closed for r in done.records] == [True, False, True]  # UNSAFE stays as it was
    for answered in done.records:
        logged = writer.log.get(answered.decision_id)
        assert logged is not None
        assert (logged.label, logged.fail_closed) == (answered.label, answered.fail_closed)
        if answered.fail_closed:
            assert "(writing the decision log)" in (logged.fail_reason or "")


def test_not_written_every_row_fails_closed_and_is_kept(writer: LogWriter) -> None:
    recs = [make_record(i) for i in range(2)] + [
        make_record(2, label="UNSAFE", fail_closed=True, fail_reason="input: bad image")
    ]
    writer.log._conn().execute("PRAGMA query_only = 1")
    done = writer.commit(recs, images=None, policy=_policy(), clock=FakeClock(expired=False))
    assert done.error is not None and "read" in done.error
    assert all(r.label == "UNSAFE" and r.fail_closed for r in done.records)
    assert [r.fail_reason for r in done.records] == [done.error, done.error, "input: bad image"]
    assert writer.pending == 3  # kept, not lost
    writer.log._conn().execute("PRAGMA query_only = 0")
    assert writer.flush() == 3  # written as the fail-closed UNSAFE that was answered
    assert [writer.log.get(r.decision_id).fail_reason for r in recs] == [
        done.error,
        done.error,
        "input: bad image",
    ]


def _restart(tmp_path: Path) -> DecisionLog:
    """What a new process finds after this one died without closing (or flushing) anything:
    a new writer on the same log and journal imports what the journal holds."""
    log = DecisionLog(tmp_path / "log.sqlite")
    LogWriter(log, LogOptions(journal=tmp_path / "elsewhere" / "decisions.journal")).close()
    return log


def test_a_write_whose_outcome_is_unknown_journals_its_fail_closed_copy_at_once(
    writer: LogWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error at the commit's fsync may have written the transaction all the same, and a
    crash would bring the row back as decided (SAFE) while the answer was UNSAFE: the
    fail-closed copy goes to the journal at once (not after ``spill_after_s``, an hour here),
    and the next start's import amends the row."""
    real = DecisionLog.append_many

    def commit_then_fail(self, *a, **k):  # type: ignore[no-untyped-def]
        real(self, *a, **k)
        raise OSError(5, "I/O error at the commit's fsync (injected)")

    monkeypatch.setattr(DecisionLog, "append_many", commit_then_fail)
    rec = make_record(0)  # SAFE
    done = writer.commit([rec], images=None, policy=_policy(), clock=FakeClock(expired=False))
    monkeypatch.setattr(DecisionLog, "append_many", real)
    assert done.error is not None and done.records[0].label == "UNSAFE"
    status = writer.status()
    assert status.pending_rows == 0 and status.journal_rows == 1
    logged = _restart(tmp_path).get(rec.decision_id)  # the process died here
    assert logged is not None and (logged.label, logged.fail_closed) == ("UNSAFE", True)
    assert logged.fail_reason == done.error


def test_a_busy_log_keeps_a_refused_write_in_memory_for_its_spill_time(
    writer: LogWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before a byte was written (another writer holds the log): nothing can come
    back, so the rows wait in memory as before, and the next write takes them."""
    from spotstop.guard._log_schema import LogError

    real = DecisionLog.append_many

    def busy(self, *a, **k):  # type: ignore[no-untyped-def]
        raise LogError("database is locked (injected)", "locked")

    monkeypatch.setattr(DecisionLog, "append_many", busy)
    rec = make_record(0)
    done = writer.commit([rec], images=None, policy=_policy(), clock=FakeClock(expired=False))
    monkeypatch.setattr(DecisionLog, "append_many", real)
    assert done.error is not None
    assert writer.status().pending_rows == 1 and writer.status().journal_rows == 0
    assert writer.flush() == 1


def test_a_late_safes_amendment_the_log_refuses_goes_to_the_journal_at_once(
    writer: LogWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row was written SAFE after the deadline and the answer is UNSAFE; another writer
    holds the log at the one attempt to amend it. The amendment goes to the journal before
    the answer, so a crash right after answering still leaves the row UNSAFE."""
    import sqlite3

    real = DecisionLog.append_many
    other: list[sqlite3.Connection] = []

    def commit_then_busy(self, *a, **k):  # type: ignore[no-untyped-def]
        real(self, *a, **k)
        c = sqlite3.connect(tmp_path / "log.sqlite", isolation_level=None)
        c.execute("BEGIN IMMEDIATE")  # someone else writes for a moment
        other.append(c)

    monkeypatch.setattr(DecisionLog, "append_many", commit_then_busy)
    rec = make_record(0)  # SAFE
    done = writer.commit([rec], images=None, policy=_policy(), clock=FakeClock(expired=True))
    monkeypatch.setattr(DecisionLog, "append_many", real)
    assert done.error is None and done.records[0].label == "UNSAFE"
    status = writer.status()
    assert status.pending_amendments == 0 and status.journal_entries == 1
    other[0].execute("ROLLBACK")
    other[0].close()
    logged = _restart(tmp_path).get(rec.decision_id)  # the process died after answering
    assert logged is not None and (logged.label, logged.fail_closed) == ("UNSAFE", True)


def test_a_late_safes_amendment_neither_log_nor_journal_takes_is_an_error(
    writer: LogWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the journal cannot take the amendment either, it waits in memory and the call says
    so (``require_logged`` callers answer 503); the answer is UNSAFE in every case."""
    from spotstop.guard._journal import Journal, JournalError

    def refuse(self, *a, **k):  # type: ignore[no-untyped-def]
        raise JournalError("journal full (injected)")

    def refuse_amend(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(5, "busy (injected)")

    monkeypatch.setattr(Journal, "append", refuse)
    monkeypatch.setattr(writer.log, "mark_fail_closed", refuse_amend)
    rec = make_record(0)  # SAFE
    done = writer.commit([rec], images=None, policy=_policy(), clock=FakeClock(expired=True))
    assert done.records[0].label == "UNSAFE" and done.records[0].fail_closed
    assert done.error is not None and "amendment" in done.error
    assert writer.status().pending_amendments == 1
