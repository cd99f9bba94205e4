"""int8's kept layers: int8 activations per block (what the export writes) against float
activations and against the int8 GEMM the other layers use, on one int8 bundle, one run
(issue #24).

``spotstop export --precision int8`` leaves the layers whose measured error at per-token int8
activations exceeds ``--int8-keep-error`` weight-only: ``MatMulNBits`` 8-bit with
``accuracy_level`` 4 (int8 activations per block of 128, export/int8.py). This script copies
an int8 bundle (weights hard-linked), drops ``accuracy_level`` from every ``MatMulNBits`` but
the output layer's (the widest; float activations, ``accuracy_level`` 0), updates the copy's
manifest hashes. A second copy multiplies the kept layers like every other int8 layer
(per-token activations through ``MatMulIntegerToFloat``, export/int8.py): each kept layer's
8-bit blocks are dequantized and given to the export's own rewrite, ``quantize_matmuls_int8``
(round to nearest, per column: its weights are quantized twice, so its error is an upper
bound of what the export would write). Then:

* times the three on the same generated scenes, one scene a call, after one warm-up call, in
  one process per bundle and round (``--rounds``, the order alternating), and prints the
  median per scene, the decoder graph's median (the only graph that differs) and their ratios
  to the export's form;
* with ``--verify``, runs ``spotstop verify-bundle --scenes N`` on each (the torch reference
  of the manifest's source) and prints max |Δs|, Spearman and decision agreement.

Run it alone on the machine: the three forms are timed minutes apart.

    python bench/int8_kept_form.py /work/real/bundle-int8 --verify --results bench/RESULTS.md
"""

from __future__ import annotations

import argparse
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
from bundle_ab import time_all
from int8_gemm import measured_by


def float_copy(src: Path, dst: Path) -> dict[str, int]:
    """``dst``: ``src`` with its kept layers at float activations; per graph, how many."""

    def edit(m: Any) -> int:
        kept = _kept(m)  # the output layer stays at level 4
        for n in kept:
            keep = [a for a in n.attribute if a.name != "accuracy_level"]
            del n.attribute[:]
            n.attribute.extend(keep)
        return len(kept)

    return _hashed_copy(src, dst, edit, weights=False)


def _attrs(n: Any) -> dict[str, int]:
    return {a.name: a.i for a in n.attribute}


def _kept(m: Any) -> list[Any]:
    """The graph's kept layers: its ``MatMulNBits`` nodes but the output layer (the one whose
    output the vocabulary's ``LogSoftmax`` reads, as export/int8.py finds it)."""
    from spotstop.export.int8 import _output_layers

    head = _output_layers(m)
    return [n for n in m.graph.node if n.op_type == "MatMulNBits" and n.output[0] not in head]


