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
