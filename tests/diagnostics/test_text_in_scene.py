"""The card's "Text in the scene" section: files written by the cues results' own ``to_dict``
(reliance.json, shift.json, select.json, any subset), the advice, and the flag shares logged
at decision time against a direct count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics import CardContext, DataError, Estimate, log_cases, simulate_log
from spotstop.diagnostics._results import ConfidenceInterval
from spotstop.diagnostics._text_in_scene import TextInSceneCheck, read_cue_files
from spotstop.diagnostics.cues import (
    CandidateReliance,
    CueReliance,
    CueShift,
    Prediction,
    RelianceResult,
    SelectionResult,
    ShiftResult,
)
from spotstop.guard._log import DecisionLog
from spotstop.guard.policies import FrozenPolicy

from tests._support.log_writer import Segment, policy_config, write_log

CUES = ("reassuring", "alarming")
OCR = {"name": "rapidocr 3.10.0 PP-OCRv6 det+rec (test)", "sha256": "ab" * 32, "files": {}}


def _e(v: float, lo: float, hi: float, n: int = 50) -> Estimate:
    return Estimate(v, ConfidenceInterval(lo, hi), n)


def _cand(name: str, kind: str, reassuring: Estimate, alarming: Estimate) -> CandidateReliance:
    zero = _e(0.0, -0.01, 0.01)
    cues = {
        c: CueReliance(c, r, zero, _e(0.2, 0.1, 0.3), r, r, r)
        for c, r in zip(CUES, (reassuring, alarming), strict=True)
    }
    return CandidateReliance(name, kind, "hard", _e(0.2, 0.15, 0.25), cues)


def write_cue_files(
    folder: Path,
    *,
    which: tuple[str, ...] = ("reliance", "shift", "select"),
    assumption: str | None = None,
):
    folder.mkdir(parents=True, exist_ok=True)
    rel = RelianceResult(
        candidates={
            "qwen": _cand("qwen", "member", _e(0.05, -0.02, 0.12), _e(0.0, -0.03, 0.03)),
            "guard": _cand("guard", "guard", _e(0.31, 0.22, 0.40), _e(0.02, -0.01, 0.05)),
        },
        n_sources=50, n_scenes=1000, templates=("t1", "t2", "t3", "t4"), held_out="t5",
        n_boot=200, provenance={}, draws={},
    )  # fmt: skip
    sh = ShiftResult(
        cues={
            "reassuring": CueShift(
                "reassuring",
                _e(0.12, 0.10, 0.14, 400),
                _e(0.8, 0.7, 0.9),
                _e(0.05, 0.02, 0.08),
                _e(0.09, 0.06, 0.12, 400),
                _e(0.027, 0.018, 0.036, 400),
            ),
            "alarming": CueShift(
                "alarming",
                _e(0.03, 0.02, 0.04, 400),
                _e(0.9, 0.8, 0.95),
                _e(0.03, 0.01, 0.05),
                _e(0.0, 0.0, 0.01, 400),
                _e(0.0, 0.0, 0.007, 400),
            ),
        },
        prevalence=_e(0.3, 0.25, 0.35, 400),
        prevalence_source="log labels",
        n_frames=400,
        n_calibration=120,
        n_boot=200,
        provenance={"ocr_model": OCR, "lexicon_sha256": "cd" * 32},
        draws={},
        assumption=assumption,
    )
    preds = (
        Prediction(
            "qwen",
            "member",
            _e(0.21, 0.16, 0.26),
            _e(0.2, 0.15, 0.25),
            {},
            {"reassuring": 0.001, "alarming": 0.0},
            1,
            2,
            intercept=_e(0.209, 0.16, 0.26),
        ),
        Prediction(
            "guard",
            "guard",
            _e(0.208, 0.16, 0.26),
            _e(0.19, 0.14, 0.24),
            {},
            {"reassuring": 0.0084, "alarming": 0.0},
            2,
            1,
            intercept=_e(0.1996, 0.15, 0.25),  # the source error 0.19 weighted to π̂ 0.3
        ),
    )
    sel = SelectionResult(
        preds,
        {c: sh.cues[c].misleading_share for c in CUES},
        "SRA picks qwen.",
        weighting={"description": "intercept = source error weighted to π̂ = 0.300"},
        basis=sh.basis,
        assumption=sh.assumption,
    )
    docs = {"reliance": rel.to_dict(), "shift": sh.to_dict(), "select": sel.to_dict()}
    for name in which:
        (folder / f"{name}.json").write_text(json.dumps(docs[name]))
    return folder


def _run(table, folder=None, log=None):
    ctx = CardContext(table, 0.0, np.random.default_rng(0), n_boot=100, log=log, cues_dir=folder)
    return TextInSceneCheck().run(ctx)


def test_the_section_from_all_three_files(tmp_path):
    res = _run(simulate_log(20, rng=0), write_cue_files(tmp_path / "cues"))
    rows = dict(res.rows)
    assert rows["reliance of guard (guard, hard error) on reassuring text"] == (
        "+0.310 [+0.220, +0.400]"
    )
    assert (
        "d̂" in " ".join(rows)
        and "9.0 [6.0, 12.0] %" in rows["reassuring text in the deployment: d̂"]
    )
    assert (
        "sens 0.800 [0.700, 0.900], fpr 0.050 [0.020, 0.080]"
        in rows["reassuring text in the deployment: d̂"]
    )
    assert rows["OCR model"] == f"{OCR['name']} (sha256 {OCR['sha256']})"
    extra = rows["predicted extra error of guard"]
    assert "reassuring +0.008" in extra and "from select.json" in extra
    # Eq. 1 as the row reads it: the predicted error is the weighted intercept plus the extra
    # error (0.1996 + 0.0084 = 0.208), not the unweighted source error plus it
    assert (
        "predicted error 0.208 [0.160, 0.260] = its source error weighted to this deployment "
        "0.200 [0.150, 0.250] + the extra error (unweighted source error 0.190" in extra
    ), extra
    advice = [b for a, b in res.rows if a == "what to do"]
    assert any(
        "follows reassuring text" in a and "fail closed" in a and "choose candidate qwen" in a
        for a in advice
    )
    d = res.data
    assert d["files"] == ["reliance.json", "shift.json", "select.json"]
    assert d["ocr_model"]["sha256"] == OCR["sha256"] and d["prevalence_source"] == "log labels"
    assert d["shift"]["reassuring"]["d_hat"].ci.low == 0.06


def test_no_candidate_is_named_when_sra_could_not_rank(tmp_path):
    """Every predicted error undefined (a source set without SAFE scenes): select.json's order
    is by name, so its first candidate is no pick. The advice said "choose candidate qwen (SRA
    ranks it first)"; it now says SRA could not rank and names none."""
    folder = write_cue_files(tmp_path / "cues")
    doc = json.loads((folder / "select.json").read_text())
    for c in doc["candidates"]:
        c["predicted_error"] = {"value": None, "ci": [None, None], "n": 50}
    (folder / "select.json").write_text(json.dumps(doc))
    res = _run(simulate_log(20, rng=0), folder)
    advice = " ".join(b for a, b in res.rows if a == "what to do")
    assert "follows reassuring text" in advice and "fail closed" in advice
    assert "SRA ranks it first" not in advice and "choose candidate" not in advice
    assert "SRA could not rank the candidates (every predicted error is undefined" in advice
    assert res.data["predicted_extra_error"]["best"] is None


