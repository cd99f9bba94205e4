"""The compact Gated-DeltaNet scoring graph (export/gated_delta.py) and graph node counts.

Parity of the loop-free kernel with transformers' chunked reference at the lengths where
chunking changes (1, 17, 64, 65, 300 and the longest the default buckets allow), in torch and
exported to ONNX with a dynamic sequence axis (ONE graph for every length), and the node-count
bound per Gated-DeltaNet layer, so that a regression to the unrolled graph fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("transformers")

from spotstop.export.gated_delta import (  # noqa: E402
    CHUNK_SIZE,
    compact_chunk_gated_delta_rule,
    compact_gated_delta,
    scan_levels,
)
from spotstop.export.onnx import DEFAULT_BUCKETS  # noqa: E402

#: the longest sequence the default buckets allow
MAX_LENGTH = max(DEFAULT_BUCKETS)
LENGTHS = (1, 17, 64, 65, 300, MAX_LENGTH)
#: nodes one exported Gated-DeltaNet layer may have (projections, conv, gated norm included);
#: the unrolled graph had ~5,400 at 256 tokens, the compact one has ~185 on the tiny member
GDN_LAYER_MAX_NODES = 400


def _reference() -> Any:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    return mod.torch_chunk_gated_delta_rule


def _inputs(length: int, hk: int, hv: int, dk: int, dv: int, *, seed: int = 0) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed + length)
    q = torch.randn(2, length, hk, dk, generator=g)
    # keys sharing a direction: a UT system far from the identity
    k = 0.3 * torch.randn(2, length, hk, dk, generator=g) + torch.randn(1, 1, hk, dk, generator=g)
    v = torch.randn(2, length, hv, dv, generator=g)
    decay = -0.5 * torch.rand(2, length, hv, generator=g)
    beta = torch.rand(2, length, hv, generator=g)
    return q, k, v, decay, beta


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("heads", [(2, 4, 16, 16), (16, 16, 128, 128)], ids=["tiny", "2B"])
def test_kernel_matches_the_transformers_reference(length: int, heads: tuple[int, ...]) -> None:
    """Exact (fp32 rounding) at every chunk boundary case, tiny and Qwen3.5-2B head sizes."""
    if heads[0] == 16 and length not in (65, MAX_LENGTH):
        pytest.skip("the 2B head sizes are checked at one chunk boundary and the maximum")
    q, k, v, decay, beta = _inputs(length, *heads)
    want, _ = _reference()(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True)
    got, state = compact_chunk_gated_delta_rule(
        q, k, v, decay, beta, use_qk_l2norm_in_kernel=True, levels=scan_levels(MAX_LENGTH)
    )
    assert state is None
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5


def test_kernel_without_l2norm_and_its_limits() -> None:
    q, k, v, decay, beta = _inputs(200, 2, 2, 16, 16)
    k = k / k.norm(dim=-1, keepdim=True)  # unit keys: a stable delta rule without the l2norm
    decay = 0.01 * decay  # slow decay: the state carries across chunks
    want, _ = _reference()(q, k, v, g=decay, beta=beta)
    got, _ = compact_chunk_gated_delta_rule(q, k, v, decay, beta, levels=scan_levels(200))
    assert float((got - want).abs().max()) <= 1e-5
    assert [scan_levels(n) for n in (1, CHUNK_SIZE, CHUNK_SIZE + 1, 256, 1024, 1025)] == [
        0,
        0,
        1,
        2,
        4,
        5,
    ]
    # too few scan levels for the length: the chunks beyond them miss earlier state
    bad, _ = compact_chunk_gated_delta_rule(q, k, v, decay, beta, levels=0)
    assert float((bad - want).abs().max()) > 1e-3
    with pytest.raises(NotImplementedError, match="no recurrent state"):
        compact_chunk_gated_delta_rule(q, k, v, decay, beta, levels=2, output_final_state=True)


def test_the_patch_is_scoped_to_the_export() -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    original = mod.torch_chunk_gated_delta_rule
    with compact_gated_delta(300):
        assert mod.torch_chunk_gated_delta_rule is not original
        assert mod.torch_chunk_gated_delta_rule.keywords == {"levels": 3}  # type: ignore[attr-defined]
    assert mod.torch_chunk_gated_delta_rule is original


class _Layer(torch.nn.Module):
    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states: Any) -> Any:
        return self.layer(hidden_states)


@pytest.fixture(scope="module")
def gdn_layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The tiny Qwen3.5 member's Gated-DeltaNet layer and its compact ONNX export (dynamic
    batch and length, exact up to :data:`MAX_LENGTH`), as the decoder export writes it."""
    from spotstop.export.configs import Qwen35ExportConfig
    from spotstop.export.exporters import _exporter_noise, _exporter_options
    from torch.export import Dim
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    text = dict(Qwen35ExportConfig.member_recipe.tiny_config["text_config"])
    torch.manual_seed(0)
    layer = _Layer(Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**text), 0)).eval()
    path = tmp_path_factory.mktemp("gdn") / "layer.onnx"
    x = torch.randn(1, 100, text["hidden_size"])
    with torch.no_grad(), _exporter_noise(), Qwen35ExportConfig.decoder_patcher(MAX_LENGTH):
        torch.onnx.export(
            layer,
            (x,),
            str(path),
            input_names=["hidden_states"],
            output_names=["out"],
            dynamic_shapes={"hidden_states": {0: Dim("batch"), 1: Dim("length")}},
            **_exporter_options(Qwen35ExportConfig, "dynamo"),
        )
    return layer, path


