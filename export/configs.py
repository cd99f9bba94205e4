"""One export config per member architecture: exporters, tolerances, graph patch, test member.

As in optimum-onnx, each supported ``model_type`` has exactly one registered
:class:`ExportConfig` subclass, and everything the export side knows about the architecture is
in it: which ``torch.onnx`` exporter each scoring graph needs, whether the decoder graph has a
fixed sequence length (one graph per length bucket), how far the exported graph's outputs and
scores may move from the torch reference at each precision, the decoder's position ids
(:meth:`ExportConfig.position_ids`, used by export/graphs.py) and how to build a TEST member of
the architecture with seeded random weights (:class:`MemberRecipe`, used by export/tiny.py).
The runtime's counterpart is the architecture's spec in ``guard/_arch.py``; no other module
branches on an architecture. Adding one means adding its spec and its config here: the export
tests are parametrized over this registry and run on its tiny member, and
``tests/test_export.py`` fails when a registered architecture lacks a case.

Facts these configs encode (checked with torch 2.13 / transformers 5.24 / onnxruntime 1.32):

* Both vision towers export with the legacy TorchScript exporter (``dynamo=False``) at a
  fixed image grid (the grid-dependent position tables are traced into constants).
* The LFM2 decoder (short convolutions + attention) exports with the legacy exporter with a
  dynamic batch and sequence length.
* The Qwen3.5 decoder exports with ``dynamo=True`` and a dynamic sequence length: ONE graph
  for every length up to the longest bucket. While it is exported, its config's
  :meth:`ExportConfig.decoder_patcher` swaps transformers' chunked Gated-DeltaNet
  (``torch_chunk_gated_delta_rule``: a Python loop over chunks and, when exporting, a
  row-by-row triangular solve, unrolled for one length: ~5,400 nodes per layer of the tiny
  member at 256 tokens, and one graph per length bucket) for the exact loop-free kernel of
  export/gated_delta.py (~185 nodes per layer, whatever the length). The legacy exporter cannot give that graph a dynamic
  length (its traced chunk count becomes a constant), and its graphs carry no module
  metadata, which the fp16 conversion needs to keep the delta rule float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from spotstop.export.precision import PRECISION_SPECS

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch

__all__ = [
    "EXPORT_CONFIGS",
    "PRECISIONS",
    "ExportConfig",
    "Lfm2VlExportConfig",
    "MemberRecipe",
    "Qwen35ExportConfig",
    "get_export_config",
    "register",
]

#: Precisions an export can write, in order of decreasing size (export/precision.py's registry).
PRECISIONS: tuple[str, ...] = tuple(PRECISION_SPECS)

EXPORT_CONFIGS: dict[str, type[ExportConfig]] = {}


def register(cls: type[ExportConfig]) -> type[ExportConfig]:
    """Class decorator: register ``cls`` as the export config of ``cls.model_type``."""
    if cls.model_type in EXPORT_CONFIGS:
        raise ValueError(f"an export config for {cls.model_type!r} is registered already.")
    EXPORT_CONFIGS[cls.model_type] = cls
    return cls


@dataclass(frozen=True)
class MemberRecipe:
    """How export/tiny.py builds a TEST member of an architecture (seeded random weights).

    The tokenizer is a byte-level BPE trained on a built-in corpus, with the real member's
    special tokens and a chat template shaped like the real one (image placeholder,
    generation prompt, reasoning off); the config is the real configuration class with the
    token ids of that tokenizer.
    """

    #: the transformers configuration and ``*ForConditionalGeneration`` class names
    config_class: str
    model_class: str
    #: the tiny member's config keyword arguments, without vocabulary size and token ids
    tiny_config: Mapping[str, Any]
    #: tokenizer: special tokens (in id order), added tokens that are not special, template
    specials: tuple[str, ...]
    added: tuple[str, ...]
    chat_template: str
    #: ``PreTrainedTokenizerFast`` roles (``bos_token``, ``eos_token``, ``pad_token``) and
    #: the other special tokens it lists
    roles: Mapping[str, str]
    additional_special_tokens: tuple[str, ...]
    #: the real tokenizer's pre-tokenizer split pattern; None: byte-level's own
    split_pattern: str | None
    #: added to the seed for the tokenizer's training corpus
    corpus_seed_offset: int
    #: config key → token whose id it takes: in ``text_config`` and at the top level
    text_token_ids: Mapping[str, str]
    token_ids: Mapping[str, str]


class ExportConfig:
    """How to export one architecture's scoring graphs, and what counts as a faithful export.

    Tolerances are per precision. ``atol``/``rtol`` bound each graph output against the torch
    scoring graph on the same inputs (``numpy.allclose`` semantics); ``score_atol`` bounds the
    member score ``s`` against the torch reference backend (``spotstop verify-bundle``).
    Weight-only int8/int4/int4-trt move logits by design, so their output tolerances are loose
    and their score bound is what decides (int4-trt: int4 blocks of 128 like int4's, written as
    DequantizeLinear for TensorRT; see export/quant.py).
    """

    model_type: ClassVar[str]
    #: exporter per graph: "legacy" (TorchScript, dynamo=False) or "dynamo"
    vision_exporter: ClassVar[Literal["legacy", "dynamo"]] = "legacy"
    decoder_exporter: ClassVar[Literal["legacy", "dynamo"]] = "legacy"
    #: True: the decoder graph has a fixed sequence length (one graph per length bucket)
    decoder_fixed_length: ClassVar[bool] = False
    #: ONNX opset per exporter
    legacy_opset: ClassVar[int] = 17
    dynamo_opset: ClassVar[int] = 18
    #: per precision (export/precision.py's registry; an architecture may override one):
    #: per-output bounds, graph vs torch scoring graph
    atol: ClassVar[Mapping[str, float]] = {p: s.tolerance.atol for p, s in PRECISION_SPECS.items()}
    rtol: ClassVar[Mapping[str, float]] = {p: s.tolerance.rtol for p, s in PRECISION_SPECS.items()}
    #: |Δs| bound, bundle vs torch reference backend
    score_atol: ClassVar[Mapping[str, float]] = {
        p: s.tolerance.score_atol for p, s in PRECISION_SPECS.items()
    }
    #: minimum Spearman rank correlation of the scores, bundle vs torch reference
    min_spearman: ClassVar[Mapping[str, float]] = {
        p: s.tolerance.min_spearman for p, s in PRECISION_SPECS.items()
    }

    #: how export/tiny.py builds a test member of this architecture
    member_recipe: ClassVar[MemberRecipe]

    @classmethod
    def decoder_patcher(cls, max_length: int) -> AbstractContextManager[None]:
        """What is patched while the decoder graph is exported, for sequences up to
        ``max_length`` tokens (optimum's model patcher): an export-friendly, exact replacement of
        code that exports badly. The torch reference the export is validated against is the
        unpatched model. Default: nothing."""
        from contextlib import nullcontext

        return nullcontext()

    @classmethod
    def position_ids(
        cls, input_ids: torch.Tensor, is_image: torch.Tensor, grid: tuple[int, int]
    ) -> torch.Tensor:
        """The decoder's ``position_ids`` for ``input_ids`` (B, L), in the graph.

        ``is_image`` (B, L) marks the image tokens, at most one image of ``grid`` = (rows,
        columns) of visual tokens per row. Default: 0, 1, 2, ... (1, L).
        """
        import torch

        return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)

    @classmethod
    def image_processor_config(
        cls, config: Mapping[str, Any], image_tokens: tuple[int, int]
    ) -> dict[str, Any]:
        """A test member's ``preprocessor_config.json``, shaped like the real member's.

        ``config``: the member's config keyword arguments; ``image_tokens``: the fewest and the
        most visual tokens an image may have (where the processor has such bounds).
        """
        raise TypeError(
            f"{cls.__name__} does not say how to build a test member's image processor: "
            "override image_processor_config in its export config (see Qwen35ExportConfig)."
        )

    @classmethod
    def describe(cls) -> str:
        fixed = "fixed length per bucket" if cls.decoder_fixed_length else "dynamic length"
        return (
            f"{cls.model_type}: vision {cls.vision_exporter}, decoder {cls.decoder_exporter} "
            f"({fixed})"
        )


#: pixel scaling both real members' image processors use: to [0, 1], then (x - 0.5) / 0.5
_RESCALE_NORMALIZE: Mapping[str, Any] = {
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
}


# -- Qwen3.5 --------------------------------------------------------------------------------

_QWEN_SPECIALS = (
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
)

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


@register
class Qwen35ExportConfig(ExportConfig):
    """Qwen3.5 (Gated-DeltaNet + full attention; Qwen3.5 vision tower, 2x2 merger)."""

    model_type = "qwen3_5"
    vision_exporter = "legacy"
    decoder_exporter = "dynamo"
    decoder_fixed_length = False
    member_recipe = MemberRecipe(
        config_class="Qwen3_5Config",
        model_class="Qwen3_5ForConditionalGeneration",
        tiny_config={
            "text_config": {
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
            },
            "vision_config": {
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
            "tie_word_embeddings": False,
        },
        specials=_QWEN_SPECIALS,
        # added but not "special" in the real Qwen3.5 tokenizer (they are decoded like text)
        added=("<think>", "</think>", "<tool_call>", "</tool_call>"),
        chat_template=_QWEN_TEMPLATE,
        roles={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        additional_special_tokens=tuple(t for t in _QWEN_SPECIALS if t != "<|endoftext|>"),
        # the pre-tokenizer regex of the real Qwen3.5 tokenizer
        split_pattern=(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
            r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        corpus_seed_offset=0,
        text_token_ids={"eos_token_id": "<|im_end|>", "pad_token_id": "<|endoftext|>"},
        token_ids={
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
        },
    )

    @classmethod
    def decoder_patcher(cls, max_length: int) -> AbstractContextManager[None]:
        """The loop-free Gated-DeltaNet kernel (export/gated_delta.py), exact up to
        ``max_length`` tokens."""
        from spotstop.export.gated_delta import compact_gated_delta

        return compact_gated_delta(max_length)

    @classmethod
    def position_ids(
        cls, input_ids: torch.Tensor, is_image: torch.Tensor, grid: tuple[int, int]
    ) -> torch.Tensor:
        """M-RoPE positions (3, B, L): text, then the image's (t, h, w) grid, then text again
        offset by the grid's longest side (as transformers' Qwen3.5 places them)."""
        import torch

        gh, gw = grid
        b, length = input_ids.shape
        idx = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(b, length)
        count = torch.cumsum(is_image.long(), dim=1)  # image tokens up to and including here
        k = count - 1  # rank of an image token within the image
        start = idx - k  # the image's first position (valid on image tokens)
        text = idx - count + torch.where(count > 0, max(gh, gw), 0)
        t = torch.where(is_image, start, text)
        h = torch.where(is_image, start + torch.div(k, gw, rounding_mode="floor"), text)
        w = torch.where(is_image, start + torch.remainder(k, gw), text)
        return torch.stack([t, h, w], dim=0)

    @classmethod
    def image_processor_config(
        cls, config: Mapping[str, Any], image_tokens: tuple[int, int]
    ) -> dict[str, Any]:
        # Qwen2VLImageProcessor's own pixel bounds: 1 to 1024 visual tokens
        return {
            **_RESCALE_NORMALIZE,
            "image_processor_type": "Qwen2VLImageProcessor",
            "do_resize": True,
            "do_convert_rgb": True,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "size": {"shortest_edge": 32 * 32, "longest_edge": 1024 * 32 * 32},
            "resample": 3,
        }


# -- LFM2-VL --------------------------------------------------------------------------------

_LFM_SPECIALS = (
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
)

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
_LFM_ROLES = {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}


@register
class Lfm2VlExportConfig(ExportConfig):
    """LFM2-VL (LFM2 short convolutions + attention; SigLIP2 vision tower, pixel unshuffle)."""

    model_type = "lfm2_vl"
    vision_exporter = "legacy"
    decoder_exporter = "legacy"
    decoder_fixed_length = False
    member_recipe = MemberRecipe(
        config_class="Lfm2VlConfig",
        model_class="Lfm2VlForConditionalGeneration",
        tiny_config={
            "text_config": {
                "model_type": "lfm2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "layer_types": ["conv", "conv", "full_attention", "conv"],
                "initializer_range": 0.08,
                "max_position_embeddings": 2048,
            },
            "vision_config": {
                "model_type": "siglip2_vision_model",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "patch_size": 16,
                "num_patches": 64,
            },
            "projector_hidden_size": 64,
            "downsample_factor": 2,
            "tie_word_embeddings": True,
        },
        specials=_LFM_SPECIALS,
        added=(),
        chat_template=_LFM_TEMPLATE,
        roles=_LFM_ROLES,
        additional_special_tokens=tuple(t for t in _LFM_SPECIALS if t not in _LFM_ROLES.values()),
        split_pattern=None,
        corpus_seed_offset=1,
        text_token_ids={
            "pad_token_id": "<|pad|>",
            "bos_token_id": "<|startoftext|>",
            "eos_token_id": "<|im_end|>",
        },
        token_ids={"image_token_id": "<image>"},
    )

    @classmethod
    def image_processor_config(
        cls, config: Mapping[str, Any], image_tokens: tuple[int, int]
    ) -> dict[str, Any]:
        return {
            "image_processor_type": "Lfm2VlImageProcessor",
            "do_image_splitting": False,
            "downsample_factor": int(config.get("downsample_factor", 2)),
            "encoder_patch_size": 16,
            "min_image_tokens": image_tokens[0],
            "max_image_tokens": image_tokens[1],
            **_RESCALE_NORMALIZE,
            "resample": 2,
            "use_thumbnail": False,
            "tile_size": 512,
        }


def get_export_config(model_type: str) -> type[ExportConfig]:
    """The registered config of ``model_type``; the error lists the registered ones."""
    try:
        return EXPORT_CONFIGS[model_type]
    except KeyError:
        raise ValueError(
            f"no export config is registered for architecture {model_type!r}; registered: "
            f"{sorted(EXPORT_CONFIGS)}. Add one in export/configs.py."
        ) from None
