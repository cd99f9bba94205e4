"""The cost model (export/cost.py): FLOPs against torch's FLOP counter, parameters against the
model, a bundle's real token counts, the real pair at the paper's settings, measured / bound.

The independent count is ``torch.utils.flop_counter.FlopCounterMode`` over the scoring graphs'
torch forward (export/graphs.py: the vision graph and the decoder graph the bundle exports), on
the tiny pair. Like is compared with like:

* attention runs with transformers' eager implementation (matmuls): the counter has no formula
  for the CPU kernel of ``scaled_dot_product_attention`` (``_scaled_dot_product_flash_attention_for_cpu``)
  and would count no attention at all; eager computes the same full L x L scores and values;
* Qwen3.5's Gated-DeltaNet takes the branch transformers takes when exporting
  (``is_torchdynamo_exporting()`` true: the UT transform as a forward substitution, then two
  C x C matrix products), which is what the exported ONNX graph runs; in eager mode it would
  call ``torch.linalg.solve_triangular``, which the counter does not count;
* SigLIP2's attention-pooling head is switched off: the scoring graph never reads it (the ONNX
  export drops it) and the cost model does not count it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.export.cost import (
    COST_MODELS,
    DEVICES,
    Workload,
    bundle_cost,
    measured_latencies,
    member_cost,
    real_pair_cost,
    report,
    roofline,
    stored_weight_bytes,
)
from spotstop.export.cost_data import PAPER_TFLOPS

from tests._support import REPO_ROOT
from tests._support.pair import by_arch

ROOT = REPO_ROOT


def test_every_registered_architecture_has_a_cost_model() -> None:
    from spotstop.export.configs import EXPORT_CONFIGS

    assert set(COST_MODELS) == set(EXPORT_CONFIGS)


def _counted(arch: str, tiny_pair: Path, monkeypatch: pytest.MonkeyPatch, length_pad: int) -> Any:
    """(torch's vision FLOPs, torch's decoder FLOPs, our MemberCost) for one scene."""
    torch = pytest.importorskip("torch")
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen
    from spotstop.export.configs import get_export_config
    from spotstop.export.graphs import build_graphs
    from spotstop.guard import load_member
    from spotstop.guard.backends._graphs import decoder_feeds
    from torch.utils.flop_counter import FlopCounterMode

    monkeypatch.setattr(qwen, "is_torchdynamo_exporting", lambda: True)
    m: Any = load_member(tiny_pair / f"tiny-{arch}")
    model = m.backend.model
    model.set_attn_implementation("eager")
    # FlopCounterMode's module tracker hooks module outputs that require grad. With
    # transformers 5.25.0 (whose `kernels` layer wrapper runs Qwen3.5's norms) that hook raised
    # "Expected gradient function to be set" under no_grad. Counting needs no gradients.
    model.requires_grad_(False)
    if arch == "lfm2_vl":
        model.model.vision_tower.use_head = False
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
    prompt = m.prompt_ids("pick up the knife and hand it to the child", "scene")
    length = len(prompt) + plan.max_row_len + length_pad
    feeds = decoder_feeds([prompt], plan, length)
    rows = len(plan.rows)
    with torch.no_grad():
        with FlopCounterMode(display=False) as fv:
            emb = vis(torch.from_numpy(m._gray()["pixel_values"]))
        with FlopCounterMode(display=False) as fd:
            dec(
                torch.from_numpy(feeds["input_ids"]),
                emb.repeat(rows, 1, 1),
                *(torch.from_numpy(feeds[k]) for k in ("last_index", "read_index", "read_token")),
            )
    config = json.loads((tiny_pair / f"tiny-{arch}" / "config.json").read_text())
    w = Workload(
        images=((g.height // g.patch_size, g.width // g.patch_size),),
        seq_len=length,
        n_seqs=rows,
        first_rows=len(plan.first_ids),
        read_rows=int(feeds["read_index"].shape[1]),
    )
    return fv.get_total_flops(), fd.get_total_flops(), member_cost(arch, config, w), model


@pytest.mark.parametrize("arch", by_arch())
def test_flops_match_torch_flop_counter_on_the_tiny_pair(
    arch: str, tiny_pair: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within 1 % (the formulas count exactly what the counter does: equal here), at the
    prompt's own length and right-padded past the next Gated-DeltaNet chunk (a bucket)."""
    for pad in (0, 70):
        vision, decoder, ours, _ = _counted(arch, tiny_pair, monkeypatch, pad)
        assert vision > 0 and decoder > 0
        assert abs(ours.vision - vision) <= 0.01 * vision, (pad, ours.vision_flops, vision)
        assert abs(ours.decoder - decoder) <= 0.01 * decoder, (pad, ours.decoder_flops, decoder)
        total = vision + decoder
        assert abs(ours.total - total) <= 0.01 * total


