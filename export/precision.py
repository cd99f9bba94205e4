"""The precisions an export can write: one registered :class:`PrecisionSpec` each.

Everything the product knows about a precision is in its spec, and nothing else branches on a
precision's name: the graph rewrite and quantizer (:attr:`PrecisionSpec.convert`, called by
:func:`convert_precision` in export_member's ``quantize`` stage, export/onnx.py), whether a
large member's weights can stream through it from disk, which graph form it runs in, its
bytes per weight for the cost model and ``jetson/memory_budget.py`` (export/cost.py's
:func:`~spotstop.export.cost.stored_weight_bytes`), its activation width, the compute peak its
roofline uses, whether it uses the calibration scenes, and its tolerances (export/configs.py's
defaults; an architecture may override one). A new precision is one spec (and its module and
tests); ``tests/export/test_precision.py`` runs every registered precision.

=============  ===========================================================================
``fp32``       the exported graph
``fp16``       export/fp16.py: float32 inputs/outputs, normalisers and the delta rule kept float32
``int8``       export/int8.py: int8 weights per output channel, activations quantized per call
               and per token (``MatMulIntegerToFloat``: computes in int8); the output layer and any layer
               over the measured error bound weight-only 8-bit (``int8-nbits``'s operator)
``int8-nbits`` weight-only 8-bit ``MatMulNBits``, ``accuracy_level`` 4 (int8 activations per
               block of 128): one scale per block, for ARM CPUs' int8 dot products
``int4``       weight-only 4-bit ``MatMulNBits`` (blocks of 32; some weights at 8 bits,
               export/mixed.py)
``int4-trt``   the fp16 graph, then INT4 ``DequantizeLinear`` blocks → float16 ``MatMul``
               (export/quant.py): what TensorRT parses
=============  ===========================================================================

Quantized codes are GPTQ's where the calibration inputs hold a weight's inputs (export/gptq.py),
else rounded to nearest. Inputs and outputs stay float32, and so do the vision graph's first and
last layers at every MatMulNBits / int8 precision (export/weights.py's ``image_end_weights``;
int4-trt quantizes every weight, as TensorRT's quantizer does).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "PRECISION_SPECS",
    "ConvertOptions",
    "PrecisionSpec",
    "Tolerance",
    "convert_precision",
    "get_precision",
    "register_precision",
]


@dataclass(frozen=True)
class Tolerance:
    """How far an export at this precision may move from the torch reference.

    ``atol``/``rtol`` bound each graph output (``numpy.allclose``); ``score_atol`` the member
    score ``s`` (``spotstop verify-bundle``); ``min_spearman`` the scores' rank correlation."""

    atol: float
    rtol: float
    score_atol: float
    min_spearman: float


