"""The tiny test pair: two Hugging Face model folders built locally, deterministically.

    THIS IS A TEST PAIR. Its weights are seeded random numbers: its scores and
    decisions mean nothing. It exists so that every code path that loads, scores,
    exports and serves the real pair (Qwen3.5-2B and LFM2.5-VL-3B) runs here, where no
    model hub is reachable, with the real architectures' code.

Each member is made from the real configuration class (``Qwen3_5Config`` with
Gated-DeltaNet linear attention + full attention and the Qwen3.5 vision tower;
``Lfm2VlConfig`` with the LFM2 short-conv + attention text model and a SigLIP2 vision
tower), shrunk to a few layers of width 64, with weights drawn from a seeded generator.
Its tokenizer is a byte-level BPE trained here on a built-in corpus, with special tokens
and a chat template shaped like the real model's (image placeholder, generation prompt,
reasoning off). Everything is written with ``save_pretrained`` and read back with
``from_pretrained`` by the same code that loads a real snapshot folder or hub id.

Same seed → byte-identical files (checked by ``tests/test_tiny.py``).
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

from spotstop.guard._hf import MEMBER_HINTS, TEST_PAIR_MARKER

__all__ = [
    "TINY_MEMBERS",
    "TinyPair",
    "build_random_member",
    "build_tiny_member",
    "build_tiny_pair",
    "default_tiny_dir",
    "tree_digest",
]

#: The two members of the tiny pair, by folder name.
TINY_MEMBERS = ("tiny-qwen3_5", "tiny-lfm2_vl")

_VOCAB_SIZE = 640
_IMAGE_SIZE = 64  # pixels per side; 64/16 = 4 patches → 2x2 = 4 visual tokens after the 2x2 merge

_QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Added but not "special" in the real Qwen3.5 tokenizer (they are decoded like text).
_QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

# Shaped like the Qwen3.5 template: images in a vision span, <think></think> when reasoning is off.
# (Literal strings inside {{ }} keep their newlines; "-" only trims the template's own layout.)
_QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)

_LFM_SPECIALS = [
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<|image_start|>",
    "<|image_end|>",
    "<|img_thumbnail|>",
    *[f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)],
]

# Shaped like the LFM2-VL template: BOS, ChatML turns, a bare <image> placeholder.
_LFM_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

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


def _train_tokenizer(specials: list[str], added: list[str], seed: int, qwen_style: bool) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    if qwen_style:
        # The pre-tokenizer regex of the real Qwen3.5 tokenizer.
        pattern = (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
            r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    if added:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def _save_model(model: Any, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _marker_text(arch: str, built_by: str = "`spotstop tiny`") -> str:
    return (
        "SPOTSTOP TEST PAIR — NOT A SAFETY MODEL\n"
        f"architecture: {arch}\n"
        f"This folder was built by {built_by} from the real configuration class with\n"
        "seeded random weights and a locally trained tokenizer. Its scores and decisions\n"
        "mean nothing. Use it to test code paths, never to guard a robot.\n"
    )


def _write_markers(
    out: Path,
    arch: str,
    image_size: tuple[int, int] | None = (_IMAGE_SIZE, _IMAGE_SIZE),
    built_by: str = "`spotstop tiny`",
) -> None:
    (out / TEST_PAIR_MARKER).write_text(_marker_text(arch, built_by), encoding="utf-8")
    size = "" if image_size is None else f"image_size: [{image_size[0]}, {image_size[1]}]\n"
    (out / MEMBER_HINTS).write_text(
        "# spotstop hints for this member folder\n"
        "test_pair: true  # seeded random weights: decisions mean nothing\n" + size,
        encoding="utf-8",
    )


def _build_qwen(out: Path, seed: int) -> None:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tok = _train_tokenizer(_QWEN_SPECIALS, _QWEN_ADDED, seed, qwen_style=True)
    ids = {t: tok.token_to_id(t) for t in _QWEN_SPECIALS + _QWEN_ADDED}
    config = Qwen3_5Config(
        text_config={
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "layer_types": [
                "linear_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            "max_position_embeddings": 2048,
            "initializer_range": 0.08,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "initializer_range": 0.08,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    _seed_all(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _save_model(model, out)
    _save_qwen_files(tok, out)
    _write_markers(out, "qwen3_5")


def _save_qwen_files(tok: Any, out: Path, *, max_length: int = 2048) -> None:
    """The Qwen-shaped tokenizer files and image-processor config of a member folder."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=[t for t in _QWEN_SPECIALS if t != "<|endoftext|>"],
        chat_template=_QWEN_TEMPLATE,
        model_max_length=max_length,
    )
    hf_tok.save_pretrained(out)
    _write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Qwen2VLImageProcessor",
            "do_resize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": True,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "size": {"shortest_edge": 32 * 32, "longest_edge": 1024 * 32 * 32},
            "resample": 3,
        },
    )


