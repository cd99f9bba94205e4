"""fp16 graphs and tied output layers of exported members.

* fp16: every graph loads in onnxruntime (CPU) and matches its fp32 graph within the fp16
  tolerances of its export config, also where float16 would overflow (RMSNorm variance of
  large activations), with the normalisers and the Gated-DeltaNet decay kept in float32.
* tied output layer: a member whose output layer is its token-embedding table stores that
  table ONCE at fp32, fp16, int8 and int4.

The member tests are parametrized over the registered export configs (conftest's
``by_arch``). The tiny LFM2-VL member ties its embeddings and exports with the legacy exporter
in seconds: its cases run in the default test run. The tiny Qwen3.5 member does not tie them
and its decoder needs the dynamo exporter (minutes): its cases are ``slow`` and share one fp32
bundle export, from which the other precisions are derived without exporting again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from spotstop.export.configs import get_export_config  # noqa: E402
from spotstop.export.fp16 import fp32_nodes, to_fp16  # noqa: E402
from spotstop.export.onnx import _session, onnx_weight_bytes  # noqa: E402
from spotstop.export.precision import convert_precision, get_precision  # noqa: E402
from spotstop.export.weights import tie_output_layer, untie_for_quantizer  # noqa: E402

from tests._support import REPO_ROOT  # noqa: E402
from tests._support.pair import by_arch, fp32_bundle  # noqa: E402

QUANT = ("int8", "int8-nbits", "int4")

# -- helpers ---------------------------------------------------------------------------------


def _member_graphs(bundle: Path, member: str) -> dict[str, Any]:
    """vision + the first decoder graph of a bundle member, loaded with their weights."""
    onnx_dir = bundle / "members" / member / "onnx"
    dec = sorted(p for p in onnx_dir.glob("decoder*.onnx"))[0]
    return {
        "vision": onnx.load(str(onnx_dir / "vision.onnx")),
        "decoder": onnx.load(str(dec)),
    }


def _dims(model: Any, name: str) -> list[int | None]:
    vi = next(i for i in model.graph.input if i.name == name)
    return [d.dim_value or None for d in vi.type.tensor_type.shape.dim]


def _vocab(model: Any) -> int:
    """Rows of the token-embedding table (the float initializer a Gather reads)."""
    inits = {t.name: t for t in model.graph.initializer}
    return max(
        int(inits[n.input[0]].dims[0])
        for n in model.graph.node
        if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2
    )


def _feeds(model: Any, seed: int, *, batch: int = 2, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random inputs for a decoder or vision graph (shapes from the graph, batch ``batch``)."""
    rng = np.random.default_rng(seed)
    names = [i.name for i in model.graph.input]
    if names == ["pixel_values"]:
        shape = [d or 1 for d in _dims(model, "pixel_values")]
        return {"pixel_values": rng.uniform(-1, 1, shape).astype(np.float32)}
    length = _dims(model, "input_ids")[1] or 48
    _, n_img, hidden = _dims(model, "image_embeds")
    vocab = _vocab(model)
    last = rng.integers(length // 2, length - 4, batch)
    reads = last[:, None] + rng.integers(1, 4, (batch, 3))
    return {
        "input_ids": rng.integers(0, vocab, (batch, length)).astype(np.int64),
        "image_embeds": (scale * rng.standard_normal((batch, n_img or 4, hidden))).astype(
            np.float32
        ),
        "last_index": last.astype(np.int64),
        "read_index": reads.astype(np.int64),
        "read_token": rng.integers(0, vocab, (batch, 3)).astype(np.int64),
    }


def _close(got: list[np.ndarray], want: list[np.ndarray], atol: float, rtol: float) -> None:
    for g, w in zip(got, want, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=atol, rtol=rtol)


def _scale_embeddings(model: Any, factor: float) -> Any:
    """A copy whose token embeddings (the Gather's output, not the output layer) × ``factor``.

    Every norm is scale-invariant, so the outputs barely move, but the residual stream and the
    squares in RMSNorm's variance grow by factor and factor² (float16 overflows at 65504).
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    gather = next(n for n in m.graph.node if n.op_type == "Gather" and n.input[0] in inits)
    out = gather.output[0]
    gather.output[0] = out + "_unscaled"
    m.graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "scale_k"))
    idx = list(m.graph.node).index(gather)
    m.graph.node.insert(idx + 1, helper.make_node("Mul", [out + "_unscaled", "scale_k"], [out]))
    return m


def _types(model: Any) -> dict[str, int]:
    """Element type of every tensor of ``model`` (onnx shape inference)."""
    from onnx import shape_inference

    typed = shape_inference.infer_shapes(model)
    out = {t.name: t.data_type for t in typed.graph.initializer}
    for v in [*typed.graph.input, *typed.graph.value_info, *typed.graph.output]:
        out[v.name] = v.type.tensor_type.elem_type
    return out


def _float16_round_trips(model: Any) -> list[str]:
    """Cast(to=float32)(Cast(to=float16)(x)) with x float32: a float32 value rounded to float16."""
    producer = {o: n for n in model.graph.node for o in n.output}

    def to(n: Any) -> int | None:
        if n is None or n.op_type != "Cast":
            return None
        return next(a.i for a in n.attribute if a.name == "to")

    types = _types(model)
    return [
        n.name
        for n in model.graph.node
        if to(n) == TensorProto.FLOAT
        and to(inner := producer.get(n.input[0])) == TensorProto.FLOAT16
        and types.get(inner.input[0]) == TensorProto.FLOAT
    ]


def _tables(model: Any, vocab: int, hidden: int) -> list[Any]:
    """Initializers holding a vocab × hidden table in any layout or precision."""
    n = vocab * hidden
    out = []
    for t in model.graph.initializer:
        size = int(np.prod(t.dims)) if t.dims else 1
        if t.data_type == TensorProto.UINT8 and t.dims and int(t.dims[0]) == vocab:
            out.append(t)  # quantized blocks (vocab, k_blocks, blob)
        elif size == n and t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            out.append(t)
    return out


def _assert_one_table(model: Any, vocab: int, hidden: int, precision: str) -> None:
    tables = _tables(model, vocab, hidden)
    if get_precision(precision).table_residual:  # the blocks, and their rounding residual's
        residual = [t for t in tables if t.name.endswith("_residual")]
        assert len(residual) == 1, [(t.name, list(t.dims)) for t in tables]
        readers = [n for n in model.graph.node if residual[0].name in n.input]
        assert [n.op_type for n in readers] == ["GatherBlockQuantized"]
        assert helper.get_node_attr_value(readers[0], "bits") == 8
        tables = [t for t in tables if t is not residual[0]]
    assert len(tables) == 1, [(t.name, list(t.dims)) for t in tables]
    (table,) = tables
    readers = [n for n in model.graph.node if table.name in n.input]
    ops = sorted(n.op_type for n in readers)
    if precision in QUANT:
        assert ops == ["GatherBlockQuantized", "MatMulNBits"], ops
    else:
        assert ops == ["Gather", "Gemm"], ops
        gemm = next(n for n in readers if n.op_type == "Gemm")
        assert helper.get_node_attr_value(gemm, "transB") == 1
        want = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.FLOAT
        assert table.data_type == want
    assert not any(n.op_type == "Transpose" and table.name in n.input for n in model.graph.node)


# -- synthetic graphs: the root cause and the repairs ----------------------------------------


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_fp16_root_cause_scalar_float_constants() -> None:
    """``Constant(value_float)`` (what the dynamo exporter writes for ``new_ones``) + a
    type-generic consumer: the plain converter retypes the output but not the attribute."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    nodes = [
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Expand", ["one", "shape"], ["ones"]),
        helper.make_node("Add", ["x", "ones"], ["y"]),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = _model(nodes, [x_info], [y_info], [])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    plain = convert_float_to_float16(
        onnx.load_from_string(model.SerializeToString()), keep_io_types=True
    )
    with pytest.raises(Exception, match="tensor\\(float"):
        _session(plain)
    (y,) = _session(to_fp16(model)).run(None, {"x": x})
    np.testing.assert_array_equal(y, x + 1)


def test_fp16_keeps_a_float32_region_in_float32() -> None:
    """An RMSNorm of large activations (legacy node names): the plain converter overflows in
    the variance; ours keeps the whole region float32, with no float16 round trip inside."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    h = 64
    rng = np.random.default_rng(0)
    w = rng.standard_normal((h, h)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["/norm/Pow_output_0"], name="/norm/Pow"),
        helper.make_node(
            "ReduceMean", ["/norm/Pow_output_0", "axes"], ["/norm/var"], name="/norm/ReduceMean"
        ),
        helper.make_node("Add", ["/norm/var", "eps"], ["/norm/add"], name="/norm/Add"),
        helper.make_node("Sqrt", ["/norm/add"], ["/norm/sqrt"], name="/norm/Sqrt"),
        helper.make_node("Div", ["x", "/norm/sqrt"], ["/norm/out"], name="/norm/Div"),
        helper.make_node("MatMul", ["/norm/out", "w"], ["y"], name="/proj/MatMul"),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(w, "w"),
    ]
    io = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, h]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, h]),
    ]
    model = _model(nodes, [io[0]], [io[1]], inits)
    x = (3000 * rng.standard_normal((3, h))).astype(np.float32)  # x² ≫ 65504
    (want,) = _session(model).run(None, {"x": x})
    # onnxruntime's CPU provider fuses this into SimplifiedLayerNormalization (float32 inside)
    # and runs float16 ops it lacks kernels for in float32, so the plain graph happens to work
    # there; a strongly typed TensorRT engine runs each op in the type the graph states.
    plain = convert_float_to_float16(
        onnx.load_from_string(model.SerializeToString()), keep_io_types=True
    )
    assert _types(plain)["/norm/Pow_output_0"] == TensorProto.FLOAT16
    ours = to_fp16(onnx.load_from_string(model.SerializeToString()))
    (got,) = _session(ours).run(None, {"x": x})
    np.testing.assert_allclose(got, want, atol=5e-2, rtol=1e-2)
    assert not _float16_round_trips(ours)
    types = _types(ours)
    norm = [n for n in ours.graph.node if n.name.startswith("/norm/") and n.op_type != "Cast"]
    assert not [x for n in norm for x in [*n.input, *n.output] if types[x] == TensorProto.FLOAT16]
    matmul = next(n for n in ours.graph.node if n.op_type == "MatMul")
    assert types[matmul.input[0]] == types[matmul.input[1]] == TensorProto.FLOAT16


@pytest.mark.parametrize("form", ["transpose_node", "folded_copy"])
def test_tie_output_layer_on_both_exporter_forms(form: str) -> None:
    """Dynamo writes MatMul(x, Transpose(W)); the legacy exporter folds Wᵀ into a second
    initializer. Both become Gemm(transB=1) on the Gather's W, with the same outputs."""
    vocab, hidden = 300, 64
    rng = np.random.default_rng(1)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["W", "ids"], ["emb"])]
    inits = [numpy_helper.from_array(table, "W")]
    if form == "transpose_node":
        nodes.append(helper.make_node("Transpose", ["W"], ["WT"], perm=[1, 0]))
    else:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(table.T), "WT"))
    nodes.append(helper.make_node("MatMul", ["emb", "WT"], ["logits"]))
    model = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 5, vocab])],
        inits,
    )
    ids = rng.integers(0, vocab, (2, 5)).astype(np.int64)
    (want,) = _session(model).run(None, {"ids": ids})
    tied = tie_output_layer(onnx.load_from_string(model.SerializeToString()))
    (got,) = _session(tied).run(None, {"ids": ids})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _assert_one_table(tied, vocab, hidden, "fp32")
    saved = table.nbytes if form == "folded_copy" else 0
    assert onnx_weight_bytes(tied) <= onnx_weight_bytes(model) - saved + 64  # + shape constants
    # a table that is not the output layer's transpose is left alone
    other = onnx.load_from_string(model.SerializeToString())
    if form == "folded_copy":
        t = next(t for t in other.graph.initializer if t.name == "WT")
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(table.T) + 1.0, "WT"))
        assert not any(n.op_type == "Gemm" for n in tie_output_layer(other).graph.node)


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_tie_output_layer_on_real_exports(exporter: str, tmp_path: Path) -> None:
    """A tied embedding + output layer as both torch exporters write it (seconds)."""
    import torch
    from spotstop.export.exporters import _exporter_noise
    from spotstop.export.weights import fold_weight_transposes
    from torch import nn

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(300, 64)
            self.head = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.embed(ids))[:, 1:3]
            return torch.log_softmax(h @ self.head.T, dim=-1)

    torch.manual_seed(0)
    mod = Tied().eval()
    ids = torch.randint(0, 300, (2, 6))
    path = tmp_path / "tied.onnx"
    with torch.no_grad(), _exporter_noise():
        if exporter == "dynamo":
            torch.onnx.export(mod, (ids,), str(path), dynamo=True, optimize=False, opset_version=18)
        else:
            torch.onnx.export(mod, (ids,), str(path), dynamo=False, opset_version=17)
        want = mod(ids).numpy()
    raw = fold_weight_transposes(onnx.load(str(path)))
    assert len(_tables(raw, 300, 64)) == 2  # the table and its transposed copy
    tied = fold_weight_transposes(tie_output_layer(onnx.load(str(path))))
    for precision in ("fp32", "fp16", "int8"):
        m = convert_precision(tied, precision)
        _assert_one_table(m, 300, 64, precision)
        (got,) = _session(m).run(None, {m.graph.input[0].name: ids.numpy()})
        tol = {"fp32": (1e-5, 1e-5), "fp16": (2e-2, 1e-3), "int8": (0.5, 1e-2)}[precision]
        np.testing.assert_allclose(got, want, atol=tol[0], rtol=tol[1], err_msg=precision)


