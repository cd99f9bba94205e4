"""The card writer and the CLI."""

from __future__ import annotations

import json
import math

import pytest
from spotstop.diagnostics import (
    CARD_CHECKS,
    FIELD_KEYS,
    CardCheck,
    CheckResult,
    Estimate,
    card_check,
    simulate_log,
    write_card,
)
from spotstop.diagnostics._cli import card_main

REQUIRED = (
    "auroc", "direct_balanced_accuracy", "R", "L", "A", "A_star", "R_minus_A", "threshold_part",
    "overlap_part", "within_part", "g_auroc", "cross_fitted_threshold_part", "null_gap",
)  # fmt: skip


@pytest.fixture(scope="module")
def card_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("card")
    t = simulate_log(80, size_leak=0.5, rng=1)
    card = write_card(
        t,
        out,
        n_boot=200,
        rng=2,
        provenance={"source": "test"},
        n_boot_checks=100,
        n_boot_kernel=20,
    )
    return out, card


def test_card_json_has_stable_keys_and_shapes(card_dir):
    out, _ = card_dir
    doc = json.loads((out / "card.json").read_text())
    assert doc["schema_version"] == 2
    assert [v["topic"] for v in doc["verdict"]] == ["leak", "cut", "policy", "guarantee"]
    assert all(v["status"] in ("ok", "warn", "fail") and v["sentence"] for v in doc["verdict"])
    assert doc["delivered_balanced_accuracy"] is None and doc["delivered_by_policy"] == {}
    assert tuple(doc["fields"]) == FIELD_KEYS
    for k in REQUIRED:
        f = doc["fields"][k]
        assert set(f) == {"value", "ci", "n"} and len(f["ci"]) == 2
        assert f["ci"][0] <= f["value"] <= f["ci"][1], k
    f = doc["fields"]
    assert f["threshold_part"]["value"] + f["overlap_part"]["value"] + f["within_part"][
        "value"
    ] == pytest.approx(f["R_minus_A"]["value"])
    assert list(doc["checks"]) == list(CARD_CHECKS)  # every registered check, in order
    assert set(doc["checks"]["prevalence"]) >= {"unsafe_50", "unsafe_10", "unsafe_100"}
    assert doc["checks"]["scene_blind"]["file_reader_auroc"]["value"] > 0.5
    assert doc["provenance"]["source"] == "test" and doc["provenance"]["spotstop_version"]
    assert all(k in doc["explanations"] for k in FIELD_KEYS)
    assert "recalibrate" in doc["explanations"]["threshold_part"]
    assert "leaks through the image files" in doc["explanations"]["checks.scene_blind"]


def test_card_html_is_self_contained_and_small(card_dir):
    out, _ = card_dir
    text = (out / "card.html").read_text()
    assert text.count("<svg") == 4
    assert 'href="http' not in text and "url(http" not in text and "<metadata>" not in text
    assert "<script" not in text and "<link" not in text and "src=" not in text
    assert len(text.encode()) < 200_000
    md = (out / "card.md").read_text()
    assert "| `R_minus_A` |" in md and md.index("## Verdict") < md.index("## Spot-Stop")
    for name in CARD_CHECKS:  # the card renders every registered check
        title = card_check(name).title
        assert f"## {title}" in md and f"<h2>{title}</h2>" in text


def test_markdown_and_html_show_every_prevalence_level_of_the_json(card_dir):
    """No level of card.json is missing from card.md or card.html."""
    import html as _html

    out, _ = card_dir
    doc = json.loads((out / "card.json").read_text())
    levels = sorted(
        int(k.removeprefix("unsafe_"))
        for k in doc["checks"]["prevalence"]
        if k.startswith("unsafe_")
    )
    assert levels == [10, 25, 50, 75, 90, 100]
    md = (out / "card.md").read_text()
    page = _html.unescape((out / "card.html").read_text())
    for text in (md, page):
        for p in levels:
            if p == 100:
                assert "all unsafe: share flagged" in text
            else:
                assert f"{p} % unsafe: balanced accuracy" in text, p
                assert f"{p} % unsafe: share of unsafe flagged" in text, p


def test_the_split_plot_names_r_half_minus_a(card_dir):
    _, card = card_dir
    split = card.displays["split"]
    assert split.names[0] == "R½ − A"
    assert "R½ − A and its three parts" in split.plot().get_title()


