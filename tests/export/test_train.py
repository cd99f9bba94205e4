"""The trained tiny pair: committed weights, the training rule, reproducibility, held-out signal.

The held-out checks score the committed pair on a world seed the training never drew (its
rooms, layouts and lighting are new); the figures with intervals are in bench/RESULTS.md
(``python bench/trained_world.py``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from spotstop.cli import main  # noqa: E402
from spotstop.export import train as T  # noqa: E402
from spotstop.export.train import (  # noqa: E402
    TRAINED_DIR,
    TRAINING,
    TrainedWeightsError,
    build_trained_pair,
    train_member,
    trained_pair_ready,
)
from spotstop.export.world import WorldOptions, case_scene, world_cases  # noqa: E402
from spotstop.guard._member import load_member  # noqa: E402

#: a world the training never saw: another seed (new rooms, layouts, lighting), moderate offsets
HELD_OUT = WorldOptions(rooms=6, contrasts_per_room=8, test_share=1.0, offsets=0.3)
HELD_OUT_SEED = 424242


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    build_trained_pair(root)
    return root


@pytest.fixture(scope="module")
def held_out_scores(trained: Path) -> dict[str, np.ndarray]:
    cases = world_cases(HELD_OUT_SEED, HELD_OUT)
    scenes = [case_scene(c, HELD_OUT) for c in cases]
    out = {"label": np.array([c.label for c in cases])}
    for r in TRAINING:
        m = load_member(trained / r.member)
        out[r.member] = np.array([s.score for s in m.score(scenes)])
    return out


def _auroc(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s))


def test_committed_weights_match_their_recorded_sha256(trained: Path) -> None:
    manifest = json.loads((TRAINED_DIR / "trained.json").read_text())
    assert set(manifest["members"]) == {r.member for r in TRAINING}
    assert trained_pair_ready(trained)
    for r in TRAINING:
        hints = (trained / r.member / "spotstop_member.yaml").read_text()
        assert "test_pair: true" in hints and "toy world" in hints


def test_altered_weights_are_noticed_and_another_seed_needs_retraining(
    tmp_path: Path, trained: Path
) -> None:
    shutil.copytree(trained, tmp_path / "p")
    f = tmp_path / "p" / TRAINING[0].member / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1] + b"\0")
    assert not trained_pair_ready(tmp_path / "p")
    with pytest.raises(TrainedWeightsError, match="--retrain"):
        build_trained_pair(tmp_path / "q", seed=1)


def test_the_pair_ranks_held_out_scenes(held_out_scores: dict[str, np.ndarray]) -> None:
    """The trained pair ranks: each member's AUROC above 0.8, the Avg-2 pair's at least 0.9, on a
    world the training never saw. Avg-2 here: robust z-scores fitted on these scores."""
    y = held_out_scores["label"]
    z = []
    for r in TRAINING:
        s = held_out_scores[r.member]
        assert _auroc(y, s) > 0.8, r.member
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        z.append((s - med) / (q3 - q1))
    assert _auroc(y, np.mean(z, axis=0)) >= 0.9


def test_the_leaning_member_leans_safe(held_out_scores: dict[str, np.ndarray]) -> None:
    """The member given a lean (:func:`fit_lean`: every score down by ``lean.nats``) answers
    SAFE on more UNSAFE scenes than its ranking needs: on a world the training never saw, its
    direct answer (S > 0: UNSAFE) has a threshold part (diagnostics' spot_stop) of at least
    half its target, and its best cut lies below 0. (The threshold part
    with its interval and the batch-mean recovery need a bigger world: bench/RESULTS.md,
    trained-world.)"""
    from spotstop.diagnostics import CaseTable, spot_stop

    recipe = next(r for r in TRAINING if r.threshold_part > 0)
    cases = world_cases(HELD_OUT_SEED, HELD_OUT)
    ss = spot_stop(
        CaseTable(
            case_id=[c.case_id for c in cases],
            label=held_out_scores["label"],
            score=held_out_scores[recipe.member],
            contrast_id=[c.contrast_id for c in cases],
            situation_id=[c.room.room_id for c in cases],
        )
    )
    assert ss.threshold_part >= recipe.threshold_part / 2
    assert ss.cut_star < 0
    assert ss.hit_rate < 1 - recipe.threshold_part  # UNSAFE scenes answered SAFE


def test_the_lean_record_says_what_fit_lean_did() -> None:
    """trained.json's lean: sized to the recipe's target (the paper's 9.3 points), reached on
    its own world, the ranking kept (AUROC within 0.01), the drop near one shift."""
    from spotstop.export.train import PAPER_THRESHOLD_PART

    recipe = next(r for r in TRAINING if r.threshold_part > 0)
    assert recipe.threshold_part == PAPER_THRESHOLD_PART == 0.093
    lean = _members_json()[recipe.member]["lean"]
    assert isinstance(lean, dict)
    assert lean["target"] == recipe.threshold_part
    assert lean["threshold_part"] >= recipe.threshold_part - 0.01
    assert abs(lean["auroc"] - lean["auroc_before"]) < 0.01
    assert lean["nats"] > 0 and lean["shift_sd"] < 0.1 * lean["nats"]
    assert all("lean" not in e for m, e in _members_json().items() if m != recipe.member)


def _members_json() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = json.loads(
        (TRAINED_DIR / "trained.json").read_text(encoding="utf-8")
    )["members"]
    return out


def test_fit_lean_moves_the_cut_and_keeps_the_ranking(trained: Path, tmp_path: Path) -> None:
    """fit_lean on a copy of the leaning member, asked for a larger threshold part: it edits
    one row of the answer head (the first UNSAFE token's) and nothing else, reaches the target
    within the 0.05-nat grid's step, keeps the AUROC, and lowers every scene's score by about
    the lean it reports (checked here on the scenes it never saw)."""
    from spotstop.export.train import TRAINED_IMAGE_SIZE, fit_lean

    recipe = next(r for r in TRAINING if r.threshold_part > 0)
    shutil.copytree(trained / recipe.member, tmp_path / "m")
    m = load_member(tmp_path / "m", image_size=(TRAINED_IMAGE_SIZE, TRAINED_IMAGE_SIZE))
    before = {k: v.detach().clone() for k, v in m.backend.model.state_dict().items()}
    cases = world_cases(HELD_OUT_SEED, HELD_OUT)
    scenes = [case_scene(c, HELD_OUT) for c in cases]
    s0 = np.array([s.score for s in m.score(scenes)])
    lean = fit_lean(m, replace(recipe, threshold_part=0.2), seed=1)
    assert lean.target == 0.2 and lean.threshold_part >= 0.2 - 0.01
    assert lean.threshold_part_before < lean.threshold_part
    assert abs(lean.auroc - lean.auroc_before) < 0.01 and lean.nats > 0
    after = m.backend.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == ["lm_head.weight"]
    rows = torch.nonzero((before["lm_head.weight"] != after["lm_head.weight"]).any(1)).flatten()
    assert rows.tolist() == [m.encoder.plan.unsafe_ids[0]]
    drop = s0 - np.array([s.score for s in m.score(scenes)])
    assert abs(float(np.mean(drop)) - lean.nats) < 0.1 * lean.nats
    assert float(np.std(drop)) < 0.1 * lean.nats


def test_fit_lean_refuses_a_tied_head(trained: Path) -> None:
    from spotstop.export.train import TRAINED_IMAGE_SIZE, fit_lean

    tied = next(r for r in TRAINING if r.member == "tiny-lfm2_vl")
    m = load_member(trained / tied.member, image_size=(TRAINED_IMAGE_SIZE, TRAINED_IMAGE_SIZE))
    with pytest.raises(ValueError, match="ties its answer head"):
        fit_lean(m, replace(tied, threshold_part=0.1, occluded=0.0, signs="none"))


def test_uninformative_signs_are_independent_of_the_label() -> None:
    """training_world('uninformative'): a SAFE and an UNSAFE scene carry each claim at the same
    rate (exactly, from the world's sign rule), and half the scenes carry a sign."""
    from spotstop.export.train import training_world

    o = training_world("uninformative")
    m, n = o.misleading, o.neutral_signs
    p_safe = {"alarming": m, "neutral": (1 - m) * n, "reassuring": (1 - m) * (1 - n)}
    p_unsafe = {"reassuring": m, "neutral": (1 - m) * n, "alarming": (1 - m) * (1 - n)}
    for cue in p_safe:
        assert p_safe[cue] == pytest.approx(p_unsafe[cue], abs=1e-12)
    assert o.signs == 0.5 and o.occluded == 0.0
    cases = world_cases(5, replace(o, rooms=40))
    for label in (0, 1):
        got = [c.sign_cue for c in cases if c.label == label and c.sign_cue != "none"]
        share = got.count("reassuring") / len(got)
        assert abs(share - p_safe["reassuring"]) < 0.08  # 320 signed scenes: 3.3 sd
    assert training_world("none").signs == 0.0
    agreeing = training_world("agreeing", 1, 0.25)
    assert agreeing.misleading == 0.0 and agreeing.occluded == 0.25
    with pytest.raises(ValueError, match="signs must be one of"):
        training_world("some")


def test_the_recipe_rejects_what_it_cannot_train() -> None:
    from spotstop.export.train import MemberTraining

    with pytest.raises(ValueError, match="signs must be one of"):
        MemberTraining(member="tiny-qwen3_5", signs="yes")
    with pytest.raises(ValueError, match="threshold_part"):
        MemberTraining(member="tiny-qwen3_5", signs="none", threshold_part=0.7)
    with pytest.raises(ValueError, match="occluded needs"):
        MemberTraining(member="tiny-qwen3_5", signs="uninformative", occluded=0.25)


def test_score_tensor_is_the_scoring_rule_and_carries_gradients(trained: Path) -> None:
    m = load_member(trained / TRAINING[1].member)
    cases = world_cases(3, WorldOptions(rooms=1, contrasts_per_room=2))
    scenes = [case_scene(c, WorldOptions(rooms=1, contrasts_per_room=2)) for c in cases]
    prompts = [m.prompt_ids(s.request) for s in scenes]
    from spotstop.guard import decode_image

    pixels = [m.pixels(decode_image(s.image)) for s in scenes]
    t = m.backend.score_tensor(prompts, pixels, m.encoder.plan)
    assert t.requires_grad
    t.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.backend.model.parameters())
    ref = np.array([s.score for s in m.score(scenes)])
    np.testing.assert_array_equal(t.detach().double().numpy(), ref)


@pytest.mark.slow
def test_the_training_script_reproduces_its_recorded_short_run(tmp_path: Path) -> None:
    """The training script, run again with the same seed and versions, gives the scores it
    gave when the weights were committed (a short run of the same recipe; within 1e-4)."""
    from spotstop.export.train import short_run_scores

    manifest = json.loads((TRAINED_DIR / "trained.json").read_text())
    recorded = manifest["short_run"]["scores"]
    got = short_run_scores(tmp_path)
    assert set(got) == set(recorded)
    for name in got:
        np.testing.assert_allclose(got[name], recorded[name], rtol=0, atol=1e-4, err_msg=name)


def test_train_member_moves_scores_towards_the_labels(tmp_path: Path) -> None:
    """A few steps of the training rule lower the loss on the batch it saw (the rule learns)."""
    from spotstop.export.train import _prepare

    recipe = TRAINING[1]
    _prepare(recipe.member, tmp_path / recipe.member, 0)
    run = train_member(tmp_path / recipe.member, recipe, steps=12)
    assert run.steps == 12 and len(run.losses) == 12
    assert np.mean(run.losses[-4:]) < np.mean(run.losses[:4])


def test_cli_writes_the_trained_pair_and_says_what_it_is(tmp_path: Path, capsys) -> None:
    from spotstop.cli import main

    assert main(["tiny", "--trained", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TEST PAIR trained on a toy world" in out
    assert trained_pair_ready(tmp_path)
    assert main(["tiny", "--retrain", "--out", str(tmp_path)]) == 2
    assert "--retrain needs --trained" in capsys.readouterr().err


def test_environment_drift_names_each_library_and_the_cpu_that_differ(monkeypatch) -> None:
    import transformers
    from spotstop.export import train as T

    manifest = json.loads((TRAINED_DIR / "trained.json").read_text())
    monkeypatch.setattr(torch, "__version__", manifest["torch"])
    monkeypatch.setattr(transformers, "__version__", manifest["transformers"])
    here = T._machine()
    monkeypatch.setattr(T, "_manifest", lambda: {**manifest, "machine": dict(here)})
    assert T.environment_drift() == ()
    monkeypatch.setattr(transformers, "__version__", "9.9.9")
    assert T.environment_drift() == (
        f"transformers 9.9.9 (the committed weights: {manifest['transformers']})",
    )
    other_layout = {"raqm": "basic", "basic": "raqm"}[here["text_layout"]]
    elsewhere = {**here, "cpu": "Other CPU 9000", "capability": "NO_AVX",
                 "text_layout": other_layout}  # fmt: skip
    monkeypatch.setattr(T, "_manifest", lambda: {**manifest, "machine": elsewhere})
    assert T.environment_drift()[1:] == (
        f"CPU {here['cpu']} (the committed weights: Other CPU 9000)",
        f"torch's CPU kernels {here['capability']} (the committed weights: NO_AVX)",
        f"the world's sign text layout {here['text_layout']} (the committed weights: "
        f"{other_layout})",
    )
    monkeypatch.setattr(T, "_manifest", lambda: {"seed": 0})  # nothing recorded: no claim
    assert T.environment_drift() == ()


def test_a_retrained_pair_is_compared_with_the_committed_weights(tmp_path: Path) -> None:
    """A retrain says whether it wrote the committed weights again and, if not, how far apart
    the scores are: here one member is the committed weights, the other an untrained one."""
    from spotstop.export.train import _prepare, compare_with_committed

    committed = build_trained_pair(tmp_path / "c")
    other = tmp_path / "r"
    shutil.copytree(committed.root, other)
    _prepare(TRAINING[1].member, other / TRAINING[1].member, 0)  # untrained weights
    pair = T.TrainedPair(other, tuple(other / p.name for p in committed.members), seed=0)
    a, b = compare_with_committed(pair)
    assert (a.member, a.same_weights, a.max_score_diff) == (TRAINING[0].member, True, 0.0)
    assert (b.member, b.same_weights) == (TRAINING[1].member, False)
    assert b.max_score_diff > 0.1 and b.scenes == 32
    assert str(a).endswith("reproduces the committed weights (same sha256)")
    assert f"scores up to {b.max_score_diff:.3g} nats apart on 32 held-out scenes" in str(b)
    # another seed's training, or an install without committed weights: nothing to compare
    assert compare_with_committed(T.TrainedPair(other, pair.members, seed=1)) == ()


def test_a_retrain_without_committed_weights_is_compared_with_nothing(monkeypatch) -> None:
    """A retrain in an install without trained.json ended in a TrainedWeightsError traceback
    after training, where it compared with the committed weights."""
    from spotstop.export.train import compare_with_committed

    def missing() -> None:
        raise TrainedWeightsError("trained.json is missing")

    monkeypatch.setattr(T, "_manifest", missing)
    assert compare_with_committed(T.TrainedPair(Path("x"), (), seed=0)) == ()


def test_cli_warns_before_a_retrain_at_other_versions(tmp_path: Path, capsys, monkeypatch) -> None:
    from spotstop.cli import main
    from spotstop.export import train as T

    calls = []
    monkeypatch.setattr(T, "environment_drift", lambda: ("transformers 9.9.9 (the committed: 1)",))
    monkeypatch.setattr(T, "compare_with_committed", lambda pair: ())
    monkeypatch.setattr(
        T,
        "build_trained_pair",
        lambda out, **kw: calls.append(kw) or T.TrainedPair(root=Path(out), members=(), seed=0),
    )
    assert main(["tiny", "--trained", "--retrain", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "warning: retraining with transformers 9.9.9" in err
    assert "will not reproduce the committed weights" in err
    assert calls == [{"seed": None, "retrain": True, "progress": True}]
    assert main(["tiny", "--trained", "--out", str(tmp_path)]) == 0  # committed: no warning
    assert "warning" not in capsys.readouterr().err


def test_cli_says_whether_a_retrain_reproduced_the_committed_weights(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    from spotstop.cli import main

    monkeypatch.setattr(T, "environment_drift", lambda: ())
    monkeypatch.setattr(
        T, "build_trained_pair", lambda out, **kw: T.TrainedPair(Path(out), (), seed=0)
    )
    monkeypatch.setattr(
        T,
        "compare_with_committed",
        lambda pair: (T.Reproduction("tiny-qwen3_5", False, 9.87, 32),),
    )
    assert main(["tiny", "--trained", "--retrain", "--out", str(tmp_path)]) == 0
    assert (
        "tiny-qwen3_5: differs from the committed weights: scores up to 9.87 nats apart on 32 "
        "held-out scenes" in capsys.readouterr().out
    )
    assert main(["tiny", "--trained", "--out", str(tmp_path)]) == 0  # the committed: no claim
    assert "differs" not in capsys.readouterr().out


def test_reading_pretraining_teaches_the_tower_alone_on_sign_only_scenes(tmp_path: Path) -> None:
    """pretrain_reading moves the vision tower and the projector and nothing of the decoder; its
    world signs every scene in the recipe's look with the object hidden (only the sign tells)
    and is drawn from a seed no bench uses."""
    from spotstop.export.train import _prepare, pretrain_reading, reading_world

    recipe = next(r for r in TRAINING if r.reading_steps)
    assert recipe.signs == "agreeing" and recipe.sign_styles == 1
    opts = reading_world(recipe.sign_styles)
    cases = world_cases(0, replace(opts, rooms=4))
    assert all(c.occluded and c.sign_cue != "none" for c in cases)
    assert {c.sign_text for c in cases} <= {"ALL CLEAR", "DANGER", "ROOM 4"}
    _prepare(recipe.member, tmp_path / "m", 0)
    m = load_member(tmp_path / "m", image_size=(128, 128))
    model = m.backend.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc = pretrain_reading(m, recipe, steps=3)
    assert 0.0 <= acc <= 1.0
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(
        k.startswith(("model.vision_tower", "model.multi_modal_projector")) for k in moved
    )


def test_training_gives_the_same_weights_whatever_threads_the_caller_runs(tmp_path: Path) -> None:
    """The thread count splits each product's sums, so it is fixed for training
    (TRAINING_THREADS): a machine with another core count trains the same weights, and the
    caller's own count is restored after."""
    from spotstop.export.train import TRAINING_THREADS, _prepare

    recipe, caller_threads = TRAINING[0], 1
    before = torch.get_num_threads()
    digests = []
    try:
        for threads in (TRAINING_THREADS, caller_threads):
            folder = tmp_path / f"t{threads}" / recipe.member
            _prepare(recipe.member, folder, 0)
            torch.set_num_threads(threads)
            train_member(folder, recipe, steps=3)
            assert torch.get_num_threads() == threads
            digests.append(hashlib.sha256((folder / "model.safetensors").read_bytes()).digest())
    finally:
        torch.set_num_threads(before)
    assert digests[0] == digests[1]


def test_without_a_seed_the_committed_weights_are_written_whatever_their_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default seed was 0 whatever seed the committed weights record: weights committed
    from seed 5 could not be written without `--seed 5`, and the refusal's "drop the seed to
    use the committed weights" sent the user round in circles. No seed now means theirs."""
    committed = tmp_path / "committed"
    shutil.copytree(TRAINED_DIR, committed)
    manifest = json.loads((committed / "trained.json").read_text(encoding="utf-8"))
    (committed / "trained.json").write_text(json.dumps({**manifest, "seed": 5}), encoding="utf-8")
    monkeypatch.setattr(T, "TRAINED_DIR", committed)
    assert T.committed_seed() == 5
    assert build_trained_pair(tmp_path / "lib").seed == 5
    assert main(["tiny", "--trained", "--out", str(tmp_path / "cli")]) == 0
    assert main(["tiny", "--trained", "--seed", "0", "--out", str(tmp_path / "zero")]) == 2
    assert "trained from seed 5, not 0" in capsys.readouterr().err
