"""Helpers shared by the diagnostics tests (imported by them), with their own checks."""

from __future__ import annotations

import numpy as np
from spotstop.diagnostics import CaseTable


def pairs_table(safe, unsafe, *, situation=None, extra=None) -> CaseTable:
    """A table of one-to-one contrasts from the two score arrays (and optional extra cases
    without a contrast: a list of (label, score))."""
    safe = np.asarray(safe, dtype=float)
    unsafe = np.asarray(unsafe, dtype=float)
    n = safe.size
    score = np.empty(2 * n)
    score[0::2], score[1::2] = safe, unsafe
    label = np.tile([0, 1], n)
    contrast = np.repeat([f"c{i}" for i in range(n)], 2).astype(object)
    sit = contrast.copy() if situation is None else np.repeat(situation, 2).astype(object)
    cid = [f"x{i}" for i in range(2 * n)]
    if extra:
        for j, (lab, sc) in enumerate(extra):
            score = np.append(score, sc)
            label = np.append(label, lab)
            contrast = np.append(contrast, "")
            sit = np.append(sit, "")
            cid.append(f"e{j}")
    return CaseTable(
        case_id=np.array(cid, dtype=object),
        label=label,
        score=score,
        contrast_id=contrast,
        situation_id=sit,
    )


def materialize(table: CaseTable, counts: np.ndarray) -> CaseTable:
    """The bootstrap draw as an explicit table: group g repeated counts[g] times, each copy
    with its own ids (so copies of a contrast do not pair with each other)."""
    rows, suffix = [], []
    for g in np.flatnonzero(counts):
        members = np.flatnonzero(table.group == g)
        for c in range(int(counts[g])):
            rows.extend(members.tolist())
            suffix.extend([f"#{g}.{c}"] * members.size)
    rows_a = np.asarray(rows, dtype=int)
    suf = np.asarray(suffix, dtype=object)

    def tag(ids):
        return np.array(
            [i + s if i != "" else "" for i, s in zip(ids, suf, strict=True)], dtype=object
        )

    return CaseTable(
        case_id=tag(table.case_id[rows_a]),
        label=table.label[rows_a],
        score=table.score[rows_a],
        contrast_id=tag(table.contrast_id[rows_a]),
        situation_id=tag(table.situation_id[rows_a]),
    )


def test_materialize_keeps_copies_apart():
    t = pairs_table([0.0, 1.0], [2.0, 0.5])
    m = materialize(t, np.array([2, 0]))
    assert len(m) == 4 and m.pairs.n == 2 and m.n_groups == 2
