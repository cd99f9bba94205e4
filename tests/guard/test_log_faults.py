"""A log that cannot be written: fault kinds, the journal, the log writer, and the guard on top.

The faults are SQLite's own, raised on the log's own connection: ``PRAGMA max_page_count``
makes the database full (SQLITE_FULL, what a full disk gives), ``PRAGMA query_only`` makes it
read-only (SQLITE_READONLY), another connection's write transaction locks it (SQLITE_BUSY).
Lifting the pragma is the space coming back. ``tests/guard/serve/test_log_and_shutdown.py`` fills a real file system.
"""

from __future__ import annotations

import errno
import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
from spotstop.guard._journal import Journal, JournalEntry, default_journal_path
from spotstop.guard._log import DecisionLog, PolicyRow
from spotstop.guard._log_options import LogOptions, parse_bytes
from spotstop.guard._log_schema import FAULT_KINDS, LogError, fault_kind
from spotstop.guard._log_writer import LogWriter
from spotstop.guard._record import RecordError

from tests._support.records import assert_same_record, make_record

BIG = "x" * 6000  # a request that needs pages of its own


def fill_up(log: DecisionLog) -> None:
    """SQLITE_FULL from now on for this thread's connection: no page may be added."""
    conn = log._conn()
    (n,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {n}")


def make_room(log: DecisionLog) -> None:
    log._conn().execute("PRAGMA max_page_count = 1073741823")


def policy_row() -> PolicyRow:
    return PolicyRow("v1", "frozen", "fk", "bundle-1", "abc123", "2026-01-01", {"kind": "frozen"})


# -- fault kinds ---------------------------------------------------------------------------


def test_fault_kinds_of_real_sqlite_errors(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "log.sqlite") as log:
        log.append(make_record(0))
        fill_up(log)
        with pytest.raises(LogError, match=r"disk_full") as full:
            log.append(make_record(1, request=BIG))
        assert full.value.kind == "disk_full" and "log.sqlite" in str(full.value)
        make_room(log)
        log._conn().execute("PRAGMA query_only = 1")
        with pytest.raises(LogError) as ro:
            log.append(make_record(2))
        assert ro.value.kind == "read_only" and "read-only" in str(ro.value)
        log._conn().execute("PRAGMA query_only = 0")
        other = sqlite3.connect(log.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(LogError) as busy:
            log.append(make_record(3), timeout_s=0.05)
        assert busy.value.kind == "locked"
        other.execute("ROLLBACK")
        other.close()
        log.append(make_record(4))  # every fault passed: the log takes rows again
        assert log.count() == 2
    with pytest.raises(LogError) as closed:
        log.append(make_record(5))
    assert closed.value.kind == "closed"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
        (OSError(errno.EROFS, "Read-only file system"), "read_only"),
        (OSError(errno.EIO, "Input/output error"), "io_error"),
        (sqlite3.OperationalError("database or disk is full"), "disk_full"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "read_only"),
        (sqlite3.OperationalError("database is locked"), "locked"),
        (ValueError("something else"), "other"),
        (LogError("x", "locked"), "locked"),
    ],
)
def test_fault_kind_of_each_error(exc: BaseException, kind: str) -> None:
    assert fault_kind(exc) == kind
    assert kind in FAULT_KINDS


def test_log_error_keeps_its_kind_across_pickling() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(LogError("disk gone", "disk_full")))
    assert isinstance(e, LogError) and e.kind == "disk_full" and str(e) == "disk gone"


# -- the journal -----------------------------------------------------------------------------