def test_exported_layer_is_one_compact_graph_for_every_length(gdn_layer: tuple[Any, Path]) -> None:
    import onnx
    from spotstop.export.graph_stats import graph_stats
    from spotstop.export.onnx import _session

    layer, path = gdn_layer
    model = onnx.load(str(path))
    assert len(model.graph.node) <= GDN_LAYER_MAX_NODES, len(model.graph.node)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[1].dim_param and not dims[1].dim_value, "the sequence axis must be dynamic"
    assert graph_stats(model).total == len(model.graph.node)
    sess = _session(model)
    hidden = layer.layer.hidden_size
    for length in LENGTHS:
        x = torch.randn(2, length, hidden, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = layer(x).numpy()  # the unpatched transformers layer
        (got,) = sess.run(None, {"hidden_states": x.numpy()})
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"L={length}")


def test_graph_stats_groups_nodes_by_layer_type(gdn_layer: tuple[Any, Path]) -> None:
    """Both exporters' ways of naming a node's module are read (dynamo metadata, legacy names)."""
    import onnx
    from onnx import helper
    from spotstop.export.graph_stats import OUTSIDE, graph_stats

    nodes = [
        helper.make_node(
            "MatMul", ["a", "b"], ["c"], name="/language_model/layers.0/self_attn/q_proj/MatMul"
        ),
        helper.make_node("Add", ["c", "a"], ["d"], name="/language_model/layers.0/Add"),
        helper.make_node(
            "Constant",
            [],
            ["e"],
            name="/language_model/layers.1/self_attn/Constant",
            value_float=1.0,
        ),
        helper.make_node("Relu", ["d"], ["f"], name="/Relu"),
    ]
    dyn = helper.make_node("Neg", ["f"], ["g"], name="node_Neg_1")
    dyn.metadata_props.add(
        key="pkg.torch.onnx.name_scopes",
        value="['', 'language_model', 'language_model.layers.slice(None, 4, None).2', "
        "'language_model.layers.slice(None, 4, None).2.linear_attn', 'neg']",
    )
    g = helper.make_graph([*nodes, dyn], "g", [], [])
    stats = graph_stats(helper.make_model(g))
    assert stats.per_type["language_model.layers.*.self_attn"] == (1, 1)
    assert stats.constants["language_model.layers.*.self_attn"] == (0, 1)
    assert stats.per_type["language_model.layers.*.(layer)"] == (1,)
    assert stats.per_type["language_model.layers.*.linear_attn"] == (1,)
    assert stats.per_type[OUTSIDE] == (1,)
    assert stats.max_per_layer(".linear_attn") == 1 and stats.total == 5
    assert any("linear_attn" in line for line in stats.lines())
    real = graph_stats(onnx.load(str(gdn_layer[1])))
    assert real.total <= GDN_LAYER_MAX_NODES


