"""An exported fp32 graph converted to another precision (weights only).

:func:`convert_precision` writes ``fp16`` (:func:`spotstop.export.fp16.to_fp16`), ``int8`` /
``int4`` weight-only (onnxruntime's ``MatMulNBits`` as its ``MatMulNBitsQuantizer`` writes it,
export/nbits.py: symmetric, block 128, every MatMul
with a constant weight; embedding tables stored as float16; a tied output layer stays one
table, see export/weights.py) and ``int4-trt`` (the fp16 graph, then export/quant.py: INT4
blocked ``DequantizeLinear`` with float16 scales → float16 ``MatMul`` at opset 21, which
TensorRT parses). Inputs and outputs stay float32.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from spotstop.export.configs import PRECISIONS
from spotstop.export.fp16 import to_fp16
from spotstop.export.gptq import CalibrationInputs
from spotstop.export.weights import (
    WeightIO,
    embeddings_to_fp16,
    fold_weight_transposes,
    gather_from_quantized,
    gemms_to_matmuls,
    untie_for_quantizer,
)

__all__ = ["convert_precision"]


#: precisions a graph whose weights stay on disk (:class:`~spotstop.export.weights.DiskWeights`,
#: a large member's streamed export) can be converted to; fp16 and int4-trt rewrite the graph
#: in memory (export/fp16.py, export/quant.py)
STREAMABLE = ("fp32", "int8", "int4")


def convert_precision(
    model: Any,
    precision: str,
    *,
    copy: bool = True,
    io: WeightIO | None = None,
    calibration: CalibrationInputs | None = None,
    int8: Collection[str] = (),
) -> Any:
    """fp32 ``model`` at ``precision`` (weights only; float32 inputs and outputs).

    ``copy=False`` converts ``model`` itself and returns it (or a new object). ``io``: where
    the weights are read and written (default: in the model); a
    :class:`~spotstop.export.weights.DiskWeights` needs ``copy=False`` and a precision of
    :data:`STREAMABLE`. ``calibration``: int8/int4 by GPTQ where it holds a weight's inputs
    (export/gptq.py), else round to nearest. ``int8`` (int4): the weight keys
    (:func:`~spotstop.export.gptq.weight_key`) kept at 8 bits, as export/mixed.py chose them.
    """
    import onnx

    if io is not None and (copy or precision not in STREAMABLE):
        raise ValueError(
            f"a graph with its weights on disk converts in place to {list(STREAMABLE)}; "
            f"got precision {precision!r}, copy={copy}."
        )
    if precision == "fp32":
        return model
    if copy:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    if precision == "fp16":
        return to_fp16(m)
    if precision in ("int8", "int4"):
        from spotstop.export.nbits import quantize_matmuls_nbits
        from spotstop.export.quant import NBITS_BLOCK

        bits = 8 if precision == "int8" else 4
        fold_weight_transposes(m, io)
        tied = untie_for_quantizer(m, io)
        gemms_to_matmuls(m, io)  # a Linear exported as Gemm is quantized too
        # onnxruntime's MatMulNBits, symmetric; codes by GPTQ where calibration has the inputs
        block, kept = NBITS_BLOCK[precision], int8 if bits == 4 else ()
        quantize_matmuls_nbits(m, bits, block, io, calibration, kept)
        return embeddings_to_fp16(gather_from_quantized(m, tied, bits, io), io)
    if precision == "int4-trt":  # DequantizeLinear(INT4) -> MatMul: TensorRT parses it
        from spotstop.export.quant import quantize_int4_trt

        fold_weight_transposes(m)
        untie_for_quantizer(m)  # the tied head as MatMul on Wᵀ; the Gather keeps W (fp16)
        # the fp16 graph (same float32 islands as fp16), then its float16 MatMul weights as
        # INT4 blocks with float16 scales: DequantizeLinear outputs float16 into fp16 MatMuls
        return embeddings_to_fp16(quantize_int4_trt(to_fp16(m)))
    raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}.")
