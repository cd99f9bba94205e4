"""A fail-closed amendment is one rule, and every reader of the log and its archives applies it.

A SAFE decision whose write ended after the call's deadline was answered fail-closed UNSAFE;
the log amends its row (``DecisionLog.mark_fail_closed``). While the log cannot take the
amendment it waits in the journal, or for good in the dead letter: the store's own reads
(``records``, ``get``, ``to_arrays``, the CSV and Parquet exports) and the archives a retention
pass writes must still say UNSAFE, with the log's own rule (``_log_amend.py``).
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spotstop.guard import _log_amend as amend_rule
from spotstop.guard import read_reviewed
from spotstop.guard._journal import DeadLetter, Journal, JournalEntry, default_journal_path
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import Protect, Retention, read_archive_file
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_pending import PendingChanges
from spotstop.guard._log_schema import COLUMNS, LogError, RecordError
from spotstop.guard._log_writer import LogWriter
from spotstop.guard._record import record_from_row

from tests._support.records import assert_same_record, make_record

_REASON = "deadline exceeded (writing the decision log)"
_DAY = 86400.0


def _rows(log: DecisionLog) -> list[tuple[Any, ...]]:
    sql = f"SELECT {', '.join(COLUMNS)} FROM decisions ORDER BY rowid"
    return [tuple(r) for r in log._conn().execute(sql).fetchall()]


def _dead_letter(log: Path) -> DeadLetter:
    return DeadLetter(log.with_name(log.name + ".dead-letter.jsonl"), log=str(log))


# -- one rule: the log's UPDATE and a reader's application are derived from one declaration --

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_row = st.tuples(
    st.sampled_from(["SAFE", "UNSAFE"]),
    st.booleans(),  # fail_closed, for an UNSAFE row
    st.none() | _text,  # fail_reason
    st.booleans(),  # amended
)


@settings(max_examples=40, deadline=None)
@given(cases=st.lists(_row, min_size=1, max_size=8), reason=_text)
def test_the_log_s_update_and_a_reader_s_application_agree(
    cases: list[tuple[str, bool, str | None, bool]], reason: str
) -> None:
    with tempfile.TemporaryDirectory() as folder, DecisionLog(Path(folder) / "l.sqlite") as log:
        recs = [
            make_record(i, label=lab, fail_closed=lab == "UNSAFE" and fc, fail_reason=why)
            for i, (lab, fc, why, _) in enumerate(cases)
        ]
        log.append_many(recs)
        ids = [r.decision_id for r, case in zip(recs, cases, strict=True) if case[3]]
        stored = _rows(log)
        pending = PendingChanges(((tuple(ids), reason),), frozenset(), frozenset())
        read, changed = pending.amend_rows(stored)  # a reader's, while the amendment waits

        log.mark_fail_closed(ids, reason)  # the log's, once it can take it
        assert read == _rows(log)
        assert changed == tuple(
            r.decision_id for r in recs if r.decision_id in ids and r.label == "SAFE"
        )
        for rec, row in zip(log.records(raw=True), read, strict=True):
            assert_same_record(rec, record_from_row(row))


def test_both_applications_follow_the_one_declaration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the UPDATE nor the reader's application spells the change itself: a change of
    the declaration changes both."""
    declared = amend_rule.amendment
    monkeypatch.setattr(
        amend_rule, "amendment", lambda reason: {**declared(reason), "policy": "amended"}
    )
    with DecisionLog(tmp_path / "l.sqlite") as log:
        rec = make_record(0, label="SAFE")
        log.append(rec)
        [stored] = _rows(log)
        pending = PendingChanges((((rec.decision_id,), "late"),), frozenset(), frozenset())
        read = pending.amend(stored)
        log.mark_fail_closed([rec.decision_id], "late")
        assert read == _rows(log)[0]
        assert log.get(rec.decision_id, raw=True).policy == "amended"  # type: ignore[union-attr]


