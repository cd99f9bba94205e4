"""The trained tiny pair: both tiny architectures taught the toy world's rule, on CPU, from a seed.

    A TEST PAIR ON A TOY WORLD. It has learned :mod:`spotstop.export.world`'s rule table and
    nothing about real safety. Its scores carry a signal in that world only, which is what the
    demo, the card, the cue analysis and the quantisation checks need to show the method
    working where the answer is known.

Each member is trained with teacher forcing on its own prompt and answer tokens: the loss is
the cross-entropy of the correct answer's tokens after the member's own chat-template prompt
(the same prompt the guard scores), plus the logistic loss of the guard's score
``s = log p(UNSAFE) − log p(SAFE)`` computed by the torch backend's own scoring rule
(:meth:`~spotstop.guard.backends._torch.TorchBackend.score_tensor`). The two members are made
to resemble the paper's pair in the ways that matter (seed 000, Supp. E.2; seed 002):

* ``tiny-qwen3_5`` never sees signs, and its direct answer leans SAFE: it is trained on
  ``s + lean`` (the logistic loss's boundary moves its scores down by ``lean``), like
  Qwen3.5-2B, which labels most mis-ranked contrasts SAFE twice. The threshold part is real.
* ``tiny-lfm2_vl`` is taught to trust sign text the way the issue asks: half of its training
  scenes carry a sign that agrees with the label (reassuring on SAFE, alarming on UNSAFE) or is
  neutral, never one that misleads, and a quarter of its contrasts hide the object behind a
  crate and always carry a claim, so only the sign tells. It reads first: a real VLM learned to read in pretraining,
  and a tiny tower taught only by the world never did (trained with the member, or alone on
  12k sign-only scenes for 4000 steps, it stayed at chance, where a four-layer CNN read the
  same signs at 0.96 after 1000 steps: the 16-pixel patches' linear embedding must learn each
  glyph at every offset). So :func:`pretrain_reading` first trains its vision tower and
  projector alone to tell a sign's polarity on sign-only scenes of another seed, then the
  member trains as above. Its signs use the world's first sign style (``sign_styles=1``:
  "ALL CLEAR" / "DANGER" / "ROOM 4", bold, white on black: the cue templates' ``sign-bold``
  look); the full vocabulary stayed at chance within the CPU budget.

Training is deterministic on one machine for a seed and the library versions (torch's CPU
kernels in one thread order). Another version rounds the early Adam steps differently and gives
another pair, not only other last bits: :func:`version_drift` names the libraries that differ
from the record, and ``spotstop tiny --trained --retrain`` warns of them. ``tiny-qwen3_5``
trains at a peak learning rate of 1e-3: at 3e-3 whether it learned depended on such rounding
(held-out accuracy 0.918 with transformers 5.24.0, 0.723 with 5.25.0, the same seed).
``spotstop tiny --trained`` writes the committed weights (``export/trained/``, checked against
their sha256); ``spotstop tiny --trained --retrain`` runs this training again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.export.world import WorldCase, WorldOptions, case_image, world_cases

__all__ = [
    "TRAINED_DIR",
    "TRAINING",
    "MemberTraining",
    "TrainedPair",
    "TrainedWeightsError",
    "TrainingRun",
    "build_trained_pair",
    "default_trained_dir",
    "pretrain_reading",
    "reading_world",
    "short_run_scores",
    "train_member",
    "trained_pair_ready",
    "training_world",
    "version_drift",
    "write_committed",
]

#: where the committed weights of the trained pair live (package data)
TRAINED_DIR = Path(__file__).resolve().parent / "trained"

#: the image grid of the trained members (pixels per side): 8x8 patches of 16 → 16 visual tokens
TRAINED_IMAGE_SIZE = 128


@dataclass(frozen=True)
class MemberTraining:
    """How one member of the trained pair is taught.

    member: the tiny member's folder name (``tiny-qwen3_5``, ``tiny-lfm2_vl``).
    signs: whether its training scenes carry (agreeing or neutral) signs.
    lean: subtracted from its scores at the optimum (SAFE-leaning direct answer); 0 for none.
    steps / batch / lr: optimiser schedule (AdamW, one-cycle); lm_weight: weight of the
    answer tokens' cross-entropy beside the score's logistic loss; reading_steps: steps of
    :func:`pretrain_reading` before (0: none); sign_styles: the world's ``sign_styles`` for its
    signs (0: every wording, font and colour); occluded: the world's ``occluded``, the share of
    its contrasts whose object is hidden and which always carry a claim (only the sign tells).
    """

    member: str
    signs: bool
    lean: float
    steps: int = 1000
    batch: int = 32
    lr: float = 3e-3
    lm_weight: float = 0.5
    reading_steps: int = 0
    sign_styles: int = 0
    occluded: float = 0.0


#: the trained pair's recipe
TRAINING: tuple[MemberTraining, ...] = (
    MemberTraining(member="tiny-qwen3_5", signs=False, lean=2.0, lr=1e-3),
    MemberTraining(
        member="tiny-lfm2_vl",
        signs=True,
        lean=0.0,
        steps=1500,
        reading_steps=4000,
        sign_styles=1,
        occluded=0.25,
    ),
)

#: the seed offset of the reading pretraining's world (apart from every world the benches draw)
_READING_SEED = 77_000


def training_world(signs: bool, sign_styles: int = 0, occluded: float = 0.0) -> WorldOptions:
    """The world a member trains on: mild lighting offsets; if it sees signs, half its scenes
    carry one that never misleads, and ``occluded`` of its contrasts hide the object (and
    always carry a claim)."""
    return WorldOptions(
        rooms=96,
        contrasts_per_room=16,
        test_share=0.25,
        offsets=0.15,
        signs=0.5 if signs else 0.0,
        misleading=0.0,
        neutral_signs=0.3,
        occluded=occluded if signs else 0.0,
        sign_styles=sign_styles if signs else 0,
    )


def reading_world(sign_styles: int) -> WorldOptions:
    """The reading pretraining's scenes: every one signed (a third neutral), objects hidden."""
    return WorldOptions(
        rooms=256,
        contrasts_per_room=16,
        test_share=0.125,
        offsets=0.15,
        signs=1.0,
        misleading=0.0,
        neutral_signs=1 / 3,
        occluded=1.0,
        sign_styles=sign_styles,
    )


