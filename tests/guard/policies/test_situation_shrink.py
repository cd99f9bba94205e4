"""The situation policy's shrunk reference mean: ICC(1), Spearman-Brown's weight, Kelley's
threshold, its policy.yaml key and its fit (guard/policies/_situation.py)."""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from spotstop.calibrate._cli import _icc_arg
from spotstop.diagnostics._situation import _icc_from_sums
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard.policies import (
    ConformalPolicy,
    FitContext,
    FrozenPolicy,
    PolicyError,
    SituationPolicy,
    batch_inputs,
    decide_batch,
    dump_policy,
    load_policy,
    reference_weight,
    replay,
    situation_icc,
)

# S = (a + b) / 2 with both members' statistics (0, 1): a = b = S gives S itself
ID = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 1.0), "b": MemberStats(0.0, 1.0)})


def _x(s: Any, sids: Any) -> Any:
    s = np.asarray(s, dtype=float)
    return batch_inputs(ID, {"a": s, "b": s}, list(sids))


# ---------------------------------------------------------------------- ICC(1)


def test_icc_by_hand_balanced() -> None:
    # groups (1, 2, 3) and (4, 5, 6): MSB = 3·((2−3.5)² + (5−3.5)²)/1 = 13.5,
    # MSW = (2 + 2)/(6 − 2) = 1, n0 = 3: ICC = (13.5 − 1)/(13.5 + 2·1) = 12.5/15.5
    got = situation_icc([1, 2, 3, 4, 5, 6], ["p", "p", "p", "q", "q", "q"])
    assert got == pytest.approx(12.5 / 15.5, rel=1e-12)


def test_icc_matches_the_cards_estimator() -> None:
    """The card's ICC(1) (diagnostics/_situation.py, written apart, from sums, of the
    class-centred score) equals this one on the class-centred values."""
    rng = np.random.default_rng(7)
    sizes = rng.integers(2, 9, size=15)
    codes = np.repeat(np.arange(sizes.size), sizes)
    y = rng.integers(0, 2, codes.size)
    v = rng.normal(0, 1, codes.size) + rng.normal(0, 0.8, sizes.size)[codes] + 2.0 * y
    n_jc = np.stack([np.bincount(codes, weights=(y == c).astype(float)) for c in (0, 1)], 1)
    s_jc = np.stack([np.bincount(codes, weights=v * (y == c)) for c in (0, 1)], 1)
    q_jc = np.stack([np.bincount(codes, weights=v**2 * (y == c)) for c in (0, 1)], 1)
    want = float(_icc_from_sums(np.ones((1, sizes.size)), n_jc, s_jc, q_jc)[0])
    assert 0 < want < 1
    centred = v - np.where(y == 1, v[y == 1].mean(), v[y == 0].mean())
    assert situation_icc(centred, [f"r{c}" for c in codes]) == pytest.approx(want, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=6, max_size=40),
    st.integers(2, 5),
    st.floats(0.1, 10),
    st.floats(-100, 100),
)
def test_icc_is_a_share_unmoved_by_scale_and_shift(
    v: list[float], groups: int, a: float, b: float
) -> None:
    sids = [f"g{i % groups}" for i in range(len(v))]
    got = situation_icc(v, sids)
    if got is None:  # every value the same
        assert np.ptp(v) == 0 or situation_icc(np.asarray(v) * a + b, sids) is None
        return
    assert 0.0 <= got <= 1.0
    moved = situation_icc(np.asarray(v) * a + b, sids)
    assert moved is not None and moved == pytest.approx(got, abs=1e-6)


def test_icc_counts_only_finite_scenes_of_situations_with_two() -> None:
    v = [1, 2, 3, 4, 5, 6, math.nan, 100.0, 7.0]
    sids = ["p", "p", "p", "q", "q", "q", "q", "lone", ""]
    assert situation_icc(v, sids) == pytest.approx(12.5 / 15.5)
    assert situation_icc([1.0, 2.0, 3.0], ["p", "p", "p"]) is None  # one situation
    assert situation_icc([1.0, 2.0], ["p", "q"]) is None  # no situation with two scenes
    assert situation_icc([3.0] * 4, ["p", "p", "q", "q"]) is None  # nothing to apportion
    assert situation_icc([0, 0, 5, 5], ["p", "p", "q", "q"]) == 1.0
    assert situation_icc([0, 5, 0, 5], ["p", "p", "q", "q"]) == 0.0  # negative: clipped
    with pytest.raises(PolicyError, match="one situation id per value"):
        situation_icc([1.0, 2.0], ["p"])


