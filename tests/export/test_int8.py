"""int8 that computes in int8 (export/int8.py): the arithmetic against onnxruntime's own
operators and a hand-worked example, per token and per tensor, SmoothQuant's identity, the keep
rule, and the rewrite of a small graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from spotstop.export.gptq import CalibrationInputs, weight_key  # noqa: E402
from spotstop.export.int8 import (  # noqa: E402
    SMOOTH_ALPHA,
    SYMMETRIC_SLACK,
    VISION_SHARE,
    VisionActivationCheck,
    host_weight_form,
    quantize_matmuls_int8,
    vision_activation_check,
)
from spotstop.export.int8_graph import per_token_codes_model  # noqa: E402
from spotstop.export.int8_math import (  # noqa: E402
    ACTIVATIONS,
    block_rotation,
    channel_int8,
    dequantize_activations,
    dequantize_activations_per_token,
    dequantize_activations_symmetric,
    graph_codes,
    layer_error,
    rotate_hessian,
    rotate_rows,
    rotate_weight,
    smoothing_factors,
    stored_codes,
)

#: the int8 weight form this host computes exactly (``s8``, or ``u8`` on an x86 CPU with AVX2
#: and no VNNI, whose u8·s8 kernel saturates): what the export writes here
FORM = host_weight_form()


def _session(model: object) -> object:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(),  # type: ignore[attr-defined]
        sess_options=opts,
        providers=["CPUExecutionProvider"],
    )


def _model(nodes: list, inits: list, k: int, n: int, extra_out: list | None = None) -> object:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n]), *(extra_out or [])],
        inits,
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def test_activation_rounding_is_onnxruntimes() -> None:
    """The simulated per-tensor activation quantization equals onnxruntime's
    DynamicQuantizeLinear → DequantizeLinear bit for bit (ranges with and without 0)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    s = _session(_model(nodes, [], 16, 16))
    for x in (
        rng.normal(size=(7, 16)),
        rng.uniform(0.5, 3.0, size=(7, 16)),  # all positive: the range is widened to 0
        rng.uniform(-3.0, -0.5, size=(7, 16)),
        np.r_[rng.normal(size=(6, 16)), np.full((1, 16), 40.0)],  # an outlier row
    ):
        x = x.astype(np.float32)
        (want,) = s.run(None, {"x": x})  # type: ignore[attr-defined]
        np.testing.assert_array_equal(dequantize_activations(x), want)


def test_per_token_rounding_by_hand() -> None:
    """Row [1, -2, 0.5, 0]: μ = -0.5, σ = 3/254, codes round((x − μ)/σ) = round(127, -127,
    84.67, 42.33) = (127, -127, 85, 42); a one-sided row [0.5, 1, 2, 4] (after a GELU) keeps
    all 255 levels over [0.5, 4]; a constant row keeps its value; rows are independent."""
    x = np.array(
        [[1.0, -2.0, 0.5, 0.0], [0.5, 1.0, 2.0, 4.0], [3.0, 3.0, 3.0, 3.0], [300.0, 1.0, -1.0, 0.0]]
    )
    got = dequantize_activations_per_token(x)
    f = np.float32
    sigma = f(3.0) / f(254)
    np.testing.assert_allclose(
        got[0], np.array([127, -127, 85, 42], np.float32) * sigma - f(0.5), rtol=0, atol=1e-6
    )
    assert np.abs(got[1] - x[1]).max() <= 3.5 / 254 / 2 + 1e-6  # half a step of its own range
    np.testing.assert_array_equal(got[2], x[2].astype(np.float32))
    np.testing.assert_array_equal(got[:2], dequantize_activations_per_token(x[:2]))
    # the outlier row costs only itself: per tensor, row 0 would share 300's range
    assert np.abs(dequantize_activations(x)[0] - x[0]).max() > 0.4  # step 301/255
    assert np.abs(got[0] - x[0]).max() <= float(sigma) / 2 + 1e-6


def test_symmetric_rounding_by_hand() -> None:
    """Row [1, -2, 0.5, 0]: σ = 2/127, codes round(x/σ) = round(63.5, -127, 31.75, 0) =
    (64, -127, 32, 0) (63.5: half to even); a one-sided row [0.5, 1, 2, 4] spends half its
    levels on the sign it never takes (step 4/127, twice the midpoint form's 3.5/254); a
    constant row keeps its value, an all-zero row stays 0; rows are independent."""
    x = np.array(
        [[1.0, -2.0, 0.5, 0.0], [0.5, 1.0, 2.0, 4.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0]]
    )
    got = dequantize_activations_symmetric(x)
    f = np.float32
    sigma = f(2.0) / f(127)
    np.testing.assert_array_equal(got[0], np.array([64, -127, 32, 0], np.float32) * sigma)
    step = float(f(4.0) / f(127))
    assert np.abs(got[1] - x[1]).max() <= step / 2 + 1e-6
    assert np.abs(got[1] - x[1]).max() > 3.5 / 254 / 2  # worse than the midpoint form's bound
    np.testing.assert_allclose(got[2], x[2], rtol=1e-6)
    np.testing.assert_array_equal(got[3], np.zeros(4, np.float32))
    np.testing.assert_array_equal(got[:2], dequantize_activations_symmetric(x[:2]))
    with pytest.raises(ValueError, match="per token"):
        layer_error(
            x, np.ones((4, 2)), np.ones((4, 2), np.int8), np.ones(2), "per-tensor", symmetric=True
        )


@pytest.mark.parametrize("shape", [(9, 16), (2, 5, 16)])
def test_symmetric_codes_are_the_same_in_both_graph_forms(shape: tuple[int, ...]) -> None:
    """The symmetric form's codes: QuantizeLinear per row (opset ≥ 13) and Div, Round, Add,
    Cast (opset 12) agree bit for bit with numpy's round(x / σ) + 128, σ = max|x| / 127, on
    ties (row max 127: σ = 1, 2.5 → 2, 3.5 → 4, −2.5 → −2), a constant row (all 255) and a
    row whose largest magnitude is negative (−10 → code 1)."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=shape).astype(np.float32) * 3
    flat = x.reshape(-1, shape[-1])
    flat[0] = 0.0
    flat[0, :4] = [127.0, 2.5, 3.5, -2.5]
    flat[1] = 7.0
    flat[2, 0] = -10.0
    x = flat.reshape(shape)
    new = _session(per_token_codes_model(17, len(shape), symmetric=True)).run(None, {"x": x})[0]  # type: ignore[attr-defined]
    old = _session(per_token_codes_model(12, len(shape), symmetric=True)).run(None, {"x": x})[0]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(new, old)
    hi, lo = x.max(axis=-1, keepdims=True), x.min(axis=-1, keepdims=True)
    sigma = np.maximum(np.maximum(hi, -lo), np.float32(2e-30)) / np.float32(127)
    want = (np.round(x / sigma) + 128).astype(np.uint8)
    np.testing.assert_array_equal(new, want)
    rows = new.reshape(-1, shape[-1])
    assert list(rows[0, :4]) == [255, 130, 132, 126] and np.all(rows[1] == 255)
    assert rows[2, 0] == 1


def _one_linear(k: int, n: int, w: np.ndarray) -> object:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="lin")
    return _model([node], [numpy_helper.from_array(w, "w")], k, n)


@pytest.mark.parametrize("form", ["s8", "u8"])
@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_rewritten_layer_is_the_numpy_arithmetic(activations: str, form: str) -> None:
    """One Linear rewritten by the export (no calibration: round-to-nearest codes) and run by
    onnxruntime equals numpy's deq(Q(x)) @ (codes · scales): the integer GEMM is exact, so only
    float rounding separates them; an outlier token among the rows (an attention sink). In
    both weight forms: int8 codes (s8), or the same codes + 128 as uint8 read with a weight zero
    point (u8). A form this host's kernel would get wrong is refused by the export instead."""
    rng = np.random.default_rng(11)
    k, n = 64, 48
    w = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    x = rng.normal(size=(12, k)).astype(np.float32)
    x[0] *= 50.0
    model = _one_linear(k, n, w)
    if form != FORM and form == "s8":  # this host saturates it: the export refuses, says why
        with pytest.raises(ValueError, match=r"saturating int16.*--int8-weights u8"):
            host_weight_form(form)
        return
    rep = quantize_matmuls_int8(model, activations=activations, weight_form=form)
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    want_op = "MatMulIntegerToFloat" if activations == "per-token" else "DynamicQuantizeMatMul"
    assert rep.dynamic == 1 and want_op in ops and "MatMul" not in ops
    assert rep.as_meta()["activations"] == activations and rep.as_meta()["weight_form"] == form
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # type: ignore[attr-defined]
    assert inits["w_int8"].dtype == (np.int8 if form == "s8" else np.uint8)
    (gemm,) = [nd for nd in model.graph.node if nd.op_type == want_op]  # type: ignore[attr-defined]
    assert (gemm.input[-1] == "int8_weight_zero") == (form == "u8")
    (got,) = _session(model).run(None, {"x": x})  # type: ignore[attr-defined]
    codes, scales = channel_int8(w)
    deq = dequantize_activations_per_token if activations == "per-token" else dequantize_activations
    sim = deq(x).astype(np.float64) @ (codes * scales.astype(np.float64))
    np.testing.assert_allclose(got, sim, rtol=1e-5, atol=1e-5 * float(np.abs(sim).max()))
    ref = x.astype(np.float64) @ w
    err_rest = np.linalg.norm(got[1:] - ref[1:]) / np.linalg.norm(ref[1:])
    # the other tokens: per token ~1 %, per tensor they share the outlier's 255 levels
    assert (err_rest < 0.02) if activations == "per-token" else (err_rest > 0.1), err_rest


