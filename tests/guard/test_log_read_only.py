"""A log opened for reading only (``DecisionLog(path, read_only=True)``), as the card, calibrate
and the cue tools read a robot's log: nothing in it changes, and every row is read."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
from spotstop.guard import DecisionLog, LogError, read_reviewed
from spotstop.guard._log_schema import LOG_SCHEMA_VERSION, RecordError

from tests._support.records import make_record

_SCHEMA_4 = Path(__file__).parents[1] / "data" / "demo_log_schema4.sqlite"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _meta(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()


def test_reading_an_older_log_for_review_leaves_it_as_it_was(tmp_path: Path) -> None:
    """The card of a robot's schema-4 log is read through a migrated private copy: the robot's
    file keeps its bytes and its schema (before, reading it migrated it in place)."""
    path = tmp_path / "robot.sqlite"
    shutil.copyfile(_SCHEMA_4, path)
    before = _digest(path)
    arr = read_reviewed(path).arrays
    assert len(arr.decision_id) == 24
    # what the migration gives, read from the copy: each rule's deciding kind
    assert set(arr.deciding_kind.tolist()) == {"conformal", "situation", "frozen"}
    assert _digest(path) == before
    assert _meta(path)["schema_version"] == "4"
    with DecisionLog(path, read_only=True) as log:
        assert log.count() == 24 and log.read_only
        private = log._open_path
        assert private != path and private.is_file()
        assert _meta(private)["schema_version"] == str(LOG_SCHEMA_VERSION)
    assert not private.exists()  # the copy goes with the reader
    assert _digest(path) == before


def test_a_read_only_log_refuses_every_write_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    first = make_record(1)
    with DecisionLog(path) as log:
        log.append(first)
    before = _digest(path)
    with DecisionLog(path, read_only=True) as log:
        assert [r.decision_id for r in log.records()] == [first.decision_id]
        with pytest.raises(LogError, match="read-only") as err:
            log.append(make_record(2))
        assert err.value.kind == "read_only"
        with pytest.raises(LogError, match="read-only"):
            log.set_labels([(first.decision_id, "unsafe", None, None)])
        assert log.checkpoint() is False
        assert log.count() == 1
    assert _digest(path) == before
    with pytest.raises(RecordError, match="read_only"):
        DecisionLog(path, read_only=True, robot_id="r1")
    missing = tmp_path / "none.sqlite"
    with pytest.raises(LogError, match="does not exist"):
        DecisionLog(missing, read_only=True)
    assert not missing.exists()  # a reader never creates a log


def test_a_read_only_reader_sees_a_live_writer_s_rows_and_does_not_block_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.sqlite"
    with DecisionLog(path) as writer:
        writer.append(make_record(1))
        with DecisionLog(path, read_only=True) as reader:
            assert reader.count() == 1
            with reader._snapshot():  # a read transaction open while the robot writes
                writer.append(make_record(2), timeout_s=1.0)
            assert reader.count() == 2


def _log_with_a_wal_row(src: Path, dst: Path) -> list:
    """``dst/log.sqlite`` and its -wal, copied while a writer held them: its second row is in
    the -wal only (no -shm is copied). Returns the two records."""
    src.mkdir()
    dst.mkdir()
    recs = [make_record(1), make_record(2)]
    with DecisionLog(src / "log.sqlite") as log:
        log.append(recs[0])
        log.checkpoint()
        log._conn().execute("PRAGMA wal_autocheckpoint = 0")
        log.append(recs[1])  # in the -wal only
        shutil.copyfile(src / "log.sqlite", dst / "log.sqlite")
        shutil.copyfile(src / "log.sqlite-wal", dst / "log.sqlite-wal")
    return recs


def test_a_log_sqlite_cannot_open_in_place_is_read_with_its_wal_rows(tmp_path: Path) -> None:
    """SQLite reads a WAL log read-only only when it can open or create its -shm file (a
    read-only folder, a copied log, cannot): the reader reads a copy of the file and its -wal,
    rows that only the -wal holds included. A folder standing where the -shm file goes
    makes SQLite fail here the same way, as root too."""
    frozen = tmp_path / "frozen"
    recs = _log_with_a_wal_row(tmp_path / "src", frozen)
    path = frozen / "log.sqlite"
    (frozen / "log.sqlite-shm").mkdir()
    files = {p.name: _digest(p) for p in frozen.iterdir() if p.is_file()}
    main_only = sqlite3.connect(f"file:{path}?immutable=1", uri=True)  # the -wal not read
    assert main_only.execute("SELECT count(*) FROM decisions").fetchone() == (1,)
    main_only.close()
    with pytest.raises(LogError):  # what reading it in place gives
        DecisionLog(path)
    ids = read_reviewed(path).arrays.decision_id.tolist()
    assert ids == [r.decision_id for r in recs]
    assert {p.name: _digest(p) for p in frozen.iterdir() if p.is_file()} == files


def test_a_database_that_is_no_decision_log_is_refused_read_only(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(LogError, match="not a spotstop decision log"):
        DecisionLog(other, read_only=True)
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(LogError, match="no decision log"):
        DecisionLog(empty, read_only=True)
    assert empty.read_bytes() == b""


def _listing(folder: Path) -> dict[str, str]:
    return {p.name: _digest(p) for p in folder.iterdir()}


def test_reading_a_closed_log_leaves_nothing_beside_it(tmp_path: Path) -> None:
    """Read in place, SQLite created -shm and -wal files beside a log no one held, owned by
    the reviewer: a guard running as another user could then not open its own log (LogError
    "attempt to write a readonly database" at its next start). A log no connection holds is
    now read without them, its rows all there, and its folder as it was."""
    path = tmp_path / "robot.sqlite"
    recs = [make_record(i) for i in range(3)]
    with DecisionLog(path) as log:
        for r in recs:
            log.append(r)
    before = _listing(tmp_path)
    assert set(before) == {"robot.sqlite"}
    assert read_reviewed(path).arrays.decision_id.tolist() == [r.decision_id for r in recs]
    with DecisionLog(path, read_only=True) as log:
        assert log.count() == 3 and log.get(recs[1].decision_id) is not None
    assert _listing(tmp_path) == before


def test_a_crashed_writer_s_wal_rows_are_read_and_its_files_left_alone(tmp_path: Path) -> None:
    """A writer that died leaves its -wal (rows only it holds) and no -shm once its -shm is
    gone: the rows are read from a copy, and nothing is created beside the log."""
    robot = tmp_path / "robot"
    recs = _log_with_a_wal_row(tmp_path / "src", robot)
    before = _listing(robot)
    ids = read_reviewed(robot / "log.sqlite").arrays.decision_id.tolist()
    assert ids == [r.decision_id for r in recs]
    assert _listing(robot) == before


def test_a_log_written_while_read_with_no_writer_is_refused_then_read_again(
    tmp_path: Path, monkeypatch
) -> None:
    """A log no one held is read without SQLite's locks; a guard that opens and writes it
    meanwhile makes the next read refuse (LogChangedError), never answer from a file being
    rewritten; read_reviewed then reads it again, with the guard's locks."""
    from spotstop.guard import _reviewed
    from spotstop.guard._log import LogChangedError

    path = tmp_path / "robot.sqlite"
    with DecisionLog(path) as log:
        log.append(make_record(1))
    with DecisionLog(path, read_only=True) as reader:
        assert reader.count() == 1
        with DecisionLog(path) as guard:  # the guard starts, writes, and checkpoints on close
            guard.append(make_record(2))
        with pytest.raises(LogChangedError, match="changed while it was read"):
            reader.count()
    calls = []
    real = _reviewed._read_open

    def once_changed(log, pending):
        calls.append(log._unwatched is not None)
        if len(calls) == 1:
            raise LogChangedError("changed while it was read")
        return real(log, pending)

    monkeypatch.setattr(_reviewed, "_read_open", once_changed)
    assert len(read_reviewed(path).arrays.decision_id) == 2
    assert calls == [True, True]


