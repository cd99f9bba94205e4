"""The card checks: prevalence, situation share, scene-blind readers, the conformal split
simulation; and the check registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression as SkLogistic
from sklearn.model_selection import GroupKFold
from sklearn.preprocessing import StandardScaler
from spotstop.diagnostics import (
    CaseTable,
    DataError,
    LogisticRegression,
    UndefinedMetricWarning,
    conformal_cut,
    conformal_split_simulation,
    file_features,
    grouped_folds,
    prevalence_check,
    scene_blind_readers,
    simulate_log,
    situation_share,
)
from spotstop.diagnostics._metrics import auroc_unchecked
from spotstop.diagnostics._resample import UnboundedRatioWarning
from spotstop.diagnostics._situation import _icc_from_sums


@pytest.mark.parametrize("C", [0.1, 1.0, 10.0])
def test_logistic_regression_matches_sklearn(C):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5)) * [1, 50, 0.01, 3, 1] + [0, 600, 0, 2, 0]
    y = (X[:, 0] + 0.02 * X[:, 1] + rng.normal(size=400) > 12).astype(np.int8)
    ours = LogisticRegression(C=C).fit(X, y)
    Z = StandardScaler().fit_transform(X)
    sk = SkLogistic(C=C, tol=1e-12, max_iter=10_000).fit(Z, y)
    np.testing.assert_allclose(ours.decision_function(X), sk.decision_function(Z), atol=1e-5)
    with pytest.raises(DataError, match="not fitted yet"):
        LogisticRegression().decision_function(X)


def test_grouped_folds_keep_groups_and_match_group_kfold_sizes():
    rng = np.random.default_rng(1)
    groups = rng.integers(0, 40, 300)
    folds = grouped_folds(groups, 5)
    for g in np.unique(groups):
        assert len(set(folds[groups == g].tolist())) == 1
    ours = sorted(np.bincount(folds).tolist())
    theirs = sorted(len(te) for _, te in GroupKFold(5).split(groups, groups=groups))
    assert ours == theirs
    with pytest.raises(DataError, match="at least n_folds=5 groups"):
        grouped_folds(np.array([0, 1, 1]), 5)


def test_icc_matches_anova_by_hand():
    rng = np.random.default_rng(2)
    sizes = rng.integers(2, 6, 30)
    sit = np.repeat(np.arange(30), sizes)
    y = rng.integers(0, 2, sit.size)
    s = rng.normal(size=30)[sit] + rng.normal(size=sit.size) + 2 * y
    r = s - np.where(y == 1, s[y == 1].mean(), s[y == 0].mean())
    N, J = r.size, 30
    means = np.bincount(sit, r) / sizes
    ssb = (sizes * (means - r.mean()) ** 2).sum()
    ssw = ((r - means[sit]) ** 2).sum()
    msb, msw = ssb / (J - 1), ssw / (N - J)
    n0 = (N - (sizes**2).sum() / N) / (J - 1)
    icc = (msb - msw) / (msb + (n0 - 1) * msw)
    stack = lambda w: np.stack([np.bincount(sit, w * (y == c), minlength=30) for c in (0, 1)], 1)  # noqa: E731
    got = _icc_from_sums(np.ones((1, 30)), stack(np.ones_like(s)), stack(s), stack(s**2))[0]
    assert got == pytest.approx(icc)


def test_situation_share_sees_offsets():
    hi = situation_share(
        simulate_log(150, situation_sd=0.8, rng=3), n_boot=100, n_permutations=20, rng=0
    )
    lo = situation_share(
        simulate_log(150, situation_sd=0.05, rng=3), n_boot=100, n_permutations=20, rng=0
    )
    assert hi.icc.value > 0.4 > lo.icc.value
    assert hi.icc.ci.low < hi.icc.value < hi.icc.ci.high
    assert hi.ba_gain.value > 0 and hi.auroc_gain.value > 0
    assert hi.n_situations == 150


def test_conformal_cut_rank_and_refusal():
    u = np.arange(1.0, 20.0)  # 19 scores: k = floor(0.1 * 20) = 2
    assert conformal_cut(u, 0.1) == 2.0
    with pytest.raises(
        DataError, match=r"needs at least 9 unsafe calibration scores for alpha=0\.1; got 5"
    ):
        conformal_cut(np.arange(5.0), 0.1)
    with pytest.raises(DataError, match=r"alpha must be in \(0, 1\); got 1\.5"):
        conformal_cut(u, 1.5)


def test_conformal_split_simulation_holds_miss_rate():
    t = simulate_log(500, rng=4)
    a = conformal_split_simulation(t, alpha=0.1, delta=None, n_splits=100, rng=1)
    assert a.guarantee == "marginal" and a.miss_rate.value == pytest.approx(0.1, abs=0.02)
    assert a.expected_miss <= 0.1 and a.n_infeasible == 0
    assert a.miss_rate.ci.low < 0.1 < a.miss_rate.ci.high
    pac = conformal_split_simulation(t, alpha=0.1, delta=0.1, n_splits=100, rng=1)
    assert pac.guarantee == "pac" and pac.miss_rate.value < a.miss_rate.value  # conservative
    assert pac.expected_miss < 0.1


def test_prevalence_check_batch_mean_follows_prevalence():
    t = simulate_log(300, rng=5)
    p = prevalence_check(t, n_resamples=60, rng=2)
    assert p.batch_kind == "batch"  # the simulated cases carry member scores
    fr = p.rules[1.0]["frozen"]
    for kind in ("batch", "batch_frozen_iqr"):
        bm = p.rules[1.0][kind]
        assert bm.tpr.value == pytest.approx(0.5, abs=0.05)  # flags about half of any batch
        assert math.isnan(bm.balanced_accuracy.value)
        assert p.rules[0.1][kind].tpr.value > p.rules[0.5][kind].tpr.value
    # the frozen cut does not depend on the batch: same hit rate at 10 % and 100 % unsafe
    assert fr.tpr.value == pytest.approx(p.rules[0.1]["frozen"].tpr.value, abs=0.05)
    assert p.recovery[0.5].value > p.recovery[0.1].value
    # the guard's PAC cut (alpha = delta = 0.1) misses less than alpha
    assert 0.9 < p.rules[0.5]["conformal"].tpr.value < 0.97
    with pytest.raises(DataError, match="prevalences must lie in \\(0, 1\\]"):
        prevalence_check(t, prevalences=(0.0,))


def test_prevalence_conformal_too_small_warns():
    t = simulate_log(10, rng=6)
    with (
        pytest.warns(UndefinedMetricWarning, match="conformal cut was undefined"),
        pytest.warns(UnboundedRatioWarning, match="batch rule's recovery .* is undefined at 10"),
    ):
        p = prevalence_check(t, n_resamples=5, rng=0)
    assert math.isnan(p.rules[0.5]["conformal"].tpr.value)


def test_scene_blind_readers_find_a_file_leak():
    leak = simulate_log(150, size_leak=1.5, rng=7)
    clean = simulate_log(150, size_leak=0.0, rng=7)
    r = scene_blind_readers(leak, n_permutations=30, n_splits=30, n_boot=100, rng=0)
    c = scene_blind_readers(clean, n_permutations=30, n_splits=30, n_boot=100, rng=0)
    assert r.file_reader.value > 0.75 and r.file_reader_p < 0.05
    assert abs(c.file_reader.value - 0.5) < 0.1 and c.file_reader_p > 0.05
    assert r.longest_side.accuracy.value > 0.7 and r.longest_side.direction == ">"
    assert "log_longest_side" in r.file_features and "format_png" in r.file_features
    assert abs(r.request_only.value - 0.5) < 0.1
    assert r.image_minus_gray.value > 0.7
    assert set(r.members) == {"a", "b"}


def test_scene_blind_without_columns():
    t = simulate_log(30, rng=0)
    bare = CaseTable(
        case_id=t.case_id,
        label=t.label,
        score=t.score,
        contrast_id=t.contrast_id,
        situation_id=t.situation_id,
    )
    r = scene_blind_readers(bare, n_permutations=2, n_boot=10, rng=0)
    assert r.file_reader is None and r.longest_side is None and r.request_only is None
    assert file_features(bare) is None


def test_auroc_unchecked_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 200).astype(np.int8)
    s = rng.integers(0, 5, 200).astype(float)
    assert auroc_unchecked(y, s) == pytest.approx(roc_auc_score(y, s))


def test_file_reader_with_too_few_groups_warns_and_is_undefined():
    from spotstop.diagnostics import UndefinedMetricWarning, scene_blind_readers, simulate_log

    table = simulate_log(3, rng=4)
    assert np.unique(table.group).size < 5
    with pytest.warns(UndefinedMetricWarning, match="n_folds"):
        res = scene_blind_readers(table, n_boot=50, n_permutations=10, n_splits=10, rng=0)
    assert res.file_reader is None and math.isnan(res.file_reader_p)
