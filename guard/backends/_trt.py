"""The TensorRT backend: serialized engines built on the device from a member's ONNX graphs.

No torch, no onnxruntime: the engines are deserialized with ``tensorrt.Runtime`` and run with
TensorRT's named-tensor API (10.x and 11.x: ``num_io_tensors``, ``get_tensor_name``,
``get_tensor_mode``, ``get_tensor_dtype``, ``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``); device memory and the stream come from cuda-python
(``cuda.bindings.runtime``, or the older ``cuda.cudart``) behind :class:`DeviceMemory`, so
the engine-IO logic does not touch CUDA directly. Everything but loading and running a graph
(buckets, decoder inputs, vision dedupe, the score) is shared with the onnx backend
(:mod:`spotstop.guard.backends._graphs`).

Where the engines live
----------------------
In the member's folder, next to the ONNX graphs they were built from::

    members/<name>/onnx/vision.onnx          → members/<name>/trt/vision.plan
    members/<name>/onnx/decoder[_L<n>].onnx  → members/<name>/trt/decoder[_L<n>].plan
    members/<name>/trt/engines.yaml           the engine record

Engines are built on the device AFTER export (``bash BUNDLE/trt/build.sh``, which
``jetson/build_engines.sh`` runs; or :func:`spotstop.export.trt.build_engines` where tensorrt and a
GPU are present at export), so they cannot be in the bundle manifest's sha256 list
(``spotstop.guard._bundle`` skips device-built files under ``trt/`` when verifying). What vouches for
them is the record, written by whoever built them: the TensorRT version, the GPU name and
compute capability, the precision, whether the network was strongly typed, the sha256 of
every file of the ONNX graphs they were built from, and each engine's file and sha256.

At load the backend refuses (:class:`MemberLoadError`, "rebuild with trt/build.sh") a
missing record or engine, an engine whose sha256 differs, engines built from other ONNX
graphs than the member's, by another TensorRT version (major.minor.patch) or on another GPU.
A missing ``tensorrt`` or cuda-python, or no CUDA GPU, is :class:`BackendUnavailableError`.
Either way a :class:`spotstop.guard.Guard` answers every scene UNSAFE with the reason.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from spotstop.guard._errors import BackendUnavailableError, MemberLoadError, ScoringError
from spotstop.guard._hf import MemberFolder
from spotstop.guard.backends import BACKENDS
from spotstop.guard.backends._graphs import (
    DECODER_INPUTS,
    DECODER_OUTPUTS,
    VISION_INPUTS,
    VISION_OUTPUTS,
    GraphBackend,
)
from spotstop.guard.backends._trt_record import (
    TRT_PRECISIONS,
    check_engine_record,
    rebuild_hint,
)

__all__ = [
    "INSTALL_HINT",
    "CudaMemory",
    "DeviceMemory",
    "TensorRTBackend",
    "cuda_index",
    "import_tensorrt",
]

logger = logging.getLogger("spotstop.guard.backends.tensorrt")

#: The engine record in a member folder (paths in it are relative to the member folder).
INSTALL_HINT = BACKENDS["tensorrt"][2]

_NP_DTYPES: dict[str, Any] = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT32": np.int32,
    "INT64": np.int64,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


# -- device memory -------------------------------------------------------------------------


class DeviceMemory(Protocol):
    """Device buffers, copies and one stream: all the engine-IO code needs from CUDA."""

    gpu_name: str
    compute_capability: str

    @property
    def stream(self) -> int:
        """The stream handle TensorRT's ``execute_async_v3`` takes."""
        ...

    def activate(self) -> None:
        """Make this GPU current in the calling thread (scoring runs in a worker thread)."""
        ...

    def alloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...

    def to_device(self, ptr: int, host: np.ndarray) -> None:
        """Copy the contiguous ``host`` array to ``ptr`` (on the stream)."""
        ...

    def to_host(self, host: np.ndarray, ptr: int) -> None:
        """Copy ``host.nbytes`` bytes from ``ptr`` into the contiguous ``host`` (on the stream)."""
        ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...