def test_per_token_quantizes_a_shared_activation_once() -> None:
    """q and k read the same activation: one ReduceMax/ReduceMin/…/QuantizeLinear chain feeds
    both MatMulIntegerToFloat nodes; an opset-17 graph gets the reductions' axes as an
    attribute."""
    model, _ = _norm_then_two_linears(16, 8, 9, 1.0)
    quantize_matmuls_int8(model)
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("ReduceMax") == 1
    assert ops.count("ReduceMin") == 1 and ops.count("QuantizeLinear") == 1
    assert "Cast" not in ops and "Round" not in ops  # the codes come from QuantizeLinear
    rm = next(nd for nd in model.graph.node if nd.op_type == "ReduceMax")  # type: ignore[attr-defined]
    assert len(rm.input) == 1 and helper.get_node_attr_value(rm, "axes") == [-1]
    with pytest.raises(ValueError, match="per-token, per-tensor"):
        quantize_matmuls_int8(model, activations="per-channel")


@pytest.mark.parametrize("shape", [(9, 16), (2, 5, 16)])
def test_per_token_codes_are_the_same_in_both_graph_forms(shape: tuple[int, ...]) -> None:
    """QuantizeLinear per axis over the flattened rows (opset ≥ 13) gives the codes that
    Round((x − μ)/σ) + 128 cast to uint8 gives (opset 12), bit for bit, on ties (row [0, 254]:
    σ = 1, μ = 127, so 127.5 → 0.5 → 0, 128.5 → 1.5 → 2, 126.5 → −0.5 → 0, 125.5 → −1.5 → −2:
    half to even), on a constant row
    and at batch > 1; and both equal numpy's reference codes."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=shape).astype(np.float32) * 3
    flat = x.reshape(-1, shape[-1])
    flat[0] = 100.0
    flat[0, :6] = [0.0, 254.0, 127.5, 128.5, 126.5, 125.5]
    flat[1] = 7.0  # a constant row
    flat[2, :2] = [-1e4, 1e4]  # a wide one
    x = flat.reshape(shape)
    new = _session(per_token_codes_model(17, len(shape))).run(None, {"x": x})[0]  # type: ignore[attr-defined]
    old = _session(per_token_codes_model(12, len(shape))).run(None, {"x": x})[0]  # type: ignore[attr-defined]
    ops17 = [nd.op_type for nd in per_token_codes_model(17, len(shape)).graph.node]  # type: ignore[attr-defined]
    assert "QuantizeLinear" in ops17 and "Round" not in ops17
    np.testing.assert_array_equal(new, old)
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    mu = (hi + lo) * np.float32(0.5)
    sigma = np.maximum(hi - lo, np.float32(2e-30)) / np.float32(254)
    want = (np.round((x - mu) / sigma) + 128).astype(np.uint8)
    np.testing.assert_array_equal(new, want)
    assert list(new.reshape(-1, shape[-1])[0, 2:6]) == [128, 130, 128, 126]
    assert np.all(new.reshape(-1, shape[-1])[1] == 128)


def test_channel_codes_round_to_nearest_per_column() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(48, 10)).astype(np.float32) * rng.uniform(0.1, 5, 10).astype(np.float32)
    codes, scales = channel_int8(w)
    assert codes.dtype == np.int8 and scales.shape == (10,)
    np.testing.assert_allclose(scales, np.abs(w).max(axis=0) / 127, rtol=1e-6)
    assert np.abs(codes).max() == 127
    err = np.abs(codes * scales - w)
    assert np.all(err <= scales / 2 + 1e-6)


def test_gptq_codes_lower_the_output_error_on_their_inputs() -> None:
    """GPTQ with one block of every row: the (K, N) int8 codes and per-column scales it picks
    give a smaller ‖XW − XŴ‖ on correlated inputs than rounding to nearest (its objective)."""
    rng = np.random.default_rng(2)
    k, n = 64, 32
    mix = rng.normal(size=(k, k)).astype(np.float32)
    x = (rng.normal(size=(512, k)) @ mix).astype(np.float32)  # correlated channels
    w = rng.normal(size=(k, n)).astype(np.float32)
    h = (x.T @ x).astype(np.float64)
    gq, gs = channel_int8(w, h)
    rq, rs = channel_int8(w)
    assert gq.dtype == np.int8 and gs.shape == (n,)
    e_g = np.linalg.norm(x @ w - x @ (gq * gs))
    e_r = np.linalg.norm(x @ w - x @ (rq * rs))
    assert e_g < 0.9 * e_r, (e_g, e_r)


def test_layer_error_is_what_dynamic_quantize_matmul_computes() -> None:
    """onnxruntime's DynamicQuantizeMatMul with our codes and scales gives deq(Q(x)) @ (codes ·
    scales): its integer GEMM is exact, so only float rounding separates the two; and the
    measured error is that output's distance from x @ w."""
    rng = np.random.default_rng(3)
    k, n = 96, 40
    w = rng.normal(size=(k, n)).astype(np.float32)
    x = rng.normal(size=(20, k)).astype(np.float32)
    codes, scales = channel_int8(w, (x.T @ x).astype(np.float64))  # GPTQ: negative scales too
    wz = ["wz"] if FORM == "u8" else []  # the u8 form's weight zero point
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["x", "w", "s", *wz], ["y"], domain="com.microsoft"
    )
    inits = [
        numpy_helper.from_array(stored_codes(codes, FORM), "w"),
        numpy_helper.from_array(scales, "s"),
        *[numpy_helper.from_array(np.asarray(np.uint8(128)), "wz")] * len(wz),
    ]
    m = _model([node], inits, k, n)
    (got,) = _session(m).run(None, {"x": x})  # type: ignore[attr-defined]
    sim = dequantize_activations(x).astype(np.float64) @ (codes * scales.astype(np.float64))
    np.testing.assert_allclose(got, sim, rtol=1e-4, atol=1e-4 * float(np.abs(sim).max()))
    ref = x.astype(np.float64) @ w
    want = np.linalg.norm(sim - ref) / np.linalg.norm(ref)
    assert layer_error(x, w, codes, scales, "per-tensor") == pytest.approx(want, rel=1e-4)
    assert 0 < want < 0.05
    tok = dequantize_activations_per_token(x).astype(np.float64) @ (codes * scales)
    want_tok = np.linalg.norm(tok - ref) / np.linalg.norm(ref)
    assert layer_error(x, w, codes, scales) == pytest.approx(want_tok, rel=1e-4)