# -- the store's reads: records, get, arrays, exports -----------------------------------------


def _late_log(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A log of three SAFE rows: one amended by the dead letter, one by the default journal
    (both as the guard's writer leaves them when the log cannot take the change)."""
    log = tmp_path / "log.sqlite"
    dead_late, journal_late, other = (make_record(i, label="SAFE") for i in (0, 2, 4))
    with DecisionLog(log) as d:
        d.append_many([dead_late, journal_late, other])
    _dead_letter(log).append(
        "amend", error="x", amend_ids=[dead_late.decision_id], amend_reason=_REASON
    )
    Journal(default_journal_path(log), owner=str(log.resolve())).append(
        [JournalEntry("amend", amend_ids=(journal_late.decision_id,), amend_reason="late")]
    )
    return log, dead_late.decision_id, journal_late.decision_id, other.decision_id


@pytest.mark.parametrize("read_only", [False, True])
def test_records_get_and_arrays_are_as_the_robot_was_answered(
    tmp_path: Path, read_only: bool
) -> None:
    log, dead, journal, other = _late_log(tmp_path)
    want = {dead: ("UNSAFE", True, _REASON), journal: ("UNSAFE", True, "late")}
    # opened for writing, the log applies its dead letter's amendments to its rows
    # (test_log_dead_letter.py): the row stored says UNSAFE too; a reader changes nothing
    stored = {dead: "SAFE" if read_only else "UNSAFE", journal: "SAFE", other: "SAFE"}
    with DecisionLog(log, read_only=read_only) as d:
        got = {r.decision_id: (r.label, r.fail_closed, r.fail_reason) for r in d.records()}
        assert got == {**want, other: ("SAFE", False, None)}
        for i, answered in want.items():
            r = d.get(i)
            assert r is not None and (r.label, r.fail_closed, r.fail_reason) == answered
            assert d.get(i, raw=True).label == stored[i]  # type: ignore[union-attr]
        arr = d.to_arrays()
        assert dict(zip(arr.decision_id, arr.guard_label.tolist(), strict=True)) == {
            dead: 1,
            journal: 1,
            other: 0,
        }
        assert arr.fail_closed.tolist() == [True, True, False]
        assert d.to_arrays(raw=True).guard_label.tolist() == [
            int(stored[i] == "UNSAFE") for i in (dead, journal, other)
        ]
        assert [r.label for r in d.records(raw=True)] == [stored[i] for i in (dead, journal, other)]
        with pytest.raises(RecordError, match=r"raw must be False .* or True"):
            d.get(dead, raw="no")  # type: ignore[arg-type]


def test_the_exports_are_as_answered_and_a_raw_one_says_so(tmp_path: Path) -> None:
    log, dead, journal, other = _late_log(tmp_path)
    with DecisionLog(log, read_only=True) as d:
        d.export_csv(tmp_path / "a.csv")
        d.export_csv(tmp_path / "raw.csv", raw=True)
        d.export_parquet(tmp_path / "a.parquet")
        d.export_parquet(tmp_path / "raw.parquet", raw=True)

    def csv_rows(name: str) -> dict[str, tuple[str, str]]:
        with (tmp_path / name).open(newline="") as fh:
            return {r["decision_id"]: (r["label"], r["fail_closed"]) for r in csv.DictReader(fh)}

    assert csv_rows("a.csv") == {
        dead: ("UNSAFE", "true"),
        journal: ("UNSAFE", "true"),
        other: ("SAFE", "false"),
    }
    assert {v for v in csv_rows("raw.csv").values()} == {("SAFE", "false")}
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.column("label").to_pylist() == ["UNSAFE", "UNSAFE", "SAFE"]
    assert table.schema.metadata[b"spotstop.rows"] == b"as_answered"
    raw = pq.read_table(tmp_path / "raw.parquet")
    assert raw.column("label").to_pylist() == ["SAFE"] * 3
    assert raw.schema.metadata[b"spotstop.rows"] == b"raw"


def test_a_raw_csv_export_says_it_is_raw_in_every_row(tmp_path: Path) -> None:
    """The repro: a CSV export written with raw=True (the rows as stored: a SAFE there may
    have been answered UNSAFE) could not say so (the Parquet one says it in its metadata);
    read later, or passed on, it was taken for what the robot was answered. Every row of
    either export now says what it is, in the last column (a plain column: CSV readers
    read it as any other)."""
    log, *_ = _late_log(tmp_path)
    with DecisionLog(log, read_only=True) as d:
        d.export_csv(tmp_path / "a.csv")
        d.export_csv(tmp_path / "raw.csv", raw=True)
        d.export_parquet(tmp_path / "raw.parquet", raw=True)
    for name, rows in (("a.csv", "as_answered"), ("raw.csv", "raw")):
        with (tmp_path / name).open(newline="") as fh:
            header, *body = list(csv.reader(fh))
        assert header[-1] == "export_rows" and len(body) == 3
        assert {r[-1] for r in body} == {rows}
    table = pq.read_table(tmp_path / "raw.parquet")
    assert table.column("export_rows").to_pylist() == ["raw"] * 3


def test_a_journal_that_cannot_be_read_is_said_and_the_log_still_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, *_ = _late_log(tmp_path)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with DecisionLog(log, read_only=True, journal=folder) as d:
        assert [r.label for r in d.records()] == ["UNSAFE", "SAFE", "SAFE"]  # the dead letter's
    assert "a-folder" in caplog.text and "not applied" in caplog.text


def test_the_guard_s_own_journal_is_read_by_its_log(tmp_path: Path) -> None:
    """A guard with a ``--journal`` elsewhere: its log's reads apply what waits there."""
    log = tmp_path / "log.sqlite"
    w = LogWriter(
        DecisionLog(log), LogOptions(journal=tmp_path / "j" / "x.journal", spill_after_s=3600.0)
    )
    late = make_record(0, label="SAFE")
    w.log.append(late)
    w.log._conn().execute("PRAGMA query_only = 1")  # the log cannot take the amendment
    assert w.amend_late([late.decision_id], _REASON)
    assert w.status().journal_entries == 1
    assert w.log.get(late.decision_id).label == "UNSAFE"  # type: ignore[union-attr]
    assert w.log.get(late.decision_id, raw=True).label == "SAFE"  # type: ignore[union-attr]
    w.log._conn().execute("PRAGMA query_only = 0")
    w.close()
    w.log.close()


# -- archives ----------------------------------------------------------------------------------


def test_an_archived_row_whose_amendment_came_later_is_read_as_answered(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4)]
    with DecisionLog(log) as d:
        d.append_many(recs)
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[2].time + _DAY)
        assert d.count() == 3 and len(d.archived_ids()) == 2
        _dead_letter(log).append(
            "amend", error="x", amend_ids=[recs[0].decision_id], amend_reason=_REASON
        )
        assert d.get(recs[0].decision_id).label == "UNSAFE"  # type: ignore[union-attr]
        assert [r.label for r in d.records()] == ["UNSAFE", "SAFE", "SAFE"]
        assert d.to_arrays().guard_label.tolist() == [1, 0, 0]
        d.export_parquet(tmp_path / "a.parquet")
        assert pq.read_table(tmp_path / "a.parquet").column("label").to_pylist() == [
            "UNSAFE",
            "SAFE",
            "SAFE",
        ]


