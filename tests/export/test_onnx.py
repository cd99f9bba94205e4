"""ONNX export of the scoring graphs, the onnx backend and exported bundles, on the tiny pair.

The export tests are parametrized over the registered export configs (conftest's ``by_arch``), each on
its architecture's tiny member, and :func:`test_every_registered_architecture_is_tested` fails
when a registered architecture lacks a case. The LFM2-VL member exports in seconds (legacy
exporter for both graphs): its bundle runs in the default test run and also serves the
backend and bundle tests. The Qwen3.5 decoder needs the dynamo exporter (about a minute on
two cores, with the compact Gated-DeltaNet graph: tests/export/test_compact.py): its scoring
graphs are checked in torch and its vision graph is exported in the default run; its bundle
tests are ``slow`` (conftest's ``SLOW_EXPORT``).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from spotstop.export.configs import EXPORT_CONFIGS, PRECISIONS, Lfm2VlExportConfig  # noqa: E402
from spotstop.guard import Scene, ScoringConfig, load_member  # noqa: E402
from spotstop.guard._errors import BackendUnavailableError, ScoringError  # noqa: E402
from spotstop.guard._image import decode_image  # noqa: E402

from tests._support.images import make_image_bytes  # noqa: E402
from tests._support.pair import SLOW_EXPORT, by_arch, fp32_bundle  # noqa: E402

REQUESTS = ["pick up the knife", "pour the hot water into the cup near the child"]


def _scenes() -> list[Scene]:
    return [Scene(make_image_bytes(i, (72 + 8 * i, 40 + 4 * i)), r) for i, r in enumerate(REQUESTS)]


@pytest.fixture(scope="session")
def lfm_fp32(member_fp32_bundles: Callable[[str], Path]) -> Path:
    """The fast member's fp32 bundle, for the backend and bundle tests."""
    return member_fp32_bundles("lfm2_vl")


# -- registry ------------------------------------------------------------------------------


def _cases(test: Callable[..., None]) -> set[str]:
    marks = getattr(test, "pytestmark", [])
    return {p.values[0] for m in marks if m.name == "parametrize" for p in m.args[1]}


def test_every_registered_architecture_is_tested() -> None:
    """A registered export config has a spec, a tiny member and a case in every export test."""
    from spotstop.export.tiny import TINY_MEMBERS
    from spotstop.guard._arch import ARCHS

    registered = set(EXPORT_CONFIGS)
    assert registered == set(ARCHS), "every member architecture needs an export config"
    assert set(TINY_MEMBERS) == {f"tiny-{a}" for a in registered}
    assert set(SLOW_EXPORT) <= registered
    for test in PER_ARCH_TESTS:
        missing = sorted(registered - _cases(test))
        assert not missing, f"{test.__name__} has no case for {missing}"


def _in_default_run(marks: list[Any]) -> bool:
    """Whether a test with these marks runs in the default run: not slow or gpu as a whole, and
    each of its parametrize lists has a case that is not."""
    off = {"slow", "gpu"}
    if any(m.name in off for m in marks):
        return False
    return all(
        any(not {k.name for k in getattr(c, "marks", ())} & off for c in m.args[1])
        for m in marks
        if m.name == "parametrize"
    )