# -- every registered architecture's tiny member ---------------------------------------------


def _graphs(request: pytest.FixtureRequest, arch: str) -> dict[str, Any]:
    return _member_graphs(fp32_bundle(request, arch), f"tiny-{arch}")


@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_fp16_matches_fp32(arch: str, request: pytest.FixtureRequest) -> None:
    cfg = get_export_config(arch)
    graphs = _graphs(request, arch)
    sessions = {
        (g, p): _session(convert_precision(m, p))
        for g, m in graphs.items()
        for p in ("fp32", "fp16")
    }

    @settings(max_examples=6, deadline=None)
    @given(seed=st.integers(0, 2**31 - 1), graph=st.sampled_from(sorted(graphs)))
    def check(seed: int, graph: str) -> None:
        feeds = _feeds(graphs[graph], seed)
        want = sessions[(graph, "fp32")].run(None, feeds)
        got = sessions[(graph, "fp16")].run(None, feeds)
        _close(got, want, cfg.atol["fp16"], cfg.rtol["fp16"])

    check()


@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_fp16_survives_large_activations(arch: str, request: pytest.FixtureRequest) -> None:
    """RMSNorm variance and the residual stream beyond float16's range."""
    cfg = get_export_config(arch)
    big = _scale_embeddings(_graphs(request, arch)["decoder"], 2000.0)
    feeds = _feeds(big, 7, scale=2000.0)
    want = _session(big).run(None, feeds)
    fp16 = convert_precision(big, "fp16")
    _close(_session(fp16).run(None, feeds), want, cfg.atol["fp16"], cfg.rtol["fp16"])
    assert not _float16_round_trips(fp16)


