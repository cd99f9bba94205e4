"""Reviewers' labels from a file (CSV or JSONL), keyed by decision id or image sha256.

The decision log has a labels table (``DecisionLog.set_labels``, the sidecar's
``POST /v1/labels``); a labels *file* overrides it for one reading. ``calibrate`` and the
card read it with the same function, :func:`apply_labels_file`, through the one log reader
(:func:`spotstop.guard._reviewed.read_reviewed`).

Rows are keyed by ``decision_id`` or ``image_sha256`` (a row may hold both: they must then
name the same decision, else the file is refused); an ``image_sha256`` key labels every
decision with that image. Columns: ``label`` (safe/unsafe or 0/1, required), optional ``contrast_id`` and
``situation_id``; an empty or missing cell keeps the log's value. A key that matches no
decision is an error listing a few; so is a decision given two different labels, contrast ids
or situation ids by the file.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.guard._errors import GuardError
from spotstop.guard.validate import CSV_ENCODING, csv_header

__all__ = ["LabelsFileError", "apply_labels_file"]

_LABELS = {"0": 0, "1": 1, "safe": 0, "unsafe": 1}
_KEYS = ("decision_id", "image_sha256")


class LabelsFileError(GuardError, ValueError):
    """A labels file is missing, malformed, or names decisions the log does not hold."""


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v).strip()


def _read_label_rows(path: Path) -> list[tuple[str, dict[str, str]]]:
    """Rows of a labels file as ``(where, {column: text})``."""
    if not path.is_file():
        raise LabelsFileError(f"labels file {str(path)!r} does not exist; pass --labels PATH.")
    rows: list[tuple[str, dict[str, str]]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        with path.open(encoding=CSV_ENCODING) as fh:  # (JSON lines: the same BOM rule)
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise LabelsFileError(
                        f"{path}, line {line_no}: not valid JSON ({exc})."
                    ) from None
                if not isinstance(obj, dict):
                    raise LabelsFileError(
                        f"{path}, line {line_no}: expected a JSON object per line; "
                        f"got {type(obj).__name__}."
                    )
                rows.append((f"{path}, line {line_no}", {str(k): _cell(v) for k, v in obj.items()}))
    else:
        with path.open(newline="", encoding=CSV_ENCODING) as fh:
            reader = csv.DictReader(fh)
            header = csv_header(reader.fieldnames, source=str(path), error=LabelsFileError)
            reader.fieldnames = header
            if "label" not in header or not any(k in header for k in _KEYS):
                raise LabelsFileError(
                    f"{path}: the header must contain label and decision_id or image_sha256 "
                    f"(got {','.join(header) or 'no header'})."
                )
            for row_no, row in enumerate(reader, start=1):
                where = f"{path}, row {row_no} (line {reader.line_num})"
                if None in row:
                    raise LabelsFileError(
                        f"{where}: more cells than header columns; check the quoting."
                    )
                rows.append((where, {k: _cell(v) for k, v in row.items()}))
    if not rows:
        raise LabelsFileError(f"{path}: no label rows.")
    return rows


def apply_labels_file(
    path: Path,
    decision_id: NDArray[np.object_],
    sha: NDArray[np.object_],
    label: NDArray[np.int8],
    contrast: NDArray[np.object_],
    situation: NDArray[np.object_],
) -> int:
    """Override ``label``/``contrast``/``situation`` in place; returns the decisions labelled."""
    by_id = {str(d): i for i, d in enumerate(decision_id)}
    by_sha: dict[str, list[int]] = {}
    for i, s in enumerate(sha):
        if s:
            by_sha.setdefault(str(s).lower(), []).append(i)
    unknown: list[str] = []
    given: dict[int, tuple[int, str]] = {}  # row index -> (label, where)
    ids_given: dict[tuple[int, str], tuple[str, str]] = {}  # (row, column) -> (id, where)
    for where, row in _read_label_rows(path):
        did, key_sha = row.get("decision_id", ""), row.get("image_sha256", "").lower()
        if did:
            rows_hit = [by_id[did]] if did in by_id else []
            key = f"decision_id {did!r}"
            own = str(sha[rows_hit[0]] or "").lower() if rows_hit else key_sha
            if key_sha and own != key_sha:
                raise LabelsFileError(
                    f"{where}: decision_id {did!r} and image_sha256 {key_sha!r} name different "
                    f"decisions (that decision's image is {own or 'none'!r}); a row's keys must "
                    "agree. Check the file (was one column sorted alone?), or leave one key empty."
                )
        elif key_sha:
            rows_hit = by_sha.get(key_sha, [])
            key = f"image_sha256 {key_sha!r}"
        else:
            raise LabelsFileError(
                f"{where}: needs a decision_id or an image_sha256; both are empty."
            )
        lab_text = row.get("label", "").lower()
        if lab_text not in _LABELS:
            raise LabelsFileError(
                f"{where}, column 'label': expected safe, unsafe, 0 or 1; "
                f"got {row.get('label', '')!r}."
            )
        if not rows_hit:
            unknown.append(key)
            continue
        lab = _LABELS[lab_text]
        for i in rows_hit:
            if i in given and given[i][0] != lab:
                raise LabelsFileError(
                    f"{where}: decision {decision_id[i]!r} is labelled {lab_text} here but "
                    f"{'unsafe' if given[i][0] else 'safe'} at {given[i][1]}; give each "
                    "decision one label."
                )
            given[i] = (lab, where)
            label[i] = lab
            for column, ids in (("contrast_id", contrast), ("situation_id", situation)):
                value = row.get(column, "")
                if not value:
                    continue
                before = ids_given.get((i, column))
                if before is not None and before[0] != value:
                    raise LabelsFileError(
                        f"{where}: decision {decision_id[i]!r} gets {column} {value!r} here but "
                        f"{before[0]!r} at {before[1]}; give each decision one {column}."
                    )
                ids_given[(i, column)] = (value, where)
                ids[i] = value
    if unknown:
        shown = ", ".join(unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise LabelsFileError(
            f"{path}: {len(unknown)} label row(s) match no decision in the log: {shown}{more}. "
            "Check the keys (and that the labels belong to this log)."
        )
    return len(given)
