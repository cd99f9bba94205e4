"""bench/quant_error.py on the tiny pair: the simulation is exact where nothing is quantized,
moves scores where weights are, and its variants are validated."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._support import REPO_ROOT
from tests._support.bench import load_bench

ROOT = REPO_ROOT


def _load() -> Any:
    return load_bench("quant_error")


def _max_abs_rows(
    qe: Any, argv: list[str], variants: str, name: str, capsys: pytest.CaptureFixture[str]
) -> dict[str, float]:
    """Run ``variants`` and read back the printed max |Δs| (round to nearest) of every row
    whose variant name matches the pattern ``name``."""
    assert qe.main([*argv, "--variants", variants]) == 0
    out = capsys.readouterr().out
    found = re.findall(rf"^\s*({name})\s+rtn\s+([\d.]+)", out, re.M)
    return {n.strip(): float(v) for n, v in found}


def test_variants_are_parsed_and_checked() -> None:
    qe = _load()
    assert qe.parse_variant("8:128:all") == (8, 128, "all", True, (), False, "bundle")
    assert qe.parse_variant("4:32:mlp:nohead") == (4, 32, "mlp", False, (), False, "bundle")
    # the token table: as the bundle reads it, float, or with the residual table
    assert qe.parse_variant("4:32:all:tablecoarse").table == "coarse"
    assert qe.parse_variant("8:col:all:tablefloat").table == "float"
    assert qe.parse_variant("8:col:all:tablefloat").exact
    assert [qe.parse_variant(v).precision for v in ("8:col:all", "8:128:all", "4:32:all")] == [
        "int8",
        "int8-nbits",
        "int4",
    ]
    # int8 selectors (export/mixed.py), in the rule's own order
    assert qe.parse_variant("4:128:all:int8=mixed_layers+output_layer") == (
        4,
        128,
        "all",
        True,
        ("output_layer", "mixed_layers"),
        False,
        "bundle",
    )
    # the int8 precision: the read rows exact, as the export computes them, unless int8reads
    assert qe.parse_variant("8:col:vision") == (8, qe.COLUMN, "vision", True, (), True, "bundle")
    assert qe.parse_variant("8:col:mlp:nohead")[:6] == (8, qe.COLUMN, "mlp", False, (), True)
    assert qe.parse_variant("8:col:all:int8reads")[:6] == (8, qe.COLUMN, "all", True, (), False)
    for bad in (
        "8:128",
        "3:128:all",
        "8:100:all",
        "8:128:heads",
        "8:128:all:head",
        "4:col:all",  # per column per token is the int8 precision alone
        "8:col:all:int8=vision",
        "8:128:all:int8reads",  # the read rows are the int8 precision's
        "8:128:all:tablefloat:tablecoarse",
        "8:128:all:nohead:tablefloat",  # a float output layer leaves the table float
    ):
        with pytest.raises(ValueError, match="variant"):
            qe.parse_variant(bad)
    with pytest.raises(ValueError, match=r"unknown int8 selector.*'attn'"):
        qe.parse_variant("4:128:all:int8=attn")


def test_groups_split_the_real_module_names() -> None:
    g = _load().GROUPS
    vision = "model.visual.blocks.0.mlp.linear_fc1"
    assert g["vision"](vision) and not g["decoder"](vision) and not g["mlp"](vision)
    assert g["vision"]("model.multi_modal_projector.linear_1")
    assert g["mlp"]("model.language_model.layers.3.mlp.down_proj")
    assert g["mlp"]("model.language_model.layers.3.feed_forward.w2")  # LFM2
    assert g["mixer"]("model.language_model.layers.0.linear_attn.in_proj_qkv")  # Gated-DeltaNet
    assert g["mixer"]("model.language_model.layers.0.conv.in_proj")  # LFM2 short convolution
    assert not g["mixer"]("model.language_model.layers.3.mlp.down_proj")
    assert g["projector"]("model.visual.merger.linear_fc1")  # Qwen3.5's patch merger
    assert g["projector"]("model.multi_modal_projector.linear_1")  # LFM2-VL
    assert not g["projector"](vision)


def test_per_column_per_token_is_what_the_int8_graph_computes() -> None:
    """A Linear given the int8 precision's codes and the per-token input hook gives what the
    export's own int8 rewrite of that Linear gives when onnxruntime runs it (one token an
    outlier, as an attention sink is), to float rounding."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.export.int8 import quantize_matmuls_int8
    from spotstop.export.int8_math import channel_int8

    qe = _load()
    rng = np.random.default_rng(5)
    k, n = 64, 40
    w = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    x = rng.normal(size=(9, k)).astype(np.float32)
    x[0] *= 40.0
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="lin")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    assert quantize_matmuls_int8(model).dynamic == 1  # round to nearest, per token
    (want,) = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})
    lin = torch.nn.Linear(k, n, bias=False)
    codes, scales = channel_int8(w)
    lin.weight.data.copy_(torch.from_numpy((codes.astype(np.float32) * scales).T.copy()))
    hook = lin.register_forward_pre_hook(qe._per_token)
    with torch.no_grad():
        got = lin(torch.from_numpy(x)).numpy()
    hook.remove()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    with torch.no_grad():  # the hook removed: the float layer, which int8 moved
        assert not np.allclose(lin(torch.from_numpy(x)).numpy(), want, rtol=1e-4, atol=0)


