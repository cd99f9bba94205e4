"""Where ``policy diff`` / ``recalibrate`` start a stateful policy's replay of the log.

``recalibrate`` fits a situation policy's ``state_seed`` from the log (the last ``window``
scores of each situation) and then showed the new policy's effect by replaying that same log
FROM that seed: every decision's cut was a situation mean that already held its own score
and the later ones. With strong situation offsets the operator read "miss rate 0.0% of 80"
where the guard, starting from the state it would have held, misses 30%. The replay now
starts from the state before the first replayed decision: empty windows when the seed holds
a replayed decision, the seed when it was fitted only on earlier decisions.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from spotstop.calibrate import Recalibrator, diff_policies, predict_effect
from spotstop.calibrate._logdata import read_log_for_bundle
from spotstop.guard._bundle import load_bundle
from spotstop.guard._log import DecisionLog
from spotstop.guard.policies import PolicyConfig, SituationPolicy, dump_policy

from tests._support.calibration_logs import (
    FIXED,
    T0,
    fake_bundle,
    frozen_policy,
    usable_record,
)

N_SIT = 80
PER = (0, 1, 0)  # three scenes per situation, one unsafe


def _offset_log(path: Path, bundle: Path) -> None:
    """Situations whose offsets (sd 2) dwarf the class gap (1.5): only a situation's own
    mean separates its scenes, and a fresh situation has no mean yet."""
    b = load_bundle(bundle, verify=False)
    g = np.random.default_rng(0)
    recs, labels, t = [], [], T0
    for s in range(N_SIT):
        off = g.normal(0, 2.0)
        for j, y in enumerate(PER):
            z = 1.5 * (y - 0.5) + off + g.normal(0, 0.3)
            t += 60
            did = f"d{s}-{j}"
            recs.append(usable_record(b, t, did, f"s{s}", {"a": z, "b": z}))
            labels.append((did, "unsafe" if y else "safe", None, "sim"))
    with DecisionLog(path) as log:
        log.append_many(recs)
        log.set_labels(labels)


def _setup(tmp_path: Path) -> Path:
    bundle = fake_bundle(tmp_path / "bundle")
    dump_policy(frozen_policy(bundle, 0.0), bundle / "policy.yaml")
    _offset_log(tmp_path / "log.sqlite", bundle)
    return bundle


def _fit(bundle: Path, log: Path, **window: str) -> PolicyConfig:
    data = read_log_for_bundle(log, load_bundle(bundle, verify=False), **window)  # type: ignore[arg-type]
    current = frozen_policy(bundle, 0.0)
    settings = {"prior_weight": 0.0, "min_refs": 3, "window": 8}
    return Recalibrator("situation", settings=settings).fit(data, current).to_config(created=FIXED)


def _decide_in_order(cfg: PolicyConfig, data, state) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The policy's own decide, one decision at a time in log order, threading its state."""
    flags = []
    for i in range(data.n):
        scores = {m: data.member_scores[m][i : i + 1] for m in cfg.fusion.members}
        d = cfg.decide(scores, [data.logged_situation_id[i]], state=state)
        flags.append(d.verdicts[0].label == "UNSAFE")
        state = d.state
    return np.array(flags)[data.usable]


def test_recalibrates_effect_is_not_replayed_from_the_seed_it_fitted_on_the_same_log(
    tmp_path: Path,
) -> None:
    bundle = _setup(tmp_path)
    log = tmp_path / "log.sqlite"
    cfg = _fit(bundle, log)
    assert isinstance(cfg.policy, SituationPolicy) and cfg.state_seed is not None
    data = read_log_for_bundle(log, load_bundle(bundle, verify=False))
    eff = predict_effect(cfg, data)
    y = data.label[data.usable]
    assert eff.n == 3 * N_SIT and int((y == 1).sum()) == N_SIT

    # independent: the policy's own decide over the sequence from empty windows
    empty = _decide_in_order(cfg, data, None)
    assert np.array_equal(eff.flags, empty)
    assert eff.miss_rate == float((~empty[y == 1]).mean())
    # and by hand: 3 scenes a situation never reach min_refs 3 before the scene, so from
    # empty windows every scene meets the fallback's frozen cut on the fitted fusion
    st = cfg.fusion.stats
    fused = np.mean([(data.member_scores[m] - st[m].median) / st[m].iqr for m in ("a", "b")], 0)
    t0 = cfg.policy.fallback.threshold  # type: ignore[attr-defined]
    by_hand = fused[data.usable] >= t0
    assert np.array_equal(eff.flags, by_hand)
    assert eff.miss_rate == float((~by_hand[y == 1]).mean()) > 0.2

    # the in-sample number the old replay showed (from the seed fitted on these decisions)
    in_sample = _decide_in_order(cfg, data, cfg.initial_state())
    assert float((~in_sample[y == 1]).mean()) < 0.05 < eff.miss_rate

    # the output says which start it used, and the seed records the decisions it holds
    assert eff.start == "empty" and eff.to_dict()["start"] == "empty"
    assert "from empty state, not its state seed" in eff.note
    first, last = (datetime.fromtimestamp(float(t), UTC) for t in (data.time[0], data.time[-1]))
    assert cfg.fitted_on["state_seed"]["decisions"] == [first.isoformat(), last.isoformat()]
    diff = diff_policies(frozen_policy(bundle, 0.0), cfg, data, names=("active", "new"))
    assert "new: situation: replayed in log order" in str(diff)
    assert "from empty state, not its state seed" in str(diff)
    assert diff.effect_b is not None and diff.effect_b.miss_rate == eff.miss_rate