def test_any_subset_of_files(tmp_path):
    res = _run(
        simulate_log(20, rng=0), write_cue_files(tmp_path / "c", which=("reliance", "shift"))
    )
    extra = dict(res.rows)["predicted extra error of guard"]
    # without select.json: guard reliance x misleading share, point values, said so
    assert f"reassuring {0.31 * 0.027:+.3f}" in extra and "no interval" in extra
    only = _run(simulate_log(20, rng=0), write_cue_files(tmp_path / "s", which=("shift",)))
    assert only.data["files"] == ["shift.json"] and not only.data["reliance"]
    with pytest.raises(DataError, match=r"holds none of reliance\.json"):
        read_cue_files(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "shift.json").write_text('{"cues": {}}')
    with pytest.raises(DataError, match=r"missing key.*prevalence"):
        read_cue_files(tmp_path / "bad")


def test_no_guard_measured_is_not_nothing_to_do(tmp_path):
    """Without a guard in reliance.json (or without reliance.json) the advice said "No guard's
    reliance on scene text is resolved above zero: nothing to do", of a reliance never
    measured; it now says the guard was not measured and how to measure it."""
    members = write_cue_files(tmp_path / "m", which=("reliance",))
    doc = json.loads((members / "reliance.json").read_text())
    del doc["candidates"]["guard"]
    (members / "reliance.json").write_text(json.dumps(doc))
    for folder, why in (
        (members, "reliance.json holds no guard"),
        (write_cue_files(tmp_path / "s", which=("shift",)), "--cues holds no reliance.json"),
    ):
        advice = " ".join(
            b for a, b in _run(simulate_log(20, rng=0), folder).rows if a == "what to do"
        )
        assert "nothing to do" not in advice
        assert "Whether the guard follows scene text was not measured" in advice and why in advice
        assert "spotstop reliance --bundle" in advice


