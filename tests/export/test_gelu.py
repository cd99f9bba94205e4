"""The fused form's GELU (export/gelu.py): each decomposed GELU the exporter writes as one
onnxruntime ``FastGelu`` / ``Gelu``, a preceding bias folded in, near misses left alone.

Tolerances, from the float arithmetic:

* one GELU against the exact formula in float64 (numpy): FastGelu evaluates the nine nodes'
  formula reassociated (``0.5·x·(1 + tanh(x·(0.0356774·x² + 0.7978846)))``) with the same MLAS
  tanh as the ``Tanh`` node; each of its five or so float32 operations rounds once, so both
  forms stay within a few ulps of max(|x|, |y|, 1): ``ULPS`` = 4 (measured: 1.4 for both forms,
  1.5 between them; the erf form 0.8).
* a whole vision graph, fused against unfused: the GELUs' outputs differ by those few ulps,
  and the rest of the graph is the same nodes, which carry the difference through two blocks,
  their norms and the projector: ``GRAPH_TOL`` = 1e-5, about 80 ulps at the outputs' scale
  (~2-4; measured 1.1e-6 and 7e-7).
* at int8 the per-token codes after each GELU and norm are compared as well. Where every code
  agrees the integer products are the same integers and the graphs differ by float rounding
  only: the same ``GRAPH_TOL``. A value within an ulp or so of a code boundary turns that
  rounding into a whole step (1/254 of its row's range); the test counts such codes (none on
  these inputs on the machine it was written on) and allows at most one in 1,000, each by one
  step, with the outputs then within ``STEP_TOL``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from spotstop.export.fused import FUSED_DOMAIN, graph_form_ops  # noqa: E402
from spotstop.export.gelu import GELU_CONSTANTS, fuse_gelu  # noqa: E402

from tests._support.make_bundle import BUNDLE_DIR  # noqa: E402

#: float32 ulps (of max(|x|, |y|, 1)) a GELU output may differ from the exact formula by
ULPS = 4
EPS32 = float(np.finfo(np.float32).eps)
#: the whole vision graph, fused against unfused (see the module doc)
GRAPH_TOL = 1e-5
#: the same where per-token codes moved by a step: a step moves a product's input by 1/254 of
#: its row's range; the tiny towers' rows span a few units, their weights ~0.02-0.1
STEP_TOL = 2e-2


def _session(model: Any) -> Any:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def _copy(model: Any) -> Any:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _const(name: str, value: float) -> Any:
    return helper.make_node(
        "Constant",
        [],
        [name],
        value=numpy_helper.from_array(np.array(value, np.float32)),
    )


def _tanh_nodes(x: str, y: str, consts: dict[str, float] | None = None) -> list[Any]:
    """The legacy exporter's tanh GELU (torch's symbolic_opset9.gelu), Constant nodes."""
    c = {**GELU_CONSTANTS, **(consts or {})}
    return [
        helper.make_node("Mul", [x, x], ["x2"]),
        helper.make_node("Mul", [x, "x2"], ["x3"]),
        _const("kappa", c["kappa"]),
        helper.make_node("Mul", ["kappa", "x3"], ["m"]),
        helper.make_node("Add", [x, "m"], ["s"]),
        _const("beta", c["beta"]),
        helper.make_node("Mul", ["beta", "s"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        _const("one", c["one"]),
        helper.make_node("Add", ["one", "t"], ["u"]),
        helper.make_node("Mul", [x, "u"], ["v"]),
        _const("half", c["half"]),
        helper.make_node("Mul", ["half", "v"], [y]),
    ]


def _erf_nodes(x: str, y: str) -> list[Any]:
    """The legacy exporter's erf GELU."""
    return [
        _const("sqrt2", GELU_CONSTANTS["sqrt2"]),
        helper.make_node("Div", [x, "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        _const("one", 1.0),
        helper.make_node("Add", ["e", "one"], ["u"]),
        helper.make_node("Mul", [x, "u"], ["v"]),
        _const("half", 0.5),
        helper.make_node("Mul", ["v", "half"], [y]),
    ]


def _model(nodes: list[Any], inits: list[Any], n: int | str, extra_out: tuple[str, ...] = ()):
    inputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["rows", n])]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", *extra_out)]
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The exact tanh GELU, float64."""
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _inputs(rows: int, n: int) -> np.ndarray:
    """Values over the whole GELU: both tails, the bend, and a few large ones."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((rows, n)) * 3.0
    h[0, :] = np.linspace(-12.0, 12.0, n)
    return h.astype(np.float32)


def _ops(model: Any) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type != "Constant"]


