"""The log's one rule for which decisions count (``spotstop.guard.decisions_that_count``).

A hand-made log holds one decision per exclusion rule (fail-closed, a late SAFE amended to
fail-closed, unlabelled, no score, a cascade's member not run, a label only in a labels file)
and two that count everywhere. Each rule is checked on its own; ``calibrate`` and
``diagnostics`` must get the same mask from the same log; archived decisions count like live
ones.
"""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from spotstop.calibrate import read_calibration_log
from spotstop.diagnostics import log_cases, read_log
from spotstop.guard import (
    CountedDecisions,
    DecisionLog,
    decisions_that_count,
    read_reviewed,
)
from spotstop.guard._log import DecisionRecord, LogError, Retention
from spotstop.guard.policies import FrozenPolicy

from tests._support.log_writer import BUNDLE, PROMPT, policy_config, policy_row

FROZEN = policy_config(FrozenPolicy(threshold=0.0))  # S = (a + b) / 2
DAY = 86_400.0
T_OLD = 1_700_000_000.0  # archived by the retention test
T_NEW = T_OLD + 30 * DAY
MEMBERS = ("a", "b")

# id -> (time, a, b, fused, fail_closed, members_run, review label in the log's table)
ROWS: dict[str, tuple[float, float, float, float, bool, dict[str, bool] | None, str | None]] = {
    "ok_unsafe": (T_OLD + 0, 1.0, 2.0, 1.5, False, None, "unsafe"),
    "ok_safe": (T_OLD + 1, -1.0, -2.0, -1.5, False, None, "safe"),
    "failed": (T_OLD + 2, math.nan, math.nan, math.nan, True, None, "unsafe"),
    "late_safe": (T_OLD + 3, -1.0, -1.0, -1.0, False, None, "safe"),  # amended below
    "unlabelled": (T_NEW + 0, 0.5, 0.5, 0.5, False, None, None),
    "no_score": (T_NEW + 1, math.nan, math.nan, math.nan, False, None, "safe"),
    "cascade_first_only": (T_NEW + 2, 3.0, math.nan, 3.0, False, {"a": True, "b": False}, "unsafe"),
    "file_label": (T_NEW + 3, -0.5, -0.5, -0.5, False, None, None),  # labelled by a file
}
IDS = list(ROWS)


def _record(did: str) -> DecisionRecord:
    t, a, b, fused, fail, ran, _ = ROWS[did]
    return DecisionRecord(
        time=t,
        decision_id=did,
        situation_id=f"s-{did}",
        request="pick it up",
        image_sha256=None,
        member_scores={"a": a, "b": b},
        fused_score=fused,
        policy_score=fused,
        threshold=math.nan if fail else 0.0,
        policy="frozen",
        policy_kind="frozen",
        policy_version=FROZEN.version_id,
        fusion_key=FROZEN.fusion_key,
        label="UNSAFE" if fail or fused >= 0 else "SAFE",
        fail_closed=fail,
        fail_reason="FusionError: member a failed" if fail else None,
        members_run=ran,
        latency_ms={"total": 1.0},
        bundle_id=BUNDLE,
        prompt_hash=PROMPT,
    )


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("counting") / "decisions.sqlite"
    with DecisionLog(path) as log:
        log.append_many((_record(i) for i in IDS), policy=policy_row(FROZEN))
        log.mark_fail_closed(["late_safe"], "late: the write ended after the deadline")
        log.set_labels([(i, lab, None, "rev") for i, (*_, lab) in ROWS.items() if lab is not None])
    return path


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("labels") / "labels.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["decision_id", "label"])
        w.writerow(["file_label", "safe"])
    return path


def _counted(path: Path, labels: Path | None = None, **kw) -> CountedDecisions:
    with DecisionLog(path) as log:
        return decisions_that_count(read_reviewed(log, labels).arrays, **kw)


def _ids(mask: np.ndarray) -> set[str]:
    return {IDS[i] for i in np.flatnonzero(mask)}


def test_a_fail_closed_decision_never_counts(log_path: Path) -> None:
    for needs in ("fused", MEMBERS, None):
        for labelled in (False, True):
            c = _counted(log_path, needs=needs, labelled=labelled)
            assert _ids(c.fail_closed) == {"failed", "late_safe"}
            assert not (c.mask & c.fail_closed).any()


def test_a_late_safe_amended_to_fail_closed_does_not_count(log_path: Path) -> None:
    c = _counted(log_path, needs=None)
    assert "late_safe" not in _ids(c.mask) and "late_safe" in _ids(c.fail_closed)


def test_an_unlabelled_decision_counts_only_when_no_label_is_needed(log_path: Path) -> None:
    assert "unlabelled" in _ids(_counted(log_path, labelled=False).mask)
    c = _counted(log_path, labelled=True)
    assert _ids(c.unlabelled) == {"unlabelled", "file_label"}
    assert not (c.mask & c.unlabelled).any()


def test_a_label_from_the_labels_file_counts(log_path: Path, labels_file: Path) -> None:
    c = _counted(log_path, labels_file, labelled=True)
    assert "file_label" in _ids(c.mask) and _ids(c.unlabelled) == {"unlabelled"}


def test_a_decision_without_the_needed_score_does_not_count(log_path: Path) -> None:
    fused = _counted(log_path, needs="fused", labelled=True)
    assert _ids(fused.unscored) == {"no_score"}
    assert "cascade_first_only" in _ids(fused.mask)  # its S is finite
    pair = _counted(log_path, needs=MEMBERS, labelled=True)
    assert _ids(pair.unscored) == {"no_score", "cascade_first_only"}
    assert _ids(pair.member_not_run) == {"cascade_first_only"}
    first = _counted(log_path, needs=("a",), labelled=True)
    assert "cascade_first_only" in _ids(first.mask)
    answer = _counted(log_path, needs=None, labelled=True)
    assert "no_score" in _ids(answer.mask)  # grading the logged answer needs no score


