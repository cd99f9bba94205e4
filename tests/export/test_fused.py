"""The "fused" decoder graph form (export/fused.py): com.microsoft operators for onnxruntime.

Each tiny member's decoder is exported twice, standard and fused, as ``export_member`` exports it
(``export_decoder``, weights tied and transposes folded), and the fused graph is checked the way
``export_member``'s validation checks a graph: right-padded batches (with image embeddings, and
the request-only pass) against the UNPATCHED torch scoring graph at fp32 tolerances, at every
bucket and at the cases' own lengths; plus the node counts: the fused operators are there, the
Gated-DeltaNet decomposition (and the decomposed attention / Conv) is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("transformers")

from spotstop.export.fused import (  # noqa: E402
    FUSED_DOMAIN,
    GRAPH_FORMS,
    fused_architectures,
    fused_patcher,
    graph_form_ops,
)

#: length buckets of the check (the tiny members' prompts are 120-140 tokens; 384 crosses
#: six 64-token chunks of the Gated-DeltaNet)
BUCKETS = (256, 384)

#: fused operators each tiny decoder must hold (tiny Qwen3.5: 3 Gated-DeltaNet + 1 attention
#: layer; tiny LFM2: 3 conv + 1 attention layer): one recurrence / attention per layer of that
#: kind; every residual Add with the RMSNorm after it (two per layer: the last one with the
#: final norm) as SkipSimplifiedLayerNormalization, the other RMSNorms (the first layer's input
#: norm, the attention's q and k norms, and Qwen3.5's gated norm, one per Gated-DeltaNet layer)
#: as SimplifiedLayerNormalization. The short convolutions are depthwise ``Conv`` nodes
#: (three per tiny decoder), not CausalConvWithState (slower on CPU: bench/fused_ops.py)
EXPECTED_OPS = {
    "qwen3_5": {
        "GroupQueryAttention": 1,
        "LinearAttention": 3,
        "LinearAttentionGate": 3,
        "SimplifiedLayerNormalization": 6,
        "SkipSimplifiedLayerNormalization": 8,
    },
    "lfm2_vl": {
        "GroupQueryAttention": 1,
        "SimplifiedLayerNormalization": 3,
        "SkipSimplifiedLayerNormalization": 8,
    },
}


@dataclass
class _Decoders:
    """One tiny member's torch scoring graph, its validation cases and both exported forms."""

    model_type: str
    vision_t: Any
    pixels: dict[str, dict[str, np.ndarray]]
    decoder_t: Any
    cases: Callable[[int], dict[str, dict[str, np.ndarray]]]
    lengths: list[int]
    graphs: dict[str, Any]  # graph form → onnx.ModelProto
    paths: dict[str, Path]


