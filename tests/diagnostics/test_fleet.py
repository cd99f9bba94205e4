"""A fleet's logs and archives read as one log: ``spotstop card LOG LOG ...`` (diagnostics/_fleet.py)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.diagnostics import DataError
from spotstop.diagnostics._cli import card_main
from spotstop.diagnostics._fleet import expand_inputs, fleet_robots, read_fleet
from spotstop.diagnostics._from_log import read_log, robot_of_path
from spotstop.guard._log import DecisionLog, DecisionRecord, LogError, RecordError, Retention

from tests._support.log_writer import (
    CONFORMAL_CONFIG,
    Segment,
    policy_row,
    segment_records,
)

T0 = 1_750_000_000.0


def _robot(name: str, k: int, *, n_pairs: int = 40, shift: float = 1.6, seed: int = 0):
    """A robot's decisions: ``n_pairs`` contrasts (one situation each), decided by CONFORMAL_CONFIG, and
    the reviewers' labels ``(id, label, contrast)``."""
    rng = np.random.default_rng(seed)
    y = np.tile([0, 1], n_pairs)
    a = rng.normal(0, 1, y.size) + shift * y
    b = rng.normal(0, 1, y.size) + shift * y
    sit = [f"s{j // 2}" for j in range(y.size)]
    seg = Segment(CONFORMAL_CONFIG, {"a": a, "b": b}, sit, T0 + k / 10.0)
    recs = segment_records(seg, f"{name}-")
    recs = [r for r in recs]
    labels = [
        (r.decision_id, "unsafe" if y[j] else "safe", f"c{j // 2}", "rev")
        for j, r in enumerate(recs)
    ]
    # times interleave across robots, one second apart within a robot
    return recs, labels


def _write(path: Path, robot: str | None, recs: list[DecisionRecord], labels) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with DecisionLog(path, robot_id=robot) as log:
        log.append_many(recs, policy=policy_row(CONFORMAL_CONFIG))
        log.set_labels(labels)
    return path