def test_each_decision_is_under_one_reason(log_path: Path, labels_file: Path) -> None:
    for labels in (None, labels_file):
        for needs in ("fused", MEMBERS, None):
            for labelled in (False, True):
                c = _counted(log_path, labels, needs=needs, labelled=labelled)
                parts = np.vstack([c.mask, c.fail_closed, c.unlabelled, c.unscored]).astype(int)
                assert (parts.sum(axis=0) == 1).all()
                assert not (c.member_not_run & ~c.unscored).any()


def test_the_exact_masks(log_path: Path, labels_file: Path) -> None:
    assert _ids(_counted(log_path, labels_file, needs="fused", labelled=True).mask) == {
        "ok_unsafe",
        "ok_safe",
        "cascade_first_only",
        "file_label",
    }
    assert _ids(_counted(log_path, needs=MEMBERS).mask) == {
        "ok_unsafe",
        "ok_safe",
        "unlabelled",
        "file_label",
    }


def test_calibrate_and_diagnostics_get_the_same_mask(log_path: Path, labels_file: Path) -> None:
    for labels in (None, labels_file):
        cal = read_calibration_log(
            log_path, bundle_id=BUNDLE, prompt_hash=PROMPT, members=MEMBERS, labels=labels
        )
        card = read_log(log_path, labels=labels)
        assert cal.decision_id.tolist() == card.arrays.decision_id.tolist() == IDS
        rule = _counted(log_path, labels, needs=MEMBERS)
        assert np.array_equal(cal.usable, rule.mask)
        assert np.array_equal(card.counting(needs=MEMBERS).mask, cal.usable)
        labelled = card.counting(needs=MEMBERS, labelled=True).mask
        assert np.array_equal(labelled, cal.usable & (cal.label >= 0))
        cases = log_cases(log_path, labels=labels)
        assert np.array_equal(cases.keep, _counted(log_path, labels, labelled=True).mask)
        assert np.array_equal(card.delivered, card.counting(needs=None, labelled=True).mask)


def test_drop_counts_follow_the_reasons(log_path: Path) -> None:
    cal = read_calibration_log(log_path, bundle_id=BUNDLE, prompt_hash=PROMPT, members=MEMBERS)
    assert cal.dropped == {
        "other_bundle": 0,
        "fail_closed": 2,
        "nonfinite_member_score": 1,
        "member_not_run": 1,
    }
    prov = log_cases(log_path).provenance
    assert prov["dropped"] == {
        "fail_closed": 2,
        "fail_closed_labelled": 2,
        "unlabelled": 2,
        "nonfinite_score": 1,
    }
    assert prov["n_cases"] == 3


def test_archived_decisions_count_like_live_ones(tmp_path: Path, log_path: Path) -> None:
    trimmed = tmp_path / "decisions.sqlite"
    shutil.copy(log_path, trimmed)
    with DecisionLog(trimmed) as log:
        res = log.apply_retention(Retention(keep_days=10), now=T_NEW + DAY)
        assert res.archived_rows == 4  # the four old decisions, fail-closed ones included
        assert log.archived_ids() == set(IDS[:4])
    for needs in ("fused", MEMBERS, None):
        for labelled in (False, True):
            a = _counted(log_path, needs=needs, labelled=labelled)
            b = _counted(trimmed, needs=needs, labelled=labelled)
            for name in ("mask", "fail_closed", "unlabelled", "unscored", "member_not_run"):
                assert np.array_equal(getattr(a, name), getattr(b, name)), (needs, name)
    cal = read_calibration_log(trimmed, bundle_id=BUNDLE, prompt_hash=PROMPT, members=MEMBERS)
    assert np.array_equal(cal.usable, _counted(log_path, needs=MEMBERS).mask)


def test_bad_arguments_are_refused(log_path: Path) -> None:
    with DecisionLog(log_path) as log:
        arr = read_reviewed(log).arrays
    with pytest.raises(ValueError, match=r"needs must be 'fused', a sequence of member names"):
        decisions_that_count(arr, needs="score")
    with pytest.raises(ValueError, match=r"needs must name at least one member"):
        decisions_that_count(arr, needs=())
    with pytest.raises(TypeError, match=r"needs the log's arrays"):
        decisions_that_count(read_reviewed(arr), needs=None)  # type: ignore[arg-type]
    assert "needs='fused'" in repr(decisions_that_count(arr))


def test_the_one_reader_reads_a_path_an_open_log_or_arrays_alike(
    tmp_path: Path, log_path: Path, labels_file: Path
) -> None:
    trimmed = tmp_path / "decisions.sqlite"
    shutil.copy(log_path, trimmed)
    with DecisionLog(trimmed) as log:
        log.apply_retention(Retention(keep_days=10), now=T_NEW + DAY)
        opened = read_reviewed(log, labels_file)
    by_path = read_reviewed(trimmed, labels_file)
    from_arrays = read_reviewed(by_path.arrays)
    for r in (opened, by_path, from_arrays):
        assert r.arrays.decision_id.tolist() == IDS
        assert np.array_equal(r.arrays.label, opened.arrays.label)
    assert by_path.archived == opened.archived == {"files": 1, "rows": 4}
    assert list(by_path.policies) == [FROZEN.version_id] and by_path.n_from_file == 1
    assert from_arrays.policies == {} and from_arrays.archived == {}
    with pytest.raises(LogError, match=r"does not exist; pass the guard's SQLite log file"):
        read_reviewed(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()  # not created by the attempt
