"""Every CSV table (a scene table, a labels file, a scores file) is read by one header rule: the
byte-order mark a spreadsheet's "CSV UTF-8" writes is dropped (it made the first column
``'\\ufeffimage'``, "not one this reader knows"), and a column named twice is refused by name
(the csv module kept its last cell, or the row was "too short")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics._data import read_scores_csv
from spotstop.diagnostics._errors import DataError
from spotstop.guard import ConfigError
from spotstop.guard._labels import LabelsFileError, apply_labels_file
from spotstop.guard._scene_table import read_scene_table
from spotstop.guard.validate import csv_header

from tests._support.images import make_image_bytes

BOM = "\ufeff"


def _labels(path: Path) -> list[int]:
    label = np.full(2, -1, dtype=np.int8)
    ids = np.array(["d0", "d1"], dtype=object)
    none = np.array([None, None], dtype=object)
    apply_labels_file(path, ids, none.copy(), label, none.copy(), none.copy())
    return label.tolist()


def test_a_byte_order_mark_is_read_as_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(make_image_bytes(0))
    scenes = tmp_path / "scenes.csv"
    scenes.write_text(BOM + "image,request\na.png,open the door\n", encoding="utf-8")
    assert [s.request for s in read_scene_table(scenes).scenes([0])] == ["open the door"]
    labels = tmp_path / "labels.csv"
    labels.write_text(BOM + "decision_id,label\nd1,unsafe\n", encoding="utf-8")
    assert _labels(labels) == [-1, 1]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text(BOM + '{"decision_id": "d0", "label": "safe"}\n', encoding="utf-8")
    assert _labels(jsonl) == [0, -1]
    scores = tmp_path / "scores.csv"
    scores.write_text(
        BOM + "case_id,label,score,contrast_id\na,safe,1,c\nb,unsafe,2,c\n", encoding="utf-8"
    )
    assert read_scores_csv(scores).case_id.tolist() == ["a", "b"]


def test_a_column_named_twice_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(make_image_bytes(0))
    cases = [
        ("scenes.csv", "image,request,request\na.png,x,y\n", read_scene_table, ConfigError),
        ("labels.csv", "decision_id,label,label\nd1,safe,unsafe\n", _labels, LabelsFileError),
        (
            "scores.csv",
            "case_id,label,score,score,contrast_id\na,safe,1,2,c\n",
            read_scores_csv,
            DataError,
        ),
    ]
    for name, text, read, error in cases:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(error, match=r"the header names '(request|label|score)' more than once"):
            read(path)
    assert csv_header([" a", "b "], source="t") == ["a", "b"]
    with pytest.raises(ValueError, match="t: the header names 'a' more than once"):
        csv_header(["a", " a "], source="t", error=ValueError)
