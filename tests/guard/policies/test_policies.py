"""Threshold policies: the one decision rule, every registered kind by hand, policy.yaml.

Every registered kind has a hand-computed example in ``_HAND_EXAMPLES``; a kind added to the
registry without one fails :func:`test_every_registered_kind_has_a_hand_computed_example`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from spotstop.guard._errors import ConfigError
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard.policies import (
    POLICY_KINDS,
    BatchFrozenIqrPolicy,
    BatchPolicy,
    CascadePolicy,
    ConformalPolicy,
    DecisionError,
    DirectPolicy,
    FrozenPolicy,
    PolicyError,
    ScoringPlan,
    ScoringStage,
    SituationPolicy,
    SituationWindows,
    batch_inputs,
    cascade_band,
    check_policy_matches,
    conformal_cut,
    conformal_min_n,
    conformal_rank,
    decide_batch,
    dump_policy,
    entered_scores,
    is_unsafe,
    label_of,
    load_policy,
    n_safe,
    policy_class,
    policy_kinds,
    replay,
    unsafe_mask,
)

FUSION = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 2.0), "b": MemberStats(1.0, 1.0)})


def _x(a: list[float], b: list[float], sids: list[str | None] | None = None, text: Any = None):
    return batch_inputs(FUSION, {"a": a, "b": b}, sids, text)


def _labels(d: Any) -> list[str]:
    return [v.label for v in d.verdicts]


# ---------------------------------------------------------------------- the rule


def test_the_rule_ties_and_non_finite_are_unsafe() -> None:
    assert label_of(0.5, 0.5) == "UNSAFE"  # a tie is UNSAFE (fail-safe)
    assert label_of(0.499, 0.5) == "SAFE"
    assert label_of(math.nan, 0.0) == "UNSAFE" and label_of(0.0, math.nan) == "UNSAFE"
    assert label_of(-math.inf, 0.0) == "UNSAFE"  # not finite, whatever its sign
    assert label_of(-1.0, math.inf) == "UNSAFE"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)), max_size=20
    ),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
)
def test_the_vectorized_rule_is_the_scalar_rule(scores: list[float], t: float) -> None:
    mask = unsafe_mask(scores, t)
    assert mask.tolist() == [is_unsafe(s, t) for s in scores]
    assert all(
        label_of(s, t) == ("UNSAFE" if m else "SAFE") for s, m in zip(scores, mask, strict=True)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20).map(sorted),
    st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
        max_size=8,
    ),
)
def test_n_safe_counts_what_the_rule_calls_safe(scores: list[float], ts: list[float]) -> None:
    got = n_safe(scores, ts)
    assert got.tolist() == [int((~unsafe_mask(scores, t)).sum()) for t in ts]


# ---------------------------------------------------------------------- conformal rank


@pytest.mark.parametrize(
    "n, alpha, k",
    [(9, 0.1, 1), (19, 0.1, 2), (10, 0.2, 2), (4, 0.2, 1), (99, 0.05, 5), (99, 0.29, 29)],
)
def test_conformal_rank_by_hand(n: int, alpha: float, k: int) -> None:
    assert conformal_rank(alpha, n) == k
    fit = conformal_cut(np.arange(n, 0, -1, dtype=float), alpha=alpha)  # descending: sorted here
    assert (fit.marginal.n, fit.marginal.k, fit.marginal.threshold) == (n, k, float(k))
    pol = ConformalPolicy(alpha=alpha, n=n, k=k, threshold=float(k))
    assert (pol.alpha, pol.n, pol.k) == (alpha, n, k)


def test_conformal_cut_refuses_non_finite_scores() -> None:
    """A NaN would count in n and, under the "min" rule, wipe out its situation's cases."""
    u = np.arange(1.0, 11.0)
    for bad in (math.nan, math.inf, -math.inf):
        v = np.r_[bad, u]
        with pytest.raises(ValueError, match=r"1 of 11 unsafe calibration scores are not finite"):
            conformal_cut(v, alpha=0.1)
        with pytest.raises(ValueError, match=r"not finite \(positions \[0\]\)"):
            conformal_cut(v, ["a", "a"] + [""] * 9, alpha=0.1, delta=0.1)
    assert conformal_cut(u, alpha=0.1).marginal.threshold == 1.0


def test_the_card_and_the_guard_share_the_conformal_rank() -> None:
    """A rank where rounding matters: α = 0.29, n = 99 gives 29, not 28 from 0.29·100 = 28.999…"""
    from spotstop.diagnostics import conformal_cut as card_cut

    u = np.arange(1.0, 100.0)
    assert card_cut(u, 0.29) == 29.0 == conformal_cut(u, alpha=0.29).marginal.threshold
    rng = np.random.default_rng(7)
    for _ in range(300):
        alpha = float(np.round(rng.uniform(0.01, 0.5), 2))
        n = int(rng.integers(1, 300))
        if conformal_rank(alpha, n) == 0:
            continue
        u = np.sort(rng.normal(size=n))
        assert card_cut(u, alpha) == u[conformal_rank(alpha, n) - 1]


@pytest.mark.parametrize("alpha, n, need", [(0.1, 8, 9), (0.05, 10, 19), (0.3, 2, 3), (0.5, 0, 1)])
def test_conformal_refuses_too_few(alpha: float, n: int, need: int) -> None:
    assert conformal_min_n(alpha) == need
    assert conformal_rank(alpha, need) >= 1
    fit = conformal_cut(np.linspace(0, 1, n), alpha=alpha)
    assert not fit.marginal.feasible and fit.marginal.n_needed == need
    assert f"at least {need} unsafe situations are needed" in fit.refusal("marginal")


def test_conformal_policy_constructor_agrees_with_the_rank() -> None:
    with pytest.raises(PolicyError, match="k must be floor"):
        ConformalPolicy(alpha=0.1, n=19, k=1, threshold=0.0)
    with pytest.raises(PolicyError, match="At least 9"):
        ConformalPolicy(alpha=0.1, n=5, k=0, threshold=0.0)


# ---------------------------------------------------------------------- each kind, by hand
#
# FUSION: a has median 0, IQR 2; b has median 1, IQR 1; equal weights. So
# S = ((a − 0)/2 + (b − 1)/1) / 2.