def _import_cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError as e:
            raise BackendUnavailableError(
                f"the 'tensorrt' backend needs cuda-python for device memory, which is not "
                f"installed ({e}); install it with: {INSTALL_HINT}"
            ) from e
    return cudart


class CudaMemory:
    """:class:`DeviceMemory` on cuda-python's runtime API (``cudaMalloc``, ``cudaMemcpyAsync``)."""

    def __init__(self, index: int, cudart: Any = None) -> None:
        self._rt = cudart if cudart is not None else _import_cudart()
        self.index = index
        try:
            count = int(self._call(self._rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))
        except ScoringError as e:
            raise BackendUnavailableError(
                f"the 'tensorrt' backend needs a CUDA GPU, and CUDA found none ({e}). Check "
                "the driver (nvidia-smi; on a Jetson, run in the L4T container with "
                "--runtime nvidia), or serve with backend 'onnx' on the CPU."
            ) from e
        if count < 1 or index >= count:
            raise BackendUnavailableError(
                f"device cuda:{index} does not exist: CUDA sees {count} GPU(s)."
            )
        self.activate()
        prop = self._call(self._rt.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
        name = prop.name
        self.gpu_name = (
            name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
        ).strip()
        self.compute_capability = f"{prop.major}.{prop.minor}"
        self._stream = self._call(self._rt.cudaStreamCreate(), "cudaStreamCreate")

    def _call(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self._rt.cudaError_t.cudaSuccess:
            raise ScoringError(f"CUDA {what} failed: {err}")
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    @property
    def stream(self) -> int:
        return int(self._stream)

    def activate(self) -> None:
        self._call(self._rt.cudaSetDevice(self.index), "cudaSetDevice")

    def alloc(self, nbytes: int) -> int:
        return int(self._call(self._rt.cudaMalloc(nbytes), f"cudaMalloc({nbytes})"))

    def free(self, ptr: int) -> None:
        self._call(self._rt.cudaFree(ptr), "cudaFree")

    def to_device(self, ptr: int, host: np.ndarray) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call(
            self._rt.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind, self._stream),
            "cudaMemcpyAsync (host to device)",
        )

    def to_host(self, host: np.ndarray, ptr: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call(
            self._rt.cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes, kind, self._stream),
            "cudaMemcpyAsync (device to host)",
        )

    def synchronize(self) -> None:
        self._call(self._rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def close(self) -> None:
        if self._stream is not None:
            self._rt.cudaStreamDestroy(self._stream)
            self._stream = None


def cuda_index(device: str) -> int:
    """The GPU index of ``"cuda"`` / ``"cuda:N"``; anything else is refused."""
    dev = str(device).lower()
    m = re.fullmatch(r"cuda(?::(\d+))?", dev)
    if m is None:
        raise MemberLoadError(
            f"the tensorrt backend runs on a CUDA GPU: device must be 'cuda' or 'cuda:N'; got "
            f"{device!r}. For the CPU, serve the bundle with backend 'onnx'."
        )
    return int(m.group(1) or 0)


#: Opens the device memory of GPU ``index``; tests replace it with host memory.
open_device: Callable[[int], DeviceMemory] = CudaMemory


# -- engines -------------------------------------------------------------------------------


def _np_dtype(trt_dtype: Any, where: str) -> Any:
    name = getattr(trt_dtype, "name", None) or str(trt_dtype).rsplit(".", 1)[-1]
    if str(name) not in _NP_DTYPES:
        raise MemberLoadError(
            f"{where} has TensorRT type {name}, which spotstop does not bind (it binds "
            f"{sorted(_NP_DTYPES)}); the graph's inputs/outputs must stay float32/int64: "
            "re-export the member."
        )
    return np.dtype(_NP_DTYPES[str(name)])


def _as_engine_dtype(arr: np.ndarray, want: np.dtype, name: str) -> np.ndarray:
    """``arr`` in the engine's type for ``name``; never a lossy integer or float→int cast."""
    arr = np.asarray(arr)
    if arr.dtype == want:
        return np.ascontiguousarray(arr)
    if (arr.dtype.kind == "f") != (want.kind == "f"):
        raise ScoringError(
            f"input {name} is {arr.dtype} but the engine takes {want}; the engine was not "
            "built from this member's graphs. Rebuild it with trt/build.sh."
        )
    out = np.ascontiguousarray(arr, dtype=want)
    if want.kind != "f" and not np.array_equal(out, arr):
        raise ScoringError(f"input {name} does not fit the engine's {want} without loss.")
    return out


class _Engine:
    """One deserialized engine, its execution context and device buffers (named tensors)."""

    def __init__(
        self,
        trt: Any,
        runtime: Any,
        path: Path,
        mem: DeviceMemory,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> None:
        self.path = path
        self._mem = mem
        hint = rebuild_hint(path.parent.parent)
        mem.activate()
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise MemberLoadError(
                f"TensorRT could not deserialize {path} (built by another TensorRT release or "
                f"for another GPU, or corrupt): {hint}."
            )
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if sorted(self.inputs) != sorted(inputs) or sorted(self.outputs) != sorted(outputs):
            raise MemberLoadError(
                f"engine {path} has inputs {self.inputs} and outputs {self.outputs}; the graph "
                f"needs inputs {list(inputs)} and outputs {list(outputs)}: {hint}."
            )
        self.dtypes = {
            n: _np_dtype(engine.get_tensor_dtype(n), f"tensor {n} of {path}") for n in names
        }
        self.profile: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
        for n in self.inputs:
            shape = tuple(int(d) for d in engine.get_tensor_shape(n))
            if all(d >= 0 for d in shape):  # static input: no optimization profile needed
                self.profile[n] = (shape, shape, shape)
            else:
                lo, opt, hi = engine.get_tensor_profile_shape(n, 0)
                self.profile[n] = (
                    tuple(int(d) for d in lo),
                    tuple(int(d) for d in opt),
                    tuple(int(d) for d in hi),
                )
        self.engine = engine
        self.context = engine.create_execution_context()
        if self.context is None:
            raise MemberLoadError(
                f"TensorRT could not create an execution context for {path} (out of GPU "
                "memory?). Free the GPU, or load the members on demand (--sessions on-demand)."
            )
        self._buffers: dict[str, tuple[int, int]] = {}

    @property
    def max_batch(self) -> int:
        """The largest first dimension the engine's first input takes."""
        return self.profile[self.inputs[0]][2][0] if self.inputs else 1

    def _buffer(self, name: str, nbytes: int) -> int:
        have = self._buffers.get(name)
        if have is not None and have[1] >= nbytes:
            return have[0]
        if have is not None:
            self._mem.free(have[0])
            del self._buffers[name]
        size = max(int(nbytes), 256)
        ptr = self._mem.alloc(size)
        self._buffers[name] = (ptr, size)
        return ptr

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ScoringError(f"engine {self.path.name}: inputs {missing} were not fed.")
        self._mem.activate()
        host_in: dict[str, np.ndarray] = {}
        for n in self.inputs:
            arr = _as_engine_dtype(feeds[n], self.dtypes[n], n)
            lo, _, hi = self.profile[n]
            if arr.ndim != len(lo) or any(
                not a <= d <= b for a, d, b in zip(lo, arr.shape, hi, strict=True)
            ):
                raise ScoringError(
                    f"input {n} of shape {tuple(arr.shape)} is outside what engine "
                    f"{self.path.name} was built for ({lo} to {hi}); rebuild the engines with "
                    "the bundle's trt/build.sh after exporting with the wanted buckets."
                )
            if not self.context.set_input_shape(n, tuple(int(d) for d in arr.shape)):
                raise ScoringError(f"TensorRT refused shape {arr.shape} for input {n}.")
            host_in[n] = arr
        host_out: dict[str, np.ndarray] = {}
        for n in self.outputs:
            shape = tuple(int(d) for d in self.context.get_tensor_shape(n))
            if any(d < 0 for d in shape):
                raise ScoringError(
                    f"TensorRT could not infer the shape of output {n} of {self.path.name} "
                    f"({shape}) from the inputs' shapes."
                )
            host_out[n] = np.empty(shape, dtype=self.dtypes[n])
        for n, arr in {**host_in, **host_out}.items():
            if not self.context.set_tensor_address(n, self._buffer(n, arr.nbytes)):
                raise ScoringError(f"TensorRT refused the device address of tensor {n}.")
        for n, arr in host_in.items():
            self._mem.to_device(self._buffers[n][0], arr)
        if not self.context.execute_async_v3(self._mem.stream):
            raise ScoringError(f"TensorRT failed to run engine {self.path.name}.")
        for n, arr in host_out.items():
            self._mem.to_host(arr, self._buffers[n][0])
        self._mem.synchronize()
        return host_out

    def close(self) -> None:
        for ptr, _ in self._buffers.values():
            self._mem.free(ptr)
        self._buffers.clear()
        self.context = None
        self.engine = None


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or :class:`BackendUnavailableError` with the install hint."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise BackendUnavailableError(
            f"the 'tensorrt' backend needs TensorRT's Python package, which is not installed "
            f"({e}); install it with: {INSTALL_HINT}. Or serve the bundle with backend 'onnx'."
        ) from e
    return trt


class TensorRTBackend(GraphBackend):
    """Scores with TensorRT engines built from the member's exported ONNX graphs."""

    name = "tensorrt"

    def __init__(
        self,
        folder: MemberFolder,
        *,
        device: str = "cuda",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> None:
        # ``dtype`` and ``threads`` are other backends' knobs: an engine's precision is fixed
        # when it is built, and it runs on the GPU.
        trt = import_tensorrt()
        super().__init__(folder)
        if self.precision not in TRT_PRECISIONS:
            raise MemberLoadError(
                f"member {folder.path.name} is a {self.precision} export: its weight-only "
                "graphs use onnxruntime's MatMulNBits, which TensorRT cannot parse. Serve it "
                "with backend 'onnx', or re-export with --precision fp16 (or int4-trt) for "
                "TensorRT."
            )
        self.device = device
        index = cuda_index(device)
        self._trt = trt
        self._mem = open_device(index)
        try:
            self.record = check_engine_record(
                folder.path,
                self.meta,
                tensorrt_version=str(trt.__version__),
                gpu=self._mem.gpu_name,
                compute_capability=self._mem.compute_capability,
            )
            self._logger = trt.Logger(trt.Logger.WARNING)
            self._runtime = trt.Runtime(self._logger)
            self.vision  # noqa: B018 - loads the vision engine: fail at load, not at a scene
        except BaseException:
            self.close()
            raise
        logger.info(
            "member %s: TensorRT %s on %s (cuda:%d, %s engines, %s)",
            folder.path.name,
            trt.__version__,
            self._mem.gpu_name,
            index,
            self.precision,
            "resident" if self.resident else "on-demand",
        )
        if not self.resident:
            self.release()

    def _load_graph(self, path: Path, kind: str) -> Any:
        graph = path.relative_to(self.folder.path).as_posix()
        engine = self.folder.path / self.record.engines[graph]
        io = (
            (VISION_INPUTS, VISION_OUTPUTS)
            if kind == "vision"
            else (DECODER_INPUTS, DECODER_OUTPUTS)
        )
        return _Engine(self._trt, self._runtime, engine, self._mem, *io)

    def _run_graph(self, graph: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(graph.run(feeds))

    def _drop_graph(self, graph: Any) -> None:
        graph.close()

    def _run_decoder(
        self, length: int, feeds: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The decoder in chunks of at most the engine's largest batch (rows are independent)."""
        engine = self._decoder(length)
        b = int(feeds["input_ids"].shape[0])
        step = max(1, engine.max_batch)
        firsts, logps = [], []
        for start in range(0, b, step):
            got = engine.run({k: v[start : start + step] for k, v in feeds.items()})
            firsts.append(got["first_logits"])
            logps.append(got["read_logprob"])
        return np.concatenate(firsts), np.concatenate(logps)

    def close(self) -> None:
        """Free the engines' buffers and the stream."""
        self.release()
        self._mem.close()
