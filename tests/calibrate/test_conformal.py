"""The conformal cut's two guarantees: the PAC rank, refusals, and coverage over 1,000 splits.

Multiplicity: the coverage test makes 18 statistical checks on seeded simulations: for 3
settings (alpha, delta, n) and 2 cluster rules, the mean miss rate and the share of splits with
miss > alpha (12), plus, for the exact "random" rule, that both sit at their theoretical values
(6). Each check is at level 1e-3 / 18 (Bonferroni), so the family fails by chance with
probability at most 1e-3 for a random seed. The exact-rank checks are not statistical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta as beta_dist
from scipy.stats import binom
from spotstop.calibrate import ConformalCalibrator, binom_cdf
from spotstop.guard.policies import (
    ConformalPolicy,
    NotFittedError,
    PolicyError,
    conformal_pac_min_n,
    conformal_pac_rank,
    conformal_rank,
    load_policy,
)

FAMILY_LEVEL = 1e-3
N_CHECKS = 18
PER_CHECK = FAMILY_LEVEL / N_CHECKS


# ------------------------------------------------------------------ the PAC rank


@pytest.mark.parametrize(
    ("alpha", "delta"), [(0.1, 0.1), (0.05, 0.1), (0.1, 0.05), (0.2, 0.01), (0.29, 0.5)]
)
def test_pac_rank_is_the_largest_k_with_binomial_tail_at_most_delta(alpha, delta):
    for n in [1, 5, 10, 21, 22, 30, 44, 59, 100, 257, 1000]:
        k = conformal_pac_rank(alpha, delta, n)
        if k >= 1:
            assert binom.cdf(k - 1, n, alpha) <= delta * (1 + 1e-12)
            # the miss rate given the calibration set is Beta(k, n-k+1): same tail
            assert beta_dist.sf(alpha, k, n - k + 1) == pytest.approx(
                binom.cdf(k - 1, n, alpha), rel=1e-9, abs=1e-300
            )
        if k < n:
            assert binom.cdf(k, n, alpha) > delta * (1 - 1e-12), (n, k)
        assert k <= conformal_rank(alpha, n) or delta >= 0.5


def test_pac_rank_above_the_exact_limit_agrees_with_floating_point():
    # n > 20,000 is summed in floating point; it must agree with scipy
    n, alpha, delta = 20_500, 0.1, 0.1
    k = conformal_pac_rank(alpha, delta, n)
    assert binom.cdf(k - 1, n, alpha) <= delta < binom.cdf(k, n, alpha)


def test_pac_direction_by_simulation_of_order_statistics():
    # miss rate given calibration = F(u(k)) = U(k) for uniform scores
    rng = np.random.default_rng(11)
    n, alpha, delta, reps = 60, 0.1, 0.1, 20_000
    k = conformal_pac_rank(alpha, delta, n)
    u = np.sort(rng.random((reps, n)), axis=1)
    share_k = float((u[:, k - 1] > alpha).mean())
    share_k1 = float((u[:, k] > alpha).mean())  # one rank higher: must break the bound
    sd = math.sqrt(delta * (1 - delta) / reps)
    assert share_k <= delta + 4 * sd
    assert share_k == pytest.approx(binom.cdf(k - 1, n, alpha), abs=4 * sd)
    assert share_k1 > delta + 4 * sd


def test_pac_min_n_is_the_smallest_n_with_a_rank():
    for alpha, delta in [(0.1, 0.1), (0.05, 0.05), (0.1, 0.01), (0.3, 0.2)]:
        n = conformal_pac_min_n(alpha, delta)
        assert conformal_pac_rank(alpha, delta, n) == 1
        assert conformal_pac_rank(alpha, delta, n - 1) == 0
    assert conformal_pac_min_n(0.1, 0.1) == 22  # 0.9**22 = 0.098 ≤ 0.1 < 0.9**21
    # a small alpha: the rank is decided in floating point there, and so is the fewest n
    # (the exact power (1 − 1e-6)^2302585 ran to millions of digits: recalibrate never ended)
    for alpha, delta in [(1e-5, 0.05), (1e-6, 0.1)]:
        n = conformal_pac_min_n(alpha, delta)
        assert n > 20_000
        assert conformal_pac_rank(alpha, delta, n) == 1
        assert conformal_pac_rank(alpha, delta, n - 1) == 0
        assert n == pytest.approx(math.log(delta) / math.log1p(-alpha), abs=1)


def test_binom_cdf_matches_scipy():
    for n, p in [(10, 0.1), (200, 0.05), (1000, 0.3)]:
        for k in (-1, 0, 3, n // 10, n - 1, n):
            assert binom_cdf(k, n, p) == pytest.approx(binom.cdf(k, n, p), rel=1e-9, abs=1e-15)


# ------------------------------------------------------------------ the calibrator


def test_calibrator_reports_both_guarantees_and_chooses_one():
    scores = np.arange(100.0)
    cal = ConformalCalibrator(alpha=0.1, delta=0.1).fit(scores)
    assert (cal.marginal_.k, cal.pac_.k) == (10, 6)
    assert cal.k_ == 6 and cal.threshold_ == 5.0 and cal.n_ == 100
    assert cal.marginal_.expected_miss == pytest.approx(10 / 101)
    assert cal.pac_.p_miss_above_alpha == pytest.approx(binom.cdf(5, 100, 0.1))
    pol = cal.to_policy()
    assert pol == ConformalPolicy(alpha=0.1, n=100, k=6, threshold=5.0, delta=0.1)
    marg = ConformalCalibrator(alpha=0.1, guarantee="marginal").fit(scores)
    assert marg.to_policy() == ConformalPolicy(alpha=0.1, n=100, k=10, threshold=9.0)
    assert "PAC" in cal.pac_.statement and "marginal" in cal.marginal_.statement


def test_calibrator_refuses_too_small_sets_naming_the_number_needed():
    with pytest.raises(PolicyError, match=r"at least 22 unsafe situations are needed, so 7 more"):
        ConformalCalibrator(alpha=0.1, delta=0.1).fit(np.arange(15.0))
    # the message also says that the marginal guarantee would do
    with pytest.raises(PolicyError, match="marginal guarantee would be available"):
        ConformalCalibrator(alpha=0.1, delta=0.1).fit(np.arange(15.0))
    with pytest.raises(PolicyError, match=r"at least 9 unsafe situations"):
        ConformalCalibrator(alpha=0.1, guarantee="marginal").fit(np.arange(5.0))
    cal = ConformalCalibrator(alpha=0.1).fit(np.arange(15.0), refuse=False)
    assert not cal.pac_.feasible and math.isnan(cal.pac_.threshold) and cal.marginal_.feasible
    with pytest.raises(PolicyError, match="too few"):
        cal.to_policy()


def test_calibrator_validates_settings_and_order_of_calls():
    with pytest.raises(NotFittedError, match="call fit"):
        _ = ConformalCalibrator().threshold_
    for kwargs, key in [
        ({"alpha": 1.5}, "alpha"),
        ({"delta": 0.0}, "delta"),
        ({"guarantee": "strict"}, "guarantee"),
        ({"cluster_rule": "mean"}, "cluster_rule"),
    ]:
        with pytest.raises(PolicyError, match=key):
            ConformalCalibrator(**kwargs).fit(np.arange(50.0))
    with pytest.raises(PolicyError, match="non-finite"):
        ConformalCalibrator().fit([1.0, math.nan])
    with pytest.raises(PolicyError, match="one entry per unsafe score"):
        ConformalCalibrator().fit(np.arange(30.0), ["a"])


def test_one_case_per_situation():
    # 30 situations x 3 cases: n counts situations, "min" keeps each situation's lowest
    scores = np.arange(90.0)
    sids = [f"s{i // 3}" for i in range(90)]
    cal = ConformalCalibrator(alpha=0.1, delta=0.1).fit(scores, sids)
    assert cal.n_ == 30 and cal.n_cases_ == 90 and cal.n_situations_ == 30
    assert "one case per situation" in cal.cluster_note_
    assert cal.threshold_ == 3.0 * (cal.k_ - 1)  # the k-th smallest situation minimum
    # cases without a situation each count as their own
    cal2 = ConformalCalibrator(alpha=0.1).fit(np.arange(30.0), [None] * 30)
    assert cal2.n_ == 30
    # the random rule is reproducible with its seed and picks one case of each situation
    r1 = ConformalCalibrator(alpha=0.1, cluster_rule="random", rng=5).fit(scores, sids)
    r2 = ConformalCalibrator(alpha=0.1, cluster_rule="random", rng=5).fit(scores, sids)
    assert r1.threshold_ == r2.threshold_ and r1.n_ == 30


def test_conformal_policy_with_delta_round_trips_and_without_delta_is_marginal():
    base = {
        "version": 2,
        "bundle_id": "b",
        "prompt_hash": "p",
        "created": "2026-05-01T12:00:00+00:00",
        "fusion": {"method": "avg2", "members": ["a"], "stats": {"a": {"median": 0, "iqr": 1}}},
        "fitted_on": {},
    }
    old = load_policy(
        {**base, "policy": {"kind": "conformal", "alpha": 0.1, "n": 100, "k": 10, "threshold": 1.0}}
    )
    assert old.policy == ConformalPolicy(0.1, 100, 10, 1.0) and "delta" not in old.policy.to_dict()
    pac = {"kind": "conformal", "alpha": 0.1, "n": 100, "k": 6, "threshold": 1.0, "delta": 0.1}
    cfg = load_policy({**base, "policy": pac})
    assert cfg.policy.to_dict() == pac
    with pytest.raises(PolicyError, match=r"policy.k must be the PAC rank for delta=0.1 = 6"):
        load_policy({**base, "policy": {**pac, "k": 10}})
    with pytest.raises(PolicyError, match=r"At least 22 unsafe"):
        load_policy({**base, "policy": {**pac, "n": 15, "k": 1}})
    with pytest.raises(PolicyError, match=r"policy.delta must be in \(0, 1\)"):
        load_policy({**base, "policy": {**pac, "delta": 2}})


# ------------------------------------------------------------------ coverage over splits


def _population(rng: np.random.Generator, n_sit: int = 4000, per: int = 3) -> np.ndarray:
    """Unsafe fused scores, one row per situation: shared offset (ICC ~ 0.64) + case noise."""
    return rng.normal(0, 0.8, (n_sit, 1)) + rng.normal(0, 0.6, (n_sit, per))


def _split_misses(
    pop: np.ndarray, n: int, cal: ConformalCalibrator, rng: np.random.Generator, reps: int
) -> np.ndarray:
    """Miss rate of a new unsafe scene from a new situation, for ``reps`` random splits.

    The calibration set is ``n`` random situations (all their cases, labelled by situation);
    the miss rate is exact over the rest of the population: the mean over the other
    situations of the share of their cases below the cut.
    """
    n_sit, per = pop.shape
    flat = np.sort(pop.ravel())
    out = np.empty(reps)
    for r in range(reps):
        pick = rng.choice(n_sit, n, replace=False)
        cal_scores = pop[pick].ravel()
        sids = np.repeat(pick, per)
        cut = cal.fit(cal_scores, sids).threshold_
        below_all = np.searchsorted(flat, cut, side="left")
        below_cal = int((cal_scores < cut).sum())
        out[r] = (below_all - below_cal) / ((n_sit - n) * per)
    return out


@pytest.mark.parametrize(
    ("alpha", "delta", "n"), [(0.1, 0.1, 40), (0.05, 0.1, 80), (0.1, 0.05, 60)]
)
@pytest.mark.parametrize("rule", ["random", "min"])
def test_guarantees_hold_over_1000_random_splits(alpha, delta, n, rule):
    rng = np.random.default_rng(2024)
    pop = _population(rng)
    reps = 1000
    cal = ConformalCalibrator(alpha, delta, guarantee="marginal", cluster_rule=rule, rng=rng)
    miss_m = _split_misses(pop, n, cal, rng, reps)
    k_m = conformal_rank(alpha, n)
    # marginal: mean miss rate ≤ alpha + 1/(n+1). The mean of 1000 Beta(k, n-k+1) draws has
    # sd ≈ 0.0015 here, far below the 1/(n+1) ≥ 0.012 slack, so this holds at PER_CHECK.
    assert miss_m.mean() <= alpha + 1 / (n + 1)
    if rule == "random":  # exact, not conservative: close to k/(n+1)
        # 4.5 sd is beyond the two-sided PER_CHECK normal quantile (≈ 4.1); 0.005 allows
        # for the finite population
        sd = miss_m.std(ddof=1) / math.sqrt(reps)
        assert abs(miss_m.mean() - k_m / (n + 1)) <= 4.5 * sd + 0.005
    else:  # conservative: never above the exact value
        assert miss_m.mean() <= k_m / (n + 1) + 0.005

    cal_p = ConformalCalibrator(alpha, delta, guarantee="pac", cluster_rule=rule, rng=rng)
    miss_p = _split_misses(pop, n, cal_p, rng, reps)
    over = int((miss_p > alpha).sum())
    # PAC: the count of splits with miss > alpha is Binomial(reps, p), p ≤ delta; allow the
    # upper (1 - PER_CHECK) quantile of Binomial(reps, delta)
    limit = int(binom.ppf(1 - PER_CHECK, reps, delta))
    assert over <= limit, (over, limit)
    if rule == "random":
        p_theory = binom.cdf(conformal_pac_rank(alpha, delta, n) - 1, n, alpha)
        lo, hi = binom.ppf([PER_CHECK / 2, 1 - PER_CHECK / 2], reps, p_theory)
        assert lo - 0.01 * reps <= over <= hi + 0.01 * reps  # 1 % for the finite population


def test_pooling_the_cases_of_a_situation_breaks_the_pac_guarantee():
    """Why one case per situation: treating 3 correlated cases as 3 exchangeable ones does not hold."""
    rng = np.random.default_rng(7)
    pop = _population(rng)
    alpha, delta, n, reps = 0.1, 0.1, 40, 400
    n_sit, per = pop.shape
    flat = np.sort(pop.ravel())
    over = 0
    for _ in range(reps):
        pick = rng.choice(n_sit, n, replace=False)
        scores = pop[pick].ravel()
        cut = ConformalCalibrator(alpha, delta).fit(scores).threshold_  # no situation ids
        miss = (np.searchsorted(flat, cut) - (scores < cut).sum()) / ((n_sit - n) * per)
        over += int(miss > alpha)
    assert over / reps > delta + 0.05