def _hand_frozen() -> None:
    # S of (a, b) = (0, 1) → 0; (2, 1) → 0.5; (0, 2) → 0.5; (−2, 0) → −1
    d = decide_batch(FrozenPolicy(0.5), _x([0.0, 2.0, 0.0, -2.0], [1.0, 1.0, 2.0, 0.0]))
    assert [v.score for v in d.verdicts] == [0.0, 0.5, 0.5, -1.0]
    assert _labels(d) == ["SAFE", "UNSAFE", "UNSAFE", "SAFE"]  # ties at 0.5 are UNSAFE
    assert all(v.threshold == 0.5 and v.policy == "frozen" for v in d.verdicts)


def _hand_direct() -> None:
    d = decide_batch(DirectPolicy("b"), _x([9.0, -9.0, 0.0], [-1.0, 1.0, 0.0]))
    assert [v.score for v in d.verdicts] == [-1.0, 1.0, 0.0]  # b's raw score, S unused
    assert _labels(d) == ["SAFE", "UNSAFE", "UNSAFE"]


def _hand_conformal() -> None:
    # α = 0.2, n = 9 unsafe calibration scores 1..9: k = ⌊0.2·10⌋ = 2, cut u(2) = 2
    fit = conformal_cut(np.arange(9.0, 0.0, -1.0), alpha=0.2)
    assert (fit.marginal.k, fit.marginal.threshold) == (2, 2.0)
    pol = ConformalPolicy(alpha=0.2, n=9, k=2, threshold=2.0)
    # S of (4, 2) = (2 + 1)/2 = 1.5; (4, 3) = (2 + 2)/2 = 2.0; (8, 1) = (4 + 0)/2 = 2.0
    d = decide_batch(pol, _x([4.0, 4.0, 8.0], [2.0, 3.0, 1.0]))
    assert [v.score for v in d.verdicts] == [1.5, 2.0, 2.0]
    assert _labels(d) == ["SAFE", "UNSAFE", "UNSAFE"]


def _hand_batch() -> None:
    # The paper's rule on 4 scenes: a = (0, 2, 4, 10), b = (1, 1, 3, 3).
    # a: median 3, percentiles (linear) 25 % = 1.5, 75 % = 5.5 → IQR 4
    # b: median 2, 25 % = 1, 75 % = 3 → IQR 2
    # S_B = ((a − 3)/4 + (b − 2)/2)/2 = (−0.625, −0.375, 0.375, 1.125); mean 0.125
    d = decide_batch(
        BatchPolicy(FrozenPolicy(99.0)), _x([0.0, 2.0, 4.0, 10.0], [1.0, 1.0, 3.0, 3.0])
    )
    np.testing.assert_allclose([v.score for v in d.verdicts], [-0.625, -0.375, 0.375, 1.125])
    np.testing.assert_allclose([v.threshold for v in d.verdicts], [0.125] * 4)
    assert _labels(d) == ["SAFE", "SAFE", "UNSAFE", "UNSAFE"]
    # reliance weights: text scores = scene scores for a (ρ = 1 → floor 0.05), unrelated for b
    text = {"a": [0.0, 2.0, 4.0, 10.0], "b": [5.0, 5.0, 5.0, 5.0]}  # b's text constant → ρ = 0
    d = decide_batch(
        BatchPolicy(FrozenPolicy(99.0), weights="reliance"),
        _x([0.0, 2.0, 4.0, 10.0], [1.0, 1.0, 3.0, 3.0], text=text),
    )
    # S_B = (0.05 (a − 3)/4 + 1 (b − 2)/2)/1.05
    want = (0.05 * (np.array([0, 2, 4, 10.0]) - 3) / 4 + (np.array([1, 1, 3, 3.0]) - 2) / 2) / 1.05
    np.testing.assert_allclose([v.score for v in d.verdicts], want)
    np.testing.assert_allclose(d.verdicts[0].threshold, want.mean())
    assert "reliance weights a 0.05, b 1" in d.verdicts[0].detail


def _hand_batch_frozen_iqr() -> None:
    # S under the frozen fusion: (0, 0.5, 2, 3.5); threshold = mean = 1.5
    d = decide_batch(
        BatchFrozenIqrPolicy(FrozenPolicy(99.0)), _x([0.0, 2.0, 4.0, 10.0], [1.0, 1.0, 3.0, 3.0])
    )
    assert [v.score for v in d.verdicts] == [0.0, 0.5, 2.0, 3.5]
    assert all(v.threshold == 1.5 for v in d.verdicts)
    assert _labels(d) == ["SAFE", "SAFE", "UNSAFE", "UNSAFE"]


def _hand_situation() -> None:
    # window 3, min_refs 2, fallback t0 = 10; scenes of "k" with S = 1, 2, 3, 4, 5
    pol = SituationPolicy(window=3, min_refs=2, fallback=FrozenPolicy(10.0))
    a = [2.0 * s for s in (1.0, 2.0, 3.0, 4.0, 5.0)]  # S = (a/2 + (b − 1))/2 with b = 1 + S
    b = [1.0 + s for s in (1.0, 2.0, 3.0, 4.0, 5.0)]
    state = None
    verdicts = []
    for i in range(5):  # one check per scene
        d = decide_batch(pol, _x([a[i]], [b[i]], ["k"]), state)
        state = d.state
        verdicts += d.verdicts
    assert [v.score for v in verdicts] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [v.policy for v in verdicts] == ["situation->frozen"] * 2 + ["situation"] * 3
    assert [v.threshold for v in verdicts] == [10.0, 10.0, 1.5, 2.0, 3.0]  # (2+3+4)/3 at the end
    assert state.references("k") == (3.0, 4.0, 5.0)
    assert _labels(replay(pol, _x(a, b, ["k"] * 5))) == [v.label for v in verdicts]


