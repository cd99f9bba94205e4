"""GPU benchmark of the pair at the REAL dimensions with seeded random weights (issue #5).

One prepared script for a machine with a CUDA GPU (the device tool's H200). Per member
(Qwen3.5-2B, LFM2.5-VL-3B, dimensions as recorded in ``jetson/memory_budget.py``):

1. ``build``  — a member folder at the real dimensions with seeded random weights, made in
   bf16 on the GPU (``spotstop.export.tiny.build_random_member``; the test tokenizer of the tiny pair).
   THESE ARE TEST WEIGHTS: the scores mean nothing; only time and memory are measured.
2. ``torch``  — per-scene latency of torch eager on CUDA through our own backend
   (``guard.load_member(..., backend="torch", device="cuda", dtype="bfloat16")``), one scene
   per call, preprocessing + prompt + forward pass, as a robot asks; peak GPU memory.
3. ``export`` — ``spotstop.export.onnx.export_member`` at the real dimensions, one length bucket (512:
   the member's default visual-token budget — Qwen3.5 256, LFM2-VL 64 — + the prompt); wall time. The export traces and validates on the CPU.
   Precision ``auto``: fp16 where ``tensorrt`` is importable (fp16 engines need fp16 graphs:
   the tensorrt backend refuses engines of another precision than the member's graphs), else
   int8 rounded to nearest (``quantizer="rtn"``: GPTQ, the export's default, spends minutes of
   CPU on calibration and writes the same graphs and bytes, so the device's time goes to
   latency), the precision ``bench/real_pair.py`` exports and times on a CPU workstation (both
   members are large, so the export is streamed: export/memory.py; its peak RSS is recorded).
   The device's onnxruntime is CPU-only, so the ``ort`` step times int8 on its CPU. An fp16 export whose
   fp16 graphs alone fail validation (the Qwen3.5 graph does, on the tiny pair: onnxruntime
   refuses a converted Expand node) is redone in fp32 when the step has time left.
4. ``ort``    — per-scene latency through the onnx backend on every onnxruntime provider there
   (the device's onnxruntime is CPU-only: CPUExecutionProvider).
5. ``trt``    — when ``tensorrt`` is importable: ``spotstop.export.trt.build_engines`` (engines at the
   graphs' precision) and latency through the ``tensorrt`` backend
   (``guard.load_member(..., backend="tensorrt", device="cuda")``).

Each (member, steps) group runs in a child process with a time budget per step: a step that
runs over is ended and recorded as skipped with the reason, and the figures of the other steps
are kept. The whole run stays inside ``--budget-s`` (default 450 s). Every step prints its
progress (flushed). Results go to ``--out`` (default ``$OUT``, else ``$TMPDIR/spotstop-gpu-bench``):
``gpu_bench.json`` (every record), ``gpu_bench.md`` (a section for bench/RESULTS.md: command,
date, GPU, versions, each measured figure with its unit, each skipped step with its reason;
never a figure that this run did not measure) and ``gpu_bench.log``. Exit status: 0 when every
step ran or was skipped with a reason; 1 only for a bug in this script.

Device command (paste into the device tool's ``run`` with ``timeout_s`` 540 and, when the
wheel below was fetched, ``carry`` ``[".whl"]``; without ``.whl`` it runs on the device's own
transformers)::

    if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi; set -o pipefail; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; PYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT --results bench/RESULTS.md 2>&1 | tee $OUT/console.log; cp bench/RESULTS.md $OUT/

Why the wheel: the device's python3 (/opt/torch/.venv, Python 3.12, torch 2.11.0+cu130) has
transformers 5.17.0, which has both ``qwen3_5`` and ``lfm2_vl`` (and passes tests/test_tiny.py,
test_score.py and test_arch.py here), but its SigLIP2 position-embedding resize calls
``F.interpolate(..., antialias=True)``, which the legacy ONNX exporter cannot export
(``UnsupportedOperatorError: aten::_upsample_bilinear2d_aa``): the LFM2-VL vision graph does
not export with it (seen here: tests/test_export.py::test_vision_graph_exports under 5.17.0).
transformers 5.24.0, the version this project is tested with, needs huggingface-hub>=1.31,<3
and tokenizers>=0.23.1,<0.24, which the device has (1.33.0, 0.23.2). Once, here, in the
repository root::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl transformers==5.24.0      # ~12 MB, py3-none-any

Without the wheel the script still runs: the LFM2-VL export is then recorded as skipped with
the exporter's error. No TensorRT and no onnxruntime-gpu on the device (neither fits in the
64 MiB the working tree may carry): ``trt`` is skipped with the reason, ``ort`` runs on the CPU.

Estimates for the H200 machine (16 cores, 128 GiB RAM). Not measurements: the run measures.

=================  ===========  ===========================================================
step               per member   why
=================  ===========  ===========================================================
start + env        10 s         parent imports torch/onnxruntime; each child imports
                                torch + transformers again (5-10 s, two children per member)
build              25-60 s      seeded init in bf16 on the GPU (seconds) + the test
                                tokenizer + writing 4.1 / 5.9 GiB of safetensors
torch              20-40 s      load + warm-up + 8 scenes x 3 calls; ~50-200 ms a scene
                                (Gated-DeltaNet / short-conv run their torch fallbacks:
                                no flash-linear-attention or causal-conv1d there)
export (LFM2-VL)   3-6 min      int8, streamed: 360 s on this repository's 2-core CPU
                                workstation (bench/real_pair.py), peak RSS 18 GiB; the
                                torch phases use the 16 cores there, the weight passes do not
export (Qwen3.5)   4-10 min     int8, streamed, dynamo (compact Gated-DeltaNet graph, one
                                decoder for every length): see bench/RESULTS.md for the
                                CPU figure; runs last, on what is left
ort (CPU EP)       30-60 s      session load of a 3 GiB int8 graph; seconds a scene
trt                0 s          no tensorrt on the device: skipped with the reason
=================  ===========  ===========================================================

So the default run (``--budget-s 450``) is expected to give build + torch figures for both
members within ~3 minutes and to spend the rest on the LFM2-VL export; device time: ~2 min to
start the machine + ~8 min of run. Pass ``--steps build,torch`` for a 3-minute run, or
``--members LFM2.5-VL-3B --steps build,export,ort --step-budget export=420 --budget-s 540``
to give the export the whole run.

Memory at the real dimensions (parameter counts of the config classes on the meta device, as
``jetson/memory_budget.py`` prints them): Qwen3.5-2B 2.21 B parameters → 4.1 GiB in bf16/fp16;
on the GPU with torch eager ~6-7 GiB at peak (the backend reads the 248 320-row output layer
in float32: +1.9 GiB); fp32 8.2 GiB. LFM2.5-VL-3B 3.15 B → 5.9 GiB bf16/fp16, ~7-8 GiB peak
on the GPU (+1 GiB float32 output layer), fp32 11.7 GiB. Host RAM during an export: both
members are large (float32 weights over 2 GiB), so ``export_member`` streams them
(export/memory.py): about the fp32 model plus the tracer's working set (LFM2.5-VL-3B peaked at
18 GiB on the 24 GiB workstation). Disk: both bf16 folders 10 GiB + one member's export at a
time (fp32 graphs 8-13 GB, the int8 graphs and a scratch file beside them).

Here (no GPU), the same code path runs on the tiny TEST pair on the CPU, GPU-only steps
skipped with the reason (``tests/test_bench_gpu.py`` runs it)::

    python bench/gpu.py --tiny --device cpu --out /tmp/gpu-bench
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the device runs this file with its own python3, no install
    sys.path.insert(0, str(ROOT))
#: the rooms that pyproject.toml maps to ``spotstop.<room>`` (package-dir)
_ROOMS = ("cli", "guard", "calibrate", "diagnostics", "export")


def _ensure_spotstop_importable() -> None:
    """Make ``spotstop.<room>`` importable without an install (the device's own python3).

    ``spotstop`` is a namespace package whose rooms are top-level folders mapped by
    pyproject.toml's package-dir; without an install, a folder ``spotstop/`` of links to the
    rooms under a temporary directory stands in, on ``sys.path`` and on ``PYTHONPATH`` for
    the child processes.
    """
    if importlib.util.find_spec("spotstop") is not None:
        return
    shim = Path(tempfile.mkdtemp(prefix="spotstop-shim-"))
    (shim / "spotstop").mkdir()
    for room in _ROOMS:
        (shim / "spotstop" / room).symlink_to(ROOT / room, target_is_directory=True)
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(shim), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    importlib.invalidate_caches()


_ensure_spotstop_importable()

THIS = Path(__file__).resolve()
STEPS = ("build", "torch", "export", "ort", "trt")
#: the two child processes per member: the member itself, then its exported graphs
GROUPS: tuple[tuple[str, ...], ...] = (("build", "torch"), ("export", "ort", "trt"))
#: seconds per step: the real members on the H200 machine / the tiny pair on a CPU
BUDGETS_REAL = {"build": 120.0, "torch": 90.0, "export": 300.0, "ort": 90.0, "trt": 180.0}
BUDGETS_TINY = {"build": 90.0, "torch": 60.0, "export": 120.0, "ort": 60.0, "trt": 30.0}
#: exceptions that, raised from this file, are a bug in this script rather than a finding
_BUG_TYPES = (NameError, TypeError, AttributeError, KeyError, IndexError, AssertionError)
#: the project's tested transformers (see the module doc: the device has 5.17.0)
TESTED_TRANSFORMERS = "5.24.0"


class SkipStep(Exception):
    """A step that cannot run here; the message is the reason."""


# ==========================================================================================
# shared helpers
# ==========================================================================================


def _budget_module() -> Any:
    """jetson/memory_budget.py, whose RECORDED dict holds the real members' configs."""
    spec = importlib.util.spec_from_file_location(
        "memory_budget", ROOT / "jetson" / "memory_budget.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _members(tiny: bool) -> list[tuple[str, str]]:
    """(name, model_type) of the members to measure."""
    if tiny:
        from spotstop.export.tiny import TINY_MEMBERS

        return [(n, n.removeprefix("tiny-")) for n in TINY_MEMBERS]
    return [(n, str(r["model_type"])) for n, r in _budget_module().RECORDED.items()]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "nan"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    return str(v)


def _fig(name: str, value: Any, unit: str) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _safetensors_params(folder: Path) -> int:
    """Parameters stored in a folder's safetensors files (read from their headers)."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                count = 1
                for d in v["shape"]:
                    count *= int(d)
                total += count
    return total


# ==========================================================================================
# the child: runs one member's group of steps, writes one JSON line per event
# ==========================================================================================


class _Recorder:
    """Appends JSON lines to the records file; the watchdog and the steps share it."""

    def __init__(self, path: Path, member: str) -> None:
        self.path = path
        self.member = member
        self.lock = threading.RLock()

    def write(self, **rec: Any) -> None:
        rec.setdefault("member", self.member)
        line = json.dumps(rec, default=str)
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()


def _say(msg: str) -> None:
    print(msg, flush=True)


def _scenes(n: int) -> list[Any]:
    from spotstop.export.scenes import demo_scenes

    return demo_scenes(n, seed=7)


def _latency(member: Any, scenes: list[Any], repeat: int, deadline: float) -> list[dict[str, Any]]:
    """Per-scene latency (one scene per call) until ``deadline``; figures with units."""
    t = time.perf_counter()
    member.score(scenes[:1], strict=False)  # first call: kernels, allocations, sessions
    first = time.perf_counter() - t
    member.score(scenes[:1], strict=False)
    times: list[float] = []
    tokens: list[int] = []
    finite = 0
    planned = repeat * len(scenes)
    for _ in range(repeat):
        for s in scenes:
            if times and time.time() > deadline:
                break
            t = time.perf_counter()
            [r] = member.score([s], strict=False)
            times.append(time.perf_counter() - t)
            tokens.append(r.n_prompt_tokens)
            finite += r.score == r.score and abs(r.score) != float("inf")
    times.sort()
    figs = [
        _fig("median latency", statistics.median(times) * 1e3, "ms/scene"),
        _fig("p90 latency", times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3, "ms/scene"),
        _fig("min latency", times[0] * 1e3, "ms/scene"),
        _fig("first call", first, "s"),
        _fig("timed calls", len(times), f"of {planned} planned"),
        _fig("prompt length", int(statistics.median(tokens)), "tokens (median)"),
        _fig("finite scores", finite, f"of {len(times)}"),
    ]
    return figs


def _cuda_ok(device: str) -> None:
    if not device.startswith("cuda"):
        raise SkipStep(f"needs a CUDA GPU; this run has --device {device}")
    import torch

    if not torch.cuda.is_available():
        raise SkipStep("torch sees no CUDA device (torch.cuda.is_available() is False)")


def _free_torch() -> None:
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# -- steps -----------------------------------------------------------------------------------


def _step_build(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    folder = Path(spec["folder"])
    if folder.exists():
        shutil.rmtree(folder)
    t = time.perf_counter()
    if spec["tiny"]:
        from spotstop.export.tiny import build_tiny_member

        build_tiny_member(spec["member"], folder, seed=spec["seed"])
        how = "tiny pair builder, fp32, CPU"
    else:
        from spotstop.export.tiny import build_random_member

        device = spec["device"]
        build_dev = "cuda" if device.startswith("cuda") else "cpu"
        if build_dev == "cuda":
            import torch

            if not torch.cuda.is_available():
                build_dev = "cpu"
        recorded = _budget_module().RECORDED[spec["member"]]

        def build(dev: str) -> None:
            build_random_member(
                spec["model_type"],
                recorded,
                folder,
                seed=spec["seed"],
                dtype=spec["dtype"],
                device=dev,
            )

        try:
            build(build_dev)
        except Exception as ex:
            if build_dev == "cpu":
                raise
            ctx["notes"].append(f"the build on CUDA failed ({_reason(ex)[:300]}); built on the CPU")
            _say(f"  {ctx['notes'][-1]}")
            _free_torch()
            shutil.rmtree(folder, ignore_errors=True)
            build_dev = "cpu"
            t = time.perf_counter()
            build(build_dev)
        how = f"real dimensions, random weights in {spec['dtype']} on {build_dev}"
    secs = time.perf_counter() - t
    _free_torch()
    ctx["folder"] = folder
    return [
        _fig(f"build ({how})", secs, "s"),
        _fig("parameters", _safetensors_params(folder) / 1e6, "M"),
        _fig("member folder", _dir_bytes(folder) / 2**30, "GiB"),
    ]


def _need_folder(spec: dict[str, Any]) -> Path:
    folder = Path(spec["folder"])
    if not (folder / "config.json").is_file():
        raise SkipStep("no member folder: the build step did not produce one")
    return folder


def _step_torch(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    folder = _need_folder(spec)
    import torch
    from spotstop.guard import load_member

    device = spec["device"]
    cuda = device.startswith("cuda")
    if cuda:
        _cuda_ok(device)
    dtype = spec["dtype"] if cuda else "float32"
    t = time.perf_counter()
    m = load_member(folder, name=spec["member"], backend="torch", device=device, dtype=dtype)
    load = time.perf_counter() - t
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    figs = [_fig(f"load ({dtype}, {device})", load, "s")]
    figs += _latency(m, _scenes(spec["scenes"]), spec["repeat"], deadline)
    if cuda:
        figs.append(_fig("peak GPU memory", torch.cuda.max_memory_allocated() / 2**30, "GiB"))
    del m
    _free_torch()
    return figs


def _export_info_path(spec: dict[str, Any]) -> Path:
    return Path(spec["onnx_root"]) / f"{spec['member']}.export.json"


def _save_export(e: Any, path: Path) -> None:
    d: dict[str, Any] = {}
    for f in dataclasses.fields(e):
        if f.name == "checks":
            continue
        v = getattr(e, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = dataclasses.asdict(v)
        d[f.name] = v
    path.write_text(json.dumps(d, default=str), encoding="utf-8")


def _load_export(spec: dict[str, Any]) -> Any:
    """The MemberExport that the export step wrote (rebuilt from its JSON)."""
    from spotstop.export.onnx import MemberExport
    from spotstop.guard._prompt import RenderedTemplate

    path = _export_info_path(spec)
    if not path.is_file():
        raise SkipStep("no ONNX export: the export step did not produce one")
    d = json.loads(path.read_text(encoding="utf-8"))
    names = {f.name: f for f in dataclasses.fields(MemberExport)}
    kw: dict[str, Any] = {}
    for k, v in d.items():
        if k not in names:
            continue
        if k == "path":
            v = Path(v)
        elif k == "template":
            v = RenderedTemplate(**v)
        elif isinstance(v, list):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        kw[k] = v
    return MemberExport(**kw)


def _step_export(
    spec: dict[str, Any], ctx: dict[str, Any], deadline: float
) -> list[dict[str, Any]]:
    folder = _need_folder(spec)
    from spotstop.export.onnx import ExportValidationError, export_member

    prec = spec["onnx_precision"]
    if prec == "auto":  # fp16 engines where TensorRT is; else int8, as bench/real_pair.py
        prec = "fp16" if importlib.util.find_spec("tensorrt") is not None else "int8"
    out = Path(spec["onnx_root"]) / "members" / spec["member"]
    figs: list[dict[str, Any]] = []
    notes: list[str] = []
    ctx["notes"] = notes

    def export(precision: str) -> Any:
        # rounded to nearest: GPTQ's calibration (minutes of CPU, export/gptq.py) chooses other
        # codes for the same graphs and bytes, so it changes no timing measured here
        return export_member(
            folder,
            out,
            precision=precision,
            buckets=[spec["bucket"]],
            name=spec["member"],
            quantizer="rtn",
        )

    t = time.perf_counter()
    try:
        e = export(prec)
    except Exception as ex:
        spent = time.perf_counter() - t
        left = deadline - time.time()
        fp16_only = isinstance(ex, ExportValidationError) and all(
            f.startswith("[fp16]") for f in ex.failures
        )
        if prec != "fp16" or not fp16_only or left < 1.2 * spent:
            raise
        notes.append(
            f"fp16 export failed after {spent:.0f} s ({type(ex).__name__}: "
            f"{str(ex).splitlines()[0][:300]}); retried in fp32"
        )
        _say(f"  {notes[-1]}")
        prec = "fp32"
        t = time.perf_counter()
        e = export(prec)
    secs = time.perf_counter() - t
    _save_export(e, _export_info_path(spec))
    figs += [
        _fig(f"export_member ({prec}, bucket {spec['bucket']}, on the CPU)", secs, "s"),
        _fig("graph weights (vision + decoder)", e.weight_bytes / 2**30, "GiB"),
        _fig("exported folder", _dir_bytes(out) / 2**30, "GiB"),
        _fig("peak RSS of the export", (e.peak_rss_bytes or 0) / 2**30, "GiB"),
        _fig("exported streamed (float32 weights over 2 GiB)", int(e.streamed), "yes=1"),
        _fig(f"max |Δ| vs torch ({prec} validation)", float(e.max_abs_diff), "logit"),
    ]
    return figs


def _step_ort(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    e = _load_export(spec)
    import onnxruntime as ort
    from spotstop.guard import load_member

    avail = ort.get_available_providers()
    devices = []
    cuda = spec["device"].startswith("cuda")
    if cuda and "TensorrtExecutionProvider" in avail:
        devices.append(("tensorrt", "TensorrtExecutionProvider"))
    if cuda and "CUDAExecutionProvider" in avail:
        devices.append(("cuda", "CUDAExecutionProvider"))
    if "CPUExecutionProvider" in avail:
        devices.append(("cpu", "CPUExecutionProvider"))
    if cuda and not any(d != "cpu" for d, _ in devices):
        ctx["notes"] = [
            f"onnxruntime {ort.__version__} has no GPU provider here ({avail}); CPU only"
        ]
    figs: list[dict[str, Any]] = []
    scenes = _scenes(spec["scenes"])
    for i, (dev, prov) in enumerate(devices):
        # each provider gets an equal share of what is left of the step's time
        share = time.time() + (deadline - time.time()) / (len(devices) - i)
        t = time.perf_counter()
        m = load_member(e.path, name=e.name, backend="onnx", device=dev, template=e.template)
        figs.append(_fig(f"{prov} session load ({e.precision})", time.perf_counter() - t, "s"))
        lat = _latency(m, scenes, spec["repeat"], share)
        figs += [{**f, "name": f"{prov} {f['name']}"} for f in lat]
        del m
        gc.collect()
    return figs


def _step_trt(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    _cuda_ok(spec["device"])
    try:
        import tensorrt
    except Exception as ex:  # ImportError, or a broken install's OSError
        raise SkipStep(
            f"tensorrt is not importable here ({type(ex).__name__}: {ex}); the bundle's "
            "trt/build.sh (trtexec) builds the engines where TensorRT is installed"
        ) from ex
    e = _load_export(spec)
    from spotstop.export.trt import build_engines

    want = e.precision  # the tensorrt backend refuses engines of another precision
    root = Path(spec["onnx_root"])
    t = time.perf_counter()
    built = build_engines(root, [e], max_batch=1, progress=_say)
    secs = time.perf_counter() - t
    if not built:
        raise SkipStep(
            f"spotstop.export.trt.build_engines returned False after {secs:.0f} s (tensorrt "
            f"{tensorrt.__version__} found no usable GPU, or precision {want} is not buildable)"
        )
    figs = [_fig(f"TensorRT {tensorrt.__version__} engine build ({want})", secs, "s")]
    plans = {p.resolve() for p in e.path.rglob("*.plan")}  # members/<name>/trt/ (or root/trt/)
    if (root / "trt").is_dir():
        plans |= {p.resolve() for p in (root / "trt").rglob("*.plan") if e.name in p.parts}
    if plans:
        figs.append(_fig("engine files", sum(p.stat().st_size for p in plans) / 2**30, "GiB"))
    from spotstop.guard.backends import BACKENDS

    if "tensorrt" not in BACKENDS:
        ctx["notes"] = ["latency not measured: guard has no 'tensorrt' backend registered"]
        return figs
    from spotstop.guard import load_member

    t = time.perf_counter()
    try:
        m = load_member(e.path, name=e.name, backend="tensorrt", device="cuda", template=e.template)
    except Exception as ex:
        ctx["notes"] = [
            f"engines built, but the tensorrt backend did not load them: {type(ex).__name__}: {ex}"
        ]
        return figs
    figs.append(_fig("tensorrt backend load", time.perf_counter() - t, "s"))
    figs += [
        {**f, "name": f"TensorRT {f['name']}"}
        for f in _latency(m, _scenes(spec["scenes"]), spec["repeat"], deadline)
    ]
    return figs


_STEP_FUNCS: dict[str, Callable[[dict[str, Any], dict[str, Any], float], list[dict[str, Any]]]] = {
    "build": _step_build,
    "torch": _step_torch,
    "export": _step_export,
    "ort": _step_ort,
    "trt": _step_trt,
}


def _is_bug(ex: BaseException) -> bool:
    """An exception of a bug-like type raised from this file's own code."""
    if not isinstance(ex, _BUG_TYPES):
        return False
    tb = traceback.extract_tb(ex.__traceback__)
    return bool(tb) and Path(tb[-1].filename).resolve() == THIS


def _reason(ex: BaseException) -> str:
    text = str(ex).strip() or repr(ex)
    return f"{type(ex).__name__}: {text[:1500]}"


def _child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    rec = _Recorder(Path(spec["records"]), spec["member"])
    state: dict[str, Any] = {"step": None, "deadline": None, "rest": []}
    grace = float(spec["grace_s"])

    def watchdog() -> None:  # ends this process when a blocking step overruns its budget
        while True:
            time.sleep(0.5)
            step, dl = state["step"], state["deadline"]
            if step is None or dl is None or time.time() < dl + grace:
                continue
            with rec.lock:  # re-entrant: the step cannot report its end meanwhile
                if state["step"] != step:
                    continue
                rec.write(
                    step=step,
                    event="end",
                    status="skipped",
                    reason=f"time budget of {state['budget']:.0f} s exceeded"
                    + (" (what the run's --budget-s had left)" if state["capped"] else "")
                    + "; the step was ended",
                    seconds=time.time() - state["t0"],
                )
                for s in state["rest"]:
                    rec.write(
                        step=s,
                        event="end",
                        status="skipped",
                        reason=f"not reached: {step} ran over its time budget",
                        seconds=0.0,
                    )
                _say(f"  [{spec['member']}] {step}: time budget exceeded, ending the child")
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    ctx: dict[str, Any] = {}
    steps = list(spec["steps"])
    for i, step in enumerate(steps):
        own = float(spec["budgets"][step])
        budget = min(own, float(spec["overall_deadline"]) - time.time())
        if budget <= 1:
            rec.write(
                step=step,
                event="end",
                status="skipped",
                reason="not started: the overall time budget (--budget-s) is spent",
                seconds=0.0,
            )
            continue
        _say(f"  [{spec['member']}] {step}: start (budget {budget:.0f} s)")
        ctx["notes"] = []
        t0 = time.time()
        state.update(step=step, deadline=t0 + budget, budget=budget, capped=budget < own, t0=t0)
        state["rest"] = steps[i + 1 :]
        rec.write(step=step, event="start", budget_s=budget)
        status, reason, figs = "ok", None, []
        try:
            figs = _STEP_FUNCS[step](spec, ctx, t0 + budget)
        except SkipStep as ex:
            status, reason = "skipped", str(ex)
        except Exception as ex:
            status = "error" if _is_bug(ex) else "skipped"
            reason = _reason(ex)
            traceback.print_exc()
        with rec.lock:
            state.update(step=None, deadline=None)
        rec.write(
            step=step,
            event="end",
            status=status,
            reason=reason,
            figures=figs,
            notes=list(ctx.get("notes") or []),
            seconds=time.time() - t0,
        )
        _say(
            f"  [{spec['member']}] {step}: {status} in {time.time() - t0:.1f} s"
            + (f" — {reason}" if reason else "")
        )
        for f in figs:
            _say(f"      {f['name']}: {_fmt(f['value'])} {f['unit']}")
    return 0


# ==========================================================================================
# the parent: environment, schedule, children, report
# ==========================================================================================


def _ram_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return None


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_count": os.cpu_count(),
        "ram_gib": _ram_gib(),
        "device": device,
        "versions": {},
        "gpu": None,
    }
    for dist in (
        "torch",
        "transformers",
        "onnx",
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxscript",
        "tensorrt",
        "tokenizers",
        "huggingface-hub",
        "numpy",
    ):
        env["versions"][dist] = _version(dist)
    spec = importlib.util.find_spec("transformers")
    env["transformers_from"] = str(Path(spec.origin).parent) if spec and spec.origin else None
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": p.name, "memory_gib": p.total_memory / 2**30}
    except Exception as ex:  # report, never fail the run on it
        env["torch_error"] = _reason(ex)
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            env["nvidia_smi"] = out.stdout.strip().splitlines()[0]
    try:
        import onnxruntime as ort

        env["ort_providers"] = ort.get_available_providers()
    except Exception as ex:
        env["ort_providers"] = [f"unavailable: {_reason(ex)}"]
    try:
        import tensorrt

        env["versions"]["tensorrt"] = tensorrt.__version__
    except Exception as ex:
        env["tensorrt"] = f"not importable ({type(ex).__name__})"
    return env


class _Log:
    """Prints (flushed) and keeps every line for gpu_bench.log."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, msg: str, stamp: bool = True) -> None:
        line = f"[{time.time() - self.t0:6.1f} s] {msg}" if stamp else msg
        with self.lock:
            self.lines.append(line)
            print(line, flush=True)


def _relay(stream: Any, log: _Log) -> None:
    for line in iter(stream.readline, ""):
        log("    | " + line.rstrip("\n"), stamp=False)


def _child_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TMPDIR=str(tmp),  # an export ended at its budget leaves its temporary files here
        PYTHONUNBUFFERED="1",
        TQDM_DISABLE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )
    return env


def _run_group(
    member: str,
    model_type: str,
    steps: tuple[str, ...],
    args: argparse.Namespace,
    budgets: dict[str, float],
    overall_deadline: float,
    work: Path,
    log: _Log,
) -> list[dict[str, Any]]:
    """Run one member's group of steps in a child process; its end records."""
    budgets = _member_budgets(budgets, member)
    records = work / f"records-{member}-{steps[0]}.jsonl"
    records.unlink(missing_ok=True)
    grace = 2.0 if args.tiny else 10.0
    spec = {
        "member": member,
        "model_type": model_type,
        "steps": list(steps),
        "tiny": args.tiny,
        "device": args.device,
        "dtype": args.dtype,
        "seed": args.seed,
        "scenes": args.scenes,
        "repeat": args.repeat,
        "bucket": args.bucket,
        "onnx_precision": args.onnx_precision,
        "folder": str(work / "members" / member),
        "onnx_root": str(work / "onnx"),
        "records": str(records),
        "budgets": budgets,
        "overall_deadline": overall_deadline,
        "grace_s": grace,
    }
    (work / "onnx").mkdir(parents=True, exist_ok=True)
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    spec_path = work / f"spec-{member}-{steps[0]}.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    # backstop: the child's own watchdog ends overrunning steps; this ends a hung child
    limit = min(
        sum(budgets[s] for s in steps) + grace * len(steps) + 30,
        overall_deadline - time.time() + grace + 30,
    )
    log(f"{member}: {' + '.join(steps)} in a child process (at most {limit:.0f} s)")
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-u", str(THIS), "--_child", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        cwd=str(ROOT),
        env=_child_env(tmp),
        start_new_session=True,  # its own process group: ended as a whole at the backstop
    )
    relay = threading.Thread(target=_relay, args=(proc.stdout, log), daemon=True)
    relay.start()
    killed = False
    try:
        rc = proc.wait(timeout=max(1.0, limit))
    except subprocess.TimeoutExpired:
        killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group of the child this script started
        rc = proc.wait()
    relay.join(timeout=10)
    events: list[dict[str, Any]] = []
    if records.is_file():
        for line in records.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    ends = {e["step"]: e for e in events if e.get("event") == "end"}
    started = {e["step"] for e in events if e.get("event") == "start"}
    if killed:
        why = f"the child was ended after {time.time() - t0:.0f} s (backstop of {limit:.0f} s)"
    elif rc < 0:
        why = f"the child died from signal {-rc}" + (" (out of memory?)" if -rc == 9 else "")
    elif rc != 0:
        why = f"the child exited with status {rc} (see the log above)"
    else:
        why = "the child ended without reporting this step"
    out = []
    for s in steps:
        if s in ends:
            out.append(ends[s])
        elif s in started:
            out.append(
                {
                    "member": member,
                    "step": s,
                    "status": "skipped",
                    "reason": f"{why} during this step",
                    "seconds": None,
                }
            )
        else:
            out.append(
                {
                    "member": member,
                    "step": s,
                    "status": "skipped",
                    "reason": f"not reached: {why}",
                    "seconds": None,
                }
            )
    if rc > 0 and not killed:
        # a Python exception outside every step: a bug in this script
        for r in out:
            if r.get("status") != "ok" and r["step"] not in ends:
                r["status"] = "error"
    return out


