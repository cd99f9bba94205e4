"""Retention: the log's disk budget, its Parquet archives, and reading both as one log."""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.guard._log import DecisionLog, LogError, Protect, RecordError, Retention
from spotstop.guard._log_archive import SEQ_COLUMN, archive_folder, write_archive

from tests._support.records import assert_same_record, make_record

T0 = 1_700_000_000.0
DAY = 86400.0


def _fill(log: DecisionLog, n: int, *, t0: float = T0, step: float = 60.0, **kw: Any) -> list[str]:
    """``n`` decisions a ``step`` apart (some NaN and infinite scores among them)."""
    recs = []
    for i in range(n):
        extra = {"fused_score": math.nan} if i % 7 == 0 else {}
        if i % 11 == 0:
            extra["member_scores"] = {"qwen": math.inf, "smol": -math.inf}
        recs.append(
            make_record(i, time=t0 + i * step, request=f"req {i} " + "y" * 300, **extra, **kw)
        )
    for start in range(0, n, 100):
        log.append_many(recs[start : start + 100])
    return [r.decision_id for r in recs]


@pytest.fixture
def big_log(tmp_path: Path) -> tuple[DecisionLog, list[Any]]:
    log = DecisionLog(tmp_path / "decisions.sqlite", store_images=True)
    _fill(log, 600)
    before = list(log.records())
    yield log, before
    log.close()


def test_over_budget_archives_oldest_first_and_reads_back_as_one_log(big_log) -> None:
    log, before = big_log
    used = log.used_bytes()
    budget = used // 3
    res = log.apply_retention(Retention(max_bytes=budget))
    assert res.archived_rows > 0 and res.files and not res.over_budget
    assert res.bytes_before == used and res.bytes_after <= budget
    live = log._fetchall("SELECT decision_id, time FROM decisions ORDER BY time", [])
    archived = log.archived_ids()
    assert len(live) + len(archived) == 600 and not archived & {r[0] for r in live}
    oldest_live = min(t for _, t in live)
    assert all(r.time < oldest_live for r in before if r.decision_id in archived)  # oldest first
    after = list(log.records())  # live + archives, in log order, the very same records
    assert len(after) == 600
    for a, b in zip(before, after, strict=True):
        assert_same_record(a, b)
    assert log.count() == 600 and log.count(since=T0 + 100 * 60, until=T0 + 200 * 60) == 100
    sub = list(log.records(situation_id="sit-1"))
    assert [r.decision_id for r in sub] == [
        r.decision_id for r in before if r.situation_id == "sit-1"
    ]
    gone = next(iter(archived))
    got = log.get(gone)
    assert got is not None and got.decision_id == gone
    infos = log.archives()
    assert sum(a.n_rows for a in infos) == len(archived)
    assert all((log.archive_folder / a.name).is_file() for a in infos)