def _precision_tests() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The tests of this folder marked ``precision(...)``, by the precisions they name: those in
    the default run, and every one."""
    import importlib

    default: dict[str, list[str]] = {}
    every: dict[str, list[str]] = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, fn in sorted(vars(module).items()):
            marks = getattr(fn, "pytestmark", []) if name.startswith("test_") else []
            for p in (a for m in marks if m.name == "precision" for a in m.args):
                every.setdefault(p, []).append(f"{path.stem}::{name}")
                if _in_default_run(marks):
                    default.setdefault(p, []).append(f"{path.stem}::{name}")
    return default, every


def test_every_registered_precision_is_tested() -> None:
    """A registered precision (export/precision.py) has a test, in the default run, that exports
    a tiny member at it and checks its scores at its tolerance (marked
    ``@pytest.mark.precision(name)``); a mark names only registered precisions."""
    default, every = _precision_tests()
    unknown = sorted(set(every) - set(PRECISIONS))
    assert not unknown, f"marked with unregistered precisions {unknown}: {every}"
    missing = [p for p in PRECISIONS if p not in default]
    assert not missing, (
        f"registered precisions {missing} have no test in the default run that exports a tiny "
        "member at them and checks its scores: write one and mark it "
        "@pytest.mark.precision(...)"
    )


def test_an_unregistered_precision_is_refused_with_the_registered_ones() -> None:
    from spotstop.export.precision import get_precision

    with pytest.raises(ValueError, match="precision must be one of") as e:
        get_precision("int7")
    assert "'int7'" in str(e.value)
    assert all(repr(p) in str(e.value) for p in PRECISIONS)
    assert get_precision("int8").name == "int8"


def test_the_precision_check_sees_a_slow_only_case() -> None:
    """The helper behind :func:`test_every_registered_precision_is_tested`: a test whose every
    case is slow does not count for the default run, one with a default case does."""

    def par(*cases: Any) -> Any:
        return pytest.mark.parametrize("arch", list(cases)).mark

    slow = pytest.param("q", marks=pytest.mark.slow)
    assert _in_default_run([par("a", slow)])
    assert not _in_default_run([par(slow)])
    assert not _in_default_run([pytest.mark.slow.mark, par("a")])
    assert _in_default_run([pytest.mark.precision("int8").mark])


@pytest.mark.parametrize("arch", by_arch())
def test_export_configs_state_tolerances_for_every_precision(arch: str) -> None:
    cfg = EXPORT_CONFIGS[arch]
    for table in (cfg.atol, cfg.rtol, cfg.score_atol, cfg.min_spearman):
        assert set(table) == set(PRECISIONS)
    assert cfg.score_atol["fp32"] <= 1e-3
    assert cfg.decoder_exporter in ("legacy", "dynamo")


# -- scoring graphs in torch -------------------------------------------------------------------


@pytest.mark.parametrize("arch", by_arch())
def test_scoring_graphs_match_the_torch_reference(arch: str, tiny_pair: Path) -> None:
    """Graph wrappers (in-graph positions, visual-token scatter, sliced head) = reference."""
    from spotstop.export.configs import get_export_config
    from spotstop.export.graphs import build_graphs
    from spotstop.guard.backends._onnx import combine_scores, decoder_feeds

    scenes = _scenes()
    m: Any = load_member(tiny_pair / f"tiny-{arch}")
    model = m.backend.model
    plan = m.encoder.plan
    g = m.geometry
    vis, dec = build_graphs(
        model,
        get_export_config(arch),
        image_token_id=m.folder.image_token_id,
        first_ids=plan.first_ids,
        gray_pixels=m._gray(),
        geometry=g,
    )
    hidden = model.config.get_text_config().hidden_size
    for variant in ("scene", "text"):
        ref = [r.score for r in m.score(scenes, variant)]
        prompts = [m.prompt_ids(s.request, variant) for s in scenes]
        feeds = decoder_feeds(prompts, plan, 256)
        if variant == "scene":
            with torch.no_grad():
                emb = torch.cat(
                    [
                        vis(torch.from_numpy(m.pixels(decode_image(s.image))["pixel_values"]))
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
                *(torch.from_numpy(feeds[k]) for k in ("last_index", "read_index", "read_token")),
            )
        got = combine_scores(fl.numpy(), lp.numpy(), plan, plan.first_ids)
        np.testing.assert_allclose(got, ref, atol=1e-4, err_msg=f"{m.name} {variant}")


@pytest.mark.parametrize("arch", by_arch())
def test_vision_graph_exports(arch: str, tiny_pair: Path, tmp_path: Path) -> None:
    """Every vision tower exports with its config's exporter and matches torch at fp32 and int8."""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.exporters import export_vision
    from spotstop.export.graphs import VisionGraph
    from spotstop.export.onnx import _compare, _session
    from spotstop.export.precision import convert_precision

    m = load_member(tiny_pair / f"tiny-{arch}")
    px = m._gray()
    vis = VisionGraph(m.backend.model, px).eval()
    cfg = get_export_config(arch)
    export_vision(vis, cfg, px, tmp_path / "vision.onnx")
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


