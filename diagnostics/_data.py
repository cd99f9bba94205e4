"""The case table: one row per scored case, validated once, apart from the algorithms.

A case is ``(x, q, y)``: a scene, a request and a published label (Sec. 3.1 of seed 000).
Cases form *contrasts* (one safe and one unsafe scene) through ``contrast_id`` and share a
*situation* through ``situation_id``.

Contrasts
    Within one ``contrast_id``, every safe case is paired with every unsafe case.  A contrast
    id that appears once on each side is the usual pair; several safe and unsafe cases under
    one id (VSCBench's 3 + 3 queries) form all safe x unsafe pairs (9).  An id with cases of
    one class only forms no pair (:attr:`CaseTable.one_class_contrasts` lists them; the card
    names them in its warnings).  The empty string means "no contrast".

Groups
    The resampling unit of the group bootstrap: connected components of cases that share a
    contrast id or a situation id (union-find).  A case with neither id is its own group.

Pair weights
    Each paired case carries the number of pairs it belongs to.  With these weights the
    pair-level accuracy ``A = 1/2 + L - C/2`` equals the weighted balanced accuracy over the
    paired cases, ``A*`` is the best of the same quantity over cuts, and AUROC is the expected
    ranking rate when the same cases are paired at random, so that the three parts of
    ``R - A`` share one scale.  With one-to-one contrasts every weight is 1.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from spotstop.diagnostics._errors import DataError
from spotstop.guard.validate import CSV_ENCODING, csv_header

__all__ = ["CaseTable", "Pairs", "group_codes", "read_scores_csv"]

_LABELS = {"0": 0, "1": 1, "safe": 0, "unsafe": 1}
_REQUIRED = ("case_id", "label", "score", "contrast_id")
#: columns that may be absent (their values are then empty)
_OPTIONAL_IDS = ("situation_id",)
_NUMERIC_OPTIONAL = {
    "score_gray": "score_gray",
    "score_text": "score_text",
    "width": "width",
    "height": "height",
    "bytes": "n_bytes",
    "jpeg_quality": "jpeg_quality",
}
_TEXT_OPTIONAL = {"format": "format", "request": "request"}


@dataclass(frozen=True)
class Pairs:
    """The safe x unsafe pairs of a table (indices into the table's rows).

    ``safe[p]`` and ``unsafe[p]`` are the two cases of pair ``p``; ``contrast[p]`` its contrast
    code; ``weight[i]`` the number of pairs case ``i`` belongs to (0 for unpaired cases).
    """

    safe: NDArray[np.intp]
    unsafe: NDArray[np.intp]
    contrast: NDArray[np.intp]
    weight: NDArray[np.float64]

    @property
    def n(self) -> int:
        """Number of pairs (contrasts)."""
        return int(self.safe.size)

    @property
    def one_to_one(self) -> bool:
        """True when every contrast has exactly one safe and one unsafe case."""
        return bool(np.all(self.weight[self.safe] == 1) and np.all(self.weight[self.unsafe] == 1))


def _readonly(a: NDArray[Any]) -> NDArray[Any]:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def _str_array(values: ArrayLike | None, n: int, name: str) -> NDArray[np.object_]:
    if values is None:
        return np.full(n, "", dtype=object)
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise DataError(f"{name} must have shape ({n},) like case_id; got {arr.shape}.")
    out = np.empty(n, dtype=object)
    for i, v in enumerate(arr.tolist()):
        out[i] = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    return out


def _float_array(values: ArrayLike | None, n: int, name: str) -> NDArray[np.float64] | None:
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise DataError(f"{name} must have shape ({n},) like case_id; got {arr.shape}.")
    return arr


def _codes(ids: NDArray[np.object_]) -> tuple[NDArray[np.intp], int]:
    """Integer codes for non-empty ids (first-appearance order); -1 for ''."""
    lookup: dict[str, int] = {}
    codes = np.full(ids.size, -1, dtype=np.intp)
    for i, v in enumerate(ids):
        if v != "":
            codes[i] = lookup.setdefault(v, len(lookup))
    return codes, len(lookup)


def group_codes(*ids: ArrayLike) -> NDArray[np.intp]:
    """Bootstrap groups: connected components of cases sharing any non-empty id.

    ``ids`` are string arrays of one length (e.g. contrast and situation ids; '' or None for
    none); codes run 0..G-1 in order of first appearance.  A case with no id is its own group.

    Found by label propagation: every case starts with its own index; each round gives all
    cases of an id the smallest label among them and then follows labels to their labels
    (pointer jumping), until nothing changes; a component then carries its smallest index,
    as a union-find with union by the smaller root would give.
    """
    cols = [_str_array(x, len(np.asarray(ids[0])), "ids") for x in ids]
    n = cols[0].size if cols else 0
    label = np.arange(n, dtype=np.intp)
    members = []  # per column: its cases with an id sorted by id, and where each id starts
    for col in cols:
        codes, _ = _codes(col)
        rows = np.flatnonzero(codes >= 0)
        rows = rows[np.argsort(codes[rows], kind="stable")]
        if rows.size:
            starts = np.flatnonzero(np.r_[True, np.diff(codes[rows]) != 0])
            members.append((rows, starts, np.diff(np.r_[starts, rows.size])))
    while members:
        before = label.copy()
        for rows, starts, sizes in members:
            low = np.minimum.reduceat(label[rows], starts)
            np.minimum.at(label, rows, np.repeat(low, sizes))
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(label, before):
            break
    _, inverse = np.unique(label, return_inverse=True)
    return np.asarray(inverse.reshape(-1), dtype=np.intp)


@dataclass(frozen=True)
class CaseTable:
    """Validated scores of a set of cases (all arrays one entry per case, read-only).

    Parameters
    ----------
    case_id : unique, non-empty strings.
    label : 0 = safe, 1 = unsafe (int8).
    score : finite float64; ``score > cut`` is the answer UNSAFE (the direct cut is 0).
    contrast_id, situation_id : strings, '' for none (see the module docstring).
    member_scores : optional ``{member name: scores}`` (finite or NaN).
    score_gray, score_text : optional scores of the same request with a gray image and with
        no image (NaN where missing).
    width, height, n_bytes, jpeg_quality : optional image-file properties (NaN where missing).
    format, request : optional strings ('' where missing).
    """

    case_id: NDArray[np.object_]
    label: NDArray[np.int8]
    score: NDArray[np.float64]
    contrast_id: NDArray[np.object_]
    situation_id: NDArray[np.object_]
    member_scores: Mapping[str, NDArray[np.float64]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    score_gray: NDArray[np.float64] | None = None
    score_text: NDArray[np.float64] | None = None
    width: NDArray[np.float64] | None = None
    height: NDArray[np.float64] | None = None
    n_bytes: NDArray[np.float64] | None = None
    jpeg_quality: NDArray[np.float64] | None = None
    format: NDArray[np.object_] | None = None
    request: NDArray[np.object_] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        case_id = _str_array(self.case_id, np.asarray(self.case_id).shape[0], "case_id")
        n = case_id.size
        if n == 0:
            raise DataError("case_id is empty; a CaseTable needs at least one case.")
        empty = np.flatnonzero(case_id == "")
        if empty.size:
            raise DataError(f"case_id must be non-empty; row {int(empty[0])} is empty.")
        _, first, inverse = np.unique(case_id.astype(str), return_index=True, return_inverse=True)
        if first.size != n:
            dup = sorted(set(range(n)) - set(first.tolist()))[0]
            raise DataError(
                f"case_id must be unique; {case_id[dup]!r} repeats at row {dup} (first at row "
                f"{int(first[inverse.reshape(-1)[dup]])}). Give every scored case its own id."
            )
        label = np.asarray(self.label)
        if label.shape != (n,):
            raise DataError(f"label must have shape ({n},) like case_id; got {label.shape}.")
        bad = np.flatnonzero(~np.isin(label, (0, 1)))
        if bad.size:
            raise DataError(
                f"label must be 0 (safe) or 1 (unsafe); row {int(bad[0])} has {label[bad[0]].item()!r}."
            )
        score = np.asarray(self.score, dtype=np.float64)
        if score.shape != (n,):
            raise DataError(f"score must have shape ({n},) like case_id; got {score.shape}.")
        bad = np.flatnonzero(~np.isfinite(score))
        if bad.size:
            x = float(score[bad[0]])
            got = "NaN (not a number)" if math.isnan(x) else repr(x)
            raise DataError(
                f"score must be finite; row {int(bad[0])} is {got} ({bad.size} such row(s)). "
                "Drop unscored cases before building the table."
            )
        set_(self, "case_id", _readonly(case_id))
        set_(self, "label", _readonly(label.astype(np.int8)))
        set_(self, "score", _readonly(score))
        set_(self, "contrast_id", _readonly(_str_array(self.contrast_id, n, "contrast_id")))
        set_(self, "situation_id", _readonly(_str_array(self.situation_id, n, "situation_id")))
        members: dict[str, NDArray[np.float64]] = {}
        for name, values in dict(self.member_scores).items():
            arr = np.asarray(values, dtype=np.float64)
            if arr.shape != (n,):
                raise DataError(
                    f"member_scores[{name!r}] must have shape ({n},) like case_id; got {arr.shape}."
                )
            members[str(name)] = _readonly(arr)
        set_(self, "member_scores", MappingProxyType(members))
        for name in ("score_gray", "score_text", "width", "height", "n_bytes", "jpeg_quality"):
            opt = _float_array(getattr(self, name), n, name)
            set_(self, name, None if opt is None else _readonly(opt))
        for name in ("format", "request"):
            if getattr(self, name) is not None:
                set_(self, name, _readonly(_str_array(getattr(self, name), n, name)))

    def __len__(self) -> int:
        return int(self.case_id.size)

    def __repr__(self) -> str:
        return (
            f"CaseTable(n_cases={len(self)}, n_unsafe={int(self.label.sum())}, "
            f"n_pairs={self.pairs.n}, n_groups={self.n_groups})"
        )

    @cached_property
    def pairs(self) -> Pairs:
        """All safe x unsafe pairs within each contrast id.

        Pairs run contrast by contrast (in order of first appearance); within a contrast, safe
        case by safe case (in row order), each with every unsafe case (in row order).
        """
        codes, k = _codes(self.contrast_id)
        rows = np.flatnonzero(codes >= 0)
        rows = rows[np.argsort(codes[rows], kind="stable")]  # by contrast, then row
        lab = self.label[rows]
        n_s = np.bincount(codes[rows], weights=lab == 0, minlength=k).astype(np.intp)
        n_u = np.bincount(codes[rows], weights=lab == 1, minlength=k).astype(np.intp)
        s_rows, u_rows = rows[lab == 0], rows[lab == 1]
        u_first = np.cumsum(n_u) - n_u  # where each contrast's unsafe cases start in u_rows
        reps = n_u[codes[s_rows]]  # every safe case meets all unsafe cases of its contrast
        safe = np.repeat(s_rows, reps)
        ends = np.cumsum(reps)
        within = np.arange(safe.size, dtype=np.intp) - np.repeat(ends - reps, reps)
        unsafe = u_rows[np.repeat(u_first[codes[s_rows]], reps) + within]
        contrast = np.asarray(codes[safe], dtype=np.intp)
        weight = np.zeros(len(self), dtype=np.float64)
        paired = (n_s > 0) & (n_u > 0)
        s_in = s_rows[paired[codes[s_rows]]]
        u_in = u_rows[paired[codes[u_rows]]]
        weight[s_in] = n_u[codes[s_in]]
        weight[u_in] = n_s[codes[u_in]]
        return Pairs(
            _readonly(safe.astype(np.intp)),
            _readonly(unsafe.astype(np.intp)),
            _readonly(contrast),
            _readonly(weight),
        )

    @cached_property
    def one_class_contrasts(self) -> tuple[str, ...]:
        """Contrast ids whose cases are all of one class: they form no pair (first-appearance
        order)."""
        seen: dict[str, set[int]] = {}
        for cid, lab in zip(self.contrast_id.tolist(), self.label.tolist(), strict=True):
            if cid != "":
                seen.setdefault(cid, set()).add(int(lab))
        return tuple(c for c, labs in seen.items() if len(labs) == 1)

    @cached_property
    def group(self) -> NDArray[np.intp]:
        """Group code of each case (0..n_groups-1, in order of first appearance)."""
        return _readonly(group_codes(self.contrast_id, self.situation_id))

    @property
    def n_groups(self) -> int:
        """Number of bootstrap groups."""
        return int(self.group.max()) + 1

    def subset(self, rows: ArrayLike | slice) -> CaseTable:
        """A new table with the given rows (indices, boolean mask or slice), in that order."""
        idx = np.arange(len(self))[rows if isinstance(rows, slice) else np.asarray(rows)]
        kw: dict[str, Any] = {}
        for name in (
            "score_gray",
            "score_text",
            "width",
            "height",
            "n_bytes",
            "jpeg_quality",
            "format",
            "request",
        ):
            v = getattr(self, name)
            kw[name] = None if v is None else v[idx]
        return CaseTable(
            case_id=self.case_id[idx],
            label=self.label[idx],
            score=self.score[idx],
            contrast_id=self.contrast_id[idx],
            situation_id=self.situation_id[idx],
            member_scores={k: v[idx] for k, v in self.member_scores.items()},
            **kw,
        )


def _parse_float(text: str, where: str, column: str, *, allow_missing: bool) -> float:
    t = text.strip()
    if t == "" or t.lower() in {"nan", "na", "none"}:
        if allow_missing:
            return math.nan
        if t == "":
            raise DataError(
                f"{where}, column {column!r}: a value is required; the cell is empty. "
                "Drop unscored cases from the file."
            )
        raise DataError(
            f"{where}, column {column!r}: got {text!r}, which is NaN (not a number); every "
            "case needs a finite score. Drop unscored cases from the file."
        )
    try:
        x = float(t)
    except ValueError:
        raise DataError(f"{where}, column {column!r}: expected a number; got {text!r}.") from None
    if not allow_missing and math.isnan(x):
        raise DataError(
            f"{where}, column {column!r}: got {text!r}, which is NaN (not a number); every "
            "case needs a finite score. Drop unscored cases from the file."
        )
    if not allow_missing and not math.isfinite(x):
        raise DataError(f"{where}, column {column!r}: expected a finite number; got {text!r}.")
    return x


def read_scores_csv(path: str | Path) -> CaseTable:
    """Read a scores CSV into a :class:`CaseTable`.

    Required columns: ``case_id,label,score,contrast_id``; ``label`` is ``safe``/``unsafe`` or
    ``0``/``1`` (case-insensitive); ``contrast_id`` may be empty.  ``situation_id`` may be
    absent or empty (no situation).  Optional columns: ``score_<member>`` (one per member),
    ``score_gray``, ``score_text``, ``width``, ``height``, ``bytes``, ``jpeg_quality``,
    ``format``, ``request``; empty optional cells are missing (NaN / '').

    Errors (:class:`DataError`) name the file, the data row (1-based), the line and the column;
    a repeated case id names both rows and both lines.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"scores file {str(path)!r} does not exist; pass --scores PATH to a CSV.")
    with path.open(newline="", encoding=CSV_ENCODING) as fh:
        reader = csv.DictReader(fh)
        header = csv_header(reader.fieldnames, source=str(path), error=DataError)
        missing = [c for c in _REQUIRED if c not in header]
        if missing:
            raise DataError(
                f"{path}: missing column(s) {', '.join(missing)}; the header must contain "
                f"{','.join(_REQUIRED)} and may contain situation_id "
                f"(got {','.join(header) or 'no header'})."
            )
        reader.fieldnames = header
        members = [
            h for h in header if h.startswith("score_") and h not in ("score_gray", "score_text")
        ]
        cols: dict[str, list[Any]] = {c: [] for c in (*header, *_OPTIONAL_IDS)}
        seen: dict[str, tuple[int, int]] = {}
        for row_no, row in enumerate(reader, start=1):
            line = reader.line_num
            where = f"{path}, row {row_no} (line {line})"
            if None in row:
                raise DataError(f"{where}: more cells than header columns; check the quoting.")
            for c in header:
                if row[c] is None:
                    raise DataError(f"{where}, column {c!r}: the row is too short.")
            lab = row["label"].strip().lower()
            if lab not in _LABELS:
                raise DataError(
                    f"{where}, column 'label': expected safe, unsafe, 0 or 1; got {row['label']!r}."
                )
            cols["label"].append(_LABELS[lab])
            cols["score"].append(_parse_float(row["score"], where, "score", allow_missing=False))
            cid = row["case_id"].strip()
            if cid == "":
                raise DataError(
                    f"{where}, column 'case_id': a value is required; the cell is empty."
                )
            if cid in seen:
                first_row, first_line = seen[cid]
                raise DataError(
                    f"{where}, column 'case_id': {cid!r} repeats row {first_row} (line "
                    f"{first_line}); case ids must be unique."
                )
            seen[cid] = (row_no, line)
            for c in ("case_id", "contrast_id", "situation_id", *_TEXT_OPTIONAL):
                if c in header:
                    cols[c].append(row[c].strip())
            for c in (*members, *_NUMERIC_OPTIONAL):
                if c in header:
                    cols[c].append(_parse_float(row[c], where, c, allow_missing=True))
        if not cols["case_id"]:
            raise DataError(f"{path}: no data rows after the header.")
    n = len(cols["case_id"])
    kw: dict[str, Any] = {}
    for c, name in {**_NUMERIC_OPTIONAL, **_TEXT_OPTIONAL}.items():
        if c in header:
            kw[name] = cols[c]
    return CaseTable(
        case_id=np.array(cols["case_id"], dtype=object),
        label=np.array(cols["label"], dtype=np.int8),
        score=np.array(cols["score"], dtype=np.float64),
        contrast_id=np.array(cols["contrast_id"], dtype=object),
        situation_id=np.array(cols["situation_id"] or [""] * n, dtype=object),
        member_scores={m[len("score_") :]: np.array(cols[m], dtype=np.float64) for m in members},
        **kw,
    )
