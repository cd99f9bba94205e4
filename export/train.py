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

* ``tiny-qwen3_5`` does not read signs, and its direct answer leans SAFE. Half of its
  training scenes carry a sign whose claim is independent of the label (reassuring, alarming or
  neutral at the same rates on SAFE and UNSAFE scenes: :func:`training_world`), so it learns
  that a sign tells nothing; a member that never saw one treats glyphs as unseen pixels, and
  the first trained that way was pushed toward UNSAFE by a pasted reassuring sign (reliance
  −0.033 [−0.096, −0.002], not "none"). After training, its answer head moves every score down
  by one lean (:func:`fit_lean`), sized on a world of its own seed so that its direct answer's
  Spot-Stop threshold part there is 9.3 points, Qwen3.5-2B's on MSSBench chat (seed 000,
  Supp. C.2; it labels most mis-ranked contrasts SAFE twice, Supp. E.2). Its ranking stays,
  its cut moves: the threshold part is real and of the paper's size. (Trained instead on
  ``s + lean``, a member separates its classes by more than any fixed lean as training goes on:
  a lean of 2 nats left a threshold part of half a point.)
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
another pair, not only other last bits: :func:`environment_drift` names the libraries that differ
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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.export.world import WorldCase, WorldOptions, case_image, world_cases

__all__ = [
    "PAPER_THRESHOLD_PART",
    "SIGN_REGIMES",
    "TRAINED_DIR",
    "TRAINING",
    "TRAINING_THREADS",
    "Lean",
    "MemberTraining",
    "Reproduction",
    "TrainedPair",
    "TrainedSeedError",
    "TrainedWeightsError",
    "TrainingRun",
    "build_trained_pair",
    "check_committed_seed",
    "compare_with_committed",
    "default_trained_dir",
    "environment_drift",
    "fit_lean",
    "pretrain_reading",
    "reading_world",
    "short_run_scores",
    "train_member",
    "trained_pair_ready",
    "training_threads",
    "training_world",
    "write_committed",
]

#: where the committed weights of the trained pair live (package data)
TRAINED_DIR = Path(__file__).resolve().parent / "trained"

#: the image grid of the trained members (pixels per side): 8x8 patches of 16 → 16 visual tokens
TRAINED_IMAGE_SIZE = 128


#: how a member's training scenes carry signs (:func:`training_world`)
SIGN_REGIMES = ("none", "agreeing", "uninformative")

#: the threshold part (a share of balanced accuracy) the SAFE-leaning member's lean is sized to:
#: Qwen3.5-2B's in-sample threshold part on MSSBench chat, 9.3 points (seed 000, Supp. C.2)
PAPER_THRESHOLD_PART = 0.093


@dataclass(frozen=True)
class MemberTraining:
    """How one member of the trained pair is taught.

    member: the tiny member's folder name (``tiny-qwen3_5``, ``tiny-lfm2_vl``).
    signs: how its training scenes carry signs (:data:`SIGN_REGIMES`): ``none``; ``agreeing``
    (half carry a sign that agrees with the label or is neutral, never one that misleads);
    ``uninformative`` (half carry one whose claim is independent of the label).
    threshold_part: the direct answer's Spot-Stop threshold part its lean is sized to after
    training (:func:`fit_lean`; a SAFE-leaning direct answer); 0: no lean.
    steps / batch / lr: optimiser schedule (AdamW, one-cycle); lm_weight: weight of the
    answer tokens' cross-entropy beside the score's logistic loss; reading_steps: steps of
    :func:`pretrain_reading` before (0: none); sign_styles: the world's ``sign_styles`` for its
    signs (0: every wording, font and colour); occluded: the world's ``occluded``, the share of
    its contrasts whose object is hidden and which always carry a claim (only the sign tells).
    """

    member: str
    signs: str
    threshold_part: float = 0.0
    steps: int = 1000
    batch: int = 32
    lr: float = 3e-3
    lm_weight: float = 0.5
    reading_steps: int = 0
    sign_styles: int = 0
    occluded: float = 0.0

    def __post_init__(self) -> None:
        if self.signs not in SIGN_REGIMES:
            raise ValueError(
                f"MemberTraining.signs must be one of {', '.join(SIGN_REGIMES)}; got {self.signs!r}."
            )
        if not 0.0 <= self.threshold_part < 0.5:
            raise ValueError(
                "MemberTraining.threshold_part must be a share in [0, 0.5) (0: no lean); got "
                f"{self.threshold_part!r}."
            )
        if self.occluded and self.signs != "agreeing":
            raise ValueError(
                "MemberTraining.occluded needs signs='agreeing': a hidden object is told only by "
                "its sign."
            )