def test_smoothing_factors_follow_the_papers_formula() -> None:
    a = np.array([8.0, 1.0, 0.0, 2.0])
    b = np.array([0.5, 2.0, 1.0, 0.0])
    s = smoothing_factors(a, b, 0.5)
    np.testing.assert_allclose(s, [np.sqrt(8 / 0.5), np.sqrt(1 / 2), 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(smoothing_factors(a[:2], b[:2], 1.0), a[:2], rtol=1e-6)
    np.testing.assert_allclose(smoothing_factors(a[:2], b[:2], 0.0), 1 / b[:2], rtol=1e-6)
    with pytest.raises(ValueError, match="smooth_alpha must lie in"):
        smoothing_factors(a, b, 1.5)


def _calibration(folder: Path, x: np.ndarray, weights: list[np.ndarray]) -> CalibrationInputs:
    """A calibration folder as export/gptq.py's InputRecorder writes it: the weights (graph
    layout (K, N)) that read ``x`` share one file of its rows."""
    folder.mkdir(parents=True)
    x.astype(np.float32).tofile(folder / "x0000.f32")
    index = {
        weight_key(w.T): {
            "file": "x0000.f32",
            "rows": x.shape[0],
            "width": x.shape[1],
            "linear": f"l{i}",
        }
        for i, w in enumerate(weights)
    }
    (folder / "index.json").write_text(json.dumps(index), encoding="utf-8")
    return CalibrationInputs(folder)


def _norm_then_two_linears(k: int, n: int, seed: int, outlier: float) -> tuple[object, dict]:
    """x · g (an RMSNorm-like weight Mul) read by two MatMuls (q/k-like), then their sum
    through a head MatMul into LogSoftmax (the output layer); one channel of x is large."""
    rng = np.random.default_rng(seed)
    g = rng.uniform(0.5, 1.5, k).astype(np.float32)
    w1 = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    head = rng.normal(0, 0.1, (n, 50)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "g"], ["xn"], name="norm"),
        helper.make_node("MatMul", ["xn", "w1"], ["a"], name="q"),
        helper.make_node("MatMul", ["xn", "w2"], ["b"], name="k"),
        helper.make_node("Add", ["a", "b"], ["y"], name="sum"),
        helper.make_node("MatMul", ["y", "head"], ["logits"], name="head"),
        helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=-1, name="ls"),
    ]
    inits = [
        numpy_helper.from_array(v, nm)
        for v, nm in ((g, "g"), (w1, "w1"), (w2, "w2"), (head, "head"))
    ]
    out = [helper.make_tensor_value_info("logp", TensorProto.FLOAT, [None, 50])]
    x = rng.normal(size=(256, k)).astype(np.float32)
    x[:, 3] *= outlier
    return _model(nodes, inits, k, n, out), {"x": x, "g": g, "w1": w1, "w2": w2, "head": head}


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("alpha", [None, 0.5])
def test_rewrite_quantizes_the_linears_and_keeps_the_output_layer(
    tmp_path: Path, alpha: float | None, activations: str
) -> None:
    """Both q/k MatMuls compute in int8, the output layer stays a float MatMul (for
    the weight-only pass), the answer moves by the measured error only; smoothing folds 1/s into
    the norm's weight (no new node) and keeps x·g·W exact before rounding."""
    import onnx

    k, n = 32, 24
    model, v = _norm_then_two_linears(k, n, 4, outlier=1.0)
    xn = v["x"] * v["g"]
    cal = _calibration(tmp_path / "cal", xn, [v["w1"], v["w2"]])
    fp32 = onnx.ModelProto()
    fp32.CopyFrom(model)  # type: ignore[arg-type]
    rep = quantize_matmuls_int8(
        model,
        calibration=cal,
        smooth_alpha=alpha,
        activations=activations,
        symmetric_slack=SYMMETRIC_SLACK,  # asked for (`--int8-symmetric`): per tensor, ignored
    )
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    op = "MatMulIntegerToFloat" if activations == "per-token" else "DynamicQuantizeMatMul"
    assert ops.count(op) == 2 and ops.count("MatMul") == 1
    assert rep.dynamic == 2 and rep.head == ("head",) and not rep.kept and rep.measured == 2
    assert (rep.smoothed, rep.folded) == ((1, 1) if alpha else (0, 0))
    # per token, two-sided gaussian rows: the symmetric form costs a few per cent more error;
    # unsmoothed both layers take it (one quantization of xn, no midpoint); smoothed, w1's
    # 32-wide rows measured more than SYMMETRIC_SLACK over and kept the midpoint: xn is then
    # quantized in both forms. Per tensor the form is never tried
    per_token = activations == "per-token"
    want_sym = (["w1", "w2"] if alpha is None else ["w2"]) if per_token else []
    assert [nm for nm, _ in rep.symmetric] == want_sym
    assert rep.symmetric_slack == (SYMMETRIC_SLACK if per_token else None)
    n_mid = (2 - len(want_sym)) if per_token else 0
    # folded: the norm's Mul took 1/s; per token σ is each product's A scale (no node), and
    # with a midpoint μ once and μ ⊗ c per layer
    assert ops.count("Mul") == 1 + (1 + n_mid if n_mid else 0)
    assert ops.count("QuantizeLinear") == (len(want_sym) > 0) + (n_mid > 0)
    x = v["x"][:8]
    (want,) = _session(fp32).run(["y"], {"x": x})  # type: ignore[attr-defined]
    (got,) = _session(model).run(["y"], {"x": x})  # type: ignore[attr-defined]
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < rel < 3 * rep.max_error + 1e-3, (rel, rep.max_error)


def test_an_outlier_channel_is_kept_weight_only_unless_smoothed(tmp_path: Path) -> None:
    """Per tensor, one input channel 200x the others: int8 activations lose the rest, the keep
    rule leaves both layers weight-only; SmoothQuant moves the outlier into the weights and
    both compute in int8 with a small error (the paper's Fig. 5 in miniature). (Per token the
    rows' scales follow the outlier too, but the output is dominated by that channel here.)"""
    k, n = 32, 24
    plain, v = _norm_then_two_linears(k, n, 5, outlier=200.0)
    xn = v["x"] * v["g"]
    rep = quantize_matmuls_int8(
        plain,
        calibration=_calibration(tmp_path / "a", xn, [v["w1"], v["w2"]]),
        activations="per-tensor",
    )
    assert rep.dynamic == 0 and len(rep.kept) == 2 and rep.max_error > 0.03
    smooth, _ = _norm_then_two_linears(k, n, 5, outlier=200.0)
    cal = _calibration(tmp_path / "b", xn, [v["w1"], v["w2"]])
    rep2 = quantize_matmuls_int8(
        smooth, calibration=cal, smooth_alpha=0.5, activations="per-tensor"
    )
    assert rep2.dynamic == 2 and not rep2.kept and rep2.max_error < 0.03


def test_an_outlier_token_is_kept_per_tensor_and_computed_per_token(tmp_path: Path) -> None:
    """One input ROW 200x the others (an attention sink): per tensor the other rows lose
    their precision and the keep rule leaves both layers weight-only; per token each row has
    its own scale and both layers compute in int8 (smoothing, per channel, cannot help)."""
    k, n = 32, 24
    _, v = _norm_then_two_linears(k, n, 12, outlier=1.0)
    xn = v["x"] * v["g"]
    xn[0] *= 200.0
    errs = {}
    for act in ACTIVATIONS:
        m, _ = _norm_then_two_linears(k, n, 12, outlier=1.0)
        cal = _calibration(tmp_path / act, xn, [v["w1"], v["w2"]])
        rep = quantize_matmuls_int8(m, calibration=cal, smooth_alpha=0.5, activations=act)
        errs[act] = rep
    assert errs["per-tensor"].dynamic == 0 and len(errs["per-tensor"].kept) == 2
    assert errs["per-token"].dynamic == 2 and errs["per-token"].max_error < 0.02


def test_the_block_rotation_is_an_orthogonal_hadamard_and_leaves_x_w_unchanged() -> None:
    """R = diag(d) H / √b with H Sylvester's Hadamard matrix (scipy's): orthogonal, the largest
    power of two up to the block dividing K; (x R)(Rᵀ w) = x w and Rᵀ (XᵀX) R = (XR)ᵀ(XR)."""
    from scipy.linalg import hadamard
    from spotstop.export.int8_math import hadamard as ours

    for b in (1, 2, 16, 128):
        np.testing.assert_array_equal(ours(b), hadamard(b))
    with pytest.raises(ValueError, match="power of two"):
        ours(12)
    sizes = {
        k: None if (r := block_rotation(k)) is None else r.shape[0] for k in (6144, 2048, 96, 40)
    }
    assert sizes == {6144: 128, 2048: 128, 96: 32, 40: None}  # 40 = 8 x 5: 8 < 16
    assert block_rotation(2048, 0) is None and block_rotation(2048, 64).shape == (64, 64)  # type: ignore[union-attr]
    r = block_rotation(96)
    assert r is not None
    np.testing.assert_allclose(r @ r.T, np.eye(32), atol=1e-12)
    assert np.allclose(np.abs(r), 1 / np.sqrt(32)) and not np.allclose(
        r, hadamard(32) / np.sqrt(32)
    )
    np.testing.assert_array_equal(block_rotation(96), r)  # seeded: every export the same
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 96))
    w = rng.normal(size=(96, 7))
    np.testing.assert_allclose(rotate_rows(x, r) @ rotate_weight(w, r), x @ w, atol=1e-12)
    big = np.kron(np.eye(3), r)  # the block-diagonal R
    np.testing.assert_allclose(rotate_rows(x, r), x @ big, atol=1e-12)
    np.testing.assert_allclose(rotate_weight(w, r), big.T @ w, atol=1e-12)
    xs = x.reshape(-1, 96)
    np.testing.assert_allclose(rotate_hessian(xs.T @ xs, r), (xs @ big).T @ (xs @ big), atol=1e-10)


