"""onnxruntime's fused CPU kernels against the standard nodes they would replace, at the real
members' shapes: which one the "fused" graph form writes is decided by this table.

Each row times one piece of a decoder both ways in the same run (best of ``--repeats`` after a
warm-up, ``--threads`` threads, onnxruntime's CPU provider) and checks that both give the same
numbers (max abs difference). Shapes come from the recorded configs of Qwen3.5-2B and
LFM2.5-VL-3B (export/archs/: ``QWEN35_2B``, ``LFM25_VL_3B``) at the prompt lengths of the
latency table (``--qwen-tokens``, ``--lfm2-tokens``):

* ``gated norm``: Qwen3.5's per-value-head gated RMSNorm (tokens x value heads rows of the
  value head size): com.microsoft ``GatedRMSNorm`` against ``SimplifiedLayerNormalization``
  times ``silu(gate)`` (Sigmoid, Mul, Mul).
* ``short conv``: the depthwise causal convolution of Qwen3.5's Gated-DeltaNet (2 key dims +
  the value dim channels, SiLU after) and of LFM2's conv layers (hidden-size channels, no
  activation): com.microsoft ``CausalConvWithState`` against ``Pad`` + ``Conv`` (group = the
  channels) (+ Sigmoid, Mul).
* ``per-token int8 product``: the MLP up projection as ``spotstop export --precision int8``
  writes it (export/int8.py: ``MatMulIntegerToFloat``) against the same arithmetic in standard
  ONNX nodes (``MatMulInteger``, ``Cast``, ``Mul`` by the column scales, ``Mul`` by the row
  steps).
* ``vision rotary``: Qwen3.5's vision attention inputs, q/k/v split from the fused projection
  and q, k rotated (2-D rotary, half split): ``Split`` and com.microsoft ``RotaryEmbedding``
  against the decomposition the exporter writes for transformers' code.
* ``vision attention, padded patches``: LFM2.5-VL-3B's SigLIP2 attention with a key padding
  mask: com.microsoft ``MultiHeadAttention`` against the exporter's SDPA decomposition.
* ``per-token int8 codes``: the activation's uint8 codes ``Round((x − μ) / σ) + 128`` per row,
  at the input of Qwen3.5-2B's vision MLP down projection (patches x intermediate): one
  ``QuantizeLinear`` per axis over the flattened rows (what the export writes from opset 13)
  against ``Div``, ``Round``, ``Add``, ``Cast`` (both after the same row range and ``x − μ``).

The export writes the faster of each pair (export/fused.py, export/int8.py); a later
onnxruntime may turn a row around, and this script is how to see it.

    python bench/fused_ops.py                 # the table, into bench/RESULTS.md
    python bench/fused_ops.py --no-results --json

Writes the section ``fused-ops`` of bench/RESULTS.md (``--results``; ``--no-results``: none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

#: prompt tokens of one scene in the latency table (bench/real_pair.py), per member
QWEN_TOKENS = 383
LFM2_TOKENS = 186
#: the patches of one scene's image in Qwen3.5-2B's vision tower (bench/real_pair.py's 512 x 512)
VISION_PATCHES = 1024
#: the patches of one scene's image in LFM2.5-VL-3B's vision tower (its int8 bundle's input)
LFM2_PATCHES = 256


@dataclass(frozen=True)
class Pair:
    """One piece of a decoder, as the fused kernel and as standard nodes."""

    piece: str
    shape: str
    fused: str
    standard: str
    fused_graph: Any
    standard_graph: Any
    feeds: dict[str, np.ndarray]


def _model(
    nodes: list[Any],
    inputs: dict[str, tuple[int, ...]],
    out: tuple[int, ...],
    inits: dict[str, np.ndarray],
) -> Any:
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    graph = helper.make_graph(
        nodes,
        "piece",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))],
        initializer=[nh.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 10
    return m


def gated_norm_pair(tokens: int, heads: int, dim: int, rng: np.random.Generator) -> Pair:
    from onnx import helper

    rows = tokens * heads
    w = rng.standard_normal(dim).astype(np.float32)
    shape = (rows, dim)
    fused = _model(
        [
            helper.make_node(
                "GatedRMSNorm",
                ["x", "w", "g"],
                ["y"],
                domain="com.microsoft",
                activation="silu",
                epsilon=1e-6,
            )
        ],
        {"x": shape, "g": shape},
        shape,
        {"w": w},
    )
    standard = _model(
        [
            helper.make_node(
                "SimplifiedLayerNormalization", ["x", "w"], ["n"], axis=-1, epsilon=1e-6
            ),
            helper.make_node("Sigmoid", ["g"], ["s"]),
            helper.make_node("Mul", ["g", "s"], ["silu"]),
            helper.make_node("Mul", ["n", "silu"], ["y"]),
        ],
        {"x": shape, "g": shape},
        shape,
        {"w": w},
    )
    feeds = {k: rng.standard_normal(shape).astype(np.float32) for k in ("x", "g")}
    return Pair(
        "Qwen3.5-2B gated norm",
        f"{tokens} tokens x {heads} heads, {dim}",
        "GatedRMSNorm",
        "SimplifiedLayerNormalization · silu(gate)",
        fused,
        standard,
        feeds,
    )


def short_conv_pair(
    member: str, tokens: int, channels: int, kernel: int, silu: bool, rng: np.random.Generator
) -> Pair:
    from onnx import helper

    w = rng.standard_normal((channels, 1, kernel)).astype(np.float32)
    shape = (1, channels, tokens)
    fused = _model(
        [
            helper.make_node(
                "CausalConvWithState",
                ["x", "w"],
                ["y", "state"],
                domain="com.microsoft",
                activation="silu" if silu else "none",
            )
        ],
        {"x": shape},
        shape,
        {"w": w},
    )
    conv_out = "c" if silu else "y"
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("Conv", ["xp", "w"], [conv_out], group=channels, kernel_shape=[kernel]),
    ]
    if silu:
        nodes += [
            helper.make_node("Sigmoid", ["c"], ["s"]),
            helper.make_node("Mul", ["c", "s"], ["y"]),
        ]
    pads = np.array([0, 0, kernel - 1, 0, 0, 0], dtype=np.int64)
    standard = _model(nodes, {"x": shape}, shape, {"w": w, "pads": pads})
    return Pair(
        f"{member} short conv",
        f"{channels} channels x {tokens} tokens, kernel {kernel}{', SiLU' if silu else ''}",
        "CausalConvWithState",
        "Pad + Conv (depthwise)" + (" + SiLU" if silu else ""),
        fused,
        standard,
        {"x": rng.standard_normal(shape).astype(np.float32)},
    )


def int8_product_pair(tokens: int, k: int, n: int, rng: np.random.Generator) -> Pair:
    """export/int8.py's per-token layer, and the same graph with its MatMulIntegerToFloat
    spelled as MatMulInteger + Cast + Mul by the column scales, then by the row steps (the same
    integers and scales)."""
    from int8_gemm import per_token_layer
    from onnx import TensorProto, helper

    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    fused = per_token_layer(w)
    standard = type(fused)()
    standard.CopyFrom(fused)
    nodes = list(standard.graph.node)
    i = next(j for j, nd in enumerate(nodes) if nd.op_type == "MatMulIntegerToFloat")
    q, codes, sigma, scales, zp, *w_zero = nodes[i].input  # w_zero: the u8 weight form's
    out = nodes[i].output[0]
    spelled = [
        helper.make_node("MatMulInteger", [q, codes, zp, *w_zero], [f"{out}_i32"]),
        helper.make_node("Cast", [f"{out}_i32"], [f"{out}_f32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [f"{out}_f32", scales], [f"{out}_col"]),
        helper.make_node("Mul", [f"{out}_col", sigma], [out]),  # the row steps
    ]
    del standard.graph.node[:]
    standard.graph.node.extend(nodes[:i] + spelled + nodes[i + 1 :])
    return Pair(
        "Qwen3.5-2B MLP up, per-token int8",
        f"{tokens} x {k} @ {k} x {n}",
        "MatMulIntegerToFloat",
        "MatMulInteger + Cast + Mul",
        fused,
        standard,
        {"X": rng.standard_normal((tokens, k)).astype(np.float32)},
    )


def quantize_codes_pair(rows: int, k: int, rng: np.random.Generator) -> Pair:
    """export/int8.py's per-token codes in both graph forms (opset 21 and opset 12)."""
    from spotstop.export.int8_graph import per_token_codes_model

    def as_y(model: Any) -> Any:
        from onnx import TensorProto, helper

        g = model.graph
        g.node.append(helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT))
        del g.output[:]
        g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None]))
        return model

    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[:, : k // 64] *= 20.0  # outlier channels, as trained towers have
    return Pair(
        "Qwen3.5-2B vision MLP down, per-token int8 codes",
        f"{rows} x {k}",
        "QuantizeLinear (per axis)",
        "Div + Round + Add + Cast",
        as_y(per_token_codes_model(21)),
        as_y(per_token_codes_model(12)),
        {"x": x},
    )


def vision_rotary_pair(patches: int, heads: int, dim: int, rng: np.random.Generator) -> Pair:
    """Qwen3.5's vision attention inputs from its fused q/k/v projection (patches x 3 heads
    dim): q, k, v split on the last axis and q, k rotated by one ``RotaryEmbedding`` each
    (export/archs/qwen3_5.py's fused vision attention) against the exporter's decomposition of
    transformers' code (reshape to heads, ``Transpose``, ``Split``, ``Squeeze``, the half-split
    rotary as ``Mul``, ``Slice``, ``Neg``, ``Concat``, ``Mul``, ``Add``, reshape back); both
    end in one ``Concat`` of q, k, v so each graph has one output."""
    from onnx import helper

    mk = helper.make_node
    half = dim // 2
    ang = rng.uniform(0, 10, (patches, half)).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    width = heads * dim
    fused = _model(
        [
            mk("Reshape", ["qkv", "b3"], ["q3"]),
            mk("Split", ["q3"], ["q", "k", "v"], axis=-1, num_outputs=3),
            *(
                mk(
                    "RotaryEmbedding",
                    [t, "offset", "c", "s"],
                    [f"{t}r"],
                    domain="com.microsoft",
                    num_heads=heads,
                    interleaved=0,
                )
                for t in ("q", "k")
            ),
            mk("Concat", ["qr", "kr", "v"], ["y"], axis=-1),
        ],
        {"qkv": (patches, 3 * width)},
        (1, patches, 3 * width),
        {
            "b3": np.array([1, patches, 3 * width], np.int64),
            "offset": np.array([0], np.int64),
            "c": cos,
            "s": sin,
        },
    )
    nodes = [
        mk("Reshape", ["qkv", "heads"], ["r"]),
        mk("Transpose", ["r"], ["t"], perm=[1, 0, 2, 3]),
        mk("Split", ["t"], ["s0", "s1", "s2"], axis=0, num_outputs=3),
    ]
    for t in ("s0", "s1"):
        nodes += [
            mk("Squeeze", [t, "ax0"], [f"{t}q"]),
            mk("Mul", [f"{t}q", "cos"], [f"{t}c"]),
            mk("Slice", [f"{t}q", "zero", "mid", "last"], [f"{t}x1"]),
            mk("Slice", [f"{t}q", "mid", "end", "last"], [f"{t}x2"]),
            mk("Neg", [f"{t}x2"], [f"{t}n"]),
            mk("Concat", [f"{t}n", f"{t}x1"], [f"{t}h"], axis=-1),
            mk("Mul", [f"{t}h", "sin"], [f"{t}s"]),
            mk("Add", [f"{t}c", f"{t}s"], [f"{t}e"]),
            mk("Reshape", [f"{t}e", "flat"], [f"{t}o"]),
        ]
    nodes += [
        mk("Squeeze", ["s2", "ax0"], ["s2q"]),
        mk("Reshape", ["s2q", "flat"], ["s2o"]),
        mk("Concat", ["s0o", "s1o", "s2o"], ["y"], axis=-1),
    ]
    standard = _model(
        nodes,
        {"qkv": (patches, 3 * width)},
        (1, patches, 3 * width),
        {
            "heads": np.array([patches, 3, heads, dim], np.int64),
            "cos": np.concatenate([cos, cos], -1)[:, None, :],
            "sin": np.concatenate([sin, sin], -1)[:, None, :],
            "ax0": np.array([0], np.int64),
            "zero": np.array([0], np.int64),
            "mid": np.array([half], np.int64),
            "end": np.array([dim], np.int64),
            "last": np.array([-1], np.int64),
            "flat": np.array([1, patches, width], np.int64),
        },
    )
    return Pair(
        "Qwen3.5-2B vision q/k/v split and 2-D rotary",
        f"{patches} x 3 x {heads} x {dim}",
        "Split + RotaryEmbedding x 2",
        "Reshape, Transpose, Split + Mul, Slice, Neg, Concat, Mul, Add x 2",
        fused,
        standard,
        {"qkv": rng.standard_normal((patches, 3 * width)).astype(np.float32)},
    )


def masked_attention_pair(patches: int, heads: int, dim: int, rng: np.random.Generator) -> Pair:
    """LFM2.5-VL-3B's SigLIP2 vision attention over ``patches`` patches, the last eighth
    padding: one com.microsoft ``MultiHeadAttention`` with the key padding mask
    (export/archs/lfm2_vl.py's fused vision attention) against what the exporter writes for
    transformers' SDPA with a boolean mask (heads split by ``Reshape`` + ``Transpose``,
    ``MatMul``, the mask as ``Where``, ``Softmax``, its NaN rows zeroed by ``IsNaN`` +
    ``Where``, ``MatMul``, heads merged)."""
    from onnx import helper

    mk = helper.make_node
    width = heads * dim
    keep = np.ones((1, patches), np.int32)
    keep[0, patches - max(1, patches // 8) :] = 0
    seq = (1, patches, width)
    fused = _model(
        [
            mk(
                "MultiHeadAttention",
                ["q", "k", "v", "", "keep"],
                ["y"],
                domain="com.microsoft",
                num_heads=heads,
                scale=dim**-0.5,
            )
        ],
        {"q": seq, "k": seq, "v": seq},
        seq,
        {"keep": keep},
    )
    nodes = []
    for t in "qkv":
        nodes += [
            mk("Reshape", [t, "heads"], [f"{t}h"]),
            mk("Transpose", [f"{t}h"], [f"{t}t"], perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]),
        ]
    nodes += [
        mk("MatMul", ["qt", "kt"], ["s0"]),
        mk("Mul", ["s0", "scale"], ["s1"]),
        mk("Where", ["mask", "s1", "ninf"], ["s2"]),
        mk("Softmax", ["s2"], ["p0"], axis=-1),
        mk("IsNaN", ["p0"], ["nan"]),
        mk("Where", ["nan", "zero", "p0"], ["p1"]),
        mk("MatMul", ["p1", "vt"], ["o"]),
        mk("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        mk("Reshape", ["ot", "flat"], ["y"]),
    ]
    standard = _model(
        nodes,
        {"q": seq, "k": seq, "v": seq},
        seq,
        {
            "heads": np.array([1, patches, heads, dim], np.int64),
            "scale": np.float32(dim**-0.5),
            "mask": np.broadcast_to(keep.astype(bool)[:, None, None, :], (1, 1, patches, patches)),
            "ninf": np.float32(-np.inf),
            "zero": np.float32(0),
            "flat": np.array([1, patches, width], np.int64),
        },
    )
    return Pair(
        "LFM2.5-VL-3B vision attention, padded patches",
        f"{patches} patches x {heads} x {dim}",
        "MultiHeadAttention (key padding mask)",
        "MatMul, Where, Softmax, IsNaN, Where, MatMul",
        fused,
        standard,
        {t: rng.standard_normal(seq).astype(np.float32) for t in "qkv"},
    )


def pairs(
    qwen_tokens: int = QWEN_TOKENS, lfm2_tokens: int = LFM2_TOKENS, scale: int = 1, seed: int = 0
) -> list[Pair]:
    """Every pair at the recorded members' shapes (``scale`` > 1 divides the widths and the
    lengths: a quick trial, as the test runs it)."""
    from spotstop.export.archs.lfm2_vl import LFM25_VL_3B
    from spotstop.export.archs.qwen3_5 import QWEN35_2B

    rng = np.random.default_rng(seed)
    q = QWEN35_2B.config["text_config"]
    lf = LFM25_VL_3B.config["text_config"]
    v = QWEN35_2B.config["vision_config"]
    lv = LFM25_VL_3B.config["vision_config"]
    patches = VISION_PATCHES
    qt, lt = max(2, qwen_tokens // scale), max(2, lfm2_tokens // scale)
    hv, dv = int(q["linear_num_value_heads"]), int(q["linear_value_head_dim"])
    kd = int(q["linear_num_key_heads"]) * int(q["linear_key_head_dim"])
    return [
        gated_norm_pair(qt, max(1, hv // scale), dv, rng),
        short_conv_pair(
            "Qwen3.5-2B",
            qt,
            (2 * kd + hv * dv) // scale,
            int(q.get("linear_conv_kernel_dim", 4)),
            True,
            rng,
        ),
        short_conv_pair(
            "LFM2.5-VL-3B",
            lt,
            int(lf["hidden_size"]) // scale,
            int(lf.get("conv_L_cache", 3)),
            False,
            rng,
        ),
        int8_product_pair(
            qt, int(q["hidden_size"]) // scale, int(q["intermediate_size"]) // scale, rng
        ),
        quantize_codes_pair(max(2, patches // scale), int(v["intermediate_size"]) // scale, rng),
        vision_rotary_pair(
            max(2, patches // scale),
            max(1, int(v["num_heads"]) // scale),
            int(v["hidden_size"]) // int(v["num_heads"]),
            rng,
        ),
        masked_attention_pair(
            max(8, LFM2_PATCHES // scale),
            max(1, int(lv["num_attention_heads"]) // scale),
            int(lv["hidden_size"]) // int(lv["num_attention_heads"]),
            rng,
        ),
    ]


def _session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def measure(
    threads: int = 2,
    repeats: int = 20,
    qwen_tokens: int = QWEN_TOKENS,
    lfm2_tokens: int = LFM2_TOKENS,
    scale: int = 1,
) -> dict[str, Any]:
    """Each pair's two times, their ratio and their largest difference, measured now."""
    from int8_gemm import _best, _versions, cpu_info

    rows = []
    for p in pairs(qwen_tokens, lfm2_tokens, scale):
        fs, ss = _session(p.fused_graph, threads), _session(p.standard_graph, threads)
        yf, ys = fs.run(None, p.feeds)[0], ss.run(None, p.feeds)[0]
        tf = _best(lambda fs=fs, p=p: fs.run(None, p.feeds), repeats)
        ts = _best(lambda ss=ss, p=p: ss.run(None, p.feeds), repeats)
        rows.append(
            {
                "piece": p.piece,
                "shape": p.shape,
                "fused": p.fused,
                "standard": p.standard,
                "fused_s": tf,
                "standard_s": ts,
                "max_abs_diff": float(np.abs(yf - ys).max()),
                "scale": float(np.abs(ys).max()),
            }
        )
    return {
        "threads": threads,
        "repeats": repeats,
        "scale": scale,
        "rows": rows,
        "cpu": cpu_info(),
        "versions": _versions(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def render(doc: dict[str, Any], command: str = "") -> str:
    cpu = doc["cpu"]
    lines = [
        "### onnxruntime's fused CPU kernels against standard nodes (issue #24)",
        "",
        f"Best of {doc['repeats']} after a warm-up, {doc['threads']} threads, one run. "
        "fused / standard: the fused kernel's time over the standard nodes' (above 1: the "
        "standard nodes are faster, and the export writes them).",
        "",
        "| piece | shape | fused kernel | time | standard nodes | time | fused / standard "
        "| max abs diff (of max abs) | export writes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        ratio = r["fused_s"] / r["standard_s"]
        lines.append(
            f"| {r['piece']} | {r['shape']} | {r['fused']} | {r['fused_s'] * 1e3:.2f} ms | "
            f"{r['standard']} | {r['standard_s'] * 1e3:.2f} ms | {ratio:.2f}x | "
            f"{r['max_abs_diff']:.1e} ({r['scale']:.1f}) | "
            f"{r['fused'] if ratio < 1 else r['standard']} |"
        )
    lines += [
        "",
        f"Measured by `python bench/fused_ops.py{(' ' + command) if command else ''}` "
        f"({doc['date']}); CPU {cpu['model']}, {cpu['cores']} logical cores; flags "
        f"{', '.join(cpu['flags']) or 'none'}; "
        + ", ".join(f"{a} {b}" for a, b in doc["versions"].items())
        + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per form (best kept)")
    ap.add_argument("--qwen-tokens", type=int, default=QWEN_TOKENS, help="Qwen3.5-2B's tokens")
    ap.add_argument("--lfm2-tokens", type=int, default=LFM2_TOKENS, help="LFM2.5-VL-3B's tokens")
    ap.add_argument(
        "--scale", type=int, default=1, help="divide widths and lengths by this (a quick trial)"
    )
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to update")
    ap.add_argument("--no-results", action="store_true", help="write no RESULTS.md section")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    doc = measure(args.threads, args.repeats, args.qwen_tokens, args.lfm2_tokens, args.scale)
    text = render(doc, " ".join(sys.argv[1:] if argv is None else argv))
    print(json.dumps(doc, indent=1) if args.json else text)
    if not args.no_results:
        write_section(args.results, "fused-ops", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
