"""Recalibration from the decision log: fits, versions, diff, CLI, hot reload."""

from __future__ import annotations

import csv
import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from spotstop.calibrate import (
    CalibrationError,
    Recalibrator,
    activate_policy_version,
    active_policy_version,
    diff_policies,
    list_policy_versions,
    predict_effect,
    read_calibration_log,
    write_policy_version,
)
from spotstop.calibrate._logdata import read_log_for_bundle
from spotstop.cli import main
from spotstop.guard._bundle import load_bundle
from spotstop.guard.policies import (
    ConformalPolicy,
    PolicyError,
    SituationPolicy,
    TextInScene,
    dump_policy,
    load_policy,
)

from tests._support.calibration_logs import (
    FIXED,
    T0,
    fake_bundle,
    frozen_policy,
    one_situation_log,
    simulate_decisions,
    usable_record,
)

# ------------------------------------------------------------------ helpers


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    bundle = fake_bundle(tmp_path / "bundle")
    truth = simulate_decisions(tmp_path / "log.sqlite", bundle)
    dump_policy(frozen_policy(bundle, 0.0), bundle / "policy.yaml")
    return bundle, tmp_path / "log.sqlite", truth


def _data(bundle: Path, log: Path, **kw):
    return read_log_for_bundle(log, load_bundle(bundle, verify=False), **kw)


# ------------------------------------------------------------------ reading and fitting


def test_read_log_keeps_one_bundle_and_counts_what_it_drops(setup):
    bundle, log, _ = setup
    d = _data(bundle, log)
    assert d.n == 242 and d.n_decisions == 243
    assert d.dropped == {"other_bundle": 1, "fail_closed": 1, "nonfinite_member_score": 1}
    assert [(o.bundle_id, o.n) for o in d.other_bundles] == [("another", 1)]
    assert "other bundles, left out" in Recalibrator("conformal").fit(d).summary()
    only_other = _data(bundle, log, since=float(d.time.max()) + 0.5)
    assert only_other.n == 0 and only_other.dropped["other_bundle"] == 1
    with pytest.raises(CalibrationError, match=r"left out .*: bundle another \(prompt .*\): 1 dec"):
        Recalibrator("conformal").fit(only_other)
    c = d.counts()
    assert c["usable"] == 240 and c["unsafe"] + c["safe"] == 240 and c["unlabelled"] == 0
    w = _data(bundle, log, since=T0 + 60 * 120 + 1, until="2100-01-01")
    assert w.counts()["usable"] == 120 and w.since is not None
    with pytest.raises(CalibrationError, match="ISO-8601"):
        _data(bundle, log, since="yesterday")