@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_fp16_rotary_angles_stay_float32(arch: str, request: pytest.FixtureRequest) -> None:
    """``position · inv_freq`` and its cos/sin in float32, as transformers computes them: in
    float16 the angle is rounded to 0.125 rad at positions 128-255 (cos/sin off by 1 %), which
    moved the trained tiny pair's fp16 scores by up to 0.2 nats (torch at float16: 0.017)."""
    fp16 = convert_precision(_graphs(request, arch)["decoder"], "fp16")
    types = _types(fp16)
    trig = [n for n in fp16.graph.node if n.op_type in ("Cos", "Sin")]
    assert trig
    assert not [
        n.name
        for n in trig
        if types.get(n.input[0]) != TensorProto.FLOAT or types.get(n.output[0]) != TensorProto.FLOAT
    ]
    assert not _float16_round_trips(fp16)


def test_the_trained_lfm2_vl_member_verifies_at_fp16_on_world_scenes(tmp_path: Path) -> None:
    """On the trained pair (scores spread over ±20 nats) the fp16 rotary angles moved
    LFM2-VL's scores by 0.20 against the 0.05 tolerance; the random pair, spread over 0.2
    nats, never showed it. End to end: `spotstop tiny --trained`, export at fp16, verify on
    a world's scenes."""
    from spotstop.cli import main
    from spotstop.export.verify import verify_bundle
    from spotstop.export.world import WorldOptions, case_scene, world_cases

    pair, out = tmp_path / "tt", tmp_path / "b16"
    assert main(["tiny", "--trained", "--out", str(pair)]) == 0
    member = str(pair / "tiny-lfm2_vl")
    argv = ["export", "--out", str(out), "--precision", "fp16", "--trt", "off"]
    assert main([*argv, "--member", member]) == 0
    opts = WorldOptions(rooms=4, contrasts_per_room=4)
    scenes = [case_scene(c, opts) for c in world_cases(4242, opts)]
    v = verify_bundle(out, scenes=scenes, reference=True)
    assert v.ok, str(v)