def test_not_measured_without_files_or_flags():
    res = _run(simulate_log(20, rng=0))
    assert res.rows[0][0] == "not measured" and "--cues DIR" in res.rows[0][1]


def test_flag_shares_logged_at_decision_time(tmp_path):
    rng = np.random.default_rng(4)
    n = 80
    y = np.tile([0, 1], n // 2)
    members = {"a": rng.normal(size=n) + y, "b": rng.normal(size=n) + y}
    flags = [
        None if i % 10 == 0 else {"reassuring": bool(rng.random() < 0.3 + 0.3 * y[i]),
                                  "alarming": bool(rng.random() < 0.1)}
        for i in range(n)
    ]  # fmt: skip
    seg = Segment(policy_config(FrozenPolicy(threshold=0.0)), members,
                  [f"s{i // 2}" for i in range(n)], 1.7e9, 4,
                  extra=[{"cue_flags": f} for f in flags])  # fmt: skip
    labels = [(f"d{i:05d}", "unsafe" if y[i] else "safe", f"c{i // 2}", "r") for i in range(n)]
    path = tmp_path / "log.sqlite"
    write_log(path, [(seg, "d")], labels)
    lc = log_cases(path)
    res = _run(lc.table, log=lc.log)
    with DecisionLog(path) as log:
        a = log.to_arrays()
    for cue in CUES:
        f = a.cue_flags[cue]
        read = f >= 0
        got = res.data["log_flags"][cue]
        assert got["n_read"] == int(read.sum()) == n - n // 10
        assert got["flagged"].value == pytest.approx((f[read] == 1).mean())
        unsafe = read & (a.label == 1)
        assert got["flagged_unsafe"].value == pytest.approx((f[unsafe] == 1).mean())
        assert got["flagged_unsafe"].n == int(unsafe.sum())
    assert any(r[0] == "reassuring flags logged at decision time" for r in res.rows)


def test_shares_without_labels_say_they_assume_independence(tmp_path):
    """A misleading share measured without labelled frames rests on the
    assumption that text is independent of the label; the card says so beside the numbers."""
    from spotstop.diagnostics.cues import INDEPENDENCE_ASSUMPTION

    labelled = _run(simulate_log(20, rng=0), write_cue_files(tmp_path / "lab"))
    assert labelled.data["misleading_share_basis"] == "labels"
    assert labelled.data["assumption"] is None
    assert "† assumption" not in dict(labelled.rows)
    res = _run(
        simulate_log(20, rng=0),
        write_cue_files(tmp_path / "ind", assumption=INDEPENDENCE_ASSUMPTION),
    )
    rows = dict(res.rows)
    assert res.data["misleading_share_basis"] == "assumes text independent of the label"
    assert rows["† assumption"] == INDEPENDENCE_ASSUMPTION
    assert (
        "(assumes text independent of the label †)" in rows["reassuring text in the deployment: d̂"]
    )
    assert rows["predicted extra error of guard"].endswith("†")
    assert rows["predicted error: weighting"].startswith("intercept = source error weighted")
    # a shift.json of schema 1 does not say: nothing is claimed either way
    old = json.loads((tmp_path / "ind" / "shift.json").read_text())
    for k in ("misleading_share_basis", "assumption"):
        old.pop(k)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "shift.json").write_text(json.dumps(old))
    assert _run(simulate_log(20, rng=0), tmp_path / "old").data["misleading_share_basis"] is None