def _hashed_copy(src: Path, dst: Path, edit: Any, weights: bool) -> dict[str, int]:
    """``dst``: ``src`` (weights hard-linked) with ``edit(model) -> n`` applied to each graph
    that has ``MatMulNBits`` nodes (``weights``: loaded with its weights, and a new data file
    written; else the graph file alone); the manifest's hashes follow. Per graph, ``n``."""
    import onnx
    from spotstop.guard._bundle import bundle_content_id
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
        if not any(
            n.op_type == "MatMulNBits"
            for n in onnx.load(str(p), load_external_data=False).graph.node
        ):
            continue
        files = [p, p.with_name(p.name + ".data")] if weights else [p]
        old = [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
        if weights:  # onnx refuses to read a hard-linked data file: a copy of its own
            files[1].unlink()
            shutil.copyfile(src / (rel + ".data"), files[1])
        m = onnx.load(str(p), load_external_data=weights)
        changed[rel] = edit(m)
        for f in files:
            f.unlink()  # hard links to the source bundle's files
        if weights:
            onnx.save(m, str(p), save_as_external_data=True, location=files[1].name)
        else:
            onnx.save(m, str(p))
        for f, h in zip(files, old, strict=True):
            text = text.replace(h, hashlib.sha256(f.read_bytes()).hexdigest())
    doc = load_yaml(text, source=str(man))  # the id names the content: it follows the hashes
    old_id = str(doc["bundle_id"])
    content = bundle_content_id(doc["prompt_hash"], doc["files"], doc["members"])
    text = text.replace(old_id, f"{old_id.rsplit('-', 1)[0]}-{content}")
    man.unlink()
    man.write_text(text, encoding="utf-8")
    return changed


def dynamic_copy(src: Path, dst: Path, weight_form: str | None = None) -> dict[str, int]:
    """``dst``: ``src`` with its kept layers (:func:`_kept`) rewritten by the export's int8
    GEMM rewrite, their weights in ``weight_form`` (the bundle's: ``s8`` or ``u8``; None: this
    host's, export/int8.py's ``host_weight_form``); per graph, how many."""
    from onnx import helper, numpy_helper
    from spotstop.export.int8 import quantize_matmuls_int8
    from spotstop.export.nbits import dequantize_nbits

    def edit(m: Any) -> int:
        g = m.graph
        inits = {t.name: t for t in g.initializer}
        # MatMuls already float (the vision graph's ends, unmeasured tables) stay as they are
        before = {n.output[0] for n in g.node if n.op_type in ("MatMul", "Gemm")}
        k = 0
        for n in _kept(m):
            a = _attrs(n)
            if a["bits"] != 8 or (len(n.input) > 3 and n.input[3]):
                raise SystemExit(f"{n.name}: not a symmetric 8-bit MatMulNBits")
            w = dequantize_nbits(
                numpy_helper.to_array(inits[n.input[1]]),
                numpy_helper.to_array(inits[n.input[2]]),
                8,
                a["K"],
            )
            name = f"{n.name}_kept_w"
            g.initializer.append(numpy_helper.from_array(w, name))
            n.CopyFrom(helper.make_node("MatMul", [n.input[0], name], list(n.output), name=n.name))
            k += 1
        rep = quantize_matmuls_int8(m, output_layers=before, weight_form=weight_form)
        if rep.dynamic != k:
            raise SystemExit(f"rewrote {rep.dynamic} layers, expected the {k} kept ones")
        used = {i for n in g.node for i in n.input}
        # the rewrite's shared per-token constants exist already (the export wrote them): once
        seen: set[str] = set()
        keep = [
            t for t in g.initializer if t.name in used and not (t.name in seen or seen.add(t.name))
        ]
        del g.initializer[:]
        g.initializer.extend(keep)
        return k

    return _hashed_copy(src, dst, edit, weights=True)


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
    ap.add_argument("--scenes", type=int, default=4, help="timed scenes a process")
    ap.add_argument("--rounds", type=int, default=2, help="processes per form, alternating")
    ap.add_argument("--verify", action="store_true", help="verify-bundle both")
    ap.add_argument("--verify-scenes", type=int, default=6)
    ap.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = ap.parse_args(argv)
    from spotstop.guard.validate import load_yaml

    t0 = time.perf_counter()
    src = args.bundle.resolve()
    manifest = src / "manifest.yaml"
    member = load_yaml(manifest.read_text(encoding="utf-8"), source=str(manifest))["members"][0][
        "name"
    ]
    rec = src / "members" / member / "spotstop_onnx.yaml"
    dyn8 = load_yaml(rec.read_text(encoding="utf-8"), source=str(rec))["quantizer"]
    if not dyn8.get("dynamic_int8", {}).get("weight_only", {}).get("over_keep_error"):
        raise SystemExit(
            f"{member}: the export kept no layer weight-only but the output layer (since "
            "2026-12-06 it rotates a layer over the keep bound and computes it in int8, "
            "export/int8.py); export with --int8-rotate-block 0 to compare the kept forms."
        )
    flt = src.with_name(src.name + "-float-kept")
    dyn = src.with_name(src.name + "-per-token-kept")
    changed = float_copy(src, flt)
    print("float activations:", changed, flush=True)
    form = dyn8.get("dynamic_int8", {}).get("weight_form", "s8")  # as the bundle's other layers
    print("int8 GEMM, per token:", dynamic_copy(src, dyn, form), flush=True)
    forms = (
        (src, "int8 per block (accuracy_level 4): the export"),
        (flt, "float (accuracy_level 0)"),
        (dyn, "int8 per token (MatMulIntegerToFloat, as the other layers)"),
    )
    log = src.with_name(src.name + "-kept-form.log")
    times = time_all([b for b, _ in forms], member, args.scenes, args.rounds, log)
    med = {n: statistics.median(t["scene"]) for n, t in times.items()}
    dec = {n: statistics.median(t["decoder"]) for n, t in times.items()}
    rows = []
    ver = {b.name: verify(b, args.verify_scenes) for b, _ in forms} if args.verify else {}
    for b, form in forms:
        v = ver.get(b.name)
        check = (
            f"{v['max_abs_diff']:.3f} | {v['spearman']:.3f} | {v['decision_agreement']:.2f} | "
            f"{'pass' if v['ok'] else 'FAIL'}"
            if v
            else "not run | | |"
        )
        rows.append(
            f"| {form} | {med[b.name]:.2f} s | {min(times[b.name]['scene']):.2f} s | "
            f"{med[b.name] / med[src.name]:.2f}x | {dec[b.name]:.2f} s | "
            f"{dec[b.name] / dec[src.name]:.2f}x | {check} |"
        )
    cmd = "python bench/int8_kept_form.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(
        [
            "### int8's kept layers: int8 activations per block, float, or the int8 GEMM "
            "(`bench/int8_kept_form.py`, issue #24)",
            "",
            f"Bundle `{src.name}` (member `{member}`), "
            f"{sum(changed.values())} kept layers; the first two rows have the same weights, only "
            "the kept layers' `accuracy_level` differs (the output layer stays at 4); the third "
            "requantizes the kept layers' 8-bit blocks per column and multiplies them as the "
            "other int8 layers are (export/int8.py's rewrite; weights quantized twice). "
            f"{args.scenes} generated scenes in each of {args.rounds} processes per form, "
            "alternating; "
            f"verify-bundle on {args.verify_scenes} scenes (scene and request-only scores).",
            "",
            "| kept layers' activations | median / scene | min | time / export's | decoder "
            "graph | decoder / export's | max abs Δs | Spearman | decisions agree | "
            "verify-bundle |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            measured_by(cmd, time.perf_counter() - t0),
        ]
    )
    print(text)
    if args.results:
        write_section(args.results, "int8-kept-form", text)
    shutil.rmtree(flt)
    shutil.rmtree(dyn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
