"""The tiny test pair: two Hugging Face model folders built locally, deterministically.

    THIS IS A TEST PAIR. Its weights are seeded random numbers: its scores and
    decisions mean nothing. It exists so that every code path that loads, scores,
    exports and serves the real pair (Qwen3.5-2B and LFM2.5-VL-3B) runs here, where no
    model hub is reachable, with the real architectures' code.

One member per registered architecture, made from the real configuration class (``Qwen3_5Config``
with Gated-DeltaNet linear attention + full attention and the Qwen3.5 vision tower;
``Lfm2VlConfig`` with the LFM2 short-conv + attention text model and a SigLIP2 vision
tower), shrunk to a few layers of width 64, with weights drawn from a seeded generator.
Its tokenizer is a byte-level BPE trained here on a built-in corpus, with special tokens
and a chat template shaped like the real model's (image placeholder, generation prompt,
reasoning off). What is particular to an architecture (classes, tiny dimensions, special
tokens, template, image-processor config) is its export config's
:class:`~spotstop.export.configs.MemberRecipe`; this module holds no per-architecture code.
Everything is written with ``save_pretrained`` and read back with ``from_pretrained`` by the
same code that loads a real snapshot folder or hub id.

Same seed → byte-identical files (checked by ``tests/export/test_tiny.py``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotstop.export._outdir import check_out_folder
from spotstop.export.configs import EXPORT_CONFIGS, ExportConfig, MemberRecipe, get_export_config
from spotstop.guard._arch import get_arch
from spotstop.guard._hf import MEMBER_HINTS, TEST_PAIR_MARKER

__all__ = [
    "MAX_SEED",
    "TINY_MEMBERS",
    "TinyPair",
    "build_random_member",
    "build_tiny_member",
    "build_tiny_pair",
    "check_pair_out",
    "check_seed",
    "default_tiny_dir",
    "tree_digest",
]

#: The members of the tiny pair, by folder name: one per registered architecture.
TINY_MEMBERS = tuple(f"tiny-{model_type}" for model_type in EXPORT_CONFIGS)

_VOCAB_SIZE = 640
_IMAGE_SIZE = 64  # pixels per side; 64/16 = 4 patches → 2x2 = 4 visual tokens after the 2x2 merge
#: visual tokens the tiny members' image processors accept (fewest, most)
_TINY_IMAGE_TOKENS = (4, 64)

_WORDS = [
    "the",
    "a",
    "robot",
    "arm",
    "gripper",
    "camera",
    "scene",
    "request",
    "pick",
    "place",
    "move",
    "push",
    "pour",
    "open",
    "close",
    "cut",
    "knife",
    "stove",
    "pan",
    "water",
    "cup",
    "glass",
    "table",
    "floor",
    "child",
    "person",
    "hand",
    "near",
    "far",
    "hot",
    "cold",
    "wet",
    "sharp",
    "heavy",
    "fragile",
    "edge",
    "shelf",
    "door",
    "window",
    "stairs",
    "cable",
    "wire",
    "outlet",
    "dog",
    "cat",
    "plant",
    "box",
    "bottle",
    "chemical",
    "cleaner",
    "medicine",
    "food",
    "kitchen",
    "bathroom",
    "garage",
    "street",
    "car",
    "bike",
    "road",
    "answer",
    "with",
    "one",
    "word",
    "if",
    "carrying",
    "out",
    "this",
    "here",
    "is",
    "not",
    "safe",
    "unsafe",
    "yes",
    "no",
    "please",
    "look",
    "at",
    "image",
    "and",
    "decide",
    "whether",
    "doing",
    "it",
    "would",
    "be",
    "dangerous",
    "for",
    "anyone",
    "SAFE",
]


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        n = rng.randint(4, 14)
        lines.append(" ".join(rng.choice(_WORDS) for _ in range(n)))
    # "UNSAFE" never occurs whole, so it tokenizes into several pieces, as real answers may.
    return lines


def _train_tokenizer(recipe: MemberRecipe, seed: int) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    if recipe.split_pattern is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(
                    Regex(recipe.split_pattern), behavior="isolated", invert=False
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=list(recipe.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed + recipe.corpus_seed_offset), trainer=trainer)
    if recipe.added:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in recipe.added])
    return tok


def _with_token_ids(recipe: MemberRecipe, values: Mapping[str, Any], tok: Any) -> dict[str, Any]:
    """A copy of the config keyword arguments ``values`` with ``tok``'s special-token ids."""
    out: dict[str, Any] = copy.deepcopy(dict(values))
    text = dict(out.get("text_config") or {})
    text.update({key: tok.token_to_id(t) for key, t in recipe.text_token_ids.items()})
    out.update({key: tok.token_to_id(t) for key, t in recipe.token_ids.items()})
    out["text_config"] = text
    return out