def test_retention_archives_a_dead_letter_amended_row_as_answered(tmp_path: Path) -> None:
    """The repro: an amendment the log could not take lies in the dead letter (its row says
    SAFE); retention moved the row to an archive as SAFE, and a fleet's collected archive,
    read without its log, said SAFE for a decision the robot was answered UNSAFE."""
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4)]
    late = recs[0].decision_id
    with DecisionLog(log) as d:
        d.append_many(recs)
    _dead_letter(log).append("amend", error="x", amend_ids=[late], amend_reason=_REASON)
    w = LogWriter(DecisionLog(log), LogOptions(keep_days=1.0))
    result = w.apply_retention(now=recs[2].time + _DAY)
    assert result.archived_rows == 2 and late in w.log.archived_ids()

    [name] = result.files
    archived = read_archive_file(w.log.archive_folder / name)
    got = {r[COLUMNS.index("decision_id")]: record_from_row(r) for r in archived.rows}
    assert (got[late].label, got[late].fail_closed, got[late].fail_reason) == (
        "UNSAFE",
        True,
        _REASON,
    )
    assert got[recs[1].decision_id].label == "SAFE"
    # the log reads it so, raw too (the archive holds it as answered)
    assert w.log.get(late, raw=True).label == "UNSAFE"  # type: ignore[union-attr]
    assert read_reviewed(log).arrays.guard_label.tolist() == [1, 0, 0]
    w.close()
    w.log.close()


