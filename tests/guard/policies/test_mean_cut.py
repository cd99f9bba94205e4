"""A score equal to its batch or situation mean is a tie, UNSAFE, whatever the float sum gives."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from spotstop.guard._fusion import Avg2Fusion, MemberStats
from spotstop.guard.policies import (
    BatchFrozenIqrPolicy,
    BatchInputs,
    FrozenPolicy,
    SituationPolicy,
    batch_inputs,
    decide_batch,
    mean_cut,
)

# S = ((a − 0)/2 + (b − 1)/1)/2: a = 0.4, b = 1 gives S = 0.1 exactly (the float 0.1)
FUSION = Avg2Fusion(("a", "b"), {"a": MemberStats(0.0, 2.0), "b": MemberStats(1.0, 1.0)})


def _exact_ge(values: list[float], t: float) -> list[bool]:
    mean = sum(map(Fraction, values), Fraction(0)) / len(values)
    return [Fraction(v) >= mean for v in values]


@pytest.mark.parametrize(
    "values",
    [[0.1] * 3, [0.2] * 3, [0.1, 0.0, 0.2], [0.7, 0.1, 0.2, 0.3, 0.2, 0.3], [1.0, 2.0], [-0.3] * 7],
)
def test_mean_cut_is_the_exact_mean_rounded_up(values: list[float]) -> None:
    t = mean_cut(values)
    assert [v >= t for v in values] == _exact_ge(values, t)
    assert Fraction(t) >= sum(map(Fraction, values), Fraction(0)) / len(values)
    assert np.isnan(mean_cut([])) and np.isnan(mean_cut([1.0, float("nan")]))


def test_equal_scores_of_a_batch_tie_with_its_mean_and_are_unsafe() -> None:
    # np.mean([0.1] * 3) is 0.10000000000000002: the three scenes would be SAFE
    x = batch_inputs(FUSION, {"a": [0.4] * 3, "b": [1.0] * 3}, None, None)
    d = decide_batch(BatchFrozenIqrPolicy(FrozenPolicy(99.0)), x)
    assert [v.score for v in d.verdicts] == [0.1] * 3
    assert [v.label for v in d.verdicts] == ["UNSAFE"] * 3


def test_a_scene_equal_to_its_situation_mean_is_unsafe() -> None:
    pol = SituationPolicy(window=3, min_refs=3, fallback=FrozenPolicy(99.0))
    state = None
    labels = []
    for _ in range(4):
        d = decide_batch(pol, batch_inputs(FUSION, {"a": [0.4], "b": [1.0]}, ["k"], None), state)
        state = d.state
        labels += [v.label for v in d.verdicts]
    assert d.verdicts[0].threshold == 0.1  # the mean of three references 0.1, not 0.1 + 1 ulp
    assert labels[-1] == "UNSAFE"


def test_the_frozen_cut_is_the_pools_exact_mean_rounded_up() -> None:
    # the float mean of this pool's fused scores is 2 ulps above their exact mean: a scene at
    # the pool's mean (a tie, UNSAFE under the batch rule the frozen cut freezes) was SAFE
    pool = {
        "a": [0.2, -0.6, -1.3, -1.4, 0.5, 1.0, -0.2, -1.1],
        "b": [0.9, -1.3, -0.7, 0.6, -2.3, 0.4, -0.6, 0.1],
    }
    fusion, policy = FrozenPolicy.fit_pool(pool)
    fused = fusion.fuse_many({m: np.asarray(v) for m, v in pool.items()}).tolist()
    exact = sum(map(Fraction, fused), Fraction(0)) / len(fused)
    at_mean = float(exact)  # the smallest float at or above the exact mean
    if Fraction(at_mean) < exact:
        at_mean = float(np.nextafter(at_mean, np.inf))
    assert policy.threshold == at_mean
    x = BatchInputs(
        fused=np.array([at_mean]),
        members={"a": np.zeros(1), "b": np.zeros(1)},
        situation_ids=(None,),
        fusion=fusion,
    )
    assert decide_batch(policy, x).labels == ("UNSAFE",)
