"""A vision tower's attention in float32 and in int8, on the graph's own attention inputs.

Issue #24. The int8 bundle's Qwen3.5-2B vision graph spends about half its node time in its
24 ``com.microsoft`` ``MultiHeadAttention`` nodes (16 heads, 1024 patches, hidden 1024), in
float32, at this CPU's float32 GEMM rate; onnxruntime's CPU execution provider has no bf16
attention, but it has ``MatMulInteger`` / ``MatMulIntegerToFloat`` on AMX. This script
measures what lower precision would cut there. It copies the vision graph (in memory; the
bundle is not touched), makes the Q, K and V inputs of a few attention nodes (``--layers``)
graph outputs, runs one generated scene's ``pixel_values`` through it (``demo_scenes(1,
seed=--scene-seed)``, preprocessed by the member's own architecture at the bundle's image
size, as the guard does), and then times, per layer, each form of that layer's attention on
those inputs, each its own onnxruntime session (``ORT_ENABLE_ALL``, ``--threads``):

1. ``MultiHeadAttention fp32``: the bundle's own node, the reference of every error;
2. ``MatMul + Softmax + MatMul fp32``: the same attention written out (heads split by
   Reshape / Transpose, the scale folded into Q);
3. ``int8 QK^T, PV fp32``: SageAttention's first step: K smoothed (its mean over the tokens
   subtracted per head channel: each row of ``Q K^T`` moves by one constant, which softmax
   ignores), Q and K quantized per token and head (symmetric, step = max |x| / 127; Q's codes
   stored as uint8 with zero point 128, as onnxruntime's fast u8 x s8 product wants), ``Q K^T``
   by ``MatMulIntegerToFloat`` (K's step per column inside it, Q's step one Mul after over the
   tokens x tokens logits), softmax and ``P V`` in float32;
4. ``int8 QK^T ... Q per head``: as 3 with one step per head for Q, folded into K's steps
   inside ``MatMulIntegerToFloat``: no pass over the logits to rescale them;
5. ``int8 QK^T and PV``: as 3, with ``P`` quantized per row to uint8 (step = row max / 255)
   and V per channel to int8, ``P V`` by ``MatMulIntegerToFloat`` too;

and with ``--torch``, for scale, torch's fused ``scaled_dot_product_attention`` on the same
inputs in float32 and bfloat16 (on a CPU with AMX its bf16 kernel runs on it): a fused
lower-precision attention kernel, which onnxruntime's CPU provider does not have.

Each of ``--rounds`` rounds runs every form once, in alternating order (forward, then
backward), after one warm-up call each; the median per form is kept with its ratio to form 1
(form 1's median / its median: above 1 is faster) and its error against form 1's output: the
largest absolute difference and the relative RMS ``||y - y_1|| / ||y_1||``.

With ``--whole``, every attention node of the graph is rewritten as form 3 (or
``--whole-form``) in a second copy, and both graphs are timed on the scene (alternating
rounds, medians) and their ``image_embeds`` compared: the error that form makes at the vision
tower's output.

    python bench/int8_attention.py /work/real/bundle-int8/members/Qwen3.5-2B/onnx/vision.onnx
    python bench/int8_attention.py GRAPH --layers 0,12,23 --rounds 9 --whole --results bench/RESULTS.md

The graph's member folder (two levels above it: ``config.json``, the preprocessor) gives the
scene's pixels; ``--random-pixels`` feeds a seeded Gaussian of the graph's declared input shape
instead (a graph outside a member folder). Writes the section ``int8-attention`` of
bench/RESULTS.md only with ``--results FILE``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

MHA = "MultiHeadAttention fp32"
DECOMPOSED = "MatMul + Softmax + MatMul fp32"
INT8_QK = "int8 QK^T (K smoothed, Q K per token), PV fp32"
INT8_QK_HEAD = "int8 QK^T (K smoothed and per token, Q per head), PV fp32"
INT8_QK_PV = "int8 QK^T and PV (P per row u8, V per channel s8)"
FORMS = (MHA, DECOMPOSED, INT8_QK, INT8_QK_HEAD, INT8_QK_PV)
TORCH_FP32 = "torch SDPA fp32 (not onnxruntime)"
TORCH_BF16 = "torch SDPA bf16 (not onnxruntime)"
#: a fused attention kernel at lower precision, for scale: what onnxruntime's CPU provider lacks
TORCH_FORMS = (TORCH_FP32, TORCH_BF16)
#: the smallest quantization step (a token whose Q or K is all zero)
_MIN_STEP = 1e-12


@dataclass(frozen=True)
class FormResult:
    """One form of one layer's attention: its median time over the rounds and its error."""

    form: str
    median_s: float
    all_s: tuple[float, ...]
    max_abs_err: float
    rel_rms_err: float
    #: node kernel time per operator type (ms a call, largest first), from one profiled
    #: session; empty where the layer was not profiled
    ops: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class LayerResult:
    """Every form of one attention node, timed on that node's own inputs from the scene."""

    layer: int
    node: str
    shape: tuple[int, ...]
    heads: int
    forms: tuple[FormResult, ...]


