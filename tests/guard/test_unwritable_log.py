"""The guard when its log cannot be written: fail closed, keep every decision, recover alone.

Faults are SQLite's own on the log's connection (``PRAGMA query_only``: SQLITE_READONLY, the
fault every guard write meets whatever its size; ``test_log_faults.py`` raises each kind, and
``serve/test_log_and_shutdown.py`` fills a real file system). The guard runs
the tiny TEST pair (its decisions mean nothing) with a frozen cut that would call every scene
SAFE, so any UNSAFE here is a fail-closed one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from spotstop.guard import DecisionLog, Guard
from spotstop.guard._guard import DecisionNotLogged
from spotstop.guard._journal import Journal
from spotstop.guard._log_options import LogOptions
from spotstop.guard._log_schema import LogError

from tests._support.guard import make_scene, set_frozen


def break_log(log: DecisionLog) -> None:
    log._conn().execute("PRAGMA query_only = 1")


def mend_log(log: DecisionLog) -> None:
    log._conn().execute("PRAGMA query_only = 0")


@pytest.fixture(scope="module")
def safe_bundle(committed_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = tmp_path_factory.mktemp("guardlog") / "bundle"
    shutil.copytree(committed_bundle, bundle)
    set_frozen(bundle, 1e9)  # every scored scene is SAFE
    return bundle


def _guard(bundle: Path, tmp: Path, **opts: object) -> Guard:
    options = LogOptions(journal=tmp / "journal" / "decisions.journal", **opts)  # type: ignore[arg-type]
    return Guard(bundle, log=tmp / "log" / "decisions.sqlite", log_options=options)


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    (tmp_path / "log").mkdir()
    return tmp_path


def test_unwritable_log_fails_closed_keeps_the_rows_and_recovers(safe_bundle: Path, logdir: Path):
    with _guard(safe_bundle, logdir, spill_after_s=3600.0) as g:
        ok = g.check(make_scene(0))
        assert ok.label == "SAFE" and not ok.fail_closed
        break_log(g.log)
        bad = g.check_batch([make_scene(1), make_scene(2)])
        for d in bad:
            assert d.label == "UNSAFE" and d.fail_closed
            assert d.fail_reason is not None and d.fail_reason.startswith(
                "decision log (read_only)"
            )
            assert str(g.log.path) in d.fail_reason  # the reason names the log
        with pytest.raises(DecisionNotLogged) as e:
            g.check(make_scene(3), require_logged=True)
        assert e.value.decisions[0].label == "UNSAFE" and "read_only" in e.value.reason
        st = g.log_status()
        assert not st.writable and st.pending_rows == 3 and g.pending == 3
        mend_log(g.log)  # the fault passed: the next call writes what waited, then its own
        later = g.check(make_scene(4))
        assert later.label == "SAFE" and not later.fail_closed and g.pending == 0
        assert g.log_status().writable
        rows = {r.decision_id: r for r in g.log.records()}
        assert len(rows) == 5
        for d in [*bad, e.value.decisions[0]]:  # what the caller was told is what the log says
            assert rows[d.decision_id].label == "UNSAFE" and rows[d.decision_id].fail_closed


def test_shutdown_while_unwritable_loses_nothing_the_next_start_imports(
    safe_bundle: Path, logdir: Path
):
    with _guard(safe_bundle, logdir, spill_after_s=3600.0) as g:
        first = g.check(make_scene(0))
        break_log(g.log)
        refused = [g.check(make_scene(i)) for i in range(1, 4)]
        assert all(d.fail_closed for d in refused)
    # closed while the log was read-only: the three rows went to the journal, none nowhere
    journal = Journal(logdir / "journal" / "decisions.journal")
    assert journal.read().n_rows == 3
    with _guard(safe_bundle, logdir) as g2:  # the next start imports the journal
        st = g2.log_status()
        assert st.imported_rows == 3 and st.journal_rows == 0 and st.writable
        ids = {r.decision_id for r in g2.log.records()}
    assert ids == {d.decision_id for d in [first, *refused]}
    assert journal.read().n_rows == 0


def test_no_decision_when_nothing_can_keep_it(safe_bundle: Path, logdir: Path):
    (logdir / "blocker").write_text("not a folder: the journal cannot be created")
    g = Guard(
        safe_bundle,
        log=logdir / "log" / "decisions.sqlite",
        log_options=LogOptions(
            journal=logdir / "blocker" / "j", max_pending_bytes=1, spill_after_s=3600.0
        ),
    )
    with g:
        break_log(g.log)
        kept = g.check(make_scene(0))  # decided, failed closed, kept in memory (over the bound)
        assert kept.fail_closed and kept.decision_id and g.pending == 1
        refused = g.check(make_scene(1))
        assert refused.label == "UNSAFE" and refused.fail_closed and refused.decision_id == ""
        assert refused.fail_reason is not None and "no decision made" in refused.fail_reason
        with pytest.raises(DecisionNotLogged):
            g.check(make_scene(2), require_logged=True)
        mend_log(g.log)
        assert g.flush_pending(1.0) == 1
        again = g.check(make_scene(3))
        assert again.label == "SAFE" and again.decision_id
        assert {r.decision_id for r in g.log.records()} == {kept.decision_id, again.decision_id}


def test_check_command_names_the_log_and_the_next_check_imports(
    safe_bundle: Path, logdir: Path, tmp_path: Path
):
    img = tmp_path / "scene.jpg"
    img.write_bytes(make_scene(0).image)  # type: ignore[arg-type]
    log = logdir / "log" / "decisions.sqlite"
    journal = logdir / "journal" / "decisions.journal"
    base = [sys.executable, "-m", "spotstop.cli", "check", str(img), "--request", "open it"]
    base += ["--bundle", str(safe_bundle), "--log", str(log), "--journal", str(journal), "--json"]
    full = subprocess.run([*base, "--log-min-free-bytes", "1000T"], capture_output=True, text=True)
    assert full.returncode == 1, full.stderr
    d = json.loads(full.stdout)
    assert d["label"] == "UNSAFE" and d["fail_closed"]
    assert str(log) in d["fail_reason"] and "disk_full" in d["fail_reason"]
    assert "below the floor" in d["fail_reason"]
    assert Journal(journal).read().n_rows == 1  # kept, on the way out, for the next start
    ok = subprocess.run(base, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    with DecisionLog(log) as lg:
        rows = {r.decision_id: r for r in lg.records()}
    assert set(rows) == {d["decision_id"], json.loads(ok.stdout)["decision_id"]}
    assert rows[d["decision_id"]].fail_closed


def test_a_guard_that_refused_decides_again_once_the_log_is_back(safe_bundle: Path, logdir: Path):
    (logdir / "blocker").write_text("not a folder: the journal cannot be created")
    opts = LogOptions(journal=logdir / "blocker" / "j", max_pending_bytes=1, spill_after_s=3600.0)
    with Guard(safe_bundle, log=logdir / "log" / "decisions.sqlite", log_options=opts) as g:
        break_log(g.log)
        g.check(make_scene(0))
        assert g.check(make_scene(1)).decision_id == ""  # refused
        mend_log(g.log)
        back = g.check(make_scene(2))  # no flush_pending by anyone: the check tries the log itself
        assert back.label == "SAFE" and back.decision_id and g.pending == 0


def test_a_closed_guard_says_so(safe_bundle: Path, logdir: Path):
    g = _guard(safe_bundle, logdir)
    g.close()
    g.close()  # twice is fine
    from spotstop.guard import GuardError

    with pytest.raises(GuardError, match="this guard is closed"):
        g.check(make_scene(0))


def _remove_log_files(log: Path) -> None:
    for p in log.parent.glob(log.name + "*"):
        p.unlink()


def test_a_log_file_deleted_while_the_guard_runs_gets_the_next_decisions(
    safe_bundle: Path, logdir: Path
):
    # SQLite goes on writing the file it holds open: a deleted log took every later SAFE,
    # answered as logged, into a file nobody could read
    with _guard(safe_bundle, logdir) as g:
        g.check(make_scene(0))
        _remove_log_files(g.log.path)
        later = g.check_batch([make_scene(1), make_scene(2)])
        assert [d.label for d in later] == ["SAFE", "SAFE"]
        assert g.log_status().writable
        with DecisionLog(g.log.path, read_only=True) as lg:
            ids = {r.decision_id for r in lg.records()}
    assert ids == {d.decision_id for d in later}


def test_a_log_replaced_while_the_guard_runs_is_said_at_once_and_probed_open(
    safe_bundle: Path, logdir: Path
):
    # the status said writable until a decision failed or went to the new file: /readyz
    # stayed 200 for a log that was no longer there
    with _guard(safe_bundle, logdir) as g:
        g.check(make_scene(0))
        assert g.log_status().writable
        _remove_log_files(g.log.path)
        DecisionLog(g.log.path).close()  # another log put at its path (a restore, a rotation)
        st = g.log_status()
        assert not st.writable and st.fault == "io_error" and st.since is not None
        assert st.reason is not None and "no longer the file the guard last wrote" in st.reason
        g.flush_pending(timeout_s=5.0)  # what the sidecar does every second: a probe
        assert g.log_status().writable
        later = g.check(make_scene(1))
        assert later.label == "SAFE" and not later.fail_closed
        with DecisionLog(g.log.path, read_only=True) as lg:
            assert [r.decision_id for r in lg.records()] == [later.decision_id]
        shutil.rmtree(logdir / "log")  # the folder gone: the probe says why
        assert not g.log_status().writable
        with pytest.raises(LogError) as e:
            g.flush_pending(timeout_s=5.0)
        assert e.value.kind == "io_error" and "unable to open" in str(e.value)
        assert str(e.value) in (g.log_status().reason or "")


def test_a_wal_file_removed_while_the_guard_runs_loses_no_decision(safe_bundle: Path, logdir: Path):
    # rm decisions.sqlite-wal (a cleanup): the connection went on writing the WAL it held
    # open, which no other connection (nor the next start) ever reads
    with _guard(safe_bundle, logdir) as g:
        first = g.check(make_scene(0))
        for suffix in ("-wal", "-shm"):
            Path(f"{g.log.path}{suffix}").unlink()
        later = g.check_batch([make_scene(1), make_scene(2)])
        assert [d.label for d in later] == ["SAFE", "SAFE"]
        with DecisionLog(g.log.path, read_only=True) as lg:  # another connection
            ids = {r.decision_id for r in lg.records()}
    assert ids == {d.decision_id for d in [first, *later]}


def test_a_log_file_emptied_in_place_fails_closed_until_it_is_moved_away(
    safe_bundle: Path, logdir: Path
):
    # logrotate's copytruncate: the same file, cut to 0 bytes; SQLite went on answering
    # SAFE into a file that no longer is a database
    with _guard(safe_bundle, logdir, spill_after_s=3600.0) as g:
        g.check(make_scene(0))
        os.truncate(g.log.path, 0)
        cut = g.check(make_scene(1))
        assert cut.label == "UNSAFE" and cut.fail_closed
        assert cut.fail_reason is not None and "emptied in place" in cut.fail_reason
        (logdir / "rotated").mkdir()
        for f in list((logdir / "log").iterdir()):
            f.rename(logdir / "rotated" / f.name)
        back = g.check(make_scene(2))
        assert back.label == "SAFE" and not back.fail_closed and g.pending == 0
        rows = {r.decision_id: r for r in g.log.records()}
    assert set(rows) == {cut.decision_id, back.decision_id}
    assert rows[cut.decision_id].fail_closed


def test_a_log_folder_removed_fails_closed_and_recovers_when_it_is_back(
    safe_bundle: Path, logdir: Path
):
    with _guard(safe_bundle, logdir, spill_after_s=3600.0) as g:
        g.check(make_scene(0))
        shutil.rmtree(logdir / "log")
        gone = g.check(make_scene(1))
        assert gone.label == "UNSAFE" and gone.fail_closed
        assert gone.fail_reason is not None and "decision log (io_error)" in gone.fail_reason
        assert not g.log_status().writable and g.pending == 1
        (logdir / "log").mkdir()
        back = g.check(make_scene(2))  # the waiting row first, then its own
        assert back.label == "SAFE" and not back.fail_closed and g.pending == 0
        rows = {r.decision_id: r for r in g.log.records()}
    assert set(rows) == {gone.decision_id, back.decision_id}
    assert rows[gone.decision_id].fail_closed


def test_a_log_file_removed_during_a_write_is_not_answered_as_logged(tmp_path: Path):
    # the path checked before the write still named the file; it was removed before COMMIT
    path = tmp_path / "decisions.sqlite"
    log = DecisionLog(path)
    try:

        def body(conn: object) -> None:
            _remove_log_files(path)

        with pytest.raises(LogError, match="removed or replaced") as e:
            log._write(body, what="append decisions")  # type: ignore[arg-type]
        assert e.value.kind == "io_error"
        log.probe()  # the next write sets up a log at the path again
        with DecisionLog(path, read_only=True) as again:
            assert list(again.records()) == []
    finally:
        log.close()
