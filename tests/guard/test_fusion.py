"""Avg-2 fusion: formula, fitting, invariance of the batch cut, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from spotstop.guard._errors import ConfigError, GuardError
from spotstop.guard._fusion import Avg2Fusion, FusionError, MemberStats, member_spread
from spotstop.guard.policies import (
    BatchFrozenIqrPolicy,
    FrozenPolicy,
    batch_inputs,
    decide_batch,
)
from spotstop.guard.policies._batch import batch_scores

A = MemberStats(median=-1.0, iqr=2.0)
B = MemberStats(median=0.5, iqr=0.25)


def _pair(weights: dict[str, float] | None = None) -> Avg2Fusion:
    return Avg2Fusion(members=("a", "b"), stats={"a": A, "b": B}, weights=weights or {})


def test_fuse_equals_hand_computation() -> None:
    # ((3 - (-1)) / 2 + (1 - 0.5) / 0.25) / 2 = (2 + 2) / 2 = 2
    assert _pair().fuse({"a": 3.0, "b": 1.0}) == pytest.approx(2.0)
    # ((-2 - (-1)) / 2 + (0.25 - 0.5) / 0.25) / 2 = (-0.5 - 1) / 2 = -0.75
    assert _pair().fuse({"a": -2.0, "b": 0.25}) == pytest.approx(-0.75)


def test_equal_weights_are_the_default() -> None:
    f = _pair()
    assert dict(f.weights) == {"a": 1.0, "b": 1.0}
    s = {"a": 1.0, "b": 2.0}
    z = [(1.0 - A.median) / A.iqr, (2.0 - B.median) / B.iqr]
    assert f.fuse(s) == pytest.approx(sum(z) / 2)
    assert f.fuse(s) == pytest.approx(_pair({"a": 3.0, "b": 3.0}).fuse(s))


def test_weights_follow_the_formula() -> None:
    s = {"a": 3.0, "b": 0.0}  # z_a = 2, z_b = -2
    za, zb = 2.0, -2.0
    for wa, wb in [(1.0, 1.0), (3.0, 1.0), (1.0, 4.0), (0.2, 0.7)]:
        got = _pair({"a": wa, "b": wb}).fuse(s)
        assert got == pytest.approx((wa * za + wb * zb) / (wa + wb))
    assert _pair({"a": 3.0, "b": 1.0}).fuse(s) > _pair().fuse(s)


def test_single_member_is_a_robust_z_score() -> None:
    f = Avg2Fusion(members=("a",), stats={"a": A})
    assert f.fuse({"a": 5.0}) == pytest.approx((5.0 - A.median) / A.iqr)


def test_fuse_many_matches_fuse() -> None:
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=20), rng.normal(size=20)
    f = _pair({"a": 2.0, "b": 1.0})
    many = f.fuse_many({"a": xa, "b": xb})
    one = [f.fuse({"a": a, "b": b}) for a, b in zip(xa, xb, strict=True)]
    np.testing.assert_allclose(many, one)


def test_fit_matches_numpy_and_scipy() -> None:
    rng = np.random.default_rng(1)
    pool = {"a": rng.normal(2.0, 3.0, size=101), "b": rng.gamma(2.0, size=57)}
    f = Avg2Fusion.fit(pool)
    assert f.members == ("a", "b")
    for m, x in pool.items():
        assert f.stats[m].median == pytest.approx(np.median(x))
        assert f.stats[m].iqr == pytest.approx(scipy.stats.iqr(x))
        q75, q25 = np.percentile(x, [75, 25])
        assert f.stats[m].iqr == pytest.approx(q75 - q25)


def test_fit_refuses_zero_iqr_naming_the_member() -> None:
    with pytest.raises(FusionError, match="'flat'"):
        Avg2Fusion.fit({"ok": [0.0, 1.0, 2.0, 3.0], "flat": [1.0, 1.0, 1.0, 1.0]})
    with pytest.raises(FusionError, match=r"'b'.*not finite"):
        Avg2Fusion.fit({"a": [0.0, 1.0, 2.0], "b": [0.0, np.nan, 2.0]})


def test_fit_and_the_batch_rule_share_one_flat_member_rule() -> None:
    """One median/IQR rule (member_spread) for the frozen fit and the batch rule: a member
    whose IQR is at rounding level is flat for both (the fit refuses it, the batch rule
    reports IQR 0 and falls back), and otherwise both give the same numbers."""
    flat = 1e6 + np.array([0.0, 1e-4, 2e-4, 3e-4, 4e-4])  # IQR 2e-4 ≤ 1e-9 · 1e6
    assert member_spread(flat).flat and member_spread(np.ones(4)).flat
    with pytest.raises(FusionError, match=r"member 'a'.*IQR is 0\.0002.*rounding level"):
        Avg2Fusion.fit({"b": [0.0, 1.0, 2.0, 3.0, 4.0], "a": flat})
    _, stats = batch_scores({"a": flat}, {"a": 1.0}, np.ones(flat.size, bool))
    assert stats["a"][1] == 0.0
    rng = np.random.default_rng(4)
    x = {"a": 1e6 + rng.normal(0, 1e-2, 9), "b": rng.gamma(2.0, size=9)}  # not flat
    f = Avg2Fusion.fit(x)
    s_b, stats = batch_scores(x, {"a": 1.0, "b": 1.0}, np.ones(9, bool))
    for m in x:
        sp = member_spread(x[m])
        assert not sp.flat
        assert (f.stats[m].median, f.stats[m].iqr) == stats[m] == (sp.median, sp.iqr)
        q25, q50, q75 = np.percentile(x[m], [25, 50, 75])
        assert (sp.median, sp.iqr) == (q50, q75 - q25)  # unchanged numbers
    np.testing.assert_array_equal(s_b, f.fuse_many(x))


@pytest.mark.parametrize(
    "scores, match",
    [
        ({"a": 1.0}, "'b' has no score"),
        ({"a": 1.0, "b": math.nan}, "'b' has a non-finite"),
        ({"a": math.inf, "b": 0.0}, "'a' has a non-finite"),
        ({"a": None, "b": 0.0}, "'a' has a non-finite"),
    ],
)
def test_fuse_missing_or_nonfinite_raises(scores: dict[str, float], match: str) -> None:
    with pytest.raises(FusionError, match=match) as info:
        _pair().fuse(scores)
    assert isinstance(info.value, GuardError | ValueError)


def test_fuse_many_missing_nan_and_propagate() -> None:
    f = _pair()
    with pytest.raises(FusionError, match="'b' has no scores"):
        f.fuse_many({"a": np.zeros(3)})
    with pytest.raises(FusionError, match=r"'a' has non-finite scores at positions \[1\]"):
        f.fuse_many({"a": [0.0, np.nan, 1.0], "b": np.zeros(3)})
    with pytest.raises(FusionError, match="same length"):
        f.fuse_many({"a": np.zeros(3), "b": np.zeros(2)})
    out = f.fuse_many({"a": [0.0, np.nan, 1.0], "b": np.ones(3)}, nan_policy="propagate")
    assert np.isnan(out[1]) and np.isfinite(out[[0, 2]]).all()


def test_round_trip_and_from_dict_errors() -> None:
    f = _pair({"a": 2.0, "b": 1.0})
    assert Avg2Fusion.from_dict(f.to_dict()) == f
    bad = f.to_dict()
    bad["stats"]["b"]["iqr"] = 0.0
    with pytest.raises(ConfigError, match=r"fusion\.stats\.b\.iqr must be a finite number > 0"):
        Avg2Fusion.from_dict(bad)
    bad = f.to_dict()
    bad["wieghts"] = bad.pop("weights")
    with pytest.raises(
        ConfigError, match=r"fusion\.wieghts is not a known key\. Did you mean 'weights'"
    ):
        Avg2Fusion.from_dict(bad)


def test_constructor_validation() -> None:
    with pytest.raises(FusionError, match="iqr"):
        MemberStats(median=0.0, iqr=-1.0)
    with pytest.raises(FusionError, match="one entry per member"):
        Avg2Fusion(members=("a", "b"), stats={"a": A})
    with pytest.raises(FusionError, match=r"weights\['a'\]"):
        _pair({"a": 0.0, "b": 1.0})


def test_weights_that_sum_past_a_float_are_refused_by_name() -> None:
    """With Σw = inf, S = finite / inf = 0 for every scene: a cut above 0 said SAFE to all."""
    with pytest.raises(FusionError, match="sum to more than a float holds"):
        _pair({"a": 1e308, "b": 1e308})
    from spotstop.guard.policies import PolicyError, load_policy

    doc = {
        "version": 2,
        "bundle_id": "b",
        "prompt_hash": "p",
        "created": "2026-05-01T12:00:00+00:00",
        "fusion": {**_pair().to_dict(), "weights": {"a": 1e308, "b": 1e308}},
        "policy": {"kind": "frozen", "threshold": -0.5},
        "fitted_on": {},
    }
    with pytest.raises(PolicyError, match="sum to more than a float holds"):
        load_policy(doc)


def test_a_fused_score_that_overflows_is_no_score_and_unsafe() -> None:
    """Finite weights and scores whose weighted sum overflows: −inf would pass any cut."""
    f = _pair({"a": 1e308, "b": 1.0})
    low, high = {"a": -5.0, "b": 0.5}, {"a": 3.0, "b": 0.5}  # z_a = −2 and +2
    for scores in (low, high):
        with pytest.raises(FusionError, match="overflowed"):
            f.fuse(scores)
    batch = {m: np.array([low[m], high[m], -1.0]) for m in ("a", "b")}
    with pytest.raises(FusionError, match=r"positions \[0, 1\] overflowed"):
        f.fuse_many(batch)
    out = f.fuse_many(batch, nan_policy="propagate")
    assert np.isnan(out[:2]).all() and out[2] == pytest.approx(0.0)
    d = decide_batch(FrozenPolicy(threshold=1.0), batch_inputs(f, batch))
    assert list(d.labels) == ["UNSAFE", "UNSAFE", "SAFE"]
    assert [v.fail_closed for v in d.verdicts] == [True, True, False]


_score = st.floats(-50, 50, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(
    xa=st.lists(_score, min_size=2, max_size=20),
    seed=st.integers(0, 2**16),
    shift_a=_score,
    shift_b=_score,
    iqr_a=st.floats(0.1, 10),
    iqr_b=st.floats(0.1, 10),
)
def test_batch_cut_labels_do_not_depend_on_medians(
    xa: list[float],
    seed: int,
    shift_a: float,
    shift_b: float,
    iqr_a: float,
    iqr_b: float,
) -> None:
    """With the batch-mean cut on the frozen fusion the medians cancel: S − mean(S) does not
    depend on them (the ``batch_frozen_iqr`` kind; the paper's ``batch`` kind refits them)."""
    rng = np.random.default_rng(seed)
    a = np.asarray(xa)
    b = rng.normal(size=a.size) * 5
    weights = {"a": 1.0, "b": float(rng.uniform(0.2, 3.0))}
    f1 = Avg2Fusion(
        ("a", "b"), {"a": MemberStats(0.0, iqr_a), "b": MemberStats(0.0, iqr_b)}, weights
    )
    f2 = Avg2Fusion(
        ("a", "b"), {"a": MemberStats(shift_a, iqr_a), "b": MemberStats(shift_b, iqr_b)}, weights
    )
    policy = BatchFrozenIqrPolicy(fallback=FrozenPolicy(0.0))
    s1 = f1.fuse_many({"a": a, "b": b})
    v1 = decide_batch(policy, batch_inputs(f1, {"a": a, "b": b})).verdicts
    v2 = decide_batch(policy, batch_inputs(f2, {"a": a, "b": b})).verdicts
    # compare labels away from float ties (margin far above rounding of the shift)
    clear = np.abs(s1 - s1.mean()) > 1e-9 * (1 + np.abs(s1).max() + 100)
    for i in np.flatnonzero(clear):
        assert v1[i].label == v2[i].label
