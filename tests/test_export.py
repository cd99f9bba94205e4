"""ONNX export of the scoring graphs, the onnx backend and exported bundles, on the tiny pair.

The LFM2-VL member exports in seconds (legacy exporter for both graphs) and runs in the
default test run at fp32 and int8. The Qwen3.5 decoder needs the dynamo exporter (minutes on
two cores): its scoring graphs are checked in torch against the reference and its vision
graph is exported in the default run; the full Qwen3.5 bundle is a ``slow`` test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from spotstop.export.configs import EXPORT_CONFIGS, PRECISIONS, Lfm2VlExportConfig  # noqa: E402
from spotstop.guard import Scene, ScoringConfig, load_member  # noqa: E402
from spotstop.guard._errors import BackendUnavailableError, ScoringError  # noqa: E402
from spotstop.guard._image import decode_image  # noqa: E402

from tests.conftest import make_image_bytes  # noqa: E402

#: architecture → the tests that export it end to end (a registered one without is a failure)
TESTED_ARCHS = {
    "lfm2_vl": "test_lfm2_bundle_fp32_matches_torch, test_lfm2_bundle_int8_verifies",
    "qwen3_5": "test_qwen_bundle_fp32_and_int8 (slow), test_vision_graph_exports[tiny-qwen3_5]",
}
BUCKETS = "128,256"
REQUESTS = ["pick up the knife", "pour the hot water into the cup near the child"]


def _scenes() -> list[Scene]:
    return [Scene(make_image_bytes(i, (72 + 8 * i, 40 + 4 * i)), r) for i, r in enumerate(REQUESTS)]


def _export(tiny_pair: Path, out: Path, precision: str, *members: str) -> Path:
    from spotstop.guard.cli import main

    args = ["export", "--out", str(out), "--precision", precision, "--buckets", BUCKETS]
    for m in members:
        args += ["--member", str(tiny_pair / m)]
    assert main([*args, "--triton"]) == 0
    return out


@pytest.fixture(scope="session")
def lfm_fp32(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(tiny_pair, tmp_path_factory.mktemp("exp") / "b32", "fp32", "tiny-lfm2_vl")


@pytest.fixture(scope="session")
def lfm_int8(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(tiny_pair, tmp_path_factory.mktemp("exp") / "b8", "int8", "tiny-lfm2_vl")


# -- registry ------------------------------------------------------------------------------


def test_every_registered_architecture_has_a_test() -> None:
    missing = sorted(set(EXPORT_CONFIGS) - set(TESTED_ARCHS))
    assert not missing, f"export configs without an export test: {missing}"
    from spotstop.guard._arch import ARCHS

    assert set(EXPORT_CONFIGS) == set(ARCHS), "every member architecture needs an export config"


@pytest.mark.parametrize("arch", sorted(EXPORT_CONFIGS))
def test_export_configs_state_tolerances_for_every_precision(arch: str) -> None:
    cfg = EXPORT_CONFIGS[arch]
    for table in (cfg.atol, cfg.rtol, cfg.score_atol, cfg.min_spearman):
        assert set(table) == set(PRECISIONS)
    assert cfg.score_atol["fp32"] <= 1e-3
    assert cfg.decoder_exporter in ("legacy", "dynamo")


# -- scoring graphs in torch -------------------------------------------------------------------


def test_scoring_graphs_match_the_torch_reference(loaded_members: dict[str, object]) -> None:
    """Graph wrappers (in-graph M-RoPE positions, visual-token scatter, sliced head) = reference."""
    from spotstop.export.graphs import build_graphs
    from spotstop.guard.backends._onnx import combine_scores, decoder_feeds

    scenes = _scenes()
    for m in loaded_members.values():
        model = m.backend.model  # type: ignore[attr-defined]
        plan = m.encoder.plan  # type: ignore[attr-defined]
        g = m.geometry  # type: ignore[attr-defined]
        vis, dec = build_graphs(
            model,
            m.folder.model_type,  # type: ignore[attr-defined]
            image_token_id=m.folder.image_token_id,  # type: ignore[attr-defined]
            first_ids=plan.first_ids,
            gray_pixels=m._gray(),  # type: ignore[attr-defined]
            merge=g.merge,
        )
        hidden = model.config.get_text_config().hidden_size
        for variant in ("scene", "text"):
            ref = [r.score for r in m.score(scenes, variant)]  # type: ignore[attr-defined]
            prompts = [m.prompt_ids(s.request, variant) for s in scenes]  # type: ignore[attr-defined]
            feeds = decoder_feeds(prompts, plan, 256)
            if variant == "scene":
                with torch.no_grad():
                    emb = torch.cat(
                        [
                            vis(torch.from_numpy(m.pixels(decode_image(s.image))["pixel_values"]))  # type: ignore[attr-defined]
                            for s in scenes
                        ]
                    )
                emb = emb.repeat_interleave(len(plan.rows), dim=0)
            else:
                emb = torch.zeros(len(prompts) * len(plan.rows), g.n_image_tokens, hidden)
            with torch.no_grad():
                fl, lp = dec(
                    torch.from_numpy(feeds["input_ids"]),
                    emb,
                    *(
                        torch.from_numpy(feeds[k])
                        for k in ("last_index", "read_index", "read_token")
                    ),
                )
            got = combine_scores(fl.numpy(), lp.numpy(), plan, plan.first_ids)
            np.testing.assert_allclose(got, ref, atol=1e-4, err_msg=f"{m.name} {variant}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("member", ["tiny-qwen3_5", "tiny-lfm2_vl"])
def test_vision_graph_exports(member: str, tiny_pair: Path, tmp_path: Path) -> None:
    """Both vision towers export with the legacy exporter and match torch at fp32 and int8."""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.graphs import VisionGraph
    from spotstop.export.onnx import _compare, _export_vision, _session, convert_precision

    m = load_member(tiny_pair / member)
    px = m._gray()
    vis = VisionGraph(m.backend.model, m.folder.model_type, px).eval()
    cfg = get_export_config(m.folder.model_type)
    assert cfg.vision_exporter == "legacy"
    _export_vision(vis, cfg, px, tmp_path / "vision.onnx")
    noise = m.pixels(decode_image(make_image_bytes(3)))
    with torch.no_grad():
        want = vis(torch.from_numpy(noise["pixel_values"])).numpy()
    model = onnx.load(str(tmp_path / "vision.onnx"))
    for prec in ("fp32", "int8"):
        (got,) = _session(convert_precision(model, prec)).run(
            None, {"pixel_values": noise["pixel_values"]}
        )
        check = _compare("vision", "image_embeds", prec, got, want, cfg.atol[prec], cfg.rtol[prec])
        assert check.ok, check


# -- exported LFM2-VL bundles (default run) ----------------------------------------------------------


def _compare_member(bundle: Path, tiny_pair: Path, name: str) -> float:
    from spotstop.guard._bundle import load_bundle

    b = load_bundle(bundle)
    bm = next(m for m in b.members if m.name == name)
    cfg = ScoringConfig(prompt=b.prompt)
    got_m = load_member(bm.path, name=name, config=cfg, backend="onnx", template=bm.template)
    ref_m = load_member(tiny_pair / name, config=cfg, template=bm.template)
    assert got_m.prompt_hash == ref_m.prompt_hash == bm.prompt_hash
    worst = 0.0
    for variant in ("scene", "gray", "text"):
        got = np.array([r.score for r in got_m.score(_scenes(), variant)])  # type: ignore[arg-type]
        ref = np.array([r.score for r in ref_m.score(_scenes(), variant)])  # type: ignore[arg-type]
        worst = max(worst, float(np.max(np.abs(got - ref))))
    return worst


def test_lfm2_bundle_fp32_matches_torch(lfm_fp32: Path, tiny_pair: Path) -> None:
    assert _compare_member(lfm_fp32, tiny_pair, "tiny-lfm2_vl") <= 1e-3


def test_lfm2_bundle_int8_verifies(lfm_int8: Path, lfm_fp32: Path, tiny_pair: Path) -> None:
    from spotstop.export.verify import verify_bundle
    from spotstop.guard._bundle import load_bundle

    worst = _compare_member(lfm_int8, tiny_pair, "tiny-lfm2_vl")
    assert worst <= Lfm2VlExportConfig.score_atol["int8"]
    v = verify_bundle(lfm_int8, n_scenes=4)
    assert v.ok, str(v)
    w8 = load_bundle(lfm_int8).manifest["export"]["weight_bytes"]
    w32 = load_bundle(lfm_fp32).manifest["export"]["weight_bytes"]
    assert w8 < 0.6 * w32


def test_verify_bundle_cli(lfm_fp32: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spotstop.guard.cli import main

    assert main(["verify-bundle", str(lfm_fp32), "--scenes", "4"]) == 0
    out = capsys.readouterr().out
    assert "max|Δs|" in out and "PASS" in out


def test_bundle_lists_every_file_and_refuses_altered_graphs(lfm_fp32: Path, tmp_path: Path) -> None:
    import shutil

    from spotstop.guard._bundle import BundleError, load_bundle

    b = load_bundle(lfm_fp32)
    on_disk = {
        p.relative_to(lfm_fp32).as_posix()
        for p in lfm_fp32.rglob("*")
        if p.is_file() and p.name != "manifest.yaml" and not p.name.startswith("decisions")
    }
    assert on_disk == set(b.manifest["files"])
    assert "trt/build.sh" in on_disk and any(f.startswith("triton/") for f in on_disk)
    m = b.manifest["members"][0]
    assert m["backend"] == "onnx" and m["answer_ids"]["unsafe"] and m["first_ids"]
    assert not any(f.endswith(".safetensors") for f in on_disk), "no HF weights in a bundle"
    copy = tmp_path / "copy"
    shutil.copytree(lfm_fp32, copy)
    data = copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match=r"decoder\.onnx\.data: sha256 differs"):
        load_bundle(copy)


def test_runtime_imports_no_torch(lfm_fp32: Path) -> None:
    """Scoring an exported member imports neither torch nor transformers."""
    code = f"""
