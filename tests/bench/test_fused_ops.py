"""bench/fused_ops.py: each fused kernel and its standard nodes give the same numbers, at the
recorded members' shapes scaled down; the table says which one the export writes.

The real shapes are the script's own run; here every pair runs for real in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests._support.bench import load_bench

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def test_each_pair_computes_the_same_and_the_section_is_written(tmp_path: Path) -> None:
    b = load_bench("fused_ops")
    f = tmp_path / "RESULTS.md"
    f.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    assert b.main(["--scale", "16", "--repeats", "1", "--results", str(f)]) == 0
    text = f.read_text(encoding="utf-8")
    assert "kept" in text and "<!-- fused-ops:begin -->" in text and "export writes" in text
    doc = b.measure(threads=1, repeats=1, scale=16)
    pieces = [r["piece"] for r in doc["rows"]]
    assert pieces == [
        "Qwen3.5-2B gated norm",
        "Qwen3.5-2B short conv",
        "LFM2.5-VL-3B short conv",
        "Qwen3.5-2B MLP up, per-token int8",
        "Qwen3.5-2B vision MLP down, per-token int8 codes",
        "Qwen3.5-2B vision q/k/v split and 2-D rotary",
        "LFM2.5-VL-3B vision attention, padded patches",
    ]
    for r in doc["rows"]:
        # float32 rounding of the same maths (a norm, a 3- or 4-tap sum, an exact integer
        # product scaled in another order)
        assert r["max_abs_diff"] <= 1e-5 * max(1.0, r["scale"]), r
        assert r["fused_s"] > 0 and r["standard_s"] > 0


def test_shapes_follow_the_recorded_configs() -> None:
    b = load_bench("fused_ops")
    by = {p.piece: p for p in b.pairs(qwen_tokens=383, lfm2_tokens=186)}
    # Qwen3.5-2B: 16 value heads of 128; conv over 2 x 16 x 128 key + 16 x 128 value channels
    assert by["Qwen3.5-2B gated norm"].feeds["x"].shape == (383 * 16, 128)
    assert by["Qwen3.5-2B short conv"].feeds["x"].shape == (1, 6144, 383)
    assert by["LFM2.5-VL-3B short conv"].feeds["x"].shape == (1, 2048, 186)
    assert by["Qwen3.5-2B MLP up, per-token int8"].feeds["X"].shape == (383, 2048)
    ops = [n.op_type for n in by["Qwen3.5-2B MLP up, per-token int8"].standard_graph.graph.node]
    assert "MatMulInteger" in ops and "MatMulIntegerToFloat" not in ops
    assert np.isfinite(by["Qwen3.5-2B gated norm"].feeds["g"]).all()
    # the vision tower's 1024 patches of one 512 x 512 scene, 4096 intermediate channels
    codes = by["Qwen3.5-2B vision MLP down, per-token int8 codes"]
    assert codes.feeds["x"].shape == (1024, 4096)
    assert "QuantizeLinear" in [n.op_type for n in codes.fused_graph.graph.node]
    assert "Round" in [n.op_type for n in codes.standard_graph.graph.node]
    # the vision attention's q/k/v: 1024 patches, 16 heads of 64
    rope = by["Qwen3.5-2B vision q/k/v split and 2-D rotary"]
    assert rope.feeds["qkv"].shape == (1024, 3 * 16 * 64)
    assert [n.op_type for n in rope.fused_graph.graph.node].count("RotaryEmbedding") == 2
    assert "Neg" in [n.op_type for n in rope.standard_graph.graph.node]
    # LFM2.5-VL-3B's SigLIP2: 256 patches, 16 heads of 72, the last 32 padding
    att = by["LFM2.5-VL-3B vision attention, padded patches"]
    assert att.feeds["q"].shape == (1, 256, 16 * 72)
    keep = {t.name: t for t in att.fused_graph.graph.initializer}["keep"]
    assert onnx.numpy_helper.to_array(keep).sum() == 256 - 32
