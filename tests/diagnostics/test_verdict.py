"""The verdict's sentences, on constructed logs: the label leaks / does not leak through the
files; the conformal guarantee holds / is violated; what changed since a previous card (and a
previous card of another bundle is refused); the cut and policy rules on hand-made inputs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.diagnostics import (
    CardContext,
    CaseTable,
    DataError,
    Estimate,
    log_cases,
    scene_blind_readers,
    simulate_log,
)
from spotstop.diagnostics._build import card_from_inputs
from spotstop.diagnostics._card import _deployed, compute_card
from spotstop.diagnostics._cli import card_main
from spotstop.diagnostics._conformal_audit import ConformalAuditCheck
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._recommend import Recommendation
from spotstop.diagnostics._results import ConfidenceInterval
from spotstop.diagnostics._verdict import (
    check_previous,
    cut_item,
    guarantee_item,
    leak_item,
    policy_item,
)
from spotstop.guard.policies import ConformalPolicy, FrozenPolicy

from tests._support.log_writer import Segment, policy_config, write_log
from tests._support.replay_log import build_log


def log_from_table(path: Path, t: CaseTable, threshold: float = 0.0, *, bundle: str = "") -> Path:
    """A schema-2 log of ``t``'s cases decided by a frozen cut (S = mean of members a, b),
    with the table's image sizes and labels (contrast ids kept)."""
    cfg = policy_config(FrozenPolicy(threshold=threshold), created=1_600_000_000.0)
    w, h, nb, fmt = t.width, t.height, t.n_bytes, t.format
    assert w is not None and h is not None and nb is not None and fmt is not None
    extra = [
        {
            "width": int(w[i]),
            "height": int(h[i]),
            "n_bytes": int(nb[i]),
            "image_format": str(fmt[i]),
        }
        for i in range(len(t))
    ]
    if bundle:
        extra = [{**e, "bundle_id": bundle} for e in extra]
    seg = Segment(cfg, dict(t.member_scores), [str(s) for s in t.situation_id], 1.7e9, 5,
                  extra=extra)  # fmt: skip
    labels = [
        (f"d-{i:05d}", "unsafe" if t.label[i] else "safe", str(t.contrast_id[i]) or None, "r")
        for i in range(len(t))
    ]
    write_log(path, [(seg, "d-")], labels)
    return path


def _card(log: Path, out: Path, **kw) -> dict:
    card_from_inputs(log=log, out=out, n_boot=200, n_boot_checks=200, **kw)
    return json.loads((out / "card.json").read_text())


def test_leak_and_no_leak_from_logs(tmp_path):
    leak = log_from_table(tmp_path / "leak.sqlite", simulate_log(120, size_leak=1.5, rng=7))
    clean = log_from_table(tmp_path / "clean.sqlite", simulate_log(120, size_leak=0.0, rng=7))
    doc = _card(leak, tmp_path / "card")
    item = doc["verdict"][0]
    assert item["topic"] == "leak" and item["status"] == "fail"
    assert "leaks through the image files" in item["sentence"]
    auroc = doc["checks"]["scene_blind"]["file_reader_auroc"]
    assert (
        f"AUROC {auroc['value']:.3f} [{auroc['ci'][0]:.3f}, {auroc['ci'][1]:.3f}]"
        in item["sentence"]
    )
    assert "letterbox" in item["sentence"]  # what to do
    blind = scene_blind_readers(log_cases(clean).table, n_permutations=40, n_boot=100, rng=0)
    ok = leak_item(blind)
    assert ok.status == "ok" and "does not leak" in ok.sentence and "nothing to do" in ok.sentence
    missing = leak_item(None)
    assert missing.status == "warn" and "not measured" in missing.sentence


