"""An exported fp32 graph converted to another precision (weights only).

:func:`convert_precision` writes ``fp16`` (:func:`spotstop.export.fp16.to_fp16`), ``int8`` /
``int4`` weight-only (onnxruntime ``MatMulNBitsQuantizer``: symmetric, block 128, every MatMul
with a constant weight; embedding tables stored as float16; a tied output layer stays one
table, see export/weights.py) and ``int4-trt`` (the fp16 graph, then export/quant.py: INT4
blocked ``DequantizeLinear`` with float16 scales → float16 ``MatMul`` at opset 21, which
TensorRT parses). Inputs and outputs stay float32.
"""

from __future__ import annotations

import logging
from typing import Any

from spotstop.export.configs import PRECISIONS
from spotstop.export.fp16 import to_fp16
from spotstop.export.weights import (
    embeddings_to_fp16,
    fold_weight_transposes,
    gather_from_quantized,
    untie_for_quantizer,
)

__all__ = ["convert_precision"]


def _quiet_onnxruntime_tools() -> None:
    for name in ("onnxruntime.quantization", "onnxruntime.quantization.matmul_nbits_quantizer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def convert_precision(model: Any, precision: str, *, copy: bool = True) -> Any:
    """fp32 ``model`` at ``precision`` (weights only; float32 inputs and outputs).

    ``copy=False`` converts ``model`` itself (its weights are not held twice; a large member's
    export, export/memory.py) and returns the converted model, which may be a new object.
    """
    import onnx

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
        _quiet_onnxruntime_tools()
        fold_weight_transposes(m)
        tied = untie_for_quantizer(m)
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(
            m,
            bits=8 if precision == "int8" else 4,
            block_size=128,
            is_symmetric=True,
            op_types_to_quantize=("MatMul",),
        )
        q.process()
        qm = gather_from_quantized(q.model.model, tied, 8 if precision == "int8" else 4)
        return embeddings_to_fp16(qm)
    if precision == "int4-trt":  # DequantizeLinear(INT4) -> MatMul: TensorRT parses it
        from spotstop.export.quant import quantize_int4_trt

        fold_weight_transposes(m)
        untie_for_quantizer(m)  # the tied head as MatMul on Wᵀ; the Gather keeps W (fp16)
        # the fp16 graph (same float32 islands as fp16), then its float16 MatMul weights as
        # INT4 blocks with float16 scales: DequantizeLinear outputs float16 into fp16 MatMuls
        return embeddings_to_fp16(quantize_int4_trt(to_fp16(m)))
    raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}.")