def _hand_cascade() -> None:
    # first a (median 0, IQR 2: z1 = a/2), cut frozen 0.5, band 1: the pair scores a scene
    # only when |z1 − 0.5| ≤ 1, i.e. −0.5 ≤ z1 ≤ 1.5; S = (a/2 + (b − 1))/2
    pol = CascadePolicy(first="a", share=0.5, band=1.0, cut=FrozenPolicy(0.5))
    nan = math.nan
    a = [4.0, -2.0, 1.0, 2.0, 0.0, 3.0]
    # z1 = 2 (out: a alone, UNSAFE), −1 (out: SAFE), 0.5 (in: S = 0.25, SAFE),
    # 1 (in: S = (1 + 1)/2 = 1, UNSAFE), 0 (in, but no pair score: NaN, fail closed),
    # 1.5 (on the band's edge: in; S = (1.5 − 1)/2 = 0.25, SAFE)
    b = [nan, nan, 1.0, 2.0, nan, 0.0]
    np.testing.assert_array_equal(
        pol.second_needed(FUSION, np.array(a), [None] * 6, None),
        [False, False, True, True, True, True],
    )
    d = decide_batch(pol, _x(a, b))
    np.testing.assert_allclose([v.score for v in d.verdicts], [2.0, -1.0, 0.25, 1.0, nan, 0.25])
    assert _labels(d) == ["UNSAFE", "SAFE", "SAFE", "UNSAFE", "UNSAFE", "SAFE"]
    assert [v.policy for v in d.verdicts][:3] == [
        "cascade[a]->frozen",
        "cascade[a]->frozen",
        "cascade[pair]->frozen",
    ]
    assert "not finite" in d.verdicts[4].detail
    # the deciding kind is the cut's, whichever stage decided
    assert [v.kind for v in d.verdicts] == ["frozen"] * 6
    # with a situation cut the references are the cascade's own scores C
    sit = CascadePolicy(
        first="a",
        share=0.5,
        band=1.0,
        cut=SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(0.5)),
    )
    d = decide_batch(sit, _x([4.0, -2.0, 1.0], [nan, nan, 1.0], ["k", "k", "k"]))
    # scene 1: fallback 0.5 (z1 = 2: out); scene 2: mean(2) = 2, |−1 − 2| = 3 > 1: out,
    # SAFE; scene 3: pre-cut mean(2, −1) = 0.5, z1 = 0.5: in, S = 0.25 < 0.5: SAFE
    assert [v.threshold for v in d.verdicts] == [0.5, 2.0, 0.5]
    assert _labels(d) == ["UNSAFE", "SAFE", "SAFE"]
    assert d.state.references("k") == (2.0, -1.0, 0.25)


_HAND_EXAMPLES: dict[str, Callable[[], None]] = {
    "frozen": _hand_frozen,
    "direct": _hand_direct,
    "conformal": _hand_conformal,
    "batch": _hand_batch,
    "batch_frozen_iqr": _hand_batch_frozen_iqr,
    "situation": _hand_situation,
    "cascade": _hand_cascade,
}


def test_every_registered_kind_has_a_hand_computed_example() -> None:
    assert set(_HAND_EXAMPLES) == set(POLICY_KINDS), "add a hand example for each new kind"
    for kind in POLICY_KINDS:
        assert policy_class(kind).kind == kind


@pytest.mark.parametrize("kind", list(_HAND_EXAMPLES))
def test_hand_computed_example(kind: str) -> None:
    _HAND_EXAMPLES[kind]()


def test_registry_filters() -> None:
    assert policy_kinds(single_scene=True) == ("direct", "frozen", "conformal")
    assert "conformal" not in policy_kinds(label_free=True)
    with pytest.raises(PolicyError, match="policy kind must be one of"):
        policy_class("cascades")
    assert "cascade" not in policy_kinds(single_scene=True)  # never a fallback


# ---------------------------------------------------------------------- batch: the paper's rule


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-5, 5), min_size=6, max_size=12, unique=True),
    st.floats(0.1, 10), st.floats(-5, 5), st.floats(0.1, 10), st.floats(-5, 5),
)  # fmt: skip
def test_the_paper_batch_rule_ignores_each_members_scale_and_offset(
    s: list[float], ka: float, ca: float, kb: float, cb: float
) -> None:
    """Medians and IQRs are refitted on the batch, so a member's affine change moves nothing."""
    a = np.array(s)
    b = np.roll(a, 2) * 0.7 + np.sin(a)
    pol = BatchPolicy(FrozenPolicy(0.0))
    base = decide_batch(pol, _x(list(a), list(b)))
    moved = decide_batch(pol, _x(list(ka * a + ca), list(kb * b + cb)))
    if base.verdicts[0].policy == "batch" and moved.verdicts[0].policy == "batch":
        np.testing.assert_allclose(
            [v.score - v.threshold for v in base.verdicts],
            [v.score - v.threshold for v in moved.verdicts],
            atol=1e-9,
        )


def test_the_frozen_iqr_variant_differs_when_the_batch_spread_moves() -> None:
    """With batches whose spread differs from the pool, the frozen-IQR
    variant labels some scenes differently from the paper's rule."""
    rng = np.random.default_rng(20261130)
    paper, frozen = BatchPolicy(FrozenPolicy(0.0)), BatchFrozenIqrPolicy(FrozenPolicy(0.0))
    differ = total = 0
    for _ in range(300):
        y = rng.integers(0, 2, 20)  # both members carry the label, with their own noise
        a = rng.normal(0, 6.0, 20) + y  # a varies 4x more than the pool's IQR of 2 says
        b = rng.normal(1, 1.0, 20) + y
        x = _x(list(a), list(b))
        differ += int((decide_batch(paper, x).unsafe != decide_batch(frozen, x).unsafe).sum())
        total += 20
    assert 0.05 < differ / total < 0.5  # 12.5 % with this seed


