"""Case tables for the diagnostics tests: one-to-one contrasts from two score arrays, a
bootstrap draw made explicit, and a Hypothesis strategy of small tables with ties."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from spotstop.diagnostics import (
    CaseTable,
)


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


def small_tables():
    """Hypothesis strategy: tables of one-to-one and 2x2 contrasts with tied scores."""

    @st.composite
    def build(draw):
        n1 = draw(st.integers(1, 12))
        n2 = draw(st.integers(0, 3))
        vals = st.integers(-3, 3).map(lambda x: x / 2)
        label, score, contrast, sit = [], [], [], []
        for i in range(n1):
            label += [0, 1]
            score += [draw(vals), draw(vals)]
            contrast += [f"c{i}"] * 2
            sit += [f"s{draw(st.integers(0, 4))}"] * 2
        for j in range(n2):
            label += [0, 0, 1, 1]
            score += [draw(vals) for _ in range(4)]
            contrast += [f"m{j}"] * 4
            sit += [""] * 4
        n = len(label)
        return CaseTable(
            case_id=[f"x{i}" for i in range(n)],
            label=label,
            score=score,
            contrast_id=contrast,
            situation_id=sit,
        )

    return build()