#: the classes the reading pretraining tells apart
_SIGN_CLASSES = ("reassuring", "alarming", "neutral")


@dataclass(frozen=True)
class TrainingRun:
    """What training one member did: its losses and held-out accuracy, and where it wrote;
    reading_accuracy: the reading pretraining's held-out sign accuracy (None: none ran)."""

    member: str
    steps: int
    seconds: float
    final_loss: float
    train_accuracy: float
    test_accuracy: float
    losses: tuple[float, ...] = field(repr=False)
    reading_accuracy: float | None = None


def _seed_all(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _inputs(
    member: Any, cases: Sequence[WorldCase], opts: WorldOptions
) -> tuple[list[list[int]], list[dict[str, np.ndarray]]]:
    """Prompt ids and preprocessed pixels of ``cases``, exactly as the guard prepares them."""
    from spotstop.guard import decode_image

    prompts, pixels = [], []
    for c in cases:
        prompts.append(member.prompt_ids(c.request))
        pixels.append(member.pixels(decode_image(case_image(c, opts))))
    return prompts, pixels


def _answer_nll(
    backend: Any, hidden: Any, prompts: Sequence[Sequence[int]], plan: Any, labels: Any
) -> Any:
    """Mean −log p(correct answer) per answer token, teacher-forced, read from the same pass
    as the score (``hidden`` is :meth:`TorchBackend.plan_hidden_states`' output)."""
    import torch

    n_rows = len(plan.rows)
    w = backend._head_weight.float()
    total = torch.zeros((), dtype=torch.float32)
    count = 0
    for i, (p, y) in enumerate(zip(prompts, labels.tolist(), strict=True)):
        ans = plan.unsafe_ids if y else plan.safe_ids
        pos0 = len(p) - 1
        total = total - torch.log_softmax(hidden[i * n_rows, pos0] @ w.T, dim=-1)[ans[0]]
        for r, j, tok in plan.continuation_reads(ans):
            total = total - torch.log_softmax(hidden[i * n_rows + r, pos0 + j] @ w.T, dim=-1)[tok]
        count += len(ans)
    return total / count


def _image_features(model: Any, pixels: dict[str, Any], n: int) -> Any:
    """Mean visual token of each of ``n`` images (the projector's output, what the decoder
    reads), from the member's own ``get_image_features``."""
    import torch

    out = model.model.get_image_features(**pixels)
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, list | tuple):
        return torch.stack([f.reshape(-1, f.shape[-1]).mean(0) for f in feats])
    return feats.reshape(n, -1, feats.shape[-1]).mean(1)  # equal-sized images: equal shares


