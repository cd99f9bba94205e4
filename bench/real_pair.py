"""The REAL pair's dimensions on this CPU: export int8/int4 bundles, verify them, time them.

Issue #13 item 4. What a user's workstation does before buying a Jetson: with seeded random
weights at the real dimensions of Qwen3.5-2B and LFM2.5-VL-3B (``jetson/memory_budget.py``'s
recorded configs; TEST WEIGHTS: the scores mean nothing, only time, memory and bytes are
measured), run the product's own commands as a user runs them:

1. ``build``   — each member folder (bf16 safetensors, the tiny pair's test tokenizer) with
   ``spotstop.export.tiny.build_random_member``; skipped when the folder is there.
2. ``export``  — ``spotstop export --member Q --member L --precision P --json`` per precision
   (int8, int4): the members are large (float32 weights over 2 GiB), so the export runs
   streamed (export/memory.py); wall time of the command, and per member the seconds and
   peak RSS the export reports. When the pair's export fails (a member beyond its
   tolerance: no bundle is written), each member is exported alone, so one that passes still
   has a bundle to verify and time; the pair's failure stays in the report.
3. ``verify``  — ``spotstop verify-bundle BUNDLE --json`` per bundle this run's export wrote:
   every member's score against its torch reference at the precision's tolerance
   (export/configs.py).
4. ``latency`` — per member, on the same generated scenes, one scene per call after a
   warm-up call: torch eager fp32 and torch eager bf16 (the member folder, ``backend="torch"``
   with ``dtype``) against onnxruntime at each precision (the bundles; default: every
   precision this store's export wrote a bundle for, names taken as data), each in its own
   process, measured in this run; ratio columns against torch fp32 and torch bf16. Each
   onnxruntime run also logs the time of each graph (vision, decoder) and the decoder's input
   shape. Each bundle is then profiled once more in its own process
   (``SessionOptions.enable_profiling``; one scene after a warm-up): the share of node time
   in linear layers, Gated-DeltaNet, LFM2's short convolutions, attention and the rest. The
   roofline floor of one scene on this CPU is ``spotstop cost``'s roofline (export/cost.py:
   ``bundle_cost``'s FLOPs, ``roofline``'s max(FLOPs / peak, bytes / bandwidth)) at peaks
   measured at the start of the step by ``bench/int8_gemm.py`` (one Qwen3.5-2B-sized linear
   layer in fp32, bf16 and int8 forms; a 1 GiB read for the bandwidth). Last, each precision
   against issue #24's speed goals.
5. ``peer``    — onnxruntime-genai's model builder (``python -m
   onnxruntime_genai.models.builder -i MEMBER -p P -e cpu``, last-token logits) on the same
   member folder, for each of our precisions at the builder's precision of that name (int4:
   its MatMulNBits 4-bit; int8: its MatMulNBits 8-bit; the table says what it emitted), run
   by the interpreter of a separate venv (``--peer-python``: ``python3 -m venv V && V/bin/pip
   install torch==2.13.0 onnxruntime-genai onnx onnx_ir transformers``; the step says so and
   writes no figures when it is missing or cannot import the builder). Its decoder's prefill
   is timed at our decoder's token count (batch x length of the latency step's median decoder
   call) beside ours. The builder emits no vision tower for either member: decoders alone
   are compared.

Each step runs in a child process; its peak RSS is the child's (``os.wait4``). Results
accumulate in ``WORK/real_pair.json`` (a step run again replaces its own figures) and are
rendered into ``bench/RESULTS.md``, with the bundle bytes against ``jetson/memory_budget.py``'s
prediction, in sections a run rewrites only when it measured them: ``cpu-real`` (the header
and the member folders), ``cpu-real-export-PRECISION``, ``cpu-real-verify-PRECISION``,
``cpu-real-latency`` and ``cpu-real-peer``; each table names the command, date and machine
that measured it. So an int4 export run again leaves the int8 figures as they were measured, even when the store is
gone. Only figures this machine measured are written; a step that failed is written with its
error.

    python bench/real_pair.py --work /work/real                      # everything (~1 h here)
    python bench/real_pair.py --work /work/real --steps latency      # one step again
    python bench/real_pair.py --work /work/real --steps build --members Qwen3.5-2B
    python bench/real_pair.py --work /tmp/t --tiny                   # a trial on the tiny pair

``--tiny`` builds the tiny TEST pair's members (``spotstop tiny``'s) under the real members'
names and writes ``cpu-tiny-*`` sections to WORK/RESULTS.md (``--results`` to choose):
a minutes-long trial of every step, its figures meaning nothing about the real dimensions.

Disk: the two bf16 member folders (10 GiB), the export's float32 temporaries of one member
at a time (up to 12 GiB), and the bundles (int8 ~4.5 GiB, int4 ~3 GiB).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

STEPS = ("build", "export", "verify", "latency", "peer")


def _budget() -> Any:
    """jetson/memory_budget.py (its RECORDED real configs and byte formulas)."""
    spec = importlib.util.spec_from_file_location(
        "memory_budget", ROOT / "jetson" / "memory_budget.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(cmd: list[str], log: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """Run ``cmd``; its wall time, exit status, peak RSS (its own, from wait4) and stdout."""
    t = time.perf_counter()
    with open(log, "ab") as err:
        err.write(f"\n$ {' '.join(cmd)}\n".encode())
        err.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        assert p.stdout is not None
        out = p.stdout.read()
        p.stdout.close()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        except ChildProcessError:  # already reaped
            status, ru = 0, None
        p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "cmd": " ".join(cmd),
        "rc": p.returncode,
        "seconds": time.perf_counter() - t,
        "peak_rss_bytes": int(ru.ru_maxrss) * 1024 if ru else None,
        "stdout": out.decode("utf-8", "replace"),
    }


def _py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


_BUILD = """
import sys, json, importlib.util
spec = importlib.util.spec_from_file_location("memory_budget", sys.argv[3])
mb = importlib.util.module_from_spec(spec); sys.modules["memory_budget"] = mb; spec.loader.exec_module(mb)
from spotstop.export.tiny import build_random_member
rec = mb.RECORDED[sys.argv[1]]
build_random_member(str(rec["model_type"]), rec, sys.argv[2], seed=0, dtype="bfloat16", device="cpu")
"""

_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import real_pair
getattr(real_pair, sys.argv[2])(*sys.argv[3:])
"""


def _child(fn: str, *args: str, python: str | None = None) -> list[str]:
    """A child process (``python``: another interpreter, e.g. the peer's venv) that runs this
    module's ``fn(*args)``; it prints one JSON line last."""
    return [python or sys.executable, "-c", _CHILD, str(ROOT / "bench"), fn, *args]


# ---- per-op time shares (onnxruntime profiling) ------------------------------------------------

#: where a profiled node's time goes (the latency step's share table)
GROUPS = ("linear layers", "Gated-DeltaNet", "short conv", "attention", "other")
#: operators that are a linear layer whatever their name (weights quantized or not)
_LINEAR_OPS = {
    "MatMulNBits",
    "DynamicQuantizeMatMul",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "QGemm",
    "QLinearMatMul",
    "MatMulFpQ4",
}
_MATMUL_OPS = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm"}
_GDN_OPS = {"LinearAttention", "LinearAttentionGate", "GatedDeltaNet"}
_ATTN_OPS = {
    "GroupQueryAttention",
    "MultiHeadAttention",
    "Attention",
    "PagedAttention",
    "SparseAttention",
}
_LINEAR_NAME = re.compile(r"(_proj|proj[./]|lm_head|linear|feed_forward|mlp|fc\d|/w\d/)", re.I)
_SHORT_CONV = re.compile(r"[./]conv([./_]|$)")
_ATTN_NAME = re.compile(r"(self_attn|[./]attn[./_]|attention)", re.I)


