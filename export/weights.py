"""How an exported graph stores its weights: transposes folded, a tied table stored once.

* :func:`fold_weight_transposes`: ``MatMul(x, Transpose(W))`` (the dynamo exporter's
  ``Linear``) reads the transposed initializer instead, so weight-only quantizers see it.
* A tied output layer (word embeddings = output layer) is stored ONCE: at export
  (:func:`tie_output_layer`), the token ``Gather`` and a ``Gemm(transB=1)`` read the same
  table (fp32/fp16); for int8/int4 (:func:`untie_for_quantizer`, then
  :func:`gather_from_quantized`), the table is the output layer's ``MatMulNBits`` blocks, which
  ``GatherBlockQuantized`` reads for the token embeddings too.
* :func:`embeddings_to_fp16`: float32 token-embedding tables of int8/int4 graphs stored as
  float16.

Every function here reads and writes weights through a :class:`WeightIO`: by default
(:class:`WeightIO`) the weights live in the ModelProto; :class:`DiskWeights` keeps them in
files (a large member's streamed export, export/memory.py). The python protobuf runtime (upb)
frees nothing of a message until the whole model is freed: a weight replaced or removed in a
ModelProto still takes its memory, so a pass over a 10 GiB graph held in memory would need
10 GiB more. With :class:`DiskWeights` the ModelProto holds only references: a weight is read
from its file when a pass needs it and a new one is appended to the output file at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DiskWeights",
    "WeightIO",
    "default_opset",
    "embeddings_to_fp16",
    "fold_weight_transposes",
    "gather_from_quantized",
    "gemms_to_matmuls",
    "rewrite_weight_matmuls",
    "tie_output_layer",
    "untie_for_quantizer",
]


#: name prefix of the nodes :func:`tie_output_layer` writes (found again by the int8/int4 path)
_TIED = "tied_output_layer"


class WeightIO:
    """Weights kept in the ModelProto itself (the default; small graphs)."""

    def read(self, t: Any) -> np.ndarray:
        """The initializer ``t`` as an array."""
        from onnx import numpy_helper

        return numpy_helper.to_array(t)

    def add(self, model: Any, arr: np.ndarray, name: str) -> Any:
        """Append ``arr`` to the model's initializers as ``name``; return the TensorProto."""
        from onnx import numpy_helper

        model.graph.initializer.append(numpy_helper.from_array(arr, name))
        return model.graph.initializer[-1]

    def add_tensor(self, model: Any, t: Any) -> Any:
        """Append a ready TensorProto (e.g. packed INT4); return the model's copy."""
        model.graph.initializer.append(t)
        return model.graph.initializer[-1]