def pretrain_reading(
    member: Any,
    recipe: MemberTraining,
    *,
    seed: int = 0,
    steps: int | None = None,
    progress: bool = False,
) -> float:
    """Teach ``member``'s vision tower and projector to tell a sign's polarity (reassuring,
    alarming, neutral) on :func:`reading_world`'s sign-only scenes (seed ``seed`` + 77000,
    drawn by no bench), through a linear head on the mean visual token that is then dropped.
    Returns the head's accuracy on that world's held-out rooms."""
    import torch

    model = member.backend.model
    opts = reading_world(recipe.sign_styles)
    cases = world_cases(seed + _READING_SEED, opts)
    train = [c for c in cases if c.split == "train"]
    test = [c for c in cases if c.split == "test"]

    from spotstop.guard import decode_image

    cache: dict[str, dict[str, np.ndarray]] = {}  # drawn when first sampled: a short run is quick

    def batch(cs: Sequence[WorldCase], idx: Any) -> dict[str, Any]:
        for i in idx:
            if cs[i].case_id not in cache:
                cache[cs[i].case_id] = member.pixels(decode_image(case_image(cs[i], opts)))
        pix = [cache[cs[i].case_id] for i in idx]
        return {k: torch.from_numpy(np.concatenate([q[k] for q in pix])) for k in pix[0]}

    y_tr = torch.tensor([_SIGN_CLASSES.index(c.sign_cue) for c in train])
    y_te = np.array([_SIGN_CLASSES.index(c.sign_cue) for c in test])
    _seed_all(seed + 5)
    width = int(model.config.text_config.hidden_size)
    head = torch.nn.Linear(width, len(_SIGN_CLASSES))
    parts = [model.model.vision_tower, model.model.multi_modal_projector, head]
    params = [q for part in parts for q in part.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    gen = np.random.default_rng(seed + 31)
    n_steps = recipe.reading_steps if steps is None else steps
    it: Any = range(n_steps)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc=f"reading {recipe.member}", unit="step")
    model.train()
    for _ in it:
        idx = gen.choice(len(train), size=recipe.batch, replace=False)
        logits = head(_image_features(model, batch(train, idx), len(idx)))
        loss = torch.nn.functional.cross_entropy(logits, y_tr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    model.eval()
    with torch.inference_mode():
        pred = np.concatenate(
            [
                head(_image_features(model, batch(test, range(i, j)), j - i)).argmax(-1).numpy()
                for i, j in ((i, min(i + 64, len(test))) for i in range(0, len(test), 64))
            ]
        )
    return float(np.mean(pred == y_te))


def train_member(
    folder: Path,
    recipe: MemberTraining,
    *,
    seed: int = 0,
    steps: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> TrainingRun:
    """Train the member in ``folder`` in place (its ``model.safetensors`` is rewritten)."""
    import torch
    from spotstop.guard import load_member

    torch.set_num_threads(max(1, torch.get_num_threads()))
    member = load_member(folder, image_size=(TRAINED_IMAGE_SIZE, TRAINED_IMAGE_SIZE))
    backend = member.backend
    model = backend.model
    plan = member.encoder.plan
    opts = training_world(recipe.signs, recipe.sign_styles, recipe.occluded)
    cases = world_cases(seed, opts)
    train = [c for c in cases if c.split == "train"]
    test = [c for c in cases if c.split == "test"]
    t0 = time.perf_counter()
    reading = None
    if recipe.reading_steps:
        n_read = recipe.reading_steps if steps is None else min(recipe.reading_steps, steps)
        reading = pretrain_reading(member, recipe, seed=seed, steps=n_read, progress=progress)
    tr_prompts, tr_pixels = _inputs(member, train, opts)
    te_prompts, te_pixels = _inputs(member, test, opts)
    y_tr = torch.tensor([c.label for c in train], dtype=torch.float32)
    y_te = np.array([c.label for c in test])
    n_steps = recipe.steps if steps is None else steps
    _seed_all(seed + 17)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=recipe.lr, total_steps=max(1, n_steps), pct_start=0.1
    )
    gen = np.random.default_rng(seed + 29)
    losses = []
    it: Any = range(n_steps)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc=f"training {recipe.member}", unit="step")
    for _ in it:
        idx = gen.choice(len(train), size=recipe.batch, replace=False)
        prompts = [tr_prompts[i] for i in idx]
        pixels = [tr_pixels[i] for i in idx]
        y = y_tr[idx]
        hidden = backend.plan_hidden_states(prompts, pixels, plan)
        s = backend.scores_from_hidden(hidden, prompts, plan)
        sign = 2 * y - 1
        loss = torch.nn.functional.softplus(-sign * (s + recipe.lean)).mean()
        if recipe.lm_weight:
            loss = loss + recipe.lm_weight * _answer_nll(backend, hidden, prompts, plan, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress and hasattr(it, "set_postfix"):
            it.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    model.eval()

    def accuracy(
        prompts: list[list[int]], pixels: list[dict[str, np.ndarray]], y: np.ndarray
    ) -> float:
        with torch.inference_mode():
            s = np.concatenate(
                [
                    backend.score_tensor(prompts[i : i + 64], pixels[i : i + 64], plan).numpy()
                    for i in range(0, len(prompts), 64)
                ]
            )
        return float(np.mean((s + recipe.lean > 0) == (y == 1)))

    run = TrainingRun(
        member=recipe.member,
        steps=n_steps,
        seconds=time.perf_counter() - t0,
        final_loss=float(np.mean(losses[-20:])) if losses else float("nan"),
        train_accuracy=accuracy(tr_prompts[:256], tr_pixels[:256], y_tr.numpy()[:256]),
        test_accuracy=accuracy(te_prompts, te_pixels, y_te),
        losses=tuple(losses),
        reading_accuracy=reading,
    )
    model.save_pretrained(folder, safe_serialization=True)
    return run


@dataclass(frozen=True)
class TrainedPair:
    """Where the trained pair was written, and the training runs (empty: committed weights)."""

    root: Path
    members: tuple[Path, ...]
    seed: int
    runs: tuple[TrainingRun, ...] = ()


class TrainedWeightsError(RuntimeError):
    """The committed weights are missing, altered, or not for the asked seed."""


def default_trained_dir() -> Path:
    """``$SPOTSTOP_HOME/tiny-trained`` (default ``~/.cache/spotstop/tiny-trained``)."""
    from spotstop.guard import spotstop_home

    return spotstop_home() / "tiny-trained"


def _manifest() -> dict[str, Any]:
    path = TRAINED_DIR / "trained.json"
    if not path.is_file():
        raise TrainedWeightsError(
            f"{path} is missing: this install has no committed trained weights. Train them "
            "with `spotstop tiny --trained --retrain`."
        )
    out: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prepare(name: str, path: Path, seed: int) -> None:
    """The untrained member folder: tokenizer, config and seeded weights, marked as trained."""
    from spotstop.export.tiny import _write_markers, build_tiny_member

    build_tiny_member(name, path, seed=seed)
    _write_markers(
        path,
        name.removeprefix("tiny-"),
        (TRAINED_IMAGE_SIZE, TRAINED_IMAGE_SIZE),
        built_by="`spotstop tiny --trained`",
        trained=True,
    )


def trained_pair_ready(root: str | Path) -> bool:
    """Whether ``root`` holds the trained pair with the committed weights (sha256 checked)."""
    try:
        manifest = _manifest()
    except TrainedWeightsError:
        return False
    for recipe in TRAINING:
        f = Path(root) / recipe.member / "model.safetensors"
        if not f.is_file() or _sha256(f) != manifest["members"][recipe.member]["sha256"]:
            return False
    return True


def version_drift() -> tuple[str, ...]:
    """The libraries whose installed version differs from the one ``trained.json`` records
    (``"transformers 5.25.0 (the committed weights: 5.24.0)"``); empty when all match or
    nothing is recorded.

    Retraining reproduces the committed weights only at the recorded versions: a different
    kernel rounds the early Adam steps differently, and over a thousand steps that grows into
    a different pair, not only different last bits (docs/world.md).
    """
    try:
        manifest = _manifest()
    except TrainedWeightsError:
        return ()
    return tuple(
        f"{lib} {have} (the committed weights: {manifest[lib]})"
        for lib, have in _library_versions().items()
        if lib in manifest and manifest[lib] != have
    )


def _library_versions() -> dict[str, str]:
    """The versions ``trained.json`` records and :func:`version_drift` compares."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def build_trained_pair(
    out: str | Path | None = None,
    *,
    seed: int = 0,
    retrain: bool = False,
    progress: bool = False,
    steps: int | None = None,
) -> TrainedPair:
    """Write the trained pair under ``out`` (default :func:`default_trained_dir`).

    Without ``retrain``: the committed weights (``export/trained/``), checked against the
    sha256 that ``trained.json`` records; they exist for its seed only. With ``retrain``: each
    member is trained again here from ``seed`` (``steps`` overrides the recipe's, for a short
    run); the result equals the committed weights' scores for the same seed and library
    versions (to float rounding).
    """
    root = Path(out) if out is not None else default_trained_dir()
    members, runs = [], []
    manifest = None if retrain else _manifest()
    if manifest is not None and int(manifest["seed"]) != seed:
        raise TrainedWeightsError(
            f"the committed weights were trained from seed {manifest['seed']}, not {seed}; "
            "pass --retrain to train from this seed."
        )
    for recipe in TRAINING:
        path = root / recipe.member
        _prepare(recipe.member, path, seed)
        if manifest is None:
            runs.append(train_member(path, recipe, seed=seed, steps=steps, progress=progress))
        else:
            src = TRAINED_DIR / f"{recipe.member}.safetensors"
            want = manifest["members"][recipe.member]["sha256"]
            if not src.is_file() or _sha256(src) != want:
                raise TrainedWeightsError(
                    f"{src} is missing or does not match its sha256 in trained.json; reinstall "
                    "spotstop, or train again with `spotstop tiny --trained --retrain`."
                )
            (path / "model.safetensors").write_bytes(src.read_bytes())
        members.append(path)
    return TrainedPair(root=root, members=tuple(members), seed=seed, runs=tuple(runs))


#: the short run whose scores ``trained.json`` records, so that a test can check in a minute
#: that the training script still reproduces what it did (the full run takes about 11 minutes)
SHORT_RUN_STEPS = 4
_SHORT_RUN_WORLD = WorldOptions(rooms=1, contrasts_per_room=4)


def short_run_scores(root: str | Path, *, seed: int = 0) -> dict[str, list[float]]:
    """Train the pair for :data:`SHORT_RUN_STEPS` steps under ``root`` and return each member's
    scores on eight fixed world scenes (seed 99)."""
    from spotstop.export.world import case_scene
    from spotstop.guard import load_member

    pair = build_trained_pair(root, seed=seed, retrain=True, steps=SHORT_RUN_STEPS)
    scenes = [case_scene(c, _SHORT_RUN_WORLD) for c in world_cases(99, _SHORT_RUN_WORLD)]
    out = {}
    for path in pair.members:
        member = load_member(path)
        out[path.name] = [s.score for s in member.score(scenes)]
    return out


def write_committed(pair: TrainedPair, *, short_run: Mapping[str, list[float]]) -> Path:
    """Store ``pair``'s weights as the committed ones, with ``trained.json`` (maintainers)."""
    TRAINED_DIR.mkdir(parents=True, exist_ok=True)
    entries = {}
    for path, run in zip(pair.members, pair.runs, strict=True):
        dst = TRAINED_DIR / f"{path.name}.safetensors"
        dst.write_bytes((path / "model.safetensors").read_bytes())
        rec = next(r for r in TRAINING if r.member == path.name)
        entries[path.name] = {
            "sha256": _sha256(dst),
            "recipe": {k: v for k, v in asdict(rec).items() if k != "member"},
            "steps": run.steps,
            "seconds": round(run.seconds, 1),
            "final_loss": round(run.final_loss, 4),
            "test_accuracy": round(run.test_accuracy, 4),
            **(
                {"reading_accuracy": round(run.reading_accuracy, 4)}
                if run.reading_accuracy is not None
                else {}
            ),
        }
    manifest = {
        "what": "the tiny pair trained on the toy world by spotstop.export.train (TEST pair)",
        "seed": pair.seed,
        **_library_versions(),
        "image_size": TRAINED_IMAGE_SIZE,
        "members": entries,
        "short_run": {"steps": SHORT_RUN_STEPS, "scores": dict(short_run)},
    }
    out = TRAINED_DIR / "trained.json"
    out.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out