@dataclass(frozen=True)
class ConvertOptions:
    """What a precision's conversion may use besides the graph.

    ``io``: where weights are read and written (None: in the model; a
    :class:`~spotstop.export.weights.DiskWeights` for a streamed member). ``calibration``: the
    recorded inputs of the member's Linears (GPTQ codes, int8's error rule and smoothing).
    ``int8_keys``: int4's weights kept at 8 bits (export/mixed.py). ``smooth_alpha`` and
    ``keep_error``: int8's SmoothQuant strength and error bound (export/int8.py)."""

    io: Any = None
    calibration: Any = None
    int8_keys: Collection[str] = ()
    smooth_alpha: float | None = None
    keep_error: float | None = None
    #: int8: the largest block a layer over ``keep_error`` is rotated in (export/int8.py's
    #: ``block_rotation``; None: its default, 0: no rotation)
    rotate_block: int | None = None
    #: int8: whether a measured layer may take the symmetric per-token form (export/int8.py's
    #: ``SYMMETRIC_SLACK`` rule; off by default, docs/limits.md); False: the midpoint form
    #: everywhere
    symmetric: bool = False
    #: int8: every Linear weight-only 8-bit with float activations (``accuracy_level`` 0), for a
    #: vision graph that failed export/int8.py's ``vision_activation_check``
    float_activations: bool = False
    #: int8: a decoder graph's read rows multiplied with their residual's codes too
    #: (export/int8.py's ``EXACT_READS``); False: quantized like every other row
    exact_reads: bool = True
    #: int8: the integer GEMM's weight form (``s8`` or ``u8``: export/int8.py's
    #: ``host_weight_form``); None: the first this host's int8 GEMM multiplies exactly
    int8_weights: str | None = None
    #: filled by the conversion: what it did, for the manifest (e.g. int8's layer counts)
    report: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrecisionSpec:
    """One precision; see the module doc."""

    name: str
    summary: str
    #: ``(model, options) -> model``: the fp32 graph (folded, tied) at this precision
    convert: Callable[[Any, ConvertOptions], Any] = field(repr=False)
    tolerance: Tolerance
    #: bytes per parameter: ``linear`` matrix-multiply weights, ``embed`` an untied token
    #: table, ``other`` norms, convolutions, biases (an upper bound where the scale count
    #: depends on the layer: int8's per-column scales are counted as one per 128 rows)
    weight_bytes: Mapping[str, float]
    #: a tied token table (= the output layer): ``once`` (one float table), ``shared`` (the
    #: output layer's blocks, read by GatherBlockQuantized with a second copy of the scales,
    #: and with ``table_residual`` the 8-bit blocks of their rounding residual),
    #: ``both`` (a float16 table and the output layer's blocks: TensorRT has no quantized Gather)
    tied_table: Literal["once", "shared", "both"]
    #: bytes of one scale per weight in the shared table's blocks (``shared`` only; the
    #: residual's blocks are the same size)
    table_scale_bytes: float = 0.0
    #: a ``shared`` table's Gather adds the 8-bit blocks of the output layer's rounding
    #: residual (export/weights.py's ``residual_blocks``): the token embeddings within 1/128
    #: of the blocks' step, for 1 B and a scale per weight more (docs/limits.md)
    table_residual: bool = False
    #: activation bytes (float16 graphs: 2)
    activation_bytes: float = 4.0
    #: the weights can stream from disk through the conversion (a large member's export)
    streamable: bool = False
    #: uses the calibration scenes (GPTQ codes, int8's rule); the export records them
    calibrated: bool = False
    #: the runtimes that can run it
    targets: tuple[str, ...] = ("onnxruntime",)
    #: which dense compute peak its roofline uses (export/cost.py); None: not modelled
    roofline_peak: str | None = None
    #: a weight's bits in MatMulNBits form (int4's weights kept at 8 bits are counted by it)
    nbits: int | None = None
    #: rows per MatMulNBits block (the manifest, the cost model's scale bytes)
    block_size: int | None = None
    #: the decoder/vision graph form an export uses by default (export/fused.py): ``fused``
    #: (onnxruntime's contrib operators: LinearAttention, GroupQueryAttention,
    #: SkipSimplifiedLayerNormalization, ...) for what only onnxruntime runs; ``standard`` for what
    #: TensorRT parses too (fp32 by default, so its TensorRT script stays valid)
    graph_form: Literal["fused", "standard"] = "standard"
    #: the fused form is allowed (fp16's float32 islands do not know the fused operators)
    fusable: bool = True
    #: the vision graph's first and last layers stay float32 (export/weights.py's
    #: ``image_end_weights``): the conversion leaves them and the cost model counts them at 4 B
    float32_image_ends: bool = False
    #: the export measures what the vision graph's int8 activations move the calibration
    #: scenes' scores and converts it again with float activations over the bound
    #: (export/int8.py's ``vision_activation_check``)
    checks_vision_activations: bool = False
    #: the export measures what the vision graph's weights at this precision's bits move the
    #: check scenes' scores and keeps them at 8 bits over the bound (export/mixed.py's
    #: ``vision_weight_check``)
    checks_vision_weights: bool = False


PRECISION_SPECS: dict[str, PrecisionSpec] = {}


def register_precision(spec: PrecisionSpec) -> PrecisionSpec:
    if spec.name in PRECISION_SPECS:
        raise ValueError(f"a precision named {spec.name!r} is registered already.")
    PRECISION_SPECS[spec.name] = spec
    return spec


def get_precision(name: str) -> PrecisionSpec:
    """The registered spec of ``name``; an error that lists the choices."""
    spec = PRECISION_SPECS.get(name)
    if spec is None:
        raise ValueError(f"precision must be one of {list(PRECISION_SPECS)}; got {name!r}.")
    return spec


# -- conversions ---------------------------------------------------------------------------