def _swiglu_inputs(n: int, k: int, seed: int) -> np.ndarray:
    """A feed-forward output layer's inputs: silu(g) · u with g, u normal and a few channels
    10x larger (heavy tails: one row's range is set by a handful of its values)."""
    rng = np.random.default_rng(seed)
    g, u = rng.normal(size=(n, k)), rng.normal(size=(n, k))
    u[:, rng.choice(k, 3, replace=False)] *= 10.0
    return (g / (1 + np.exp(-g)) * u).astype(np.float32)


@pytest.mark.parametrize("slack", [None, SYMMETRIC_SLACK])
def test_a_layer_over_the_bound_computes_in_int8_after_a_rotation(
    tmp_path: Path, slack: float | None
) -> None:
    """Heavy-tailed inputs put a layer over the keep bound per token; rotated in blocks of 64
    its error falls under it, so the layer computes in int8 (no weight-only MatMulNBits): the
    graph rotates x (one MatMul by the 64 x 64 constant, left float32 by the weight-only pass)
    and onnxruntime's output equals numpy's deq(Q(x R)) @ (codes · scales) with the graph's
    codes: the rotated rows are two-sided, so with the symmetric form allowed the layer takes
    it (measured on the rotated rows), else the midpoint form. With the rotation off, the same
    layer is kept."""
    k, n = 128, 40
    x = _swiglu_inputs(512, k, 7)
    w = np.random.default_rng(8).normal(0, 0.1, (k, n)).astype(np.float32)
    bound = 0.01
    plain = layer_error(x, w, *channel_int8(w, x.astype(np.float64).T @ x))
    r = block_rotation(k, 64)
    assert r is not None
    xr, wr = rotate_rows(x, r), rotate_weight(w, r)
    turned = layer_error(xr, wr, *channel_int8(wr, xr.astype(np.float64).T @ xr))
    assert turned < bound < plain, (turned, plain)  # the case this rule is for

    off = _one_linear(k, n, w)
    rep0 = quantize_matmuls_int8(
        off, calibration=_calibration(tmp_path / "a", x, [w]), keep_error=bound, rotate_block=0
    )
    assert rep0.dynamic == 0 and [nm for nm, _ in rep0.kept] == ["w"] and not rep0.rotated

    model = _one_linear(k, n, w)
    rep = quantize_matmuls_int8(
        model,
        calibration=_calibration(tmp_path / "b", x, [w]),
        keep_error=bound,
        rotate_block=64,
        symmetric_slack=slack,
    )
    assert rep.dynamic == 1 and not rep.kept and rep.rotations == ("int8_rotate_64",)
    assert [nm for nm, _ in rep.symmetric] == ([] if slack is None else ["w"])
    ((name, e1, e2),) = rep.rotated
    assert name == "w" and e1 == pytest.approx(plain, rel=1e-3) and e2 <= bound
    meta = rep.as_meta()
    assert (meta["rotated"], meta["rotate_block"]) == (1, 64)
    assert meta["rotated_max_error"] == pytest.approx(e2, abs=1e-6)
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    assert "MatMulIntegerToFloat" in ops and ops.count("MatMul") == 1
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # type: ignore[attr-defined]
    np.testing.assert_array_equal(inits["int8_rotate_64"], r.astype(np.float32))
    codes, scales = graph_codes(inits["w_int8"]), inits["w_int8_scale"]
    xt = x[:16]
    (got,) = _session(model).run(None, {"x": xt})  # type: ignore[attr-defined]
    deq = dequantize_activations_per_token if slack is None else dequantize_activations_symmetric
    xq = deq(rotate_rows(xt, r.astype(np.float32)))
    sim = xq.astype(np.float64) @ (codes * scales.astype(np.float64))
    np.testing.assert_allclose(got, sim, rtol=1e-4, atol=1e-4 * float(np.abs(sim).max()))
    ref = xt.astype(np.float64) @ w
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2 * bound
    # the weight-only pass that follows leaves the rotation float32 and quantizes nothing else
    from spotstop.export.nbits import quantize_matmuls_nbits

    assert quantize_matmuls_nbits(model, 8, 32, skip=rep.rotations) == 0


def test_symmetric_form_where_it_costs_little_and_the_midpoint_where_rows_are_one_sided(
    tmp_path: Path,
) -> None:
    """Per token, measured: gaussian rows take the symmetric form (its error within
    SYMMETRIC_SLACK of the midpoint form's), and onnxruntime's output equals numpy's
    deq_sym(x) @ (codes · scales) with the graph's own codes; rows after a GELU-like
    one-sided activation measure ~1.4x the midpoint form's error and keep the midpoint; with
    ``symmetric_slack=None`` (the default) the gaussian layer keeps it too; a negative slack is
    refused."""
    k, n = 64, 32
    rng = np.random.default_rng(21)
    w = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    two = rng.normal(size=(512, k)).astype(np.float32)
    g = rng.normal(size=(512, k))
    one = (g / (1 + np.exp(-1.702 * g))).astype(np.float32)  # a GELU: min ~ -0.17
    e_mid = layer_error(two, w, *channel_int8(w, two.astype(np.float64).T @ two))
    e_sym = layer_error(two, w, *channel_int8(w, two.astype(np.float64).T @ two), symmetric=True)
    assert e_mid < e_sym <= e_mid * (1 + SYMMETRIC_SLACK)
    h1 = one.astype(np.float64).T @ one
    assert layer_error(one, w, *channel_int8(w, h1), symmetric=True) > 1.2 * layer_error(
        one, w, *channel_int8(w, h1)
    )

    model = _one_linear(k, n, w)
    rep = quantize_matmuls_int8(
        model, calibration=_calibration(tmp_path / "a", two, [w]), symmetric_slack=SYMMETRIC_SLACK
    )
    ((name, es),) = rep.symmetric
    assert name == "w" and es == pytest.approx(e_sym, rel=1e-3)
    meta = rep.as_meta()
    assert (meta["symmetric"], meta["symmetric_slack"]) == (1, SYMMETRIC_SLACK)
    assert meta["symmetric_max_error"] == pytest.approx(es, abs=1e-6)
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    # nothing after the product: σ is its A scale, applied per row inside the kernel
    assert "Mul" not in ops and "Sub" not in ops and "Add" not in ops
    (product,) = [nd for nd in model.graph.node if nd.op_type == "MatMulIntegerToFloat"]  # type: ignore[attr-defined]
    assert product.input[2].endswith("_tok8s_sigma") and product.output[0] == "y"
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # type: ignore[attr-defined]
    assert "w_int8_colsum" not in inits  # no midpoint term
    codes, scales = graph_codes(inits["w_int8"]), inits["w_int8_scale"]
    xt = two[:16].copy()
    xt[0] *= 50.0  # an outlier token costs only itself
    (got,) = _session(model).run(None, {"x": xt})  # type: ignore[attr-defined]
    sim = dequantize_activations_symmetric(xt).astype(np.float64) @ (
        codes * scales.astype(np.float64)
    )
    np.testing.assert_allclose(got, sim, rtol=1e-5, atol=1e-5 * float(np.abs(sim).max()))
    # one row: its step is a (1, 1) A scale, still applied per row (not read as a scalar)
    (got1,) = _session(model).run(None, {"x": xt[1:2]})  # type: ignore[attr-defined]
    np.testing.assert_allclose(got1, sim[1:2], rtol=1e-5, atol=1e-5 * float(np.abs(sim).max()))

    gelu = _one_linear(k, n, w)
    rep1 = quantize_matmuls_int8(
        gelu, calibration=_calibration(tmp_path / "b", one, [w]), symmetric_slack=SYMMETRIC_SLACK
    )
    assert rep1.dynamic == 1 and not rep1.symmetric
    assert "Sub" in [nd.op_type for nd in gelu.graph.node]  # type: ignore[attr-defined]
    off = _one_linear(k, n, w)
    rep2 = quantize_matmuls_int8(off, calibration=_calibration(tmp_path / "c", two, [w]))
    assert rep2.dynamic == 1 and not rep2.symmetric and rep2.symmetric_slack is None
    with pytest.raises(ValueError, match="symmetric_slack"):
        quantize_matmuls_int8(_one_linear(k, n, w), symmetric_slack=-0.1)


