"""Selection (seed 002, Eq. 1 and Sec. 3.5): the prediction, its interval, the switch point."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spotstop.diagnostics import UndefinedMetricWarning
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues import (
    CUES,
    crossing_scale,
    estimate_reliance,
    estimate_shift,
    predicted_error,
    select,
)

from tests._support.cues_fakes import make_edits, score_table, text_scores


def test_predicted_error_and_crossing_closed_form():
    assert predicted_error(
        0.1, {"reassuring": 0.5, "alarming": 0.2}, {"reassuring": 0.2, "alarming": 0.1}
    ) == pytest.approx(0.1 + 0.1 + 0.02)
    # E_a = .10 + .60 t, E_b = .25 + .10 t cross at t = .15 / .5 = .3
    assert crossing_scale(0.10, 0.60, 0.25, 0.10) == pytest.approx(0.3)
    with pytest.warns(UndefinedMetricWarning, match="parallel"):
        assert math.isnan(crossing_scale(0.1, 0.2, 0.3, 0.2))


def _shift_at(share: float, n: int = 400):
    """A deployment where exactly ``share`` of the frames carry reassuring text, read by a
    perfect detector, and every frame is UNSAFE (prior 1): the misleading share is ``share``
    for reassuring text and 0 for alarming text."""
    cal_c = ["reassuring"] * 20 + ["alarming"] * 20 + ["none"] * 20
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    frames = np.zeros((n, 2), dtype=bool)
    frames[: round(share * n), 0] = True
    return estimate_shift(frames, cal_f, cal_c, prior=1.0, n_boot=500, rng=0)


@pytest.fixture(scope="module")
def crossing(tmp_path_factory):
    """Two members: ``steady`` errs more on the source scenes but ignores text; ``reader`` errs
    less but follows reassuring text (and only that, so the agreeing control moves nothing
    and the linear model of Sec. 3.5 holds exactly)."""
    edits = make_edits(tmp_path_factory.mktemp("x"), 150, 150)
    rng = np.random.default_rng(0)
    labels = np.array([s.label for s in edits.source.scenes])
    sign = np.where(labels == 1, 1.0, -1.0)
    scores = {
        "reader": text_scores(edits, sign * 1.5 + rng.normal(0, 1, labels.size), 4.0, 0.0),
        "steady": text_scores(edits, sign * 0.9 + rng.normal(0, 1, labels.size), 0.0, 0.0),
    }
    return edits, scores, estimate_reliance(score_table(edits, scores), n_boot=1000, rng=1)


def test_ranking_switches_at_the_predicted_share(crossing):
    _, _, rel = crossing
    a, b = rel["reader"].hard, rel["steady"].hard
    # every frame is UNSAFE (prior 1): the intercept is the error on the UNSAFE source scenes
    d_star = crossing_scale(
        a.cues["reassuring"].source_error.value, a.cues["reassuring"].reliance.value,
        b.cues["reassuring"].source_error.value, b.cues["reassuring"].reliance.value,
    )  # fmt: skip
    assert 0.05 < d_star < 0.5
    for share in (0.0, d_star - 0.03, d_star + 0.03, 0.8):
        sel = select(rel, _shift_at(share))
        expected = "reader" if share < d_star else "steady"
        assert sel.best.name == expected, (share, d_star, sel)
        for p in sel.ranking:
            h = rel[p.name].as_hard()
            want = (
                h.cues["reassuring"].source_error.value
                + h.cues["reassuring"].reliance.value * round(share * 400) / 400
            )
            assert p.predicted_error.value == pytest.approx(want)
            assert p.intercept.value == pytest.approx(h.cues["reassuring"].source_error.value)
    by_src = select(rel, _shift_at(0.8))
    assert [p.rank_by_source_error for p in by_src.ranking] == [2, 1]  # source error prefers reader
    assert "SRA picks steady where source error alone picks reader" in by_src.explanation
    assert "follows reassuring text more" in by_src.explanation
    assert "SRA keeps reader" in select(rel, _shift_at(0.0)).explanation


def test_realized_errors_on_cuedial_test_sets_cross_where_sra_predicts(crossing):
    """Sec. 3.5: T_d = O_{n/2} ∪ C_{dn} ∪ N_{(1/2-d)n} (O: SAFE scenes, no cue; C: UNSAFE
    scenes with the misleading text; N: UNSAFE scenes, no cue); each model's error is linear in
    d, and the best model changes where SRA's lines cross."""
    edits, scores, rel = crossing
    y = np.array([r.label for r in edits.records])
    kind = np.array([r.kind for r in edits.records])
    meas = np.array([not r.held_out for r in edits.records])
    pools = {
        "O": np.flatnonzero((kind == "source") & (y == 0)),
        "C": np.flatnonzero((kind == "misleading") & (y == 1) & meas),
        "N": np.flatnonzero((kind == "source") & (y == 1)),
    }
    err = {m: ((s > 0) != (y == 1)).astype(float) for m, s in scores.items()}
    rng = np.random.default_rng(2)
    n = 200
    grid = np.linspace(0, 0.5, 11)
    best = []
    for d in grid:
        mean = dict.fromkeys(scores, 0.0)
        for _ in range(30):
            idx = np.concatenate([
                rng.choice(pools["O"], n // 2, replace=False),
                rng.choice(pools["C"], round(d * n), replace=False),
                rng.choice(pools["N"], round((0.5 - d) * n), replace=False),
            ])  # fmt: skip
            for m in scores:
                mean[m] += err[m][idx].mean() / 30
        best.append(min(mean, key=mean.get))
    a, b = rel["reader"].hard, rel["steady"].hard
    d_star = crossing_scale(
        a.source_error.value, a.cues["reassuring"].reliance.value,
        b.source_error.value, b.cues["reassuring"].reliance.value,
    )  # fmt: skip
    switch = [
        (lo, hi) for lo, hi, x, z in zip(grid, grid[1:], best, best[1:], strict=False) if x != z
    ]
    assert best[0] == "reader" and best[-1] == "steady" and len(switch) == 1
    lo, hi = switch[0]
    assert lo - 0.05 <= d_star <= hi + 0.05, (switch, d_star)


def test_predicted_error_interval_combines_the_draws(crossing):
    _, _, rel = crossing
    sh = _shift_at(0.3)
    sel = select(rel, sh)
    n = min(rel.n_boot, sh.n_boot)
    for p in sel.ranking:  # π = 1 (a stated prior): the intercept is the UNSAFE scenes' error
        d = np.asarray(rel.draws[(p.name, "hard", "reassuring", "source_error")][:n]).copy()
        for c in CUES:
            d += rel.draws[(p.name, "hard", c, "reliance")][:n] * sh.draws[c][:n]
        lo, hi = np.percentile(d, [2.5, 97.5])
        assert (p.predicted_error.ci.low, p.predicted_error.ci.high) == pytest.approx((lo, hi))
        assert p.predicted_error.ci.contains(p.predicted_error.value)


def test_select_json_keys_and_rank_order(crossing):
    _, _, rel = crossing
    doc = json.loads(json.dumps(select(rel, _shift_at(0.6)).to_dict(), allow_nan=False))
    names = [c["name"] for c in doc["candidates"]]
    assert names == ["steady", "reader"] and [c["rank"] for c in doc["candidates"]] == [1, 2]
    for c in doc["candidates"]:
        assert set(c["predicted_error"]) == {"value", "ci", "basis"}
        assert set(c["source_error"]) == {"value", "ci", "n"}
        assert "rank_by_source_error" in c
    assert doc["ranking_by_source_error"] == ["reader", "steady"] and doc["error"] == "hard"
    assert doc["schema_version"] == 2 and doc["dropped_cues"] == [] and doc["check"] is None
    assert doc["weighting"]["intercept"] == "deployment" and doc["weighting"]["prevalence"] == 1.0
    assert doc["weighting"]["miss_cost"] == 1.0 and doc["weighting"]["units"] == "error"
    # a stated prior and no labels: every share and prediction says it rests on independence
    assert doc["misleading_share_basis"] == "assumes text independent of the label"
    assert "independent of the label" in doc["assumption"]
    assert all(c["predicted_error"]["basis"] == doc["misleading_share_basis"]
               for c in doc["candidates"])  # fmt: skip
    assert doc["candidates"][0]["operating_point"]["rule"].startswith("the member's own answer")


def test_undefined_share_drops_out_and_the_ranking_says_so(crossing):
    _, _, rel = crossing
    cal_c = ["reassuring"] * 10 + ["none"] * 10  # no alarming scene: its share is undefined
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    frames = np.zeros((20, 2), bool)
    frames[:10, 0] = True
    with pytest.warns(UndefinedMetricWarning):
        sh = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=50, rng=0)
    with pytest.warns(UndefinedMetricWarning, match="alarming text is undefined, so it drops out"):
        sel = select(rel, sh)
    assert sel.dropped_cues == ("alarming",)
    for p in sel.ranking:  # the remaining terms: intercept + reassuring reliance × share
        h = rel[p.name].as_hard()
        want = (0.5 * h.cues["reassuring"].source_error.value
                + 0.5 * h.cues["alarming"].source_error.value
                + h.cues["reassuring"].reliance.value * 0.5 * 0.5)  # fmt: skip
        assert p.predicted_error.value == pytest.approx(want)
        assert math.isnan(p.extra_error["alarming"])
    assert "drops out: the ranking falls back to source error and reassuring text" in (
        sel.explanation
    )
    assert sel.to_dict()["dropped_cues"] == ["alarming"]


