"""A vision graph as exported against the same graph with its GELUs fused, timed in one run.

The fused graph form writes each decomposed GELU as onnxruntime's ``FastGelu`` / ``Gelu``
(export/gelu.py ``fuse_gelu``, after the precision's conversion, a bias Add folded in). This
script applies that same function to a COPY of an exported vision graph, so a bundle exported
before the rewrite (e.g. the real Qwen3.5-2B int8 bundle) is measured without exporting it
again, and nothing in the bundle is changed::

    python bench/gelu_fusion.py /work/real/bundle-int8/members/Qwen3.5-2B/onnx/vision.onnx

The graph and its external data files are copied (not linked: onnx refuses a hard-linked data
file) to ``--work`` (default: a temporary folder, removed after), the copy is rewritten, and both
are loaded in onnxruntime (CPU, ``ORT_ENABLE_ALL`` as the guard's sessions, ``--threads``). Each
of ``--rounds`` rounds runs both on the same seeded input, in alternating order (AB, BA, ...),
after one warm-up call each; the medians and their ratio are printed with the largest |Δ|
between the two outputs, beside the graph's own sensitivity to a rounding: the exported graph
against itself on its input moved up by one float32 ulp (in an int8 graph a rounding that moves
a value across a per-token code boundary moves it by a whole step). The ratio is a same-run ratio: on a shared machine the absolute times
move with the load, the ratio much less.

Writes the section ``gelu-fusion`` of bench/RESULTS.md only with ``--results FILE``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402


@dataclass(frozen=True)
class GeluTiming:
    """One run: the medians (s) of each graph over ``rounds`` calls and what the rewrite did."""

    graph: str
    rounds: int
    threads: int
    exported_s: float
    fused_s: float
    exported_all: tuple[float, ...]
    fused_all: tuple[float, ...]
    max_abs_diff: float
    #: the exported graph against itself on its input moved up by one float32 ulp
    max_abs_diff_ulp_input: float
    max_abs_output: float
    fast_gelu: int
    gelu: int
    biases: int
    nodes_before: int
    nodes_after: int

    @property
    def ratio(self) -> float:
        """exported / fused median time (> 1: the fused graph is faster)."""
        return self.exported_s / self.fused_s

    @property
    def paired_ratio(self) -> float:
        """The median of each round's own exported / fused ratio (the two calls of a round
        ran back to back, so a load that comes and goes moves both)."""
        return statistics.median(
            e / f for e, f in zip(self.exported_all, self.fused_all, strict=True)
        )


def copy_graph(src: Path, dst_dir: Path) -> Path:
    """``src`` and the external data files it names, copied (never linked) into ``dst_dir``."""
    import onnx

    dst_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src), load_external_data=False)
    files = {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    for f in sorted(files):
        shutil.copyfile(src.parent / f, dst_dir / f)
    dst = dst_dir / src.name
    shutil.copyfile(src, dst)
    return dst


def rewrite_copy(graph: Path) -> tuple[Path, Any, int, int]:
    """The export's own GELU rewrite on ``graph`` (a copy), saved beside it as
    ``<name>.gelu.onnx`` over the same data file; returns (path, counts, nodes before, after)."""
    import onnx
    from spotstop.export.gelu import fuse_gelu

    model = onnx.load(str(graph), load_external_data=False)
    before = len(model.graph.node)
    counts = fuse_gelu(model)
    out = graph.with_name(graph.stem + ".gelu.onnx")
    onnx.save_model(model, str(out))
    return out, counts, before, len(model.graph.node)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def _feeds(sess: Any, seed: int) -> dict[str, np.ndarray]:
    """A seeded standard-normal float32 input of each graph input's shape (a dynamic axis: 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        if i.type != "tensor(float)":
            raise ValueError(f"input {i.name} is {i.type}; this bench feeds float32 inputs only.")
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def measure(graph: Path, *, rounds: int, threads: int, seed: int, work: Path) -> GeluTiming:
    """Copy ``graph`` into ``work``, rewrite the copy, and time both alternately."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1; got {rounds}.")
    exported = copy_graph(graph, work)
    fused, counts, before, after = rewrite_copy(exported)
    sessions = {"exported": _session(exported, threads), "fused": _session(fused, threads)}
    feeds = _feeds(sessions["exported"], seed)
    outs = {k: s.run(None, feeds) for k, s in sessions.items()}  # warm-up, and the outputs
    diff = max(
        float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
        for a, b in zip(outs["exported"], outs["fused"], strict=True)
    )
    big = max(float(np.max(np.abs(a), initial=0.0)) for a in outs["exported"])
    # the exported graph's own sensitivity to one float32 rounding: its input moved by an ulp
    nudged = {k: np.nextafter(v, np.float32(np.inf)) for k, v in feeds.items()}
    own = max(
        float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
        for a, b in zip(outs["exported"], sessions["exported"].run(None, nudged), strict=True)
    )
    times: dict[str, list[float]] = {"exported": [], "fused": []}
    for r in range(rounds):
        for k in ("exported", "fused") if r % 2 == 0 else ("fused", "exported"):
            t0 = time.perf_counter()
            sessions[k].run(None, feeds)
            times[k].append(time.perf_counter() - t0)
    return GeluTiming(
        graph=str(graph),
        rounds=rounds,
        threads=threads,
        exported_s=statistics.median(times["exported"]),
        fused_s=statistics.median(times["fused"]),
        exported_all=tuple(times["exported"]),
        fused_all=tuple(times["fused"]),
        max_abs_diff=diff,
        max_abs_diff_ulp_input=own,
        max_abs_output=big,
        fast_gelu=counts.fast_gelu,
        gelu=counts.gelu,
        biases=counts.biases,
        nodes_before=before,
        nodes_after=after,
    )


def render(t: GeluTiming, command: str) -> str:
    import onnxruntime as ort

    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    return "\n".join(
        [
            "### GELU fusion: a vision graph as exported against its GELUs fused (same run)",
            "",
            f"Measured by `python bench/gelu_fusion.py{(' ' + command) if command else ''}` "
            f"({when}); {cpu}, {os.cpu_count()} logical cores; onnxruntime {ort.__version__}, "
            f"{t.threads} threads, ORT_ENABLE_ALL; {t.rounds} rounds in alternating order, "
            "median; a same-run ratio on a shared machine.",
            "",
            f"Rewrite (export/gelu.py `fuse_gelu` on a copy): {t.fast_gelu} FastGelu "
            f"({t.biases} with the bias folded in), {t.gelu} Gelu; "
            f"{t.nodes_before} → {t.nodes_after} nodes.",
            "",
            "| graph | median ms | all rounds (ms) |",
            "| --- | --- | --- |",
            f"| as exported | {t.exported_s * 1e3:.1f} | "
            + ", ".join(f"{x * 1e3:.1f}" for x in t.exported_all)
            + " |",
            f"| GELUs fused | {t.fused_s * 1e3:.1f} | "
            + ", ".join(f"{x * 1e3:.1f}" for x in t.fused_all)
            + " |",
            "",
            f"Ratio (as exported / fused): **{t.ratio:.3f}x** of the medians, "
            f"**{t.paired_ratio:.3f}x** the median of the rounds' own ratios. "
            "Max |Δ| of the outputs: "
            f"{t.max_abs_diff:.3g} (largest |output| {t.max_abs_output:.3g}); the graph as "
            f"exported against itself on its input moved by one float32 ulp: "
            f"{t.max_abs_diff_ulp_input:.3g} (an int8 graph's per-token codes turn such "
            "roundings into whole steps).",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("graph", type=Path, help="an exported vision.onnx (its data file beside it)")
    ap.add_argument("--rounds", type=int, default=7, help="timed calls per graph (median kept)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    ap.add_argument("--seed", type=int, default=0, help="the input's seed")
    ap.add_argument("--work", type=Path, help="where the copies go (default: a temp folder)")
    ap.add_argument("--results", type=Path, help="a RESULTS.md to write the section into")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if not args.graph.is_file():
        ap.error(f"{args.graph} is not a file; pass an exported vision.onnx.")
    tmp = None if args.work else Path(tempfile.mkdtemp(prefix="gelu-fusion-"))
    try:
        t = measure(
            args.graph,
            rounds=args.rounds,
            threads=args.threads,
            seed=args.seed,
            work=args.work or tmp,  # type: ignore[arg-type]
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    text = render(t, " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        print(json.dumps({**asdict(t), "ratio": t.ratio, "paired_ratio": t.paired_ratio}, indent=2))
    else:
        print(text)
    if args.results is not None:
        write_section(args.results, "gelu-fusion", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
