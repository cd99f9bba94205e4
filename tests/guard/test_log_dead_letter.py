"""Amendments an older version left in the dead letter are pushed into the log's rows.

Before archived rows could be amended, a late fail-closed amendment whose row was archived was
"unknown" and went to the dead letter; before that, an amendment naming a live row and an
unknown id went there whole. Readers through the log applied them, but the files alone did
not: an archive read on its own (a fleet's collected archives, DuckDB) said SAFE for a
decision the robot was answered UNSAFE. The log now applies them when it opens for writing
(and at each retention pass) through ``mark_fail_closed``, then removes them from the dead
letter; ids in no row of the log stay (``guard/_log_dead_letter.py``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spotstop.guard import _journal, _log_archive
from spotstop.guard._journal import DeadLetter
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import Protect, Retention

from tests._support.records import make_record

_REASON = "deadline exceeded (writing the decision log)"
_DAY = 86400.0


def _dead_letter(log: Path) -> DeadLetter:
    return DeadLetter(log.with_name(log.name + ".dead-letter.jsonl"), log=str(log))


def _old_line(log: Path, ids: list[str], error: str) -> bytes:
    """An ``amend`` entry as an older spotstop wrote it (the dead letter's format, by hand)."""
    body = {
        "v": 2,
        "kind": "amend",
        "time": 1_700_000_500.0,
        "log": str(log),
        "error": error,
        "ids": ids,
        "reason": _REASON,
    }
    return json.dumps(body, ensure_ascii=True).encode("ascii") + b"\n"


def _log_with_archive(tmp_path: Path) -> tuple[Path, list[Any]]:
    """Four SAFE decisions, the three oldest archived (one file), the newest live."""
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE") for i in (0, 2, 4, 6)]
    with DecisionLog(log) as d:
        d.append_many(recs)
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[3].time + _DAY)
        assert len(d.archived_ids()) == 3 and len(d.archives()) == 1
    return log, recs


def _archive_alone(log: Path) -> dict[str, tuple[str, bool, str | None]]:
    """The only archive file, read with pyarrow alone (no spotstop, no log)."""
    [path] = log.with_name(log.name + ".archive").glob("*.parquet")
    t = pq.read_table(path).to_pydict()
    return {
        i: (lab, fc, why)
        for i, lab, fc, why in zip(
            t["decision_id"], t["label"], t["fail_closed"], t["fail_reason"], strict=True
        )
    }


def _raw(log: Path, decision_id: str) -> str:
    with DecisionLog(log, read_only=True) as d:
        rec = d.get(decision_id, raw=True)
        assert rec is not None
        return rec.label


