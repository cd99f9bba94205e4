"""The vectorized group bootstrap against a naive loop, and its guarantees."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score
from spotstop.diagnostics import (
    BootstrapResult,
    CaseTable,
    DataError,
    Estimate,
    UndefinedMetricWarning,
    bootstrap_auroc,
    draw_group_counts,
    group_bootstrap,
    pair_rates,
    simulate_log,
    spot_stop,
)
from spotstop.diagnostics._engine import CurveEngine
from spotstop.diagnostics._resample import (
    FewGroupsWarning,
    UnboundedRatioWarning,
    random_halves,
)
from spotstop.guard.policies import unsafe_mask

from tests._support.case_tables import materialize, pairs_table, small_tables


def naive_cross_fit(table: CaseTable, counts, half, cut):
    """Fit the cut on the drawn groups of one half (first best, placed at the highest fit
    score answered SAFE), score it on the other half; exact integer comparisons."""

    def sub(mask):
        c = np.where(mask, counts, 0)
        return materialize(table, c) if c.sum() else None

    def best_cut(t):
        p = t.pairs
        m = p.weight > 0
        y, s, w = t.label[m], t.score[m], p.weight[m]
        ts, tu = w[y == 0].sum(), w[y == 1].sum()
        best, cut_best = 0.0, -math.inf  # D(-inf) = 0
        for c in np.unique(s):
            tn = w[(y == 0) & (s <= c)].sum()
            tp = w[(y == 1) & (s > c)].sum()
            d = tn * tu + tp * ts - ts * tu  # proportional to BA - 1/2
            if d > best:
                best, cut_best = d, c
        return cut_best

    parts, ns = [], []
    for fit, ev in ((half, ~half), (~half, half)):
        tf, te = sub(fit), sub(ev)
        c = best_cut(tf)
        s = te.score
        p = te.pairs
        gain = pair_rates(s[p.safe], s[p.unsafe], c).A - pair_rates(s[p.safe], s[p.unsafe], cut).A
        parts.append(gain)
        ns.append(p.n)
    return (parts[0] * ns[0] + parts[1] * ns[1]) / (ns[0] + ns[1])


def naive_draw(table: CaseTable, counts, cut):
    t = materialize(table, counts)
    ss = spot_stop(t, cut)
    p = t.pairs
    m = p.weight > 0
    # AUROC with sklearn on the explicit draw
    au = roc_auc_score(t.label[m], t.score[m], sample_weight=p.weight[m])
    # the batch-mean cut with the guard's own rule (S >= t, ties UNSAFE), pair-weighted
    flag = unsafe_mask(t.score, float(np.mean(t.score)))
    batch = 0.5 * (flag[p.unsafe].mean() + (~flag[p.safe]).mean())
    return ss, au, batch


@settings(max_examples=25, deadline=None)
@given(t=small_tables(), seed=st.integers(0, 10_000), cut=st.sampled_from([0.0, 0.25]))
def test_vectorized_equals_naive_loop(t, seed, cut):
    prep = CurveEngine.build(t, cut)
    rng = np.random.default_rng(seed)
    counts = next(draw_group_counts(t.n_groups, 6, rng))
    halves = random_halves(rng, 6, t.n_groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        stats = prep.statistics(counts, halves)
        for b in range(6):
            lab = t.label[np.isin(t.group, np.flatnonzero(counts[b]))]
            if t.pairs.n == 0 or len(set(lab.tolist())) < 2:
                continue
            ss, au, a_batch = naive_draw(t, counts[b], cut)
            assert stats["auroc"][b] == pytest.approx(au)
            for k in (
                "R",
                "L",
                "W",
                "A",
                "A_star",
                "threshold_part",
                "overlap_part",
                "within_part",
                "tied_share",
                "R_half",
                "R_half_minus_A",
                "tie_part",
                "null_gap",
                "excess_beyond_g",
            ):
                assert stats[k][b] == pytest.approx(getattr(ss, k)), k
            assert stats["A_batch"][b] == pytest.approx(a_batch)
            assert stats["d_prime"][b] == pytest.approx(ss.d_prime)
            h = halves[b]
            have = [
                len(set(t.label[np.isin(t.group, np.flatnonzero(counts[b] * m))].tolist())) == 2
                for m in (h, ~h)
            ]
            if all(have) and all(t.pairs.n for _ in have):
                assert stats["cross_fitted_threshold_part"][b] == pytest.approx(
                    naive_cross_fit(t, counts[b], h, cut)
                )


def test_same_rng_same_draws_and_naive_bootstrap_reproduced(monkeypatch):
    from spotstop.diagnostics import _resample

    monkeypatch.setattr(_resample, "BLOCK_DRAWS", 12)  # blocks of 12, 12 and 6 draws
    t = simulate_log(40, rng=1)
    with warnings.catch_warnings():  # 30 draws: the threshold part's interval may reach 0
        warnings.simplefilter("ignore", UnboundedRatioWarning)
        res = group_bootstrap(t, n_boot=30, rng=np.random.default_rng(9), chunk_size=7)
    # replay the scheme: one call of the generator seeds the blocks; block i's child seed i
    # spawns the counts' and the halves' generators
    words = np.random.default_rng(9).integers(0, 2**32, size=4, dtype=np.uint64)
    root = np.random.SeedSequence([int(w) for w in words])
    prep = CurveEngine.build(t, 0.0)
    aur, rr, cf, n_draws = [], [], [], 0
    for i, child in enumerate(root.spawn(3)):
        assert child.spawn_key == (i,)
        g_counts, g_halves = (np.random.default_rng(s) for s in child.spawn(2))
        b = min(12, 30 - n_draws)
        n_draws += b
        picks = g_counts.integers(0, t.n_groups, size=(b, t.n_groups))
        counts = np.array([np.bincount(p, minlength=t.n_groups) for p in picks], dtype=float)
        for c in counts:
            ss, au, _ = naive_draw(t, c, 0.0)
            aur.append(au)
            rr.append(ss.R_minus_A)
        cf.append(prep.cross_fit(counts, random_halves(g_halves, b, t.n_groups)))
    assert n_draws == 30
    np.testing.assert_allclose(res.draws["auroc"], aur)
    np.testing.assert_allclose(res.draws["R_minus_A"], rr)
    np.testing.assert_array_equal(res.draws["cross_fitted_threshold_part"], np.concatenate(cf))


@pytest.mark.parametrize("decimals", [1, 2])
def test_draws_do_not_depend_on_memory_budget_or_chunk(decimals):
    # blocks of BLOCK_DRAWS draws, each from its own seed: the memory budget (draws swept
    # together), the chunk of draws generated at once and the block order change nothing
    from spotstop.diagnostics._bootstrap import block_statistics
    from spotstop.diagnostics._resample import draw_blocks

    t = simulate_log(300, rng=decimals)
    t = CaseTable(
        case_id=t.case_id,
        label=t.label,
        contrast_id=t.contrast_id,
        situation_id=t.situation_id,
        score=np.round(t.score, decimals),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        ref = group_bootstrap(t, n_boot=620, rng=4)
        for kw in (
            {"memory_budget": 1},
            {"memory_budget": 2**33, "chunk_size": 3},
            {"chunk_size": 250},
        ):
            other = group_bootstrap(t, n_boot=620, rng=4, **kw)
            for k, d in ref.draws.items():
                np.testing.assert_array_equal(other.draws[k], d, err_msg=f"{k} {kw}")
            assert repr(other) == repr(ref)
        # the blocks in reverse order, each on its own, give the same draws
        prep = CurveEngine.build(t, 0.0)
        blocks = draw_blocks(np.random.default_rng(4), 620)
        assert [b.n_draws for b in blocks] == [250, 250, 120]
        back = {b.index: block_statistics(prep, b, 50) for b in reversed(blocks)}
    for k, d in ref.draws.items():
        np.testing.assert_array_equal(np.concatenate([back[i][k] for i in range(3)]), d)


def test_group_counts_are_multinomial():
    rng = np.random.default_rng(0)
    c = np.concatenate(list(draw_group_counts(5, 20_000, rng, 3000)))
    assert c.shape == (20_000, 5)
    assert np.all(c.sum(axis=1) == 5)
    assert c.mean(axis=0) == pytest.approx(np.ones(5), abs=0.03)
    assert c.var(axis=0) == pytest.approx(np.full(5, 5 * 0.2 * 0.8), rel=0.05)


def test_full_bootstrap_10000_draws_parts_add_up_draw_by_draw():
    t = simulate_log(600, rng=2)
    res = group_bootstrap(t, rng=3)  # default: 10,000 draws
    assert isinstance(res, BootstrapResult) and res.n_boot == 10_000
    d = res.draws
    assert d["R"].shape == (10_000,)
    np.testing.assert_allclose(
        d["threshold_part"] + d["overlap_part"] + d["within_part"], d["R_half_minus_A"], atol=1e-12
    )
    np.testing.assert_allclose(d["tie_part"] + d["R_half_minus_A"], d["R_minus_A"], atol=1e-12)
    np.testing.assert_allclose(d["G"] - d["null_gap"], d["R_half_minus_A"], atol=1e-12)
    assert np.all(d["threshold_part"] >= -1e-12)
    ss = spot_stop(t)
    for k in ("R", "A", "auroc", "A_star", "threshold_part", "overlap_part", "within_part"):
        e = res[k]
        assert e.value == pytest.approx(getattr(ss, k))
        assert e.ci.low <= e.value <= e.ci.high
        assert e.n == 600
    assert res["R"].ci.high - res["R"].ci.low == pytest.approx(
        2 * 1.96 * math.sqrt(ss.R * (1 - ss.R) / 600), rel=0.15
    )
    assert "R=Estimate(value=" in repr(res)


def test_bootstrap_is_reproducible_and_invariant_to_case_order():
    t = simulate_log(60, rng=4)
    with warnings.catch_warnings():
        # 60 contrasts: the threshold part's interval reaches 0 (batch_recovery undefined)
        warnings.simplefilter("ignore", UnboundedRatioWarning)
        a = group_bootstrap(t, n_boot=200, rng=5)
        b = group_bootstrap(t, n_boot=200, rng=5)
        # reversing the cases changes the group codes but not the point estimates
        r = group_bootstrap(t.subset(np.arange(len(t))[::-1]), n_boot=200, rng=5)
    assert a["R_minus_A"] == b["R_minus_A"]
    for k in ("R", "A", "auroc", "within_part", "A_batch"):
        assert r[k].value == pytest.approx(a[k].value)


def test_bootstrap_degenerate_and_errors():
    no_pairs = CaseTable(
        case_id=["a", "b"],
        label=[0, 1],
        score=[0.0, 1.0],
        contrast_id=["", ""],
        situation_id=["", ""],
    )
    with pytest.warns(UndefinedMetricWarning, match="no contrasts"):
        res = group_bootstrap(no_pairs, n_boot=10, rng=0)
    assert math.isnan(res["R"].value) and math.isnan(res["R"].ci.low)
    with pytest.raises(DataError, match="n_boot must be an integer >= 1; got 0"):
        group_bootstrap(simulate_log(5, rng=0), n_boot=0)
    with pytest.raises(DataError, match="rng must be a numpy Generator"):
        group_bootstrap(simulate_log(5, rng=0), rng="seed")  # type: ignore[arg-type]
    with pytest.warns(UndefinedMetricWarning):
        e = bootstrap_auroc(
            np.zeros(3, dtype=np.int8), np.arange(3.0), np.arange(3), n_boot=5, rng=0
        )
    assert math.isnan(e.value)


def test_bootstrap_auroc_and_estimate_repr():
    t = simulate_log(100, rng=6)
    e = bootstrap_auroc(t.label, t.score, t.group, n_boot=300, rng=1)
    assert e.value == pytest.approx(roc_auc_score(t.label, t.score))
    assert e.ci.low < e.value < e.ci.high and e.n == 200
    assert repr(e).startswith("Estimate(value=0.")
    assert Estimate(math.nan, e.ci, 0).to_dict()["value"] is None


def test_the_progress_bar_shows_the_draws_and_changes_no_number(capsys):
    t = simulate_log(40, rng=0)
    with_bar = group_bootstrap(t, n_boot=20, rng=0, progress=True)
    err = capsys.readouterr().err
    assert "group bootstrap" in err and "/20" in err and "draw/s" in err
    without = group_bootstrap(t, n_boot=20, rng=0, progress=False)
    for key in ("auroc", "threshold_part", "R_minus_A"):
        assert with_bar[key] == without[key], key


def test_batch_recovery_without_threshold_room_is_nan_with_a_warning():
    t = pairs_table([-1.0, -2.0, -0.5], [1.0, 2.0, 0.5])  # the direct cut 0 is already best
    with (
        pytest.warns(UnboundedRatioWarning, match="batch_recovery .* is undefined"),
        pytest.warns(FewGroupsWarning, match="only 3 groups"),
    ):
        b = group_bootstrap(t, n_boot=50, rng=0)
    assert b["threshold_part"].value == 0.0 and math.isnan(b["batch_recovery"].value)
    assert not np.isinf(b.draws["batch_recovery"]).any()


@pytest.mark.parametrize("decimals", [None, 1])
def test_sweep_across_blocks_and_sub_chunks_equals_naive_loop(decimals):
    # 1,000 paired cases: several blocks of BLOCK_ROWS unique scores (with decimals=1 many
    # ties across classes), swept one draw at a time (memory_budget=1) and all at once
    from spotstop.diagnostics._engine import BLOCK_ROWS

    t = simulate_log(500, rng=4)
    if decimals is not None:
        t = CaseTable(
            case_id=t.case_id,
            label=t.label,
            contrast_id=t.contrast_id,
            situation_id=t.situation_id,
            score=np.round(t.score, decimals),
        )
    rng = np.random.default_rng(5)
    counts = next(draw_group_counts(t.n_groups, 4, rng))
    halves = random_halves(rng, 4, t.n_groups)
    prep = CurveEngine.build(t, 0.0)
    if decimals is None:
        assert prep.v.size > 3 * BLOCK_ROWS
    tiny = CurveEngine.build(t, 0.0, memory_budget=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        stats = prep.statistics(counts, halves)
        one_by_one = tiny.statistics(counts, halves)
    for k, v in stats.items():
        np.testing.assert_array_equal(v, one_by_one[k], err_msg=k)
    for b in range(4):
        ss, au, a_batch = naive_draw(t, counts[b], 0.0)
        assert stats["auroc"][b] == pytest.approx(au, abs=1e-12)
        assert stats["A_star"][b] == pytest.approx(ss.A_star, abs=1e-12)
        assert stats["A_batch"][b] == pytest.approx(a_batch, abs=1e-12)
        assert stats["cross_fitted_threshold_part"][b] == pytest.approx(
            naive_cross_fit(t, counts[b], halves[b], 0.0), abs=1e-12
        )


def test_memory_budget_is_validated():
    with pytest.raises(DataError, match="memory_budget must be an integer >= 1"):
        group_bootstrap(simulate_log(40, rng=1), n_boot=10, memory_budget=0)


@pytest.mark.parametrize("n_groups", [1, 2, 7, 301, 5000])
def test_sub_blocks_give_the_stream_of_one_call(monkeypatch, n_groups):
    # the counts and halves, generated in sub-blocks of rows, equal their one-call definitions
    from spotstop.diagnostics import _resample

    monkeypatch.setattr(_resample, "_SUB_BLOCK", 3 * n_groups + 1)  # sub-blocks of 3 rows
    got, want = np.random.default_rng(3), np.random.default_rng(3)
    for counts in draw_group_counts(n_groups, 23, got, 10):
        b = counts.shape[0]
        picks = want.integers(0, n_groups, size=(b, n_groups))
        np.testing.assert_array_equal(counts, [np.bincount(p, minlength=n_groups) for p in picks])
        half = random_halves(got, b, n_groups)
        ranks = np.argsort(want.random((b, n_groups)), axis=1)[:, : n_groups // 2]
        expect = np.zeros((b, n_groups), dtype=bool)
        np.put_along_axis(expect, ranks, True, axis=1)
        np.testing.assert_array_equal(half, expect)
    assert got.bit_generator.state == want.bit_generator.state


def test_merged_rows_hold_one_class_runs():
    # neighbouring one-class scores form one row; a score with both classes stays alone
    t = pairs_table([1.0, 2.0, 3.0, 5.0], [4.0, 5.0, 6.0, 7.0])
    prep = CurveEngine.build(t, 0.0)
    assert prep.v.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert prep.runs.start.tolist() == [0, 3, 4, 5]
    assert prep.runs.end.tolist() == [2, 3, 4, 6]
    assert prep.runs.safe.tolist() == [True, False, False, False]
    assert prep.runs.unsafe.tolist() == [False, True, False, True]


def test_materialize_keeps_copies_apart():
    t = pairs_table([0.0, 1.0], [2.0, 0.5])
    m = materialize(t, np.array([2, 0]))
    assert len(m) == 4 and m.pairs.n == 2 and m.n_groups == 2