def _prefixed(robot: str, recs, labels):
    import dataclasses

    out = [dataclasses.replace(r, situation_id=f"{robot}/{r.situation_id}") for r in recs]
    return out, [(i, lab, f"{robot}/{c}", who) for i, lab, c, who in labels]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fleet")
    parts = {r: _robot(r, k, seed=k) for k, r in enumerate(("arm-1", "arm-2", "arm-3", "arm-4"))}
    logs = root / "robots"
    _write(logs / "arm-1" / "decisions.sqlite", None, *parts["arm-1"])  # robot from its folder
    _write(logs / "arm-2.sqlite", "arm-2", *parts["arm-2"])
    trimmed = _write(logs / "arm-3" / "decisions.sqlite", "arm-3", *parts["arm-3"])
    with DecisionLog(trimmed) as log:  # half of it lives in archives beside the log
        res = log.apply_retention(Retention(max_bytes=log.used_bytes() * 3 // 4))
        assert res.archived_rows > 10
    # arm-4: only its archive was collected (its log stayed on the robot); labels in a file
    gone = _write(root / "arm-4-on-robot" / "decisions.sqlite", "arm-4", *parts["arm-4"])
    with DecisionLog(gone) as log:
        log.apply_retention(Retention(keep_days=1), now=T0 + 10 * 86400)
        [info] = log.archives()
        collected = root / "collected" / "arm-4.parquet"
        collected.parent.mkdir()
        shutil.copy(log.archive_folder / info.name, collected)
        # the newest decision stays in the live log (retention never archives a log's newest
        # row: guard/_log_read.py), so the collected archive holds all but it
        (kept,) = [r[0] for r in log._conn().execute("SELECT decision_id FROM decisions")]
    recs4, labels4 = parts["arm-4"]
    assert kept == recs4[-1].decision_id
    parts["arm-4"] = (recs4[:-1], [lab for lab in labels4 if lab[0] != kept])
    labels_file = root / "arm-4-labels.csv"
    labels_file.write_text(
        "decision_id,label,contrast_id\n"
        + "".join(f"{i},{lab},{c}\n" for i, lab, c, _ in parts["arm-4"][1])
    )
    # the same decisions in one log, with the ids the fleet card groups by
    merged = root / "merged" / "decisions.sqlite"
    recs_all, labels_all = [], []
    for r, (recs, labels) in parts.items():
        pr, pl = _prefixed(r, recs, labels)
        recs_all += pr
        labels_all += pl
    recs_all.sort(key=lambda r: r.time)
    _write(merged, "merged", recs_all, labels_all)
    return {
        "root": root,
        "inputs": [str(logs), str(collected)],
        "labels": labels_file,
        "merged": merged,
        "parts": parts,
    }


def test_robot_ids_are_kept_and_taken_from_the_path_where_the_log_has_none(fleet) -> None:
    data = read_fleet(fleet["inputs"], labels=fleet["labels"])
    assert data.robots == ["arm-1", "arm-2", "arm-3", "arm-4"]  # time order of first decision
    assert data.n == 4 * 80 - 1 and data.archived["rows"] > 10 + 79  # arm-4: its archive
    for r, (recs, _) in fleet["parts"].items():
        mine = data.robot_id == r
        assert set(data.arrays.decision_id[mine]) == {x.decision_id for x in recs}
    assert (data.label >= 0).all()  # arm-4's labels came from the file
    assert np.all(np.diff(data.arrays.time) > 0)
    contrast, situation = data.group_ids()
    assert contrast[0] == "arm-1/c0" and situation[0] == "arm-1/s0"
    assert robot_of_path(Path("f/arm-9/decisions.sqlite")) == "arm-9"
    assert robot_of_path(Path("f/arm-9.sqlite")) == "arm-9"
    assert robot_of_path(Path("f/arm-9/decisions.sqlite.archive/x.parquet")) == "arm-9"


def _card(inputs: list[str], out: Path, *extra: str) -> dict[str, Any]:
    assert card_main([*inputs, "--out", str(out), "--n-boot", "300", "--quiet", *extra]) == 0
    return json.loads((out / "card.json").read_text())


def test_the_fleet_card_is_the_card_of_the_merged_log(fleet, tmp_path: Path) -> None:
    a = _card(fleet["inputs"], tmp_path / "fleet", "--labels", str(fleet["labels"]))
    b = _card([str(fleet["merged"])], tmp_path / "merged")
    assert a["checks"].pop("fleet")["applicable"] and not b["checks"].pop("fleet")["applicable"]
    assert a["provenance"]["log"]["robots"] == {"arm-1": 80, "arm-2": 80, "arm-3": 80, "arm-4": 79}
    for doc in (a, b):
        for key in ("source", "created_utc", "log"):
            doc["provenance"].pop(key)
        for v in doc["delivered_by_policy"].values():
            v["replay"].pop("note")  # says the fleet's robots were replayed apart
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_each_log_and_archive_counts_once(fleet) -> None:
    logs = Path(fleet["inputs"][0])
    arm3 = logs / "arm-3" / "decisions.sqlite"
    beside = sorted((logs / "arm-3" / "decisions.sqlite.archive").glob("*.parquet"))
    got = expand_inputs([str(arm3), str(beside[0])])  # the archive its log reads is left out
    assert got == [arm3.resolve()]
    copy = logs.parent / "copy.sqlite"
    shutil.copy(arm3, copy)  # without its archive folder: that is said, never read as less
    with pytest.raises(DataError, match=r"copy.sqlite.archive/.*registered in the log but"):
        read_fleet([str(copy)])
    arm2 = logs / "arm-2.sqlite"
    shutil.copy(arm2, copy)
    with pytest.raises(DataError, match=r"is in .*arm-2.*and in .*copy.sqlite.*give each log"):
        read_fleet([str(arm2), str(copy)])
    copy.unlink()
    with pytest.raises(DataError, match=r"names no decision log"):
        read_fleet([str(logs / "nothing-*.sqlite")])


def test_a_log_of_another_schema_is_migrated_or_refused_by_name(fleet, tmp_path: Path) -> None:
    src = Path(fleet["inputs"][0]) / "arm-2.sqlite"
    newer = tmp_path / "arm-5.sqlite"
    shutil.copy(src, newer)
    with sqlite3.connect(newer) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    c.close()
    with pytest.raises(DataError, match=r"arm-5.sqlite.*schema_version 99"):
        read_fleet([str(src), str(newer)])


def test_one_log_of_another_robot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "decisions.sqlite"
    DecisionLog(path, robot_id="arm-1").close()
    with pytest.raises(LogError, match=r"belongs to robot 'arm-1', not 'arm-2'"):
        DecisionLog(path, robot_id="arm-2")
    with DecisionLog(path, robot_id="arm-1") as log:
        assert log.robot_id == "arm-1"
    with pytest.raises(RecordError, match="robot_id must be 1-64 characters"):
        DecisionLog(tmp_path / "x.sqlite", robot_id="arm 1/")
    assert not (tmp_path / "x.sqlite").exists()  # bad input changed nothing
    with pytest.raises(DataError, match="holds no decisions"):
        read_log(path)


def _fleet(tmp: Path, shifts: dict[str, float], seed: int, n_pairs: int = 40):
    paths = []
    for k, (r, shift) in enumerate(shifts.items()):
        recs, labels = _robot(r, k, n_pairs=n_pairs, shift=shift, seed=1000 * seed + k)
        paths.append(str(_write(tmp / f"{r}.sqlite", r, recs, labels)))
    return read_fleet(paths)


def test_the_robot_that_differs_is_flagged_with_the_hand_computed_rates(tmp_path: Path) -> None:
    data = _fleet(tmp_path, {"arm-1": 1.6, "arm-2": 1.6, "arm-3": -0.5, "arm-4": 1.6}, seed=1)
    rows = {r.robot: r for r in fleet_robots(data, n_boot=500, rng=np.random.default_rng(0))}
    bad = rows["arm-3"]
    assert bad.flagged and bad.vs_rest.ci.high < 0 and bad.miss_vs_rest.ci.low > 0
    assert "balanced accuracy below the rest's" in bad.flagged
    assert not rows["arm-1"].flagged and not rows["arm-2"].flagged
    for r, row in rows.items():  # the point values, by hand
        mine = (data.robot_id == r) & data.delivered
        y, f = data.label[mine], data.arrays.guard_label[mine]
        ba = 0.5 * (np.mean(f[y == 1] == 1) + np.mean(f[y == 0] == 0))
        assert row.balanced_accuracy.value == pytest.approx(ba, abs=1e-12)
        assert row.miss_rate.value == pytest.approx(np.mean(f[y == 1] == 0), abs=1e-12)
        rest = (data.robot_id != r) & data.delivered
        yr, fr = data.label[rest], data.arrays.guard_label[rest]
        ba_r = 0.5 * (np.mean(fr[yr == 1] == 1) + np.mean(fr[yr == 0] == 0))
        assert row.vs_rest.value == pytest.approx(ba - ba_r, abs=1e-12)
        lo, hi = row.vs_rest.ci.low, row.vs_rest.ci.high
        b_lo, b_hi = row.balanced_accuracy.ci.low, row.balanced_accuracy.ci.high
        assert lo <= row.vs_rest.value <= hi and b_lo <= row.balanced_accuracy.value <= b_hi


def test_a_fleet_of_alike_robots_is_flagged_at_no_more_than_the_stated_rate(
    tmp_path: Path,
) -> None:
    flagged_fleets = 0
    for seed in range(20):
        data = _fleet(tmp_path / str(seed), {f"arm-{k}": 1.2 for k in range(4)}, seed, 30)
        rows = fleet_robots(data, n_boot=300, rng=np.random.default_rng(seed))
        flagged_fleets += any(r.flagged for r in rows)
    # family-wise 5 % per fleet: P(4 or more of 20 fleets | 5 %) = 0.016
    assert flagged_fleets <= 3


def test_one_robot_has_no_fleet_section(fleet) -> None:
    from spotstop.diagnostics._check_base import CardContext
    from spotstop.diagnostics._fleet import FleetCheck
    from spotstop.diagnostics._from_log import log_cases

    cases = log_cases(Path(fleet["inputs"][0]) / "arm-2.sqlite")
    assert cases.log.robots == ["arm-2"] and cases.provenance["robots"] == {"arm-2": 80}
    ctx = CardContext(cases.table, 0.6, np.random.default_rng(0), log=cases.log)
    res = FleetCheck().run(ctx)
    assert res.data == {"applicable": False}


def test_a_robot_with_too_few_groups_is_not_compared(tmp_path: Path) -> None:
    """A robot with fewer than MIN_GROUPS groups: its percentile interval at the Bonferroni
    level undercovers (a robot like the rest was flagged in 11 % of fleets at 3 situations),
    so it is shown but not compared, and its row says why."""
    from spotstop.diagnostics._resample import MIN_GROUPS

    paths = []
    for k, (r, n_pairs, shift) in enumerate(
        [("arm-1", 40, 1.6), ("arm-2", 40, 1.6), ("arm-3", 3, -3.0), ("arm-4", 40, 1.6)]
    ):
        recs, labels = _robot(r, k, n_pairs=n_pairs, shift=shift, seed=k)
        paths.append(str(_write(tmp_path / f"{r}.sqlite", r, recs, labels)))
    data = read_fleet(paths)
    rows = {r.robot: r for r in fleet_robots(data, n_boot=300, rng=np.random.default_rng(0))}
    few = rows["arm-3"]
    assert few.groups == 3 < MIN_GROUPS and not few.flagged
    assert "not compared: 3 groups" in few.note
    assert few.balanced_accuracy.value < rows["arm-1"].balanced_accuracy.value  # still shown
    assert all(rows[r].groups == 40 and not rows[r].note for r in ("arm-1", "arm-2", "arm-4"))


def test_the_conformal_miss_rate_counts_what_a_conformal_fallback_decided(
    tmp_path: Path,
) -> None:
    """The fleet's "conformal miss rate" took the decisions of conformal policy versions; the
    conformal audit takes those a conformal cut decided (``deciding_kind``). A situation
    policy whose conformal fallback missed every unsafe scene on one robot showed "n=0" there
    and was never flagged. Both read one rule now."""
    from spotstop.diagnostics._conformal_audit import audit_deployed, decided_by_conformal
    from spotstop.guard.policies import ConformalPolicy, SituationPolicy

    from tests._support.log_writer import Segment, policy_config, policy_row, segment_records

    cfg = policy_config(
        SituationPolicy(
            window=8, min_refs=3, fallback=ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.0)
        )
    )
    for k, (name, unsafe_mean) in enumerate((("good", 3.0), ("good2", 3.0), ("bad", -1.0))):
        rng = np.random.default_rng(k)
        y = np.tile([0, 1], 40)
        mu = np.where(y == 1, unsafe_mean, -2.0)
        scores = {"a": rng.normal(mu, 0.5), "b": rng.normal(mu, 0.5)}
        sit = [f"s{j // 2}" for j in range(y.size)]  # 2 scenes a situation: the fallback decides
        recs = segment_records(Segment(cfg, scores, sit, 1_750_000_000.0 + k / 10), f"{name}-")
        labels = [
            (r.decision_id, "unsafe" if y[j] else "safe", f"c{j // 2}", "rev")
            for j, r in enumerate(recs)
        ]
        with DecisionLog(tmp_path / f"{name}.sqlite", robot_id=name) as log:
            log.append_many(recs, policy=policy_row(cfg))
            log.set_labels(labels)
    data = read_fleet([str(tmp_path)])
    assert decided_by_conformal(data).all()  # every decision: the fallback's
    robots = {r.robot: r for r in fleet_robots(data, n_boot=200, rng=np.random.default_rng(0))}
    bad = robots["bad"]
    # by hand: the bad robot's fallback answered SAFE on each of its 40 unsafe scenes
    assert bad.miss_rate.n == 40 and bad.miss_rate.value == 1.0
    assert "conformal miss rate above the rest's" in bad.flagged
    assert robots["good"].miss_rate.value == 0.0
    (audit,) = audit_deployed(data)
    assert audit.status == "violated"


def test_a_robot_whose_log_holds_no_decision_is_named(tmp_path: Path) -> None:
    """A robot that logged nothing (its guard never ran, or its log was not collected) was
    missing from the fleet section, as if the fleet had one robot fewer."""
    from spotstop.diagnostics._check_base import CardContext
    from spotstop.diagnostics._fleet import FleetCheck
    from spotstop.diagnostics._from_log import log_cases

    paths = []
    for k, r in enumerate(("arm-1", "arm-2")):
        recs, labels = _robot(r, k, seed=k)
        paths.append(str(_write(tmp_path / f"{r}.sqlite", r, recs, labels)))
    DecisionLog(tmp_path / "arm-9.sqlite", robot_id="arm-9").close()
    for given, robots in ((paths, ["arm-1", "arm-2"]), (paths[:1], ["arm-1"])):
        cases = log_cases([*given, str(tmp_path / "arm-9.sqlite")])
        assert cases.log.robots == robots and cases.log.idle_robots == ("arm-9",)
        ctx = CardContext(cases.table, 0.6, np.random.default_rng(0), log=cases.log)
        res = FleetCheck().run(ctx)
        assert res.data["applicable"] and res.data["idle"] == ["arm-9"]
        assert [r["robot"] for r in res.data["robots"]] == (robots if len(robots) > 1 else [])
        (row,) = [t for t in res.rows if t[0].startswith("robot arm-9")]
        assert row[0] == "robot arm-9 (n=0)" and "no decision" in row[1]
