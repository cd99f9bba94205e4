"""bench/int8_attention.py: a vision graph's attention in float32 and int8 on its own inputs.

The real graph (Qwen3.5-2B, 24 attention nodes of 16 heads over 1024 patches) is the script's own
run; here a tiny graph of the same form (pixels → Q, K, V projections → ``MultiHeadAttention``,
two blocks) runs every form for real in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._support.bench import load_bench

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

TOKENS, HIDDEN, HEADS, BLOCKS = 32, 16, 2, 2


def _tiny_vision(path: Path, opset: int = 17) -> None:
    """pixels (TOKENS x HIDDEN) → BLOCKS attention blocks (seeded weights) → image_embeds, in
    ``opset`` (the exporter writes 17: reductions take their axes as an attribute)."""
    import onnx
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(3)
    nodes, inits = [], [nh.from_array(np.array([0], np.int64), "ax0")]
    x = "pixel_values"
    for b in range(BLOCKS):
        for p in "qkvo":
            w = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / 2
            inits.append(nh.from_array(w, f"w{p}{b}"))
        nodes.append(helper.make_node("Unsqueeze", [x, "ax0"], [f"x3_{b}"]))
        for p in "qkv":
            nodes.append(helper.make_node("MatMul", [f"x3_{b}", f"w{p}{b}"], [f"{p}{b}"]))
        nodes += [
            helper.make_node(
                "MultiHeadAttention",
                [f"q{b}", f"k{b}", f"v{b}"],
                [f"a{b}"],
                name=f"/blocks.{b}/attn/MultiHeadAttention",
                domain="com.microsoft",
                num_heads=HEADS,
                scale=0.25,
            ),
            helper.make_node("Squeeze", [f"a{b}", "ax0"], [f"a2_{b}"]),
            helper.make_node("MatMul", [f"a2_{b}", f"wo{b}"], [f"o{b}"]),
            helper.make_node("Add", [x, f"o{b}"], [f"h{b}"]),
        ]
        x = f"h{b}"
    nodes.append(helper.make_node("Identity", [x], ["image_embeds"]))
    graph = helper.make_graph(
        nodes,
        "tiny-vision",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    onnx.save(model, str(path))


def _forms(layer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["form"]: f for f in layer["forms"]}


@pytest.mark.parametrize("opset", [17, 21])
def test_every_form_on_the_graphs_own_inputs_and_the_whole_rewrite(
    tmp_path: Path, opset: int
) -> None:
    a = load_bench("int8_attention")
    graph = tmp_path / "vision.onnx"
    _tiny_vision(graph, opset)
    doc = a.measure(
        graph, layers=[0, 1], rounds=3, threads=1, random=True, whole=True, whole_rounds=2,
        torch=True,
    )  # fmt: skip
    assert [layer["layer"] for layer in doc["layers"]] == [0, 1]
    assert doc["attention_nodes"] == BLOCKS
    for layer in doc["layers"]:
        assert tuple(layer["shape"]) == (1, TOKENS, HIDDEN) and layer["heads"] == HEADS
        f = _forms(layer)
        assert list(f) == [*a.FORMS, *a.TORCH_FORMS]
        assert f[a.TORCH_FP32]["rel_rms_err"] < 1e-5 < f[a.TORCH_BF16]["rel_rms_err"] < 0.05
        assert all(len(x["all_s"]) == 3 and x["median_s"] > 0 for x in f.values())
        assert f[a.MHA]["max_abs_err"] == 0.0
        # written out in float32: the same attention to rounding
        assert f[a.DECOMPOSED]["rel_rms_err"] < 1e-5
        # int8: about a per cent, and not the float32 rounding (the codes are really used)
        assert 1e-5 < f[a.INT8_QK]["rel_rms_err"] < 0.05
        assert 1e-5 < f[a.INT8_QK_PV]["rel_rms_err"] < 0.05
        # one step per head for Q is coarser than one per token
        assert f[a.INT8_QK]["rel_rms_err"] < f[a.INT8_QK_HEAD]["rel_rms_err"] < 0.1
    # the first layer measured is profiled: the int8 forms run integer products
    first, second = (_forms(layer) for layer in doc["layers"])
    assert first[a.MHA]["ops"][0][0] == "MultiHeadAttention"
    assert "MatMulIntegerToFloat" in dict(first[a.INT8_QK]["ops"])
    assert "MatMulInteger" not in str(dict(first[a.DECOMPOSED]["ops"]))
    assert all(not x["ops"] for x in second.values()) and not first[a.TORCH_BF16]["ops"]
    w = doc["whole"]
    assert w["form"] == a.INT8_QK and w["nodes_rewritten"] == BLOCKS
    # a float32 graph: one ulp on its input moves its output by rounding only
    assert w["ulp_rel_rms"] < 1e-5 < w["rel_rms_err"]
    assert 0 < w["rel_rms_err"] < 0.05 and w["exported_s"] > 0 and w["rewritten_s"] > 0


def test_k_smoothing_makes_a_shared_k_offset_free() -> None:
    """A large offset common to every key (what K smoothing removes; softmax ignores it) leaves
    the int8 form as close as without it, while it would swamp K's per-token int8 steps."""
    a = load_bench("int8_attention")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, TOKENS, HIDDEN)).astype(np.float32) for _ in range(3))
    plain = a.measure_layer(0, "n", HEADS, 0.25, (q, k, v), 1, 1, (a.MHA, a.INT8_QK))
    shifted = a.measure_layer(0, "n", HEADS, 0.25, (q, k + 40.0, v), 1, 1, (a.MHA, a.INT8_QK))
    e0 = plain.forms[1].rel_rms_err
    e1 = shifted.forms[1].rel_rms_err
    assert e1 < 2 * e0 + 1e-4, (e0, e1)


def test_main_writes_its_section_and_refuses_a_missing_layer(tmp_path: Path) -> None:
    a = load_bench("int8_attention")
    graph = tmp_path / "vision.onnx"
    _tiny_vision(graph)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    argv = [str(graph), "--layers", "1", "--rounds", "2", "--threads", "1", "--random-pixels"]
    assert a.main([*argv, "--results", str(results)]) == 0
    text = results.read_text(encoding="utf-8")
    assert "kept" in text and "<!-- int8-attention:begin -->" in text
    assert "| 1 | 3. " + a.INT8_QK + " |" in text and "load average" in text
    assert "| 1 | 5. " + a.INT8_QK_PV + " |" in text
    assert "Where each form's time goes (layer 1" in text and "- 3. " + a.INT8_QK in text
    assert a.main([*argv, "--whole", "--whole-form", "5", "--results", str(results)]) == 0
    text = results.read_text(encoding="utf-8")
    assert (
        "2 attention nodes as 5. " + a.INT8_QK_PV in text
        and text.count("int8-attention:begin") == 1
    )
    with pytest.raises(ValueError, match="the graph has 2 attention nodes"):
        a.measure(graph, layers=[5], rounds=1, threads=1, random=True)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        a.measure(graph, layers=[0], rounds=0, threads=1, random=True)
