"""bench/trained_world.py: its helpers (fast) and its quick run end to end (slow).

The figures of the full run are in bench/RESULTS.md (section ``trained-world``); the pair's
own checks (committed weights, held-out AUROC, SAFE lean) are tests/export/test_train.py's.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests._support.bench import load_bench


@pytest.fixture(scope="module")
def tw() -> Any:
    return load_bench("trained_world")


def _est(value: float, low: float, high: float) -> Any:
    from spotstop.diagnostics import ConfidenceInterval, Estimate

    return Estimate(value, ConfidenceInterval(low, high), 10)


def test_goal_helpers_read_value_and_interval(tw: Any) -> None:
    e = _est(0.25, 0.05, 0.4)
    assert tw.at_least(e, 0.2) and not tw.at_least(e, 0.3)
    assert tw.interval_above(e, 0.0) and not tw.interval_above(e, 0.05)
    assert not tw.interval_covers(e, 0.0) and tw.interval_covers(_est(0.01, -0.02, 0.03))
    nan = _est(math.nan, math.nan, math.nan)
    assert not tw.at_least(nan, 0.0) and not tw.interval_above(nan) and not tw.interval_covers(nan)


def test_the_table_aligns_and_says_which_goals_are_met(tw: Any) -> None:
    rows = [
        tw.Row("1", "pair AUROC", "0.950 [0.930, 0.970]", "768 scenes", ">= 0.9", True),
        tw.Row("4", "reliance", "+0.010 [-0.020, +0.040]", "24", "CI covers 0", False),
        tw.Row("7", "share", "0.900", "768 scenes", "", None),
    ]
    lines = tw.render(rows)
    assert lines[0].split()[0] == "#" and lines[0].rstrip().endswith("met")
    assert set(lines[1]) == {"-"}
    assert lines[2].endswith("yes") and lines[3].endswith("NO") and lines[4].endswith("-")
    col = lines[0].index("value")
    assert all(line[col:].startswith(r.value) for line, r in zip(lines[2:], rows, strict=True))


def test_the_demo_line_is_read_as_the_demo_prints_it(tw: Any) -> None:
    lines = ["", "The guard's answers follow the world's rule on 11 of 12 scenes (✗: not).", "x"]
    assert tw.demo_agreement(lines) == (11, 12)
    assert tw.demo_agreement(["nothing here"]) is None


def test_arrival_order_keeps_rooms_together_and_shuffles_within_them(tw: Any) -> None:
    sids = [f"r{i // 6}" for i in range(30)]
    order = tw.arrival_order(sids, seed=5)
    assert sorted(order.tolist()) == list(range(30))
    seen = [sids[i] for i in order]
    assert seen == sorted(seen, key=lambda s: int(s[1:]))  # room after room, first-seen order
    assert np.array_equal(order, tw.arrival_order(sids, seed=5))
    assert not np.array_equal(order, np.arange(30))


def test_calibration_cues_are_the_claims_signs_make(tw: Any) -> None:
    assert [tw.calibration_cue(c) for c in ("reassuring", "alarming", "neutral", "none")] == [
        "reassuring",
        "alarming",
        "none",
        "none",
    ]


def test_ranking_by_source_error_compares_each_rank(tw: Any) -> None:
    same = [
        SimpleNamespace(rank=1, rank_by_source_error=1),
        SimpleNamespace(rank=2, rank_by_source_error=2),
    ]
    swapped = [
        SimpleNamespace(rank=1, rank_by_source_error=2),
        SimpleNamespace(rank=2, rank_by_source_error=1),
    ]
    assert tw.ranks_follow_source_error(same) and not tw.ranks_follow_source_error(swapped)


def test_ba_draws_point_is_the_projects_balanced_accuracy(tw: Any) -> None:
    from spotstop.diagnostics import balanced_accuracy

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 40).astype(np.int8)
    f1, f2 = rng.random(80) < 0.5 + 0.3 * y, rng.random(80) < 0.5
    group = np.arange(80) // 4
    point, draws = tw.ba_draws(y, [f1, f2], group, n_boot=200, seed=1)
    for k, f in enumerate((f1, f2)):
        assert point[k] == pytest.approx(balanced_accuracy(y, f.astype(float), cut=0.5))
    assert draws.shape == (200, 2) and np.isfinite(draws).all()


def _scored(tw: Any, seed: int = 3) -> Any:
    from spotstop.export.world import WorldOptions, world_cases

    cases = world_cases(seed, WorldOptions(rooms=3, contrasts_per_room=4))
    rng = np.random.default_rng(seed)
    y = np.array([c.label for c in cases])
    room = np.array([int(c.room.room_id[-3:]) for c in cases])  # rooms shift the scores
    scores = {m: rng.normal(size=y.size) + y * d + 3 * room for m, d in (("a", 1.5), ("b", 0.5))}
    return tw.Scored("w", cases, scores)


def test_replay_flags_use_the_guards_rule_and_map_back_to_csv_order(tw: Any) -> None:
    from spotstop.calibrate import fit_frozen
    from spotstop.guard.policies import SituationPolicy, batch_inputs, replay, unsafe_mask

    sc = _scored(tw)
    fit = fit_frozen(sc.scores)
    order = tw.arrival_order(sc.sids, seed=2)
    fused = fit.fusion.fuse_many(sc.scores)
    frozen = tw.replay_flags(fit.policy, fit.fusion, sc, order)
    assert np.array_equal(frozen, unsafe_mask(fused, fit.policy.threshold))
    pol = SituationPolicy(window=8, min_refs=3, fallback=fit.policy)
    got = tw.replay_flags(pol, fit.fusion, sc, order)
    sids = [sc.sids[i] for i in order]
    x = batch_inputs(fit.fusion, {m: v[order] for m, v in sc.scores.items()}, sids)
    assert np.array_equal(got[order], replay(pol, x).unsafe)
    assert not np.array_equal(got, frozen)  # recentering changed some answers


def test_room_shift_is_the_sd_of_room_means_beside_the_label_gap(tw: Any) -> None:
    sc = _scored(tw)
    y, room = sc.label, sc.room_codes
    for m, (sd, gap) in tw.room_shift(sc).items():
        s = sc.scores[m]
        means = [
            float(np.mean([v for v, r in zip(s, room, strict=True) if r == k])) for k in range(3)
        ]
        assert sd == pytest.approx(float(np.std(means, ddof=1)))
        assert gap == pytest.approx(float(np.mean(s[y == 1]) - np.mean(s[y == 0])))
    # _scored moves every room by 3 (sd of 0, 3, 6 is 3) and member a's label gap is 1.5
    sd_a, gap_a = tw.room_shift(sc)["a"]
    assert 2.0 < sd_a < 4.0 and 0.5 < gap_a < 2.5


def test_scored_tables_keep_rooms_and_contrasts_of_their_world_apart(tw: Any) -> None:
    sc = _scored(tw)
    t = sc.table(sc.scores["a"])
    assert t.pairs.n == 12 and t.n_groups == 3
    assert all(s.startswith("w/room-") for s in sc.sids)
    assert sorted(set(sc.room_codes.tolist())) == [0, 1, 2]


def test_the_command_shown_in_results_has_no_local_paths(tw: Any) -> None:
    argv = ["--results", "--work", "/tmp/w", "--json=/tmp/x.json", "--n-boot", "100"]
    assert tw.shown_args(argv) == ["--results", "--n-boot", "100"]


@pytest.mark.slow
@pytest.mark.filterwarnings("default")  # a bench run reports; its warnings are printed, not raised
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """The whole bench on small worlds: every item reports, and what its quick run reliably
    reaches holds (with margin; the full run's figures are in bench/RESULTS.md)."""
    pytest.importorskip("torch")
    pytest.importorskip("rapidocr")
    from spotstop.export.train import TRAINED_DIR

    if not (TRAINED_DIR / "trained.json").is_file():
        pytest.skip("no committed trained weights")
    tw = load_bench("trained_world", "trained_world_quick")
    out = tmp_path / "rows.json"
    assert tw.main(["--quick", "--json", str(out), "--work", str(tmp_path / "w")]) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert {r["item"] for r in rows} == {str(i) for i in range(1, 9)}
    by = {r["what"]: r for r in rows}

    def value(what: str) -> float:
        return float(by[what]["value"].split()[0])

    def interval(row: dict[str, Any]) -> tuple[float, float]:
        lo, hi = row["value"].split("[")[1].split("]")[0].split(",")
        return float(lo), float(hi)

    # measured on the quick run: 0.994, 0.996, 0.898; the situation gain at full offsets
    # -0.005 [-0.029, +0.018] (12 scenes a room: its sign is noise at this size; the full run's
    # figure, in bench/RESULTS.md, is the goal's). What holds here: recentering on the room
    # is not worse than the frozen cut with its interval below 0 (a broken rule would be).
    assert value("pair AUROC (Avg-2, frozen statistics)") >= 0.9
    assert value("tiny-qwen3_5 AUROC") > 0.8 and value("tiny-lfm2_vl AUROC") > 0.8
    gain = by[f"offsets {max(tw.SITUATION_OFFSETS):g}: situation - frozen"]
    assert interval(gain)[1] > 0, gain
    # Conformal: given one calibration draw of n rooms at rank k, the miss rate on fresh scenes
    # is Beta(k, n + 1 - k) (mean k/(n + 1) <= alpha), not <= alpha: at n = 32 one draw in
    # twenty lies above 0.184 (this run: 0.188 [0.115, 0.280]). What holds: the measured
    # interval reaches that distribution's 99 % range. The goal's figure is the full run's.
    from scipy.stats import beta

    conformal = [r for r in rows if r["what"].startswith("conformal marginal")]
    assert len(conformal) == 1
    m = re.search(r"k=(\d+) of (\d+) rooms", conformal[0]["what"])
    assert m, conformal[0]
    k, n = int(m.group(1)), int(m.group(2))
    assert interval(conformal[0])[0] <= beta.ppf(0.99, k, n + 1 - k), conformal[0]
    world_rho = [
        r
        for r in rows
        if r["what"].startswith("int8 tiny") and r["what"].endswith(": Spearman on world scenes")
    ]
    assert len(world_rho) == 2 and all(float(r["value"]) >= 0.99 for r in world_rho)
    assert by["spotstop demo follows the world's rule"]["met"]
    # every goal row says whether it is met; reported-only rows say nothing
    assert all((r["met"] is None) == (r["goal"] == "") for r in rows)


def test_item_6_alone_replaces_only_its_rows_and_says_when_it_ran(tw: Any) -> None:
    """``--only-export --results``: the section keeps every other item's rows and text, item 6's
    old rows give way to the new ones in the same place and columns, and a note says how item 6
    ran again (an earlier such note is replaced, not piled up)."""
    rows = [
        tw.Row("1", "pair AUROC", "0.950 [0.930, 0.970]", "768 scenes", ">= 0.9", True),
        tw.Row("6", "int4 old", "0.9 (max|ds| 1.9, tol 1: FAIL)", "64 scores", ">= 0.95", False),
        tw.Row("6", "int4 older", "0.8", "64 scores", "", None),
        tw.Row("7", "share", "0.900", "768 scenes", "", None),
    ]
    section = "### The bench\n\nWhat it measures.\n\n```\n" + "\n".join(tw.render(rows)) + "\n```"
    new = [tw.Row("6", "int4 new", "0.99 (max|ds| 0.7, tol 1: ok)", "64 scores", ">= 0.95", True)]
    once = tw.replace_item_rows(section, "6", new, "Item 6 run again alone: first.")
    twice = tw.replace_item_rows(once, "6", new, "Item 6 run again alone: second.")
    head, table = twice.split("```\n")[0], twice.split("```\n")[1].rstrip("`\n").split("\n")
    assert head.startswith("### The bench\n\nWhat it measures.\n\nItem 6 run again alone: second.")
    assert "first." not in twice
    assert [line.split()[0] for line in table[2:]] == ["1", "6", "7"]
    old = tw.render(rows)
    assert table[:3] == old[:3] and table[-1] == old[-1]  # the other rows untouched
    col = old[0].index("value")
    assert table[3][col:].startswith(new[0].value) and table[3].endswith("yes")
    assert table[3].index(">= 0.95") == old[0].index("goal")
    with pytest.raises(ValueError, match="no table"):
        tw.replace_item_rows("no table here", "6", new, "x")