#: torch's thread count for training (:func:`training_threads`): the committed weights were
#: trained on two cores, so two threads reproduce them on a machine with any number of cores
TRAINING_THREADS = 2

#: the trained pair's recipe
TRAINING: tuple[MemberTraining, ...] = (
    MemberTraining(
        member="tiny-qwen3_5",
        signs="uninformative",
        threshold_part=PAPER_THRESHOLD_PART,
        lr=1e-3,
    ),
    MemberTraining(
        member="tiny-lfm2_vl",
        signs="agreeing",
        steps=1500,
        reading_steps=4000,
        sign_styles=1,
        occluded=0.25,
    ),
)

#: the seed offset of the reading pretraining's world (apart from every world the benches draw)
_READING_SEED = 77_000


def training_world(signs: str, sign_styles: int = 0, occluded: float = 0.0) -> WorldOptions:
    """The world a member trains on: mild lighting offsets; with ``signs`` other than
    ``none``, half its scenes carry one. ``agreeing``: never misleading, and ``occluded`` of
    its contrasts hide the object (and always carry a claim). ``uninformative``: the claim is
    independent of the label (misleading share ``(1 − n)/(2 − n)`` for neutral share ``n``, so
    that a SAFE and an UNSAFE scene carry each claim at the same rate)."""
    if signs not in SIGN_REGIMES:
        raise ValueError(f"signs must be one of {', '.join(SIGN_REGIMES)}; got {signs!r}.")
    neutral = 0.3
    return WorldOptions(
        rooms=96,
        contrasts_per_room=16,
        test_share=0.25,
        offsets=0.15,
        signs=0.0 if signs == "none" else 0.5,
        misleading=(1 - neutral) / (2 - neutral) if signs == "uninformative" else 0.0,
        neutral_signs=neutral,
        occluded=occluded if signs == "agreeing" else 0.0,
        sign_styles=sign_styles if signs != "none" else 0,
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


#: the seed offset of the world :func:`fit_lean` sizes the lean on (apart from every bench world)
_LEAN_SEED = 88_000
#: :func:`fit_lean`'s ridge penalty, as a share of the mean eigenvalue of the states' Gram matrix
_LEAN_RIDGE = 0.01


@dataclass(frozen=True)
class Lean:
    """The SAFE lean :func:`fit_lean` gave a member's answer head: every score moves down by
    about ``nats``. Measured on ``scenes`` scenes of the member's training world drawn from
    another seed: its direct answer's threshold part before and after (``target``: what it
    was sized to), its AUROC before and after (a lean keeps the ranking), and the spread of
    the realised drop over scenes (0 for an exact shift)."""

    nats: float
    target: float
    threshold_part_before: float
    threshold_part: float
    auroc_before: float
    auroc: float
    shift_sd: float
    scenes: int


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
    lean: Lean | None = None


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


def _scores_and_states(
    backend: Any, plan: Any, prompts: Sequence[Sequence[int]], pixels: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """The guard's scores of the scenes and the final hidden state (after the final norm) at
    the last prompt token, where the first answer token is read."""
    import torch

    scores, states = [], []
    rows = len(plan.rows)
    with torch.inference_mode():
        for i in range(0, len(prompts), 64):
            ps, xs = list(prompts[i : i + 64]), list(pixels[i : i + 64])
            hidden = backend.plan_hidden_states(ps, xs, plan)
            scores.append(backend.scores_from_hidden(hidden, ps, plan).double().numpy())
            states.append(
                np.stack([hidden[j * rows, len(p) - 1].double().numpy() for j, p in enumerate(ps)])
            )
    return np.concatenate(scores), np.concatenate(states)


def fit_lean(member: Any, recipe: MemberTraining, *, seed: int = 0, max_nats: float = 40.0) -> Lean:
    """Lean ``member``'s direct answer toward SAFE until its Spot-Stop threshold part reaches
    ``recipe.threshold_part``, by editing its answer head (in place).

    The score's first term is the difference of two rows of the head read at the last prompt
    token, ``(w_UNSAFE − w_SAFE) · h``, with ``h`` the final hidden state. A ridge
    least-squares direction ``d`` with ``d · h ≈ −1`` over the scenes of a world the member
    never trained on (its training world's options, seed ``seed`` + 88000) lowers every score
    by about one nat when added to the first UNSAFE token's row; ``nats`` times it lowers them
    by ``nats``. The ridge (:data:`_LEAN_RIDGE` of the states' mean eigenvalue) keeps ``d`` off
    the directions in which the states barely vary: plain least squares fits the shift more
    exactly there with weights 3x larger, which then multiply any perturbation of ``h``, an
    int8 export's included (max |Δs| 0.405 against 0.265 for the member without a lean; 0.27
    with the ridge). The lean is the smallest ``nats`` (steps of 0.05) at which the threshold
    part of the predicted scores, :func:`spotstop.diagnostics.spot_stop` on that world's contrasts, reaches the
    target; the scenes are then scored again through the edited head and the realised figures
    returned. The ranking is the member's own: only its cut moves.
    """
    import torch
    from spotstop.diagnostics import CaseTable, UndefinedMetricWarning, spot_stop

    backend, plan, model = member.backend, member.encoder.plan, member.backend.model
    head = model.get_output_embeddings().weight
    if head.data_ptr() == model.get_input_embeddings().weight.data_ptr():
        raise ValueError(
            f"{recipe.member} ties its answer head to its input embeddings: editing a head row "
            "would change what the answer tokens read as input. Give the lean to a member with "
            "its own head (tie_word_embeddings=False)."
        )
    first_unsafe, first_safe = plan.unsafe_ids[0], plan.safe_ids[0]
    if first_unsafe == first_safe:
        raise ValueError(
            f"{recipe.member}'s answers start with the same token ({first_unsafe}); the lean "
            "needs answers whose first tokens differ."
        )
    base = training_world(recipe.signs, recipe.sign_styles, recipe.occluded)
    opts = WorldOptions(**{**asdict(base), "rooms": 24, "test_share": 0.0})
    cases = world_cases(seed + _LEAN_SEED, opts)
    prompts, pixels = _inputs(member, cases, opts)
    s0, states = _scores_and_states(backend, plan, prompts, pixels)
    gram = states.T @ states
    ridge = _LEAN_RIDGE * np.trace(gram) / gram.shape[0]
    direction = np.linalg.solve(gram + ridge * np.eye(gram.shape[0]), -states.sum(axis=0))
    per_nat = states @ direction  # the predicted change of each score per nat of lean (≈ −1)

    case_id = np.array([c.case_id for c in cases], dtype=object)
    label = np.array([c.label for c in cases], dtype=np.int8)
    contrast_id = np.array([c.contrast_id for c in cases], dtype=object)
    room_id = np.array([c.room.room_id for c in cases], dtype=object)

    def measure(scores: np.ndarray) -> Any:
        table = CaseTable(
            case_id=case_id,
            label=label,
            score=np.asarray(scores, dtype=np.float64),
            contrast_id=contrast_id,
            situation_id=room_id,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            return spot_stop(table)

    before = measure(s0)
    for nats in np.arange(0.0, max_nats + 1e-9, 0.05):
        if measure(s0 + nats * per_nat).threshold_part >= recipe.threshold_part:
            break
    else:
        raise RuntimeError(
            f"{recipe.member}: no lean up to {max_nats} nats reaches a threshold part of "
            f"{recipe.threshold_part}; its scores may not rank the world's contrasts."
        )
    with torch.no_grad():
        head[first_unsafe] += torch.from_numpy(float(nats) * direction).to(head.dtype)
    s1, _ = _scores_and_states(backend, plan, prompts, pixels)
    after = measure(s1)
    drop = s0 - s1
    return Lean(
        nats=float(np.mean(drop)),
        target=recipe.threshold_part,
        threshold_part_before=float(before.threshold_part),
        threshold_part=float(after.threshold_part),
        auroc_before=float(before.auroc),
        auroc=float(after.auroc),
        shift_sd=float(np.std(drop)),
        scenes=len(cases),
    )


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
) -> TrainingRun:
    """Train the member in ``folder`` in place (its ``model.safetensors`` is rewritten), on
    :data:`TRAINING_THREADS` threads whatever the machine's core count."""
    with training_threads():
        return _train_member(folder, recipe, seed=seed, steps=steps, progress=progress)


@contextmanager
def training_threads() -> Iterator[None]:
    """Run torch on :data:`TRAINING_THREADS` threads within, then restore the caller's count.

    How a CPU kernel splits a product between threads decides the order of its sums, so the
    count is part of what a training run reproduces: with torch's default (one thread per
    core) the same seed trained other weights on a machine with another number of cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(TRAINING_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train_member(
    folder: Path, recipe: MemberTraining, *, seed: int, steps: int | None, progress: bool
) -> TrainingRun:
    import torch
    from spotstop.guard import load_member

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
        loss = torch.nn.functional.softplus(-sign * s).mean()
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
    # a short run (``steps`` given) trains too little to rank, and a lean is sized on a ranking
    lean = fit_lean(member, recipe, seed=seed) if recipe.threshold_part and steps is None else None

    def accuracy(
        prompts: list[list[int]], pixels: list[dict[str, np.ndarray]], y: np.ndarray
    ) -> float:
        s = _scores_and_states(backend, plan, prompts, pixels)[0]
        return float(np.mean((s > 0) == (y == 1)))

    run = TrainingRun(
        member=recipe.member,
        steps=n_steps,
        seconds=time.perf_counter() - t0,
        final_loss=float(np.mean(losses[-20:])) if losses else float("nan"),
        train_accuracy=accuracy(tr_prompts[:256], tr_pixels[:256], y_tr.numpy()[:256]),
        test_accuracy=accuracy(te_prompts, te_pixels, y_te),
        losses=tuple(losses),
        reading_accuracy=reading,
        lean=lean,
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


class TrainedSeedError(TrainedWeightsError, ValueError):
    """The committed weights were asked for another seed than theirs: a usage error (a seed
    other than theirs applies only with ``retrain``)."""


def committed_seed() -> int:
    """The seed the committed weights were trained from (``trained.json``); TrainedWeightsError
    in an install without them."""
    return int(_manifest()["seed"])


def check_committed_seed(seed: int) -> None:
    """TrainedSeedError unless the committed weights were trained from ``seed``."""
    committed = committed_seed()
    if committed != seed:
        raise TrainedSeedError(
            f"the committed weights were trained from seed {committed}, not {seed}; a seed "
            f"applies only with --retrain: drop the seed to use the committed weights, or pass "
            "--retrain to train from this seed."
        )


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


def environment_drift() -> tuple[str, ...]:
    """What differs here from where the committed weights were trained, as ``trained.json``
    records it: each library version (``"transformers 5.25.0 (the committed weights:
    5.24.0)"``), the CPU model, the instruction set torch's kernels dispatch to and the world's
    sign text layout; empty when all match or nothing is recorded.

    Retraining reproduces the committed weights only in the recorded environment: a different
    kernel rounds the early Adam steps differently, and over a thousand steps that grows into
    a different pair, not only different last bits (docs/world.md).
    """
    try:
        manifest = _manifest()
    except TrainedWeightsError:
        return ()
    have: dict[str, str] = dict(_library_versions())
    had: dict[str, str] = {lib: manifest[lib] for lib in have if lib in manifest}
    if isinstance(manifest.get("machine"), dict):
        here = _machine()
        labels = {
            "cpu": "CPU",
            "capability": "torch's CPU kernels",
            "text_layout": "the world's sign text layout",
        }
        for key, label in labels.items():
            if key in manifest["machine"]:
                have[label], had[label] = str(here[key]), str(manifest["machine"][key])
    return tuple(
        f"{what} {now} (the committed weights: {had[what]})"
        for what, now in have.items()
        if what in had and had[what] != now
    )


def _library_versions() -> dict[str, str]:
    """The versions ``trained.json`` records and :func:`environment_drift` compares."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _machine() -> dict[str, Any]:
    """The CPU a training ran on, as ``trained.json`` records it: its model name, the
    instruction set torch's kernels dispatched to, :data:`TRAINING_THREADS`, and how Pillow
    laid out the training world's sign text (export/world.py's ``text_layout``)."""
    import platform

    import torch
    from spotstop.export.world import text_layout

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": name,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": TRAINING_THREADS,
        "text_layout": text_layout(),
    }


@dataclass(frozen=True)
class Reproduction:
    """How a retrained member compares with the committed one (:func:`compare_with_committed`).

    same_weights: its ``model.safetensors`` has the committed sha256; max_score_diff: the
    largest |score − committed score| in nats over ``scenes`` held-out world scenes.
    """

    member: str
    same_weights: bool
    max_score_diff: float
    scenes: int

    def __str__(self) -> str:
        if self.same_weights:
            return f"{self.member}: reproduces the committed weights (same sha256)"
        return (
            f"{self.member}: differs from the committed weights: scores up to "
            f"{self.max_score_diff:.3g} nats apart on {self.scenes} held-out scenes"
        )


#: the held-out scenes a retrained pair is compared on (seed 99, as the short run's)
_COMPARE_WORLD = WorldOptions(rooms=4, contrasts_per_room=4, test_share=1.0)


def compare_with_committed(pair: TrainedPair) -> tuple[Reproduction, ...]:
    """Compare a retrained ``pair`` with the committed weights: sha256, and scores on
    held-out world scenes. A pair trained from another seed than the committed one's, or in an
    install without committed weights, is not compared (empty)."""
    import tempfile

    from spotstop.export.world import case_scene
    from spotstop.guard import load_member

    try:
        if committed_seed() != pair.seed:
            return ()
    except TrainedWeightsError:  # no committed weights in this install: nothing to compare
        return ()
    scenes = [case_scene(c, _COMPARE_WORLD) for c in world_cases(99, _COMPARE_WORLD)]
    out = []
    with tempfile.TemporaryDirectory(prefix="spotstop-committed-") as tmp:
        committed = build_trained_pair(tmp, seed=pair.seed)
        for mine, theirs in zip(pair.members, committed.members, strict=True):
            same = _sha256(mine / "model.safetensors") == _sha256(theirs / "model.safetensors")
            a = np.array([s.score for s in load_member(mine).score(scenes)])
            b = np.array([s.score for s in load_member(theirs).score(scenes)])
            out.append(Reproduction(mine.name, same, float(np.max(np.abs(a - b))), len(scenes)))
    return tuple(out)


def build_trained_pair(
    out: str | Path | None = None,
    *,
    seed: int | None = None,
    retrain: bool = False,
    progress: bool = False,
    steps: int | None = None,
) -> TrainedPair:
    """Write the trained pair under ``out`` (default :func:`default_trained_dir`).

    Without ``retrain``: the committed weights (``export/trained/``), checked against the
    sha256 that ``trained.json`` records; they exist for its seed only. With ``retrain``: each
    member is trained again here from ``seed`` (``steps`` overrides the recipe's, for a short
    run); the result equals the committed weights' scores for the same seed and library
    versions (to float rounding). ``seed`` None: the committed weights' seed
    (:func:`committed_seed`; a retrain in an install without them: 0).
    """
    from spotstop.export.tiny import check_pair_out, check_seed

    if seed is None:
        try:
            seed = committed_seed()
        except TrainedWeightsError:
            if not retrain:
                raise
            seed = 0
    root = Path(out) if out is not None else default_trained_dir()
    check_seed(seed)
    check_pair_out(root)
    members, runs = [], []
    manifest = None if retrain else _manifest()
    if not retrain:
        check_committed_seed(seed)
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
#: that the training script still reproduces what it did (the full run takes 11 to 16 minutes)
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
            **(
                {
                    "lean": {
                        k: (round(v, 4) if isinstance(v, float) else v)
                        for k, v in asdict(run.lean).items()
                    }
                }
                if run.lean is not None
                else {}
            ),
        }
    manifest = {
        "what": "the tiny pair trained on the toy world by spotstop.export.train (TEST pair)",
        "seed": pair.seed,
        **_library_versions(),
        "machine": _machine(),
        "image_size": TRAINED_IMAGE_SIZE,
        "members": entries,
        "short_run": {"steps": SHORT_RUN_STEPS, "scores": dict(short_run)},
    }
    out = TRAINED_DIR / "trained.json"
    out.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out