def test_both_per_token_forms_of_one_activation_live_in_one_graph() -> None:
    """Two readers of one activation that measured different forms get two quantizations of
    it, with distinct node names (a valid graph), each the codes numpy computes."""
    from onnx import checker
    from spotstop.export.int8_graph import per_token_quantize

    consts = {
        "floor": np.float32(2e-30),
        "half": np.float32(0.5),
        "levels": np.float32(254),
        "sym_levels": np.float32(127),
        "zp": np.uint8(128),
        "axes": np.array([-1], np.int64),
    }
    nodes: list = []
    q_mid, _, _ = per_token_quantize("x", {k: f"c_{k}" for k in consts}, nodes, 17)
    q_sym, _, mu = per_token_quantize("x", {k: f"c_{k}" for k in consts}, nodes, 17, symmetric=True)
    assert mu == "" and q_mid != q_sym
    names = [nd.name for nd in nodes]
    assert len(names) == len(set(names))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info(q, TensorProto.UINT8, [None, 8]) for q in (q_mid, q_sym)],
        [numpy_helper.from_array(np.asarray(v), f"c_{k}") for k, v in consts.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    checker.check_model(m)
    x = np.random.default_rng(2).normal(size=(5, 8)).astype(np.float32)
    a, b = _session(m).run(None, {"x": x})  # type: ignore[attr-defined]
    hi, lo = x.max(-1, keepdims=True), x.min(-1, keepdims=True)
    mu_ = (hi + lo) * np.float32(0.5)
    np.testing.assert_array_equal(
        a,
        (np.round((x - mu_) / (np.maximum(hi - lo, 2e-30) / np.float32(254))) + 128).astype(
            np.uint8
        ),
    )
    np.testing.assert_array_equal(
        b, (np.round(x / (np.maximum(hi, -lo) / np.float32(127))) + 128).astype(np.uint8)
    )


def test_the_smallest_rotation_block_within_the_bound_is_taken(tmp_path: Path) -> None:
    """Blocks are tried smallest first (128, or rotate_block if smaller, then doubling up to
    rotate_block): the heavy-tailed layer that 128 brings under the bound is rotated in 128 even
    when 256 is allowed; a bound only the larger block meets takes 256, one neither meets keeps
    the layer after trying both. By default (128) only 128 is tried."""
    from spotstop.export.int8_math import rotation_blocks

    assert rotation_blocks(128) == (128,) and rotation_blocks(256) == (128, 256)
    assert rotation_blocks(64) == (64,) and rotation_blocks(32) == (32,)
    assert rotation_blocks(0) == ()
    k, n = 256, 40
    x = _swiglu_inputs(512, k, 7)
    w = np.random.default_rng(8).normal(0, 0.1, (k, n)).astype(np.float32)

    def rotated_error(b: int) -> float:
        r = block_rotation(k, b)
        assert r is not None
        xr, wr = rotate_rows(x, r), rotate_weight(w, r)
        return layer_error(xr, wr, *channel_int8(wr, xr.astype(np.float64).T @ xr))

    e128, e256 = rotated_error(128), rotated_error(256)
    plain = layer_error(x, w, *channel_int8(w, x.astype(np.float64).T @ x))
    assert e256 < e128 < plain, (e256, e128, plain)
    for i, (bound, want) in enumerate(
        [
            (e128 * 1.001, ("int8_rotate_128",)),
            ((e128 + e256) / 2, ("int8_rotate_256",)),
            (e256 * 0.999, ()),
        ]
    ):
        rep = quantize_matmuls_int8(
            _one_linear(k, n, w),
            calibration=_calibration(tmp_path / str(i), x, [w]),
            keep_error=bound,
            rotate_block=256,
        )
        assert rep.rotations == want, (bound, rep)
        assert len(rep.kept) == (0 if want else 1)


def test_rotate_block_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="rotate_block"):
        quantize_matmuls_int8(_one_linear(16, 8, np.ones((16, 8), np.float32)), rotate_block=-1)


def test_smoothing_defaults_per_activation_form() -> None:
    from spotstop.export.int8 import default_smooth_alpha

    assert default_smooth_alpha(calibrated=True) is None  # per token (the default)
    assert default_smooth_alpha(calibrated=True, activations="per-tensor") == SMOOTH_ALPHA
    assert default_smooth_alpha(calibrated=False, activations="per-tensor") is None
    with pytest.raises(ValueError, match="per-token, per-tensor"):
        default_smooth_alpha(True, "per-row")


def test_smoothing_needs_calibration_and_a_positive_bound() -> None:
    model, _ = _norm_then_two_linears(8, 4, 6, 1.0)
    with pytest.raises(ValueError, match="calibration scenes"):
        quantize_matmuls_int8(model, smooth_alpha=0.5)
    with pytest.raises(ValueError, match="keep_error must be positive"):
        quantize_matmuls_int8(model, keep_error=0.0)


def test_without_calibration_every_linear_but_the_head_is_int8() -> None:
    model, _ = _norm_then_two_linears(16, 8, 7, 1.0)
    rep = quantize_matmuls_int8(model)
    assert rep.dynamic == 2 and rep.measured == 0 and rep.gptq == 0 and rep.head == ("head",)


