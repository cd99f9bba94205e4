"""Two or more ONNX bundles of one member timed on the same scenes, in one run: what one export
choice costs or saves (issue #24; e.g. int8 with and without exact reads, export/int8.py).

Each bundle is timed in its own child process per round (one bundle resident at a time: two
real-size bundles beside each other would crowd the memory), the order alternating by round;
each child (``bench/real_pair.py``'s latency child) scores one warm-up scene, then ``--scenes``
generated scenes one a call. Prints per bundle the median and least time per scene, the
decoder graph's median, their ratios to the FIRST bundle, and the manifest's int8 record that
tells the bundles apart (``exact_reads``, ``rotated``, ``symmetric``). Run it alone.

    python bench/bundle_ab.py /work/real4/bundle-int8 /work/real3/bundle-int8 --rounds 2 \\
        --results bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section
from int8_gemm import measured_by

#: the manifest's int8 counts that tell two int8 bundles of one member apart
_INT8_KEYS = ("dynamic", "exact_reads", "rotated", "symmetric")


def time_all(bundles: list[Path], member: str, scenes: int, rounds: int, log: Path) -> dict:
    """Per bundle, the per-scene times and the decoder graph's times of ``rounds`` child
    processes each (one bundle resident at a time: three Qwen3.5-2B bundles in one process
    would not fit beside each other in memory), the bundles' order alternating per round.
    Each child (``bench/real_pair.py``'s latency child) scores one warm-up scene, then
    ``scenes`` generated scenes one a call."""
    from real_pair import _child, _run

    out: dict[str, dict[str, list[float]]] = {b.name: {"scene": [], "decoder": []} for b in bundles}
    for r in range(rounds):
        for b in bundles if r % 2 == 0 else bundles[::-1]:
            res = _run(_child("child_latency", "onnx", str(b), member, str(scenes), "", ""), log)
            if res["rc"] != 0:
                raise SystemExit(f"timing {b} failed (exit {res['rc']}); see {log}")
            doc = json.loads(res["stdout"].strip().splitlines()[-1])
            out[b.name]["scene"] += doc["times_s"]
            out[b.name]["decoder"] += [g["decoder"] for g in doc["graph_s"]]
    return out


def seconds(t: float) -> str:
    """A time as a table shows it: milliseconds under a second (a tiny bundle's scene), else
    seconds."""
    return f"{t * 1e3:.2f} ms" if t < 1.0 else f"{t:.2f} s"


def member_record(bundle: Path) -> tuple[str, dict[str, Any]]:
    """The bundle's one member's name and its ``spotstop_onnx.yaml`` (``SystemExit`` saying why
    when the bundle has no member or several)."""
    from spotstop.guard.validate import load_yaml

    manifest = bundle / "manifest.yaml"
    if not manifest.is_file():
        raise SystemExit(f"{bundle} has no manifest.yaml: not a bundle.")
    members = load_yaml(manifest.read_text(encoding="utf-8"), source=str(manifest))["members"]
    if len(members) != 1:
        raise SystemExit(f"{bundle} holds {len(members)} members; give bundles of one member.")
    name = members[0]["name"]
    rec = bundle / "members" / name / "spotstop_onnx.yaml"
    return name, load_yaml(rec.read_text(encoding="utf-8"), source=str(rec))


def describe(rec: dict[str, Any]) -> str:
    """``precision``, and for int8 the counts that differ between exports."""
    d = (rec.get("quantizer") or {}).get("dynamic_int8") or {}
    parts = [str(rec.get("precision", "?"))]
    parts += [f"{k} {d[k]}" for k in _INT8_KEYS if k in d]
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", type=Path, nargs="+", help="bundles of one member; the first is "
                    "the baseline of the ratios")  # fmt: skip
    ap.add_argument("--scenes", type=int, default=4, help="timed scenes a process (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per bundle, alternating")
    ap.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    ap.add_argument("--key", default="bundle-ab", help="its section's name (default bundle-ab)")
    args = ap.parse_args(argv)
    if len(args.bundles) < 2:
        ap.error("give at least two bundles to compare.")
    if args.scenes < 1 or args.rounds < 1:
        ap.error("--scenes and --rounds must be at least 1.")
    t0 = time.perf_counter()
    bundles = [b.resolve() for b in args.bundles]
    if len({b.name for b in bundles}) < len(bundles):  # the timings are keyed by folder name
        ap.error("the bundles' folder names must differ (copy or link one under another name).")
    recs = [member_record(b) for b in bundles]
    names = {n for n, _ in recs}
    if len(names) != 1:
        ap.error(f"the bundles hold different members {sorted(names)}; compare one member.")
    (member,) = names
    log = bundles[0].with_name(bundles[0].name + "-ab.log")
    times = time_all(bundles, member, args.scenes, args.rounds, log)
    base = bundles[0].name
    med = {n: statistics.median(t["scene"]) for n, t in times.items()}
    dec = {n: statistics.median(t["decoder"]) for n, t in times.items()}
    rows = [
        f"| `{b}` | {describe(r)} | {seconds(med[b.name])} | "
        f"{seconds(min(times[b.name]['scene']))} | {med[b.name] / med[base]:.2f}x | "
        f"{seconds(dec[b.name])} | {dec[b.name] / dec[base]:.2f}x |"
        for b, (_, r) in zip(bundles, recs, strict=True)
    ]
    cmd = "python bench/bundle_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(
        [
            f"### Bundles of `{member}` timed on the same scenes (`bench/bundle_ab.py`)",
            "",
            f"{args.scenes} generated scenes, one a call, in each of {args.rounds} processes per "
            "bundle, the order alternating; ratios to the first bundle.",
            "",
            "| bundle | what it holds | median / scene | min | time / first | decoder graph | "
            "decoder / first |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            measured_by(cmd, time.perf_counter() - t0),
        ]
    )
    print(text)
    if args.results:
        write_section(args.results, args.key, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
