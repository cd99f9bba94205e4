"""The ONNX Runtime backend: a member's exported scoring graphs, no torch, no transformers.

The graphs, their description (``spotstop_onnx.yaml``) and everything a score needs besides
running them live in :mod:`spotstop.guard.backends._graphs`, shared with the TensorRT backend; this
module only loads a graph into an onnxruntime session and runs it.

Execution providers: ``device="cpu"`` → CPU; ``"cuda"`` / ``"cuda:N"`` → CUDA;
``"tensorrt"`` → onnxruntime's TensorRT provider (with CUDA for the nodes TensorRT does not
take; for prebuilt TensorRT engines without onnxruntime use the ``tensorrt`` backend). A
requested provider that this onnxruntime build lacks is an error, never a silent fallback to
the CPU; the provider that runs is logged.

Intra-op threads, per graph (:func:`intra_op_threads`): a graph smaller than
:data:`SMALL_GRAPH_BYTES` (its file and its weights file) runs on one thread, whatever the
cap; a larger one on the cap the caller gives (``threads``), or onnxruntime's default (all
cores). At that size a node is microseconds of work, and handing half of it to a second
thread costs more than it saves: measured on a 2-core CPU, the tiny test pair's decoder
(LFM2 at int8, 0.5 MB) ran in 1.1-1.2 ms on one thread and 1.2-1.6 ms on two (median of
55 runs), and when other processes hold the second core a two-thread run waits for it
(median 6.0 ms against 1.9 ms for Qwen3.5's tiny int8 decoder). The real members' graphs (0.4 GB and more)
keep every core.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._errors import BackendUnavailableError, MemberLoadError
from spotstop.guard._hf import MemberFolder
from spotstop.guard.backends._graphs import (
    GRAPHS_FILE,
    GRAPHS_FORMAT,
    GRAPHS_VERSION,
    GraphBackend,
    combine_scores,
    decoder_feeds,
    read_meta,
)
from spotstop.guard.backends._int8_probe import INT8_WEIGHT_FORMS, host_int8_weight_forms

__all__ = [
    "GRAPHS_FILE",
    "GRAPHS_FORMAT",
    "GRAPHS_VERSION",
    "SMALL_GRAPH_BYTES",
    "OnnxBackend",
    "check_int8_host",
    "combine_scores",
    "decoder_feeds",
    "graph_bytes",
    "intra_op_threads",
    "onnx_providers",
]

logger = logging.getLogger("spotstop.guard.backends.onnx")

_read_meta = read_meta  # the name this module used before the shared module existed

#: A graph under this many bytes (its ``.onnx`` file and its weights file together) runs on
#: one intra-op thread (see the module docstring for the measurements). 32 MiB sits far from
#: both the graphs this project ships: the tiny test pair's are under 1 MiB, the real
#: members' smallest (Qwen3.5-2B's vision tower at int8) about 0.4 GiB.
SMALL_GRAPH_BYTES = 32 * 2**20


def graph_bytes(path: Path, kind: str) -> int:
    """Bytes of the graph at ``path``: the file and the weights file the exporter writes
    beside it for its ``kind`` (``vision.onnx.data`` / ``decoder.onnx.data``; export/onnx.py),
    where there is one."""
    data = path.parent / f"{kind}.onnx.data"
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def intra_op_threads(n_bytes: int, threads: int | None) -> int | None:
    """The intra-op threads for a graph of ``n_bytes``: 1 under :data:`SMALL_GRAPH_BYTES`,
    else the caller's cap ``threads`` (None: onnxruntime's default, all cores)."""
    return 1 if n_bytes < SMALL_GRAPH_BYTES else threads


def check_int8_host(meta: Mapping[str, Any], where: Path) -> None:
    """Refuse (:class:`MemberLoadError`) a member whose integer-GEMM weights this host's
    onnxruntime CPU kernel (which also runs the nodes a GPU provider lacks) would not multiply
    exactly (guard/backends/_int8_probe.py): its
    ``spotstop_onnx.yaml`` (``meta``) records int8 layers (``quantizer.dynamic_int8.dynamic``)
    in the form ``weight_form`` (``s8`` when absent: bundles exported before it was recorded)."""
    q = meta.get("quantizer")
    d = q.get("dynamic_int8") if isinstance(q, Mapping) else None
    if not isinstance(d, Mapping) or not d.get("dynamic"):
        return
    form = d.get("weight_form", "s8")
    if form not in INT8_WEIGHT_FORMS:
        raise MemberLoadError(
            f"{where}: quantizer.dynamic_int8.weight_form is {form!r}; expected one of "
            f"{list(INT8_WEIGHT_FORMS)}. The manifest is damaged: copy the bundle again."
        )
    host = host_int8_weight_forms()
    if form not in host:
        raise MemberLoadError(
            f"{where}: this member multiplies in int8 with its weights in the {form} form, "
            "which this CPU's onnxruntime int8 GEMM does not compute exactly (measured just now: "
            + (f"exact in the {', '.join(host)} form only" if host else "exact in no form")
            + "; an x86 CPU with AVX2 and no VNNI adds two u8·s8 products into a saturating "
            "int16), so its scores would be wrong. Refusing it. Export the bundle again with "
            "`spotstop export --int8-weights u8` (the same codes; exact on every CPU) or "
            "--precision int8-nbits, or run it on a CPU with AVX512-VNNI, AVX-VNNI, AMX, or ARM."
        )


def onnx_providers(device: str, available: Sequence[str]) -> list[Any]:
    """onnxruntime providers for ``device``; raises when the build lacks them (no fallback)."""
    dev = device.lower()
    if dev == "cpu":
        wanted: list[Any] = ["CPUExecutionProvider"]
    elif dev == "cuda" or dev.startswith("cuda:"):
        idx = int(dev.split(":", 1)[1]) if ":" in dev else 0
        wanted = [("CUDAExecutionProvider", {"device_id": idx})]
    elif dev == "tensorrt":
        wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    else:
        raise MemberLoadError(
            f"device for the onnx backend must be 'cpu', 'cuda', 'cuda:N' or 'tensorrt'; got {device!r}."
        )
    first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
    if first not in available:
        raise BackendUnavailableError(
            f"device {device!r} needs onnxruntime's {first}, which this onnxruntime build lacks "
            f"(available: {list(available)}). Install onnxruntime-gpu (pip install "
            "'spotstop[gpu]') on a machine with CUDA, or pass device='cpu'. spotstop does not "
            "fall back to another provider silently."
        )
    return wanted


class OnnxBackend(GraphBackend):
    """Scores with the member's exported ONNX graphs on onnxruntime."""

    name = "onnx"
    exact_length = True  # a dynamic-length decoder runs at the batch's own length

    def __init__(
        self,
        folder: MemberFolder,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> None:
        # ``dtype`` is the torch backend's knob; an exported member's precision is fixed at
        # export time (spotstop_onnx.yaml: precision) and its inputs/outputs are float32.
        import onnxruntime as ort

        super().__init__(folder)
        self._ort = ort
        self.providers = onnx_providers(device, ort.get_available_providers())
        self.device = device
        self.threads = threads  # the cap on intra-op threads; None = onnxruntime's default
        #: the intra-op threads each opened graph's session was given, by kind (None: the
        #: default); see :func:`intra_op_threads`
        self.session_threads: dict[str, int | None] = {}
        # before a graph is opened; on every device: a node a GPU provider lacks (the int8
        # GEMMs, on CUDA) runs on onnxruntime's CPU kernel
        check_int8_host(self.meta, folder.path)
        provider = self.vision.get_providers()[0]  # loads the vision graph: fail early
        if self.resident and not self.fixed_length:  # and the decoder: a guard that cannot
            self._decoder(self.buckets[-1])  # open it is not ready, not failing every check
        logger.info(
            "member %s: onnxruntime %s on %s (%s graphs, %s sessions)",
            folder.path.name,
            ort.__version__,
            provider,
            self.precision,
            "resident" if self.resident else "on-demand",
        )
        if not self.resident:
            self.release()

    # -- sessions --------------------------------------------------------------------------
    def _session(self, path: Path, kind: str) -> Any:
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        try:
            n_bytes = graph_bytes(path, kind)
        except OSError as e:
            raise MemberLoadError(f"cannot read {path}: {e}; copy the bundle again.") from e
        threads = intra_op_threads(n_bytes, self.threads)
        if threads is not None:
            options.intra_op_num_threads = threads
        try:
            sess = self._ort.InferenceSession(
                str(path), sess_options=options, providers=self.providers
            )
        except Exception as e:  # onnxruntime raises its own exception types; name the file
            hint = ""
            if "is not a registered function/op" in str(e) or "implementation for" in str(e):
                hint = (
                    f"; this onnxruntime ({self._ort.__version__}) lacks an operator the graph "
                    "uses: install the onnxruntime the bundle was exported for, or export the "
                    "bundle again with `--graph-form standard` (standard ONNX operators only)."
                )
            raise MemberLoadError(
                f"onnxruntime could not load {path}: {type(e).__name__}: {e}{hint}"
            ) from e
        want = self.providers[0] if isinstance(self.providers[0], str) else self.providers[0][0]
        got = sess.get_providers()
        if not got or got[0] != want:
            raise BackendUnavailableError(
                f"onnxruntime runs {path.name} on {got} instead of {want}; refusing a silent "
                "fallback. Check the CUDA/TensorRT installation or pass device='cpu'."
            )
        self.session_threads[kind] = threads
        return sess

    def _load_graph(self, path: Path, kind: str) -> Any:
        return self._session(path, kind)

    def _run_graph(self, graph: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in graph.get_outputs()]
        return dict(zip(names, graph.run(names, dict(feeds)), strict=True))