def _export_both(member: Path, out: Path) -> _Decoders:
    """Mirror export_member's decoder stage (export/onnx.py) for both graph forms."""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import export_decoder
    from spotstop.export.graphs import build_graphs
    from spotstop.export.onnx import _validation_cases
    from spotstop.export.weights import fold_weight_transposes, tie_output_layer
    from spotstop.guard._config import ScoringConfig
    from spotstop.guard._hf import render_template, resolve_member
    from spotstop.guard._member import resolve_image_size
    from spotstop.guard._prompt import PromptEncoder
    from spotstop.guard.backends._onnx import decoder_feeds
    from transformers import AutoModelForImageTextToText

    cfg_s = ScoringConfig()
    folder = resolve_member(str(member))
    ecfg = get_export_config(folder.model_type)
    size = resolve_image_size(folder, cfg_s, member.name, None, None)
    g = folder.arch.geometry(folder.config, folder.preprocessor, size)
    encoder = PromptEncoder(folder.tokenizer(), render_template(folder, cfg_s.prompt), cfg_s.prompt)
    plan = encoder.plan
    vc = _validation_cases(folder, encoder, g)
    model = AutoModelForImageTextToText.from_pretrained(str(folder.path), dtype=torch.float32)
    vision_t, decoder_t = build_graphs(
        model.eval(),
        ecfg,
        image_token_id=folder.image_token_id,
        first_ids=plan.first_ids,
        gray_pixels=vc.pixels["gray"],
        geometry=g,
    )
    with torch.no_grad():
        emb = {
            k: vision_t(torch.from_numpy(px["pixel_values"])).numpy() for k, px in vc.pixels.items()
        }
    n_img = emb["gray"].shape[1]
    hidden = int(model.config.get_text_config().hidden_size)

    def cases(length: int) -> dict[str, dict[str, np.ndarray]]:  # as export_member's dec_cases
        res = {}
        for case, prompts in vc.prompts.items():
            if max(len(p) for p in prompts) + plan.max_row_len > length:
                continue
            feeds = decoder_feeds(prompts, plan, length)
            b = feeds["input_ids"].shape[0]
            if case == "text":
                e = np.zeros((b, n_img, hidden), np.float32)
            else:
                per = [emb["noise"][0]] + [emb["gray"][0]] * (len(prompts) - 1)
                e = np.repeat(np.stack(per), len(plan.rows), axis=0)
            res[case] = {**feeds, "image_embeds": e}
        return res

    own = {max(len(p) for p in ps) + plan.max_row_len for ps in vc.prompts.values()}
    lengths = sorted(set(BUCKETS) | own)
    case0 = cases(BUCKETS[0])["scene"]
    feeds0 = {k: v for k, v in case0.items() if k != "image_embeds"}
    graphs, paths = {}, {}
    for form in GRAPH_FORMS:
        path = out / f"decoder_{form}.onnx"
        export_decoder(
            decoder_t, ecfg, feeds0, case0["image_embeds"], path, BUCKETS[-1], graph_form=form
        )
        graphs[form] = fold_weight_transposes(tie_output_layer(onnx.load(str(path))))
        paths[form] = path
    return _Decoders(
        folder.model_type, vision_t, vc.pixels, decoder_t, cases, lengths, graphs, paths
    )


@pytest.fixture(scope="module", params=sorted(EXPECTED_OPS))
def decoders(
    request: pytest.FixtureRequest, tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory
) -> _Decoders:
    member = tiny_pair / f"tiny-{request.param}"
    return _export_both(member, tmp_path_factory.mktemp(f"fused-{request.param}"))


def _session(model: Any, level: str = "all", threads: int = 2) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def test_every_architecture_has_a_fused_form() -> None:
    from spotstop.export.configs import EXPORT_CONFIGS

    assert set(fused_architectures()) == set(EXPORT_CONFIGS) == set(EXPECTED_OPS)
    with pytest.raises(ValueError, match="no fused graph form"), fused_patcher("llama", 128):
        pass


