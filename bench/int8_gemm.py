"""One linear layer at Qwen3.5-2B's size in every form onnxruntime and torch run it on this CPU.

Issue #24. ``x (M x K) @ W (K x N)`` with M = 383 (the real member's prompt tokens in
``bench/real_pair.py``'s latency table), K = 2048 (hidden size), N = 6144 (the MLP's
intermediate size), on ``--threads`` threads (default 2: the workstation this project is
measured on), each form timed best of ``--repeats`` after one warm-up call, all in one run:

* ``onnxruntime fp32 MatMul``: the float graph, the reference every error is against;
* ``onnxruntime MatMulNBits b-bit acc L``: weight-only blocks as ``spotstop export`` writes them
  (``spotstop.export.nbits.nbits_blocks``, onnxruntime's own quantizer; block size
  ``spotstop.export.quant.NBITS_BLOCK`` of the precision), 8 and 4 bits, accuracy level 0
  (dequantize, multiply in float32) and 4 (activations quantized to int8 per block, int8 dot
  products);
* ``onnxruntime DynamicQuantizeMatMul``: int8 weights with one scale per output channel,
  activations quantized at run time to uint8 with one scale per tensor (W8A8);
* ``onnxruntime MatMulInteger + DynamicQuantizeLinear``: the same arithmetic as standard ONNX
  operators (quantize, integer product, two rescales);
* ``onnxruntime MatMulIntegerToFloat per token (spotstop int8)``: the graph ``spotstop export
  --precision int8`` writes (``spotstop.export.int8.quantize_matmuls_int8``): each row of ``x``
  its own midpoint and step, zero point 128, the integer product scaled per column and per
  row (its step) inside ``MatMulIntegerToFloat``, then the midpoint term; its weights in the
  form the export picks on this host (``s8``: int8, the u8·s8 kernel; ``u8``: the same codes
  + 128 as uint8, the u8·u8 kernel, where the u8·s8 one saturates: x86 with AVX2 and no VNNI),
  and timed again in each form by name (``..., s8 weights`` / ``..., u8 weights``: the error
  column shows a form this CPU gets wrong);
* ``onnxruntime MatMulIntegerToFloat per token, symmetric (spotstop int8)``: the form a layer
  with two-sided inputs takes (``SYMMETRIC_SLACK``): each row's step its largest magnitude
  over 127, no midpoint: nothing after the product;
* ``onnxruntime MatMulIntegerToFloat per token, exact reads of 3 rows``: the midpoint form as
  a decoder graph's layer takes it (``EXACT_READS``): the 3 rows the score reads (the last
  prompt position and the two answer tokens after it, here the last 3 rows) multiplied with
  their residual's codes too, in one GEMM over ``M + 3`` rows, the main rows sliced off and the
  read rows written back: what exact reads cost a layer;
* ``... input rotated in blocks of 64 / 128``: that form after the online rotation a layer over
  the keep bound takes (one float32 ``MatMul`` by the ``b × b`` Hadamard constant, the weight
  stored rotated): what the rotation costs at each block size;
* ``torch fp32`` and ``torch bf16``: ``torch.nn.functional.linear``, eager.

Per form: the best time, GFLOP/s (2 M K N / time, the int8 forms' integer operations
counted alike), the weight bytes it reads, the relative error ``||Y - Y_fp32|| / ||Y_fp32||``
against onnxruntime's float32 output (Gaussian activations and weights: no outlier channels,
so the int8 errors are a floor, not what a real layer sees), the same error on the other rows
when one row of ``x`` is :data:`OUTLIER_TOKEN` times larger (an attention-sink token, as
trained decoders have: where per-tensor and per-token activations part), and the ratio of its time to
onnxruntime fp32's and to torch bf16's. A last line times a read of 1 GiB (``torch.sum`` on
the same threads): the memory bandwidth a roofline divides weight bytes by.

The stamp names the CPU model and the instruction-set flags that decide which kernels run
(AVX2, AVX-512, VNNI, BF16, AMX): an int8 or bf16 speed-up measured on a CPU with AMX tiles
does not carry to one without them.

    python bench/int8_gemm.py                         # the table, into bench/RESULTS.md
    python bench/int8_gemm.py --repeats 20 --threads 2
    python bench/int8_gemm.py --json --no-results     # figures only (bench/real_pair.py)

Writes the section ``int8-gemm`` of bench/RESULTS.md (``--results``; ``--no-results``: none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

#: Qwen3.5-2B's MLP up projection at the latency table's prompt length
SHAPE = (383, 2048, 6144)
REF = "onnxruntime fp32 MatMul"
PER_TOKEN = "onnxruntime MatMulIntegerToFloat per token (spotstop int8)"
PER_TOKEN_SYMMETRIC = "onnxruntime MatMulIntegerToFloat per token, symmetric (spotstop int8)"
PER_TOKEN_EXACT = (
    "onnxruntime MatMulIntegerToFloat per token, exact reads of 3 rows (spotstop int8)"
)
#: the rows a decoder's score reads (the last prompt position and the two answer tokens)
READ_ROWS = 3
#: the rotation blocks a layer over the keep bound is tried with (export/int8.py)
ROTATED_BLOCKS = (64, 128)
#: how much larger the first row of x is in the outlier-token error column
OUTLIER_TOKEN = 50.0
BF16 = "torch bf16"
#: the instruction-set flags that decide which GEMM kernels a CPU runs
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


@dataclass
class Form:
    """One way to run the layer: its name, its weight bytes and a call on the activations."""

    name: str
    weight_bytes: int
    run: Callable[[], np.ndarray]


def cpu_info() -> dict[str, Any]:
    """The CPU's model name, which of :data:`FLAGS` it has, and its logical cores."""
    model: str = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine()):
                model = val.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(val.split())
    except OSError:
        pass
    return {
        "model": model or "?",
        "flags": [f for f in FLAGS if f in flags],
        "missing": [f for f in FLAGS if f not in flags],
        "cores": os.cpu_count(),
    }


