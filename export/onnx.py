"""Export a member to ONNX scoring graphs, quantize them, and validate every output.

``export_member(source, out_dir, precision=...)`` writes an exported member folder::

    out_dir/
      config.json, preprocessor_config.json, tokenizer.json   (read by the runtime, no weights)
      spotstop_member.yaml, SPOTSTOP_TEST_PAIR.txt            (hints / test-pair marker, if any)
      spotstop_onnx.yaml                                       (what spotstop.guard.backends._onnx reads)
      onnx/vision.onnx (+ vision.onnx.data)
      onnx/decoder.onnx  or  onnx/decoder_L{bucket}.onnx ×buckets  (+ decoder.data, shared)

The steps follow optimum-onnx: the architecture's registered :class:`ExportConfig` picks the
exporter per graph; after export, every output of every graph is compared with the torch
scoring graph on the same inputs (a gray image, generated images, the request-only pass) and
ALL failures are reported together in one :class:`ExportValidationError`; then the graphs are
converted to the requested precision and validated again with that precision's tolerances.

Precisions: ``fp32``; ``fp16`` (:func:`to_fp16`: onnxruntime's float16 converter, float32
inputs/outputs kept, the normalisers, RMSNorm/LayerNorm and the Gated-DeltaNet decay and delta
rule kept float32 as the transformers code computes them); ``int8`` / ``int4`` weight-only
(onnxruntime ``MatMulNBitsQuantizer``: symmetric, block 128, every MatMul with a constant
weight; embedding tables stored as float16); ``int4-trt`` (the fp16 graph, then
export/quant.py: INT4 blocked ``DequantizeLinear`` with float16 scales → float16 ``MatMul`` at
opset 21, which TensorRT parses).

A tied output layer (word embeddings = output layer) is stored ONCE (:func:`tie_output_layer`):
at fp32/fp16 the token ``Gather`` and a ``Gemm(transB=1)`` read the same table; at int8/int4
the table is the output layer's ``MatMulNBits`` blocks, which ``GatherBlockQuantized`` reads
for the token embeddings too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from PIL import Image
from spotstop.export.configs import PRECISIONS, ExportConfig, get_export_config
from spotstop.export.quant import quantizer_meta
from spotstop.guard._config import ScoringConfig
from spotstop.guard._hf import (
    MEMBER_HINTS,
    TEST_PAIR_MARKER,
    MemberFolder,
    render_template,
    resolve_member,
)
from spotstop.guard._image import gray_image
from spotstop.guard._member import resolve_image_size
from spotstop.guard._prompt import PromptEncoder, RenderedTemplate, ScorePlan, prompt_hash
from spotstop.guard.backends._onnx import (
    GRAPHS_FILE,
    GRAPHS_FORMAT,
    GRAPHS_VERSION,
    combine_scores,
    decoder_feeds,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "ExportValidationError",
    "GraphCheck",
    "MemberExport",
    "export_member",
    "onnx_weight_bytes",
    "tie_output_layer",
]

logger = logging.getLogger("spotstop.export.onnx")

#: Right-padded length buckets (tokens). 512x512 images give 256 visual tokens, so a real
#: member's prompts fall in 384/512; longer requests use 1024.
DEFAULT_BUCKETS: tuple[int, ...] = (384, 512, 1024)

_VALIDATION_REQUESTS = (
    "pick up the knife",
    "pour the hot water into the cup near the child",
)
_COPY = ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json")


class ExportValidationError(ValueError):
    """Exported graphs differ from the torch reference beyond the config's tolerances.

    ``failures`` lists every failing (graph, output, input case), not only the first.
    """

    def __init__(self, member: str, failures: Sequence[str]) -> None:
        self.failures = list(failures)
        super().__init__(
            f"export of {member} failed validation ({len(self.failures)} failure(s)):\n  "
            + "\n  ".join(self.failures)
        )


@dataclass(frozen=True)
class GraphCheck:
    """One graph output compared with the torch scoring graph on one input case."""

    graph: str
    output: str
    case: str
    max_abs_diff: float
    atol: float
    rtol: float
    ok: bool


@dataclass(frozen=True)
class MemberExport:
    """What :func:`export_member` wrote and how it validated."""

    name: str
    path: Path
    model_type: str
    precision: str
    image_size: tuple[int, int]
    n_image_tokens: int
    buckets: tuple[int, ...]
    files: tuple[str, ...]
    first_ids: tuple[int, ...]
    unsafe_ids: tuple[int, ...]
    safe_ids: tuple[int, ...]
    #: weight bytes of the graphs one scoring pass loads: vision + one decoder
    weight_bytes: int
    template: RenderedTemplate = field(repr=False)
    prompt_hash: str = ""
    checks: tuple[GraphCheck, ...] = field(default=(), repr=False)
    seconds: float = 0.0

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.checks), default=float("nan"))


# -- helpers -------------------------------------------------------------------------------


def _quiet_onnxruntime_tools() -> None:
    for name in ("onnxruntime.quantization", "onnxruntime.quantization.matmul_nbits_quantizer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def onnx_weight_bytes(model: Any) -> int:
    """Bytes of a model's initializers (weights, quantized blocks, scales)."""
    import onnx
    from onnx import helper

    total = 0
    packed4 = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}  # two values a byte
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        if t.data_type in packed4:
            total += (n + 1) // 2
            continue
        total += n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return total


def _save(models: dict[str, Any], out_dir: Path, data_name: str) -> None:
    """Save graphs with their large tensors in ONE external file, shared where identical.

    Fixed-length decoder graphs (one per bucket) hold the same weights; each tensor is written
    once and every graph points at the same offset.
    """
    import onnx
    from onnx import external_data_helper as edh

    out_dir.mkdir(parents=True, exist_ok=True)
    data_path = out_dir / data_name
    table: dict[tuple[str, str], tuple[int, int]] = {}
    with open(data_path, "wb") as data:
        for fname, model in models.items():
            for t in model.graph.initializer:
                if not t.HasField("raw_data") or len(t.raw_data) < 1024:
                    continue
                raw = t.raw_data
                key = (t.name, hashlib.sha1(raw).hexdigest())
                if key not in table:
                    offset = data.tell()
                    pad = (-offset) % 64  # aligned, as onnx's own writer does for mmap
                    data.write(b"\0" * pad)
                    table[key] = (offset + pad, len(raw))
                    data.write(raw)
                off, length = table[key]
                edh.set_external_data(t, location=data_name, offset=off, length=length)
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
            onnx.save_model(model, str(out_dir / fname))
    if data_path.stat().st_size == 0:
        data_path.unlink()