def test_fused_ops_replace_the_decomposition(decoders: _Decoders) -> None:
    """The fused operators are there, one per layer; what they replace is gone."""
    from spotstop.export.graph_stats import graph_stats

    std, fused = decoders.graphs["standard"], decoders.graphs["fused"]
    assert graph_form_ops(std) == {}
    assert graph_form_ops(fused) == EXPECTED_OPS[decoders.model_type]
    assert {o.domain: o.version for o in fused.opset_import}.get(FUSED_DOMAIN) == 1
    n_std, n_fused = len(std.graph.node), len(fused.graph.node)
    assert n_fused < n_std, (n_fused, n_std)
    ops = [n.op_type for n in fused.graph.node]
    # no Softmax or RMSNorm (ReduceMean) left in the decoder: the attention and the norms are
    # fused; each short convolution is one depthwise Conv (its left Pad folded in or before it;
    # never a right pad: causal)
    assert "Softmax" not in ops and "ReduceMean" not in ops
    convs = [n for n in fused.graph.node if n.op_type == "Conv"]
    assert len(convs) == 3, [n.name for n in convs]
    for n in convs:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        pads = list(attrs.get("pads", []))
        assert attrs["group"] > 1 and not any(pads[len(pads) // 2 :]), attrs  # no right pad
    if decoders.model_type == "qwen3_5":
        # the loop-free Gated-DeltaNet's ~185 nodes per layer are down to its projections, the
        # l2 norms, gates and gated norm: the chunked inverse/scan (Trilu, CumSum) is gone
        assert "Trilu" not in ops and "CumSum" in [n.op_type for n in std.graph.node]
        per = graph_stats(fused).max_per_layer(".linear_attn")
        assert per <= 60, per
        assert graph_stats(std).max_per_layer(".linear_attn") > 3 * per
    # the projections are still MatMul nodes on constant weights (the int8/int4 quantizers
    # rewrite those)
    weights = {t.name for t in fused.graph.initializer}
    assert sum(1 for n in fused.graph.node if n.op_type == "MatMul" and n.input[1] in weights) >= (
        sum(1 for n in std.graph.node if n.op_type == "MatMul" and n.input[1] in weights)
    )


def test_fused_decoder_matches_the_torch_scoring_graph(decoders: _Decoders) -> None:
    """As export_member validates: every bucket and the cases' own lengths, right-padded
    batches with image embeddings and the request-only pass, fp32 tolerances."""
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import DECODER_INPUTS

    ecfg = get_export_config(decoders.model_type)
    atol, rtol = ecfg.atol["fp32"], ecfg.rtol["fp32"]
    sess = _session(decoders.graphs["fused"])
    checked = 0
    for length in decoders.lengths:
        for case, feeds in decoders.cases(length).items():
            with torch.no_grad():
                want = decoders.decoder_t(*(torch.from_numpy(feeds[n]) for n in DECODER_INPUTS))
            got = sess.run(None, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
            for name, g, w in zip(("first_logits", "read_logprob"), got, want, strict=True):
                np.testing.assert_allclose(
                    g, w.numpy(), atol=atol, rtol=rtol, err_msg=f"{case}@L{length} {name}"
                )
            checked += 1
    assert checked >= 2 * len(decoders.lengths) - 1


def test_onnxruntime_keeps_the_fused_ops(decoders: _Decoders, tmp_path: Path) -> None:
    """onnxruntime's own optimizer (ORT_ENABLE_ALL, as the guard's sessions run) keeps every
    fused operator: nothing is unfused or duplicated."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "fused.opt.onnx")
    ort.InferenceSession(
        decoders.graphs["fused"].SerializeToString(),
        sess_options=opts,
        providers=["CPUExecutionProvider"],
    )
    optimized = onnx.load(opts.optimized_model_filepath)
    assert graph_form_ops(optimized) == EXPECTED_OPS[decoders.model_type]


def test_the_patch_is_scoped_and_the_eager_ops_match(tiny_pair: Path) -> None:
    """Inside the patch, the transformers decoder runs the custom ops' eager maths and gives
    the unpatched outputs; outside, it is the transformers code again."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.lfm2 import modeling_lfm2
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.siglip2 import modeling_siglip2

    def targets() -> tuple[Any, ...]:
        """Everything fused_patcher swaps, as the modules hold it now."""
        return (
            modeling_qwen3_5.torch_chunk_gated_delta_rule,
            modeling_qwen3_5.causal_conv1d_fn,
            modeling_qwen3_5.Qwen3_5Attention.forward,
            modeling_lfm2.causal_conv1d_fn,
            modeling_lfm2.Lfm2Attention.forward,
            modeling_qwen3_5.Qwen3_5RMSNorm.forward,
            modeling_qwen3_5.Qwen3_5RMSNormGated.forward,
            modeling_qwen3_5.Qwen3_5DecoderLayer.forward,
            modeling_qwen3_5.Qwen3_5GatedDeltaNet.forward,
            modeling_qwen3_5.Qwen3_5VisionAttention.forward,
            modeling_qwen3_5.Qwen3_5VisionPatchEmbed.forward,
            modeling_lfm2.Lfm2RMSNorm.forward,
            modeling_lfm2.Lfm2DecoderLayer.forward,
            modeling_siglip2.Siglip2Attention.forward,
        )

    originals = targets()
    for model_type in sorted(EXPECTED_OPS):
        model = AutoModelForImageTextToText.from_pretrained(
            str(tiny_pair / f"tiny-{model_type}"), dtype=torch.float32
        ).eval()
        lm = model.model.language_model
        ids = torch.randint(0, 500, (2, 70), generator=torch.Generator().manual_seed(1))
        emb = model.get_input_embeddings()(ids)
        with torch.no_grad():
            want = lm(
                inputs_embeds=emb, attention_mask=torch.ones_like(ids), use_cache=False
            ).last_hidden_state
            with fused_patcher(model_type, 128):
                got = lm(
                    inputs_embeds=emb, attention_mask=torch.ones_like(ids), use_cache=False
                ).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert originals == targets()


@pytest.mark.parametrize("length", [1, 17, 64, 65, 300, 1024])
def test_rotary_embedding_is_transformers_vision_rotary_and_onnxruntimes(length: int) -> None:
    """The fused rotary (one ``RotaryEmbedding`` node, positions from offset 0) on (1, S, H·D)
    equals transformers' ``apply_rotary_pos_emb_vision`` with Qwen3.5's axial cos/sin tables,
    in the custom op's eager maths and in onnxruntime, at lengths 1 .. 1024 (1024: the real
    vision tower's patches for a 512 x 512 image)."""
    from spotstop.export import fused
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    heads, d = 4, 16
    g = torch.Generator().manual_seed(length)
    x = torch.randn(1, length, heads * d, generator=g)
    pos = torch.randint(0, 40, (length, 2), generator=g).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, d // 2, 2).float() / (d // 2)))
    freqs = pos[..., None] * inv  # (S, 2, D/4): h and w
    hw = torch.cat([freqs[:, 0], freqs[:, 1]], -1)
    emb = torch.cat([hw, hw], -1)  # (S, D), as Qwen3_5VisionRotaryEmbedding recomposes it
    cos, sin = emb.cos(), emb.sin()
    heads_x = x.reshape(length, heads, d)
    want, _ = mod.apply_rotary_pos_emb_vision(heads_x, heads_x, cos, sin)
    got = fused.rotary_embedding(x, cos, sin, heads)
    torch.testing.assert_close(got.reshape(length, heads, d), want, atol=1e-6, rtol=1e-6)

    node = onnx.helper.make_node(
        "RotaryEmbedding",
        ["x", "offset", "c", "s"],
        ["y"],
        domain=FUSED_DOMAIN,
        num_heads=heads,
        interleaved=0,
    )
    f32 = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        [node],
        "rope",
        [onnx.helper.make_tensor_value_info("x", f32, [1, None, heads * d])],
        [onnx.helper.make_tensor_value_info("y", f32, [1, None, heads * d])],
        [
            onnx.numpy_helper.from_array(np.array([0], np.int64), "offset"),
            onnx.numpy_helper.from_array(cos[:, : d // 2].numpy(), "c"),
            onnx.numpy_helper.from_array(sin[:, : d // 2].numpy(), "s"),
        ],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(FUSED_DOMAIN, 1)],
    )
    (y,) = _session(model).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(y.reshape(length, heads, d), want.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_fused_siglip2_attention_reads_the_key_padding_mask(
    tiny_pair: Path, mask_kind: str
) -> None:
    """LFM2-VL's SigLIP2 attention, patched, equals transformers' own on 40 patches of which
    the last 9 are padding, with the mask as transformers hands it (None: every patch real; a
    (B, 1, S, S) boolean mask; an additive one, 0 or the dtype's minimum): every real
    patch's output, the padded rows too (they read the real keys in both)."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.siglip2 import modeling_siglip2

    model = AutoModelForImageTextToText.from_pretrained(
        str(tiny_pair / "tiny-lfm2_vl"), dtype=torch.float32
    ).eval()
    attn = model.model.vision_tower.encoder.layers[0].self_attn
    x = torch.randn(2, 40, attn.embed_dim, generator=torch.Generator().manual_seed(3))
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1, 31:] = False
    mask = {
        "none": None,
        "bool": keep[:, None, None, :].expand(2, 1, 40, 40),
        "additive": torch.where(keep, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
        .expand(2, 1, 40, 40)
        .contiguous(),
    }[mask_kind]
    with torch.no_grad():
        want, _ = attn(x, mask)
        original = modeling_siglip2.Siglip2Attention.forward
        with fused_patcher("lfm2_vl", 64):
            assert modeling_siglip2.Siglip2Attention.forward is not original
            got, none = attn(x, mask)
    assert none is None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_graph_form_is_checked() -> None:
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import export_decoder

    with pytest.raises(ValueError, match="graph_form must be one of"):
        export_decoder(
            None, get_export_config("lfm2_vl"), {}, np.zeros(1), Path("x.onnx"), graph_form="x"
        )


def test_quantizers_rewrite_the_fused_graph_as_the_standard(decoders: _Decoders) -> None:
    """int4 quantizes the same projections in both forms: the fused operators hold no weight a
    quantizer would miss, and survive the rewrite."""
    from spotstop.export.precision import convert_precision

    quantized = {"MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
    # int4 (MatMulNBits); int8 was checked by hand the same way (MatMulInteger: 32 in
    # each Qwen3.5 form, 23 in each LFM2 form) while its conversion was being rewritten
    for precision in ("int4",):
        q = {f: convert_precision(m, precision) for f, m in decoders.graphs.items()}
        counts = {f: sum(n.op_type in quantized for n in m.graph.node) for f, m in q.items()}
        assert counts["fused"] == counts["standard"] > 0, (precision, counts)
        assert graph_form_ops(q["fused"]) == EXPECTED_OPS[decoders.model_type], precision
        _session(q["fused"])  # onnxruntime loads it


def test_lfm2_fused_export_without_constant_folding(tiny_pair: Path, tmp_path: Path) -> None:
    """A large member's legacy export runs without constant folding (export/exporters.py
    ``fold_constants``): the fused LFM2 decoder exports and matches there too."""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import DECODER_INPUTS, export_decoder
    from spotstop.export.weights import fold_weight_transposes, tie_output_layer

    d = _export_both(tiny_pair / "tiny-lfm2_vl", tmp_path)
    length = d.lengths[-1]
    feeds = d.cases(length)["scene"]
    path = tmp_path / "unfolded.onnx"
    ecfg = get_export_config("lfm2_vl")
    feeds0 = {k: v for k, v in feeds.items() if k != "image_embeds"}
    export_decoder(
        d.decoder_t, ecfg, feeds0, feeds["image_embeds"], path, length, False, graph_form="fused"
    )
    model = fold_weight_transposes(tie_output_layer(onnx.load(str(path))))
    assert graph_form_ops(model) == EXPECTED_OPS["lfm2_vl"]
    got = _session(model).run(None, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    with torch.no_grad():
        want = d.decoder_t(*(torch.from_numpy(feeds[n]) for n in DECODER_INPUTS))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-4)


def test_fuse_graph_takes_only_residual_adds() -> None:
    """fuse_graph fuses Add(residual stream, projection) → RMSNorm, and leaves an Add that
    could broadcast (a bias) alone; the rewritten graph computes the same."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from spotstop.export.fused import fuse_graph

    rng = np.random.default_rng(0)
    h = 8
    inits = [numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), "w_proj")]
    inits += [
        numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), n)
        for n in ("g0", "g1", "g2", "bias")
    ]
    ms = FUSED_DOMAIN
    nodes = [
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["x", "y", "g0"], ["n0", "", "", "s0"], domain=ms
        ),
        helper.make_node("MatMul", ["n0", "w_proj"], ["p"]),
        helper.make_node("Add", ["s0", "p"], ["s1"]),  # residual + projection: fused
        helper.make_node("SimplifiedLayerNormalization", ["s1", "g1"], ["n1"], axis=-1),
        helper.make_node("Add", ["n1", "bias"], ["s2"]),  # + a bias: left alone
        helper.make_node("SimplifiedLayerNormalization", ["s2", "g2"], ["n2"], axis=-1),
        helper.make_node("Add", ["n2", "s1"], ["out"]),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "l", h]) for n in ("x", "y")]
    out = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    model = helper.make_model(
        helper.make_graph(nodes, "g", vi, out, inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)],
    )
    feeds = {n: rng.standard_normal((2, 5, h)).astype(np.float32) for n in ("x", "y")}
    (want,) = _session(model).run(None, feeds)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_graph(fused) == {"SkipSimplifiedLayerNormalization": 1}
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 and ops.count("Add") == 2
    (got,) = _session(fused).run(None, feeds)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_fused_vision_graph(decoders: _Decoders, tmp_path: Path) -> None:
    """Qwen3.5's vision attention as MultiHeadAttention (one per block) after one
    RotaryEmbedding each for q and k (no Transpose, Neg or Concat of the decomposed rotary left)
    and its patch embedding's Conv3d as a product with the flattened kernel (no Conv left), exact
    at fp32 on the validation images; LFM2's SigLIP2 attention as MultiHeadAttention too (one
    per layer, no rotary), its decomposed mask handling (Where, IsNaN) gone."""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import export_vision

    ecfg = get_export_config(decoders.model_type)
    graphs = {}
    for form in GRAPH_FORMS:
        path = tmp_path / f"vision_{form}.onnx"
        export_vision(decoders.vision_t, ecfg, decoders.pixels["gray"], path, graph_form=form)
        graphs[form] = onnx.load(str(path))
    blocks = 2  # both tiny towers have two layers
    rotary = decoders.model_type == "qwen3_5"
    assert graph_form_ops(graphs["standard"]) == {}
    assert graph_form_ops(graphs["fused"]) == (
        {"MultiHeadAttention": blocks, "RotaryEmbedding": 2 * blocks}
        if rotary
        else {"MultiHeadAttention": blocks}
    )
    fused_ops = [n.op_type for n in graphs["fused"].graph.node]
    assert "Softmax" not in fused_ops and "IsNaN" not in fused_ops
    if rotary:
        ops = [n.op_type for n in graphs["fused"].graph.node]
        std = [n.op_type for n in graphs["standard"].graph.node]
        # the decomposed rotary's Neg, the heads' Transpose and Squeeze: none in a block
        assert std.count("Neg") == 2 * blocks and "Neg" not in ops and "Squeeze" not in ops
        assert ops.count("Transpose") == std.count("Transpose") - 6 * blocks == 1
    convs = {f: sum(n.op_type == "Conv" for n in g.graph.node) for f, g in graphs.items()}
    assert convs == ({"standard": 1, "fused": 0} if rotary else {"standard": 0, "fused": 0})
    sess = _session(graphs["fused"])
    for case, px in decoders.pixels.items():
        with torch.no_grad():
            want = decoders.vision_t(torch.from_numpy(px["pixel_values"])).numpy()
        (got,) = sess.run(None, {"pixel_values": px["pixel_values"]})
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=case)