def test_an_old_dead_lettered_amendment_of_an_archived_row_goes_into_its_archive(
    tmp_path: Path,
) -> None:
    """The repro: an old version dead-lettered the amendment of an archived row as unknown, and
    of a live row with an unknown id whole; the archive read alone said SAFE. Opening the log
    for writing amends the archive (and the live row), and the dead letter keeps only the
    ids in no row of the log, with their message."""
    log, recs = _log_with_archive(tmp_path)
    a0, a1, a2, live = (r.decision_id for r in recs)
    unknown_line = _old_line(log, ["never-logged"], "RecordError: unknown decision_id")
    rows_line = DeadLetter.encode(
        {"v": 2, "kind": "rows", "log": str(log), "error": "y", "rows": [{"decision_id": "r"}]}
    )
    dead = _dead_letter(log)
    dead.path.write_bytes(
        _old_line(log, [a0], "RecordError: mark_fail_closed: unknown decision_id")
        + unknown_line
        + _old_line(log, [live, "gone", a1], "RecordError: unknown decision_id 'gone'")
        + rows_line
        + _old_line(log, [a0], "RecordError: the same entry again")
    )
    assert _archive_alone(log)[a0] == ("SAFE", False, None)  # as the old version left it

    with DecisionLog(log) as d:
        [archive] = d.archives()
    got = _archive_alone(log)
    assert got[a0] == ("UNSAFE", True, _REASON) and got[a1] == ("UNSAFE", True, _REASON)
    assert got[a2] == ("SAFE", False, None)
    assert _raw(log, live) == "UNSAFE"  # the live row in the SQLite file itself
    # the fleet reader on a collector's copy of the archive alone
    from spotstop.diagnostics._fleet import read_fleet

    collected = tmp_path / "collected"
    collected.mkdir()
    copy = collected / archive.name
    copy.write_bytes((log.with_name(log.name + ".archive") / archive.name).read_bytes())
    fleet = read_fleet([collected]).arrays
    as_read = dict(zip(fleet.decision_id, fleet.fail_closed.tolist(), strict=True))
    assert as_read == {a0: True, a1: True, a2: False}
    assert pq.read_table(log.with_name(log.name + ".archive") / archive.name).num_rows == 3
    # the dead letter: the unknown entry as it was, the mixed one narrowed, the rows entry kept
    lines = dead.path.read_bytes().splitlines()
    assert lines[0] == unknown_line.rstrip(b"\n") and lines[2] == rows_line.rstrip(b"\n")
    narrowed = json.loads(lines[1])
    assert (
        narrowed["ids"] == ["gone"]
        and narrowed["error"] == "RecordError: unknown decision_id 'gone'"
    )
    assert narrowed["reason"] == _REASON and len(lines) == 3
    assert dead.changes().amendments == (
        (("never-logged",), _REASON),
        (("gone",), _REASON),
        (("r",), ""),
    )
    # the log's readers read the same as before (nothing read twice, nothing lost)
    with DecisionLog(log, read_only=True) as d:
        assert [r.label for r in d.records()] == ["UNSAFE", "UNSAFE", "SAFE", "UNSAFE"]
        assert d.pending_changes().reasons.keys() >= {"never-logged", "gone"}


def test_a_fault_in_the_archive_rewrite_leaves_the_entry_in_the_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, recs = _log_with_archive(tmp_path)
    a0 = recs[0].decision_id
    dead = _dead_letter(log)
    dead.path.write_bytes(_old_line(log, [a0], "RecordError: unknown decision_id"))
    before = dead.path.read_bytes()

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(_log_archive, "write_archive", fails)
    with DecisionLog(log) as d:
        result = d.apply_dead_letter()
    assert result.failed and not result.applied
    assert dead.path.read_bytes() == before and _archive_alone(log)[a0][0] == "SAFE"
    monkeypatch.undo()
    with DecisionLog(log):  # the next opening applies it
        pass
    assert _archive_alone(log)[a0] == ("UNSAFE", True, _REASON)
    assert not dead.path.exists()


def test_an_unexpected_fault_in_the_dead_letter_s_work_never_keeps_the_log_from_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The work is best effort at every opening: a fault of any kind (here a TypeError, as a
    malformed entry might raise) is a warning, or a guard could never start again until
    someone edited the dead letter by hand; the next opening tries again."""
    from spotstop.guard import _log

    log, recs = _log_with_archive(tmp_path)
    a0 = recs[0].decision_id
    dead = _dead_letter(log)
    dead.path.write_bytes(_old_line(log, [a0], "RecordError: unknown decision_id"))

    def breaks(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("unexpected (injected)")

    monkeypatch.setattr(_log.DecisionLog, "apply_dead_letter", breaks)
    with DecisionLog(log) as d:  # opens, and logs
        d.append_many([make_record(8, label="SAFE")])
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[3].time)
    monkeypatch.undo()
    with DecisionLog(log):
        pass
    assert _archive_alone(log)[a0] == ("UNSAFE", True, _REASON)


def test_a_crash_between_the_archive_s_commit_and_the_dead_letter_s_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive replacement is committed before the entry is removed: a failure (a crash)
    in between leaves the entry, and applying it again finds the row UNSAFE (no new file)
    and removes it."""
    log, recs = _log_with_archive(tmp_path)
    a0 = recs[0].decision_id
    dead = _dead_letter(log)
    dead.path.write_bytes(_old_line(log, [a0], "RecordError: unknown decision_id"))

    def crashes(self: DeadLetter, new: Any) -> Any:
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(DeadLetter, "replace_lines", crashes)
    with DecisionLog(log) as d:  # the opening says so and still opens
        [amended] = d.archives()
    assert _archive_alone(log)[a0] == ("UNSAFE", True, _REASON)
    assert dead.changes().amendments == (((a0,), _REASON),)
    monkeypatch.undo()
    with DecisionLog(log) as d:
        assert [a.name for a in d.archives()] == [amended.name]  # not written again
    assert not dead.path.exists()


