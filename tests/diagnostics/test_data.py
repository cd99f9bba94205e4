"""CaseTable validation, the CSV reader, contrasts and groups."""

from __future__ import annotations

import numpy as np
import pytest
from spotstop.diagnostics import CaseTable, DataError, read_scores_csv

HEADER = "case_id,label,score,contrast_id,situation_id"


def write(tmp_path, text):
    p = tmp_path / "scores.csv"
    p.write_text(text)
    return p


def test_read_minimal_and_optional_columns(tmp_path):
    p = write(
        tmp_path,
        HEADER + ",score_qwen,score_lfm,score_gray,score_text,width,height,bytes,format,request\n"
        "a,safe,-1.5,c1,s1,-1,-2,0.1,0.2,640,480,1000,jpeg,cut it\n"
        "b,UNSAFE,2,c1,s1,1,3,,0.3,1024,768,2000,png,cut it\n"
        "c,0,0.5,,,0,1,0.2,,800,600,1500,jpeg,\n",
    )
    t = read_scores_csv(p)
    assert list(t.case_id) == ["a", "b", "c"]
    assert t.label.tolist() == [0, 1, 0]
    assert t.label.dtype == np.int8
    assert t.score.tolist() == [-1.5, 2.0, 0.5]
    assert set(t.member_scores) == {"qwen", "lfm"}
    assert np.isnan(t.score_gray[1]) and np.isnan(t.score_text[2])
    assert t.n_bytes.tolist() == [1000, 2000, 1500]
    assert t.format.tolist() == ["jpeg", "png", "jpeg"]
    assert t.pairs.n == 1
    assert t.n_groups == 2
    with pytest.raises(ValueError):
        t.score[0] = 3.0  # read-only arrays


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "a,maybe,1,c,s\n",
            "row 1 (line 2), column 'label': expected safe, unsafe, 0 or 1; got 'maybe'",
        ),
        (
            "a,safe,1,c,s\nb,unsafe,abc,c,s\n",
            "row 2 (line 3), column 'score': expected a number; got 'abc'",
        ),
        ("a,safe,,c,s\n", "row 1 (line 2), column 'score': a value is required; the cell is empty"),
        (
            "a,safe,1,c,s\nb,unsafe,nan,c,s\n",
            "row 2 (line 3), column 'score': got 'nan', which is NaN (not a number); every case "
            "needs a finite score",
        ),
        ("a,safe,NaN,c,s\n", "row 1 (line 2), column 'score': got 'NaN', which is NaN"),
        ("a,safe,-nan,c,s\n", "row 1 (line 2), column 'score': got '-nan', which is NaN"),
        ("a,safe,inf,c,s\n", "row 1 (line 2), column 'score': expected a finite number; got 'inf'"),
        (",safe,1,c,s\n", "row 1 (line 2), column 'case_id': a value is required"),
        (
            "a,safe,1,c,s\nb,safe,1,d,s\na,unsafe,2,c,s\n",
            "row 3 (line 4), column 'case_id': 'a' repeats row 1 (line 2); case ids must be unique",
        ),
        ("a,safe,1,c,s,extra\n", "row 1 (line 2): more cells than header columns"),
        ("a,safe,1\n", "row 1 (line 2), column 'contrast_id': the row is too short"),
        ("", "no data rows after the header"),
    ],
)
def test_every_csv_message_names_row_line_and_column(tmp_path, body, message):
    p = write(tmp_path, HEADER + "\n" + body)
    with pytest.raises(DataError) as e:
        read_scores_csv(p)
    assert message in str(e.value)
    assert str(p) in str(e.value)


def test_a_repeated_id_after_a_multiline_cell_names_both_lines(tmp_path):
    p = write(tmp_path, HEADER + '\na,safe,1,"c\nc",s\nb,unsafe,1,d,s\na,unsafe,2,c,s\n')
    with pytest.raises(DataError, match=r"row 3 \(line 5\).*'a' repeats row 1 \(line 3\)"):
        read_scores_csv(p)


def test_situation_id_may_be_absent_or_empty(tmp_path):
    t = read_scores_csv(
        write(tmp_path, "case_id,label,score,contrast_id\na,safe,0,c\nb,unsafe,1,c\n")
    )
    assert t.situation_id.tolist() == ["", ""] and t.pairs.n == 1 and t.n_groups == 1
    t = read_scores_csv(write(tmp_path, HEADER + "\na,safe,0,c,\nb,unsafe,1,c,\n"))
    assert t.situation_id.tolist() == ["", ""] and t.n_groups == 1


def test_one_class_contrasts_are_listed():
    t = CaseTable(
        case_id=list("abcdef"),
        label=[0, 1, 0, 0, 1, 0],
        score=np.zeros(6),
        contrast_id=["k", "k", "solo", "solo", "u", ""],
        situation_id=[""] * 6,
    )
    assert t.one_class_contrasts == ("solo", "u") and t.pairs.n == 1


def test_csv_missing_column_and_file(tmp_path):
    p = write(tmp_path, "case_id,label,score\na,safe,1\n")
    with pytest.raises(DataError, match="missing column\\(s\\) contrast_id; the header must"):
        read_scores_csv(p)
    with pytest.raises(DataError, match="does not exist"):
        read_scores_csv(tmp_path / "nope.csv")