def test_frozen_fit_pool_is_the_one_frozen_rule() -> None:
    """t0 = the mean fused score of the pool under Avg2Fusion.fit; small pools are refused."""
    rng = np.random.default_rng(5)
    pool = {"a": rng.normal(0, 1, 40), "b": rng.normal(1, 3, 40)}
    fusion, pol = FrozenPolicy.fit_pool(pool, weights={"a": 2.0, "b": 1.0})
    want = Avg2Fusion.fit(pool, weights={"a": 2.0, "b": 1.0})
    assert fusion == want
    # the smallest float at or above the exact mean (a scene at the mean is a tie: UNSAFE)
    fused = want.fuse_many(pool).tolist()
    exact = sum(map(Fraction, fused), Fraction(0)) / len(fused)
    assert Fraction(pol.threshold) >= exact > Fraction(np.nextafter(pol.threshold, -np.inf))
    assert pol.threshold == pytest.approx(float(np.mean(fused)))
    small = {m: x[:7] for m, x in pool.items()}
    with pytest.raises(ConfigError, match=r"the unlabelled pool has 7 scenes; at least 8 are"):
        FrozenPolicy.fit_pool(small)
    assert FrozenPolicy.fit_pool(small, min_n=7)[1].threshold == pytest.approx(
        float(np.mean(Avg2Fusion.fit(small).fuse_many(small)))
    )
    with pytest.raises(PolicyError, match="at least one member"):
        FrozenPolicy.fit_pool({})
    with pytest.raises(PolicyError, match="one length per member"):
        FrozenPolicy.fit_pool({"a": np.zeros(9), "b": np.zeros(10)})
    with pytest.raises(PolicyError, match="member 'b' hold non-finite"):
        FrozenPolicy.fit_pool({"a": np.arange(9.0), "b": np.r_[np.arange(8.0), np.nan]})
    # a given fusion is kept, t0 alone is fitted (recalibrate without refitting the fusion)
    other = {m: x + 5.0 for m, x in pool.items()}
    kept, moved = FrozenPolicy.fit_pool(other, fusion=want)
    assert kept is want
    assert moved.threshold == pytest.approx(float(np.mean(want.fuse_many(other))))
    with pytest.raises(PolicyError, match="a given fusion keeps its own"):
        FrozenPolicy.fit_pool(other, fusion=want, weights={"a": 1.0, "b": 1.0})


def test_batch_nan_is_unsafe_left_out_and_small_batches_fall_back() -> None:
    d = decide_batch(
        BatchPolicy(FrozenPolicy(0.0)), _x([0.0, 2.0, math.nan, 10.0], [1.0, 1.0, 3.0, 3.0])
    )
    assert d.verdicts[2].label == "UNSAFE" and "not finite" in d.verdicts[2].detail
    assert "3 scored scenes" in d.verdicts[0].detail
    small = decide_batch(BatchPolicy(FrozenPolicy(0.25), min_batch=3), _x([0.0, 2.0], [1.0, 1.0]))
    assert [v.policy for v in small.verdicts] == ["batch->frozen"] * 2
    assert _labels(small) == ["SAFE", "UNSAFE"] and "min_batch 3" in small.verdicts[0].detail
    flat = decide_batch(BatchPolicy(FrozenPolicy(0.25)), _x([0.0, 2.0, 4.0], [1.0, 1.0, 1.0]))
    assert "IQR 0" in flat.verdicts[0].detail and flat.verdicts[0].policy == "batch->frozen"
    with pytest.raises(PolicyError, match="min_batch"):
        BatchPolicy(FrozenPolicy(0.0), min_batch=1)
    with pytest.raises(PolicyError, match="labels one scene on its own"):
        BatchPolicy(BatchPolicy(FrozenPolicy(0.0)))  # type: ignore[arg-type]


def test_a_scene_missing_a_member_score_is_never_safe_whatever_the_kind() -> None:
    # direct reads member a only, but a scene member b failed on is missing a part: UNSAFE
    x = _x([-3.0, -3.0], [math.nan, 0.0])
    for pol in (
        DirectPolicy("a"),
        SituationPolicy(window=4, min_refs=1, fallback=DirectPolicy("a")),
        FrozenPolicy(1e9),
    ):
        d = decide_batch(pol, x, None)
        v = d.verdicts[0]
        assert v.label == "UNSAFE" and v.fail_closed, (pol.kind, v)
        assert "missing or not finite" in v.detail or "not finite" in v.detail
        assert d.verdicts[1].label == "SAFE" and not d.verdicts[1].fail_closed, pol.kind
    # a cascade needs the second member only inside its band
    cas = CascadePolicy(first="a", share=0.5, band=1.0, cut=FrozenPolicy(0.0))
    out = decide_batch(cas, _x([-10.0, -10.0, 0.5], [math.nan, -10.0, math.nan]))
    assert [v.label for v in out.verdicts] == ["SAFE", "SAFE", "UNSAFE"]
    assert not out.verdicts[0].fail_closed and out.verdicts[2].fail_closed


def test_entered_scores_blanks_what_the_guard_gave_its_policy_as_missing() -> None:
    got = entered_scores({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]}, [0.1, math.nan, -0.2])
    assert np.isnan(got["a"][1]) and np.isnan(got["b"][1])
    assert got["a"][[0, 2]].tolist() == [1.0, 3.0] and got["b"][[0, 2]].tolist() == [4.0, 6.0]
    with pytest.raises(DecisionError, match="policy_score has 2"):
        entered_scores({"a": [1.0, 2.0, 3.0]}, [0.0, 0.0])


def test_decide_batch_checks_inputs() -> None:
    with pytest.raises(DecisionError, match="situation_ids"):
        _x([0.0, 1.0], [0.0, 1.0], ["a"])
    with pytest.raises(DecisionError, match="1-D"):
        batch_inputs(FUSION, {"a": [[0.0]], "b": [[0.0]]})
    with pytest.raises(DecisionError, match="shape"):
        batch_inputs(FUSION, {"a": [0.0], "b": [1.0, 2.0]})
    with pytest.raises(DecisionError, match="fusion member"):
        batch_inputs(FUSION, {"a": [0.0]})


# ---------------------------------------------------------------------- situation state


def test_situation_state_is_a_value_the_policy_never_mutates() -> None:
    pol = SituationPolicy(window=2, min_refs=1, fallback=FrozenPolicy(0.0))
    s0 = pol.initial_state(SituationWindows(2, {"k": (1.0, 2.0, 3.0)}))
    assert s0.references("k") == (2.0, 3.0)  # the seed is cut to the window
    d = decide_batch(pol, _x([2.0, 2.0], [1.0, 1.0], ["k", None]), s0)
    assert s0.references("k") == (2.0, 3.0)  # unchanged
    assert d.state.references("k") == (3.0, 0.5)
    with pytest.raises(FrozenInstanceError):
        s0.window = 3  # type: ignore[misc]


