"""Tests of the decision log (guard/_log.py): round trip, schema, labels, arrays, concurrency,
crash safety, image retention and export."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import hashlib
import math
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.guard._errors import GuardError
from spotstop.guard._log import (
    SCHEMA_VERSION,
    DecisionLog,
    DecisionRecord,
    LogArrays,
    LogError,
    RecordError,
)
from spotstop.guard._log_schema import COLUMNS, LOG_SCHEMA_VERSION

from tests._support import REPO_ROOT
from tests._support.records import assert_same_record, make_record


@pytest.fixture
def log(tmp_path: Path):
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        yield lg


# -- round trip and schema -------------------------------------------------------------


def test_round_trip_nan_inf_none_unicode(log: DecisionLog) -> None:
    rec = DecisionRecord(
        request="Schneide das Brot 🍞 — «vorsichtig», 日本語\n'quote\" ; DROP TABLE decisions",
        member_scores={"qwen": math.nan, "smol": math.inf, "third": -math.inf, "ok": 1e-300},
        member_scores_gray={"qwen": -0.0, "smol": math.nan},
        member_scores_text=None,
        fused_score=math.nan,
        threshold=math.nan,
        policy="conformal",
        label="UNSAFE",
        fail_closed=True,
        fail_reason="ScoringError: non-finite score from member 'qwen'",
        latency_ms={"total": math.nan, "decode": 0.0},
        bundle_id="b",
        prompt_hash="h",
    )
    assert rec.situation_id is None and rec.image_sha256 is None and rec.width is None
    log.append(rec)
    back = log.get(rec.decision_id)
    assert back is not None
    assert_same_record(rec, back)
    assert math.isnan(back.fused_score) and math.isnan(back.member_scores["qwen"])
    assert back.member_scores["smol"] == math.inf and back.member_scores["third"] == -math.inf
    assert back.schema_version == SCHEMA_VERSION == 4
    assert [r.decision_id for r in log.records()] == [rec.decision_id]
    assert log.get("no-such-id") is None


def test_round_trip_all_fields_and_inf_scalars(log: DecisionLog) -> None:
    rec = make_record(
        7,
        image_sha256="e3b0" * 16,
        width=640,
        height=480,
        n_bytes=123_456,
        image_format="JPEG",
        member_scores_gray={"qwen": 0.1, "smol": 0.2},
        member_scores_text={"qwen": -3.0, "smol": math.nan},
        fused_score=math.inf,
        threshold=-math.inf,
    )
    log.append(rec)
    back = log.get(rec.decision_id)
    assert back is not None
    assert_same_record(rec, back)
    assert back.time_utc.startswith("2023-11-14T22:13:27")
    assert back.time_utc.endswith("+00:00")


def test_defaults_give_fresh_ids_and_now() -> None:
    t0 = time.time()
    a, b = make_record(time=time.time()), make_record(time=time.time())
    assert a.decision_id != b.decision_id and len(a.decision_id) == 32
    int(a.decision_id, 16)
    assert abs(a.time - t0) < 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.label = "SAFE"  # type: ignore[misc]


def test_schema_version_recorded_and_newer_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    DecisionLog(path).close()
    with sqlite3.connect(path) as conn:
        (value,) = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(value) == LOG_SCHEMA_VERSION == 5  # the tables' version, apart from the record's
        conn.execute(
            "UPDATE meta SET value = ? WHERE key='schema_version'", (LOG_SCHEMA_VERSION + 1,)
        )
    conn.close()
    with pytest.raises(LogError, match=r"schema_version 6.*reads schema_version 5.*Upgrade"):
        DecisionLog(path)
    assert issubclass(LogError, GuardError) and issubclass(LogError, RuntimeError)


def test_reopen_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with DecisionLog(path) as lg:
        lg.append_many([make_record(i) for i in range(5)])
    with DecisionLog(path) as lg:
        assert lg.count() == 5


def test_foreign_files_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(LogError, match="not a spotstop decision log"):
        DecisionLog(other)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(LogError, match="not a database"):
        DecisionLog(junk)
    with pytest.raises(RecordError, match="must be a file path"):
        DecisionLog(":memory:")


def test_wal_mode_and_synchronous(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with DecisionLog(path) as lg:
        lg.append(make_record())
        conn = lg._conn()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with sqlite3.connect(path) as raw:  # WAL is persistent in the file
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    with DecisionLog(path, synchronous="FULL") as lg:
        assert lg._conn().execute("PRAGMA synchronous").fetchone()[0] == 2


def test_closed_log_and_context_manager(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        lg.append(make_record())
    with pytest.raises(LogError, match="is closed"):
        lg.append(make_record(1))
    with pytest.raises(LogError, match="is closed"):
        lg.count()
    lg.close()  # idempotent


def test_record_validation_messages() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"label": "safe"}, r"label must be one of \['SAFE', 'UNSAFE'\]; got 'safe'"),
        ({"time": math.nan}, r"time must be a finite float"),
        ({"member_scores": [1.0]}, r"member_scores must be a dict of name -> float"),
        ({"member_scores": {"a": "x"}}, r"member_scores\['a'\] must be a real number"),
        ({"member_scores_gray": {"": 1.0}}, r"member_scores_gray keys must be non-empty"),
        ({"latency_ms": {"total": None}}, r"latency_ms\['total'\] must be a real number"),
        ({"fused_score": None}, r"fused_score must be a float \(NaN allowed\)"),
        ({"width": -1}, r"width must be a non-negative int or None; got -1"),
        ({"n_bytes": 1.5}, r"n_bytes must be a non-negative int"),
        ({"fail_closed": 1}, r"fail_closed must be a bool"),
        ({"request": None}, r"request must be a str"),
        ({"situation_id": 3}, r"situation_id must be a str or None"),
        ({"schema_version": 5}, r"schema_version must be 1 to 3 \(migrated\) or 4"),
        ({"label": "SAFE", "fail_closed": True}, r"a fail-closed decision is UNSAFE"),
        ({"cue_flags": {"alarming": 1}}, r"cue_flags\['alarming'\] must be a bool"),
        ({"policy_version": 2}, r"policy_version must be a str or None"),
    ]
    for override, message in cases:
        with pytest.raises(RecordError, match=message):
            make_record(**override)
    assert issubclass(RecordError, ValueError)


def test_duplicate_id_and_append_many_atomic(log: DecisionLog) -> None:
    first = make_record(0)
    log.append(first)
    with pytest.raises(RecordError, match=f"{first.decision_id}.*already in the log"):
        log.append(make_record(1, decision_id=first.decision_id))
    batch = [make_record(i) for i in range(2, 6)] + [make_record(9, decision_id=first.decision_id)]
    with pytest.raises(RecordError, match="already in the log"):
        log.append_many(batch)
    assert log.count() == 1  # nothing of the failed batch was written
    log.append_many(batch[:-1])
    assert log.count() == 5
    with pytest.raises(RecordError, match="append expects a DecisionRecord"):
        log.append({"request": "x"})  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="decision_id must be a non-empty str to be logged"):
        log.append(make_record(20, decision_id=""))


def test_records_filters(log: DecisionLog) -> None:
    recs = [make_record(i) for i in range(9)]
    log.append_many(reversed(recs))  # insertion order differs from time order
    # log order is the order the log took them in (a clock stepped back keeps it:
    # tests/guard/test_log_order.py); time selects
    assert [r.decision_id for r in log.records()] == [r.decision_id for r in reversed(recs)]
    t0 = recs[0].time
    got = list(log.records(since=t0 + 2, until=t0 + 5))
    assert [r.time - t0 for r in got] == [4, 3, 2]
    assert log.count(since=t0 + 2, until=t0 + 5) == 3
    since = dt.datetime.fromtimestamp(t0 + 6, tz=dt.UTC)
    assert len(list(log.records(since=since))) == 3
    assert {r.situation_id for r in log.records(situation_id="sit-1")} == {"sit-1"}
    assert log.count(situation_id="sit-1") == 3
    with pytest.raises(RecordError, match="naive datetime"):
        log.records(since=dt.datetime(2024, 1, 1))  # checked at the call, not lazily


def test_records_pages_through_ties(log: DecisionLog) -> None:
    # more rows than one read page, times repeating and going back: order is insertion
    recs = [make_record(i, time=1_700_000_000.0 + (i % 3)) for i in range(2500)]
    log.append_many(recs)
    got = [r.decision_id for r in log.records()]
    assert got == [r.decision_id for r in recs]
    assert len(list(log.records(since=1_700_000_001.0))) == 1666


def test_busy_database_times_out_with_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with DecisionLog(path, timeout_s=0.3) as lg:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            start = time.monotonic()
            with pytest.raises(LogError, match=r"stayed busy for 0.3 s.*raise timeout_s"):
                lg.append(make_record())
            assert time.monotonic() - start < 5
            assert lg.count() == 0  # readers are not blocked by a writer in WAL mode
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        lg.append(make_record())
        assert lg.count() == 1


# -- labels and arrays ---------------------------------------------------------------


def test_labels_upsert_and_errors(log: DecisionLog) -> None:
    recs = [make_record(i) for i in range(4)]
    log.append_many(recs)
    ids = [r.decision_id for r in recs]
    log.set_labels([(ids[0], "unsafe", "c1", "ana"), (ids[1], "safe", "c1", None)])
    arr = log.to_arrays()
    assert arr.label.tolist() == [1, 0, -1, -1]
    # upsert: relabel one, label another
    log.set_labels([(ids[0], "safe", "c9", "bo"), (ids[3], "unsafe", None, None)])
    arr = log.to_arrays()
    assert arr.label.tolist() == [0, 0, -1, 1]
    assert arr.contrast_id.tolist() == ["c9", "c1", None, None]
    conn = log._conn()
    (reviewer, t) = conn.execute(
        "SELECT reviewer, time FROM labels WHERE decision_id = ?", (ids[0],)
    ).fetchone()
    assert reviewer == "bo" and abs(t - time.time()) < 60

    with pytest.raises(RecordError, match=r"unknown decision_id 'nope-1'.*No labels were written"):
        log.set_labels([(ids[2], "unsafe", None, None), ("nope-1", "safe", None, None)])
    assert log.to_arrays().label.tolist() == [0, 0, -1, 1]  # the good item was not written
    with pytest.raises(RecordError, match=r"label must be one of \['safe', 'unsafe'\]; got 'SAFE'"):
        log.set_labels([(ids[2], "SAFE", None, None)])
    with pytest.raises(RecordError, match="must be a 4-tuple"):
        log.set_labels([(ids[2], "safe")])  # type: ignore[list-item]
    with pytest.raises(RecordError, match="appears twice"):
        log.set_labels([(ids[2], "safe", None, None), (ids[2], "unsafe", None, None)])


def test_to_arrays_alignment(log: DecisionLog) -> None:
    recs = [
        make_record(0, width=10, height=20, n_bytes=300, image_format="PNG"),
        make_record(1, member_scores={"qwen": math.nan}, member_scores_gray={"qwen": 2.0}),
        make_record(2, member_scores={"smol": 3.0, "new": 4.0}, fail_closed=True, label="UNSAFE"),
        make_record(3, member_scores_text={"smol": -1.0}, fused_score=math.nan),
    ]
    log.append_many(recs)
    log.set_labels([(recs[2].decision_id, "unsafe", "cx", None)])
    a = log.to_arrays()
    assert isinstance(a, LogArrays) and len(a) == a.n == 4
    assert a.decision_id.tolist() == [r.decision_id for r in recs]
    assert a.decision_id.dtype == object and a.time.dtype == np.float64
    assert a.label.dtype == np.int8 and a.label.tolist() == [-1, -1, 1, -1]
    assert a.contrast_id.tolist() == [None, None, "cx", None]
    assert list(a.member_scores) == ["qwen", "smol", "new"]
    np.testing.assert_array_equal(a.member_scores["qwen"], [0.5, np.nan, np.nan, 3.5])
    np.testing.assert_array_equal(a.member_scores["smol"], [-1.25, np.nan, 3.0, -1.25])
    np.testing.assert_array_equal(a.member_scores["new"], [np.nan, np.nan, 4.0, np.nan])
    np.testing.assert_array_equal(a.member_scores_gray["qwen"], [np.nan, 2.0, np.nan, np.nan])
    np.testing.assert_array_equal(a.member_scores_text["smol"], [np.nan, np.nan, np.nan, -1.0])
    np.testing.assert_array_equal(a.fused, [0.0, 0.25, 0.5, np.nan])
    np.testing.assert_array_equal(a.width, [10, np.nan, np.nan, np.nan])
    np.testing.assert_array_equal(a.n_bytes, [300, np.nan, np.nan, np.nan])
    assert a.image_format.tolist() == ["PNG", None, None, None]
    assert a.fail_closed.dtype == bool and a.fail_closed.tolist() == [False, False, True, False]
    assert a.guard_label.tolist() == [0, 1, 1, 1]  # the fail-closed one is UNSAFE
    assert a.policy.tolist() == ["frozen"] * 4
    assert a.request[2] == recs[2].request
    assert a.situation_id.tolist() == ["sit-0", "sit-1", "sit-2", "sit-0"]
    assert "n=4" in repr(a) and "labelled=1" in repr(a)
    # filters apply to arrays too; an empty selection gives empty arrays, not an error
    assert log.to_arrays(situation_id="sit-0").n == 2
    empty = log.to_arrays(situation_id="none")
    assert empty.n == 0 and empty.fused.dtype == np.float64 and empty.member_scores == {}


# -- concurrency and crash safety -----------------------------------------------------


def test_concurrent_threads_lose_nothing(tmp_path: Path) -> None:
    n_threads, per_thread = 8, 200
    ids: list[list[str]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        barrier = threading.Barrier(n_threads)

        def work(k: int) -> None:
            try:
                barrier.wait()
                for i in range(per_thread):
                    rec = make_record(i, request=f"thread {k} #{i}", time=time.time())
                    lg.append(rec)
                    ids[k].append(rec.decision_id)
                # readers work from every thread while others write
                assert lg.count() >= per_thread
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert lg.count() == n_threads * per_thread
        got = {r.decision_id for r in lg.records()}
    assert got == {i for chunk in ids for i in chunk}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_a_thread_per_write_does_not_keep_a_connection_per_thread(tmp_path: Path) -> None:
    # a caller that checks from a new thread each time: each thread's connection (two file
    # descriptors) was kept until close, until the process could open no file
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        lg.append(make_record(0))
        before = len(os.listdir("/proc/self/fd"))
        for i in range(1, 61):
            t = threading.Thread(target=lg.append, args=(make_record(i),))
            t.start()
            t.join()
        grown = len(os.listdir("/proc/self/fd")) - before
        assert grown < 10, f"{grown} more file descriptors open after 60 ended threads"
        assert lg.count() == 61


def test_a_relative_log_path_keeps_its_file_when_the_working_folder_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    with DecisionLog("log.sqlite") as lg:
        lg.append(make_record(0))
        monkeypatch.chdir(tmp_path / "b")
        lg.append(make_record(1))
        t = threading.Thread(target=lg.append, args=(make_record(2),))  # a new connection
        t.start()
        t.join()
        assert lg.path == tmp_path / "a" / "log.sqlite"
    with DecisionLog(tmp_path / "a" / "log.sqlite", read_only=True) as lg:
        assert lg.count() == 3
    assert not (tmp_path / "b" / "log.sqlite").exists()


def _process_writer(path: str, k: int, n: int) -> list[str]:
    out = []
    with DecisionLog(path) as lg:
        for i in range(n):
            rec = make_record(i, request=f"process {k} #{i}", time=time.time())
            lg.append(rec)
            out.append(rec.decision_id)
    return out


def test_concurrent_processes_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "log.sqlite")
    DecisionLog(path).close()  # schema created up front; the children race on writes only
    n_procs, per_proc = 4, 200
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(n_procs) as pool:
        results = pool.starmap(_process_writer, [(path, k, per_proc) for k in range(n_procs)])
    expected = {i for chunk in results for i in chunk}
    assert len(expected) == n_procs * per_proc
    with DecisionLog(path) as lg:
        assert lg.count() == n_procs * per_proc
        assert {r.decision_id for r in lg.records()} == expected


def test_concurrent_processes_create_schema_together(tmp_path: Path) -> None:
    path = str(tmp_path / "fresh.sqlite")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_process_writer, [(path, k, 5) for k in range(4)])
    with DecisionLog(path) as lg:
        assert {r.decision_id for r in lg.records()} == {i for c in results for i in c}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_keeps_acknowledged_writes(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite"
    env = dict(os.environ)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests._support.log_writer", str(path)],
        # Unbuffered: communicate() reads the fd directly, so lines held in a Python-side
        # read buffer would be missed and look like unacknowledged rows.
        bufsize=0,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    acked: list[str] = []
    try:
        assert child.stdout is not None
        for _ in range(300):
            line = child.stdout.readline()
            if not line:
                break
            acked.append(line.decode().strip())
        child.send_signal(signal.SIGKILL)
        # Lines already written to the pipe before the kill are acknowledged writes too.
        rest, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, err.decode()
    acked += [x for x in rest.decode().split("\n")[:-1]]  # drop a possibly torn last line
    assert len(acked) >= 300, err.decode()

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    with DecisionLog(path) as lg:
        present = {r.decision_id for r in lg.records()}
        assert set(acked) <= present
        # at most the append in flight at the kill is in the log but unacknowledged
        assert lg.count() - len(acked) in (0, 1)
        assert lg._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- images ---------------------------------------------------------------------------


def _image_record(i: int, data: bytes, t: float) -> DecisionRecord:
    return make_record(i, time=t, image_sha256=hashlib.sha256(data).hexdigest(), n_bytes=len(data))


def test_images_off_by_default(log: DecisionLog) -> None:
    data = b"\xff\xd8jpeg" * 10
    rec = _image_record(0, data, time.time())
    log.append(rec, image_bytes=data)
    assert log.image(rec.image_sha256 or "") is None
    assert log.count() == 1


def test_stored_images_names_what_image_finds(tmp_path: Path) -> None:
    """stored_images(digests) is {d : image(d) is not None}, over more digests than one query
    takes (500), with unknown, empty and repeated ones."""
    blobs = [bytes([k]) * 10 for k in range(3)]
    with DecisionLog(tmp_path / "log.sqlite", store_images=True) as lg:
        for k, data in enumerate(blobs):
            lg.append(_image_record(k, data, time.time()), image_bytes=data)
        ask = [hashlib.sha256(b).hexdigest() for b in blobs] + [f"{i:064x}" for i in range(1200)]
        ask += ["", ask[0], ask[-1]]
        assert lg.stored_images(ask) == {d for d in ask if d and lg.image(d) is not None}
        assert lg.stored_images(ask) == {hashlib.sha256(b).hexdigest() for b in blobs}
        assert lg.stored_images([]) == set()


def test_image_retention_by_size(tmp_path: Path) -> None:
    now = time.time()
    blobs = [bytes([k]) * 1000 for k in range(6)]
    with DecisionLog(tmp_path / "log.sqlite", store_images=True, image_retention_bytes=3500) as lg:
        recs = []
        for k, data in enumerate(blobs):
            rec = _image_record(k, data, now - 60 * (10 - k))  # later k = newer
            lg.append(rec, image_bytes=data)
            recs.append(rec)
        kept = [lg.image(r.image_sha256 or "") is not None for r in recs]
        assert kept == [False, False, False, True, True, True]  # oldest pruned first
        assert lg.image(recs[-1].image_sha256 or "") == blobs[-1]
        assert lg.count() == 6  # decisions are never pruned
        # the same image seen again is stored once and refreshed, not duplicated
        again = _image_record(9, blobs[3], now)
        lg.append(again, image_bytes=blobs[3])
        assert lg.image(again.image_sha256 or "") == blobs[3]
        with pytest.raises(RecordError, match="image_bytes hash to sha256"):
            lg.append(make_record(10, image_sha256="0" * 64), image_bytes=b"other")


def test_image_retention_by_age(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    now = time.time()
    old, new = b"old" * 10, b"new" * 10
    with DecisionLog(path, store_images=True, image_retention_days=None) as lg:
        rec_old = _image_record(0, old, now - 10 * 86400)
        lg.append(rec_old, image_bytes=old)
        assert lg.image(rec_old.image_sha256 or "") == old
    with DecisionLog(path, store_images=True, image_retention_days=7) as lg:
        rec_new = _image_record(1, new, now)
        lg.append(rec_new, image_bytes=new)
        assert lg.image(rec_old.image_sha256 or "") is None
        assert lg.image(rec_new.image_sha256 or "") == new


def test_log_argument_validation(tmp_path: Path) -> None:
    p = tmp_path / "x.sqlite"
    with pytest.raises(RecordError, match="image_retention_bytes must be a non-negative int"):
        DecisionLog(p, image_retention_bytes=-1)
    with pytest.raises(RecordError, match="image_retention_days must be a positive number"):
        DecisionLog(p, image_retention_days=0)
    with pytest.raises(RecordError, match="timeout_s must be a positive finite"):
        DecisionLog(p, timeout_s=0)
    with pytest.raises(RecordError, match="synchronous must be 'NORMAL' or 'FULL'"):
        DecisionLog(p, synchronous="OFF")  # type: ignore[arg-type]


# -- export ---------------------------------------------------------------------------


def _export_fixture(log: DecisionLog) -> list[DecisionRecord]:
    recs = [
        make_record(
            0,
            request='ünïcødé, with "quotes" and\na newline',
            member_scores={"qwen": math.nan, "smol": 1.0 / 3.0},
            width=64,
            height=48,
            image_format="PNG",
        ),
        make_record(
            1,
            member_scores={"qwen": math.inf, "smol": -2.5},
            member_scores_gray={"qwen": 0.5},
            fused_score=math.nan,
            fail_closed=True,
            fail_reason="boom",
        ),
    ]
    log.append_many(recs)
    log.set_labels([(recs[1].decision_id, "unsafe", "c1", "ana")])
    return recs


def test_export_csv_round_trip(log: DecisionLog, tmp_path: Path) -> None:
    recs = _export_fixture(log)
    out = tmp_path / "log.csv"
    log.export_csv(out)
    with out.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    r0, r1 = rows
    assert r0["decision_id"] == recs[0].decision_id and r0["request"] == recs[0].request
    assert math.isnan(float(r0["score.qwen"])) and float(r0["score.smol"]) == 1.0 / 3.0
    assert float(r1["score.qwen"]) == math.inf and float(r1["score.smol"]) == -2.5
    assert math.isnan(float(r1["fused_score"])) and float(r0["fused_score"]) == 0.0
    assert math.isnan(float(r0["score_gray.qwen"])) and float(r1["score_gray.qwen"]) == 0.5
    assert r0["width"] == "64" and r1["width"] == "" and r0["image_format"] == "PNG"
    assert r0["situation_id"] == "sit-0" and r0["fail_reason"] == ""
    assert r1["fail_closed"] == "true" and r0["fail_closed"] == "false"
    assert float(r0["latency_ms.total"]) == 20.0
    assert r1["review_label"] == "unsafe" and r1["review_contrast_id"] == "c1"
    assert r0["review_label"] == "" and math.isnan(float(r0["review_time"]))
    assert r0["schema_version"] == "4" and r0["time_utc"] == recs[0].time_utc


def test_export_parquet_round_trip(log: DecisionLog, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    recs = _export_fixture(log)
    out = tmp_path / "log.parquet"
    log.export_parquet(out)
    table = pq.read_table(out)
    assert table.num_rows == 2
    assert table.schema.metadata[b"spotstop.schema_version"] == b"4"
    cols = table.to_pydict()
    assert cols["decision_id"] == [r.decision_id for r in recs]
    assert cols["request"][0] == recs[0].request
    qwen = cols["score.qwen"]
    assert math.isnan(qwen[0]) and qwen[1] == math.inf  # NaN is a value, not a null
    assert table.column("score.qwen").null_count == 0
    assert math.isnan(cols["fused_score"][1])
    assert cols["width"] == [64, None] and cols["fail_closed"] == [False, True]
    assert cols["review_label"] == [None, "unsafe"]
    assert str(table.schema.field("score.smol").type) == "double"
    assert str(table.schema.field("width").type) == "int64"


def test_export_parquet_without_pyarrow(
    log: DecisionLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _export_fixture(log)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(LogError, match=r"pyarrow is a base dependency"):
        log.export_parquet(tmp_path / "x.parquet")


# -- schema 1 -> 2 migration ----------------------------------------------------------------

# The decision log as spotstop wrote it under schema 1 (frozen copy of that DDL).
_SCHEMA_1_DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY,
    time REAL NOT NULL,
    situation_id TEXT,
    request TEXT NOT NULL,
    image_sha256 TEXT,
    width INTEGER,
    height INTEGER,
    n_bytes INTEGER,
    image_format TEXT,
    member_scores TEXT NOT NULL,
    member_scores_gray TEXT,
    member_scores_text TEXT,
    fused_score REAL,
    threshold REAL,
    policy TEXT NOT NULL,
    label TEXT NOT NULL CHECK (label IN ('SAFE', 'UNSAFE')),
    fail_closed INTEGER NOT NULL,
    fail_reason TEXT,
    latency_ms TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    prompt_hash TEXT NOT NULL,
    schema_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time);
CREATE INDEX IF NOT EXISTS decisions_situation ON decisions (situation_id, time);
CREATE TABLE IF NOT EXISTS labels (
    decision_id TEXT PRIMARY KEY REFERENCES decisions (decision_id),
    label TEXT NOT NULL CHECK (label IN ('safe', 'unsafe')),
    contrast_id TEXT,
    reviewer TEXT,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    n_bytes INTEGER NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS images_time ON images (time);
"""
_V1_COLUMNS = (
    "decision_id, time, situation_id, request, image_sha256, width, height, n_bytes, "
    "image_format, member_scores, member_scores_gray, member_scores_text, fused_score, "
    "threshold, policy, label, fail_closed, fail_reason, latency_ms, bundle_id, prompt_hash, "
    "schema_version"
)
_V1_ROWS = [
    ("a1", 1.7e9, "kitchen-1", "pick up the knife", "ab" * 32, 640, 480, 1234, "JPEG",
     '{"qwen":1.5,"lfm":-0.5}', None, None, 0.75, 0.2, "situation->frozen", "UNSAFE", 0, None,
     '{"total_ms":30.0}', "bundle-1", "h1", 1),
    ("a2", 1.7e9 + 1, None, "open the door", None, None, None, None, None,
     '{"qwen":"NaN","lfm":-0.5}', '{"qwen":0.1,"lfm":"-Infinity"}', None, None, None,
     "frozen", "UNSAFE", 1, "member qwen produced a non-finite score", '{"total_ms":12.0}',
     "bundle-1", "h1", 1),
    ("a3", 1.7e9 + 2, "kitchen-1", "water the plant", "cd" * 32, 320, 240, 999, "PNG",
     '{"qwen":-1.0,"lfm":-2.0}', None, None, -1.2, 0.1, "situation", "SAFE", 0, None,
     '{"total_ms":25.0}', "bundle-1", "h1", 1),
]  # fmt: skip


