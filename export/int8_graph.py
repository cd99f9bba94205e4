"""The ONNX nodes an int8 layer of export/int8.py is written as, and the small models built
from them.

* :func:`per_token_quantize`: an activation quantized per row (token), its codes, row steps and
  midpoints (the module doc of export/int8.py; its numpy twin is export/int8_math.py's
  ``dequantize_activations_per_token``);
* :func:`rotate_nodes`: an activation multiplied block by block by a rotation constant;
* :class:`ReadRows`: a decoder's exact reads (the rows the score reads, their residual
  multiplied too), with :func:`reached` and :func:`read_out`, which find the tensors that hold
  one row per token;
* :func:`per_token_codes_model`: the per-token quantization alone as a model (tests,
  ``bench/fused_ops.py``); :func:`int8_probe_model`: the host probe the runtime ships
  (``python -m spotstop.export.int8_graph --write-probe`` writes it).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
from spotstop.export.int8_math import (
    HALF,
    LEVELS,
    ROW_FLOOR,
    SYM_LEVELS,
    WEIGHT_FORMS,
    stored_codes,
)
from spotstop.export.weights import WeightIO
from spotstop.guard.backends._int8_probe import W_ZERO

__all__ = [
    "READ_INPUTS",
    "ReadRows",
    "int8_probe_model",
    "per_token_codes_model",
    "per_token_quantize",
    "reached",
    "read_out",
    "rotate_nodes",
]
#: the decoder graph's inputs that say which rows the score reads (guard/backends/_graphs.py's
#: ``DECODER_INPUTS``): the token ids (their shape gives the rows), the last prompt position and
#: the answer tokens' positions
READ_INPUTS = ("input_ids", "last_index", "read_index")


def rotate_nodes(a: str, rot: str, rows: str, out: list[Any]) -> str:
    """Append the nodes that multiply each block of the activation ``a``'s channels by the
    constant ``rot`` (b, b): reshaped to ``rows`` (the constant (−1, b)), one float32
    ``MatMul``, reshaped back; returns the rotated activation's name."""
    from onnx import helper

    tag = f"{a}_{rot}"
    mk = helper.make_node
    out += [
        mk("Shape", [a], [f"{tag}_shape"], name=f"{tag}_shape"),
        mk("Reshape", [a, rows], [f"{tag}_rows"], name=f"{tag}_rows"),
        mk("MatMul", [f"{tag}_rows", rot], [f"{tag}_mm"], name=f"{tag}_mm"),
        mk("Reshape", [f"{tag}_mm", f"{tag}_shape"], [tag], name=tag),
    ]
    return tag