def _guard_writes(path: Path, first: int) -> None:
    """A guard run beside the reader (``spotstop check`` per action): it opens the log, writes
    and closes it, its close copying its rows into the log's file (a new page at least)."""
    with DecisionLog(path) as guard:
        guard.append_many([make_record(first + i, request="r" * 2000) for i in range(8)])


def test_a_read_torn_by_a_guard_is_said_as_a_change_and_read_again(tmp_path: Path) -> None:
    """A read without locks that meets pages a guard's checkpoint is writing got SQLite's
    "database disk image is malformed", a LogError that nothing reads again: the card beside
    a robot that runs `spotstop check` per action failed with it. It is a LogChangedError."""
    from spotstop.guard._log import LogChangedError

    path = tmp_path / "robot.sqlite"
    with DecisionLog(path) as log:
        log.append_many([make_record(i) for i in range(40)])
    with DecisionLog(path, read_only=True) as reader:
        size = path.stat().st_size
        with path.open("r+b") as fh:  # the guard's checkpoint, half done: pages rewritten
            fh.seek(4096)
            fh.write(b"\x5a" * (size - 4096 + 4096))
        with pytest.raises(LogChangedError, match="changed while it was read"):
            reader.count()


def test_a_card_beside_a_guard_that_writes_during_each_read_still_reads(
    tmp_path: Path, monkeypatch
) -> None:
    """read_reviewed read again once after a LogChangedError, again in place without locks, so
    a guard writing during that read as well (a long read of a big log beside `spotstop check`
    per action) failed the card. The second read reads a copy no guard changes meanwhile."""
    from spotstop.guard import _reviewed

    path = tmp_path / "robot.sqlite"
    with DecisionLog(path) as log:
        log.append_many([make_record(i) for i in range(5)])
    real = _reviewed._read_open
    writes = []

    def guard_writes_meanwhile(log, pending):
        _guard_writes(path, 100 * (len(writes) + 1))
        writes.append(log._unwatched is not None)
        return real(log, pending)

    monkeypatch.setattr(_reviewed, "_read_open", guard_writes_meanwhile)
    before = {p.name for p in tmp_path.iterdir()}
    arr = read_reviewed(path).arrays
    assert writes == [True, True]  # both reads began with no guard holding the log
    assert len(arr.decision_id) == 5 + 8  # the copy: the log as the first guard left it
    assert len(set(arr.decision_id.tolist())) == len(arr.decision_id)
    assert {p.name for p in tmp_path.iterdir()} == before  # and nothing beside the log


