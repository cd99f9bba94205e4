"""GPU benchmark of the pair at the real dimensions, with seeded random weights.

A prepared script for a machine with a CUDA GPU. Per member (Qwen3.5-2B and LFM2.5-VL-3B, the
configs recorded in ``jetson/memory_budget.py``) it runs five steps:

``build``   the member folder at the real dimensions with seeded random weights, made in bf16
            on the GPU (``spotstop.export.tiny.build_random_member``, the tiny pair's test
            tokenizer). TEST WEIGHTS: the scores mean nothing; only time and memory count.
``torch``   per-scene latency of torch eager on CUDA through the guard's torch backend, one
            scene per call (preprocessing + prompt + forward pass), and peak GPU memory.
``export``  wall time of ``spotstop.export.onnx.export_member`` for one length bucket (512:
            the member's default visual tokens + the prompt), on the CPU. Precision ``auto``:
            fp16 where tensorrt is importable (the tensorrt backend wants engines of the graphs'
            precision), else int8 rounded to nearest (GPTQ writes the same graphs and bytes
            after minutes of calibration, so it changes no timing). Large members export
            streamed (export/memory.py); the peak RSS is recorded.
``ort``     per-scene latency through the onnx backend on each onnxruntime provider present.
``trt``     where tensorrt is importable: the engine build (``spotstop.export.trt``) and the
            latency through the tensorrt backend.

Each member's steps run in two child processes (build + torch, then export + ort + trt). Each
step has a time budget: a step that runs over is ended and recorded as skipped with the
reason, and the other steps keep their figures; the whole run stays inside ``--budget-s``.
The members come first, then the exports, the legacy-exported decoders (LFM2-VL) before the
slower dynamo-exported ones (Qwen3.5).

Outputs in ``--out``: ``gpu_bench.json`` (every record), ``gpu_bench.md`` (a section for
bench/RESULTS.md: command, date, GPU, versions, each measured figure with its unit, each
skipped step with its reason; never a figure this run did not measure) and ``gpu_bench.log``;
``--results bench/RESULTS.md`` also writes the section between that file's ``gpu`` markers.
Exit status: 0 when every step ran or was skipped with a reason, 1 for a bug in this script.

Device command (the device tool's ``run``, ``timeout_s`` 540, ``carry`` ``[".whl"]``)::

    if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi; set -o pipefail; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; PYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT --results bench/RESULTS.md 2>&1 | tee $OUT/console.log; cp bench/RESULTS.md $OUT/

The device's python3 has no spotstop install (this file makes ``spotstop.<room>`` importable
from the checkout) and a transformers whose SigLIP2 resize the legacy ONNX exporter cannot
export (``aten::_upsample_bilinear2d_aa``), so the LFM2-VL export needs the transformers the
project is tested with, fetched once here, in the repository root::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl transformers==5.24.0

Without the wheel, the LFM2-VL export is skipped with the exporter's error. On 2026-12-04 the
device's python3 had transformers 5.17.0 and huggingface-hub 1.33.0, and a transformers 5.25.0
wheel failed to import there (it wants huggingface-hub>=2.4, which in turn wants httpx2 and
hf-xet): the wheel must be one whose requirements the device meets, or come with theirs. The device has
neither tensorrt nor onnxruntime-gpu: ``trt`` is skipped with the reason and ``ort`` times the
CPU. The default budget gives build + torch for both members in about 3 minutes and the rest
to the exports; ``--steps build,torch`` is a 3-minute run, and ``--members LFM2.5-VL-3B
--steps build,export,ort --step-budget export=420 --budget-s 540`` gives one export the run.

Without a GPU, the same code path runs on the tiny TEST pair on the CPU, the GPU-only steps
skipped with the reason (tests/bench/test_gpu.py runs it)::

    python bench/gpu.py --tiny --device cpu --out /tmp/gpu-bench
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import importlib.metadata
import importlib.util
import json
import math
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
THIS = Path(__file__).resolve()
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _ensure_spotstop_importable() -> None:
    """Make ``spotstop.<room>`` importable without an install (the device's own python3): a
    temporary ``spotstop/`` folder of links to the rooms, on ``sys.path`` and, for the child
    processes, on ``PYTHONPATH``."""
    if importlib.util.find_spec("spotstop") is not None:
        return
    shim = Path(tempfile.mkdtemp(prefix="spotstop-shim-"))
    (shim / "spotstop").mkdir()
    for room in ("cli", "guard", "calibrate", "diagnostics", "export"):  # pyproject's package-dir
        (shim / "spotstop" / room).symlink_to(ROOT / room, target_is_directory=True)
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(shim), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    importlib.invalidate_caches()


_ensure_spotstop_importable()

STEPS = ("build", "torch", "export", "ort", "trt")
#: the two child processes per member: the member itself, then its exported graphs
GROUPS: tuple[tuple[str, ...], ...] = (("build", "torch"), ("export", "ort", "trt"))
#: seconds per step: the real members on the GPU machine / the tiny pair on a CPU
BUDGETS_REAL = {"build": 120.0, "torch": 90.0, "export": 300.0, "ort": 90.0, "trt": 180.0}
BUDGETS_TINY = {"build": 90.0, "torch": 60.0, "export": 120.0, "ort": 60.0, "trt": 30.0}
#: exceptions that, raised from this file, are a bug in this script rather than a finding
_BUG_TYPES = (NameError, TypeError, AttributeError, KeyError, IndexError, AssertionError)

Figure = dict[str, Any]


class SkipStep(Exception):
    """A step that cannot run here; the message is the reason."""


# ---- helpers ---------------------------------------------------------------------------------


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
        if v != v:
            return "nan"
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def _fig(name: str, value: Any, unit: str) -> Figure:
    return {"name": name, "value": value, "unit": unit}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _safetensors_params(folder: Path) -> int:
    """Parameters stored in a folder's safetensors files (read from their headers)."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for k, v in header.items():
            if k != "__metadata__":
                total += math.prod(int(d) for d in v["shape"])
    return total


def _reason(ex: BaseException) -> str:
    text = str(ex).strip() or repr(ex)
    return f"{type(ex).__name__}: {text[:1500]}"


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---- the child: one member's group of steps, one JSON line per event ---------------------------


def _scenes(n: int) -> list[Any]:
    from spotstop.export.scenes import demo_scenes

    return demo_scenes(n, seed=7)


def _latency(member: Any, scenes: list[Any], repeat: int, deadline: float) -> list[Figure]:
    """Per-scene latency (one scene per call) after two warm-up calls, until ``deadline``."""
    t = time.perf_counter()
    member.score(scenes[:1], strict=False)  # first call: kernels, allocations, sessions
    first = time.perf_counter() - t
    member.score(scenes[:1], strict=False)
    times: list[float] = []
    tokens: list[int] = []
    finite = 0
    for _ in range(repeat):
        for s in scenes:
            if times and time.time() > deadline:
                break
            t = time.perf_counter()
            [r] = member.score([s], strict=False)
            times.append(time.perf_counter() - t)
            tokens.append(r.n_prompt_tokens)
            finite += math.isfinite(r.score)
    times.sort()
    return [
        _fig("median latency", statistics.median(times) * 1e3, "ms/scene"),
        _fig("p90 latency", times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3, "ms/scene"),
        _fig("min latency", times[0] * 1e3, "ms/scene"),
        _fig("first call", first, "s"),
        _fig("timed calls", len(times), f"of {repeat * len(scenes)} planned"),
        _fig("prompt length", int(statistics.median(tokens)), "tokens (median)"),
        _fig("finite scores", finite, f"of {len(times)}"),
    ]


def _cuda_ok(device: str) -> None:
    if not device.startswith("cuda"):
        raise SkipStep(f"needs a CUDA GPU; this run has --device {device}")
    import torch

    if not torch.cuda.is_available():
        raise SkipStep("torch sees no CUDA device (torch.cuda.is_available() is False)")


def _free_torch() -> None:
    gc.collect()
    with contextlib.suppress(Exception):  # torch absent or without CUDA: nothing to free
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _step_build(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[Figure]:
    folder = Path(spec["folder"])
    shutil.rmtree(folder, ignore_errors=True)
    t = time.perf_counter()
    if spec["tiny"]:
        from spotstop.export.tiny import build_tiny_member

        build_tiny_member(spec["member"], folder, seed=spec["seed"])
        how = "tiny pair builder, fp32, CPU"
    else:
        import torch
        from spotstop.export.tiny import build_random_member

        dev = "cuda" if spec["device"].startswith("cuda") and torch.cuda.is_available() else "cpu"
        recorded = _budget_module().RECORDED[spec["member"]]
        build_random_member(
            spec["model_type"], recorded, folder, seed=spec["seed"], dtype=spec["dtype"], device=dev
        )
        how = f"real dimensions, random weights in {spec['dtype']} on {dev}"
    secs = time.perf_counter() - t
    _free_torch()
    return [
        _fig(f"build ({how})", secs, "s"),
        _fig("parameters", _safetensors_params(folder) / 1e6, "M"),
        _fig("member folder", _dir_bytes(folder) / 2**30, "GiB"),
    ]


def _member_folder(spec: dict[str, Any]) -> Path:
    folder = Path(spec["folder"])
    if not (folder / "config.json").is_file():
        raise SkipStep("no member folder: the build step did not produce one")
    return folder


def _step_torch(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[Figure]:
    folder = _member_folder(spec)
    import torch
    from spotstop.guard import load_member

    device = spec["device"]
    cuda = device.startswith("cuda")
    if cuda:
        _cuda_ok(device)
    dtype = spec["dtype"] if cuda else "float32"
    t = time.perf_counter()
    m = load_member(folder, name=spec["member"], backend="torch", device=device, dtype=dtype)
    figs = [_fig(f"load ({dtype}, {device})", time.perf_counter() - t, "s")]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    figs += _latency(m, _scenes(spec["scenes"]), spec["repeat"], deadline)
    if cuda:
        figs.append(_fig("peak GPU memory", torch.cuda.max_memory_allocated() / 2**30, "GiB"))
    del m
    _free_torch()
    return figs


def _step_export(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[Figure]:
    folder = _member_folder(spec)
    from spotstop.export.onnx import export_member

    prec = spec["onnx_precision"]
    if prec == "auto":
        prec = "fp16" if importlib.util.find_spec("tensorrt") is not None else "int8"
    out = Path(spec["onnx_root"]) / "members" / spec["member"]
    t = time.perf_counter()
    e = export_member(
        folder, out, precision=prec, buckets=[spec["bucket"]], name=spec["member"], quantizer="rtn"
    )
    secs = time.perf_counter() - t
    ctx["export"] = e
    return [
        _fig(f"export_member ({prec}, bucket {spec['bucket']}, on the CPU)", secs, "s"),
        _fig("graph weights (vision + decoder)", e.weight_bytes / 2**30, "GiB"),
        _fig("exported folder", _dir_bytes(out) / 2**30, "GiB"),
        _fig("peak RSS of the export", (e.peak_rss_bytes or 0) / 2**30, "GiB"),
        _fig("exported streamed (float32 weights over 2 GiB)", int(e.streamed), "yes=1"),
        _fig(f"max |Δ| vs torch ({prec} validation)", float(e.max_abs_diff), "logit"),
    ]


def _exported(ctx: dict[str, Any]) -> Any:
    if "export" not in ctx:
        raise SkipStep("no ONNX export: the export step did not produce one")
    return ctx["export"]


def _step_ort(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[Figure]:
    e = _exported(ctx)
    import onnxruntime as ort
    from spotstop.guard import load_member

    avail = ort.get_available_providers()
    cuda = spec["device"].startswith("cuda")
    devices = [
        (dev, prov)
        for dev, prov, gpu in (
            ("tensorrt", "TensorrtExecutionProvider", True),
            ("cuda", "CUDAExecutionProvider", True),
            ("cpu", "CPUExecutionProvider", False),
        )
        if prov in avail and (cuda or not gpu)
    ]
    if cuda and all(d == "cpu" for d, _ in devices):
        ctx["notes"].append(
            f"onnxruntime {ort.__version__} has no GPU provider here ({avail}); CPU only"
        )
    figs: list[Figure] = []
    scenes = _scenes(spec["scenes"])
    for i, (dev, prov) in enumerate(devices):
        # each provider gets an equal share of what is left of the step's time
        share = time.time() + (deadline - time.time()) / (len(devices) - i)
        t = time.perf_counter()
        m = load_member(e.path, name=e.name, backend="onnx", device=dev, template=e.template)
        figs.append(_fig(f"{prov} session load ({e.precision})", time.perf_counter() - t, "s"))
        figs += [
            {**f, "name": f"{prov} {f['name']}"} for f in _latency(m, scenes, spec["repeat"], share)
        ]
        del m
        gc.collect()
    return figs


def _step_trt(spec: dict[str, Any], ctx: dict[str, Any], deadline: float) -> list[Figure]:
    _cuda_ok(spec["device"])
    try:
        import tensorrt
    except Exception as ex:  # ImportError, or a broken install's OSError
        raise SkipStep(
            f"tensorrt is not importable here ({type(ex).__name__}: {ex}); the bundle's "
            "trt/build.sh (trtexec) builds the engines where TensorRT is installed"
        ) from ex
    e = _exported(ctx)
    from spotstop.export.trt import build_engines
    from spotstop.guard import load_member

    t = time.perf_counter()
    built = build_engines(Path(spec["onnx_root"]), [e], max_batch=1, progress=_say)
    secs = time.perf_counter() - t
    if not built:
        raise SkipStep(
            f"spotstop.export.trt.build_engines returned False after {secs:.0f} s (tensorrt "
            f"{tensorrt.__version__} found no usable GPU, or precision {e.precision} is not buildable)"
        )
    figs = [_fig(f"TensorRT {tensorrt.__version__} engine build ({e.precision})", secs, "s")]
    if plans := list(e.path.rglob("*.plan")):  # members/<name>/trt/
        figs.append(_fig("engine files", sum(p.stat().st_size for p in plans) / 2**30, "GiB"))
    t = time.perf_counter()
    try:
        m = load_member(e.path, name=e.name, backend="tensorrt", device="cuda", template=e.template)
    except Exception as ex:  # the build is a figure of its own; say why no latency follows
        ctx["notes"].append(
            f"engines built, but the tensorrt backend did not load them: {_reason(ex)}"
        )
        return figs
    figs.append(_fig("tensorrt backend load", time.perf_counter() - t, "s"))
    figs += [
        {**f, "name": f"TensorRT {f['name']}"}
        for f in _latency(m, _scenes(spec["scenes"]), spec["repeat"], deadline)
    ]
    return figs


_STEP_FUNCS: dict[str, Callable[[dict[str, Any], dict[str, Any], float], list[Figure]]] = {
    "build": _step_build,
    "torch": _step_torch,
    "export": _step_export,
    "ort": _step_ort,
    "trt": _step_trt,
}


def _is_bug(ex: BaseException) -> bool:
    """An exception of a bug-like type raised from this file's own code."""
    tb = traceback.extract_tb(ex.__traceback__)
    return isinstance(ex, _BUG_TYPES) and bool(tb) and Path(tb[-1].filename).resolve() == THIS


def _child_main(spec_path: str) -> int:
    """Run one member's steps in order, appending a JSON line to the records file as each
    starts and ends; the parent ends this process when a step overruns its deadline."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))

    def record(**rec: Any) -> None:
        with open(spec["records"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"member": spec["member"], **rec}, default=str) + "\n")

    ctx: dict[str, Any] = {}
    for step in spec["steps"]:
        own, left = float(spec["budgets"][step]), float(spec["overall_deadline"]) - time.time()
        budget = min(own, left)
        if left < (3 if spec["tiny"] else 20):  # too little left to finish any step
            reason = "not started: the overall time budget (--budget-s) is spent"
            record(step=step, event="end", status="skipped", reason=reason, seconds=0.0)
            continue
        _say(f"  [{spec['member']}] {step}: start (budget {budget:.0f} s)")
        ctx["notes"] = []
        t0 = time.time()
        record(step=step, event="start", budget_s=budget, deadline=t0 + budget, capped=budget < own)
        status, reason, figs = "ok", None, []
        try:
            figs = _STEP_FUNCS[step](spec, ctx, t0 + budget)
        except SkipStep as ex:
            status, reason = "skipped", str(ex)
        except Exception as ex:
            status, reason = ("error" if _is_bug(ex) else "skipped"), _reason(ex)
            traceback.print_exc()
        secs = time.time() - t0
        record(
            step=step,
            event="end",
            status=status,
            reason=reason,
            figures=figs,
            notes=ctx["notes"],
            seconds=secs,
        )
        _say(
            f"  [{spec['member']}] {step}: {status} in {secs:.1f} s"
            + (f" — {reason}" if reason else "")
        )
        for f in figs:
            _say(f"      {f['name']}: {_fmt(f['value'])} {f['unit']}")
    return 0


# ---- the parent: environment, children, report ------------------------------------------------


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
        "gpu": None,
    }
    dists = ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxscript")
    dists += ("tensorrt", "tokenizers", "huggingface-hub", "numpy")
    env["versions"] = {d: _version(d) for d in dists}
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
    with contextlib.suppress(Exception):  # no nvidia-smi: the GPU line comes from torch alone
        query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        smi = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
        if smi.returncode == 0 and smi.stdout.strip():
            env["nvidia_smi"] = smi.stdout.strip().splitlines()[0]
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


def _skipped(member: str, step: str, reason: str, status: str = "skipped") -> dict[str, Any]:
    return {"member": member, "step": step, "status": status, "reason": reason, "seconds": None}


def _events(records: Path) -> list[dict[str, Any]]:
    events = []
    if records.is_file():
        for line in records.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut when the child ended
                events.append(json.loads(line))
    return events


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
    """Run one member's group of steps in a child process, ending it when a step runs past
    its deadline (plus a grace period); one end record per step."""
    records = work / f"records-{member}-{steps[0]}.jsonl"
    records.unlink(missing_ok=True)
    grace = 2.0 if args.tiny else 10.0
    options = ("tiny", "device", "dtype", "seed", "scenes", "repeat", "bucket", "onnx_precision")
    spec = {
        **{k: getattr(args, k) for k in options},
        "member": member,
        "model_type": model_type,
        "steps": list(steps),
        "folder": str(work / "members" / member),
        "onnx_root": str(work / "onnx"),
        "records": str(records),
        "budgets": _member_budgets(budgets, member),
        "overall_deadline": overall_deadline,
    }
    (work / "onnx").mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    spec_path = work / f"spec-{member}-{steps[0]}.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    log(f"{member}: {' + '.join(steps)} in a child process")
    env = dict(os.environ)
    env.update(
        TMPDIR=str(work / "tmp"),  # an export ended at its budget leaves its temporary files here
        PYTHONUNBUFFERED="1",
        TQDM_DISABLE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-u", str(THIS), "--_child", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        cwd=str(ROOT),
        env=env,
        start_new_session=True,  # its own process group, ended as a whole
    )

    def relay() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            log("    | " + line.rstrip("\n"), stamp=False)

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    overran: dict[str, Any] | None = None  # the start record of the step that ran over
    hung = False  # past the overall deadline outside every step
    while proc.poll() is None:
        time.sleep(0.5)
        events = _events(records)
        ended = {e["step"] for e in events if e["event"] == "end"}
        running = [e for e in events if e["event"] == "start" and e["step"] not in ended]
        overran = running[-1] if running and time.time() > running[-1]["deadline"] + grace else None
        hung = not running and time.time() > overall_deadline + grace
        if overran or hung:
            late = overran["step"] if overran else "the child"
            log(f"{member}: {late} ran past its time budget; ending the child")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group of the child this script started
            break
    rc = proc.wait()
    relay_thread.join(timeout=10)
    events = _events(records)
    ends = {e["step"]: e for e in events if e["event"] == "end"}
    started = {e["step"] for e in events if e["event"] == "start"}
    if overran:
        step = overran["step"]
        capped = " (what the run's --budget-s had left)" if overran["capped"] else ""
        ends.setdefault(
            step,
            {
                **_skipped(
                    member,
                    step,
                    f"time budget of {overran['budget_s']:.0f} s exceeded{capped}; the step was ended",
                ),
                "seconds": time.time() - (overran["deadline"] - overran["budget_s"]),
            },
        )
        why = f"{step} ran over its time budget"
    elif hung:
        why = f"the child was ended after {time.time() - t0:.0f} s, past the run's budget"
    elif rc < 0:
        why = f"the child died from signal {-rc}" + (" (out of memory?)" if -rc == 9 else "")
    elif rc != 0:
        why = f"the child exited with status {rc} (see the log above)"
    else:
        why = "the child ended without reporting this step"
    # a child that exits with an error outside every step has a bug in this script
    status = "error" if rc > 0 else "skipped"
    return [
        ends.get(s)
        or _skipped(
            member, s, f"{why} during this step" if s in started else f"not reached: {why}", status
        )
        for s in steps
    ]


def _command_text(argv: list[str]) -> str:
    out_env = os.environ.get("OUT")
    parts = []
    for a in argv:
        if out_env and a == out_env:
            parts.append("$OUT")
        elif out_env and a == f"--out={out_env}":
            parts.append("--out=$OUT")
        else:
            parts.append(shlex.quote(a))
    return " ".join(["PYTHONUNBUFFERED=1 python3 bench/gpu.py", *parts])


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|")


def _markdown(report: dict[str, Any]) -> str:
    """The section for bench/RESULTS.md (export/cost.py's ``measured_latencies`` reads its
    ``### date — GPU — command`` heading and its table)."""
    env = report["env"]
    v = env["versions"]
    gpu = env.get("gpu")
    gpu_text = (
        f"{gpu['name']} ({gpu['memory_gib']:.0f} GiB)" if gpu else f"none (device {env['device']})"
    )
    if env.get("nvidia_smi"):
        gpu_text += f"; nvidia-smi: {env['nvidia_smi']}"
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
    tiny = " --tiny" if report["tiny"] else ""
    lines = [
        f"### {env['date_utc'][:10]} — {gpu['name'] if gpu else 'no GPU'} — bench/gpu.py{tiny}",
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
    if env.get("transformers_from"):
        lines.append(f"- transformers loaded from {env['transformers_from']}")
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
    notes = [
        f"- {r['member']} {r['step']}: {n}" for r in report["records"] for n in r.get("notes") or []
    ]
    if notes:
        lines += ["", "Notes:", "", *notes]
    skipped = [
        f"- {r['member']} {r['step']} ({r['status']}): {r.get('reason')}"
        for r in report["records"]
        if r["status"] != "ok"
    ]
    lines += ["", "Skipped steps (no figure is reported for them):", "", *(skipped or ["- none"])]
    return "\n".join(lines) + "\n"


def _write_report(out_dir: Path, report: dict[str, Any], log: _Log, results: Path | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = _markdown(report)
    if results is not None:  # its own section of bench/RESULTS.md (bench/_results.py)
        sys.path.insert(0, str(THIS.parent))
        from _results import write_section

        write_section(results, "gpu", md)
    (out_dir / "gpu_bench.json").write_text(
        json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8"
    )
    (out_dir / "gpu_bench.md").write_text(md, encoding="utf-8")
    (out_dir / "gpu_bench.log").write_text("\n".join(log.lines) + "\n", encoding="utf-8")


def _parse_budgets(items: list[str], tiny: bool) -> dict[str, float]:
    """Step budgets in seconds: ``STEP`` for every member, ``MEMBER:STEP`` for one."""
    budgets = dict(BUDGETS_TINY if tiny else BUDGETS_REAL)
    for item in items:
        key, sep, val = item.partition("=")
        try:
            seconds = float(val)
        except ValueError:
            seconds = -1.0
        if not sep or key.rpartition(":")[2] not in STEPS or seconds <= 0:
            raise SystemExit(
                f"--step-budget takes [MEMBER:]STEP=SECONDS (seconds > 0) with STEP in "
                f"{list(STEPS)}; got {item!r}"
            )
        budgets[key] = seconds
    return budgets


def _member_budgets(budgets: dict[str, float], member: str) -> dict[str, float]:
    return {s: budgets.get(f"{member}:{s}", budgets[s]) for s in STEPS}


def _parser() -> argparse.ArgumentParser:
    budgets = "; ".join(
        f"{kind} " + ", ".join(f"{k}={v:.0f}" for k, v in b.items())
        for kind, b in (("real", BUDGETS_REAL), ("tiny", BUDGETS_TINY))
    )
    ap = argparse.ArgumentParser(
        prog="bench/gpu.py",
        description=(
            "Benchmark the pair at the real dimensions with seeded random weights on a CUDA GPU: "
            "build, torch eager latency, ONNX export, onnxruntime latency, TensorRT build and "
            "latency. Each step has a time budget; a step that cannot run is skipped with the "
            "reason. Writes gpu_bench.json / .md / .log to --out. See the module docstring for "
            "the device command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  PYTHONUNBUFFERED=1 python3 bench/gpu.py --out $OUT      # the device run (H200)\n"
            "  python bench/gpu.py --tiny --device cpu --out /tmp/b    # same code path, tiny pair\n"
            "  python bench/gpu.py --members LFM2.5-VL-3B --steps build,torch --budget-s 200\n"
            f"steps: {', '.join(STEPS)}; default budgets (s): {budgets}\n"
            "exit status: 0 when every step ran or was skipped with a reason; 1 on a bug here."
        ),
    )
    add = ap.add_argument
    add("--out", type=Path, help="output folder (default: $OUT, else $TMPDIR/spotstop-gpu-bench)")
    add("--tiny", action="store_true", help="the tiny TEST pair instead of the real dimensions")
    add(
        "--device",
        default="cuda",
        help="'cuda', 'cuda:N' or 'cpu' (default cuda; on cpu the GPU-only steps are skipped "
        "with the reason)",
    )
    add("--members", default="", help="comma-separated member names (default: both members)")
    add("--steps", default=",".join(STEPS), help="comma-separated steps to run (default: all five)")
    add(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16"),
        help="dtype of the random weights and of torch eager on CUDA (default bfloat16; the "
        "CPU uses float32)",
    )
    add("--scenes", type=int, default=8, help="generated scenes per latency step (default 8)")
    add("--repeat", type=int, default=3, help="timed passes over the scenes (default 3)")
    add("--bucket", type=int, help="ONNX length bucket (default 512; tiny 256)")
    add(
        "--onnx-precision",
        default="auto",
        choices=("auto", "fp32", "fp16", "int8", "int4"),
        help="ONNX precision (default auto: fp16 where tensorrt is importable, else int8)",
    )
    add("--seed", type=int, default=0, help="weight and tokenizer seed (default 0)")
    add("--budget-s", type=float, help="wall-time budget of the whole run (default 450; tiny 600)")
    add(
        "--step-budget",
        action="append",
        default=[],
        metavar="STEP=S",
        help="one step's budget in seconds, for every member (STEP=S) or one (MEMBER:STEP=S); "
        "repeatable",
    )
    add(
        "--work",
        type=Path,
        help="work folder for members and exports (default: a temporary folder, removed at the end)",
    )
    add("--keep", action="store_true", help="keep the work folder")
    add(
        "--results",
        type=Path,
        help="also write the markdown into this file's gpu section (bench/RESULTS.md; the "
        "device command copies it to $OUT)",
    )
    add("--_child", help=argparse.SUPPRESS)
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
    if bad := [s for s in steps if s not in STEPS]:
        raise SystemExit(f"--steps: unknown step(s) {bad}; steps are {list(STEPS)}")
    members = _members(args.tiny)
    if args.members:
        wanted = [m.strip() for m in args.members.split(",") if m.strip()]
        if unknown := [m for m in wanted if m not in dict(members)]:
            raise SystemExit(f"--members: unknown {unknown}; members are {[m for m, _ in members]}")
        members = [m for m in members if m[0] in wanted]
    out_dir = args.out or Path(
        os.environ.get("OUT") or Path(tempfile.gettempdir()) / "spotstop-gpu-bench"
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="spotstop-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    what = "tiny TEST pair" if args.tiny else "real dimensions, random weights"
    log(
        f"bench/gpu.py: {what} on {args.device}; budget {budget_s:.0f} s; work {work}; out {out_dir}"
    )
    env = _environment(args.device)
    log(
        "environment: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f"; GPU {env['gpu']}; onnxruntime providers {env.get('ort_providers')}"
    )
    with contextlib.suppress(OSError):
        env["work_free_gib"] = shutil.disk_usage(work).free / 2**30
        log(f"free disk under the work folder: {env['work_free_gib']:.0f} GiB")

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
    # the members first (the sure figures), then the exports, legacy before dynamo (slower)
    from spotstop.export.configs import get_export_config

    def dynamo_export(member: tuple[str, str]) -> bool:
        return get_export_config(member[1]).decoder_exporter == "dynamo"

    order = [(m, GROUPS[0]) for m in members]
    order += [(m, GROUPS[1]) for m in sorted(members, key=dynamo_export)]
    try:
        for (name, mtype), group in order:
            todo = tuple(s for s in group if s in steps)
            if not todo:
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
    log("markdown section for bench/RESULTS.md:")
    log(_markdown(report), stamp=False)
    _write_report(out_dir, report, log, args.results)
    log(
        f"wrote {out_dir / 'gpu_bench.json'}, {out_dir / 'gpu_bench.md'}, {out_dir / 'gpu_bench.log'}"
    )
    if any(r["status"] == "error" for r in report["records"]):
        log(
            "a step failed from a bug in bench/gpu.py (status 'error' under the skipped steps): exit 1"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
