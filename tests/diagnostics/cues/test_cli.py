"""The reliance, shift and select commands: help, bad input, files written; end to end (slow)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics.cues import (
    CUES,
    TEMPLATES,
    CandidateSet,
    GuardSpec,
    MemberSpec,
    _candidates,
    _cli,
    estimate_reliance,
    plan_edits,
    read_source_set,
    score_edit_set,
)
from spotstop.diagnostics.cues._deployed import frozen_pair_policy
from spotstop.guard import Avg2Fusion, BackendUnavailableError

from tests._support.cues_fakes import (
    RecordedTextDetector,
    TextDrivenMember,
    png,
    rendered_doubles,
    text_scores,
    write_source,
)

# small source sets by design (reliance's few-groups warning: tests/diagnostics/cues/test_reliance.py)
pytestmark = pytest.mark.filterwarnings("ignore::spotstop.diagnostics._resample.FewGroupsWarning")


def _demo_source(
    root: Path, n: int, seed: int, label=lambda i: "UNSAFE" if i % 2 == 0 else "SAFE"
) -> Path:
    """A source folder of ``n`` demo scenes (drawn shapes; JPEG or PNG) with labels."""
    from spotstop.export.scenes import demo_scenes

    root.mkdir(parents=True)
    rows = ["image,request,label"]
    for i, s in enumerate(demo_scenes(n, seed=seed)):
        (root / f"i{i}.img").write_bytes(bytes(s.image))  # type: ignore[arg-type]
        rows.append(f"i{i}.img,{s.request},{label(i)}")
    (root / "s.csv").write_text("\n".join(rows) + "\n")
    return root


def spotstop(argv: list[str]) -> int:
    """The composition root as it registers these commands (see the module _cli docstring)."""
    p = argparse.ArgumentParser(prog="spotstop")
    sub = p.add_subparsers(dest="command")
    for add in (_cli.add_reliance_parser, _cli.add_shift_parser, _cli.add_select_parser):
        add(sub)
    args = p.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize("cmd", ["reliance", "shift", "select"])
def test_help_explains_the_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        spotstop([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"{cmd}.json" in out and "seed 002" in out and "example" in out
    if cmd in ("shift", "select"):  # the assumption behind shares without labels is stated
        assert "INDEPENDENT OF THE LABEL" in " ".join(out.split())
    if cmd == "select":
        assert "--miss-cost" in out and "--member-cut" in out and "W_s" in out


def _calibration(root: Path, det: RecordedTextDetector) -> Path:
    rows = ["image,cue"]
    for i in range(30):
        img = png(7000 + i, size=(24, 24))
        (root / f"cal{i}.png").write_bytes(img)
        cue = ("reassuring", "alarming", "none")[i % 3]
        if cue != "none":
            det.register(img, "ALL CLEAR" if cue == "reassuring" else "DANGER")
        rows.append(f"cal{i}.png,{cue}")
    (root / "cal.csv").write_text("\n".join(rows) + "\n")
    return root / "cal.csv"


def _frames(root: Path, det: RecordedTextDetector, n: int = 40, share: float = 0.25) -> Path:
    (root / "frames").mkdir(parents=True)
    for i in range(n):
        img = png(9000 + i, size=(24, 24))
        (root / "frames" / f"f{i}.png").write_bytes(img)
        if i < share * n:
            det.register(img, "ALL CLEAR")
    return root / "frames"


@pytest.fixture
def doubles(tmp_path, monkeypatch):
    """Candidates made of test doubles: the CLI's wiring runs fast, without a model."""
    src_csv = write_source(tmp_path / "src", ["UNSAFE"] * 6 + ["SAFE"] * 6)
    edits = plan_edits(read_source_set(src_csv), seed=0)
    labels = np.array([s.label for s in edits.source.scenes])
    base = np.where(labels == 1, 1.0, -1.0) + np.random.default_rng(0).normal(0, 1, labels.size)
    det, base_of = rendered_doubles(edits, base)
    reader = TextDrivenMember("reader", det, base_of, reassuring_push=3.0)
    steady = TextDrivenMember("steady", det, base_of)
    pool = {
        m.name: text_scores(edits, base, 3.0 * (m is reader), 0.0)[:1] for m in (reader, steady)
    }
    fusion = Avg2Fusion.fit({k: np.array([v[0], v[0] + 1.0, v[0] - 1.0]) for k, v in pool.items()})
    policy = frozen_pair_policy(fusion, 0.0, name="bundle", fitted_on={"what": "test"})
    cands = CandidateSet(
        members=(
            MemberSpec("reader", "r", reader.prompt_hash, lambda: reader),
            MemberSpec("steady", "s", steady.prompt_hash, lambda: steady),
        ),
        guards=(GuardSpec("guard", policy, {"reader": "reader", "steady": "steady"}),),
        folders=("doubles",),
    )
    monkeypatch.setattr(_candidates, "load_candidates", lambda folders, **kw: cands)
    monkeypatch.setattr(_cli, "_make_detector", lambda args: det)
    return tmp_path, src_csv, det