@pytest.mark.slow
def test_qwen_bundle_holds_one_compact_decoder(
    request: pytest.FixtureRequest, tiny_pair: Path
) -> None:
    """The exported Qwen3.5 member: one ``decoder.onnx`` with a dynamic length, each
    Gated-DeltaNet layer within the bound, parity with torch at every length up to its largest
    bucket."""
    import yaml
    from spotstop.export.graph_stats import graph_stats

    from tests._support.pair import fp32_bundle  # the pair's one fp32 export (slow: Qwen3.5)

    member = fp32_bundle(request, "qwen3_5") / "members" / "tiny-qwen3_5"
    meta = yaml.safe_load((member / "spotstop_onnx.yaml").read_text(encoding="utf-8"))
    assert meta["decoder"]["fixed_length"] is False
    assert list(meta["decoder"]["files"].values()) == ["onnx/decoder.onnx"]
    assert sorted(p.name for p in (member / "onnx").glob("*.onnx")) == [
        "decoder.onnx",
        "vision.onnx",
    ]
    stats = graph_stats(member / "onnx" / "decoder.onnx")
    n = stats.max_per_layer(".linear_attn")
    assert 0 < n <= GDN_LAYER_MAX_NODES, stats.lines()

    # the whole decoder graph against the torch scoring graph at every kind of length
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import DECODER_INPUTS
    from spotstop.export.graphs import build_graphs
    from spotstop.export.onnx import _session
    from spotstop.guard import load_member

    m: Any = load_member(tiny_pair / "tiny-qwen3_5")
    _, dec = build_graphs(
        m.backend.model,
        get_export_config("qwen3_5"),
        image_token_id=m.folder.image_token_id,
        first_ids=m.encoder.plan.first_ids,
        gray_pixels=m._gray(),
        geometry=m.geometry,
    )
    sess = _session(str(member / "onnx" / "decoder.onnx"))
    longest = max(int(b) for b in meta["decoder"]["buckets"])
    rng = np.random.default_rng(0)
    n_img, hidden = m.geometry.n_image_tokens, int(meta["hidden_size"])
    for length in (1, 17, 64, 65, longest - 56, longest):
        ids = rng.integers(0, 200, (2, length)).astype(np.int64)  # no image token
        at = np.array([[length - 1, 0], [length // 2, length // 3]], np.int64)
        feeds = {
            "input_ids": ids,
            "image_embeds": np.zeros((2, n_img, hidden), np.float32),
            "last_index": at[:, 0].copy(),
            "read_index": at,
            "read_token": rng.integers(0, 200, (2, 2)).astype(np.int64),
        }
        with torch.no_grad():
            want = dec(*(torch.from_numpy(feeds[k]) for k in DECODER_INPUTS))
        got = sess.run(None, feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-4, err_msg=f"L={length}")


def test_onnx_backend_reads_per_bucket_and_single_decoder_bundles(
    member_fp32_bundles: Any, tmp_path: Path
) -> None:
    """A bundle with one dynamic ``decoder.onnx`` runs at each batch's own length; one written
    before the compact graph (``decoder_L{bucket}.onnx`` per bucket, ``fixed_length: true``)
    still loads and runs each length on its bucket's graph, with the same scores."""
    import shutil

    import yaml
    from spotstop.guard import Scene, ScoringConfig, load_member
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard._errors import ScoringError

    from tests._support.images import make_image_bytes

    src = member_fp32_bundles("lfm2_vl")
    old = tmp_path / "old"
    shutil.copytree(src, old)
    mdir = old / "members" / "tiny-lfm2_vl"
    onnx_dir = mdir / "onnx"
    shutil.copy(onnx_dir / "decoder.onnx", onnx_dir / "decoder_L128.onnx")
    (onnx_dir / "decoder.onnx").rename(onnx_dir / "decoder_L256.onnx")  # same external data
    meta_path = mdir / "spotstop_onnx.yaml"
    meta = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    assert meta["decoder"]["fixed_length"] is False
    meta["decoder"] = {
        "fixed_length": True,
        "buckets": [128, 256],
        "files": {128: "onnx/decoder_L128.onnx", 256: "onnx/decoder_L256.onnx"},
    }
    meta_path.write_text(yaml.safe_dump(meta), encoding="utf-8")

    def member(bundle: Path) -> Any:
        b = load_bundle(bundle, verify=False)  # the renamed graphs are not in the file list
        bm = b.members[0]
        return load_member(
            bm.path,
            name=bm.name,
            config=ScoringConfig(prompt=b.prompt),
            backend="onnx",
            template=bm.template,
        )

    new_m = member(src)
    old_m = member(old)
    assert new_m.backend.feed_length(37) == 37 and old_m.backend.feed_length(37) == 128
    assert old_m.backend.feed_length(129) == 256
    for m in (new_m, old_m):
        with pytest.raises(ScoringError, match="largest length bucket"):
            m.backend.feed_length(257)
    scenes = [Scene(make_image_bytes(i), r) for i, r in enumerate(["open the door", "cut it"])]
    a = np.array([r.score for r in new_m.score(scenes)])
    b = np.array([r.score for r in old_m.score(scenes)])
    np.testing.assert_allclose(b, a, atol=1e-4)
    assert set(old_m.backend._decoders) <= {128, 256} and old_m.backend._decoders


def test_no_traced_constant_leaks_out_of_an_export(gdn_layer: tuple[Any, Path]) -> None:
    """The kernel's constants made while exporting are the tracer's fake tensors; none may
    reach eager code afterwards (CI once ran the parity tests after an export and got them)."""
    from spotstop.export import gated_delta

    assert gated_delta._CONSTANTS == {}  # emptied when the export's patch was undone
    q, k, v, decay, beta = _inputs(65, 2, 4, 16, 16)
    want, _ = _reference()(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True)
    with gated_delta.compact_gated_delta(MAX_LENGTH):  # inside a patch, in eager code too
        got, _ = compact_chunk_gated_delta_rule(
            q, k, v, decay, beta, use_qk_l2norm_in_kernel=True, levels=scan_levels(MAX_LENGTH)
        )
    assert float((got - want).abs().max()) <= 1e-5