@pytest.mark.precision("int8")
def test_export_member_at_int8_calibrates_measures_and_records(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """The export's int8: GPTQ codes and a measured error for every Linear the calibration
    scenes reach, per-token MatMulInteger in both graphs, the output layer weight-only 8-bit
    (accuracy_level 4) and one table, validated, and all of it in the manifest; no smoothing
    by default, and SmoothQuant, asked for, smooths the activations it has statistics for."""
    import onnx
    import yaml
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl", "calibration_scenes": 2}
    e = export_member(src, tmp_path / "m", **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in e.checks)
    q = e.quantizer
    assert q is not None and q["method"] == "gptq" and "MatMulInteger" in q["format"]
    d = q["dynamic_int8"]
    assert d["activations"] == "per-token"
    assert d["dynamic"] > 20 and d["gptq"] == d["measured"] > 20
    assert d["weight_only"]["output_layer"] == 1 and d["smooth_alpha"] is None  # per token
    assert d["float32_image_ends"] == 2  # the patch embedding and the projector's last layer
    assert 0 < d["median_error"] <= d["max_error"]
    # every int8 weight is counted: the dynamic layers' and the weight-only output layer's
    # (it said {int8: 1}, the output layer alone)
    assert q["weights_by_bits"] == {"int8": d["dynamic"] + d["weight_only"]["output_layer"]}
    on_disk = yaml.safe_load((tmp_path / "m" / "spotstop_onnx.yaml").read_text())
    assert on_disk["precision"] == "int8" and on_disk["quantizer"] == dict(q)
    nodes = []
    for f in ("vision.onnx", "decoder.onnx"):
        g = onnx.load(str(tmp_path / "m" / "onnx" / f), load_external_data=False).graph
        assert any(n.op_type == "MatMulIntegerToFloat" for n in g.node), f
        nodes += list(g.node)
    nb = [n for n in nodes if n.op_type == "MatMulNBits"]
    wo = d["weight_only"]
    assert len(nb) == wo["output_layer"] + wo["over_keep_error"]
    dec = onnx.load(str(tmp_path / "m" / "onnx" / "decoder.onnx"), load_external_data=False)
    assert any(n.op_type == "GatherBlockQuantized" for n in dec.graph.node)  # one table
    assert d["smoothed_inputs"] == 0
    # by default the midpoint form everywhere: no symmetric layer, no symmetric quantization
    assert d["symmetric"] == 0 and d["symmetric_slack"] is None
    # (the read rows' residuals take it: their own quantization, named for them)
    assert not any(n.name.endswith("_tok8s_neg") and "_reads" not in n.name for n in nodes)
    # the decoder's read rows are multiplied with their residual's codes too; the vision
    # graph's rows all alike
    vis = onnx.load(str(tmp_path / "m" / "onnx" / "vision.onnx"), load_external_data=False)
    assert not any(n.op_type == "ScatterND" for n in vis.graph.node)
    n_int8 = sum(1 for n in vis.graph.node if n.op_type == "MatMulIntegerToFloat")
    assert d["exact_reads"] == d["dynamic"] - n_int8 > 0
    writes = [n for n in dec.graph.node if n.op_type == "ScatterND" and "_xr8_" in n.output[0]]
    assert len(writes) == d["exact_reads"]
    # its codes are made as (rows, K), as the GEMM reads them (no reshape to the activation's
    # shape and back), with zero points made once for the graph's B·T rows and read rows
    assert not any(n.name.endswith(("_tok8_u8", "_tok8s_u8", "_qf")) for n in dec.graph.node)
    zps = sorted(n.name for n in dec.graph.node if n.op_type == "Expand" and "zps" in n.name)
    assert zps == ["int8_reads_zps", "int8_reads_zps2"]
    # symmetric=True (`spotstop export --int8-symmetric`): the layers with two-sided inputs
    # take the symmetric form, each within the bound; the graphs hold one per-row Sub (the
    # midpoint) per activation quantized with it
    m = export_member(src, tmp_path / "sym", symmetric=True, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in m.checks)
    md = m.quantizer["dynamic_int8"]  # type: ignore[index]
    assert md["symmetric_slack"] == SYMMETRIC_SLACK and 0 < md["symmetric"] <= md["dynamic"]
    assert 0 < md["symmetric_max_error"] <= md["keep_error"]
    assert md["dynamic"] == d["dynamic"] and md["max_error"] == d["max_error"]
    sym_nodes = [
        n
        for f in ("vision.onnx", "decoder.onnx")
        for n in onnx.load(str(tmp_path / "sym" / "onnx" / f), load_external_data=False).graph.node
    ]
    n_mid = sum(1 for n in sym_nodes if n.op_type == "Sub" and n.name.endswith("_tok8_centred"))
    n_sym = sum(
        1
        for n in sym_nodes
        if n.op_type == "Neg" and n.name.endswith("_tok8s_neg") and "_reads" not in n.name
    )
    assert n_sym > 0 and n_mid + n_sym <= md["dynamic"]
    s = export_member(src, tmp_path / "s", smooth_alpha=SMOOTH_ALPHA, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in s.checks)
    sd = s.quantizer["dynamic_int8"]  # type: ignore[index]
    assert sd["smooth_alpha"] == SMOOTH_ALPHA and sd["smoothed_inputs"] > 10


def test_the_export_rotates_the_layers_over_the_bound_and_records_them(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """With a bound some layers exceed per token but not rotated (0.0085 on the random tiny
    LFM2-VL member: its layers measure up to 0.014, rotated in blocks of 64 or 128 channels under
    0.008), those layers compute in int8 behind a float32 MatMul by the rotation constant, the
    member validates and the manifest counts them; with the rotation off (``rotate_block=0``)
    the same layers are kept weight-only instead."""
    import onnx
    from spotstop.export.int8_math import ROTATE_BLOCK
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl", "calibration_scenes": 2}
    e = export_member(src, tmp_path / "r", keep_error=0.0085, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in e.checks)
    d = e.quantizer["dynamic_int8"]  # type: ignore[index]
    assert d["rotate_block"] == ROTATE_BLOCK and d["rotated"] >= 1
    assert 0 < d["rotated_max_error"] <= 0.0085 < d["max_error"]
    rot_mm, nbits = 0, 0
    for f in ("vision.onnx", "decoder.onnx"):
        g = onnx.load(str(tmp_path / "r" / "onnx" / f), load_external_data=False).graph
        consts = {t.name for t in g.initializer if t.name.startswith("int8_rotate_")}
        rot_mm += sum(n.op_type == "MatMul" and n.input[1] in consts for n in g.node)
        nbits += sum(n.op_type == "MatMulNBits" for n in g.node)
    assert 1 <= rot_mm <= d["rotated"]  # one per rotated input (layers may share one)
    wo = d["weight_only"]
    assert nbits == wo["output_layer"] + wo["over_keep_error"]
    off = export_member(src, tmp_path / "o", keep_error=0.0085, rotate_block=0, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in off.checks)
    d0 = off.quantizer["dynamic_int8"]  # type: ignore[index]
    assert d0["rotate_block"] == 0 and d0["rotated"] == 0 and d0["rotated_max_error"] == 0
    assert d0["weight_only"]["over_keep_error"] == wo["over_keep_error"] + d["rotated"]
    assert d0["dynamic"] == d["dynamic"] - d["rotated"]


def _levels(folder: Path) -> list[int]:
    """Every MatMulNBits node's accuracy_level in a member's graphs (absent: 0)."""
    import onnx

    out = []
    for f in ("vision.onnx", "decoder.onnx"):
        g = onnx.load(str(folder / "onnx" / f), load_external_data=False).graph
        for n in g.node:
            if n.op_type == "MatMulNBits":
                has = any(a.name == "accuracy_level" for a in n.attribute)
                out.append(int(helper.get_node_attr_value(n, "accuracy_level")) if has else 0)
    return sorted(out)


@pytest.mark.parametrize("alpha", [None, SMOOTH_ALPHA])
def test_the_export_keeps_the_layers_over_the_bound_weight_only(
    tiny_pair: Path, tmp_path: Path, alpha: float | None
) -> None:
    """With a keep bound under most layers' measured error, the export keeps them (their
    smoothed weights when smoothed) weight-only 8-bit beside the output layer, all at
    accuracy_level 4, and the bundle still validates."""
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl", "calibration_scenes": 2}
    e = export_member(src, tmp_path / "k", keep_error=1e-4, smooth_alpha=alpha, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in e.checks)
    wo = e.quantizer["dynamic_int8"]["weight_only"]  # type: ignore[index]
    assert wo["over_keep_error"] > 10
    assert _levels(tmp_path / "k") == [4] * (wo["over_keep_error"] + wo["output_layer"])


def test_int8_options_are_checked_before_anything_is_written(
    tiny_pair: Path, tmp_path: Path
) -> None:
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    with pytest.raises(ValueError, match="int8's"):
        export_member(src, tmp_path / "a", precision="int4", smooth_alpha=0.5)
    with pytest.raises(ValueError, match="only the 'gptq' quantizer records"):
        export_member(src, tmp_path / "b", precision="int8", smooth_alpha=0.5, quantizer="rtn")
    with pytest.raises(ValueError, match=r"smooth_alpha must be a number in \[0, 1\]"):
        export_member(src, tmp_path / "d", precision="int8", smooth_alpha=1.5)
    with pytest.raises(ValueError, match="precision must be one of"):
        export_member(src, tmp_path / "c", precision="int7")
    with pytest.raises(ValueError, match="rotate_block is int8's option"):
        export_member(src, tmp_path / "e", precision="int4", rotate_block=64)
    with pytest.raises(ValueError, match="rotate_block must be 0"):
        export_member(src, tmp_path / "f", precision="int8", rotate_block=-1)
    with pytest.raises(ValueError, match="symmetric is int8's option"):
        export_member(src, tmp_path / "g", precision="int4", symmetric=False)
    with pytest.raises(ValueError, match="exact_reads is int8's option"):
        export_member(src, tmp_path / "h", precision="int4", exact_reads=False)
    assert not any(tmp_path.iterdir())


def test_the_export_rounds_the_read_rows_too_when_asked(tiny_pair: Path, tmp_path: Path) -> None:
    """``exact_reads=False`` (``spotstop export --int8-reads int8``): the decoder's read rows
    quantized like the others, none written back (ScatterND), the manifest's count 0; by default (round to
    nearest here, so the answers' first-token rows, read out after the Gather at the last
    position, are an int8 layer too) every token-row layer has them and that one does not."""
    import onnx
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-qwen3_5"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-qwen3_5", "quantizer": "rtn"}
    counts = {}
    for exact in (False, None):
        e = export_member(src, tmp_path / str(exact), exact_reads=exact, **kw)  # type: ignore[arg-type]
        assert all(c.ok for c in e.checks)
        d = e.quantizer["dynamic_int8"]  # type: ignore[index]
        g = onnx.load(
            str(tmp_path / str(exact) / "onnx" / "decoder.onnx"), load_external_data=False
        )
        n_int8 = sum(1 for n in g.graph.node if n.op_type == "MatMulIntegerToFloat")
        writes = sum(1 for n in g.graph.node if n.op_type == "ScatterND" and "_xr8_" in n.output[0])
        counts[exact] = (d["exact_reads"], writes)
        if exact is None:
            # every int8 layer but the read-out's first-token rows (Qwen3.5's reshapes take the
            # batch size from last_index: no row picked, so no layer after them left out)
            assert d["exact_reads"] == n_int8 - 1 > 0
    assert counts[False] == (0, 0) and counts[None][0] == counts[None][1] > 0


@pytest.mark.parametrize(
    ("op", "extra"),
    [("SimplifiedLayerNormalization", []), ("LayerNormalization", ["beta"])],
)
def test_smoothing_folds_into_a_fused_norms_scale(
    tmp_path: Path, op: str, extra: list[str]
) -> None:
    """In the fused graph the norm is one operator: 1/s goes into its scale (and a LayerNorm's
    bias), no Mul is added, and the graph computes what it did up to int8's rounding."""
    import onnx

    k, n = 32, 16
    rng = np.random.default_rng(8)
    g = rng.uniform(0.5, 1.5, k).astype(np.float32)
    beta = rng.normal(0, 0.1, k).astype(np.float32)
    w1 = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    nodes = [
        helper.make_node(op, ["x", "g", *extra], ["xn"], axis=-1, epsilon=1e-6, name="norm"),
        helper.make_node("MatMul", ["xn", "w1"], ["a"], name="q"),
        helper.make_node("MatMul", ["xn", "w2"], ["b"], name="k"),
        helper.make_node("Add", ["a", "b"], ["y"], name="sum"),
    ]
    arrays = {"g": g, "w1": w1, "w2": w2, **({"beta": beta} if extra else {})}
    model = _model(nodes, [numpy_helper.from_array(v, nm) for nm, v in arrays.items()], k, n)
    fp32 = onnx.ModelProto()
    fp32.CopyFrom(model)  # type: ignore[arg-type]
    x = rng.normal(size=(256, k)).astype(np.float32)
    x[:, 5] *= 30.0
    # the recorded inputs of q and k: the norm's output, as the calibration would hold it
    probe = onnx.ModelProto()
    probe.CopyFrom(fp32)
    probe.graph.output.append(helper.make_tensor_value_info("xn", TensorProto.FLOAT, [None, k]))
    xn = _session(probe).run(["xn"], {"x": x})[0]  # type: ignore[attr-defined]
    cal = _calibration(tmp_path / "cal", xn, [w1, w2])
    rep = quantize_matmuls_int8(model, calibration=cal, smooth_alpha=0.5)
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    assert rep.smoothed == 1 and rep.folded == 1
    assert ops.count("Mul") == 3  # no smoothing Mul: μ once, μ ⊗ c per layer (σ: A scale)
    assert ops.count("MatMulIntegerToFloat") == 2
    (want,) = _session(fp32).run(["y"], {"x": x[:16]})  # type: ignore[attr-defined]
    (got,) = _session(model).run(["y"], {"x": x[:16]})  # type: ignore[attr-defined]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 3 * rep.max_error + 1e-3


def test_the_vision_rule_keeps_int8_activations_within_its_share_of_the_tolerance() -> None:
    """export/int8.py's vision rule on constructed moves: within VISION_SHARE of the score
    tolerance (either sign) the vision graph keeps int8 activations; one scene over it, or a
    move that is not finite, and it computes in float; nonsense arguments are refused."""
    bound = VISION_SHARE * 0.25
    keep = vision_activation_check(np.array([0.01, -bound, 0.05]), 0.25)
    assert keep == VisionActivationCheck(bound, bound, 3) and not keep.float_activations
    assert keep.as_meta()["activations"] == "int8" and keep.as_meta()["scenes"] == 3
    over = vision_activation_check(np.array([0.01, -0.02, -(bound + 1e-3)]), 0.25)
    assert over.float_activations and over.max_abs_diff == pytest.approx(bound + 1e-3)
    assert over.as_meta()["activations"] == "float (weight-only 8-bit)"
    # a wider tolerance (int4's 1.0) lets the same moves through
    assert not vision_activation_check(np.array([bound + 1e-3]), 1.0).float_activations
    nan = vision_activation_check(np.array([0.0, np.nan]), 0.25)
    assert nan.float_activations and nan.as_meta()["max_abs_diff"] == "nan"
    with pytest.raises(ValueError, match="at least one calibration scene"):
        vision_activation_check(np.array([]), 0.25)
    with pytest.raises(ValueError, match="share"):
        vision_activation_check(np.array([0.1]), 0.25, share=0.0)
    with pytest.raises(ValueError, match="score_atol"):
        vision_activation_check(np.array([0.1]), 0.0)


def test_a_failed_int8_validation_says_what_the_vision_rule_chose(
    tiny_pair: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member whose int8 graphs fail the export's validation leaves no manifest, so the
    error carries the measured rule's record (its move, scenes, bound and choice): a real-size
    export that fails after minutes still says which choice the failure follows. It survives
    the child process a large member is exported in (pickled)."""
    import pickle

    import spotstop.export.onnx as export_onnx
    from spotstop.export.archs.lfm2_vl import Lfm2VlExportConfig

    monkeypatch.setattr(export_onnx, "CHECK_SCENES", 2)
    monkeypatch.setattr(Lfm2VlExportConfig, "atol", {**Lfm2VlExportConfig.atol, "int8": 0.0})
    monkeypatch.setattr(Lfm2VlExportConfig, "rtol", {**Lfm2VlExportConfig.rtol, "int8": 0.0})
    kw = {"precision": "int8", "buckets": [256], "calibration_scenes": 1}
    with pytest.raises(export_onnx.ExportValidationError) as ei:
        export_onnx.export_member(tiny_pair / "tiny-lfm2_vl", tmp_path / "m", **kw)  # type: ignore[arg-type]
    e = ei.value
    va = e.measured["vision_activations"]
    assert set(e.measured) == {"vision_activations"} and va["scenes"] == 2
    assert va["activations"] in ("int8", "float (weight-only 8-bit)")
    said = str(e).split("the measured rules chose (before validation):")[1]
    assert f"vision_activations: max |ds| {va['max_abs_diff']} over 2 check scenes" in said
    assert f"(bound {va['bound']}): activations {va['activations']}" in said
    again = pickle.loads(pickle.dumps(e))
    assert again.measured == e.measured and str(again) == str(e)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("over", [False, True])
def test_the_export_measures_the_vision_graphs_int8_activations_and_records_the_choice(
    tiny_pair: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: bool
) -> None:
    """The export measures what the int8 vision graph moves each check scene's score (float32
    decoder; export/gptq.py's CHECK_SCENES, more than the calibration scenes GPTQ fitted the
    weights on: 8 of them missed the tail) and hands the rule those moves; over its bound the vision graph is
    converted again with float activations (every Linear weight-only 8-bit, accuracy_level 0;
    the image's two ends float32) while the decoder still computes in int8; within it the
    vision graph computes in int8. Either way the bundle validates and the manifest records
    the measured move, the bound and the choice."""
    import onnx
    import spotstop.export.onnx as export_onnx

    seen: list[np.ndarray] = []

    def rule(moves: np.ndarray, score_atol: float) -> VisionActivationCheck:
        seen.append(moves)
        real = vision_activation_check(moves, score_atol)
        assert real.bound == VISION_SHARE * score_atol == VISION_SHARE * 0.25
        # the decision forced either way around the measured move
        return VisionActivationCheck(real.max_abs_diff, 0.0 if over else 1e6, real.scenes)

    monkeypatch.setattr(export_onnx, "vision_activation_check", rule)
    monkeypatch.setattr(export_onnx, "CHECK_SCENES", 5)  # 32 by default; 3 calibrate
    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl", "calibration_scenes": 3}
    e = export_onnx.export_member(src, tmp_path / "m", **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in e.checks)
    (moves,) = seen
    assert moves.shape == (5,) and np.isfinite(moves).all() and np.abs(moves).max() > 0
    d = e.quantizer["dynamic_int8"]  # type: ignore[index]
    assert d["gptq"] > 0 and e.quantizer["calibration"]["scenes"] == 3  # type: ignore[index]
    va = d["vision_activations"]
    assert va["scenes"] == 5 and va["max_abs_diff"] == pytest.approx(np.abs(moves).max(), abs=1e-6)
    assert va["activations"] == ("float (weight-only 8-bit)" if over else "int8")
    assert d["float32_image_ends"] == 2  # either way

    def ops(f: str) -> list[onnx.NodeProto]:
        return list(
            onnx.load(str(tmp_path / "m" / "onnx" / f), load_external_data=False).graph.node
        )

    vision, decoder = ops("vision.onnx"), ops("decoder.onnx")
    assert any(n.op_type == "MatMulIntegerToFloat" for n in decoder)
    dynamic_vision = [n for n in vision if n.op_type == "MatMulIntegerToFloat"]
    levels = [
        int(helper.get_node_attr_value(n, "accuracy_level"))
        if any(a.name == "accuracy_level" for a in n.attribute)
        else 0
        for n in vision
        if n.op_type == "MatMulNBits"
    ]
    if over:
        assert not dynamic_vision and len(levels) == d["weight_only"]["float_activations"] > 5
        assert set(levels) == {0}
    else:  # the keep rule's weight-only layers, if any, at accuracy_level 4
        assert dynamic_vision and set(levels) <= {4}
        assert d["weight_only"]["float_activations"] == 0


def _decoder_like(k: int, n: int, opset: int, seed: int) -> tuple[object, list[np.ndarray]]:
    """A graph with the decoder's scoring inputs: ``x`` (B, T, K; ``x_in`` plus nothing, made
    from the token ids as a decoder's rows are) read by two Linears (one activation, two
    weights), the first one's output read by a third; and a read-out Linear on the rows
    gathered at ``last_index`` (as the answers' first-token rows are multiplied)."""
    rng = np.random.default_rng(seed)
    ws = [rng.normal(0, 0.1, (k, n)).astype(np.float32) for _ in range(2)]
    ws += [rng.normal(0, 0.1, (n, n)).astype(np.float32) for _ in range(2)]
    mk = helper.make_node
    ax = numpy_helper.from_array(np.array([-1], np.int64), "ax")
    zero = numpy_helper.from_array(np.float32(0), "zero")
    flat = numpy_helper.from_array(np.array([-1, n], np.int64), "flat")
    if opset >= 13:
        unsq = mk("Unsqueeze", ["ids_f", "ax"], ["ids_3"])
    else:
        unsq = mk("Unsqueeze", ["ids_f"], ["ids_3"], axes=[-1])
    nodes = [
        mk("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        unsq,
        mk("Mul", ["ids_3", "zero"], ["ids_0"]),
        mk("Add", ["x_in", "ids_0"], ["x_ids"]),
        # a shape made from the read positions (the batch size, as a decoder's reshapes take
        # it) picks no rows: x keeps one row per token
        mk("Shape", ["last_index"], ["n_b"]),
        mk("Concat", ["n_b", "m1", "kk"], ["x_shape"], axis=0),
        mk("Reshape", ["x_ids", "x_shape"], ["x"]),
        mk("MatMul", ["x", "w0"], ["y0"], name="lin0"),
        mk("MatMul", ["x", "w1"], ["y1"], name="lin1"),
        mk("MatMul", ["y0", "w2"], ["y2"], name="lin2"),
        mk("Reshape", ["y0", "flat"], ["y0_rows"]),
        mk("Gather", ["y0_rows", "last_index"], ["y0_last"], axis=0),
        mk("MatMul", ["y0_last", "w3"], ["y3"], name="readout"),
    ]
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("input_ids", i64, ["b", "t"]),
            helper.make_tensor_value_info("x_in", f32, ["b", "t", k]),
            helper.make_tensor_value_info("last_index", i64, ["b"]),
            helper.make_tensor_value_info("read_index", i64, ["b", 2]),
        ],
        [helper.make_tensor_value_info(f"y{i}", f32, ["b", "t", n]) for i in range(3)]
        + [helper.make_tensor_value_info("y3", f32, ["b", n])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)]
        + [ax, zero, flat]
        + [
            numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("m1", [-1]), ("kk", [k]))
        ],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )
    return m, ws