def measured_by(cmd: str, seconds: float) -> str:
    """A RESULTS table's last line: the command, when it ran, how long, and on what CPU."""
    import datetime as dt

    cpu = cpu_info()
    return (
        f"Measured by `{cmd}` ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {seconds:.0f} s); "
        f"CPU {cpu['model']}, {cpu['cores']} logical cores, flags {', '.join(cpu['flags'])}."
    )


def _ort_session(nodes: list[Any], inits: list[Any], m: int, n: int, k: int, threads: int) -> Any:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    return _session(model, threads)


def _session(model: Any, threads: int) -> Any:
    """An onnxruntime CPU session of ``model`` on ``threads`` intra-op threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def build_forms(x: np.ndarray, w: np.ndarray, threads: int) -> list[Form]:
    """Every form of ``x @ w`` (float32 ``x`` M x K, ``w`` K x N) this script times."""
    import torch
    from onnx import helper
    from onnx import numpy_helper as nh
    from spotstop.export.int8_math import WEIGHT_FORMS
    from spotstop.export.nbits import nbits_blocks
    from spotstop.export.quant import NBITS_BLOCK

    m, k = x.shape
    n = w.shape[1]
    feed = {"X": x}

    def ort_form(name: str, nodes: list[Any], inits: list[Any], nbytes: int) -> Form:
        sess = _ort_session(nodes, inits, m, n, k, threads)
        return Form(name, nbytes, lambda: sess.run(["Y"], feed)[0])

    forms = [
        ort_form(
            REF,
            [helper.make_node("MatMul", ["X", "W"], ["Y"])],
            [nh.from_array(w, "W")],
            w.nbytes,
        )
    ]
    for bits, prec in ((8, "int8"), (4, "int4")):
        block = NBITS_BLOCK[prec]
        packed, scales = nbits_blocks(w, bits, block)
        for acc in (0, 4):
            node = helper.make_node(
                "MatMulNBits",
                ["X", "B", "S"],
                ["Y"],
                domain="com.microsoft",
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=acc,
            )
            forms.append(
                ort_form(
                    f"onnxruntime MatMulNBits {bits}-bit block {block} acc {acc}",
                    [node],
                    [nh.from_array(packed, "B"), nh.from_array(scales, "S")],
                    packed.nbytes + scales.nbytes,
                )
            )
    # int8 per output channel, symmetric (zero point 0)
    wscale = (np.abs(w).max(axis=0) / 127.0).astype(np.float32)
    wscale[wscale == 0] = 1.0
    wq = np.clip(np.rint(w / wscale), -127, 127).astype(np.int8)
    forms.append(
        ort_form(
            "onnxruntime DynamicQuantizeMatMul (s8 per-channel W, u8 per-tensor A)",
            [
                helper.make_node(
                    "DynamicQuantizeMatMul", ["X", "Wq", "Ws"], ["Y"], domain="com.microsoft"
                )
            ],
            [nh.from_array(wq, "Wq"), nh.from_array(wscale, "Ws")],
            wq.nbytes + wscale.nbytes,
        )
    )
    forms.append(
        ort_form(
            "onnxruntime MatMulInteger + DynamicQuantizeLinear",
            [
                helper.make_node("DynamicQuantizeLinear", ["X"], ["Xq", "Xs", "Xz"]),
                helper.make_node("MatMulInteger", ["Xq", "Wq", "Xz"], ["Yi"]),
                helper.make_node("Cast", ["Yi"], ["Yf"], to=1),
                helper.make_node("Mul", ["Xs", "Ws"], ["S2"]),
                helper.make_node("Mul", ["Yf", "S2"], ["Y"]),
            ],
            [nh.from_array(wq, "Wq"), nh.from_array(wscale, "Ws")],
            wq.nbytes + wscale.nbytes,
        )
    )
    forms.append(_per_token_form(w, ort_form))
    for wf in WEIGHT_FORMS:  # both weight forms (the default row above is the host's choice)
        forms.append(_per_token_form(w, ort_form, weight_form=wf))
    forms.append(_per_token_form(w, ort_form, symmetric=True))
    forms.append(_exact_reads_form(w, x, threads))
    for block in ROTATED_BLOCKS:
        forms.append(_rotated_form(w, block, ort_form))
    torch.set_num_threads(threads)
    xt, wt = torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(w.T))
    xb, wb = xt.bfloat16(), wt.bfloat16()

    def lin(a: Any, b: Any) -> Callable[[], np.ndarray]:
        def call() -> np.ndarray:
            with torch.inference_mode():
                return torch.nn.functional.linear(a, b).float().numpy()

        return call

    forms.append(Form("torch fp32", wt.numel() * 4, lin(xt, wt)))
    forms.append(Form(BF16, wb.numel() * 2, lin(xb, wb)))
    return forms


def per_token_layer(w: np.ndarray, symmetric: bool = False, weight_form: str | None = None) -> Any:
    """``X @ w`` (input ``X``, output ``Y``) as ``spotstop export --precision int8`` rewrites it
    (no calibration: codes rounded to nearest, as :func:`channel_int8` without a Hessian);
    ``symmetric``: in the symmetric per-token form (``symmetric_slack=math.inf``), else with
    the midpoint; ``weight_form``: ``s8`` or ``u8`` (None: the export's choice on this host)."""
    import math

    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh
    from spotstop.export.int8 import quantize_matmuls_int8

    k, n = w.shape
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="layer")],
        "layer",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])],
        initializer=[nh.from_array(w, "W")],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    rep = quantize_matmuls_int8(
        model,
        activations="per-token",
        symmetric_slack=math.inf if symmetric else None,
        weight_form=weight_form,
    )
    if rep.dynamic != 1 or len(rep.symmetric) != symmetric or symmetric != _is_symmetric(model):
        raise RuntimeError(f"the int8 rewrite did not quantize the layer: {rep}")
    return model


