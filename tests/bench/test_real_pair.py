"""bench/real_pair.py's report and bench/_results.py's sections of bench/RESULTS.md.

The run itself (an hour of a 24 GB workstation at the real dimensions) is not a test; its
figures are in bench/RESULTS.md. Here: what it writes from the figures it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._support import REPO_ROOT
from tests._support.bench import load_bench

ROOT = REPO_ROOT


def _load(name: str) -> Any:
    return load_bench(name)


def test_sections_are_rewritten_in_place_and_others_kept(tmp_path: Path) -> None:
    results = _load("_results")
    f = tmp_path / "RESULTS.md"
    results.write_section(f, "gpu", "### GPU one")
    results.write_section(f, "cpu-real", "## CPU one")
    results.write_section(f, "gpu", "### GPU two")
    text = f.read_text(encoding="utf-8")
    assert text.startswith("# Benchmark results")
    assert "GPU one" not in text and text.count("GPU two") == 1 and "CPU one" in text
    assert text.index("GPU two") < text.index("CPU one")  # the section stays where it was


def test_seconds_under_a_tenth_print_in_milliseconds() -> None:
    """The tiny pair's scenes take a few milliseconds: ``0.01 s`` would hide the medians the
    ratios are computed from."""
    s = _load("real_pair")._s
    assert s(2.5) == "2.50 s" and s(0.1) == "0.10 s"
    assert s(0.0076) == "7.6 ms" and s(0.00045, 3) == "0.45 ms" and s(0.02, 1) == "20.0 ms"
    assert s(None) == "n/a"


def test_report_shows_failures_ratios_and_bytes_against_the_budget() -> None:
    rp = _load("real_pair")
    gib = 2**30
    res: dict[str, Any] = {
        "environment": {"date": "d", "cores": 2, "ram_gib": 23.5, "versions": {"torch": "x"}},
        "argv": "--work w",
        "export": {
            "int8": {
                "rc": 0,
                "seconds": 600.0,
                "peak_rss_bytes": 18 * gib,
                "members": [
                    {
                        "name": "M",
                        "seconds": 300.0,
                        "peak_rss_bytes": 9 * gib,
                        "streamed": True,
                        "file_bytes": 3 * gib,
                        "predicted_bytes": 2 * gib,
                    }
                ],
            },
            "int4": {
                "rc": 1,
                "seconds": 300.0,
                "peak_rss_bytes": gib,
                "error": "UserWarning: noise\nspotstop export: export of N failed validation\n"
                "  [int4] decoder.onnx score (scene@L195): max|Δ| = 2.41 > atol 1",
                "alone": {
                    "M": {
                        "rc": 0,
                        "bundle": "w/bundle-int4-M",
                        "seconds": 120.0,
                        "peak_rss_bytes": 8 * gib,
                        "members": [
                            {
                                "name": "M",
                                "seconds": 110.0,
                                "peak_rss_bytes": 8 * gib,
                                "streamed": True,
                                "file_bytes": gib,
                                "predicted_bytes": gib,
                                "quantizer": {
                                    "method": "gptq",
                                    "weights": {"gptq": 40, "round_to_nearest": 2},
                                },
                            }
                        ],
                    },
                    "N": {"rc": 1, "seconds": 60.0, "error": "spotstop export: N failed"},
                },
            },
        },
        "latency": {
            "M": {
                "torch eager fp32": {
                    "rc": 0,
                    "times_s": [4.0, 6.0, 5.0],
                    "first_s": 9.0,
                    "tokens": [300, 300, 300],
                    "peak_rss_bytes": 9 * gib,
                },
                "onnxruntime int8": {
                    "rc": 0,
                    "times_s": [2.0, 2.5, 3.0],
                    "first_s": 3.0,
                    "tokens": [300, 300, 300],
                    "peak_rss_bytes": 4 * gib,
                },
                "onnxruntime int4": {"rc": 1, "error": "no"},
            }
        },
    }
    md = rp.render(res)
    assert "| int8 | M | rtn | 300 s | 9.00 GiB | yes | 3.00 GiB | 2.00 GiB | 1.500 |" in md
    assert "**10.0 min**" in md
    # the pair failed at int4: each member alone; the reason without the exporter's warnings
    assert "| int4 | the pair: FAILED (exit 1) | | 5.0 min |" in md
    assert (
        "| int4 | M | gptq (40 of 42 weights) | 110 s | 8.00 GiB | yes | 1.00 GiB | 1.00 GiB | 1.000 |"
        in md
    )
    assert "| int4 | **M alone** (whole command) | | **2.0 min** |" in md
    assert "| int4 | N alone: FAILED (exit 1) | | 1.0 min |" in md
    assert "- int4, the pair: spotstop export: export of N failed validation; [int4] " in md
    assert "UserWarning" not in md
    # medians 5.0 s and 2.5 s: torch / onnxruntime = 2.00x
    assert (
        "| M | onnxruntime int8 | 2.50 s | 2.00 s | 3.0 s | 300 | n/a | 4.00 GiB | 2.00x | n/a | "
        "n/a | n/a |" in md
    )
    assert "| M | onnxruntime int4 | FAILED |" in md
    assert "verify-bundle" not in md  # no verify figures held: no verify table
    # a record without its run's stamp (from before the stamps): the store's commands
    assert "Measured by `python bench/real_pair.py --work w`; 2 cores, 23.5 GiB RAM, torch x." in md
    stamp = {
        "command": "--work w --steps latency",
        "started": "t1",
        "environment": {"cores": 16, "ram_gib": 64, "versions": {"onnxruntime": "y"}},
    }
    res["latency_run"] = {"run": stamp}
    assert (
        "Measured by `python bench/real_pair.py --work w --steps latency` (t1); 16 cores, 64 GiB "
        "RAM, onnxruntime y. On the bundles that run's export wrote; a later export does not "
        "change this table." in rp.render(res)
    )
    # each command with the time it started, when recorded
    res["commands"], res["started"] = ["--work w --steps build", "--work w"], {"--work w": "t2"}
    md = rp.render(res)
    assert (
        "`python bench/real_pair.py --work w --steps build`, `python bench/real_pair.py --work w` (t2);"
        in md
    )
    # one section per precision and step: a run writes only what it measured
    keys = [k for k, _ in rp.sections(res)]
    assert keys == ["cpu-real", "cpu-real-export-int8", "cpu-real-export-int4", "cpu-real-latency"]
    # what each precision's bundles are: the pair's, else each member's own; never a stale one
    assert rp.bundles(res, "int4") == {"M": "w/bundle-int4-M"}
    assert rp.bundles(res, "int8") == {}  # the int8 record names no bundle folder: none used
    res["export"]["int8"]["bundle"] = "w/bundle-int8"
    assert rp.bundles(res, "int8") == {"M": "w/bundle-int8"}
    assert rp.bundles(res, "fp16") == {}


def _verified_member(**changed: Any) -> dict[str, Any]:
    """One member's row of a verify-bundle --json result."""
    m = {
        "name": "M",
        "n": 12,
        "max_abs_diff": 0.5,
        "tolerance": 1.0,
        "spearman": 0.95,
        "min_spearman": 0.8,
        "decision_agreement": 1.0,
        "ok": True,
    }
    return {**m, **changed}


