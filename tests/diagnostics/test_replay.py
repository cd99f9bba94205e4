"""The card replays the guard: a real schema-2 log (three policy versions, one conformal, plus
schema-1-like rows and fail-closed decisions), delivered rates against a direct count, the
replay, gray/text fused with each version's own fusion, the conformal audit against scipy,
and one end-to-end ``spotstop card LOG`` through ``run_card``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest
from spotstop.diagnostics import (
    UNKNOWN_VERSION,
    audit_deployed,
    delivered,
    log_cases,
    read_log,
)
from spotstop.diagnostics._cli import add_card_parser
from spotstop.diagnostics._from_log import direct_cut_of
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard._log import DecisionLog
from spotstop.guard.policies import (
    SituationPolicy,
)

from tests._support.log_writer import Segment, policy_config, write_log
from tests._support.replay_log import N_SIT, T1, build_log, fitted_conformal, replay_scenes


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("replay") / "decisions.sqlite"
    return path, build_log(path)


def _direct_rates(path: Path, version: str | None = None) -> tuple[float, float, int, int]:
    """Hit and false-alarm rates straight from the log (independent of diagnostics)."""
    with DecisionLog(path) as log:
        a = log.to_arrays()
    use = (a.label >= 0) & ~a.fail_closed
    if version is not None:
        use &= np.array([(v or UNKNOWN_VERSION) == version for v in a.policy_version])
    u, s = use & (a.label == 1), use & (a.label == 0)
    hit = float((a.guard_label[u] == 1).sum() / u.sum())
    fa = float((a.guard_label[s] == 1).sum() / s.sum())
    return hit, fa, int(u.sum()), int(s.sum())


def test_delivered_rates_are_the_logged_answers(built):
    path, info = built
    d = delivered(read_log(path), n_boot=200, rng=np.random.default_rng(0))
    hit, fa, n_u, n_s = _direct_rates(path)
    assert d.overall.hit_rate.value == pytest.approx(hit, abs=1e-12)
    assert d.overall.false_alarm_rate.value == pytest.approx(fa, abs=1e-12)
    assert d.overall.balanced_accuracy.value == pytest.approx(0.5 * (hit + 1 - fa), abs=1e-12)
    assert (d.overall.hit_rate.n, d.overall.false_alarm_rate.n) == (n_u, n_s)
    assert d.overall.balanced_accuracy.n == n_u + n_s
    assert d.n_fail_closed_labelled == 2
    versions = [c.version_id for c in info["cfgs"]]
    assert list(d.by_policy) == [*versions, UNKNOWN_VERSION]
    for v, p in d.by_policy.items():
        h, f, _, _ = _direct_rates(path, v)
        assert p.rates.hit_rate.value == pytest.approx(h, abs=1e-12), v
        assert p.rates.false_alarm_rate.value == pytest.approx(f, abs=1e-12), v
        lo, hi = p.rates.hit_rate.ci.low, p.rates.hit_rate.ci.high
        assert lo <= h <= hi
    kinds = {v: p.kind for v, p in d.by_policy.items()}
    assert kinds == dict(
        zip([*versions, UNKNOWN_VERSION], ["frozen", "conformal", "situation", None], strict=True)
    )
    assert d.by_policy[versions[0]].n_fail_closed_labelled == 2


def test_replay_reproduces_every_version(built):
    path, info = built
    d = delivered(read_log(path), n_boot=50, rng=np.random.default_rng(0))
    for cfg in info["cfgs"]:
        r = d.by_policy[cfg.version_id].replay
        assert r.n == 2 * N_SIT  # every decision that did not fail closed
        assert r.agreement == 1.0 and r.max_fused_diff == pytest.approx(0.0, abs=1e-12)
    unknown = d.by_policy[UNKNOWN_VERSION].replay
    assert unknown.n == 0 and "not replayed" in unknown.note


def test_gray_and_text_use_each_versions_fusion(built):
    path, info = built
    lc = log_cases(path)
    with DecisionLog(path) as log:
        a = log.to_arrays()
    by_id = {d: i for i, d in enumerate(a.decision_id)}
    for cfg in info["cfgs"]:
        for k, did in enumerate(lc.table.case_id):
            if not str(did).startswith(f"v{cfg.fitted_on['version']}-"):
                continue
            i = by_id[did]
            expect = cfg.fusion.fuse({m: a.member_scores_gray[m][i] for m in ("a", "b")})
            assert lc.table.score_gray[k] == pytest.approx(expect, abs=1e-12)  # type: ignore[index]
    old = np.array([str(c).startswith("old-") for c in lc.table.case_id])
    assert np.isnan(lc.table.score_gray[old]).all()  # type: ignore[index]
    notes = lc.provenance["gray_text"]["score_text"]["by_version"]
    assert notes[UNKNOWN_VERSION].startswith("no stored policy document")
    assert len(lc.provenance["fusion_keys"]) == 2  # v1 and v3 share the unit fusion
    cut = direct_cut_of(lc.log, lc.keep)  # several rules decided: no single cut
    assert (cut.value, cut.label) == (0.0, "the Avg-2 direct answer")


def _independent_audit(path: Path, cfg) -> tuple[int, int]:
    """Misses and situations of the conformal version, counted straight from the log."""
    with DecisionLog(path) as log:
        a = log.to_arrays()
    created = cfg.created.timestamp()
    seen, x, n = set(), 0, 0
    for i in range(a.n):
        if a.policy_version[i] != cfg.version_id or a.label[i] != 1 or a.fail_closed[i]:
            continue
        if a.time[i] <= created or a.situation_id[i] in seen:
            continue
        seen.add(a.situation_id[i])
        n += 1
        x += int(a.guard_label[i] == 0)
    return x, n


@pytest.mark.parametrize("shift, status", [(0.0, "holds"), (2.5, "violated")])
def test_conformal_audit_against_scipy(tmp_path, shift, status):
    path = tmp_path / "log.sqlite"
    info = build_log(path, conformal_shift=shift, seed=1)
    audits = audit_deployed(read_log(path))
    assert [a.version_id for a in audits] == [info["cfgs"][1].version_id]
    a, pol = audits[0], info["cfgs"][1].policy
    assert (a.alpha, a.delta, a.n_calibration, a.k, a.threshold) == (
        pol.alpha, pol.delta, pol.n, pol.k, pol.threshold,
    )  # fmt: skip
    x, n = _independent_audit(path, info["cfgs"][1])
    assert (a.misses, a.n_situations) == (x, n) and n > 0
    ref = binomtest(x, n, pol.alpha, alternative="greater")
    assert a.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    ci = binomtest(x, n, pol.alpha).proportion_ci(0.95, method="exact")
    assert (a.miss_rate.ci.low, a.miss_rate.ci.high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert a.miss_rate.value == pytest.approx(x / n)
    assert a.status == status
    assert a.guarantee == "pac"


def test_spotstop_card_log_end_to_end(built, tmp_path, capsys):
    path, info = built
    root = argparse.ArgumentParser(prog="spotstop")
    add_card_parser(root.add_subparsers())
    out = tmp_path / "card"
    args = root.parse_args(["card", str(path), "--out", str(out), "--n-boot", "200"])
    assert args.func(args) == 0
    # the fields pool two fusions' scores: said first in the summary, not only in card.md
    summary = capsys.readouterr().out.splitlines()
    assert summary[0].startswith("[warn] scores: the cases were decided under 2 fusions")
    doc = json.loads((out / "card.json").read_text())
    hit, fa, n_u, n_s = _direct_rates(path)
    assert doc["delivered_hit_rate"]["value"] == pytest.approx(hit, abs=1e-12)
    assert doc["delivered_false_alarm_rate"]["value"] == pytest.approx(fa, abs=1e-12)
    assert doc["delivered_balanced_accuracy"]["n"] == n_u + n_s
    versions = [c.version_id for c in info["cfgs"]]
    assert list(doc["delivered_by_policy"]) == [*versions, UNKNOWN_VERSION]
    for v in versions:
        assert doc["delivered_by_policy"][v]["replay"]["agreement"] == 1.0
    dep = doc["checks"]["conformal_audit"]["deployed"]
    assert [d["version_id"] for d in dep] == [versions[1]] and dep[0]["status"] in (
        "holds", "not enough data",
    )  # fmt: skip
    assert [v["topic"] for v in doc["verdict"]] == ["leak", "cut", "policy", "guarantee"]
    assert f"deployed situation policy ({versions[2]})" in doc["verdict"][2]["sentence"]
    assert doc["verdict"][0]["status"] == "warn"  # the log holds no image sizes: not measured
    assert f"earlier conformal cut {versions[1]}" in doc["verdict"][3]["sentence"]
    assert f"the deployed policy {versions[2]} carries no" in doc["verdict"][3]["sentence"]
    assert doc["settings"]["direct_cut_source"] == "the Avg-2 direct answer"
    assert "not a cut the guard used" in doc["settings"]["direct_cut_note"]
    assert any("2 fusions" in w for w in doc["settings"]["warnings"])
    assert "pooled in the Spot-Stop fields" in doc["settings"]["pooled_fusions"]
    md = (out / "card.md").read_text()
    assert (
        md.index("## Verdict") < md.index("## What the guard delivered") < md.index("## Spot-Stop")
    )
    assert versions[1] in md and "unknown (schema 1)" in md
    html = (out / "card.html").read_text()
    assert html.index("Verdict") < html.index("What the guard delivered")


def test_the_conformal_audit_covers_a_conformal_fallback_and_only_its_decisions(tmp_path):
    """situation(min_refs 2, fallback conformal) on situations of four scenes, one at a time:
    the first two of each fall back (the rule logs ``situation->conformal``); the audit counts
    exactly those, one unsafe decision per situation, as counted here from the log."""
    rng = np.random.default_rng(3)
    fusion = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 1.0), "b": MemberStats(0.0, 1.0)})
    cut = fitted_conformal(rng, fusion, 0.0)
    cfg = policy_config(
        SituationPolicy(window=4, min_refs=2, fallback=cut), version=5, created=T1 - 10,
        fusion=fusion,
    )  # fmt: skip
    y, _, members, _, _ = replay_scenes(rng, 80, "fb")
    sit = [f"fb-s{i // 4}" for i in range(y.size)]  # safe, unsafe, safe, unsafe per situation
    seg = Segment(cfg, members, sit, T1, batch_size=1)
    labels = [
        (f"fb{i:05d}", "unsafe" if y[i] else "safe", f"fbc{i // 2}", "rev") for i in range(y.size)
    ]
    path = tmp_path / "log.sqlite"
    write_log(path, [(seg, "fb")], labels)
    [a] = audit_deployed(read_log(path))
    assert a.version_id == cfg.version_id and a.kind == "situation"
    assert (a.alpha, a.k, a.threshold) == (cut.alpha, cut.k, cut.threshold)
    with DecisionLog(path) as log:
        arr = log.to_arrays()
    rules = set(arr.policy.tolist())
    assert rules == {"situation", "situation->conformal"}  # both decided, by the log
    seen: set[str] = set()
    x = n = 0
    for i in range(arr.n):
        if arr.policy[i] != "situation->conformal" or arr.label[i] != 1:
            continue
        if arr.situation_id[i] in seen:
            continue
        seen.add(arr.situation_id[i])
        n += 1
        x += int(arr.guard_label[i] == 0)
    assert (a.misses, a.n_situations) == (x, n) and n == 40  # one fallback unsafe per situation
    assert "situation with a conformal fallback" in a.policy_text()