@pytest.mark.precision("fp32", "int8", "int8-nbits")
@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_bundle_matches_torch_at_fp32_and_int8(
    arch: str, request: pytest.FixtureRequest, tiny_pair: Path, tmp_path: Path
) -> None:
    """The member's fp32 bundle scores as torch does; int8-nbits derived from it verifies, with
    every MatMul weight quantized but the vision graph's two ends; int8 (MatMulIntegerToFloat per token, no calibration when derived)
    scores within its tolerance with every Linear but the output layer computing in int8. (The
    random pair's scores spread ~0.2 nats, so int8's rank check is made on the trained pair:
    bench/trained_world.py, tests/bench/test_trained_world.py.)"""
    import onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.export.verify import verify_bundle
    from spotstop.guard._bundle import load_bundle

    cfg, name = get_export_config(arch), f"tiny-{arch}"
    b32 = fp32_bundle(request, arch)
    assert _compare_member(b32, tiny_pair, name) <= cfg.score_atol["fp32"]
    dyn = derive_bundle(b32, tmp_path / "dyn", precision="int8")
    assert _compare_member(dyn, tiny_pair, name) <= cfg.score_atol["int8"]
    ops = [
        n.op_type
        for f in sorted((dyn / "members" / name / "onnx").glob("*.onnx"))
        for n in onnx.load(str(f), load_external_data=False).graph.node
    ]
    assert ops.count("MatMulIntegerToFloat") > 10 * ops.count("MatMulNBits") > 0
    b8 = derive_bundle(b32, tmp_path / "b8", precision="int8-nbits")
    assert _compare_member(b8, tiny_pair, name) <= cfg.score_atol["int8-nbits"]
    v = verify_bundle(b8, n_scenes=4)
    # the scores within tolerance and every decision the same; the rank check needs a spread
    # the random pair lacks (int8-nbits' int8 activations per block moved a Spearman of 8
    # scores spread over 0.15 nats to 0.86): the trained pair's verify-bundle checks it
    for m in v.members:
        assert m.max_abs_diff <= m.tolerance and m.decision_agreement == 1.0, str(v)
        # each pass's own max, the larger of them the member's
        assert set(m.max_abs_diff_by_pass) == {"scene", "text"}
        assert max(m.max_abs_diff_by_pass.values()) == m.max_abs_diff
    weights = {
        b: next(m for m in load_bundle(b).manifest["members"] if m["name"] == name)["weight_bytes"]
        for b in (b32, b8)
    }
    assert weights[b8] < weights[b32]
    from spotstop.export.weights import image_end_weights

    for f in sorted(
        [
            *(b8 / "members" / name / "onnx").glob("*.onnx"),
            *(dyn / "members" / name / "onnx").glob("*.onnx"),
        ]
    ):
        # every weight quantized but the vision graph's two ends (export/weights.py)
        g = onnx.load(str(f), load_external_data=False)
        inits = {t.name for t in g.graph.initializer}
        float_weights = {
            n.input[1] for n in g.graph.node if n.op_type == "MatMul" and n.input[1] in inits
        }
        ends = image_end_weights(g)
        assert float_weights == ends, (f.name, float_weights)
        # LFM2-VL: the patch embedding and the projector's last layer; Qwen3.5's patch layer is
        # a Conv (never quantized), so its merger's last layer only
        want = {"tiny-lfm2_vl": 2, "tiny-qwen3_5": 1}[name] if f.name == "vision.onnx" else 0
        assert len(ends) == want, (f.name, ends)