@pytest.mark.parametrize(
    "shift, status, words",
    [(0.0, "ok", "the guarantee holds"), (2.5, "fail", "the guarantee is violated")],
)
def test_guarantee_holds_or_is_violated(tmp_path, shift, status, words):
    path = tmp_path / "log.sqlite"
    info = build_log(path, conformal_shift=shift, seed=1)
    lc = log_cases(path)
    ctx = CardContext(lc.table, 0.0, np.random.default_rng(0), n_boot=50, log=lc.log)
    res = ConformalAuditCheck().run(ctx)
    item = guarantee_item(res.result)
    a = res.result.deployed[-1]
    assert item.topic == "guarantee" and item.status == status and words in item.sentence
    assert info["cfgs"][1].version_id in item.sentence
    assert f"missed {a.misses} of {a.n_situations}" in item.sentence
    assert "one-sided binomial test" in item.sentence and "p" in item.sentence
    if status == "fail":
        assert "spotstop recalibrate --policy conformal" in item.sentence


def test_guarantee_without_a_deployed_cut():
    t = simulate_log(80, rng=3)
    res = ConformalAuditCheck().run(CardContext(t, 0.0, np.random.default_rng(0), n_boot=50))
    item = guarantee_item(res.result)
    assert (
        item.status == "warn"
        and "scores CSV or the simulated log holds no deployed policy" in item.sentence
    )
    assert res.data["deployed"] == [] and "what-if" in res.data["note"]


def test_the_guarantee_reads_a_conformal_cut_activated_again(tmp_path):
    # v1 decides, v2 replaces it, then v1 is activated again and decides the latest
    # decisions: the sentence is v1's (it misses most unsafe scenes), not v2's (it holds)
    rng = np.random.default_rng(0)
    v1 = policy_config(ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.5), created=1.0e9)
    v2 = policy_config(
        ConformalPolicy(alpha=0.1, n=100, k=10, threshold=-5.0), version=2, created=1.1e9
    )
    segments, labels = [], []
    for prefix, cfg, t0 in (("a-", v1, 1.05e9), ("b-", v2, 1.15e9), ("c-", v1, 1.25e9)):
        s = np.empty(120)
        s[0::2], s[1::2] = rng.normal(0.0, 1.0, 60), rng.normal(-2.0, 0.5, 60)
        sit = [f"{prefix}{i // 2}" for i in range(s.size)]
        segments.append((Segment(cfg, {"a": s, "b": s}, sit, t0), prefix))
        labels += [
            (f"{prefix}{i:05d}", "safe" if i % 2 else "unsafe", f"{prefix}{i // 2}", "r")
            for i in range(s.size)
        ]
    path = tmp_path / "log.sqlite"
    write_log(path, segments, labels)
    lc = log_cases(path)
    res = ConformalAuditCheck().run(
        CardContext(lc.table, 0.0, np.random.default_rng(0), 50, log=lc.log)
    )
    status = {a.version_id: a.status for a in res.result.deployed}
    assert status == {v1.version_id: "violated", v2.version_id: "holds"}
    kind, version = _deployed(lc.log)
    assert (kind, version) == ("conformal", v1.version_id)
    item = guarantee_item(res.result, version)
    assert item.status == "fail" and "the guarantee is violated" in item.sentence
    assert item.sentence.startswith(f"The conformal cut {v1.version_id} ")
    assert "no longer decides" not in item.sentence and "carries no" not in item.sentence


