"""The int4 mixed-precision rule (export/mixed.py): which weights stay at int8, checked against
hand-worked layer lists, the tiny members' real module names, the cost model's parameter
formulas, and what an int4 export really writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.export.mixed import (
    DECODER_GROUPS,
    DEFAULT_INT4_INT8,
    INT8_SELECTORS,
    Q4_K_M,
    DecoderWeightCheck,
    VisionWeightCheck,
    decoder_weight_check,
    int8_linears,
    keeps_int8,
    parse_selectors,
    vision_weight_check,
)

from tests._support.pair import TINY_MEMBERS


def _mixed(n: int) -> list[int]:
    return [i for i in range(n) if keeps_int8(["mixed_layers"], "down", i, n)]


def test_mixed_layers_are_the_hand_worked_lists() -> None:
    """onnxruntime-genai's form of llama.cpp's rule (real division, ``round(n/8)``), worked by
    hand: 24 layers (Qwen3.5-2B) 0-2, every third from 5, 21-23; 30 layers (LFM2.5-VL-3B)
    0-3 (3 < 3.75), every third from 6 (round(3.75) = 4), 27-29 (27 >= 26.25); 4 layers (the
    tiny pair) 0 and 2."""
    assert _mixed(24) == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    assert _mixed(30) == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29]
    assert _mixed(4) == [0, 2]
    # only the value and down projections of those layers; other roles never by layer
    for role in ("feed_forward", "mixer"):
        assert not any(keeps_int8(["mixed_layers"], role, i, 24) for i in range(24))
    assert keeps_int8(["mixed_layers"], "value", 5, 24)
    assert not keeps_int8(["mixed_layers"], "value", 6, 24)
    # a Gated-DeltaNet layer: every projection with linear_attn, none of a full-attention one
    assert all(keeps_int8(["linear_attn"], r, 7, 24, True) for r in ("mixer", "feed_forward"))
    assert not keeps_int8(["linear_attn"], "mixer", 7, 24, False)
    assert keeps_int8(["output_layer"], "output") and not keeps_int8([], "output")
    assert keeps_int8(["vision"], "vision") and not keeps_int8(Q4_K_M, "vision")
    with pytest.raises(ValueError, match=r"role must be one of .*got 'head'"):
        keeps_int8([], "head")


def test_selectors_are_parsed_in_the_rules_order() -> None:
    assert parse_selectors("mixed_layers, output_layer") == ("output_layer", "mixed_layers")
    assert parse_selectors(["vision", "linear_attn"]) == ("linear_attn", "vision")
    assert parse_selectors("none") == parse_selectors("") == parse_selectors(None) == ()
    assert parse_selectors(",".join(INT8_SELECTORS)) == INT8_SELECTORS
    with pytest.raises(ValueError, match=r"unknown int8 selector\(s\) \['lm_head'\]; choose"):
        parse_selectors("output_layer,lm_head")


@pytest.fixture(scope="module")
def torch_linears(tiny_pair: Path) -> dict[str, dict[str, tuple[int, ...]]]:
    """member → its torch model's Linear names → weight shape."""
    torch = pytest.importorskip("torch")
    from spotstop.guard import load_member

    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for name in TINY_MEMBERS:
        m: Any = load_member(tiny_pair / name, backend="torch", dtype="float32")
        out[name] = {
            n: tuple(mod.weight.shape)
            for n, mod in m.backend.model.named_modules()
            if isinstance(mod, torch.nn.Linear)
        }
    return out


