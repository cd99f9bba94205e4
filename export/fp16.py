"""fp16 graphs: a float32 ONNX graph converted to float16 with float32 islands.

:func:`to_fp16` is onnxruntime's float16 converter with float32 inputs and outputs kept, and
the parts that the transformers code itself computes in float32 kept float32 behind Casts:
the normalisers (``Softmax``/``LogSoftmax``), RMSNorm/LayerNorm, the rotary embedding's angles
and cos/sin, the Gated-DeltaNet decay and delta rule (:func:`fp32_nodes`). The islands are taken
out of the graph, the rest is converted (linear in the graph's size, where the converter's own
block list is quadratic), and the islands are put back with one Cast per crossing
(:func:`_convert_with_fp32_islands`); float16 round trips between float32 nodes are removed
(:func:`_join_fp32_regions`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["FP16_FP32_OPS", "fp32_nodes", "to_fp16"]


#: op types computed in float32 inside fp16 graphs, besides onnxruntime's default block list
#: (which already keeps Range, CumSum, Min, Max, TopK ... in float32): the normalisers, as the
#: transformers models compute them (``softmax(..., dtype=torch.float32)``,
#: ``log_softmax(logits.float())``), and LayerNorm, whose variance overflows float16.
FP16_FP32_OPS: tuple[str, ...] = ("Softmax", "LogSoftmax", "LayerNormalization")
#: module classes whose own code stays float32 (the transformers code upcasts there itself:
#: RMSNorm's ``x.float()``; an architecture's own, its export config's ``fp32_modules``, e.g.
#: Gated-DeltaNet's decay and the chunked delta rule's ``.to(torch.float32)``); their children
#: (the Linear projections, the conv) do not.
#: The rotary embedding too: transformers computes ``position · inv_freq`` and its cos/sin in
#: float32 (``position_ids.float() * inv_freq.float()``, autocast off) and hands cos/sin to the
#: attention in the model's dtype. In float16 the angle is rounded to float16's spacing at the
#: position (0.125 rad at positions 128-255): cos/sin off by 1 % instead of float16's 0.05 %,
#: which moved the trained tiny pair's scores by up to 0.2 nats (torch at float16: 0.017).
_FP32_NORMS = ("RMSNorm", "LayerNorm", "RotaryEmbedding")
_FP32_CHILD_OK = re.compile(r"RMSNorm|LayerNorm")  # everything under a norm stays float32
#: legacy (TorchScript) graphs carry no module metadata; their node names are module paths
#: (``/language_model/rotary_emb/Cos``)
_NORM_SCOPE = re.compile(r"norm|rotary", re.IGNORECASE)


def _fp32_modules() -> re.Pattern[str]:
    from spotstop.export.configs import EXPORT_CONFIGS

    own = (m for c in EXPORT_CONFIGS.values() for m in c.fp32_modules)
    names = dict.fromkeys((*_FP32_NORMS, *own))
    return re.compile(rf"({'|'.join(map(re.escape, names))})\w*$")


def fp32_nodes(model: Any) -> list[str]:
    """Names of the nodes an fp16 graph keeps in float32 (numerics of the fp32 reference).

    Dynamo graphs: from each node's ``pkg.torch.onnx.class_hierarchy`` (the module classes
    that produced it, outermost first): nodes under an RMSNorm/LayerNorm module, nodes in a
    rotary embedding module (the angles and their cos/sin), and nodes in a Gated-DeltaNet
    module's own code (decay ``exp``/``softplus``, the chunked delta rule with its within-chunk
    ``exp`` of decay differences and its recurrent state) but not in its Linear/Conv children,
    which are the bulk of the work and stay float16. Legacy graphs: nodes under a module path
    segment named ``*norm*`` or ``*rotary*``. Unnamed nodes are named here.
    """
    fp32_modules = _fp32_modules()
    names = []
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}_unnamed"
        meta = {p.key: p.value for p in node.metadata_props}
        hierarchy = meta.get("pkg.torch.onnx.class_hierarchy")
        if hierarchy is not None:
            classes = [c.strip(" '\"") for c in hierarchy.strip("[]").split(",")][:-1]
            if any(_FP32_CHILD_OK.search(c) for c in classes) or (
                classes and fp32_modules.search(classes[-1])
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
    :func:`fp32_nodes`) stay float32 behind Casts. Weights of the float16 parts are stored as
    float16.
    """
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    _scalar_constants_as_tensors(model)
    # ops with inputs fixed to float32 (the converter's mixed-type special cases) stay float32
    block_ops = [*DEFAULT_OP_BLOCK_LIST, *FP16_FP32_OPS, "Resize", "GroupNorm", "SkipGroupNorm"]
    fp32 = set(fp32_nodes(model))
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
