"""The trained tiny pair: committed weights, the training rule, reproducibility, held-out signal.

The held-out checks score the committed pair on a world seed the training never drew (its
rooms, layouts and lighting are new); the figures with intervals are in bench/RESULTS.md
(``python bench/trained_world.py``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

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
    """The member trained on ``s + lean`` centres its classes near ``−lean``, not 0, so its
    direct answer (S > 0: UNSAFE) leans SAFE: the midpoint of its mean SAFE and mean UNSAFE
    score lies below ``−lean/2``, while the member trained without a lean centres within
    ``lean/2`` of 0. (Whether that makes a Spot-Stop threshold part, with its interval, and how
    much the batch-mean cut recovers, needs a bigger world: bench/RESULTS.md, trained-world.)"""
    y = held_out_scores["label"]
    lean = next(r for r in TRAINING if r.lean > 0)
    plain = next(r for r in TRAINING if r.lean == 0)

    def midpoint(member: str) -> float:
        s = held_out_scores[member]
        return float((s[y == 0].mean() + s[y == 1].mean()) / 2)

    assert midpoint(lean.member) < -lean.lean / 2
    assert abs(midpoint(plain.member)) < lean.lean / 2


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


def test_version_drift_names_each_library_that_differs_from_the_record(monkeypatch) -> None:
    import transformers
    from spotstop.export import train as T

    manifest = json.loads((TRAINED_DIR / "trained.json").read_text())
    monkeypatch.setattr(torch, "__version__", manifest["torch"])
    monkeypatch.setattr(transformers, "__version__", manifest["transformers"])
    assert T.version_drift() == ()
    monkeypatch.setattr(transformers, "__version__", "9.9.9")
    assert T.version_drift() == (
        f"transformers 9.9.9 (the committed weights: {manifest['transformers']})",
    )
    monkeypatch.setattr(T, "_manifest", lambda: {"seed": 0})  # nothing recorded: no claim
    assert T.version_drift() == ()


def test_cli_warns_before_a_retrain_at_other_versions(tmp_path: Path, capsys, monkeypatch) -> None:
    from spotstop.cli import main
    from spotstop.export import train as T

    calls = []
    monkeypatch.setattr(T, "version_drift", lambda: ("transformers 9.9.9 (the committed: 1)",))
    monkeypatch.setattr(
        T,
        "build_trained_pair",
        lambda out, **kw: calls.append(kw) or T.TrainedPair(root=Path(out), members=(), seed=0),
    )
    assert main(["tiny", "--trained", "--retrain", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "warning: retraining with transformers 9.9.9" in err
    assert "will not reproduce the committed weights" in err
    assert calls == [{"seed": 0, "retrain": True, "progress": True}]
    assert main(["tiny", "--trained", "--out", str(tmp_path)]) == 0  # committed: no warning
    assert "warning" not in capsys.readouterr().err


def test_reading_pretraining_teaches_the_tower_alone_on_sign_only_scenes(tmp_path: Path) -> None:
    """pretrain_reading moves the vision tower and the projector and nothing of the decoder; its
    world signs every scene in the recipe's look with the object hidden (only the sign tells)
    and is drawn from a seed no bench uses."""
    from spotstop.export.train import _prepare, pretrain_reading, reading_world

    recipe = next(r for r in TRAINING if r.reading_steps)
    assert recipe.signs and recipe.sign_styles == 1
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
