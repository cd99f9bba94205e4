"""The card's cascade section on a real schema-3 log written record by record.

The log: a frozen policy v1 that ran the pair on every scene, then a cascade v2 over the same
fusion (the second member only inside its band: its score NaN and ``members_run`` False
outside), then a few cascade rows logged before ``members_run`` existed.  Checked against a
hand count and scipy's exact interval (the share), sklearn's AUROC on a hand-built cascade
score (the cost), and the policy's own ``second_needed`` (the mask).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.metrics import roc_auc_score
from spotstop.diagnostics import audit_deployed, read_log
from spotstop.diagnostics._build import card_from_inputs
from spotstop.diagnostics._cascade import (
    cascade_cost,
    cascade_shares,
    simulate_cascade,
)
from spotstop.diagnostics._cascade_check import CascadeCheck
from spotstop.diagnostics._check_base import CardContext
from spotstop.diagnostics._checks import CARD_CHECKS
from spotstop.diagnostics._data import CaseTable
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard._log import DecisionLog
from spotstop.guard.policies import (
    CascadePolicy,
    ConformalPolicy,
    FrozenPolicy,
    Policy,
    cascade_band,
    conformal_cut,
)

from tests._support.log_writer import Segment, policy_config, policy_row, segment_records

T1, T2 = 1_700_000_000.0, 1_700_100_000.0
FUSION = Avg2Fusion(("a", "b"), {"a": MemberStats(0.2, 1.5), "b": MemberStats(-0.1, 0.8)})
CUT = 0.1


def _scenes(rng: np.random.Generator, n_sit: int, prefix: str):
    """Two scenes per situation (safe, unsafe); member a noisier than b."""
    y = np.tile([0, 1], n_sit)
    sit = np.repeat([f"{prefix}s{i}" for i in range(n_sit)], 2)
    base = 1.4 * (y - 0.5) + np.repeat(rng.normal(0, 0.6, n_sit), 2)
    members = {"a": 0.2 + 1.5 * (base + rng.normal(0, 1.0, y.size)),
               "b": -0.1 + 0.8 * (base + rng.normal(0, 0.4, y.size))}  # fmt: skip
    return y, sit, members


def _hand_inside(a: np.ndarray, policy: CascadePolicy) -> np.ndarray:
    """The band rule written out for the test: |z1 − cut| ≤ band on member a."""
    z1 = (a - 0.2) / 1.5
    return np.abs(z1 - CUT) <= policy.band


def build(
    path: Path, *, with_pair_segment: bool = True, seed: int = 0, cut: Policy | None = None
) -> dict:
    rng = np.random.default_rng(seed)
    # the band fitted for a 50 % share on an unlabelled pool of the same scale
    pool = _scenes(rng, 200, "pool")[2]["a"]
    band = cascade_band(np.abs((pool - 0.2) / 1.5 - CUT), 0.5)
    cut = cut or FrozenPolicy(threshold=CUT)
    cascade = CascadePolicy(first="a", share=0.5, band=band, cut=cut)
    cfg1 = policy_config(FrozenPolicy(threshold=CUT), version=1, created=T1 - 10, fusion=FUSION)
    cfg2 = policy_config(cascade, version=2, created=T2 - 10, fusion=FUSION)
    labels, truth = [], {}
    with DecisionLog(path) as log:
        if with_pair_segment:
            y, sit, members = _scenes(rng, 40, "v1-")
            seg = Segment(cfg1, members, list(sit), T1, batch_size=4)
            recs = [
                dataclasses.replace(r, members_run={"a": True, "b": True})
                for r in segment_records(seg, "v1-")
            ]
            log.append_many(recs, policy=policy_row(cfg1))
            for i, r in enumerate(recs):
                truth[r.decision_id] = int(y[i])
                labels.append((r.decision_id, "unsafe" if y[i] else "safe", f"v1-c{i // 2}", "r"))
        y, sit, members = _scenes(rng, 60, "v2-")
        inside = _hand_inside(members["a"], cascade)
        seg = Segment(cfg2, members, list(sit), T2, batch_size=3)
        recs = []
        for i, r in enumerate(segment_records(seg, "v2-")):
            if not inside[i]:  # the guard never ran b here: no score, no fused S
                r = dataclasses.replace(
                    r,
                    member_scores={"a": r.member_scores["a"], "b": math.nan},
                    fused_score=math.nan,
                )
            recs.append(dataclasses.replace(r, members_run={"a": True, "b": bool(inside[i])}))
            truth[r.decision_id] = int(y[i])
            if i % 11 != 3:
                labels.append((r.decision_id, "unsafe" if y[i] else "safe", f"v2-c{i // 2}", "r"))
        # cascade rows from before members_run was logged (schema 2): counted apart
        old = [
            dataclasses.replace(recs[i], decision_id=f"old-{i}", time=T2 + 10_000 + i,
                                members_run=None)
            for i in range(3)
        ]  # fmt: skip
        log.append_many(recs + old, policy=policy_row(cfg2))
        log.set_labels(labels)
    return {"cfg": cfg2, "inside": inside, "truth": truth, "members": members, "y": y}


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("cascade") / "log.sqlite"
    return path, build(path)


def test_the_cascade_check_is_registered():
    assert CARD_CHECKS["cascade"] == ("spotstop.diagnostics._cascade_check", "CascadeCheck")


def test_share_and_its_exact_interval_against_a_hand_count(logged):
    path, b = logged
    log = read_log(path)
    (s,) = cascade_shares(log)
    v2 = b["cfg"].version_id
    assert s.version_id == v2 and s.first == "a"
    assert (s.configured_share, s.band, s.cut_kind) == (0.5, b["cfg"].policy.band, "frozen")
    inside = b["inside"]
    n, x = inside.size, int(inside.sum())
    assert (s.n_decisions, s.share.n, s.n_second, s.n_unknown) == (n + 3, n, x, 3)
    assert s.n_first_not_run == 0 and s.n_first_only_in_log == n - x
    assert s.share.value == pytest.approx(x / n, abs=1e-15)
    ci = binomtest(x, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (s.share.ci.low, s.share.ci.high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert s.configured_inside == (ci.low <= 0.5 <= ci.high)


def test_without_its_policy_document_the_first_member_is_the_one_that_ran_alone(
    logged, tmp_path: Path
):
    """A cascade version whose policy document the log does not store: its first member is
    read from ``members_run`` (the member that ran alone), not from the rule's text."""
    import shutil
    import sqlite3

    path, b = logged
    copy = tmp_path / "no-doc.sqlite"
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("DELETE FROM policies WHERE policy_version = ?", (b["cfg"].version_id,))
    conn.close()
    (s,) = cascade_shares(read_log(copy))
    (full,) = cascade_shares(read_log(path))
    assert s.first == "a" and s.configured_share is None
    assert (s.n_decisions, s.share.n, s.n_second) == (full.n_decisions, full.share.n, full.n_second)