def test_nan_stays_null_in_json(tmp_path):
    # one-class-per-contrast log: no pairs -> NaN fields as null, warnings listed
    t = simulate_log(20, rng=0).subset(slice(0, 40, 2))  # safe cases only
    card = write_card(t, tmp_path, n_boot=20, rng=0, n_boot_checks=10, n_boot_kernel=5)
    doc = json.loads((tmp_path / "card.json").read_text())
    assert doc["fields"]["R"]["value"] is None
    assert math.isnan(card.fields["R"].value)
    assert doc["settings"]["warnings"]


def test_d_prime_at_auroc_1_is_shown_as_a_bound_not_inf(tmp_path):
    """√2 Φ⁻¹(AUROC) is +∞ at AUROC 1: card.md printed "inf" and card.json null (read back as
    "undefined"); both now give the finite value the estimate exceeds, marked as a bound."""
    t = simulate_log(30, d_prime=40, rng=0)
    card = write_card(t, tmp_path, n_boot=20, rng=0, n_boot_checks=10, n_boot_kernel=5)
    e = card.fields["d_prime_auroc"]
    assert card.fields["auroc"].value == 1.0
    assert math.isfinite(e.value) and e.bound == "lower"

    def no_constant(name: str) -> float:
        raise AssertionError(f"card.json holds a bare {name}")

    doc = json.loads((tmp_path / "card.json").read_text(), parse_constant=no_constant)
    assert doc["fields"]["d_prime_auroc"]["value"] == pytest.approx(e.value)
    assert doc["fields"]["d_prime_auroc"]["bound"] == "lower"
    assert "bound" not in doc["fields"]["auroc"]
    assert Estimate.from_dict(doc["fields"]["d_prime_auroc"]) == e
    row = next(r for r in (tmp_path / "card.md").read_text().splitlines() if "`d_prime_auroc`" in r)
    assert row.split(" | ")[1] == f"> {e.value:.3f}"  # was "inf"
    assert f"&gt; {e.value:.3f}" in (tmp_path / "card.html").read_text()


def test_cli_demo_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        card_main(["--help"])
    assert e.value.code == 0
    assert "--scores CSV" in capsys.readouterr().out
    bad = tmp_path / "bad.csv"
    bad.write_text("case_id,label,score,contrast_id,situation_id\na,oops,1,c,s\n")
    argv = ["--scores", str(bad), "--cut", "0.5", "--out", str(tmp_path / "o"), "--quiet"]
    assert card_main(argv) == 2
    assert "row 1 (line 2), column 'label'" in capsys.readouterr().err
    assert card_main(["--out", str(tmp_path)]) == 2  # no input
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exactly one input" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--simulated"], "--out DIR is required"),
        (["--out", "o"], "give exactly one input: LOG, --scores CSV, --demo or --simulated."),
        (["--demo", "--simulated", "--out", "o"], "give exactly one input"),
        (["--simulated", "--scores", "x.csv", "--out", "o"], "give exactly one input"),
        (
            ["--scores", "x.csv", "--out", "o"],
            "--scores needs --cut T, the score that separates SAFE from UNSAFE",
        ),
        (["--scores", "x.csv", "--cut", "nan", "--out", "o"], "--cut must be a finite number"),
        (["--simulated", "--direct-cut", "inf", "--out", "o"], "--cut must be a finite number"),
        (["--scores", "x.csv", "--cut", "0.5", "--out", "o"], "scores file 'x.csv' does not"),
        (["--simulated", "--labels", "l.csv", "--out", "o"], "--labels goes with a decision LOG"),
        (["--simulated", "--n-boot", "0", "--out", "o"], "--n-boot must be >= 1; got 0."),
        (["--simulated", "--seed", "-1", "--out", "o"], "--seed must be >= 0; got -1."),
        (
            ["--simulated", "--previous", "nope.json", "--out", "o"],
            "is not a file; pass an earlier",
        ),
        (["--simulated", "--cues", "nope", "--out", "o"], "is not a folder; pass the --out folder"),
        (["missing.sqlite", "--out", "o"], "does not exist; pass the log's SQLite file"),
    ],
)
def test_every_cli_message_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert card_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spotstop card: ") and message in err
    assert not (tmp_path / "o").exists()


class DummyCheck(CardCheck):
    """A check registered only in the test below."""

    name = "dummy"
    title = "A dummy check"
    explanation = "Shows that a registered check is run and rendered like every other."

    def run(self, ctx):
        return CheckResult({"n_cases": len(ctx.table)}, (("cases seen", str(len(ctx.table))),))