def _check(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> float:
    """Max error in ulps of max(|x|, |want|, 1)."""
    scale = np.maximum(np.maximum(np.abs(x.astype(np.float64)), np.abs(want)), 1.0)
    return float(np.max(np.abs(got.astype(np.float64) - want) / (scale * EPS32)))


def test_tanh_gelu_is_one_fast_gelu_and_matches_numpy() -> None:
    n = 64
    h = _inputs(32, n)
    model = _model(_tanh_nodes("h", "y"), [], n)
    (before,) = _session(model).run(None, {"h": h})
    fused = _copy(model)
    r = fuse_gelu(fused)
    assert (r.fast_gelu, r.gelu, r.biases) == (1, 0, 0)
    assert _ops(fused) == ["FastGelu"]  # the nine nodes and their constants are gone
    assert [n.domain for n in fused.graph.node] == [FUSED_DOMAIN]
    assert {o.domain for o in fused.opset_import} == {"", FUSED_DOMAIN}
    assert graph_form_ops(fused) == {"FastGelu": 1}
    (after,) = _session(fused).run(None, {"h": h})
    want = _gelu_tanh(h)
    assert _check(before, want, h) <= ULPS
    assert _check(after, want, h) <= ULPS


def test_a_bias_before_the_tanh_gelu_is_folded_in() -> None:
    """x = Add(MatMul(h, W), b), b a 1-D initializer: FastGelu(h @ W, b), the Add gone. W is
    the identity, so numpy computes the same float32 sum the kernel does."""
    n = 48
    h = _inputs(16, n)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.eye(n, dtype=np.float32), "W"),
        numpy_helper.from_array(b, "bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["h", "W"], ["p"]),
        helper.make_node("Add", ["p", "bias"], ["x"]),
        *_tanh_nodes("x", "y"),
    ]
    model = _model(nodes, inits, n)
    fused = _copy(model)
    r = fuse_gelu(fused)
    assert (r.fast_gelu, r.biases) == (1, 1)
    assert _ops(fused) == ["MatMul", "FastGelu"]
    assert list(fused.graph.node[-1].input) == ["p", "bias"]
    (got,) = _session(fused).run(None, {"h": h})
    x = h + b  # float32, as the Add and the kernel round it
    assert _check(got, _gelu_tanh(x), x) <= ULPS
    (before,) = _session(model).run(None, {"h": h})
    assert _check(got, before.astype(np.float64), x) <= 2 * ULPS


def test_erf_gelu_is_one_gelu_and_matches_numpy() -> None:
    n = 64
    h = _inputs(32, n)
    model = _model(_erf_nodes("h", "y"), [], n)
    fused = _copy(model)
    r = fuse_gelu(fused)
    assert (r.fast_gelu, r.gelu, r.biases) == (0, 1, 0)
    assert _ops(fused) == ["Gelu"] and fused.graph.node[0].domain == FUSED_DOMAIN
    (got,) = _session(fused).run(None, {"h": h})
    assert _check(got, _gelu_erf(h), h) <= ULPS


@pytest.mark.parametrize(
    "consts",
    [
        {"kappa": 0.0447},  # another constant
        {"beta": float(np.nextafter(np.float32(math.sqrt(2 / math.pi)), np.float32(1)))},  # 1 ulp
        {"half": 0.25},
        {"one": 2.0},
    ],
)
def test_a_gelu_with_other_constants_is_left_alone(consts: dict[str, float]) -> None:
    model = _model(_tanh_nodes("h", "y", consts), [], 8)
    fused = _copy(model)
    assert fuse_gelu(fused).nodes == 0
    assert fused == model


def test_a_constant_that_could_broadcast_to_more_axes_is_left_alone() -> None:
    """0.5 as a (1, 1, 1) tensor makes the 2-D GELU's output 3-D; FastGelu's would stay 2-D."""
    nodes = _tanh_nodes("h", "y")
    nodes[-2] = helper.make_node(
        "Constant", [], ["half"], value=numpy_helper.from_array(np.full((1, 1, 1), 0.5, np.float32))
    )
    model = _model(nodes, [], 8)
    fused = _copy(model)
    assert fuse_gelu(fused).nodes == 0
    assert fused == model


def test_a_gelu_whose_inside_is_read_elsewhere_is_left_alone() -> None:
    """The Tanh's output is also a graph output: removing it would change the graph."""
    model = _model(_tanh_nodes("h", "y"), [], 8, extra_out=("t",))
    fused = _copy(model)
    assert fuse_gelu(fused).nodes == 0
    assert fused == model