def test_report_lists_every_verify_run_and_a_member_without_a_bundle() -> None:
    rp = _load("real_pair")
    member = _verified_member(max_abs_diff_by_pass={"scene": 0.5, "text": 0.125})
    one = {"rc": 0, "seconds": 60.0, "peak_rss_bytes": 2**30}
    res = {
        "verify": {
            "int4": {"runs": [{**one, "result": {"ok": True, "members": [member]}}]},
            "int8": {"rc": None, "error": "no bundle: its export failed (see the export table)"},
        },
        "latency": {"N": {"onnxruntime int4": {"rc": None, "error": "no bundle: failed"}}},
    }
    md = rp.render(res)
    assert (
        "| int4 | M | 12 | 0.500 | 1.0 | 0.950 | 0.8 | 1.00 | PASS | scene 0.500, text 0.125 |"
        in md
    )
    assert "| int8 | FAILED (no bundle: its export failed (see the export table)) |" in md
    assert "| N | onnxruntime int4 | no bundle: failed |" in md


def test_a_run_rewrites_only_the_sections_it_measured(tmp_path: Path) -> None:
    rp = _load("real_pair")
    member = _verified_member()
    env = {"cores": 2, "ram_gib": 23.5, "versions": {}}
    one = {
        "rc": 0,
        "seconds": 60.0,
        "peak_rss_bytes": 2**30,
        "result": {"ok": True, "members": [member]},
    }
    f = tmp_path / "RESULTS.md"
    first = {
        "verify": {
            p: {**one, "run": {"command": f"--p {p}", "started": "t1", "environment": env}}
            for p in ("int8", "int4")
        }
    }
    rp.write_results(first, f)
    # a later run with a fresh store measures int4 only: the int8 table stays as measured
    member4 = _verified_member(max_abs_diff=0.25)
    later = {
        "verify": {
            "int4": {
                **one,
                "result": {"ok": True, "members": [member4]},
                "run": {"command": "--p int4 again", "started": "t2", "environment": env},
            }
        }
    }
    rp.write_results(later, f)
    text = f.read_text(encoding="utf-8")
    assert "| int8 | M | 12 | 0.500 |" in text and "(t1)" in text
    assert "| int4 | M | 12 | 0.250 |" in text and "| int4 | M | 12 | 0.500 |" not in text
    assert "`python bench/real_pair.py --p int4 again` (t2)" in text
    assert text.index("int8 (torch") < text.index("int4 (torch")  # each section where it was