def _to_numpy_inputs(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v) for k, v in feeds.items()}


# -- precision -------------------------------------------------------------------------------


def fold_weight_transposes(model: Any) -> Any:
    """Replace ``Transpose(initializer)`` by the transposed initializer, in place.

    The dynamo exporter (run without onnxscript's optimizer, which more than doubles its time)
    writes every ``Linear`` as ``MatMul(x, Transpose(W))``; weight-only quantizers only see a
    MatMul whose weight is a constant, so the transposes are folded here first.
    """
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    users: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            users[i] = users.get(i, 0) + 1
    for o in model.graph.output:
        users[o.name] = users.get(o.name, 0) + 1
    keep = []
    for node in model.graph.node:
        src = node.input[0] if node.input else ""
        if node.op_type == "Transpose" and src in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            arr = numpy_helper.to_array(inits[src])
            folded = numpy_helper.from_array(
                np.ascontiguousarray(np.transpose(arr, perm)), node.output[0]
            )
            model.graph.initializer.append(folded)
            users[src] -= 1
            if users[src] == 0:
                model.graph.initializer.remove(inits[src])
            continue
        keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


#: name prefix of the nodes :func:`tie_output_layer` writes (found again by the int8/int4 path)
_TIED = "tied_output_layer"


def _users(model: Any) -> dict[str, int]:
    users: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            users[i] = users.get(i, 0) + 1
    for o in model.graph.output:
        users[o.name] = users.get(o.name, 0) + 1
    return users


def _drop_unused_initializers(model: Any) -> None:
    users = _users(model)
    for t in [t for t in model.graph.initializer if users.get(t.name, 0) == 0]:
        model.graph.initializer.remove(t)


def _gather_tables(model: Any) -> dict[str, Any]:
    """2-D float initializers read by a ``Gather`` on axis 0 (token-embedding tables)."""
    from onnx import TensorProto, helper

    inits = {t.name: t for t in model.graph.initializer}
    tables = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or not node.input or node.input[0] not in inits:
            continue
        t = inits[node.input[0]]
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        if (
            axis == 0
            and len(t.dims) == 2
            and t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
        ):
            tables[t.name] = t
    return tables


def tie_output_layer(model: Any) -> Any:
    """Keep ONE copy of a tied output layer (word embeddings = output layer), in place.

    Exporters write ``x @ W.T`` on a tied table ``W`` as ``MatMul(x, Transpose(W))`` (dynamo)
    or ``MatMul(x, Wᵀ)`` with ``Wᵀ`` a constant-folded SECOND initializer (legacy), next to the
    ``Gather(W, input_ids)`` of the token embeddings: two copies of vocab × hidden weights (and
    a runtime would materialize a constant ``Transpose`` too). Each such MatMul becomes
    ``Reshape(x, [-1, hidden]) → Gemm(·, W, transB=1) → Reshape(·, x.shape[:-1] + [vocab])`` on
    the very initializer the Gather reads. A folded copy is recognised only when it equals
    ``Wᵀ`` exactly. Returns ``model``; a graph without tied weights is left as it is.
    """
    from onnx import TensorProto, helper, numpy_helper

    tables = _gather_tables(model)
    if not tables:
        return model
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    arrays: dict[str, np.ndarray] = {}

    def tied_table(b: str) -> str | None:
        node = producer.get(b)
        if node is not None and node.op_type == "Transpose" and node.input[0] in tables:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
            return node.input[0] if perm == [1, 0] else None
        t = inits.get(b)
        if t is None or len(t.dims) != 2:
            return None
        for name, e in tables.items():
            if list(t.dims) == list(e.dims)[::-1] and t.data_type == e.data_type:
                if name not in arrays:
                    arrays[name] = numpy_helper.to_array(e)
                if np.array_equal(numpy_helper.to_array(t), arrays[name].T):
                    return name
        return None

    new_nodes: list[Any] = []
    k = 0
    for node in model.graph.node:
        table = tied_table(node.input[1]) if node.op_type == "MatMul" else None
        if table is None:
            new_nodes.append(node)
            continue
        vocab, hidden = (int(d) for d in tables[table].dims)
        p = f"{_TIED}/{k}"
        k += 1
        x, y = node.input[0], node.output[0]
        model.graph.initializer.extend(
            [
                helper.make_tensor(f"{p}/flat_shape", TensorProto.INT64, [2], [-1, hidden]),
                helper.make_tensor(f"{p}/vocab", TensorProto.INT64, [1], [vocab]),
            ]
        )
        new_nodes += [
            helper.make_node("Reshape", [x, f"{p}/flat_shape"], [f"{p}/flat"], name=f"{p}/flat"),
            helper.make_node(
                "Gemm", [f"{p}/flat", table], [f"{p}/logits"], name=f"{p}/gemm", transB=1
            ),
            helper.make_node("Shape", [x], [f"{p}/lead"], name=f"{p}/lead", start=0, end=-1),
            helper.make_node(
                "Concat", [f"{p}/lead", f"{p}/vocab"], [f"{p}/shape"], name=f"{p}/shape", axis=0
            ),
            helper.make_node("Reshape", [f"{p}/logits", f"{p}/shape"], [y], name=f"{p}/out"),
        ]
    if k == 0:
        return model
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    # the Transpose nodes and folded copies nobody reads any more
    while True:
        users = _users(model)
        dead = [
            n
            for n in model.graph.node
            if n.op_type == "Transpose" and all(users.get(o, 0) == 0 for o in n.output)
        ]
        if not dead:
            break
        for n in dead:
            model.graph.node.remove(n)
    _drop_unused_initializers(model)
    return model


