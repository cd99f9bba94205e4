"""Weight-only int4 that TensorRT parses: precision ``int4-trt``.

``int8`` / ``int4`` use onnxruntime's ``MatMulNBits`` contrib operator, which only onnxruntime
runs. ``int4-trt`` writes the standard ONNX form that TensorRT's parser reads for weight-only
int4 (and onnxruntime runs too)::

    W_i4 (INT4 initializer, [K, N]) ──┐
    W_scale (float16, [ceil(K/128), N]) ─ DequantizeLinear(axis=0, block_size=128) ─→ MatMul(x, ·)

symmetric (no zero point), one scale per block of 128 input rows per output column, in an
opset-21 graph (the first opset whose ``DequantizeLinear`` takes INT4 and ``block_size``).
export/precision.py ``convert_precision`` quantizes the FP16 graph (``to_fp16`` first, with its
float32 islands), so the scales are float16, each ``DequantizeLinear`` outputs float16 and
the MatMuls it feeds compute in float16 (a strongly typed TensorRT build takes its precision
from these types), as nvidia-modelopt writes fp16 models: its RTN casts the float32 scales to
the weight's dtype and quantizes with the cast scales. A float32 model given directly to
:func:`quantize_int4_trt` keeps float32 scales.

The quantization convention is nvidia-modelopt's RTN: per block ``s = max|w| / 7`` (floored at
``1e-5``), ``q = round_half_to_even(w / s)`` clipped to ``[-8, 7]``. Float16 scales are computed
in float32, floored at the smallest normal float16 (``2**-14``: below it float16 holds a scale
only as a subnormal, which flush-to-zero arithmetic reads as 0) and rounded to float16
BEFORE ``q`` is computed, so ``q * s`` dequantizes with the scale that quantized it. Every
scale is positive:
TensorRT's ONNX parser refuses a ``DequantizeLinear`` whose scales are not all ``> 0``
("Scale coefficients must all be positive"), which is why onnxruntime's own symmetric QDQ
quantizer (``MatMulNBitsQuantizer`` with ``QuantFormat.QDQ``) is NOT used here: it maps each
block's largest-magnitude weight to ``-8`` with a signed scale ``w_max / -8``, so about half of
its scales are negative, and an all-zero block gets a zero scale.

Which quantizer runs:

* ``nvidia-modelopt`` when ``modelopt.onnx.quantization`` imports: its
  ``int4.quantize(model, calibration_method="rtn_dq")`` (default) or ``"awq_clip"``
  (activation-aware clipping, calibrated on feeds the caller passes);
* otherwise :func:`rtn_quantize_matmuls` here, which writes the same numbers as modelopt's
  ``rtn_dq`` (same scale, rounding, clipping and block layout; every ``MatMul`` whose second
  input is a constant weight of rank 2).

:func:`quantize_int4_trt` records which one ran (name, version, method) in the model's
``metadata_props`` (``spotstop.quantizer``); :func:`graph_quantizer` reads it back for
``spotstop_onnx.yaml``.

onnxruntime note: at its default graph optimization level onnxruntime fuses
``DequantizeLinear → MatMul`` into ``MatMulNBits`` on CPU and, by default
(``session.qdq_matmulnbits_accuracy_level`` = 4), computes it with int8-quantized activations;
the weights it uses are exactly the int4 ones. TensorRT runs the same graph with its own int4
weight-only kernels.
"""

from __future__ import annotations

import heapq
import importlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from spotstop.export.precision import PRECISION_SPECS
from spotstop.export.weights import default_opset

__all__ = [
    "BLOCK_SIZE",
    "FP16_SCALE_MIN",
    "INT4_OPSET",
    "METADATA_KEY",
    "NBITS_BLOCK",
    "QuantizerInfo",
    "floor_fp16_scales",
    "graph_quantizer",
    "modelopt_version",
    "quantize_int4_trt",
    "quantizer_meta",
    "raise_opset",
    "rtn_int4_blocks",
    "rtn_quantize_matmuls",
    "toposort",
]

logger = logging.getLogger("spotstop.export.quant")