def _command_text(argv: list[str]) -> str:
    out_env = os.environ.get("OUT")
    parts = []
    for a in argv:
        if out_env and a == out_env:
            parts.append("$OUT")
        elif out_env and a.startswith("--out=") and a[6:] == out_env:
            parts.append("--out=$OUT")
        else:
            parts.append(shlex.quote(a))
    return "PYTHONUNBUFFERED=1 python3 bench/gpu.py" + ("" if not parts else " " + " ".join(parts))


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|")


def _markdown(report: dict[str, Any]) -> str:
    env = report["env"]
    v = env["versions"]
    gpu = env.get("gpu")
    gpu_text = (
        f"{gpu['name']} ({gpu['memory_gib']:.0f} GiB)" if gpu else f"none (device {env['device']})"
    )
    if env.get("nvidia_smi"):
        gpu_text += f"; nvidia-smi: {env['nvidia_smi']}"
    title_gpu = gpu["name"] if gpu else "no GPU"
    ver = [
        f"Python {env['python']}",
        f"torch {v.get('torch')}"
        + (f" (CUDA {env['torch_cuda']})" if env.get("torch_cuda") else ""),
        f"transformers {v.get('transformers')}",
        f"onnx {v.get('onnx')}",
        f"onnxruntime {v.get('onnxruntime') or v.get('onnxruntime-gpu')} "
        f"(providers: {', '.join(env.get('ort_providers') or [])})",
        f"onnxscript {v.get('onnxscript')}",
        f"tensorrt {v['tensorrt']}" if v.get("tensorrt") else "tensorrt: not installed",
    ]
    kind = (
        "the tiny TEST pair (export/tiny.py)"
        if report["tiny"]
        else "the real dimensions (jetson/memory_budget.py RECORDED) with seeded random weights"
    )
    lines = [
        f"### {env['date_utc'][:10]} — {title_gpu} — bench/gpu.py{' --tiny' if report['tiny'] else ''}",
        "",
        "Command (repository root):",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"- date: {env['date_utc']}",
        f"- GPU: {gpu_text}",
        f"- host: {env['platform']}, {env['cpu_count']} CPU cores"
        + (f", {env['ram_gib']:.0f} GiB RAM" if env.get("ram_gib") else ""),
        f"- versions: {', '.join(ver)}",
    ]
    if env.get("transformers_from") and os.environ.get("PYTHONPATH"):
        lines.append(f"- transformers loaded from {env['transformers_from']} (PYTHONPATH)")
    lines += [
        f"- members: {kind}; test tokenizer — the scores mean nothing, only time and memory "
        f"were measured; seed {report['seed']}, torch eager in "
        f"{report['dtype'] if env['device'].startswith('cuda') else 'float32'} on "
        f"{env['device']}, ONNX length bucket {report['bucket']}",
        f"- latency: one scene per call (image decode + preprocessing + prompt + forward), "
        f"{report['scenes']} generated scenes x {report['repeat']} after two warm-up calls",
        f"- wall time of the run: {report['wall_s']:.0f} s (budget {report['budget_s']:.0f} s)",
        "",
        "| member | step | figure | value | unit |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for r in report["records"]:
        for f in r.get("figures") or []:
            lines.append(
                f"| {_cell(r['member'])} | {r['step']} | {_cell(f['name'])} | "
                f"{_cell(_fmt(f['value']))} | {_cell(f['unit'])} |"
            )
    notes = [(r, n) for r in report["records"] for n in r.get("notes") or []]
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"- {r['member']} {r['step']}: {n}" for r, n in notes]
    skipped = [r for r in report["records"] if r["status"] != "ok"]
    lines += ["", "Skipped steps (no figure is reported for them):", ""]
    if skipped:
        lines += [
            f"- {r['member']} {r['step']} ({r['status']}): {r.get('reason')}" for r in skipped
        ]
    else:
        lines.append("- none")
    return "\n".join(lines) + "\n"


