"""Ties, few groups and unbounded ratios: hand-worked fixtures and properties.

Fixtures
    ``discrete_table``: five score values (0, .25, .5, .75, 1), 9 pairs of which 4 tied
    (44 %), one contrast with 2 safe + 1 unsafe scenes; cut 0.5.
    ``hard_label_table``: scores 0/1 only, 8 one-to-one contrasts of which 4 tied; cut 0.5.
Every expected number below is worked out by hand in the comments.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score
from spotstop.diagnostics import CaseTable, UndefinedMetricWarning, group_bootstrap
from spotstop.diagnostics._engine import CurveEngine
from spotstop.diagnostics._metrics import TiedScoresWarning, spot_stop
from spotstop.diagnostics._null import LabelSwapNullCheck, label_swap_null
from spotstop.diagnostics._prevalence import (
    PrevalenceCardCheck,
    prevalence_check,
    prevalence_reading,
)
from spotstop.diagnostics._resample import (
    MIN_GROUPS,
    FewGroupsWarning,
    UnboundedRatioWarning,
    draw_group_counts,
    ratio_estimate,
    regroup,
    resampling_groups,
    resampling_note,
)
from spotstop.guard.policies import unsafe_mask


def _table(rows: list[tuple[str, int, float]], situation: list[str] | None = None) -> CaseTable:
    return CaseTable(
        case_id=[f"x{i}" for i in range(len(rows))],
        label=[r[1] for r in rows],
        score=[r[2] for r in rows],
        contrast_id=[r[0] for r in rows],
        situation_id=situation,
    )


def discrete_table() -> CaseTable:
    # (contrast, label, score); pairs and their status at cut 0.5 (S > 0.5 is UNSAFE):
    # c1 (0, 1) ordered, L | c2 (.25, .75) ordered, L | c3 (.5, .5) tied | c4 (1, 1) tied
    # c5 (.75, .25) inverted, W | c6 (0, .5) ordered | c7 (.25, .25) tied
    # c8: safe 0 and .75, unsafe .75 -> (0, .75) ordered, L; (.75, .75) tied
    return _table(
        [
            ("c1", 0, 0.0),
            ("c1", 1, 1.0),
            ("c2", 0, 0.25),
            ("c2", 1, 0.75),
            ("c3", 0, 0.5),
            ("c3", 1, 0.5),
            ("c4", 0, 1.0),
            ("c4", 1, 1.0),
            ("c5", 0, 0.75),
            ("c5", 1, 0.25),
            ("c6", 0, 0.0),
            ("c6", 1, 0.5),
            ("c7", 0, 0.25),
            ("c7", 1, 0.25),
            ("c8", 0, 0.0),
            ("c8", 0, 0.75),
            ("c8", 1, 0.75),
        ]
    )


def hard_label_table() -> CaseTable:
    # 3 x (0, 1) ordered, L; 2 x (1, 1) tied; 2 x (0, 0) tied; 1 x (1, 0) inverted, W
    pairs = [(0.0, 1.0)] * 3 + [(1.0, 1.0)] * 2 + [(0.0, 0.0)] * 2 + [(1.0, 0.0)]
    rows = []
    for i, (s, u) in enumerate(pairs):
        rows += [(f"c{i}", 0, s), (f"c{i}", 1, u)]
    return _table(rows)


def _close(x: float, frac: F) -> None:
    assert x == pytest.approx(float(frac), abs=1e-12)


def test_discrete_fixture_by_hand():
    ss = spot_stop(discrete_table(), 0.5)
    assert ss.n_pairs == 9
    _close(ss.R, F(4, 9))  # c1, c2, c6, c8a
    _close(ss.tied_share, F(4, 9))  # c3, c4, c7, c8b: 44 % >= 30 %
    _close(ss.R_half, F(4, 9) + F(2, 9))
    _close(ss.tie_part, -F(2, 9))
    _close(ss.L, F(3, 9))
    _close(ss.W, F(1, 9))
    _close(ss.C, F(4, 9))
    _close(ss.A, F(1, 2) + F(3, 9) - F(2, 9))  # 11/18
    _close(ss.G, F(1, 9))
    _close(ss.null_gap, (1 - F(4, 9) - F(4, 9)) / 2)  # 1/18; the paper's (1 - C)/2 = 5/18
    _close(ss.R_half_minus_A, F(1, 18))
    _close(ss.R_minus_A, -F(1, 6))
    # pair-weighted paired cases: safe 0:3, .25:2, .5:1, .75:2, 1:1; unsafe .25:2, .5:2,
    # .75:3 (c8's unsafe scene counts twice), 1:2 -> AUROC = (8 + 11 + 21 + 17)/81 = 19/27
    _close(ss.auroc, F(19, 27))
    t = discrete_table()
    m = t.pairs.weight > 0
    assert ss.auroc == pytest.approx(
        roc_auc_score(t.label[m], t.score[m], sample_weight=t.pairs.weight[m])
    )
    # A*: flag S > 0 -> 0.5 (3/9 + 1) = 2/3 (first best; S > .25 ties it)
    _close(ss.A_star, F(2, 3))
    assert ss.cut_star == 0.0
    _close(ss.threshold_part, F(1, 18))
    _close(ss.overlap_part, F(19, 27) - F(2, 3))  # 1/27
    _close(ss.within_part, F(2, 3) - F(19, 27))  # -1/27
    parts = ss.threshold_part + ss.overlap_part + ss.within_part
    assert parts == pytest.approx(ss.R_half_minus_A) == pytest.approx(ss.G - ss.null_gap)
    assert ss.tie_part + parts == pytest.approx(ss.R_minus_A)


def test_hard_label_fixture_by_hand():
    ss = spot_stop(hard_label_table(), 0.5)
    _close(ss.R, F(3, 8))
    _close(ss.tied_share, F(1, 2))
    _close(ss.R_half, F(5, 8))
    _close(ss.tie_part, -F(1, 4))
    _close(ss.L, F(3, 8))
    _close(ss.W, F(1, 8))
    _close(ss.A, F(5, 8))
    _close(ss.null_gap, F(0))  # (1 - 1/2 - 1/2)/2; the paper's (1 - C)/2 would say 1/4
    # AUROC: unsafe 1 (x5) above 5 safe 0s and tied with 3 safe 1s; unsafe 0 (x3) tied with
    # 5 safe 0s -> (5 (5 + 1.5) + 3 (2.5))/64 = 40/64
    _close(ss.auroc, F(5, 8))
    _close(ss.A_star, F(5, 8))
    # everything the paper's R - A = -25 % shows is the tie part; the parts are all 0
    _close(ss.R_minus_A, -F(1, 4))
    for k in ("R_half_minus_A", "threshold_part", "overlap_part", "within_part"):
        assert getattr(ss, k) == pytest.approx(0.0, abs=1e-12), k
    assert ss.excess_beyond_g == pytest.approx(-ss.g_auroc)


values5 = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])


@st.composite
def tied_tables(draw: st.DrawFn, hard: bool = False) -> CaseTable:
    vals = st.sampled_from([0.0, 1.0]) if hard else values5
    rows: list[tuple[str, int, float]] = []
    for i in range(draw(st.integers(1, 12))):
        n_s, n_u = draw(st.sampled_from([(1, 1), (1, 1), (2, 1), (1, 2), (2, 2)]))
        rows += [(f"c{i}", 0, draw(vals)) for _ in range(n_s)]
        rows += [(f"c{i}", 1, draw(vals)) for _ in range(n_u)]
    rows += [("", draw(st.integers(0, 1)), draw(vals)) for _ in range(draw(st.integers(0, 3)))]
    return _table(rows)


@settings(max_examples=80, deadline=None)
@given(t=st.one_of(tied_tables(), tied_tables(hard=True)), cut=st.sampled_from([0.0, 0.5, 0.6]))
def test_identity_with_ties_property(t, cut):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        ss = spot_stop(t, cut)
    if math.isnan(ss.auroc):
        return
    parts = ss.threshold_part + ss.overlap_part + ss.within_part
    assert ss.G - ss.null_gap == pytest.approx(ss.R_half_minus_A, abs=1e-12)
    assert parts == pytest.approx(ss.R_half_minus_A, abs=1e-12)
    assert ss.tie_part + parts == pytest.approx(ss.R_minus_A, abs=1e-12)
    p = t.pairs
    s = t.score
    assert ss.tied_share == pytest.approx(np.mean(s[p.safe] == s[p.unsafe]))
    assert ss.R_half == pytest.approx(
        np.mean((s[p.unsafe] > s[p.safe]) + 0.5 * (s[p.unsafe] == s[p.safe]))
    )


@settings(max_examples=30, deadline=None)
@given(t=tied_tables(), seed=st.integers(0, 10_000))
def test_identity_with_ties_draw_by_draw(t, seed):
    prep = CurveEngine.build(t, 0.5)
    counts = next(draw_group_counts(t.n_groups, 20, np.random.default_rng(seed)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        d = prep.statistics(counts, None)
    ok = np.isfinite(d["auroc"])
    parts = d["threshold_part"] + d["overlap_part"] + d["within_part"]
    np.testing.assert_allclose(parts[ok], d["R_half_minus_A"][ok], atol=1e-12)
    np.testing.assert_allclose((d["G"] - d["null_gap"])[ok], d["R_half_minus_A"][ok], atol=1e-12)
    np.testing.assert_allclose((d["tie_part"] + parts)[ok], d["R_minus_A"][ok], atol=1e-12)


def _one_to_one_discrete(n: int, seed: int, hard: bool = False) -> CaseTable:
    rng = np.random.default_rng(seed)
    vals = np.array([0.0, 1.0]) if hard else np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    p_s = [0.6, 0.4] if hard else [0.15, 0.1, 0.5, 0.15, 0.1]
    p_u = [0.3, 0.7] if hard else [0.05, 0.05, 0.5, 0.2, 0.2]
    rows = []
    for i in range(n):
        rows += [(f"c{i}", 0, float(rng.choice(vals, p=p_s)))]
        rows += [(f"c{i}", 1, float(rng.choice(vals, p=p_u)))]
    return _table(rows)


@pytest.mark.parametrize("seed,hard", [(0, False), (1, False), (2, True), (3, True)])
def test_analytic_null_agrees_with_label_swap_simulation_with_ties(seed, hard):
    t = _one_to_one_discrete(200, seed, hard)
    null = label_swap_null(t, cut=0.5, n_draws=20_000, rng=seed)
    ss = spot_stop(t, 0.5)
    assert ss.tied_share >= 0.2
    se = null.G0.std() / math.sqrt(null.n_draws)
    assert null.expected_null_gap == pytest.approx(ss.null_gap)
    assert abs(null.mean_G0 - ss.null_gap) < 5 * se + 1e-12
    # the paper's no-ties form (1 - C)/2 misses it by T/2
    assert abs(null.mean_G0 - (1 - ss.C) / 2) > 20 * se
    assert null.tied_share == pytest.approx(ss.tied_share)


def test_null_check_rows_show_the_closed_form_and_the_draws():
    from spotstop.diagnostics._check_base import CardContext

    t = _one_to_one_discrete(100, 5)
    ctx = CardContext(table=t, direct_cut=0.5, rng=np.random.default_rng(0), n_boot=2000)
    res = LabelSwapNullCheck().run(ctx)
    labels = [r[0] for r in res.rows]
    assert "permutation p of R / of R½ − A (2000 label swaps)" in labels
    # one-to-one contrasts keep T under swaps: the two p values agree
    assert res.data["p_R_minus_A"].value == res.data["p_R_half_minus_A"].value
    assert any("(1 − C − T)/2" in x for x in labels)
    assert res.data["null_gap_expected"].value == pytest.approx(spot_stop(t, 0.5).null_gap)


def test_common_ties_are_named_on_the_bootstrap():
    t = _one_to_one_discrete(60, 7)
    with pytest.warns(TiedScoresWarning, match=r"ties: \d+\.\d % of the contrasts") as rec:
        warnings.simplefilter("ignore", UnboundedRatioWarning)
        res = group_bootstrap(t, cut=0.5, n_boot=200, rng=0)
    msg = str(next(w.message for w in rec if w.category is TiedScoresWarning))
    assert "a different cut would not" in msg
    assert res["tied_share"].value == pytest.approx(spot_stop(t, 0.5).tied_share)
    assert res["tied_share"].ci.low <= res["tied_share"].value <= res["tied_share"].ci.high


# ------------------------------------------------------------------ unbounded ratios


def test_ratio_with_denominator_reaching_zero_is_undefined_not_huge():
    den = np.r_[np.full(50, 1e-17), np.linspace(0.01, 0.1, 950)]  # some draws ~0
    num = np.r_[np.full(50, 0.8), np.linspace(0.0, 0.1, 950)]
    with pytest.warns(UnboundedRatioWarning, match="reaches 0.*read the gain instead"):
        e = ratio_estimate(0.05, 0.05, num, den, 100, what="a recovery", instead="the gain")
    assert math.isnan(e.value) and math.isnan(e.ci.low) and e.n == 100
    # a denominator well away from 0: a bounded interval, the ratio of the point values
    den2 = np.linspace(0.05, 0.1, 1000)
    e2 = ratio_estimate(0.03, 0.06, den2 / 2, den2, 100, what="x", instead="y")
    assert e2.value == pytest.approx(0.5) and e2.ci.low == pytest.approx(0.5)
    assert e2.ci.high == pytest.approx(0.5)


def test_batch_recovery_with_near_zero_threshold_part_is_undefined():
    # five-value scores, cut 0.5 near the best cut: the threshold part is 1.5 points, but it is
    # 0 in ~28 % of the draws, some of them at rounding level (A* - A ~ 1e-16), where the
    # plain ratio (A_batch - A)/(A* - A) explodes as soon as A_batch < A (the card once
    # printed -8e13)
    t = _one_to_one_discrete(100, 0)
    with (
        warnings.catch_warnings(),
        pytest.warns(UnboundedRatioWarning, match="batch_recovery .* is undefined.*batch_gain"),
    ):
        warnings.simplefilter("ignore", TiedScoresWarning)
        res = group_bootstrap(t, cut=0.5, n_boot=1000, rng=0)
    tp = res.draws["threshold_part"]
    assert res["threshold_part"].value > 0.01 and res["threshold_part"].ci.low <= 1e-9
    tiny = (tp > 0) & (tp < 1e-9)
    assert tiny.any()  # rounding-level denominators: a plain ratio would divide by 1e-16
    assert np.abs(-0.01 / tp[tiny]).min() > 1e12  # e.g. a gain of -1 point over them
    e = res["batch_recovery"]
    assert math.isnan(e.value) and math.isnan(e.ci.low) and math.isnan(e.ci.high)
    # the difference stays defined and bounded
    g = res["batch_gain"]
    assert math.isfinite(g.value) and -1 <= g.ci.low <= g.ci.high <= 1
    # no draw divides by a rounding-level threshold part
    d = res.draws["batch_recovery"]
    assert np.all(np.abs(d[np.isfinite(d)]) <= 1e6)


# ------------------------------------------------------------------ few groups


def _situation_table(n_contrasts: int = 200, n_situations: int = 8) -> CaseTable:
    t = _one_to_one_discrete(n_contrasts, 11)
    sit = [f"s{(i // 2) % n_situations}" for i in range(len(t))]
    return CaseTable(
        case_id=t.case_id,
        label=t.label,
        score=t.score,
        contrast_id=t.contrast_id,
        situation_id=sit,
    )


def test_few_groups_warn_and_group_by_contrast_resamples_contrasts():
    t = _situation_table()
    assert int(resampling_groups(t, "situation").max()) + 1 == 8
    assert int(resampling_groups(t, "contrast").max()) + 1 == 200
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TiedScoresWarning)
        warnings.simplefilter("ignore", UnboundedRatioWarning)
        with pytest.warns(FewGroupsWarning, match="only 8 groups .*optimistic.*200 contrast"):
            few = group_bootstrap(t, cut=0.5, n_boot=300, rng=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FewGroupsWarning)
            many = group_bootstrap(t, cut=0.5, n_boot=300, rng=0, group_by="contrast")
    assert (few.n_groups, few.group_by) == (8, "situation")
    assert (many.n_groups, many.group_by) == (200, "contrast")
    assert few["R"].value == many["R"].value  # the unit moves intervals, not estimates


def test_regroup_and_header_note():
    t = _situation_table()
    assert regroup(t, "situation") is t
    r = regroup(t, "contrast")
    assert r.n_groups == 200 and np.array_equal(r.score, t.score)
    assert t.n_groups == 8  # the original is untouched
    note = resampling_note(8, "situation")
    assert "8 situation groups" in note and f"fewer than {MIN_GROUPS} groups" in note
    assert "optimistic" in note
    assert "optimistic" not in resampling_note(200, "contrast")
    assert "200 contrast groups" in resampling_note(200, "contrast")
    with pytest.raises(ValueError, match="group_by must be one of situation, contrast"):
        resampling_groups(t, "case")


def test_card_states_unit_and_count_in_header(tmp_path):
    from spotstop.diagnostics._card import compute_card

    t = _situation_table(60, 8)
    card = compute_card(t, direct_cut=0.5, n_boot=200, n_boot_checks=50, n_boot_kernel=5,
                        rng=0, group_by="situation")  # fmt: skip
    st_ = card.settings
    assert st_["group_by"] == "situation" and st_["n_groups"] == 8
    assert "8 situation groups" in st_["interval"] and "optimistic" in st_["interval"]
    assert any("only 8 groups" in w for w in st_["warnings"])
    assert any(w.startswith("ties:") for w in st_["warnings"])
    c = compute_card(t, direct_cut=0.5, n_boot=200, n_boot_checks=50, n_boot_kernel=5,
                     rng=0, group_by="contrast")  # fmt: skip
    assert c.settings["n_groups"] == 60 and "60 contrast groups" in c.settings["interval"]
    assert not any("only" in w and "groups" in w for w in c.settings["warnings"])


def test_cli_group_by_flag_parses():
    from spotstop.diagnostics._cli import _parser

    base = ["--simulated", "--out", "x"]
    assert _parser().parse_args(base).group_by == "situation"
    assert _parser().parse_args([*base, "--group-by", "contrast"]).group_by == "contrast"
    with pytest.raises(SystemExit):
        _parser().parse_args([*base, "--group-by", "case"])


# ------------------------------------------------------------------ the guard's rule, text


def test_batch_rule_is_the_guards_with_hard_labels():
    # all-unsafe batches of scores 0/1: the batch mean is a score value itself only when all
    # scores are equal; the guard's S >= t flags a batch of 1s entirely
    t = _one_to_one_discrete(200, 4, hard=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        p = prevalence_check(t, policy_cut=0.5, n_resamples=40, rng=0)
    bm = p.rules[1.0]["batch_frozen_iqr"].tpr
    # replay one all-unsafe batch by hand with the guard's function
    u = t.score[t.label == 1]
    expected = unsafe_mask(u, float(np.mean(u))).mean()
    assert bm.value == pytest.approx(expected, abs=0.1)
    ones = np.ones(50)
    assert unsafe_mask(ones, float(np.mean(ones))).all()  # S >= t: ties UNSAFE


def test_engine_batch_cut_uses_the_guards_rule_on_a_tie():
    # safe 0 and .5, unsafe .5 and .5 plus an unpaired safe case at 1: batch mean = 2.5/5 = .5,
    # a tie with three scores. Guard (S >= .5): unsafe 2/2 flagged, safe 1/2 -> BA 0.75;
    # the direct answer's S > .5 would flag nothing paired -> 0.5
    t = _table([("a", 0, 0.0), ("a", 1, 0.5), ("b", 0, 0.5), ("b", 1, 0.5), ("", 0, 1.0)])
    prep = CurveEngine.build(t, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        d = prep.statistics(np.ones((1, t.n_groups)), None)
    assert d["A_batch"][0] == pytest.approx(0.75)
    assert d["batch_gain"][0] == pytest.approx(0.75 - 0.5)


def test_prevalence_card_rows_cover_every_level_and_reading_uses_numbers():
    from spotstop.diagnostics._check_base import CardContext

    t = _one_to_one_discrete(150, 9)
    ctx = CardContext(table=t, direct_cut=0.5, rng=np.random.default_rng(0), n_boot=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        res = PrevalenceCardCheck().run(ctx)
    levels = [k for k in res.data if k.startswith("unsafe_")]
    assert sorted(levels) == sorted(f"unsafe_{x}" for x in (10, 25, 50, 75, 90, 100))
    labels = " | ".join(r[0] for r in res.rows)
    for x in (10, 25, 50, 75, 90):
        assert f"{x} % unsafe: balanced accuracy" in labels
    assert "all unsafe: share flagged" in labels
    reading = dict(res.rows)["what to do"]
    assert reading == res.data["reading"] == prevalence_reading(res.result)
    prev = res.result
    bt = prev.rules[1.0][prev.batch_kind].tpr.value
    assert f"{100 * bt:.1f} %" in reading  # the line quotes the computed share flagged
    assert "about half" not in reading
    assert all("batch_gain" in res.data[k] for k in levels)


def test_situation_reading_follows_the_interval():
    from spotstop.diagnostics._results import ConfidenceInterval, Estimate
    from spotstop.diagnostics._situation import SituationShare, situation_reading

    def share(v: float, lo: float, hi: float, n_sit: int) -> SituationShare:
        e = Estimate(v, ConfidenceInterval(lo, hi), 100)
        return SituationShare(e, 0.7, 0.6, e, 0.6, 0.7, 0.8, 0.7, e, n_sit)

    up = situation_reading(share(0.05, 0.02, 0.08, 100))
    assert "gains 5.0 [2.0, 8.0] points" in up and "can use it" in up and "Only" not in up
    flat = situation_reading(share(0.01, -0.02, 0.04, 8))
    assert "includes 0" in flat and "no evidence" in flat
    assert "Only 8 situations" in flat and "optimistic" in flat
    down = situation_reading(share(-0.05, -0.08, -0.02, 100))
    assert "do not recentre" in down
    none = situation_reading(share(math.nan, math.nan, math.nan, 0))
    assert none.startswith("not measured")


def _prev_check(b10: float, f10: float, bt: float, ft: float):
    from spotstop.diagnostics._prevalence import PrevalenceCheck, RuleOutcome
    from spotstop.diagnostics._results import NAN_CI, Estimate

    def out(ba: float, tpr: float) -> RuleOutcome:
        return RuleOutcome(
            Estimate(ba, NAN_CI, 10), Estimate(tpr, NAN_CI, 10), Estimate(0, NAN_CI, 10)
        )

    rules = {
        0.1: {"batch": out(b10, 0.5), "frozen": out(f10, 0.5), "conformal": out(math.nan, 0)},
        1.0: {"batch": out(math.nan, bt), "frozen": out(math.nan, ft), "conformal": out(0, 0)},
    }
    return PrevalenceCheck(rules, {}, {}, 0.1, 0.1, "pac", 10, 10, "batch")


def test_prevalence_reading_is_chosen_from_the_values():
    # behind in all-unsafe batches only
    r = prevalence_reading(_prev_check(0.735, 0.735, 0.619, 0.892))
    assert r.startswith("the batch rule falls behind the fixed cut: share flagged in all-unsafe")
    assert "batch 61.9 %, fixed cut 89.2 %" in r
    assert "(balanced accuracy at 10 % unsafe: batch 73.5 %, fixed cut 73.5 %)" in r
    assert "frozen or conformal" in r
    # behind at 10 % only
    r = prevalence_reading(_prev_check(0.60, 0.75, 0.95, 0.95))
    assert "falls behind the fixed cut: balanced accuracy at 10 % unsafe" in r
    # the batch mean flags every unsafe scene as the guard's rule does, and wins at 10 %
    r = prevalence_reading(_prev_check(0.80, 0.60, 1.0, 1.0))
    assert r.startswith("the batch rule beats the fixed cut even at 10 % unsafe")
    assert "batch 100.0 %, fixed cut 100.0 %" in r
    r = prevalence_reading(_prev_check(0.70, 0.705, 0.9, 0.9))
    assert r.startswith("the batch rule and the fixed cut agree within 2 points")
    assert "about half" not in r


def test_tie_consistent_excess_is_centred_under_the_null_with_multi_case_contrasts():
    # contrasts of 2 safe + 1 unsafe and 1 + 1 with five-value scores: a swap changes which
    # pairs tie, but E[R½0 - A0] = 0 (every pair is as likely either way round)
    rows = []
    base = discrete_table()
    for r in range(30):
        rows += [
            (f"{c}_{r}", int(y), float(v))
            for c, y, v in zip(base.contrast_id, base.label, base.score, strict=True)
        ]
    t = _table(rows)
    null = label_swap_null(t, cut=0.5, n_draws=20_000, rng=1)
    se = null.R0_half_minus_A0.std() / math.sqrt(null.n_draws)
    assert abs(null.R0_half_minus_A0.mean()) < 5 * se
    assert null.observed_R_half_minus_A == pytest.approx(1 / 18)
    # T moves under the swaps here (the 2 + 1 contrasts), so R0 - A0 is not simply shifted
    assert np.ptp(null.R0_half_minus_A0 - null.R0_minus_A0) > 0