@pytest.mark.parametrize(
    ("opset", "symmetric"), [(12, False), (17, False), (18, False), (17, True)]
)
def test_the_read_rows_are_multiplied_with_their_residual_too(opset: int, symmetric: bool) -> None:
    """A decoder graph's read rows (the last prompt position and ``read_index``'s, which pads
    with the last position) are multiplied as their per-token codes plus the residual's codes,
    numpy's ``dequantize_read_rows``; every other row as per-token codes alone; two sequences
    of different lengths, right-padded. The read rows' activation error falls far below the
    other rows'."""
    import math

    from onnx import checker
    from spotstop.export.int8_math import dequantize_read_rows

    k, n, b, t = 64, 48, 2, 9
    model, ws = _decoder_like(k, n, opset, seed=4)
    plain, _ = _decoder_like(k, n, opset, seed=4)
    slack = math.inf if symmetric else None
    rep = quantize_matmuls_int8(model, symmetric_slack=slack)
    quantize_matmuls_int8(plain, symmetric_slack=slack, exact_reads=False)
    checker.check_model(model)
    # the read-out Linear (after the Gather at last_index) computes in int8, its rows alone
    assert rep.dynamic == 4 and rep.as_meta()["exact_reads"] == 3
    ops = [nd.op_type for nd in model.graph.node]  # type: ignore[attr-defined]
    assert ops.count("MatMulIntegerToFloat") == 4 and ops.count("ScatterND") == 3
    rng = np.random.default_rng(7)
    x = rng.normal(size=(b, t, k)).astype(np.float32)
    x[0, 0] *= 30.0  # an outlier token (an attention sink)
    last = np.array([4, 6], np.int64)  # prompts of 5 and 7 tokens
    read = np.array([[5, 6], [7, 6]], np.int64)  # the second sequence's second read: padding
    feeds = {
        "input_ids": np.zeros((b, t), np.int64),
        "x_in": x,
        "last_index": last,
        "read_index": read,
    }
    got = _session(model).run(None, feeds)  # type: ignore[attr-defined]
    base = _session(plain).run(None, feeds)  # type: ignore[attr-defined]
    is_read = np.zeros((b, t), bool)
    for i in range(b):
        is_read[i, [last[i], *read[i]]] = True
    first = dequantize_activations_symmetric if symmetric else dequantize_activations_per_token
    for y, inp, w in ((0, x, ws[0]), (1, x, ws[1]), (2, got[0], ws[2])):
        codes, scales = channel_int8(w)
        w_hat = codes * scales.astype(np.float64)
        deq = first(inp).astype(np.float64)
        deq[is_read] = dequantize_read_rows(inp[is_read], symmetric=symmetric)
        sim = deq @ w_hat
        np.testing.assert_allclose(got[y], sim, rtol=1e-5, atol=1e-5 * float(np.abs(sim).max()))
        if y < 2:  # the rows nobody reads: what the plain per-token graph computes
            np.testing.assert_allclose(got[y][~is_read], base[y][~is_read], rtol=1e-6, atol=1e-6)
        exact = inp.astype(np.float64) @ w_hat
        e_read = np.abs(got[y] - exact)[is_read].max() / np.abs(exact[is_read]).max()
        e_plain = np.abs(base[y] - exact)[is_read].max() / np.abs(exact[is_read]).max()
        assert e_read < e_plain / 30, (y, e_read, e_plain)
    # the read-out Linear: the gathered rows (flattened over the batch) per token alone
    codes, scales = channel_int8(ws[3])
    rows = got[0].reshape(-1, n)[last]
    sim = first(rows).astype(np.float64) @ (codes * scales)
    np.testing.assert_allclose(got[3], sim, rtol=1e-5, atol=1e-5 * float(np.abs(sim).max()))


