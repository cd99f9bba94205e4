"""The log's readers see what the robot received while the log is faulty.

A SAFE row whose write ended after the deadline was answered fail-closed UNSAFE; while its
amendment waits in the journal (the log cannot take it) or lies in the dead letter (the log
can never take it), the log still says SAFE. Rows the log did not take wait there too.
:func:`spotstop.guard.read_reviewed` (the card's, ``calibrate``'s reader) applies what waits,
counts what the log lacks, and writes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from spotstop.guard import Guard, LogError, read_reviewed
from spotstop.guard._journal import DeadLetter, Journal, JournalEntry, default_journal_path
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_writer import LogWriter

from tests._support.guard import make_scene, set_frozen
from tests._support.records import make_record
from tests._support.tolerance import SCHEDULING_SLACK_S


def _files(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``folder`` with its mtime, size and bytes: a reader changes none."""
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _as_read(path: Path, **kw: object) -> dict[str, tuple[int, bool]]:
    arr = read_reviewed(path, **kw).arrays  # type: ignore[arg-type]
    return {
        str(i): (int(lab), bool(fc))
        for i, lab, fc in zip(arr.decision_id, arr.guard_label, arr.fail_closed, strict=True)
    }


def test_a_late_amendment_waiting_in_the_journal_is_read_as_answered(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    w = LogWriter(DecisionLog(log), LogOptions(spill_after_s=3600.0))
    late, other = make_record(0, label="SAFE"), make_record(2, label="SAFE")
    w.log.append_many([late, other])
    w.log._conn().execute("PRAGMA query_only = 1")  # the log cannot take the amendment
    assert w.amend_late([late.decision_id], "deadline exceeded (writing the decision log)")
    assert w.status().journal_entries == 1  # it waits in the journal, the row says SAFE
    assert w.log.get(late.decision_id, raw=True).label == "SAFE"  # type: ignore[union-attr]
    assert w.log.get(late.decision_id).label == "UNSAFE"  # type: ignore[union-attr]
    before = _files(tmp_path) | _files(w.journal.path.parent)

    r = read_reviewed(log)
    assert _as_read(log) == {late.decision_id: (1, True), other.decision_id: (0, False)}
    assert r.pending.amended == 1 and r.pending.missing == 0
    assert r.pending.journal == str(w.journal.path)
    assert "1 decision(s) the log still holds as SAFE" in r.pending.message()
    assert _files(tmp_path) | _files(w.journal.path.parent) == before  # nothing written

    w.log._conn().execute("PRAGMA query_only = 0")
    w.flush(5.0)  # the log takes it: read once, not twice
    r = read_reviewed(log)
    assert _as_read(log)[late.decision_id] == (1, True) and not r.pending
    w.close()
    w.log.close()


def test_the_dead_letter_s_amendments_and_rows_are_read(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    safe, committed, unsafe = (
        make_record(0, label="SAFE"),
        make_record(2, label="SAFE"),
        make_record(4, label="UNSAFE"),
    )
    with DecisionLog(log) as d:
        d.append_many([safe, committed, unsafe])
    dead = DeadLetter(log.with_name(log.name + ".dead-letter.jsonl"), log=str(log))
    dead.append(
        "amend", error="x", amend_ids=[safe.decision_id, unsafe.decision_id], amend_reason="late"
    )
    # rows set aside as answered: one the log holds as decided (a write reported failed that
    # committed), one it lacks
    answered = make_record(
        2,
        label="UNSAFE",
        fail_closed=True,
        fail_reason="decision log (io_error)",
        decision_id=committed.decision_id,
    )
    lacked = make_record(6, label="UNSAFE", fail_closed=True, fail_reason="decision log")
    dead.append("rows", error="y", records=[answered, lacked])
    with open(dead.path, "ab") as fh:
        fh.write(b'{"v": 2, "kind": "rows", "rows": [{"label"')  # a torn last line

    got = _as_read(log)
    assert got[safe.decision_id] == (1, True)
    assert got[committed.decision_id] == (1, True)
    assert got[unsafe.decision_id] == (1, False)  # an UNSAFE row stays as it is
    p = read_reviewed(log).pending
    assert (p.amended, p.missing_dead_letter, p.missing_journal) == (2, 1, 0)
    assert p.unreadable == 1 and p.dead_letter == str(dead.path)
    msg = p.message()
    assert "1 decision(s) answered fail-closed UNSAFE are not in the log" in msg
    assert "1 set aside in the dead letter" in msg and "could not be read" in msg


def test_rows_waiting_in_a_named_journal_are_counted_and_other_logs_entries_left(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log.sqlite"
    with DecisionLog(log) as d:
        d.append(make_record(0, label="SAFE"))
    journal = tmp_path / "elsewhere" / "decisions.journal"
    waiting = make_record(1, label="UNSAFE", fail_closed=True, fail_reason="decision log")
    Journal(journal, owner=str(log.resolve())).append([JournalEntry("rows", (waiting,))])
    amend = JournalEntry("amend", amend_ids=(make_record(0).decision_id,), amend_reason="late")
    Journal(journal, owner=str((tmp_path / "other.sqlite").resolve())).append([amend])

    assert not read_reviewed(log).pending  # the default journal holds nothing
    p = read_reviewed(log, journal=journal).pending
    assert (p.amended, p.missing_journal, p.unknown) == (0, 1, 0)
    assert "1 waiting in the journal" in p.message()


def test_a_journal_that_cannot_be_read_is_said_not_raised(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    with DecisionLog(log) as d:
        d.append(make_record(0, label="SAFE"))
    from spotstop.guard._log_pending import read_pending

    folder = tmp_path / "a-folder"
    folder.mkdir()
    changes = read_pending(log, folder)
    assert changes.faults and "a-folder" in changes.faults[0]
    p = read_reviewed(log, journal=folder).pending
    assert p and "not read: journal" in p.message()


def test_a_guard_s_late_answer_reads_as_answered_while_its_amendment_waits(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repro: a log write that ends past the call's deadline, and a log that cannot take
    the amendment (read-only now). The robot got UNSAFE; every reader must say so."""
    set_frozen(bundle_copy, 1e9)  # every scored scene is SAFE
    log = tmp_path / "l.sqlite"
    with Guard(bundle_copy, log=log) as g:
        t = time.perf_counter()
        assert g.check(make_scene()).label == "SAFE"
        budget = 3 * (time.perf_counter() - t) + SCHEDULING_SLACK_S
        append = g.log.append_many

        def slow(*a: object, **k: object) -> None:
            time.sleep(budget + 0.2)
            append(*a, **k)  # type: ignore[arg-type]

        def read_only(*a: object, **k: object) -> None:
            raise LogError("attempt to write a readonly database", "read_only")

        monkeypatch.setattr(g.log, "append_many", slow)
        monkeypatch.setattr(g.log, "mark_fail_closed", read_only)
        d = g.check(make_scene(1), deadline_s=budget)
        assert d.label == "UNSAFE" and d.fail_closed
        assert g.log.get(d.decision_id, raw=True).label == "SAFE"  # type: ignore[union-attr]
        assert g.log.get(d.decision_id).label == "UNSAFE"  # type: ignore[union-attr]
        assert default_journal_path(log).is_file()
        r = read_reviewed(log)
        i = list(r.arrays.decision_id).index(d.decision_id)
        assert r.arrays.guard_label[i] == 1 and r.arrays.fail_closed[i]
        assert r.pending.amended == 1
        assert r.counting(needs=None).fail_closed[i]  # never counted as a SAFE answer
        monkeypatch.undo()
