"""Weight-only int8/int4 as onnxruntime's ``MatMulNBits``, one weight at a time.

The same numbers and graph as onnxruntime's ``MatMulNBitsQuantizer`` (``QOperator`` format,
symmetric, no zero points, its C++ kernels ``quantize_matmul_8bits`` / ``quantize_matmul_4bits``
do the quantizing): every ``MatMul`` whose second input is a rank-2 float initializer
``B`` (K x N) becomes ``MatMulNBits(A, B_Q{bits}, B_scales)`` with ``K``, ``N``, ``bits`` and
``block_size`` attributes; ``B_Q{bits}`` is uint8 (N, ceil(K / block), block * bits / 8) and
``B_scales`` float32 (N, ceil(K / block)); ``B`` is dropped when nothing else reads it.
``tests/export/test_nbits.py`` holds the graph and bytes equal to onnxruntime's quantizer's.
With calibration inputs, each weight's codes and scales are chosen by GPTQ instead
(export/gptq.py): the same operator, layout and dequantization.

Why not call that quantizer: it reads each weight from the in-memory ModelProto, and a
quantized copy added to a ModelProto stays in its memory with the float one (protobuf's arena,
export/weights.py). Here each weight goes through a :class:`~spotstop.export.weights.WeightIO`,
so a large member's graph (export/memory.py) is quantized with its weights on disk, holding
one weight at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
from spotstop.export.gptq import CalibrationInputs, gptq_nbits, weight_key
from spotstop.export.weights import WeightIO, rewrite_weight_matmuls

__all__ = ["dequantize_nbits", "nbits_blocks", "nbits_weights", "quantize_matmuls_nbits"]


def nbits_blocks(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``w`` (K, N) float → (packed uint8 (N, k_blocks, blob), scales float32 (N, k_blocks)),
    symmetric, by onnxruntime's own kernels (as its ``MatMulNBitsQuantizer`` calls them)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8; got {bits}.")
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = w.shape
    k_blocks = (rows + block_size - 1) // block_size
    kpack = 8 // bits
    blob = (block_size + kpack - 1) // kpack
    pad = k_blocks * block_size - rows
    if pad:
        w = np.pad(w, ((0, pad), (0, 0)), "constant")
    packed = np.zeros((cols, k_blocks, blob), dtype=np.uint8)
    zero_point = np.zeros((cols, (k_blocks + kpack - 1) // kpack), dtype=np.uint8)
    scales = np.zeros((cols, k_blocks), dtype=np.float32)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    kernel(packed, w, scales, zero_point, block_size, cols, rows, True)
    return packed, scales


def dequantize_nbits(packed: np.ndarray, scales: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """The (K, N) float32 weight a symmetric ``MatMulNBits`` multiplies by: the inverse of
    :func:`nbits_blocks` (``rows`` = K). Each block's codes are unsigned around the implicit
    zero point ``2**(bits-1)``; int4 packs two codes a byte, the lower nibble first.
    ``x @ dequantize_nbits(...)`` equals onnxruntime's MatMulNBits output (float32 compute);
    ``bench/quant_error.py`` uses it to put the exact quantized weights into a torch model."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8; got {bits}.")
    cols, k_blocks = packed.shape[:2]
    if bits == 8:
        codes = packed.astype(np.int16)
    else:
        codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).astype(np.int16)
    codes = codes.reshape(cols, k_blocks, -1) - (1 << (bits - 1))
    w = codes.astype(np.float32) * scales[:, :, None].astype(np.float32)
    return np.ascontiguousarray(w.reshape(cols, -1)[:, :rows].T)


def quantize_matmuls_nbits(
    model: Any,
    bits: int,
    block_size: int = 128,
    io: WeightIO | None = None,
    calibration: CalibrationInputs | None = None,
    int8: Collection[str] = (),
    accuracy_level: int = 0,
    skip: Collection[str] = (),
) -> int:
    """Quantize, in place, every ``MatMul`` with a rank-2 float initializer weight; return
    how many weights were quantized. A weight shared by several MatMuls is quantized once.

    ``calibration``: the recorded inputs of the member's Linears (export/gptq.py); a weight
    they hold inputs for is quantized by GPTQ (same operator and layout, other codes), any
    other (none: every weight) is rounded to nearest. ``int8``: the
    :func:`~spotstop.export.gptq.weight_key` of weights kept at 8 bits whatever ``bits`` is
    (export/mixed.py's rule chose them on the torch model). ``accuracy_level``: the node's
    attribute: 0 computes in float32 (dequantized weights); 4 quantizes the activations to
    int8 per block and multiplies in int8 (onnxruntime's int8 dot-product kernels: about 2.7x
    faster for 8-bit weights on an AVX512-VNNI CPU, bench/int8_gemm.py; the usual choice on
    ARM). ``skip``: weight names left as they are (float32)."""
    from onnx import helper

    io = io or WeightIO()
    done: dict[str, tuple[str, str, int, int, int]] = {}
    int8 = frozenset(int8)

    skip = frozenset(skip)

    def rewrite(node: Any, t: Any) -> list[Any] | None:
        if t.name in skip:
            return None
        if t.name not in done:
            k, n = (int(d) for d in t.dims)
            w = io.read(t)
            b = 8 if int8 and weight_key(w.T) in int8 else bits
            h = calibration.hessian(w) if calibration is not None else None
            if h is not None:
                packed, scales = gptq_nbits(w, h, b, block_size)
            else:
                packed, scales = nbits_blocks(w, b, block_size)
            del w, h
            qn, sn = f"{t.name}_Q{b}", f"{t.name}_scales"
            io.add(model, packed, qn)
            io.add(model, scales, sn)
            done[t.name] = (qn, sn, k, n, b)
        qn, sn, k, n, b = done[t.name]
        attrs: dict[str, Any] = {"K": k, "N": n, "bits": b, "block_size": block_size}
        if accuracy_level:
            attrs["accuracy_level"] = int(accuracy_level)
        name = f"{node.name}_Q{b}" if node.name else ""
        return [
            helper.make_node(
                "MatMulNBits",
                [node.input[0], qn, sn],
                list(node.output),
                name=name,
                domain="com.microsoft",
                **attrs,
            )
        ]

    rewrite_weight_matmuls(model, rewrite, f"GPTQ int{bits}" if calibration else None)
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(done)  # the weights in ``skip`` are not counted


#: operators whose second input is an int8 weight (int8's dynamic path: int8 activations)
_INT8_WEIGHT_OPS = ("MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulInteger")


def nbits_weights(models: Iterable[Any]) -> dict[int, int]:
    """bits → how many weights the graphs hold at that width: those of ``MatMulNBits`` nodes
    (their ``bits``) and the int8 weights of int8's dynamic operators (a weight several nodes
    or graphs read counts once): what a bundle really stores, read back from its graphs for
    the manifest."""
    from onnx import helper

    seen: dict[str, int] = {}
    for m in models:
        for node in m.graph.node:
            if node.op_type in _INT8_WEIGHT_OPS and len(node.input) > 1:
                seen[node.input[1]] = 8
            elif node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
                bits = next(
                    (
                        int(helper.get_attribute_value(a))
                        for a in node.attribute
                        if a.name == "bits"
                    ),
                    4,  # the operator's default
                )
                seen[node.input[1]] = bits
    out: dict[int, int] = {}
    for bits in seen.values():
        out[bits] = out.get(bits, 0) + 1
    return out