import sys
from spotstop.guard import Scene, ScoringConfig, load_member
from spotstop.guard._bundle import load_bundle
b = load_bundle({str(lfm_fp32)!r})
bm = b.members[0]
m = load_member(bm.path, name=bm.name, config=ScoringConfig(prompt=b.prompt), backend="onnx",
                template=bm.template, image_size=bm.image_size)
from PIL import Image
import io
buf = io.BytesIO(); Image.new("RGB", (50, 40), (200, 10, 10)).save(buf, "PNG")
[r] = m.score([Scene(buf.getvalue(), "open the door")])
assert r.score == r.score
bad = [k for k in ("torch", "transformers") if k in sys.modules]
print("IMPORTED", bad)
sys.exit(1 if bad else 0)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_guard_serves_an_onnx_bundle(lfm_fp32: Path, tmp_path: Path) -> None:
    import shutil
    from datetime import UTC, datetime

    from spotstop.calibrate import fit_frozen
    from spotstop.guard import Guard
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard._demo import demo_scenes
    from spotstop.guard._policy import PolicyConfig, dump_policy

    bdir = tmp_path / "bundle"
    shutil.copytree(lfm_fp32, bdir)
    b = load_bundle(bdir)
    bm = b.members[0]
    m = load_member(
        bm.path,
        name=bm.name,
        config=ScoringConfig(prompt=b.prompt),
        backend="onnx",
        template=bm.template,
    )
    pool = demo_scenes(8, seed=5)
    fit = fit_frozen({bm.name: np.array([r.score for r in m.score(pool)])})
    dump_policy(
        PolicyConfig(
            bundle_id=b.bundle_id,
            prompt_hash=b.prompt_hash,
            fusion=fit.fusion,
            policy=fit.policy,
            fitted_on={"what": "test pool", "n": fit.n},
            created=datetime.now(UTC),
        ),
        bdir / "policy.yaml",
    )
    with Guard(bdir, log=tmp_path / "log.sqlite") as guard:
        d = guard.check(Scene(make_image_bytes(9), "open the door"))
    assert not d.fail_closed, d.fail_reason
    assert d.label in ("SAFE", "UNSAFE")


