"""One export config per member architecture, with its exporters and tolerances.

As in optimum-onnx, each supported ``model_type`` has exactly one registered
:class:`ExportConfig` subclass. It says which ``torch.onnx`` exporter each scoring graph
needs, whether the decoder graph has a fixed sequence length (one graph per length bucket)
and how far the exported graph's outputs and scores may move from the torch reference at
each precision. ``tests/test_export.py`` fails when a registered architecture has no test.

Facts these configs encode (checked with torch 2.13 / transformers 5.24 / onnxruntime 1.32):

* Both vision towers export with the legacy TorchScript exporter (``dynamo=False``) at a
  fixed image grid (the grid-dependent position tables are traced into constants).
* The LFM2 decoder (short convolutions + attention) exports with the legacy exporter with a
  dynamic batch and sequence length.
* The Qwen3.5 decoder does NOT export with the legacy exporter: its chunked Gated-DeltaNet
  (``torch_chunk_gated_delta_rule``) calls ``torch.linalg.solve_triangular``, which has no
  TorchScript→ONNX symbolic (``UnsupportedOperatorError: aten::linalg_solve_triangular``).
  It exports with ``dynamo=True`` at a fixed sequence length (the chunk loop is unrolled
  for that length), so it gets one decoder graph per right-padded length bucket.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

__all__ = [
    "EXPORT_CONFIGS",
    "PRECISIONS",
    "ExportConfig",
    "Lfm2VlExportConfig",
    "Qwen35ExportConfig",
    "get_export_config",
    "register",
]

Precision = Literal["fp32", "fp16", "int8", "int4", "int4-trt"]
#: Precisions an export can write, in order of decreasing size.
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8", "int4", "int4-trt")

EXPORT_CONFIGS: dict[str, type[ExportConfig]] = {}


def register(cls: type[ExportConfig]) -> type[ExportConfig]:
    """Class decorator: register ``cls`` as the export config of ``cls.model_type``."""
    if cls.model_type in EXPORT_CONFIGS:
        raise ValueError(f"an export config for {cls.model_type!r} is registered already.")
    EXPORT_CONFIGS[cls.model_type] = cls
    return cls


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
    #: per-output bounds, graph vs torch scoring graph
    atol: ClassVar[Mapping[str, float]] = {
        "fp32": 1e-4,
        "fp16": 5e-2,
        "int8": 0.5,
        "int4": 2.0,
        "int4-trt": 2.0,
    }
    rtol: ClassVar[Mapping[str, float]] = {
        "fp32": 1e-4,
        "fp16": 1e-2,
        "int8": 0.1,
        "int4": 0.3,
        "int4-trt": 0.3,
    }
    #: |Δs| bound, bundle vs torch reference backend
    score_atol: ClassVar[Mapping[str, float]] = {
        "fp32": 1e-3,
        "fp16": 5e-2,
        "int8": 0.25,
        "int4": 1.0,
        # max|w|/7 blocks (positive scales for TensorRT) use 15 of int4's 16 levels: ~1.13x
        # int4's weight error; on the random tiny pair |Δs| reached 0.94 (LFM2) / 1.19 (Qwen3.5)
        # on the fp32 graph, 0.87 / 1.06 on the fp16 graph (float16 scales) int4-trt now uses
        "int4-trt": 1.5,
    }
    #: minimum Spearman rank correlation of the scores, bundle vs torch reference
    min_spearman: ClassVar[Mapping[str, float]] = {
        "fp32": 0.999,
        "fp16": 0.99,
        "int8": 0.9,
        "int4": 0.8,
        "int4-trt": 0.8,
    }

    @classmethod
    def describe(cls) -> str:
        fixed = "fixed length per bucket" if cls.decoder_fixed_length else "dynamic length"
        return (
            f"{cls.model_type}: vision {cls.vision_exporter}, decoder {cls.decoder_exporter} "
            f"({fixed})"
        )


@register
class Qwen35ExportConfig(ExportConfig):
    """Qwen3.5 (Gated-DeltaNet + full attention; Qwen3.5 vision tower, 2x2 merger)."""

    model_type = "qwen3_5"
    vision_exporter = "legacy"
    decoder_exporter = "dynamo"
    decoder_fixed_length = True


@register
class Lfm2VlExportConfig(ExportConfig):
    """LFM2-VL (LFM2 short convolutions + attention; SigLIP2 vision tower, pixel unshuffle)."""

    model_type = "lfm2_vl"
    vision_exporter = "legacy"
    decoder_exporter = "legacy"
    decoder_fixed_length = False


def get_export_config(model_type: str) -> type[ExportConfig]:
    """The registered config of ``model_type``; the error lists the registered ones."""
    try:
        return EXPORT_CONFIGS[model_type]
    except KeyError:
        raise ValueError(
            f"no export config is registered for architecture {model_type!r}; registered: "
            f"{sorted(EXPORT_CONFIGS)}. Add one in export/configs.py."
        ) from None