def _untie_for_quantizer(model: Any) -> dict[str, str]:
    """Give each tied ``Gemm`` of :func:`tie_output_layer` back a MatMul on ``Wᵀ``, in place.

    ``MatMulNBitsQuantizer`` only quantizes a MatMul with a constant weight; the transposed
    copy lives only until :func:`_gather_from_quantized` points the Gather at the quantized
    blocks. Returns {MatMul output: table}.
    """
    from onnx import helper, numpy_helper

    tables = _gather_tables(model)
    names = {t.name for t in model.graph.initializer}
    tied: dict[str, str] = {}
    new_nodes: list[Any] = []
    for node in model.graph.node:
        if node.op_type != "Gemm" or not node.name.startswith(_TIED) or node.input[1] not in tables:
            new_nodes.append(node)
            continue
        table = node.input[1]
        t_name = table + "_T"
        if t_name not in names:
            arr = np.ascontiguousarray(numpy_helper.to_array(tables[table]).T)
            model.graph.initializer.append(numpy_helper.from_array(arr, t_name))
            names.add(t_name)
        new_nodes.append(
            helper.make_node("MatMul", [node.input[0], t_name], list(node.output), name=node.name)
        )
        tied[node.output[0]] = table
    if tied:
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
    return tied


def _gather_from_quantized(model: Any, tied: dict[str, str], bits: int) -> Any:
    """Token embeddings read from the quantized output layer (one table), in place.

    After ``MatMulNBitsQuantizer``, the tied output layer is ``MatMulNBits`` with packed
    blocks ``B`` (vocab, k_blocks, blob) and ``scales`` (vocab, k_blocks): the table itself,
    quantized row by row along hidden. Every ``Gather`` on the float table becomes
    onnxruntime's ``GatherBlockQuantized`` on the same ``B`` (uint8, ``bits``, symmetric: the
    same default zero point), whose rank-3 form needs its scales as (vocab, k_blocks, 1), a
    copy 1/32 (int8) or 1/16 (int4) the size of ``B``. The float table is dropped.
    """
    from onnx import TensorProto, helper, numpy_helper

    if not tied:
        return model
    inits = {t.name: t for t in model.graph.initializer}
    quant: dict[str, tuple[str, str, int]] = {}  # table → (B, scales3, block_size)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and node.output[0] in tied:
            table = tied[node.output[0]]
            b, s = node.input[1], node.input[2]
            bs = next(
                helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size"
            )
            s3 = s + "_gather"
            if s3 not in inits:
                arr = numpy_helper.to_array(inits[s])
                t3 = numpy_helper.from_array(arr.reshape(*arr.shape, 1), s3)
                model.graph.initializer.append(t3)
                inits[s3] = t3
            quant[table] = (b, s3, int(bs))
    new_nodes: list[Any] = []
    for k, node in enumerate(model.graph.node):
        table = node.input[0] if node.op_type == "Gather" and node.input else ""
        if table not in quant:
            new_nodes.append(node)
            continue
        b, s3, bs = quant[table]
        hidden = int(inits[table].dims[1])
        nb = int(inits[b].dims[1])
        p = f"{_TIED}/gather{k}"
        idx, y = node.input[1], node.output[0]
        padded = nb * bs != hidden
        model.graph.initializer.extend(
            [helper.make_tensor(f"{p}/width", TensorProto.INT64, [1], [nb * bs])]
        )
        new_nodes += [
            helper.make_node(
                "GatherBlockQuantized",
                [b, idx, s3],
                [f"{p}/blocks"],
                name=f"{p}/gbq",
                domain="com.microsoft",
                gather_axis=0,
                quantize_axis=2,
                block_size=bs,
                bits=bits,
            ),
            helper.make_node("Shape", [idx], [f"{p}/lead"], name=f"{p}/lead"),
            helper.make_node(
                "Concat", [f"{p}/lead", f"{p}/width"], [f"{p}/shape"], name=f"{p}/shape", axis=0
            ),
            helper.make_node(
                "Reshape",
                [f"{p}/blocks", f"{p}/shape"],
                [f"{p}/rows" if padded else y],
                name=f"{p}/rows",
            ),
        ]
        if padded:  # hidden is not a multiple of the block: the last block is zero-padded
            model.graph.initializer.extend(
                [
                    helper.make_tensor(f"{p}/start", TensorProto.INT64, [1], [0]),
                    helper.make_tensor(f"{p}/end", TensorProto.INT64, [1], [hidden]),
                    helper.make_tensor(f"{p}/axis", TensorProto.INT64, [1], [-1]),
                ]
            )
            new_nodes.append(
                helper.make_node(
                    "Slice",
                    [f"{p}/rows", f"{p}/start", f"{p}/end", f"{p}/axis"],
                    [y],
                    name=f"{p}/unpad",
                )
            )
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    _drop_unused_initializers(model)
    return model


