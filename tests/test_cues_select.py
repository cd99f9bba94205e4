"""Selection (seed 002, Eq. 1 and Sec. 3.5): the prediction, its interval, the switch point."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from spotstop.diagnostics import UndefinedMetricWarning
from spotstop.diagnostics.cues import (
    CUES,
    crossing_scale,
    estimate_reliance,
    estimate_shift,
    predicted_error,
    select,
)

from tests.test_cues_fakes import make_edits, score_table, text_scores


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
    d_star = crossing_scale(
        a.source_error.value, a.cues["reassuring"].reliance.value,
        b.source_error.value, b.cues["reassuring"].reliance.value,
    )  # fmt: skip
    assert 0.05 < d_star < 0.5
    for share in (0.0, d_star - 0.03, d_star + 0.03, 0.8):
        sel = select(rel, _shift_at(share))
        expected = "reader" if share < d_star else "steady"
        assert sel.best.name == expected, (share, d_star, sel)
        for p in sel.ranking:
            h = rel[p.name].as_hard()
            want = (
                h.source_error.value
                + h.cues["reassuring"].reliance.value * round(share * 400) / 400
            )
            assert p.predicted_error.value == pytest.approx(want)
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
    for p in sel.ranking:
        d = np.asarray(rel.draws[(p.name, "hard", "all", "source_error")][:n]).copy()
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
        assert set(c["predicted_error"]) == {"value", "ci"}
        assert set(c["source_error"]) == {"value", "ci", "n"}
        assert "rank_by_source_error" in c
    assert doc["ranking_by_source_error"] == ["reader", "steady"] and doc["error"] == "hard"


def test_undefined_share_gives_nan_predictions_and_says_so(crossing):
    _, _, rel = crossing
    cal_c = ["reassuring"] * 10 + ["none"] * 10  # no alarming scene: its share is undefined
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    with pytest.warns(UndefinedMetricWarning):
        sh = estimate_shift(np.zeros((20, 2), bool), cal_f, cal_c, prior=0.5, n_boot=50, rng=0)
    with pytest.warns(
        UndefinedMetricWarning, match="misleading share of alarming text is undefined"
    ):
        sel = select(rel, sh)
    assert all(math.isnan(p.predicted_error.value) for p in sel.ranking)
    assert sel.explanation.startswith("SRA cannot rank")
