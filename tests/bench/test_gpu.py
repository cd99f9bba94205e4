"""bench/gpu.py, the GPU benchmark: its tiny CPU mode, its report, and random real-shape members.

The GPU run itself happens on a lent machine (see the script's docstring); here the same code
path runs on the tiny TEST pair on the CPU, with the GPU-only steps skipped with a reason.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._support import REPO_ROOT
from tests._support.bench import load_bench

ROOT = REPO_ROOT
SCRIPT = ROOT / "bench" / "gpu.py"
STEPS = ("build", "torch", "export", "ort", "trt")


def _bench() -> Any:
    return load_bench("gpu", "bench_gpu")


def test_help_explains_the_steps_and_the_exit_status() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for word in ("--tiny", "--device", "--budget-s", "--step-budget", "exit status", *STEPS):
        assert word in out.stdout


def test_report_shows_only_measured_figures_and_every_reason() -> None:
    gpu = _bench()
    report = {
        "command": "PYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT",
        "tiny": False,
        "seed": 0,
        "dtype": "bfloat16",
        "bucket": 512,
        "scenes": 8,
        "repeat": 3,
        "budget_s": 420.0,
        "wall_s": 400.0,
        "env": {
            "date_utc": "2026-12-01T10:00:00Z",
            "python": "3.12.3",
            "platform": "Linux x86_64",
            "cpu_count": 16,
            "ram_gib": 125.0,
            "device": "cuda",
            "versions": {"torch": "2.11.0", "transformers": "5.24.0", "onnx": "1.23.1"},
            "torch_cuda": "13.0",
            "gpu": {"name": "NVIDIA H200", "memory_gib": 139.8},
            "ort_providers": ["CPUExecutionProvider"],
        },
        "records": [
            {
                "member": "M",
                "step": "export",
                "status": "ok",
                "figures": [{"name": "max |Δ| vs torch", "value": 0.5, "unit": "logit"}],
            },
            {"member": "M", "step": "trt", "status": "skipped", "reason": "no tensorrt"},
        ],
    }
    md = gpu._markdown(report)
    assert "```bash\nPYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT\n```" in md
    assert "NVIDIA H200" in md and "torch 2.11.0 (CUDA 13.0)" in md
    assert "tensorrt: not installed" in md
    assert "| M | export | max \\|Δ\\| vs torch | 0.5 | logit |" in md  # pipes escaped
    assert "- M trt (skipped): no tensorrt" in md
    assert "| M | trt |" not in md


def test_step_budgets_per_step_and_per_member() -> None:
    gpu = _bench()
    b = gpu._parse_budgets(["export=30", "tiny-qwen3_5:export=3"], True)
    assert gpu._member_budgets(b, "tiny-qwen3_5")["export"] == 3
    assert gpu._member_budgets(b, "tiny-lfm2_vl")["export"] == 30
    for bad in ("export", "nope=3", "export=-1", "export=x"):
        with pytest.raises(SystemExit):
            gpu._parse_budgets([bad], True)


#: per architecture: (text_config, vision_config, top-level) changes that shrink a recorded
#: real config (a registered architecture without an entry fails the random-member test)
_SHRINK: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "qwen3_5": (
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
        {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "out_hidden_size": 64,
        },
        {},
    ),
    "lfm2_vl": (
        {
            "block_ff_dim": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
        {"projector_hidden_size": 64},
    ),
}


def _shrunk(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded real config with its widths and depths shrunk (same keys, same classes)."""
    r = copy.deepcopy(recorded)
    text, vision, top = _SHRINK[r["model_type"]]
    t = r["text_config"]
    t.update(vocab_size=1024, hidden_size=64, intermediate_size=128, **text)
    t["layer_types"] = t["layer_types"][: text["num_hidden_layers"]]
    r["vision_config"].update(vision)
    r.update(top)
    return r


