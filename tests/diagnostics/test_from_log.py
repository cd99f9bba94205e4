"""The card from the guard's decision log: diagnostics/_from_log.py and ``spotstop card LOG``."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.diagnostics import CaseTable, DataError, case_table_from_log, log_cases, simulate_log
from spotstop.diagnostics._cli import card_main
from spotstop.guard._log import DecisionLog, DecisionRecord, Retention
from spotstop.guard.policies import FrozenPolicy

from tests._support.log_writer import policy_config, policy_row

CUT = -0.49
FROZEN = policy_config(FrozenPolicy(threshold=CUT))  # S = (a + b) / 2, UNSAFE when S >= CUT

N_FAIL = 3  # fail-closed decisions (labelled) appended after the simulated cases
N_UNLABELLED = 4  # scored decisions that nobody labelled
N_NAN = 2  # labelled decisions whose fused score is NaN but that did not fail closed


def _sha(i: int) -> str:
    return hashlib.sha256(f"image {i}".encode()).hexdigest()


def _record(t: CaseTable, i: int) -> DecisionRecord:
    g, q = float(t.score_gray[i]), float(t.score_text[i])  # type: ignore[index]
    return DecisionRecord(
        time=1_700_000_000.0 + i,
        decision_id=str(t.case_id[i]),
        situation_id=str(t.situation_id[i]),
        request=str(t.request[i]),  # type: ignore[index]
        image_sha256=_sha(i),
        width=int(t.width[i]),  # type: ignore[index]
        height=int(t.height[i]),  # type: ignore[index]
        n_bytes=int(t.n_bytes[i]),  # type: ignore[index]
        image_format=str(t.format[i]),  # type: ignore[index]
        member_scores={k: float(v[i]) for k, v in t.member_scores.items()},
        # score = (a + b) / 2, so member gray/text scores equal to the fused ones map back
        member_scores_gray={"a": g, "b": g},
        member_scores_text={"a": q, "b": q},
        fused_score=float(t.score[i]),
        policy_score=float(t.score[i]),
        threshold=CUT,
        policy="frozen",
        policy_kind="frozen",
        policy_version=FROZEN.version_id,
        fusion_key=FROZEN.fusion_key,
        label="UNSAFE" if t.score[i] >= CUT else "SAFE",
        fail_closed=False,
        latency_ms={"total": 10.0},
        bundle_id="bundle-1",
        prompt_hash="p1",
    )


def _extra(k: int, *, fused: float, fail: bool) -> DecisionRecord:
    return DecisionRecord(
        time=1_800_000_000.0 + k,
        decision_id=f"extra{k:03d}",
        situation_id=f"sx{k}",
        request="extra",
        image_sha256=_sha(10_000 + k),
        member_scores={"a": math.nan if fail else fused, "b": math.nan if fail else fused},
        fused_score=fused,
        policy_score=fused,
        threshold=math.nan if fail else CUT,
        policy="frozen",
        policy_kind="frozen",
        policy_version=FROZEN.version_id,
        fusion_key=FROZEN.fusion_key,
        label="UNSAFE",
        fail_closed=fail,
        fail_reason="FusionError: member a failed" if fail else None,
        latency_ms={"total": 10.0},
        bundle_id="bundle-1",
        prompt_hash="p1",
    )


@pytest.fixture(scope="module")
def sim() -> CaseTable:
    return simulate_log(40, prevalence=0.6, size_leak=0.3, rng=3)


@pytest.fixture(scope="module")
def unlabelled_log(tmp_path_factory, sim) -> Path:
    path = tmp_path_factory.mktemp("log") / "decisions.sqlite"
    with DecisionLog(path) as log:
        log.append_many((_record(sim, i) for i in range(len(sim))), policy=policy_row(FROZEN))
        k = 0
        for _ in range(N_FAIL):
            log.append(_extra(k, fused=math.nan, fail=True))
            k += 1
        for _ in range(N_UNLABELLED):
            log.append(_extra(k, fused=0.3, fail=False))
            k += 1
        for _ in range(N_NAN):
            log.append(_extra(k, fused=math.nan, fail=False))
            k += 1
    return path


def _extra_labelled() -> list[int]:
    """Extras with a label: the fail-closed ones and the NaN-score ones."""
    return [*range(N_FAIL), *range(N_FAIL + N_UNLABELLED, N_FAIL + N_UNLABELLED + N_NAN)]


@pytest.fixture(scope="module")
def labelled_log(tmp_path_factory, unlabelled_log, sim) -> Path:
    path = tmp_path_factory.mktemp("labelled") / "decisions.sqlite"
    path.write_bytes(unlabelled_log.read_bytes())
    items = [
        (
            str(sim.case_id[i]),
            "unsafe" if sim.label[i] else "safe",
            str(sim.contrast_id[i]) or None,
            "rev",
        )
        for i in range(len(sim))
    ]
    items += [(f"extra{k:03d}", "unsafe", None, "rev") for k in _extra_labelled()]
    with DecisionLog(path) as log:
        log.set_labels(items)
    return path


def _label_rows(sim: CaseTable) -> list[dict[str, str]]:
    rows = [
        {
            "image_sha256": _sha(i),
            "label": "unsafe" if sim.label[i] else "safe",
            "contrast_id": str(sim.contrast_id[i]),
        }
        for i in range(len(sim))
    ]
    rows += [
        {"image_sha256": _sha(10_000 + k), "label": "1", "contrast_id": ""}
        for k in _extra_labelled()
    ]
    return rows


def _check_matches(got: CaseTable, sim: CaseTable) -> None:
    assert list(got.case_id) == list(sim.case_id)
    np.testing.assert_array_equal(got.label, sim.label)
    np.testing.assert_array_equal(got.score, sim.score)
    assert list(got.contrast_id) == list(sim.contrast_id)
    assert list(got.situation_id) == list(sim.situation_id)
    for k in ("a", "b"):
        np.testing.assert_array_equal(got.member_scores[k], sim.member_scores[k])
    np.testing.assert_allclose(got.score_gray, sim.score_gray, atol=1e-9)  # type: ignore[arg-type]
    np.testing.assert_allclose(got.score_text, sim.score_text, atol=1e-9)  # type: ignore[arg-type]
    for name in ("width", "height", "n_bytes"):
        np.testing.assert_array_equal(getattr(got, name), getattr(sim, name))
    assert got.pairs.n == sim.pairs.n == 40


def test_labels_table(labelled_log, sim):
    lc = log_cases(labelled_log)
    _check_matches(lc.table, sim)
    p = lc.provenance
    assert p["n_decisions"] == len(sim) + N_FAIL + N_UNLABELLED + N_NAN
    assert p["n_cases"] == len(sim)
    assert p["dropped"] == {
        "fail_closed": N_FAIL,
        "fail_closed_labelled": N_FAIL,
        "unlabelled": N_UNLABELLED,
        "nonfinite_score": N_NAN,
    }
    assert p["bundle_ids"] == ["bundle-1"] and p["prompt_hashes"] == ["p1"]
    assert p["labels"] == "log labels table"
    assert p["time_range"][0].startswith("2023-11-14")
    assert p["thresholds"]["median"] == p["thresholds"]["min"] == p["thresholds"]["max"] == CUT
    assert p["policy_versions"] == [FROZEN.version_id]
    assert p["fusion_keys"] == [FROZEN.fusion_key]
    note = p["gray_text"]["score_gray"]["by_version"][FROZEN.version_id]
    assert note.startswith("fused with the policy's own fusion")
    assert not any(str(c).startswith("extra") for c in lc.table.case_id)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_labels_file_by_sha256(tmp_path, unlabelled_log, sim, kind):
    rows = _label_rows(sim)
    path = tmp_path / f"labels.{kind}"
    if kind == "csv":
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lc = log_cases(unlabelled_log, labels=path)
    _check_matches(lc.table, sim)
    assert lc.provenance["n_labelled_from_file"] == len(sim) + N_FAIL + N_NAN
    assert lc.provenance["dropped"]["fail_closed"] == N_FAIL


def test_file_overrides_table_and_sha_labels_all_matches(tmp_path, labelled_log, sim):
    # flip the first case's label by decision_id and give it a new contrast and situation
    path = tmp_path / "labels.csv"
    first = str(sim.case_id[0])
    path.write_text(f"decision_id,label,contrast_id,situation_id\n{first},unsafe,cnew,snew\n")
    t = case_table_from_log(labelled_log, labels=path)
    assert t.label[0] == 1 and t.contrast_id[0] == "cnew" and t.situation_id[0] == "snew"
    np.testing.assert_array_equal(t.label[1:], sim.label[1:])

    # one image seen by several decisions: a sha256 key labels all of them
    log_path = tmp_path / "dup.sqlite"
    with DecisionLog(log_path) as log:
        for i in range(3):
            r = _record(sim, i)
            log.append(dataclasses.replace(r, decision_id=f"d{i}", image_sha256=_sha(99)))
    lab = tmp_path / "dup.jsonl"
    lab.write_text(json.dumps({"image_sha256": _sha(99), "label": "safe"}) + "\n")
    t = case_table_from_log(log_path, labels=lab)
    assert list(t.case_id) == ["d0", "d1", "d2"] and list(t.label) == [0, 0, 0]


def test_unknown_keys_error(tmp_path, unlabelled_log):
    path = tmp_path / "labels.csv"
    path.write_text(
        "decision_id,image_sha256,label\nnope1,,safe\n,deadbeef,unsafe\nx000000,,safe\n"
    )
    with pytest.raises(DataError, match=r"2 label row\(s\) match no decision.*nope1.*deadbeef"):
        log_cases(unlabelled_log, labels=path)
    bad = tmp_path / "bad.csv"
    bad.write_text("decision_id,label\nx000000,maybe\n")
    with pytest.raises(DataError, match="column 'label'"):
        log_cases(unlabelled_log, labels=bad)


def test_no_labels_and_missing_log(tmp_path, unlabelled_log):
    with pytest.raises(DataError, match="no decision is labelled"):
        log_cases(unlabelled_log)
    with pytest.raises(DataError, match="does not exist"):
        log_cases(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()


def test_card_main_from_log(tmp_path, labelled_log, capsys):
    out = tmp_path / "card"
    assert card_main([str(labelled_log), "--out", str(out), "--n-boot", "200", "--quiet"]) == 0
    for name in ("card.json", "card.md", "card.html"):
        assert (out / name).is_file()
    doc = json.loads((out / "card.json").read_text())
    prov = doc["provenance"]
    assert prov["log"]["dropped"]["fail_closed"] == N_FAIL
    # one frozen cut decided every case: the Spot-Stop fields describe it (paper convention)
    assert doc["settings"]["direct_cut"] == CUT
    assert doc["settings"]["direct_cut_source"] == "the deployed frozen cut"
    assert doc["fields"]["auroc"]["n"] > 0


def test_card_main_sources_are_exclusive(tmp_path, labelled_log, capsys):
    out = str(tmp_path / "c")
    assert card_main([str(labelled_log), "--demo", "--out", out]) == 2
    assert card_main([str(labelled_log), "--simulated", "--out", out]) == 2
    assert card_main(["--out", out]) == 2
    assert "exactly one input" in capsys.readouterr().err
    assert card_main(["--simulated", "--labels", "x.csv", "--out", out]) == 2
    assert "--labels goes with a decision LOG" in capsys.readouterr().err
    assert card_main([str(tmp_path / "missing.sqlite"), "--out", out, "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- one bundle: the scores of two bundles are not on one scale -------------------------------


N_OTHER = 24  # labelled decisions of another bundle added to the log


@pytest.fixture(scope="module")
def two_bundle_log(tmp_path_factory, labelled_log, sim) -> Path:
    """The labelled log with decisions of another bundle (scores on ten times the scale)."""
    path = tmp_path_factory.mktemp("two_bundles") / "decisions.sqlite"
    path.write_bytes(labelled_log.read_bytes())
    with DecisionLog(path) as log:
        for i in range(N_OTHER):
            r = _record(sim, i)
            log.append(
                dataclasses.replace(
                    r,
                    decision_id=f"other{i:03d}",
                    time=1_900_000_000.0 + i,
                    image_sha256=_sha(20_000 + i),
                    member_scores={k: 10 * v for k, v in r.member_scores.items()},
                    fused_score=10 * r.fused_score,
                    policy_score=10 * r.fused_score,
                    bundle_id="bundle-2",
                    prompt_hash="p2",
                )
            )
        log.set_labels(
            [(f"other{i:03d}", "unsafe" if sim.label[i] else "safe", None, "rev")
             for i in range(N_OTHER)]
        )  # fmt: skip
    return path


def test_a_log_of_two_bundles_is_refused_with_each_bundles_count(two_bundle_log, sim, capsys):
    n1 = len(sim) + N_FAIL + N_UNLABELLED + N_NAN
    with pytest.raises(DataError) as err:
        log_cases(two_bundle_log)
    msg = str(err.value)
    assert f"bundle bundle-1 (prompt p1): {n1} decision(s)" in msg
    assert f"bundle bundle-2 (prompt p2): {N_OTHER} decision(s)" in msg
    assert "--bundle-id" in msg
    out = str(two_bundle_log.parent / "card")
    assert card_main([str(two_bundle_log), "--out", out, "--quiet"]) == 2
    assert "holds decisions of 2 bundles" in capsys.readouterr().err
    assert not Path(out).exists()
    with pytest.raises(DataError, match=r"no decision of bundle 'bundle-9'.*bundle-1.*bundle-2"):
        log_cases(two_bundle_log, bundle_id="bundle-9")
    assert card_main(["--simulated", "--bundle-id", "bundle-1", "--out", out]) == 2
    assert "--bundle-id goes with a decision LOG" in capsys.readouterr().err


def test_bundle_id_reads_one_bundles_decisions_only(two_bundle_log, labelled_log, sim):
    one = log_cases(two_bundle_log, bundle_id="bundle-1")
    _check_matches(one.table, sim)
    p = one.provenance
    assert p["bundle_ids"] == ["bundle-1"] and p["dropped"]["other_bundle"] == N_OTHER
    assert p["bundle_filter"] == {
        "bundle_id": "bundle-1",
        "left_out": {"bundle-2 (prompt p2)": N_OTHER},
    }
    assert p["n_decisions"] == log_cases(labelled_log).provenance["n_decisions"]
    assert one.log.n == p["n_decisions"]  # what the delivered rates and replays read too
    other = log_cases(two_bundle_log, bundle_id="bundle-2")
    assert other.provenance["n_cases"] == N_OTHER
    assert other.provenance["prompt_hashes"] == ["p2"]
    np.testing.assert_array_equal(other.table.score, 10 * sim.score[:N_OTHER])
    # a log of one bundle reads the same with or without its id
    assert "bundle_filter" not in log_cases(labelled_log).provenance
    out = two_bundle_log.parent / "card-1"
    args = [str(two_bundle_log), "--bundle-id", "bundle-1", "--out", str(out), "--n-boot", "200"]
    assert card_main([*args, "--quiet"]) == 0
    doc = json.loads((out / "card.json").read_text())
    assert doc["provenance"]["bundle_ids"] == ["bundle-1"]
    assert doc["provenance"]["log"]["bundle_filter"]["left_out"] == {
        "bundle-2 (prompt p2)": N_OTHER
    }
    # the guard's answers graded: bundle 1's labelled decisions that did not fail closed
    assert doc["delivered_balanced_accuracy"]["n"] == len(sim) + N_NAN
    same = log_cases(labelled_log, bundle_id="bundle-1").provenance
    assert same["dropped"] == {**p["dropped"], "other_bundle": 0}
    assert same["bundle_filter"] == {"bundle_id": "bundle-1", "left_out": {}}


def test_a_card_of_one_bundle_says_only_that_bundle_s_pending_answers(
    tmp_path, two_bundle_log, sim, capsys
):
    """The repro: `spotstop card --bundle-id bundle-1` said "the decision log does not say
    every answer the robot got" for an amendment of bundle 2's decision and a bundle 2
    decision the log lacks: the pending counts covered the whole log. Now they are selected
    as the decisions are (guard.of_bundle's rule: pending_of_bundle)."""
    from spotstop.guard._journal import DeadLetter, default_dead_letter_path

    log = tmp_path / "decisions.sqlite"
    shutil.copyfile(two_bundle_log, log)
    late = next(f"other{i:03d}" for i in range(N_OTHER) if 10 * sim.score[i] < CUT)
    dead = DeadLetter(default_dead_letter_path(log))
    dead.append("amend", error="ValueError: x", amend_ids=[late], amend_reason="late")
    lacked = dataclasses.replace(
        _extra(98, fused=math.nan, fail=True), decision_id="never-logged-2", label="UNSAFE"
    )
    dead.append(
        "rows",
        error="ValueError: y",
        records=[dataclasses.replace(lacked, bundle_id="bundle-2", prompt_hash="p2")],
    )
    one = log_cases(log, bundle_id="bundle-1").provenance["pending"]
    assert (one["amended"], one["missing"], one["missing_dead_letter"]) == (0, 0, 0)
    two = log_cases(log, bundle_id="bundle-2").provenance["pending"]
    assert (two["amended"], two["missing_dead_letter"]) == (1, 1)
    out = tmp_path / "card"
    args = [str(log), "--bundle-id", "bundle-1", "--out", str(out), "--n-boot", "200"]
    assert card_main([*args, "--quiet"]) == 0
    doc = json.loads((out / "card.json").read_text())
    assert doc["settings"]["pending"] == ""
    assert not any("does not say every answer" in w for w in doc["settings"]["warnings"])
    # bundle 1's own: a decision of it the log lacks is said on its card
    dead.append("rows", error="ValueError: z", records=[lacked])
    one = log_cases(log, bundle_id="bundle-1").provenance["pending"]
    assert (one["amended"], one["missing_dead_letter"]) == (0, 1)
    capsys.readouterr()


# -- retention: the card on archive + live log is the card on the untrimmed log ----------------


def _card(log: Path, out: Path) -> dict[str, Any]:
    from spotstop.diagnostics._cli import card_main

    assert card_main([str(log), "--out", str(out), "--n-boot", "200", "--quiet"]) == 0
    doc = json.loads((out / "card.json").read_text())
    prov = doc["provenance"]
    for key in ("source", "created_utc"):  # where and when the card was made
        prov.pop(key)
    prov["log"].pop("log")
    prov["log"].pop("robots")  # from the folder name: whole/ and trimmed/
    return doc


def test_the_card_on_archive_and_live_log_is_the_card_on_the_untrimmed_log(
    tmp_path: Path, labelled_log: Path
) -> None:
    whole = tmp_path / "whole" / "decisions.sqlite"
    trimmed = tmp_path / "trimmed" / "decisions.sqlite"
    for p in (whole, trimmed):
        p.parent.mkdir()
        shutil.copy(labelled_log, p)
    with DecisionLog(trimmed) as log:
        res = log.apply_retention(Retention(max_bytes=log.used_bytes() * 4 // 5))
        assert res.archived_rows > 10 and log._fetchall("SELECT 1 FROM decisions LIMIT 1", [])
    a = _card(whole, tmp_path / "card-whole")
    b = _card(trimmed, tmp_path / "card-trimmed")
    assert a["provenance"]["log"].pop("archived") == {}
    assert b["provenance"]["log"].pop("archived") == {
        "files": len(res.files),
        "rows": res.archived_rows,
    }
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_the_deployed_version_is_the_one_that_decided_last(tmp_path):
    """One rule for "the version in force", read by the card, its batch rule and its
    recommendation: v1 (frozen) decided, v2 (conformal) replaced it, then v3 (frozen, the
    last stored), then v1 was activated again."""
    from spotstop.diagnostics._batch_rule import _deployed_config
    from spotstop.diagnostics._card import _deployed
    from spotstop.diagnostics._from_log import read_log
    from spotstop.diagnostics._recommend import _latest
    from spotstop.guard.policies import ConformalPolicy, FrozenPolicy

    from tests._support.log_writer import Segment, policy_config, write_log

    v1 = policy_config(FrozenPolicy(threshold=0.0))
    v2 = policy_config(ConformalPolicy(alpha=0.2, n=30, k=3, threshold=-1.0, delta=0.1), version=2)
    v3 = policy_config(FrozenPolicy(threshold=5.0), version=3)
    s = np.linspace(-1.0, 1.0, 6)
    segments = [
        (Segment(cfg, {"a": s, "b": s}, [None] * 6, t0), prefix)
        for prefix, cfg, t0 in (
            ("a-", v1, 1.7e9),
            ("b-", v2, 1.8e9),
            ("d-", v3, 1.85e9),
            ("c-", v1, 1.9e9),
        )
    ]
    write_log(tmp_path / "log.sqlite", segments)
    log = read_log(tmp_path / "log.sqlite")
    assert v3.version_id in log.policies
    assert log.deployed_version() == v1.version_id
    assert log.deployed_version(kind="conformal") == v2.version_id
    assert log.deployed_version(kind="situation") is None
    assert _deployed(log) == ("frozen", v1.version_id)
    assert _deployed_config(log).version_id == v1.version_id
    assert _latest(log, "conformal").threshold == -1.0  # v2's, the conformal that decided


def test_the_card_counts_a_late_answer_as_received_and_says_what_the_log_lacks(
    tmp_path, labelled_log, sim, capsys
):
    """An amendment the log could not store lies in the dead letter: the log's row still says
    SAFE, the robot got a fail-closed UNSAFE. The card reads what the robot got (the decision
    is left out as fail-closed) and says so; a decision the log lacks is counted."""
    from spotstop.guard._journal import DeadLetter, default_dead_letter_path

    log = tmp_path / "decisions.sqlite"
    shutil.copyfile(labelled_log, log)
    late = next(str(sim.case_id[i]) for i in range(len(sim)) if sim.score[i] < CUT)
    dead = DeadLetter(default_dead_letter_path(log))
    dead.append("amend", error="ValueError: x", amend_ids=[late], amend_reason="late")
    lacked = dataclasses.replace(
        _extra(99, fused=math.nan, fail=True), decision_id="never-logged", label="UNSAFE"
    )
    dead.append("rows", error="ValueError: y", records=[lacked])
    out = tmp_path / "card"
    assert card_main([str(log), "--out", str(out), "--n-boot", "200"]) == 0
    printed = capsys.readouterr()
    assert "[warn] decision log: 1 decision(s) the log still holds as SAFE" in printed.out
    assert "spotstop card: warning: 1 decision(s) the log still holds as SAFE" in printed.err
    doc = json.loads((out / "card.json").read_text())
    prov = doc["provenance"]["log"]
    assert prov["dropped"]["fail_closed"] == N_FAIL + 1  # the late answer, as received
    assert prov["n_cases"] == len(sim) - 1
    assert prov["pending"]["amended"] == 1 and prov["pending"]["missing_dead_letter"] == 1
    assert doc["settings"]["pending"].startswith("1 decision(s) the log still holds as SAFE")
    assert any("does not say every answer" in w for w in doc["settings"]["warnings"])
    assert "does not say every answer" in (out / "card.md").read_text()


def test_the_card_reads_the_guard_s_named_journal(tmp_path, labelled_log, sim, capsys):
    """A guard run with --journal elsewhere (another file system, as docs/log.md advises):
    `spotstop card LOG --journal FILE` reads the amendments waiting there."""
    from spotstop.guard._journal import Journal, JournalEntry

    log = tmp_path / "decisions.sqlite"
    shutil.copyfile(labelled_log, log)
    late = next(str(sim.case_id[i]) for i in range(len(sim)) if sim.score[i] < CUT)
    journal = tmp_path / "sd" / "decisions.journal"
    entry = JournalEntry("amend", amend_ids=(late,), amend_reason="late")
    Journal(journal, owner=str(log.resolve())).append([entry])
    assert log_cases(log).provenance["pending"]["amended"] == 0  # not the default journal
    lc = log_cases(log, journal=journal)
    assert lc.provenance["pending"]["amended"] == 1 and late not in set(lc.table.case_id)
    out = tmp_path / "card"
    args = [str(log), "--journal", str(journal), "--out", str(out), "--n-boot", "200", "--quiet"]
    assert card_main(args) == 0
    doc = json.loads((out / "card.json").read_text())
    assert doc["provenance"]["log"]["pending"]["journal"] == str(journal)
    assert doc["provenance"]["log"]["dropped"]["fail_closed"] == N_FAIL + 1
    capsys.readouterr()
    assert card_main(["--simulated", "--journal", str(journal), "--out", str(out)]) == 2
    assert "--journal goes with a decision LOG" in capsys.readouterr().err