def per_token_quantize(
    a: str,
    consts: dict[str, str],
    out: list[Any],
    opset: int,
    *,
    symmetric: bool = False,
    rows: bool = False,
    flat_in: bool = False,
    zps: str = "",
) -> tuple[str, str, str]:
    """Append to ``out`` the nodes that quantize the activation ``a`` per row (the module doc's
    per-token form, :func:`dequantize_activations_per_token`'s arithmetic); returns the names
    of its uint8 codes, its row steps ``σ`` and its row midpoints ``μ`` (both …, 1).
    ``symmetric``: the form without a midpoint (:func:`dequantize_activations_symmetric`:
    ``σ = max(max a, −min a, 2e-30) / 127``, the codes of ``a`` itself; ``μ`` is "").
    ``rows``: the codes as (rows, K), as the exact reads multiply them, not in ``a``'s shape;
    ``flat_in``: ``a`` is (rows, K) already. ``zps``: the rows' zero points (128 each, one a
    row) where the graph made them once for every activation of that many rows (else made
    here). The three take out nodes, not arithmetic: the codes are the same.

    From opset 13 the codes are one per-axis ``QuantizeLinear`` of ``a − μ`` flattened to
    (rows, K) with the rows' steps and a zero point of 128 each (``Round`` half to even after
    the division, saturated to uint8: the same codes as ``Cast(Round((a − μ) / σ) + 128)``, in
    one pass instead of four); below 13, those four nodes."""
    from onnx import TensorProto, helper

    def n(op: str, ins: list[str], tag: str, **kw: Any) -> str:
        name = f"{a}_tok8{'s' if symmetric else ''}_{tag}"
        out.append(helper.make_node(op, ins, [name], name=name, **kw))
        return name

    def reduce(op: str, tag: str) -> str:
        if opset >= 18:
            return n(op, [a, consts["axes"]], tag, keepdims=1)
        return n(op, [a], tag, axes=[-1], keepdims=1)

    hi, lo = reduce("ReduceMax", "max"), reduce("ReduceMin", "min")
    if symmetric:
        top = n("Max", [hi, n("Neg", [lo], "neg"), consts["floor"]], "top")
        sigma, mu, centred = n("Div", [top, consts["sym_levels"]], "sigma"), "", a
    else:
        mu = n("Mul", [n("Add", [hi, lo], "sum"), consts["half"]], "mu")
        rng = n("Max", [n("Sub", [hi, lo], "range"), consts["floor"]], "floor")
        sigma = n("Div", [rng, consts["levels"]], "sigma")
        centred = n("Sub", [a, mu], "centred")
    if opset < 13:
        r = n("Round", [n("Div", [centred, sigma], "scaled")], "round")
        q = n("Cast", [n("Add", [r, consts["c128"]], "shift")], "u8", to=TensorProto.UINT8)
        if rows and not flat_in:
            q = n("Flatten", [q], "u8rows", axis=-1)
        return q, sigma, mu
    flat = centred if flat_in else n("Flatten", [centred], "rows", axis=-1)
    steps = n("Reshape", [sigma, consts["axes"]], "steps")
    if not zps:
        zps = n("Expand", [consts["zp"], n("Shape", [steps], "nrows")], "zps")
    q2 = n("QuantizeLinear", [flat, steps, zps], "q2", axis=0)
    if rows:
        return q2, sigma, mu
    return n("Reshape", [q2, n("Shape", [a], "shape")], "u8"), sigma, mu


#: operators that pick rows by an index input (what a read-out after the read positions is)
_SELECTS = ("Gather", "GatherElements", "GatherND")