@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_output_layer_is_stored_as_the_member_ties_it(
    arch: str, request: pytest.FixtureRequest, tiny_pair: Path
) -> None:
    """A tied table is stored once at every precision; an untied one is left alone."""
    dec = _graphs(request, arch)["decoder"]
    config = json.loads((tiny_pair / f"tiny-{arch}" / "config.json").read_text(encoding="utf-8"))
    if not config.get("tie_word_embeddings"):
        assert not any(n.name.startswith("tied_output_layer") for n in dec.graph.node)
        assert not any(n.op_type == "Gemm" for n in dec.graph.node)
        return
    cfg = get_export_config(arch)
    vocab, hidden = _vocab(dec), _dims(dec, "image_embeds")[2]
    assert hidden is not None
    feeds = _feeds(dec, 3)
    for precision in ("fp32", "fp16", "int8", "int8-nbits", "int4"):
        tied = convert_precision(dec, precision)
        _assert_one_table(tied, vocab, hidden, precision)
        # the graph as exported before: the output layer as a MatMul on a second (transposed) copy
        untied = onnx.ModelProto()
        untied.CopyFrom(dec)
        assert untie_for_quantizer(untied)  # Gemm on W → MatMul on a copy of Wᵀ
        before = onnx_weight_bytes(convert_precision(untied, precision))
        after = onnx_weight_bytes(tied)
        # the dropped copy's bytes: the float table (float16 at int8/int4), less the second copy
        # of the scales that GatherBlockQuantized reads (one float32 per block) and the 8-bit
        # blocks of the rounding residual (1 B and a float32 scale per block)
        from spotstop.export.quant import NBITS_BLOCK

        per = {"fp32": 4, "fp16": 2}.get(precision)
        if per is None:  # the residual's blocks are as wide as the output layer's (padded)
            bs, residual = NBITS_BLOCK[precision], get_precision(precision).table_residual
            per = 2 - (4 + (4 + bs) * residual) * -(-hidden // bs) / hidden
        assert before - after >= vocab * hidden * per - 0.05 * abs(before), (
            precision,
            before,
            after,
        )
        _close(
            _session(tied).run(None, feeds),
            _session(dec).run(None, feeds),
            cfg.atol[precision],
            cfg.rtol[precision],
        )


@pytest.mark.precision("fp16")
@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_fp16_bundle_verifies(arch: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """fp16 derived from the fp32 bundle: verify-bundle passes, about half the weight bytes."""
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.export.verify import verify_bundle
    from spotstop.guard._bundle import load_bundle

    b32 = fp32_bundle(request, arch)
    b16 = derive_bundle(b32, tmp_path / "b16", precision="fp16")
    # spotstop verify-bundle's default 12 scenes: the tiny pair's scores bunch together, so
    # with fewer scenes a swap of two near-equal scores moves the rank correlation a lot
    v = verify_bundle(b16)
    assert v.ok, str(v)
    w16, w32 = (
        next(m for m in load_bundle(b).manifest["members"] if m["name"] == f"tiny-{arch}")[
            "weight_bytes"
        ]
        for b in (b16, b32)
    )
    assert w16 <= 0.55 * w32


@pytest.mark.parametrize("arch", by_arch())
def test_vision_fp16_matches_fp32(arch: str, tiny_pair: Path, tmp_path: Path) -> None:
    """Every vision tower (seconds to export): fp16 loads and matches fp32."""
    from spotstop.export.exporters import export_vision
    from spotstop.export.graphs import VisionGraph
    from spotstop.guard import load_member

    m: Any = load_member(tiny_pair / f"tiny-{arch}")
    px = m._gray()
    vis = VisionGraph(m.backend.model, px).eval()
    cfg = get_export_config(arch)
    export_vision(vis, cfg, px, tmp_path / "vision.onnx")
    model = onnx.load(str(tmp_path / "vision.onnx"))
    fp16 = _session(convert_precision(model, "fp16"))
    fp32 = _session(model)
    for seed in range(3):
        feeds = {"pixel_values": _feeds(model, seed)["pixel_values"]}
        _close(fp16.run(None, feeds), fp32.run(None, feeds), cfg.atol["fp16"], cfg.rtol["fp16"])


def test_memory_budget_counts_a_tied_table_once() -> None:
    import importlib.util

    root = REPO_ROOT
    spec = importlib.util.spec_from_file_location(
        "memory_budget", root / "jetson" / "memory_budget.py"
    )
    assert spec is not None and spec.loader is not None
    mb = importlib.util.module_from_spec(spec)
    sys.modules["memory_budget"] = mb
    spec.loader.exec_module(mb)
    for name, rec in mb.RECORDED.items():
        c = mb.count(name, mb.build_config(name, rec))
        assert c.tied
        # fp32/fp16: every parameter once
        assert mb.weight_bytes(c, "fp32") == pytest.approx(4 * c.total)
        assert mb.weight_bytes(c, "fp16") == pytest.approx(2 * c.total)
        # int8: the table only as the output layer's blocks (+ one more copy of the scales)
        # and their rounding residual's 8-bit blocks (1 B + a scale per block of 128);
        # the vision graph's two ends float32
        assert c.vision_ends > 0
        linear = c.vision_linear - c.vision_ends + c.text_linear + c.embed
        other = c.vision_other + c.text_other
        residual = c.embed * (1 + 4 / 128)
        want = linear * (1 + 4 / 128) + c.embed * 4 / 128 + residual + other * 4 + c.vision_ends * 4
        assert mb.weight_bytes(c, "int8") == pytest.approx(want)
        # int4-trt: the output layer's int4 blocks (float16 scales) AND the float16 table;
        # its ends are int4 like the rest
        linear += c.vision_ends
        want = linear * (0.5 + 2 / 128) + c.embed * 2 + other * 2
        assert mb.weight_bytes(c, "int4-trt") == pytest.approx(want)
    # `spotstop cost` counts the parameters its own way; the bytes are the same rule, and both
    # keep export/mixed.py's default int4 selectors at int8
    from spotstop.export.cost import PRECISIONS, real_pair_cost

    assert set(PRECISIONS) == set(mb.PRECISIONS)
    for m in real_pair_cost("low").members:
        c = mb.count(m.name, mb.build_config(m.name, mb.RECORDED[m.name]))
        assert c.int4_linear_int8 == m.int4_linear_int8 < c.text_linear
        for prec in PRECISIONS:
            assert m.weight_bytes(prec) == pytest.approx(mb.weight_bytes(c, prec), rel=1e-9), (
                m.name,
                prec,
            )


def test_memory_budget_sizes_the_shapes_the_guard_and_its_engines_run() -> None:
    """The budget sized batch 1 at 512 tokens while the guard sends 8 scenes per call up to
    the largest bucket (1024), and a TensorRT context reserves its profile's maximum: int8
    read "both resident" at 6.48 of 6.50 GiB. Its shapes are now the guard's and the export's
    own constants, and the activations grow with the batch by hand: vision per scene, the
    decoder per row."""
    import importlib.util

    from spotstop.export.onnx import DEFAULT_BUCKETS
    from spotstop.export.trt import MAX_CONTINUATION_ROWS
    from spotstop.guard import ScoringConfig

    spec = importlib.util.spec_from_file_location(
        "memory_budget", REPO_ROOT / "jetson" / "memory_budget.py"
    )
    assert spec is not None and spec.loader is not None
    mb = importlib.util.module_from_spec(spec)
    sys.modules["memory_budget"] = mb
    spec.loader.exec_module(mb)
    assert max(DEFAULT_BUCKETS) == mb.SEQ and ScoringConfig().batch_size == mb.BATCH
    assert ScoringConfig().batch_size * MAX_CONTINUATION_ROWS == mb.TRT_ROWS
    name, rec = next(iter(mb.RECORDED.items()))
    c = mb.count(name, mb.build_config(name, rec))
    one, two = mb.activation_bytes(c, "int8", 1), mb.activation_bytes(c, "int8", 2)
    assert two == pytest.approx(2 * one)  # linear in the batch (onnxruntime sizes per call)
    # TensorRT: the profile's rows whatever the batch
    assert mb.activation_bytes(c, "int4-trt", 1) == mb.activation_bytes(c, "int4-trt", 8)
    with pytest.raises(SystemExit):  # a misspelt member name is not a third member
        mb.main(["--print", "--config-dir", f"{name.lower()}=/nonexistent"])


def test_memory_budget_readme_is_current() -> None:
    root = REPO_ROOT
    res = subprocess.run(
        [sys.executable, str(root / "jetson" / "memory_budget.py"), "--print"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert res.returncode == 0, res.stderr
    readme = (root / "jetson" / "README.md").read_text(encoding="utf-8")
    assert res.stdout.strip() == readme.strip(), "regenerate: python jetson/memory_budget.py"


# -- the tiny Qwen3.5 member (dynamo decoder export: slow) ------------------------------------


@pytest.mark.slow
def test_qwen_fp16_decoder_is_float16_where_it_counts(tiny_pair_fp32_bundle: Path) -> None:
    """Weights and projections float16; normalisers, RMSNorm and the delta rule float32."""
    dec = _member_graphs(tiny_pair_fp32_bundle, "tiny-qwen3_5")["decoder"]
    fp16 = convert_precision(dec, "fp16")
    assert not _float16_round_trips(fp16)
    inits = {t.name: t for t in fp16.graph.initializer}
    weights = [
        inits[n.input[1]]
        for n in fp16.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits
    ]
    assert weights and all(w.data_type == TensorProto.FLOAT16 for w in weights)
    big = [t for t in fp16.graph.initializer if int(np.prod(t.dims or [1])) >= 4096]
    assert all(t.data_type == TensorProto.FLOAT16 for t in big), [
        t.name for t in big if t.data_type != TensorProto.FLOAT16
    ]
    wb32, wb16 = onnx_weight_bytes(dec), onnx_weight_bytes(fp16)
    assert wb16 <= 0.52 * wb32
    # (onnx's shape inference does not type every tensor of this graph: "not float16" and
    # "not made by a Cast to float16")
    types = _types(fp16)
    producer = {o: n for n in fp16.graph.node for o in n.output}

    def float16_in(n: Any) -> bool:
        p = producer.get(n.input[0])
        to16 = p is not None and p.op_type == "Cast" and helper.get_node_attr_value(p, "to") == 10
        return to16 or types.get(n.input[0]) == TensorProto.FLOAT16

    regions = set(fp32_nodes(dec))
    checked = [
        n
        for n in fp16.graph.node
        if n.op_type in ("Softmax", "LogSoftmax", "Exp")
        or (n.op_type in ("Pow", "ReduceMean", "CumSum") and n.name in regions)
    ]
    assert {"Softmax", "LogSoftmax", "Exp", "Pow", "ReduceMean"} <= {n.op_type for n in checked}
    assert not [(n.name, n.op_type) for n in checked if float16_in(n)]