def test_a_run_keeps_the_sections_its_store_holds_but_it_did_not_measure(tmp_path: Path) -> None:
    """The member-folder table came from another store (both members built); this store
    recorded one member's build long ago and this run measured latency only: the folder
    table stays as RESULTS.md holds it."""
    rp = _load("real_pair")
    env = {"cores": 2, "ram_gib": 23.5, "versions": {}}
    f = tmp_path / "RESULTS.md"
    both = {
        "build": {
            n: {"rc": 0, "seconds": 64.0, "peak_rss_bytes": 2**30, "folder_bytes": 2**32}
            for n in ("Qwen3.5-2B", "LFM2.5-VL-3B")
        },
        "build_run": {"run": {"command": "--steps build", "started": "t0", "environment": env}},
    }
    rp.write_results(both, f)
    store = {
        "build": {"Qwen3.5-2B": {**both["build"]["Qwen3.5-2B"], "seconds": 58.0}},
        "build_run": {"run": {"command": "--steps build", "started": "t1", "environment": env}},
    }
    before = dict(rp.sections(store))
    store["latency_run"] = {"run": {"command": "--steps latency", "started": "t2"}}
    store["latency"] = {}
    rp.write_results(store, f, since=before)
    text = f.read_text(encoding="utf-8")
    assert "| LFM2.5-VL-3B | 64 s |" in text and "| Qwen3.5-2B | 64 s |" in text
    assert "| Qwen3.5-2B | 58 s |" not in text
    rp.write_results(store, f)  # without ``since``: every section the store renders
    assert "| LFM2.5-VL-3B | 64 s |" not in f.read_text(encoding="utf-8")


def test_last_json_skips_what_a_command_printed_before() -> None:
    rp = _load("real_pair")
    out = '[torch.onnx] Translate...\n{\n  "a": [\n    {\n      "b": 1\n    }\n  ]\n}\n'
    assert rp._last_json(out) == {"a": [{"b": 1}]}