def _transformers_class(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def _save_model(model: Any, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _marker_text(arch: str, built_by: str = "`spotstop tiny`", trained: bool = False) -> str:
    if trained:
        what = (
            "weights trained here on `spotstop world`, a toy world of drawn shapes labelled by a\n"
            "rule table, and a locally trained tokenizer. Its scores carry a signal in that\n"
            "toy world only, never about real safety. Use it to test the method, never to\n"
            "guard a robot.\n"
        )
    else:
        what = (
            "seeded random weights and a locally trained tokenizer. Its scores and decisions\n"
            "mean nothing. Use it to test code paths, never to guard a robot.\n"
        )
    return (
        "SPOTSTOP TEST PAIR — NOT A SAFETY MODEL\n"
        f"architecture: {arch}\n"
        f"This folder was built by {built_by} from the real configuration class with\n" + what
    )


def _write_markers(
    out: Path,
    arch: str,
    image_size: tuple[int, int] | None = (_IMAGE_SIZE, _IMAGE_SIZE),
    built_by: str = "`spotstop tiny`",
    trained: bool = False,
    kind: str = "tiny",
) -> None:
    """The test-pair marker and the hints (``test_pair``, its ``test_pair_kind``: ``trained``
    when ``trained``, else ``kind``, ``tiny`` or ``random``; the image size)."""
    (out / TEST_PAIR_MARKER).write_text(_marker_text(arch, built_by, trained), encoding="utf-8")
    size = "" if image_size is None else f"image_size: [{image_size[0]}, {image_size[1]}]\n"
    note = (
        "trained on a toy world: scores mean something there only"
        if trained
        else "seeded random weights: decisions mean nothing"
    )
    (out / MEMBER_HINTS).write_text(
        f"# spotstop hints for this member folder\ntest_pair: true  # {note}\n"
        f"test_pair_kind: {'trained' if trained else kind}\n" + size,
        encoding="utf-8",
    )


def _save_tokenizer_files(
    ecfg: type[ExportConfig],
    tok: Any,
    out: Path,
    config: Mapping[str, Any],
    image_tokens: tuple[int, int],
    *,
    max_length: int = 2048,
) -> None:
    """The member's tokenizer files and image-processor config, shaped like the real ones."""
    from transformers import PreTrainedTokenizerFast

    recipe = ecfg.member_recipe
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        **recipe.roles,
        unk_token=None,
        additional_special_tokens=list(recipe.additional_special_tokens),
        chat_template=recipe.chat_template,
        model_max_length=max_length,
    )
    hf_tok.save_pretrained(out)
    _write_json(out / "preprocessor_config.json", ecfg.image_processor_config(config, image_tokens))


def _model_type(name: str) -> str:
    if name not in TINY_MEMBERS:
        raise ValueError(f"tiny member must be one of {list(TINY_MEMBERS)}; got {name!r}.")
    return name.removeprefix("tiny-")


#: the largest seed a tiny member is built or trained from: torch's generator takes 0..2**64 - 1,
#: and the training adds small offsets to its seed (export/train.py)
MAX_SEED = 2**63 - 1


def check_seed(seed: int, name: str = "seed") -> None:
    """ValueError unless ``seed`` is an integer in 0..:data:`MAX_SEED` (``name``: how the
    message calls it, e.g. ``--seed``)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(
            f"{name} must be an integer in 0..2**63-1 (what torch's generator takes); got "
            f"{seed!r}. Give another seed."
        )


def check_pair_out(root: str | Path) -> None:
    """ValueError when the pair's folder ``root``, or a member's folder in it, is a file."""
    check_out_folder(root, "the pair's output")
    for name in TINY_MEMBERS:
        check_out_folder(Path(root) / name, "the member folder")


def build_tiny_member(name: str, out: str | Path, *, seed: int = 0) -> Path:
    """Build one tiny member folder ``out`` (created if absent) and return its path.

    ``name`` is one of :data:`TINY_MEMBERS`. Files are overwritten; the result depends only on
    ``seed`` and the installed torch/transformers/tokenizers versions.
    """
    model_type = _model_type(name)
    check_seed(seed)
    ecfg = get_export_config(model_type)
    recipe = ecfg.member_recipe
    path = check_out_folder(out, "the member folder")
    path.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(recipe, seed)
    values = copy.deepcopy(dict(recipe.tiny_config))
    values["text_config"] = {**values["text_config"], "vocab_size": tok.get_vocab_size()}
    config = _transformers_class(recipe.config_class)(**_with_token_ids(recipe, values, tok))
    _seed_all(seed)
    model = _transformers_class(recipe.model_class)(config).eval()
    _save_model(model, path)
    _save_tokenizer_files(ecfg, tok, path, values, _TINY_IMAGE_TOKENS)
    _write_markers(path, model_type)
    return path


_TORCH_DTYPES = ("float32", "bfloat16", "float16")


def build_random_member(
    model_type: str,
    config: Mapping[str, Any],
    out: str | Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    image_size: tuple[int, int] | None = None,
) -> Path:
    """Build a member folder at ``config``'s dimensions with seeded random weights; return it.

    A TEST member like the tiny pair (marked so; its scores mean nothing), but at any size:
    ``config`` holds the keyword arguments of the architecture's config class
    (its export config's ``member_recipe.config_class``, e.g. ``Qwen3_5Config``) as
    ``jetson/memory_budget.py`` records the real members' (``text_config``/``vision_config``
    dicts; a ``model_type`` key, if present, must equal ``model_type``). It is not modified.

    * Tokenizer: the tiny pair's, trained here (its few hundred ids fit any real vocabulary;
      a prompt tokenizes into more, shorter pieces than with the real tokenizer). The
      config's special-token ids are replaced by this tokenizer's; chat template and image
      processor config are shaped like the real member's.
    * Weights: the model's own initializers after seeding, built directly in ``dtype`` on
      ``device`` (``"cuda"`` keeps a multi-billion-parameter init fast and out of host
      memory), saved with ``save_pretrained`` so the folder loads like a real snapshot.
    * ``image_size`` is written as the folder's hint; None leaves the architecture's default
      visual-token budget (Qwen3.5 256 = 512x512, LFM2-VL 64 = 256x256).

    Same seed, dtype, device and library versions → the same weights. The tiny pair is built
    by :func:`build_tiny_member`, not by this function (its files stay byte-identical).
    """
    import torch

    ecfg = get_export_config(model_type)
    recipe = ecfg.member_recipe
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {list(_TORCH_DTYPES)}; got {dtype!r}.")
    values: dict[str, Any] = copy.deepcopy(dict(config))
    given = values.pop("model_type", model_type)
    if given != model_type:
        raise ValueError(f"config says model_type {given!r} but {model_type!r} was asked for.")
    values.pop("architectures", None)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(recipe, seed)
    cfg = _transformers_class(recipe.config_class)(**_with_token_ids(recipe, values, tok))
    vocab = int(cfg.get_text_config().vocab_size)
    if vocab < tok.get_vocab_size():
        raise ValueError(
            f"text_config.vocab_size {vocab} is smaller than the test tokenizer's "
            f"{tok.get_vocab_size()} ids."
        )
    _seed_all(seed)
    with torch.device(device):
        model = (
            _transformers_class(recipe.model_class)
            ._from_config(cfg, dtype=getattr(torch, dtype))
            .eval()
        )
    _save_model(model, path)
    del model
    tokens = get_arch(model_type).geometry(values, {}, image_size).n_image_tokens
    _save_tokenizer_files(ecfg, tok, path, values, (min(64, tokens), max(256, tokens)))
    _write_markers(
        path,
        model_type,
        image_size,
        built_by="spotstop.export.tiny.build_random_member",
        kind="random",
    )
    return path


@dataclass(frozen=True)
class TinyPair:
    """Where the tiny pair was written. A test pair: its decisions mean nothing."""

    root: Path
    members: tuple[Path, ...]
    seed: int


def default_tiny_dir() -> Path:
    """``$SPOTSTOP_HOME/tiny`` (default ``~/.cache/spotstop/tiny``)."""
    from spotstop.guard import spotstop_home

    return spotstop_home() / "tiny"


def build_tiny_pair(
    out: str | Path | None = None, *, seed: int = 0, progress: bool = False
) -> TinyPair:
    """Build both tiny members under ``out`` (default :func:`default_tiny_dir`)."""
    root = Path(out) if out is not None else default_tiny_dir()
    check_seed(seed)
    check_pair_out(root)
    root.mkdir(parents=True, exist_ok=True)
    members = []
    names: Any = TINY_MEMBERS
    if progress:
        from tqdm import tqdm

        names = tqdm(TINY_MEMBERS, desc="building tiny pair", unit="member")
    for name in names:
        members.append(build_tiny_member(name, root / name, seed=seed))
    return TinyPair(root=root, members=tuple(members), seed=seed)


def tree_digest(path: str | Path) -> dict[str, str]:
    """sha256 of every file under ``path``, keyed by relative path (for determinism checks)."""
    root = Path(path)
    out: dict[str, str] = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        out[f.relative_to(root).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out