#: Rows of the weight (input features, K) that share one scale in int4-trt's DequantizeLinear
#: blocks (TensorRT's block quantization), and int8's MatMulNBits blocks (NBITS_BLOCK).
BLOCK_SIZE = 128
#: Rows that share one scale in the MatMulNBits weights of each precision
#: (export/precision.py's registry, where the choices are explained).
NBITS_BLOCK: dict[str, int] = {p: s.block_size for p, s in PRECISION_SPECS.items() if s.block_size}
#: First opset whose DequantizeLinear takes INT4 inputs and the ``block_size`` attribute.
INT4_OPSET = 21
#: Smallest scale (modelopt's ``CLIP_MIN``): an all-zero block keeps a positive scale.
SCALE_MIN = 1e-5
#: Smallest float16 scale: the smallest normal float16 (2**-14 ≈ 6.1e-5), so a float16 scale
#: is never subnormal or zero (TensorRT refuses scales that are not > 0).
FP16_SCALE_MIN = float(np.finfo(np.float16).tiny)
#: ``metadata_props`` key of a quantized graph: which quantizer made it.
METADATA_KEY = "spotstop.quantizer"
_METHODS = ("rtn", "awq")


@dataclass(frozen=True)
class QuantizerInfo:
    """Which quantizer made an int4-trt graph."""

    quantizer: str  # "nvidia-modelopt" or "spotstop-rtn"
    version: str
    method: str  # "rtn_dq" / "awq_clip" (modelopt) or "rtn" (spotstop)
    block_size: int = BLOCK_SIZE

    def as_text(self) -> str:
        return f"{self.quantizer} {self.version} {self.method} block {self.block_size}"

    @classmethod
    def from_text(cls, text: str) -> QuantizerInfo:
        parts = text.split()
        if len(parts) != 5 or parts[3] != "block":
            raise ValueError(f"not a quantizer description: {text!r}")
        return cls(parts[0], parts[1], parts[2], int(parts[4]))

    def as_meta(self) -> dict[str, Any]:
        return {
            "name": self.quantizer,
            "version": self.version,
            "method": self.method,
            "block_size": self.block_size,
            "format": "DequantizeLinear(INT4, axis 0, symmetric) -> MatMul, opset 21",
        }


def modelopt_version() -> str | None:
    """nvidia-modelopt's version when ``modelopt.onnx.quantization.int4`` imports, else None."""
    try:
        importlib.import_module("modelopt.onnx.quantization.int4")
    except Exception:  # not installed, or its onnx dependencies are missing / incompatible
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:  # pragma: no cover - importable but not installed as dist
        import modelopt

        return str(getattr(modelopt, "__version__", "unknown"))


def _spotstop_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spotstop")
    except PackageNotFoundError:
        return "0+unknown"


# -- the quantization itself (numpy) ---------------------------------------------------------


