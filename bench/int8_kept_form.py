"""int8's kept layers: int8 activations per block (what the export writes) against float
activations, on one int8 bundle, same weights, one run (issue #24).

``spotstop export --precision int8`` leaves the layers whose measured error at per-token int8
activations exceeds ``--int8-keep-error`` weight-only: ``MatMulNBits`` 8-bit with
``accuracy_level`` 4 (int8 activations per block of 128, export/int8.py). This script copies
an int8 bundle (weights hard-linked), drops ``accuracy_level`` from every ``MatMulNBits`` but
the output layer's (the widest; float activations, ``accuracy_level`` 0), updates the copy's
manifest hashes, then:

* times both bundles on the same generated scenes, one scene a call, after one warm-up call
  each, alternating which goes first, and prints the median per scene and their ratio;
* with ``--verify``, runs ``spotstop verify-bundle --scenes N`` on both (the torch reference
  of the manifest's source) and prints max |Δs|, Spearman and decision agreement.

    python bench/int8_kept_form.py /work/real/bundle-int8 --verify --results bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section
from int8_gemm import cpu_info


def float_copy(src: Path, dst: Path) -> dict[str, int]:
    """``dst``: ``src`` with its kept layers at float activations; per graph, how many."""
    import onnx
    from spotstop.guard.validate import load_yaml

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=os.link)  # the weight files are not written
    man = dst / "manifest.yaml"
    text = man.read_text(encoding="utf-8")
    changed: dict[str, int] = {}
    for rel in load_yaml(text, source=str(man))["files"]:
        if not rel.endswith(".onnx"):
            continue
        p = dst / rel
        m = onnx.load(str(p), load_external_data=False)
        nb = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
        if not nb:
            continue

        def width(n: Any) -> int:
            return int(next(a.i for a in n.attribute if a.name == "N"))

        head = max(width(n) for n in nb)
        k = 0
        for n in nb:
            if width(n) != head:  # every kept layer; the output layer stays at level 4
                keep = [a for a in n.attribute if a.name != "accuracy_level"]
                del n.attribute[:]
                n.attribute.extend(keep)
                k += 1
        old = hashlib.sha256(p.read_bytes()).hexdigest()
        p.unlink()  # a hard link to the source bundle's file: write a new one
        onnx.save(m, str(p))
        text = text.replace(old, hashlib.sha256(p.read_bytes()).hexdigest())
        changed[rel] = k
    man.unlink()
    man.write_text(text, encoding="utf-8")
    return changed


def time_both(bundles: list[Path], scenes: int) -> dict[str, list[float]]:
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import load_bundle, load_bundle_member

    members = {}
    for b in bundles:
        bd = load_bundle(b)
        members[b.name] = load_bundle_member(bd, bd.members[0])
    sc = demo_scenes(scenes, seed=7)
    for m in members.values():
        m.score(sc[:1])  # warm-up
    times: dict[str, list[float]] = {n: [] for n in members}
    for i, s in enumerate(sc * 2):
        order = list(members) if i % 2 == 0 else list(members)[::-1]
        for n in order:
            t0 = time.perf_counter()
            members[n].score([s])
            times[n].append(time.perf_counter() - t0)
    return times


def verify(bundle: Path, scenes: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "spotstop.cli", "verify-bundle", str(bundle)]
    out = subprocess.run(
        [*cmd, "--scenes", str(scenes), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    doc = json.loads(out.stdout)
    [m] = doc["members"]
    return dict(m)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="an int8 bundle of one member")
    ap.add_argument("--scenes", type=int, default=4, help="timed scenes (each twice)")
    ap.add_argument("--verify", action="store_true", help="verify-bundle both")
    ap.add_argument("--verify-scenes", type=int, default=6)
    ap.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = ap.parse_args(argv)
    from spotstop.guard.validate import load_yaml

    t0 = time.perf_counter()
    src = args.bundle.resolve()
    flt = src.with_name(src.name + "-float-kept")
    changed = float_copy(src, flt)
    print("float activations:", changed, flush=True)
    times = time_both([src, flt], args.scenes)
    med = {n: statistics.median(t) for n, t in times.items()}
    rows = []
    ver = {b.name: verify(b, args.verify_scenes) for b in (src, flt)} if args.verify else {}
    for b, form in ((src, "int8 per block (accuracy_level 4)"), (flt, "float (accuracy_level 0)")):
        v = ver.get(b.name)
        check = (
            f"{v['max_abs_diff']:.3f} | {v['spearman']:.3f} | {v['decision_agreement']:.2f} | "
            f"{'pass' if v['ok'] else 'FAIL'}"
            if v
            else "not run | | |"
        )
        rows.append(
            f"| {form} | {med[b.name]:.2f} s | {min(times[b.name]):.2f} s | "
            f"{med[b.name] / med[src.name]:.2f}x | {check} |"
        )
    cpu = cpu_info()
    manifest = src / "manifest.yaml"
    member = load_yaml(manifest.read_text(encoding="utf-8"), source=str(manifest))["members"][0][
        "name"
    ]
    cmd = "python bench/int8_kept_form.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(
        [
            "### int8's kept layers: int8 activations per block or float (`bench/int8_kept_form.py`, issue #24)",
            "",
            f"Bundle `{src.name}` (member `{member}`), "
            f"{sum(changed.values())} kept layers; the same weights in both rows, only the "
            "kept layers' `accuracy_level` differs (the output layer stays at 4). "
            f"{args.scenes} generated scenes, each timed twice per form, alternating; "
            f"verify-bundle on {args.verify_scenes} scenes (scene and request-only scores).",
            "",
            "| kept layers' activations | median / scene | min | time / int8 form | "
            "max abs Δs | Spearman | decisions agree | verify-bundle |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Measured by `{cmd}` ({_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{time.perf_counter() - t0:.0f} s); CPU {cpu['model']}, {cpu['cores']} logical "
            f"cores, flags {', '.join(cpu['flags'])}.",
        ]
    )
    print(text)
    if args.results:
        write_section(args.results, "int8-kept-form", text)
    shutil.rmtree(flt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