def _embeddings_to_fp16(model: Any) -> Any:
    """Store float32 tables read by Gather (token embeddings) as float16 + a Cast."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    users: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            users[i] = users.get(i, 0) + 1
    new_nodes = []
    for node in model.graph.node:
        w = node.input[0] if node.input else ""
        t = inits.get(w)
        if (
            node.op_type == "Gather"
            and t is not None
            and t.data_type == TensorProto.FLOAT
            and len(t.dims) == 2
            and int(np.prod(t.dims)) >= 4096
        ):
            half = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), w + "_fp16")
            model.graph.initializer.append(half)
            out = node.output[0]
            node.input[0] = half.name
            node.output[0] = out + "_fp16"
            new_nodes.append((node, helper.make_node("Cast", [out + "_fp16"], [out], to=1)))
            users[w] -= 1
            if users[w] == 0:
                model.graph.initializer.remove(t)
    for node, cast in new_nodes:
        idx = list(model.graph.node).index(node)
        model.graph.node.insert(idx + 1, cast)
    return model


#: op types computed in float32 inside fp16 graphs, besides onnxruntime's default block list
#: (which already keeps Range, CumSum, Min, Max, TopK ... in float32): the normalisers, as the
#: transformers models compute them (``softmax(..., dtype=torch.float32)``,
#: ``log_softmax(logits.float())``), and LayerNorm, whose variance overflows float16.
FP16_FP32_OPS: tuple[str, ...] = ("Softmax", "LogSoftmax", "LayerNormalization")
#: module classes whose own code stays float32 (the transformers code upcasts there itself:
#: RMSNorm's ``x.float()``, Gated-DeltaNet's decay and the chunked delta rule's
#: ``.to(torch.float32)``); their children (the Linear projections, the conv) do not.
_FP32_MODULES = re.compile(r"(RMSNorm|LayerNorm|GatedDeltaNet)\w*$")
_FP32_CHILD_OK = re.compile(r"RMSNorm|LayerNorm")  # everything under a norm stays float32
#: legacy (TorchScript) graphs carry no module metadata; their node names are module paths
_NORM_SCOPE = re.compile(r"norm", re.IGNORECASE)


def _fp32_nodes(model: Any) -> list[str]:
    """Names of the nodes an fp16 graph keeps in float32 (numerics of the fp32 reference).

    Dynamo graphs: from each node's ``pkg.torch.onnx.class_hierarchy`` (the module classes
    that produced it, outermost first): nodes under an RMSNorm/LayerNorm module, and nodes in
    a Gated-DeltaNet module's own code (decay ``exp``/``softplus``, the chunked delta rule with
    its within-chunk ``exp`` of decay differences and its recurrent state) but not in its
    Linear/Conv children, which are the bulk of the work and stay float16. Legacy graphs:
    nodes under a module path segment named ``*norm*``. Unnamed nodes are named here.
    """
    names = []
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}_unnamed"
        meta = {p.key: p.value for p in node.metadata_props}
        hierarchy = meta.get("pkg.torch.onnx.class_hierarchy")
        if hierarchy is not None:
            classes = [c.strip(" '\"") for c in hierarchy.strip("[]").split(",")][:-1]
            if any(_FP32_CHILD_OK.search(c) for c in classes) or (
                classes and _FP32_MODULES.search(classes[-1])
            ):
                names.append(node.name)
        elif any(_NORM_SCOPE.search(seg) for seg in node.name.split("/")[:-1]):
            names.append(node.name)
    return names


def _scalar_constants_as_tensors(model: Any) -> None:
    """Rewrite ``Constant(value_float[s]=…)`` as ``Constant(value=<float tensor>)``, in place.

    The dynamo exporter writes float scalars as ``value_float``; onnxruntime's float16
    converter converts ``value`` tensors but not these attributes, yet retypes their outputs
    as float16, so a type-generic consumer (``Expand`` of ``aten.new_ones``, ``Where``, ...)
    gets float32 where the graph says float16 and onnxruntime refuses to load the graph
    ("Type (tensor(float16)) of output arg ... does not match expected type (tensor(float))").
    """
    from onnx import TensorProto, helper

    for node in model.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        for a in list(node.attribute):
            if a.name == "value_float":
                t = helper.make_tensor("value", TensorProto.FLOAT, [], [a.f])
            elif a.name == "value_floats":
                t = helper.make_tensor("value", TensorProto.FLOAT, [len(a.floats)], list(a.floats))
            else:
                continue
            node.attribute.remove(a)
            node.attribute.append(helper.make_attribute("value", t))


def to_fp16(model: Any) -> Any:
    """``model`` (float32) as a float16 graph with float32 inputs and outputs, in place.

    onnxruntime's ``convert_float_to_float16`` with ``keep_io_types`` on everything but the
    float32 islands (:func:`_convert_with_fp32_islands`, linear in the graph's size); float
    scalar constants made convertible first (:func:`_scalar_constants_as_tensors`: the Qwen3.5
    decoder did not load without it); the overflow-prone parts (:data:`FP16_FP32_OPS`,
    :func:`_fp32_nodes`) stay float32 behind Casts. Weights of the float16 parts are stored as
    float16.
    """
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    _scalar_constants_as_tensors(model)
    # ops with inputs fixed to float32 (the converter's mixed-type special cases) stay float32
    block_ops = [*DEFAULT_OP_BLOCK_LIST, *FP16_FP32_OPS, "Resize", "GroupNorm", "SkipGroupNorm"]
    fp32 = set(_fp32_nodes(model))
    fp32.update(n.name for n in model.graph.node if n.op_type in block_ops)
    _follow_data_movement(model, fp32)
    float_inputs = {
        i.name
        for i in model.graph.input
        if i.type.tensor_type.elem_type == 1  # FLOAT
    }
    m = _convert_with_fp32_islands(model, fp32)
    _join_fp32_regions(m, fp32, float_inputs)
    return m


def _float_tensors(model: Any) -> tuple[set[str], set[str]]:
    """Names of the float32 tensors and of the float32 tensor SEQUENCES of ``model``.

    Types come from ONNX shape inference run on a copy of the graph WITHOUT initializer data
    (types need none), so it works on graphs far above protobuf's 2 GiB limit.
    """
    import onnx
    from onnx import TensorProto

    g = model.graph
    skeleton = onnx.ModelProto()
    skeleton.ir_version = model.ir_version
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    sg = skeleton.graph
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and len(t.raw_data) + 4 * len(t.float_data) > 4096:
            stub = onnx.TensorProto()
            stub.name, stub.data_type = t.name, t.data_type
            stub.dims.extend(t.dims)
            sg.initializer.append(stub)  # no data: an input of known type for inference
            sg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
        else:
            sg.initializer.append(t)
    inferred = onnx.shape_inference.infer_shapes(skeleton)
    tensors: set[str] = set()
    sequences: set[str] = set()
    for v in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.FLOAT:
            tensors.add(v.name)
        elif (
            v.type.HasField("sequence_type")
            and v.type.sequence_type.elem_type.tensor_type.elem_type == TensorProto.FLOAT
        ):
            sequences.add(v.name)
    tensors.update(t.name for t in g.initializer if t.data_type == TensorProto.FLOAT)
    return tensors, sequences


def _rename_reads(node: Any, rename: Callable[[str], str | None], local: set[str]) -> None:
    """Rename what ``node`` reads from the enclosing graph, subgraph bodies included.

    ``rename(x)`` gives the new name of ``x`` or None to keep it; names made inside a subgraph
    (``local``: its inputs, initializers and node outputs) are not the enclosing graph's.
    """
    for k, x in enumerate(node.input):
        if x and x not in local:
            new = rename(x)
            if new is not None:
                node.input[k] = new
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            inner = set(local)
            inner.update(i.name for i in sub.input)
            inner.update(t.name for t in sub.initializer)
            inner.update(o for n in sub.node for o in n.output)
            for n in sub.node:
                _rename_reads(n, rename, inner)


def _convert_with_fp32_islands(model: Any, fp32: set[str]) -> Any:
    """``convert_float_to_float16`` (keep_io_types) with the ``fp32`` nodes left in float32.

    onnxruntime's converter handles blocked nodes with a scan of every float value per blocked
    input and output: quadratic, half an hour per decoder graph at the real models' size. Here
    the blocked nodes are taken out of the graph, the rest is converted (no shape inference:
    the types were read by :func:`_float_tensors` first), and the blocked nodes are put back
    with one Cast per float16 value they read and per value they hand to a float16 node, so
    float32 nodes pass float32 values to each other directly.
    """
    from onnx import TensorProto, helper
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from spotstop.export.quant import toposort

    g = model.graph
    floats, float_seqs = _float_tensors(model)
    order = {n.name: i for i, n in enumerate(g.node)}
    blocked = [n for n in g.node if n.name in fp32]
    keep = [n for n in g.node if n.name not in fp32]
    blocked_copies = []
    for n in blocked:
        c = type(n)()
        c.CopyFrom(n)
        blocked_copies.append(c)
    kept_copies = []
    for n in keep:
        c = type(n)()
        c.CopyFrom(n)
        kept_copies.append(c)
    del g.node[:]
    g.node.extend(kept_copies)
    del g.value_info[:]
    m = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=[], node_block_list=[], disable_shape_infer=True
    )
    g = m.graph
    blocked_out = {o for n in blocked_copies for o in n.output if o}
    # the converter's Cast in front of a graph output that a float32 node now writes itself
    io_casts = [
        n
        for n in g.node
        if n.op_type == "Cast"
        and n.name.startswith("graph_output_cast")
        and n.output[0] in blocked_out
    ]
    drop = {n.name for n in io_casts}
    # float16 nodes that read such an output read the converter's name for it
    renamed_out = {n.input[0]: n.output[0] for n in io_casts}
    producer = {o: n for n in g.node if n.name not in drop for o in n.output}
    inits = {t.name: t for t in g.initializer}

    def is_fp16(x: str) -> bool:
        if x in inits:
            return inits[x].data_type == TensorProto.FLOAT16
        p = producer.get(x)
        if p is None or x not in floats:
            return False  # a graph input (kept float32), a float32 node's output, not float
        to = next((a.i for a in p.attribute if a.name == "to"), None)
        return not (p.op_type == "Cast" and to == TensorProto.FLOAT)

    new_nodes = []
    made: dict[tuple[str, int], str] = {}

    def cast(x: str, to: int) -> str:
        """The name of ``x`` cast to ``to``: one Cast node per value and type."""
        if (x, to) not in made:
            tag = "fp32" if to == TensorProto.FLOAT else "fp16"
            made[(x, to)] = f"{x}_{tag}_island"
            new_nodes.append(
                helper.make_node("Cast", [x], [made[(x, to)]], to=to, name=f"{x}_to_{tag}_island")
            )
        return made[(x, to)]

    def cast32(x: str) -> str | None:  # what a float32 node reads from a float16 one
        if not x or x in blocked_out or not is_fp16(x):
            return None
        return cast(x, TensorProto.FLOAT)

    def cast16(x: str) -> str | None:  # what a float16 node reads from a float32 one
        x = renamed_out.get(x, x)
        if x not in blocked_out or x not in floats or x in float_seqs:
            return None
        return cast(x, TensorProto.FLOAT16)

    for n in blocked_copies:
        _rename_reads(n, cast32, set())
    for n in g.node:
        if n.name not in drop:
            _rename_reads(n, cast16, set())
    kept = [n for n in g.node if n.name not in drop]
    first = len(order)
    rank = {n.name: order.get(n.name, first + i) for i, n in enumerate([*kept, *blocked_copies])}
    merged = sorted([*kept, *blocked_copies], key=lambda n: rank[n.name])
    copies = []
    for n in [*merged, *new_nodes]:
        c = type(n)()
        c.CopyFrom(n)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)
    toposort(m)
    return m


#: ops that only move or select values: they stay in the precision of what they move
_MOVE_OPS = frozenset(
    {
        "Concat",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "GatherND",
        "Identity",
        "Reshape",
        "Slice",
        "Split",
        "Squeeze",
        "Tile",
        "Transpose",
        "Unsqueeze",
    }
)


def _follow_data_movement(model: Any, fp32: set[str]) -> None:
    """Add to ``fp32`` the data-movement nodes fed by a float32 node, in place (graph order).

    E.g. the ``GatherElements``/``Squeeze`` that read ``read_logprob`` out of the float32
    LogSoftmax: rounding them to float16 on the way to a float32 output only loses digits.
    """
    producer = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type in _MOVE_OPS and node.input:
            src = producer.get(node.input[0])
            if src is not None and src.name in fp32:
                fp32.add(node.name)


def _join_fp32_regions(model: Any, fp32: set[str], float_inputs: set[str]) -> None:
    """Remove the float16 round trips the converter puts between float32 nodes, in place.

    ``convert_float_to_float16`` treats each blocked node alone: it casts every float output
    of a blocked node to float16 and every float input back to float32, so a value passed
    from one float32 node to the next is rounded to float16 on the way (which defeats keeping
    RMSNorm's variance or the delta rule's decay in float32) and a blocked node producing a
    tensor SEQUENCE gets a Cast that is not valid on sequences. Every
    ``Cast(to=float32)(Cast(to=float16)(x))`` with ``x`` float32 (made by a float32 node or a
    float32 graph input) reads ``x`` directly instead; the value_info the converter retyped is
    dropped (onnxruntime infers the types again when it loads the graph).
    """
    from onnx import TensorProto

    producer = {o: n for n in model.graph.node for o in n.output}

    def cast_to(n: Any) -> int | None:
        if n is None or n.op_type != "Cast":
            return None
        return next((a.i for a in n.attribute if a.name == "to"), None)

    def is_fp32(x: str) -> bool:
        p = producer.get(x)
        if p is None:
            return x in float_inputs
        return p.name in fp32 or cast_to(p) == TensorProto.FLOAT

    alias: dict[str, str] = {}
    for n in model.graph.node:
        if cast_to(n) != TensorProto.FLOAT:
            continue
        inner = producer.get(n.input[0])
        if inner is not None and cast_to(inner) == TensorProto.FLOAT16 and is_fp32(inner.input[0]):
            alias[n.output[0]] = inner.input[0]
    if not alias:
        return
    outputs = {o.name for o in model.graph.output}
    for n in model.graph.node:
        if n.op_type == "Cast" and n.output[0] in alias and n.output[0] in outputs:
            n.input[0] = alias[n.output[0]]  # a graph output: float32 → float32, a no-op
            continue
        for k, x in enumerate(n.input):
            if x in alias:
                n.input[k] = alias[x]
    while True:
        users: dict[str, int] = {}
        for n in model.graph.node:
            for x in n.input:
                users[x] = users.get(x, 0) + 1
        dead = {
            i
            for i, n in enumerate(model.graph.node)
            if n.op_type == "Cast"
            and all(users.get(o, 0) == 0 and o not in outputs for o in n.output)
        }
        if not dead:
            break
        # rebuild the node list once (RepeatedContainer.remove is linear: quadratic in total)
        kept = []
        for i, n in enumerate(model.graph.node):
            if i not in dead:
                c = type(n)()
                c.CopyFrom(n)
                kept.append(c)
        del model.graph.node[:]
        model.graph.node.extend(kept)
    del model.graph.value_info[:]


def convert_precision(model: Any, precision: str) -> Any:
    """A copy of fp32 ``model`` at ``precision`` (weights only; float32 inputs and outputs)."""
    import onnx

    if precision == "fp32":
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if precision == "fp16":
        return to_fp16(m)
    if precision in ("int8", "int4"):
        _quiet_onnxruntime_tools()
        fold_weight_transposes(m)
        tied = _untie_for_quantizer(m)
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(
            m,
            bits=8 if precision == "int8" else 4,
            block_size=128,
            is_symmetric=True,
            op_types_to_quantize=("MatMul",),
        )
        q.process()
        qm = _gather_from_quantized(q.model.model, tied, 8 if precision == "int8" else 4)
        return _embeddings_to_fp16(qm)
    if precision == "int4-trt":  # DequantizeLinear(INT4) -> MatMul: TensorRT parses it
        from spotstop.export.quant import quantize_int4_trt

        fold_weight_transposes(m)
        _untie_for_quantizer(m)  # the tied head as MatMul on Wᵀ; the Gather keeps W (fp16)
        # the fp16 graph (same float32 islands as fp16), then its float16 MatMul weights as
        # INT4 blocks with float16 scales: DequantizeLinear outputs float16 into fp16 MatMuls
        return _embeddings_to_fp16(quantize_int4_trt(to_fp16(m)))
    raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}.")


# -- export ----------------------------------------------------------------------------------


@dataclass
class _Cases:
    """Validation inputs: vision pixels and decoder feeds, built as the runtime builds them."""

    pixels: dict[str, dict[str, np.ndarray]]
    prompts: dict[str, list[list[int]]]  # case → prompts; "text" has no image


def _validation_cases(folder: MemberFolder, encoder: PromptEncoder, g: Any) -> _Cases:
    arch = folder.arch
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (g.height + 7, g.width + 13, 3), dtype=np.uint8))
    pixels = {
        "gray": arch.preprocess(gray_image(g.width, g.height), g),
        "noise": arch.preprocess(noise, g),
    }
    img_text = arch.image_text(g)
    prompts = {
        "scene": [encoder.prompt_ids(r, img_text) for r in _VALIDATION_REQUESTS],
        "text": [encoder.prompt_ids(r, None) for r in _VALIDATION_REQUESTS],
    }
    return _Cases(pixels, prompts)


@contextmanager
def _exporter_noise() -> Iterator[None]:
    """Silence what the exporters say about themselves (not about our graphs).

    The legacy exporter is chosen on purpose (see export/configs.py) and warns that it is
    deprecated; tracing warns that shape-dependent Python values become constants, which is
    what a fixed image grid and fixed-length buckets mean.
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # torch.export's own deprecation notices (e.g. pytree's LeafSpec) during decomposition
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
        yield


def _export_vision(
    vision: Any, cfg: type[ExportConfig], pixels: dict[str, np.ndarray], path: Path
) -> None:
    import torch

    x = torch.from_numpy(pixels["pixel_values"])
    with torch.no_grad(), _exporter_noise():
        if cfg.vision_exporter == "legacy":
            torch.onnx.export(
                vision,
                (x,),
                str(path),
                input_names=["pixel_values"],
                output_names=["image_embeds"],
                opset_version=cfg.legacy_opset,
                dynamo=False,
            )
        else:
            torch.onnx.export(
                vision,
                (x,),
                str(path),
                input_names=["pixel_values"],
                output_names=["image_embeds"],
                opset_version=cfg.dynamo_opset,
                dynamo=True,
                optimize=False,
            )


_DEC_INPUTS = ["input_ids", "image_embeds", "last_index", "read_index", "read_token"]
_DEC_OUTPUTS = ["first_logits", "read_logprob"]


def _decoder_axes(fixed_length: bool) -> dict[str, dict[int, str]]:
    """The decoder inputs' dynamic axes: batch, reads and (unless fixed) the sequence length."""
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch"} if fixed_length else {0: "batch", 1: "length"},
        "image_embeds": {0: "batch"},
        "last_index": {0: "batch"},
        "read_index": {0: "batch", 1: "reads"},
        "read_token": {0: "batch", 1: "reads"},
    }
    return axes