def test_a_new_registered_check_is_run_and_rendered(tmp_path, monkeypatch):
    from spotstop.diagnostics import _checks

    monkeypatch.setitem(_checks.CARD_CHECKS, "dummy", ("tests.diagnostics.test_card", "DummyCheck"))
    t = simulate_log(30, rng=0)
    write_card(t, tmp_path, n_boot=50, n_boot_checks=50, n_boot_kernel=5, rng=0)
    doc = json.loads((tmp_path / "card.json").read_text())
    assert doc["checks"]["dummy"] == {"n_cases": 60}
    assert doc["explanations"]["checks.dummy"] == DummyCheck.explanation
    md = (tmp_path / "card.md").read_text()
    assert "## A dummy check" in md and "| cases seen | 60 |" in md
    assert "<h2>A dummy check</h2>" in (tmp_path / "card.html").read_text()


def test_the_registry_refuses_unknown_and_wrong_entries(monkeypatch):
    from spotstop.diagnostics import DataError, _checks

    with pytest.raises(DataError, match="card check must be one of label_swap_null"):
        card_check("nope")
    monkeypatch.setitem(_checks.CARD_CHECKS, "other", ("tests.diagnostics.test_card", "DummyCheck"))
    with pytest.raises(DataError, match="is not a 'other' check"):
        card_check("other")


# ------------------------------------------------------------------------------------------
# a scores CSV like a public benchmark's per-case judgements: five score values in [0, 1]


