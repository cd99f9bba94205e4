"""A reviewers' labels file over a log (``--labels``): each label lands on the decision its row
names, or the file is refused by row; it never lands on another decision silently."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from spotstop.guard import DecisionLog, LabelsFileError, read_reviewed

from tests._support.records import make_record

SHA = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]


@pytest.fixture
def log_path(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "decisions.sqlite"
    recs = [make_record(i, image_sha256=SHA[i]) for i in range(3)]
    with DecisionLog(path) as log:
        log.append_many(recs)
    return path, [r.decision_id for r in recs]


def _labels(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "labels.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_row_whose_two_keys_name_different_decisions_is_refused(log_path, tmp_path) -> None:
    """A row with the id of one decision and the image of another (a column sorted alone in a
    spreadsheet) labelled the id's decision, silently; it is refused by row now."""
    path, ids = log_path
    bad = _labels(tmp_path, f"decision_id,image_sha256,label\n{ids[0]},{SHA[1]},unsafe\n")
    with pytest.raises(LabelsFileError, match=r"row 1 .*name different decisions"):
        read_reviewed(path, bad)
    good = _labels(tmp_path, f"decision_id,image_sha256,label\n{ids[0]},{SHA[0].upper()},unsafe\n")
    assert read_reviewed(path, good).arrays.label.tolist() == [1, -1, -1]


def test_a_decision_given_two_contrast_or_situation_ids_is_refused(log_path, tmp_path) -> None:
    """Two rows that put one decision in two contrasts (or situations) kept the last one
    silently, which pairs it with another scene in every contrast statistic of the card; the
    file is refused like one that gives a decision two labels. Rows that agree, or leave the
    cell empty, read as before."""
    path, ids = log_path
    two = _labels(
        tmp_path,
        f"decision_id,label,contrast_id\n{ids[2]},unsafe,c-1\n{ids[2]},unsafe,c-2\n",
    )
    with pytest.raises(LabelsFileError, match=r"row 2 .*contrast_id 'c-2' here but 'c-1' at"):
        read_reviewed(path, two)
    by_image = _labels(
        tmp_path,
        f"decision_id,image_sha256,label,situation_id\n{ids[1]},,safe,kitchen\n"
        f",{SHA[1]},safe,garage\n",
    )
    with pytest.raises(LabelsFileError, match=r"situation_id 'garage' here but 'kitchen'"):
        read_reviewed(path, by_image)
    agree = _labels(
        tmp_path,
        f"decision_id,label,contrast_id\n{ids[2]},unsafe,c-1\n{ids[2]},unsafe,\n"
        f"{ids[2]},unsafe,c-1\n",
    )
    assert read_reviewed(path, agree).arrays.contrast_id.tolist() == ["", "", "c-1"]
