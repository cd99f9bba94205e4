"""The new statistics of the card against independent computations: the exact binomial
interval and test of the conformal audit, the audit's minimum size, the delivered rates, the
group-bootstrap share; degenerate data gives a named warning and NaN, never 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest
from spotstop.diagnostics import (
    UndefinedMetricWarning,
    audit_min_n,
    binomial_upper_p,
    clopper_pearson,
    delivered_rates,
    group_codes,
)
from spotstop.diagnostics._resample import share_estimate


@pytest.mark.parametrize("x, n", [(0, 1), (0, 30), (3, 30), (15, 30), (30, 30), (7, 120)])
def test_clopper_pearson_matches_scipy(x, n):
    ci = clopper_pearson(x, n)
    ref = binomtest(x, n).proportion_ci(0.95, method="exact")
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high), abs=1e-10)
    assert (ci.low == 0.0) == (x == 0) and (ci.high == 1.0) == (x == n)


@pytest.mark.parametrize("x, n, p", [(0, 10, 0.1), (4, 30, 0.1), (9, 30, 0.1), (20, 50, 0.3)])
def test_binomial_upper_p_matches_scipy(x, n, p):
    assert binomial_upper_p(x, n, p) == pytest.approx(
        binomtest(x, n, p, alternative="greater").pvalue, rel=1e-12
    )


def test_empty_audit_is_nan_not_zero():
    assert math.isnan(binomial_upper_p(0, 0, 0.1))
    ci = clopper_pearson(0, 0)
    assert math.isnan(ci.low) and math.isnan(ci.high)


def _doubled_rate_significant(alpha: float, m: int) -> bool:
    return binom.sf(math.ceil(2 * alpha * m - 1e-9) - 1, m, alpha) < 0.05


def test_audit_min_n_by_hand():
    # alpha 0.1: 35 situations with 7 misses (twice alpha) are not significant; from 36 on,
    # a doubled miss rate always is (at 26, 6 misses were, but at 27-35 it comes and goes)
    assert binom.sf(6, 35, 0.1) > 0.05 > binom.sf(7, 36, 0.1)
    assert _doubled_rate_significant(0.1, 26) and not _doubled_rate_significant(0.1, 35)
    assert audit_min_n(0.1) == 36
    # alpha 0.01: one miss of one situation is significant (p 0.01), yet 100 % is no doubled
    # rate; the audit needs hundreds of situations, never one
    assert _doubled_rate_significant(0.01, 1)
    assert audit_min_n(0.01) > 1 / 0.01
    for alpha in (0.01, 0.02, 0.05, 0.1, 0.2):
        n = audit_min_n(alpha)
        assert not _doubled_rate_significant(alpha, n - 1)
        assert all(_doubled_rate_significant(alpha, m) for m in range(n, n + 3000)), alpha
    assert audit_min_n(0.01, limit=50) == 50  # not settled within the limit: the limit


def test_delivered_rates_by_hand():
    # 4 unsafe (3 flagged), 6 safe (1 flagged); groups: pairs of decisions
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    f = np.array([1, 1, 0, 1, 0, 1, 0, 0, 0, 0])
    g = np.repeat(np.arange(5), 2)
    r = delivered_rates(y, f, g, n_boot=300, rng=np.random.default_rng(0))
    assert r.hit_rate.value == 0.75 and r.hit_rate.n == 4
    assert r.false_alarm_rate.value == pytest.approx(1 / 6) and r.false_alarm_rate.n == 6
    assert r.balanced_accuracy.value == pytest.approx(0.5 * (0.75 + 5 / 6))
    assert r.balanced_accuracy.n == 10
    for e in (r.hit_rate, r.false_alarm_rate, r.balanced_accuracy):
        assert e.ci.low <= e.value <= e.ci.high


def test_delivered_rates_one_class_warns_and_is_nan():
    y = np.array([0, 0, 0])
    f = np.array([0, 1, 0])
    with pytest.warns(UndefinedMetricWarning, match="no labelled unsafe case"):
        r = delivered_rates(y, f, np.arange(3), n_boot=50, rng=np.random.default_rng(0))
    assert math.isnan(r.hit_rate.value) and math.isnan(r.balanced_accuracy.value)
    assert r.false_alarm_rate.value == pytest.approx(1 / 3)


def test_share_estimate_and_its_groups():
    hit = np.array([True, False, True, True, False, False])
    of = np.array([True, True, True, False, True, True])
    groups = group_codes(["c1", "c1", "", "", "c2", ""], ["", "s", "s", "", "", ""])
    assert groups.tolist() == [0, 0, 0, 1, 2, 3]  # c1 and situation s join rows 0-2
    e = share_estimate(hit, of, groups, n_boot=200, rng=np.random.default_rng(1), what="x")
    assert e.value == pytest.approx(2 / 5) and e.n == 5
    with pytest.warns(UndefinedMetricWarning, match="the y share is undefined"):
        none = share_estimate(hit, np.zeros(6, bool), groups, n_boot=10,
                              rng=np.random.default_rng(1), what="the y share")  # fmt: skip
    assert math.isnan(none.value) and none.n == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: clopper_pearson(3, 2), "need whole counts 0 <= x <= n; got x=3, n=2."),
        (lambda: clopper_pearson(-1, 2), "need whole counts 0 <= x <= n; got x=-1, n=2."),
        (lambda: clopper_pearson(1, 2, confidence=1.0), "confidence must be in (0, 1); got 1.0."),
        (lambda: binomial_upper_p(1, 2, 0.0), "p must be in (0, 1); got 0.0."),
        (lambda: audit_min_n(1.5), "alpha must be in (0, 1); got 1.5."),
        (
            lambda: delivered_rates(
                np.array([0, 1]),
                np.array([0]),
                np.arange(2),
                n_boot=5,
                rng=np.random.default_rng(0),
            ),
            "label and flagged must be 1-d of one length",
        ),
        (
            lambda: delivered_rates(
                np.array([0, 2]),
                np.array([0, 1]),
                np.arange(2),
                n_boot=5,
                rng=np.random.default_rng(0),
            ),
            "must hold 0 or 1 only",
        ),
    ],
)
def test_every_validation_message(call, message):
    from spotstop.diagnostics import DataError

    with pytest.raises(DataError) as e:
        call()
    assert message in str(e.value)