def test_export_args_reach_the_export_command(tmp_path: Path, monkeypatch: Any) -> None:
    """``--export-args`` are passed on to ``spotstop export`` as separate arguments (shell
    quoting undone), after the step's own options; a failed export keeps its error."""
    import argparse

    rp = _load("real_pair")
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], log: Path, timeout_s: float | None = None) -> dict[str, Any]:
        seen.append(cmd)
        return {"cmd": cmd, "rc": 1, "seconds": 1.0, "peak_rss_bytes": 0, "stdout": ""}

    monkeypatch.setattr(rp, "_run", fake_run)
    args = argparse.Namespace(
        work=tmp_path, bucket=512, export_args="--calibration-scenes 16 --int4-int8 'none'"
    )
    log = tmp_path / "log"
    log.write_text("spotstop export: failed validation\n")
    rec = rp._export(args, "int4", ["Qwen3.5-2B"], tmp_path / "b", log)
    i = seen[0].index("--calibration-scenes")
    assert seen[0][i : i + 4] == ["--calibration-scenes", "16", "--int4-int8", "none"]
    assert seen[0].index("--precision") < seen[0].index("--calibration-scenes")
    assert rec["rc"] == 1 and "failed validation" in rec["error"]


def test_a_run_on_one_member_has_sections_of_its_own() -> None:
    """``--members Qwen3.5-2B``: its export, verify and latency sections are keyed by the
    member (the pair's sections stay as measured) and the export table says it ran alone."""
    rp = _load("real_pair")
    one = ["Qwen3.5-2B"]
    run = {"command": "--members Qwen3.5-2B", "started": "t", "environment": {}, "members": one}
    both = {**run, "members": ["Qwen3.5-2B", "LFM2.5-VL-3B"]}
    res: dict[str, Any] = {
        "export": {
            "int4": {"rc": 1, "seconds": 60.0, "error": "failed", "run": run},
            "int8": {"rc": 1, "seconds": 60.0, "error": "failed", "run": both},
        },
        "verify": {"int4": {"rc": None, "error": "no bundle", "run": run}},
    }
    keys = dict(rp.sections(res))
    assert set(keys) == {
        "cpu-real",
        "cpu-real-export-int4-Qwen3.5-2B",
        "cpu-real-export-int8",
        "cpu-real-verify-int4-Qwen3.5-2B",
    }
    assert "at int4 (Qwen3.5-2B alone, one command)" in keys["cpu-real-export-int4-Qwen3.5-2B"]
    # its rows name the member, not the pair
    assert "| int4 | Qwen3.5-2B alone: FAILED (exit 1) |" in keys["cpu-real-export-int4-Qwen3.5-2B"]
    assert "the pair" not in keys["cpu-real-export-int4-Qwen3.5-2B"]
    assert "| int8 | the pair: FAILED (exit 1) |" in keys["cpu-real-export-int8"]
    assert "at int8 (both members, one command)" in keys["cpu-real-export-int8"]


def _lat(times: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "rc": 0,
        "times_s": times,
        "first_s": 1.0,
        "tokens": [300] * len(times),
        "peak_rss_bytes": 2**30,
        **extra,
    }