def test_random_member_from_a_recorded_config(tmp_path: Path) -> None:
    """build_random_member takes jetson/memory_budget.py's configs and builds a loadable member."""
    pytest.importorskip("torch")
    from spotstop.export.scenes import demo_scenes
    from spotstop.export.tiny import build_random_member, tree_digest
    from spotstop.guard import load_member

    recorded = _bench()._budget_module().RECORDED
    for name, rec in recorded.items():
        cfg = _shrunk(rec)
        path = build_random_member(rec["model_type"], cfg, tmp_path / name, seed=3)
        written = json.loads((path / "config.json").read_text())
        assert written["model_type"] == rec["model_type"]
        assert written["text_config"]["vocab_size"] == 1024
        assert written["text_config"]["layer_types"] == cfg["text_config"]["layer_types"]
        assert "mean nothing" in (path / "SPOTSTOP_TEST_PAIR.txt").read_text()
        assert cfg == _shrunk(rec)  # the caller's config is not modified
        m = load_member(path)
        # the default budgets: Qwen3.5 256 tokens (512x512), LFM2-VL 64 (256x256)
        assert m.info.test_pair and m.info.test_pair_kind == "random"
        assert "members at real dimensions" in m.info.test_pair_note  # not "tiny members"
        assert m.info.n_image_tokens == {"qwen3_5": 256, "lfm2_vl": 64}[rec["model_type"]]
        [r] = m.score(demo_scenes(1, seed=1))
        assert r.test_pair
        again = build_random_member(rec["model_type"], cfg, tmp_path / f"{name}-2", seed=3)
        assert tree_digest(again) == tree_digest(path)
    with pytest.raises(ValueError, match="model_type"):
        build_random_member("lfm2_vl", recorded["Qwen3.5-2B"], tmp_path / "x")


@pytest.mark.slow
def test_tiny_cpu_run_reports_figures_and_reasons(tmp_path: Path) -> None:
    """The whole script on the tiny pair on the CPU: every step is measured or skipped with a
    reason (TensorRT: no GPU; the Qwen3.5 export: its 3 s budget), exit 0, JSON + markdown."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--scenes",
        "2",
        "--repeat",
        "1",
        "--budget-s",
        "500",
        "--step-budget",
        "export=300",
        "--step-budget",
        "tiny-qwen3_5:export=3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=800, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "markdown section for bench/RESULTS.md" in proc.stdout

    report = json.loads((out / "gpu_bench.json").read_text())
    assert report["command"].startswith("PYTHONUNBUFFERED=1 python3 bench/gpu.py --tiny")
    env = report["env"]
    for key in ("torch", "transformers", "onnx", "onnxruntime"):
        assert env["versions"][key]
    assert env["date_utc"] and env["device"] == "cpu"
    recs = {(r["member"], r["step"]): r for r in report["records"]}
    assert len(recs) == len(report["records"]) == 2 * len(STEPS)
    for r in report["records"]:
        assert r["status"] in ("ok", "skipped"), r
        if r["status"] == "skipped":
            assert r["reason"], r
            assert not r.get("figures"), r
        else:
            assert r["figures"], r
            for f in r["figures"]:
                assert f["name"] and f["unit"] and f["value"] is not None
    for m in ("tiny-qwen3_5", "tiny-lfm2_vl"):
        assert recs[(m, "build")]["status"] == "ok"
        torch_figs = {f["name"]: f for f in recs[(m, "torch")]["figures"]}
        assert torch_figs["median latency"]["unit"] == "ms/scene"
        assert torch_figs["median latency"]["value"] > 0
    lfm = "tiny-lfm2_vl"
    assert "CUDA" in recs[(lfm, "trt")]["reason"]
    assert recs[(lfm, "export")]["status"] == "ok"
    ort_names = [f["name"] for f in recs[(lfm, "ort")]["figures"]]
    assert "CPUExecutionProvider median latency" in ort_names
    assert "time budget" in recs[("tiny-qwen3_5", "export")]["reason"]
    for step in ("ort", "trt"):  # nothing to run them on
        assert "not reached" in recs[("tiny-qwen3_5", step)]["reason"]

    md = (out / "gpu_bench.md").read_text()
    assert report["command"] in md
    for needle in (
        "- date: ",
        "- GPU: none",
        "- versions: ",
        "torch ",
        "transformers ",
        "onnxruntime ",
    ):
        assert needle in md
    assert "| member | step | figure | value | unit |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| tiny-")]
    assert len(rows) == sum(len(r.get("figures") or []) for r in report["records"])
    assert not any(ln.startswith("| tiny-qwen3_5 | export |") for ln in rows)
    assert "- tiny-qwen3_5 export (skipped): time budget" in md
    assert (out / "gpu_bench.log").read_text().count("[tiny-lfm2_vl] export: ok") == 1