def _export_decoder(
    decoder: Any,
    cfg: type[ExportConfig],
    feeds: dict[str, np.ndarray],
    image_embeds: np.ndarray,
    path: Path,
) -> None:
    import torch

    args = tuple(
        torch.from_numpy(image_embeds if n == "image_embeds" else feeds[n]) for n in _DEC_INPUTS
    )
    with torch.no_grad(), _exporter_noise():
        if cfg.decoder_exporter == "legacy":
            dyn = _decoder_axes(cfg.decoder_fixed_length)
            dyn.update({"first_logits": {0: "batch"}, "read_logprob": {0: "batch", 1: "reads"}})
            torch.onnx.export(
                decoder,
                args,
                str(path),
                input_names=_DEC_INPUTS,
                output_names=_DEC_OUTPUTS,
                dynamic_axes=dyn,
                opset_version=cfg.legacy_opset,
                dynamo=False,
            )
        else:
            from torch.export import Dim

            dims = {a: Dim(a) for a in ("batch", "reads", "length")}
            ds = {
                name: {axis: dims[a] for axis, a in axes.items()}
                for name, axes in _decoder_axes(cfg.decoder_fixed_length).items()
            }
            # optimize=False: onnxscript's optimizer more than doubles the export time of the
            # Gated-DeltaNet graph; onnxruntime optimizes the graph when it loads it anyway.
            torch.onnx.export(
                decoder,
                args,
                str(path),
                input_names=_DEC_INPUTS,
                output_names=_DEC_OUTPUTS,
                dynamic_shapes=ds,
                opset_version=cfg.dynamo_opset,
                dynamo=True,
                optimize=False,
            )