def graph_index(path: str | Path) -> dict[str, tuple[str, bool]]:
    """node name → (its name with the module scopes the exporter recorded, whether it
    multiplies by a weight: an initializer input) for the graph at ``path`` (weights not
    loaded)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    consts = {o for n in m.graph.node if n.op_type == "Constant" for o in n.output}
    out = {}
    for n in m.graph.node:
        meta = {p.key: p.value for p in n.metadata_props}
        text = " ".join(
            [n.name, meta.get("pkg.torch.onnx.name_scopes", ""), meta.get("namespace", "")]
        )
        linear = "torch.nn.modules.linear.Linear" in meta.get("pkg.torch.onnx.class_hierarchy", "")
        weight = linear or any(i in inits or i in consts for i in n.input[1:2])
        out[n.name] = (text, weight)
    return out


def classify(op: str, name: str, index: dict[str, tuple[str, bool]]) -> str:
    """The :data:`GROUPS` entry of a profiled node (``op`` its operator, ``name`` its node
    name). Linear layers: the quantized matrix-multiply operators, and a MatMul/Gemm by a
    weight; Gated-DeltaNet: Qwen3.5's linear-attention layers (their module scope or node
    name ``linear_attn``, or onnxruntime's LinearAttention operators); short conv: LFM2's
    convolution layers (``…/conv/…``, or CausalConvWithState outside a linear-attention
    layer); attention: the attention layers (``self_attn``/``attn`` scopes, the fused
    attention operators). A node onnxruntime fused under a new name is classed by its
    operator and name alone."""
    text, weight = index.get(name, (name, False))
    if op in _LINEAR_OPS:
        return "linear layers"
    if op in _MATMUL_OPS and (weight or (name not in index and _LINEAR_NAME.search(text))):
        return "linear layers"
    if "linear_attn" in text or op in _GDN_OPS:
        return "Gated-DeltaNet"
    if op == "CausalConvWithState" or _SHORT_CONV.search(text):
        return "short conv"
    if op in _ATTN_OPS or _ATTN_NAME.search(text):
        return "attention"
    return "other"


def profile_shares(
    events: list[dict[str, Any]], index: dict[str, tuple[str, bool]]
) -> dict[str, Any]:
    """Milliseconds per :data:`GROUPS` entry of the LAST run in one session's onnxruntime
    profile (``events``: its JSON; earlier runs are warm-up), and their total."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    lo, hi = (runs[-1]["ts"], runs[-1]["ts"] + runs[-1]["dur"]) if runs else (0, float("inf"))
    ms = dict.fromkeys(GROUPS, 0.0)
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if not lo <= e.get("ts", 0) <= hi:
            continue
        node = name[: -len("_kernel_time")]
        op = str((e.get("args") or {}).get("op_name", ""))
        ms[classify(op, node, index)] += float(e.get("dur", 0)) / 1e3
    return {
        "ms": ms,
        "total_ms": sum(ms.values()),
        "run_ms": runs[-1]["dur"] / 1e3 if runs else None,
    }


