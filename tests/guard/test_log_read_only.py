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


def test_a_log_sqlite_cannot_open_in_place_is_read_with_its_wal_rows(tmp_path: Path) -> None:
    """SQLite reads a WAL log read-only only when it can open or create its -shm file (a
    read-only folder, a copied log, cannot): the reader reads a copy of the file and its -wal,
    rows that only the -wal holds included. A folder standing where the -shm file goes
    makes SQLite fail here the same way, as root too."""
    src = tmp_path / "src" / "log.sqlite"
    src.parent.mkdir()
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    recs = [make_record(1), make_record(2)]
    with DecisionLog(src) as log:
        log.append(recs[0])
        log.checkpoint()
        log._conn().execute("PRAGMA wal_autocheckpoint = 0")
        log.append(recs[1])  # in the -wal only
        shutil.copyfile(src, frozen / "log.sqlite")
        shutil.copyfile(src.with_name("log.sqlite-wal"), frozen / "log.sqlite-wal")
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