def test_an_unchanged_dead_letter_of_unknown_ids_is_not_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening is cheap: ids in no row are looked for in the archives once; the next opening
    reads no archive until the dead letter or the archives change."""
    log, recs = _log_with_archive(tmp_path)
    dead = _dead_letter(log)
    dead.path.write_bytes(_old_line(log, ["never-logged"], "RecordError: unknown"))
    with DecisionLog(log) as d:
        assert d.apply_dead_letter().skipped  # the opening checked it
    reads = []
    real = _log_archive._read_registered
    monkeypatch.setattr(_log_archive, "_read_registered", lambda *a: reads.append(a) or real(*a))
    with DecisionLog(log) as d:
        assert reads == []
        dead.append("amend", error="x", amend_ids=[recs[1].decision_id], amend_reason=_REASON)
        result = d.apply_dead_letter()  # a new entry: checked, applied
        assert result.applied == (recs[1].decision_id,) and result.kept == ("never-logged",)
        assert len(reads) >= 1
    assert dead.changes().amendments == ((("never-logged",), _REASON),)


def test_an_append_waits_for_the_rewrite_and_lands_in_the_new_file(tmp_path: Path) -> None:
    dead = DeadLetter(tmp_path / "log.sqlite.dead-letter.jsonl")
    dead.append("amend", error="x", amend_ids=["a"], amend_reason="r")
    dead.append("amend", error="x", amend_ids=["b"], amend_reason="r")
    first = dead.path.read_bytes().splitlines()[0]
    fd = dead._open_locked(create=False)  # a rewrite under way holds the lock
    assert fd is not None
    t = threading.Thread(
        target=dead.append, args=("amend",), kwargs={"error": "x", "amend_ids": ["c"]}
    )
    t.start()
    time.sleep(0.2)
    assert t.is_alive()  # the append waits for the lock
    os.close(fd)
    t.join(5)
    assert not t.is_alive()
    dead.replace_lines({first: None})
    assert [ids for ids, _ in dead.changes().amendments] == [("b",), ("c",)]


def test_a_line_an_unlocked_writer_appended_during_the_rewrite_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older spotstop appends without the lock: a line it adds to the file being replaced
    is copied into the new one."""
    dead = DeadLetter(tmp_path / "log.sqlite.dead-letter.jsonl")
    dead.append("amend", error="x", amend_ids=["a"], amend_reason="r")
    dead.append("amend", error="x", amend_ids=["b"], amend_reason="r")
    first = dead.path.read_bytes().splitlines()[0]
    real = _journal.atomic_write_bytes

    def with_an_old_writer(path: Any, data: bytes) -> None:
        with open(dead.path, "ab") as fh:  # the old file, before the rename
            fh.write(DeadLetter.encode({"v": 2, "kind": "amend", "ids": ["old"], "reason": "r"}))
        real(path, data)

    monkeypatch.setattr(_journal, "atomic_write_bytes", with_an_old_writer)
    dead.replace_lines({first: None})
    assert [ids for ids, _ in dead.changes().amendments] == [("b",), ("old",)]


def test_retention_applies_what_an_opening_could_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opening that could not apply the dead letter (a retention pass of another process
    held the archives) leaves it to the next retention pass."""
    log, recs = _log_with_archive(tmp_path)
    a0 = recs[0].decision_id
    dead = _dead_letter(log)
    with DecisionLog(log) as other:
        dead.path.write_bytes(_old_line(log, [a0], "RecordError: unknown decision_id"))
        with other._retention_lock():
            d = DecisionLog(log, timeout_s=0.2)  # waits at most its timeout, then opens
        assert _archive_alone(log)[a0][0] == "SAFE" and dead.path.exists()
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[3].time)
        d.close()
    assert _archive_alone(log)[a0] == ("UNSAFE", True, _REASON)
    assert not dead.path.exists()
