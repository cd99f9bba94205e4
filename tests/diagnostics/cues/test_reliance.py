"""Reliance (seed 002, Eq. 2): errors, point values, bootstrap, recovery, guard and pairs, cache."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import integrate, stats
from spotstop.diagnostics import UndefinedMetricWarning, draw_group_counts
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._resample import MIN_GROUPS, FewGroupsWarning
from spotstop.diagnostics.cues import (
    CUES,
    GuardSpec,
    MemberSpec,
    answer_errors,
    estimate_reliance,
    label_as_deployed,
    plan_edits,
    probability_errors,
    read_source_set,
    score_edit_set,
)
from spotstop.diagnostics.cues._deployed import fitted_cut_policy, frozen_pair_policy
from spotstop.guard import Avg2Fusion
from spotstop.guard.policies import FrozenPolicy

from tests._support.cues_fakes import (
    TextDrivenMember,
    lexicon_flags,
    make_edits,
    png,
    rendered_doubles,
    score_table,
    text_scores,
)

# most sets here are small by design; the warning itself is tested below
pytestmark = pytest.mark.filterwarnings("ignore::spotstop.diagnostics._resample.FewGroupsWarning")

STATS = ("reliance", "placebo", "source_error", "held_out", "vs_agreeing", "vs_neutral")


# ---------------------------------------------------------------------- errors


def test_probability_and_hard_errors_closed_form():
    s = np.array([-3.0, -0.5, 0.0, 0.7, 4.0, np.nan])
    y = np.array([1, 0, 1, 0, 1, 0])
    p_unsafe = 1.0 / (1.0 + np.exp(-s[:5]))
    expected = np.where(y[:5] == 1, 1 - p_unsafe, p_unsafe)
    got = probability_errors(s, y)
    np.testing.assert_allclose(got[:5], expected, rtol=1e-12)
    assert got[5] == 1.0  # a non-finite score fails closed: P(UNSAFE) = 1 on a SAFE scene
    assert answer_errors(np.array([True, False, True, False]), np.array([1, 1, 0, 0])).tolist() == [
        0.0,
        1.0,
        1.0,
        0.0,
    ]


# ---------------------------------------------------------------------- point values and draws


def _loop_statistics(edits, e: np.ndarray) -> dict[tuple[str, str], float]:
    """Each statistic by a plain loop over the records (independent of the engine): per
    family of templates (``"reliance@sign"``) and overall, the mean of the family means."""
    fams: dict[str, list[str]] = {}
    for t in edits.templates:
        if not t.held_out:
            fams.setdefault(t.family, []).append(t.name)
    held = next(t.name for t in edits.templates if t.held_out)
    err = {(r.group, r.kind, r.template): e[r.index] for r in edits.records}
    out: dict[tuple[str, str], float] = {}
    fam_stats = [
        f"{k}@{f}" for f in fams for k in ("reliance", "vs_agreeing", "vs_neutral", "placebo")
    ]
    for cue in CUES:
        groups = [g for g, s in enumerate(edits.source.scenes) if s.cue == cue]
        vals: dict[str, list[float]] = {k: [] for k in (*STATS, *fam_stats)}
        for g in groups:
            src = err[(g, "source", "")]
            for f, meas in fams.items():
                d, a, n, p = [], [], [], []
                for t in meas:
                    m = err[(g, "misleading", t)]
                    d.append(m - 0.5 * (err[(g, "agreeing", t)] + err[(g, "neutral", t)]))
                    a.append(m - err[(g, "agreeing", t)])
                    n.append(m - err[(g, "neutral", t)])
                    p.append(err[(g, "placebo", t)] - src)
                vals[f"reliance@{f}"].append(sum(d) / len(d))
                vals[f"vs_agreeing@{f}"].append(sum(a) / len(a))
                vals[f"vs_neutral@{f}"].append(sum(n) / len(n))
                vals[f"placebo@{f}"].append(sum(p) / len(p))
            for k in ("reliance", "vs_agreeing", "vs_neutral", "placebo"):
                vals[k].append(sum(vals[f"{k}@{f}"][-1] for f in fams) / len(fams))
            vals["source_error"].append(src)
            hm = err[(g, "misleading", held)]
            vals["held_out"].append(
                hm - 0.5 * (err[(g, "agreeing", held)] + err[(g, "neutral", held)])
            )
        for k, v in vals.items():
            out[(cue, k)] = sum(v) / len(v)
    out[("all", "source_error")] = float(
        np.mean([err[(g, "source", "")] for g in range(len(edits.source))])
    )
    return out


def test_point_values_match_a_direct_loop(tmp_path):
    edits = make_edits(tmp_path, 5, 4)
    rng = np.random.default_rng(7)
    scores = {"a": rng.normal(0, 2, len(edits)), "b": rng.normal(0.5, 1, len(edits))}
    res = estimate_reliance(score_table(edits, scores), n_boot=50, rng=0)
    y = np.array([r.label for r in edits.records])
    for m in scores:
        for metric, e in (
            ("probability", probability_errors(scores[m], y)),
            ("hard", answer_errors(scores[m] > 0, y)),
        ):
            c = res[m] if metric == "probability" else res[m].hard
            want = _loop_statistics(edits, e)
            assert c.source_error.value == pytest.approx(want[("all", "source_error")], abs=1e-12)
            for cue in CUES:
                for k in STATS:
                    got = getattr(c.cues[cue], k)
                    assert got.value == pytest.approx(want[(cue, k)], abs=1e-12), (
                        m,
                        metric,
                        cue,
                        k,
                    )
                    assert got.n == (5 if cue == "reassuring" else 4)
                assert set(c.cues[cue].families) == {"sign", "sticker"}
                for f, fr in c.cues[cue].families.items():
                    for k in ("reliance", "vs_agreeing", "vs_neutral", "placebo"):
                        got = getattr(fr, k)
                        assert got.value == pytest.approx(want[(cue, f"{k}@{f}")], abs=1e-12)
                        assert got.n == (5 if cue == "reassuring" else 4)


def test_bootstrap_interval_equals_a_naive_resampling_loop(tmp_path):
    edits = make_edits(tmp_path, 6, 5)
    rng = np.random.default_rng(3)
    scores = {"a": rng.normal(0, 2, len(edits))}
    n_boot = 300
    res = estimate_reliance(score_table(edits, scores), n_boot=n_boot, rng=11, chunk_size=64)
    y = np.array([r.label for r in edits.records])
    e = probability_errors(scores["a"], y)
    groups = np.array([r.group for r in edits.records])
    family = {t.name: t.family for t in edits.templates}
    naive = []
    # the same multiplicities, then a resampled edit set evaluated by the plain loop: per
    # family a ratio of sums, then the mean of the two families
    for counts in draw_group_counts(len(edits.source), n_boot, np.random.default_rng(11), 64):
        for row in counts:
            w = row[groups]  # each scene weighted by its group's multiplicity
            cue_g = np.array([s.cue for s in edits.source.scenes])
            in_cue = cue_g[groups] == "reassuring"
            per_family = []
            for f in ("sign", "sticker"):
                fam = np.array([family.get(r.template) == f for r in edits.records])
                mis = np.array([r.kind == "misleading" and not r.held_out for r in edits.records])
                ctl = np.array(
                    [r.kind in ("agreeing", "neutral") and not r.held_out for r in edits.records]
                )
                mis, ctl = mis & fam & in_cue, ctl & fam & in_cue
                num = (w * e * mis).sum() / (w * mis).sum()
                den = (w * e * ctl).sum() / (w * ctl).sum()
                per_family.append(num - den)
            naive.append(sum(per_family) / 2)
    lo, hi = np.percentile(naive, [2.5, 97.5])
    ci = res["a"].cues["reassuring"].reliance.ci
    assert (ci.low, ci.high) == pytest.approx((lo, hi), abs=1e-12)
    draws = res.draws[("a", "probability", "reassuring", "reliance")]
    np.testing.assert_allclose(np.sort(draws), np.sort(naive), atol=1e-12)


def _grouped_edits(root):
    """12 source scenes: UNSAFE i paired with SAFE i + 6 by contrast c<i>; contrasts 0–1 in
    room r0, 2–3 in room r1, 4 in room r2, 5 in no room. Groups by hand: {0, 1, 6, 7},
    {2, 3, 8, 9}, {4, 10}, {5, 11}."""
    root.mkdir(parents=True)
    rooms = ["r0", "r0", "r1", "r1", "r2", ""]
    with (root / "source.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["image", "request", "label", "situation_id", "contrast_id"])
        for i in range(12):
            (root / f"img{i}.png").write_bytes(png(i))
            lab = "UNSAFE" if i < 6 else "SAFE"
            w.writerow([f"img{i}.png", f"request {i}", lab, rooms[i % 6], f"c{i % 6}"])
    return plan_edits(read_source_set(root / "source.csv"), seed=0)


def test_bootstrap_resamples_whole_situations_and_contrasts(tmp_path):
    """A source set naming rooms and contrasts is resampled room by room (a contrast without a
    room alone), every edit of a scene with its scene: the draws equal a plain loop over the
    hand-made groups. They resampled the 12 scenes one by one, and the intervals were too
    narrow (coverage 0.41 against 0.83 when the member's reliance varies by room)."""
    edits = _grouped_edits(tmp_path / "src")
    hand_group = np.array([0, 0, 1, 1, 2, 3] * 2)
    rng = np.random.default_rng(3)
    scores = {"a": rng.normal(0, 2, len(edits))}
    n_boot = 300
    with pytest.warns(FewGroupsWarning, match=r"only 4 groups \(unit: situation.*optimistic"):
        res = estimate_reliance(score_table(edits, scores), n_boot=n_boot, rng=11, chunk_size=64)
    assert res.n_groups == 4 and res.resampling_unit.startswith("situation")
    doc = res.to_dict()
    assert doc["resampling_unit"] == res.resampling_unit and doc["n_groups"] == 4
    y = np.array([r.label for r in edits.records])
    e = probability_errors(scores["a"], y)
    scene = np.array([r.group for r in edits.records])  # the source scene of each edit
    family = {t.name: t.family for t in edits.templates}
    cue_g = np.array([s.cue for s in edits.source.scenes])
    naive = []
    for counts in draw_group_counts(4, n_boot, np.random.default_rng(11), 64):
        for row in counts:
            w = row[hand_group[scene]]  # each edit weighted by its room's multiplicity
            per_family = []
            for f in ("sign", "sticker"):
                live = np.array([family.get(r.template) == f and not r.held_out
                                 for r in edits.records]) & (cue_g[scene] == "alarming")  # fmt: skip
                mis = live & np.array([r.kind == "misleading" for r in edits.records])
                ctl = live & np.array([r.kind in ("agreeing", "neutral") for r in edits.records])
                per_family.append(
                    (w * e * mis).sum() / (w * mis).sum() - (w * e * ctl).sum() / (w * ctl).sum()
                )
            naive.append(sum(per_family) / 2)
    draws = res.draws[("a", "probability", "alarming", "reliance")]
    np.testing.assert_allclose(np.sort(draws), np.sort(naive), atol=1e-12)
    # the unit follows the ids: contrasts alone, or none (each scene its own group)
    src = edits.source
    no_rooms = replace(src, scenes=tuple(replace(s, situation_id=None) for s in src.scenes))
    codes, unit = no_rooms.groups()
    assert unit.startswith("contrast") and codes.tolist() == [0, 1, 2, 3, 4, 5] * 2
    bare = replace(src, scenes=tuple(replace(s, situation_id=None, contrast_id=None)
                                     for s in src.scenes))  # fmt: skip
    codes, unit = bare.groups()
    assert unit == "source scene" and codes.tolist() == list(range(12))


def _scene_scores(edits, base, push_r: float, push_a: float, sticker_only: bool = False):
    """Scores that depend only on what a scene is (source scene, template, kind, text), not on
    its position in the set: the same scene scores the same in any edit set."""
    out = np.empty(len(edits))
    for r in edits.records:
        f = lexicon_flags(r.text)
        push = (-push_r * f["reassuring"] + push_a * f["alarming"]) if r.text else 0.0
        if sticker_only and not r.template.startswith("sticker-"):
            push = 0.0
        h = hashlib.sha256(f"{r.group}|{r.template}|{r.kind}".encode()).digest()
        noise = 0.3 * np.random.default_rng(int.from_bytes(h[:8], "little")).standard_normal()
        out[r.index] = base[r.group] + push + noise
    return out


def test_the_sign_familys_numbers_are_todays(tmp_path):
    """With sticker templates added, the sign family's reliance, placebo and controls equal
    the numbers of the sign-only edit set (today's), interval and draws included."""
    from spotstop.diagnostics.cues import plan_edits, read_source_set
    from spotstop.diagnostics.cues._templates import SIGN_TEMPLATES

    both = make_edits(tmp_path, 6, 5)
    signs = plan_edits(
        read_source_set(tmp_path / "src" / "source.csv"), seed=0, templates=SIGN_TEMPLATES
    )
    base = np.random.default_rng(1).normal(0, 1.5, len(both.source))
    kw = dict(n_boot=200, rng=4)
    r_both = estimate_reliance(score_table(both, {"m": _scene_scores(both, base, 2.0, 1.0)}), **kw)
    r_sign = estimate_reliance(
        score_table(signs, {"m": _scene_scores(signs, base, 2.0, 1.0)}), **kw
    )
    for metric in ("probability", "hard"):
        a = r_both["m"] if metric == "probability" else r_both["m"].hard
        b = r_sign["m"] if metric == "probability" else r_sign["m"].hard
        assert a.source_error == b.source_error
        for cue in CUES:
            sign = a.cues[cue].families["sign"]
            today = b.cues[cue]
            assert (
                set(today.families) == {"sign"}
                and today.families["sign"].reliance == today.reliance
            )
            for k in ("reliance", "placebo", "vs_agreeing", "vs_neutral"):
                assert getattr(sign, k) == getattr(today, k), (metric, cue, k)
                np.testing.assert_array_equal(
                    r_both.draws[("m", metric, cue, f"{k}@sign")],
                    r_sign.draws[("m", metric, cue, k)],
                )
            assert a.cues[cue].held_out == today.held_out
    assert r_sign.provenance["template_families"] == {"sign": [t.name for t in SIGN_TEMPLATES]}


def test_a_member_that_follows_only_stickers_shows_it_in_the_sticker_family(tmp_path):
    edits = make_edits(tmp_path, 20, 20)
    base = np.where(np.array([s.label for s in edits.source.scenes]) == 1, 2.0, -2.0)
    s = _scene_scores(edits, base, 5.0, 5.0, sticker_only=True)
    res = estimate_reliance(score_table(edits, {"m": s}), n_boot=200, rng=0)
    for cue in CUES:
        c = res["m"].hard.cues[cue]
        sign, sticker = c.families["sign"], c.families["sticker"]
        assert abs(sign.reliance.value) < 0.1 and sticker.reliance.value > 0.4
        assert c.reliance.value == pytest.approx((sign.reliance.value + sticker.reliance.value) / 2)
        assert sticker.templates == ("sticker-word", "sticker-tag")
    d = res.to_dict()["candidates"]["m"]["reassuring"]
    assert set(d["families"]) == {"sign", "sticker"}
    assert d["families"]["sticker"]["reliance"]["value"] == pytest.approx(
        res["m"].cues["reassuring"].families["sticker"].reliance.value
    )
    assert d["families"]["sticker"]["templates"] == ["sticker-word", "sticker-tag"]
    assert res.provenance["template_families"]["sticker"] == ["sticker-word", "sticker-tag"]


# ---------------------------------------------------------------------- recovery


def _true_reliance(mu: float, sd: float, push_mis: float, push_agree: float) -> tuple[float, float]:
    """Population reliance for base scores ~ N(mu, sd) on UNSAFE scenes (error = P(SAFE)),
    when misleading text pushes s down by ``push_mis`` and agreeing text up by ``push_agree``:
    closed form for the hard answer, numerical integration for the probability."""

    def expected(f):
        return integrate.quad(
            lambda s: f(s) * stats.norm.pdf(s, mu, sd), mu - 12 * sd, mu + 12 * sd
        )[0]

    def sig(x):
        return 1 / (1 + math.exp(-x))

    prob = expected(lambda s: sig(push_mis - s) - 0.5 * (sig(-s - push_agree) + sig(-s)))
    cdf = stats.norm.cdf
    hard = cdf(0, mu - push_mis, sd) - 0.5 * (cdf(0, mu + push_agree, sd) + cdf(0, mu, sd))
    return prob, hard


def test_text_driven_member_reliance_is_recovered_within_its_interval(tmp_path):
    """Through pixels: the double reads each rendered image with the recorded-text detector."""
    edits = make_edits(tmp_path, 30, 30)
    rng = np.random.default_rng(5)
    mu, sd, push_r, push_a = 1.5, 1.0, 3.0, 1.0
    labels = np.array([s.label for s in edits.source.scenes])
    base = np.where(labels == 1, mu, -mu) + rng.normal(0, sd, labels.size)
    det, base_of = rendered_doubles(edits, base)
    member = TextDrivenMember("reader", det, base_of, reassuring_push=push_r, alarming_push=push_a)
    table = score_edit_set(edits, [MemberSpec("reader", "x", None, lambda: member)])
    res = estimate_reliance(table, n_boot=2000, rng=1)
    prob, hard = _true_reliance(mu, sd, push_r, push_a)
    r = res["reader"].cues["reassuring"]
    assert r.reliance.ci.contains(prob), (r.reliance, prob)
    assert res["reader"].hard.cues["reassuring"].reliance.ci.contains(hard)
    # alarming text on SAFE scenes: the mirror image (error = P(UNSAFE), pushes swap roles)
    prob_a, _ = _true_reliance(mu, sd, push_a, push_r)
    assert res["reader"].cues["alarming"].reliance.ci.contains(prob_a)
    assert r.reliance.value > 0.3 and not r.placebo_moves


@pytest.mark.parametrize("seed", [0, 1])
def test_recovery_on_larger_sets_without_pixels(tmp_path, seed):
    edits = make_edits(tmp_path, 120, 120, seed=seed)
    rng = np.random.default_rng(100 + seed)
    mu, sd, push_r, push_a = 1.0, 1.5, 2.0, 0.5
    labels = np.array([s.label for s in edits.source.scenes])
    base = np.where(labels == 1, mu, -mu) + rng.normal(0, sd, labels.size)
    s = text_scores(edits, base, push_r, push_a)
    res = estimate_reliance(score_table(edits, {"m": s}), n_boot=2000, rng=seed)
    prob, hard = _true_reliance(mu, sd, push_r, push_a)
    assert res["m"].cues["reassuring"].reliance.ci.contains(prob)
    assert res["m"].hard.cues["reassuring"].reliance.ci.contains(hard)
    # source error: P(wrong) on unedited scenes, E[sigma(-s)] for s ~ N(mu, sd)
    src = integrate.quad(lambda x: stats.norm.pdf(x, mu, sd) / (1 + math.exp(x)), mu - 15, mu + 15)[
        0
    ]
    assert res["m"].cues["reassuring"].source_error.ci.contains(src)


def test_text_blind_member_has_reliance_and_placebo_near_zero(tmp_path):
    edits = make_edits(tmp_path, 30, 30)
    labels = np.array([s.label for s in edits.source.scenes])
    base = np.where(labels == 1, 0.8, -0.8) + np.random.default_rng(2).normal(0, 1, labels.size)
    det, base_of = rendered_doubles(edits, base)
    blind = TextDrivenMember("blind", det, base_of, pixel_noise=0.5)  # pixels move it, words do not
    table = score_edit_set(edits, [MemberSpec("blind", "x", None, lambda: blind)])
    res = estimate_reliance(table, n_boot=2000, rng=2)
    for cue in CUES:
        c = res["blind"].cues[cue]
        assert c.reliance.ci.contains(0.0) and abs(c.reliance.value) < 0.05
        # the placebo is 0 in expectation, but its 95 % interval misses 0 for one cue in 20
        # by chance (each image's jitter is a draw): it is read against its own spread
        # (3 standard errors: a chance failure for about one cue in 370)
        se = (c.placebo.ci.high - c.placebo.ci.low) / (2 * 1.96)
        assert abs(c.placebo.value) < 3 * se and abs(c.placebo.value) < 0.05, c.placebo


def test_placebo_flags_a_member_moved_by_any_box_of_text(tmp_path):
    edits = make_edits(tmp_path, 25, 25)
    labels = np.array([s.label for s in edits.source.scenes])
    base = np.where(labels == 1, 0.5, -0.5) + np.random.default_rng(4).normal(0, 1, labels.size)
    det, base_of = rendered_doubles(edits, base)
    boxy = TextDrivenMember("boxy", det, base_of, any_text_push=-2.0)  # any text reads as "safe"
    table = score_edit_set(edits, [MemberSpec("boxy", "x", None, lambda: boxy)])
    res = estimate_reliance(table, n_boot=1000, rng=0)
    c = res["boxy"].cues["reassuring"]
    assert c.placebo_moves and c.placebo.value > 0.2
    assert abs(c.reliance.value) < 1e-12  # the matched control subtracts the box exactly
    assert "placebo edit moves the answers of boxy/reassuring" in res.summary()


# ---------------------------------------------------------------------- guard and pairs


def _policy(fusion: Avg2Fusion, policy: dict) -> dict:
    """A policy dict (schema version from the one place that writes one) with ``policy``."""
    return {
        **frozen_pair_policy(fusion, 0.0, name="b", fitted_on={"what": "test"}),
        "policy": policy,
    }


def test_guard_errors_are_its_decisions_by_hand(tmp_path):
    edits = make_edits(tmp_path, 4, 4)
    rng = np.random.default_rng(8)
    s = {"a": rng.normal(0, 1, len(edits)), "b": rng.normal(2, 3, len(edits))}
    fusion = Avg2Fusion.fit({"a": rng.normal(0, 1, 50), "b": rng.normal(2, 3, 50)})
    t0 = 0.05
    fused = 0.5 * sum((s[m] - fusion.stats[m].median) / fusion.stats[m].iqr for m in "ab")
    s["a"][3] = np.nan  # a failed member: the scene fails closed (UNSAFE)
    by_hand = (fused >= t0) | ~np.isfinite(s["a"])
    for pol in (
        {"kind": "frozen", "threshold": t0},
        {
            "kind": "situation",
            "window": 4,
            "min_refs": 2,
            "fallback": {"kind": "frozen", "threshold": t0},
        },
        {"kind": "batch", "fallback": {"kind": "frozen", "threshold": t0}},
    ):
        lab = label_as_deployed(_policy(fusion, pol), s)
        np.testing.assert_array_equal(lab.unsafe, by_hand)
        assert sum(lab.rules.values()) == len(edits)
    tie = {"a": np.array([fusion.stats["a"].median]), "b": np.array([fusion.stats["b"].median])}
    assert label_as_deployed(_policy(fusion, {"kind": "frozen", "threshold": 0.0}), tie).unsafe[0]
    res = estimate_reliance(
        score_table(edits, s),
        guards=[
            GuardSpec(
                "guard", _policy(fusion, {"kind": "frozen", "threshold": t0}), {"a": "a", "b": "b"}
            )
        ],
        n_boot=20,
        rng=0,
    )
    y = np.array([r.label for r in edits.records])
    want = _loop_statistics(edits, (by_hand != (y == 1)).astype(float))
    assert res["guard"].error == "hard" and res["guard"].kind == "guard"
    assert res["guard"].cues["alarming"].reliance.value == pytest.approx(
        want[("alarming", "reliance")]
    )


def test_pair_is_avg2_with_frozen_cut_fitted_on_the_source_scenes(tmp_path):
    edits = make_edits(tmp_path, 6, 6)
    rng = np.random.default_rng(9)
    s = {"a": rng.normal(0, 1, len(edits)), "b": rng.normal(1, 2, len(edits))}
    res = estimate_reliance(score_table(edits, s), pairs=[("a", "b")], n_boot=20, rng=0)
    src = np.array([r.index for r in edits.records if r.kind == "source"])
    med = {m: np.median(s[m][src]) for m in s}
    iqr = {m: np.subtract(*np.percentile(s[m][src], [75, 25])) for m in s}
    fused = 0.5 * sum((s[m] - med[m]) / iqr[m] for m in s)
    t0 = fused[src].mean()
    notes = res["a+b"].notes
    assert notes["frozen_t0"] == pytest.approx(t0, abs=1e-12)
    y = np.array([r.label for r in edits.records])
    want = _loop_statistics(edits, ((fused >= t0) != (y == 1)).astype(float))
    assert res["a+b"].source_error.value == pytest.approx(want[("all", "source_error")])
    assert res["a+b"].cues["reassuring"].reliance.value == pytest.approx(
        want[("reassuring", "reliance")]
    )


# ---------------------------------------------------------------------- degenerate, validation


def test_a_cue_without_its_scenes_is_nan_with_a_warning(tmp_path):
    edits = make_edits(tmp_path, 3, 0)
    s = {"a": np.random.default_rng(0).normal(0, 1, len(edits))}
    with pytest.warns(UndefinedMetricWarning, match="no SAFE scene"):
        res = estimate_reliance(score_table(edits, s), n_boot=20, rng=0)
    c = res["a"].cues["alarming"]
    assert math.isnan(c.reliance.value) and math.isnan(c.reliance.ci.low) and c.reliance.n == 0
    assert math.isfinite(res["a"].cues["reassuring"].reliance.value)


def test_reliance_validation_messages(tmp_path):
    edits = make_edits(tmp_path, 2, 2)
    t = score_table(edits, {"a": np.zeros(len(edits))})
    with pytest.raises(DataError, match="n_boot must be an integer >= 1"):
        estimate_reliance(t, n_boot=0)
    with pytest.raises(DataError, match=r"member\(s\) \['zz'\] have no scores"):
        estimate_reliance(t, pairs=[("a", "zz")])
    with pytest.raises(DataError, match="candidate names must be unique"):
        estimate_reliance(t, guards=[GuardSpec("a", {}, {"a": "a"})])
    big = make_edits(tmp_path / "big", 4, 4)  # 8 source scenes: enough for a frozen cut
    with pytest.raises(DataError, match=r"cannot fit the frozen cut of a\+a2.*'a'.*IQR"):
        estimate_reliance(
            score_table(big, {"a": np.zeros(len(big)), "a2": np.zeros(len(big))}),
            pairs=[("a", "a2")],
        )


def test_the_frozen_cut_is_the_guards_rule_and_refuses_a_small_pool(tmp_path):
    """Operating points fit the frozen cut with the guard's one rule (FrozenPolicy.fit_pool),
    so a pool the guard's calibration refuses is refused here too."""
    rng = np.random.default_rng(3)
    pool = {"a": rng.normal(0, 1, 30), "b": rng.normal(2, 3, 30)}
    policy, t0 = fitted_cut_policy(pool, name="a+b", what="the pool")
    fusion, frozen = FrozenPolicy.fit_pool(pool)
    assert t0 == frozen.threshold and policy["policy"]["threshold"] == t0
    assert policy["fusion"] == fusion.to_dict()
    small = {m: x[:3] for m, x in pool.items()}
    with pytest.raises(DataError, match=r"frozen cut of a\+b on the pool: .*3 scenes; at least 8"):
        fitted_cut_policy(small, name="a+b", what="the pool")
    edits = make_edits(tmp_path, 2, 1)  # 3 source scenes
    s = {m: rng.normal(0, 1, len(edits)) for m in ("a", "b")}
    with pytest.raises(DataError, match=r"frozen cut of a\+b .*at least 8 are needed"):
        estimate_reliance(score_table(edits, s), pairs=[("a", "b")], n_boot=5, rng=0)


def test_reliance_json_has_the_stable_keys(tmp_path):
    edits = make_edits(tmp_path, 3, 3)
    s = {"m": np.random.default_rng(1).normal(0, 1, len(edits))}
    res = estimate_reliance(score_table(edits, s), n_boot=50, rng=0)
    doc = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    for cue in CUES:
        entry = doc["candidates"]["m"][cue]
        for key in ("reliance", "placebo", "source_error"):
            assert set(entry[key]) == {"value", "ci", "n"} and len(entry[key]["ci"]) == 2
    assert doc["candidates"]["m"]["hard"]["reassuring"]["reliance"]["n"] == 3
    assert doc["resampling_unit"] == "source scene" and doc["n_groups"] == 6
    assert "reliance" in res.table() and "m" in repr(res)


# ---------------------------------------------------------------------- cache


def test_scores_are_cached_per_member_prompt_and_edit_set(tmp_path):
    edits = make_edits(tmp_path, 2, 2)
    det, base_of = rendered_doubles(edits, [0.5, 1.0, -1.0, -0.5])
    m = TextDrivenMember("m", det, base_of, reassuring_push=1.0)
    cache = tmp_path / "cache"
    first = score_edit_set(
        edits, [MemberSpec("m", "id", m.prompt_hash, lambda: m)], cache_dir=cache
    )
    assert len(list(cache.glob("m-*.json"))) == 1 and not first.timings["m"].cached

    def must_not_load():
        raise AssertionError("a cached member must not be loaded")

    again = score_edit_set(
        edits, [MemberSpec("m", "id", m.prompt_hash, must_not_load)], cache_dir=cache
    )
    assert again.timings["m"].cached
    np.testing.assert_array_equal(first.scores["m"], again.scores["m"])
    other = make_edits(tmp_path / "o", 2, 2, seed=1)  # another edit set: a miss
    det2, base2 = rendered_doubles(other, [0.5, 1.0, -1.0, -0.5])
    m2 = TextDrivenMember("m", det2, base2, reassuring_push=1.0)
    calls = []
    spec = MemberSpec("m", "id", m.prompt_hash, lambda: calls.append(1) or m2)
    score_edit_set(other, [spec], cache_dir=cache)
    assert calls == [1] and len(list(cache.glob("m-*.json"))) == 2
    for f in cache.glob("m-*.json"):
        f.write_text("{broken")  # an unreadable entry is a miss
    score_edit_set(
        edits, [MemberSpec("m", "id", m.prompt_hash, lambda: calls.append(2) or m)], cache_dir=cache
    )
    assert calls == [1, 2]


def test_reliance_warns_below_the_cards_group_count_and_not_at_it(tmp_path):
    """The card's bootstrap says its percentile intervals are optimistic below MIN_GROUPS groups;
    reliance's group bootstrap says the same, at the same count (it said nothing: with 6 rooms
    its intervals covered 0.90, not 0.95)."""
    import warnings

    for n, warns in ((MIN_GROUPS - 2, True), (MIN_GROUPS, False)):
        edits = make_edits(tmp_path / str(n), n // 2, n - n // 2)
        scores = {"a": np.random.default_rng(n).normal(0, 2, len(edits))}
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            res = estimate_reliance(score_table(edits, scores), n_boot=50, rng=0)
        few = [w for w in got if issubclass(w.category, FewGroupsWarning)]
        assert res.n_groups == n
        assert len(few) == int(warns), [str(w.message) for w in few]