def test_a_seed_fitted_on_earlier_decisions_starts_the_replay(tmp_path: Path) -> None:
    """A seed fitted only on decisions before the replayed ones is the state the guard had
    when it started on them: the replay starts from it (and from empty windows on a window
    that overlaps the seed's decisions)."""
    from dataclasses import replace

    from spotstop.calibrate._diff import replay_start
    from spotstop.calibrate._logdata import iso_time

    bundle = _setup(tmp_path)
    log = tmp_path / "log.sqlite"
    mid = iso_time(T0 + 60 * 3 * (N_SIT // 2) + 30)  # between situation 39 and 40
    cfg = _fit(bundle, log, until=mid)
    later = read_log_for_bundle(log, load_bundle(bundle, verify=False), since=mid)
    # a log that holds only the later decisions (the seed came from another one)
    alone = replace(later, earlier=None)
    state, start, why = replay_start(cfg, alone)
    assert start == "seed" and "before the first replayed one" in why
    assert state == cfg.initial_state()
    eff = predict_effect(cfg, alone)
    assert eff.start == "seed"
    assert np.array_equal(eff.flags, _decide_in_order(cfg, later, cfg.initial_state()))
    # this log also holds the decisions before --since, the seed's among them: the replay
    # runs them first, from empty windows (not on top of a seed that holds them)
    assert later.earlier is not None and later.earlier.n == 3 * (N_SIT // 2)
    primed = predict_effect(cfg, later)
    assert primed.start == "empty" and "primed with the 120 decisions before --since" in primed.note
    assert np.array_equal(primed.flags, eff.flags)

    everything = read_log_for_bundle(log, load_bundle(bundle, verify=False))
    assert replay_start(cfg, everything)[1] == "empty"


def test_a_seed_not_fitted_on_logged_decisions_starts_the_replay(tmp_path: Path) -> None:
    """``policy init``'s pool seed (or a written-out one) is what the guard starts from."""
    from dataclasses import replace

    from spotstop.calibrate._diff import replay_start

    bundle = _setup(tmp_path)
    log = tmp_path / "log.sqlite"
    cfg = _fit(bundle, log)
    pool = replace(cfg, fitted_on={"what": "unlabelled pool (frozen reference statistics)"})
    data = read_log_for_bundle(log, load_bundle(bundle, verify=False))
    eff = predict_effect(pool, data)
    assert eff.start == "seed" and "not fitted on logged decisions" in eff.note
    assert np.array_equal(eff.flags, _decide_in_order(pool, data, pool.initial_state()))
    # a recalibrated file that says it came from a log but not from which decisions: empty
    vague = replace(cfg, fitted_on={"state_seed": {"n_scores": 3}})
    assert replay_start(vague, data)[1] == "empty"


def test_a_window_after_the_start_replays_what_the_guard_decided(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """``--since`` after the guard's situation policy had been deciding: the guard's windows at
    ``since`` held the decisions before it. A replay that starts from empty windows at
    ``since`` (the policy has no seed) gave other labels than the guard's for the same policy
    on its own decisions (28 decisions: flag rate 0.464 predicted, 0.607 logged). The replay
    now runs the earlier decisions first, and predicts exactly what the guard logged."""
    from spotstop.calibrate._logdata import iso_time
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import Guard, load_policy

    log = tmp_path / "decisions.sqlite"
    with Guard(bundle_copy, log=log, state_dir=tmp_path / "state") as g:  # window 8, min_refs 3
        for b in range(16):
            sids = [f"room-{(b + i) % 3}" for i in range(4)]
            g.check_batch(demo_scenes(4, seed=500 + b, situations=sids))
    with DecisionLog(log) as opened:
        arr = opened.to_arrays()
    t = np.asarray(arr.time, dtype=float)
    assert t[35] < t[36]
    cut = (t[35] + t[36]) / 2  # before batch 9: every room has a full window by then
    since = iso_time(cut)
    active = load_policy(bundle_copy / "policy.yaml")
    assert isinstance(active.policy, SituationPolicy) and active.state_seed is None
    data = read_log_for_bundle(log, load_bundle(bundle_copy, verify=False), since=since)
    assert data.n == 28

    eff = predict_effect(active, data)
    guard_said = (arr.guard_label == 1)[t >= cut][data.usable]
    assert eff.n == guard_said.size == 28
    assert np.array_equal(eff.flags, guard_said)
    assert eff.start == "empty"
    assert data.earlier is not None and data.earlier.n == 36
    assert (
        "from empty state (the policy has no state seed); primed with the 36 decisions before"
        in eff.note
    )
    # regrouped in batches of 4 from --since (the guard's batches), the same
    assert np.array_equal(predict_effect(active, data, batch_size=4).flags, guard_said)
    # the CLI's diff of the active policy with itself shows the same
    diff = diff_policies(active, active, data, names=("active", "active"))
    assert diff.effect_b is not None and diff.effect_b.flag_rate == float(guard_said.mean())
    assert any("primed with the 36 decisions before --since" in n for n in diff.notes)
