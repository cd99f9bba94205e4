"""The TensorRT backend, the graph logic it shares with onnxruntime, and the engine build.

TensorRT and a GPU are not available in the default test run, so most of this file checks
OUR side of the TensorRT integration, not TensorRT:

* the shared graph logic (buckets, decoder feeds, one vision pass per distinct image, the
  answer check) through :class:`OnnxBackend` on the tiny LFM2-VL member;
* the TensorRT backend's engine-IO logic — which tensor gets which array, in which dtype
  and shape, at which device address, with which bucket and batch chunks — against a FAKE
  ``tensorrt`` module that implements exactly the TensorRT 10 named-tensor API surface the
  backend uses and runs the member's ONNX graphs with onnxruntime underneath, with host
  numpy buffers standing in for device memory. A wrong input name, shape, dtype, address or
  bucket mapping fails these tests; whether real TensorRT builds and runs the graphs, and
  how close its scores are, is only checked by the ``gpu`` test at the end;
* ``trt/build.sh`` end to end with a FAKE ``trtexec`` (flags per TensorRT release, the engine
  record it writes, which the backend then accepts);
* the refusals: no tensorrt (install hint; the guard answers UNSAFE with the reason), a
  missing, altered or mismatched engine record, int8/int4 graphs.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from spotstop.guard import Guard, Scene, ScoringConfig, load_member  # noqa: E402
from spotstop.guard._bundle import is_device_built, load_bundle  # noqa: E402
from spotstop.guard._errors import BackendUnavailableError, MemberLoadError, ScoringError  # noqa: E402

from tests._support import REPO_ROOT  # noqa: E402
from tests._support.images import make_image_bytes  # noqa: E402

MEMBER = "tiny-lfm2_vl"
FAKE_TRT = "10.3.0"
FAKE_GPU = "FakeGPU Orin"
FAKE_CC = "8.7"
REQUESTS = ["pick up the knife", "pour the hot water into the cup near the child", "open it"]


def _scenes() -> list[Scene]:
    return [Scene(make_image_bytes(i, (72 + 8 * i, 40 + 4 * i)), r) for i, r in enumerate(REQUESTS)]


@pytest.fixture(scope="session")
def lfm_bundle(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fp32 LFM2-VL bundle (about 20 s), with ``trt/build.sh`` and no engines."""
    from spotstop.export.onnx_bundle import write_onnx_bundle

    out = tmp_path_factory.mktemp("trt") / "b32"
    write_onnx_bundle([tiny_pair / MEMBER], out, precision="fp32", buckets=[128, 256], trt="script")
    return out


