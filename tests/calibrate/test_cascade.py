"""Fitting the ``cascade`` kind end to end: ``spotstop recalibrate LOG --policy cascade`` and
``spotstop policy init BUNDLE --kind cascade``.

The written policy round-trips through YAML, keeps the given share, and its band sends
exactly ``ceil(share · n)`` of the fitting scenes (no ties) to the second member, counted with
the policy's own :meth:`CascadePolicy.second_needed`; a Guard loads the policy from
``policy init`` and decides with it, running the second member exactly there.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from spotstop.calibrate import list_policy_versions
from spotstop.calibrate._logdata import read_log_for_bundle
from spotstop.cli import main
from spotstop.guard._bundle import load_bundle
from spotstop.guard.policies import CascadePolicy, cascade_band, dump_policy, load_policy

from tests._support.calibration_logs import fake_bundle, frozen_policy, simulate_decisions


def _newest(bundle: Path) -> Path:
    return list_policy_versions(bundle)[-1].path


def _round_trip(path: Path, tmp: Path) -> None:
    """The file loads, dumps and loads to the same policy (and the same document)."""
    cfg = load_policy(path)
    again = tmp / "again.yaml"
    dump_policy(cfg, again)
    back = load_policy(again)
    assert back.to_dict() == cfg.to_dict() and back.policy == cfg.policy
    assert yaml.safe_load(again.read_text(encoding="utf-8"))["policy"]["kind"] == "cascade"


@pytest.mark.parametrize(("share", "cut"), [(0.5, "frozen"), (0.9, "frozen"), (0.3, "conformal")])
def test_recalibrate_fits_a_cascade_whose_band_sends_its_share(
    tmp_path: Path, share: float, cut: str, capsys: pytest.CaptureFixture[str]
):
    bundle = fake_bundle(tmp_path / "bundle")
    log = tmp_path / "log.sqlite"
    simulate_decisions(log, bundle)
    dump_policy(frozen_policy(bundle, 0.0), bundle / "policy.yaml")
    args = ["recalibrate", str(log), "--bundle", str(bundle), "--policy", "cascade"]
    rc = main([*args, "--share", str(share), "--cut", cut, "--first", "b"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "kind=cascade" in out
    path = _newest(bundle)
    _round_trip(path, tmp_path)
    cfg = load_policy(path)
    pol = cfg.policy
    assert isinstance(pol, CascadePolicy)
    assert (pol.kind, pol.share, pol.first, pol.cut.kind) == ("cascade", share, "b", cut)
    # the fitting scenes: the usable decisions of the bundle (the recalibrator's pool)
    data = read_log_for_bundle(log, load_bundle(bundle, verify=False))
    s1 = data.member_scores["b"][data.usable]
    assert np.unique(s1).size == s1.size  # no ties: the count is exact
    inside = pol.second_needed(cfg.fusion, s1, [None] * s1.size, cfg.initial_state())
    assert int(inside.sum()) == math.ceil(share * s1.size)
    # the band is the distance of the last scene inside (both cuts here are one number)
    dist = np.abs(pol.z_first(cfg.fusion, s1) - pol.cut.threshold)
    assert pol.band == pytest.approx(cascade_band(dist, share), abs=0)
    assert pol.band == np.sort(dist)[math.ceil(share * s1.size) - 1]
    # the active policy is unchanged; activating the version makes it load as policy.yaml
    assert load_policy(bundle / "policy.yaml").policy.kind == "frozen"
    assert main(["policy", "activate", str(bundle), list_policy_versions(bundle)[-1].name]) == 0
    assert load_policy(bundle / "policy.yaml").policy == pol


def test_recalibrate_cascade_refuses_a_member_the_fusion_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bundle = fake_bundle(tmp_path / "bundle")
    log = tmp_path / "log.sqlite"
    simulate_decisions(log, bundle, n_sit=20)
    before = len(list_policy_versions(bundle))
    rc = main(
        ["recalibrate", str(log), "--bundle", str(bundle), "--policy", "cascade", "--first", "zz"]
    )
    assert rc == 2 and "first must name a fusion member" in capsys.readouterr().err
    assert len(list_policy_versions(bundle)) == before


def test_policy_init_fits_a_cascade_and_a_guard_decides_with_it(
    committed_bundle: Path, tmp_path: Path
):
    from spotstop.calibrate._pool import pool_scenes
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import DecisionLog, Guard, Scene
    from spotstop.guard._member import load_bundle_member

    bundle = tmp_path / "b"  # the committed export, without its policy
    shutil.copytree(committed_bundle, bundle, ignore=shutil.ignore_patterns("policy.yaml"))
    pool = tmp_path / "pool"
    pool.mkdir()
    for i, s in enumerate(demo_scenes(12, seed=5)):
        assert isinstance(s.image, bytes)
        suffix = ".jpg" if s.image[:2] == b"\xff\xd8" else ".png"
        (pool / f"frame{i:03d}{suffix}").write_bytes(s.image)
    b = load_bundle(bundle)
    first = b.members[1].name  # not the fusion's first: the setting is used
    rc = main(
        ["policy", "init", str(bundle), "--pool", str(pool), "--request", "open the door",
         "--kind", "cascade", "--first", first, "--share", "0.5", "--cut", "frozen"]
    )  # fmt: skip
    assert rc == 0
    _round_trip(bundle / "policy.yaml", tmp_path)
    cfg = load_policy(bundle / "policy.yaml")
    pol = cfg.policy
    assert isinstance(pol, CascadePolicy)
    assert (pol.share, pol.first, pol.cut.kind) == (0.5, first, "frozen")
    # the pool's first-member scores, recomputed: exactly ceil(0.5 · 12) = 6 inside the band
    scenes = pool_scenes(pool, ["open the door"])
    s1 = np.array([r.score for r in load_bundle_member(b, b.members[1]).score(scenes)])
    assert np.unique(s1).size == s1.size
    inside = pol.second_needed(cfg.fusion, s1, [None] * s1.size, cfg.initial_state())
    assert int(inside.sum()) == 6
    # a Guard loads it and runs the second member exactly where the band says
    with Guard(bundle, log=tmp_path / "l.sqlite") as g:
        got = g.check_batch([Scene(s.image, s.request) for s in scenes])
    assert not any(d.fail_closed for d in got)
    with DecisionLog(tmp_path / "l.sqlite") as log:
        arr = log.to_arrays()
    second = next(m for m in cfg.fusion.members if m != first)
    assert (arr.members_run[first] == 1).all()
    assert (arr.members_run[second] == inside.astype(np.int8)).all()
    assert np.isnan(arr.member_scores[second][~inside]).all()
    assert set(arr.policy_kind) == {"cascade"}
    assert [str(p).split("->")[0] for p in arr.policy] == [
        "cascade[pair]" if i else f"cascade[{first}]" for i in inside
    ]
    # a conformal cut needs labels: the pool refuses it before scoring, naming recalibrate
    from spotstop.calibrate import CalibrationError
    from spotstop.calibrate._pool import fit_pool_policy

    with pytest.raises(CalibrationError, match="spotstop recalibrate LOG --policy cascade"):
        fit_pool_policy(bundle, scenes, kind="cascade", settings={"cut": "conformal"})


def test_a_window_where_the_cascade_skipped_a_member_is_refused_with_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Decisions where the second member ran were chosen by the first member's score: a fit
    on them alone would see scenes near the cut only, so recalibrate refuses and says why."""
    import dataclasses

    from spotstop.guard._log import DecisionLog

    bundle = fake_bundle(tmp_path / "bundle")
    plain = tmp_path / "plain.sqlite"
    simulate_decisions(plain, bundle, n_sit=20)
    with DecisionLog(plain) as src:
        recs = list(src.records())
    log = tmp_path / "log.sqlite"
    out = []
    for i, r in enumerate(recs):
        if r.fail_closed or r.bundle_id != recs[0].bundle_id:
            continue
        skip = i % 3 == 0  # the cascade left b out here
        out.append(
            dataclasses.replace(
                r,
                member_scores={**r.member_scores, "b": math.nan} if skip else r.member_scores,
                members_run={"a": True, "b": not skip},
            )
        )
    with DecisionLog(log) as dst:
        dst.append_many(out)
    data = read_log_for_bundle(log, load_bundle(bundle, verify=False))
    n_skip = sum(1 for r in out if not r.members_run["b"])
    nan_a = sum(1 for r in out if r.members_run["b"] and not np.isfinite(r.member_scores["a"]))
    assert data.dropped["member_not_run"] == n_skip > 0
    assert data.dropped["nonfinite_member_score"] == nan_a
    dump_policy(frozen_policy(bundle, 0.0), bundle / "policy.yaml")
    before = len(list_policy_versions(bundle))
    for kind in ("cascade", "frozen"):
        rc = main(["recalibrate", str(log), "--bundle", str(bundle), "--policy", kind])
        err = capsys.readouterr().err
        assert rc == 2 and f"{n_skip} of the {data.n} decisions" in err, err
        assert "did not run every member" in err and "policy init" in err
    assert len(list_policy_versions(bundle)) == before
    # policy diff's replay reads the same subset, and says so
    from spotstop.calibrate import predict_effect

    eff = predict_effect(frozen_policy(bundle, 0.0), data)
    assert eff.n == int(data.usable.sum()) and eff.n < data.n
    assert f"the {n_skip} a cascade decided on its first member alone" in eff.note