def test_a_decision_answered_unsafe_whose_amendment_waits_is_never_fitted_as_safe(
    setup, capsys: pytest.CaptureFixture[str]
):
    """A SAFE row whose fail-closed amendment lies in the dead letter (the log could not
    store it), or waits in the guard's journal, was answered UNSAFE: recalibrate and policy
    diff read it so, and say that the log does not say it yet, and how many decisions the log
    lacks."""
    from spotstop.guard._journal import (
        DeadLetter,
        Journal,
        JournalEntry,
        default_dead_letter_path,
    )
    from spotstop.guard._log import DecisionLog

    bundle, log, _ = setup
    b = load_bundle(bundle, verify=False)
    late = usable_record(b, T0 + 1e6, "late", "s000", {"a": 0.0, "b": -2.0})
    late = dataclasses.replace(late, label="SAFE")
    also = dataclasses.replace(late, decision_id="late2", time=late.time + 1)
    # both written before the dead letter below: a log opened for writing applies the dead
    # letter's amendments to its rows (tests/guard/test_log_dead_letter.py)
    with DecisionLog(log) as d:
        d.append(late)
        d.append(also)
    assert _data(bundle, log).dropped["fail_closed"] == 1  # the log alone: a SAFE answer
    dead = DeadLetter(default_dead_letter_path(log))
    dead.append("amend", error="ValueError: x", amend_ids=["late"], amend_reason="late write")
    lacked = dataclasses.replace(late, decision_id="lacked", label="UNSAFE", fail_closed=True)
    dead.append("rows", error="ValueError: y", records=[lacked])
    d = _data(bundle, log)
    assert d.dropped["fail_closed"] == 2 and not d.usable[list(d.decision_id).index("late")]
    assert (d.pending.amended, d.pending.missing_dead_letter) == (1, 1)
    args = ["recalibrate", str(log), "--bundle", str(bundle), "--policy", "frozen", "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warning: the log does not say every answer the robot got: 1 decision(s)" in out
    assert "1 set aside in the dead letter" in out
    # the guard's own --journal (another file system): named, it is read too
    journal = log.parent / "sd" / "decisions.journal"
    entry = JournalEntry("amend", amend_ids=("late2",), amend_reason="late write")
    Journal(journal, owner=str(log.resolve())).append([entry])
    assert _data(bundle, log).pending.amended == 1  # not the log's default journal
    assert _data(bundle, log, journal=journal).pending.amended == 2
    assert main([*args, "--journal", str(journal)]) == 0
    assert "2 decision(s) the log still holds as SAFE" in capsys.readouterr().out
    diff = ["policy", "diff", "active", "active", "--bundle", str(bundle), "--log", str(log)]
    assert main([*diff, "--journal", str(journal)]) == 0
    err = capsys.readouterr().err
    assert "spotstop policy diff: warning: the log does not say every answer" in err
    assert "2 decision(s) the log still holds as SAFE" in err


def test_labels_file_is_read_by_the_diagnostics_reader(tmp_path: Path):
    bundle = fake_bundle(tmp_path / "bundle")
    truth = simulate_decisions(tmp_path / "log.sqlite", bundle, label=False)
    assert _data(bundle, tmp_path / "log.sqlite").counts()["unlabelled"] == 240
    f = tmp_path / "labels.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["decision_id", "label"])
        for did, y in truth.items():
            w.writerow([did, "unsafe" if y else "safe"])
    d = _data(bundle, tmp_path / "log.sqlite", labels=f, since=T0 + 60 * 200)  # window after labels
    assert d.counts()["unlabelled"] == 0 and d.labels == str(f)
    bad = tmp_path / "bad.csv"
    bad.write_text("decision_id,label\nnope,unsafe\n")
    with pytest.raises(CalibrationError, match="match no decision"):
        _data(bundle, tmp_path / "log.sqlite", labels=bad)


def test_fit_recomputes_fused_scores_with_the_new_fusion(setup):
    bundle, log, _ = setup
    d = _data(bundle, log)
    r = Recalibrator("conformal").fit(d)
    use = d.usable
    a, b = d.member_scores["a"][use], d.member_scores["b"][use]
    sa, sb = r.fusion_.stats["a"], r.fusion_.stats["b"]
    assert sa.median == pytest.approx(np.median(a)) and sb.median == pytest.approx(np.median(b))
    expect = ((a - sa.median) / sa.iqr + (b - sb.median) / sb.iqr) / 2
    np.testing.assert_allclose(r.fused_[use], expect)  # not the logged 0.0
    assert r.frozen_.policy.threshold == pytest.approx(expect.mean())
    # the cut: PAC rank among the per-situation minima of the unsafe recomputed scores
    unsafe = use & (d.label == 1)
    mins: dict[str, float] = {}
    for s, v in zip(d.situation_id[unsafe], r.fused_[unsafe], strict=True):
        mins[s] = min(v, mins.get(s, np.inf))
    u = np.sort(list(mins.values()))
    pol = r.policy_
    assert isinstance(pol, ConformalPolicy) and pol.n == len(mins) and pol.delta == 0.1
    assert pol.threshold == u[pol.k - 1]
    prov = r.provenance()
    assert prov["conformal"]["pac"]["k"] == pol.k and prov["conformal"]["marginal"]["k"] >= pol.k
    assert prov["n"]["unsafe"] == int(unsafe.sum()) and prov["tool"]["name"] == "spotstop"
    assert "one case per situation" in prov["conformal"]["cluster_note"]


def test_refits_are_deterministic(setup):
    bundle, log, _ = setup
    cfgs = [
        Recalibrator(kind, rng=3).fit(_data(bundle, log)).to_config(created=FIXED)
        for kind in ("situation", "situation")
    ]
    assert yaml.safe_dump(cfgs[0].to_dict()) == yaml.safe_dump(cfgs[1].to_dict())
    r1 = Recalibrator("conformal").fit(_data(bundle, log))
    r2 = Recalibrator("conformal").fit(_data(bundle, log))
    assert r1.policy_ == r2.policy_ and r1.state_seed_ is r2.state_seed_ is None


@pytest.mark.parametrize("guarantee", ["pac", "marginal"])
def test_a_random_cluster_rule_gives_the_report_the_policys_cut(setup, guarantee: str):
    """With one random case per situation, the report (fitted_on) and the policy file are one
    draw: the same k, n and cut."""
    bundle, log, _ = setup
    for seed in range(4):
        r = Recalibrator("conformal", guarantee=guarantee, cluster_rule="random", rng=seed).fit(
            _data(bundle, log)
        )
        cfg = r.to_config(created=FIXED)
        said = cfg.fitted_on["conformal"][guarantee]
        pol = cfg.policy
        assert (said["k"], said["n"], said["threshold"]) == (pol.k, pol.n, pol.threshold)  # type: ignore[attr-defined]


def test_conformal_refuses_too_few_unsafe_cases_and_says_how_many(tmp_path: Path):
    bundle = fake_bundle(tmp_path / "bundle")
    simulate_decisions(tmp_path / "log.sqlite", bundle, n_sit=15, per=2, p_unsafe=0.4)
    d = _data(bundle, tmp_path / "log.sqlite")
    with pytest.raises(PolicyError, match=r"at least 22 unsafe situations are needed"):
        Recalibrator("conformal").fit(d)
    r = Recalibrator("frozen").fit(d)  # other kinds still report the cut
    assert r.conformal_ is not None and not r.conformal_.pac_.feasible
    assert r.conformal_.pac_.n_needed == 22


def test_bad_conformal_settings_are_refused_by_name_before_any_fit(tmp_path: Path, capsys):
    """Without unsafe labels, --alpha nan or 1.5 ended in a bare ValueError (Fraction's
    'nan', a math domain error) from the conformal kind, and other kinds wrote alpha 7 into
    the policy's provenance."""
    bundle = fake_bundle(tmp_path / "bundle")
    simulate_decisions(tmp_path / "log.sqlite", bundle, label=False)
    dump_policy(frozen_policy(bundle, 0.0), bundle / "policy.yaml")
    d = _data(bundle, tmp_path / "log.sqlite")
    for kind, kw in (
        ("conformal", {"alpha": float("nan")}),
        ("conformal", {"alpha": 1.5}),
        ("frozen", {"alpha": 7.0}),
        ("frozen", {"delta": 0.0}),
    ):
        with pytest.raises(PolicyError, match=rf"{next(iter(kw))} must be in \(0, 1\)"):
            Recalibrator(kind, **kw).fit(d)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="guarantee must be"):
        Recalibrator("frozen", guarantee="both").fit(d)  # type: ignore[arg-type]
    args = [str(tmp_path / "log.sqlite"), "--bundle", str(bundle), "--policy", "conformal"]
    assert main(["recalibrate", *args, "--alpha", "nan"]) != 0
    assert "alpha must be in (0, 1); got nan" in capsys.readouterr().err
    assert list_policy_versions(bundle) == []