def test_journal_round_trip_keeps_nan_infinities_images_and_policy(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j" / "decisions.journal")
    r0 = make_record(0, fused_score=math.nan, member_scores={"a": math.inf, "b": -math.inf})
    r1 = make_record(1, request="ünïcode ✓", threshold=math.inf)
    j.append([JournalEntry("rows", (r0, r1), policy_row(), (b"\x00\xff", None))])
    j.append([JournalEntry("amend", amend_ids=("x",), amend_reason="late")])
    read = j.read()
    assert read.rejected == 0 and read.n_rows == 2 and len(read.entries) == 2
    rows, amend = read.entries
    for want, got in zip((r0, r1), rows.records, strict=True):
        assert_same_record(want, got)
    assert rows.policy == policy_row() and rows.images == (b"\x00\xff", None)
    assert amend.kind == "amend" and amend.amend_ids == ("x",) and amend.amend_reason == "late"


def test_journal_torn_line_is_set_apart_and_counted_never_imported(tmp_path: Path) -> None:
    j = Journal(tmp_path / "decisions.journal")
    j.append([JournalEntry("rows", (make_record(0),), None)])
    good = j.path.read_bytes()
    altered = good.replace(b'"pick up the knife 0"', b'"pick up the knife 9"')
    j.path.write_bytes(good + altered + good[:40])  # a changed line and a torn last line
    read = j.read()
    assert read.n_rows == 1 and read.rejected == 2
    assert j.path.read_bytes() == good  # the journal keeps only what can be imported
    assert j.path.with_name(j.path.name + ".rejected").read_bytes().count(b"\n") == 2


def _line(body: dict[str, object]) -> bytes:
    import hashlib

    text = json.dumps(body, ensure_ascii=True, separators=(",", ":"))
    return f"{hashlib.sha256(text.encode()).hexdigest()} {text}\n".encode()


def test_a_journal_of_the_previous_log_schema_is_imported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Journal rows were positional and checked against this schema's column count: what a
    guard of log schema 4 (before ``deciding_kind``) left in its journal was set apart as
    "torn" after an upgrade and never imported. Such rows are read and get the added column
    as the log's migration gives it; a line of a newer spotstop is said to be one."""
    from spotstop.guard._log_schema import COLUMNS, kind_of_old_rule
    from spotstop.guard._record import record_to_row

    log = DecisionLog(tmp_path / "log.sqlite")
    k = COLUMNS.index("deciding_kind")
    recs = [
        make_record(i, label="UNSAFE", fail_closed=True, fail_reason="decision log (disk_full)")
        for i in range(3)
    ]
    rows = []
    for r in recs:
        row = list(record_to_row(r))
        del row[k]  # the row as log schema 4 wrote it
        rows.append(row)
    old = {"v": 1, "kind": "rows", "log": str(log.path.resolve()), "rows": rows}
    newer = {"v": 3, "kind": "rows", "log": str(log.path.resolve()), "rows": []}
    j = Journal(tmp_path / "j.journal", owner=str(log.path.resolve()))
    j.path.write_bytes(_line({**old, "policy": None, "images": None}) + _line(newer))
    w = LogWriter(log, LogOptions(journal=j.path))
    w.flush(1.0)
    assert log.count() == 3 and w.status().rejected_lines == 1
    for r in recs:
        got = log.get(r.decision_id)
        assert got is not None and got.label == "UNSAFE"
        assert got.deciding_kind == kind_of_old_rule(r.policy, r.threshold)
    assert "1 journal line(s) were written by another spotstop version" in caplog.text
    assert "journal entry version 3" in caplog.text and "torn" not in caplog.text
    w.close()
    log.close()
    # this version's lines name their columns, so a later schema can read them
    j2 = Journal(tmp_path / "j2.journal")
    j2.append([JournalEntry("rows", (recs[0],), None)])
    body = json.loads(j2.path.read_bytes().split(b" ", 1)[1])
    assert body["v"] == 2 and body["columns"] == list(COLUMNS)


def test_journal_is_emptied_only_when_the_import_finished(tmp_path: Path) -> None:
    j = Journal(tmp_path / "decisions.journal")
    j.append([JournalEntry("rows", (make_record(0),), None)])
    with pytest.raises(RuntimeError), j.draining() as read:
        assert read.n_rows == 1
        raise RuntimeError("the log failed half-way")
    assert j.read().n_rows == 1
    with j.draining() as read:
        assert read.n_rows == 1
    assert j.read().n_rows == 0


def test_journal_that_cannot_be_written_says_where_and_why(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file, not a folder")
    j = Journal(tmp_path / "blocker" / "decisions.journal")
    with pytest.raises(LogError, match=r"journal .*cannot be written.*--journal"):
        j.append([JournalEntry("rows", (make_record(0),), None)])
    with pytest.raises(LogError, match=r"is not a file"):
        Journal(tmp_path)


def test_default_journal_is_per_log_under_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    a = default_journal_path(tmp_path / "a" / "decisions.sqlite")
    b = default_journal_path(tmp_path / "b" / "decisions.sqlite")
    assert a != b and a.parent == b.parent == tmp_path / "state" / "spotstop" / "journal"
    assert a.name.startswith("decisions.sqlite-") and a.suffix == ".journal"


def test_import_twice_is_importing_once(tmp_path: Path) -> None:
    recs = [make_record(i) for i in range(3)]
    with DecisionLog(tmp_path / "log.sqlite") as log:
        assert log.import_batch(recs[:2], policy=policy_row()) == 2
        assert log.import_batch(recs, policy=policy_row()) == 1  # a re-import after a crash
        assert [r.decision_id for r in log.records()] == [r.decision_id for r in recs]
        assert set(log.policies()) == {"v1"}


# -- the writer ------------------------------------------------------------------------------


def _writer(tmp_path: Path, **kw: object) -> LogWriter:
    opts = LogOptions(journal=tmp_path / "elsewhere" / "decisions.journal", **kw)  # type: ignore[arg-type]
    return LogWriter(DecisionLog(tmp_path / "log.sqlite"), opts)


def test_writer_keeps_rows_then_recovers_by_itself(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    log = w.log
    assert w.write([make_record(0)], images=None, policy=policy_row(), timeout_s=1) is None
    fill_up(log)
    why = w.write([make_record(1, request=BIG)], images=None, policy=policy_row(), timeout_s=1)
    assert why is not None and why.startswith("decision log (disk_full)") and "log.sqlite" in why
    w.keep([make_record(1, request=BIG)], images=None, policy=policy_row())
    st = w.status()
    assert not st.writable and st.fault == "disk_full" and st.pending_rows == 1
    assert st.faults == {"disk_full": 1} and st.since is not None and st.accepting
    with pytest.raises(LogError) as still:
        w.flush(1.0)
    assert still.value.kind == "disk_full" and w.status().faults["disk_full"] == 2
    make_room(log)  # the space came back
    assert w.flush(1.0) == 1
    st = w.status()
    assert st.writable and st.fault is None and st.pending_rows == 0 and log.count() == 2
    w.close()
    log.close()


def test_writer_probes_a_log_that_failed_with_nothing_waiting(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w.log._conn().execute("PRAGMA query_only = 1")
    assert w.write([make_record(0)], images=None, policy=None, timeout_s=1) is not None
    assert w.status().fault == "read_only" and w.status().waiting_rows == 0
    with pytest.raises(LogError, match="read_only"):
        w.flush(1.0)  # nothing waits: the probe row finds the fault still there
    assert w.status().faults == {"read_only": 2}
    w.log._conn().execute("PRAGMA query_only = 0")
    assert w.flush(1.0) == 0 and w.status().writable  # the probe row went in
    w.close()
    w.log.close()


def test_writer_spills_past_its_time_and_its_memory_bound(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0, max_pending_bytes=3000)
    fill_up(w.log)
    w.keep([make_record(0)], images=None, policy=policy_row())  # about 1 KiB: stays in memory
    assert w.status().pending_rows == 1 and w.status().journal_rows == 0
    w.keep([make_record(1)], images=[b"\x01" * 4000], policy=policy_row())  # past the bound
    st = w.status()
    assert st.journal_rows == 2 and st.spilled_rows == 2 and st.pending_rows == 0
    (tmp_path / "t").mkdir()
    w2 = _writer(tmp_path / "t", spill_after_s=0.0)
    w2.keep([make_record(2)], images=None, policy=None)  # waited "too long" at once
    assert w2.status().journal_rows == 1
    w.close()
    w2.close()
    w.log.close()
    w2.log.close()


def test_close_while_full_spills_and_the_next_start_imports(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    recs = [make_record(i, request=BIG) for i in range(3)]
    fill_up(w.log)
    for r in recs:
        assert w.write([r], images=None, policy=policy_row(), timeout_s=1) is not None
        w.keep([r], images=None, policy=policy_row())
    w.amend_late(["not-yet-logged"], "deadline exceeded")  # kept: its row is not in the log
    w.close()  # the log is still full: everything goes to the journal
    w.log.close()
    journal = tmp_path / "elsewhere" / "decisions.journal"
    read = Journal(journal).read()
    assert read.n_rows == 3 and [e.kind for e in read.entries][-1] == "amend"
    w2 = _writer(tmp_path)  # the next start, with room again: the journal is imported
    st = w2.status()
    assert st.imported_rows == 3 and st.journal_rows == 0 and st.writable
    got = [r.decision_id for r in w2.log.records()]
    assert got == [r.decision_id for r in recs]
    assert Journal(journal).read().n_rows == 0
    w2.close()
    w2.log.close()


def test_refusal_when_memory_is_full_and_the_journal_cannot_take_more(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("not a folder")
    w = LogWriter(
        DecisionLog(tmp_path / "log.sqlite"),
        LogOptions(journal=tmp_path / "blocker" / "j", max_pending_bytes=100, spill_after_s=3600),
    )
    fill_up(w.log)
    w.keep([make_record(0)], images=None, policy=None)
    st = w.status()
    assert not st.accepting and st.pending_rows == 1  # kept in memory, never dropped
    make_room(w.log)
    assert w.flush(1.0) == 1 and w.accepting
    w.close()
    w.log.close()


def test_floor_counts_as_full_before_sqlite_meets_it(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    w = _writer(tmp_path, min_free_bytes=free * 4)
    why = w.write([make_record(0)], images=None, policy=None, timeout_s=1)
    assert why is not None and "below the floor" in why and "(disk_full)" in why
    st = w.status()
    assert not st.writable and st.fault == "disk_full" and st.min_free_bytes == free * 4
    assert w.log.count() == 0
    w.close()
    w.log.close()


def test_the_floor_fault_keeps_the_time_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the floor with no write failed yet, every status() said the fault began now
    (/readyz and the metrics could never tell how long it had lasted)."""
    from dataclasses import replace

    import spotstop.guard._log_writer as lw

    clock = iter(float(t) for t in range(1000, 2000))
    free = shutil.disk_usage(tmp_path).free
    w = _writer(tmp_path, min_free_bytes=free * 4)
    monkeypatch.setattr(lw.time, "time", lambda: next(clock))
    first, again = w.status(), w.status()
    assert first.fault == again.fault == "disk_full" and first.since == again.since == 1000.0
    w.options = replace(w.options, min_free_bytes=0)  # space again
    assert w.status().fault is None
    w.options = replace(w.options, min_free_bytes=free * 4)  # a new fault: a new start
    later = w.status().since
    assert later is not None and later > 1000.0
    monkeypatch.undo()
    w.close()
    w.log.close()


@pytest.mark.parametrize(
    ("text", "n"),
    [("512", 512), ("64K", 65536), ("1.5GiB", 3 << 29), ("2 mb", 2 << 20), (7, 7)],
)
def test_parse_bytes(text: str | int, n: int) -> None:
    assert parse_bytes(text, "x") == n


def test_log_options_name_the_bad_key() -> None:
    with pytest.raises(RecordError, match=r"min_free_bytes .*non-negative int"):
        LogOptions(min_free_bytes=-1)
    with pytest.raises(RecordError, match=r"max_bytes .*--log-max-bytes.*got 0"):
        LogOptions(max_bytes=0)
    with pytest.raises(RecordError, match=r"keep_days .*positive"):
        LogOptions(keep_days=float("nan"))
    with pytest.raises(RecordError, match=r"a number of bytes, e.g."):
        parse_bytes("lots", "--log-max-bytes")


def test_status_repr_says_what_waits(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=3600.0)
    fill_up(w.log)
    w.write([make_record(0, request=BIG)], images=None, policy=None, timeout_s=1)
    w.keep([make_record(0, request=BIG)], images=None, policy=None)
    text = repr(w.status())
    assert "NOT WRITABLE (disk_full" in text and "pending 1 rows in memory" in text
    json.dumps(dict(w.status().faults))  # plain counts
    make_room(w.log)
    w.close()
    w.log.close()


def test_a_write_reported_failed_that_committed_never_blocks_and_says_what_was_answered(
    tmp_path: Path,
) -> None:
    import dataclasses

    w = _writer(tmp_path)
    rec = make_record(0, label="SAFE")
    w.log.append(rec)  # it went in, but the writer was told it failed
    answered = dataclasses.replace(
        rec, label="UNSAFE", fail_closed=True, fail_reason="decision log (io_error): lost reply"
    )
    w.keep([answered, make_record(1, label="UNSAFE", fail_closed=True, fail_reason="x")],
           images=None, policy=None)  # fmt: skip
    assert w.flush(1.0) == 1  # the other row; no duplicate-id error that blocks the log
    got = w.log.get(rec.decision_id)
    assert got is not None and got.label == "UNSAFE" and got.fail_closed
    assert got.fail_reason == "decision log (io_error): lost reply"
    assert w.status().writable and w.log.count() == 2
    w.close()
    w.log.close()


# -- races and crash windows (each failed before its fix) --------------------------------------


def test_a_spill_never_moves_a_batch_while_it_is_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _writer(tmp_path, spill_after_s=0.0)
    real = w.log.import_batch
    landed: list[bool] = []
    r1, r2, r9 = make_record(1), make_record(2), make_record(9)

    def import_batch(records, **kw):  # another thread's keep() lands mid-write, once
        if not landed:
            landed.append(True)
            w.keep([r9], images=None, policy=None)
        return real(records, **kw)

    w.log._conn().execute("PRAGMA query_only = 1")
    monkeypatch.setattr(w, "_spill", lambda **kw: None)  # keep both batches in memory
    w.keep([r1], images=None, policy=None)
    w.keep([r2], images=None, policy=None)
    monkeypatch.undo()
    w.log._conn().execute("PRAGMA query_only = 0")
    monkeypatch.setattr(w.log, "import_batch", import_batch)
    w.flush(1.0)
    monkeypatch.undo()
    w.flush(1.0)
    ids = sorted(r.decision_id for r in w.log.records())
    assert ids == sorted(r.decision_id for r in (r1, r2, r9))  # each once, none lost
    assert w.journal.read().n_rows == 0 and w.status().pending_rows == 0
    w.close()
    w.log.close()


def test_retention_leaves_young_rows_and_rolls_back_over_an_amendment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spotstop.guard._log_archive as arch
    from spotstop.guard._log import Protect, Retention

    w = _writer(tmp_path, max_bytes=1)
    now = 1_800_000_000.0
    old = make_record(0, time=now - 3600, label="SAFE")
    young = make_record(1, time=now - 10, label="SAFE")
    w.log.append_many([old, young])
    res = w.apply_retention(now=now)  # the writer protects what is younger than 10 minutes
    assert res.archived_rows == 1 and w.log.get(young.decision_id) is not None
    assert [r[0] for r in w.log._fetchall("SELECT decision_id FROM decisions", [])] == [
        young.decision_id
    ]
    # a row amended while its archive is being written: the pass is rolled back (a newer row
    # first: retention never archives the log's newest)
    w.log.append(make_record(2, time=now - 5, label="SAFE"))
    real = arch.write_archive

    def write_archive(*a, **kw):
        info = real(*a, **kw)
        w.log.mark_fail_closed([young.decision_id], "deadline exceeded (late write)")
        return info

    monkeypatch.setattr(arch, "write_archive", write_archive)
    anyage = Protect(min_age_s=0)  # as if ten minutes had passed
    with pytest.raises(LogError, match="changed or left the log meanwhile"):
        w.log.apply_retention(Retention(max_bytes=1), anyage, now=now)
    monkeypatch.undo()
    got = w.log.get(young.decision_id)
    assert got is not None and got.label == "UNSAFE" and got.fail_closed
    assert len(w.log.archives()) == 1  # only the first pass's archive is registered
    assert sorted(p.name for p in w.log.archive_folder.glob("*.parquet")) == [
        a.name for a in w.log.archives()
    ]
    w.log.apply_retention(Retention(max_bytes=1), anyage, now=now)  # archived as it is now
    back = w.log.get(young.decision_id)
    assert back is not None and back.label == "UNSAFE" and w.log.count() == 3
    w.close()
    w.log.close()


def test_two_retention_passes_at_once_lose_nothing(tmp_path: Path) -> None:
    import threading

    from spotstop.guard._log import Retention

    log = DecisionLog(tmp_path / "log.sqlite")
    log.append_many([make_record(i) for i in range(300)])
    errors: list[BaseException] = []

    def run() -> None:
        try:
            DecisionLog(log.path).apply_retention(Retention(keep_days=1), now=2e9)
        except BaseException as e:  # collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert log.count() == 300 and len({r.decision_id for r in log.records()}) == 300
    assert sorted(p.name for p in log.archive_folder.glob("*.parquet")) == sorted(
        a.name for a in log.archives()
    )
    log.close()


def test_an_entry_after_a_torn_tail_is_imported(tmp_path: Path) -> None:
    j = Journal(tmp_path / "decisions.journal")
    j.append([JournalEntry("rows", (make_record(0),), None)])
    with open(j.path, "ab") as fh:  # another process died mid-line
        fh.write(b'0123 {"v": 1, "kind"')
    j.append([JournalEntry("rows", (make_record(1),), None)])
    read = j.read()
    assert [e.records[0].request for e in read.entries] == [
        "pick up the knife 0",
        "pick up the knife 1",
    ]
    assert read.rejected == 1


def test_setting_lines_apart_never_leaves_an_empty_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spotstop.guard._journal as journal_module
    from spotstop.guard._journal import JournalError

    j = Journal(tmp_path / "decisions.journal")
    j.append([JournalEntry("rows", (make_record(0),), None)])
    with open(j.path, "ab") as fh:
        fh.write(b"garbage line\n")
    before = j.path.read_bytes()

    def broken(path: object, data: bytes) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_module, "atomic_write_bytes", broken)
    with pytest.raises(JournalError, match="cannot be read"):
        j.read()
    assert j.path.read_bytes() == before  # the good entry is still there
    monkeypatch.undo()
    assert j.read().n_rows == 1


def test_waiting_amendments_reach_the_journal_and_the_next_start(tmp_path: Path) -> None:
    w = _writer(tmp_path, spill_after_s=0.0)
    rec = make_record(0, label="SAFE")
    w.log.append(rec)
    w.log._conn().execute("PRAGMA query_only = 1")
    w.amend_late([rec.decision_id], "deadline exceeded (late write)")
    st = w.status()
    assert st.pending_amendments == 0 and st.journal_entries == 1 and st.waiting
    w.log._conn().execute("PRAGMA query_only = 0")
    w.log.close()  # a crash: no close() of the writer
    w2 = _writer(tmp_path)
    got = w2.log.get(rec.decision_id)
    assert got is not None and got.label == "UNSAFE" and got.fail_closed
    assert not w2.status().waiting
    w2.close()
    w2.log.close()


def test_a_broken_journal_does_not_stop_a_healthy_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.guard._journal import JournalError

    w = _writer(tmp_path, spill_after_s=0.0)
    w.log._conn().execute("PRAGMA query_only = 1")
    w.keep([make_record(0)], images=None, policy=None)  # spilled: the journal exists
    w.log._conn().execute("PRAGMA query_only = 0")

    def draining(**kw: object) -> object:
        raise JournalError("journal 'x' cannot be read (Errno 30)", "read_only")

    monkeypatch.setattr(w.journal, "draining", draining)
    assert w.write([make_record(1)], images=None, policy=None, timeout_s=1) is None
    st = w.status()
    assert st.writable and st.journal_fault is not None and "journal" in st.journal_fault
    monkeypatch.undo()
    w.flush(1.0)  # the journal is readable again: its row goes in
    assert w.log.count() == 2 and w.status().journal_fault is None
    w.close()
    w.log.close()


def test_guards_of_two_logs_may_share_one_journal(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "decisions.journal"
    a = LogWriter(DecisionLog(tmp_path / "a.sqlite"), LogOptions(journal=shared, spill_after_s=0))
    b = LogWriter(DecisionLog(tmp_path / "b.sqlite"), LogOptions(journal=shared, spill_after_s=0))
    ra, rb = make_record(0), make_record(1)
    for w, r in ((a, ra), (b, rb)):
        w.log._conn().execute("PRAGMA query_only = 1")
        w.keep([r], images=None, policy=None)
        w.log._conn().execute("PRAGMA query_only = 0")
    a.flush(1.0)
    assert [r.decision_id for r in a.log.records()] == [ra.decision_id]
    assert b.log.count() == 0 and b.journal.read().n_rows == 1  # b's row waits for b
    b.flush(1.0)
    assert [r.decision_id for r in b.log.records()] == [rb.decision_id]
    for w in (a, b):
        w.close()
        w.log.close()


def test_a_torn_line_found_at_start_is_counted_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash's torn last line, found when the next process starts (the read that counts
    the journal sets it apart): counted in the status and said in the process's log."""
    log = DecisionLog(tmp_path / "log.sqlite")
    j = Journal(tmp_path / "j.journal", owner=str(log.path.resolve()))
    j.append([JournalEntry("rows", (make_record(0, label="UNSAFE", fail_closed=True),), None)])
    with j.path.open("ab") as fh:
        fh.write(b'deadbeef {"v": 1, "kind": "rows", "ro')  # killed mid-write
    w = LogWriter(log, LogOptions(journal=j.path))
    assert w.status().rejected_lines == 1
    assert "1 journal line(s) could not be read" in caplog.text
    w.flush(1.0)
    assert log.count() == 1 and w.status().rejected_lines == 1  # counted once
    w.close()
    log.close()


def test_a_journal_unreadable_at_start_counts_as_waiting_until_it_is_imported(
    tmp_path: Path,
) -> None:
    """Its rows are not known yet, so the status says something waits (the sidecar's watch
    then flushes on its own, with no check arriving), and the first flush after it can be read
    imports them."""
    log = DecisionLog(tmp_path / "log.sqlite")
    j = Journal(tmp_path / "j.journal", owner=str(log.path.resolve()))
    j.append([JournalEntry("rows", (make_record(i, label="UNSAFE"),), None) for i in range(3)])
    lock = j.path.with_name(j.path.name + ".lock")
    lock.unlink(missing_ok=True)
    lock.mkdir()  # the journal's lock cannot be taken: it cannot be read now
    w = LogWriter(log, LogOptions(journal=j.path))
    st = w.status()
    assert st.writable and st.journal_fault is not None and st.journal_rows == 0
    assert st.waiting
    lock.rmdir()  # ... and now it can
    w.flush(1.0)
    st = w.status()
    assert log.count() == 3 and st.journal_fault is None and not st.waiting
    w.close()
    log.close()


def test_the_journals_import_is_fsynced_even_on_a_normal_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal is emptied right after its rows are imported: under ``synchronous=NORMAL``
    a power cut could roll the import back after the journal is gone, so the import's commits
    are FULL (fsynced) whatever the log's setting, and the setting is restored after it."""
    log = DecisionLog(tmp_path / "log.sqlite", synchronous="NORMAL")
    j = Journal(tmp_path / "j.journal", owner=str(log.path.resolve()))
    j.append([JournalEntry("rows", (make_record(i, label="UNSAFE"),), None) for i in range(2)])
    seen: list[int] = []
    real = DecisionLog._write

    def watch(self, body, **k):  # type: ignore[no-untyped-def]
        seen.append(self._conn().execute("PRAGMA synchronous").fetchone()[0])
        return real(self, body, **k)

    monkeypatch.setattr(DecisionLog, "_write", watch)
    w = LogWriter(log, LogOptions(journal=j.path))
    w.flush(1.0)
    assert log.count() == 2 and seen and set(seen) == {2}  # 2: FULL
    assert log._conn().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL again
    w.write([make_record(5)], images=None, policy=None, timeout_s=1)
    assert seen[-1] == 1  # the log's own writes keep its setting
    w.close()
    log.close()