def _subgraphs(n: Any) -> list[Any]:
    return [g for a in n.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _names_read(n: Any) -> set[str]:
    """What node ``n`` reads: its inputs and, for a node with subgraphs (an ``If``), every name
    their nodes read."""
    out = set(n.input)
    for sub in _subgraphs(n):
        for m in sub.node:
            out |= _names_read(m)
    return out


def reached(g: Any, sources: Collection[str], hit: set[str] | None = None) -> set[str]:
    """The tensors of graph ``g`` (its subgraphs' too) that depend on any of ``sources``."""
    hit = set(sources) if hit is None else hit
    for n in g.node:  # topological order
        for sub in _subgraphs(n):
            reached(sub, (), hit)
        if _names_read(n) & hit:
            hit.update(o for o in n.output if o)
    return hit


def read_out(g: Any, positions: Collection[str]) -> set[str]:
    """The tensors of graph ``g`` that hold rows picked by the read positions: a Gather's output
    whose indices depend on ``positions`` (the graph inputs), and whatever depends on such a
    tensor (a node whose subgraph picks so, e.g. LFM2's ``If``, included). A mask or a shape
    made from the positions picks no rows: what it reaches keeps one row per token."""
    pos = reached(g, positions)
    out: set[str] = set()

    def visit(graph: Any) -> None:
        for n in graph.node:
            for sub in _subgraphs(n):
                visit(sub)
            picks = n.op_type in _SELECTS and len(n.input) > 1 and n.input[1] in pos
            if picks or _names_read(n) & out:
                out.update(o for o in n.output if o)

    visit(g)
    return out


class ReadRows:
    """The nodes of a decoder graph's exact reads (the module doc): the read rows' flat indices
    (once per graph), each activation's codes with its read rows' residual codes appended
    (once per activation and form), and each layer's GEMM over both, its read rows summed and
    written back."""

    def __init__(self, io: WeightIO, model: Any, consts: dict[str, str], opset: int) -> None:
        self.io, self.model, self.consts, self.opset = io, model, consts, opset
        self.flat: tuple[str, str, str] | None = None  # (F, F as (n, 1), B·T as 1-D)
        #: the zero points (128) of B·T rows and of the read rows, made with ``flat``
        self.zps: tuple[str, str] = ("", "")
        self.acts: dict[tuple[str, bool], tuple[str, str, str, str]] = {}
        self.layers = 0
        self._c: dict[str, str] = {}

    def const(self, key: str, arr: Any) -> str:
        if key not in self._c:
            self._c[key] = self.io.add(self.model, np.asarray(arr), f"int8_reads_{key}").name
        return self._c[key]

    def _unsqueeze(self, x: str, name: str, out: list[Any]) -> str:
        from onnx import helper

        if self.opset >= 13:
            node = helper.make_node(
                "Unsqueeze", [x, self.const("ax1", np.array([1], np.int64))], [name], name=name
            )
        else:
            node = helper.make_node("Unsqueeze", [x], [name], name=name, axes=[1])
        out.append(node)
        return name

    def indices(self, out: list[Any]) -> tuple[str, str, str]:
        """Row ``b·T + p`` of the (B·T, ·) rows for every read position ``p`` of sequence
        ``b`` (the last prompt position, then ``read_index``'s); with them, once per graph,
        :attr:`zps`: the codes' zero points of B·T rows and of the read rows."""
        if self.flat is None:
            from onnx import helper

            ids, last, reads = READ_INPUTS
            mk, c = helper.make_node, self.const
            i0, i1 = c("i0", np.int64(0)), c("i1", np.int64(1))
            v0, v1 = c("v0", np.array([0], np.int64)), c("v1", np.array([1], np.int64))
            out += [
                mk("Shape", [ids], ["int8_reads_shape"], name="int8_reads_shape"),
                mk("Gather", ["int8_reads_shape", i0], ["int8_reads_b"], name="int8_reads_b"),
                mk("Gather", ["int8_reads_shape", i1], ["int8_reads_t"], name="int8_reads_t"),
                mk("Gather", ["int8_reads_shape", v0], ["int8_reads_b1"], name="int8_reads_b1"),
                mk("Gather", ["int8_reads_shape", v1], ["int8_reads_t1"], name="int8_reads_t1"),
                mk(
                    "Mul",
                    ["int8_reads_b1", "int8_reads_t1"],
                    ["int8_reads_bt"],
                    name="int8_reads_bt",
                ),
                mk("Range", [i0, "int8_reads_b", i1], ["int8_reads_seq"], name="int8_reads_seq"),
                mk(
                    "Mul",
                    ["int8_reads_seq", "int8_reads_t"],
                    ["int8_reads_base"],
                    name="int8_reads_base",
                ),
            ]
            base = self._unsqueeze("int8_reads_base", "int8_reads_base2", out)
            first = self._unsqueeze(last, "int8_reads_last", out)
            m1 = c("m1", np.array([-1], np.int64))
            out += [
                mk("Concat", [first, reads], ["int8_reads_pos"], name="int8_reads_pos", axis=1),
                mk("Add", ["int8_reads_pos", base], ["int8_reads_at"], name="int8_reads_at"),
                mk("Reshape", ["int8_reads_at", m1], ["int8_reads_rows"], name="int8_reads_rows"),
            ]
            col = self._unsqueeze("int8_reads_rows", "int8_reads_rows2", out)
            if self.opset >= 13:  # (below 13 the codes are a Cast: no zero points)
                zp = self.consts["zp"]
                out += [
                    mk("Expand", [zp, "int8_reads_bt"], ["int8_reads_zps"], name="int8_reads_zps"),
                    mk("Shape", ["int8_reads_rows"], ["int8_reads_n"], name="int8_reads_n"),
                    mk("Expand", [zp, "int8_reads_n"], ["int8_reads_zps2"], name="int8_reads_zps2"),
                ]
                self.zps = ("int8_reads_zps", "int8_reads_zps2")
            self.flat = ("int8_reads_rows", col, "int8_reads_bt")
        return self.flat

    def activation(
        self, a: str, q: str, sigma: str, mu: str, out: list[Any]
    ) -> tuple[str, str, str, str]:
        """The activation ``a``'s codes ``q`` (as (rows, K): :func:`per_token_quantize`'s
        ``rows``; steps ``sigma``, midpoints ``mu``; "" in the symmetric form) with its read
        rows' residual codes appended, their steps likewise, its midpoints as (rows, 1) (""
        symmetric) and the shape its layers' outputs take back; once per activation and
        form."""
        key = (a, not mu)
        if key not in self.acts:
            from onnx import TensorProto, helper

            f_rows, _, _ = self.indices(out)
            mk, c = helper.make_node, self.const
            tag = f"{a}_reads{'s' if not mu else ''}"

            def n(op: str, ins: list[str], suffix: str, **kw: Any) -> str:
                name = f"{tag}_{suffix}"
                out.append(mk(op, ins, [name], name=name, **kw))
                return name

            rows = n("Flatten", [a], "rows", axis=-1)
            sf = n("Flatten", [sigma], "sf", axis=-1)
            a_sel = n("Gather", [rows, f_rows], "a", axis=0)
            q_sel = n("Cast", [n("Gather", [q, f_rows], "q", axis=0)], "qfl", to=TensorProto.FLOAT)
            deq = n(
                "Mul",
                [
                    n("Sub", [q_sel, c("c128", np.float32(128))], "qc"),
                    n("Gather", [sf, f_rows], "s", axis=0),
                ],
                "deq",
            )
            mf = ""
            if mu:
                mf = n("Flatten", [mu], "mf", axis=-1)
                deq = n("Add", [deq, n("Gather", [mf, f_rows], "m", axis=0)], "deqm")
            resid = n("Sub", [a_sel, deq], "resid")
            q2, s2, _ = per_token_quantize(
                resid,
                self.consts,
                out,
                self.opset,
                symmetric=True,
                rows=True,
                flat_in=True,
                zps=self.zps[1],
            )
            lead = n(
                "Slice",
                [
                    n("Shape", [a], "shape"),
                    c("v0", np.array([0], np.int64)),
                    c("m1", np.array([-1], np.int64)),
                ],
                "lead",
            )
            shape = n("Concat", [lead, c("m1", np.array([-1], np.int64))], "oshape", axis=0)
            self.acts[key] = (
                n("Concat", [q, q2], "qcat", axis=0),
                n("Concat", [sf, s2], "scat", axis=0),
                mf,
                shape,
            )
        return self.acts[key]

    def layer(
        self,
        act: tuple[str, str, str, str],
        qn: str,
        sn: str,
        cn: str,
        y: str,
        base: str,
        w_zero: Collection[str] = (),
    ) -> list[Any]:
        """One layer's nodes: the GEMM over the activation's codes and its read rows'
        residual codes, the rows split, the midpoints' term added to the main rows, the read
        rows' residual products added to them and written back, reshaped to ``y``.
        ``w_zero``: the weight zero point's name (the ``u8`` form), or none."""
        from onnx import helper

        q_cat, s_cat, mf, shape = act
        assert self.flat is not None, "indices() makes the read rows' indices first"
        f_rows, f_col, bt = self.flat
        mk, c = helper.make_node, self.const
        v0 = c("v0", np.array([0], np.int64))
        big = c("end", np.array([np.iinfo(np.int64).max], np.int64))
        nodes = [
            mk(
                "MatMulIntegerToFloat",
                [q_cat, qn, s_cat, sn, self.consts["zp"], *w_zero],
                [f"{y}_xr8_all"],
                name=base,
                domain="com.microsoft",
            ),
            mk("Slice", [f"{y}_xr8_all", v0, bt, v0], [f"{y}_xr8_main"], name=f"{base}_main"),
            mk("Slice", [f"{y}_xr8_all", bt, big, v0], [f"{y}_xr8_resid"], name=f"{base}_resid"),
        ]
        main = f"{y}_xr8_main"
        if mf:
            nodes += [
                mk("Mul", [mf, cn], [f"{y}_xr8_mid"], name=f"{base}_mid"),
                mk("Add", [main, f"{y}_xr8_mid"], [f"{y}_xr8_mainm"], name=f"{base}_add"),
            ]
            main = f"{y}_xr8_mainm"
        nodes += [
            mk("Gather", [main, f_rows], [f"{y}_xr8_read"], name=f"{base}_read", axis=0),
            mk(
                "Add", [f"{y}_xr8_read", f"{y}_xr8_resid"], [f"{y}_xr8_exact"], name=f"{base}_exact"
            ),
            mk(
                "ScatterND",
                [main, f_col, f"{y}_xr8_exact"],
                [f"{y}_xr8_rows"],
                name=f"{base}_write",
            ),
            mk("Reshape", [f"{y}_xr8_rows", shape], [y], name=f"{base}_shape"),
        ]
        self.layers += 1
        return nodes


def per_token_codes_model(opset: int, rank: int = 2, *, symmetric: bool = False) -> Any:
    """The per-token quantization alone as a model (input ``x``, float32 of ``rank`` dims;
    output ``q``, its uint8 codes), with the nodes :func:`~spotstop.export.int8.quantize_matmuls_int8` writes at
    ``opset`` (``symmetric``: the form without a midpoint): how tests and
    ``bench/fused_ops.py`` check and time the graph forms."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "floor": ROW_FLOOR,
        "half": HALF,
        "levels": LEVELS,
        "zp": np.uint8(128),
        "axes": np.array([-1], dtype=np.int64),
        "c128": np.float32(128),
        "sym_levels": SYM_LEVELS,
    }
    nodes: list[Any] = []
    q, _, _ = per_token_quantize(
        "x", {k: f"c_{k}" for k in consts}, nodes, opset, symmetric=symmetric
    )
    nodes.append(helper.make_node("Identity", [q], ["q"]))
    graph = helper.make_graph(
        nodes,
        "per_token_codes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * rank)],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [None] * rank)],
        [
            numpy_helper.from_array(np.asarray(v), f"c_{k}")
            for k, v in consts.items()
            if (k != "c128" or opset < 13) and (k != "sym_levels" or symmetric)
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def int8_probe_model() -> Any:
    """The host probe the ONNX backend runs before it opens an int8 member
    (guard/backends/_int8_probe.py, which ships it as ``int8_gemm_probe.onnx``): uint8 ``a``
    (M, K) by the probe's constant weight codes in each form (:data:`WEIGHT_FORMS`), one
    ``MatMulIntegerToFloat`` each as :func:`~spotstop.export.int8.quantize_matmuls_int8` writes it (per-row
    activation scales, here 1; column scales 1; activation zero point 128; the ``u8`` form's
    weight zero point 128), outputs ``y_s8`` and ``y_u8``. ``python -m spotstop.export.int8_graph
    --write-probe`` writes the file; a test checks the shipped one is this model."""
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.guard.backends._int8_probe import A_ZERO, PROBE_K, PROBE_M, probe_weights

    codes = probe_weights()
    n = codes.shape[1]
    nodes, inits = (
        [],
        [
            numpy_helper.from_array(np.ones((PROBE_M, 1), np.float32), "a_scale"),
            numpy_helper.from_array(np.ones(n, np.float32), "w_scale"),
            numpy_helper.from_array(np.asarray(np.uint8(A_ZERO)), "a_zero"),
            numpy_helper.from_array(np.asarray(np.uint8(W_ZERO)), "w_zero"),
        ],
    )
    for form in WEIGHT_FORMS:
        inits.append(numpy_helper.from_array(stored_codes(codes, form), f"w_{form}"))
        nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                ["a", f"w_{form}", "a_scale", "w_scale", "a_zero"]
                + (["w_zero"] if form == "u8" else []),
                [f"y_{form}"],
                name=f"int8_gemm_probe_{form}",
                domain="com.microsoft",
            )
        )
    graph = helper.make_graph(
        nodes,
        "int8_gemm_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [PROBE_M, PROBE_K])],
        [
            helper.make_tensor_value_info(f"y_{f}", TensorProto.FLOAT, [PROBE_M, n])
            for f in WEIGHT_FORMS
        ],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        producer_name="spotstop",
    )
    model.ir_version = 8  # onnxruntime 1.18 (the oldest the runtime takes) reads it
    return model


if __name__ == "__main__":  # python -m spotstop.export.int8_graph --write-probe
    import sys

    if sys.argv[1:] != ["--write-probe"]:
        sys.exit("usage: python -m spotstop.export.int8_graph --write-probe")
    from spotstop.guard.backends._int8_probe import PROBE_FILE

    PROBE_FILE.write_bytes(int8_probe_model().SerializeToString())
    print(f"wrote {PROBE_FILE}")