def exact_reads_layer(w: np.ndarray) -> Any:
    """``X @ w`` as a layer of a decoder graph, rewritten by ``spotstop export --precision
    int8`` with its exact reads (:data:`~spotstop.export.int8.EXACT_READS`): inputs ``X``
    (1 x M x K), ``input_ids`` (1 x M; only its shape is read: ``X`` is reshaped to it, no
    copy, so that the layer's input has one row per token), ``last_index`` (1) and
    ``read_index`` (1 x 2); output ``Y`` (1 x M x N)."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh
    from spotstop.export.int8 import quantize_matmuls_int8

    k, n = w.shape
    mk, i64, f32 = helper.make_node, TensorProto.INT64, TensorProto.FLOAT
    g = helper.make_graph(
        [
            mk("Shape", ["input_ids"], ["ids_shape"]),
            mk("Concat", ["ids_shape", "K"], ["x_shape"], axis=0),
            mk("Reshape", ["X", "x_shape"], ["Xt"]),
            mk("MatMul", ["Xt", "W"], ["Y"], name="layer"),
        ],
        "layer",
        [
            helper.make_tensor_value_info("X", f32, [1, None, k]),
            helper.make_tensor_value_info("input_ids", i64, [1, None]),
            helper.make_tensor_value_info("last_index", i64, [1]),
            helper.make_tensor_value_info("read_index", i64, [1, 2]),
        ],
        [helper.make_tensor_value_info("Y", f32, [1, None, n])],
        initializer=[nh.from_array(w, "W"), nh.from_array(np.array([k], np.int64), "K")],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    rep = quantize_matmuls_int8(model, activations="per-token", exact_reads=True)
    if rep.dynamic != 1 or rep.exact_reads != 1:
        raise RuntimeError(f"the int8 rewrite did not give the layer exact reads: {rep}")
    return model


def _exact_reads_form(w: np.ndarray, x: np.ndarray, threads: int) -> Form:
    """:func:`exact_reads_layer` on ``x``, its last :data:`READ_ROWS` rows read."""
    m, n = x.shape[0], w.shape[1]
    if m < READ_ROWS:
        raise ValueError(f"exact reads need at least {READ_ROWS} rows; x has {m}.")
    model = exact_reads_layer(w)
    inits = list(model.graph.initializer)
    nbytes = sum(int(np.prod(t.dims)) for t in inits if t.name.endswith("_int8")) + 4 * n
    sess = _session(model, threads)
    feed = {
        "X": x[None],
        "input_ids": np.zeros((1, m), np.int64),
        "last_index": np.array([m - READ_ROWS], np.int64),
        "read_index": np.arange(m - READ_ROWS + 1, m, dtype=np.int64)[None],
    }
    return Form(PER_TOKEN_EXACT, nbytes, lambda: sess.run(["Y"], feed)[0][0])


def rotated_layer(w: np.ndarray, block: int) -> Any:
    """``X @ w`` as the export writes a layer rotated in blocks of ``block``
    (:func:`~spotstop.export.int8.block_rotation`): the weight stored as ``Rᵀ w``, the input
    multiplied by the ``b × b`` constant (the export's own nodes, ``rotate_nodes``) before its
    symmetric per-token quantization: the output is ``X w`` up to int8 rounding."""
    from onnx import numpy_helper as nh
    from spotstop.export.int8_graph import rotate_nodes
    from spotstop.export.int8_math import block_rotation, rotate_weight

    r = block_rotation(w.shape[0], block)
    if r is None:
        raise ValueError(f"K = {w.shape[0]} has no rotation block up to {block}.")
    model = per_token_layer(rotate_weight(w, r).astype(np.float32), symmetric=True)
    b = r.shape[0]
    g = model.graph
    g.initializer.extend(
        [
            nh.from_array(r.astype(np.float32), "R"),
            nh.from_array(np.array([-1, b], np.int64), "Rrows"),
        ]
    )
    pre: list[Any] = []
    xr = rotate_nodes("X", "R", "Rrows", pre)
    rest = list(g.node)
    for nd in rest:
        for i, name in enumerate(nd.input):
            if name == "X":
                nd.input[i] = xr
    del g.node[:]
    g.node.extend(pre + rest)
    return model


def _rotated_form(w: np.ndarray, block: int, ort_form: Callable[..., Form]) -> Form:
    model = rotated_layer(w, block)
    inits = list(model.graph.initializer)
    nbytes = sum(int(np.prod(t.dims)) for t in inits if t.name.endswith("_int8")) + 4 * w.shape[1]
    return ort_form(
        f"{PER_TOKEN_SYMMETRIC}, input rotated in blocks of {block}",
        list(model.graph.node),
        inits,
        nbytes,
    )


def _is_symmetric(model: Any) -> bool:
    """Whether the rewritten layer quantizes its input without a midpoint (no ``a − μ``)."""
    return not any(nd.op_type == "Sub" for nd in model.graph.node)


def _per_token_form(
    w: np.ndarray,
    ort_form: Callable[..., Form],
    symmetric: bool = False,
    weight_form: str | None = None,
) -> Form:
    """The layer as ``spotstop export --precision int8`` rewrites it (:func:`per_token_layer`);
    ``weight_form`` named: that form, whether or not this host computes it exactly (its error
    column says)."""
    n = w.shape[1]
    model = per_token_layer(w, symmetric, weight_form)
    inits = list(model.graph.initializer)
    nbytes = sum(int(np.prod(t.dims)) for t in inits if t.name.endswith("_int8")) + 4 * n
    name = PER_TOKEN_SYMMETRIC if symmetric else PER_TOKEN
    if weight_form is not None:
        name = f"onnxruntime MatMulIntegerToFloat per token, {weight_form} weights"
    return ort_form(name, list(model.graph.node), inits, nbytes)


def _best(call: Callable[[], Any], repeats: int) -> float:
    call()  # warm-up: pre-packing, first-touch allocation
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth(threads: int, repeats: int, gib: float = 1.0) -> float:
    """GB/s of ``torch.sum`` over ``gib`` GiB of float32 on ``threads`` threads, best of
    ``repeats``: the rate weights stream from memory."""
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    s = _best(lambda: float(a.sum()), repeats)
    return a.numel() * 4 / s / 1e9


def measure(
    shape: tuple[int, int, int] = SHAPE,
    threads: int = 2,
    repeats: int = 10,
    seed: int = 0,
    read_gib: float = 1.0,
) -> dict[str, Any]:
    """Every form's best time and error, and the read bandwidth, measured now."""
    m, k, n = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(np.float32)
    forms = build_forms(x, w, threads)
    ref = forms[0].run()
    norm = float(np.linalg.norm(ref))
    rows = []
    for f in forms:
        y = f.run()
        rows.append(
            {
                "form": f.name,
                "seconds": _best(f.run, repeats),
                "weight_bytes": int(f.weight_bytes),
                "rel_err": float(np.linalg.norm(y.astype(np.float32) - ref)) / norm,
            }
        )
        del y
    del forms
    # the same forms on activations with one outlier row: the error on the other rows
    xo = x.copy()
    xo[0] *= OUTLIER_TOKEN
    forms = build_forms(xo, w, threads)
    ref_o = forms[0].run()[1:]
    norm_o = float(np.linalg.norm(ref_o))
    for f, row in zip(forms, rows, strict=True):
        row["rel_err_outlier"] = (
            float(np.linalg.norm(f.run()[1:].astype(np.float32) - ref_o)) / norm_o
        )
    del forms
    return {
        "shape": [m, k, n],
        "threads": threads,
        "repeats": repeats,
        "rows": rows,
        "read_gbs": read_bandwidth(threads, max(3, repeats // 2), read_gib),
        "read_gib": read_gib,
        "cpu": cpu_info(),
        "versions": _versions(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def with_ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row with its GFLOP/s and its speed against onnxruntime fp32 and torch bf16 (their
    time / its time: above 1 is faster); a baseline missing from the run: None."""
    m, k, n = doc["shape"]
    by = {r["form"]: r["seconds"] for r in doc["rows"]}
    out = []
    for r in doc["rows"]:
        s = r["seconds"]
        out.append(
            {
                **r,
                "gflops": 2 * m * k * n / s / 1e9,
                "vs_ort_fp32": by[REF] / s if REF in by else None,
                "vs_torch_bf16": by[BF16] / s if BF16 in by else None,
            }
        )
    return out


def peaks(doc: dict[str, Any]) -> dict[str, float]:
    """The best GFLOP/s this run measured per arithmetic (fp32, bf16, int8) and the read
    bandwidth: the CPU figures a roofline of this machine divides by (bench/real_pair.py)."""
    rows = with_ratios(doc)

    def best(pred: Callable[[str], bool]) -> float:
        return max((r["gflops"] for r in rows if pred(r["form"])), default=float("nan"))

    return {
        "fp32_gflops": best(lambda f: f in (REF, "torch fp32")),
        "bf16_gflops": best(lambda f: f == BF16),
        "int8_gops": best(
            lambda f: "DynamicQuantize" in f or "MatMulInteger" in f or f.endswith("acc 4")
        ),
        "read_gbs": float(doc["read_gbs"]),
    }


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def render(doc: dict[str, Any], command: str = "") -> str:
    m, k, n = doc["shape"]
    cpu = doc["cpu"]
    lines = [
        f"### One linear layer, {m} x {k} @ {k} x {n}, every form on this CPU (issue #24)",
        "",
        f"Best of {doc['repeats']} after a warm-up, {doc['threads']} threads, one run; Gaussian "
        "activations and weights (no outlier channels: the int8 errors are a floor). "
        "Speed-up = baseline time / this time.",
        "",
        f"| form | best | GFLOP/s | weight bytes | rel. error vs fp32 | the same, one token "
        f"x{OUTLIER_TOKEN:g} (the others) | vs onnxruntime fp32 | vs torch bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in with_ratios(doc):
        eo = r.get("rel_err_outlier")
        lines.append(
            f"| {r['form']} | {r['seconds'] * 1e3:.1f} ms | {r['gflops']:.0f} | "
            f"{r['weight_bytes'] / 2**20:.1f} MiB | {r['rel_err']:.2e} | "
            f"{'n/a' if eo is None else f'{eo:.2e}'} | {_x(r['vs_ort_fp32'])} | "
            f"{_x(r['vs_torch_bf16'])} |"
        )
    lines += [
        "",
        f"Memory read (torch.sum over {doc.get('read_gib', 1.0):g} GiB float32, "
        f"{doc['threads']} threads): "
        f"{doc['read_gbs']:.1f} GB/s.",
        "",
        f"Measured by `python bench/int8_gemm.py{(' ' + command) if command else ''}` "
        f"({doc['date']}); CPU {cpu['model']}, {cpu['cores']} logical cores; flags "
        f"{', '.join(cpu['flags']) or 'none of ' + ', '.join(FLAGS)}"
        + (f"; without {', '.join(cpu['missing'])}" if cpu["missing"] else "")
        + "; "
        + ", ".join(f"{a} {b}" for a, b in doc["versions"].items())
        + ".",
    ]
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for d in ("onnxruntime", "torch", "numpy"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = "absent"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--shape",
        default="x".join(map(str, SHAPE)),
        metavar="MxKxN",
        help=f"layer shape (default {'x'.join(map(str, SHAPE))}: Qwen3.5-2B's MLP up projection)",
    )
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per form (default 10)")
    ap.add_argument(
        "--read-gib", type=float, default=1.0, help="GiB read for the bandwidth (default 1)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to update")
    ap.add_argument("--no-results", action="store_true", help="write no RESULTS.md section")
    args = ap.parse_args(argv)
    try:
        shape = tuple(int(v) for v in args.shape.lower().split("x"))
        assert len(shape) == 3 and min(shape) > 0
    except (ValueError, AssertionError):
        ap.error(f"--shape must be MxKxN, e.g. 383x2048x6144; got {args.shape!r}")
    doc = measure(shape, args.threads, args.repeats, read_gib=args.read_gib)
    doc["peaks"] = peaks(doc)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    text = render(doc, command)
    if not args.no_results:
        write_section(args.results, "int8-gemm", text)
    print(json.dumps(doc, indent=1) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