def test_a_graph_without_the_scoring_inputs_has_no_read_rows() -> None:
    """The vision graph (no ``input_ids``/``last_index``/``read_index``) and the per-tensor form
    quantize every row alike."""
    model, _ = _norm_then_two_linears(16, 8, 9, 1.0)
    assert quantize_matmuls_int8(model).exact_reads == 0
    dec, _ = _decoder_like(16, 8, 17, seed=1)
    assert quantize_matmuls_int8(dec, activations="per-tensor").exact_reads == 0
    assert "ScatterND" not in [nd.op_type for nd in dec.graph.node]  # type: ignore[attr-defined]


def test_the_cli_writes_the_weight_form_asked_or_refuses_one_this_host_gets_wrong(
    tiny_pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``spotstop export --int8-weights s8|u8``: the form asked, recorded in the member's
    manifest and held by every int8 GEMM weight of its graphs (uint8 with the zero point, or
    int8 without); a form this host's kernel gets wrong (s8 on x86 with AVX2 and no VNNI) is
    refused before the model is loaded, nothing written; another precision refuses the option."""
    import onnx
    import yaml
    from spotstop.cli import main
    from spotstop.guard.backends._int8_probe import host_int8_weight_forms

    base = ["export", "--precision", "int8", "--buckets", "256", "--quantizer", "rtn"]
    base += ["--trt", "off", "--member", str(tiny_pair / "tiny-lfm2_vl")]
    for form in ("u8", "s8"):
        out = tmp_path / form
        rc = main([*base, "--out", str(out), "--int8-weights", form])
        if form not in host_int8_weight_forms():
            assert rc == 1 and not out.exists()
            assert "does not compute that form exactly" in capsys.readouterr().err
            continue
        assert rc == 0
        # the summary says what the u8 form costs where s8 runs natively, and only for it
        assert ("int8 weights in the u8 form" in capsys.readouterr().out) == (form == "u8")
        member = out / "members" / "tiny-lfm2_vl"
        meta = yaml.safe_load((member / "spotstop_onnx.yaml").read_text())
        assert meta["quantizer"]["dynamic_int8"]["weight_form"] == form
        g = onnx.load(str(member / "onnx" / "decoder.onnx")).graph
        inits = {t.name: t.data_type for t in g.initializer}
        gemms = [n for n in g.node if n.op_type == "MatMulIntegerToFloat"]
        want = onnx.TensorProto.UINT8 if form == "u8" else onnx.TensorProto.INT8
        assert gemms and all(inits[n.input[1]] == want for n in gemms)
        assert all((n.input[-1] == "int8_weight_zero") == (form == "u8") for n in gemms)
    rc = main([*base, "--out", str(tmp_path / "i4"), "--int8-weights", "u8", "--precision", "int4"])
    assert rc == 1 and "int8_weights is int8's option" in capsys.readouterr().err