def test_situation_nan_is_not_stored_and_batches_run_in_order() -> None:
    pol = SituationPolicy(window=5, min_refs=1, fallback=FrozenPolicy(10.0))
    d = decide_batch(pol, _x([2.0, math.nan, 6.0], [1.0, 1.0, 1.0], ["s", "s", "s"]))
    assert d.verdicts[0].policy == "situation->frozen"
    assert d.verdicts[1].label == "UNSAFE" and d.verdicts[1].threshold == 0.5
    assert d.verdicts[2].threshold == 0.5  # NaN did not join the window
    assert d.state.references("s") == (0.5, 1.5)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.sampled_from(["a", "b", None])), min_size=1, max_size=25),
       st.integers(1, 5))  # fmt: skip
def test_replay_in_batches_equals_one_check_at_a_time(items: list[Any], chunk: int) -> None:
    pol = SituationPolicy(window=3, min_refs=2, fallback=FrozenPolicy(0.3))
    a = [2 * s for s, _ in items]
    b = [1.0 + 0.0 * s for s, _ in items]
    sids = [sid for _, sid in items]
    one_by_one = replay(pol, _x(a, b, sids))
    batched = replay(pol, _x(a, b, sids), batch_ids=[i // chunk for i in range(len(items))])
    assert _labels(one_by_one) == _labels(batched)  # in-batch order = one check at a time
    assert one_by_one.state == batched.state


# ---------------------------------------------------------------------- policy.yaml


def _doc(policy: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "version": 2,
        "bundle_id": "tiny-pair-0001",
        "prompt_hash": "sha256:abc123",
        "created": "2026-05-01T12:00:00+00:00",
        "fusion": {
            "method": "avg2",
            "members": ["qwen", "lfm"],
            "stats": {"qwen": {"median": -1.0, "iqr": 2.0}, "lfm": {"median": 0.5, "iqr": 1.0}},
            "weights": {"qwen": 1.0, "lfm": 1.0},
        },
        "policy": policy or {"kind": "frozen", "threshold": 0.25},
        "fitted_on": {"dataset": "dev-pool", "n": 400},
    }


_CASCADE: dict[str, Any] = {
    "kind": "cascade",
    "first": "qwen",
    "share": 0.9,
    "band": 1.25,
    "cut": {"kind": "frozen", "threshold": 0.25},
}

_KINDS = [
    _CASCADE,
    {
        **_CASCADE,
        "centre": -0.25,
        "cut": {"kind": "conformal", "alpha": 0.1, "n": 19, "k": 2, "threshold": -0.3},
    },
    {
        **_CASCADE,
        "cut": {
            "kind": "situation",
            "window": 6,
            "min_refs": 3,
            "fallback": {"kind": "frozen", "threshold": 0.0},
        },
    },
    {"kind": "direct", "member": "lfm"},
    {"kind": "frozen", "threshold": 0.25},
    {"kind": "conformal", "alpha": 0.1, "n": 19, "k": 2, "threshold": -0.3},
    {"kind": "conformal", "alpha": 0.1, "n": 29, "k": 1, "threshold": -0.3, "delta": 0.1},
    {
        "kind": "batch",
        "min_batch": 4,
        "weights": "reliance",
        "fallback": {"kind": "frozen", "threshold": 0.0},
    },
    {"kind": "batch_frozen_iqr", "min_batch": 2, "fallback": {"kind": "direct", "member": "qwen"}},
    {
        "kind": "situation",
        "window": 6,
        "min_refs": 3,
        "fallback": {"kind": "conformal", "alpha": 0.1, "n": 9, "k": 1, "threshold": 0.0},
    },
]


@pytest.mark.parametrize("policy", _KINDS, ids=[p["kind"] for p in _KINDS])
def test_load_dump_round_trip(tmp_path: Path, policy: dict[str, Any]) -> None:
    src = tmp_path / "policy.yaml"
    doc = _doc(policy)
    situational = policy["kind"] == "situation" or policy.get("cut", {}).get("kind") == "situation"
    if situational:
        doc["state_seed"] = {"situations": {"hall": [0.5, -0.25]}}
    src.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = load_policy(src)
    assert cfg.policy.to_dict() == policy
    out = tmp_path / "out" / "policy.yaml"
    dump_policy(cfg, out)
    assert yaml.safe_load(out.read_text()) == {**doc, "fitted_on": doc["fitted_on"]}
    again = load_policy(out)
    assert again.to_dict() == cfg.to_dict() and again.digest == cfg.digest
    assert again.version_id == cfg.version_id and cfg.version_id.startswith("adhoc+")
    if situational:
        assert cfg.initial_state().references("hall") == (0.5, -0.25)
    assert not list(tmp_path.glob("*.json"))  # loading reads the file only


def test_version_id_and_fusion_key_identify_what_decided() -> None:
    a = load_policy(_doc())
    b = load_policy({**_doc(), "fitted_on": {"version": 2}})
    c = load_policy(
        {**_doc(), "fusion": {**_doc()["fusion"], "weights": {"qwen": 2.0, "lfm": 1.0}}}
    )
    assert b.version_id.startswith("v0002+") and a.version_id != b.version_id
    assert a.fusion_key == b.fusion_key != c.fusion_key and len(a.fusion_key) == 16


def test_check_policy_matches() -> None:
    cfg = load_policy(_doc())
    check_policy_matches(cfg, "tiny-pair-0001", "sha256:abc123")
    with pytest.raises(PolicyError, match=r"'tiny-pair-0001'.*'other-bundle'"):
        check_policy_matches(cfg, "other-bundle", "sha256:abc123")
    with pytest.raises(PolicyError, match=r"'sha256:abc123'.*'sha256:fff'"):
        check_policy_matches(cfg, "tiny-pair-0001", "sha256:fff")


def _with(path: str, value: Any) -> dict[str, Any]:
    """_doc() with the value at a dotted path set (or removed when value is _DROP)."""
    d = copy.deepcopy(_doc())
    *parents, last = path.split(".")
    node: Any = d
    for p in parents:
        node = node[p]
    if value is _DROP:
        del node[last]
    else:
        node[last] = value
    return d


_DROP = object()
_SIT = {
    "kind": "situation",
    "window": 3,
    "min_refs": 2,
    "fallback": {"kind": "frozen", "threshold": 0},
}

# (bad document, text the message must contain: the key path and what is wrong)
_BAD: list[tuple[dict[str, Any], str]] = [
    (_with("version", 1), "version must be 2; got 1"),
    (_with("version", _DROP), "version is required"),
    (_with("bundle_id", ""), "bundle_id must be a non-empty string"),
    (_with("prompt_hash", 7), "prompt_hash must be a non-empty string; got 7"),
    (_with("created", "yesterday"), "created must be an ISO 8601 time"),
    (_with("created", "2026-05-01T12:00:00"), "created must be an ISO 8601 time with a UTC offset"),
    (_with("fitted_on", [1]), "fitted_on must be a mapping"),
    (_with("polcy", {}), "polcy is not a known key. Did you mean 'policy'?"),
    (_with("fusion.members", []), "fusion.members must be a non-empty list"),
    (_with("fusion.members", ["qwen", "qwen"]), "fusion.members must not repeat"),
    (_with("fusion.method", "avg3"), "fusion.method must be 'avg2'; got 'avg3'"),
    (_with("fusion.stats.qwen.iqr", 0), "fusion.stats.qwen.iqr must be a finite number > 0; got 0"),
    (_with("fusion.stats.lfm.median", math.nan), "fusion.stats.lfm.median must be a finite"),
    (_with("fusion.stats.lfm", {"median": 0.0}), "fusion.stats.lfm.iqr is required"),
    (
        _with("fusion.stats.qwen.iqrr", 1.0),
        "fusion.stats.qwen.iqrr is not a known key. Did you mean 'iqr'?",
    ),
    (_with("fusion.weights.lfm", -1.0), "fusion.weights.lfm must be a finite number > 0"),
    (_with("fusion.weights", {"qwen": 1.0}), "fusion.weights.lfm is required"),
    (
        _with("policy", {"kind": "situaton"}),
        "policy.kind must name a policy kind, one of direct, frozen, conformal, batch, batch_frozen_iqr, situation, cascade; got 'situaton'. Did you mean 'situation'?",
    ),
    (_with("policy", {"kind": "frozen"}), "policy.threshold is required"),
    (
        _with("policy", {**_CASCADE, "first": "gpt"}),
        "policy.first must name a fusion member, one of ['qwen', 'lfm']; got 'gpt'",
    ),
    (_with("policy", {**_CASCADE, "share": 0.0}), "policy.share must be in (0, 1]; got 0.0"),
    (_with("policy", {**_CASCADE, "band": -1.0}), "policy.band must be ≥ 0; got -1.0"),
    (
        _with("policy", {**_CASCADE, "cut": {"kind": "batch"}}),
        "policy.cut.kind must be one of frozen, conformal, situation; got 'batch'",
    ),
    (
        _with("policy", {**_CASCADE, "cut": {"kind": "frozen"}}),
        "policy.cut.threshold is required",
    ),
    (
        _with(
            "policy",
            {**_CASCADE, "cut": {**_SIT, "fallback": {"kind": "direct", "member": "lfm"}}},
        ),
        "policy.cut must decide on the cascade's score C; its situation cut reads the raw "
        "score of member(s) ['lfm'] (a direct fallback)",
    ),
    (
        _with("policy", {"kind": "frozen", "threshold": math.inf}),
        "policy.threshold must be a finite number",
    ),
    (
        _with("policy", {"kind": "frozen", "threshold": 0, "treshold": 1}),
        "policy.treshold is not a known key. Did you mean 'threshold'?",
    ),
    (
        _with("policy", {"kind": "direct", "member": "qwne"}),
        "policy.member must be one of the fusion members ['qwen', 'lfm']; got 'qwne'. Did you mean 'qwen'?",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 1.5, "n": 19, "k": 2, "threshold": 0}),
        "policy.alpha must be in (0, 1); got 1.5",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 5, "k": 0, "threshold": 0}),
        "policy.n: 5 unsafe calibration case(s) are too few",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 19, "k": 3, "threshold": 0}),
        "policy.k must be floor(alpha*(n+1)) = 2",
    ),
    (
        _with("policy", {"kind": "conformal", "alpha": 0.1, "n": 19.0, "k": 2, "threshold": 0}),
        "policy.n must be an integer ≥ 1; got 19.0",
    ),
    (
        _with(
            "policy",
            {"kind": "batch", "fallback": {"kind": "frozen", "threshold": 0}, "min_batch": 1},
        ),
        "policy.min_batch must be an integer ≥ 2; got 1",
    ),
    (_with("policy", {"kind": "batch"}), "policy.fallback is required"),
    (
        _with("policy", {"kind": "batch", "fallback": {"kind": "batch", "fallback": {}}}),
        "policy.fallback.kind must name a fallback kind, one of direct, frozen, conformal; got 'batch'",
    ),
    (_with("policy", {**_SIT, "window": 0}), "policy.window must be an integer ≥ 1; got 0"),
    (
        _with("policy", {**_SIT, "min_refs": 4}),
        "policy.min_refs must be an integer in [1, 3]; got 4",
    ),
    (_with("policy", {**_SIT, "window": True}), "policy.window must be an integer ≥ 1; got True"),
    (
        _with("policy", {**_SIT, "state_file": "s.json"}),
        "policy.state_file is not a known key",
    ),
    (
        _with(
            "policy",
            {
                "kind": "batch",
                "weights": "reliable",
                "fallback": {"kind": "frozen", "threshold": 0},
            },
        ),
        "policy.weights must be one of equal, reliance; got 'reliable'. Did you mean 'reliance'?",
    ),
    (_with("state_seed", {"situations": {"a": [1.0]}}), "state_seed is only for stateful policies"),
    (
        {**_with("policy", _SIT), "state_seed": {"situations": {"a": [1.0, "x"]}}},
        "state_seed.situations['a'] must be a list of finite numbers",
    ),
    (
        {**_with("policy", _SIT), "state_seed": {"windows": {}}},
        "state_seed must be a mapping with one key, situations",
    ),
    (
        _with("policy", {**_SIT, "fallback": {"kind": "frozen", "threshold": "x"}}),
        "policy.fallback.threshold must be a finite number; got 'x'",
    ),
    (
        _with("policy", {**_SIT, "fallback": {"kind": "direct", "member": "x"}}),
        "policy.fallback.member must be one of the fusion members",
    ),
    (
        _with("policy", {**_SIT, "windows": 3}),
        "policy.windows is not a known key. Did you mean 'window'?",
    ),
]


