"""The fused graph form's GELU: the exporter's decomposed GELU as one onnxruntime kernel.

The legacy exporter writes ``gelu(x, approximate="tanh")`` (Qwen3.5's vision blocks, SigLIP2's
MLPs) as nine elementwise nodes, torch's own decomposition (``symbolic_opset9.gelu``)::

    x2 = Mul(x, x); x3 = Mul(x, x2); m = Mul(0.044715, x3); s = Add(x, m)
    a = Mul(sqrt(2/pi), s); t = Tanh(a); u = Add(1, t); v = Mul(x, u); y = Mul(0.5, v)

and the erf GELU (Qwen3.5's projector) as five::

    d = Div(x, sqrt(2)); e = Erf(d); u = Add(e, 1); v = Mul(x, u); y = Mul(v, 0.5)

onnxruntime 1.32's optimizer fuses the erf form itself (into ``com.microsoft`` ``Gelu``) but not
this tanh form: on the real Qwen3.5-2B int8 bundle its nine passes took 166 ms of the vision
graph's 1.30 s (docs/limits.md). :func:`fuse_gelu` writes each as ``com.microsoft``
``FastGelu`` (``Gelu`` for the erf form), and a bias ``Add`` before a tanh GELU as FastGelu's
bias input. The erf form is written too, so the graph says what it computes before any optimizer
runs; it saves no time on CPU.

What is matched, and nothing else (a near miss is left as it is):

* the nodes above, each in the standard domain, each input order of ``Mul`` and ``Add``;
* every constant a one-element float32 tensor of rank 0 or 1 (an initializer or a
  ``Constant`` node) equal, as float32, to the float32 of its value (0.5, 0.044715,
  sqrt(2/pi), 1, sqrt(2)); ``x`` float32 where the graph says;
* every intermediate read by the next node of the pattern only, and no graph output;
* the bias: ``x = Add(p, b)`` with ``b`` a 1-D float32 initializer of ``n`` > 1 values
  (or an ``Identity`` of one, as the legacy exporter writes a tensor two parameters share),
  ``x`` read by the GELU only, and ``p``'s last axis shown to be ``n`` (by its producer: a
  MatMul-like node on a constant weight, or an elementwise node over such; FastGelu adds a bias
  of its input's last axis only, while ``Add`` would also broadcast a last axis of 1).

FastGelu computes ``0.5 · x · (1 + tanh(x · (0.0356774 · x² + 0.7978846)))`` with onnxruntime's
``Tanh`` kernel (MLAS): the same formula and tanh as the nine nodes, reassociated, so each value
moves by a few float32 roundings (tests/export/test_gelu.py measures it against numpy and the
tiny members' vision graphs against their unfused graphs). It is a ``com.microsoft`` operator:
only the fused graph form (export/fused.py) gets it; TensorRT's standard form never.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GELU_CONSTANTS", "GeluFusion", "fuse_gelu"]

#: the constants of the decomposed GELUs, as the exporter writes them (float32 of these)
GELU_CONSTANTS: dict[str, float] = {
    "half": 0.5,
    "kappa": 0.044715,
    "beta": math.sqrt(2.0 / math.pi),
    "one": 1.0,
    "sqrt2": math.sqrt(2.0),
}

#: nodes whose output's last axis is their constant weight's (input 1): N of ``(K, N)``
_MATMULS = frozenset({"MatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
#: elementwise nodes: their output's last axis is any input's that is > 1 (broadcasting)
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Relu", "Cast", "Identity", "Neg"})
#: how far back a last axis is looked for (the int8 epilogue before a bias is 3 nodes deep)
_LAST_AXIS_DEPTH = 8
_STANDARD = ("", "ai.onnx")


@dataclass(frozen=True)
class GeluFusion:
    """What :func:`fuse_gelu` wrote: ``fast_gelu`` FastGelu nodes (``biases`` of them with a
    bias folded in) and ``gelu`` Gelu nodes."""

    fast_gelu: int
    gelu: int
    biases: int

    @property
    def nodes(self) -> int:
        return self.fast_gelu + self.gelu


class _Graph:
    """The lookups a match needs: producers, readers, constants and last axes."""

    def __init__(self, graph: Any) -> None:
        from onnx import TensorProto

        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.readers: dict[str, list[Any]] = {}
        for n in graph.node:
            for i in n.input:
                if i:
                    self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in graph.output}
        self.inits = {t.name: t for t in graph.initializer}
        self.elem_type: dict[str, int] = {}
        self.shapes: dict[str, list[int | None]] = {}
        for vi in (*graph.input, *graph.output, *graph.value_info):
            tt = vi.type.tensor_type
            if tt.elem_type:  # 0: not said
                self.elem_type[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = [
                    d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim
                ]
        self._float = TensorProto.FLOAT

    def node(self, name: str, op: str) -> Any:
        """The standard-domain ``op`` node that writes ``name``, else None."""
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op and n.domain in _STANDARD else None

    def only_reader(self, name: str, node: Any) -> bool:
        """``name`` is read by ``node`` alone (once or twice) and is no graph output."""
        return name not in self.outputs and all(r is node for r in self.readers.get(name, []))

    def constant(self, name: str) -> float | None:
        """The value of a one-element float32 constant of rank 0 or 1 (an initializer or a
        Constant node; a higher rank could broadcast the GELU's output to more axes)."""
        from onnx import helper, numpy_helper

        t = self.inits.get(name)
        if t is None:
            n = self.node(name, "Constant")
            if n is None or len(n.attribute) != 1:
                return None
            a = n.attribute[0]
            if a.name == "value_float":
                return float(np.float32(a.f))
            if a.name != "value":
                return None
            t = helper.get_attribute_value(a)
        if t.data_type != self._float or int(np.prod(t.dims)) != 1 or len(t.dims) > 1:
            return None
        if t.data_location == 1:  # external: never a one-element tensor the exporter writes
            return None
        return float(numpy_helper.to_array(t).reshape(-1)[0])

    def is_const(self, name: str, key: str) -> bool:
        """``name`` is the float32 of :data:`GELU_CONSTANTS` ``[key]``, exactly."""
        v = self.constant(name)
        return v is not None and np.float32(v) == np.float32(GELU_CONSTANTS[key])

    def split(self, node: Any, key: str) -> str | None:
        """The other input of a two-input ``node`` whose one input is the constant ``key``."""
        if len(node.input) != 2:
            return None
        a, b = node.input
        if self.is_const(a, key):
            return b
        if self.is_const(b, key):
            return a
        return None

    def initializer(self, name: str) -> Any:
        """The initializer ``name`` is, directly or through ``Identity`` nodes (the legacy
        exporter writes one for a tensor two parameters share), else None."""
        for _ in range(_LAST_AXIS_DEPTH):
            if name in self.inits:
                return self.inits[name]
            n = self.node(name, "Identity")
            if n is None:
                return None
            name = n.input[0]
        return None

    def float32(self, name: str) -> bool:
        """``name`` is not known to be anything but float32."""
        t = self.inits.get(name)
        if t is not None:
            return t.data_type == self._float
        return self.elem_type.get(name, self._float) == self._float

    def last_axis(self, name: str, depth: int = 0) -> int | None:
        """``name``'s last axis where the graph shows it, else None."""
        shape = self.shapes.get(name)
        if shape and shape[-1]:
            return shape[-1]
        t = self.inits.get(name)
        if t is not None:
            return int(t.dims[-1]) if len(t.dims) else 1
        n = self.producer.get(name)
        if n is None or depth > _LAST_AXIS_DEPTH:
            return None
        if n.op_type in _MATMULS and len(n.input) > 1 and n.input[1] in self.inits:
            dims = self.inits[n.input[1]].dims
            return int(dims[-1]) if len(dims) >= 2 else None
        if n.op_type == "MatMulNBits":
            from onnx import helper

            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            return int(attrs["N"]) if "N" in attrs else None
        if n.op_type in _ELEMENTWISE and n.domain in _STANDARD:
            for i in n.input:
                d = self.last_axis(i, depth + 1) if i else None
                if d is not None and d > 1:
                    return d
        return None


def _other(node: Any, name: str) -> str | None:
    """The input of a two-input ``node`` that is not ``name`` (None: not read, or read twice)."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _tails(g: _Graph, y_node: Any) -> Iterator[tuple[str, Any, Any]]:
    """The common end of both GELUs, ``y = Mul(half, v)``, ``v = Mul(x, u)``, ``u = Add(...)``:
    each ``(x, u, v)`` it can be read as (``x`` either input of ``v``), each intermediate read
    by the next node only."""
    if y_node.op_type != "Mul" or y_node.domain not in _STANDARD:
        return
    v_name = g.split(y_node, "half")
    v = g.node(v_name, "Mul") if v_name else None
    if v is None or not g.only_reader(v_name, y_node):  # type: ignore[arg-type]
        return
    for x, u_name in (tuple(v.input), tuple(v.input)[::-1]):
        u = g.node(u_name, "Add")
        if u is not None and x != u_name and g.only_reader(u_name, v):
            yield x, u, v


def _match_tanh(g: _Graph, y_node: Any) -> tuple[str, list[Any]] | None:
    """``(x, nodes)`` when ``y_node`` is the last Mul of a tanh GELU of ``x``, else None."""
    for x, u, v in _tails(g, y_node):
        t_name = g.split(u, "one")
        t = g.node(t_name, "Tanh") if t_name else None
        if t is None or not g.only_reader(t_name, u):  # type: ignore[arg-type]
            continue
        a = g.node(t.input[0], "Mul")
        s_name = g.split(a, "beta") if a is not None and g.only_reader(t.input[0], t) else None
        s = g.node(s_name, "Add") if s_name else None
        if s is None or not g.only_reader(s_name, a):  # type: ignore[arg-type]
            continue
        m_name = _other(s, x)
        m = g.node(m_name, "Mul") if m_name else None
        if m is None or not g.only_reader(m_name, s):  # type: ignore[arg-type]
            continue
        x3_name = g.split(m, "kappa")
        x3 = g.node(x3_name, "Mul") if x3_name else None
        if x3 is None or not g.only_reader(x3_name, m):  # type: ignore[arg-type]
            continue
        x2_name = _other(x3, x)
        x2 = g.node(x2_name, "Mul") if x2_name else None
        if x2 is None or not g.only_reader(x2_name, x3) or list(x2.input) != [x, x]:  # type: ignore[arg-type]
            continue
        if not g.float32(x):
            continue
        return x, [x2, x3, m, s, a, t, u, v, y_node]
    return None


def _match_erf(g: _Graph, y_node: Any) -> tuple[str, list[Any]] | None:
    """``(x, nodes)`` when ``y_node`` is the last Mul of an erf GELU of ``x``, else None."""
    for x, u, v in _tails(g, y_node):
        e_name = g.split(u, "one")
        e = g.node(e_name, "Erf") if e_name else None
        if e is None or not g.only_reader(e_name, u):  # type: ignore[arg-type]
            continue
        d = g.node(e.input[0], "Div")
        if d is None or not g.only_reader(e.input[0], e) or len(d.input) != 2:
            continue
        if d.input[0] != x or not g.is_const(d.input[1], "sqrt2") or not g.float32(x):
            continue
        return x, [d, e, u, v, y_node]
    return None


def _bias(g: _Graph, x: str, gelu_nodes: list[Any]) -> tuple[str, str, Any] | None:
    """``(p, b, add)`` when ``x = Add(p, b)`` can be FastGelu's input and bias (module doc)."""
    add = g.node(x, "Add")
    if add is None or len(add.input) != 2 or x in g.outputs:
        return None
    if any(r not in gelu_nodes for r in g.readers.get(x, [])):
        return None
    for p, b in (tuple(add.input), tuple(add.input)[::-1]):
        t = g.initializer(b)
        if t is None or p == b or g.initializer(p) is not None:
            continue
        if t.data_type != g._float or len(t.dims) != 1 or t.dims[0] <= 1:
            continue
        if g.last_axis(p) == t.dims[0] and g.float32(p):
            return p, b, add
    return None


def fuse_gelu(model: Any) -> GeluFusion:
    """Each decomposed GELU of ``model``'s main graph (see the module doc) as one
    ``com.microsoft`` ``FastGelu`` (tanh form, with a preceding bias ``Add`` folded in) or
    ``Gelu`` (erf form), in place; the ``com.microsoft`` opset is imported where one was
    written. Constants that only the replaced nodes read are dropped. Returns the counts.

    Called by export/onnx.py on a fused graph after its precision's conversion (so a bias that
    the conversion splits from a Gemm is folded too); never on a standard graph."""
    from onnx import helper
    from spotstop.export.fused import FUSED_DOMAIN, FUSED_DOMAIN_VERSION

    graph = model.graph
    g = _Graph(graph)
    replace: dict[int, Any] = {}  # id(last Mul) → its fused node
    dropped: set[int] = set()
    fast = erf = biases = 0
    for n in graph.node:
        if id(n) in dropped:
            continue
        hit = _match_tanh(g, n)
        kind = "FastGelu"
        if hit is None:
            hit, kind = _match_erf(g, n), "Gelu"
        if hit is None:
            continue
        x, nodes = hit
        if any(id(m) in dropped or id(m) in replace for m in nodes):
            continue
        inputs = [x]
        name = n.name or n.output[0]
        if kind == "FastGelu":
            bias = _bias(g, x, nodes)
            if bias is not None:
                p, b, add = bias
                inputs = [p, b]
                dropped.add(id(add))
                biases += 1
            fast += 1
        else:
            erf += 1
        replace[id(n)] = helper.make_node(
            kind, inputs, [n.output[0]], name=f"{name}/{kind}", domain=FUSED_DOMAIN
        )
        dropped.update(id(m) for m in nodes if m is not n)
    if not replace:
        return GeluFusion(0, 0, 0)
    gone = [n for n in graph.node if id(n) in dropped or id(n) in replace]
    kept = [replace.get(id(n), n) for n in graph.node if id(n) not in dropped]
    # the constants the replaced nodes read that nothing reads now: Constant nodes and
    # one-element initializers (a graph input of that name stays)
    theirs = {i for n in gone for i in n.input if i}
    read = {i for n in kept for i in n.input if i} | {o.name for o in graph.output}
    unread = theirs - read - {i.name for i in graph.input}
    kept = [n for n in kept if not (n.op_type == "Constant" and set(n.output) <= unread)]
    del graph.node[:]
    graph.node.extend(kept)
    for t in [t for t in graph.initializer if t.name in unread and int(np.prod(t.dims)) == 1]:
        graph.initializer.remove(t)
    if not any(o.domain == FUSED_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, FUSED_DOMAIN_VERSION))
    return GeluFusion(fast, erf, biases)