class DiskWeights(WeightIO):
    """Weights in files: read from ``base_dir`` (external data), new ones appended to a
    scratch file beside ``out``.

    :meth:`finish` writes ``out``: every weight the graphs still read (from ``base_dir``, the
    scratch file, or inline), one at a time, 64-byte aligned as onnx's own writer does for
    mmap, and nothing else (a weight that a later pass replaced is not copied); the scratch
    file is removed. The saved graphs need only ``out`` beside them.
    """

    #: tensors below this many bytes stay inside the graph
    MIN_BYTES = 1024

    def __init__(self, base_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
        self.base_dir = str(base_dir)
        self.out = Path(out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.scratch = self.out.with_name(self.out.name + ".scratch")
        self._f = open(self.scratch, "wb")  # noqa: SIM115  (closed by finish / close)
        self._written: set[str] = set()  # initializers whose bytes are in the scratch file

    def read(self, t: Any) -> np.ndarray:
        from onnx import numpy_helper

        if t.name in self._written:
            self._f.flush()
            return numpy_helper.to_array(t, str(self.scratch.parent))
        return numpy_helper.to_array(t, self.base_dir)  # does not load into ``t`` (onnx>=1.16)

    @staticmethod
    def _append(f: Any, raw: Any) -> tuple[int, int]:
        offset = f.tell()
        pad = (-offset) % 64
        f.write(b"\0" * pad)
        f.write(raw)
        return offset + pad, len(raw)

    @staticmethod
    def _reference(t: Any, location: str, offset: int, length: int) -> None:
        import onnx

        t.ClearField("raw_data")
        del t.external_data[:]
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        t.data_location = onnx.TensorProto.EXTERNAL

    def _scratch(self, t: Any, raw: Any) -> None:
        self._reference(t, self.scratch.name, *self._append(self._f, raw))
        self._written.add(t.name)

    def add(self, model: Any, arr: np.ndarray, name: str) -> Any:
        from onnx import TensorProto, helper

        arr = np.ascontiguousarray(arr)
        if arr.nbytes < self.MIN_BYTES:
            return super().add(model, arr, name)
        t = TensorProto()
        t.name = name
        t.dims.extend(arr.shape)
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        self._scratch(t, arr.reshape(-1).view(np.uint8).data)
        model.graph.initializer.append(t)
        return model.graph.initializer[-1]

    def add_tensor(self, model: Any, t: Any) -> Any:
        if not t.HasField("raw_data") or len(t.raw_data) < self.MIN_BYTES:
            return super().add_tensor(model, t)
        stub = type(t)()
        stub.CopyFrom(t)  # a standalone copy: its bytes are dropped with it
        self._scratch(stub, t.raw_data)
        model.graph.initializer.append(stub)
        return model.graph.initializer[-1]

    def close(self) -> None:
        self._f.close()
        self.scratch.unlink(missing_ok=True)

    def __enter__(self) -> DiskWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def finish(self, models: list[Any]) -> None:
        """Write ``out``: every weight the ``models`` read from a file, or hold inline with at
        least :data:`MIN_BYTES`, one tensor at a time; then drop the scratch file."""
        from onnx.external_data_helper import uses_external_data

        self._f.flush()
        with open(self.out, "wb") as out:
            for model in models:
                for t in model.graph.initializer:
                    big = t.HasField("raw_data") and len(t.raw_data) >= self.MIN_BYTES
                    if not (big or uses_external_data(t)):
                        continue
                    raw = np.ascontiguousarray(self.read(t)).reshape(-1).view(np.uint8).data
                    self._reference(t, self.out.name, *self._append(out, raw))
                    self._written.discard(t.name)
                    del raw
        self.close()


def default_opset(model: Any) -> int:
    """The model's opset of the default ONNX domain (0 when it imports none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _users(model: Any) -> dict[str, int]:
    users: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            users[i] = users.get(i, 0) + 1
    for o in model.graph.output:
        users[o.name] = users.get(o.name, 0) + 1
    return users


#: the scoring graphs' image ends (export/exporters.py): the vision graph reads the pixels from
#: ``pixel_values`` and writes what the decoder reads to ``image_embeds``
PIXELS_INPUT, IMAGE_OUTPUT = "pixel_values", "image_embeds"
#: how many weightless ops an image end is looked for through
_WEIGHTLESS_DEPTH = 64
#: ops that are a layer of their own (a weight the quantizers do not take: a Conv's, a MatMul
#: on a computed weight): an image end is not looked for behind them
_LAYERS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulNBits"})
#: ops whose output is a shape, not values
_SHAPE_ONLY = frozenset({"Shape", "Size", "ConstantOfShape", "NonZero"})


def image_end_weights(model: Any) -> frozenset[str]:
    """The weights of the vision graph's first and last layers, which every quantized
    precision leaves float32: the ``MatMul`` weights that read :data:`PIXELS_INPUT` through
    weightless ops only (the patch embedding) and those whose output reaches
    :data:`IMAGE_OUTPUT` through weightless ops only (the projector's last layer). A layer the
    quantizers do not take (a Conv) ends the search on its side. Empty for a graph without
    those names (a decoder).

    Why (measured on the trained tiny pair, docs/export.md): re-quantizing the image's pixels
    per patch, and the embeddings the decoder reads, moved single scenes' scores by up to 0.65
    nats at int8 while every layer's own output error stayed under 1 %."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}

    def weight_of(node: Any) -> Any:
        return weight_initializer(node, inits)

    consumers: dict[str, list[Any]] = {}
    producer: dict[str, Any] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n

    def walk(start: str, forward: bool) -> set[str]:
        found: set[str] = set()
        seen: set[str] = set()
        todo = [(start, 0)]
        while todo:
            name, depth = todo.pop()
            if name in seen or depth > _WEIGHTLESS_DEPTH:
                continue
            seen.add(name)
            if forward:
                nodes = consumers.get(name, [])
            else:
                nodes = [producer[name]] if name in producer else []
            for n in nodes:
                if n.op_type in _SHAPE_ONLY:
                    continue  # a shape (and what is computed from it) is not the image
                t = weight_of(n)
                if t is not None:
                    found.add(t.name)
                if t is not None or n.op_type in _LAYERS:
                    continue  # a layer: the image end is this one, not one behind it
                todo += [(x, depth + 1) for x in (n.output if forward else n.input) if x]
        return found

    names_in = {i.name for i in g.input}
    names_out = {o.name for o in g.output}
    first = walk(PIXELS_INPUT, True) if PIXELS_INPUT in names_in else set()
    last = walk(IMAGE_OUTPUT, False) if IMAGE_OUTPUT in names_out else set()
    return frozenset(first | last)


def weight_initializer(node: Any, inits: Mapping[str, Any]) -> Any:
    """The weight of a ``MatMul`` whose second input is a rank-2 float initializer, else None."""
    from onnx import TensorProto

    w = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else ""
    t = inits.get(w)
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    return None if t is None or t.data_type not in floats or len(t.dims) != 2 else t


def rewrite_weight_matmuls(
    model: Any, rewrite: Callable[[Any, Any], list[Any] | None], progress: str | None = None
) -> int:
    """Replace, in place, every ``MatMul`` whose second input is a rank-2 float initializer
    (a weight) by the nodes ``rewrite(node, weight)`` returns (the weight-only quantizers:
    export/nbits.py, export/quant.py, export/int8.py); ``rewrite`` returning None leaves the
    node as it is. A weight nothing reads any more is dropped. Returns how many distinct
    weights were visited. ``progress``: a bar of that name over the
    weights on stderr (GPTQ takes minutes per member at the real size)."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users = _users(model)

    def weight(node: Any) -> Any:
        return weight_initializer(node, inits)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        n = len({t.name for t in map(weight, g.node) if t is not None})
        bar = tqdm(total=n, desc=progress, unit="weight", leave=False)
    seen: set[str] = set()
    new_nodes: list[Any] = []
    for node in g.node:
        t = weight(node)
        if t is None:
            new_nodes.append(node)
            continue
        out = rewrite(node, t)
        if bar is not None and t.name not in seen:
            bar.update()
        seen.add(t.name)
        if out is None:  # left as it is (its weight too)
            new_nodes.append(node)
            continue
        new_nodes += out
    if bar is not None:
        bar.close()
    del g.node[:]
    g.node.extend(new_nodes)
    users = _users(model)
    for w in seen:
        if users.get(w, 0) == 0:
            g.initializer.remove(inits[w])
    return len(seen)


def _drop_unused_initializers(model: Any) -> None:
    users = _users(model)
    for t in [t for t in model.graph.initializer if users.get(t.name, 0) == 0]:
        model.graph.initializer.remove(t)


def fold_weight_transposes(model: Any, io: WeightIO | None = None) -> Any:
    """Replace ``Transpose(initializer)`` by the transposed initializer, in place.

    The dynamo exporter (run without onnxscript's optimizer, which more than doubles its time)
    writes every ``Linear`` as ``MatMul(x, Transpose(W))``; weight-only quantizers only see a
    MatMul whose weight is a constant, so the transposes are folded here first.
    """
    io = io or WeightIO()
    inits = {t.name: t for t in model.graph.initializer}
    users = _users(model)
    keep = []
    for node in model.graph.node:
        src = node.input[0] if node.input else ""
        if node.op_type == "Transpose" and src in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            arr = io.read(inits[src])
            io.add(model, np.ascontiguousarray(np.transpose(arr, perm)), node.output[0])
            del arr
            users[src] -= 1
            if users[src] == 0:
                model.graph.initializer.remove(inits[src])
            continue
        keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


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


def tie_output_layer(model: Any, io: WeightIO | None = None) -> Any:
    """Keep ONE copy of a tied output layer (word embeddings = output layer), in place.

    Exporters write ``x @ W.T`` on a tied table ``W`` as ``MatMul(x, Transpose(W))`` (dynamo)
    or ``MatMul(x, Wᵀ)`` with ``Wᵀ`` a constant-folded SECOND initializer (legacy), next to the
    ``Gather(W, input_ids)`` of the token embeddings: two copies of vocab × hidden weights (and
    a runtime would materialize a constant ``Transpose`` too). Each such MatMul becomes
    ``Reshape(x, [-1, hidden]) → Gemm(·, W, transB=1) → Reshape(·, x.shape[:-1] + [vocab])`` on
    the very initializer the Gather reads. A folded copy is recognised only when it equals
    ``Wᵀ`` exactly. Returns ``model``; a graph without tied weights is left as it is.
    """
    from onnx import TensorProto, helper

    io = io or WeightIO()
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
                    arrays[name] = io.read(e)
                if np.array_equal(io.read(t), arrays[name].T):
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


def gemms_to_matmuls(model: Any, io: WeightIO | None = None) -> int:
    """``Gemm(A, B[, C])`` with a rank-2 float initializer ``B`` (alpha = beta = 1, no transA)
    as ``MatMul(A, B')`` (+ ``Add(·, C)``), ``B' = Bᵀ`` when ``transB``, in place; returns how
    many Gemms were rewritten.

    The legacy exporter writes a Linear on a 2-D input as Gemm (the Qwen3.5 vision tower's
    every Linear), and the weight-only quantizers read MatMuls only: without this, int8/int4
    left those weights float32 (about 1.3 GiB of Qwen3.5-2B's vision tower). A tied output
    layer's Gemm (:func:`tie_output_layer`) is turned back by :func:`untie_for_quantizer`.
    """
    from onnx import TensorProto, helper

    io = io or WeightIO()
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users = _users(model)
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
    transposed: dict[str, str] = {}
    new_nodes: list[Any] = []
    count = 0
    for node in g.node:
        t = inits.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0
        plain = plain and attrs.get("beta", 1.0) == 1.0
        if t is None or not plain or len(t.dims) != 2 or t.data_type not in floats:
            new_nodes.append(node)
            continue
        b = t.name
        w = b
        if attrs.get("transB", 0):
            if b not in transposed:
                transposed[b] = f"{b}_gemmT"
                io.add(model, np.ascontiguousarray(io.read(t).T), transposed[b])
            w = transposed[b]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        y = node.output[0]
        out = f"{y}_matmul" if bias else y
        new_nodes.append(helper.make_node("MatMul", [node.input[0], w], [out], name=node.name))
        if bias:
            new_nodes.append(helper.make_node("Add", [out, bias], [y], name=f"{node.name}_bias"))
        users[b] -= 1
        count += 1
    if count:
        for b, n in users.items():
            if n == 0 and b in inits and b in transposed:
                g.initializer.remove(inits[b])
        del g.node[:]
        g.node.extend(new_nodes)
    return count


def untie_for_quantizer(model: Any, io: WeightIO | None = None) -> dict[str, str]:
    """Give each tied ``Gemm`` of :func:`tie_output_layer` back a MatMul on ``Wᵀ``, in place.

    The int8/int4 quantizer (export/nbits.py) only quantizes a MatMul with a constant weight; the transposed
    copy lives only until :func:`gather_from_quantized` points the Gather at the quantized
    blocks. Returns {MatMul output: table}.
    """
    from onnx import helper

    io = io or WeightIO()
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
            io.add(model, np.ascontiguousarray(io.read(tables[table]).T), t_name)
            names.add(t_name)
        new_nodes.append(
            helper.make_node("MatMul", [node.input[0], t_name], list(node.output), name=node.name)
        )
        tied[node.output[0]] = table
    if tied:
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
    return tied


def gather_from_quantized(
    model: Any, tied: dict[str, str], bits: int, io: WeightIO | None = None, *, residual: bool
) -> Any:
    """Token embeddings read from the quantized output layer's table, in place.

    After the int8/int4 quantizer (export/nbits.py), the tied output layer is ``MatMulNBits`` with packed
    blocks ``B`` (vocab, k_blocks, blob) and ``scales`` (vocab, k_blocks): the table itself,
    quantized row by row along hidden. Every ``Gather`` on the float table becomes
    onnxruntime's ``GatherBlockQuantized`` on the same ``B`` (uint8, at the bits the output
    layer's ``MatMulNBits`` has, which an int4 export may keep at 8, export/mixed.py; ``bits``
    when the node does not say; symmetric: the same default zero point), whose rank-3 form
    needs its scales as (vocab, k_blocks, 1), a copy 1/32 (int8) or 1/16 (int4) the size of
    ``B``; with ``residual`` (the precision's ``table_residual``), plus a second
    ``GatherBlockQuantized`` on :func:`residual_blocks` (the 8-bit codes of what ``B`` rounded
    off, in the same blocks), the two rows added: every token's embedding within 1/128 of
    ``B``'s step, where the output layer keeps ``B``'s. The token embeddings enter every
    position's residual stream unnormalised, and ``B``'s rounding alone (8-bit blocks of 128:
    0.6 % of a row) moved Qwen3.5-2B's scores at the real size up to 0.23 of int8's 0.25
    tolerance (docs/limits.md). The float table is dropped.
    """
    from onnx import TensorProto, helper

    if not tied:
        return model
    io = io or WeightIO()
    inits = {t.name: t for t in model.graph.initializer}
    # table → (B, scales3, block_size, bits, residual B, residual scales3 ("": none))
    quant: dict[str, tuple[str, str, int, int, str, str]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and node.output[0] in tied:
            table = tied[node.output[0]]
            b, s = node.input[1], node.input[2]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            bs, nbits = int(attrs["block_size"]), int(attrs.get("bits", bits))
            s3 = s + "_gather"
            if s3 not in inits:
                arr = io.read(inits[s])
                inits[s3] = io.add(model, arr.reshape(*arr.shape, 1), s3)
            rb, rs3 = (b + "_residual", s + "_residual_gather") if residual else ("", "")
            if residual and rb not in inits:
                r_codes, r_scales = residual_blocks(
                    io.read(inits[table]), io.read(inits[b]), io.read(inits[s]), nbits, bs
                )
                inits[rb] = io.add(model, r_codes, rb)
                inits[rs3] = io.add(model, r_scales.reshape(*r_scales.shape, 1), rs3)
            quant[table] = (b, s3, bs, nbits, rb, rs3)
    new_nodes: list[Any] = []
    for k, node in enumerate(model.graph.node):
        table = node.input[0] if node.op_type == "Gather" and node.input else ""
        if table not in quant:
            new_nodes.append(node)
            continue
        b, s3, bs, nbits, rb, rs3 = quant[table]
        hidden = int(inits[table].dims[1])
        nb = int(inits[b].dims[1])
        p = f"{_TIED}/gather{k}"
        idx, y = node.input[1], node.output[0]
        padded = nb * bs != hidden
        model.graph.initializer.extend(
            [helper.make_tensor(f"{p}/width", TensorProto.INT64, [1], [nb * bs])]
        )
        new_nodes.append(
            helper.make_node(
                "GatherBlockQuantized",
                [b, idx, s3],
                [f"{p}/coarse" if rb else f"{p}/blocks"],
                name=f"{p}/gbq",
                domain="com.microsoft",
                gather_axis=0,
                quantize_axis=2,
                block_size=bs,
                bits=nbits,
            )
        )
        if rb:  # the rounding residual's rows added
            new_nodes += [
                helper.make_node(
                    "GatherBlockQuantized",
                    [rb, idx, rs3],
                    [f"{p}/residual"],
                    name=f"{p}/gbq_residual",
                    domain="com.microsoft",
                    gather_axis=0,
                    quantize_axis=2,
                    block_size=bs,
                    bits=8,
                ),
                helper.make_node(
                    "Add", [f"{p}/coarse", f"{p}/residual"], [f"{p}/blocks"], name=f"{p}/blocks"
                ),
            ]
        new_nodes += [
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


#: vocabulary rows :func:`residual_blocks` converts at a time (hidden 2048: 128 MiB of float32)
_RESIDUAL_ROWS = 16384


def residual_blocks(
    table: np.ndarray, packed: np.ndarray, scales: np.ndarray, bits: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit blocks of what a tied output layer's ``MatMulNBits`` blocks rounded off the
    token table: ``table`` (vocab, hidden) float, ``packed`` (vocab, k_blocks, blob) and
    ``scales`` (vocab, k_blocks) its blocks at ``bits`` (export/nbits.py's layout) →
    (codes uint8 (vocab, k_blocks, block_size), scales float32 (vocab, k_blocks)) of
    ``table − deq(packed)`` in the same blocks, symmetric (zero point 128), by onnxruntime's own
    kernel. A row read as ``deq(packed) + deq(codes)`` is within one residual step of
    ``table``'s: onnxruntime's symmetric blocks take the step ``max |x| / 128`` and clip a
    block's largest positive value to code 127, so an error reaches one step, and the
    residual, itself within one coarse step, has a step at most 1/128 of the coarse one."""
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks

    vocab, hidden = table.shape
    if packed.shape[0] != vocab or scales.shape[0] != vocab:
        raise ValueError(
            f"the output layer's blocks hold {packed.shape[0]} rows; the table has {vocab}."
        )
    k_blocks = scales.shape[1]
    codes = np.empty((vocab, k_blocks, block_size), np.uint8)
    out_scales = np.empty((vocab, k_blocks), np.float32)
    for lo in range(0, vocab, _RESIDUAL_ROWS):
        hi = min(vocab, lo + _RESIDUAL_ROWS)
        coarse = dequantize_nbits(packed[lo:hi], scales[lo:hi], bits, hidden)  # (hidden, rows)
        resid = np.asarray(table[lo:hi], np.float32).T - coarse
        c, sc = nbits_blocks(resid, 8, block_size)
        codes[lo:hi], out_scales[lo:hi] = c, sc
    return codes, out_scales


def embeddings_to_fp16(model: Any, io: WeightIO | None = None) -> Any:
    """Store float32 tables read by Gather (token embeddings) as float16 + a Cast."""
    from onnx import TensorProto, helper

    io = io or WeightIO()
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
            half = io.add(model, io.read(t).astype(np.float16), w + "_fp16")
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