@dataclass(frozen=True)
class WholeResult:
    """The vision graph as exported against the same graph with every attention as ``form``."""

    form: str
    nodes_rewritten: int
    exported_s: float
    rewritten_s: float
    max_abs_err: float
    rel_rms_err: float
    max_abs_output: float
    #: the exported graph against itself on its input moved up one float32 ulp: how far the
    #: graph's own roundings (its per-token int8 codes) move the output without any rewrite
    ulp_max_abs: float
    ulp_rel_rms: float


class _Names:
    """Unique tensor names under one prefix, and the initializers the nodes use."""

    def __init__(self, prefix: str, opset: int) -> None:
        self.prefix = prefix
        self.opset = opset
        self.inits: list[Any] = []

    def reduce(self, op: str, x: str, axes: Sequence[int], out: str) -> Any:
        """``op`` (ReduceMax, ReduceMean) over ``axes``, dims kept, in the graph's opset (axes
        an input from opset 18, an attribute before)."""
        from onnx import helper

        if self.opset >= 18:
            axes_in = self.const(f"{out}_axes", list(axes), np.int64)
            return helper.make_node(op, [x, axes_in], [self(out)], keepdims=1)
        return helper.make_node(op, [x], [self(out)], axes=list(axes), keepdims=1)

    def __call__(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def const(self, name: str, value: Any, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper as nh

        full = self(name)
        self.inits.append(nh.from_array(np.asarray(value, dtype=dtype), full))
        return full


def _quantize(
    x: str, axes: Sequence[int], qmax: int, dtype: str, n: _Names, tag: str
) -> tuple[list[Any], str, str]:
    """Nodes that quantize ``x`` symmetrically, one step per line along ``axes`` (per token
    when ``axes`` is the head channel, per channel when it is the token axis, per head when it
    is both): step = max |x| / qmax (at least :data:`_MIN_STEP`). ``dtype`` ``s8``: codes
    -qmax..qmax; ``u8``: the same codes + 128 (zero point 128: onnxruntime's fast integer
    product on x86 is u8 x s8, s8 x s8 runs about 4x slower here); ``u8+``: x is non-negative,
    codes 0..qmax. Returns the nodes, the codes and the steps (``x``'s shape, ``axes`` 1)."""
    from onnx import TensorProto, helper

    nodes = []
    src = x
    if dtype != "u8+":
        nodes.append(helper.make_node("Abs", [x], [n(f"{tag}_abs")]))
        src = n(f"{tag}_abs")
    nodes += [
        n.reduce("ReduceMax", src, axes, f"{tag}_max"),
        helper.make_node("Div", [n(f"{tag}_max"), n.const(f"{tag}_qmax", qmax)], [n(f"{tag}_s0")]),
        helper.make_node(
            "Max", [n(f"{tag}_s0"), n.const(f"{tag}_min", _MIN_STEP)], [n(f"{tag}_s")]
        ),
        # Div, Round, Cast rather than a blocked QuantizeLinear: onnxruntime 1.32's graph
        # optimizations break the blocked form's scale shape here (it runs only unoptimized)
        helper.make_node("Div", [x, n(f"{tag}_s")], [n(f"{tag}_x")]),
        helper.make_node("Round", [n(f"{tag}_x")], [n(f"{tag}_r")]),
    ]
    codes = n(f"{tag}_r")
    if dtype == "u8":
        nodes.append(helper.make_node("Add", [codes, n.const(f"{tag}_zp", 128.0)], [n(f"{tag}_o")]))
        codes = n(f"{tag}_o")
    to = TensorProto.INT8 if dtype == "s8" else TensorProto.UINT8
    nodes.append(helper.make_node("Cast", [codes], [n(f"{tag}_q")], to=to))
    return nodes, n(f"{tag}_q"), n(f"{tag}_s")


def attention_nodes(
    form: str,
    q: str,
    k: str,
    v: str,
    out: str,
    *,
    heads: int,
    scale: float,
    prefix: str,
    opset: int = 17,
) -> tuple[list[Any], list[Any]]:
    """The nodes and initializers of one attention ``out = MHA(q, k, v)`` in ``form`` (one of
    :data:`FORMS`); ``q``, ``k``, ``v`` are batch x tokens x (heads x head_dim) float32, as the
    ``MultiHeadAttention`` node takes them (no mask, no bias); ``opset``: the graph's ONNX opset
    (the exporter writes 17). K and V, the integer products' second operands, are quantized
    as int8 where this CPU's u8·s8 kernel is exact, else as the same codes + 128 in uint8 with
    a zero point of 128 (x86 with AVX2 and no VNNI saturates u8·s8: export/int8.py's weight
    forms, guard/backends/_int8_probe.py)."""
    from onnx import helper
    from spotstop.guard.backends._int8_probe import host_int8_weight_forms

    n = _Names(prefix, opset)
    b8 = "s8" if "s8" in host_int8_weight_forms() else "u8"  # the second operand's form
    b_zero = [n.const("b_zp8", 128, np.uint8)] if b8 == "u8" else []
    if form == MHA:
        node = helper.make_node(
            "MultiHeadAttention",
            [q, k, v],
            [out],
            domain="com.microsoft",
            num_heads=heads,
            scale=scale,
        )
        return [node], []
    if form not in FORMS:
        raise ValueError(f"unknown attention form {form!r}; one of {', '.join(FORMS)}")
    split = n.const("split", [0, 0, heads, -1], np.int64)
    nodes = [
        helper.make_node("Mul", [q, n.const("scale", scale)], [n("qs")]),
        helper.make_node("Reshape", [n("qs"), split], [n("q4")]),
        helper.make_node("Transpose", [n("q4")], [n("qh")], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [v, split], [n("v4")]),
        helper.make_node("Transpose", [n("v4")], [n("vh")], perm=[0, 2, 1, 3]),
    ]
    if form == DECOMPOSED:
        nodes += [
            helper.make_node("Reshape", [k, split], [n("k4")]),
            helper.make_node("Transpose", [n("k4")], [n("kt")], perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", [n("qh"), n("kt")], [n("logits")]),
        ]
    else:
        one = n.const("one", 1.0)
        nodes += [  # K smoothed: its mean over the tokens, per head channel, subtracted
            helper.make_node("Reshape", [k, split], [n("k4")]),
            helper.make_node("Transpose", [n("k4")], [n("kraw")], perm=[0, 2, 1, 3]),
            n.reduce("ReduceMean", n("kraw"), [2], "kmean"),
            helper.make_node("Sub", [n("kraw"), n("kmean")], [n("kh")]),
        ]
        per_head = form == INT8_QK_HEAD
        qn, qq, qstep = _quantize(n("qh"), [2, 3] if per_head else [3], 127, "u8", n, "q")
        kn, kq, kstep = _quantize(n("kh"), [3], 127, b8, n, "k")
        nodes += qn + kn
        nodes += [
            helper.make_node("Transpose", [kq], [n("kqt")], perm=[0, 1, 3, 2]),
            helper.make_node("Transpose", [kstep], [n("kst")], perm=[0, 1, 3, 2]),
        ]
        if per_head:  # Q's one step per head folds into K's steps per column: no S x S Mul
            nodes += [
                helper.make_node("Mul", [n("kst"), qstep], [n("qkst")]),
                helper.make_node(
                    "MatMulIntegerToFloat",
                    [qq, n("kqt"), one, n("qkst"), n.const("q_zp8", 128, np.uint8), *b_zero],
                    [n("logits")],
                    domain="com.microsoft",
                ),
            ]
        else:
            nodes += [
                helper.make_node(
                    "MatMulIntegerToFloat",
                    [qq, n("kqt"), one, n("kst"), n.const("q_zp8", 128, np.uint8), *b_zero],
                    [n("logits_k")],
                    domain="com.microsoft",
                ),
                helper.make_node("Mul", [n("logits_k"), qstep], [n("logits")]),
            ]
    nodes.append(helper.make_node("Softmax", [n("logits")], [n("p")], axis=-1))
    if form == INT8_QK_PV:
        pn, pq, pstep = _quantize(n("p"), [3], 255, "u8+", n, "p")
        vn, vq, vstep = _quantize(n("vh"), [2], 127, b8, n, "v")
        nodes += pn + vn
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [pq, vq, n.const("one_pv", 1.0), vstep]
                + ([n.const("p_zp8", 0, np.uint8), *b_zero] if b_zero else []),
                [n("o_v")],
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [n("o_v"), pstep], [n("o")]),
        ]
    else:
        nodes.append(helper.make_node("MatMul", [n("p"), n("vh")], [n("o")]))
    nodes += [
        helper.make_node("Transpose", [n("o")], [n("ot")], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [n("ot"), n.const("merge", [0, 0, -1], np.int64)], [out]),
    ]
    return nodes, n.inits


def _options(threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return opts


def _session(model: Any, threads: int, profile: str = "") -> Any:
    import onnxruntime as ort

    opts = _options(threads)
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(
        model.SerializeToString(),
        sess_options=opts,
        providers=["CPUExecutionProvider"],
    )


def form_session(
    form: str, shape: tuple[int, ...], heads: int, scale: float, threads: int, profile: str = ""
) -> Any:
    """An onnxruntime session of one attention in ``form`` on inputs Q, K, V of ``shape``
    (``profile``: onnxruntime's profile on, its file under this prefix)."""
    import onnx
    from onnx import TensorProto, helper

    nodes, inits = attention_nodes(form, "Q", "K", "V", "Y", heads=heads, scale=scale, prefix="a_")
    vi = [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape)) for x in "QKV"]
    graph = helper.make_graph(
        nodes, "attention", vi, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(shape))],
        initializer=inits,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    return _session(model, threads, profile)