def test_export_member_chooses_the_graph_form_by_precision_and_records_it(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """int8 exports fused by default (onnxruntime only), fp32 standard (TensorRT builds from
    it); the manifest records the form and the fused operators each graph holds; a form a
    precision cannot take is refused before anything is written."""
    import yaml
    from spotstop.export.onnx import export_member
    from spotstop.export.onnx_bundle import write_onnx_bundle

    src = tiny_pair / "tiny-qwen3_5"
    kw = {"buckets": [384], "name": "tiny-qwen3_5", "calibration_scenes": 1}
    e = export_member(src, tmp_path / "i8", precision="int8", **kw)  # type: ignore[arg-type]
    assert e.graph_form == "fused" and all(c.ok for c in e.checks)
    meta = yaml.safe_load((tmp_path / "i8" / "spotstop_onnx.yaml").read_text())
    assert meta["graph_form"] == "fused"
    assert meta["fused_ops"]["decoder"]["LinearAttention"] >= 1
    assert meta["fused_ops"]["decoder"]["GroupQueryAttention"] >= 1
    assert meta["fused_ops"]["vision"].get("MultiHeadAttention", 0) >= 1
    # the vision graph's GELUs (export/gelu.py, after the int8 conversion): both blocks' tanh
    # GELUs as FastGelu with their fc1 bias folded in, the projector's erf GELU as Gelu; the
    # decoder (SiLU MLPs) has none
    assert {k: meta["fused_ops"]["vision"].get(k) for k in ("FastGelu", "Gelu")} == {
        "FastGelu": 2,
        "Gelu": 1,
    }
    assert not {"FastGelu", "Gelu"} & set(meta["fused_ops"]["decoder"])
    vision = onnx.load(str(tmp_path / "i8" / "onnx" / "vision.onnx"), load_external_data=False)
    fast = [n for n in vision.graph.node if n.op_type == "FastGelu"]
    assert [len(n.input) for n in fast] == [2, 2]
    assert not {"Tanh", "Erf"} & {n.op_type for n in vision.graph.node}
    with pytest.raises(ValueError, match="starts from the standard graph"):
        export_member(src, tmp_path / "f16", precision="fp16", graph_form="fused")
    with pytest.raises(ValueError, match="graph_form must be"):
        export_member(src, tmp_path / "x", precision="int8", graph_form="fast")
    with pytest.raises(ValueError, match="TensorRT cannot parse"):
        write_onnx_bundle([src], tmp_path / "b", precision="fp32", graph_form="fused", trt="script")
    assert not any(p.exists() for p in (tmp_path / "f16", tmp_path / "x", tmp_path / "b"))


def test_a_tensorrt_target_gets_no_com_microsoft_node(tiny_pair: Path, tmp_path: Path) -> None:
    """A bundle with a TensorRT script (fp32, the standard form by default) holds no
    com.microsoft node in any graph or subgraph, nor the domain's import: the decomposed GELUs
    and the attention stay standard nodes, which TensorRT parses."""
    import yaml
    from spotstop.export.onnx_bundle import write_onnx_bundle

    out = tmp_path / "b"
    member = "tiny-qwen3_5"  # the member whose fused form has MultiHeadAttention and GELUs
    write_onnx_bundle([tiny_pair / member], out, precision="fp32", buckets=[384], trt="script")
    assert (out / "trt" / "build.sh").is_file()
    meta = yaml.safe_load((out / "members" / member / "spotstop_onnx.yaml").read_text())
    assert meta["graph_form"] == "standard"
    assert meta["fused_ops"] == {"vision": {}, "decoder": {}}

    def domains(graph: Any) -> set[str]:
        found = set()
        for node in graph.node:
            found.add(node.domain)
            for attr in node.attribute:
                subs = [attr.g] if attr.HasField("g") else []
                for sub in [*subs, *attr.graphs]:
                    found |= domains(sub)
        return found

    graphs = sorted((out / "members" / member / "onnx").glob("*.onnx"))
    assert [p.name for p in graphs] == ["decoder.onnx", "vision.onnx"]
    for path in graphs:
        model = onnx.load(str(path), load_external_data=False)
        assert FUSED_DOMAIN not in domains(model.graph), path.name
        assert FUSED_DOMAIN not in {o.domain for o in model.opset_import}, path.name
    vision = onnx.load(str(graphs[1]), load_external_data=False)
    assert {"Tanh", "Erf"} <= {n.op_type for n in vision.graph.node}
