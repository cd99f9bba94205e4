"""int8/int4 MatMulNBits (export/nbits.py) against onnxruntime's own quantizer, and weights
kept on disk (export/weights.py DiskWeights) against weights kept in the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tests._support.tied_table import tied_table_rows  # noqa: E402


def _graph(seed: int = 0) -> object:
    """x (B, 300) → MatMul W1 (300 x 70, K not a multiple of 128) → MatMul W2 (70 x 256) and a
    second MatMul on W1 (a shared weight) → Add; a Transpose-free float32 graph."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.05, (300, 70)).astype(np.float32)
    w2 = rng.normal(0, 0.05, (70, 256)).astype(np.float32)
    w2[:, :3] = 0.0  # an all-zero block column
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "w2"], ["y1"], name="mm2"),
        helper.make_node("MatMul", ["x", "w1"], ["h2"], name="mm3"),
        helper.make_node("ReduceSum", ["h2"], ["s"], keepdims=1, name="sum"),
        helper.make_node("Add", ["y1", "s"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 256])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: object, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(
        model.SerializeToString(),  # type: ignore[attr-defined]
        providers=["CPUExecutionProvider"],
    )
    return np.asarray(s.run(None, {"x": x})[0])


def _inits(model: object) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # type: ignore[attr-defined]