# ---------------------------------------------------------------------- the threshold


def test_reference_weight_is_spearman_brown() -> None:
    assert reference_weight(1, 0.25) == pytest.approx(0.25)
    assert reference_weight(4, 0.25) == pytest.approx(4 * 0.25 / (1 + 3 * 0.25))
    assert reference_weight(8, 1.0) == 1.0 and reference_weight(8, 0.0) == 0.0
    w = [reference_weight(k, 0.1) for k in range(1, 30)]
    assert all(a < b < 1 for a, b in itertools.pairwise(w))


def test_shrunk_threshold_by_hand() -> None:
    # t0 = 10, icc 0.5, min_refs 2: the third scene has references (2, 4), mean 3, weight
    # 2·0.5/(1 + 0.5) = 2/3, threshold 10 + 2/3·(3 − 10) = 16/3
    pol = SituationPolicy(window=3, min_refs=2, fallback=FrozenPolicy(10.0), icc=0.5)
    d = decide_batch(pol, _x([2.0, 4.0, 5.0, 6.0], ["k"] * 4))
    assert [v.threshold for v in d.verdicts][:3] == pytest.approx([10.0, 10.0, 16 / 3])
    # the fourth: references (2, 4, 5), mean 11/3, weight 3·0.5/2 = 3/4
    assert d.verdicts[3].threshold == pytest.approx(10 + 0.75 * (11 / 3 - 10))
    assert [v.policy for v in d.verdicts] == ["situation->frozen"] * 2 + ["situation"] * 2
    assert "moved 0.67 of the way" in d.verdicts[2].detail
    # the next scene of "k" gets what next_threshold reports: one rule
    rule, thr, refs = pol.next_threshold(d.state, "k")
    assert rule == "situation" and refs == (4.0, 5.0, 6.0)
    nxt = decide_batch(pol, _x([0.0], ["k"]), d.state)
    assert nxt.verdicts[0].threshold == pytest.approx(thr)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30),
    st.lists(st.sampled_from(["p", "q", None]), min_size=30, max_size=30),
)
def test_icc_one_is_the_plain_mean_and_icc_zero_the_frozen_cut(
    s: list[float], sid_pool: list[str | None]
) -> None:
    sids = sid_pool[: len(s)]
    x = _x(s, sids)
    plain = SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(0.3))
    one = SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(0.3), icc=1.0)
    zero = SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(0.3), icc=0.0)
    a, b = decide_batch(plain, x), decide_batch(one, x)
    assert [v.threshold for v in a.verdicts] == [v.threshold for v in b.verdicts]
    z = decide_batch(zero, x)
    assert all(v.threshold == pytest.approx(0.3) for v in z.verdicts)
    assert list(replay(zero, x).labels) == list(decide_batch(FrozenPolicy(0.3), x).labels)


# ---------------------------------------------------------------------- policy.yaml


def _doc(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 2,
        "bundle_id": "b",
        "prompt_hash": "p",
        "created": "2026-05-01T12:00:00+00:00",
        "fitted_on": {"n": 10},
        "fusion": {
            "members": ["a", "b"],
            "stats": {"a": {"median": 0.0, "iqr": 1.0}, "b": {"median": 0.0, "iqr": 1.0}},
        },
        "policy": policy,
    }


_SIT = {
    "kind": "situation",
    "window": 4,
    "min_refs": 2,
    "fallback": {"kind": "frozen", "threshold": 0.5},
}