def test_arrays_and_exports_are_those_of_the_untrimmed_log(big_log, tmp_path: Path) -> None:
    log, _ = big_log
    log.set_labels([(r.decision_id, "unsafe", "c1", "rev") for r in list(log.records())[:50]])
    want = log.to_arrays()
    log.export_csv(tmp_path / "before.csv")
    log.apply_retention(Retention(max_bytes=log.used_bytes() // 4))
    assert log.archives()
    got = log.to_arrays()
    for f in dataclasses.fields(want):
        a, b = getattr(want, f.name), getattr(got, f.name)
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        elif a.dtype == object:
            assert list(a) == list(b), f.name
        else:
            np.testing.assert_array_equal(a, b)
    log.export_csv(tmp_path / "after.csv")
    assert (tmp_path / "after.csv").read_bytes() == (tmp_path / "before.csv").read_bytes()


def test_labels_attach_to_archived_decisions(big_log) -> None:
    log, before = big_log
    log.apply_retention(Retention(keep_days=1), now=T0 + 600 * 60 + DAY)  # all but the newest
    live = log._fetchall("SELECT decision_id FROM decisions", [])
    assert log.count() == 600 and live == [(before[-1].decision_id,)]
    first = before[0].decision_id
    log.set_labels([(first, "safe", None, "late reviewer")])
    arr = log.to_arrays()
    assert arr.label[list(arr.decision_id).index(first)] == 0
    with pytest.raises(RecordError, match="unknown decision_id 'nope'"):
        log.set_labels([("nope", "safe", None, None)])


def test_a_label_of_a_decision_archived_while_labels_are_written_is_written(
    big_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """set_labels read the archives' ids once when some ids were not live; a retention pass
    (the sidecar's thread) that archived another of its decisions before the labels' write
    made a valid label "unknown decision_id" (the sidecar: 422). It reads them again."""
    log, before = big_log
    log.apply_retention(Retention(keep_days=1), now=T0 + 100 * 60 + DAY)  # rows 0..99
    archived, live = before[0].decision_id, before[200].decision_id
    real = DecisionLog.archives
    armed = [True]

    def a_pass_right_after(self: DecisionLog) -> list[Any]:
        infos = real(self)
        if armed and armed.pop():  # the first listing set_labels reads the ids from
            log.apply_retention(Retention(keep_days=1), now=T0 + 300 * 60 + DAY)
        return infos

    monkeypatch.setattr(DecisionLog, "archives", a_pass_right_after)
    log.set_labels([(archived, "safe", None, "r"), (live, "unsafe", None, "r")])
    assert not armed  # the pass ran between the ids' reading and the labels' write
    assert not log._fetchall("SELECT 1 FROM decisions WHERE decision_id = ?", [live])
    arr = log.to_arrays()
    ids = list(arr.decision_id)
    assert arr.label[ids.index(archived)] == 0 and arr.label[ids.index(live)] == 1


def test_the_archived_count_read_with_a_log_is_that_of_its_rows(
    big_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_reviewed counted the archives (the card's provenance) after reading the rows: a
    retention pass in between (the guard's, beside the card) made it say 599 archived rows for
    rows read with 100 archived. The rows are read again until both agree."""
    from spotstop.guard import read_reviewed

    log, _ = big_log
    log.apply_retention(Retention(keep_days=1), now=T0 + 100 * 60 + DAY)  # rows 0..99
    real = DecisionLog.arrays_as_answered
    archived_when_read: list[int] = []

    def then_a_pass(self: DecisionLog, *a: Any, **kw: Any) -> Any:
        arr = real(self, *a, **kw)
        archived_when_read.append(len(self.archived_ids()))
        self.apply_retention(Retention(keep_days=1), now=T0 + 600 * 60 + DAY)  # all but one
        return arr

    monkeypatch.setattr(DecisionLog, "arrays_as_answered", then_a_pass)
    r = read_reviewed(log)
    assert r.arrays.n == 600
    assert r.archived["rows"] == archived_when_read[-1] == 599


def test_keep_days_archives_what_is_older_and_keeps_the_rest(big_log) -> None:
    log, before = big_log
    now = T0 + 300 * 60 + 2 * DAY  # rows 0..299 are older than 2 days, 300.. younger
    res = log.apply_retention(Retention(keep_days=2), now=now)
    assert res.archived_rows == 300 and res.max_bytes is None
    live = {r[0] for r in log._fetchall("SELECT decision_id FROM decisions", [])}
    assert live == {r.decision_id for r in before[300:]}
    again = log.apply_retention(Retention(keep_days=2), now=now)
    assert again.archived_rows == 0 and not again.files


def test_protected_rows_stay_and_an_unmeetable_budget_says_so(tmp_path: Path) -> None:
    import hashlib
    import time

    now = time.time() - 100  # stored images of recent decisions (image retention keeps 30 days)
    with DecisionLog(tmp_path / "log.sqlite", store_images=True) as log:
        recs = []
        for i in range(40):
            img = f"image {i}".encode()
            extra: dict[str, Any] = {}
            if i < 5:  # under review: stored image, no label yet
                extra = {"image_sha256": hashlib.sha256(img).hexdigest()}
            recs.append(
                make_record(
                    i,
                    time=now + i,
                    policy_version="v-active" if i >= 20 else "v-old",
                    policy_score=float(i),
                    **extra,
                )
            )
            log.append(recs[-1], img if i < 5 else None)
        log.set_labels([(recs[0].decision_id, "safe", None, None)])  # review of 0 is done
        protect = Protect(
            decision_ids=frozenset({recs[7].decision_id}), windows={"v-active": 2}, min_age_s=0
        )
        res = log.apply_retention(Retention(max_bytes=1), protect)
        live = {r[0] for r in log._fetchall("SELECT decision_id FROM decisions", [])}
        # in review (1..4), a pending amendment (7), the last 2 of each situation of v-active
        by_sit: dict[str, list[str]] = {}
        for r in recs[20:]:
            by_sit.setdefault(str(r.situation_id), []).append(r.decision_id)
        window = {i for ids in by_sit.values() for i in ids[-2:]}
        assert live == {r.decision_id for r in recs[1:5]} | {recs[7].decision_id} | window
        assert res.over_budget and res.protected_rows == len(live) and "OVER BUDGET" in repr(res)
        assert log.count() == 40


def test_a_pass_cut_short_leaves_an_orphan_that_no_reader_counts(big_log) -> None:
    log, _ = big_log
    rows = log._fetchall("SELECT rowid, * FROM decisions ORDER BY rowid LIMIT 10", [])
    info = write_archive(log.archive_folder, [r[0] for r in rows], [tuple(r[1:]) for r in rows])
    # the process died here, before the registering transaction: the rows are still live
    assert (log.archive_folder / info.name).is_file()
    assert log.count() == 600 and len(list(log.records())) == 600
    log.apply_retention(Retention(max_bytes=10**12))  # the next pass cleans up
    assert not (log.archive_folder / info.name).exists()


def test_a_registration_that_reports_an_error_keeps_its_file(
    big_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registering commit reported an error but committed (an I/O error at its fsync
    leaves valid frames in the WAL, which a crash's recovery replays; here it commits, then
    raises): the archive file stays, so the log reads back whole, each row once."""
    log, _ = big_log
    real = type(log)._write

    def commit_then_fail(self, body, *, what, **k):  # type: ignore[no-untyped-def]
        real(self, body, what=what, **k)
        if what == "register an archive":
            raise LogError("disk I/O error at the commit (injected)", "io_error")

    monkeypatch.setattr(type(log), "_write", commit_then_fail)
    with pytest.raises(LogError, match="injected"):
        log.apply_retention(Retention(max_bytes=log.used_bytes() // 2))
    monkeypatch.undo()
    [reg] = log.archives()
    assert (log.archive_folder / reg.name).is_file()
    ids = [r.decision_id for r in log.records()]
    assert len(ids) == len(set(ids)) == 600 and log.count() == 600


def test_orphans_are_removed_only_after_a_write_to_the_log(big_log) -> None:
    """A pass that cannot write the log removes no file (what it would read of the
    registrations might not be final); the next one that can removes the orphan."""
    log, _ = big_log
    rows = log._fetchall("SELECT rowid, * FROM decisions ORDER BY rowid LIMIT 10", [])
    info = write_archive(log.archive_folder, [r[0] for r in rows], [tuple(r[1:]) for r in rows])
    log._conn().execute("PRAGMA query_only = 1")
    with pytest.raises(LogError):  # a read-only log archives nothing either
        log.apply_retention(Retention(max_bytes=log.used_bytes() // 2))
    assert (log.archive_folder / info.name).is_file()
    log._conn().execute("PRAGMA query_only = 0")
    log.apply_retention(Retention(max_bytes=10**12))
    assert not (log.archive_folder / info.name).exists()


def test_a_missing_or_changed_archive_is_an_error_not_a_smaller_log(big_log) -> None:
    log, _ = big_log
    log.apply_retention(Retention(max_bytes=log.used_bytes() // 2))
    [first, *_] = log.archives()
    path = log.archive_folder / first.name
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(LogError, match=r"sha256 .*changed since it was written"):
        log.to_arrays()
    path.unlink()
    with pytest.raises(LogError, match="registered in the log but cannot be read"):
        list(log.records())
    with pytest.raises(LogError, match="cannot be read"):
        log.count()


def test_archives_are_plain_parquet_with_the_log_columns(big_log) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    log, _ = big_log
    log.apply_retention(Retention(max_bytes=log.used_bytes() // 2))
    table = pq.read_table(log.archive_folder / log.archives()[0].name)
    cols = [r[1] for r in log._fetchall("PRAGMA table_info(decisions)", [])]
    assert table.column_names == [SEQ_COLUMN, *cols]
    assert table.schema.metadata[b"spotstop.table"] == b"decisions"
    assert log.archive_folder == archive_folder(log.path) and log.archive_folder.name.endswith(
        ".sqlite.archive"
    )


def test_a_new_log_gives_freed_pages_back_to_the_file_system(big_log) -> None:
    log, _ = big_log
    log.checkpoint()
    before = log.path.stat().st_size
    log.apply_retention(Retention(max_bytes=log.used_bytes() // 4))
    assert log.path.stat().st_size < before / 2
    with sqlite3.connect(log.path) as c:
        assert c.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    c.close()


def test_retention_settings_name_the_bad_key() -> None:
    with pytest.raises(RecordError, match=r"max_bytes .*got -5"):
        Retention(max_bytes=-5)
    with pytest.raises(RecordError, match=r"keep_days .*got 0"):
        Retention(keep_days=0)
    with pytest.raises(RecordError, match=r"low_water must be in \(0, 1\]"):
        Retention(max_bytes=10, low_water=0.0)
    assert not Retention().active and Retention(keep_days=1).active


def test_young_decisions_are_never_archived_by_default(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "log.sqlite") as log:
        _fill(log, 20, t0=T0, step=60.0)  # 20 minutes of decisions
        res = log.apply_retention(Retention(max_bytes=1), now=T0 + 19 * 60 + 1)
        live = log._fetchall("SELECT time FROM decisions ORDER BY time", [])
        assert res.over_budget and len(live) == 10  # the last 10 minutes
        assert min(t for (t,) in live) >= T0 + 19 * 60 + 1 - 600


def test_arrays_from_rows_are_the_arrays_of_the_records(big_log) -> None:
    from spotstop.guard._log_read import log_arrays

    log, _ = big_log
    log.set_labels([(r.decision_id, "safe", "c", None) for r in list(log.records())[:40]])
    log.apply_retention(Retention(max_bytes=log.used_bytes() // 2))
    fast, slow = log.to_arrays(), log_arrays(log._joined_rows(None))
    for f in dataclasses.fields(fast):
        a, b = getattr(fast, f.name), getattr(slow, f.name)
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
                assert a[k].dtype == b[k].dtype
        else:
            assert a.dtype == b.dtype, f.name
            if a.dtype == object:
                assert list(a) == list(b), f.name
            else:
                np.testing.assert_array_equal(a, b)  # NaN equals NaN here


# -- retention beside what still waits (guard level) --------------------------------------


def _guard_for_retention(bundle: Path, tmp_path: Path, **opts: Any) -> Any:
    from spotstop.guard import Guard
    from spotstop.guard._log_options import LogOptions

    o = LogOptions(journal=tmp_path / "j.journal", keep_days=1, min_free_bytes=0, **opts)
    return Guard(bundle, log=tmp_path / "l.sqlite", deadline_s=None, log_options=o)


def test_retention_keeps_a_safe_row_whose_amendment_waits_in_the_journal(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SAFE row written past the deadline is answered UNSAFE; its amendment meets a busy log
    (injected) and goes to the journal. A retention pass two days on must not archive the
    row as SAFE: the journal's amendment lands on it, and the log says what was answered."""
    import time

    from tests._support.guard import make_scene

    g = _guard_for_retention(bundle_copy, tmp_path, spill_after_s=0.0)
    g.check(make_scene(0))
    real_append, real_mark = DecisionLog.append_many, DecisionLog.mark_fail_closed

    def slow_append(self, *a, **k):  # type: ignore[no-untyped-def]
        out = real_append(self, *a, **k)
        time.sleep(0.6)  # committed after the call's deadline
        return out

    busy = [1]

    def busy_mark(self, *a, **k):  # type: ignore[no-untyped-def]
        if busy[0]:
            busy[0] = 0
            raise LogError("database is locked (injected)", "locked")
        return real_mark(self, *a, **k)

    monkeypatch.setattr(DecisionLog, "append_many", slow_append)
    monkeypatch.setattr(DecisionLog, "mark_fail_closed", busy_mark)
    d = g.check(make_scene(1), deadline_s=0.5)
    monkeypatch.setattr(DecisionLog, "append_many", real_append)
    assert d.label == "UNSAFE" and g.log_status().journal_entries == 1
    assert g.log.get(d.decision_id, raw=True).label == "SAFE"  # until the amendment lands
    assert g.log.get(d.decision_id).label == "UNSAFE"  # read as answered meanwhile
    res = g._writer.apply_retention(now=time.time() + 2 * DAY)
    assert res.protected_rows >= 1
    g.flush_pending()
    assert g.log.get(d.decision_id).label == "UNSAFE"
    assert g.log_status().dead_letter_amendments == 0
    g.close()


def test_retention_keeps_a_row_that_waits_to_be_rewritten(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that committed its SAFE row and then failed (an error after COMMIT, injected)
    is answered UNSAFE and its fail-closed copy waits; retention leaves the live row for it."""
    import time

    from tests._support.guard import make_scene

    g = _guard_for_retention(bundle_copy, tmp_path)
    real = DecisionLog.append_many

    def commit_then_fail(self, *a, **k):  # type: ignore[no-untyped-def]
        real(self, *a, **k)
        raise OSError(5, "I/O error after COMMIT (injected)")

    monkeypatch.setattr(DecisionLog, "append_many", commit_then_fail)
    d = g.check(make_scene(1))
    monkeypatch.setattr(DecisionLog, "append_many", real)
    # the commit's outcome is unknown (a crash may bring the SAFE row back): the fail-closed
    # copy went to the journal at once, whose import amends the row
    status = g.log_status()
    assert d.fail_closed and status.pending_rows == 0 and status.journal_rows == 1
    assert g._writer.apply_retention(now=time.time() + 2 * DAY).archived_rows == 0
    g.flush_pending()
    assert g.log.get(d.decision_id).label == "UNSAFE"
    g.close()


def test_background_passes_do_not_keep_a_connection_each(tmp_path: Path) -> None:
    # each background pass runs on a thread of its own, whose connection (two descriptors)
    # stayed open until the log was closed: a guard with a budget gained two a minute
    from spotstop.guard._log_options import LogOptions
    from spotstop.guard._log_writer import LogWriter

    log = DecisionLog(tmp_path / "decisions.sqlite")
    opts = LogOptions(journal=tmp_path / "j", keep_days=30, retention_every_s=0.0)
    writer = LogWriter(log, opts)
    try:
        for i in range(30):
            assert writer.write([make_record(i)], images=None, policy=None, timeout_s=None) is None
            t = writer._retention_thread
            assert t is not None
            t.join()  # this write's pass is over
        assert len(log._connections) <= 3  # this thread's and the last pass's
    finally:
        writer.close()
        log.close()