def _fp32(m: Any, o: ConvertOptions) -> Any:
    return m


def _fp16(m: Any, o: ConvertOptions) -> Any:
    from spotstop.export.fp16 import to_fp16

    return to_fp16(m)


def _prepare(m: Any, o: ConvertOptions) -> dict[str, str]:
    """The graph as the quantizers expect it: weights un-transposed, a tied output layer as a
    MatMul on Wᵀ, every Linear a MatMul (a Gemm is quantized too). Returns the tied outputs."""
    from spotstop.export.weights import (
        fold_weight_transposes,
        gemms_to_matmuls,
        untie_for_quantizer,
    )

    fold_weight_transposes(m, o.io)
    tied = untie_for_quantizer(m, o.io)
    gemms_to_matmuls(m, o.io)
    return tied


def _finish_nbits(
    m: Any, o: ConvertOptions, tied: dict[str, str], bits: int, precision: str
) -> Any:
    from spotstop.export.weights import embeddings_to_fp16, gather_from_quantized

    residual = get_precision(precision).table_residual
    return embeddings_to_fp16(gather_from_quantized(m, tied, bits, o.io, residual=residual), o.io)


def _nbits(
    precision: str, bits: int, block: int, accuracy_level: int, kept_int8: bool
) -> Callable[..., Any]:
    def convert(m: Any, o: ConvertOptions) -> Any:
        from spotstop.export.nbits import quantize_matmuls_nbits
        from spotstop.export.weights import image_end_weights

        tied = _prepare(m, o)
        kept = o.int8_keys if kept_int8 else ()
        ends = image_end_weights(m)  # float32 (export/weights.py)
        quantize_matmuls_nbits(m, bits, block, o.io, o.calibration, kept, accuracy_level, ends)
        if ends:
            o.report["float32_image_ends"] = o.report.get("float32_image_ends", 0) + len(ends)
        return _finish_nbits(m, o, tied, bits, precision)

    return convert