def test_situation_state_holds_the_last_window_scores(setup):
    bundle, log, _ = setup
    r = Recalibrator("situation", settings={"window": 3}).fit(_data(bundle, log))
    refs = r.state_seed_.situations
    assert len(refs) == 60 and all(len(v) == 3 for v in refs.values())
    d = r.data_
    rows = np.flatnonzero(d.usable & (d.situation_id == "s007"))
    assert refs["s007"] == tuple(r.fused_[rows[-3:]])
    assert isinstance(r.policy_, SituationPolicy) and r.policy_.window == 3
    cfg = r.to_config()  # the seed travels in the policy file and is the starting state
    assert load_policy(cfg.to_dict()).initial_state().references("s007") == refs["s007"]


def test_situation_prior_is_fitted_by_situation_and_reported(setup):
    from spotstop.guard.policies import situation_prior_weight

    bundle, log, _ = setup
    r = Recalibrator("situation", settings={"window": 6}).fit(_data(bundle, log))
    d = r.data_
    use = d.usable
    want, how = situation_prior_weight(r.fused_[use], d.situation_id[use], cap=6)
    pol = r.policy_
    assert isinstance(pol, SituationPolicy)
    assert pol.prior_weight == want and pol.prior_threshold == r.frozen_.policy.threshold
    prior = r.provenance()["situation_prior"]
    assert prior == {"weight": want, "threshold": pol.prior_threshold, "how": how}
    assert f"situation prior: {want:.3g} pseudo-references at the frozen cut" in r.summary()
    paper = Recalibrator("situation", settings={"prior_weight": 0.0}).fit(_data(bundle, log))
    assert paper.policy_.prior_weight == 0  # type: ignore[attr-defined]
    assert paper.provenance()["situation_prior"]["how"] == "given"
    assert Recalibrator("frozen").fit(_data(bundle, log)).provenance()["situation_prior"] is None
    with pytest.raises(PolicyError, match="prior_weight must be a finite number ≥ 0"):
        Recalibrator("situation", settings={"prior_weight": -1.0}).fit(_data(bundle, log))