class _Timed:
    """An onnxruntime session that logs each run's wall time and input shapes."""

    def __init__(self, sess: Any, graph: str, calls: list[dict[str, Any]]) -> None:
        self._s, self._graph, self._calls = sess, graph, calls

    def run(self, names: Any, feeds: dict[str, Any], *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = self._s.run(names, feeds, *a, **k)
        self._calls.append(
            {
                "graph": self._graph,
                "s": time.perf_counter() - t,
                "shapes": {n: list(getattr(v, "shape", ())) for n, v in feeds.items()},
            }
        )
        return out

    def __getattr__(self, a: str) -> Any:
        return getattr(self._s, a)


def _patch_sessions(profile_dir: str | None) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """Make every onnxruntime session this process opens for a bundle's graphs log its runs
    (and, with ``profile_dir``, profile them there); return the run log and the (path, session)
    list. The int8 host probe (guard/backends/_int8_probe.py, run once before an int8 member
    opens) is no graph of the bundle: opened as it is."""
    import onnxruntime as ort
    from spotstop.guard.backends._int8_probe import PROBE_FILE

    calls: list[dict[str, Any]] = []
    sessions: list[tuple[str, Any]] = []
    orig = ort.InferenceSession

    def make(path: Any, sess_options: Any = None, providers: Any = None, **kw: Any) -> Any:
        if Path(str(path)) == PROBE_FILE:
            return orig(path, sess_options=sess_options, providers=providers, **kw)
        if profile_dir:
            sess_options = sess_options or ort.SessionOptions()
            sess_options.enable_profiling = True
            sess_options.profile_file_prefix = str(Path(profile_dir) / Path(str(path)).stem)
        s = orig(path, sess_options=sess_options, providers=providers, **kw)
        sessions.append((str(path), s))
        return _Timed(s, Path(str(path)).stem, calls)

    ort.InferenceSession = make
    return calls, sessions


def _shares_of(sessions: list[tuple[str, Any]]) -> dict[str, Any]:
    """Per graph (file stem): the last run's profiled milliseconds by group."""
    out = {}
    for path, s in sessions:
        f = s.end_profiling()
        if not f:
            continue
        events = json.loads(Path(f).read_text(encoding="utf-8"))
        out[Path(path).stem] = profile_shares(events, graph_index(path))
    return out


def child_latency(kind: str, where: str, name: str, n: str, dtype: str, profile: str) -> None:
    """Child process: load member ``name`` (``kind`` torch: the folder ``where`` in ``dtype``;
    onnx: the bundle ``where``), score one warm-up scene, then ``n`` scenes one a call; print
    their times, scores, prompt tokens and, for onnx, each call's time per graph and the
    decoder's input shape. ``profile`` (a folder, or "" for none): instead, score one warm-up
    and one scene with onnxruntime profiling on and print the last scene's time shares."""
    calls: list[dict[str, Any]] = []
    sessions: list[tuple[str, Any]] = []
    if kind == "torch":
        from spotstop.guard import load_member

        m = load_member(where, name=name, backend="torch", dtype=dtype)
    else:
        calls, sessions = _patch_sessions(profile or None)
        from spotstop.guard import load_bundle, load_bundle_member

        b = load_bundle(where)
        m = load_bundle_member(b, next(bm for bm in b.members if bm.name == name))
    from spotstop.export.scenes import demo_scenes

    scenes = demo_scenes(2 if profile else int(n), seed=7)
    t = time.perf_counter()
    m.score(scenes[:1])
    first = time.perf_counter() - t
    if profile:
        m.score(scenes[1:2])
        print(json.dumps({"shares": _shares_of(sessions)}))
        return
    times, scores, tokens, graphs, decoder_shape = [], [], [], [], []
    for s in scenes:
        calls.clear()
        t = time.perf_counter()
        [r] = m.score([s])
        times.append(time.perf_counter() - t)
        scores.append(r.score)
        tokens.append(r.n_prompt_tokens)
        per: dict[str, float] = {}
        for c in calls:
            key = "decoder" if c["graph"].startswith("decoder") else c["graph"]
            per[key] = per.get(key, 0.0) + c["s"]
            if key == "decoder":
                decoder_shape.append(c["shapes"].get("input_ids"))
        graphs.append(per)
    print(
        json.dumps(
            {
                "first_s": first,
                "times_s": times,
                "scores": scores,
                "tokens": tokens,
                "graph_s": graphs,
                "decoder_shapes": decoder_shape,
            }
        )
    )


def peer_feeds(
    inputs: list[Any], batch: int, length: int, vocab: int = 100, head_size: int = 1
) -> dict[str, Any]:
    """Prefill feeds for an onnxruntime-genai decoder from its graph inputs (``inputs``:
    ``session.get_inputs()``): ``input_ids`` of ``batch`` x ``length`` seeded tokens, the
    attention mask all ones, position ids counting up (3 rows where the graph asks for
    multimodal rotary positions), every past state empty (past length 0) or zero; the
    cache's ``kv_cache_dim`` is ``head_size`` (genai_config.json's)."""
    import numpy as np

    types = {
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
    }
    known = {
        "batch_size": batch,
        "sequence_length": length,
        "total_sequence_length": length,
        "past_sequence_length": 0,
        "kv_cache_dim": head_size,
    }
    rng = np.random.default_rng(0)
    feeds = {}
    for i in inputs:
        dt = types.get(i.type)
        if dt is None:
            raise ValueError(f"peer input {i.name}: type {i.type} not handled")
        shape = [d if isinstance(d, int) else known.get(str(d), 1) for d in i.shape]
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(1, vocab, size=shape).astype(dt)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones(shape, dt)
        elif i.name == "position_ids":
            feeds[i.name] = np.broadcast_to(np.arange(length, dtype=dt), shape).copy()
        else:
            feeds[i.name] = np.zeros(shape, dt)
    return feeds


def _peer_position_fix(g: Any) -> bool:
    """onnxruntime-genai 0.18's builder declares Qwen3.5's ``position_ids`` as 3 x batch x
    length (multimodal rotary) even when the config has no ``mrope_section`` and the graph
    feeds them to plain ``RotaryEmbedding`` nodes, which reject 3 dimensions: declare them
    batch x length there (in ``g``, in place). True when it did."""
    users = {n.op_type for n in g.graph.node if "position_ids" in n.input}
    for i in g.graph.input:
        dims = i.type.tensor_type.shape.dim
        if i.name == "position_ids" and len(dims) == 3 and users == {"RotaryEmbedding"}:
            del dims[0]
            return True
    return False


def child_peer(model_dir: str, batch: str, length: str, n: str, profile: str) -> None:
    """Child process (the peer's venv): the onnxruntime-genai decoder in ``model_dir``,
    prefill of ``batch`` x ``length`` tokens, one warm-up then ``n`` timed runs; then one
    profiled run's time shares (``profile``: a folder). Prints its operators, inputs, times."""
    import collections

    import onnx
    import onnxruntime as ort

    cfg = json.loads((Path(model_dir) / "genai_config.json").read_text(encoding="utf-8"))
    dec = cfg["model"]["decoder"]
    path = Path(model_dir) / dec.get("filename", "model.onnx")
    g = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(n.op_type for n in g.graph.node)
    bits = collections.Counter(
        a.i
        for n in g.graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "bits"
    )
    acc = sorted(
        {
            a.i
            for n in g.graph.node
            if n.op_type == "MatMulNBits"
            for a in n.attribute
            if a.name == "accuracy_level"
        }
    )
    block = sorted(
        {
            a.i
            for n in g.graph.node
            if n.op_type == "MatMulNBits"
            for a in n.attribute
            if a.name == "block_size"
        }
    )
    vocab = int(cfg["model"].get("vocab_size", 100))
    fixed = _peer_position_fix(g)
    if fixed:  # a copy beside the original: the same external weights file
        path = path.with_name(path.stem + ".spotstop-positions.onnx")
        onnx.save(g, str(path))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    head = int(dec.get("head_size", 1))
    feeds = peer_feeds(sess.get_inputs(), int(batch), int(length), min(vocab, 100), head)
    outs = [o.name for o in sess.get_outputs()][:1]
    t = time.perf_counter()
    sess.run(outs, feeds)
    first = time.perf_counter() - t
    times = []
    for _ in range(int(n)):
        t = time.perf_counter()
        sess.run(outs, feeds)
        times.append(time.perf_counter() - t)
    del sess
    shares = None
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(profile) / "peer")
        ps = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        ps.run(outs, feeds)
        ps.run(outs, feeds)
        events = json.loads(Path(ps.end_profiling()).read_text(encoding="utf-8"))
        shares = profile_shares(events, graph_index(path))
    print(
        json.dumps(
            {
                "first_s": first,
                "times_s": times,
                "ops": dict(ops.most_common()),
                "nbits": {str(k): v for k, v in bits.items()},
                "accuracy_level": acc,
                "block_size": block,
                "inputs": [i.name for i in g.graph.input],
                "outputs": [o.name for o in g.graph.output][:1],
                "shares": shares,
                "position_ids_fixed": fixed,
                "versions": {"onnxruntime": ort.__version__},
            }
        )
    )