def _int8_dynamic(m: Any, o: ConvertOptions) -> Any:
    from spotstop.export.int8 import (
        KEEP_ERROR,
        SYMMETRIC_SLACK,
        Int8Report,
        host_weight_form,
        quantize_matmuls_int8,
    )
    from spotstop.export.int8_math import ROTATE_BLOCK
    from spotstop.export.nbits import quantize_matmuls_nbits
    from spotstop.export.weights import image_end_weights

    form = host_weight_form(o.int8_weights)  # before any work: a host that cannot, says so
    tied = _prepare(m, o)
    keep_error = KEEP_ERROR if o.keep_error is None else o.keep_error
    if o.float_activations:  # weight-only 8-bit, float compute
        # float32 as in quantize_matmuls_int8: the image's ends, and with calibration the
        # constants no recorded Linear multiplies by (a folded table: its inputs are unknown)
        ends = tuple(sorted(image_end_weights(m)))
        unmeasured = _unmeasured(m, o, set(ends))
        n = quantize_matmuls_nbits(
            m, 8, INT8_NBITS_BLOCK, o.io, o.calibration, (), 0, (*ends, *unmeasured)
        )
        rep = Int8Report(
            dynamic=0,
            unmeasured=unmeasured,
            image_ends=ends,
            keep_error=keep_error,
            float_activations=n,
            weight_form=form,
        )
    else:
        rep = quantize_matmuls_int8(
            m,
            o.io,
            o.calibration,
            smooth_alpha=o.smooth_alpha,
            keep_error=keep_error,
            rotate_block=ROTATE_BLOCK if o.rotate_block is None else o.rotate_block,
            symmetric_slack=SYMMETRIC_SLACK if o.symmetric else None,
            exact_reads=o.exact_reads,
            weight_form=form,
            output_layers=tied,  # a tied output layer stays the one table the Gather reads
        )
        # what it left (the output layer, the layers over the error bound): weight-only 8-bit
        # (the constants no Linear reads stay float32, export/int8.py)
        float32 = (*rep.unmeasured, *rep.image_ends, *rep.rotations)
        quantize_matmuls_nbits(m, 8, INT8_NBITS_BLOCK, o.io, o.calibration, (), 4, float32)
    # several graphs (vision, decoder) add up to one record for the manifest
    errors = o.report.setdefault("_int8_errors", [])
    errors += list(rep.errors.values())
    prev = o.report.get("int8") or {}
    meta = rep.as_meta()
    for k in (
        "dynamic",
        "measured",
        "smoothed_inputs",
        "gptq",
        "float32_unmeasured",
        "float32_image_ends",
        "rotated",
        "symmetric",
        "exact_reads",
    ):
        meta[k] += prev.get(k, 0)
    for k in ("output_layer", "over_keep_error", "float_activations"):
        meta["weight_only"][k] += prev.get("weight_only", {}).get(k, 0)
    for k in ("rotated_max_error", "symmetric_max_error"):
        meta[k] = max(meta[k], prev.get(k, 0.0))
    if meta["symmetric_slack"] is None:  # a graph converted with float activations tried none
        meta["symmetric_slack"] = prev.get("symmetric_slack")
    if errors:
        meta["max_error"] = round(float(max(errors)), 6)
        meta["median_error"] = round(float(sorted(errors)[len(errors) // 2]), 6)
    o.report["int8"] = meta
    return _finish_nbits(m, o, tied, 8, "int8")


def _unmeasured(m: Any, o: ConvertOptions, skip: set[str]) -> tuple[str, ...]:
    """The float32 MatMul weights of ``m`` (but ``skip``) whose inputs the calibration did not
    record (none without calibration)."""
    from onnx import TensorProto
    from spotstop.export.weights import WeightIO, weight_initializer

    if o.calibration is None:
        return ()
    io = o.io or WeightIO()
    inits = {t.name: t for t in m.graph.initializer}
    found: dict[str, None] = {}
    for node in m.graph.node:
        t = weight_initializer(node, inits)
        if t is None or t.data_type != TensorProto.FLOAT or t.name in skip or t.name in found:
            continue
        if o.calibration.sample(io.read(t), 1) is None:
            found[t.name] = None
    return tuple(found)


def _int4_trt(m: Any, o: ConvertOptions) -> Any:
    from spotstop.export.fp16 import to_fp16
    from spotstop.export.quant import quantize_int4_trt
    from spotstop.export.weights import (
        embeddings_to_fp16,
        fold_weight_transposes,
        gemms_to_matmuls,
        untie_for_quantizer,
    )

    fold_weight_transposes(m)
    untie_for_quantizer(m)  # the tied head as MatMul on Wᵀ; the Gather keeps W (fp16)
    gemms_to_matmuls(m)  # the Qwen3.5 vision tower's Linears (Gemm) are quantized too
    # the fp16 graph (same float32 islands as fp16), then its float16 MatMul weights as
    # INT4 blocks with float16 scales: DequantizeLinear outputs float16 into fp16 MatMuls
    return embeddings_to_fp16(quantize_int4_trt(to_fp16(m)))


#: rows per scale of the 8-bit MatMulNBits blocks (int8-nbits, and int8's weight-only layers)
INT8_NBITS_BLOCK = 128
#: int4's blocks: onnxruntime-genai's default; at the real Qwen3.5-2B dimensions its score error
#: on the export's validation cases was 0.65 / 0.12 against 1.17 / 1.44 at 128 (tolerance 1.0),
#: for 0.09 more bytes per weight
INT4_NBITS_BLOCK = 32
#: int4-trt's DequantizeLinear blocks (TensorRT's block quantization)
INT4_TRT_BLOCK = 128

register_precision(
    PrecisionSpec(
        "fp32",
        "the exported float32 graph",
        _fp32,
        Tolerance(1e-4, 1e-4, 1e-3, 0.999),
        {"linear": 4.0, "embed": 4.0, "other": 4.0},
        "once",
        streamable=True,
        targets=("onnxruntime", "tensorrt"),
    )
)
register_precision(
    PrecisionSpec(
        "fp16",
        "float16 weights and compute, the normalisers, rotary angles and delta rule kept float32",
        _fp16,
        Tolerance(5e-2, 1e-2, 5e-2, 0.99),
        {"linear": 2.0, "embed": 2.0, "other": 2.0},
        "once",
        activation_bytes=2.0,
        targets=("onnxruntime", "tensorrt"),
        roofline_peak="fp16_tflops",
        fusable=False,
    )
)
_INT8 = register_precision(
    PrecisionSpec(
        "int8",
        "int8 weights per output channel, activations quantized per call (computes in int8)",
        _int8_dynamic,
        # the weight-only tolerances: int8 activations add a per-tensor rounding step
        Tolerance(0.5, 0.1, 0.25, 0.9),
        {"linear": 1.0 + 4 / INT8_NBITS_BLOCK, "embed": 2.0, "other": 4.0},
        "shared",
        table_scale_bytes=4 / INT8_NBITS_BLOCK,
        table_residual=True,
        streamable=True,
        calibrated=True,
        roofline_peak="int8_tops",
        nbits=8,
        block_size=INT8_NBITS_BLOCK,
        graph_form="fused",
        float32_image_ends=True,
        checks_vision_activations=True,
    )
)
# the same bytes, tolerances and table as int8's (whose weight-only layers it is)
register_precision(
    replace(
        _INT8,
        name="int8-nbits",
        checks_vision_activations=False,
        summary="weight-only int8 (MatMulNBits, int8 activations per block of 128)",
        convert=_nbits("int8-nbits", 8, INT8_NBITS_BLOCK, 4, kept_int8=False),
    )
)
register_precision(
    PrecisionSpec(
        "int4",
        "weight-only int4 (MatMulNBits, float32 compute; chosen weights at 8 bits)",
        _nbits("int4", 4, INT4_NBITS_BLOCK, 0, kept_int8=True),
        Tolerance(2.0, 0.3, 1.0, 0.8),
        {"linear": 0.5 + 4 / INT4_NBITS_BLOCK, "embed": 2.0, "other": 4.0},
        "shared",
        table_scale_bytes=4 / INT4_NBITS_BLOCK,
        # the 4-bit blocks alone moved Qwen3.5-2B's scores 1.63 (docs/limits.md)
        table_residual=True,
        streamable=True,
        calibrated=True,
        roofline_peak="fp16_tflops",
        nbits=4,
        block_size=INT4_NBITS_BLOCK,
        graph_form="fused",
        float32_image_ends=True,
        checks_vision_weights=True,
    )
)
register_precision(
    PrecisionSpec(
        "int4-trt",
        "the fp16 graph with INT4 DequantizeLinear blocks (TensorRT)",
        _int4_trt,
        # max|w|/7 blocks (positive scales for TensorRT) use 15 of int4's 16 levels: ~1.13x
        # int4's weight error; on the random tiny pair |Δs| reached 0.94 (LFM2) / 1.19 (Qwen3.5)
        # on the fp32 graph, 0.87 / 1.06 on the fp16 graph (float16 scales) int4-trt now uses
        Tolerance(2.0, 0.3, 1.5, 0.8),
        {"linear": 0.5 + 2 / INT4_TRT_BLOCK, "embed": 2.0, "other": 2.0},
        "both",
        activation_bytes=2.0,
        targets=("onnxruntime", "tensorrt"),
        roofline_peak="fp16_tflops",  # float16 GEMMs on the dequantized blocks
        fusable=False,
    )
)


def convert_precision(
    model: Any,
    precision: str,
    *,
    copy: bool = True,
    io: Any = None,
    calibration: Any = None,
    int8: Collection[str] = (),
    options: ConvertOptions | None = None,
) -> Any:
    """fp32 ``model`` at ``precision`` (its spec's conversion; float32 inputs and outputs).

    ``copy=False`` converts ``model`` itself and returns it (or a new object). ``io``: where
    the weights are read and written (default: in the model); a
    :class:`~spotstop.export.weights.DiskWeights` needs ``copy=False`` and a streamable
    precision. ``calibration``: GPTQ codes (and int8's error rule) where it holds a weight's
    inputs. ``int8`` (int4): the weight keys kept at 8 bits, as export/mixed.py chose them.
    ``options`` gives all of these at once (and int8's smoothing); its ``report`` is filled.
    """
    import onnx

    spec = get_precision(precision)
    o = options or ConvertOptions(io=io, calibration=calibration, int8_keys=tuple(int8))
    if o.io is not None and (copy or not spec.streamable):
        streamable = [p for p, s in PRECISION_SPECS.items() if s.streamable]
        raise ValueError(
            f"a graph with its weights on disk converts in place to {streamable}; "
            f"got precision {precision!r}, copy={copy}."
        )
    if copy and spec.convert is not _fp32:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    return spec.convert(m, o)