def _no_text_shift(prior: float):
    """A deployment without any scene text (a perfect detector sees none) and a stated prior."""
    cal_c = ["reassuring"] * 20 + ["alarming"] * 20 + ["none"] * 20
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    return estimate_shift(np.zeros((100, 2), bool), cal_f, cal_c, prior=prior, n_boot=200, rng=0)


@pytest.fixture(scope="module")
def a_and_e(tmp_path_factory):
    """50 UNSAFE and 50 SAFE source scenes, no reaction to text.
    A errs on 5 of 50 UNSAFE and 5 of 50 SAFE scenes (0.10 on each); E errs on 24 of 50
    UNSAFE scenes (0.48) and on no SAFE one."""
    edits = make_edits(tmp_path_factory.mktemp("ae"), 50, 50)
    unsafe = np.arange(100) < 50
    base_a = np.where(unsafe, 1.0, -1.0)
    base_a[:5], base_a[50:55] = -1.0, 1.0
    base_e = np.where(unsafe, 1.0, -1.0)
    base_e[:24] = -1.0
    scores = {"A": text_scores(edits, base_a, 0, 0), "E": text_scores(edits, base_e, 0, 0)}
    return estimate_reliance(score_table(edits, scores), n_boot=300, rng=0)


def test_prevalence_in_the_intercept_selects_e_at_pi_0_1(a_and_e):
    """By hand, π = 0.1: A = 0.1·0.10 + 0.9·0.10 = 0.100, E = 0.1·0.48 + 0.9·0 = 0.048, so E.
    On the source set's own (balanced) mix: A = 0.10, E = 0.24, so A (the old answer).
    A miss costing 5 false stops at π = 0.1: A = 5·0.1·0.10 + 0.9·0.10 = 0.14,
    E = 5·0.1·0.48 = 0.24, so A again."""
    sh = _no_text_shift(0.1)
    sel = select(a_and_e, sh)
    assert sel.best.name == "E"
    got = {p.name: p.predicted_error.value for p in sel.ranking}
    assert got == pytest.approx({"A": 0.100, "E": 0.048})
    assert "π̂ = 0.100 (prior)" in sel.weighting["description"]
    balanced = select(a_and_e, sh, weighting="source")
    assert balanced.best.name == "A"
    assert {p.name: p.predicted_error.value for p in balanced.ranking} == pytest.approx(
        {"A": 0.10, "E": 0.24}
    )
    assert balanced.weighting["intercept"] == "source"
    costly = select(a_and_e, sh, miss_cost=5.0)
    assert costly.best.name == "A"
    assert {p.name: p.predicted_error.value for p in costly.ranking} == pytest.approx(
        {"A": 0.14, "E": 0.24}
    )
    assert costly.weighting["units"].startswith("cost per frame")
    with pytest.raises(DataError, match="miss_cost is the cost of a missed hazard"):
        select(a_and_e, sh, miss_cost=0.0)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pi=st.floats(0.0, 1.0), cost=st.floats(0.2, 20.0))