def test_retention_archives_nothing_when_the_dead_letter_cannot_be_read(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4)]
    _dead_letter(log).path.mkdir()  # a folder where the dead letter should be
    with DecisionLog(log) as d:
        d.append_many(recs)
        with pytest.raises(LogError, match="retention archived nothing: dead letter"):
            d.apply_retention(
                Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[2].time + _DAY
            )
        assert d.archives() == [] and d.count() == 3


def test_an_amendment_of_known_and_unknown_ids_amends_the_known_rows_in_the_store(
    tmp_path: Path,
) -> None:
    """The repro: a journal amendment listing a logged SAFE row and an id the live log does not
    hold went whole to the dead letter, and the stored row (read from the sqlite file
    directly, e.g. by DuckDB) stayed SAFE. Now the known row is amended in the log and only
    the unknown id is set aside."""
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2)]
    with DecisionLog(log) as d:
        d.append_many(recs)
    late = recs[0].decision_id
    Journal(default_journal_path(log), owner=str(log.resolve())).append(
        [JournalEntry("amend", amend_ids=(late, "never-logged"), amend_reason=_REASON)]
    )
    w = LogWriter(DecisionLog(log), LogOptions())
    w.flush()
    w.close()
    w.log.close()
    with DecisionLog(log, read_only=True) as d:
        stored = d.get(late, raw=True)
        assert stored is not None
        assert (stored.label, stored.fail_closed, stored.fail_reason) == ("UNSAFE", True, _REASON)
        assert d.get(recs[1].decision_id, raw=True).label == "SAFE"  # type: ignore[union-attr]
    assert _dead_letter(log).changes().amendments == ((("never-logged",), _REASON),)


def test_mark_fail_closed_skip_unknown_returns_the_unknown_ids(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "log.sqlite") as d:
        rec = make_record(0, label="SAFE")
        d.append_many([rec])
        known = rec.decision_id
        with pytest.raises(RecordError, match="unknown decision_id 'x'; nothing changed"):
            d.mark_fail_closed([known, "x"], _REASON)
        assert d.get(known, raw=True).label == "SAFE"  # type: ignore[union-attr]
        assert d.mark_fail_closed([known, "x", "y"], _REASON, skip_unknown=True) == ("x", "y")
        assert d.get(known, raw=True).label == "UNSAFE"  # type: ignore[union-attr]


def _archived_log(tmp_path: Path) -> tuple[Path, list[Any]]:
    """A log of three SAFE rows, the two oldest archived."""
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4)]
    with DecisionLog(log) as d:
        d.append_many(recs)
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[2].time + _DAY)
        assert len(d.archived_ids()) == 2
    return log, recs


def _answers(path: Path) -> dict[str, tuple[str, bool, str | None]]:
    rows = read_archive_file(path).rows
    recs = [record_from_row(r) for r in rows]
    return {r.decision_id: (r.label, r.fail_closed, r.fail_reason) for r in recs}