def test_simulated_cascade_masks_exactly_where_second_needed_says_false(logged):
    path, b = logged
    log = read_log(path)
    cfg = b["cfg"]
    pol = cfg.policy
    rng = np.random.default_rng(1)
    members = {"a": rng.normal(0.2, 2.0, 50), "b": rng.normal(0, 1, 50)}
    sim = simulate_cascade(cfg, members, [None] * 50, batch_ids=[i // 5 for i in range(50)])
    need = pol.second_needed(cfg.fusion, members["a"], [None] * 50, cfg.initial_state())
    assert (sim.inside == need).all() and 0 < need.sum() < 50
    assert (sim.inside == _hand_inside(members["a"], pol)).all()
    z1 = (members["a"] - 0.2) / 1.5
    s = cfg.fusion.fuse_many(members)
    np.testing.assert_array_equal(sim.score, np.where(need, s, z1))
    np.testing.assert_array_equal(sim.pair_score, s)
    assert (sim.unsafe == (np.where(need, s, z1) >= CUT)).all()
    assert (sim.pair_unsafe == (s >= CUT)).all()
    # in the log: every v2 decision the guard decided with the pair is inside the band
    v2 = log.version == cfg.version_id
    ran_b = log.arrays.members_run["b"] == 1
    assert (
        ~np.isfinite(
            log.arrays.member_scores["b"][v2 & ~ran_b & (log.arrays.members_run["b"] == 0)]
        )
    ).all()


def test_cost_against_sklearn_on_scenes_where_both_ran(logged):
    path, b = logged
    log = read_log(path)
    cfg = b["cfg"]
    c = cascade_cost(log, cfg.version_id, n_boot=300, rng=np.random.default_rng(0))
    arr = log.arrays
    ran = (
        (log.label >= 0) & np.isfinite(arr.member_scores["a"]) & np.isfinite(arr.member_scores["b"])
    )
    # the cascade's own second-member decisions (chosen by its band) are left out: the sample
    # is the scenes where the pair ran whatever the band said
    own = ran & (log.version == cfg.version_id)
    both = ran & ~own
    assert own.any() and both.any()
    y = log.label[both]
    a, bb = arr.member_scores["a"][both], arr.member_scores["b"][both]
    s = 0.5 * ((a - 0.2) / 1.5 + (bb + 0.1) / 0.8)
    inside = _hand_inside(a, cfg.policy)
    score = np.where(inside, s, (a - 0.2) / 1.5)
    assert c.n == int(both.sum()) and c.n_unsafe == int(y.sum())
    assert c.n_first_only == int((~inside).sum()) > 0 and c.measurable
    assert c.simulated_share == pytest.approx(inside.mean())
    assert c.n_from_cascade == int(own.sum())
    assert c.auroc_pair.value == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert c.auroc_cascade.value == pytest.approx(roc_auc_score(y, score), abs=1e-12)
    assert c.auroc_diff.value == pytest.approx(
        roc_auc_score(y, score) - roc_auc_score(y, s), abs=1e-12
    )

    def ba(flag: np.ndarray) -> float:
        return 0.5 * (flag[y == 1].mean() + 1 - flag[y == 0].mean())

    assert c.ba_pair.value == pytest.approx(ba(s >= CUT), abs=1e-12)
    assert c.ba_cascade.value == pytest.approx(ba(score >= CUT), abs=1e-12)
    assert c.ba_diff.value == pytest.approx(ba(score >= CUT) - ba(s >= CUT), abs=1e-12)
    for e in (c.auroc_pair, c.auroc_diff, c.ba_diff):
        assert e.ci.low <= e.value <= e.ci.high and e.n == c.n


def test_cost_keys_a_situation_cut_by_the_guards_ids_not_a_labels_files(tmp_path: Path):
    """A labels file that regroups situations (for the card's bootstrap groups) changes no
    simulated decision: the cascade's situation cut keys its windows by the ids the guard
    logged, as the guard would have, so the point values are those of the guard's ids."""
    import csv

    from spotstop.guard.policies import SituationPolicy

    path = tmp_path / "log.sqlite"
    sit_cut = SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(threshold=CUT))
    b = build(path, cut=sit_cut)
    cfg = b["cfg"]
    plain = read_log(path)
    arr = plain.arrays
    labels = tmp_path / "labels.csv"
    with labels.open("w", newline="") as fh:  # same labels, v1 regrouped 6 scenes a situation
        w = csv.writer(fh)
        w.writerow(["decision_id", "label", "situation_id"])
        for i, d in enumerate(arr.decision_id.tolist()):
            if plain.label[i] >= 0 and d.startswith("v1-"):
                w.writerow([d, "unsafe" if plain.label[i] == 1 else "safe", f"review-{i // 6}"])
    regrouped = read_log(path, labels=labels)
    rows = np.flatnonzero((plain.version != cfg.version_id) & (plain.label >= 0))
    assert (regrouped.situation_id[rows] != arr.logged_situation_id[rows]).any()
    # independent: the guard's own decide_batch per logged batch, on the logged ids
    sim = simulate_cascade(
        cfg,
        {m: arr.member_scores[m][rows] for m in ("a", "b")},
        [s or None for s in arr.logged_situation_id[rows]],
        list(arr.batch_id[rows]),
    )
    y = plain.label[rows]

    def ba(flag: np.ndarray) -> float:
        return 0.5 * (flag[y == 1].mean() + 1 - flag[y == 0].mean())

    for log in (plain, regrouped):
        c = cascade_cost(log, cfg.version_id, n_boot=50, rng=np.random.default_rng(0))
        assert c.n == rows.size
        assert c.ba_cascade.value == pytest.approx(ba(sim.unsafe), abs=1e-12)
        assert c.ba_pair.value == pytest.approx(ba(sim.pair_unsafe), abs=1e-12)
        assert c.auroc_cascade.value == pytest.approx(roc_auc_score(y, sim.score), abs=1e-12)


def test_cost_reads_only_scenes_of_the_cascades_bundle_and_prompt(logged, tmp_path: Path):
    """The pair segment logged by another bundle (other members, another prompt: scores on
    another scale) is no sample for this cascade's policy: its cost is then not measured."""
    import shutil
    import sqlite3

    path, b = logged
    v2 = b["cfg"].version_id
    full = cascade_cost(read_log(path), v2, n_boot=50, rng=np.random.default_rng(0))
    assert full.n > 0 and full.measurable
    other = tmp_path / "other.sqlite"
    shutil.copyfile(path, other)
    with sqlite3.connect(other) as conn:
        conn.execute(
            "UPDATE decisions SET bundle_id = 'bundle-0', prompt_hash = 'p0' "
            "WHERE policy_version != ?",
            (v2,),
        )
        conn.execute(
            "UPDATE policies SET bundle_id = 'bundle-0', prompt_hash = 'p0' "
            "WHERE policy_version != ?",
            (v2,),
        )
    conn.close()
    log = read_log(other)
    assert set(log.arrays.bundle_id.tolist()) == {"bundle-0", b["cfg"].bundle_id}
    c = cascade_cost(log, v2, n_boot=50, rng=np.random.default_rng(0))
    assert c.n == 0 and not c.measurable and "of its bundle" in c.note


def test_only_the_cascades_own_scenes_say_the_cost_is_not_measurable(tmp_path: Path):
    path = tmp_path / "log.sqlite"
    b = build(path, with_pair_segment=False)
    log = read_log(path)
    c = cascade_cost(log, b["cfg"].version_id, n_boot=50, rng=np.random.default_rng(0))
    assert c.n == 0 and c.n_from_cascade > 0 and c.n_first_only == 0 and not c.measurable
    assert math.isnan(c.auroc_diff.value) and "not measured" in c.note
    assert "a cascade's own second-member decisions" in c.note
    res = CascadeCheck().run(_ctx(log))
    assert any("Run the pair on a labelled sample" in v for _, v in res.rows)
    item = CascadeCheck.verdict_item(res.result)
    assert item is not None and item.status == "warn" and item.topic == "cascade"
    assert "run the pair on a labelled sample" in item.sentence


def _table() -> CaseTable:
    return CaseTable(
        case_id=np.array(["x", "y"], dtype=object),
        label=np.array([0, 1], dtype=np.int8),
        score=np.array([0.0, 1.0]),
        contrast_id=np.array(["c", "c"], dtype=object),
        situation_id=np.array(["", ""], dtype=object),
    )


def _ctx(log) -> CardContext:
    table = _table()
    return CardContext(table=table, direct_cut=0.0, rng=np.random.default_rng(0), n_boot=50,
                       log=log)  # fmt: skip


def test_no_cascade_in_the_log_or_no_log_is_not_used_not_an_error(tmp_path: Path):
    ctx = CardContext(table=_table(), direct_cut=0.0, rng=np.random.default_rng(0))
    res = CascadeCheck().run(ctx)
    assert res.data == {"used": False, "note": res.rows[0][1]} and "not used" in res.rows[0][1]
    path = tmp_path / "frozen.sqlite"
    cfg = policy_config(FrozenPolicy(threshold=0.0), fusion=FUSION)
    rng = np.random.default_rng(0)
    _, sit, members = _scenes(rng, 5, "f-")
    with DecisionLog(path) as log:
        log.append_many(segment_records(Segment(cfg, members, list(sit), T1), "f-"),
                        policy=policy_row(cfg))  # fmt: skip
    res = CascadeCheck().run(_ctx(read_log(path)))
    assert not res.result.used and "no cascade policy decided" in res.rows[0][1]
    assert CascadeCheck.verdict_item(res.result) is None


def test_the_card_shows_the_cascade_in_json_markdown_and_html(logged, tmp_path: Path):
    path, b = logged
    out = tmp_path / "card"
    card_from_inputs(log=path, out=out, n_boot=200, seed=0)
    doc = json.loads((out / "card.json").read_text(encoding="utf-8"))
    sec = doc["checks"]["cascade"]
    assert sec["used"] is True
    (v,) = sec["versions"]
    assert v["version_id"] == b["cfg"].version_id and v["configured_share"] == 0.5
    assert v["share"]["n"] == b["inside"].size
    assert v["cost"]["measurable"] is True and v["cost"]["auroc"]["pair"]["ci"][0] is not None
    topics = [v["topic"] for v in doc["verdict"]]
    assert topics == ["leak", "cut", "policy", "guarantee", "cascade"]
    item = doc["verdict"][-1]
    lost = -v["cost"]["auroc"]["cascade_minus_pair"]["value"]
    assert v["cost"]["auroc"]["cascade_minus_pair"]["ci"][1] < 0 and lost >= 0.01
    assert item["status"] == "warn" and f"gives up {lost:.3f} AUROC" in item["sentence"]
    assert "raise the share" in item["sentence"] and "fitted for 50 %" in item["sentence"]
    md = (out / "card.md").read_text(encoding="utf-8")
    html = (out / "card.html").read_text(encoding="utf-8")
    for text in (md, html):
        assert "Cascade" in text and "second member ran on" in text
        assert "AUROC for running the second member on" in text
        assert "full pair against the cascade" in text


def test_a_cascade_with_a_conformal_cut_is_audited_on_its_own_answers(tmp_path: Path):
    """The cut's guarantee is on the pair's S; the cascade answers on z1 outside the band, so
    its logged answers are audited against the cut's alpha (kind ``cascade``)."""
    rng = np.random.default_rng(3)
    y, _, members = _scenes(rng, 150, "cal")
    s = FUSION.fuse_many(members)[y == 1]
    fit = conformal_cut(s, alpha=0.1).marginal
    conf = ConformalPolicy(alpha=0.1, n=fit.n, k=fit.k, threshold=fit.threshold)
    path = tmp_path / "log.sqlite"
    b = build(path, cut=conf)
    log = read_log(path)
    (a,) = audit_deployed(log)
    assert a.kind == "cascade" and a.version_id == b["cfg"].version_id
    assert a.threshold == conf.threshold and a.alpha == 0.1
    assert a.to_dict()["kind"] == "cascade" and "cascade with a conformal cut" in a.policy_text()
    # the misses are the logged SAFE answers on unsafe decisions (first per situation)
    v2 = (log.version == a.version_id) & (log.label == 1) & ~log.arrays.fail_closed
    assert a.n_decisions == int(v2.sum())
    assert a.misses == int((log.arrays.guard_label[v2] == 0).sum())  # one unsafe per situation


def test_a_cascade_that_beats_the_pair_is_said_to_gain():
    """The verdict said "gives up -0.044 AUROC" where the section said "gains 0.044"."""
    from spotstop.diagnostics._cascade import CascadeCost, CascadeShare
    from spotstop.diagnostics._cascade_check import CascadeResult, _verdict_item
    from spotstop.diagnostics._results import ConfidenceInterval, Estimate

    def e(v: float, lo: float, hi: float, n: int = 80) -> Estimate:
        return Estimate(v, ConfidenceInterval(lo, hi), n)

    share = CascadeShare("v2", "a", 0.5, 1.0, "frozen", 120, 60, e(0.5, 0.41, 0.59, 120), 0, 0, 60)
    for diff, verb in ((0.044, "gains 0.044"), (-0.044, "gives up 0.044")):
        cost = CascadeCost(
            "v2", 80, 40, 40, 0, 0.5, e(0.8, 0.7, 0.9), e(0.8 + diff, 0.7, 0.9),
            e(diff, diff - 0.04, diff + 0.05), e(0.7, 0.6, 0.8), e(0.7, 0.6, 0.8),
            e(0.0, -0.05, 0.05),
        )  # fmt: skip
        item = _verdict_item(CascadeResult((share,), (cost,), ""))
        assert item is not None and f"{verb} AUROC against the full pair" in item.sentence
        assert "-0.044 AUROC" not in item.sentence
