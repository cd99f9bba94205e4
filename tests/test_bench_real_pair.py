"""bench/real_pair.py's report and bench/_results.py's sections of bench/RESULTS.md.

The run itself (an hour of a 24 GB workstation at the real dimensions) is not a test; its
figures are in bench/RESULTS.md. Here: what it writes from the figures it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import load_bench

ROOT = Path(__file__).resolve().parents[1]


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
    assert "| M | onnxruntime int8 | 2.50 s | 2.00 s | 3.0 s | 300 | 4.00 GiB | 2.00x |" in md
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
    member = _verified_member()
    one = {"rc": 0, "seconds": 60.0, "peak_rss_bytes": 2**30}
    res = {
        "verify": {
            "int4": {"runs": [{**one, "result": {"ok": True, "members": [member]}}]},
            "int8": {"rc": None, "error": "no bundle: its export failed (see the export table)"},
        },
        "latency": {"N": {"onnxruntime int4": {"rc": None, "error": "no bundle: failed"}}},
    }
    md = rp.render(res)
    assert "| int4 | M | 12 | 0.500 | 1.0 | 0.950 | 0.8 | 1.00 | PASS |" in md
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