def test_verify_bundle_cli(lfm_fp32: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spotstop.cli import main

    assert main(["verify-bundle", str(lfm_fp32), "--scenes", "4"]) == 0
    out = capsys.readouterr().out
    assert "max|Δs|" in out and "PASS" in out and "p95 |Δs|=" in out and "max at scene" in out


def test_verify_bundle_takes_the_precision_of_the_graphs_not_of_the_manifest(
    bundle_copy: Path,
) -> None:
    """The tolerance follows the graphs' own, sha256-checked record: a manifest entry that
    names a looser precision (no sha256 covers it, the bundle id does not name it) is refused,
    not used to judge the scores."""
    import yaml
    from spotstop.export.verify import verify_bundle
    from spotstop.guard import BundleError, load_bundle

    v = verify_bundle(bundle_copy, n_scenes=2, reference=False)
    assert v.ok and {r.precision for r in v.runtime} == {"fp32"}
    path = bundle_copy / "manifest.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["members"][0]["precision"] = "int4-trt"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    assert load_bundle(bundle_copy).bundle_id == v.bundle_id  # the edit loads, same id
    name = doc["members"][0]["name"]
    with pytest.raises(BundleError, match=rf"member {name} is int4-trt, but its graphs are fp32"):
        verify_bundle(bundle_copy, n_scenes=2, reference=False)


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
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import Guard
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard.policies import PolicyConfig, dump_policy

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


# -- per-member visual-token budgets --------------------------------------------------------


def _pair(tiny_pair: Path) -> list[Path]:
    from spotstop.export.tiny import TINY_MEMBERS

    return [tiny_pair / m for m in TINY_MEMBERS]


def _cfg(d: dict[str, Any]) -> ScoringConfig:
    from spotstop.guard._config import scoring_config_from_dict

    return scoring_config_from_dict(d)


def test_a_visual_token_budget_is_a_bundle_setting(tiny_pair: Path, tmp_path: Path) -> None:
    """Each member's budget is recorded beside its grid; the bundle id changes with it, so
    a policy fitted at one budget is refused by the bundle at another."""
    import yaml
    from spotstop.calibrate._pool import fit_pool_policy
    from spotstop.export.bundle import write_bundle
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import Guard, load_bundle
    from spotstop.guard.policies import PolicyMismatchError, dump_policy

    a = write_bundle(_pair(tiny_pair), tmp_path / "a", visual_tokens={"lfm": 64})
    b = write_bundle(_pair(tiny_pair), tmp_path / "b", visual_tokens={"lfm2_vl": 16})
    same = write_bundle(_pair(tiny_pair), tmp_path / "c", visual_tokens={"lfm": 64})
    ba, bb = load_bundle(a), load_bundle(b)
    grids = {m.model_type: (m.visual_tokens, m.image_size) for m in ba.members}
    # LFM at 64 tokens (256x256, 16x16 SigLIP2 patches); Qwen keeps its folder's hint (4)
    assert grids == {"lfm2_vl": (64, (256, 256)), "qwen3_5": (4, (64, 64))}
    assert {m.model_type: m.visual_tokens for m in bb.members}["lfm2_vl"] == 16
    manifest = yaml.safe_load((a / "manifest.yaml").read_text())
    assert all(e["visual_tokens"] == e["n_image_tokens"] for e in manifest["members"])
    assert ba.prompt_hash == bb.prompt_hash  # the grid is not part of the rendered template
    assert ba.bundle_id != bb.bundle_id
    assert load_bundle(same).bundle_id == ba.bundle_id  # the same setting, the same id
    # the scoring YAML's visual_tokens: one count for every member, or per member; the
    # explicit setting (export --visual-tokens) wins
    one = write_bundle(_pair(tiny_pair), tmp_path / "d", config=_cfg({"visual_tokens": 16}))
    assert {m.visual_tokens for m in load_bundle(one).members} == {16}
    both = write_bundle(
        _pair(tiny_pair),
        tmp_path / "e",
        config=_cfg({"visual_tokens": {"qwen": 16, "lfm": 64}}),
        visual_tokens={"qwen": 36},
    )
    assert {m.model_type: m.visual_tokens for m in load_bundle(both).members} == {
        "qwen3_5": 36,
        "lfm2_vl": 64,
    }

    fit = fit_pool_policy(a, demo_scenes(8, seed=5))
    assert fit.fitted_on["visual_tokens"] == {"tiny-qwen3_5": 4, "tiny-lfm2_vl": 64}
    dump_policy(fit, a / "policy.yaml")
    dump_policy(fit, b / "policy.yaml")
    with Guard(a, log=tmp_path / "a.sqlite") as g:
        d = g.check(Scene(make_image_bytes(3), "pick up the knife"))
    assert not d.fail_closed
    with pytest.raises(PolicyMismatchError, match="bundle_id"):
        Guard(b, log=tmp_path / "b.sqlite")
    # a manifest whose budget was edited by hand no longer matches its grid
    from spotstop.guard import BundleError
    from spotstop.guard._errors import MemberLoadError
    from spotstop.guard._member import load_bundle_member

    for e in manifest["members"]:
        e["visual_tokens"] = 16 if e["model_type"] == "lfm2_vl" else e["visual_tokens"]
    (a / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    with pytest.raises(BundleError, match="does not name the bundle's content"):
        load_bundle(a)  # the budget is part of the id
    edited = load_bundle(a, verify=False)
    [lfm] = [m for m in edited.members if m.model_type == "lfm2_vl"]
    with pytest.raises(MemberLoadError, match="records 16 visual tokens"):
        load_bundle_member(edited, lfm)


def test_a_budget_that_names_no_member_or_fills_no_square_is_refused(
    tiny_pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotstop.cli import main
    from spotstop.export.bundle import write_bundle
    from spotstop.guard._config import scoring_config_from_dict
    from spotstop.guard._errors import ConfigError

    with pytest.raises(ConfigError, match=r"names no member.*tiny-qwen3_5 \(qwen3_5\)"):
        write_bundle(_pair(tiny_pair), tmp_path / "x", visual_tokens={"llava": 64})
    with pytest.raises(ConfigError, match="nearest budgets that do: 16 or 25"):
        write_bundle(_pair(tiny_pair), tmp_path / "x", visual_tokens={"lfm": 20})
    cfg = scoring_config_from_dict({"visual_tokens": {"llava": 64}})
    with pytest.raises(ConfigError, match="names no member"):
        write_bundle(_pair(tiny_pair), tmp_path / "x", config=cfg)
    with pytest.raises(ConfigError, match=r"visual_tokens\.lfm must be a positive integer"):
        scoring_config_from_dict({"visual_tokens": {"lfm": 0}})
    base = ["export", "--out", str(tmp_path / "e"), "--trt", "off"]
    for m in _pair(tiny_pair):
        base += ["--member", str(m)]
    for budgets, msg in [
        ("llava=64", "names no member"),
        ("qwen=20", "nearest budgets"),
        ("qwen=x", "member=count"),
    ]:
        assert main([*base, "--visual-tokens", budgets]) == 2
        assert msg in capsys.readouterr().err
    assert main([*base, "--visual-tokens", "16", "--image-size", "64x64"]) == 2
    assert "disagree" in capsys.readouterr().err


def test_an_onnx_bundle_exports_a_member_at_its_budget(tiny_pair: Path, tmp_path: Path) -> None:
    """The tiny LFM2-VL member exported at 16 visual tokens (128x128): the vision graph's
    grid, the manifest and the runtime's prompt all follow the budget."""
    from spotstop.export.onnx_bundle import write_onnx_bundle
    from spotstop.guard import load_bundle
    from spotstop.guard._member import load_bundle_member

    out = write_onnx_bundle(
        [tiny_pair / "tiny-lfm2_vl"],
        tmp_path / "b",
        buckets=[256],
        trt="off",
        visual_tokens={"lfm": 16},
    )
    [e] = out.members
    assert (e.image_size, e.n_image_tokens) == ((128, 128), 16)
    b = load_bundle(out.path)
    [bm] = b.members
    assert (bm.visual_tokens, bm.image_size) == (16, (128, 128))
    m = load_bundle_member(b, bm)
    assert m.geometry.n_image_tokens == 16
    [r] = m.score([Scene(make_image_bytes(2), "open the door")])
    assert np.isfinite(r.score)


#: the per-architecture export tests: each must have a case per registered export config
PER_ARCH_TESTS = (
    test_export_configs_state_tolerances_for_every_precision,
    test_scoring_graphs_match_the_torch_reference,
    test_vision_graph_exports,
    test_bundle_matches_torch_at_fp32_and_int8,
)


def test_the_rank_check_fails_a_bundle_whose_scores_do_not_vary() -> None:
    """Spearman is undefined when a side is constant; it counted as a pass, so a bundle that
    gives one score for every scene passed whenever the reference spread less than the
    tolerance (the tiny pair: 0.2 nats against 0.25). It passes only when the reference itself
    has nothing to rank."""
    from spotstop.export.verify import MemberVerification, pass_spearman, spearman

    ref = np.array([-12.5, -12.4, -12.6, -12.45])
    flat = np.full(4, -12.5)
    assert math.isnan(spearman(flat, ref))
    m = MemberVerification(
        "m", "int8", 4, 0.1, spearman(flat, ref), 0.5, 0.25, 0.9, reference_varies=True
    )
    assert not m.rank_ok and not m.ok and "undefined: the bundle's scores do not vary" in str(m)
    same = MemberVerification(
        "m", "int8", 4, 0.1, spearman(flat, flat), 1.0, 0.25, 0.9, reference_varies=False
    )
    assert same.ok and "n/a (the reference does not vary)" in str(same)
    ranked = MemberVerification("m", "int8", 4, 0.1, spearman(ref + 0.01, ref), 1.0, 0.25, 0.9)
    assert ranked.ok and ranked.spearman == pytest.approx(1.0)
    # one scene (--scenes 1, a one-row --scene-table): the reference was not found constant,
    # there was nothing to rank, and the output says which
    rho, varies, by_pass = pass_spearman(ref[:2] + 0.01, ref[:2], ("scene", "text"))
    one = MemberVerification(
        "m", "int8", 2, 0.01, rho, 1.0, 0.25, 0.9, reference_varies=varies, spearman_by_pass=by_pass
    )
    assert one.ok and "n/a (one scene per pass: nothing to rank)" in str(one)
    assert "the reference does not vary" not in str(one)


def test_the_rank_check_is_judged_within_each_pass() -> None:
    """Pooled over the scene and request-only passes, a gap between the passes' means ranked
    the two groups apart: six scenes scrambled within the scene pass (Spearman 0.03 there)
    still gave a pooled Spearman of 0.88, above int4's 0.8. Within each pass (scipy's
    spearmanr) the worst pass is judged, and fails."""
    from scipy.stats import spearmanr
    from spotstop.export.verify import MemberVerification, pass_spearman, spearman

    ref = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0])
    got = ref.copy()
    got[:6] = ref[[0, 3, 5, 4, 2, 1]]  # the scene pass scrambled, the request-only untouched
    pooled = spearman(got, ref)
    assert pooled == pytest.approx(spearmanr(got, ref).statistic) and pooled > 0.8
    rho, varies, by_pass = pass_spearman(got, ref, ("scene", "text"))
    within = spearmanr(got[:6], ref[:6]).statistic
    assert varies and rho == pytest.approx(within) and within == pytest.approx(1 / 35)
    assert by_pass == pytest.approx({"scene": 1 / 35, "text": 1.0})
    m = MemberVerification(
        "m", "int4", 12, 5.0, rho, 1.0, 6.0, 0.8, reference_varies=varies, spearman_by_pass=by_pass
    )
    assert not m.ok and "(scene 0.0286, text 1.0000)" in str(m)
    # a pass whose reference is constant owes no rank check; a bundle constant where the
    # reference varies fails it
    flat_text = np.r_[ref[:6], np.full(6, 3.0)]
    assert pass_spearman(flat_text, flat_text, ("scene", "text"))[:2] == pytest.approx((1.0, True))
    assert math.isnan(pass_spearman(np.full(12, 1.0), ref, ("scene", "text"))[0])
    none_vary = pass_spearman(np.full(12, 1.0), np.full(12, 1.0), ("scene", "text"))
    assert math.isnan(none_vary[0]) and not none_vary[1]


def test_the_pairs_decision_agreement_is_counted_within_each_pass(
    bundle_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By hand: both members score the scene pass -2, -1, 1, 2 and the request-only pass 8, 9,
    11, 12 in the reference; the bundle moves one scene-pass score from -1 to +1. Within the
    scene pass (median 0, IQR 2.5) one Avg-2 decision of four changes: 75 %. Pooled over both
    passes, the median 5 lay between them and every decision agreed: 100 % was printed."""
    from types import SimpleNamespace

    from spotstop.export import verify

    ref = {"scene": [-2.0, -1.0, 1.0, 2.0], "text": [8.0, 9.0, 11.0, 12.0]}
    got = np.array([-2.0, 1.0, 1.0, 2.0, *ref["text"]])

    def run(b, bm, scenes, variants):  # type: ignore[no-untyped-def]
        return verify.MemberRuntime(bm.name, bm.backend, "fp32", 8, -2.0, 12.0), got

    def reference(src, *, name, template, **kw):  # type: ignore[no-untyped-def]
        bm = next(m for m in verify.load_bundle(bundle_copy).members if m.name == name)
        scored = lambda scenes, v: [SimpleNamespace(score=x) for x in ref[v]]  # noqa: E731
        return SimpleNamespace(prompt_hash=bm.prompt_hash, score=scored)

    monkeypatch.setattr(verify, "_run_member", run)
    monkeypatch.setattr(verify, "load_member", reference)
    v = verify.verify_bundle(bundle_copy, n_scenes=4, reference=True)
    assert v.pair_decision_agreement == pytest.approx(0.75)
    assert v.pair_agreement_by_pass == pytest.approx({"scene": 0.75, "text": 1.0})
    assert "decisions agree 75.0% (scene 75.0%, text 100.0%)" in str(v)


def test_diff_summary_names_the_worst_score() -> None:
    """By hand: two scenes, each scored with its image then request-only; |Δs| = 0.1, 0.5,
    0.2, 0: the max is scene 1 with its image, and the 95th percentile interpolates the
    sorted 0, 0.1, 0.2, 0.5 at position 0.95 * 3 = 2.85: 0.2 + 0.85 * 0.3 = 0.455."""
    from spotstop.export.verify import MemberVerification, diff_summary, pass_max_abs_diff

    scenes = [Scene(make_image_bytes(0), "open the door"), Scene(make_image_bytes(1), "x" * 70)]
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    got = ref + np.array([0.1, -0.5, 0.2, 0.0])
    worst, p95, where = diff_summary(got, ref, scenes, ("scene", "text"))
    assert worst == pytest.approx(0.5) and p95 == pytest.approx(0.455)
    assert where == f"scene 1 (with its image): {'x' * 60 + '…'!r}"
    _, _, last = diff_summary(ref + np.array([0, 0, 0, -1.0]), ref, scenes, ("scene", "text"))
    assert last == "scene 1 (request only): 'x" + "x" * 59 + "…'"
    # per pass: the scene pass 0.1, 0.5; the request-only pass 0.2, 0
    by_pass = pass_max_abs_diff(got, ref, ("scene", "text"))
    assert by_pass == pytest.approx({"scene": 0.5, "text": 0.2})
    m = MemberVerification("m", "int8", 4, worst, 1.0, 1.0, 0.25, 0.9, p95, where)
    assert not m.ok and "p95 |Δs|=0.455; max at scene 1 (with its image)" in str(m)
    first, second = str(m).splitlines()  # the second line starts under the first's max|Δs|
    assert second.index("p95") == first.index("max|Δs|")
    m = MemberVerification(
        "m", "int8", 4, worst, 1.0, 1.0, 0.25, 0.9, p95, where, max_abs_diff_by_pass=by_pass
    )
    assert str(m).splitlines()[1].endswith("; max|Δs| by pass: scene 0.5, text 0.2")


def test_the_rank_check_counts_one_input_once() -> None:
    """A world's request-only pass scores each contrast's request once per scene: the same
    prompt, which differently batched runs score 1e-6 apart on either side, and plain
    Spearman counted that noise as a reordering (an fp32 bundle, max |Δs| 1.9e-5, got 0.994
    on a 32-scene world table and failed its 0.999). The copies of one input are one score;
    the order between inputs is still checked."""
    from scipy.stats import spearmanr
    from spotstop.export.verify import pass_spearman, score_inputs, spearman
    from spotstop.guard import Scene

    requests = ["a", "a", "b", "b", "c", "c"]
    scenes = [Scene(image=b"", request=r) for r in requests]
    inputs = score_inputs(scenes, ("scene", "text"))
    assert inputs[:6] == [("scene", i) for i in range(6)]
    assert inputs[6:] == [("text", r) for r in requests]
    assert score_inputs(scenes[:2], ("gray",)) == [("gray", "a"), ("gray", "a")]
    scene = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    ref_text = np.array([-3.0, -3.0 + 1e-6, -1.0, -1.0, 2.0 - 1e-6, 2.0])  # noise in the reference
    got_text = np.array([-3.0 + 1e-6, -3.0, -1.0 + 1e-6, -1.0, 2.0, 2.0])  # and in the bundle
    ref, got = np.r_[scene, ref_text], np.r_[scene, got_text]
    plain = pass_spearman(got, ref, ("scene", "text"))
    assert plain[2]["text"] == pytest.approx(spearmanr(got_text, ref_text).statistic)
    assert plain[0] < 0.999
    rho, varies, by_pass = pass_spearman(got, ref, ("scene", "text"), inputs)
    assert (
        varies
        and rho == pytest.approx(1.0)
        and by_pass == pytest.approx({"scene": 1.0, "text": 1.0})
    )
    # by hand: one input's copies are their mean, so the text pass ranks (-3, -1, 2) against
    # the bundle's means; a swap between inputs still counts
    swapped = np.array([2.0, 2.0, -1.0, -1.0, -3.0, -3.0])
    rho2, _, by2 = pass_spearman(np.r_[scene, swapped], ref, ("scene", "text"), inputs)
    assert by2["text"] == pytest.approx(spearman([2.0, -1.0, -3.0], [-3.0, -1.0, 2.0])) == -1.0
    assert rho2 == -1.0
    # a bundle whose copies differ where the reference's inputs do not vary owes no rank
    flat = pass_spearman(got, np.r_[scene, np.full(6, 1.0)], ("scene", "text"), inputs)
    assert flat[2]["scene"] == pytest.approx(1.0) and math.isnan(flat[2]["text"])