@pytest.mark.parametrize("bits", [8, 4])
def test_matmul_nbits_equals_onnxruntimes_quantizer(bits: int) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from spotstop.export.nbits import quantize_matmuls_nbits

    ref = _graph()
    q = MatMulNBitsQuantizer(
        ref, bits=bits, block_size=128, is_symmetric=True, op_types_to_quantize=("MatMul",)
    )
    q.process()
    want = q.model.model
    got = _graph()
    assert quantize_matmuls_nbits(got, bits, 128) == 2  # w1 shared by two MatMuls: once
    want_nodes = [n for n in want.graph.node if n.op_type == "MatMulNBits"]
    got_nodes = [n for n in got.graph.node if n.op_type == "MatMulNBits"]
    assert len(got_nodes) == len(want_nodes) == 3
    for a, b in zip(got_nodes, want_nodes, strict=True):
        assert a.domain == b.domain == "com.microsoft"
        assert {x.name: onnx.helper.get_attribute_value(x) for x in a.attribute} == {
            x.name: onnx.helper.get_attribute_value(x) for x in b.attribute
        }
    gi, wi = _inits(got), _inits(want)
    for name in ("w1", "w2"):
        np.testing.assert_array_equal(gi[f"{name}_Q{bits}"], wi[f"{name}_Q{bits}"])
        np.testing.assert_array_equal(gi[f"{name}_scales"], wi[f"{name}_scales"])
    assert "w1" not in gi and "w2" not in gi  # the float weights are dropped
    x = np.random.default_rng(1).normal(size=(5, 300)).astype(np.float32)
    np.testing.assert_array_equal(_run(got, x), _run(want, x))
    # and the weight-only error is what the bits allow
    full = _run(_graph(), x)
    rel = float(np.max(np.abs(_run(got, x) - full)) / np.max(np.abs(full)))
    assert 0 < rel < (0.02 if bits == 8 else 0.2), rel


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [32, 128])
def test_dequantized_weight_is_what_matmul_nbits_multiplies_by(bits: int, block: int) -> None:
    """x @ dequantize_nbits(...) is onnxruntime's MatMulNBits output (float32 compute), with
    the rows beyond K (a last partial block) dropped; the weight error is a rounding error."""
    from onnx import helper, numpy_helper
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks, quantize_matmuls_nbits

    rng = np.random.default_rng(bits + block)
    w = (rng.normal(size=(300, 48)) * 0.02).astype(np.float32)  # K = 300: a partial block
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 300])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 48])],
        [numpy_helper.from_array(w, "W")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    quantize_matmuls_nbits(m, bits, block)
    x = rng.normal(size=(5, 300)).astype(np.float32)
    packed, scales = nbits_blocks(w, bits, block)
    deq = dequantize_nbits(packed, scales, bits, 300)
    assert deq.shape == w.shape and deq.dtype == np.float32
    np.testing.assert_allclose(_run(m, x), x @ deq, rtol=0, atol=2e-6)
    # each weight's block step; the block's largest magnitude is code -2**(bits-1) (a signed
    # scale), so a weight of the other sign near it clips at 2**(bits-1) - 1: one step at most,
    # half a step for the rest
    step = np.repeat(np.abs(scales).T, block, axis=0)[:300]
    err = np.abs(deq - w)
    assert np.all(err <= step * (1 + 1e-5))
    assert np.mean(err <= 0.5 * step * (1 + 1e-5)) > 0.99
    assert err.max() > 0  # it is quantized


@pytest.mark.parametrize(("bits", "block"), [(8, 128), (4, 32)])
def test_residual_blocks_hold_what_the_coarse_blocks_rounded_off(bits: int, block: int) -> None:
    """export/weights.py's residual table, against numpy: its codes are the 8-bit symmetric
    blocks (step max|r|/128, onnxruntime's kernel) of ``table − deq(coarse)``, and the two
    dequantized together are within one residual step, at most 1/128 of the coarse step, of
    the table (hidden 200: the last block padded)."""
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks
    from spotstop.export.weights import residual_blocks

    rng = np.random.default_rng(11)
    vocab, hidden = 300, 200
    table = rng.normal(0, 0.02, (vocab, hidden)).astype(np.float32)
    table[5] = 0.0  # a padding row: no error, a zero step
    packed, scales = nbits_blocks(table.T, bits, block)
    codes, r_scales = residual_blocks(table, packed, scales, bits, block)
    k_blocks = -(-hidden // block)
    assert codes.shape == (vocab, k_blocks, block) and codes.dtype == np.uint8
    assert r_scales.shape == (vocab, k_blocks)
    coarse = dequantize_nbits(packed, scales, bits, hidden).T
    resid = table.astype(np.float64) - coarse
    # numpy's own blocks of the residual: step max|r| / 128 per block
    padded = np.pad(resid, ((0, 0), (0, k_blocks * block - hidden))).reshape(vocab, k_blocks, -1)
    amax = np.abs(padded).max(-1)
    np.testing.assert_allclose(np.abs(r_scales), amax / 128, rtol=1e-6, atol=0)
    fine = dequantize_nbits(codes, r_scales, 8, hidden).T
    step = np.repeat(np.abs(r_scales), block, axis=1)[:, :hidden]
    err = np.abs(table - coarse - fine)
    assert np.all(err <= step * (1 + 1e-5) + 1e-12)
    assert np.all(np.abs(r_scales) <= np.abs(scales) / 128 * (1 + 1e-5))
    assert err[5].max() == 0.0
    assert np.abs(resid).max() > 100 * err.max()  # what the residual table buys


@pytest.mark.parametrize("precision", ["int8", "int8-nbits", "int4"])
@pytest.mark.parametrize("residual", [True, False])
def test_tied_token_rows_read_through_onnxruntime(
    precision: str, residual: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tied table: the Gather's rows (GatherBlockQuantized on the output layer's blocks plus
    one on their residual's) are the table within 1/128 of a coarse step, at 8 and at 4 bits;
    a precision registered without ``table_residual`` (none today) reads the coarse blocks
    alone, off by up to a step."""
    from dataclasses import replace

    from spotstop.export.nbits import dequantize_nbits
    from spotstop.export.precision import PRECISION_SPECS, get_precision

    assert get_precision(precision).table_residual  # every shared table today
    if not residual:
        spec = replace(get_precision(precision), table_residual=False)
        monkeypatch.setitem(PRECISION_SPECS, precision, spec)
    rng = np.random.default_rng(4)
    table = rng.normal(0, 0.05, (512, 256)).astype(np.float32)
    ids = np.array([[0, 3, 511, 3]], np.int64)
    e, q = tied_table_rows(table, precision, ids)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("GatherBlockQuantized") == 1 + residual
    inits = _inits(q)
    head = next(n for n in q.graph.node if n.op_type == "MatMulNBits")
    bits = next(a.i for a in head.attribute if a.name == "bits")
    assert bits == (4 if precision == "int4" else 8)
    coarse_step = np.abs(inits[head.input[2]]).max()
    coarse = dequantize_nbits(inits[head.input[1]], inits[head.input[2]], bits, 256).T
    err = np.abs(e - table[ids[0]])
    if residual:
        assert err.max() <= coarse_step / 128 * (1 + 1e-4)
        assert np.abs(coarse[ids[0]] - table[ids[0]]).max() > 30 * err.max()
    else:
        np.testing.assert_allclose(e, coarse[ids[0]], rtol=0, atol=1e-7)
        assert err.max() > coarse_step / 8


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_disk_weights_write_what_the_graph_would_hold(tmp_path: Path, precision: str) -> None:
    """The whole int4/int8 conversion (fold, untie, quantize, gather with int8's residual table,
    fp16 tables) with the weights on disk gives the same tensors as with the weights in the
    graph; nothing large is inline."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import uses_external_data
    from spotstop.export.precision import convert_precision
    from spotstop.export.weights import DiskWeights, tie_output_layer

    rng = np.random.default_rng(3)
    table = rng.normal(0, 0.05, (512, 64)).astype(np.float32)  # tied: embeddings = output
    w = rng.normal(0, 0.05, (96, 64)).astype(np.float32)  # a Linear's (out, in) weight
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("Transpose", ["w"], ["wT"], perm=[1, 0], name="wt"),
        helper.make_node("MatMul", ["e", "wT"], ["h0"], name="lin"),
        helper.make_node("Slice", ["h0", "st", "en", "ax"], ["h"], name="cut"),
        helper.make_node("Transpose", ["table"], ["tT"], perm=[1, 0], name="tt"),
        helper.make_node("MatMul", ["h", "tT"], ["logits"], name="head"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, None, 512])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([0], np.int64), "st"),
            numpy_helper.from_array(np.array([64], np.int64), "en"),
            numpy_helper.from_array(np.array([-1], np.int64), "ax"),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(model, str(src / "m.onnx"), save_as_external_data=True, size_threshold=1024)

    in_mem = tie_output_layer(onnx.load(str(src / "m.onnx")))
    in_mem = convert_precision(in_mem, precision, copy=False)

    stage = tmp_path / "stage"
    on_disk = onnx.load(str(src / "m.onnx"), load_external_data=False)
    with DiskWeights(src, stage / "m.onnx.data") as io:
        tie_output_layer(on_disk, io)
        on_disk = convert_precision(on_disk, precision, copy=False, io=io)
        io.finish([on_disk])
    big = [t for t in on_disk.graph.initializer if not uses_external_data(t)]
    assert all(len(t.raw_data) < 1024 for t in big)
    onnx.save_model(on_disk, str(stage / "m.onnx"))

    reloaded = onnx.load(str(stage / "m.onnx"))  # reads stage/m.onnx.data only
    a, b = _inits(in_mem), _inits(reloaded)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert [n.op_type for n in in_mem.graph.node] == [n.op_type for n in reloaded.graph.node]
    assert "GatherBlockQuantized" in {n.op_type for n in reloaded.graph.node}
    ids = np.array([[1, 7, 300]], np.int64)
    s1 = ort.InferenceSession(str(stage / "m.onnx"), providers=["CPUExecutionProvider"])
    s2 = ort.InferenceSession(in_mem.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(s1.run(None, {"ids": ids})[0], s2.run(None, {"ids": ids})[0])


@pytest.mark.parametrize("precision", ["int8", "int8-nbits", "int4"])
def test_linears_exported_as_gemm_are_quantized_too(precision: str) -> None:
    """A Linear on a 2-D input exports as Gemm (the Qwen3.5 vision tower): int8 turns it into
    MatMulIntegerToFloat per token, int8-nbits/int4 into MatMulNBits (+ its bias), not a float32 Gemm;
    the answer moves by the weight (and int8's activation) error."""
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.export.precision import convert_precision

    rng = np.random.default_rng(5)
    w1 = rng.normal(0, 0.05, (64, 256)).astype(np.float32)  # Linear(256 → 64): (out, in)
    b1 = rng.normal(0, 0.1, 64).astype(np.float32)
    w2 = rng.normal(0, 0.05, (64, 128)).astype(np.float32)  # transB = 0: (in, out)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
        helper.make_node("Gemm", ["h", "w2"], ["y"], name="fc2"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 128])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = convert_precision(model, precision)
    ops = [n.op_type for n in q.graph.node]
    op = "MatMulIntegerToFloat" if precision == "int8" else "MatMulNBits"
    assert "Gemm" not in ops and ops.count(op) == 2 and "Add" in ops
    assert {t.name for t in q.graph.initializer} & {"w1", "w2", "w1_gemmT"} == set()
    x = rng.normal(size=(3, 256)).astype(np.float32)
    want = (x @ w1.T + b1) @ w2  # the float answer, by numpy
    got = _run(q, x)
    rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert 0 < rel < (0.2 if precision == "int4" else 0.02), rel
