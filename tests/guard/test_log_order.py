"""The log's order is the order the guard took its decisions in, not the wall clock's: a
clock stepped back (NTP on a robot whose clock ran ahead) must not reorder the replay of a
stateful policy, nor what calibrate and the card read, live or archived."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics import delivered, read_log
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import SEQ_FLOOR_KEY, ArchiveStore, Protect, Retention
from spotstop.guard._log_schema import COLUMNS
from spotstop.guard.policies import FrozenPolicy, SituationPolicy

from tests._support.log_writer import Segment, policy_config, write_log

T0 = 1_700_000_000.0


def _stepped_log(
    path: Path,
    n: int = 40,
    step_at: int = 20,
    step_s: float = -3600.0,
    *,
    t0: float = T0,
    prefix: str = "d",
) -> list[str]:
    """One situation policy deciding ``n`` scenes of two situations, one a second; the clock
    steps by ``step_s`` before scene ``step_at``. Returns the decision ids in decision order."""
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, n)
    sids = [f"s{i % 2}" for i in range(n)]
    scores = (y - 0.5) * 2.0 + rng.normal(0, 0.8, n) + np.array([0.0, 1.5] * (n // 2))
    members = {"a": scores, "b": scores + rng.normal(0, 0.2, n)}
    pol = SituationPolicy(window=4, min_refs=2, fallback=FrozenPolicy(0.0))
    times = [t0 + i + (step_s if i >= step_at else 0.0) for i in range(n)]
    seg = Segment(
        cfg=policy_config(pol, created=t0 - 100),
        members=members,
        situation_id=sids,
        t0=t0,
        extra=[{"time": t} for t in times],
    )
    labels = [(f"{prefix}{i:05d}", "unsafe" if y[i] else "safe", None, None) for i in range(n)]
    recs = write_log(path, [(seg, prefix)], labels=labels)[prefix]
    return [r.decision_id for r in recs]


def test_a_clock_stepped_back_keeps_the_decision_order(tmp_path: Path) -> None:
    path = tmp_path / "decisions.sqlite"
    ids = _stepped_log(path)
    with DecisionLog(path) as log:
        assert [r.decision_id for r in log.records()] == ids
        assert list(log.to_arrays().decision_id) == ids
    # the card replays the situation windows in that order and finds what the guard did
    d = delivered(read_log(path), n_boot=20, rng=np.random.default_rng(0))
    (p,) = d.by_policy.values()
    assert p.replay.n == len(ids) and p.replay.agreement == 1.0


def test_archived_and_live_rows_keep_the_decision_order(tmp_path: Path) -> None:
    """Times T0+i, stepped back an hour from scene 30: a pass archiving what is older than
    T0+15 takes scenes 0-14 and 30-38 (not 39, the newest: its position must stay the
    largest), and the log reads back 0-14, 15-29 (live), 30-38, 39 (live) in that order."""
    path = tmp_path / "decisions.sqlite"
    ids = _stepped_log(path, n=40, step_at=30)
    with DecisionLog(path) as log:
        res = log.apply_retention(
            Retention(keep_days=1.0), Protect(review=False, min_age_s=0.0), now=T0 + 15 + 86400
        )
        assert res.archived_rows == 24
        live = {r[0] for r in log._conn().execute("SELECT decision_id FROM decisions")}
        assert live == {ids[i] for i in [*range(15, 30), 39]}
        assert [r.decision_id for r in log.records()] == ids
        assert list(log.to_arrays().decision_id) == ids
    d = delivered(read_log(path), n_boot=20, rng=np.random.default_rng(0))
    (p,) = d.by_policy.values()
    assert p.replay.n == len(ids) and p.replay.agreement == 1.0
    with DecisionLog(path) as log:  # the next row's position is above every archived one
        log.append(dataclasses.replace(next(iter(log.records())), decision_id="new", time=T0))
        assert [r.decision_id for r in log.records()] == [*ids, "new"]


def test_retention_never_archives_the_newest_row(tmp_path: Path) -> None:
    path = tmp_path / "decisions.sqlite"
    ids = _stepped_log(path, n=10, step_at=5)
    with DecisionLog(path) as log:
        log.apply_retention(
            Retention(keep_days=1.0), Protect(review=False, min_age_s=0.0), now=T0 + 10 * 86400
        )
        assert [r[0] for r in log._conn().execute("SELECT decision_id FROM decisions")] == [ids[-1]]
        assert [r.decision_id for r in log.records()] == ids


def _previous_release_candidates(self, protect, now, n, older_than):  # type: ignore[no-untyped-def]
    """Retention's choice of rows as the release before log order archived them: by time,
    the newest row included."""
    self._protect(protect, now)
    where = "WHERE rowid NOT IN (SELECT r FROM temp._spotstop_keep)"
    params: list[object] = []
    if older_than is not None:
        where += " AND time < ?"
        params.append(older_than)
    sql = f"SELECT rowid, {', '.join(COLUMNS)} FROM decisions {where} ORDER BY time, rowid LIMIT ?"
    rows = self._conn().execute(sql, [*params, int(n)]).fetchall()
    return [int(r[0]) for r in rows], [tuple(r[1:]) for r in rows]


@pytest.mark.parametrize("key_stored", [True, False], ids=["floor-kept", "older-log"])
def test_a_log_whose_older_retention_archived_its_newest_rows_never_repeats_a_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_stored: bool
) -> None:
    """The previous release archived by time and could empty the table; SQLite then gives the
    next rows positions 1, 2, ... that archived rows hold, and they read back among them.
    The log keeps the largest archived position (and computes it once for a log whose
    archives predate that), and the next row takes the position above it."""
    path = tmp_path / "decisions.sqlite"
    ids = _stepped_log(path, n=10, step_at=10)
    with monkeypatch.context() as mp:
        mp.setattr(ArchiveStore, "_candidates", _previous_release_candidates)
        with DecisionLog(path) as log:
            log.apply_retention(
                Retention(keep_days=1.0), Protect(review=False, min_age_s=0.0), now=T0 + 86400 * 9
            )
            assert log.count() == 10 and not log._fetchall("SELECT 1 FROM decisions", [])
            if not key_stored:  # as a log archived before the key existed
                log._write(
                    lambda c: c.execute("DELETE FROM meta WHERE key = ?", (SEQ_FLOOR_KEY,)),
                    what="t",
                )
    with DecisionLog(path) as log:
        template = next(iter(log.records()))
        for k in range(3):
            log.append(dataclasses.replace(template, decision_id=f"new{k}", time=T0 + k))
        rowids = [r[0] for r in log._fetchall("SELECT rowid FROM decisions ORDER BY rowid", [])]
        assert rowids == [11, 12, 13]
        assert [r.decision_id for r in log.records()] == [*ids, "new0", "new1", "new2"]
        assert list(log.to_arrays().decision_id) == [*ids, "new0", "new1", "new2"]
        assert log.seq_floor() == 10


def test_the_card_names_the_policy_of_the_last_decision_as_deployed(tmp_path: Path) -> None:
    """v1 decides while the clock runs an hour ahead; NTP steps it back; v2 is activated. The
    deployed policy is v2 (it made the last decision), though v1 first decided 'later'."""
    from spotstop.diagnostics._card import _deployed
    from spotstop.guard.policies import ConformalPolicy

    path = tmp_path / "decisions.sqlite"
    rng = np.random.default_rng(0)
    n = 20
    m = {"a": rng.normal(0, 1, n), "b": rng.normal(0, 1, n)}
    sid = [f"s{i}" for i in range(n)]
    v1 = policy_config(ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.6), created=T0 - 7200)
    v2 = policy_config(FrozenPolicy(0.0), version=2, created=T0 - 7200)
    write_log(path, [(Segment(v1, m, sid, T0), "a"), (Segment(v2, m, sid, T0 - 3600 + n), "b")])
    log = read_log(path)
    assert list(log.policies) == [v1.version_id, v2.version_id]  # in log order
    assert _deployed(log) == ("frozen", v2.version_id)


def test_an_archive_read_alone_is_in_log_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An archive the previous release wrote holds its rows by time; read without its log
    (a fleet's collected file) it comes back by position, as through its log."""
    from spotstop.guard._log_archive import read_archive_file

    path = tmp_path / "decisions.sqlite"
    ids = _stepped_log(path, n=40, step_at=20)
    monkeypatch.setattr(ArchiveStore, "_candidates", _previous_release_candidates)
    with DecisionLog(path) as log:
        log.apply_retention(
            Retention(keep_days=1.0), Protect(review=False, min_age_s=0.0), now=T0 + 86400 * 9
        )
        (info,) = log.archives()
        af = read_archive_file(log.archive_folder / info.name)
    assert list(af.seqs) == sorted(af.seqs)
    assert [row[COLUMNS.index("decision_id")] for row in af.rows] == ids


