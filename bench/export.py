"""Benchmark of the exported pair: per-scene latency and weight bytes.

    python bench/export.py                       # builds the tiny pair and exports it (minutes)
    python bench/export.py --bundle B32 --tiny T # reuse an fp32 bundle of the tiny pair

Prints, in one run:
1. per-scene latency (one scene per call, as a robot asks) of torch eager vs ONNX Runtime
   fp32 and int8 on the tiny TEST pair (CPU), per member and for the pair, and how many times
   faster onnxruntime is than torch eager;
2. the fp32 graphs' node counts per layer type (export/graph_stats.py): the Gated-DeltaNet,
   attention, MLP, LFM2 short-convolution and vision layers, per layer and in all;
3. the tiny bundles' weight bytes per precision;
4. the real pair's weight bytes per precision (Qwen3.5-2B + LFM2.5-VL-3B), from meta-device
   parameter counts of their config classes (jetson/memory_budget.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _budget_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "memory_budget", ROOT / "jetson" / "memory_budget.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _latency(member, scenes, repeat: int) -> float:  # type: ignore[no-untyped-def]
    member.score(scenes[:1])  # warm-up (session creation, first-call allocations)
    times = []
    for _ in range(repeat):
        for s in scenes:
            t = time.perf_counter()
            member.score([s])
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", type=Path, default=None, help="tiny pair folder (built if absent)")
    ap.add_argument("--bundle", type=Path, default=None, help="an fp32 bundle of the tiny pair")
    ap.add_argument("--scenes", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch/onnxruntime intra-op threads (0: default)"
    )
    args = ap.parse_args(argv)

    import torch
    from spotstop.export.onnx_bundle import derive_bundle, write_onnx_bundle
    from spotstop.export.scenes import demo_scenes
    from spotstop.export.tiny import TINY_MEMBERS, build_tiny_pair
    from spotstop.guard import ScoringConfig, load_bundle, load_member

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="spotstop-bench-"))
    tiny = args.tiny or work / "tiny"
    if not all((tiny / m / "model.safetensors").is_file() for m in TINY_MEMBERS):
        build_tiny_pair(tiny)
    b32 = args.bundle
    if b32 is None:
        t = time.perf_counter()
        b32 = write_onnx_bundle(
            [tiny / m for m in TINY_MEMBERS], work / "b32", buckets=[128, 256], trt="script"
        ).path
        print(f"exported the tiny pair (fp32) in {time.perf_counter() - t:.0f} s")
    bundles = {"fp32": b32, "int8": derive_bundle(b32, work / "b8", precision="int8")}
    bundles["int4"] = derive_bundle(b32, work / "b4", precision="int4")

    scenes = demo_scenes(args.scenes, seed=7)
    b = load_bundle(b32)
    cfg = ScoringConfig(prompt=b.prompt)
    rows: list[tuple[str, str, float]] = []
    for bm in b.members:
        threads = args.threads or None  # both runtimes get the same intra-op threads
        ref = load_member(
            tiny / bm.name, name=bm.name, config=cfg, template=bm.template, threads=threads
        )
        rows.append((bm.name, "torch eager fp32", _latency(ref, scenes, args.repeat)))
        for prec in ("fp32", "int8"):
            bb = load_bundle(bundles[prec])
            bmp = next(m for m in bb.members if m.name == bm.name)
            m = load_member(
                bmp.path,
                name=bm.name,
                config=cfg,
                backend="onnx",
                template=bmp.template,
                threads=threads,
            )
            rows.append((bm.name, f"onnxruntime {prec}", _latency(m, scenes, args.repeat)))
    print()
    print(
        f"per-scene latency, tiny TEST pair, CPU ({os.cpu_count()} cores, "
        f"{args.threads or 'default'} threads), median of "
        f"{args.scenes}x{args.repeat} single-scene calls (preprocessing + prompt + graphs):"
    )
    print(f"{'member':<16} {'runtime':<20} {'ms/scene':>9}")
    for name, rt, sec in rows:
        print(f"{name:<16} {rt:<20} {sec * 1e3:9.2f}")
    for rt in ("torch eager fp32", "onnxruntime fp32", "onnxruntime int8"):
        tot = sum(sec for _, r, sec in rows if r == rt)
        print(f"{'pair':<16} {rt:<20} {tot * 1e3:9.2f}")
    print("onnxruntime vs torch eager, per scene (x times faster):")
    names = [bm.name for bm in b.members]
    for who in [*names, "pair"]:
        sel = [r for r in rows if who in ("pair", r[0])]
        eager = sum(sec for _, r, sec in sel if r == "torch eager fp32")
        ratios = [
            f"{prec} {eager / sum(sec for _, r, sec in sel if r == f'onnxruntime {prec}'):.2f}x"
            for prec in ("fp32", "int8")
        ]
        print(f"  {who:<16} " + "  ".join(ratios))
    print()
    from spotstop.export.graph_stats import graph_stats

    print("fp32 graphs, ONNX nodes per layer type (per layer: the largest instance):")
    for bm in b.members:
        for f in sorted((bm.path / "onnx").glob("*.onnx")):
            print(f"{bm.name}/{f.name}:")
            print("\n".join(graph_stats(f).lines()))
    print()
    print("tiny bundles, weight bytes (vision + one decoder per member):")
    for prec in ("fp32", "int8", "int4"):
        bb = load_bundle(bundles[prec])
        per = {m["name"]: m["weight_bytes"] for m in bb.manifest["members"]}
        print(
            f"  {prec:<5} "
            + "  ".join(f"{k} {v / 1024:.0f} KiB" for k, v in per.items())
            + f"  pair {sum(per.values()) / 1024:.0f} KiB"
        )
    print()
    mb = _budget_module()
    counts = [mb.count(n, mb.build_config(n, r)) for n, r in mb.RECORDED.items()]
    print("real pair at its published dimensions (meta-device parameter counts), weight GiB:")
    print(f"{'precision':<10}" + "".join(f"{c.name:>16}" for c in counts) + f"{'pair':>10}")
    for prec in mb.PRECISIONS:
        ws = [mb.weight_bytes(c, prec) / 2**30 for c in counts]
        print(f"{prec:<10}" + "".join(f"{w:16.2f}" for w in ws) + f"{sum(ws):10.2f}")
    print("  (" + ", ".join(f"{c.name}: {c.total / 1e9:.2f} B parameters" for c in counts) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