def test_an_amendment_that_comes_after_its_row_was_archived_rewrites_the_archive(
    tmp_path: Path,
) -> None:
    """The repro: an amendment that reached the log after its row was archived found no live
    row ("unknown", dead-lettered); the archive file, read on its own (a fleet's collected
    archives, ``spotstop card`` on a folder of them), said SAFE for a decision the robot was
    answered UNSAFE. Now the archive is written again with the row amended, registered in the
    old file's place, and the old file removed."""
    from spotstop.diagnostics._fleet import read_fleet

    log, recs = _archived_log(tmp_path)
    late, other = recs[0].decision_id, recs[1].decision_id
    folder = log.with_name(log.name + ".archive")
    [old_file] = folder.glob("*.parquet")
    collected = tmp_path / "collected"
    collected.mkdir()
    (collected / old_file.name).write_bytes(old_file.read_bytes())  # a collector's earlier copy
    with DecisionLog(log) as d:
        [old] = d.archives()
        assert d.mark_fail_closed([late], _REASON) == ()
        [new] = d.archives()
        assert new.name != old.name and new.sha256 != old.sha256
        assert (new.n_rows, new.first_time, new.last_time) == (
            old.n_rows,
            old.first_time,
            old.last_time,
        )
        stored = d.get(late, raw=True)  # the archive itself holds it as answered
        assert stored is not None and (stored.label, stored.fail_reason) == ("UNSAFE", _REASON)
        assert [r.label for r in d.records(raw=True)] == ["UNSAFE", "SAFE", "SAFE"]
        # an UNSAFE row stays as it is; `other` (SAFE) is amended: the file is written again
        assert d.mark_fail_closed([late, other], "later", skip_unknown=True) == ()
        [newer] = d.archives()
        assert newer.name != new.name
    assert [p.name for p in folder.glob("*.parquet")] == [newer.name]
    assert _answers(folder / newer.name) == {
        late: ("UNSAFE", True, _REASON),
        other: ("UNSAFE", True, "later"),
    }
    assert read_archive_file(folder / newer.name).replaces == (old.name, new.name)
    assert not _dead_letter(log).path.exists()
    # a fleet's card on the collected archives, with the old copy and the new one beside it
    (collected / newer.name).write_bytes((folder / newer.name).read_bytes())
    data = read_fleet([collected])
    assert data.arrays.guard_label.tolist() == [1, 1]
    assert data.arrays.fail_closed.tolist() == [True, True]