def test_reliance_command_writes_reliance_json(doubles, capsys):
    tmp, src, _ = doubles
    out = tmp / "out"
    argv = ["reliance", "--bundle", "B", "--source", str(src), "--out", str(out), "--n-boot", "200"]
    assert spotstop([*argv, "--cache", str(tmp / "cache")]) == 0
    printed = capsys.readouterr().out
    assert "reader" in printed and "wrote" in printed
    doc = json.loads((out / "reliance.json").read_text())
    assert set(doc["candidates"]) == {"reader", "steady", "guard"}
    for name in ("reader", "steady", "guard"):
        for cue in CUES:
            assert {"reliance", "placebo", "source_error"} <= set(doc["candidates"][name][cue])
    assert doc["candidates"]["reader"]["reassuring"]["reliance"]["value"] > 0.3
    assert doc["candidates"]["steady"]["reassuring"]["reliance"]["value"] == 0.0
    # a rerun with the same seed reads the cache and gives the same file
    first = (out / "reliance.json").read_text()
    assert spotstop([*argv, "--cache", str(tmp / "cache"), "--quiet"]) == 0
    again = json.loads((out / "reliance.json").read_text())
    assert again["provenance"]["timings"]["reader"]["cached"] is True
    assert json.loads(first)["candidates"] == again["candidates"]
    assert again["provenance"]["templates"] == [t.name for t in TEMPLATES]
    # --templates measures with those alone: one family, one template
    assert spotstop([*argv, "--no-cache", "--quiet", "--templates", "sign-bold"]) == 0
    one = json.loads((out / "reliance.json").read_text())
    assert one["provenance"]["templates"] == ["sign-bold"]
    fams = one["candidates"]["reader"]["reassuring"]["families"]
    assert list(fams) == ["sign"] and fams["sign"]["templates"] == ["sign-bold"]