def test_export_reports_every_failure_together(
    tiny_pair: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.export.onnx import ExportValidationError, export_member

    monkeypatch.setattr(Lfm2VlExportConfig, "atol", {**Lfm2VlExportConfig.atol, "fp32": 0.0})
    monkeypatch.setattr(Lfm2VlExportConfig, "rtol", {**Lfm2VlExportConfig.rtol, "fp32": 0.0})
    monkeypatch.setattr(
        Lfm2VlExportConfig, "score_atol", {**Lfm2VlExportConfig.score_atol, "fp32": 0.0}
    )
    with pytest.raises(ExportValidationError) as ei:
        export_member(tiny_pair / "tiny-lfm2_vl", tmp_path / "m", buckets=[256])
    assert len(ei.value.failures) >= 3
    assert any("vision" in f for f in ei.value.failures)
    assert any("decoder" in f for f in ei.value.failures)
    assert not (tmp_path / "m").exists()


# -- the backend's refusals ----------------------------------------------------------------


def test_onnx_backend_never_falls_back_silently() -> None:
    from spotstop.guard.backends._onnx import onnx_providers

    assert onnx_providers("cpu", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    for dev in ("cuda", "cuda:1", "tensorrt"):
        with pytest.raises(BackendUnavailableError, match="does not fall back"):
            onnx_providers(dev, ["CPUExecutionProvider"])


def test_onnx_backend_refuses_long_prompts_and_other_answers(lfm_fp32: Path) -> None:
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard._prompt import PromptSpec, ScorePlan

    b = load_bundle(lfm_fp32)
    bm = b.members[0]
    m = load_member(
        bm.path,
        name=bm.name,
        config=ScoringConfig(prompt=b.prompt),
        backend="onnx",
        template=bm.template,
    )
    with pytest.raises(ScoringError, match="largest length bucket"):
        m.backend.bucket(10_000)
    other = ScorePlan.build([5, 6], [7])
    with pytest.raises(ScoringError, match="re-export"):
        m.backend.score([[1, 2, 3]], None, other)
    assert PromptSpec().safe_answer == b.prompt.safe_answer
    # on-demand sessions: loaded to score, released after, same score
    [before] = m.score([Scene(make_image_bytes(1), "open the door")])
    m.backend.resident = False
    [after] = m.score([Scene(make_image_bytes(1), "open the door")])
    assert m.backend._vision is None and not m.backend._decoders
    assert after.score == before.score


# -- the full Qwen3.5 bundle (slow: dynamo export) ---------------------------------------------


@pytest.mark.slow
def test_qwen_bundle_fp32_and_int8(
    tiny_pair: Path, tiny_pair_fp32_bundle: Path, tmp_path: Path
) -> None:
    """The Qwen3.5 member (dynamo decoder, one graph per bucket) at fp32, and int8 from it."""
    from spotstop.export.configs import Qwen35ExportConfig
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.export.verify import verify_bundle

    b32 = tiny_pair_fp32_bundle
    assert _compare_member(b32, tiny_pair, "tiny-qwen3_5") <= 1e-3
    b8 = derive_bundle(b32, tmp_path / "p8", precision="int8")
    assert _compare_member(b8, tiny_pair, "tiny-qwen3_5") <= Qwen35ExportConfig.score_atol["int8"]
    v = verify_bundle(b8)
    assert v.ok, str(v)