def _member_bytes(bundle: Path, name: str) -> int:
    """Bytes of a member's graph files in a bundle (what the device loads)."""
    d = bundle / "members" / name / "onnx"
    if not d.is_dir():
        d = next(p for p in bundle.rglob("onnx") if p.parent.name == name)
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _fmt_b(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def step_build(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    out = res.setdefault("build", {})
    for name in args.members:
        folder = args.work / name
        if (folder / "config.json").is_file() and not args.rebuild:
            out.setdefault(name, {"note": "folder present; not rebuilt in this run"})
            continue
        if args.tiny:  # the tiny TEST pair's member of that architecture, at the real name
            kind = f"tiny-{_budget().RECORDED[name]['model_type']}"
            code = "import sys; from spotstop.export.tiny import build_tiny_member; "
            code += "build_tiny_member(sys.argv[1], sys.argv[2])"
            r = _run(_py(code, kind, str(folder)), log)
        else:
            r = _run(_py(_BUILD, name, str(folder), str(ROOT / "jetson" / "memory_budget.py")), log)
        out[name] = {k: r[k] for k in ("rc", "seconds", "peak_rss_bytes")}
        out[name]["folder_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        if r["rc"] != 0:
            out[name]["error"] = _tail(log)
        res["build_run"] = {"run": _stamp(res)}


def _export(
    args: argparse.Namespace, prec: str, names: list[str], bundle: Path, log: Path
) -> dict[str, Any]:
    """``spotstop export`` of ``names`` at ``prec`` into ``bundle``: the command's figures and,
    when it wrote the bundle, each member's seconds, peak RSS and bytes against the budget."""
    mb = _budget()
    cmd = [sys.executable, "-m", "spotstop.cli", "export", "--precision", prec, "--json"]
    cmd += ["--buckets", str(args.bucket), "--trt", "script", "--out", str(bundle)]
    cmd += ["--name", f"real-{'pair' if len(names) > 1 else names[0]}-{prec}"]
    cmd += shlex.split(args.export_args)
    for name in names:
        cmd += ["--member", str(args.work / name)]
    r = _run(cmd, log)
    rec: dict[str, Any] = {k: r[k] for k in ("cmd", "rc", "seconds", "peak_rss_bytes")}
    rec["bundle"] = str(bundle)
    if r["rc"] != 0:
        rec["error"] = _tail(log)
    try:  # a slip here must not lose the export's own figures
        j = _last_json(r["stdout"]) if r["rc"] == 0 else {"members": []}
        rec["bundle_id"] = j.get("bundle_id")
        for m in j["members"]:
            m["file_bytes"] = _member_bytes(bundle, m["name"])
            if getattr(args, "tiny", False):
                continue  # memory_budget.py predicts the real dimensions, not the tiny pair's
            counts = mb.count(m["name"], mb.build_config(m["name"], mb.RECORDED[m["name"]]))
            try:  # a precision the budget has no bytes rule for: no prediction, still a bundle
                m["predicted_bytes"] = float(mb.weight_bytes(counts, prec))
            except (KeyError, ValueError) as ex:
                m["predicted_bytes"] = None
                m["prediction_error"] = f"{type(ex).__name__}: {ex}"
        rec["members"] = j["members"]
    except Exception as ex:
        rec["error"] = f"{type(ex).__name__}: {ex}; stdout: {r['stdout'][-400:]}"
        rec["rc"] = rec["rc"] or -1
    return rec


def step_export(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    """One ``spotstop export`` of the pair per precision. When the pair's export fails (one
    member beyond its tolerance writes no bundle), each member is exported alone, so a member
    that passes still gets its own bundle to verify and time; the pair's failure is kept."""
    names = args.members
    out = res.setdefault("export", {})
    for prec in args.precisions:
        rec = _export(args, prec, names, args.work / f"bundle-{prec}", log)
        if rec["rc"] != 0 and len(names) > 1:
            rec["alone"] = {
                n: _export(args, prec, [n], args.work / f"bundle-{prec}-{n}", log) for n in names
            }
        rec["run"] = _stamp(res)
        out[prec] = rec


def bundles(res: dict[str, Any], prec: str) -> dict[str, str]:
    """member name → the bundle this run's export wrote it into at ``prec`` (the pair's, else
    its own); a member whose export failed is absent. Never a bundle left by an earlier run."""
    e = res.get("export", {}).get(prec, {})
    if e.get("rc") == 0:
        return {m["name"]: e["bundle"] for m in e.get("members", []) if e.get("bundle")}
    return {
        n: a["bundle"]
        for n, a in e.get("alone", {}).items()
        if a.get("rc") == 0 and a.get("members") and a.get("bundle")
    }


def step_verify(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    out = res.setdefault("verify", {})
    precs = args.precisions if args.precisions_given else list(res.get("export", {}))
    for prec in precs:
        written = sorted(set(bundles(res, prec).values()))
        if not written:
            out[prec] = {
                "rc": None,
                "error": "no bundle: its export failed (see the export table)",
                "run": _stamp(res),
            }
            continue
        runs = []
        for bundle in written:
            cmd = [sys.executable, "-m", "spotstop.cli", "verify-bundle", bundle, "--json"]
            cmd += ["--scenes", str(args.verify_scenes)]
            r = _run(cmd, log)
            rec: dict[str, Any] = {k: r[k] for k in ("cmd", "rc", "seconds", "peak_rss_bytes")}
            try:
                rec["result"] = _last_json(r["stdout"])
            except json.JSONDecodeError:
                rec["error"] = _tail(log)
            runs.append(rec)
        out[prec] = {**runs[0]} if len(runs) == 1 else {"runs": runs}
        out[prec]["run"] = _stamp(res)


def _latency_precisions(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    """``--precisions`` when given, else every precision whose export this store records a
    bundle for (names as the export step wrote them: none is assumed)."""
    if args.precisions_given:
        return list(args.precisions)
    return [p for p in res.get("export", {}) if bundles(res, p)]


def _measure_peaks(log: Path) -> dict[str, Any]:
    """This CPU's peaks, measured now: ``bench/int8_gemm.py`` (one linear layer at
    Qwen3.5-2B's size in every form, on all cores) and its read bandwidth."""
    cmd = [sys.executable, str(ROOT / "bench" / "int8_gemm.py"), "--json", "--no-results"]
    cmd += ["--threads", str(os.cpu_count() or 1), "--repeats", "5"]
    r = _run(cmd, log)
    if r["rc"] != 0:
        return {"error": _tail(log)}
    doc = _last_json(r["stdout"])
    return {**doc["peaks"], "cpu": doc["cpu"], "threads": doc["threads"], "shape": doc["shape"]}


def _decoder_peak(bundle: str, name: str) -> str:
    """Which arithmetic a bundle member's decoder multiplies in: ``int8`` (dynamic int8
    operators, or MatMulNBits at accuracy level 4: int8 dot products) else ``fp32``."""
    import onnx

    d = Path(bundle) / "members" / name / "onnx"
    files = sorted(d.glob("decoder*.onnx")) if d.is_dir() else []
    for f in files[:1]:
        g = onnx.load(str(f), load_external_data=False)
        for n in g.graph.node:
            if n.op_type in ("DynamicQuantizeMatMul", "MatMulInteger", "MatMulIntegerToFloat"):
                return "int8"
            if n.op_type == "MatMulNBits" and any(
                a.name == "accuracy_level" and a.i >= 4 for a in n.attribute
            ):
                return "int8"
    return "fp32"


def _cpu_floor(
    flops: float, nbytes: float, peak_gflops: float, read_gbs: float
) -> dict[str, float]:
    """``spotstop cost``'s roofline (export/cost.py ``roofline``: max(FLOPs / peak, bytes /
    bandwidth)) on this CPU, its peak and bandwidth measured in this run: registered for the
    call as a device of the cost model's table."""
    from spotstop.export import cost

    key = "this CPU (measured)"
    cost.DEVICES[key] = {
        "fp16_tflops": peak_gflops / 1e3,
        "int8_tops": peak_gflops / 1e3,
        "bandwidth_gbs": read_gbs,
    }
    try:
        return cost.roofline(flops, nbytes, key, "fp16")
    finally:
        del cost.DEVICES[key]


def _member_cost(res: dict[str, Any], name: str, precs: list[str]) -> dict[str, Any] | None:
    """``spotstop cost``'s figures of one scene of member ``name`` (export/cost.py
    ``bundle_cost`` on a bundle of this run holding it: its prompt, image grid and score
    plan): FLOPs (at the length the graph runs at), decoder sequence length, parameters."""
    from spotstop.export.cost import bundle_cost

    for p in precs:
        b = bundles(res, p).get(name)
        if not b:
            continue
        try:
            m = next(x for x in bundle_cost(b).members if x.name == name)
        except Exception as ex:  # a cost that cannot be computed leaves the floor n/a
            return {"error": f"{type(ex).__name__}: {ex}"}
        return {
            "flops": float(m.padded_flops or m.total),
            "seq_len": m.workload.seq_len,
            "padded_len": m.padded_len,
            "params": m.params.total,
            "bundle": b,
        }
    return None


def step_latency(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    """Per member, on the same scenes: torch eager fp32 and bf16 (the member folder) and
    onnxruntime at each precision (its bundle), each timed in its own process; each onnx
    bundle profiled once more in another process for its time shares; this CPU's peaks
    measured first, for the roofline floor."""
    precs = _latency_precisions(args, res)
    peaks = _measure_peaks(log)
    out: dict[str, Any] = {}
    floors: dict[str, Any] = {}
    for name in args.members:
        runs: list[tuple[str, str, str | None, str]] = [
            ("torch eager fp32", "torch", str(args.work / name), "float32"),
            ("torch eager bf16", "torch", str(args.work / name), "bfloat16"),
        ]
        runs += [(f"onnxruntime {p}", "onnx", bundles(res, p).get(name), "") for p in precs]
        cost = _member_cost(res, name, precs)
        for label, kind, where, dtype in runs:
            if where is None:
                out.setdefault(name, {})[label] = {
                    "rc": None,
                    "error": "no bundle: this member's export failed validation at this precision",
                }
                continue
            cmd = _child("child_latency", kind, where, name, str(args.scenes), dtype, "")
            r = _run(cmd, log)
            rec: dict[str, Any] = {"rc": r["rc"], "peak_rss_bytes": r["peak_rss_bytes"]}
            if r["rc"] == 0:
                rec.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            else:
                rec["error"] = _tail(log)
            if kind == "onnx" and r["rc"] == 0:
                prof = args.work / "profiles" / f"{name}-{label.split()[-1]}"
                prof.mkdir(parents=True, exist_ok=True)
                pr = _run(_child("child_latency", kind, where, name, "1", "", str(prof)), log)
                if pr["rc"] == 0:
                    rec["shares"] = json.loads(pr["stdout"].strip().splitlines()[-1])["shares"]
                else:
                    rec["shares_error"] = _tail(log, 300)
                rec["bytes"] = _member_bytes(Path(where), name)
                rec["arith"] = _decoder_peak(where, name)
            elif kind == "torch" and cost and "params" in cost:
                rec["bytes"] = cost["params"] * (4 if dtype == "float32" else 2)
                rec["arith"] = "fp32" if dtype == "float32" else "bf16"
            peak = peaks.get(f"{rec.get('arith')}_gflops") or peaks.get(f"{rec.get('arith')}_gops")
            if cost and "flops" in cost and peak and rec.get("bytes"):
                rec["floor"] = _cpu_floor(cost["flops"], rec["bytes"], peak, peaks["read_gbs"])
            out.setdefault(name, {})[label] = rec
        floors[name] = cost
    res["latency"] = out
    res["latency_cost"] = floors
    res["latency_peaks"] = peaks
    res["latency_run"] = {"run": _stamp(res)}


#: the precisions onnxruntime-genai's builder takes (``-p``)
PEER_PRECISIONS = ("int4", "int8", "bf16", "fp16", "fp32")
#: the genai venv (a separate venv, so the product's is not disturbed)
PEER_PYTHON = os.environ.get("SPOTSTOP_PEER_PYTHON", "/work/genai-venv/bin/python")


def peer_precision(ours: str) -> str | None:
    """The builder's ``-p`` for our precision name: the name itself, else its first part
    (``int8-nbits`` → ``int8``, ``int4-trt`` → ``int4``); None when it has none."""
    for p in (ours, ours.split("-")[0]):
        if p in PEER_PRECISIONS:
            return p
    return None


def _peer_tokens(res: dict[str, Any], name: str) -> tuple[int, int] | None:
    """(batch, length) of our decoder's prefill in this store's latency run of ``name``: the
    median call's input_ids shape over every onnxruntime precision's timed scenes."""
    shapes = [
        tuple(s)
        for label, r in res.get("latency", {}).get(name, {}).items()
        if label.startswith("onnxruntime") and r.get("rc") == 0
        for s in r.get("decoder_shapes") or []
        if s
    ]
    if not shapes:
        return None
    shapes.sort(key=lambda s: s[0] * s[1])
    b, length = shapes[len(shapes) // 2]
    return int(b), int(length)


def step_peer(args: argparse.Namespace, res: dict[str, Any], log: Path) -> None:
    """onnxruntime-genai's model builder on the same member folder (same seeded random
    weights), per precision: its export (time, peak RSS; a folder already there is reused),
    then its decoder's prefill at our decoder's token count, timed in the genai venv."""
    out: dict[str, Any] = {}
    python = args.peer_python
    missing = None
    if not Path(python).is_file():
        missing = f"no peer interpreter at {python} (--peer-python): the genai venv is missing"
    else:
        chk = _run([python, "-c", "import onnxruntime_genai.models.builder"], log)
        if chk["rc"] != 0:
            missing = (
                f"{python} cannot import onnxruntime_genai.models.builder (its error is in "
                f"{log}); the builder needs onnx and onnx_ir beside onnxruntime-genai: "
                f"{python} -m pip install onnxruntime-genai onnx onnx_ir"
            )
    for name in args.members:
        rows: dict[str, Any] = {}
        tokens = _peer_tokens(res, name) or (1, args.peer_tokens)
        for ours in args.peer_precisions or _latency_precisions(args, res):
            p = peer_precision(ours)
            rec: dict[str, Any] = {"ours": ours, "peer_precision": p, "tokens": list(tokens)}
            if missing or p is None:
                rec.update(rc=None, error=missing or f"the builder has no precision like {ours!r}")
                rows[ours] = rec
                continue
            folder = args.work / f"peer-{name}-{p}"
            if not (folder / "genai_config.json").is_file() or args.rebuild:
                cmd = [
                    python,
                    "-m",
                    "onnxruntime_genai.models.builder",
                    "-i",
                    str(args.work / name),
                ]
                cmd += [
                    "-o",
                    str(folder),
                    "-p",
                    p,
                    "-e",
                    "cpu",
                    "-c",
                    str(args.work / "peer-cache"),
                ]
                cmd += ["--extra_options", "prune_lm_head=true"]
                b = _run(cmd, log)
                rec["build"] = {k: b[k] for k in ("cmd", "rc", "seconds", "peak_rss_bytes")}
                if b["rc"] != 0:
                    rec.update(rc=b["rc"], error=_tail(log))
                    rows[ours] = rec
                    continue
            else:
                rec["build"] = {"note": "folder present; not rebuilt in this run"}
            rec["folder_bytes"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            prof = args.work / "profiles" / f"peer-{name}-{p}"
            prof.mkdir(parents=True, exist_ok=True)
            cmd = _child(
                "child_peer",
                str(folder),
                str(tokens[0]),
                str(tokens[1]),
                str(args.scenes),
                str(prof),
                python=python,
            )
            r = _run(cmd, log)
            rec["rc"], rec["peak_rss_bytes"] = r["rc"], r["peak_rss_bytes"]
            if r["rc"] == 0:
                rec.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            else:
                rec["error"] = _tail(log)
            rows[ours] = rec
        out[name] = rows
    res["peer"] = out
    res["peer_run"] = {"run": _stamp(res)}


def _stamp(res: dict[str, Any]) -> dict[str, Any]:
    """Which command measured a step's figures, when, and on what (its table says so)."""
    return {
        "command": res.get("argv", ""),
        "started": res.get("environment", {}).get("date", "?"),
        "environment": res.get("environment", {}),
        "members": res.get("members"),
    }


def _subset(rec: dict[str, Any]) -> list[str]:
    """The members a step ran on when its run named fewer than all (``--members``): its
    RESULTS.md section is then its own (``…-NAME``), beside the pair's; else []."""
    asked = (rec.get("run") or {}).get("members") or []
    return list(asked) if set(asked) != set(_budget().RECORDED) else []


def _key(base: str, rec: dict[str, Any]) -> str:
    return base + "".join(f"-{m}" for m in _subset(rec))


def _last_json(text: str) -> Any:
    """The JSON document a command printed last (an indented object from column 0)."""
    start = text.rfind("\n{\n")
    return json.loads(text[start + 1 :] if start >= 0 else text)


def _error_lines(text: str) -> str:
    """The lines of a failed command's log tail that say why (spotstop's own message and the
    outputs beyond tolerance), without the exporter's warnings."""
    keep = [ln.strip() for ln in text.splitlines() if "spotstop" in ln or "max|Δ|" in ln]
    return "; ".join(keep) if keep else text.strip().replace("\n", " ")[-300:]


def _tail(log: Path, n: int = 600) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-n:]


def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    def v(d: str) -> str:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return "absent"

    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions": {d: v(d) for d in ("torch", "transformers", "onnx", "onnxruntime")},
    }


def _run_line(res: dict[str, Any], rec: dict[str, Any]) -> str:
    """ "Measured by COMMAND (date); machine and versions": the run a table's figures came from
    (its step's ``run`` stamp; a record from before the stamps: the store's commands)."""
    run = rec.get("run")
    if run:
        env = run.get("environment", {})
        what = f"`python bench/real_pair.py {run['command']}` ({run['started']})"
    else:
        env = res.get("environment", {})
        what = ", ".join(
            f"`python bench/real_pair.py {c}`"
            + (f" ({res['started'][c]})" if c in res.get("started", {}) else "")
            for c in res.get("commands") or [res.get("argv", "")]
        )
    return (
        f"Measured by {what}; {env.get('cores', '?')} cores, {env.get('ram_gib', '?')} GiB RAM"
        + "".join(f", {k} {v}" for k, v in env.get("versions", {}).items())
        + "."
    )


def _export_rows(prec: str, e: dict[str, Any], what: str) -> list[str]:
    """An export command's rows: each member it wrote, then the whole command."""
    rows = [
        f"| {prec} | {m['name']} | {_quantizer(m)} | {m['seconds']:.0f} s | {_fmt_b(m['peak_rss_bytes'])} | "
        f"{'yes' if m['streamed'] else 'no'} | {_fmt_b(m['file_bytes'])} | "
        f"{_fmt_b(m.get('predicted_bytes'))} | {_share(m['file_bytes'], m.get('predicted_bytes'))} |"
        for m in e["members"]
    ]
    rows.append(
        f"| {prec} | **{what}** (whole command) | | **{e['seconds'] / 60:.1f} min** | "
        f"{_fmt_b(e['peak_rss_bytes'])} | | | | |"
    )
    return rows


def sections(res: dict[str, Any]) -> list[tuple[str, str]]:
    """The RESULTS.md sections this store's figures fill, as (marker key, text): the header
    and member folders (``cpu-real``), then one section per precision for the export and the
    verify step, and the latency table. A run writes only the sections it measured, so a later
    run of one precision leaves another precision's figures as they were measured."""
    out: list[tuple[str, str]] = []
    lines = [
        "## The real pair's dimensions on a CPU workstation (issue #13, item 4)",
        "",
        "Seeded random weights at the real dimensions (TEST WEIGHTS: the scores mean nothing);",
        "each table says which `bench/real_pair.py` command measured it, when, and on what.",
        "",
    ]
    build = res.get("build", {})
    if build:
        lines += [
            "### Member folders (bf16 safetensors)",
            "",
            "| member | built in | peak RSS | folder |",
            "|---|---|---|---|",
        ]
        for name, b in build.items():
            if b.get("rc") not in (0, None):
                lines.append(
                    f"| {name} | FAILED (exit {b['rc']}): {_error_lines(b.get('error', ''))[-200:]} | | |"
                )
            elif "seconds" in b:
                lines.append(
                    f"| {name} | {b['seconds']:.0f} s | {_fmt_b(b['peak_rss_bytes'])} | {_fmt_b(b['folder_bytes'])} |"
                )
            else:
                lines.append(f"| {name} | {b.get('note', '')} | | |")
        lines += ["", _run_line(res, res.get("build_run", {})), ""]
    out.append(("cpu-real", "\n".join(lines)))

    for prec, e in res.get("export", {}).items():
        who = " and ".join(_subset(e)) + " alone" if _subset(e) else "both members"
        lines = [
            f"### `spotstop export` at {prec} ({who}, one command)",
            "",
            "| precision | member | quantizer | export | peak RSS | streamed | graph files | memory_budget.py predicts | files / predicted |",
            "|---|---|---|---|---|---|---|---|---|",
        ]

        ran = " and ".join(_subset(e)) + " alone" if _subset(e) else "the pair"
        if e.get("rc") == 0:
            lines += _export_rows(prec, e, ran)
        else:
            lines.append(
                f"| {prec} | {ran}: FAILED (exit {e.get('rc')}) | | {e.get('seconds', 0) / 60:.1f} min | | | | | |"
            )
            for name, a in e.get("alone", {}).items():
                if a.get("rc") == 0:
                    lines += _export_rows(prec, a, f"{name} alone")
                else:
                    lines.append(
                        f"| {prec} | {name} alone: FAILED (exit {a.get('rc')}) | | {a.get('seconds', 0) / 60:.1f} min | | | | | |"
                    )
        lines.append("")
        errs = []
        if e.get("rc") != 0:
            errs.append(f"- {prec}, {ran}: {_error_lines(e.get('error', ''))}")
        for name, a in e.get("alone", {}).items():
            if a.get("rc") != 0:
                errs.append(f"- {prec}, {name} alone: {_error_lines(a.get('error', ''))}")
        lines += errs + ([""] if errs else [])
        lines.append(_run_line(res, e))
        out.append((_key(f"cpu-real-export-{prec}", e), "\n".join(lines)))

    for prec, v in res.get("verify", {}).items():
        lines = [
            f"### `spotstop verify-bundle` at {prec} (torch reference fp32 vs the bundle)",
            "",
            "| precision | member | scores | max abs Δs | tolerance | Spearman | min | decisions agree | result | max abs Δs by pass |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for one in v.get("runs", [v]):
            r = one.get("result")
            if not r:
                why = one.get("error", "") if one.get("rc") is None else f"exit {one.get('rc')}"
                lines.append(f"| {prec} | FAILED ({why}) | | | | | | | | |")
                continue
            for m in r.get("members", []):
                lines.append(
                    f"| {prec} | {m['name']} | {m['n']} | {m['max_abs_diff']:.3f} | {m['tolerance']} | "
                    f"{m['spearman']:.3f} | {m['min_spearman']} | {m['decision_agreement']:.2f} | "
                    f"{'PASS' if m['ok'] else 'FAIL'} | "
                    + ", ".join(
                        f"{k} {x:.3f}" for k, x in m.get("max_abs_diff_by_pass", {}).items()
                    )
                    + " |"
                )
            lines.append(
                f"| {prec} | whole command | {one['seconds'] / 60:.1f} min, peak RSS {_fmt_b(one['peak_rss_bytes'])} | | | | | | "
                f"**{'PASS' if r.get('ok') else 'FAIL'}** | |"
            )
        lines += ["", _run_line(res, v)]
        out.append((_key(f"cpu-real-verify-{prec}", v), "\n".join(lines)))

    lat = res.get("latency", {})
    if lat:
        out.append((_key("cpu-real-latency", res.get("latency_run", {})), _latency_text(res)))
    if res.get("peer"):
        out.append((_key("cpu-real-peer", res.get("peer_run", {})), _peer_text(res)))
    if res.get("tiny"):
        out = [(k.replace("cpu-real", "cpu-tiny", 1), t) for k, t in out]
    return out


def _median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def _ratio(base: float | None, this: float | None, digits: int = 2) -> str:
    return f"{base / this:.{digits}f}x" if base and this else "n/a"


def _share(a: float, b: float | None) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def _s(x: float | None, digits: int = 2) -> str:
    """Seconds as the tables print them; under 0.1 s in milliseconds (the tiny pair's scenes
    take a few, which ``0.01 s`` would hide)."""
    if x is None:
        return "n/a"
    if abs(x) < 0.1:
        return f"{x * 1e3:.{max(digits - 1, 1)}f} ms"
    return f"{x:.{digits}f} s"


#: issue #24's speed goals, as (what, member it is for or None for every member, test)
GOALS = (
    "our int8 ≥ 7x torch eager fp32",
    "our int8 ≥ 1.5x torch eager bf16",
    "our int8 ≤ 1.5 s per scene (Qwen3.5-2B)",
    "tiny pair: onnxruntime ≥ 2x torch eager",
)


def goal_lines(res: dict[str, Any]) -> list[str]:
    """Each onnxruntime precision against issue #24's goals, from this run's medians (the
    int8 goals read for every precision: which name is "our int8" is the reader's call)."""
    lines = []
    tiny = bool(res.get("tiny"))
    for name, runs in res.get("latency", {}).items():
        f32 = _median(runs.get("torch eager fp32", {}).get("times_s"))
        b16 = _median(runs.get("torch eager bf16", {}).get("times_s"))
        for label, r in runs.items():
            if not label.startswith("onnxruntime") or r.get("rc") != 0:
                continue
            med = _median(r["times_s"])
            if med is None:
                continue
            if tiny:
                ok = f32 is not None and f32 / med >= 2
                lines.append(
                    f"- {name} {label}: {_ratio(f32, med)} torch eager fp32 (goal ≥ 2x: "
                    f"{'met' if ok else 'not met'})"
                )
                continue
            parts = []
            if f32:
                parts.append(
                    f"{f32 / med:.2f}x torch fp32 (≥ 7x: {'met' if f32 / med >= 7 else 'not met'})"
                )
            if b16:
                parts.append(
                    f"{b16 / med:.2f}x torch bf16 (≥ 1.5x: {'met' if b16 / med >= 1.5 else 'not met'})"
                )
            if name.startswith("Qwen3.5"):
                parts.append(f"{med:.2f} s a scene (≤ 1.5 s: {'met' if med <= 1.5 else 'not met'})")
            lines.append(f"- {name} {label}: " + "; ".join(parts))
    return lines


def _latency_text(res: dict[str, Any]) -> str:
    lat = res["latency"]
    peaks = res.get("latency_peaks") or {}
    lines = [
        "### Per-scene latency on this CPU (same scenes, one scene a call, after one warm-up call)",
        "",
        "| member | runtime | median | min | first call | prompt tokens | decoder (of median) | "
        "process peak RSS | vs torch fp32 | vs torch bf16 | roofline floor | median / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in lat.items():
        f32 = _median(runs.get("torch eager fp32", {}).get("times_s"))
        b16 = _median(runs.get("torch eager bf16", {}).get("times_s"))
        for label, r in runs.items():
            if r.get("rc") != 0:
                why = r["error"] if r.get("rc") is None else "FAILED"
                lines.append(f"| {name} | {label} | {why} | | | | | | | | | |")
                continue
            med = statistics.median(r["times_s"])
            dec = _median([g["decoder"] for g in r.get("graph_s") or [] if "decoder" in g])
            fl = r.get("floor")
            floor = (
                f"{_s(fl['bound_s'], 3)} ({r.get('arith')}, {'c' if fl['compute_s'] >= fl['memory_s'] else 'm'})"
                if fl
                else "n/a"
            )
            lines.append(
                f"| {name} | {label} | {_s(med)} | {_s(min(r['times_s']))} | {_s(r['first_s'], 1)} | "
                f"{int(statistics.median(r['tokens']))} | {_s(dec)} | {_fmt_b(r['peak_rss_bytes'])} | "
                f"{_ratio(f32, med)} | {_ratio(b16, med)} | {floor} | "
                f"{_ratio(med, fl['bound_s'] if fl else None, 1)} |"
            )
    lines.append("")
    n = {len(r["times_s"]) for runs in lat.values() for r in runs.values() if r.get("times_s")}
    lines.append(
        f"Scenes timed per runtime: {sorted(n)}; one run, a noisy shared machine. vs torch: the "
        "torch median / this median (above 1: faster). Decoder: the decoder graph's share of "
        "the median scene (onnxruntime; its input shape feeds the peer table)."
    )
    if peaks and "error" not in peaks:
        cpu = peaks.get("cpu", {})
        lines.append(
            f"Roofline floor: `spotstop cost`'s roofline (export/cost.py) of one scene, "
            "max(FLOPs / peak, bytes / bandwidth), FLOPs from `bundle_cost` on this run's bundle "
            "(at the length the graph runs), bytes the bundle's graph files (torch: parameters x "
            "4 or 2), peaks measured in this run by `bench/int8_gemm.py` on "
            f"{peaks.get('threads')} threads (one {' x '.join(map(str, peaks.get('shape', [])))} "
            f"layer): fp32 {peaks['fp32_gflops']:.0f} GFLOP/s, bf16 {peaks['bf16_gflops']:.0f}, "
            f"int8 {peaks['int8_gops']:.0f} GOP/s; read {peaks['read_gbs']:.1f} GB/s; c/m: "
            f"compute/memory bound. CPU {cpu.get('model', '?')}, flags "
            f"{', '.join(cpu.get('flags', []))}."
        )
    elif peaks:
        lines.append(f"Roofline floor: n/a (the peak measurement failed: {peaks['error'][-200:]}).")
    shares = [
        (name, label, g, sh)
        for name, runs in lat.items()
        for label, r in runs.items()
        for g, sh in (r.get("shares") or {}).items()
    ]
    if shares:
        lines += [
            "",
            "Where onnxruntime's time goes (one profiled scene after a warm-up, its own process; "
            "node kernel time by group: linear layers = MatMulNBits / DynamicQuantizeMatMul / "
            "MatMulInteger / a MatMul or Gemm by a weight; Gated-DeltaNet = Qwen3.5's "
            "linear-attention layers; short conv = LFM2's convolution layers; attention = the "
            "attention layers and fused attention operators):",
            "",
            "| member | runtime | graph | " + " | ".join(GROUPS) + " | node time |",
            "|---|---|---|" + "---|" * (len(GROUPS) + 1),
        ]
        for name, label, g, sh in shares:
            tot = sh["total_ms"] or 1.0
            lines.append(
                f"| {name} | {label} | {g} | "
                + " | ".join(f"{100 * sh['ms'][k] / tot:.0f} %" for k in GROUPS)
                + f" | {sh['total_ms']:.0f} ms |"
            )
    goals = goal_lines(res)
    if goals:
        lines += ["", "Against issue #24's speed goals (medians of this run):", "", *goals]
    lines += [
        "",
        _run_line(res, res.get("latency_run", {}))
        + " On the bundles that run's export wrote; a later export does not change this table.",
    ]
    return "\n".join(lines)


def _peer_text(res: dict[str, Any]) -> str:
    lines = [
        "### The peer: onnxruntime-genai's model builder on the same member folders",
        "",
        "Its decoder alone (the builder emits no vision tower for either member: Qwen3.5 and "
        "LFM2-VL are text-only there), last-token logits (`prune_lm_head=true`), prefill of "
        "the token count our decoder ran (batch x length of the median call), one warm-up "
        "then timed runs, in the genai venv; ours: the decoder graph's median time in the "
        "latency table's scenes (their lengths vary about the median call's); peer / ours: "
        "the peer's time over ours (below 1: the peer is faster).",
        "",
        "| member | ours | peer -p | peer emits | build | build peak RSS | tokens | peer prefill median | "
        "our decoder median | peer / ours |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    inputs = {}
    for name, rows in res["peer"].items():
        runs = res.get("latency", {}).get(name, {})
        for ours, r in rows.items():
            if r.get("rc") != 0:
                why = r.get("error", "") if r.get("rc") is None else f"FAILED (exit {r.get('rc')})"
                lines.append(
                    f"| {name} | {ours} | {r.get('peer_precision') or 'n/a'} | {why} | | | | | | |"
                )
                continue
            b = r.get("build") or {}
            built = f"{b['seconds'] / 60:.1f} min" if "seconds" in b else b.get("note", "")
            nb = r.get("nbits") or {}
            emits = ", ".join(
                [f"MatMulNBits {k}-bit x{v}" for k, v in sorted(nb.items())]
                + (
                    [f"acc {'/'.join(map(str, r['accuracy_level']))}"]
                    if r.get("accuracy_level")
                    else []
                )
                + ([f"block {'/'.join(map(str, r['block_size']))}"] if r.get("block_size") else [])
                + [f"MatMul x{r['ops'].get('MatMul', 0)}"]
                + [
                    op
                    for op in ("LinearAttention", "CausalConvWithState", "GroupQueryAttention")
                    if op in r["ops"]
                ]
            )
            peer = _median(r.get("times_s"))
            ours_run = runs.get(f"onnxruntime {ours}", {})
            dec = _median([g["decoder"] for g in ours_run.get("graph_s") or [] if "decoder" in g])
            bt = " x ".join(map(str, r.get("tokens", [])))
            lines.append(
                f"| {name} | {ours} | {r['peer_precision']} | {emits} | {built} | "
                f"{_fmt_b(b.get('peak_rss_bytes'))} | {bt} | {_s(peer, 3)} | {_s(dec, 3)} | "
                f"{_ratio(peer, dec)} |"
            )
            inputs[name] = r.get("inputs", [])
    for name, ins in inputs.items():
        lines.append("")
        lines.append(
            f"{name}: the peer decoder's inputs: {', '.join(f'`{i}`' for i in ins[:8])}"
            + (f" and {len(ins) - 8} more past-state inputs" if len(ins) > 8 else "")
            + "."
        )
    fixed = sorted(
        {n for n, rows in res["peer"].items() for r in rows.values() if r.get("position_ids_fixed")}
    )
    if fixed:
        lines += [
            "",
            f"{', '.join(fixed)}: the builder declared `position_ids` 3 x batch x length "
            "(multimodal rotary) while its RotaryEmbedding nodes take batch x length (the member's "
            "config has no `mrope_section`); timed on a copy of its graph declaring them so.",
        ]
    shares = [
        (n, o, r["shares"])
        for n, rows in res["peer"].items()
        for o, r in rows.items()
        if r.get("shares")
    ]
    if shares:
        lines += [
            "",
            "| member | peer at | " + " | ".join(GROUPS) + " | node time |",
            "|---|---|" + "---|" * (len(GROUPS) + 1),
        ]
        for name, ours, sh in shares:
            tot = sh["total_ms"] or 1.0
            lines.append(
                f"| {name} | {ours} | "
                + " | ".join(f"{100 * sh['ms'][k] / tot:.0f} %" for k in GROUPS)
                + f" | {sh['total_ms']:.0f} ms |"
            )
    lines += ["", _run_line(res, res.get("peer_run", {}))]
    return "\n".join(lines)


def render(res: dict[str, Any]) -> str:
    """All of this store's sections, as one text (what a run prints at its end)."""
    return "\n\n".join(text for _, text in sections(res)) + "\n"


def _quantizer(m: dict[str, Any]) -> str:
    """How a member's int8/int4 weights were chosen, from its ``export --json`` record (an
    export from before the record carried it rounded to nearest: the only method then)."""
    q = m.get("quantizer")
    if not q:
        return "rtn"
    w = q.get("weights")
    if q.get("method") == "gptq" and w:
        return f"gptq ({w['gptq']} of {w['gptq'] + w['round_to_nearest']} weights)"
    return str(q.get("method", "?"))


def write_results(
    res: dict[str, Any], path: Path = RESULTS, since: dict[str, str] | None = None
) -> None:
    """Write the store's sections into ``path``; with ``since`` (the sections as the store
    rendered them before this run), only those this run changed: a section the run did not
    measure keeps what RESULTS.md holds, which may come from another store (e.g. a member
    measured on another day, whose folder this store no longer records)."""
    for key, text in sections(res):
        if since is None or since.get(key) != text:
            write_section(path, key, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Steps: " + ", ".join(STEPS) + ". See the module docstring for what each measures.",
    )
    ap.add_argument("--work", type=Path, required=True, help="folder for members, bundles, results")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps (default: all)")
    ap.add_argument(
        "--precisions",
        default=None,
        metavar="NAMES",
        help="comma-separated precision names (as `spotstop export --precision` takes them). "
        "export: default int8,int4; verify and latency: default every precision whose "
        "export this store records a bundle for",
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="the tiny TEST pair at the real members' names (seconds, not an hour): a trial "
        "of every step; its sections go to WORK/RESULTS.md unless --results is given",
    )
    ap.add_argument(
        "--peer-python",
        default=PEER_PYTHON,
        metavar="PYTHON",
        help="the interpreter of a venv with onnxruntime-genai (the peer step; default "
        "$SPOTSTOP_PEER_PYTHON or /work/genai-venv/bin/python)",
    )
    ap.add_argument(
        "--peer-precisions",
        default=None,
        metavar="NAMES",
        help="our precisions to build the peer at (default: the latency step's); each maps "
        "to the builder's int4/int8/bf16/fp16/fp32 by name",
    )
    ap.add_argument(
        "--peer-tokens",
        type=int,
        default=383,
        help="prefill length for the peer when no latency run of ours recorded one (default 383)",
    )
    ap.add_argument("--bucket", type=int, default=512, help="decoder length bucket (default 512)")
    ap.add_argument("--scenes", type=int, default=4, help="timed scenes per runtime (default 4)")
    ap.add_argument(
        "--verify-scenes",
        type=int,
        default=24,
        help="verify-bundle scenes (default 24: 48 scores; on 12 a real-size int8 bundle "
        "passed by its draw and failed on 48, docs/limits.md)",
    )
    ap.add_argument("--rebuild", action="store_true", help="rebuild member folders that exist")
    ap.add_argument(
        "--members",
        default=None,
        metavar="NAMES",
        help="comma-separated members to export and time (default: both; one alone is exported "
        "as its own bundle)",
    )
    ap.add_argument(
        "--export-args",
        default="",
        metavar="ARGS",
        help="more `spotstop export` options for the export step, as one string (e.g. "
        '"--calibration-scenes 16 --int4-int8 none"); the command in RESULTS.md shows them',
    )
    ap.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = ap.parse_args(argv)
    args.precisions_given = args.precisions is not None
    given = "int8,int4" if args.precisions is None else args.precisions
    args.precisions = [p.strip() for p in given.split(",") if p.strip()]
    args.peer_precisions = [
        p.strip() for p in (args.peer_precisions or "").split(",") if p.strip()
    ] or None
    if args.results is None:
        args.results = args.work / "RESULTS.md" if args.tiny else RESULTS
    known = list(_budget().RECORDED)
    args.members = [m.strip() for m in (args.members or ",".join(known)).split(",") if m.strip()]
    if not args.members or set(args.members) - set(known):
        ap.error(f"--members: choose from {known}; got {args.members}")
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"unknown step(s) {bad}; choose from {list(STEPS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    store = args.work / "real_pair.json"
    res: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {}
    res["environment"] = _environment()
    res["members"] = args.members
    res["tiny"] = bool(args.tiny)
    res.setdefault("commands", [res["argv"]] if res.get("argv") else [])
    res["argv"] = " ".join(sys.argv[1:] if argv is None else argv)
    if res["argv"] not in res["commands"]:
        res["commands"].append(res["argv"])
    res.setdefault("started", {})[res["argv"]] = res["environment"]["date"]  # when each ran
    log = args.work / "real_pair.log"
    before = dict(sections(res)) if store.is_file() else None
    for s in steps:
        print(f"[{time.strftime('%H:%M:%S')}] {s} ...", flush=True)
        globals()[f"step_{s}"](args, res, log)
        store.write_text(json.dumps(res, indent=1), encoding="utf-8")
        write_results(res, args.results, since=before)
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
