"""The log's order is the order the guard took its decisions in, not the wall clock's: a
clock stepped back (NTP on a robot whose clock ran ahead) must not reorder the replay of a
stateful policy, nor what calibrate and the card read, live or archived."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from spotstop.diagnostics import delivered, read_log
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import Protect, Retention
from spotstop.guard.policies import FrozenPolicy, SituationPolicy

from tests._support.log_writer import Segment, policy_config, write_log

T0 = 1_700_000_000.0


def _stepped_log(path: Path, n: int = 40, step_at: int = 20, step_s: float = -3600.0) -> list[str]:
    """One situation policy deciding ``n`` scenes of two situations, one a second; the clock
    steps by ``step_s`` before scene ``step_at``. Returns the decision ids in decision order."""
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, n)
    sids = [f"s{i % 2}" for i in range(n)]
    scores = (y - 0.5) * 2.0 + rng.normal(0, 0.8, n) + np.array([0.0, 1.5] * (n // 2))
    members = {"a": scores, "b": scores + rng.normal(0, 0.2, n)}
    pol = SituationPolicy(window=4, min_refs=2, fallback=FrozenPolicy(0.0))
    times = [T0 + i + (step_s if i >= step_at else 0.0) for i in range(n)]
    seg = Segment(
        cfg=policy_config(pol, created=T0 - 100),
        members=members,
        situation_id=sids,
        t0=T0,
        extra=[{"time": t} for t in times],
    )
    labels = [(f"d{i:05d}", "unsafe" if y[i] else "safe", None, None) for i in range(n)]
    recs = write_log(path, [(seg, "d")], labels=labels)["d"]
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