def test_icc_round_trips_and_a_file_without_it_is_unchanged(tmp_path: Any) -> None:
    cfg = load_policy(_doc({**_SIT, "icc": 0.25}))
    assert cfg.policy.icc == 0.25  # type: ignore[attr-defined]
    dump_policy(cfg, tmp_path / "p.yaml")
    again = load_policy(tmp_path / "p.yaml")
    assert again.policy == cfg.policy and again.digest == cfg.digest
    old = load_policy(_doc(dict(_SIT)))
    assert old.policy.icc == 1.0  # type: ignore[attr-defined]
    assert old.policy.to_dict() == _SIT  # no key written: the digest of an old file holds
    dump_policy(old, tmp_path / "old.yaml")
    assert "icc" not in yaml.safe_load((tmp_path / "old.yaml").read_text())["policy"]


@pytest.mark.parametrize(
    ("icc", "fallback", "message"),
    [
        (1.5, None, "policy.icc must be a number in [0, 1]; got 1.5"),
        ("high", None, "policy.icc must be a finite number; got 'high'"),
        (math.nan, None, "policy.icc must be a finite number"),
        (
            0.3,
            {"kind": "conformal", "alpha": 0.1, "n": 9, "k": 1, "threshold": 0.0},
            "policy.icc 0.3 < 1 needs a frozen fallback",
        ),
    ],
)
def test_bad_icc_is_refused_naming_the_key(icc: Any, fallback: Any, message: str) -> None:
    pol = {**_SIT, "icc": icc}
    if fallback is not None:
        pol["fallback"] = fallback
    with pytest.raises(Exception, match=None) as err:
        load_policy(_doc(pol))
    assert message in str(err.value)


def test_constructor_refuses_what_the_file_refuses() -> None:
    with pytest.raises(PolicyError, match=r"icc must be a number in \[0, 1\]"):
        SituationPolicy(window=2, min_refs=1, fallback=FrozenPolicy(0.0), icc=-0.1)
    conf = ConformalPolicy(alpha=0.1, n=9, k=1, threshold=0.0)
    with pytest.raises(PolicyError, match="use a frozen fallback"):
        SituationPolicy(window=2, min_refs=1, fallback=conf, icc=0.5)
    SituationPolicy(window=2, min_refs=1, fallback=conf)  # the plain mean needs no centre


# ---------------------------------------------------------------------- fit


def _ctx(fused: np.ndarray, sids: list[str], settings: dict[str, Any], current: Any = None) -> Any:
    return FitContext(
        fusion=ID,
        frozen_t0=float(np.mean(fused)),
        fused=fused,
        label=np.full(fused.size, -1),
        situation_id=np.array(sids, dtype=object),
        member_scores={"a": fused, "b": fused},
        member_text=None,
        settings=settings,
        current=current,
        rng=np.random.default_rng(0),
    )


def test_fit_estimates_icc_from_the_fitting_scenes_each_time() -> None:
    rng = np.random.default_rng(3)
    codes = np.repeat(np.arange(20), 6)
    fused = rng.normal(0, 1, codes.size) + rng.normal(0, 0.7, 20)[codes]
    sids = [f"room{c}" for c in codes]
    want = situation_icc(fused, sids)
    assert want is not None and 0 < want < 1
    pol = SituationPolicy.fit(_ctx(fused, sids, {}))
    assert pol.icc == pytest.approx(want)
    assert pol.fallback == FrozenPolicy(float(np.mean(fused)))
    # a refit estimates again: the current policy's icc is not carried over, as t0 is not
    stale = SituationPolicy(window=8, min_refs=3, fallback=FrozenPolicy(0.0), icc=0.9)
    assert SituationPolicy.fit(_ctx(fused, sids, {}, current=stale)).icc == pytest.approx(want)
    assert SituationPolicy.fit(_ctx(fused, sids, {"icc": "auto"})).icc == pytest.approx(want)
    assert SituationPolicy.fit(_ctx(fused, sids, {"icc": 0.4})).icc == 0.4
    # no situation seen twice: nothing to estimate, the plain mean
    lone = [f"s{i}" for i in range(codes.size)]
    assert SituationPolicy.fit(_ctx(fused, lone, {})).icc == 1.0


def test_the_command_line_takes_auto_or_a_share() -> None:
    assert _icc_arg("auto") == "auto" and _icc_arg("0.25") == 0.25
    for bad in ("1.5", "-0.1", "nan", "high"):
        with pytest.raises(argparse.ArgumentTypeError, match="--icc takes auto or a number"):
            _icc_arg(bad)