def _table(records: list[dict[str, Any]]) -> str:
    rows = [("member", "step", "status", "figure", "value", "unit")]
    for r in records:
        figs = r.get("figures") or []
        if not figs:
            rows.append((r["member"], r["step"], r["status"], "-", "-", str(r.get("reason"))[:90]))
        for f in figs:
            rows.append(
                (r["member"], r["step"], r["status"], f["name"], _fmt(f["value"]), f["unit"])
            )
    widths = [min(60, max(len(str(row[i])) for row in rows)) for i in range(5)]
    out = []
    for row in rows:
        cells = [str(c)[:60].ljust(widths[i]) if i < 5 else str(c) for i, c in enumerate(row)]
        out.append("  ".join(cells))
    return "\n".join(out)


def _write_report(
    out_dir: Path, report: dict[str, Any], log: _Log, results: Path | None = None
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if results is not None:  # its own section of bench/RESULTS.md (bench/_results.py)
        sys.path.insert(0, str(THIS.parent))
        from _results import write_section

        write_section(results, "gpu", _markdown(report))
    (out_dir / "gpu_bench.json").write_text(
        json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8"
    )
    (out_dir / "gpu_bench.md").write_text(_markdown(report), encoding="utf-8")
    (out_dir / "gpu_bench.log").write_text("\n".join(log.lines) + "\n", encoding="utf-8")


def _parse_budgets(items: list[str], tiny: bool) -> dict[str, float]:
    """Step budgets in seconds: ``STEP`` for every member, ``MEMBER:STEP`` for one."""
    budgets = dict(BUDGETS_TINY if tiny else BUDGETS_REAL)
    for item in items:
        key, sep, val = item.partition("=")
        step = key.rpartition(":")[2]
        try:
            seconds = float(val)
        except ValueError:
            seconds = -1.0
        if not sep or step not in STEPS or seconds <= 0:
            raise SystemExit(
                f"--step-budget takes [MEMBER:]STEP=SECONDS (seconds > 0) with STEP in "
                f"{list(STEPS)}; got {item!r}"
            )
        budgets[key] = seconds
    return budgets


def _member_budgets(budgets: dict[str, float], member: str) -> dict[str, float]:
    return {s: budgets.get(f"{member}:{s}", budgets[s]) for s in STEPS}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench/gpu.py",
        description=(
            "Benchmark the pair at the real dimensions with seeded random weights on a CUDA GPU: "
            "build, torch eager latency, ONNX export, onnxruntime latency, TensorRT build and "
            "latency. Each step has a time budget; a step that cannot run is skipped with the "
            "reason. Writes gpu_bench.json / .md / .log to --out. See the module docstring for "
            "the device command and the estimates."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  PYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT      # the device run (H200)\n"
            "  python bench/gpu.py --tiny --device cpu --out /tmp/b    # same code path, tiny pair\n"
            "  python bench/gpu.py --members LFM2.5-VL-3B --steps build,torch --budget-s 200\n"
            "steps: build, torch, export, ort, trt; default budgets (s): real "
            + ", ".join(f"{k}={v:.0f}" for k, v in BUDGETS_REAL.items())
            + "; tiny "
            + ", ".join(f"{k}={v:.0f}" for k, v in BUDGETS_TINY.items())
            + "\nexit status: 0 when every step ran or was skipped with a reason; 1 on a bug here."
        ),
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: $OUT, else $TMPDIR/spotstop-gpu-bench)",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="the tiny TEST pair instead of the real dimensions"
    )
    ap.add_argument(
        "--device",
        default="cuda",
        help="'cuda', 'cuda:N' or 'cpu' (default cuda; on cpu the GPU-only steps are skipped with the reason)",
    )
    ap.add_argument(
        "--members", default="", help="comma-separated member names (default: both members)"
    )
    ap.add_argument(
        "--steps", default=",".join(STEPS), help="comma-separated steps to run (default: all five)"
    )
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16"),
        help="dtype of the random weights and of torch eager on CUDA (default bfloat16; the CPU uses float32)",
    )
    ap.add_argument(
        "--scenes", type=int, default=8, help="generated scenes per latency step (default 8)"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed passes over the scenes (default 3)"
    )
    ap.add_argument(
        "--bucket", type=int, default=None, help="ONNX length bucket (default 512; tiny 256)"
    )
    ap.add_argument(
        "--onnx-precision",
        default="auto",
        choices=("auto", "fp32", "fp16", "int8", "int4"),
        help="ONNX precision (default auto: fp16 where tensorrt is importable, else int8, the "
        "precision bench/real_pair.py measures on a CPU workstation)",
    )
    ap.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed (default 0)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-time budget of the whole run (default 450; tiny 600)",
    )
    ap.add_argument(
        "--step-budget",
        action="append",
        default=[],
        metavar="STEP=S",
        help="one step's budget in seconds, for every member (STEP=S) or one (MEMBER:STEP=S); "
        "repeatable",
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="work folder for members and exports (default: a temporary folder, removed at the end)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="also write the markdown into this file's gpu section (bench/RESULTS.md; the "
        "device command copies it to $OUT)",
    )
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    if args._child:
        return _child_main(args._child)
    t0 = time.time()
    log = _Log(t0)
    budget_s = args.budget_s if args.budget_s is not None else (600.0 if args.tiny else 450.0)
    overall_deadline = t0 + budget_s - 5.0  # leaves time to write the report
    if args.bucket is None:
        args.bucket = 256 if args.tiny else 512
    budgets = _parse_budgets(args.step_budget, args.tiny)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise SystemExit(f"--steps: unknown step(s) {bad}; steps are {list(STEPS)}")
    members = _members(args.tiny)
    if args.members:
        wanted = [m.strip() for m in args.members.split(",") if m.strip()]
        unknown = [m for m in wanted if m not in dict(members)]
        if unknown:
            raise SystemExit(f"--members: unknown {unknown}; members are {[m for m, _ in members]}")
        members = [m for m in members if m[0] in wanted]
    out_dir = args.out or Path(
        os.environ.get("OUT") or Path(tempfile.gettempdir()) / "spotstop-gpu-bench"
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="spotstop-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    log(
        f"bench/gpu.py: {'tiny TEST pair' if args.tiny else 'real dimensions, random weights'} on {args.device}; budget {budget_s:.0f} s; work {work}; out {out_dir}"
    )
    env = _environment(args.device)
    log(
        "environment: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f"; GPU {env['gpu']}; onnxruntime providers {env.get('ort_providers')}"
    )
    if env["versions"].get("transformers") != TESTED_TRANSFORMERS:
        log(
            f"note: transformers {env['versions'].get('transformers')} here; the project is "
            f"tested with {TESTED_TRANSFORMERS} (before it, the LFM2-VL vision export fails on "
            "aten::_upsample_bilinear2d_aa): carry the wheel as the docstring says"
        )
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(work).free / 2**30
        env["work_free_gib"] = free
        log(f"free disk under the work folder: {free:.0f} GiB")

    report: dict[str, Any] = {
        "command": _command_text(raw),
        "argv": raw,
        "tiny": args.tiny,
        "seed": args.seed,
        "dtype": args.dtype,
        "bucket": args.bucket,
        "scenes": args.scenes,
        "repeat": args.repeat,
        "budget_s": budget_s,
        "budgets": budgets,
        "env": env,
        "records": [],
        "wall_s": 0.0,
    }
    # The members first (the sure figures), then the exports: legacy-exported decoders (LFM2-VL)
    # before the much slower dynamo-exported ones (Qwen3.5).
    from spotstop.export.configs import get_export_config

    def dynamo_export(member: tuple[str, str]) -> bool:
        return get_export_config(member[1]).decoder_exporter == "dynamo"

    order: list[tuple[tuple[str, str], tuple[str, ...]]] = [(m, GROUPS[0]) for m in members]
    order += [(m, GROUPS[1]) for m in sorted(members, key=dynamo_export)]
    try:
        for (name, mtype), group in order:
            todo = tuple(s for s in group if s in steps)
            if not todo:
                continue
            if overall_deadline - time.time() < (3 if args.tiny else 20):
                for s in todo:
                    report["records"].append(
                        {
                            "member": name,
                            "step": s,
                            "status": "skipped",
                            "reason": "not started: the overall time budget (--budget-s) is spent",
                            "seconds": None,
                        }
                    )
                log(f"{name}: {' + '.join(todo)} skipped — the overall time budget is spent")
                continue
            recs = _run_group(name, mtype, todo, args, budgets, overall_deadline, work, log)
            report["records"].extend(recs)
            if not args.keep:  # disk: a real member's fp32 graphs are 8-13 GB (+ temporaries)
                shutil.rmtree(work / "tmp", ignore_errors=True)
                if "export" in todo:
                    shutil.rmtree(work / "onnx" / "members" / name, ignore_errors=True)
            report["wall_s"] = time.time() - t0
            _write_report(out_dir, report, log, args.results)  # a killed run keeps these
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report["wall_s"] = time.time() - t0
    bug = any(r["status"] == "error" for r in report["records"])
    log("results:")
    log(_table(report["records"]), stamp=False)
    md = _markdown(report)
    log("markdown section for bench/RESULTS.md:", stamp=True)
    log(md, stamp=False)
    _write_report(out_dir, report, log, args.results)
    log(
        f"wrote {out_dir / 'gpu_bench.json'}, {out_dir / 'gpu_bench.md'}, {out_dir / 'gpu_bench.log'}"
    )
    if bug:
        log("a step failed from a bug in bench/gpu.py (status 'error' above): exit 1")
    return 1 if bug else 0


if __name__ == "__main__":
    raise SystemExit(main())
