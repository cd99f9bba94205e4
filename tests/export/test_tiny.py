"""The tiny test pair: real config classes, seeded weights, deterministic files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from spotstop.export.tiny import build_tiny_member, tree_digest


def test_same_seed_gives_byte_identical_files(tiny_pair: Path, tmp_path: Path):
    again = build_tiny_member("tiny-qwen3_5", tmp_path / "q", seed=0)
    assert tree_digest(again) == tree_digest(tiny_pair / "tiny-qwen3_5")
    lfm = build_tiny_member("tiny-lfm2_vl", tmp_path / "l", seed=0)
    assert tree_digest(lfm) == tree_digest(tiny_pair / "tiny-lfm2_vl")
    other = build_tiny_member("tiny-lfm2_vl", tmp_path / "l1", seed=1)
    assert tree_digest(other)["model.safetensors"] != tree_digest(lfm)["model.safetensors"]


def test_members_are_the_real_architectures(tiny_pair: Path):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    q = AutoConfig.from_pretrained(tiny_pair / "tiny-qwen3_5")
    assert type(q).__name__ == "Qwen3_5Config"
    assert set(q.text_config.layer_types) == {"linear_attention", "full_attention"}
    lf = AutoConfig.from_pretrained(tiny_pair / "tiny-lfm2_vl")
    assert type(lf).__name__ == "Lfm2VlConfig"
    assert set(lf.text_config.layer_types) == {"conv", "full_attention"}
    assert lf.vision_config.model_type == "siglip2_vision_model"
    for name, cls in (
        ("tiny-qwen3_5", "Qwen3_5ForConditionalGeneration"),
        ("tiny-lfm2_vl", "Lfm2VlForConditionalGeneration"),
    ):
        model = AutoModelForImageTextToText.from_pretrained(tiny_pair / name)
        assert type(model).__name__ == cls
        tok = AutoTokenizer.from_pretrained(tiny_pair / name)
        assert tok.chat_template


def test_chat_templates_are_shaped_like_the_real_ones(tiny_pair: Path):
    from transformers import AutoTokenizer

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    q = AutoTokenizer.from_pretrained(tiny_pair / "tiny-qwen3_5")
    text = q.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    lf = AutoTokenizer.from_pretrained(tiny_pair / "tiny-lfm2_vl")
    text = lf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|startoftext|><|im_start|>user\n<image>hi<|im_end|>\n<|im_start|>assistant\n"
    # special tokens are single ids
    assert len(q("<|image_pad|>", add_special_tokens=False)["input_ids"]) == 1
    assert (
        len(lf("<|image_start|><image><|image_end|>", add_special_tokens=False)["input_ids"]) == 3
    )


def test_labelled_as_a_test_pair(tiny_pair: Path, tiny_member_dir: Path):
    marker = (tiny_member_dir / "SPOTSTOP_TEST_PAIR.txt").read_text()
    assert "mean nothing" in marker
    cfg = json.loads((tiny_member_dir / "config.json").read_text())
    assert cfg["model_type"] in {"qwen3_5", "lfm2_vl"}


def test_a_bundle_records_and_says_what_kind_of_test_pair_it_holds(tiny_pair: Path, tmp_path: Path):
    """Its manifest (and every note printed beside its outputs) said "tiny members" of any
    test pair; each member's kind is now recorded with its marker and copied to the manifest."""
    import shutil

    from spotstop.export.bundle import write_bundle
    from spotstop.export.tiny import _write_markers
    from spotstop.guard import load_bundle
    from spotstop.guard._hf import describe_test_pair, resolve_member

    assert resolve_member(tiny_pair / "tiny-qwen3_5").test_pair_kind == "tiny"
    trained = tmp_path / "tiny-lfm2_vl"
    shutil.copytree(tiny_pair / "tiny-lfm2_vl", trained)
    _write_markers(trained, "lfm2_vl", (64, 64), built_by="a test", trained=True)
    assert resolve_member(trained).test_pair_kind == "trained"
    b = write_bundle([tiny_pair / "tiny-qwen3_5", trained], tmp_path / "b", copy_members=False)
    bundle = load_bundle(b)
    assert bundle.test_pair_kinds == ("tiny", "trained")
    note = describe_test_pair(["tiny", "trained"])
    assert "tiny members with seeded random weights" in note and "trained on the toy" in note
    assert bundle.test_pair_note == note
    assert (b / "manifest.yaml").read_text(encoding="utf-8").splitlines()[0] == f"# {note}"


@pytest.mark.parametrize("name", ["tiny-qwen3_5", "tiny-lfm2_vl"])
def test_members_score_at_the_default_visual_token_budgets(tiny_pair: Path, name: str):
    """The tiny pair keeps its 4-token hint (fast tests), but its vision towers also run at
    the real members' default budgets (Qwen3.5 256 tokens; LFM2-VL 64, SigLIP2's position
    embeddings resized to the 16x16 patch grid): the visual tokens the tower yields are the
    ones the prompt expands, or transformers would refuse the forward pass."""
    import math

    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import load_member
    from spotstop.guard._arch import get_arch

    hinted = load_member(tiny_pair / name)
    assert hinted.info.n_image_tokens == 4
    budget = get_arch(name.removeprefix("tiny-")).default_visual_tokens
    m = load_member(tiny_pair / name, visual_tokens=budget)
    assert m.info.n_image_tokens == budget
    assert m.info.image_size == (32 * math.isqrt(budget),) * 2
    scores = m.score(demo_scenes(2, seed=4))
    assert all(math.isfinite(r.score) for r in scores)
    assert scores[0].prompt_hash == hinted.prompt_hash  # the template does not hold the grid


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--trained", "--seed", "1"],
            "trained from seed 0, not 1; a seed applies only with --retrain",
        ),
        (["--trained", "--retrain", "--seed", "-40"], "--seed must be an integer in 0..2**63-1"),
        (["--seed", "-1"], "--seed must be an integer in 0..2**63-1"),
        (["--seed", str(2**64)], "--seed must be an integer in 0..2**63-1"),
        (["--out", "{file}"], "is a file; give a folder"),
        (["--trained", "--out", "{file}"], "is a file; give a folder"),
    ],
)
def test_cli_refuses_a_bad_seed_or_out_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    """Each ended in a traceback (TrainedWeightsError; NotADirectoryError; torch's overflow)
    or, for a negative seed with --retrain, in a failure midway through the training."""
    from spotstop.cli import main

    afile = tmp_path / "afile"
    afile.write_text("mine")
    args = [a.replace("{file}", str(afile)) for a in argv]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "pair")]
    assert main(["tiny", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert afile.read_text() == "mine"
