"""What an architecture's export config is: :class:`ExportConfig` and :class:`MemberRecipe`.

As in optimum-onnx, each supported ``model_type`` has exactly one :class:`ExportConfig`
subclass, in its own module ``export/archs/<model_type>.py``, and everything the export side
knows about the architecture's graphs is in it: which ``torch.onnx`` exporter each scoring graph
needs, whether the decoder graph has a fixed sequence length (one graph per length bucket), how
far the exported graph's outputs and scores may move from the torch reference at each
precision, what is patched while the decoder is exported, which layers call onnxruntime's
fused operators in the fused graph form (:meth:`ExportConfig.fused_patches`, export/fused.py),
the decoder's position ids (:meth:`ExportConfig.position_ids`, used by export/graphs.py) and
how to build a TEST member of the architecture with seeded random weights
(:class:`MemberRecipe`, used by export/tiny.py).
``export/configs.py`` is the registry's view (``EXPORT_CONFIGS``, ``get_export_config``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from spotstop.export.precision import PRECISION_SPECS

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch

__all__ = ["RESCALE_NORMALIZE", "ExportConfig", "FusedPatch", "MemberRecipe"]

#: one patch of the fused graph form: ``(owner, attribute, replacement)``, e.g.
#: ``(modeling_lfm2.Lfm2Attention, "forward", a forward that calls the fused attention)``;
#: export/fused.py's ``fused_patcher`` sets ``owner.attribute`` to ``replacement`` while a
#: graph is exported in that form, and restores it after
FusedPatch = tuple[Any, str, Any]


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
    #: module classes (name endings, as in the dynamo graph's class hierarchy) whose own code an
    #: fp16 graph keeps float32, besides every architecture's norms (export/fp16.py)
    fp32_modules: ClassVar[tuple[str, ...]] = ()
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
    def fused_patches(cls) -> Sequence[FusedPatch] | None:
        """The fused graph form (export/fused.py): which attributes of the transformers modules
        are replaced, while a graph is exported in that form, by code that calls the fused
        operators (export/fused.py's ``rms_norm``, ``group_query_attention``, ...). Each
        replacement is exact against the unpatched model, which the export is validated
        against. Default None: the architecture has no fused form (standard only)."""
        return None

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
            "override image_processor_config in its export config (see export/archs/qwen3_5.py)."
        )

    @classmethod
    def describe(cls) -> str:
        fixed = "fixed length per bucket" if cls.decoder_fixed_length else "dynamic length"
        return (
            f"{cls.model_type}: vision {cls.vision_exporter}, decoder {cls.decoder_exporter} "
            f"({fixed})"
        )


#: pixel scaling both real members' image processors use: to [0, 1], then (x - 0.5) / 0.5
RESCALE_NORMALIZE: Mapping[str, Any] = {
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
}