def test_the_rule_on_the_tiny_members_module_names(
    torch_linears: dict[str, dict[str, tuple[int, ...]]],
) -> None:
    """Q4_K_M's selectors on the real architectures' names (4 decoder layers: 0 and 2 mixed);
    the default keeps nothing at int8."""
    lay = "model.language_model.layers"
    assert DEFAULT_INT4_INT8 == ()
    assert all(int8_linears(list(n), DEFAULT_INT4_INT8) == {} for n in torch_linears.values())
    qwen = int8_linears(list(torch_linears["tiny-qwen3_5"]), Q4_K_M)
    assert qwen == {
        f"{lay}.0.linear_attn.in_proj_qkv": "value",
        f"{lay}.0.mlp.down_proj": "down",
        f"{lay}.2.linear_attn.in_proj_qkv": "value",
        f"{lay}.2.mlp.down_proj": "down",
        "lm_head": "output",
    }
    lfm = int8_linears(list(torch_linears["tiny-lfm2_vl"]), Q4_K_M)
    assert lfm == {
        f"{lay}.0.feed_forward.w2": "down",
        f"{lay}.2.self_attn.v_proj": "value",
        f"{lay}.2.feed_forward.w2": "down",
        "lm_head": "output",
    }
    # linear_attn: the three Gated-DeltaNet layers' 5 projections and 3 feed-forward weights;
    # LFM2 has none
    lin = int8_linears(list(torch_linears["tiny-qwen3_5"]), ["linear_attn"])
    assert len(lin) == 3 * 8 and all(f"{lay}.3." not in n for n in lin)
    assert int8_linears(list(torch_linears["tiny-lfm2_vl"]), ["linear_attn"]) == {}
    # vision: every vision-tower and projector weight, nothing of the decoder
    for name, names in torch_linears.items():
        vis = int8_linears(list(names), ["vision"])
        assert vis and all(".language_model." not in n and n != "lm_head" for n in vis), name
        assert len(vis) == sum(
            ".visual." in n or ".vision_tower." in n or ".multi_modal_projector." in n
            for n in names
        )


@pytest.mark.parametrize("member", TINY_MEMBERS)
def test_each_architectures_roles_name_its_weights(
    member: str, torch_linears: dict[str, dict[str, tuple[int, ...]]]
) -> None:
    """Each architecture's ``MixedRoles`` (export/archs/<model_type>.py) gives every Linear of
    the tiny member a role, and chooses as the rule over every architecture's names at once
    (what ``int8_linears`` does without a model type, e.g. in bench/quant_error.py)."""
    from spotstop.export.mixed import roles_of

    model_type = member.removeprefix("tiny-")
    names = list(torch_linears[member])
    roles = roles_of(model_type)
    assert all(roles.role(n) is not None for n in names), [n for n in names if not roles.role(n)]
    for selectors in [(), *[(s,) for s in INT8_SELECTORS], INT8_SELECTORS]:
        assert int8_linears(names, selectors, model_type) == int8_linears(names, selectors)
    with pytest.raises(ValueError, match="no member architecture 'llava' is registered"):
        int8_linears(names, Q4_K_M, "llava")


@pytest.mark.parametrize("member", TINY_MEMBERS)
@pytest.mark.parametrize(
    "selectors", [(), ("output_layer",), ("mixed_layers",), ("linear_attn",), INT8_SELECTORS]
)
def test_cost_model_counts_the_weights_the_rule_keeps(
    member: str,
    selectors: tuple[str, ...],
    tiny_pair: Path,
    torch_linears: dict[str, dict[str, tuple[int, ...]]],
) -> None:
    """``ArchCost.int8_linear`` (parameter formulas) equals the parameters of the torch Linears
    ``int8_linears`` chooses by name (the vision tower: the weights its graph reads, as the
    cost model's ``vision_linear`` counts them)."""
    from spotstop.export.cost import get_cost_model

    config = json.loads((tiny_pair / member / "config.json").read_text())
    model = get_cost_model(str(config["model_type"]))
    p = model.params(config)
    chosen = int8_linears(list(torch_linears[member]), selectors)
    want = sum(
        int(np.prod(torch_linears[member][n])) for n, role in chosen.items() if role != "vision"
    )
    if "output_layer" in selectors and not p.head:  # tied: the table (Params.bytes's table_int8)
        want -= int(np.prod(torch_linears[member]["lm_head"]))
    if "vision" in selectors:  # but its two ends, which int4 keeps float32
        want += p.vision_linear - p.unused[0] - p.vision_ends
    assert model.int8_linear(config, selectors) == want


@pytest.mark.parametrize("member", TINY_MEMBERS)
def test_int8_linear_reads_the_registry_for_the_image_ends(member: str, tiny_pair: Path) -> None:
    """The vision tower's two ends are left out of the kept-at-int8 count exactly where the
    precision keeps them float32 (``PrecisionSpec.float32_image_ends``), not by assumption."""
    from spotstop.export.cost import get_cost_model
    from spotstop.export.precision import PRECISION_SPECS

    config = json.loads((tiny_pair / member / "config.json").read_text())
    model = get_cost_model(str(config["model_type"]))
    p = model.params(config)
    assert p.vision_ends > 0
    full = p.vision_linear - p.unused[0]
    for name, spec in PRECISION_SPECS.items():
        got = model.int8_linear(config, ("vision",), precision=name)
        assert got == full - (p.vision_ends if spec.float32_image_ends else 0), name
    assert model.int8_linear(config, ("vision",)) == full - p.vision_ends  # int4's default