def test_latency_has_bf16_ratios_floors_shares_and_the_goals() -> None:
    """torch fp32 and bf16 beside every precision (names as data), the ratio to each, the
    roofline floor with the arithmetic it assumed, the profiled shares and the goal lines."""
    rp = _load("real_pair")
    floor = {"compute_s": 0.5, "memory_s": 0.1, "bound_s": 0.5}
    shares = {
        "decoder": {
            "ms": {
                "linear layers": 60.0,
                "Gated-DeltaNet": 20.0,
                "short conv": 0.0,
                "attention": 10.0,
                "other": 10.0,
            },
            "total_ms": 100.0,
            "run_ms": 110.0,
        }
    }
    res: dict[str, Any] = {
        "latency": {
            "Qwen3.5-2B": {
                "torch eager fp32": _lat([14.0, 14.0, 14.0]),
                "torch eager bf16": _lat([3.0, 3.0, 3.0]),
                "onnxruntime int8-dq": _lat(
                    [1.0, 2.0, 3.0],
                    graph_s=[{"vision": 0.5, "decoder": 1.5}] * 3,
                    floor=floor,
                    arith="int8",
                    shares=shares,
                ),
            }
        },
        "latency_peaks": {
            "fp32_gflops": 100.0,
            "bf16_gflops": 400.0,
            "int8_gops": 300.0,
            "read_gbs": 25.0,
            "threads": 2,
            "shape": [383, 2048, 6144],
            "cpu": {"model": "AMD EPYC", "flags": ["avx512_vnni"]},
        },
    }
    md = rp.render(res)
    # median 2.0 s: fp32 14 / 2 = 7.00x, bf16 3 / 2 = 1.50x; floor 0.5 s (compute bound)
    assert (
        "| Qwen3.5-2B | onnxruntime int8-dq | 2.00 s | 1.00 s | 1.0 s | 300 | 1.50 s | 1.00 GiB | "
        "7.00x | 1.50x | 0.500 s (int8, c) | 4.0x |" in md
    )
    assert "| Qwen3.5-2B | torch eager bf16 | 3.00 s |" in md
    assert "fp32 100 GFLOP/s, bf16 400, int8 300 GOP/s; read 25.0 GB/s" in md
    assert (
        "| Qwen3.5-2B | onnxruntime int8-dq | decoder | 60 % | 20 % | 0 % | 10 % | 10 % | 100 ms |"
        in md
    )
    assert (
        "- Qwen3.5-2B onnxruntime int8-dq: 7.00x torch fp32 (≥ 7x: met); 1.50x torch bf16 "
        "(≥ 1.5x: met); 2.00 s a scene (≤ 1.5 s: not met)" in md
    )
    # the tiny trial: its own sections, its own goal
    res["tiny"] = True
    keys = [k for k, _ in rp.sections(res)]
    assert "cpu-tiny-latency" in keys and not any(k.startswith("cpu-real-") for k in keys)
    assert "onnxruntime int8-dq: 7.00x torch eager fp32 (goal ≥ 2x: met)" in rp.render(res)


def test_latency_precisions_default_to_every_bundle_the_export_wrote() -> None:
    import argparse

    rp = _load("real_pair")
    res = {
        "export": {
            "int8": {"rc": 0, "bundle": "w/b8", "members": [{"name": "M"}]},
            "int8-nbits": {"rc": 0, "bundle": "w/b8n", "members": [{"name": "M"}]},
            "int4": {"rc": 1, "alone": {"M": {"rc": 1}}},
        }
    }
    args = argparse.Namespace(precisions=["int4"], precisions_given=False)
    assert rp._latency_precisions(args, res) == ["int8", "int8-nbits"]
    args.precisions_given = True
    assert rp._latency_precisions(args, res) == ["int4"]