def test_intercept_is_linear_in_the_mix(a_and_e, pi, cost):
    """Property (seed 002, Sec. A): the intercept is cost·π·err_UNSAFE + (1 − π)·err_SAFE."""
    sel = select(a_and_e, _no_text_shift(pi), miss_cost=cost)
    for p in sel.ranking:
        h = a_and_e[p.name].as_hard()
        want = cost * pi * h.cues["reassuring"].source_error.value + (1 - pi) * (
            h.cues["alarming"].source_error.value
        )
        assert p.intercept.value == pytest.approx(want, abs=1e-12)
        assert p.predicted_error.value == pytest.approx(want, abs=1e-12)  # no text here


def test_ranking_never_follows_the_input_order(a_and_e):
    """The same candidates in another order rank the same; equal candidates rank by name."""
    from dataclasses import replace

    sh = _no_text_shift(0.1)
    twin = replace(a_and_e["A"], name="AA")
    cands = {"E": a_and_e["E"], "AA": twin, "A": a_and_e["A"]}
    draws = dict(a_and_e.draws)
    draws.update({("AA", *k[1:]): v for k, v in a_and_e.draws.items() if k[0] == "A"})
    forward = replace(a_and_e, candidates=cands, draws=draws)
    backward = replace(a_and_e, candidates=dict(reversed(cands.items())), draws=draws)
    for rel in (forward, backward):
        sel = select(rel, sh)
        assert [p.name for p in sel.ranking] == ["E", "A", "AA"]  # A and AA tie: by name
        assert [p.rank_by_source_error for p in sel.ranking] == [1, 2, 3]


