"""The situation policy's prior: κ pseudo-references at the frozen cut (guard/policies/_situation.py).

The rule is checked by hand and against ``np.average``; the fitted κ against scipy's one-way
ANOVA F (``κ = n0 / (F − 1)``, since ``τ² = (MSB − MSW)/n0`` and ``F = MSB/MSW``) and against
the variances a simulation was drawn with.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard.policies import (
    FitContext,
    FrozenPolicy,
    PolicyError,
    SituationPolicy,
    batch_inputs,
    decide_batch,
    load_policy,
    policy_from_dict,
    replay,
    situation_prior_weight,
)

FUSION = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 2.0), "b": MemberStats(1.0, 1.0)})


def _x(s: list[float], sids: list[str | None]) -> Any:
    # a = 2 S, b = 1 + S give S = (a/2 + (b − 1))/2 = S
    return batch_inputs(FUSION, {"a": [2 * v for v in s], "b": [1 + v for v in s]}, sids)


def test_the_prior_by_hand() -> None:
    # window 3, min_refs 1, κ = 2 at t = 10; scenes of "k" with S = 1..5, one check each
    pol = SituationPolicy(
        window=3, min_refs=1, fallback=FrozenPolicy(10.0), prior_weight=2.0, prior_threshold=10.0
    )
    state, verdicts = None, []
    for s in (1.0, 2.0, 3.0, 4.0, 5.0):
        d = decide_batch(pol, _x([s], ["k"]), state)
        state = d.state
        verdicts += d.verdicts
    # none yet: fallback; (1 + 20)/3; (1 + 2 + 20)/4; (1 + 2 + 3 + 20)/5; window 3: (2 + 3 + 4 + 20)/5
    np.testing.assert_allclose([v.threshold for v in verdicts], [10.0, 7.0, 5.75, 5.2, 5.8])
    assert [v.policy for v in verdicts] == ["situation->frozen"] + ["situation"] * 4
    assert "and 2 prior references at 10" in verdicts[1].detail
    assert [v.label for v in replay(pol, _x([1, 2, 3, 4, 5], ["k"] * 5)).verdicts] == [
        v.label for v in verdicts
    ]
    # the next scene: (3 + 4 + 5 + 20)/5
    assert pol.next_threshold(state, "k") == ("situation", pytest.approx(6.4), (3.0, 4.0, 5.0))


@settings(max_examples=200, deadline=None)
@given(
    refs=st.lists(st.floats(-50, 50), min_size=1, max_size=8),
    weight=st.floats(0, 100),
    t=st.floats(-50, 50),
)
def test_the_threshold_is_the_weighted_mean_of_references_and_prior(
    refs: list[float], weight: float, t: float
) -> None:
    pol = SituationPolicy(
        window=8,
        min_refs=1,
        fallback=FrozenPolicy(t),
        prior_weight=weight,
        prior_threshold=t if weight > 0 else None,
    )
    got = pol.recentred(refs)
    want = np.average([*refs, t], weights=[1.0] * len(refs) + [weight])
    assert got == pytest.approx(want, rel=1e-12, abs=1e-9)
    lo, hi = min(np.mean(refs), t), max(np.mean(refs), t)
    assert lo - 1e-9 <= got <= hi + 1e-9  # between the situation's mean and the prior
    if weight == 0:  # κ = 0 is the paper's rule: the exact mean, rounded up to a float
        exact = sum(map(Fraction, refs), Fraction(0)) / len(refs)
        assert Fraction(got) >= exact > Fraction(math.nextafter(got, -math.inf))


def _groups(rng: np.random.Generator, sizes: list[int], tau: float, sigma: float) -> Any:
    s, sid = [], []
    for j, n in enumerate(sizes):
        s += list(rng.normal(rng.normal(0.0, tau), sigma, n))
        sid += [f"s{j}"] * n
    return np.array(s), np.array(sid, dtype=object)


def test_the_fitted_weight_is_n0_over_f_minus_1_from_scipys_anova() -> None:
    rng = np.random.default_rng(5)
    sizes = [3, 8, 5, 12, 2, 7, 9, 4]  # unequal: the n0 form
    s, sid = _groups(rng, sizes, tau=2.0, sigma=1.0)
    f = stats.f_oneway(*[s[sid == f"s{j}"] for j in range(len(sizes))]).statistic
    n, big_n = np.array(sizes, float), float(sum(sizes))
    n0 = (big_n - (n**2).sum() / big_n) / (len(sizes) - 1)
    k, how = situation_prior_weight(s, sid, cap=1e9)
    assert f > 2  # a clear situation effect, so no cap
    assert k == pytest.approx(n0 / (f - 1), rel=1e-9)
    assert "σ²/τ²" in how and "8 situations, 50 scenes" in how


def test_the_fitted_weight_recovers_the_variances_it_was_drawn_with() -> None:
    rng = np.random.default_rng(11)
    s, sid = _groups(rng, [20] * 600, tau=1.0, sigma=2.0)  # σ²/τ² = 4
    k, _ = situation_prior_weight(s, sid, cap=100.0)
    # τ² from 600 situations: its relative SE is about sqrt(2/599)·(1 + σ²/(nτ²)) ≈ 0.07
    assert k == pytest.approx(4.0, rel=0.25)


def test_the_weight_is_capped_and_says_why() -> None:
    rng = np.random.default_rng(3)
    s, sid = _groups(rng, [6] * 30, tau=0.0, sigma=1.0)  # no situation effect
    k, how = situation_prior_weight(s, sid, cap=8.0)
    assert k == 8.0 and how.startswith("the cap: between-situation variance")
    s2, sid2 = _groups(rng, [6] * 30, tau=1.0, sigma=0.5)  # a strong one: κ ≈ 0.25, under the cap
    assert situation_prior_weight(s2, sid2, cap=8.0)[0] < 1.0
    # scenes without a situation id, or non-finite, are left out; one situation is not enough
    k1, how1 = situation_prior_weight([1.0, 2.0, 3.0, math.nan], ["a", "a", "", "b"], cap=5.0)
    assert k1 == 5.0 and "1 situation(s), 2 scenes" in how1
    k2, how2 = situation_prior_weight([1.0, 2.0], ["a", "b"], cap=5.0)  # no within spread
    assert k2 == 5.0 and "need 2 situations and one with 2 scenes" in how2
    with pytest.raises(PolicyError, match="3 scores but 2 situation ids"):
        situation_prior_weight([1.0, 2.0, 3.0], ["a", "b"], cap=5.0)


def _ctx(s: np.ndarray, sid: np.ndarray, **settings: Any) -> FitContext:
    return FitContext(
        fusion=FUSION,
        frozen_t0=0.25,
        fused=s,
        label=np.full(s.size, -1),
        situation_id=sid,
        member_scores={"a": 2 * s, "b": 1 + s},
        member_text=None,
        settings=settings,
        current=None,
        rng=np.random.default_rng(0),
    )


def test_fit_shrinks_towards_t0_by_the_fitted_weight_unless_one_is_given() -> None:
    rng = np.random.default_rng(7)
    s, sid = _groups(rng, [8] * 40, tau=1.0, sigma=1.5)
    pol = SituationPolicy.fit(_ctx(s, sid))
    want, _ = situation_prior_weight(s, sid, cap=8)
    assert pol.prior_weight == want and 0 < want < 8 and pol.prior_threshold == 0.25
    assert pol.fallback == FrozenPolicy(0.25) and (pol.window, pol.min_refs) == (8, 3)
    paper = SituationPolicy.fit(_ctx(s, sid, prior_weight=0.0))
    assert paper.prior_weight == 0 and paper.prior_threshold is None
    assert "prior_weight" not in paper.to_dict()  # files of the paper's rule are unchanged
    given_k = SituationPolicy.fit(_ctx(s, sid, prior_weight=2.5, window=4))
    assert (given_k.prior_weight, given_k.window) == (2.5, 4)
    # no situation ids in the context: the cap, the window
    none = SituationPolicy.fit(_ctx(s, np.full(s.size, "", dtype=object), window=5))
    assert none.prior_weight == 5.0
    for bad in (True, "3", -1.0, math.inf):
        with pytest.raises(PolicyError, match="prior_weight must be a finite number ≥ 0"):
            SituationPolicy.fit(_ctx(s, sid, prior_weight=bad))


def _doc(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 2,
        "bundle_id": "b",
        "prompt_hash": "p",
        "created": "2026-05-01T12:00:00+00:00",
        "fusion": {
            "method": "avg2",
            "members": ["a", "b"],
            "stats": {"a": {"median": 0.0, "iqr": 2.0}, "b": {"median": 1.0, "iqr": 1.0}},
        },
        "policy": policy,
        "fitted_on": {},
    }


_SIT = {"kind": "situation", "window": 4, "min_refs": 2}
_FB = {"fallback": {"kind": "frozen", "threshold": 0.25}}


def test_the_prior_round_trips_through_policy_yaml() -> None:
    d = {**_SIT, "prior_weight": 3.5, "prior_threshold": 0.25, **_FB}
    cfg = load_policy(_doc(d))
    assert cfg.policy.to_dict() == d
    assert isinstance(cfg.policy, SituationPolicy) and cfg.policy.prior_weight == 3.5
    assert load_policy(_doc({**_SIT, **_FB})).policy.to_dict() == {**_SIT, **_FB}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"prior_weight": 2.0}, "policy.prior_weight is set but policy.prior_threshold is not"),
        ({"prior_threshold": 0.1}, "policy.prior_threshold is set but policy.prior_weight is not"),
        (
            {"prior_weight": -1.0, "prior_threshold": 0.1},
            "policy.prior_weight must be ≥ 0; got -1.0",
        ),
        (
            {"prior_weight": "a lot", "prior_threshold": 0.1},
            "policy.prior_weight must be a finite number; got 'a lot'",
        ),
        (
            {"prior_weight": 2.0, "prior_threshold": math.inf},
            "policy.prior_threshold must be a finite number",
        ),
        ({"prior_wieght": 2.0}, "policy.prior_wieght is not a known key"),
        (
            {"prior_weight": 0, "prior_threshold": "x"},  # unused, and still checked
            "policy.prior_threshold must be a finite number; got 'x'",
        ),
    ],
)
def test_a_bad_prior_names_its_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_policy(_doc({**_SIT, **extra, **_FB}))


def test_the_constructor_refuses_a_prior_it_cannot_use() -> None:
    fb = FrozenPolicy(0.0)
    with pytest.raises(PolicyError, match="prior_threshold must be a finite number when"):
        SituationPolicy(window=2, min_refs=1, fallback=fb, prior_weight=1.0)
    with pytest.raises(PolicyError, match="prior_weight is 0, so it would be ignored"):
        SituationPolicy(window=2, min_refs=1, fallback=fb, prior_threshold=1.0)
    with pytest.raises(PolicyError, match="prior_weight must be a finite number ≥ 0"):
        SituationPolicy(window=2, min_refs=1, fallback=fb, prior_weight=math.nan)
    # the prior with weight 0 read from a file is no prior
    pol = policy_from_dict(
        {**_SIT, "prior_weight": 0, "prior_threshold": 9.0, **_FB},
        where="policy",
        source="a test",
        members=("a", "b"),
    )
    assert pol.to_dict() == {**_SIT, **_FB}