def test_what_shapes_the_windows_reads_the_guards_ids_not_a_regrouping(tmp_path: Path):
    """A labels file that puts the robot's 60 situations in one room (for the statistics)
    fitted the situation prior κ on that one group: κ went to the cap (8, from 3.3 on the ids
    the guard recentres by), and a cascade's band was set on windows the guard never keeps."""
    from spotstop.guard.policies import situation_prior_weight

    bundle = fake_bundle(tmp_path / "bundle")
    truth = simulate_decisions(tmp_path / "log.sqlite", bundle, label=False)
    f = tmp_path / "labels.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["decision_id", "label", "situation_id"])
        for did, y in truth.items():
            w.writerow([did, "unsafe" if y else "safe", "kitchen"])
    plain = _data(bundle, tmp_path / "log.sqlite")
    regrouped = _data(bundle, tmp_path / "log.sqlite", labels=f)
    assert set(regrouped.situation_id[regrouped.usable]) == {"kitchen"}
    use = plain.usable
    fused = Recalibrator("frozen").fit(plain).fused_[use]
    want, how = situation_prior_weight(fused, plain.logged_situation_id[use], cap=8)
    assert 0 < want < 8
    for d in (plain, regrouped):
        r = Recalibrator("situation").fit(d)
        assert r.policy_.prior_weight == want  # type: ignore[attr-defined]
        assert r.provenance()["situation_prior"]["how"] == how
        assert "s007" in r.state_seed_.situations
    bands = [
        Recalibrator("cascade", settings={"cut": "situation"}).fit(d).policy_
        for d in (plain, regrouped)
    ]
    assert bands[0] == bands[1]
    # conformal's one case per situation still follows the regrouping
    assert Recalibrator("frozen").fit(regrouped).conformal_.n_situations_ == 1  # type: ignore[union-attr]


# ------------------------------------------------------------------ versions


def test_versions_never_overwrite_and_activation_is_explicit(setup):
    bundle, log, _ = setup
    original = (bundle / "policy.yaml").read_bytes()
    r = Recalibrator("situation").fit(_data(bundle, log))
    v = write_policy_version(bundle, r.to_config())
    vs = list_policy_versions(bundle)
    assert [x.number for x in vs] == [1, 2] and v.number == 2
    assert vs[0].path.read_bytes() == original and vs[0].active  # the old policy, archived
    assert (bundle / "policy.yaml").read_bytes() == original  # writing does not activate
    assert load_policy(v.path).fitted_on["previous"]["version"] == 1
    v3 = write_policy_version(bundle, r.to_config())
    assert v3.number == 3 and vs[1].path.read_bytes() == v.path.read_bytes()

    activate_policy_version(bundle, "v2")
    assert (bundle / "policy.yaml").read_bytes() == v.path.read_bytes()
    assert active_policy_version(bundle).number == 2
    cfg = load_policy(bundle / "policy.yaml")  # the guard's view: state seeded from the log
    assert cfg.initial_state().references("s007") == r.state_seed_.references("s007")
    assert cfg.version_id.startswith("v0002+")
    assert not list(bundle.glob("situations*.json"))  # no live state is written by calibrate
    activate_policy_version(bundle, 1)  # roll back
    assert (bundle / "policy.yaml").read_bytes() == original


def test_a_policy_for_another_bundle_is_refused(setup, tmp_path: Path):
    bundle, _, _ = setup
    other = frozen_policy(bundle, 1.0, bundle_id="someone-else")
    with pytest.raises(PolicyError, match="someone-else"):
        write_policy_version(bundle, other)
    # a stored version that was tampered with is refused on activation; policy.yaml stays
    v = write_policy_version(bundle, frozen_policy(bundle, 1.0))
    doc = yaml.safe_load(v.path.read_text())
    doc["prompt_hash"] = "0000000000000000"
    v.path.write_text(yaml.safe_dump(doc))
    before = (bundle / "policy.yaml").read_bytes()
    with pytest.raises(PolicyError, match="0000000000000000"):
        activate_policy_version(bundle, v.number)
    assert (bundle / "policy.yaml").read_bytes() == before
    with pytest.raises(CalibrationError, match="no policy version"):
        activate_policy_version(bundle, "v0099")


def test_keeping_the_fusion_of_a_policy_for_another_bundle_is_refused(setup, capsys):
    """--keep-fusion with a policy.yaml fitted for another bundle stamped that bundle's
    reference statistics as this bundle's; it is refused, and nothing is written."""
    bundle, log, _ = setup
    other = frozen_policy(bundle, 0.0, bundle_id="someone-else")
    dump_policy(other, bundle / "policy.yaml")
    with pytest.raises(CalibrationError, match="someone-else"):
        Recalibrator("frozen", refit_fusion=False).fit(_data(bundle, log), other)
    args = [str(log), "--bundle", str(bundle), "--policy", "frozen", "--keep-fusion"]
    assert main(["recalibrate", *args]) != 0
    assert "someone-else" in capsys.readouterr().err
    assert list_policy_versions(bundle) == []
    # refitting the fusion is fine: only the operator's settings come from the policy in force
    r = Recalibrator("frozen").fit(_data(bundle, log), other)
    assert r.to_config().bundle_id == "fake-01"