def _write_schema_1_log(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_1_DDL)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('created', '1.7e9')")
    conn.executemany(
        f"INSERT INTO decisions ({_V1_COLUMNS}) VALUES ({', '.join('?' * 22)})", _V1_ROWS
    )
    conn.execute("INSERT INTO labels VALUES ('a1', 'unsafe', 'c1', 'ana', 1.7e9 + 100)")
    conn.commit()
    conn.close()


def test_a_schema_1_log_is_migrated_on_open_and_nothing_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    _write_schema_1_log(path)
    with DecisionLog(path) as lg:
        recs = list(lg.records())
        assert [r.decision_id for r in recs] == ["a1", "a2", "a3"]
        a1, a2, a3 = recs
        # every schema-1 value is kept, and read as it was written
        assert a1.schema_version == 1 and a1.request == "pick up the knife"
        assert a1.member_scores == {"qwen": 1.5, "lfm": -0.5} and a1.width == 640
        assert a1.label == "UNSAFE" and a1.threshold == 0.2 and a1.fused_score == 0.75
        assert math.isnan(a2.member_scores["qwen"]) and a2.member_scores_gray == {
            "qwen": 0.1,
            "lfm": -math.inf,
        }
        assert a2.fail_closed and a2.fail_reason == "member qwen produced a non-finite score"
        assert math.isnan(a2.fused_score) and math.isnan(a2.threshold)
        # the new fields get their documented values for schema-1 rows
        assert a1.policy_score == 0.75 and a3.policy_score == -1.2  # what the policy compared
        assert (a1.policy_kind, a2.policy_kind, a3.policy_kind) == (
            "situation",
            "frozen",
            "situation",
        )
        assert a1.policy_version is None and a1.fusion_key is None and a1.batch_id is None
        assert a1.detail == "" and a1.cue_flags is None and a1.test_pair is False
        assert a1.members_run is None  # schema 3's field: unknown for old rows
        # schema 4's field, from the rule's text in the migration: the kind that decided
        assert (a1.deciding_kind, a2.deciding_kind, a3.deciding_kind) == (
            "frozen",
            None,  # failed closed: no threshold, no policy decided
            "situation",
        )
        arr = lg.to_arrays()
        assert arr.label.tolist() == [1, -1, -1] and arr.contrast_id.tolist() == ["c1", None, None]
        assert arr.policy_version.tolist() == [None, None, None]
        assert arr.members_run == {}  # no row says which members ran
        # new decisions are written under the current schema beside the old ones
        lg.append(make_record(5))
        assert lg.count() == 4
    with sqlite3.connect(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    conn.close()
    assert meta["schema_version"] == "5" and "migrated_from_1" in meta
    with DecisionLog(path) as lg:  # a second open does not migrate again
        assert lg.count() == 4 and lg.get("a1").schema_version == 1  # type: ignore[union-attr]


def test_a_schema_2_log_gets_members_run_on_open(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    with DecisionLog(path) as lg:
        lg.append(make_record(1))
    with sqlite3.connect(path) as conn:  # make it the schema-2 file it would have been
        conn.execute("ALTER TABLE decisions DROP COLUMN members_run")
        conn.execute("ALTER TABLE decisions DROP COLUMN deciding_kind")
        conn.execute("UPDATE decisions SET schema_version = 2")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    with DecisionLog(path) as lg:
        [old] = list(lg.records())
        assert old.schema_version == 2 and old.members_run is None
        lg.append(make_record(2, members_run={"qwen": True, "lfm": False}))
        arr = lg.to_arrays()
        assert arr.members_run["lfm"].tolist() == [-1, 0] and arr.members_run["qwen"].tolist() == [
            -1,
            1,
        ]
    with sqlite3.connect(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    conn.close()
    assert meta["schema_version"] == "5" and "migrated_from_2" in meta


def _make_schema_4(path: Path) -> None:
    """Make a log the schema-4 file it would have been: no ``deciding_kind`` column, its
    rows of record schema 3 (the old writer wrote the same columns but that one)."""
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE decisions DROP COLUMN deciding_kind")
        conn.execute("UPDATE decisions SET schema_version = 3")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()


def test_a_schema_4_log_gets_the_deciding_kind_from_its_rules_once_on_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v4.sqlite"
    rules = [
        ("frozen", 0.1, "frozen"),
        ("situation->frozen", 0.1, "frozen"),
        ("situation->conformal", 0.1, "conformal"),
        ("batch->frozen", 0.1, "frozen"),
        ("cascade[a]->frozen", 0.1, "frozen"),
        ("cascade[pair]->situation->frozen", 0.1, "frozen"),
        ("cascade", math.nan, None),  # failed closed before a policy decided: no threshold
    ]
    with DecisionLog(path) as lg:
        lg.append_many(
            [
                make_record(i, policy=rule, threshold=t, label="UNSAFE", fail_closed=t != t)
                for i, (rule, t, _) in enumerate(rules)
            ]
        )
    _make_schema_4(path)
    with DecisionLog(path) as lg:
        old = list(lg.records())
        assert [r.deciding_kind for r in old] == [k for _, _, k in rules]
        assert [r.policy for r in old] == [r for r, _, _ in rules]  # the rule is kept as it was
        assert all(r.schema_version == 3 for r in old)
        lg.append(make_record(9, policy="situation->conformal", deciding_kind="conformal"))
        arr = lg.to_arrays()
        assert arr.deciding_kind.tolist() == [k for _, _, k in rules] + ["conformal"]
    with sqlite3.connect(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        (n,) = conn.execute("SELECT count(*) FROM decisions WHERE deciding_kind IS NULL").fetchone()
    conn.close()
    assert meta["schema_version"] == "5" and "migrated_from_4" in meta and n == 1
    with DecisionLog(path) as lg:  # a second open does not migrate again
        assert lg.get(old[4].decision_id).deciding_kind == "frozen"  # type: ignore[union-attr]


def test_a_row_an_older_guard_writes_after_the_migration_reads_as_migrated(
    tmp_path: Path,
) -> None:
    """A guard of log schema 4 that kept running while a newer spotstop opened (migrated) its
    log inserts its rows without ``deciding_kind``: they read None, as if no policy had
    decided them (the card's conformal audit left them out), where the same rows written a
    moment earlier read "conformal" from the migration. They read as the migration gives."""
    from spotstop.guard._log import Protect, Retention
    from spotstop.guard._record import record_to_row

    path = tmp_path / "robot.sqlite"
    older = sqlite3.connect(path, isolation_level=None)  # opened before the upgrade
    rules = [("situation->conformal", 0.1, "conformal"), ("cascade", math.nan, None)]
    with DecisionLog(path) as lg:  # the newer spotstop opens the log (and migrates it)
        lg.append(make_record(9, time=1_600_000_000.0, deciding_kind="situation"))
    columns = [c for c in COLUMNS if c != "deciding_kind"]  # what the older guard inserts
    for i, (rule, t, _) in enumerate(rules):
        rec = make_record(i, policy=rule, threshold=t, label="UNSAFE", schema_version=3)
        row = dict(zip(COLUMNS, record_to_row(rec), strict=True))
        older.execute(
            f"INSERT INTO decisions ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            [row[c] for c in columns],
        )
    older.close()
    want = ["situation"] + [k for _, _, k in rules]
    with DecisionLog(path) as lg:
        assert lg.to_arrays().deciding_kind.tolist() == want
        assert [r.deciding_kind for r in lg.records()] == want
        ids = [r.decision_id for r in lg.records()]
        assert lg.get(ids[1]).deciding_kind == "conformal"  # type: ignore[union-attr]
        lg.apply_retention(Retention(keep_days=1), Protect(min_age_s=0, review=False))
        assert lg.archives()  # archived as written (NULL), read as migrated
        assert lg.to_arrays().deciding_kind.tolist() == want


def test_a_real_schema_4_log_reads_its_deciding_kinds(tmp_path: Path) -> None:
    """A real schema-4 log (the guard's own rows: 24 decisions of the packaged demo log as it was
    written under schema 4, kept in tests/data): migrated on a copy, every decision gets the
    kind its rule named."""
    import shutil

    path = tmp_path / "demo.sqlite"
    shutil.copyfile(Path(__file__).parents[1] / "data" / "demo_log_schema4.sqlite", path)
    with sqlite3.connect(path) as conn:
        (found,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert found == "4"
    with DecisionLog(path) as lg:
        arr = lg.to_arrays()
    pairs = {(str(p), str(k)) for p, k in zip(arr.policy, arr.deciding_kind, strict=True)}
    assert pairs == {
        ("conformal", "conformal"),
        ("situation", "situation"),
        ("situation->frozen", "frozen"),
    }
    assert len(arr.policy) == 24


def test_an_archive_written_before_the_deciding_kind_reads_as_the_migration_would(
    tmp_path: Path,
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from spotstop.guard._log_archive import SEQ_COLUMN, read_archive_file, write_archive
    from spotstop.guard._record import record_to_row

    recs = [
        make_record(0, policy="situation->conformal"),
        make_record(1, policy="cascade[pair]->frozen"),
    ]
    info = write_archive(tmp_path / "arch", [1, 2], [record_to_row(r) for r in recs])
    path = tmp_path / "arch" / info.name
    table = pq.read_table(path)
    old = table.drop_columns(["deciding_kind"])
    meta = dict(table.schema.metadata)
    meta[b"spotstop.log_schema_version"] = b"4"
    pq.write_table(old.replace_schema_metadata(meta), tmp_path / "old.parquet")
    got = read_archive_file(tmp_path / "old.parquet")
    assert got.seqs == (1, 2)
    kinds = [row[COLUMNS.index("deciding_kind")] for row in got.rows]
    assert kinds == ["conformal", "frozen"]
    assert SEQ_COLUMN in old.column_names and "deciding_kind" not in old.column_names


def test_the_policies_table_keeps_who_decided(log: DecisionLog) -> None:
    from spotstop.guard._log import PolicyRow

    row = PolicyRow("v0002+abcd1234", "frozen", "k" * 16, "b", "h", "2026-01-01T00:00:00+00:00",
                    {"policy": {"kind": "frozen", "threshold": 0.5}})  # fmt: skip
    log.append_many([make_record(1, policy_version=row.version_id)], policy=row)
    log.append_many([make_record(2, policy_version=row.version_id)], policy=row)  # kept once
    got = log.policies()
    assert list(got) == [row.version_id]
    assert got[row.version_id].document == row.document and got[row.version_id].kind == "frozen"
    assert log.to_arrays().policy_version.tolist() == [row.version_id] * 2


def test_mark_fail_closed_only_moves_towards_safety(log: DecisionLog) -> None:
    safe, unsafe = make_record(0), make_record(1)
    assert safe.label == "SAFE" and unsafe.label == "UNSAFE"
    log.append_many([safe, unsafe])
    log.mark_fail_closed([safe.decision_id, unsafe.decision_id], "deadline exceeded")
    a, b = log.get(safe.decision_id), log.get(unsafe.decision_id)
    assert a is not None and b is not None
    assert a.label == "UNSAFE" and a.fail_closed and a.fail_reason == "deadline exceeded"
    assert b.label == "UNSAFE" and not b.fail_closed  # already UNSAFE: left as it was
    with pytest.raises(RecordError, match="unknown decision_id 'nope'"):
        log.mark_fail_closed(["nope"], "x")