@pytest.fixture
def bundle(lfm_bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(lfm_bundle, dst)
    return dst


def _member(bundle: Path, backend: str, **kw: Any) -> Any:
    b = load_bundle(bundle, verify=False)  # some tests rewrite trt/build.sh
    bm = b.members[0]
    return load_member(
        bm.path,
        name=bm.name,
        config=ScoringConfig(prompt=b.prompt),
        backend=backend,
        template=bm.template,
        image_size=bm.image_size,
        **kw,
    )


# -- a fake tensorrt: the TensorRT 10 named-tensor API, onnxruntime underneath ---------------

PLAN_MAGIC = b"FAKEPLAN\n"


class _Mode(Enum):
    INPUT = 0
    OUTPUT = 1


class _DataType(Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 6
    BF16 = 7


_ONNX_TO_TRT = {1: _DataType.FLOAT, 10: _DataType.HALF, 7: _DataType.INT64, 6: _DataType.INT32}
_TRT_TO_NP = {
    _DataType.FLOAT: np.float32,
    _DataType.HALF: np.float16,
    _DataType.INT64: np.int64,
    _DataType.INT32: np.int32,
}


class HostMemory:
    """``DeviceMemory`` on host bytearrays: an address is a key, copies are checked."""

    gpu_name = FAKE_GPU
    compute_capability = FAKE_CC

    def __init__(self) -> None:
        self.buffers: dict[int, bytearray] = {}
        self._next = itertools.count(0x1000, 0x1000)
        self.allocs = 0
        self.syncs = 0
        self.closed = False

    @property
    def stream(self) -> int:
        return 0xABC

    def activate(self) -> None:
        pass

    def alloc(self, nbytes: int) -> int:
        ptr = next(self._next)
        self.buffers[ptr] = bytearray(nbytes)
        self.allocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        del self.buffers[ptr]  # a double free or a bad address is a KeyError

    def to_device(self, ptr: int, host: np.ndarray) -> None:
        assert host.flags.c_contiguous
        buf = self.buffers[ptr]
        assert host.nbytes <= len(buf), "host array larger than its device buffer"
        buf[: host.nbytes] = host.tobytes()

    def to_host(self, host: np.ndarray, ptr: int) -> None:
        buf = self.buffers[ptr]
        assert host.nbytes <= len(buf)
        host.reshape(-1).view(np.uint8)[:] = np.frombuffer(bytes(buf[: host.nbytes]), np.uint8)

    def synchronize(self) -> None:
        self.syncs += 1

    def close(self) -> None:
        self.closed = True


class _FakeEngine:
    def __init__(self, spec: dict[str, Any], mem: HostMemory, overrides: dict[str, Any]) -> None:
        import onnx

        self.spec = spec
        self.mem = mem
        self.sess = ort.InferenceSession(spec["onnx"], providers=["CPUExecutionProvider"])
        model = onnx.load(spec["onnx"], load_external_data=False)
        self.io: dict[str, tuple[_Mode, _DataType, list[int | str]]] = {}
        for mode, vals in ((_Mode.INPUT, model.graph.input), (_Mode.OUTPUT, model.graph.output)):
            for v in vals:
                t = v.type.tensor_type
                dims = [
                    d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim
                ]
                name = overrides.get("rename", {}).get(v.name, v.name)
                dtype = overrides.get("dtypes", {}).get(name, _ONNX_TO_TRT[t.elem_type])
                self.io[name] = (mode, dtype, dims)
        self.names = list(self.io)
        self.renamed = {v: k for k, v in overrides.get("rename", {}).items()}

    # the ICudaEngine surface the backend uses
    @property
    def num_io_tensors(self) -> int:
        return len(self.names)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> _Mode:
        return self.io[name][0]

    def get_tensor_dtype(self, name: str) -> _DataType:
        return self.io[name][1]

    def get_tensor_shape(self, name: str) -> list[int]:
        return [d if isinstance(d, int) and d > 0 else -1 for d in self.io[name][2]]

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[list[int]]:
        assert profile == 0
        if name not in self.spec["profile"]:
            raise RuntimeError(f"{name} has no optimization profile (static input)")
        return self.spec["profile"][name]

    def create_execution_context(self) -> _FakeContext:
        return _FakeContext(self)


class _FakeContext:
    def __init__(self, engine: _FakeEngine) -> None:
        self.e = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.runs = 0

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        mode, _, dims = self.e.io[name]
        assert mode is _Mode.INPUT, f"set_input_shape on output {name}"
        if len(shape) != len(dims):
            return False
        prof = self.e.spec["profile"].get(name)
        for k, (d, s) in enumerate(zip(dims, shape, strict=True)):
            if isinstance(d, int) and d > 0 and d != s:
                return False
            if prof is not None and not prof[0][k] <= s <= prof[2][k]:
                return False
        self.shapes[name] = tuple(shape)
        return True

    def _feeds(self, zeros: bool) -> dict[str, np.ndarray]:
        feeds = {}
        for name, (mode, dtype, _) in self.e.io.items():
            if mode is not _Mode.INPUT:
                continue
            shape = self.shapes[name]
            npt = np.dtype(_TRT_TO_NP[dtype])
            if zeros:
                arr = np.zeros(shape, npt)
            else:
                buf = self.e.mem.buffers[self.addresses[name]]
                n = int(np.prod(shape)) * npt.itemsize
                assert n <= len(buf), f"device buffer of {name} is too small"
                arr = np.frombuffer(bytes(buf[:n]), npt).reshape(shape)
            # the ONNX graph's own types (an engine may take int32 where ONNX has int64)
            orig = self.e.renamed.get(name, name)
            want = next(i for i in self.e.sess.get_inputs() if i.name == orig).type
            feeds[orig] = arr.astype({"tensor(float)": np.float32, "tensor(int64)": np.int64}[want])
        return feeds

    def get_tensor_shape(self, name: str) -> list[int]:
        """Output shapes from the input shapes (shape inference by a dry run)."""
        mode, _, dims = self.e.io[name]
        if mode is _Mode.INPUT:
            return list(self.shapes[name])
        missing = [n for n, v in self.e.io.items() if v[0] is _Mode.INPUT and n not in self.shapes]
        if missing:
            return [-1] * len(dims)
        outs = dict(
            zip(
                [o.name for o in self.e.sess.get_outputs()],
                self.e.sess.run(None, self._feeds(zeros=True)),
                strict=True,
            )
        )
        return list(outs[self.e.renamed.get(name, name)].shape)

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        assert name in self.e.io, f"unknown tensor {name}"
        assert ptr in self.e.mem.buffers, f"{name}: {ptr:#x} is not an allocated device buffer"
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        assert stream_handle == self.e.mem.stream
        assert set(self.addresses) == set(self.e.io), "every tensor needs an address"
        inputs = [n for n, v in self.e.io.items() if v[0] is _Mode.INPUT]
        assert set(self.shapes) >= set(inputs), "every input needs a shape"
        outs = self.e.sess.run(None, self._feeds(zeros=False))
        for o, val in zip(self.e.sess.get_outputs(), outs, strict=True):
            name = next((k for k, v in self.e.renamed.items() if v == o.name), o.name)
            _, dtype, _ = self.e.io[name]
            raw = np.ascontiguousarray(val, dtype=_TRT_TO_NP[dtype]).tobytes()
            buf = self.e.mem.buffers[self.addresses[name]]
            assert len(raw) <= len(buf), f"output buffer of {name} is too small"
            buf[: len(raw)] = raw
        self.runs += 1
        return True


def fake_tensorrt(mem: HostMemory, version: str = FAKE_TRT, **overrides: Any) -> types.ModuleType:
    """A ``tensorrt`` module with the surface the backend uses (Logger, Runtime, enums)."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version  # type: ignore[attr-defined]
    trt.TensorIOMode = _Mode  # type: ignore[attr-defined]
    trt.DataType = _DataType  # type: ignore[attr-defined]
    trt.engines = []  # type: ignore[attr-defined]

    class Logger:
        WARNING = 2

        def __init__(self, severity: int) -> None:
            self.severity = severity

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            assert isinstance(logger, Logger)

        def deserialize_cuda_engine(self, plan: bytes) -> _FakeEngine | None:
            if not plan.startswith(PLAN_MAGIC):
                return None
            spec = json.loads(plan[len(PLAN_MAGIC) :])
            if spec["tensorrt"] != version:  # real TensorRT refuses other releases' plans
                return None
            e = _FakeEngine(spec, mem, overrides)
            trt.engines.append(e)  # type: ignore[attr-defined]
            return e

    trt.Logger = Logger  # type: ignore[attr-defined]
    trt.Runtime = Runtime  # type: ignore[attr-defined]
    return trt


# -- a fake trtexec --------------------------------------------------------------------------

FAKE_TRTEXEC = (
    r"""
import json, os, pathlib, sys
ver = int(os.environ.get("FAKE_TRT_NUM", "100300"))
log = os.environ.get("FAKE_TRTEXEC_ARGS")
if log:
    with open(log, "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
print(f"&&&& RUNNING TensorRT.trtexec [TensorRT v{ver}] # trtexec " + " ".join(sys.argv[1:]))
if "--help" in sys.argv:
    print("  --onnx=<file>  --saveEngine=<file>  --minShapes=spec  --memPoolSize=poolspec")
    if ver < 110000:
        print("  --fp16  Enable fp16 precision (deprecated)")
    if 100000 <= ver < 110000:
        print("  --stronglyTyped  Create a strongly typed network")
    sys.exit(0)
args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in sys.argv[1:])
if ver >= 110000 and "fp16" in args:
    sys.exit("Unknown option: --fp16")
if ver < 100000 and "stronglyTyped" in args:
    sys.exit("Unknown option: --stronglyTyped")
def shapes(key):
    out = {}
    for item in filter(None, args.get(key, "").split(",")):
        name, dims = item.rsplit(":", 1)
        out[name] = [int(d) for d in dims.split("x")]
    return out
lo, opt, hi = shapes("minShapes"), shapes("optShapes"), shapes("maxShapes")
v = f"{ver // 10000}.{ver // 100 % 100}.{ver % 100}"
spec = {"onnx": str(pathlib.Path(args["onnx"]).resolve()), "tensorrt": v,
        "profile": {k: [lo[k], opt[k], hi[k]] for k in lo}}
pathlib.Path(args["saveEngine"]).write_bytes(b"FAKEPLAN\n" + json.dumps(spec).encode())
print(f"[I] TensorRT version: {v}")
print("[I] === Device Information ===")
print("[I] Selected Device: """
    + FAKE_GPU
    + r"""")
print("[I] Compute Capability: """
    + FAKE_CC
    + r"""")
print("&&&& PASSED TensorRT.trtexec")
"""
)


@pytest.fixture
def trtexec(tmp_path: Path) -> Path:
    exe = tmp_path / "trtexec"
    exe.write_text(f"#!{sys.executable}\n{FAKE_TRTEXEC}", encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _run_build(bundle: Path, trtexec: Path, num: int = 100300, **env: str) -> tuple[int, str, list]:
    args_log = bundle.parent / "trtexec-args.jsonl"
    args_log.unlink(missing_ok=True)
    res = subprocess.run(
        ["bash", str(bundle / "trt" / "build.sh")],
        env={
            **os.environ,
            "TRTEXEC": str(trtexec),
            "PYTHON": sys.executable,
            "FAKE_TRT_NUM": str(num),
            "FAKE_TRTEXEC_ARGS": str(args_log),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [json.loads(x) for x in args_log.read_text().splitlines()] if args_log.exists() else []
    return res.returncode, res.stdout + res.stderr, [c for c in calls if "--help" not in c]


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[types.ModuleType, HostMemory]]:
    """The fake tensorrt importable as ``tensorrt`` and host memory as the device."""
    import spotstop.guard.backends._trt as trt_mod

    mem = HostMemory()
    mod = fake_tensorrt(mem)
    monkeypatch.setitem(sys.modules, "tensorrt", mod)
    monkeypatch.setattr(trt_mod, "open_device", lambda index: mem)
    yield mod, mem


# -- (a) the shared graph logic, through onnxruntime -----------------------------------------


def test_shared_graph_logic_through_onnxruntime(lfm_bundle: Path) -> None:
    from spotstop.guard.backends._graphs import GraphBackend, decoder_feeds
    from spotstop.guard.backends._onnx import GRAPHS_FILE, combine_scores, onnx_providers  # noqa: F401

    m = _member(lfm_bundle, "onnx")
    be = m.backend
    assert isinstance(be, GraphBackend)
    assert be.buckets == (256,) or be.buckets == (128, 256)
    assert be.bucket(1) == be.buckets[0] and be.bucket(be.buckets[-1]) == be.buckets[-1]
    with pytest.raises(ScoringError, match="largest length bucket"):
        be.bucket(be.buckets[-1] + 1)
    plan = m.encoder.plan
    prompts = [m.prompt_ids(r) for r in REQUESTS]
    feeds = decoder_feeds(prompts, plan, 256)
    n_rows = len(plan.rows)
    assert feeds["input_ids"].shape == (len(prompts) * n_rows, 256)
    assert all(v.dtype == np.int64 for v in feeds.values())
    # one vision pass per distinct image: the gray variant runs the vision graph once
    calls: list[str] = []
    run = be._run_graph

    def counting(graph: Any, f: Any) -> Any:
        calls.append("vision" if "pixel_values" in f else "decoder")
        return run(graph, f)

    be._run_graph = counting
    m.score(_scenes(), "gray")
    assert calls.count("vision") == 1 and calls.count("decoder") == 1
    calls.clear()
    m.score(_scenes(), "scene")
    assert calls.count("vision") == len(REQUESTS)
    calls.clear()
    m.score(_scenes(), "text")
    assert calls == ["decoder"]


# -- (b) the TensorRT backend's engine IO against the fake -------------------------------------


def test_build_script_engines_and_backend_match_onnxruntime(
    bundle: Path, trtexec: Path, fake_trt: tuple[types.ModuleType, HostMemory]
) -> None:
    """build.sh (fake trtexec) → engines + record → TensorRTBackend (fake TRT) = onnxruntime."""
    trt, mem = fake_trt
    rc, out, calls = _run_build(bundle, trtexec)
    assert rc == 0, out
    mdir = bundle / "members" / MEMBER
    rec = yaml.safe_load((mdir / "trt" / "engines.yaml").read_text())
    assert rec["tensorrt"] == FAKE_TRT and rec["gpu"] == FAKE_GPU and rec["strongly_typed"]
    assert set(rec["engines"]) == {"onnx/vision.onnx", "onnx/decoder.onnx"}
    assert all("--stronglyTyped" in c and "--fp16" not in c for c in calls), calls
    load_bundle(bundle)  # engines and record are not in the manifest; it still verifies

    ref = _member(bundle, "onnx")
    got = _member(bundle, "tensorrt", device="cuda")
    assert got.info.backend == "tensorrt" and got.backend.record.gpu == FAKE_GPU
    for variant in ("scene", "gray", "text"):
        a = np.array([r.score for r in ref.score(_scenes(), variant)])  # type: ignore[arg-type]
        b = np.array([r.score for r in got.score(_scenes(), variant)])  # type: ignore[arg-type]
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=variant)
    # one vision engine and one decoder engine (dynamic length), buffers reused across calls
    assert len(trt.engines) == 2  # type: ignore[attr-defined]
    n_alloc = mem.allocs
    got.score(_scenes())
    assert mem.allocs == n_alloc
    got.backend.release()
    assert not mem.buffers, "release frees every device buffer"
    [r] = got.score(_scenes()[:1])  # engines load again when needed
    assert np.isfinite(r.score)


def test_decoder_runs_in_chunks_of_the_engine_batch(
    bundle: Path, trtexec: Path, fake_trt: tuple[types.ModuleType, HostMemory]
) -> None:
    from spotstop.export.trt import write_trt_script

    b = load_bundle(bundle, verify=False)
    e = SimpleNamespace(name=MEMBER, path=b.members[0].path, precision="fp32", buckets=[128, 256])
    write_trt_script(bundle, [e], max_batch=1)  # the decoder engine takes at most 2 rows
    assert _run_build(bundle, trtexec)[0] == 0
    ref = _member(bundle, "onnx")
    got = _member(bundle, "tensorrt", device="cuda")
    dec = got.backend._decoder(256)
    assert dec.max_batch == 2
    scenes = _scenes() * 2
    a = [r.score for r in ref.score(scenes)]
    bb = [r.score for r in got.score(scenes)]
    np.testing.assert_allclose(bb, a, atol=1e-5)
    assert dec.context.runs >= 3


def test_engine_binding_is_checked(
    bundle: Path, trtexec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names, dtypes and profile ranges come from the engine, and mismatches are refused."""
    import spotstop.guard.backends._trt as trt_mod

    assert _run_build(bundle, trtexec)[0] == 0
    mem = HostMemory()
    monkeypatch.setattr(trt_mod, "open_device", lambda index: mem)
    # an engine that takes int32 ids: fed int32, same scores
    monkeypatch.setitem(
        sys.modules,
        "tensorrt",
        fake_tensorrt(mem, dtypes={"input_ids": _DataType.INT32, "read_token": _DataType.INT32}),
    )
    ref = [r.score for r in _member(bundle, "onnx").score(_scenes())]
    got = [r.score for r in _member(bundle, "tensorrt", device="cuda").score(_scenes())]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    # an engine whose input has another name: refused at load, naming both
    monkeypatch.setitem(
        sys.modules, "tensorrt", fake_tensorrt(mem, rename={"pixel_values": "pixels"})
    )
    with pytest.raises(
        MemberLoadError, match=r"inputs \['pixels'\].*needs inputs \['pixel_values'\]"
    ):
        _member(bundle, "tensorrt", device="cuda")
    # a bf16 output: not bound
    monkeypatch.setitem(
        sys.modules, "tensorrt", fake_tensorrt(mem, dtypes={"image_embeds": _DataType.BF16})
    )
    with pytest.raises(MemberLoadError, match="TensorRT type BF16"):
        _member(bundle, "tensorrt", device="cuda")
    # a float where the engine takes integers: a binding error, not a silent cast
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(mem))
    m = _member(bundle, "tensorrt", device="cuda")
    dec = m.backend._decoder(256)
    feeds = {
        "input_ids": np.zeros((1, 256), np.float32),
        "image_embeds": np.zeros((1, 4, 64), np.float32),
        "last_index": np.zeros(1, np.int64),
        "read_index": np.zeros((1, 1), np.int64),
        "read_token": np.zeros((1, 1), np.int64),
    }
    with pytest.raises(ScoringError, match="input_ids is float32 but the engine takes int64"):
        dec.run(feeds)
    # a length outside the engine's profile
    feeds["input_ids"] = np.zeros((1, 512), np.int64)
    with pytest.raises(ScoringError, match=r"outside what engine decoder\.plan was built for"):
        dec.run(feeds)


# -- (c) no tensorrt: an install hint, and the guard fails closed ------------------------------


def _fit_policy(bundle: Path) -> None:
    from spotstop.calibrate import fit_frozen
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard.policies import PolicyConfig, dump_policy

    b = load_bundle(bundle)
    m = _member(bundle, "onnx")
    fit = fit_frozen({m.name: np.array([r.score for r in m.score(demo_scenes(8, seed=5))])})
    dump_policy(
        PolicyConfig(
            bundle_id=b.bundle_id,
            prompt_hash=b.prompt_hash,
            fusion=fit.fusion,
            policy=fit.policy,
            fitted_on={"what": "test pool", "n": fit.n},
            created=datetime.now(UTC),
        ),
        bundle / "policy.yaml",
    )


def test_missing_tensorrt_is_an_install_hint_and_the_guard_fails_closed(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotstop.cli import main

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    with pytest.raises(BackendUnavailableError, match=r"pip install 'spotstop\[gpu\]'"):
        _member(bundle, "tensorrt", device="cuda")
    _fit_policy(bundle)
    with Guard(bundle, log=bundle / "log.sqlite", backend="tensorrt", device="cuda") as g:
        assert not g.ready
        d = g.check(Scene(make_image_bytes(9), "open the door"))
    assert d.label == "UNSAFE" and d.fail_closed
    assert d.fail_reason is not None and "tensorrt" in d.fail_reason
    assert "BackendUnavailableError" in d.fail_reason
    # the CLI: --backend tensorrt picks device cuda and answers UNSAFE (exit 1) with the reason
    img = bundle / "scene.png"
    img.write_bytes(make_image_bytes(3))
    rc = main(
        [
            "check",
            str(img),
            "--request",
            "open the door",
            "--bundle",
            str(bundle),
            "--backend",
            "tensorrt",
            "--json",
        ]
    )
    assert rc == 1
    out = json.loads(capsys.readouterr().out)
    assert out["fail_closed"] and "pip install" in out["fail_reason"]
    # the same bundle on its own (onnx) backend is served normally
    with Guard(bundle, log=bundle / "log.sqlite") as g:
        assert g.ready
        assert not g.check(Scene(make_image_bytes(9), "open the door")).fail_closed


def test_tensorrt_needs_a_cuda_device_and_a_trt_precision(
    bundle: Path, fake_trt: tuple[types.ModuleType, HostMemory]
) -> None:
    with pytest.raises(MemberLoadError, match="device must be 'cuda' or 'cuda:N'"):
        _member(bundle, "tensorrt")  # device cpu
    meta_path = bundle / "members" / MEMBER / "spotstop_onnx.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta_path.write_text(yaml.safe_dump({**meta, "precision": "int8"}))
    with pytest.raises(MemberLoadError, match="MatMulNBits, which TensorRT cannot parse"):
        _member(bundle, "tensorrt", device="cuda")


def test_serve_settings_take_a_backend(lfm_bundle: Path) -> None:
    pytest.importorskip("fastapi")
    from spotstop.guard.serve import ServeSettings
    from spotstop.guard.serve._settings import SettingsError

    assert ServeSettings(bundle=lfm_bundle, backend="tensorrt", device="cuda").backend == "tensorrt"
    with pytest.raises(SettingsError, match="backend must be one of"):
        ServeSettings(bundle=lfm_bundle, backend="tpu")


# -- (d) the engine record -------------------------------------------------------------------------


def test_engine_record_refusals(
    bundle: Path, trtexec: Path, fake_trt: tuple[types.ModuleType, HostMemory]
) -> None:
    from spotstop.guard._hf import resolve_member
    from spotstop.guard.backends._graphs import read_meta
    from spotstop.guard.backends._trt_record import check_engine_record

    mdir = bundle / "members" / MEMBER
    meta = read_meta(resolve_member(mdir))
    here = {"tensorrt_version": FAKE_TRT, "gpu": FAKE_GPU, "compute_capability": FAKE_CC}
    with pytest.raises(
        MemberLoadError, match=r"no TensorRT engines .*engines.yaml is missing.*trt/build\.sh"
    ):
        _member(bundle, "tensorrt", device="cuda")
    assert _run_build(bundle, trtexec)[0] == 0
    rec = check_engine_record(mdir, meta, **here)
    assert rec.engines == {
        "onnx/vision.onnx": "trt/vision.plan",
        "onnx/decoder.onnx": "trt/decoder.plan",
    }
    # same release with a build number: accepted; another release or GPU: refused
    check_engine_record(mdir, meta, **{**here, "tensorrt_version": FAKE_TRT + ".30"})
    with pytest.raises(
        MemberLoadError,
        match=r"built with TensorRT 10\.3\.0, but this is TensorRT 10\.4\.1.*rebuild",
    ):
        check_engine_record(mdir, meta, **{**here, "tensorrt_version": "10.4.1"})
    with pytest.raises(MemberLoadError, match=r"built on FakeGPU Orin .* this GPU is H200"):
        check_engine_record(mdir, meta, **{**here, "gpu": "H200", "compute_capability": "9.0"})
    # the backend itself compares with the running tensorrt
    sys.modules["tensorrt"].__version__ = "11.4.0"  # type: ignore[attr-defined]
    with pytest.raises(MemberLoadError, match=r"TensorRT 11\.4\.0"):
        _member(bundle, "tensorrt", device="cuda")
    sys.modules["tensorrt"].__version__ = FAKE_TRT  # type: ignore[attr-defined]
    # an altered engine
    plan = mdir / "trt" / "decoder.plan"
    good = plan.read_bytes()
    plan.write_bytes(good + b" ")
    with pytest.raises(MemberLoadError, match=r"decoder\.plan does not match its sha256"):
        check_engine_record(mdir, meta, **here)
    plan.unlink()
    with pytest.raises(
        MemberLoadError, match=r"decoder\.plan \(for onnx/decoder\.onnx\) is missing"
    ):
        check_engine_record(mdir, meta, **here)
    plan.write_bytes(good)
    # graphs changed since the engines were built (e.g. re-exported): stale
    data = mdir / "onnx" / "decoder.onnx.data"
    raw = data.read_bytes()
    data.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(MemberLoadError, match=r"ONNX graphs changed .*decoder\.onnx\.data.*stale"):
        check_engine_record(mdir, meta, **here)
    data.write_bytes(raw)
    # not a record
    (mdir / "trt" / "engines.yaml").write_text("format: something-else\n")
    with pytest.raises(MemberLoadError, match="not a spotstop TensorRT engine record"):
        check_engine_record(mdir, meta, **here)


def test_device_built_files_are_not_verified_by_the_manifest() -> None:
    assert is_device_built("members/m/trt/decoder_L512.plan")
    assert is_device_built("members/m/trt/engines.yaml")
    assert is_device_built("members/m/trt/build.log")
    assert not is_device_built("trt/build.sh")
    assert not is_device_built("members/m/onnx/decoder.onnx")
    assert not is_device_built("members/m/spotstop_onnx.yaml")
    # a member folder named trt: its own files are the export's (they were left out of the
    # manifest, and the bundle was refused at load as "edited by hand"); its engines are not
    assert not is_device_built("members/trt/spotstop_onnx.yaml")
    assert not is_device_built("members/trt/spotstop_member.yaml")
    assert is_device_built("members/trt/trt/engines.yaml")


# -- (e) the build script ----------------------------------------------------------------------------


def _exports(bundle: Path, precision: str) -> list[Any]:
    b = load_bundle(bundle, verify=False)
    return [
        SimpleNamespace(
            name=MEMBER, path=b.members[0].path, precision=precision, buckets=[128, 256]
        )
    ]


def test_write_trt_script_fp16_int4_trt_and_int8(bundle: Path, trtexec: Path) -> None:
    from spotstop.export.trt import write_trt_script

    # fp16: strongly typed, no weak --fp16 on TensorRT 10, nothing on 11, --fp16 before 10
    script = write_trt_script(bundle, _exports(bundle, "fp16")).read_text()
    assert "--stronglyTyped" in script and "record members/tiny-lfm2_vl fp16" in script
    build_lines = [ln for ln in script.splitlines() if ln.startswith("build ")]
    assert len(build_lines) == 2 and not any("--fp16" in ln for ln in build_lines)
    dec = next(ln for ln in build_lines if "decoder" in ln)
    # lengths from the member's own buckets (spotstop_onnx.yaml), the batch from max_batch
    assert "--maxShapes=input_ids:16x256" in dec and "--minShapes=input_ids:1x256" in dec
    vis = next(ln for ln in build_lines if "vision" in ln)
    assert "Shapes" not in vis  # a static graph gets no profile
    for num, want, unwanted in (
        (100300, {"--stronglyTyped"}, {"--fp16"}),
        (110400, set(), {"--fp16", "--stronglyTyped"}),
        (80602, {"--fp16"}, {"--stronglyTyped"}),
    ):
        rc, out, calls = _run_build(bundle, trtexec, num)
        assert rc == 0, out
        assert len(calls) == 2
        for c in calls:
            assert want <= set(c) and not unwanted & set(c), (num, c)
        rec = yaml.safe_load((bundle / "members" / MEMBER / "trt" / "engines.yaml").read_text())
        assert rec["strongly_typed"] == (num >= 100000) and rec["precision"] == "fp16"
    rc, _, calls = _run_build(bundle, trtexec, 100300, SPOTSTOP_TRT_TYPING="weak")
    assert rc == 0 and all("--fp16" in c and "--stronglyTyped" not in c for c in calls)
    # int4-trt (blocked DequantizeLinear): strongly typed builds; refused without strong typing
    script = write_trt_script(bundle, _exports(bundle, "int4-trt")).read_text()
    assert "record members/tiny-lfm2_vl int4-trt" in script and "MatMulNBits" not in script
    assert _run_build(bundle, trtexec, 100300)[0] == 0
    rc, out, _ = _run_build(bundle, trtexec, 80602)
    assert rc == 1 and "needs a strongly typed build" in out
    # int8 / int4 (MatMulNBits): a script that refuses clearly
    for precision in ("int8", "int4"):
        path = write_trt_script(bundle, _exports(bundle, precision))
        script = path.read_text()
        assert "MatMulNBits" in script and "build members" not in script
        rc, out, calls = _run_build(bundle, trtexec)
        assert rc == 1 and "re-export with --precision fp16" in out and not calls


def test_build_engines_without_tensorrt_returns_false(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.export.trt import build_engines

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert build_engines(bundle, _exports(bundle, "fp16")) is False


def test_jetson_build_engines_runs_the_bundle_script() -> None:
    text = (REPO_ROOT / "jetson" / "build_engines.sh").read_text()
    assert "trt/build.sh" in text and "engines.yaml" in text


# -- on a GPU with TensorRT: real engines, compared with onnxruntime ---------------------------------


@pytest.mark.gpu
def test_tensorrt_engines_match_onnxruntime_on_gpu(bundle: Path) -> None:
    trt = pytest.importorskip("tensorrt")
    pytest.importorskip("cuda")
    from spotstop.export.trt import build_engines

    assert int(trt.__version__.split(".")[0]) >= 10
    assert build_engines(bundle, _exports(bundle, "fp32")), "tensorrt + GPU present but no engines"
    ref = _member(bundle, "onnx")
    got = _member(bundle, "tensorrt", device="cuda")
    for variant in ("scene", "gray", "text"):
        a = np.array([r.score for r in ref.score(_scenes(), variant)])  # type: ignore[arg-type]
        b = np.array([r.score for r in got.score(_scenes(), variant)])  # type: ignore[arg-type]
        # fp32 engines (TF32 matmuls where the GPU has them) vs onnxruntime's CPU fp32
        np.testing.assert_allclose(b, a, atol=2e-2, err_msg=variant)


def test_fixed_length_decoders_map_buckets_to_their_engines(
    bundle: Path, trtexec: Path, fake_trt: tuple[types.ModuleType, HostMemory]
) -> None:
    """One decoder graph per bucket (as Qwen3.5 exports): each length runs its own engine."""
    from spotstop.export.trt import write_trt_script

    mdir = bundle / "members" / MEMBER
    onnx_dir = mdir / "onnx"
    shutil.copy(onnx_dir / "decoder.onnx", onnx_dir / "decoder_L512.onnx")
    (onnx_dir / "decoder.onnx").rename(onnx_dir / "decoder_L256.onnx")  # same external data
    meta_path = mdir / "spotstop_onnx.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["decoder"] = {
        "fixed_length": True,
        "buckets": [256, 512],
        "files": {256: "onnx/decoder_L256.onnx", 512: "onnx/decoder_L512.onnx"},
    }
    meta_path.write_text(yaml.safe_dump(meta))
    write_trt_script(bundle, _exports(bundle, "fp32"))
    assert _run_build(bundle, trtexec)[0] == 0
    ref = _member(bundle, "onnx")
    got = _member(bundle, "tensorrt", device="cuda")
    long = " ".join(["carefully move the red box next to the shelf"] * 8)
    scenes = [*_scenes()[:2], Scene(make_image_bytes(7), long)]
    a = [r.score for r in ref.score(scenes[:2]) + ref.score(scenes[2:])]
    b = [r.score for r in got.score(scenes[:2]) + got.score(scenes[2:])]
    np.testing.assert_allclose(b, a, atol=1e-5)
    loaded = {k: e.path.name for k, e in got.backend._decoders.items()}
    assert loaded == {256: "decoder_L256.plan", 512: "decoder_L512.plan"}
