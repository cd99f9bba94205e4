"""The card's mean cuts (batch_frozen_iqr, situation recentring) treat a score equal to the
exact mean as the guard does: a tie, UNSAFE (``spotstop.guard.policies.mean_cut``)."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score
from spotstop.diagnostics import CaseTable
from spotstop.diagnostics._engine import CurveEngine
from spotstop.diagnostics._situation import _centred_metrics


def _exact_flags(s: np.ndarray) -> np.ndarray:
    mean = sum(map(Fraction, s.tolist()), Fraction(0)) / s.size
    return np.array([Fraction(v) >= mean for v in s.tolist()])


def test_batch_mean_cut_of_the_engine_is_the_exact_mean() -> None:
    # the exact mean of these floats lies just above the float 0.3 (so only 0.7 is at or
    # above it), but the float sum divided by 6 rounded to 0.3: the 0.3 scenes were UNSAFE
    s = np.array([0.7, 0.1, 0.2, 0.3, 0.2, 0.3])
    y = np.tile([0, 1], 3)
    cid = np.repeat(["c0", "c1", "c2"], 2)
    t = CaseTable(case_id=[str(i) for i in range(6)], label=y, score=s, contrast_id=cid,
                  situation_id=cid)  # fmt: skip
    eng = CurveEngine.build(t, 0.0)
    got = float(eng.statistics(np.ones((1, eng.n_groups)), None)["A_batch"][0])
    assert _exact_flags(s).tolist() == [True, False, False, False, False, False]
    assert got == pytest.approx(balanced_accuracy_score(y, _exact_flags(s).astype(int)))  # 1/3
    # and in a resampled draw: group c1 alone three times (scores 0.2, 0.3; mean 0.25)
    counts = np.zeros((1, eng.n_groups))
    counts[0, t.group[2]] = 3
    got = float(eng.statistics(counts, None)["A_batch"][0])
    assert got == 1.0


def test_situation_recentring_counts_a_score_at_its_situation_mean_as_unsafe() -> None:
    # situation 0 scores 0.1 three times (np.mean: 0.10000000000000002, so SAFE before);
    # situation 1: -2, 3, 0.5 with mean exactly 0.5 (a tie: UNSAFE)
    y = np.array([0, 1, 1, 0, 1, 0], dtype=np.int8)
    s = np.array([0.1, 0.1, 0.1, -2.0, 3.0, 0.5])
    sit = np.array([0, 0, 0, 1, 1, 1])
    flags = np.concatenate([_exact_flags(s[:3]), _exact_flags(s[3:])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ba, _ = _centred_metrics(y, s, sit)
    assert flags.tolist() == [True, True, True, False, True, True]
    assert ba == pytest.approx(balanced_accuracy_score(y, flags.astype(int)))  # 2/3
