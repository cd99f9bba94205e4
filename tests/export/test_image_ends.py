"""The vision graph's first and last layers stay float32 at every MatMulNBits / int8 precision
(export/weights.py's ``image_end_weights``): found through weightless ops, never through a
shape, a residual stream or another layer, and left as they were by the conversion."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from spotstop.export.precision import ConvertOptions, convert_precision  # noqa: E402
from spotstop.export.weights import image_end_weights  # noqa: E402

P, H, E = 48, 32, 24  # pixels per patch, hidden width, the decoder's embedding width


def _vision(first: str = "matmul", inputs: tuple[str, str] = ("pixel_values", "image_embeds")):
    """pixel_values (N, P) → patch layer → + pos → two residual blocks → norm → projector
    (fc1, Relu, fc2) → image_embeds; a Shape of the pixels reshapes a block's activation (a
    shape path that must not count), and the blocks' layers are not ends."""
    rng = np.random.default_rng(0)
    pix, out = inputs
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.2, name=n)
        for n, s in [
            ("w_patch", (P, H)),
            ("pos", (H,)),
            ("w_a", (H, H)),
            ("w_b", (H, H)),
            ("gamma", (H,)),
            ("w_fc1", (H, 2 * H)),
            ("w_fc2", (2 * H, E)),
        ]
    ]
    consts = {
        "zero": np.array([0], dtype=np.int64),
        "h1": np.array([H], dtype=np.int64),
        "flat": np.array([1, 1, -1], dtype=np.int64),
        "rows": np.array([-1, H], dtype=np.int64),
    }
    inits += [numpy_helper.from_array(v, name=k) for k, v in consts.items()]
    if first == "conv":  # a Conv patch layer (Qwen3.5's): not a MatMul weight, ends the search
        w_conv = rng.standard_normal((H, 1, P)).astype(np.float32) * 0.2
        inits.append(numpy_helper.from_array(w_conv, name="w_conv"))
        nodes = [
            helper.make_node("Reshape", [pix, "flat"], ["px"]),  # (1, 1, N·P)
            helper.make_node("Conv", ["px", "w_conv"], ["pc"], strides=[P]),  # (1, H, N)
            helper.make_node("Transpose", ["pc"], ["pt"], perm=[0, 2, 1]),
            helper.make_node("Reshape", ["pt", "rows"], ["patch"]),  # (N, H)
        ]
    else:
        nodes = [helper.make_node("MatMul", [pix, "w_patch"], ["patch"])]
    nodes += [
        helper.make_node("Add", ["patch", "pos"], ["x0"]),
        # the pixels' shape (N, P) made into (N, H): a shape path into a block's Reshape
        helper.make_node("Shape", [pix], ["pshape"]),
        helper.make_node("Gather", ["pshape", "zero"], ["n_only"], axis=0),
        helper.make_node("Concat", ["n_only", "h1"], ["pshape_h"], axis=0),
        helper.make_node("MatMul", ["x0", "w_a"], ["a"]),
        helper.make_node("Reshape", ["a", "pshape_h"], ["a2"]),
        helper.make_node("Add", ["x0", "a2"], ["x1"]),  # a residual stream
        # a scale computed from the pixels' shape (as attention scales are): values of a shape
        helper.make_node("Cast", ["n_only"], ["n_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["n_f"], ["root_n"]),
        helper.make_node("Div", ["x1", "root_n"], ["x1s"]),
        helper.make_node("MatMul", ["x1s", "w_b"], ["b"]),
        helper.make_node("Add", ["x1", "b"], ["x2"]),
        helper.make_node("Mul", ["x2", "gamma"], ["n"]),
        helper.make_node("MatMul", ["n", "w_fc1"], ["f1"]),
        helper.make_node("Relu", ["f1"], ["r"]),
        helper.make_node("MatMul", ["r", "w_fc2"], ["f2"]),
        helper.make_node("Identity", ["f2"], [out]),
    ]
    g = helper.make_graph(
        nodes,
        "vision",
        [helper.make_tensor_value_info(pix, TensorProto.FLOAT, [None, P])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [None, E])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(model: object, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    s = ort.InferenceSession(
        model.SerializeToString(),  # type: ignore[attr-defined]
        sess_options=opts,
        providers=["CPUExecutionProvider"],
    )
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def test_the_ends_are_the_patch_layer_and_the_projectors_last() -> None:
    assert image_end_weights(_vision()) == {"w_patch", "w_fc2"}


def test_a_conv_patch_layer_ends_the_search_on_its_side() -> None:
    """Behind a Conv the walk stops: the blocks' layers are never taken for the first layer."""
    m = _vision(first="conv")
    assert _run(m, np.ones((3, P), dtype=np.float32)).shape == (3, E)  # a graph that runs
    assert image_end_weights(m) == {"w_fc2"}


def test_a_graph_without_the_image_names_has_no_ends() -> None:
    assert image_end_weights(_vision(inputs=("inputs_embeds", "logits"))) == frozenset()


@pytest.mark.parametrize("precision", ["int8", "int8-nbits", "int4"])
def test_the_conversion_leaves_the_ends_float32(precision: str) -> None:
    """After conversion the two ends are still float MatMuls on their own (unchanged) weights,
    every other layer is quantized, and the graph still computes what the float graph does
    (up to the quantized middle layers)."""
    m = _vision()
    x = np.random.default_rng(1).standard_normal((5, P)).astype(np.float32)
    want = _run(m, x)
    opts = ConvertOptions()
    q = convert_precision(m, precision, options=opts)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    plain = {n.input[1] for n in q.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    assert plain == {"w_patch", "w_fc2"}
    src = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for w in plain:
        np.testing.assert_array_equal(inits[w], src[w])
    quantized = [n for n in q.graph.node if n.op_type in ("MatMulNBits", "MatMulIntegerToFloat")]
    assert len(quantized) == 3  # w_a, w_b, w_fc1
    got = _run(q, x)
    assert np.isfinite(got).all()
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < (0.2 if precision == "int4" else 0.05), rel
    if precision == "int8":
        assert opts.report["int8"]["float32_image_ends"] == 2
    else:
        assert opts.report["float32_image_ends"] == 2


def test_the_registry_flag_says_what_each_conversion_does() -> None:
    """``PrecisionSpec.float32_image_ends`` (what the bytes rule counts at 4 B) is true exactly
    for the precisions that quantize the middle layers and leave both ends float32 MatMuls
    (fp32 keeps every layer float32, and its bytes rule counts them so anyway)."""
    from spotstop.export.precision import PRECISION_SPECS

    seen = set()
    for name, spec in PRECISION_SPECS.items():
        q = convert_precision(_vision(), name, options=ConvertOptions())
        floats = {t.name for t in q.graph.initializer if t.data_type == 1}  # FLOAT
        plain = {n.input[1] for n in q.graph.node if n.op_type == "MatMul"} & floats
        middle_quantized = not plain & {"w_a", "w_b", "w_fc1"}
        kept = middle_quantized and {"w_patch", "w_fc2"} <= plain
        assert kept == spec.float32_image_ends, (name, plain)
        seen.add(kept)
    assert seen == {True, False}