@pytest.mark.filterwarnings("ignore::spotstop.diagnostics._errors.UndefinedMetricWarning")
def test_unreviewed_safe_answers_are_not_a_guarantee_that_holds(tmp_path):
    """A conformal cut that lets 68 % of unsafe scenes through, reviewed only where it answered
    UNSAFE: the audit saw 0 misses of 64 and the verdict said "the guarantee holds; nothing to
    do". It now says its SAFE answers were reviewed less often and that it cannot tell; with a
    random half reviewed, the same cut is found violated. The delivered rates (hit rate 1
    [1, 1] of the reviewed decisions) now carry the same caution."""
    from spotstop.diagnostics._card import _delivered_json
    from spotstop.diagnostics._delivered import delivered
    from spotstop.guard._log import DecisionLog

    rng = np.random.default_rng(0)
    cfg = policy_config(ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.5), created=1.0e9)
    s = np.empty(400)
    s[0::2], s[1::2] = rng.normal(0.0, 1.0, 200), rng.normal(-2.0, 0.5, 200)
    seg = Segment(cfg, {"a": s, "b": s}, [f"s{i // 2}" for i in range(400)], 1.05e9)
    status, notes = {}, {}
    for name, pick in (
        ("stops only", lambda i, r: r.label == "UNSAFE"),
        ("random half", lambda i, r: rng.random() < 0.5),
    ):
        path = tmp_path / f"{name}.sqlite"
        recs = write_log(path, [(seg, "a-")])["a-"]
        truth = ("unsafe", "safe")
        with DecisionLog(path) as log:
            log.set_labels(
                [(r.decision_id, truth[i % 2], None, "r") for i, r in enumerate(recs) if pick(i, r)]
            )
        lc = log_cases(path)
        res = ConformalAuditCheck().run(
            CardContext(lc.table, 0.0, np.random.default_rng(0), 50, log=lc.log)
        )
        [a] = res.result.deployed
        status[name] = a.status
        notes[name] = _delivered_json(delivered(lc.log, n_boot=50, rng=rng))["delivered_note"]
        item = guarantee_item(res.result, cfg.version_id)
        if name == "stops only":
            assert a.misses == 0 and a.n_situations >= a.n_min
            assert item.status == "warn" and "nothing to do" not in item.sentence
            assert "the guarantee holds cannot be told" in item.sentence
            assert "SAFE answers were reviewed less often (0 of" in item.sentence
            assert a.reviewed[0] == 0 and a.reviewed[2] == a.reviewed[3] > 0
            assert a.label_note in dict(res.rows)[f"{a.version_id} ({a.policy_text()})"]
    assert status == {"stops only": "not enough data", "random half": "violated"}
    assert "SAFE answers were reviewed less often (0 of" in notes["stops only"]
    assert "the hit rate reads high" in notes["stops only"]
    assert notes["random half"] == "0 labelled fail-closed decision(s) left out"


def test_an_unaudited_deployed_cut_is_not_a_guarantee_that_holds(tmp_path):
    """v1 (conformal, holds) decided, then v2 (conformal) decided the latest decisions, but v2's
    document in the log does not load: the verdict read v1's audit, said "the guarantee holds;
    nothing to do" and that v2 "carries no miss-rate guarantee". It now says v2's cut decides
    unaudited and to mend its document."""
    from spotstop.guard._log import DecisionLog

    from tests._support.log_writer import segment_records

    rng = np.random.default_rng(0)
    v1 = policy_config(ConformalPolicy(alpha=0.1, n=100, k=10, threshold=-5.0), created=1.0e9)
    v2 = policy_config(
        ConformalPolicy(alpha=0.1, n=100, k=10, threshold=0.5), version=2, created=1.1e9
    )
    labels = []
    with DecisionLog(tmp_path / "log.sqlite") as log:
        for prefix, cfg, t0 in (("a-", v1, 1.05e9), ("b-", v2, 1.15e9)):
            s = np.empty(160)
            s[0::2], s[1::2] = rng.normal(0.0, 1.0, 80), rng.normal(-2.0, 0.5, 80)
            seg = Segment(cfg, {"a": s, "b": s}, [f"{prefix}{i // 2}" for i in range(160)], t0)
            row = cfg.log_row()
            if cfg is v2:  # a document that no longer loads (k is not its rank)
                doc = dict(row.document)
                doc["policy"] = {**doc["policy"], "k": 3}
                row = dataclasses.replace(row, document=doc)
            log.append_many(segment_records(seg, prefix), policy=row)
            labels += [
                (f"{prefix}{i:05d}", "safe" if i % 2 else "unsafe", None, "r") for i in range(160)
            ]
        log.set_labels(labels)
    lc = log_cases(tmp_path / "log.sqlite")
    assert v2.version_id in lc.log.policy_errors
    res = ConformalAuditCheck().run(
        CardContext(lc.table, 0.0, np.random.default_rng(0), 50, log=lc.log)
    )
    assert [a.status for a in res.result.deployed] == ["holds"]
    item = guarantee_item(res.result, _deployed(lc.log)[1])
    assert item.status == "warn" and "nothing to do" not in item.sentence
    assert f"the deployed {v2.version_id}, whose conformal cut decides now, is not audited" in (
        item.sentence
    )
    assert "carries no miss-rate guarantee" not in item.sentence