def test_shift_and_select_commands(doubles, capsys):
    tmp, src, det = doubles
    cal, frames = _calibration(tmp, det), _frames(tmp, det, share=0.5)
    out = tmp / "sh"
    argv = ["--calibration", str(cal), "--frames", str(frames), "--prior", "0.8", "--out", str(out)]
    assert spotstop(["shift", *argv, "--n-boot", "300"]) == 0
    doc = json.loads((out / "shift.json").read_text())
    assert doc["prevalence_source"] == "prior" and doc["prevalence"]["value"] == 0.8
    assert doc["cues"]["reassuring"]["d_hat"]["value"] == pytest.approx(0.5)
    assert doc["cues"]["reassuring"]["misleading_share"]["value"] == pytest.approx(0.4)
    capsys.readouterr()
    sel_argv = [
        "select",
        "--candidate",
        "A",
        "--source",
        str(src),
        *argv,
        "--no-cache",
        "--n-boot",
        "300",
    ]
    assert spotstop([*sel_argv, "--check-sets", "5", "--member-cut", "steady=0.5"]) == 0
    printed = capsys.readouterr().out
    sel = json.loads((out / "select.json").read_text())
    names = [c["name"] for c in sel["candidates"]]
    assert sorted(names) == ["guard", "reader", "reader+steady", "steady"]
    assert names[0] != "reader"  # 40% of frames carry misleading reassuring text
    assert (out / "reliance.json").is_file() and "SRA" in printed
    assert sel["schema_version"] == 2 and sel["weighting"]["intercept"] == "deployment"
    assert sel["weighting"]["prevalence"] == 0.8 and sel["weighting"]["miss_cost"] == 1.0
    assert sel["misleading_share_basis"] == "assumes text independent of the label"
    assert "† No deployment frame is labelled" in printed and "W_s" in printed
    points = {c["name"]: c["operating_point"] for c in sel["candidates"]}
    assert points["steady"] == {
        "rule": "cut stated by the user on the raw score s (UNSAFE when s >= cut)",
        "cut": 0.5,
    }
    assert points["reader"]["rule"].startswith("frozen cut: mean robust z-score")
    assert points["reader+steady"]["rule"].startswith("frozen cut: mean Avg-2 score")
    assert points["guard"]["cut"] is None
    fam = sel["check"]["families"]["reassuring"]
    assert fam["n_sets"] == 5 and len(fam["selectors"]["SRA"]["mean_regret"]) == 11
    assert {"SRA", "source error", "ATC"} == set(fam["selectors"])
    # a costly miss is said in the weighting and changes the units
    assert spotstop([*sel_argv, "--miss-cost", "5", "--check-sets", "0", "--quiet"]) == 0
    costly = json.loads((out / "select.json").read_text())
    assert costly["weighting"]["miss_cost"] == 5.0 and costly["check"] is None
    assert costly["weighting"]["units"].startswith("cost per frame")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["reliance", "--bundle", "B", "--source", "/nope", "--out", "o"],
            "source set '/nope' does not exist",
        ),
        (
            ["reliance", "--bundle", "B", "--source", "S", "--out", "o", "--n-boot", "0"],
            "--n-boot must be >= 1",
        ),
        (
            ["shift", "--frames", "F", "--labels", "L", "--calibration", "C", "--out", "o"],
            "--labels goes with --log",
        ),
        (
            ["shift", "--frames", "F", "--calibration", "C", "--out", "o", "--prior", "1.5"],
            "--prior is the unsafe share",
        ),
        (
            ["shift", "--frames", "/nope", "--calibration", "C", "--out", "o"],
            "frames folder '/nope' does not exist",
        ),
        (
            [
                "select",
                "--candidate",
                "A",
                "--source",
                "S",
                "--frames",
                "F",
                "--calibration",
                "C",
                "--out",
                "o",
                "--miss-cost",
                "0",
            ],
            "--miss-cost is the cost of a missed hazard",
        ),
        (
            [
                "select",
                "--candidate",
                "A",
                "--source",
                "S",
                "--frames",
                "F",
                "--calibration",
                "C",
                "--out",
                "o",
                "--member-cut",
                "qwen",
            ],
            "--member-cut takes NAME=CUT",
        ),
        (
            [
                "reliance",
                "--bundle",
                "B",
                "--source",
                "S",
                "--out",
                "o",
                "--member-cut",
                "a=1",
                "--member-cut",
                "a=2",
            ],
            "--member-cut names 'a' twice",
        ),
        (
            ["shift", "--log", "/nope.sqlite", "--calibration", "C", "--out", "o"],
            "decision log '/nope.sqlite' does not exist",
        ),
        (
            ["reliance", "--bundle", "B", "--source", "S", "--out", "o", "--templates", "bold"],
            "--templates: templates: unknown 'bold'; choose from sign-bold,",
        ),
    ],
)
def test_bad_input_is_exit_2_with_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(_cli, "_make_detector", lambda args: RecordedTextDetector())
    assert spotstop(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_candidate_and_missing_extra(tmp_path, capsys, monkeypatch):
    src = write_source(tmp_path / "src", ["UNSAFE", "SAFE"])
    monkeypatch.setattr(_cli, "_make_detector", lambda args: RecordedTextDetector())
    argv = ["select", "--candidate", str(tmp_path / "none"), "--source", str(src), "--frames", "F",
            "--calibration", "C", "--out", str(tmp_path / "o")]  # fmt: skip
    assert spotstop(argv) == 2
    assert "is not a folder; pass a bundle or a member folder" in capsys.readouterr().err
    monkeypatch.undo()

    def missing(self):
        raise BackendUnavailableError("the text detector needs rapidocr; install spotstop[cues]")

    monkeypatch.setattr("spotstop.guard.cues.RapidOcrDetector.load", missing)
    assert spotstop(["shift", "--frames", "F", "--calibration", "C", "--out", "o"]) == 2
    assert "install spotstop[cues]" in capsys.readouterr().err


def test_an_unknown_claim_reader_is_exit_2_naming_the_choices(capsys):
    argv = ["shift", "--frames", "F", "--calibration", "C", "--out", "o", "--claim-reader", "ocr2"]
    assert spotstop(argv) == 2
    err = capsys.readouterr().err
    assert "claim reader must be one of 'lexicon', 'member:" in err and "'ocr2'" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------- slow: real models, real OCR


@pytest.mark.slow
def test_reliance_of_a_member_reading_with_the_real_ocr(tmp_path):
    """The text-driven double reads with RapidOCR: on the sign templates its scores equal the
    ones computed from the recorded texts, i.e. the OCR read every sign as pasted. A one-word
    sticker on a busy scene is sometimes not read at all (a known OCR limit, measured here:
    at most one in ten missed), so stickers are checked by share."""
    from spotstop.diagnostics.cues._templates import HELD_OUT, TEMPLATES
    from spotstop.guard.cues import RapidOcrDetector

    _demo_source(tmp_path / "src", 2, seed=5)
    edits = plan_edits(read_source_set(tmp_path / "src"), seed=0)
    _, base_of = rendered_doubles(edits, [1.0, -1.0])
    ocr = RapidOcrDetector(threads=2)
    member = TextDrivenMember("ocr-reader", ocr, base_of, reassuring_push=3.0, alarming_push=2.0)  # type: ignore[arg-type]
    table = score_edit_set(edits, [MemberSpec("ocr-reader", "x", None, lambda: member)])
    recorded = text_scores(edits, [1.0, -1.0], 3.0, 2.0)
    family = {t.name: t.family for t in (*TEMPLATES, HELD_OUT)}
    sticker = np.array([family.get(r.template) == "sticker" for r in edits.records])
    got = np.asarray(table.scores["ocr-reader"])
    np.testing.assert_allclose(got[~sticker], recorded[~sticker])
    assert np.mean(got[sticker] == recorded[sticker]) >= 0.9
    res = estimate_reliance(table, n_boot=200, rng=0)
    assert res["ocr-reader"].cues["reassuring"].reliance.value > 0.5


@pytest.mark.slow
def test_end_to_end_on_the_tiny_pair(tmp_path, tiny_pair, capsys):
    """reliance, shift, select and the card's section from the real command line (the
    composition root) on the tiny TEST pair and the real OCR."""
    from spotstop.cli import main as spotstop_main
    from spotstop.cli._demo import make_demo_bundle
    from spotstop.export.tiny import TINY_MEMBERS

    shutil.copytree(tiny_pair, tmp_path / "tiny")
    bundle = make_demo_bundle(tmp_path, members=[tmp_path / "tiny" / m for m in TINY_MEMBERS])
    _demo_source(tmp_path / "src", 8, seed=11)  # the frozen cut needs 8 pool scenes
    cache = tmp_path / "cache"
    rel_argv = ["reliance", "--bundle", str(bundle), "--source", str(tmp_path / "src"),
                "--out", str(tmp_path / "rel"), "--cache", str(cache), "--n-boot", "200"]  # fmt: skip
    assert spotstop_main(rel_argv) == 0
    doc = json.loads((tmp_path / "rel" / "reliance.json").read_text())
    assert set(doc["candidates"]) == {"tiny-qwen3_5", "tiny-lfm2_vl", "guard"}
    assert len(list(cache.glob("*.json"))) == 2
    # frames: the edited scenes themselves; calibration: a few rendered scenes of each cue
    edits = plan_edits(read_source_set(tmp_path / "src"), seed=1)
    (tmp_path / "frames").mkdir()
    (tmp_path / "cal").mkdir()
    cal = ["image,cue"]
    for r, img in edits.images():
        (tmp_path / "frames" / f"{r.index:03d}.png").write_bytes(img)
        if r.template == "sign-bold" and r.kind in ("misleading", "agreeing", "neutral"):
            (tmp_path / "cal" / f"{r.index}.png").write_bytes(img)
            cue = (
                "none"
                if r.kind == "neutral"
                else ("reassuring" if "CLEAR" in r.text else "alarming")
            )
            cal.append(f"{r.index}.png,{cue}")
    (tmp_path / "cal" / "cal.csv").write_text("\n".join(cal) + "\n")
    sel_argv = ["select", "--candidate", str(bundle), "--source", str(tmp_path / "src"),
                "--frames", str(tmp_path / "frames"), "--calibration", str(tmp_path / "cal" / "cal.csv"),
                "--prior", "0.5", "--out", str(tmp_path / "sel"), "--cache", str(cache),
                "--n-boot", "200"]  # fmt: skip
    assert spotstop_main(sel_argv) == 0
    sel = json.loads((tmp_path / "sel" / "select.json").read_text())
    assert sorted(c["name"] for c in sel["candidates"]) == [
        "guard",
        "tiny-lfm2_vl",
        "tiny-qwen3_5",
        "tiny-qwen3_5+tiny-lfm2_vl",
    ]
    shift = json.loads((tmp_path / "sel" / "shift.json").read_text())
    assert shift["cues"]["reassuring"]["sens"]["value"] == 1.0  # the OCR reads "ALL CLEAR"
    assert shift["provenance"]["ocr_model"]["sha256"]
    rel2 = json.loads((tmp_path / "sel" / "reliance.json").read_text())
    assert all(t["cached"] for t in rel2["provenance"]["timings"].values())
    # shift alone, then the card's section from what the three commands wrote
    shift_argv = ["shift", "--frames", str(tmp_path / "frames"), "--calibration",
                  str(tmp_path / "cal" / "cal.csv"), "--prior", "0.5", "--out", str(tmp_path / "sh"),
                  "--n-boot", "200"]  # fmt: skip
    assert spotstop_main(shift_argv) == 0
    alone = json.loads((tmp_path / "sh" / "shift.json").read_text())
    q_alone, q_sel = alone["cues"]["reassuring"]["q"], shift["cues"]["reassuring"]["q"]
    assert (q_alone["value"], q_alone["n"]) == (q_sel["value"], q_sel["n"])  # the same frames
    card_argv = ["card", "--simulated", "--cues", str(tmp_path / "sel"), "--out", str(tmp_path / "card"),
                 "--n-boot", "200", "--quiet"]  # fmt: skip
    assert spotstop_main(card_argv) == 0
    card = json.loads((tmp_path / "card" / "card.json").read_text())
    section = json.dumps(card["checks"]["text_in_scene"])
    assert shift["provenance"]["ocr_model"]["sha256"] in section
    md = (tmp_path / "card" / "card.md").read_text()
    assert "Text in the scene" in md and "reliance of guard" in md
