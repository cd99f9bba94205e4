"""Operating points and the selection's own check (seed 002 Sec. 3.5) on the CueDial
family of sources, every expected value computed by hand."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from spotstop.diagnostics.cues import (
    CUES,
    CandidateSet,
    MemberSpec,
    Scorer,
    check_selection,
    crossing_scale,
    estimate_shift,
    reliance_at_operating_points,
    select,
)
from spotstop.diagnostics.cues._selfcheck import GRID, regret

from tests._support.cues_fakes import make_edits, score_table, text_scores


def _at_or_above_the_exact_mean(z: np.ndarray) -> np.ndarray:
    """UNSAFE where z ≥ the exact mean of z (fractions.Fraction, apart from the guard's
    mean_cut): a float mean can round to either side of a score at the mean."""
    exact = sum(Fraction(float(v)) for v in z) / len(z)
    return np.array([Fraction(float(v)) >= exact for v in z])


# small source sets by design (reliance's few-groups warning: tests/diagnostics/cues/test_reliance.py)
pytestmark = pytest.mark.filterwarnings("ignore::spotstop.diagnostics._resample.FewGroupsWarning")

K = 26  # SAFE scenes on which E stops falsely: E's error on T_d is 26 / 200 = 0.13


def _never_loaded() -> Scorer:
    raise AssertionError("the scores are given: no member is loaded")


def _members(*names: str) -> CandidateSet:
    return CandidateSet(
        members=tuple(MemberSpec(n, n, "h", _never_loaded) for n in names),
        guards=(),
        folders=("test",),
    )


@pytest.fixture(scope="module")
def cuedial(tmp_path_factory):
    """100 UNSAFE and 100 SAFE source scenes; two members at the stated cut 0 (UNSAFE when
    s >= 0). A is right on every unedited scene but follows reassuring text (pushed by −3, so
    every UNSAFE scene under reassuring text becomes SAFE); E ignores text and stops falsely on
    K = 26 of the 100 SAFE scenes.

    By hand: A's source error 0, reassuring reliance 1 (misleading edits all wrong, controls
    all right); E's source error 26/200 = 0.13 (0 on UNSAFE, 0.26 on SAFE), reliance 0. At an
    unsafe share of 1/2 the lines A = d and E = 0.13 cross at d* = 0.13. On T_d of n = 200
    (all 100 SAFE scenes, all 100 UNSAFE scenes of which 200·d carry the held-out misleading
    edit) A's error is exactly d and E's exactly 0.13, whatever the draw."""
    edits = make_edits(tmp_path_factory.mktemp("cd"), 100, 100)
    unsafe = np.arange(200) < 100
    base_a = np.where(unsafe, 1.0, -1.0)
    base_e = np.where(unsafe, 1.0, -1.0)
    base_e[100 : 100 + K] = 1.0
    scores = {"A": text_scores(edits, base_a, 3.0, 0.0), "E": text_scores(edits, base_e, 0, 0)}
    return reliance_at_operating_points(
        score_table(edits, scores),
        _members("A", "E"),
        member_cuts={"A": 0.0, "E": 0.0},
        n_boot=300,
        rng=0,
    )


def test_cuedial_reliance_and_switch_point_by_hand(cuedial):
    a, e = cuedial.result["A"].as_hard(), cuedial.result["E"].as_hard()
    assert a.cues["reassuring"].reliance.value == 1.0 and e.cues["reassuring"].reliance.value == 0
    assert (a.source_error.value, e.source_error.value) == (0.0, 0.13)
    assert e.cues["alarming"].source_error.value == pytest.approx(0.26)
    assert crossing_scale(0.0, 1.0, 0.13, 0.0) == pytest.approx(0.13)
    assert cuedial.result["A"].notes["operating_point"] == {
        "rule": "cut stated by the user on the raw score s (UNSAFE when s >= cut)",
        "cut": 0.0,
    }


def test_selection_check_on_the_cuedial_family(cuedial):
    """By hand, on the reassuring family: the best is A at d <= 0.10 and E from 0.15.
    SRA (true d): A below 0.13, E above: regret 0 everywhere, W_s = 0.
    Source error: always A: regret max(0, d − 0.13), W_s = 0.5 − 0.13 = 0.37 at d = 0.5.
    ATC: both members have confidence |s| = 1 on every source scene, so A's threshold (error
    0: the smallest confidence, 1) and E's (error 0.13: the 27th smallest, 1) predict error 0
    on every test set (A's misleading edits have |s| = 2): a tie, scored as the mean of the
    two, regret |d − 0.13| / 2, W_s = 0.37 / 2 = 0.185."""
    chk = check_selection(cuedial, rng=0)
    fam = chk.families["reassuring"]
    assert fam.n == 200 and fam.n_sets == 30 and fam.grid == GRID
    assert fam.best == ("A",) * 3 + ("E",) * 8
    sra, src, atc = (fam.selectors[s] for s in ("SRA", "source error", "ATC"))
    assert sra.w_s == 0.0 and sra.picks == fam.best
    want_src = [max(0.0, d - 0.13) for d in GRID]
    assert src.mean_regret == pytest.approx(want_src, abs=1e-12)
    assert (src.w_s, src.d_worst) == (pytest.approx(0.37), 0.5)
    assert atc.mean_regret == pytest.approx([abs(d - 0.13) / 2 for d in GRID], abs=1e-12)
    assert atc.w_s == pytest.approx(0.185)
    assert chk.warning is not None and "Sec. 3.5" in chk.warning
    assert chk.w_s("SRA") == 0.0
    doc = chk.to_dict()
    assert doc["families"]["reassuring"]["selectors"]["SRA"]["w_s"] == 0.0
    assert "W_s" in chk.table() and "WARNING" in chk.table()
    # the alarming family: no member follows alarming text, E's false stops decide: A wins
    assert set(chk.families["alarming"].best) == {"A"}
    assert chk.families["alarming"].selectors["SRA"].w_s == 0.0


def _td_frames(d: float):
    """T_d as deployment frames read by a perfect detector: 100 SAFE frames without text, 100
    UNSAFE frames of which 200·d carry reassuring text; labels given."""
    frames = np.zeros((200, 2), dtype=bool)
    frames[100 : 100 + round(200 * d), 0] = True
    return frames, np.array([0] * 100 + [1] * 100, dtype=np.int8)


def test_sra_with_labels_has_zero_regret_and_without_switches_late(cuedial):
    """On the CueDial family. With labels the misleading share is d, so SRA
    switches from A to E between 0.10 and 0.15 (d* = 0.13): regret 0 at every d, W_s = 0.
    Assuming independence (prior 1/2) it is d/2, so SRA switches only above 0.26 and keeps A at
    d = 0.15, 0.20, 0.25: regret d − 0.13 = 0.02, 0.07, 0.12, so W_s = 0.12."""
    cal_c = ["reassuring"] * 20 + ["alarming"] * 20 + ["none"] * 20
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    reg_lab, reg_ind = [], []
    for d in GRID:
        frames, labels = _td_frames(d)
        realized = {"A": d, "E": 0.13}
        for kw, out in ((dict(frame_labels=labels), reg_lab), (dict(prior=0.5), reg_ind)):
            sh = estimate_shift(frames, cal_f, cal_c, n_boot=100, rng=0, **kw)
            pick = select(cuedial.result, sh).best.name
            out.append(realized[pick] - min(realized.values()))
    assert max(reg_lab) == 0.0
    assert reg_ind == pytest.approx([0, 0, 0, 0.02, 0.07, 0.12, 0, 0, 0, 0, 0], abs=1e-12)


def test_regret_scores_ties_as_the_mean():
    losses = np.array([[0.1, 0.3, 0.2], [0.4, 0.1, 0.1]])
    pred = np.array([[0.0, 0.0, 1.0], [0.5, 0.2, 0.3]])
    r, first = regret(losses, pred)
    assert r == pytest.approx([0.2 - 0.1, 0.0])  # (0.1 + 0.3)/2 − 0.1; the best picked
    assert first.tolist() == [0, 1]


def test_member_at_its_frozen_cut_by_hand(tmp_path):
    """Without a stated cut a member is measured at its frozen cut: robust z-scores of the
    unedited source scenes (median, IQR), t0 = their mean, UNSAFE when z >= t0 — computed here
    with numpy, apart from the guard's code."""
    edits = make_edits(tmp_path, 6, 6)
    base = np.array([3.0, 2.5, 2.0, 1.5, 1.2, 0.8, 0.6, 0.4, -0.2, -1.0, -2.0, -3.0])
    s = text_scores(edits, base, 0.0, 0.0)
    run = reliance_at_operating_points(score_table(edits, {"m": s}), _members("m"), rng=0,
                                       n_boot=50)  # fmt: skip
    med, iqr = np.median(base), np.percentile(base, 75) - np.percentile(base, 25)
    t0 = np.mean((base - med) / iqr)
    unsafe = _at_or_above_the_exact_mean((base - med) / iqr)
    want = np.mean(unsafe != (np.arange(12) < 6))
    point = run.result["m"].notes["operating_point"]
    assert point["cut"] == pytest.approx(t0) and point["rule"].startswith("frozen cut")
    assert run.result["m"].as_hard().source_error.value == pytest.approx(want)
    # at s > 0 it would be 2 false stops of 6 SAFE scenes (0.6, 0.4): another operating point
    assert want != pytest.approx(2 / 12)
    # the decisions behind the check are the ones reliance measured (one rule)
    src = [r.index for r in edits.records if r.kind == "source"]
    y = np.array([r.label for r in edits.records])
    assert np.mean(run.answers["m"].unsafe[src] != (y[src] == 1)) == pytest.approx(want)
    with pytest.raises(Exception, match="not candidate members"):
        reliance_at_operating_points(score_table(edits, {"m": s}), _members("m"),
                                     member_cuts={"x": 0.0})  # fmt: skip


def test_a_failed_source_scene_is_left_out_of_the_cut_and_fails_closed(tmp_path):
    """One NaN score on an unedited SAFE source scene (the member failed on it; the guard fails
    it closed) made the frozen-cut fit raise, so reliance and select exited 2 naming no scene.
    The cut is now fitted on the 11 finite scenes (numpy, apart from the guard's code), a
    warning names the member and the source row, and the failed scene counts as UNSAFE: an
    error on a SAFE scene. A pair fitted on the same scenes does the same."""
    edits = make_edits(tmp_path, 6, 6)
    base = np.array([3.0, 2.5, 2.0, 1.5, 1.2, 0.8, 0.6, 0.4, -0.2, -1.0, -2.0, -3.0])
    s = text_scores(edits, base, 0.0, 0.0)
    failed = next(r for r in edits.records if r.kind == "source" and r.group == 11)
    s[failed.index] = np.nan
    with pytest.warns(UserWarning, match=r"member 'm' has no finite score on 1 of the 12 "
                      r"unedited source scenes \(source rows 12\)"):  # fmt: skip
        run = reliance_at_operating_points(score_table(edits, {"m": s}), _members("m"), rng=0,
                                           n_boot=50)  # fmt: skip
    fin = base[:11]
    med, iqr = np.median(fin), np.percentile(fin, 75) - np.percentile(fin, 25)
    t0 = np.mean((fin - med) / iqr)
    # the median scene's z is 0, and the exact mean of these z is -1.6e-17 (np.mean says
    # +4.0e-17): at or above the mean, UNSAFE, by the tie rule
    unsafe = np.r_[_at_or_above_the_exact_mean((fin - med) / iqr), True]  # the failed: UNSAFE
    want = np.mean(unsafe != (np.arange(12) < 6))
    assert run.result["m"].notes["operating_point"]["cut"] == pytest.approx(t0)
    assert run.result["m"].as_hard().source_error.value == pytest.approx(want)
    assert bool(run.answers["m"].unsafe[failed.index])
    with pytest.warns(UserWarning) as rec:
        pair = reliance_at_operating_points(
            score_table(edits, {"m": s, "m2": text_scores(edits, -base, 0.0, 0.0)}),
            CandidateSet(
                members=tuple(MemberSpec(n, n, "h", _never_loaded) for n in ("m", "m2")),
                guards=(),
                folders=("test",),
            ),
            pairs=True,
            rng=0,
            n_boot=20,
        )
    said = [str(w.message) for w in rec]
    for name in ("m", "m+m2"):  # the member's own cut, and the pair's
        assert any(f"the frozen cut of {name} is fitted on the other 11;" in t for t in said)
    assert bool(pair.answers["m+m2"].unsafe[failed.index])
