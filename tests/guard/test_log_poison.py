"""A batch the log can never store does not wedge the log writer.

A row whose text cannot be encoded (a lone surrogate: UnicodeEncodeError) or a policy whose
document holds a NaN (``json.dumps(allow_nan=False)``: ValueError) fails every time it is
written. Before the fix the writer retried that batch first on every write, so every later
decision failed to log too, and the journal spill raised into the call path. Now such a batch
is *set aside*: appended, fsynced, to the dead letter beside the log
(``<log>.dead-letter.jsonl``), counted in the writer's status, and the rows after it are
written as usual. Its decisions were answered fail-closed UNSAFE when their own write failed;
setting them aside never changes an answer.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from spotstop.guard._journal import Journal, JournalEntry
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_writer import LogWriter

from tests._support.records import make_record

SURROGATE = "EXIT \ud83d"  # half an emoji: no UTF-8 encoding exists for it


class NoDeadline:
    """A call without a deadline that has not expired (``LogWriter.commit``'s clock)."""

    def remaining(self) -> float | None:
        return None

    def lock_timeout(self) -> float:
        return -1

    def expired(self) -> bool:
        return False

    def reason(self, stage: str) -> str:
        return f"deadline exceeded ({stage})"


def _policy(**document: object) -> PolicyRow:
    return PolicyRow("v1", "frozen", "fk", "bundle-1", "abc123", "2026-01-01", dict(document))


def _writer(tmp_path: Path, **kw: object) -> LogWriter:
    opts = LogOptions(journal=tmp_path / "elsewhere" / "decisions.journal", **kw)  # type: ignore[arg-type]
    return LogWriter(DecisionLog(tmp_path / "log.sqlite"), opts)


def _dead_letter(w: LogWriter) -> list[dict[str, Any]]:
    path = w.status().dead_letter
    assert path is not None
    text = Path(path).read_bytes()
    assert text.isascii() and text.endswith(b"\n")  # an encoding that cannot fail
    return [json.loads(line) for line in text.splitlines()]


def _commit_one(w: LogWriter, **overrides: object):
    rec = make_record(0, label="SAFE", **overrides)
    return rec, w.commit([rec], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())


def test_a_row_that_cannot_be_encoded_is_set_aside_and_later_rows_go_in(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    bad = make_record(1, label="SAFE", cue_text=SURROGATE)
    done = w.commit([bad], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert done.error is not None and "UnicodeEncodeError" in done.error
    assert [(r.label, r.fail_closed) for r in done.records] == [("UNSAFE", True)]  # never SAFE
    for i in range(2, 5):  # every later call is written and answered as decided
        good = make_record(i, label="SAFE")
        later = w.commit([good], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
        assert later.error is None and later.records == [good]
    assert w.log.count() == 3 and w.log.get(bad.decision_id) is None
    st = w.status()
    assert st.writable and st.pending_rows == 0 and st.dead_letter_rows == 1
    assert st.dead_letter == str(tmp_path / "log.sqlite.dead-letter.jsonl")
    (entry,) = _dead_letter(w)
    (row,) = entry["rows"]
    assert row["decision_id"] == bad.decision_id and row["label"] == "UNSAFE"  # as answered
    assert row["fail_closed"] is True and "\\ud83d" in row["cue_text"]
    assert "UnicodeEncodeError" in str(entry["error"]) and entry["log"] == str(w.log.path)
    w.close()
    w.log.close()


def test_a_policy_with_nan_sets_its_batch_aside_and_a_mended_policy_logs_again(
    tmp_path: Path,
) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    nan_policy = _policy(kind="frozen", fitted_on={"auroc": math.nan})
    recs = [make_record(i, label="SAFE") for i in range(2)]
    first = w.commit(recs, images=None, policy=nan_policy, clock=NoDeadline())
    assert first.error is not None and "ValueError" in first.error
    assert all(r.label == "UNSAFE" and r.fail_closed for r in first.records)
    mended = make_record(5, label="SAFE")
    done = w.commit([mended], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert done.error is None and done.records == [mended]
    assert [r.decision_id for r in w.log.records()] == [mended.decision_id]
    (entry,) = _dead_letter(w)
    assert [r["decision_id"] for r in entry["rows"]] == [r.decision_id for r in recs]
    assert math.isnan(entry["policy"]["document"]["fitted_on"]["auroc"])  # NaN kept as NaN
    assert w.status().dead_letter_rows == 2
    w.close()
    w.log.close()


def test_only_the_rows_that_cannot_be_stored_are_set_aside(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    good, bad = make_record(0, label="SAFE"), make_record(1, label="SAFE", detail=SURROGATE)
    done = w.commit([good, bad], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert done.error is not None  # the call's write failed: both answered fail-closed
    assert w.flush(1.0) == 1  # the storable row goes in, as the UNSAFE that was answered
    logged = w.log.get(good.decision_id)
    assert logged is not None and logged.label == "UNSAFE" and logged.fail_closed
    assert [r["decision_id"] for r in _dead_letter(w)[0]["rows"]] == [bad.decision_id]
    assert w.status().dead_letter_rows == 1 and w.pending == 0
    w.close()
    w.log.close()


def test_the_dead_letter_is_fsynced_before_the_batch_leaves_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    w = _writer(tmp_path, spill_after_s=3600.0)
    _commit_one(w, cue_text=SURROGATE)
    monkeypatch.setattr(os, "fsync", fsync)
    assert w.flush(1.0) == 0
    monkeypatch.undo()
    path = Path(str(w.status().dead_letter))
    assert path.stat().st_ino in synced and w.pending == 0
    w.close()
    w.log.close()


def test_a_dead_letter_that_cannot_be_written_keeps_the_batch_and_blocks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    bad, _ = _commit_one(w, cue_text=SURROGATE)

    def full(*a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(w.dead_letter, "append", full)
    good = make_record(3, label="SAFE")
    done = w.commit([good], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert done.error is None and done.records == [good]  # later rows still go in
    st = w.status()
    # kept (in memory, or in the journal it was spilled to), never dropped
    assert st.pending_rows + st.journal_rows == 1 and st.dead_letter_rows == 0
    assert st.dead_letter_fault is not None and "No space left" in st.dead_letter_fault
    monkeypatch.undo()
    w.flush(1.0)  # the dead letter takes it now
    st = w.status()
    assert st.pending_rows == 0 and st.dead_letter_rows == 1 and st.dead_letter_fault is None
    assert _dead_letter(w)[0]["rows"][0]["decision_id"] == bad.decision_id
    w.close()
    w.log.close()


def test_spilling_a_row_that_cannot_be_stored_never_raises_and_its_import_sets_it_aside(
    tmp_path: Path,
) -> None:
    w = _writer(tmp_path, spill_after_s=0.0)  # every kept batch goes to the journal at once
    bad, done = _commit_one(w, cue_text=SURROGATE)  # the spill in keep() raised here before
    assert done.error is not None and done.records[0].label == "UNSAFE"
    assert w.pending == 0  # in the journal (or set aside), not lost
    good = make_record(7, label="SAFE")
    later = w.commit([good], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert later.error is None and later.records == [good]
    assert [r.decision_id for r in w.log.records()] == [good.decision_id]
    assert w.journal.read().n_rows == 0 and not w.status().waiting
    assert _dead_letter(w)[0]["rows"][0]["decision_id"] == bad.decision_id
    w.close()
    w.log.close()


def test_a_journal_entry_the_dead_letter_cannot_take_stays_in_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry the log can never store (a NaN in its policy), imported while the dead letter
    cannot be written, was moved to memory and the journal emptied: a crash in the next
    seconds lost it (in none of log, journal, dead letter). It stays in the journal until the
    dead letter takes it; a later import sets it aside exactly once."""
    journal = tmp_path / "elsewhere" / "decisions.journal"
    journal.parent.mkdir()
    log_path = tmp_path / "log.sqlite"
    recs = tuple(
        make_record(i, label="UNSAFE", fail_closed=True, fail_reason="decision log (disk_full)")
        for i in range(2)
    )
    Journal(journal, owner=str(log_path.resolve())).append(
        [JournalEntry("rows", recs, _policy(threshold=math.nan))]
    )

    def full(*a: object, **kw: object) -> None:
        raise OSError(5, "Input/output error")

    from spotstop.guard._log_writer import DeadLetter

    monkeypatch.setattr(DeadLetter, "append", full)
    w = LogWriter(DecisionLog(log_path), LogOptions(journal=journal))  # imports at start
    st = w.status()
    assert st.dead_letter_fault is not None and st.pending_rows == 0
    assert w.journal.read().n_rows == 2 and st.journal_rows == 2  # durable where it was
    # a crash here (a new writer on the same files) loses nothing
    monkeypatch.undo()
    w2 = LogWriter(DecisionLog(log_path), LogOptions(journal=journal))
    assert w2.journal.read().n_rows == 0 and w2.status().journal_rows == 0
    rows = [r["decision_id"] for e in _dead_letter(w2) for r in e["rows"]]
    assert sorted(rows) == sorted(r.decision_id for r in recs)  # once each
    for x in (w, w2):
        x.close()
        x.log.close()


def test_the_journal_keeps_any_text_and_nan_exactly(tmp_path: Path) -> None:
    j = Journal(tmp_path / "decisions.journal")
    rec = make_record(0, cue_text=SURROGATE, fused_score=math.nan)
    j.append([JournalEntry("rows", (rec,), _policy(auroc=math.nan))])
    (entry,) = j.read().entries
    assert entry.records[0].cue_text == SURROGATE and math.isnan(entry.records[0].fused_score)
    assert entry.policy is not None and math.isnan(entry.policy.document["auroc"])


def test_an_amendment_that_cannot_be_stored_does_not_block_the_log(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    rec = make_record(0, label="SAFE")
    w.log.append(rec)
    w.log._conn().execute("PRAGMA query_only = 1")
    w.amend_late([rec.decision_id], f"deadline exceeded: {SURROGATE}")  # kept: the log is r/o
    w.log._conn().execute("PRAGMA query_only = 0")
    good = make_record(1, label="SAFE")
    done = w.commit([good], images=None, policy=_policy(kind="frozen"), clock=NoDeadline())
    assert done.error is None and done.records == [good]
    got = w.log.get(rec.decision_id)  # the change itself still reaches the log
    assert got is not None and got.label == "UNSAFE" and got.fail_closed
    assert not w.status().waiting
    w.close()
    w.log.close()
