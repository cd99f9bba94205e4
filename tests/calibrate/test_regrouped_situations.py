"""A labels file may regroup the log's situations (its ``situation_id`` column): a reviewer puts
the robot's ``robot-sit-0..2`` in one ``kitchen``. That grouping is for the statistics (the
bootstrap's groups, conformal's one case per situation); what replays the guard's decisions
(the card's replay, ``policy diff``) and the windows a new policy starts from read the ids the
guard was given. The card said 35 of 40 answers were reproduced where the policy in force
reproduces 40 of 40, and the new state seed was keyed by ``kitchen``, an id the guard never
sees."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from spotstop.calibrate._diff import predict_effect
from spotstop.calibrate._logdata import read_log_for_bundle
from spotstop.calibrate._recalibrate import Recalibrator
from spotstop.diagnostics import read_log
from spotstop.diagnostics._delivered import replay_version
from spotstop.export.scenes import demo_scenes
from spotstop.guard import DecisionLog, Guard, load_bundle, load_policy


def test_replays_and_seeds_read_the_guards_situation_ids_not_a_regrouping(
    bundle_copy: Path, tmp_path: Path
) -> None:
    log = tmp_path / "decisions.sqlite"
    with Guard(bundle_copy, log=log, state_dir=tmp_path / "state") as g:  # its situation policy
        for b in range(10):
            sids = [f"robot-sit-{(b + i) % 3}" for i in range(4)]
            g.check_batch(demo_scenes(4, seed=300 + b, situations=sids))
    with DecisionLog(log) as opened:
        arr = opened.to_arrays()
    labels = tmp_path / "labels.csv"
    rng = np.random.default_rng(1)
    with labels.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["decision_id", "label", "situation_id"])
        for d in arr.decision_id:
            w.writerow([d, "unsafe" if rng.random() < 0.5 else "safe", "kitchen"])
    robot = {"robot-sit-0", "robot-sit-1", "robot-sit-2"}
    current = load_policy(bundle_copy / "policy.yaml")
    guard_said = arr.guard_label == 1
    for with_labels in (None, labels):
        card = read_log(log, labels=with_labels)
        r = replay_version(card, card.versions()[0])
        assert (r.n, r.n_agree) == (40, 40), (with_labels, r)
        data = read_log_for_bundle(log, load_bundle(bundle_copy, verify=False), labels=with_labels)
        # the statistics group by the reviewer's situations; the replay and seed by the guard's
        assert set(data.situation_id) == ({"kitchen"} if with_labels else robot)
        assert set(data.logged_situation_id) == robot
        eff = predict_effect(current, data)
        assert eff.n == 40 and np.array_equal(eff.flags, guard_said[data.usable])
        fit = Recalibrator("situation", settings={"window": 8, "min_refs": 3}).fit(data, current)
        assert set(fit.state_seed_.situations) == robot