def rtn_int4_blocks(w: np.ndarray, block_size: int = BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 round-to-nearest of a ``[K, N]`` weight in blocks of ``block_size`` rows.

    Returns ``(q, s)``: ``q`` int8 values in ``[-8, 7]`` of shape ``[K, N]`` and ``s`` positive
    scales of shape ``[ceil(K / block_size), N]`` in ``w``'s dtype, with
    ``s = max(max|w_block| / 7, 1e-5)`` and ``q = clip(rint(w / s), -8, 7)`` (ties to even).
    A float16 ``w`` gets float16 scales: ``s`` computed in float32, floored at
    :data:`FP16_SCALE_MIN`, rounded to float16, and ``q`` computed (in float32) with that
    rounded scale. A last partial block is scaled over its own rows (as zero padding to a full
    block does).
    """
    if w.ndim != 2:
        raise ValueError(f"int4 block quantization needs a 2-D weight; got shape {w.shape}.")
    k, n = w.shape
    nb = -(-k // block_size)
    w32 = w.astype(np.float32, copy=False)
    pad = nb * block_size - k
    wp = np.pad(w32, ((0, pad), (0, 0))) if pad else w32
    amax = np.abs(wp.reshape(nb, block_size, n)).max(axis=1)
    s = np.maximum(amax / np.float32(7.0), np.float32(SCALE_MIN)).astype(np.float32)
    if w.dtype == np.float16:
        s = np.maximum(s, np.float32(FP16_SCALE_MIN)).astype(np.float16).astype(np.float32)
        if not bool(np.all(np.isfinite(s))):
            raise ValueError("a float16 weight block's scale max|w| / 7 overflows float16.")
    q = np.clip(np.rint(w32 / np.repeat(s, block_size, axis=0)[:k]), -8, 7).astype(np.int8)
    return q, s.astype(w.dtype)


def floor_fp16_scales(model: Any) -> int:
    """Raise float16 ``DequantizeLinear`` scales below :data:`FP16_SCALE_MIN` to it, in place.

    For graphs another quantizer wrote (nvidia-modelopt floors at ``1e-5``, which float16 holds
    only as a subnormal): each such block's INT4 values are re-rounded for the new scale,
    ``q' = clip(rint(q * s / s'), -8, 7)``. Returns the number of scales raised.
    """
    from onnx import TensorProto, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    raised = 0
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 2:
            continue
        qt, st = inits.get(node.input[0]), inits.get(node.input[1])
        if qt is None or st is None or st.data_type != TensorProto.FLOAT16:
            continue
        s = numpy_helper.to_array(st).astype(np.float32)
        low = s < np.float32(FP16_SCALE_MIN)
        if not low.any():
            continue
        if qt.data_type != TensorProto.INT4 or len(qt.dims) != 2 or s.ndim != 2:
            raise RuntimeError(f"{node.name}: float16 scales below 2**-14 on an unknown layout.")
        bs = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        if bs <= 0:
            raise RuntimeError(f"{node.name}: float16 scales below 2**-14 without block_size.")
        k = int(qt.dims[0])
        new_s = np.where(low, np.float32(FP16_SCALE_MIN), s).astype(np.float16)
        ratio = np.repeat(s / new_s.astype(np.float32), bs, axis=0)[:k]
        q = numpy_helper.to_array(qt).astype(np.float32)
        q = np.clip(np.rint(q * ratio), -8, 7).astype(np.int8)
        qt.CopyFrom(_int4_tensor(qt.name, q))
        st.CopyFrom(numpy_helper.from_array(new_s, st.name))
        raised += int(low.sum())
    return raised


def _int4_tensor(name: str, q: np.ndarray) -> Any:
    """An INT4 TensorProto of ``q`` (int8 values in [-8, 7]), two values a byte, low nibble first."""
    from onnx import TensorProto, helper

    flat = q.reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    packed = flat[0::2] | (flat[1::2] << 4)
    return helper.make_tensor(name, TensorProto.INT4, list(q.shape), packed.tobytes(), raw=True)


def rtn_quantize_matmuls(model: Any, block_size: int = BLOCK_SIZE) -> int:
    """Replace, in place, every constant rank-2 ``MatMul`` weight by INT4 blocks + a DequantizeLinear.

    The graph must already be at opset >= 21 (:func:`raise_opset`). A weight shared by several
    MatMuls is quantized once; the float weight is dropped when nothing else reads it. Returns
    the number of weights quantized.
    """
    from onnx import helper, numpy_helper
    from spotstop.export.weights import rewrite_weight_matmuls

    g = model.graph
    done: dict[str, str] = {}  # weight name → DequantizeLinear output

    def rewrite(node: Any, t: Any) -> list[Any]:
        w, first = t.name, []
        if w not in done:
            q, s = rtn_int4_blocks(numpy_helper.to_array(t), block_size)
            qt = _int4_tensor(w + "_i4", q)
            st = numpy_helper.from_array(s, w + "_scale")
            g.initializer.extend([qt, st])
            done[w] = w + "_DequantizeLinear_Output"
            first.append(
                helper.make_node(
                    "DequantizeLinear",
                    [qt.name, st.name],
                    [done[w]],
                    name=w + "_DequantizeLinear",
                    axis=0,
                    block_size=block_size,
                )
            )
        node.input[1] = done[w]
        return [*first, node]

    return rewrite_weight_matmuls(model, rewrite)


# -- opset -------------------------------------------------------------------------------------


def raise_opset(model: Any, target: int = INT4_OPSET) -> Any:
    """``model`` at opset ``target`` (>= its own), converted by ``onnx.version_converter``.

    Converting rewrites the ops whose meaning changed (e.g. ReduceMean's ``axes`` attribute
    becomes an input at opset 18); ops that only gained types keep their nodes. The converter
    serializes the model (a 2 GiB protobuf limit), so large initializers are held aside while it
    runs and put back by name after: they are constants it never reads. A graph the converter
    refuses raises its error: setting the opset number alone could silently change a node's
    meaning.
    """
    import onnx
    from onnx import TensorProto, version_converter

    cur = default_opset(model)
    if cur >= target:
        return model
    held: dict[str, bytes] = {}
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for t in stripped.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) >= 1024:
            if t.name in held:
                raise ValueError(f"initializer {t.name!r} appears twice in the graph.")
            held[t.name] = t.raw_data
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            entry = t.external_data.add()
            entry.key, entry.value = "location", "spotstop-held-aside"
    converted = version_converter.convert_version(stripped, target)
    for t in converted.graph.initializer:
        if t.name in held and t.data_location == TensorProto.EXTERNAL:
            t.raw_data = held.pop(t.name)
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
    if held:
        raise RuntimeError(
            f"opset conversion lost {len(held)} initializer(s), e.g. {next(iter(held))!r}."
        )
    if converted.ir_version < 10:  # INT4 tensors need IR version 10
        converted.ir_version = 10
    return converted


# -- entry point -------------------------------------------------------------------------------


def _modelopt_quantize(
    model: Any, method: str, calibration: Sequence[Mapping[str, np.ndarray]] | None
) -> Any:
    from modelopt.onnx.quantization.int4 import quantize as modelopt_int4

    kwargs: dict[str, Any] = {
        "calibration_method": "awq_clip" if method == "awq" else "rtn_dq",
        "block_size": BLOCK_SIZE,
        "use_zero_point": False,
        "nodes_to_exclude": [],  # modelopt leaves "/lm_head" in float by default; int4 does not
        "calibration_eps": ["cpu"],
        "log_level": "WARNING",
    }
    if method == "awq":
        kwargs["calibration_data_reader"] = [dict(c) for c in calibration or ()]
    return modelopt_int4(model, **kwargs)


def quantize_int4_trt(
    model: Any,
    *,
    method: str = "rtn",
    calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
    use_modelopt: bool | None = None,
) -> Any:
    """An int4-trt copy of fp16 (or fp32) ``model``: INT4 blocked DequantizeLinear → MatMul.

    Scales take each weight's dtype: float16 weights (export/precision.py passes the ``to_fp16``
    graph) get float16 scales and float16 DequantizeLinear outputs.

    ``method``: ``"rtn"`` (round to nearest; no data) or ``"awq"`` (modelopt's ``awq_clip``,
    calibrated on ``calibration``: a list of input feeds; needs nvidia-modelopt).
    ``use_modelopt``: None uses modelopt when it imports; False never; True requires it.
    Fold ``Transpose(weight)`` into the weight first (spotstop.export.weights.fold_weight_transposes): only a
    MatMul whose weight is a constant initializer is quantized.
    """
    import onnx

    if method not in _METHODS:
        raise ValueError(f"method must be one of {list(_METHODS)}; got {method!r}.")
    mo = modelopt_version() if use_modelopt in (None, True) else None
    if use_modelopt and mo is None:
        raise RuntimeError(
            "use_modelopt=True but modelopt.onnx.quantization does not import; install "
            "nvidia-modelopt with its onnx dependencies, or pass use_modelopt=None."
        )
    if method == "awq":
        if mo is None:
            raise RuntimeError("int4-trt AWQ needs nvidia-modelopt (modelopt.onnx.quantization).")
        calibration = list(calibration or ())
        if not calibration:
            raise ValueError("AWQ needs calibration feeds (a list of input dicts).")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m = raise_opset(m, INT4_OPSET)
    if mo is not None:
        info = QuantizerInfo("nvidia-modelopt", mo, "awq_clip" if method == "awq" else "rtn_dq")
        out = _modelopt_quantize(m, method, calibration)  # type: ignore[arg-type]
        floor_fp16_scales(out)  # float16 scales: no subnormal ones (spotstop-rtn floors too)
    else:
        info = QuantizerInfo("spotstop-rtn", _spotstop_version(), "rtn")
        rtn_quantize_matmuls(m)
        out = m
    toposort(out)  # the fp16 converter's Casts come last; keep the graph in order
    _check_int4_trt(out)
    props = {p.key: p.value for p in out.metadata_props}
    props[METADATA_KEY] = info.as_text()
    del out.metadata_props[:]
    onnx.helper.set_model_props(out, props)
    return out


def _subgraph_inputs(node: Any) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    from onnx import AttributeProto

    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                names.update(x for x in [*n.input, *_subgraph_inputs(n)] if x and x not in local)
    return names


def toposort(model: Any) -> None:
    """Order ``model``'s nodes so every node follows the nodes it reads from, in place.

    Ready nodes are taken in their original order. onnxruntime's float16 converter appends
    the Casts it inserts at the end of the graph: onnxruntime sorts such a graph itself, but
    ``onnx.checker`` refuses it and a parser need not sort it.
    """
    g = model.graph
    nodes = list(g.node)
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [
        {made[x] for x in [*n.input, *_subgraph_inputs(n)] if x in made and made[x] != i}
        for i, n in enumerate(nodes)
    ]
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return
    users: dict[int, list[int]] = {}
    for i, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    left = [len(ds) for ds in deps]
    ready = [i for i, c in enumerate(left) if c == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise RuntimeError("the graph has a cycle: cannot order its nodes.")
    del g.node[:]
    g.node.extend(nodes[i] for i in order)


def _check_int4_trt(model: Any) -> None:
    """The graph is what TensorRT parses: no MatMulNBits, positive scales, opset >= 21; and
    every Linear is quantized: no Gemm reads a float weight (the cost model and the memory
    budget count every Linear at int4).

    Float16 scales are also at least :data:`FP16_SCALE_MIN` (no subnormals)."""
    from onnx import TensorProto, numpy_helper

    if default_opset(model) < INT4_OPSET:
        raise RuntimeError(f"int4-trt graph is at opset {default_opset(model)} (< 21).")
    inits = {t.name: t for t in model.graph.initializer}
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            raise RuntimeError("int4-trt graph holds MatMulNBits, which TensorRT cannot parse.")
        w = inits.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if w is not None and len(w.dims) == 2 and w.data_type in floats:
            raise RuntimeError(
                f"{node.name}: a Gemm reads the float weight {w.name!r}; int4-trt quantizes "
                "every Linear (export/weights.py gemms_to_matmuls rewrites it as a MatMul)."
            )
        if node.op_type == "DequantizeLinear" and len(node.input) > 1:
            t = inits.get(node.input[1])
            if t is None:
                continue
            s = numpy_helper.to_array(t)
            if not bool(np.all(s > 0)):
                raise RuntimeError(
                    f"{node.name}: DequantizeLinear scales must all be > 0 for TensorRT."
                )
            if s.dtype == np.float16 and not bool(np.all(s >= np.float16(FP16_SCALE_MIN))):
                raise RuntimeError(f"{node.name}: float16 scales below 2**-14 (subnormal).")


def graph_quantizer(model: Any) -> QuantizerInfo | None:
    """Which quantizer made ``model`` (its ``spotstop.quantizer`` metadata), else None."""
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            return QuantizerInfo.from_text(p.value)
    return None


def quantizer_meta(model: Any) -> dict[str, Any]:
    """``{"quantizer": {...}}`` for spotstop_onnx.yaml when ``model`` records one, else ``{}``."""
    info = graph_quantizer(model)
    return {"quantizer": info.as_meta()} if info is not None else {}