@pytest.mark.parametrize("case", ["unknown axis", "2-D bias", "read elsewhere", "axis of 1"])
def test_a_bias_that_cannot_be_folded_stays_an_add(case: str) -> None:
    """FastGelu adds a bias along its input's last axis only: where that axis is not shown to
    be the bias's, the bias is 2-D, or the sum is read by another node, the Add stays and the
    GELU is still fused (of the Add's output)."""
    n = 8
    rng = np.random.default_rng(2)
    b = rng.standard_normal((1, n) if case == "2-D bias" else n).astype(np.float32)
    inits = [numpy_helper.from_array(b, "bias")]
    extra: tuple[str, ...] = ()
    if case == "unknown axis":  # the input's last axis is symbolic, nothing shows it
        nodes = [helper.make_node("Add", ["h", "bias"], ["x"])]
        width: int | str = "n"
    elif case == "axis of 1":  # a (rows, 1) product broadcast by the Add to n
        inits.append(numpy_helper.from_array(rng.standard_normal((n, 1)).astype(np.float32), "W"))
        nodes = [
            helper.make_node("MatMul", ["h", "W"], ["p"]),
            helper.make_node("Add", ["p", "bias"], ["x"]),
        ]
        width = n
    else:
        nodes = [helper.make_node("Add", ["h", "bias"], ["x"])]
        width = n
        if case == "read elsewhere":
            extra = ("x",)
    model = _model([*nodes, *_tanh_nodes("x", "y")], inits, width, extra_out=extra)
    fused = _copy(model)
    r = fuse_gelu(fused)
    assert (r.fast_gelu, r.biases) == (1, 0), case
    assert "Add" in _ops(fused) and fused.graph.node[-1].input[:] == ["x"]
    h = rng.standard_normal((4, n)).astype(np.float32)
    want = _session(model).run(None, {"h": h})
    got = _session(fused).run(None, {"h": h})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ULPS * EPS32 * 4, rtol=ULPS * EPS32)


def test_onnxruntime_keeps_the_fused_gelu(tmp_path: Path) -> None:
    """onnxruntime's optimizer (ORT_ENABLE_ALL, the guard's sessions) keeps FastGelu."""
    model = _model(_tanh_nodes("h", "y"), [], 8)
    fuse_gelu(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert graph_form_ops(onnx.load(opts.optimized_model_filepath)) == {"FastGelu": 1}


# -- the tiny members' whole vision graphs --------------------------------------------------

#: GELUs in each tiny vision graph: two blocks' tanh GELUs, one erf GELU (the projector); the
#: biases the rewrite folds (Qwen3.5's Linears are Gemms until the int8 conversion splits them)
TINY_GELUS = {
    ("tiny-qwen3_5", "fp32"): (2, 1, 0),
    ("tiny-qwen3_5", "int8"): (2, 1, 2),
    ("tiny-lfm2_vl", "fp32"): (2, 1, 2),
    ("tiny-lfm2_vl", "int8"): (2, 1, 2),
}


def _vision(member: str, precision: str) -> Any:
    from spotstop.export.precision import convert_precision

    model = onnx.load(str(BUNDLE_DIR / "members" / member / "onnx" / "vision.onnx"))
    return model if precision == "fp32" else convert_precision(model, precision)


@pytest.mark.parametrize(("member", "precision"), sorted(TINY_GELUS))
def test_whole_vision_graph_matches_the_unfused_graph(member: str, precision: str) -> None:
    """The committed tiny bundle's vision graph (fp32, and converted to int8 as the export
    converts it, without calibration scenes) against the same graph with its GELUs fused, on
    seeded pixels; at int8 every per-token code is compared too (see the module doc)."""
    model = _vision(member, precision)
    fused = _copy(model)
    r = fuse_gelu(fused)
    assert (r.fast_gelu, r.gelu, r.biases) == TINY_GELUS[(member, precision)]
    assert "Tanh" not in _ops(fused) and "Erf" not in _ops(fused)
    codes = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert bool(codes) == (precision == "int8")
    for m in (model, fused):
        m.graph.output.extend(
            helper.make_tensor_value_info(c, TensorProto.UINT8, None) for c in codes
        )
    x = model.graph.input[0]
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]
    a, b = _session(model), _session(fused)
    n_codes = moved = 0
    outs = []
    for seed in range(3):
        px = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        want, got = a.run(None, {x.name: px}), b.run(None, {x.name: px})
        for name, w, g in zip(codes, want[1:], got[1:], strict=True):
            step = np.abs(w.astype(np.int16) - g.astype(np.int16))
            assert step.max(initial=0) <= 1, f"{name}: a code moved by {step.max()} steps"
            moved += int(step.sum())
            n_codes += w.size
        outs.append((got[0], want[0]))
    assert moved <= n_codes // 1000, (moved, n_codes)
    tol = GRAPH_TOL if moved == 0 else STEP_TOL
    for got_y, want_y in outs:
        np.testing.assert_allclose(got_y, want_y, atol=tol, rtol=tol, err_msg=f"{moved} moved")
    assert (n_codes > 0) == (precision == "int8")