def test_policy_diff_replays_the_cascade_in_force_on_the_band_its_guard_chose(
    bundle_copy: Path, tmp_path: Path
):
    """``predict_effect`` of the cascade in force, on the log it wrote, answers as its guard
    did: a scene of a batch fails closed by its text after the plan chose the band (under a
    situation cut, its first score moved the plan's cut for the later scenes); worked out
    again without it, the band put the scene the pair scored (S +0.9, UNSAFE) outside, and
    the replay answered SAFE on the first member alone (z1 −0.4)."""

    from spotstop.calibrate import predict_effect
    from spotstop.diagnostics import read_log
    from spotstop.diagnostics._delivered import replay_version
    from spotstop.guard import DecisionLog
    from spotstop.guard.policies import TextInScene

    from tests._support.guard import decide_the_banded_batch, set_cascade_situation

    first, second = set_cascade_situation(
        bundle_copy, band=0.5, text_in_scene=TextInScene(detect=True, alarming="fail_closed")
    )
    log = tmp_path / "l.sqlite"
    ds, active = decide_the_banded_batch(bundle_copy, log, first, second)
    with DecisionLog(log) as dl:
        dl.set_labels([(d.decision_id, "unsafe", None, "r") for d in ds])
    assert [d.members_run[second] for d in ds] == [False, False, True, False]  # type: ignore[index]
    assert ds[2].label == "UNSAFE" and not ds[2].fail_closed
    data = read_log_for_bundle(log, load_bundle(bundle_copy, verify=False))
    assert data.usable.tolist() == [False, False, True, False]  # the pair scored scene 2 only
    eff = predict_effect(active, data)
    assert eff.flags.tolist() == [True] and eff.miss_rate == 0.0  # as the guard answered
    r = replay_version(read_log(log), active.version_id)  # the card's replay agrees
    assert r.n == 3 and r.n_agree == 3