@pytest.mark.parametrize("arch", by_arch())
def test_parameter_counts_match_the_model(
    arch: str, tiny_pair: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every parameter, and the matrix-multiply weights, equal the torch model's."""
    torch = pytest.importorskip("torch")
    from spotstop.guard import load_member

    m: Any = load_member(tiny_pair / f"tiny-{arch}")
    model = m.backend.model
    config = json.loads((tiny_pair / f"tiny-{arch}" / "config.json").read_text())
    p = COST_MODELS[arch].params(config)
    unique = {id(x): x for x in model.parameters()}.values()
    assert p.total == sum(x.numel() for x in unique)
    linear = {
        id(mod.weight): mod.weight.numel()
        for mod in model.modules()
        if isinstance(mod, torch.nn.Linear)
        and mod.weight is not model.get_input_embeddings().weight
    }
    heads = [
        mod
        for mod in model.modules()
        if isinstance(mod, torch.nn.MultiheadAttention)  # SigLIP2's pooling head
    ]
    mha = sum(h.in_proj_weight.numel() for h in heads)
    assert p.vision_linear + p.text_linear + p.head == sum(linear.values()) + mha
    assert p.embed == model.get_input_embeddings().weight.numel()
    read = p.total - sum(p.unused)  # SigLIP2's pooling head: in the checkpoint, never read
    assert p.bytes("fp16") == 2 * read
    assert p.bytes("fp32") == 4 * read
    assert p.bytes("int4") < p.bytes("int8") < p.bytes("fp16")


def test_bundle_cost_uses_the_bundles_prompt_and_runs_without_torch(
    tiny_pair: Path, tmp_path: Path
) -> None:
    from spotstop.export.bundle import write_bundle
    from spotstop.guard import load_member

    b = write_bundle(
        [tiny_pair / "tiny-qwen3_5", tiny_pair / "tiny-lfm2_vl"], tmp_path / "b", copy_members=False
    )
    request = "open the oven door"
    pair = bundle_cost(b, request=request)
    for mc in pair.members:
        m: Any = load_member(tiny_pair / mc.name)
        plan = m.encoder.plan
        assert mc.workload.seq_len == len(m.prompt_ids(request, "scene")) + plan.max_row_len
        assert mc.visual_tokens == m.geometry.n_image_tokens
        assert mc.workload.n_seqs == len(plan.rows)
        assert mc.padded_len is None  # torch members run at their own length
    assert pair.test_pair
    assert pair.total == sum(mc.vision + mc.decoder for mc in pair.members)
    # the note says what the pair is, from its manifest (it said "tiny random members" of a
    # trained or real-size pair too)
    from spotstop.export.cost import TEST_PAIR_COST_NOTE, format_report, report
    from spotstop.guard._hf import describe_test_pair

    text = format_report(report(pair))
    assert f"{describe_test_pair(['tiny'])} {TEST_PAIR_COST_NOTE}" in text
    # the command on the base install: it imports neither torch nor transformers
    code = (
        "import sys\n"
        "from spotstop.cli import main\n"
        f"status = main(['cost', {str(b)!r}, '--json', '--request', {request!r}])\n"
        "bad = [k for k in ('torch', 'transformers', 'onnx', 'scipy') if k in sys.modules]\n"
        "print('IMPORTED', bad, file=sys.stderr)\n"
        "sys.exit(status or (3 if bad else 0))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["scene_flops"] == pair.total
    assert doc["paper_tflops"] == PAPER_TFLOPS
    assert set(doc["roofline"]) == set(DEVICES)


def test_cost_help_states_the_model() -> None:
    from spotstop.cli._root import build_parser

    parser = build_parser("cost")
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["cost"].format_help()  # type: ignore[attr-defined]
    for phrase in (
        "prefill only",
        "2 x multiply-adds",
        "output rows actually read",
        "--json",
        "teacher forcing",
        "roofline",
        "7.4",
        "16.8",
        "Gated-DeltaNet",
    ):
        assert phrase in text, phrase


def test_real_pair_at_the_papers_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from spotstop.cli import main

    low, default = real_pair_cost("low"), real_pair_cost("default")
    assert [m.visual_tokens for m in low.members] == [256, 64]
    assert [m.visual_tokens for m in default.members] == [1024, 1280]
    assert 0 < low.total < default.total
    # the recorded configs' parameter counts (jetson/memory_budget.py counts them with
    # transformers on the meta device: 2.21 B and 3.15 B)
    assert [round(m.params.total / 1e9, 2) for m in low.members] == [2.21, 3.15]
    assert main(["cost", "--real", "--device", "L4"]) == 0
    out = capsys.readouterr().out
    assert "7.4 TFLOPs" in out and "16.8 TFLOPs" in out and "L4" in out
    assert main(["cost", "--real", "--setting", "low", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setting"] == "low" and doc["scene_flops"] == low.total
    assert main(["cost"]) == 2
    assert main(["cost", "--real", "--results", "/nope/RESULTS.md"]) == 2
    assert "--results '/nope/RESULTS.md' is not a file" in capsys.readouterr().err


def test_cost_reads_measured_latencies_only_from_a_file_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Product code reads no development file: run from a checkout, `spotstop cost --real`
    leaves bench/RESULTS.md alone unless --results names it."""
    from spotstop.cli import main

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "RESULTS.md").write_text(
        "### 2026-01-01 — NVIDIA L4 — python bench/gpu.py\n\n"
        "| member | step | figure | value | unit |\n| --- | --- | --- | --- | --- |\n"
        "| Qwen3.5-2B | trt | median latency | 12.5 | ms |\n"
        "| Qwen3.5-2B | trt | prompt length | 300 | tokens |\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["cost", "--real", "--setting", "low", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured"] == []
    argv = ["cost", "--real", "--setting", "low", "--json", "--results", "bench/RESULTS.md"]
    assert main(argv) == 0
    assert [r["ms"] for r in json.loads(capsys.readouterr().out)["measured"]] == [12.5]


def test_roofline_is_the_larger_of_compute_and_memory() -> None:
    r = roofline(989e12, 4.8e9, "H200", "fp16")
    assert r["compute_s"] == pytest.approx(1.0) and r["memory_s"] == pytest.approx(1e-3)
    assert r["bound_s"] == r["compute_s"]
    r = roofline(1e9, 68e9, "Orin Nano 8GB", "int8")
    assert r["bound_s"] == r["memory_s"] == pytest.approx(1.0)
    for d in DEVICES.values():
        assert d["int8_tops"] == pytest.approx(2 * d["fp16_tflops"], rel=0.01)
        assert d["source"]


def test_roofline_names_what_it_cannot_bound_and_covers_int4_trt() -> None:
    """A misspelt device or a precision without a peak raised a bare KeyError, and int4-trt
    (the Jetson deploy path: float16 GEMMs on dequantized blocks) had no roofline at all;
    negative counts gave a negative bound."""
    assert roofline(989e12, 0.0, "H200", "int4-trt") == roofline(989e12, 0.0, "H200", "fp16")
    with pytest.raises(ValueError, match=r"device must be one of .*'Orin Nano 8GB'"):
        roofline(1.0, 1.0, "Orin Nano", "fp16")
    with pytest.raises(ValueError, match="precision 'fp32' has no roofline peak"):
        roofline(1.0, 1.0, "L4", "fp32")
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="flops must be a finite number"):
            roofline(bad, 1.0, "L4", "fp16")
        with pytest.raises(ValueError, match="weight_bytes must be a finite number"):
            roofline(1.0, bad, "L4", "fp16")


def test_a_results_row_that_is_not_a_number_is_not_read(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "### 2026-12-01 — NVIDIA H200 — bench/gpu.py\n\n"
        "| member | step | figure | value | unit |\n| --- | --- | --- | ---: | --- |\n"
        "| Qwen3.5-2B | torch | median latency | 1.2.3 | ms/scene |\n"
        "| Qwen3.5-2B | ort | median latency | 8.05e1 | ms/scene |\n",
        encoding="utf-8",
    )
    recs = measured_latencies(results, lambda sec: True)  # raised ValueError on '1.2.3'
    assert [(r["step"], r["ms"]) for r in recs] == [("ort", 80.5)]


def test_measured_over_bound_from_results_md(tmp_path: Path) -> None:
    """A bench/gpu.py section (real dimensions, on the H200) gives measured / bound."""
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# results\n\n"
        "### 2026-12-01 — NVIDIA H200 — bench/gpu.py --tiny\n\n"
        "| member | step | figure | value | unit |\n| --- | --- | --- | ---: | --- |\n"
        "| tiny-qwen3_5 | torch | median latency | 5.0 | ms/scene |\n\n"
        "### 2026-12-01 — NVIDIA H200 — bench/gpu.py\n\n"
        "| member | step | figure | value | unit |\n| --- | --- | --- | ---: | --- |\n"
        "| Qwen3.5-2B | torch | median latency | 80.5 | ms/scene |\n"
        "| Qwen3.5-2B | torch | prompt length | 330 | tokens (median) |\n"
        "| LFM2.5-VL-3B | ort | median latency | 900 | ms/scene |\n",
        encoding="utf-8",
    )
    from spotstop.export.cost import bench_member_cost

    recs = measured_latencies(results, lambda sec: "--tiny" not in sec.splitlines()[0])
    assert [(r["member"], r["step"], r["ms"], r["device"]) for r in recs] == [
        ("Qwen3.5-2B", "torch", 80.5, "H200"),
        ("LFM2.5-VL-3B", "ort", 900.0, "H200"),
    ]
    doc = report(real_pair_cost("low"), measured=recs, bound_for=bench_member_cost)
    (r,) = doc["measured"]  # LFM2.5-VL-3B has no prompt length: not costed
    assert r["member"] == "Qwen3.5-2B" and r["ratio"] == pytest.approx(80.5 / r["bound_ms"])
    assert r["bound_ms"] > 0
    assert measured_latencies(tmp_path / "missing.md", lambda s: True) == []


def test_onnx_bundle_cost_runs_as_onnxruntime_does_and_weighs_what_the_export_wrote(
    member_fp32_bundles: Any, tmp_path: Path
) -> None:
    """An exported member: a dynamic-length decoder runs at the prompt's own length on
    onnxruntime (no padded figure); a per-bucket decoder at its bucket; at least one full
    vocabulary row read, and the weight bytes the export recorded (within 1 %: the graph
    holds the position table resized to its grid and the two first-token rows besides)."""
    import shutil

    import yaml

    b = member_fp32_bundles("lfm2_vl")
    (m,) = bundle_cost(b).members
    assert m.precision == "fp32" and m.padded_len is None and m.padded_flops is None
    assert m.workload.read_rows >= 1
    # the same member as a per-bucket (fixed-length) decoder runs at its bucket
    fixed = tmp_path / "fixed"
    shutil.copytree(b, fixed)
    [graphs] = list(fixed.rglob("spotstop_onnx.yaml"))
    meta = yaml.safe_load(graphs.read_text())
    meta["decoder"]["fixed_length"] = True
    graphs.write_text(yaml.safe_dump(meta))
    (p,) = bundle_cost(fixed).members
    assert p.padded_len is not None and p.padded_len >= p.workload.seq_len
    assert p.padded_flops is not None and p.padded_flops >= p.total == m.total
    assert m.bundle_weight_bytes is not None
    assert abs(m.weight_bytes("fp32") - m.bundle_weight_bytes) <= 0.01 * m.bundle_weight_bytes


@pytest.mark.parametrize("arch", ["qwen3_5", "lfm2_vl"])
def test_the_image_ends_the_cost_model_counts_are_the_exports(
    arch: str, member_fp32_bundles: Any, tiny_pair: Path
) -> None:
    """``Params.vision_ends`` (what int8 and int4 store at 4 B) equals the weights the export's
    own rule (export/weights.py ``image_end_weights``) finds in the tiny member's vision graph."""
    import onnx
    from spotstop.export.weights import (
        fold_weight_transposes,
        gemms_to_matmuls,
        image_end_weights,
    )

    (vision,) = member_fp32_bundles(arch).rglob("vision.onnx")
    model = onnx.load(str(vision))
    fold_weight_transposes(model)  # the graph as the quantizers see it (precision._prepare)
    gemms_to_matmuls(model)
    ends = image_end_weights(model)
    assert ends, "the vision graph has no image ends"
    dims = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    config = json.loads((tiny_pair / f"tiny-{arch}" / "config.json").read_text())
    assert COST_MODELS[arch].params(config).vision_ends == sum(dims[n] for n in ends)


def test_image_ends_are_stored_at_four_bytes_where_the_precision_keeps_them_float32() -> None:
    """The one bytes rule (stored_weight_bytes) and the precision registry agree: moving a
    weight into the ends costs 3 B more at int8 (1 B + scales → 4 B), nothing at fp32."""
    from spotstop.export.precision import PRECISION_SPECS

    kw = {"linear": 10_000.0, "table": 0.0, "other": 0.0, "tied": False}
    for name, spec in PRECISION_SPECS.items():
        base = stored_weight_bytes(name, **kw)
        ends = stored_weight_bytes(name, **kw, image_ends=1000)
        per = spec.weight_bytes["linear"]
        want = base + 1000 * (4.0 - per) if spec.float32_image_ends else base
        assert ends == pytest.approx(want), name
    assert PRECISION_SPECS["int8"].float32_image_ends and PRECISION_SPECS["int4"].float32_image_ends
    assert not PRECISION_SPECS["fp32"].float32_image_ends
    with pytest.raises(ValueError, match="image_ends"):
        stored_weight_bytes("int8", **kw, image_ends=20_000)
