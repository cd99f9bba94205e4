"""Metrics and the Spot-Stop decomposition: references, closed forms, properties."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from spotstop.diagnostics import (
    CaseTable,
    DataError,
    UndefinedMetricWarning,
    auroc,
    balanced_accuracy,
    best_balanced_accuracy,
    cross_fitted_threshold_part,
    g_auroc,
    kernel_reference,
    label_swap_null,
    pair_rates,
    signal_detection,
    simulate_log,
    spot_stop,
)
from spotstop.diagnostics._metrics import _weighted_quantile, d_prime_of_auroc

from tests._support.case_tables import pairs_table, small_tables

scores = st.lists(st.integers(-4, 4).map(lambda x: x / 2), min_size=2, max_size=40)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_auroc_matches_sklearn_with_ties_and_weights(data):
    s = np.array(data.draw(scores))
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=s.size, max_size=s.size)))
    w = np.array(data.draw(st.lists(st.integers(1, 4), min_size=s.size, max_size=s.size)), float)
    if y.min() == y.max():
        with pytest.warns(UndefinedMetricWarning):
            assert math.isnan(auroc(y, s))
        return
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    assert auroc(y, s, sample_weight=w) == pytest.approx(roc_auc_score(y, s, sample_weight=w))
    assert balanced_accuracy(y, s, 0.0) == pytest.approx(balanced_accuracy_score(y, s > 0))
    # A*: brute force over all cuts
    cuts = np.concatenate([[-np.inf], np.unique(s)])
    brute = max(balanced_accuracy_score(y, s > c) for c in cuts)
    best = best_balanced_accuracy(y, s)
    assert best.value == pytest.approx(brute)
    assert balanced_accuracy(y, s, best.cut) == pytest.approx(brute)


def test_g_closed_form_and_binormal_simulation():
    for d in (0.5, 1.0, 1.5, 2.5):
        au = norm.cdf(d / math.sqrt(2))
        assert g_auroc(au) == pytest.approx(norm.cdf(d / math.sqrt(2)) - norm.cdf(d / 2))
    assert math.isnan(g_auroc(math.nan))
    # paper: about 8 points for AUROC between 0.77 and 0.90
    assert 0.07 < g_auroc(0.77) < 0.09 and 0.07 < g_auroc(0.90) < 0.09
    rng = np.random.default_rng(0)
    n, d = 200_000, 1.4
    y = np.repeat([0, 1], n)
    s = rng.normal(size=2 * n) + d * y
    au = auroc(y, s)
    a_star = best_balanced_accuracy(y, s).value
    assert au - a_star == pytest.approx(g_auroc(au), abs=0.004)
    k = kernel_reference(y[::20], s[::20])
    assert k.overlap == pytest.approx(g_auroc(au), abs=0.01)
    assert k.auroc == pytest.approx(au, abs=0.01)


def test_kernel_bandwidth_rule():
    rng = np.random.default_rng(1)
    y = np.repeat([0, 1], 300)
    s = rng.normal(size=600) * np.where(y == 1, 2.0, 1.0)
    k = kernel_reference(y, s)
    for cls, h in ((0, k.bandwidth_safe), (1, k.bandwidth_unsafe)):
        x = s[y == cls]
        iqr = np.subtract(*np.percentile(x, [75, 25]))
        assert h == pytest.approx(0.9 * min(x.std(ddof=1), iqr / 1.34) * x.size**-0.2)
    # weights equal to repetition
    w = rng.integers(1, 4, 600).astype(float)
    kw = kernel_reference(y, s, sample_weight=w)
    kr = kernel_reference(np.repeat(y, w.astype(int)), np.repeat(s, w.astype(int)))
    assert kw.overlap == pytest.approx(kr.overlap)


@pytest.mark.parametrize("q", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_weighted_quantile_equals_repetition(q):
    rng = np.random.default_rng(2)
    x = rng.normal(size=30)
    w = rng.integers(1, 5, 30)
    assert _weighted_quantile(x, w.astype(float), q) == pytest.approx(
        np.quantile(np.repeat(x, w), q)
    )


def worked_example_table() -> CaseTable:
    """1,000 contrasts realizing the paper's Qwen3.5-2B figures: R = 88.0, L = 40.0,
    A = 69.8 (so C = 40.4, W = 0.4) and R - A = 18.2."""
    safe, unsafe = [], []
    safe += [-1.0] * 400
    unsafe += [1.0] * 400  # L: both right, ordered
    safe += [1.0] * 4
    unsafe += [-1.0] * 4  # W: both wrong, not ordered
    safe += [-2.0] * 300
    unsafe += [-0.5] * 300  # both SAFE, ordered
    safe += [0.5] * 180
    unsafe += [2.0] * 180  # both UNSAFE, ordered
    safe += [-0.3] * 116
    unsafe += [-0.7] * 116  # both SAFE, not ordered
    return pairs_table(safe, unsafe)


def test_paper_worked_figures():
    ss = spot_stop(worked_example_table())
    assert pytest.approx((0.880, 0.400, 0.004)) == (ss.R, ss.L, ss.W)
    assert pytest.approx(0.698) == ss.A
    assert ss.R_minus_A == pytest.approx(0.182)
    assert ss.G - ss.null_gap == pytest.approx(0.182)
    assert ss.null_gap == pytest.approx((1 - 0.404) / 2)


def test_label_swap_null_mean_matches_closed_form():
    t = simulate_log(300, rng=3)
    res = label_swap_null(t, n_draws=4000, rng=4)
    assert res.mean_G0 == pytest.approx(res.expected_null_gap, abs=0.005)
    assert float(np.mean(res.R0)) == pytest.approx(0.5, abs=0.005)
    assert res.p_R < 0.01  # a good ranker beats the null
    # multi-case contrasts: label permutation keeps class counts
    tm = CaseTable(
        case_id=[f"x{i}" for i in range(12)],
        label=[0, 0, 0, 1, 1, 1] * 2,
        score=np.arange(12.0),
        contrast_id=["q1"] * 6 + ["q2"] * 6,
        situation_id=[""] * 12,
    )
    r = label_swap_null(tm, n_draws=3000, rng=5)
    assert spot_stop(tm).R == 1.0
    assert float(np.mean(r.R0)) == pytest.approx(0.5, abs=0.02)
    assert r.R0.max() <= 1.0 and r.R0.min() >= 0.0


@settings(max_examples=80, deadline=None)
@given(t=small_tables(), cut=st.sampled_from([0.0, -0.5, 0.25]))
def test_decomposition_identities(t, cut):
    ss = spot_stop(t, cut)
    # with ties: G - E[G0] = R½ - A = threshold + overlap + within; R - A adds the tie part
    assert ss.threshold_part + ss.overlap_part + ss.within_part == pytest.approx(ss.R_half_minus_A)
    assert ss.G - ss.null_gap == pytest.approx(ss.R_half_minus_A)
    assert ss.tie_part + ss.R_half_minus_A == pytest.approx(ss.R_minus_A)
    assert ss.tie_part == pytest.approx(-ss.tied_share / 2)
    assert pytest.approx(0.5 + ss.L - ss.C / 2) == ss.A
    assert ss.threshold_part >= -1e-12  # A* >= A by construction
    # A equals the pair-weighted balanced accuracy at the cut
    p = t.pairs
    m = p.weight > 0
    assert (
        pytest.approx(balanced_accuracy(t.label[m], t.score[m], cut, sample_weight=p.weight[m]))
        == ss.A
    )


@settings(max_examples=40, deadline=None)
@given(t=small_tables(), seed=st.integers(0, 1000))
def test_invariant_to_case_order_and_relabelling(t, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(t))
    shuffled = t.subset(perm)
    rename = {v: f"r{rng.integers(1e9)}_{v}" for v in set(t.contrast_id) | set(t.situation_id) if v}
    relabel = CaseTable(
        case_id=[f"new{c}" for c in shuffled.case_id],
        label=shuffled.label,
        score=shuffled.score,
        contrast_id=[rename.get(v, "") for v in shuffled.contrast_id],
        situation_id=[rename.get(v, "") for v in shuffled.situation_id],
    )
    a, b = spot_stop(t), spot_stop(relabel)
    for k in ("R", "L", "W", "A", "auroc", "A_star", "cut_star", "within_part", "d_prime"):
        assert getattr(a, k) == pytest.approx(getattr(b, k), nan_ok=True)
    assert t.n_groups == relabel.n_groups


def test_signal_detection_and_clipping():
    y = np.array([0] * 10 + [1] * 10)
    s = np.r_[np.full(10, -1.0), np.full(10, 1.0)]  # H = 1, F = 0: clipped by 1/(2n)
    sd = signal_detection(y, s)
    assert (sd.hit_rate, sd.false_alarm_rate) == (1.0, 0.0)
    z = norm.ppf(1 - 1 / 20)
    assert sd.d_prime == pytest.approx(2 * z)
    assert sd.criterion == pytest.approx(0.0)
    s2 = np.r_[np.linspace(-1, 1, 10), np.linspace(-0.5, 2, 10)]
    sd2 = signal_detection(y, s2, 0.2)
    h, f = np.mean(s2[10:] > 0.2), np.mean(s2[:10] > 0.2)
    assert sd2.d_prime == pytest.approx(norm.ppf(h) - norm.ppf(f))
    assert sd2.criterion == pytest.approx(-(norm.ppf(h) + norm.ppf(f)) / 2)


def test_degenerate_inputs_warn_and_give_nan():
    one = np.zeros(5, dtype=int)
    s = np.arange(5.0)
    for fn in (auroc, balanced_accuracy, lambda y, x: best_balanced_accuracy(y, x).value,
               lambda y, x: signal_detection(y, x).d_prime, lambda y, x: kernel_reference(y, x).overlap):  # fmt: skip
        with pytest.warns(UndefinedMetricWarning):
            assert math.isnan(fn(one, s))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(pair_rates([], []).R)
    no_pairs = CaseTable(
        case_id=["a", "b"],
        label=[0, 1],
        score=[0.0, 1.0],
        contrast_id=["", ""],
        situation_id=["", ""],
    )
    with pytest.warns(UndefinedMetricWarning, match="no contrasts"):
        ss = spot_stop(no_pairs)
    assert math.isnan(ss.R) and math.isnan(ss.R_minus_A) and ss.n_pairs == 0
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(cross_fitted_threshold_part(no_pairs, rng=0).value)


def test_metric_input_errors():
    with pytest.raises(DataError, match="y must hold 0"):
        auroc([0, 2], [0.0, 1.0])
    with pytest.raises(DataError, match="score must be finite"):
        auroc([0, 1], [0.0, np.nan])
    with pytest.raises(DataError, match="shapes"):
        auroc([0, 1], [0.0])
    with pytest.raises(DataError, match="one length"):
        pair_rates([0.0], [1.0, 2.0])
    with pytest.raises(DataError, match="cut must be a number"):
        spot_stop(simulate_log(5, rng=0), math.nan)


def test_a_nan_cut_is_refused_not_a_silent_half():
    """A NaN cut answers every case SAFE; balanced accuracy would be a silent 0.5."""
    y, s = [0, 1, 0, 1], [0.0, 1.0, 0.2, 0.9]
    with pytest.raises(DataError, match="cut must be a number"):
        balanced_accuracy(y, s, math.nan)
    with pytest.raises(DataError, match="cut must be a number"):
        signal_detection(y, s, math.nan)
    assert balanced_accuracy(y, s, 0.5) == 1.0
    assert balanced_accuracy(y, s, math.inf) == 0.5  # an infinite cut is a cut: all SAFE


def test_cross_fitted_threshold_part_is_below_in_sample():
    t = simulate_log(400, bias=-0.8, rng=6)
    ss = spot_stop(t)
    cf = cross_fitted_threshold_part(t, n_splits=100, rng=7)
    assert cf.n_splits == 100
    assert 0 < cf.value <= ss.threshold_part + 0.01
    assert cf.low <= cf.value <= cf.high
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cross_fitted_threshold_part(t, n_splits=20, rng=7) == cross_fitted_threshold_part(
            t, n_splits=20, rng=7
        )


def test_d_prime_of_a_perfect_ranking_is_a_finite_bound_not_inf():
    """√2 Φ⁻¹(1) is +∞: the field gives the d′ half a comparison below AUROC 1, as a bound."""
    t = simulate_log(30, d_prime=40, rng=0)
    ss = spot_stop(t)
    assert ss.auroc == 1.0
    paired = t.pairs.weight > 0
    n_u, n_s = int((t.label[paired] == 1).sum()), int((t.label[paired] == 0).sum())
    bound = math.sqrt(2) * norm.ppf(1 - 1 / (2 * n_u * n_s))
    assert math.isfinite(ss.d_prime_auroc) and ss.d_prime_auroc_bound == "lower"
    assert ss.d_prime_auroc == pytest.approx(bound, rel=1e-12)
    flipped = spot_stop(dataclasses.replace(t, score=-t.score))
    assert flipped.auroc == 0.0 and flipped.d_prime_auroc_bound == "upper"
    assert flipped.d_prime_auroc == pytest.approx(-bound, rel=1e-12)
    usual = spot_stop(simulate_log(30, rng=0))
    assert 0 < usual.auroc < 1 and usual.d_prime_auroc_bound is None
    assert usual.d_prime_auroc == pytest.approx(math.sqrt(2) * norm.ppf(usual.auroc), rel=1e-12)
    assert d_prime_of_auroc(math.nan, 3, 3).bound is None
    assert math.isnan(d_prime_of_auroc(math.nan, 3, 3).value)