def _benchmark_csv(path, n=40, *, lonely=True, situations=True):
    """``n`` contrasts, scores from {0, .25, .5, .75, 1}, 4 situations; one contrast of one
    class (``lonely``); no image, request or member columns."""
    import numpy as np

    rng = np.random.default_rng(3)
    vals = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    head = "case_id,label,score,contrast_id" + (",situation_id" if situations else "")
    lines = [head]
    for c in range(n):
        s = f",s{c % 4}" if situations else ""
        lines.append(f"c{c}a,safe,{rng.choice(vals, p=[0.4, 0.2, 0.2, 0.1, 0.1])},c{c}{s}")
        lines.append(f"c{c}b,unsafe,{rng.choice(vals, p=[0.1, 0.1, 0.3, 0.25, 0.25])},c{c}{s}")
    if lonely:
        lines += [f"solo1,safe,0.25,k1{',s0' if situations else ''}"]
        lines += [f"solo2,unsafe,1,k2{',s1' if situations else ''}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def bench_card(tmp_path_factory):
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("bench")
    csv_path = _benchmark_csv(d / "scores.csv")
    argv = ["--scores", str(csv_path), "--cut", "0.5", "--out", str(d / "card"), "--n-boot", "50"]
    proc = subprocess.run(
        [sys.executable, "-m", "spotstop.cli", "card", *argv, "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return d / "card", proc.stderr


def test_the_card_reports_ties_at_the_cut_and_the_rule_of_each_number(bench_card):
    import numpy as np
    from spotstop.diagnostics import read_scores_csv
    from spotstop.guard.policies import unsafe_mask

    out, stderr = bench_card
    doc = json.loads((out / "card.json").read_text())
    st = doc["settings"]
    t = read_scores_csv(out.parent / "scores.csv")
    assert st["direct_cut"] == 0.5 and st["n_at_cut"] == int((t.score == 0.5).sum()) > 0
    # the tie side comes from the guard's one rule (S >= t: UNSAFE), not a copy of it
    assert st["tie_side"]["guard_rule"] == (
        "UNSAFE" if unsafe_mask(np.array([0.5]), 0.5)[0] else "SAFE"
    )
    assert st["tie_side"] == {"guard_rule": "UNSAFE", "direct_answer": "SAFE"}
    assert st["cut_rules"]["fields"].startswith("S > cut")
    assert st["cut_rules"]["checks.prevalence.frozen"].startswith("S ≥ cut")
    share = 100 * st["n_at_cut"] / st["n_cases"]
    tie_msg = (
        f"{st['n_at_cut']} of {st['n_cases']} scores ({share:.1f} %) equal the cut 0.5: the "
        "direct answer (S > cut; the Spot-Stop fields) counts them SAFE, the guard's rule "
        "(S ≥ t; the prevalence check's fixed cut) UNSAFE; to keep them on one side for both "
        "rules, put the cut between two score values (e.g. --cut 0.375 or --cut 0.625)."
    )
    assert st["cut_warnings"] == [tie_msg] and st["warnings"][0] == tie_msg
    assert f"spotstop card: warning: {tie_msg}" in stderr
    md = (out / "card.md").read_text()
    assert (
        f"{st['n_at_cut']} of {st['n_cases']} scores equal the cut: the direct answer "
        "(S > 0.5; the Spot-Stop fields) counts them SAFE, the guard's rule (S ≥ 0.5; the "
        "prevalence check's fixed cut) UNSAFE." in md
    )
    assert "equal the cut" in (out / "card.html").read_text()


def test_one_class_contrasts_are_listed_in_the_warnings(bench_card):
    out, _ = bench_card
    doc = json.loads((out / "card.json").read_text())
    assert doc["settings"]["n_one_class_contrasts"] == 2
    msg = (
        "2 contrast id(s) hold cases of one class only, form no pair and are left out of the "
        "pair statistics: k1, k2. Label their missing side or drop them."
    )
    assert msg in doc["settings"]["warnings"]
    assert f"- {msg}" in (out / "card.md").read_text()


def test_scene_blind_row_on_a_scores_csv_says_once_what_is_missing(bench_card):
    out, _ = bench_card
    md = (out / "card.md").read_text()
    section = md[md.index("## Scene-blind readers") :]
    section = section[: section.index("\n## ", 5)]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert rows == [
        "| not measured | the cases have no image-file columns (width, height, bytes), "
        "request-only score (score_text) and gray-image score (score_gray), so no reader of "
        "them ran; add them to the input to check whether the label leaks there. |"
    ]
    assert "not available" not in section and "NaN" not in section
    doc = json.loads((out / "card.json").read_text())
    assert len(doc["checks"]["scene_blind"]["not_measured"]) == 3


def test_a_cut_with_every_score_on_one_side_warns(tmp_path):
    from spotstop.diagnostics import read_scores_csv
    from spotstop.diagnostics._card import CutWarning, compute_card

    t = read_scores_csv(_benchmark_csv(tmp_path / "s.csv", n=12, lonely=False, situations=False))
    # every warning the card raises is collected into its settings, none escapes
    card = compute_card(t, direct_cut=0.0, n_boot=20, n_boot_checks=20, n_boot_kernel=5, rng=0)
    n_at = int((t.score == 0).sum())
    assert card.settings["cut_warnings"][0] == (
        f"All 24 scores lie at or above the cut 0 ({n_at} equal to it): one rule answers the "
        "same for every case. Is the cut on the score's scale? Pass the cut your guard uses "
        "with --cut."
    )
    assert card.settings["cut_warnings"][1].startswith(f"{n_at} of 24 scores")
    assert "e.g. --cut 0.125)" in card.settings["cut_warnings"][1]
    assert issubclass(CutWarning, UserWarning)
    card = compute_card(t, direct_cut=0.6, n_boot=20, n_boot_checks=20, n_boot_kernel=5, rng=0)
    assert card.settings["cut_warnings"] == [] and card.settings["n_at_cut"] == 0


def test_md_and_html_state_the_labelled_fail_closed_decisions_the_json_leaves_out(tmp_path):
    """card.json said "3 labelled fail-closed decision(s) left out" of the delivered rates;
    card.md said only "labelled decisions that did not fail closed" and card.html nothing."""
    import shutil
    import sqlite3

    from spotstop.diagnostics._build import demo_log_path
    from spotstop.guard import DecisionLog

    log = tmp_path / "log.sqlite"
    shutil.copyfile(demo_log_path(), log)
    with sqlite3.connect(log) as conn:
        ids = [r[0] for r in conn.execute("SELECT decision_id FROM decisions WHERE label = "
                                          "'SAFE' ORDER BY time LIMIT 3")]  # fmt: skip
    conn.close()
    with DecisionLog(log) as opened:
        opened.mark_fail_closed(ids, "the write finished after the deadline")
    out = tmp_path / "card"
    assert card_main([str(log), "--n-boot", "50", "--quiet", "--out", str(out)]) == 0
    doc = json.loads((out / "card.json").read_text())
    assert doc["delivered_note"] == "3 labelled fail-closed decision(s) left out"
    said = "3 labelled fail-closed decision(s) left out"
    assert said in (out / "card.md").read_text()
    assert said in (out / "card.html").read_text()