def test_validation_messages():
    ok = dict(
        case_id=["a", "b"],
        label=[0, 1],
        score=[0.0, 1.0],
        contrast_id=["c", "c"],
        situation_id=["", ""],
    )
    CaseTable(**ok)
    cases = [
        (
            dict(case_id=["a", "a"]),
            "case_id must be unique; 'a' repeats at row 1 \\(first at row 0",
        ),
        (dict(label=[0, 2]), "label must be 0 \\(safe\\) or 1 \\(unsafe\\); row 1 has 2"),
        (dict(score=[0.0, np.nan]), "score must be finite; row 1 is NaN \\(not a number\\)"),
        (dict(score=[np.inf, 0.0]), "score must be finite; row 0 is inf"),
        (dict(score=[0.0]), "score must have shape \\(2,\\)"),
        (dict(contrast_id=["c"]), "contrast_id must have shape \\(2,\\)"),
        (dict(case_id=[]), "case_id is empty"),
    ]
    for change, msg in cases:
        kw = {**ok, **change}
        if change.get("case_id") == []:
            kw = {k: [] for k in ok}
        with pytest.raises(DataError, match=msg):
            CaseTable(**kw)


def test_many_to_many_contrasts_and_weights():
    # 2 safe x 3 unsafe under one id -> 6 pairs; a one-sided id forms none
    t = CaseTable(
        case_id=list("abcdefg"),
        label=[0, 0, 1, 1, 1, 0, 0],
        score=np.arange(7.0),
        contrast_id=["q", "q", "q", "q", "q", "solo", ""],
        situation_id=[""] * 7,
    )
    p = t.pairs
    assert p.n == 6
    assert sorted(zip(p.safe.tolist(), p.unsafe.tolist(), strict=True)) == [
        (i, j) for i in (0, 1) for j in (2, 3, 4)
    ]
    assert p.weight.tolist() == [3, 3, 2, 2, 2, 0, 0]
    assert not p.one_to_one


def test_groups_union_find():
    # a-b share a contrast, b-c a situation, d-e a situation, f alone
    t = CaseTable(
        case_id=list("abcdef"),
        label=[0, 1, 0, 1, 0, 1],
        score=np.zeros(6),
        contrast_id=["k", "k", "", "", "", ""],
        situation_id=["", "s", "s", "t", "t", ""],
    )
    g = t.group
    assert g[0] == g[1] == g[2]
    assert g[3] == g[4] != g[0]
    assert len(set(g.tolist())) == 3
    assert t.n_groups == 3
    sub = t.subset([3, 4])
    assert sub.n_groups == 1 and list(sub.case_id) == ["d", "e"]


def _naive_groups(*ids):
    """Connected components by a plain union-find, codes in order of first appearance."""
    n = len(ids[0])
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for col in ids:
        first: dict[str, int] = {}
        for i, v in enumerate(col):
            if v:
                j = first.setdefault(v, i)
                a, b = find(i), find(j)
                parent[max(a, b)] = min(a, b)
    roots = [find(i) for i in range(n)]
    code = {r: k for k, r in enumerate(sorted(set(roots)))}
    return [code[r] for r in roots]


def _naive_pairs(contrast, label):
    safe, unsafe = [], []
    order = list(dict.fromkeys(c for c in contrast if c))
    for c in order:
        rows = [i for i, x in enumerate(contrast) if x == c]
        for s in (i for i in rows if label[i] == 0):
            for u in (i for i in rows if label[i] == 1):
                safe.append(s)
                unsafe.append(u)
    return safe, unsafe


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_groups_and_pairs_equal_the_plain_loops(seed):
    from spotstop.diagnostics import group_codes

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    k = int(rng.integers(1, 20))
    ids = [
        np.array(["" if rng.random() < 0.2 else f"i{rng.integers(0, k)}" for _ in range(n)])
        for _ in range(int(rng.integers(1, 4)))
    ]
    assert group_codes(*ids).tolist() == _naive_groups(*ids)
    label = rng.integers(0, 2, n)
    t = CaseTable(
        case_id=[f"x{i}" for i in range(n)],
        label=label,
        score=rng.normal(size=n),
        contrast_id=ids[0],
        situation_id=ids[-1],
    )
    safe, unsafe = _naive_pairs(ids[0].tolist(), label.tolist())
    assert t.pairs.safe.tolist() == safe and t.pairs.unsafe.tolist() == unsafe
    weight = np.zeros(n)
    for s, u in zip(safe, unsafe, strict=True):
        weight[s] += 1
        weight[u] += 1
    np.testing.assert_array_equal(t.pairs.weight, weight)


def test_groups_along_a_long_chain():
    from spotstop.diagnostics import group_codes

    n = 2001  # cases i, i+1 share a contrast id or a situation id in turn: one component
    contrast = [f"c{i // 2}" for i in range(n)]
    situation = [f"s{(i + 1) // 2}" for i in range(n)]
    assert set(group_codes(contrast, situation).tolist()) == {0}