def _attention(model: Any) -> list[Any]:
    nodes = [x for x in model.graph.node if x.op_type == "MultiHeadAttention"]
    for x in nodes:
        if len([i for i in x.input if i]) != 3:
            raise ValueError(
                f"attention node {x.name} has inputs {list(x.input)}; this script measures "
                "MultiHeadAttention on Q, K, V alone (no bias, mask or past)"
            )
    return nodes


def _attrs(node: Any) -> tuple[int, float]:
    from onnx import helper

    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    heads = int(a["num_heads"])
    return heads, float(a.get("scale", 0.0))


def capture(model: Any, layers: Sequence[int], feed: dict[str, np.ndarray], threads: int) -> dict:
    """Run ``feed`` through a copy of ``model`` whose attention nodes ``layers`` (their order in
    the graph) expose Q, K and V: ``{layer: (node, heads, scale, q, k, v)}``."""
    import onnx
    from onnx import TensorProto, helper

    att = _attention(model)
    bad = [i for i in layers if not 0 <= i < len(att)]
    if bad:
        raise ValueError(f"--layers {bad}: the graph has {len(att)} attention nodes (0..)")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = []
    for i in layers:
        for x in att[i].input[:3]:
            if x not in names:
                names.append(x)
                m.graph.output.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    got = dict(zip(names, _session(m, threads).run(names, feed), strict=True))
    out = {}
    for i in layers:
        heads, scale = _attrs(att[i])
        q, k, v = (got[x] for x in att[i].input[:3])
        if scale == 0.0:
            scale = 1.0 / float(np.sqrt(q.shape[-1] // heads))
        out[i] = (att[i].name, heads, scale, q, k, v)
    return out


def _errors(y: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = y.astype(np.float64) - ref.astype(np.float64)
    norm = max(float(np.linalg.norm(ref)), 1e-30)
    return float(np.abs(d).max()), float(np.linalg.norm(d)) / norm


def _rounds(calls: Sequence[Callable[[], Any]], rounds: int) -> list[list[float]]:
    """Each call's times over ``rounds`` rounds, alternating the order (forward, backward)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1; got {rounds}")
    for c in calls:
        c()  # warm-up: pre-packing, first-touch allocation
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for i in order:
            t = time.perf_counter()
            calls[i]()
            times[i].append(time.perf_counter() - t)
    return times


def measure_layer(
    layer: int, node: str, heads: int, scale: float, qkv: Sequence[np.ndarray], rounds: int,
    threads: int, forms: Sequence[str] = FORMS, profile: bool = False, torch: bool = False,
) -> LayerResult:  # fmt: skip
    """Every form of one attention on its captured inputs ``qkv``, timed and compared; with
    ``profile``, each form's node time per operator from a separate profiled session; with
    ``torch``, also :data:`TORCH_FORMS` (torch's fused ``scaled_dot_product_attention``) in the
    same rounds."""
    q, k, v = qkv
    shape = tuple(int(d) for d in q.shape)
    feed = {"Q": q, "K": k, "V": v}
    sessions = [form_session(f, shape, heads, scale, threads) for f in forms]
    calls: list[Callable[[], Any]] = [
        lambda s=s: s.run(["Y"], feed)[0]  # type: ignore[misc]
        for s in sessions
    ]
    names = list(forms)
    if torch:
        for dtype, name in (("float32", TORCH_FP32), ("bfloat16", TORCH_BF16)):
            calls.append(_torch_sdpa(q, k, v, heads, scale, threads, dtype))
            names.append(name)
    outs = [c() for c in calls]
    times = _rounds(calls, rounds)
    rows = []
    for f, y, t in zip(names, outs, times, strict=True):
        mx, rel = _errors(y, outs[0])
        ops = _op_times(f, shape, heads, scale, threads, feed) if profile and f in FORMS else ()
        rows.append(FormResult(f, statistics.median(t), tuple(t), mx, rel, ops))
    return LayerResult(layer, node, shape, heads, tuple(rows))


def _torch_sdpa(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, scale: float, threads: int,
    dtype: str,
) -> Callable[[], np.ndarray]:  # fmt: skip
    """A call of torch's ``scaled_dot_product_attention`` on Q, K, V (batch x tokens x hidden)
    in ``dtype``, heads split and merged around it as the ONNX forms do."""
    import torch

    torch.set_num_threads(threads)
    b, s, hidden = q.shape

    def heads_first(x: np.ndarray) -> Any:
        t = torch.from_numpy(x).to(getattr(torch, dtype))
        return t.view(b, s, heads, hidden // heads).transpose(1, 2).contiguous()

    qt, kt, vt = heads_first(q), heads_first(k), heads_first(v)

    def call() -> np.ndarray:
        with torch.inference_mode():
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, scale=scale)
            return o.transpose(1, 2).reshape(b, s, hidden).float().numpy()

    return call


def _op_times(
    form: str, shape: tuple[int, ...], heads: int, scale: float, threads: int,
    feed: dict[str, np.ndarray], calls: int = 3,
) -> tuple[tuple[str, float], ...]:  # fmt: skip
    """Node kernel time per operator type, ms a call (mean of ``calls`` after a warm-up), from
    onnxruntime's profile of a session of ``form``."""
    import tempfile
    from collections import defaultdict

    with tempfile.TemporaryDirectory(prefix="int8-attention-") as tmp:
        sess = form_session(form, shape, heads, scale, threads, profile=f"{tmp}/p")
        for _ in range(calls + 1):  # the first: warm-up, left out below
            sess.run(["Y"], feed)
        events = json.loads(Path(sess.end_profiling()).read_text(encoding="utf-8"))
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    since = runs[-calls]
    total: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= since:
            total[e["args"]["op_name"]] += e["dur"] / 1e3 / calls
    return tuple(sorted(((k, round(v, 2)) for k, v in total.items()), key=lambda kv: -kv[1]))


def rewrite_all(model: Any, form: str = INT8_QK) -> tuple[Any, int]:
    """A copy of ``model`` with every ``MultiHeadAttention`` node written as ``form``."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    att = {x.name for x in _attention(m)}
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    kept, count = [], 0
    for x in m.graph.node:
        if x.name not in att:
            kept.append(x)
            continue
        heads, scale = _attrs(x)
        if not scale:
            raise ValueError(f"{x.name} has no scale attribute; this rewrite needs it")
        q, k, v = x.input[:3]
        nodes, inits = attention_nodes(
            form, q, k, v, x.output[0], heads=heads, scale=scale,
            prefix=f"{x.name}/int8/", opset=opset,
        )  # fmt: skip
        kept += nodes
        m.graph.initializer.extend(inits)
        count += 1
    del m.graph.node[:]
    m.graph.node.extend(kept)
    return m, count


def measure_whole(
    model: Any, feed: dict[str, np.ndarray], rounds: int, threads: int, form: str = INT8_QK
) -> WholeResult:
    """The exported graph and its rewrite as ``form`` (:func:`rewrite_all`), timed and compared."""
    rewritten, count = rewrite_all(model, form)
    out_name = model.graph.output[0].name
    a, b = _session(model, threads), _session(rewritten, threads)
    ya, yb = a.run([out_name], feed)[0], b.run([out_name], feed)[0]
    nudged = {k: np.nextafter(x, np.inf).astype(x.dtype) if x.dtype.kind == "f" else x
              for k, x in feed.items()}  # fmt: skip
    umx, urel = _errors(a.run([out_name], nudged)[0], ya)
    ta, tb = _rounds([lambda: a.run([out_name], feed), lambda: b.run([out_name], feed)], rounds)
    mx, rel = _errors(yb, ya)
    return WholeResult(
        form, count, statistics.median(ta), statistics.median(tb), mx, rel,
        float(np.abs(ya).max()), umx, urel,
    )  # fmt: skip


def scene_pixels(graph: Path, seed: int) -> dict[str, np.ndarray]:
    """One generated scene (``demo_scenes(1, seed=seed)``) preprocessed by the member folder
    the graph lies in (``MEMBER/onnx/vision.onnx``), at the bundle's image size: the vision
    graph's inputs as the guard builds them."""
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import DecodedImage, decode_image, load_bundle
    from spotstop.guard._member import resolve_member

    member_dir = graph.resolve().parents[1]
    size = None
    for up in member_dir.parents:
        if (up / "manifest.yaml").is_file():
            bundle = load_bundle(up)
            size = next(
                (m.image_size for m in bundle.members if Path(m.path).resolve() == member_dir),
                None,
            )
            break
    folder = resolve_member(member_dir)
    geometry = folder.arch.geometry(folder.config, folder.preprocessor, size)
    raw = demo_scenes(1, seed=seed)[0].image
    if raw is None:
        raise ValueError("demo_scenes gave a scene without an image")
    image = (raw if isinstance(raw, DecodedImage) else decode_image(raw)).image
    px = folder.arch.preprocess(image, geometry)
    return {"pixel_values": px["pixel_values"]}


def random_pixels(model: Any, seed: int) -> dict[str, np.ndarray]:
    """A seeded Gaussian of each graph input's declared (static) shape."""
    rng = np.random.default_rng(seed)
    feed = {}
    for x in model.graph.input:
        dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
        if not dims or min(dims) <= 0:
            raise ValueError(f"input {x.name} has no static shape; give the graph's member folder")
        feed[x.name] = rng.standard_normal(dims).astype(np.float32)
    return feed


def measure(
    graph: Path, *, layers: Sequence[int], rounds: int, threads: int, scene_seed: int = 7,
    random: bool = False, whole: bool = False, whole_rounds: int | None = None,
    whole_form: str = INT8_QK, torch: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Every form of the attention nodes ``layers`` of ``graph``, on one scene's inputs; with
    ``whole``, the graph with every attention as ``whole_form`` against it as exported."""
    import onnx

    model = onnx.load(str(graph))  # the external data with it: the copies live in memory
    feed = random_pixels(model, scene_seed) if random else scene_pixels(graph, scene_seed)
    got = capture(model, layers, feed, threads)
    rows = [
        measure_layer(
            i, node, heads, scale, (q, k, v), rounds, threads, profile=j == 0, torch=torch
        )
        for j, (i, (node, heads, scale, q, k, v)) in enumerate(got.items())
    ]
    doc: dict[str, Any] = {
        "graph": str(graph),
        "attention_nodes": len(_attention(model)),
        "pixels": "random" if random else f"demo_scenes(1, seed={scene_seed})",
        "rounds": rounds,
        "threads": threads,
        "layers": [asdict(r) for r in rows],
        "whole": None,
        "load": os.getloadavg(),
        "cores": os.cpu_count(),
        "versions": _versions(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if whole:
        w = measure_whole(model, feed, whole_rounds or rounds, threads, whole_form)
        doc["whole"] = asdict(w)
        doc["whole_rounds"] = whole_rounds or rounds
    doc["load_after"] = os.getloadavg()
    return doc


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for d in ("onnxruntime", "onnx", "numpy"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = "absent"
    return out


def render(doc: dict[str, Any], command: str = "") -> str:
    first = doc["layers"][0] if doc["layers"] else None
    shape = "x".join(map(str, first["shape"])) if first else "?"
    lines = [
        "### The vision tower's attention in float32 and int8, on its own inputs (issue #24)",
        "",
        f"Graph `{doc['graph']}` ({doc['attention_nodes']} MultiHeadAttention nodes); Q, K, V "
        f"of the layers below captured from {doc['pixels']} (Q {shape}, "
        f"{first['heads'] if first else '?'} heads); each form its own onnxruntime session, "
        f"{doc['threads']} threads, {doc['rounds']} rounds in alternating order after a warm-up, "
        "median kept. Speed-up = form 1's median / this median (above 1: faster); errors "
        "against form 1's output (relative RMS = ||y - y_1|| / ||y_1||).",
        "",
        "| layer | form | median | speed-up | max abs error | relative RMS error |",
        "|---|---|---|---|---|---|",
    ]
    for layer in doc["layers"]:
        ref = layer["forms"][0]["median_s"]
        for i, f in enumerate(layer["forms"], 1):
            lines.append(
                f"| {layer['layer']} | {i}. {f['form']} | {f['median_s'] * 1e3:.1f} ms | "
                f"{ref / f['median_s']:.2f}x | {f['max_abs_err']:.2e} | {f['rel_rms_err']:.2e} |"
            )
    for layer in doc["layers"]:
        if not any(f.get("ops") for f in layer["forms"]):
            continue
        lines += [
            "",
            f"Where each form's time goes (layer {layer['layer']}, a separate session with "
            "onnxruntime's profile on: node kernel time per operator, ms a call, the five "
            "largest):",
            "",
        ]
        for i, f in enumerate(layer["forms"], 1):
            ops = f.get("ops") or []
            if not ops:  # torch's rows: no onnxruntime profile
                continue
            total = sum(ms for _, ms in ops)
            top = ", ".join(f"{op} {ms:.1f}" for op, ms in ops[:5])
            lines.append(f"- {i}. {f['form']}: {total:.1f} ms ({top})")
    w = doc.get("whole")
    if w:
        lines += [
            "",
            f"The whole vision graph with its {w['nodes_rewritten']} attention nodes as "
            f"{FORMS.index(w['form']) + 1}. {w['form']}, against the graph as exported, on the "
            f"same scene ({doc.get('whole_rounds', doc['rounds'])} rounds): "
            f"{w['exported_s'] * 1e3:.0f} ms → {w['rewritten_s'] * 1e3:.0f} ms a call "
            f"({w['exported_s'] / w['rewritten_s']:.2f}x); `image_embeds` max abs error "
            f"{w['max_abs_err']:.2e} (largest |value| {w['max_abs_output']:.2f}), relative RMS "
            f"{w['rel_rms_err']:.2e}; the exported graph against itself on its input moved up "
            f"one float32 ulp (its own int8 roundings): max abs {w['ulp_max_abs']:.2e}, relative "
            f"RMS {w['ulp_rel_rms']:.2e}.",
        ]
    la, lb = doc["load"], doc["load_after"]
    lines += [
        "",
        f"Measured by `python bench/int8_attention.py{(' ' + command) if command else ''}` "
        f"({doc['date']}); {doc['cores']} logical cores shared with other jobs: load average "
        f"{la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f} (1 / 5 / 15 min) before, "
        f"{lb[0]:.2f} / {lb[1]:.2f} / {lb[2]:.2f} after; "
        + ", ".join(f"{a} {b}" for a, b in doc["versions"].items())
        + ".",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("graph", type=Path, help="a vision.onnx with MultiHeadAttention nodes")
    ap.add_argument("--layers", default="0,12,23", help="attention nodes to measure (0-based)")
    ap.add_argument("--rounds", type=int, default=9, help="timed calls per form (median kept)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    ap.add_argument("--scene-seed", type=int, default=7, help="demo_scenes seed (or pixels')")
    ap.add_argument("--random-pixels", action="store_true", help="Gaussian pixels, no folder")
    ap.add_argument("--whole", action="store_true", help="also the graph with every layer as 3")
    ap.add_argument(
        "--whole-form", type=int, choices=(3, 4, 5), default=3, help="the form --whole uses"
    )
    ap.add_argument(
        "--torch", action="store_true", help="also torch's fused SDPA in fp32 and bf16, for scale"
    )
    ap.add_argument("--whole-rounds", type=int, help="timed calls per whole graph (default rounds)")
    ap.add_argument("--results", type=Path, help="a RESULTS.md to write the section into")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if not args.graph.is_file():
        ap.error(f"{args.graph} is not a file; pass an exported vision.onnx.")
    try:
        layers = [int(x) for x in args.layers.split(",")]
    except ValueError:
        ap.error(f"--layers must be comma-separated integers, e.g. 0,12,23; got {args.layers!r}")
    doc = measure(
        args.graph, layers=layers, rounds=args.rounds, threads=args.threads,
        scene_seed=args.scene_seed, random=args.random_pixels, whole=args.whole,
        whole_rounds=args.whole_rounds, whole_form=FORMS[args.whole_form - 1], torch=args.torch,
    )  # fmt: skip
    text = render(doc, " ".join(sys.argv[1:] if argv is None else argv))
    print(json.dumps(doc, indent=1) if args.json else text)
    if args.results is not None:
        write_section(args.results, "int8-attention", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