def test_retention_without_the_writer_then_the_guard_s_import_amends_the_archive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The repro: a retention pass run on the log alone (not the guard's writer, which
    protects what its ``--journal`` holds) archived a SAFE row whose amendment waited in the
    guard's journal; the guard's import then found no live row, dead-lettered the amendment
    as unknown and said "the log may say SAFE". Now the import amends the archived row, the
    dead letter stays empty, and an id the log never held is said to be in no row."""
    log = tmp_path / "log.sqlite"
    journal = tmp_path / "j" / "guard.journal"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4)]
    late = recs[0].decision_id
    with DecisionLog(log) as d:
        d.append_many(recs)
    Journal(journal, owner=str(log.resolve())).append(
        [JournalEntry("amend", amend_ids=(late, "never-logged"), amend_reason=_REASON)]
    )
    with DecisionLog(log) as d:  # the log's own default journal is another file
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[2].time + _DAY)
        assert late in d.archived_ids()
    w = LogWriter(DecisionLog(log), LogOptions(journal=journal))
    w.flush()
    assert w.status().dead_letter_amendments == 1  # "never-logged" alone
    w.close()
    w.log.close()
    assert _dead_letter(log).changes().amendments == ((("never-logged",), _REASON),)
    [archive] = log.with_name(log.name + ".archive").glob("*.parquet")
    assert _answers(archive)[late] == ("UNSAFE", True, _REASON)
    assert "may say SAFE" not in caplog.text
    assert "holds neither live nor archived" in caplog.text and "never-logged" in caplog.text


def test_an_archived_id_is_no_unknown_id_and_an_unknown_one_changes_nothing(
    tmp_path: Path,
) -> None:
    log, recs = _archived_log(tmp_path)
    with DecisionLog(log) as d:
        names = [a.name for a in d.archives()]
        with pytest.raises(RecordError, match="unknown decision_id 'x'; nothing changed"):
            d.mark_fail_closed([recs[0].decision_id, recs[2].decision_id, "x"], _REASON)
        assert [a.name for a in d.archives()] == names
        assert [r.label for r in d.records(raw=True)] == ["SAFE"] * 3


def test_an_archive_that_cannot_be_amended_sets_its_ids_aside_and_holds_nothing_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An archive that is missing (moved away) cannot be amended, and trying again would not
    mend it: the guard's import amends the live row, sets the ids the archives may hold aside
    in the dead letter (saying the log may say SAFE), and empties its journal."""
    log, recs = _archived_log(tmp_path)
    archived, live = recs[0].decision_id, recs[2].decision_id
    [archive] = log.with_name(log.name + ".archive").glob("*.parquet")
    archive.unlink()
    with DecisionLog(log) as d, pytest.raises(LogError) as err:
        d.mark_fail_closed([archived], _REASON, skip_unknown=True)
    assert err.value.kind == "other" and err.value.ids == (archived,)  # type: ignore[attr-defined]
    Journal(default_journal_path(log), owner=str(log.resolve())).append(
        [JournalEntry("amend", amend_ids=(archived, live), amend_reason=_REASON)]
    )
    w = LogWriter(DecisionLog(log), LogOptions())
    w.flush()
    status = w.status()
    assert status.dead_letter_amendments == 1 and status.journal_entries == 0
    assert status.journal_fault is None
    w.close()
    w.log.close()
    assert _dead_letter(log).changes().amendments == (((archived,), _REASON),)
    with DecisionLog(log) as d:
        labels = {r[COLUMNS.index("decision_id")]: r[COLUMNS.index("label")] for r in _rows(d)}
    assert labels == {live: "UNSAFE"}
    assert "may say SAFE" in caplog.text


def test_an_archive_held_by_a_retention_pass_is_waited_for_then_amended(tmp_path: Path) -> None:
    log, recs = _archived_log(tmp_path)
    archived = recs[0].decision_id
    with DecisionLog(log) as a, DecisionLog(log) as b:
        with a._retention_lock():  # a pass under way (another process's, as far as b knows)
            with pytest.raises(LogError, match="held by a retention pass") as err:
                b.mark_fail_closed([archived], _REASON, timeout_s=0.05, skip_unknown=True)
            assert err.value.kind == "locked"
        assert b.mark_fail_closed([archived], _REASON) == ()
        assert b.get(archived, raw=True).label == "UNSAFE"  # type: ignore[union-attr]


def test_a_reader_whose_archive_was_replaced_while_read_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late amendment (the guard's, beside the card) replaces an archive after a reader
    listed the registrations and before it opened the file, which is gone: read_reviewed
    reads again, and gets the amended row."""
    from spotstop.guard import _log_read

    log, recs = _archived_log(tmp_path)
    archived = recs[0].decision_id
    real = _log_read.read_archive
    first = [True]

    def amended_meanwhile(folder: Path, info: Any) -> Any:
        if first[0]:
            first[0] = False
            with DecisionLog(log) as guard_s:
                guard_s.mark_fail_closed([archived], _REASON)
        return real(folder, info)

    monkeypatch.setattr(_log_read, "read_archive", amended_meanwhile)
    arr = read_reviewed(log).arrays
    assert not first[0]
    assert dict(zip(arr.decision_id, arr.guard_label.tolist(), strict=True))[archived] == 1