# ------------------------------------------------------------------ diff


def test_a_replay_takes_each_decision_without_a_batch_id_alone(tmp_path: Path):
    """In a log whose older rows carry no batch id (schema 1) and newer ones do, the older
    rows were replayed as one batch of 20 (9 of them UNSAFE under a batch-mean cut), though
    nothing says one call made them; the card replays each alone."""
    from spotstop.guard import DecisionLog
    from spotstop.guard.policies import BatchFrozenIqrPolicy, FrozenPolicy

    from tests._support.calibration_logs import usable_record

    bundle = fake_bundle(tmp_path / "bundle")
    b = load_bundle(bundle, verify=False)
    gen = np.random.default_rng(0)
    recs = []
    for i in range(40):
        s = float(gen.normal())
        r = usable_record(b, T0 + i, f"d{i}", f"s{i % 4}", {"a": s, "b": s})
        recs.append(dataclasses.replace(r, batch_id=f"call-{i // 4}") if i >= 20 else r)
    with DecisionLog(tmp_path / "log.sqlite") as log:
        log.append_many(recs)
    # a cut far above every score alone (a batch below min_batch), the batch mean in a batch
    cfg = dataclasses.replace(
        frozen_policy(bundle, 0.0), policy=BatchFrozenIqrPolicy(FrozenPolicy(9.0))
    )
    eff = predict_effect(cfg, _data(bundle, tmp_path / "log.sqlite"))
    assert not eff.flags[:20].any()
    s = np.array([r.member_scores["a"] for r in recs[20:]]).reshape(5, 4)
    want = s >= s.mean(axis=1, keepdims=True)  # 4 decisions per logged call
    assert (eff.flags[20:] == want.ravel()).all() and want.any()
    assert "without a batch id alone" in eff.note


def test_diff_shows_changes_and_predicted_effect(setup):
    bundle, log, _ = setup
    d = _data(bundle, log)
    old = load_policy(bundle / "policy.yaml")
    new = Recalibrator("conformal").fit(d).to_config(created=FIXED)
    diff = diff_policies(old, new, d, names=("old", "new"))
    keys = {c.key for c in diff.changes}
    assert {"policy.kind", "fusion.stats.a.median", "policy.delta"} <= keys
    eff = diff.effect_b
    assert eff is not None and eff.n == 240
    y = d.label[d.usable]
    assert eff.miss_rate == pytest.approx(float((~eff.flags[y == 1]).mean()))
    assert eff.flag_rate == pytest.approx(float(eff.flags.mean()))
    assert diff.n_changed == int((diff.effect_a.flags != eff.flags).sum())
    text = str(diff)
    assert "miss rate" in text and "decisions that change label" in text
    # a frozen cut at +inf-ish flags nothing: miss rate 1 on labelled unsafe
    never = predict_effect(frozen_policy(bundle, 1e9), d)
    assert never.flag_rate == 0.0 and never.miss_rate == 1.0 and never.safe_flag_rate == 0.0


def test_a_recalibrated_policy_keeps_reading_the_scene_as_the_one_in_force(setup, capsys):
    """``text_in_scene`` is the operator's setting, not fitted: recalibrate carries it over
    (it dropped it, and a scene with an ALL CLEAR sign that failed closed went SAFE), and
    ``policy diff`` shows it when two versions differ in it."""
    bundle, log, _ = setup
    text = {"detect": True, "reassuring": "fail_closed", "alarming": "log"}
    doc = load_policy(bundle / "policy.yaml").to_dict()
    dump_policy(load_policy({**doc, "text_in_scene": text}), bundle / "policy.yaml")
    current = load_policy(bundle / "policy.yaml")
    for kind in ("frozen", "situation", "conformal"):
        new = Recalibrator(kind).fit(_data(bundle, log), current).to_config(created=FIXED)
        assert new.text_in_scene == current.text_in_scene, kind
    # without a policy in force: the default (no detection)
    assert not Recalibrator("frozen").fit(_data(bundle, log)).to_config().text_in_scene.detect
    # the CLI writes it, and the diff names a change of it
    args = ["recalibrate", str(log), "--bundle", str(bundle), "--policy", "frozen", "--activate"]
    assert main(args) == 0
    capsys.readouterr()
    assert load_policy(bundle / "policy.yaml").text_in_scene == current.text_in_scene
    off = load_policy({**doc, "text_in_scene": {**text, "reassuring": "log"}})
    diff = diff_policies(current, off, None, names=("a", "b"))
    assert {c.key for c in diff.changes} >= {"text_in_scene.reassuring"}
    sit = {"kind": "situation", "window": 4, "min_refs": 2}
    sit["fallback"] = {"kind": "frozen", "threshold": 0.0}
    a, b = (
        load_policy({**doc, "policy": sit, "state_seed": {"situations": {"hall": [x]}}})
        for x in (0.1, 0.2)
    )
    assert [c.key for c in diff_policies(a, b, None).changes] == ["state_seed.situations.hall"]