def test_exact_read_rows_are_what_the_int8_decoder_graph_computes() -> None:
    """A decoder Linear with the exact-reads hook gives what the export's int8 rewrite of that
    Linear in a graph with the scoring inputs gives (the read rows with their residual's codes,
    the rest per token), to float rounding; the rows come from ``decoder_feeds``, as the
    graph's inputs do, for two prompts of different lengths."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.export.int8 import quantize_matmuls_int8
    from spotstop.export.int8_math import channel_int8
    from spotstop.guard._prompt import ScorePlan
    from spotstop.guard.backends._graphs import decoder_feeds

    qe = _load()
    rng = np.random.default_rng(8)
    k, n = 64, 40
    plan = ScorePlan.build([5, 6, 7], [7])  # one continuation row of two tokens: 3 reads
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]
    mask = qe._read_mask(prompts, plan)
    feeds = decoder_feeds(prompts, plan, mask.shape[1])
    assert mask.shape == (2, 8) and mask.sum() == 6
    assert mask[0, 3:6].all() and mask[1, 5:8].all()
    w = rng.normal(0, 0.1, (k, n)).astype(np.float32)
    x = rng.normal(size=(*mask.shape, k)).astype(np.float32)
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    mk = helper.make_node
    g = helper.make_graph(
        [  # x made from the token ids (plus nothing), as a decoder's rows are
            mk("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
            mk("Unsqueeze", ["ids_f", "ax"], ["ids_3"]),
            mk("Mul", ["ids_3", "zero"], ["ids_0"]),
            mk("Add", ["x_in", "ids_0"], ["x"]),
            mk("MatMul", ["x", "w"], ["y"], name="lin"),
        ],
        "g",
        [
            helper.make_tensor_value_info("input_ids", i64, ["b", "t"]),
            helper.make_tensor_value_info("x_in", f32, ["b", "t", k]),
            helper.make_tensor_value_info("last_index", i64, ["b"]),
            helper.make_tensor_value_info("read_index", i64, ["b", 2]),
        ],
        [helper.make_tensor_value_info("y", f32, ["b", "t", n])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([-1], np.int64), "ax"),
            numpy_helper.from_array(np.float32(0), "zero"),
        ],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    assert quantize_matmuls_int8(model).exact_reads == 1
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(
        None,
        {"x_in": x, **{name: feeds[name] for name in ("input_ids", "last_index", "read_index")}},
    )
    lin = torch.nn.Linear(k, n, bias=False)
    codes, scales = channel_int8(w)
    lin.weight.data.copy_(torch.from_numpy((codes.astype(np.float32) * scales).T.copy()))
    got = {}
    for exact in (True, False):
        hook = lin.register_forward_pre_hook(
            lambda mod, inp, e=exact: qe._per_token(mod, inp, exact_reads=e)
        )
        qe._READS[0] = mask
        try:
            with torch.no_grad():
                got[exact] = lin(torch.from_numpy(x)).numpy()
        finally:
            qe._READS[0] = None
            hook.remove()
    tol = {"rtol": 1e-5, "atol": 1e-5 * float(np.abs(want).max())}
    np.testing.assert_allclose(got[True], want, **tol)
    np.testing.assert_allclose(got[False][~mask], want[~mask], **tol)
    exact_y = x @ (codes * scales)  # float activations
    assert np.abs(got[True] - exact_y)[mask].max() < np.abs(got[False] - exact_y)[mask].max() / 30


def test_quantized_weight_is_the_operators(tiny_member_dir: Path) -> None:
    """The simulation's weight is what MatMulNBits multiplies by (export/nbits.py's inverse),
    chunked or not."""
    import torch

    qe = _load()
    w = torch.randn(70, 96) * 0.02
    a = qe.quantized(w, 4, 32)
    b = qe.quantized(w, 4, 32, rows_per_chunk=16)
    assert torch.equal(a, b) and not torch.equal(a, w)
    assert float((a - w).abs().max()) <= float(w.abs().max()) / 7


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_the_table_read_is_what_the_bundles_gather_gives(precision: str) -> None:
    """:func:`table_read` with the precision's table rule gives the rows onnxruntime gathers
    from the converted graph (the output layer's blocks and their residual table); chunked or
    not; with the residual its rows are within 1/128 of a step, without it the coarse
    blocks' are over 30 times as far."""
    import torch
    from spotstop.export.precision import get_precision

    from tests._support.tied_table import tied_table_rows

    qe = _load()
    rng = np.random.default_rng(5)
    table = rng.normal(0, 0.05, (300, 256)).astype(np.float32)
    ids = np.array([[0, 7, 299, 150]], np.int64)
    rows, _ = tied_table_rows(table, precision, ids)
    spec = get_precision(precision)
    bits, block, residual = spec.nbits, spec.block_size, spec.table_residual
    t = torch.from_numpy(table)
    read = qe.table_read(t, bits, block, residual)
    np.testing.assert_allclose(read.numpy()[ids[0]], rows, rtol=0, atol=1e-6)
    assert torch.equal(read, qe.table_read(t, bits, block, residual, rows_per_chunk=64))
    assert residual  # every shared table today
    step = np.abs(table.reshape(300, -1, block)).max(-1) / 2 ** (bits - 1)  # max|x| / 128 or 8
    err = np.abs(read.numpy() - table).reshape(300, -1, block).max(-1)
    assert np.all(err <= step / 128 * (1 + 1e-4))
    coarse = qe.table_read(t, bits, block, False).numpy()
    assert np.abs(coarse - table).max() > 30 * err.max()


def test_the_token_table_variants_on_a_tiny_member(
    tiny_member_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table is part of what a variant quantizes: with the output layer alone quantized,
    a tied member's 4-bit blocks alone move the scores away from the same variant with the
    table float, and the bundle's read (the blocks and their residual table) stays closer;
    an untied one reads its float16 table."""
    import json

    qe = _load()
    argv = [str(tiny_member_dir), "--scenes", "2", "--threads", "1"]
    variants = "4:32:none,4:32:none:tablefloat,4:32:none:tablecoarse"
    got = _max_abs_rows(qe, argv, variants, r"int4 b32 none(?:, table [\w ]+)?", capsys)
    assert set(got) == {
        "int4 b32 none",
        "int4 b32 none, table float",
        "int4 b32 none, table blocks alone",
    }
    config = json.loads((tiny_member_dir / "config.json").read_text(encoding="utf-8"))
    tied = config.get(
        "tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings")
    )
    if tied:
        floated = got["int4 b32 none, table float"]
        coarse = abs(got["int4 b32 none, table blocks alone"] - floated)
        assert coarse > 0 and abs(got["int4 b32 none"] - floated) < coarse


def test_simulation_on_a_tiny_member(
    tiny_member_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    qe = _load()
    argv = [str(tiny_member_dir), "--scenes", "2", "--threads", "1", "--bias-correct", "--gptq"]
    assert qe.main([*argv, "--variants", "8:128:none:nohead,4:32:all"]) == 0
    out = capsys.readouterr().out
    rows = {
        (m.group(1).strip(), m.group(2)): float(m.group(3))
        for m in re.finditer(
            r"^\s*(int\d b\d+ \w+(?: nohead)?)\s+(rtn|bias|gptq)\s+([\d.]+)", out, re.M
        )
    }
    for mode in ("rtn", "bias", "gptq"):  # nothing quantized: the reference, nothing to correct
        assert rows[("int8 b128 none nohead", mode)] == 0.0
    assert rows[("int4 b32 all", "rtn")] > 0  # int4 everywhere moves the scores
    assert np.isfinite(rows[("int4 b32 all", "bias")])
    assert 0 < rows[("int4 b32 all", "gptq")] < np.inf
    assert "4 scores" in out  # scene and request-only passes of 2 scenes
    assert re.search(r"GPTQ: inputs of \d+ Linear weights recorded", out)


def test_int8_variants_on_a_world_folder(
    tiny_member_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--world scores every scene of a `spotstop world` folder (each with its image and
    request-only); 8:col with nothing chosen is the reference, 8:col on every Linear moves it."""
    from spotstop.export.world import WorldOptions, build_world

    qe = _load()
    world = build_world(tmp_path / "w", seed=3, options=WorldOptions(rooms=1, contrasts_per_room=1))
    argv = [str(tiny_member_dir), "--world", str(world.root), "--threads", "1"]
    assert qe.main([*argv, "--variants", "8:col:none:nohead,8:col:all,8:col:all:int8reads"]) == 0
    out = capsys.readouterr().out
    rows = dict(
        re.findall(
            r"^\s*(int8 per column, per token(?:, read rows int8)? \w+(?: nohead)?)\s+rtn\s+([\d.]+)",
            out,
            re.M,
        )
    )
    assert float(rows["int8 per column, per token none nohead"]) == 0.0
    assert float(rows["int8 per column, per token all"]) > 0.0
    # the read rows rounded too: another computation, another score
    assert float(rows["int8 per column, per token, read rows int8 all"]) > 0.0
    assert (
        rows["int8 per column, per token, read rows int8 all"]
        != rows["int8 per column, per token all"]
    )
    assert "4 scores (scene and request-only passes of 2 scenes of the world w (seed 3))" in out


def test_an_int8_precision_run_has_its_own_section(tiny_member_dir: Path, tmp_path: Path) -> None:
    """A run of 8:col variants does not replace the weight-only section of the same member."""
    qe = _load()
    results = tmp_path / "RESULTS.md"
    argv = [str(tiny_member_dir), "--scenes", "1", "--threads", "1", "--results", str(results)]
    assert qe.main([*argv, "--variants", "8:128:mlp"]) == 0
    assert qe.main([*argv, "--variants", "8:col:mlp"]) == 0
    text = results.read_text(encoding="utf-8")
    name = tiny_member_dir.name
    assert f"<!-- quant-error-{name}:begin -->" in text
    assert f"<!-- quant-error-{name}-int8:begin -->" in text
    assert "| int8 b128 mlp |" in text and "| int8 per column, per token mlp |" in text


def test_results_section_names_the_command_and_every_variant(
    tiny_member_dir: Path, tmp_path: Path
) -> None:
    qe = _load()
    results = tmp_path / "RESULTS.md"
    argv = [str(tiny_member_dir), "--scenes", "1", "--threads", "1", "--variants", "8:128:mlp"]
    assert qe.main([*argv, "--results", str(results)]) == 0
    text = results.read_text(encoding="utf-8")
    name = tiny_member_dir.name
    assert f"<!-- quant-error-{name}:begin -->" in text
    assert f"`python bench/quant_error.py {' '.join(argv)} --results {results}`" in text
    assert re.search(
        r"\| int8 b128 mlp \| round to nearest \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \|", text
    )
    assert "| mean Δs | SD(Δs) | SD(Δs) / SD(s) | Spearman |" in text


def test_nothing_quantized_ranks_the_scores_as_the_reference(
    tiny_member_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed rank check is verify-bundle's Spearman: 1 when no weight moved."""
    qe = _load()
    argv = [str(tiny_member_dir), "--scenes", "2", "--threads", "1"]
    assert qe.main([*argv, "--variants", "8:128:none:nohead,4:32:all"]) == 0
    out = capsys.readouterr().out
    rho = {
        m.group(1).strip(): float(m.group(2))
        for m in re.finditer(
            r"^\s*(int\d b\d+ \w+(?: nohead)?)\s+rtn\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+"
            r"\s+[\d.]+\s+(?:[\d.]+|nan)\s+(-?[\d.]+|nan)",
            out,
            re.M,
        )
    }
    assert rho["int8 b128 none nohead"] == 1.0
    assert -1.0 <= rho["int4 b32 all"] <= 1.0


def test_int8_selectors_simulate_what_the_rule_keeps_at_8_bits(
    tiny_member_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``int8=vision`` on the vision group is the int8 variant of that group, bit for bit (the
    same weights at 8 bits, by export/mixed.py's rule); --gptq-only scores GPTQ alone and the
    section of a run with selectors is its own."""
    qe = _load()
    argv = [str(tiny_member_dir), "--scenes", "1", "--threads", "1"]
    variants = "8:32:vision:nohead,4:32:vision:nohead:int8=vision,4:32:vision:nohead"
    got = _max_abs_rows(qe, argv, variants, r"int\d b32 vision nohead.*?", capsys)
    at8 = [v for name, v in got.items() if "int8: vision" in name]
    assert len(got) == 3 and len(at8) == 1
    assert at8[0] == got["int8 b32 vision nohead"] != got["int4 b32 vision nohead"]
    results = tmp_path / "RESULTS.md"
    assert (
        qe.main(
            [
                *argv,
                "--gptq",
                "--gptq-only",
                "--variants",
                "4:32:all:int8=output_layer+mixed_layers",
                "--results",
                str(results),
            ]
        )
        == 0
    )
    text = results.read_text(encoding="utf-8")
    assert f"<!-- quant-error-{tiny_member_dir.name}-gptq-mixed:begin -->" in text
    assert "| GPTQ |" in text and "round to nearest" not in text
    assert "int8: output_layer, mixed_layers;" in text


def test_the_error_split_into_a_common_shift_and_a_scene_part_by_hand() -> None:
    qe = _load()
    r = qe.QuantError.of("v", "rtn", [1.0, 2.0, 3.0, 6.0], 2.0, 0.5)
    assert r.max_abs == 6.0 and r.mean == 3.0
    assert r.rms == pytest.approx(np.sqrt((1 + 4 + 9 + 36) / 4))
    assert r.scene_sd == pytest.approx(np.sqrt((4 + 1 + 0 + 9) / 4))  # of Δs − 3
    assert r.ratio == pytest.approx(np.sqrt(3.5) / 2.0)
    assert r.rms**2 == pytest.approx(r.mean**2 + r.scene_sd**2)  # the two parts add up
    assert np.isnan(qe.QuantError.of("v", "rtn", [0.1, 0.2], 0.0, np.nan).ratio)