def test_every_validation_message_names_the_key() -> None:
    for doc, expected in _BAD:
        with pytest.raises(PolicyError) as info:
            load_policy(doc, where="policy.yaml")
        msg = str(info.value)
        assert expected in msg, (expected, msg)
        assert "policy.yaml" in msg, msg  # says where to fix it
        assert isinstance(info.value, ConfigError | ValueError)


def test_yaml_file_errors(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("version: 2\nversion: 2\n")
    with pytest.raises(PolicyError, match=r"version appears twice \(line 2\)"):
        load_policy(p)
    p.write_text("version: [1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(p)
    p.write_text("- a list\n")
    with pytest.raises(PolicyError, match="must be a mapping"):
        load_policy(p)
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------- cascade


def test_a_policy_returns_a_scoring_plan_the_guard_runs() -> None:
    """Most kinds: every member on every scene, one stage. A cascade: its first member on
    every scene, then the rest only where its own band rule says (the same mask as
    ``second_needed``); the plan holds no copy of the band."""
    plan = FrozenPolicy(0.5).scoring_plan(("a", "b"), FUSION, [None] * 3, None)
    assert [s.members for s in plan.stages] == [("a", "b")] and not plan.staged
    pol = CascadePolicy(first="b", share=0.5, band=1.0, cut=FrozenPolicy(0.5))
    plan = pol.scoring_plan(("a", "b"), FUSION, [None] * 6, None)
    assert [s.members for s in plan.stages] == [("b",), ("a",)] and plan.staged
    assert plan.members == ("b", "a") and plan.stages[0].where is None
    b = np.array([1.0, 3.0, -4.0, math.nan, 2.5, 0.0])
    where = plan.stages[1].where
    assert where is not None
    np.testing.assert_array_equal(where({"b": b}), pol.second_needed(FUSION, b, [None] * 6, None))
    plan.check(("a", "b"))
    with pytest.raises(PolicyError, match=r"names member\(s\) \['c'\] the guard does not have"):
        ScoringPlan((ScoringStage(("c",)),)).check(("a", "b"))
    with pytest.raises(PolicyError, match="more than one stage"):
        ScoringPlan((ScoringStage(("a",)), ScoringStage(("a", "b"), where=lambda s: s)))
    with pytest.raises(PolicyError, match="first stage scores every scene"):
        ScoringPlan((ScoringStage(("a",), where=lambda s: s),))
    with pytest.raises(PolicyError, match="one or more member names"):
        ScoringStage(())


def test_cascade_band_sends_the_chosen_share_of_the_pool() -> None:
    assert cascade_band(np.array([0.1, 0.5, 0.2, 2.0]), 0.5) == 0.2  # 2 of 4 inside (≤)
    assert cascade_band(np.array([0.1, 0.5, 0.2, 2.0]), 1.0) == 2.0
    rng = np.random.default_rng(13)
    for q in (0.1, 0.25, 0.5, 0.9):
        z = rng.normal(0.0, 1.5, 997)
        pol = CascadePolicy(first="a", share=q, band=0.0, cut=FrozenPolicy(0.3))
        band = cascade_band(np.abs(z - 0.3), q)
        inside = CascadePolicy(first="a", share=q, band=band, cut=FrozenPolicy(0.3)).second_needed(
            FUSION, 2.0 * z, [None] * z.size, None
        )  # a = 2 z: z1 = a / IQR 2 = z
        assert inside.sum() == math.ceil(q * z.size), q
        assert pol.scoring_plan(("a", "b"), FUSION, [None], None).members == ("a", "b")
    with pytest.raises(PolicyError, match="share must be in"):
        cascade_band(np.array([1.0]), 0.0)


def test_cascade_never_decides_safe_without_the_pair_inside_the_band() -> None:
    """Property: whatever the scores, a scene inside the band is SAFE only with a finite pair
    score below the cut, and a scene without a first score is UNSAFE."""
    rng = np.random.default_rng(5)
    pol = CascadePolicy(first="a", share=0.5, band=0.7, cut=FrozenPolicy(0.2))
    for _ in range(200):
        a = rng.normal(0, 2, 12)
        b = rng.normal(1, 1, 12)
        a[rng.random(12) < 0.1] = math.nan
        b[rng.random(12) < 0.3] = math.nan
        inside = pol.second_needed(FUSION, a, [None] * 12, None)
        d = decide_batch(pol, _x(list(a), list(b)))
        for i, v in enumerate(d.verdicts):
            if v.label == "SAFE":
                assert math.isfinite(a[i])
                assert not inside[i] or math.isfinite(b[i])


def test_cascade_fit_sets_the_band_for_the_share_and_composes_with_each_cut() -> None:
    from spotstop.guard.policies import FitContext

    rng = np.random.default_rng(8)
    n = 400
    y = rng.integers(0, 2, n)
    a = rng.normal(0, 2, n) + 2 * y
    b = rng.normal(1, 1, n) + y
    x = _x(list(a), list(b))
    sids = np.array([f"s{i % 40}" for i in range(n)], dtype=object)
    for cut, extra in (("frozen", {}), ("conformal", {"alpha": 0.2}), ("situation", {})):
        ctx = FitContext(
            fusion=FUSION,
            frozen_t0=float(np.mean(x.fused)),
            fused=x.fused,
            label=y,
            situation_id=sids,
            member_scores={"a": a, "b": b},
            member_text=None,
            settings={"share": 0.25, "cut": cut, "first": "a", **extra},
            current=None,
            rng=np.random.default_rng(0),
        )
        pol = CascadePolicy.fit(ctx)
        assert pol.cut.kind == cut and pol.share == 0.25 and pol.first == "a"
        if cut == "frozen":
            inside = pol.second_needed(FUSION, a, [None] * n, None)
            assert inside.sum() == math.ceil(0.25 * n)
            assert pol.cut.threshold == pytest.approx(float(np.mean(x.fused)))  # type: ignore[attr-defined]


def test_a_cascades_conformal_cut_keeps_its_miss_rate_on_the_cascades_own_score() -> None:
    """The cut is fitted on the score the guard compares (C: z1 outside the band), so the
    miss rate on new unsafe scenes stays at alpha even at a small share (it was 15 % for
    alpha 10 % when the cut was fitted on the pair's S)."""
    from spotstop.guard.policies import FitContext

    fusion = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 1.0), "b": MemberStats(0.0, 1.0)})
    rng = np.random.default_rng(2026)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        y = rng.integers(0, 2, n)
        return y, (y - 0.5) + rng.normal(0, 1.5, n), (y - 0.5) + rng.normal(0, 0.3, n)

    y, a, b = draw(4000)
    x = batch_inputs(fusion, {"a": a, "b": b})
    ctx = FitContext(
        fusion=fusion,
        frozen_t0=float(np.mean(x.fused)),
        fused=x.fused,
        label=y,
        situation_id=np.array([f"s{i}" for i in range(y.size)], dtype=object),
        member_scores={"a": a, "b": b},
        member_text=None,
        settings={"share": 0.3, "cut": "conformal", "first": "a", "alpha": 0.1,
                  "guarantee": "marginal"},
        current=None,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    pol = CascadePolicy.fit(ctx)
    assert pol.cut.kind == "conformal"
    y2, a2, b2 = draw(20000)
    inside = pol.second_needed(fusion, a2, [None] * y2.size, None)
    b2 = np.where(inside, b2, math.nan)  # the guard runs the second member only inside
    d = decide_batch(pol, batch_inputs(fusion, {"a": a2, "b": b2}))
    miss = float(np.mean(~d.unsafe[y2 == 1]))
    assert miss <= 0.1 + 0.012, miss  # ≈ 3 standard errors over alpha at n ≈ 10,000
    assert abs(float(np.mean(pol.second_needed(fusion, a, [None] * y.size, None))) - 0.3) < 0.01


def test_a_cascade_reads_the_band_its_plan_chose_when_the_batch_says_which_members_ran() -> None:
    from spotstop.guard.policies import logged_ran

    pol = CascadePolicy(first="a", share=0.5, band=1.0, cut=FrozenPolicy(0.5))
    # z1 = 2, 0.5: by the band, out and in; the plan ran b on the first and not the second
    x = batch_inputs(
        FUSION, {"a": [4.0, 1.0], "b": [3.0, math.nan]}, ran={"a": [1, 1], "b": [1, 0]}
    )
    d = decide_batch(pol, x)
    assert [v.policy for v in d.verdicts] == ["cascade[pair]->frozen", "cascade[a]->frozen"]
    np.testing.assert_allclose([v.score for v in d.verdicts], [2.0, 0.5])  # S = (2 + 2)/2; z1
    assert x.subset(np.array([1])).ran == {"a": np.array([True]), "b": np.array([False])}
    # not known: the band is worked out again (the second scene is then inside, without S)
    d2 = decide_batch(pol, batch_inputs(FUSION, {"a": [4.0, 1.0], "b": [3.0, math.nan]}))
    assert d2.verdicts[0].policy == "cascade[a]->frozen" and d2.verdicts[1].fail_closed
    with pytest.raises(DecisionError, match=r"ran\['b'\] must hold one bool per scene"):
        batch_inputs(FUSION, {"a": [1.0], "b": [1.0]}, ran={"b": [1, 0]})
    # -1: not known for that scene (another policy decided it): worked out there alone
    x3 = batch_inputs(
        FUSION, {"a": [1.0, 4.0], "b": [math.nan, 3.0]}, ran={"a": [1, -1], "b": [0, -1]}
    )
    d3 = decide_batch(pol, x3)  # z1 0.5 (in the band, but b did not run), 2 (out of it)
    assert [v.policy for v in d3.verdicts] == ["cascade[a]->frozen", "cascade[a]->frozen"]
    np.testing.assert_allclose([v.score for v in d3.verdicts], [0.5, 2.0])
    assert x3.ran is not None and x3.ran["b"].tolist() == [0, -1]
    # the log's members_run: -1 (not logged) where a row does not say; None without a column
    run = {"a": np.array([1, 1, 1], np.int8), "b": np.array([1, 0, -1], np.int8)}
    assert logged_ran(run, ["a", "b"], np.array([0, 1]))["b"].tolist() == [1, 0]
    assert logged_ran(run, ["a", "b"], np.array([1, 2]))["b"].tolist() == [0, -1]
    assert logged_ran(run, ["a", "c"], np.array([0])) is None


def test_a_cascades_situation_seed_holds_the_cascades_own_scores() -> None:
    """The guard's windows under a cascade hold C (z1 outside the band): so does the seed
    calibrate fits, checked one decision at a time as the guard checks them."""
    from spotstop.guard.policies import FitContext

    rng = np.random.default_rng(4)
    n = 60
    a, b = rng.normal(0, 2, n), rng.normal(1, 1, n)
    x = _x(list(a), list(b))
    sids = np.array([f"s{i % 3}" for i in range(n)], dtype=object)
    ctx = FitContext(
        fusion=FUSION,
        frozen_t0=float(np.mean(x.fused)),
        fused=x.fused,
        label=np.full(n, -1),
        situation_id=sids,
        member_scores={"a": a, "b": b},
        member_text=None,
        settings={"share": 0.5, "cut": "situation", "first": "a", "window": 4},
        current=None,
        rng=np.random.default_rng(0),
    )
    pol = CascadePolicy.fit(ctx)
    seed = pol.seed_from_fit(ctx)
    state, c = pol.initial_state(None), {"s0": [], "s1": [], "s2": []}
    for i in range(n):  # one check per decision, as the guard runs them
        d = decide_batch(pol, _x([a[i]], [b[i]], [str(sids[i])]), state)
        state = d.state
        c[str(sids[i])].append(d.verdicts[0].score)
    assert seed == state
    for sid, scores in c.items():
        assert seed.references(sid) == tuple(scores[-4:])
    outside = [v for v in replay(pol, x).verdicts if v.policy.startswith("cascade[a]")]
    assert outside, "some scenes are decided on z1 alone: the seed is not the pair's S"
    # a cut without state has no seed
    frozen = CascadePolicy.fit(dataclasses.replace(ctx, settings={**ctx.settings, "cut": "frozen"}))
    assert frozen.seed_from_fit(ctx) is None