def test_written_and_activated_policies_are_readable_by_another_user(setup, tmp_path: Path):
    """A version file and the policy.yaml it is copied to were mode 0600 (mkstemp's): a
    sidecar running as its own user could not reload or restart. A file keeps the mode of the
    one it replaces; a new one is 0644."""
    import os
    import stat

    from spotstop.guard._files import NEW_FILE_MODE, atomic_write_bytes

    bundle, log, _ = setup
    cfg = Recalibrator("frozen").fit(_data(bundle, log)).to_config(created=FIXED)
    v = write_policy_version(bundle, cfg)
    activate_policy_version(bundle, v.number)
    for path in (v.path, bundle / "policy.yaml"):
        assert stat.S_IMODE(path.stat().st_mode) == NEW_FILE_MODE == 0o644, path
    os.chmod(bundle / "policy.yaml", 0o640)  # an operator's choice is kept
    activate_policy_version(bundle, v.number)
    assert stat.S_IMODE((bundle / "policy.yaml").stat().st_mode) == 0o640
    new = tmp_path / "new" / "f.bin"
    atomic_write_bytes(new, b"x")
    assert stat.S_IMODE(new.stat().st_mode) == 0o644 and new.read_bytes() == b"x"


# ------------------------------------------------------------------ CLI end to end