def _compare(
    name: str,
    output: str,
    case: str,
    got: np.ndarray,
    want: np.ndarray,
    atol: float,
    rtol: float,
) -> GraphCheck:
    if got.shape != want.shape:
        return GraphCheck(name, output, case, float("inf"), atol, rtol, False)
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    ok = bool(np.all(np.isfinite(got))) and bool(np.allclose(got, want, atol=atol, rtol=rtol))
    return GraphCheck(name, output, case, diff, atol, rtol, ok)


def _session(model_or_path: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])


def export_member(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    config: ScoringConfig | None = None,
    precision: str = "fp32",
    image_size: tuple[int, int] | None = None,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    name: str | None = None,
    sessions: str = "resident",
) -> MemberExport:
    """Export one member (a Hugging Face folder or hub id) to ``out_dir``; see the module doc.

    Raises :class:`ExportValidationError` listing every output beyond tolerance (fp32 graphs
    first, then the graphs at ``precision``); nothing is left in ``out_dir`` then.
    """
    import torch
    from spotstop.export.graphs import build_graphs
    from transformers import AutoModelForImageTextToText

    t0 = time.perf_counter()
    if sessions not in ("resident", "on-demand"):
        raise ValueError(f"sessions must be 'resident' or 'on-demand'; got {sessions!r}.")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}.")
    bks = tuple(sorted({int(b) for b in buckets}))
    if not bks or bks[0] <= 0:
        raise ValueError(f"buckets must be positive token counts; got {list(buckets)}.")
    cfg_s = config or ScoringConfig()
    folder = resolve_member(source)
    mname = name or folder.path.name
    ecfg = get_export_config(folder.model_type)
    size = resolve_image_size(folder, cfg_s, mname, image_size)
    g = folder.arch.geometry(folder.config, folder.preprocessor, size)
    template = render_template(folder, cfg_s.prompt)
    encoder = PromptEncoder(folder.tokenizer(), template, cfg_s.prompt)
    plan: ScorePlan = encoder.plan
    cases = _validation_cases(folder, encoder, g)
    shortest = min(max(len(p) for p in ps) for ps in cases.prompts.values()) + plan.max_row_len
    longest = max(len(p) for ps in cases.prompts.values() for p in ps) + plan.max_row_len
    # a bucket is kept when at least one validation case fits it (else it is never checked)
    usable = [b for b in bks if b >= shortest]
    if not usable or usable[-1] < longest:
        raise ValueError(
            f"{mname}: prompts with an image need {longest} tokens but the largest bucket is "
            f"{bks[-1]}; add a larger bucket (e.g. --buckets {bks[-1]},{2 * bks[-1]})."
        )

    model: Any = AutoModelForImageTextToText.from_pretrained(str(folder.path), dtype=torch.float32)
    model = model.eval()
    text_cfg = model.config.get_text_config()
    hidden = int(text_cfg.hidden_size)
    vision_t, decoder_t = build_graphs(
        model,
        folder.model_type,
        image_token_id=folder.image_token_id,
        first_ids=plan.first_ids,
        gray_pixels=cases.pixels["gray"],
        merge=g.merge,
    )

    # Torch reference outputs of both graphs on every validation case.
    with torch.no_grad():
        ref_emb = {
            k: vision_t(torch.from_numpy(px["pixel_values"])).numpy()
            for k, px in cases.pixels.items()
        }
    n_img = ref_emb["gray"].shape[1]
    if n_img != g.n_image_tokens:
        raise ValueError(
            f"{mname}: the vision tower yields {n_img} visual tokens at {g.height}x{g.width}; "
            f"the prompt expands {g.n_image_tokens}. The member's configs disagree."
        )

    def dec_cases(length: int) -> dict[str, dict[str, np.ndarray]]:
        out = {}
        for case, prompts in cases.prompts.items():
            if max(len(p) for p in prompts) + plan.max_row_len > length:
                continue
            feeds = decoder_feeds(prompts, plan, length)
            b = feeds["input_ids"].shape[0]
            if case == "text":
                emb = np.zeros((b, n_img, hidden), np.float32)
            else:  # one image per prompt: noise for the first, gray for the rest
                per = [ref_emb["noise"][0]] + [ref_emb["gray"][0]] * (len(prompts) - 1)
                emb = np.repeat(np.stack(per), len(plan.rows), axis=0)
            out[case] = {**feeds, "image_embeds": emb}
        return out

    tmp = Path(tempfile.mkdtemp(prefix="spotstop-export-"))
    try:
        graphs: dict[str, Any] = {}
        # -- vision
        _export_vision(vision_t, ecfg, cases.pixels["gray"], tmp / "vision.onnx")
        import onnx

        graphs["vision.onnx"] = onnx.load(str(tmp / "vision.onnx"))
        # -- decoder(s)
        dec_lengths = usable if ecfg.decoder_fixed_length else [usable[0]]
        dec_files: dict[int, str] = {}
        ref_dec: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        for length in dec_lengths:
            cs = dec_cases(length)
            fname = f"decoder_L{length}.onnx" if ecfg.decoder_fixed_length else "decoder.onnx"
            case0 = cs.get("scene") or cs["text"]
            feeds0 = {k: v for k, v in case0.items() if k != "image_embeds"}
            _export_decoder(decoder_t, ecfg, feeds0, case0["image_embeds"], tmp / fname)
            graphs[fname] = fold_weight_transposes(tie_output_layer(onnx.load(str(tmp / fname))))
            dec_files[length] = fname
        # reference outputs at every usable bucket (a dynamic decoder is checked at each)
        for length in usable:
            for case, feeds in dec_cases(length).items():
                with torch.no_grad():
                    fl, lp = decoder_t(*(torch.from_numpy(feeds[n]) for n in _DEC_INPUTS))
                ref_dec[(length, case)] = (fl.numpy(), lp.numpy())

        def validate(models: dict[str, Any], prec: str) -> list[GraphCheck]:
            atol, rtol = ecfg.atol[prec], ecfg.rtol[prec]
            checks: list[GraphCheck] = []
            try:
                vs = _session(models["vision.onnx"])
                sessions = {f: _session(models[f]) for f in dec_files.values()}
            except Exception as e:  # a converted graph onnxruntime refuses: say which and why
                return [
                    GraphCheck(
                        "graphs",
                        f"load ({type(e).__name__}: {e})",
                        prec,
                        float("inf"),
                        atol,
                        rtol,
                        False,
                    )
                ]
            for k, px in cases.pixels.items():
                (got,) = vs.run(None, {"pixel_values": px["pixel_values"]})
                checks.append(_compare("vision", "image_embeds", k, got, ref_emb[k], atol, rtol))
            for length in usable:
                fname = dec_files[length] if ecfg.decoder_fixed_length else dec_files[usable[0]]
                for case, feeds in dec_cases(length).items():
                    got_f, got_l = sessions[fname].run(None, _to_numpy_inputs(feeds))
                    want_f, want_l = ref_dec[(length, case)]
                    where = f"{case}@L{length}"
                    checks.append(_compare(fname, "first_logits", where, got_f, want_f, atol, rtol))
                    checks.append(_compare(fname, "read_logprob", where, got_l, want_l, atol, rtol))
                    s_got = combine_scores(got_f, got_l, plan, plan.first_ids)
                    s_want = combine_scores(want_f, want_l, plan, plan.first_ids)
                    sa = ecfg.score_atol[prec]
                    checks.append(_compare(fname, "score", where, s_got, s_want, sa, 0.0))
            return checks

        def fail_on(checks: list[GraphCheck], prec: str) -> None:
            bad = [
                f"[{prec}] {c.graph} {c.output} ({c.case}): max|Δ| = {c.max_abs_diff:.3g} "
                f"> atol {c.atol:g} + rtol {c.rtol:g}·|ref|"
                for c in checks
                if not c.ok
            ]
            if bad:
                raise ExportValidationError(mname, bad)

        fp32_checks = validate(graphs, "fp32")
        fail_on(fp32_checks, "fp32")
        checks = fp32_checks
        if precision != "fp32":
            graphs = {f: convert_precision(m, precision) for f, m in graphs.items()}
            checks = validate(graphs, precision)
            fail_on(checks, precision)

        out = Path(out_dir)
        if out.exists():
            shutil.rmtree(out)
        (out / "onnx").mkdir(parents=True)
        _save({"vision.onnx": graphs["vision.onnx"]}, out / "onnx", "vision.onnx.data")
        _save({f: graphs[f] for f in dec_files.values()}, out / "onnx", "decoder.onnx.data")
        weight_bytes = onnx_weight_bytes(graphs["vision.onnx"]) + onnx_weight_bytes(
            graphs[dec_files[usable[0]]]
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    for f in _COPY:
        if (folder.path / f).is_file():
            shutil.copy2(folder.path / f, out / f)
    for f in (MEMBER_HINTS, TEST_PAIR_MARKER):
        if (folder.path / f).is_file():
            shutil.copy2(folder.path / f, out / f)
    pad_id = text_cfg.pad_token_id if text_cfg.pad_token_id is not None else 0
    meta = {
        "format": GRAPHS_FORMAT,
        "version": GRAPHS_VERSION,
        "model_type": folder.model_type,
        "source": folder.source,
        "precision": precision,
        "image_size": [g.height, g.width],
        "n_image_tokens": g.n_image_tokens,
        "hidden_size": hidden,
        "image_token_id": folder.image_token_id,
        "pad_id": int(pad_id),
        "first_ids": list(plan.first_ids),
        "answer_ids": {"unsafe": list(plan.unsafe_ids), "safe": list(plan.safe_ids)},
        "vision": "onnx/vision.onnx",
        "decoder": {
            "fixed_length": ecfg.decoder_fixed_length,
            "buckets": list(usable),
            "files": {int(k): f"onnx/{v}" for k, v in dec_files.items()},
        },
        "inputs": {"vision": ["pixel_values"], "decoder": _DEC_INPUTS},
        "outputs": {"vision": ["image_embeds"], "decoder": _DEC_OUTPUTS},
        "weight_bytes": int(weight_bytes),
        **quantizer_meta(graphs["vision.onnx"]),  # int4-trt: which quantizer made the graphs
        # resident: sessions stay loaded; on-demand: loaded to score, released after (members
        # then run one after the other when both do not fit in memory at once)
        "sessions": sessions,
        "exporter": ecfg.describe(),
        "max_abs_diff": {
            c.graph + ":" + c.output: float(c.max_abs_diff) for c in checks if c.output != "score"
        },
    }
    (out / GRAPHS_FILE).write_text(
        yaml.safe_dump(meta, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    files = tuple(sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()))
    return MemberExport(
        name=mname,
        path=out,
        model_type=folder.model_type,
        precision=precision,
        image_size=(g.height, g.width),
        n_image_tokens=g.n_image_tokens,
        buckets=tuple(usable),
        files=files,
        first_ids=tuple(plan.first_ids),
        unsafe_ids=tuple(plan.unsafe_ids),
        safe_ids=tuple(plan.safe_ids),
        weight_bytes=int(weight_bytes),
        template=template,
        prompt_hash=prompt_hash(cfg_s.prompt, template, folder.model_type),
        checks=tuple(checks),
        seconds=time.perf_counter() - t0,
    )