def test_a_fleet_keeps_one_robots_collected_archives_of_two_logs_in_order(tmp_path: Path):
    """A robot's old log (its clock stepped back inside it) and its new one (a new bundle's
    log: positions from 1 again), each collected as archives only: the fleet reads the old
    log's decisions in its order, then the new log's, whatever the files are called."""
    from spotstop.diagnostics._fleet import read_fleet

    files = []
    want: list[str] = []
    for name, t0 in (("b-old", T0), ("a-new", T0 + 86400)):
        path = tmp_path / name / "decisions.sqlite"
        path.parent.mkdir()
        ids = _stepped_log(path, n=20, step_at=10, t0=t0, prefix=f"{name}-")
        with DecisionLog(path, robot_id="arm") as log:
            log.apply_retention(
                Retention(keep_days=1.0),
                Protect(review=False, min_age_s=0.0),
                now=t0 + 86400 * 9,
                max_rows_per_file=7,  # three files of one log
            )
            for j, info in enumerate(log.archives()):
                dst = tmp_path / "collected" / f"{name}-{j}.parquet"
                dst.parent.mkdir(exist_ok=True)
                shutil.copy(log.archive_folder / info.name, dst)
                files.append(dst)
        want += ids[:-1]  # the newest row stays live
    fleet = read_fleet(sorted(files))
    assert fleet.robots == ["arm"]
    assert list(fleet.arrays.decision_id) == want