def test_the_int8_host_probe_is_not_timed_as_a_graph_of_the_bundle(
    committed_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The latency child logs and profiles the sessions of the bundle's graphs; the int8 host
    probe the ONNX backend runs before it opens an int8 member is not one of them (it showed
    as a graph ``int8_gemm_probe`` in the profile table)."""
    import onnxruntime as ort
    from spotstop.guard.backends._int8_probe import PROBE_FILE

    monkeypatch.setattr(ort, "InferenceSession", ort.InferenceSession)  # restored after
    rp = _load("real_pair")
    calls, sessions = rp._patch_sessions(None)
    ort.InferenceSession(str(PROBE_FILE), providers=["CPUExecutionProvider"])
    vision = committed_bundle / "members" / "tiny-lfm2_vl" / "onnx" / "vision.onnx"
    ort.InferenceSession(str(vision), providers=["CPUExecutionProvider"])
    assert [Path(p).name for p, _ in sessions] == ["vision.onnx"] and calls == []


def test_profiled_nodes_are_grouped_by_layer_kind() -> None:
    rp = _load("real_pair")
    idx = {
        # ours (dynamo exporter): module scopes in the node's metadata
        "node_linear_3": (
            "node_linear_3 ['', 'layers.0.linear_attn', 'layers.0.linear_attn.in_proj']",
            True,
        ),
        "node_matmul_4": ("node_matmul_4 ['', 'layers.0.linear_attn', 'matmul_4']", False),
        "node_matmul_9": ("node_matmul_9 ['', 'layers.3.self_attn', 'matmul_9']", False),
        # ours (LFM2, names with scopes)
        "/language_model/layers.0/conv/conv/Conv": (
            "/language_model/layers.0/conv/conv/Conv",
            False,
        ),
        "/vision_tower/encoder/layers.0/self_attn/MatMul": (
            "/vision_tower/encoder/layers.0/self_attn/MatMul",
            False,
        ),
    }
    c = rp.classify
    assert c("MatMulNBits", "node_linear_1_Q4", idx) == "linear layers"  # no metadata: by op
    assert c("DynamicQuantizeMatMul", "anything", idx) == "linear layers"
    assert c("MatMul", "node_linear_3", idx) == "linear layers"  # a weight, in linear_attn
    assert c("MatMul", "node_matmul_4", idx) == "Gated-DeltaNet"  # chunk product
    assert c("MatMul", "node_matmul_9", idx) == "attention"
    assert c("Conv", "/language_model/layers.0/conv/conv/Conv", idx) == "short conv"
    assert c("MatMul", "/vision_tower/encoder/layers.0/self_attn/MatMul", idx) == "attention"
    # the peer's names (onnxruntime-genai) and fused nodes: by operator and name
    assert (
        c("LinearAttention", "/model/layers.0/linear_attn/LinearAttention", {}) == "Gated-DeltaNet"
    )
    assert c("CausalConvWithState", "/model/layers.0/linear_attn/CausalConvWithState", {}) == (
        "Gated-DeltaNet"
    )
    assert c("CausalConvWithState", "/model/layers.0/conv/CausalConvWithState", {}) == "short conv"
    assert c("GroupQueryAttention", "/model/layers.3/attn/GroupQueryAttention", {}) == "attention"
    assert c("MatMul", "/model/layers.0/mlp/gate_proj/MatMul", {}) == "linear layers"
    assert c("Softmax", "x", {}) == "other"
    # only the last run of a profile counts (the first is the warm-up)
    ev = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        {
            "cat": "Node",
            "name": "node_matmul_4_kernel_time",
            "ts": 10,
            "dur": 9000,
            "args": {"op_name": "MatMul"},
        },
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
        {
            "cat": "Node",
            "name": "node_matmul_4_kernel_time",
            "ts": 210,
            "dur": 3000,
            "args": {"op_name": "MatMul"},
        },
        {"cat": "Node", "name": "node_matmul_4_fence_before", "ts": 211, "dur": 5000, "args": {}},
        {
            "cat": "Node",
            "name": "x_kernel_time",
            "ts": 220,
            "dur": 1000,
            "args": {"op_name": "MatMulNBits"},
        },
    ]
    sh = rp.profile_shares(ev, idx)
    assert sh["ms"]["Gated-DeltaNet"] == 3.0 and sh["ms"]["linear layers"] == 1.0
    assert sh["total_ms"] == 4.0 and sh["run_ms"] == 0.1


def test_peer_precision_tokens_and_feeds() -> None:
    import numpy as np

    rp = _load("real_pair")
    assert rp.peer_precision("int4") == "int4"
    assert rp.peer_precision("int8-nbits") == "int8"  # names as data: the first part
    assert rp.peer_precision("int4-trt") == "int4"
    assert rp.peer_precision("w4a16") is None
    res = {
        "latency": {
            "M": {
                "onnxruntime int8": {"rc": 0, "decoder_shapes": [[1, 390], [1, 380], [1, 385]]},
                "onnxruntime int4": {"rc": 0, "decoder_shapes": [[1, 383], [1, 386]]},
                "torch eager fp32": {"rc": 0},
            }
        }
    }
    assert rp._peer_tokens(res, "M") == (1, 385)  # the median call
    assert rp._peer_tokens(res, "N") is None

    class In:
        def __init__(self, name: str, type_: str, shape: list[Any]) -> None:
            self.name, self.type, self.shape = name, type_, shape

    feeds = rp.peer_feeds(
        [
            In("input_ids", "tensor(int64)", ["batch_size", "sequence_length"]),
            In("attention_mask", "tensor(int64)", ["batch_size", "total_sequence_length"]),
            In("position_ids", "tensor(int64)", [3, "batch_size", "sequence_length"]),
            In(
                "past_key_values.3.key",
                "tensor(float)",
                ["batch_size", 2, "past_sequence_length", 256],
            ),
            In("past.0.recurrent", "tensor(float)", ["batch_size", 16, 128, 128]),
        ],
        2,
        7,
    )
    assert feeds["input_ids"].shape == (2, 7) and feeds["attention_mask"].sum() == 14
    assert feeds["position_ids"].shape == (3, 2, 7) and feeds["position_ids"][2, 1, 6] == 6
    assert feeds["past_key_values.3.key"].shape == (2, 2, 0, 256)
    assert feeds["past.0.recurrent"].dtype == np.float32 and not feeds["past.0.recurrent"].any()


def _peer_step(
    rp: Any, work: Path, python: str, precisions: list[str], tokens: int
) -> dict[str, Any]:
    """real_pair's peer step on Qwen3.5-2B in ``work`` with the interpreter ``python``; its store."""
    import argparse

    args = argparse.Namespace(
        work=work,
        members=["Qwen3.5-2B"],
        peer_python=python,
        peer_precisions=precisions,
        peer_tokens=tokens,
        precisions=[],
        precisions_given=False,
        scenes=2,
        rebuild=False,
    )
    res: dict[str, Any] = {}
    rp.step_peer(args, res, work / "log")
    return res


def test_peer_step_without_the_genai_venv_says_why(tmp_path: Path) -> None:

    rp = _load("real_pair")
    res = _peer_step(rp, tmp_path, str(tmp_path / "no-venv" / "python"), ["int4", "w4a16"], 383)
    rows = res["peer"]["Qwen3.5-2B"]
    assert rows["int4"]["rc"] is None and "genai venv is missing" in rows["int4"]["error"]
    assert rows["int4"]["tokens"] == [1, 383]
    md = rp.render(res)
    assert "| Qwen3.5-2B | int4 | int4 | no peer interpreter at" in md
    assert "| Qwen3.5-2B | w4a16 | n/a |" in md
    assert "cpu-real-peer" in dict(rp.sections(res))


def test_peer_step_with_a_venv_that_cannot_import_the_builder_says_what_to_install(
    tmp_path: Path,
) -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec("onnxruntime_genai") is not None:
        pytest.skip("this interpreter has onnxruntime-genai: it would run the builder")
    rp = _load("real_pair")
    res = _peer_step(
        rp, tmp_path, sys.executable, ["int8"], 383
    )  # a real interpreter without the builder
    err = res["peer"]["Qwen3.5-2B"]["int8"]["error"]
    assert "cannot import onnxruntime_genai.models.builder" in err
    assert "pip install onnxruntime-genai onnx onnx_ir" in err and str(tmp_path / "log") in err
    assert "No module named" in (tmp_path / "log").read_text()  # the import's own error


def test_peer_rows_name_what_the_builder_emitted() -> None:
    rp = _load("real_pair")
    res: dict[str, Any] = {
        "latency": {
            "M": {"onnxruntime int4": _lat([1.0], graph_s=[{"vision": 0.2, "decoder": 0.8}])}
        },
        "peer": {
            "M": {
                "int4": {
                    "rc": 0,
                    "ours": "int4",
                    "peer_precision": "int4",
                    "tokens": [1, 383],
                    "build": {"seconds": 120.0, "peak_rss_bytes": 15 * 2**30, "rc": 0},
                    "times_s": [0.4, 0.4, 0.5],
                    "ops": {"MatMulNBits": 24, "MatMul": 6, "LinearAttention": 3},
                    "nbits": {"4": 24},
                    "accuracy_level": [4],
                    "block_size": [32],
                    "inputs": ["input_ids", "attention_mask", "position_ids"],
                    "shares": None,
                    "position_ids_fixed": True,
                }
            }
        },
    }
    md = rp.render(res)
    assert (
        "| M | int4 | int4 | MatMulNBits 4-bit x24, acc 4, block 32, MatMul x6, LinearAttention | "
        "2.0 min | 15.00 GiB | 1 x 383 | 0.400 s | 0.800 s | 0.50x |" in md
    )
    assert "M: the peer decoder's inputs: `input_ids`, `attention_mask`, `position_ids`." in md
    assert "M: the builder declared `position_ids` 3 x batch x length" in md


def test_the_peer_builds_and_times_a_tiny_member(tiny_pair: Path, tmp_path: Path) -> None:
    """The genai venv's builder on the tiny Qwen3.5 member and its prefill timed (skipped
    without the genai venv: the peer is a benchmark's, not the product's, dependency)."""
    import shutil
    import subprocess

    rp = _load("real_pair")
    py = rp.PEER_PYTHON
    if not Path(py).is_file():
        pytest.skip(f"no genai venv at {py} (SPOTSTOP_PEER_PYTHON): the peer step is skipped")
    ok = subprocess.run([py, "-c", "import onnxruntime_genai.models.builder"], capture_output=True)
    if ok.returncode != 0:
        pytest.skip(f"{py} cannot import onnxruntime_genai.models.builder")
    member = tmp_path / "Qwen3.5-2B"
    shutil.copytree(tiny_pair / "tiny-qwen3_5", member)

    res = _peer_step(rp, tmp_path, py, ["int4"], 20)
    r = res["peer"]["Qwen3.5-2B"]["int4"]
    assert r["rc"] == 0, r.get("error")
    assert r["nbits"] == {"4": r["ops"]["MatMulNBits"]} and len(r["times_s"]) == 2
    assert "input_ids" in r["inputs"] and r["ops"].get("LinearAttention")
    assert r["shares"]["ms"]["linear layers"] > 0 and r["shares"]["ms"]["Gated-DeltaNet"] > 0


def test_the_peers_3d_position_ids_are_declared_2d_where_plain_rotary_reads_them() -> None:
    """A Qwen3.5 folder without ``mrope_section`` (the bench's recorded config): the builder
    declares position_ids 3 x batch x length but feeds them to plain RotaryEmbedding."""
    from onnx import TensorProto, helper

    rp = _load("real_pair")

    def graph(op: str) -> Any:
        pos = helper.make_tensor_value_info(
            "position_ids", TensorProto.INT64, [3, "batch_size", "sequence_length"]
        )
        node = helper.make_node(op, ["x", "position_ids", "c", "s"], ["y"], domain="com.microsoft")
        return helper.make_model(helper.make_graph([node], "g", [pos], []))

    g = graph("RotaryEmbedding")
    assert rp._peer_position_fix(g)
    dims = g.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch_size", "sequence_length"]
    assert not rp._peer_position_fix(graph("MRotaryEmbedding"))  # multimodal: 3 rows are right


def test_a_failed_build_says_so() -> None:
    rp = _load("real_pair")
    res = {
        "build": {
            "M": {"rc": 1, "seconds": 0.1, "peak_rss_bytes": 1, "folder_bytes": 0, "error": "boom"},
            "N": {"note": "folder present; not rebuilt in this run"},
        }
    }
    md = rp.render(res)
    assert "| M | FAILED (exit 1): boom | | |" in md
    assert "| N | folder present; not rebuilt in this run | | |" in md