def test_changes_since_the_previous_card(tmp_path):
    t = simulate_log(100, rng=11)
    a = _card(log_from_table(tmp_path / "a.sqlite", t, 0.0), tmp_path / "a")
    # the same scenes under a much higher cut: the guard lets most unsafe scenes through
    b_log = log_from_table(tmp_path / "b.sqlite", t, 2.0)
    b = _card(b_log, tmp_path / "b", previous=tmp_path / "a" / "card.json")
    item = b["verdict"][-1]
    assert len(b["verdict"]) == 5 and item["topic"] == "changes" and item["status"] == "fail"
    assert "delivered hit rate" in item["sentence"] and "→" in item["sentence"]
    assert "before it runs on" in item["sentence"]
    same = _card(b_log, tmp_path / "c", previous=tmp_path / "b" / "card.json")
    assert same["verdict"][-1]["status"] == "ok"
    assert "no key field moved beyond its interval" in same["verdict"][-1]["sentence"]
    assert a["provenance"]["bundle_ids"] == b["provenance"]["bundle_ids"] == ["bundle-1"]


def test_a_previous_card_of_another_bundle_is_refused(tmp_path, capsys):
    t = simulate_log(30, rng=2)
    other = log_from_table(tmp_path / "o.sqlite", t, bundle="bundle-9")
    _card(other, tmp_path / "o")
    mine = log_from_table(tmp_path / "m.sqlite", t)
    prev = str(tmp_path / "o" / "card.json")
    with pytest.raises(DataError, match="card of bundle bundle-9; this card is of bundle bundle-1"):
        check_previous(json.loads(Path(prev).read_text()), ["bundle-1"])
    rc = card_main([str(mine), "--previous", prev, "--out", str(tmp_path / "m"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Compare cards of one bundle" in err
    with pytest.raises(DataError, match="schema 1"):
        check_previous({"schema_version": 1}, ["bundle-1"])


def _e(v: float, lo: float, hi: float) -> Estimate:
    return Estimate(v, ConfidenceInterval(lo, hi), 100)


def _fields(tp: Estimate, cf: Estimate, rec: Estimate) -> dict[str, Estimate]:
    return {"threshold_part": tp, "cross_fitted_threshold_part": cf, "batch_recovery": rec}


class _Sit:
    def __init__(self, gain: Estimate) -> None:
        self.ba_gain, self.icc = gain, _e(0.3, 0.2, 0.4)


class _Prev:
    def __init__(self, rec10: Estimate) -> None:
        self.recovery = {0.1: rec10}


def _args_of_bad() -> tuple[Any, ...]:
    return (
        _fields(_e(0.09, 0.06, 0.12), _e(0.08, 0.05, 0.10), _e(0.77, 0.6, 0.9)),
        _Prev(_e(0.2, -0.5, 0.6)),
        _Sit(_e(0.068, 0.03, 0.1)),
        "the deployed frozen cut",
        0.1,
    )


def test_cut_rule_by_hand():
    bad = cut_item(
        _fields(_e(0.09, 0.06, 0.12), _e(0.08, 0.05, 0.10), _e(0.77, 0.6, 0.9)),
        _Prev(_e(0.2, -0.5, 0.6)),
        _Sit(_e(0.068, 0.03, 0.1)),
        "the deployed frozen cut",
        0.1,
    )
    assert bad.status == "fail" and bad.sentence.startswith("The cut is misplaced")
    assert "8.0 [5.0, 10.0] points" in bad.sentence and "recentre on the situation" in bad.sentence
    assert "S > 0.1 (the deployed frozen cut)" in bad.sentence
    # where the policy line recommends another policy, the cut line defers to it (the demo
    # card said "recentre on the situation" above "keep the deployed conformal policy")
    other = cut_item(
        _fields(_e(0.09, 0.06, 0.12), _e(0.08, 0.05, 0.10), _e(0.77, 0.6, 0.9)),
        _Prev(_e(0.2, -0.5, 0.6)),
        _Sit(_e(0.068, 0.03, 0.1)),
        "the deployed frozen cut",
        0.1,
        "conformal",
    )
    assert "recentre on the situation" not in other.sentence
    assert other.sentence.endswith(
        "the situation policy would recentre it; the policy line weighs that against the "
        "recommended conformal policy."
    )
    same = cut_item(*_args_of_bad(), "situation")
    assert same.sentence == bad.sentence
    refit = cut_item(
        _fields(_e(0.09, 0.06, 0.12), _e(0.08, 0.05, 0.10), _e(0.4, 0.2, 0.6)),
        _Prev(_e(0.2, -0.5, 0.6)),
        _Sit(_e(0.0, -0.02, 0.02)),
        "x",
        0.0,
    )
    assert "spotstop recalibrate" in refit.sentence
    fine = cut_item(
        _fields(_e(0.004, -0.01, 0.02), _e(0.0, -0.02, 0.02), _e(math.nan, math.nan, math.nan)),
        None,
        None,
        "x",
        0.0,
    )
    assert fine.status == "ok" and "well placed" in fine.sentence
    none = cut_item(_fields(*(_e(math.nan, math.nan, math.nan),) * 3), None, None, "x", 0.0)
    assert none.status == "warn" and "contrast_id" in none.sentence


def test_policy_rule_by_hand():
    rec = Recommendation("conformal", ("150 labelled unsafe situations suffice",))
    assert policy_item(rec, "conformal").status == "ok"
    switch = policy_item(rec, "frozen", "v0004+0123abcd")
    assert switch.status == "warn" and "--policy conformal" in switch.sentence
    assert "deployed frozen policy (v0004+0123abcd)" in switch.sentence
    assert "nothing is deployed" in policy_item(dataclasses.replace(rec), None).sentence


def test_a_deployed_cascade_gets_its_checks_policy_advice():
    """A deployed cascade is a cost option around its cut: the cascade check gives the
    ``policy`` sentence (the recommendation against its cut) and the advice keeps it; for
    any other deployed policy it says nothing and the verdict's own sentence stands."""
    from spotstop.diagnostics._cascade_check import CascadeCheck
    from spotstop.guard.policies import CascadePolicy, ConformalPolicy, FrozenPolicy

    rec = Recommendation("conformal", ("150 labelled unsafe situations suffice",))
    conf = ConformalPolicy(alpha=0.1, n=50, k=5, threshold=0.2)

    def cascade(cut):
        return CascadePolicy(first="a", share=0.5, band=0.3, cut=cut)

    keep = CascadeCheck.policy_advice(rec, cascade(conf), "v0005+0123abcd")
    assert keep is not None and keep.status == "ok" and keep.topic == "policy"
    assert "Keep the deployed cascade (v0005+0123abcd) around its conformal cut" in keep.sentence
    recut = CascadeCheck.policy_advice(rec, cascade(FrozenPolicy(0.1)), "v0005+0123abcd")
    assert recut is not None and recut.status == "warn"
    assert "--policy cascade --cut conformal" in recut.sentence
    away = CascadeCheck.policy_advice(
        dataclasses.replace(rec, policy="batch"), cascade(FrozenPolicy(0.1)), None
    )
    assert away is not None
    assert "Switch from the deployed cascade" in away.sentence and "both members" in away.sentence
    assert CascadeCheck.policy_advice(rec, FrozenPolicy(0.1), "v1") is None
    assert CascadeCheck.policy_advice(rec, None, None) is None


def test_cut_item_reads_the_gain_when_the_recovery_is_undefined_and_names_ties():
    fields = _fields(_e(0.05, 0.0, 0.1), _e(0.03, 0.01, 0.05), _e(math.nan, math.nan, math.nan))
    fields["batch_gain"] = _e(0.012, -0.01, 0.03)
    fields["tied_share"] = _e(0.365, 0.3, 0.43)
    item = cut_item(fields, _Prev(_e(math.nan, math.nan, math.nan)), None, "x", 0.5)
    assert "the batch rule adds +1.2 [-1.0, +3.0] points" in item.sentence
    assert "undefined" in item.sentence and "nan" not in item.sentence.lower()
    assert "36.5 [30.0, 43.0] % of the contrasts are tied" in item.sentence
    assert "not another cut" in item.sentence
    # few ties: no tie sentence; a defined recovery without a defined 10 % one: no 'at 10 %'
    fields["tied_share"] = _e(0.01, 0.0, 0.02)
    fields["batch_recovery"] = _e(0.6, 0.2, 0.9)
    quiet = cut_item(fields, _Prev(_e(math.nan, math.nan, math.nan)), None, "x", 0.5)
    assert "tied" not in quiet.sentence and "at 10 % unsafe" not in quiet.sentence
    assert "recovers 60.0 [20.0, 90.0] % of it here" in quiet.sentence


def test_the_cut_and_leak_sentences_say_ok_only_when_their_interval_rules_it_out():
    """With too little data the cut sentence said "well placed" (a cross-fitted part of NaN,
    or an interval reaching 23 points) and the leak sentence "does not leak" (AUROC 0.54
    [0.28, 0.80])."""
    nan = _e(math.nan, math.nan, math.nan)
    unmeasured = cut_item(_fields(_e(0.5, 0.5, 0.5), nan, nan), None, None, "x", 0.0)
    assert unmeasured.status == "warn" and "not measured out of sample" in unmeasured.sentence
    assert "in sample the part is 50.0 [50.0, 50.0] points" in unmeasured.sentence
    wide = cut_item(_fields(_e(0.13, 0.0, 0.3), _e(0.062, -0.167, 0.233), nan), None, None, "x", 0)
    assert wide.status == "warn" and wide.sentence.startswith("Whether the cut is misplaced is not")
    assert "label more contrasts before changing the cut" in wide.sentence
    assert "no recalibration" not in wide.sentence
    # the edge: an interval up to CUT_ROOM (2 points) rules a misplaced cut out
    edge = cut_item(_fields(_e(0.0, -0.01, 0.02), _e(0.0, -0.02, 0.02), nan), None, None, "x", 0)
    assert edge.status == "ok"

    class _Blind:
        def __init__(self, fr: Estimate, p: float) -> None:
            self.file_reader, self.file_reader_p = fr, p
            self.longest_side = self.request_only = None

    unresolved = leak_item(_Blind(_e(0.542, 0.280, 0.796), 0.4))
    assert unresolved.status == "warn" and "is not resolved" in unresolved.sentence
    assert leak_item(_Blind(_e(0.52, 0.40, 0.69), 0.4)).status == "ok"
    untested = leak_item(_Blind(_e(1.0, 1.0, 1.0), math.nan))
    assert untested.status == "warn" and "may leak" in untested.sentence
    assert "permutation test cannot run" in untested.sentence


def test_a_leak_with_no_unit_of_both_classes_is_not_called_no_leak():
    """Every case its own situation and no contrast ids: a swap within a unit moves no label,
    so every draw of the null was the observed AUROC and p = 1 ("does not leak", AUROC 1)."""
    t = simulate_log(60, rng=3, size_leak=2.0)
    single = dataclasses.replace(
        t,
        contrast_id=np.array([""] * len(t), dtype=object),
        situation_id=np.array([f"u{i}" for i in range(len(t))], dtype=object),
    )
    blind = scene_blind_readers(single, n_permutations=20, n_boot=50, rng=0)
    assert blind.file_reader is not None and blind.file_reader.value > 0.9
    assert math.isnan(blind.file_reader_p)
    assert leak_item(blind).status == "warn"
    paired = scene_blind_readers(t, n_permutations=20, n_boot=50, rng=0)
    assert paired.file_reader_p < 0.1  # with its contrasts the test runs, and rejects


def test_few_groups_never_say_ok():
    """With 8 situation groups the card said "does not leak" and "the cut is well placed"
    from percentile intervals it itself calls too narrow below 30 groups; both now say the
    question is not resolved. From 30 groups the same intervals may say ok."""
    rng = np.random.default_rng(3)
    n = 8 * 5 * 2  # 8 situations x 5 contrasts x (safe, unsafe)
    y = np.tile([0, 1], n // 2)
    table = CaseTable(
        case_id=[f"c{i}" for i in range(n)],
        label=y,
        score=rng.normal(2.5 * y),
        contrast_id=[f"k{i // 2}" for i in range(n)],
        situation_id=[f"s{i // 10}" for i in range(n)],
        width=rng.choice([640.0, 800.0], n),
        height=np.full(n, 480.0),
        n_bytes=rng.integers(10_000, 20_000, n).astype(float),
    )
    assert table.n_groups == 8
    card = compute_card(table, direct_cut=1.25, n_boot=300, n_boot_checks=100, rng=0)
    items = {v.topic: v for v in card.verdict}
    for topic in ("leak", "cut"):
        assert items[topic].status == "warn", items[topic].sentence
        assert "from 8 groups, fewer than 30" in items[topic].sentence
    assert "label more situations" in items["cut"].sentence
    # the same intervals from 30 groups or more may say ok
    fine = _fields(_e(0.004, -0.01, 0.02), _e(0.0, -0.02, 0.02), _e(math.nan, math.nan, math.nan))
    assert cut_item(fine, None, None, "x", 0.0, None, 30).status == "ok"
    few = cut_item(fine, None, None, "x", 0.0, None, 29)
    assert few.status == "warn" and "from 29 groups, fewer than 30" in few.sentence


def test_an_unmeasured_leak_names_its_own_cause():
    """Every label one class: the sentence blamed missing image sizes or too few groups,
    though the cases had both. It now says what kept the file reader from being fitted."""
    t = simulate_log(60, rng=3, size_leak=2.0)
    one_class = dataclasses.replace(t, label=np.ones(len(t), dtype=t.label.dtype))
    with pytest.warns(UndefinedMetricWarning):
        blind = scene_blind_readers(one_class, n_permutations=5, n_boot=20, rng=0)
    item = leak_item(blind)
    assert item.status == "warn" and blind.file_reader is None
    assert "one class only (no SAFE case)" in item.sentence
    assert "image width" not in item.sentence and "fewer than" not in item.sentence
    few = dataclasses.replace(t, situation_id=np.array(["a", "b"] * (len(t) // 2), dtype=object),
                              contrast_id=np.array([""] * len(t), dtype=object))  # fmt: skip
    with pytest.warns(UndefinedMetricWarning):
        blind = scene_blind_readers(few, n_permutations=5, n_boot=20, rng=0)
    assert "form 2 group(s), fewer than the 5" in leak_item(blind).sentence
    measured = scene_blind_readers(t, n_permutations=5, n_boot=20, rng=0)
    assert measured.file_reader is not None and measured.file_reader_unmeasured == ""


def test_a_field_undefined_in_both_cards_is_not_said_to_be_within_its_interval():
    """A field NaN in both cards (e.g. the file reader's AUROC, never fitted) was listed
    among the fields "within their intervals", as if it had been compared and held."""
    from spotstop.diagnostics._verdict import changes_item

    def doc(auroc: float, reader: float) -> dict[str, Any]:
        est = {"value": auroc, "ci": [auroc - 0.01, auroc + 0.01]}
        nan = {"value": reader, "ci": [None, None]}
        return {
            "fields": {"auroc": est},
            "checks": {"scene_blind": {"file_reader_auroc": nan}},
            "settings": {"n_cases": 10},
        }

    item = changes_item(doc(0.9, float("nan")), doc(0.9, float("nan")))
    assert item.status == "ok"
    assert "(AUROC)" in item.sentence and "(unknown date, 10 cases)" in item.sentence
    assert "not measured in either card: file reader AUROC" in item.sentence
    moved = changes_item(doc(0.9, float("nan")), doc(0.5, float("nan")))
    assert "within their intervals" not in moved.sentence
    assert "not measured in either card: file reader AUROC" in moved.sentence