def test_cli_recalibrate_list_diff_activate(setup, capsys: pytest.CaptureFixture[str]):
    bundle, log, _ = setup
    args = ["recalibrate", str(log), "--bundle", str(bundle)]
    assert main([*args, "--policy", "conformal", "--alpha", "0.1", "--delta", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "PAC: P(miss rate > alpha" in out and "marginal: P(miss)" in out
    assert "spotstop card" in out and "wrote" in out and "policy-v0002.yaml" in out
    assert "miss rate" in out  # the diff against the active policy, on the log
    assert main([*args, "--policy", "situation", "--activate", "--since", "2023-11-14"]) == 0
    assert "activated v0003" in capsys.readouterr().out
    assert main(["policy", "list", str(bundle)]) == 0
    listing = capsys.readouterr().out
    assert "* v0003" in listing and "v0001" in listing
    diff_args = ["policy", "diff", "v0002", "active", "--bundle", str(bundle), "--log", str(log)]
    assert main([*diff_args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["effect_b"]["n"] == 240 and any(c["key"] == "policy.kind" for c in doc["changes"])
    assert main(["policy", "activate", str(bundle), "v0002"]) == 0
    capsys.readouterr()
    assert load_policy(bundle / "policy.yaml").policy.kind == "conformal"
    # refusal: exit 2, the number needed in the message, nothing written
    before = len(list_policy_versions(bundle))
    rc = main([*args, "--policy", "conformal", "--alpha", "0.01"])
    err = capsys.readouterr().err
    assert rc == 2 and "unsafe situations are needed" in err
    assert len(list_policy_versions(bundle)) == before


# ------------------------------------------------------------------ hot reload under load


def test_reload_under_load_drops_nothing(bundle_copy: Path, tmp_path: Path):
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import Guard, Scene

    bundle = bundle_copy
    dump_policy(frozen_policy(bundle, 1e9), bundle / "policy.yaml")
    v_unsafe = write_policy_version(bundle, frozen_policy(bundle, -1e9))  # archives +1e9 as v1
    bad = tmp_path / "bad.yaml"
    dump_policy(frozen_policy(bundle, 0.0, bundle_id="other-bundle"), bad)
    scenes: list[Scene] = demo_scenes(4, seed=3)
    got: list = []
    errors: list[BaseException] = []
    stop = threading.Event()
    with Guard(bundle, log=tmp_path / "log.sqlite") as guard:

        def worker(i: int) -> None:
            try:
                while not stop.is_set():
                    got.append(guard.check(scenes[i % len(scenes)]))
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        seen_swaps = 0
        for i in range(6):
            activate_policy_version(bundle, v_unsafe.number if i % 2 == 0 else 1)
            guard.reload_policy()
            seen_swaps += 1
            with pytest.raises(PolicyError, match="other-bundle"):
                guard.reload_policy(bad)  # refused; the current policy stays
            n_before = len(got)
            while len(got) == n_before and not errors:  # let at least one decision through
                stop.wait(0.01)
        stop.set()
        for t in threads:
            t.join()
        n_logged = guard.log.count()
        ids = {r.decision_id for r in guard.log.records()}
    assert not errors, errors
    assert seen_swaps == 6 and len(got) >= 6
    assert all(not d.fail_closed for d in got)
    assert {d.threshold for d in got} == {1e9, -1e9}  # both policies served, no torn state
    assert all((d.label == "SAFE") == (d.threshold == 1e9) for d in got)
    assert n_logged == len(got) and ids == {d.decision_id for d in got}


def test_read_log_refuses_a_missing_log(tmp_path: Path):
    with pytest.raises(CalibrationError, match="does not exist"):
        read_calibration_log(
            tmp_path / "none.sqlite", bundle_id="b", prompt_hash="p", members=["a"]
        )


#: one situation: a scene, one that failed closed AFTER its decision (past the deadline: its
#: score moved the guard's window), and one the guard compared with the mean of [0, 5]
_FAILED_AFTER = [
    (0.0, "UNSAFE", None),  # no reference: the fallback cut 0, a tie is UNSAFE
    (5.0, "UNSAFE", "deadline exceeded (after the decision)"),
    (1.0, "SAFE", None),  # below the mean of [0, 5]
]


def test_policy_diff_replays_a_window_as_the_guard_filled_it(tmp_path: Path):
    """The failed scene still moved the situation window in the guard, so the replay must
    count it: the third scene meets 2.5 and is SAFE, as the guard said; leaving the failed
    scene out would compare it with 0 alone and flag it."""
    from dataclasses import replace

    from spotstop.guard.policies import FrozenPolicy

    bundle = fake_bundle(tmp_path / "bundle")
    cfg = replace(
        frozen_policy(bundle, 0.0),
        policy=SituationPolicy(window=2, min_refs=1, fallback=FrozenPolicy(0.0)),
    )
    one_situation_log(tmp_path / "log.sqlite", bundle, _FAILED_AFTER)
    eff = predict_effect(cfg, _data(bundle, tmp_path / "log.sqlite"))
    assert eff.n == 2 and eff.flags.tolist() == [True, False]


def test_a_situation_seed_holds_what_entered_the_policy(tmp_path: Path):
    """recalibrate's state seed is the windows the guard held: the scene that failed closed
    after its decision is in them (the fusion kept, so the scores are the logged ones)."""
    bundle = fake_bundle(tmp_path / "bundle")
    current = frozen_policy(bundle, 0.0)
    one_situation_log(tmp_path / "log.sqlite", bundle, _FAILED_AFTER)
    r = Recalibrator("situation", refit_fusion=False, min_pool=2, settings={"window": 8}).fit(
        _data(bundle, tmp_path / "log.sqlite"), current
    )
    assert r.state_seed_.references("k") == (0.0, 5.0, 1.0)


# ------------------------------------------------------------------ activation checks


def test_activate_by_a_path_takes_that_file_or_refuses(setup, tmp_path: Path):
    """`policy activate BUNDLE other/policies/policy-v0002.yaml` matched the file NAME and
    activated this bundle's own v0002, another policy, and exited 0; a path that did not exist
    did the same."""
    bundle, _, _ = setup
    mine = write_policy_version(bundle, frozen_policy(bundle, 1.0))
    other = fake_bundle(tmp_path / "other")
    dump_policy(frozen_policy(other, -5.0), other / "policy.yaml")
    theirs = write_policy_version(other, frozen_policy(other, 3.0))
    assert theirs.path.name == mine.path.name
    before = (bundle / "policy.yaml").read_bytes()
    for path in (theirs.path, tmp_path / "nowhere" / mine.path.name):
        with pytest.raises(CalibrationError, match="path outside"):
            activate_policy_version(bundle, str(path))
        assert (bundle / "policy.yaml").read_bytes() == before
    # its own file, by name or by path, is the version
    assert activate_policy_version(bundle, mine.path.name).number == mine.number
    assert activate_policy_version(bundle, str(mine.path)).number == mine.number


def test_a_policy_the_bundle_cannot_run_is_refused_by_activate_and_by_the_guard(
    setup, tmp_path: Path
):
    """A version whose fusion names a member the bundle lacks (a typo) or whose text lexicon
    does not exist was activated (exit 0); the guard then failed every scene closed. Both
    refuse it now, with one check, and policy.yaml stays."""
    from spotstop.guard.policies import PolicyMismatchError, check_policy_fits

    bundle, _, _ = setup
    good = frozen_policy(bundle, 1.0)
    members = list(good.fusion.members)
    v = write_policy_version(bundle, good)
    doc = yaml.safe_load(v.path.read_text())
    typo = members[0] + "-typo"
    fusion = doc["fusion"]
    fusion["members"] = [typo if m == members[0] else m for m in fusion["members"]]
    for key in ("stats", "weights"):
        fusion[key][typo] = fusion[key].pop(members[0])
    v.path.write_text(yaml.safe_dump(doc))  # yaml.safe_dump drops the seal's comment lines
    before = (bundle / "policy.yaml").read_bytes()
    with pytest.raises(PolicyMismatchError, match=f"fusion names member.*{typo}"):
        activate_policy_version(bundle, v.number)
    assert (bundle / "policy.yaml").read_bytes() == before
    lex = write_policy_version(
        bundle, dataclasses.replace(good, text_in_scene=TextInScene(lexicon="no-such.yaml"))
    )
    with pytest.raises(PolicyError, match=r"no-such\.yaml.*does not exist"):
        activate_policy_version(bundle, lex.number)
    assert (bundle / "policy.yaml").read_bytes() == before
    (bundle / "no-such.yaml").write_text("x")  # exists where policy.yaml will read it from
    check_policy_fits(load_policy(lex.path), members, bundle)
    with pytest.raises(PolicyError, match="does not exist"):
        check_policy_fits(load_policy(lex.path), members, lex.path.parent)


def test_a_claim_reader_naming_a_member_the_bundle_lacks_is_refused_by_activate(
    setup, tmp_path: Path
):
    """`text_in_scene.reader: member:<typo>` was activated (exit 0), and the guard then
    failed every scene closed ("claim reader ...: no member named"); the same check refuses it.
    A member of the bundle, a member folder, or a reader the policy does not run is taken."""
    from spotstop.guard.policies import PolicyMismatchError, check_policy_fits

    bundle, _, _ = setup
    good = frozen_policy(bundle, 1.0)
    members = list(good.fusion.members)

    def reading(reader: str, detect: bool = True):
        return dataclasses.replace(good, text_in_scene=TextInScene(detect=detect, reader=reader))

    v = write_policy_version(bundle, reading(f"member:{members[0]}-typo"))
    before = (bundle / "policy.yaml").read_bytes()
    with pytest.raises(
        PolicyMismatchError, match=rf"reader: claim reader 'member:{members[0]}-typo'"
    ):
        activate_policy_version(bundle, v.number)
    assert (bundle / "policy.yaml").read_bytes() == before
    folder = tmp_path / "another-member"
    folder.mkdir()
    for fits in (
        reading(f"member:{members[1]}"),
        reading(f"member:{folder}"),
        reading("lexicon"),
        reading(f"member:{members[0]}-typo", detect=False),  # no text read: no reader built
    ):
        check_policy_fits(fits, members, bundle)


def test_a_crlf_policy_yaml_is_archived_once_byte_for_byte(setup):
    """policy.yaml with CRLF line ends was archived through read_text (CRLF became LF): the copy
    never matched, so every write archived it again and no version showed as active."""
    bundle, _, _ = setup
    active = bundle / "policy.yaml"
    active.write_bytes(active.read_bytes().replace(b"\n", b"\r\n"))
    crlf = active.read_bytes()
    for t in (1.0, 2.0, 3.0):
        write_policy_version(bundle, frozen_policy(bundle, t))
    vs = list_policy_versions(bundle)
    copies = [v for v in vs if v.path.read_bytes() == crlf]
    assert len(copies) == 1 and copies[0].active and len(vs) == 4


def test_policy_commands_name_a_missing_file_instead_of_a_traceback(setup, tmp_path, capsys):
    """`policy diff active v0001 --bundle B` on a bundle without policy.yaml, and
    `policy init --requests nope.txt`, ended in a FileNotFoundError traceback."""
    bundle, _, _ = setup
    write_policy_version(bundle, frozen_policy(bundle, 1.0))
    (bundle / "policy.yaml").unlink()
    assert main(["policy", "diff", "active", "v0001", "--bundle", str(bundle)]) == 2
    assert "has no active policy" in capsys.readouterr().err
    pool = tmp_path / "pool"
    pool.mkdir()
    missing = tmp_path / "nope.txt"
    rc = main(["policy", "init", str(bundle), "--pool", str(pool), "--requests", str(missing)])
    assert rc == 2 and "--requests" in capsys.readouterr().err