@pytest.mark.precision("int4")
def test_int4_export_keeps_the_chosen_weights_at_int8(tiny_pair: Path, tmp_path: Path) -> None:
    """An int4 export with Q4_K_M's selectors writes exactly the chosen weights (the tiny
    LFM2-VL's 3 decoder weights and its output layer) as 8-bit MatMulNBits, records it, still
    validates, and weighs what the cost model says beside the default all-int4 export."""
    import onnx
    from onnx import helper
    from spotstop.export.cost import get_cost_model
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw: dict[str, Any] = {"precision": "int4", "buckets": [256], "calibration_scenes": 1}
    mixed = export_member(src, tmp_path / "mixed", int4_int8=Q4_K_M, **kw)
    plain = export_member(src, tmp_path / "plain", int4_int8=(), **kw)  # () : no measured rule
    assert all(c.ok for c in mixed.checks) and all(c.ok for c in plain.checks)
    assert mixed.quantizer is not None and plain.quantizer is not None
    assert mixed.quantizer["int8"]["selectors"] == list(Q4_K_M)
    assert mixed.quantizer["int8"]["chosen"] == 4
    assert plain.quantizer["int8"] == {
        "selectors": [],
        "rule": "export/mixed.py (onnxruntime-genai matmul_mixed_precision)",
        "chosen": 0,
    }
    assert "int8" not in plain.quantizer["weights_by_bits"]
    assert mixed.quantizer["weights_by_bits"]["int8"] == 4
    # the vision graph's two ends stay float32 (export/weights.py), and the manifest says so
    assert mixed.quantizer["float32_image_ends"] == plain.quantizer["float32_image_ends"] == 2

    def weights(folder: Path) -> list[tuple[int, int, int]]:
        """(K, N, bits) of every MatMulNBits weight (a weight read twice counted once)."""
        seen: dict[str, tuple[int, int, int]] = {}
        for f in ("vision.onnx", "decoder.onnx"):
            g = onnx.load(str(folder / "onnx" / f), load_external_data=False)
            for node in g.graph.node:
                if node.op_type == "MatMulNBits":
                    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
                    seen[node.input[1]] = (int(a["K"]), int(a["N"]), int(a["bits"]))
        return sorted(seen.values())

    at8 = [(k, n) for k, n, b in weights(tmp_path / "mixed") if b == 8]
    # (in, out): the output layer (64 -> 608), layers 0 and 2's w2 (256 -> 64), layer 2's v_proj
    # (64 -> 32); every other weight at int4, and all of them in the plain export
    assert sorted(at8) == [(64, 32), (64, 608), (256, 64), (256, 64)]
    assert all(b == 4 for *_, b in weights(tmp_path / "plain"))
    assert len(weights(tmp_path / "plain")) == len(weights(tmp_path / "mixed"))
    # the cost model counts the same parameters: the decoder's linear weights, and the output
    # layer, which is the token table (tied, as in both real members; Params.bytes's table_int8)
    config = json.loads((src / "config.json").read_text())
    cost = get_cost_model("lfm2_vl")
    p = cost.params(config)
    assert p.head == 0 and p.embed == 64 * 608
    assert cost.int8_linear(config, Q4_K_M) + p.embed == sum(k * n for k, n in at8)
    # and the bytes: per weight kept at 8 bits, half a byte more per weight of each block of
    # int4's block size (a short K padded to one block), the same float32 scales
    from spotstop.export.quant import NBITS_BLOCK

    bs = NBITS_BLOCK["int4"]
    blocks = sum(n * -(-k // bs) for k, n in at8)
    assert mixed.weight_bytes - plain.weight_bytes == blocks * bs // 2


def test_the_vision_weight_rule_is_int8s_vision_rule_with_8_bit_weights() -> None:
    """export/mixed.py's vision rule, worked by hand at int4's tolerance 1.0: the bound is half
    of it (0.5); a largest move of 0.5 (either sign) keeps 4 bits, 0.5001 or a move that is not
    finite gives the vision graph 8-bit weights; the record says which."""
    keep = vision_weight_check(np.array([0.1, -0.5, 0.2]), 1.0)
    assert keep == VisionWeightCheck(0.5, 0.5, 3) and not keep.eight_bit
    assert keep.as_meta()["bits"] == 4 and keep.as_meta()["scenes"] == 3
    over = vision_weight_check(np.array([0.1, -0.5001]), 1.0)
    assert over.eight_bit and over.as_meta()["bits"] == 8
    assert over.as_meta()["max_abs_diff"] == pytest.approx(0.5001)
    nan = vision_weight_check(np.array([0.0, np.nan]), 1.0)
    assert nan.eight_bit and nan.as_meta()["max_abs_diff"] == "nan"
    with pytest.raises(ValueError, match="at least one"):
        vision_weight_check(np.array([]), 1.0)


def test_the_decoder_weight_rule_keeps_the_group_that_moves_the_check_scenes_least() -> None:
    """export/mixed.py's decoder rule, worked by hand at tolerance 1.0 (the decoder's bound
    0.5): within it nothing is kept; over it the tried group whose largest move is smallest,
    if smaller than all-4-bit's (ties: the first tried; not finite: never chosen)."""
    assert DECODER_GROUPS == (Q4_K_M, ("linear_attn",))
    within = decoder_weight_check({"none": [0.4, -0.5]}, 1.0, 2)
    assert within == DecoderWeightCheck({"none": 0.5}, 0.5, 2, "none")
    q4km, la = "output_layer+mixed_layers", "linear_attn"
    best = decoder_weight_check({"none": [1.2], q4km: [0.9, -1.1], la: [0.7]}, 1.0, 1)
    assert best.kept == la and best.moves == {"none": 1.2, q4km: 1.1, la: 0.7}
    meta = best.as_meta()
    assert meta["kept"] == la and meta["bound"] == 0.5 and meta["max_abs_diff"][q4km] == 1.1
    # over the bound, but no group moves less than all 4 bits: nothing is kept
    assert decoder_weight_check({"none": [1.2], q4km: [1.3], la: [np.nan]}, 1.0, 1).kept == "none"
    # a tie goes to the first group tried
    assert decoder_weight_check({"none": [2.0], q4km: [0.8], la: [-0.8]}, 1.0, 1).kept == q4km
    # over the bound with no group to try (an architecture without them): nothing is kept
    assert decoder_weight_check({"none": [2.0]}, 1.0, 1).kept == "none"
    with pytest.raises(ValueError, match="'none'"):
        decoder_weight_check({q4km: [0.1]}, 1.0, 1)
    with pytest.raises(ValueError, match="at least one"):
        decoder_weight_check({"none": []}, 1.0, 1)
    with pytest.raises(ValueError, match="score_atol"):
        decoder_weight_check({"none": [0.1]}, 0.0, 1)


@pytest.mark.parametrize("over", [False, True])
def test_the_int4_export_measures_its_vision_and_decoder_weights_and_records_the_choice(
    tiny_pair: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: bool
) -> None:
    """An int4 export without selectors measures what 4-bit weights move the check scenes'
    scores (32: export/gptq.py's CHECK_SCENES, more than its calibration scene) and hands the
    rules those moves: the vision graph's (one per scene), then the all-4-bit decoder's (both
    passes) and, over its bound, each group's. Forced over the bounds, the vision graph's
    weights and the tiny LFM2-VL's Q4_K_M group (its only one: no Gated-DeltaNet) are 8-bit
    MatMulNBits; within them every weight is 4-bit. Either way the member validates and the
    manifest records the measured moves, the bounds and the choices."""
    import onnx
    import spotstop.export.onnx as export_onnx
    from onnx import helper
    from spotstop.export.gptq import CHECK_SCENES

    seen: dict[str, list[Any]] = {"vision": [], "decoder": []}

    def vision_rule(moves: np.ndarray, score_atol: float) -> VisionWeightCheck:
        seen["vision"].append(moves)
        real = vision_weight_check(moves, score_atol)
        assert real.bound == 0.5 * score_atol == 0.5
        return VisionWeightCheck(real.max_abs_diff, 0.0 if over else 1e6, real.scenes)

    def decoder_rule(moves: dict[str, Any], score_atol: float, scenes: int) -> DecoderWeightCheck:
        seen["decoder"].append(dict(moves))
        real = decoder_weight_check(moves, score_atol, scenes)
        bound = 0.0 if over else 1e6
        kept = "output_layer+mixed_layers" if over and len(moves) > 1 else "none"
        return DecoderWeightCheck(real.moves, bound, scenes, kept)

    monkeypatch.setattr(export_onnx, "vision_weight_check", vision_rule)
    monkeypatch.setattr(export_onnx, "decoder_weight_check", decoder_rule)
    src = tiny_pair / "tiny-lfm2_vl"
    kw: dict[str, Any] = {"precision": "int4", "buckets": [256], "calibration_scenes": 1}
    e = export_onnx.export_member(src, tmp_path / "m", **kw)
    assert all(c.ok for c in e.checks)
    (vmoves,) = seen["vision"]
    assert vmoves.shape == (CHECK_SCENES,) and np.isfinite(vmoves).all()
    assert np.abs(vmoves).max() > 0
    # the decoder: all 4 bits (request-only and scene pass of each check scene), then, over
    # the bound, the one group this architecture has
    assert [sorted(d) for d in seen["decoder"]] == (
        [["none"], ["none", "output_layer+mixed_layers"]] if over else [["none"]]
    )
    assert seen["decoder"][0]["none"].shape == (2 * CHECK_SCENES,)
    q = e.quantizer
    assert q is not None
    vw, dw = q["int8"]["vision_weights"], q["int8"]["decoder_weights"]
    assert vw["scenes"] == dw["scenes"] == CHECK_SCENES
    assert vw["max_abs_diff"] == pytest.approx(np.abs(vmoves).max(), abs=1e-6)
    assert vw["bits"] == (8 if over else 4)
    assert dw["kept"] == ("output_layer+mixed_layers" if over else "none")
    assert dw["max_abs_diff"]["none"] == pytest.approx(
        np.abs(seen["decoder"][0]["none"]).max(), abs=1e-6
    )
    assert dw["chosen"] == (4 if over else 0)

    def bits(f: str) -> list[int]:
        """The bits of every MatMulNBits weight of graph ``f`` (a weight read twice once)."""
        g = onnx.load(str(tmp_path / "m" / "onnx" / f), load_external_data=False)
        seen = {
            n.input[1]: int(helper.get_attribute_value(a))
            for n in g.graph.node
            if n.op_type == "MatMulNBits"
            for a in n.attribute
            if a.name == "bits"
        }
        return list(seen.values())

    vision, decoder = bits("vision.onnx"), bits("decoder.onnx")
    assert vision and decoder
    # (the vision selector's weights: the tower's and projector's Linears, but its two float32
    # ends; a MatMul it does not name stays 4-bit)
    assert (vision.count(8) > len(vision) // 2) if over else set(vision) == {4}
    # the decoder: Q4_K_M's 4 weights (the output layer, layers 0 and 2's w2, layer 2's
    # v_proj: test_int4_export_keeps_the_chosen_weights_at_int8), the rest at 4 bits
    assert decoder.count(8) == (4 if over else 0) and 4 in decoder
    assert q["weights_by_bits"].get("int8", 0) == vision.count(8) + decoder.count(8)


def test_a_bundle_export_without_selectors_measures_as_the_cli_default_does(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """``spotstop export --precision int4`` (default ``--int4-int8 auto``) and
    write_onnx_bundle without ``int4_int8`` hand export_member None, so the measured rules run
    and the member's record holds their moves and choices; ``none`` measures nothing. (The
    bundle writer once turned None into "no selectors", and the rules never ran through it.)"""
    from spotstop.export.onnx_bundle import write_onnx_bundle

    src = tiny_pair / "tiny-lfm2_vl"
    kw: dict[str, Any] = {"precision": "int4", "buckets": [256], "calibration_scenes": 1}
    auto = write_onnx_bundle([src], tmp_path / "auto", trt="off", **kw)
    none = write_onnx_bundle([src], tmp_path / "none", trt="off", int4_int8=(), **kw)
    (a,), (n,) = auto.members, none.members
    assert a.quantizer is not None and n.quantizer is not None
    assert {"vision_weights", "decoder_weights"} <= set(a.quantizer["int8"])
    assert a.quantizer["int8"]["vision_weights"]["scenes"] == 32
    assert not {"vision_weights", "decoder_weights"} & set(n.quantizer["int8"])