def test_sens_equal_to_fpr_is_undefined_point_and_interval_and_the_fallback_is_named(a_and_e):
    """The alarming flag fires on half the scenes of every type: sens = 10/20
    = 0.5, fpr = 20/40 = 0.5. d̂_alarming, its share among SAFE frames and its misleading share
    are NaN with NaN intervals (never [1, 1]); select drops the cue and ranks on source error
    and reassuring text: at π̂ = 1/2 (labels) and no reassuring text, A = 0.5·0.10 + 0.5·0.10 =
    0.10 and E = 0.5·0.48 = 0.24, so A, and the explanation names the fallback."""
    cal_c = ["reassuring"] * 20 + ["alarming"] * 20 + ["none"] * 20
    cal_f = np.zeros((60, 2), dtype=bool)
    cal_f[:20, 0] = True
    cal_f[::2, 1] = True  # every other scene of each type
    frames = np.zeros((60, 2), dtype=bool)
    frames[:45, 1] = True
    labels = np.array([0, 1] * 30, dtype=np.int8)  # 30 of each class: the labels are used
    with pytest.warns(UndefinedMetricWarning, match="d̂ of alarming text is undefined"):
        sh = estimate_shift(frames, cal_f, cal_c, frame_labels=labels, n_boot=300, rng=0)
    a = sh["alarming"]
    assert a.sens.value == a.fpr.value == 0.5
    for e in (a.d_hat, a.d_hat_given_label, a.misleading_share):
        assert math.isnan(e.value) and math.isnan(e.ci.low) and math.isnan(e.ci.high)
    assert sh["reassuring"].d_hat.value == pytest.approx(0.0, abs=1e-12)
    with pytest.warns(UndefinedMetricWarning, match="drops out"):
        sel = select(a_and_e, sh)
    assert {p.name: p.predicted_error.value for p in sel.ranking} == pytest.approx(
        {"A": 0.10, "E": 0.24}
    )
    assert [p.name for p in sel.ranking] == ["A", "E"]
    assert "falls back to source error and reassuring text" in sel.explanation
    assert sel.summary().startswith("SRA ranks A first")
    doc = sel.to_dict()
    assert doc["misleading_share"]["alarming"]["value"] is None
    assert doc["misleading_share"]["alarming"]["ci"] == [None, None]


def test_a_tie_on_source_error_is_said_and_is_no_reorder(tmp_path):
    """alpha and beta are both right on every unedited scene (source error 0 for both); alpha
    follows reassuring text (pushed by −4: every misleading edit flips, reliance 1), beta
    barely (−1: none flips, reliance 0). 10 % of the frames carry reassuring text, prior 1/2:
    misleading share 0.05, so E_alpha = 0.05, E_beta = 0. Source error orders them only by
    name; the explanation said "alpha errs less on the source scenes (0.000 against 0.000)",
    a crossing at "-0.00×", and "SRA reorders 2 of 2"."""
    edits = make_edits(tmp_path, 30, 30)
    base = np.where(np.arange(60) < 30, 2.0, -2.0)
    scores = {"alpha": text_scores(edits, base, 4.0, 0.0),
              "beta": text_scores(edits, base, 1.0, 0.0)}  # fmt: skip
    rel = estimate_reliance(score_table(edits, scores), n_boot=200, rng=1)
    cal_c = ["reassuring"] * 30 + ["alarming"] * 30 + ["none"] * 60
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    frames = np.zeros((400, 2), bool)
    frames[:40, 0] = True
    sel = select(rel, estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=200, rng=2))
    assert {p.name: p.predicted_error.value for p in sel.ranking} == pytest.approx(
        {"alpha": 0.05, "beta": 0.0}, abs=1e-12
    )
    assert sel.ranking[0].intercept.value == sel.ranking[1].intercept.value == 0.0
    text = sel.explanation
    assert text.startswith("SRA picks beta; beta and alpha are tied on source error")
    assert "SRA separates them by reliance: alpha follows reassuring text more" in text
    assert "errs less" not in text and "cross at" not in text
    assert text.endswith("SRA reorders 0 of 2 candidates.")