def _build_lfm(out: Path, seed: int) -> None:
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    tok = _train_tokenizer(_LFM_SPECIALS, [], seed + 1, qwen_style=False)
    ids = {t: tok.token_to_id(t) for t in _LFM_SPECIALS}
    config = Lfm2VlConfig(
        text_config={
            "model_type": "lfm2",
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": ["conv", "conv", "full_attention", "conv"],
            "initializer_range": 0.08,
            "max_position_embeddings": 2048,
            "pad_token_id": ids["<|pad|>"],
            "bos_token_id": ids["<|startoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
        },
        vision_config={
            "model_type": "siglip2_vision_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "patch_size": 16,
            "num_patches": 64,
        },
        image_token_id=ids["<image>"],
        projector_hidden_size=64,
        downsample_factor=2,
        tie_word_embeddings=True,
    )
    _seed_all(seed)
    model = Lfm2VlForConditionalGeneration(config).eval()
    _save_model(model, out)
    _save_lfm_files(tok, out)
    _write_markers(out, "lfm2_vl")


def _save_lfm_files(
    tok: Any,
    out: Path,
    *,
    max_length: int = 2048,
    min_image_tokens: int = 4,
    max_image_tokens: int = 64,
    downsample_factor: int = 2,
) -> None:
    """The LFM2-VL-shaped tokenizer files and image-processor config of a member folder."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=[
            t for t in _LFM_SPECIALS if t not in ("<|startoftext|>", "<|im_end|>", "<|pad|>")
        ],
        chat_template=_LFM_TEMPLATE,
        model_max_length=max_length,
    )
    hf_tok.save_pretrained(out)
    _write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Lfm2VlImageProcessor",
            "do_image_splitting": False,
            "downsample_factor": downsample_factor,
            "encoder_patch_size": 16,
            "min_image_tokens": min_image_tokens,
            "max_image_tokens": max_image_tokens,
            "do_normalize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "resample": 2,
            "use_thumbnail": False,
            "tile_size": 512,
        },
    )


_BUILDERS = {"tiny-qwen3_5": _build_qwen, "tiny-lfm2_vl": _build_lfm}


def build_tiny_member(name: str, out: str | Path, *, seed: int = 0) -> Path:
    """Build one tiny member folder ``out`` (created if absent) and return its path.

    ``name`` is one of :data:`TINY_MEMBERS`. Files are overwritten; the result depends only on
    ``seed`` and the installed torch/transformers/tokenizers versions.
    """
    if name not in _BUILDERS:
        raise ValueError(f"tiny member must be one of {list(_BUILDERS)}; got {name!r}.")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    _BUILDERS[name](path, seed)
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
    (``Qwen3_5Config`` for ``qwen3_5``, ``Lfm2VlConfig`` for ``lfm2_vl``) as
    ``jetson/memory_budget.py`` records the real members' (``text_config``/``vision_config``
    dicts; a ``model_type`` key, if present, must equal ``model_type``). It is not modified.

    * Tokenizer: the tiny pair's, trained here (its few hundred ids fit any real vocabulary;
      a prompt tokenizes into more, shorter pieces than with the real tokenizer). The
      config's special-token ids are replaced by this tokenizer's; chat template and image
      processor config are shaped like the real member's.
    * Weights: the model's own initializers after seeding, built directly in ``dtype`` on
      ``device`` (``"cuda"`` keeps a multi-billion-parameter init fast and out of host
      memory), saved with ``save_pretrained`` so the folder loads like a real snapshot.
    * ``image_size`` is written as the folder's hint; None leaves the architecture default
      (512x512 → 256 visual tokens).

    Same seed, dtype, device and library versions → the same weights. The tiny pair is built
    by :func:`build_tiny_member`, not by this function (its files stay byte-identical).
    """
    import torch
    from transformers import (
        Lfm2VlConfig,
        Lfm2VlForConditionalGeneration,
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
    )

    if model_type not in ("qwen3_5", "lfm2_vl"):
        raise ValueError(f"model_type must be 'qwen3_5' or 'lfm2_vl'; got {model_type!r}.")
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {list(_TORCH_DTYPES)}; got {dtype!r}.")
    values: dict[str, Any] = copy.deepcopy(dict(config))
    given = values.pop("model_type", model_type)
    if given != model_type:
        raise ValueError(f"config says model_type {given!r} but {model_type!r} was asked for.")
    values.pop("architectures", None)
    text = dict(values.get("text_config") or {})
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    if model_type == "qwen3_5":
        tok = _train_tokenizer(_QWEN_SPECIALS, _QWEN_ADDED, seed, qwen_style=True)
        ids = {t: tok.token_to_id(t) for t in _QWEN_SPECIALS + _QWEN_ADDED}
        text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
        values.update(
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
        cfg: Any = Qwen3_5Config(**{**values, "text_config": text})
        cls: Any = Qwen3_5ForConditionalGeneration
    else:
        tok = _train_tokenizer(_LFM_SPECIALS, [], seed + 1, qwen_style=False)
        ids = {t: tok.token_to_id(t) for t in _LFM_SPECIALS}
        text.update(
            pad_token_id=ids["<|pad|>"],
            bos_token_id=ids["<|startoftext|>"],
            eos_token_id=ids["<|im_end|>"],
        )
        values.update(image_token_id=ids["<image>"])
        cfg = Lfm2VlConfig(**{**values, "text_config": text})
        cls = Lfm2VlForConditionalGeneration
    vocab = int(cfg.get_text_config().vocab_size)
    if vocab < tok.get_vocab_size():
        raise ValueError(
            f"text_config.vocab_size {vocab} is smaller than the test tokenizer's "
            f"{tok.get_vocab_size()} ids."
        )
    _seed_all(seed)
    with torch.device(device):
        model = cls._from_config(cfg, dtype=getattr(torch, dtype)).eval()
    _save_model(model, path)
    del model
    if model_type == "qwen3_5":
        _save_qwen_files(tok, path)
    else:
        tokens = ((image_size or (512, 512))[0] // 32) * ((image_size or (512, 512))[1] // 32)
        _save_lfm_files(
            tok,
            path,
            min_image_tokens=min(64, tokens),
            max_image_tokens=max(256, tokens),
            downsample_factor=int(values.get("downsample_factor", 2)),
        )
    _write_markers(
        path, model_type, image_size, built_by="spotstop.export.tiny.build_random_member"
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
    from spotstop.guard._config import spotstop_home

    return spotstop_home() / "tiny"


def build_tiny_pair(
    out: str | Path | None = None, *, seed: int = 0, progress: bool = False
) -> TinyPair:
    """Build both tiny members under ``out`` (default :func:`default_tiny_dir`)."""
    root = Path(out) if out is not None else default_tiny_dir()
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