def test_an_older_log_with_archives_is_read_without_a_false_warning(tmp_path: Path, caplog) -> None:
    """A schema-4 log with archives (schema 4 added them) is read through a migrated copy;
    the copy was migrated by opening it as a guard's log, which looked for the archives beside
    the copy, found none, and warned "decision log /tmp/spotstop-log-.../robot.sqlite:
    archived positions not read" on every card of such a log."""
    import logging
    import time

    from spotstop.guard._log import Protect, Retention

    path = tmp_path / "robot.sqlite"
    old = time.time() - 40 * 86400
    with DecisionLog(path) as log:
        log.append_many([make_record(i, time=old + i) for i in range(6)])
        log.apply_retention(Retention(keep_days=1), Protect(min_age_s=0, review=False))
        assert log.archives()
    with sqlite3.connect(path) as c:  # as spotstop of log schema 4 left it
        c.execute("ALTER TABLE decisions DROP COLUMN deciding_kind")
        c.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
        c.execute("DELETE FROM meta WHERE key = 'archived_seq_max'")
    c.close()
    with caplog.at_level(logging.WARNING, logger="spotstop.guard"):
        arr = read_reviewed(path).arrays
    assert len(arr.decision_id) == 6
    assert not [r.getMessage() for r in caplog.records]
    assert _meta(path)["schema_version"] == "4"
