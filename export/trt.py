"""TensorRT engines for an exported bundle: built here when possible, else a script for the device.

Engines are specific to the GPU and TensorRT version they are built with, so on a workstation
without the target device the export writes ``trt/build.sh``: the exact ``trtexec`` commands,
shapes and precision flags, to run on the Jetson (``jetson/build_engines.sh`` runs it in the
container). With ``tensorrt`` importable and a CUDA GPU present, :func:`build_engines` builds
the same engines with the TensorRT Python API.

Weight-only int8/int4 graphs use onnxruntime's ``MatMulNBits`` contrib operator, which the
TensorRT ONNX parser does not read: for TensorRT, export ``--precision fp16`` (or fp32); int4
engines for TensorRT come from nvidia-modelopt's INT4-AWQ ONNX, which is not wired in here.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_engines", "engine_specs", "write_trt_script"]

_TRT_PRECISIONS = ("fp32", "fp16")


def _input_shapes(onnx_path: Path) -> dict[str, list[int | str]]:
    import onnx

    m = onnx.load(str(onnx_path), load_external_data=False)
    out: dict[str, list[int | str]] = {}
    for i in m.graph.input:
        dims = i.type.tensor_type.shape.dim
        out[i.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    return out


def engine_specs(root: Path, exports: Sequence[Any], *, max_batch: int = 8) -> list[dict[str, Any]]:
    """One spec per graph: onnx path, engine path, min/opt/max shapes, precision."""
    specs = []
    for e in exports:
        onnx_dir = e.path / "onnx"
        graphs = sorted(onnx_dir.glob("*.onnx"))
        for g in graphs:
            shapes = _input_shapes(g)
            lo: dict[str, list[int]] = {}
            opt: dict[str, list[int]] = {}
            hi: dict[str, list[int]] = {}
            for name, dims in shapes.items():
                a, b, c = [], [], []
                for d in dims:
                    if isinstance(d, int) and d > 0:
                        a.append(d)
                        b.append(d)
                        c.append(d)
                    elif d == "batch":
                        a.append(1)
                        b.append(2)
                        c.append(max_batch * 2)
                    elif d == "reads":
                        a.append(1)
                        b.append(2)
                        c.append(8)
                    else:  # dynamic sequence length: the member's buckets
                        a.append(min(e.buckets))
                        b.append(min(e.buckets))
                        c.append(max(e.buckets))
                lo[name], opt[name], hi[name] = a, b, c
            specs.append(
                {
                    "member": e.name,
                    "precision": e.precision,
                    "onnx": g.relative_to(root).as_posix(),
                    "engine": f"trt/{e.name}/{g.stem}.plan",
                    "min": lo,
                    "opt": opt,
                    "max": hi,
                }
            )
    return specs


def _shape_arg(shapes: dict[str, list[int]]) -> str:
    return ",".join(f"{k}:{'x'.join(str(d) for d in v)}" for k, v in shapes.items())


def write_trt_script(root: Path, exports: Sequence[Any], *, max_batch: int = 8) -> Path:
    """Write ``trt/build.sh``: the trtexec commands that build every engine on the device."""
    lines = [
        "#!/usr/bin/env bash",
        "# Build the TensorRT engines of this bundle ON THE TARGET DEVICE (engines are specific",
        "# to the GPU and TensorRT version). Written by `spotstop export`; run from anywhere.",
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
        'TRTEXEC="${TRTEXEC:-trtexec}"',
        "",
    ]
    for s in engine_specs(root, exports, max_batch=max_batch):
        if s["precision"] not in _TRT_PRECISIONS:
            lines += [
                f"# {s['onnx']}: {s['precision']} weight-only graphs use onnxruntime's "
                "MatMulNBits, which TensorRT cannot parse.",
                "echo 'this bundle is "
                + s["precision"]
                + ": re-export with --precision fp16 for TensorRT' >&2; exit 1",
            ]
            break
        cmd = [
            "$TRTEXEC",
            f"--onnx={s['onnx']}",
            f"--saveEngine={s['engine']}",
            f"--minShapes={_shape_arg(s['min'])}",
            f"--optShapes={_shape_arg(s['opt'])}",
            f"--maxShapes={_shape_arg(s['max'])}",
            "--memPoolSize=workspace:2048",
        ]
        if s["precision"] == "fp16":
            cmd.append("--fp16")
        lines.append(f"mkdir -p {shlex.quote(str(Path(s['engine']).parent))}")
        lines.append(" ".join(cmd))
    path = root / "trt" / "build.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def build_engines(
    root: Path,
    exports: Sequence[Any],
    *,
    max_batch: int = 8,
    progress: Callable[[str], Any] | None = None,
) -> bool:
    """Build the engines with the TensorRT Python API; False when tensorrt or a GPU is absent."""
    try:
        import tensorrt as trt
    except ImportError:
        return False
    specs = engine_specs(root, exports, max_batch=max_batch)
    if any(s["precision"] not in _TRT_PRECISIONS for s in specs):
        return False
    logger = trt.Logger(trt.Logger.WARNING)
    try:
        builder = trt.Builder(logger)
    except Exception:  # no CUDA device / driver: fall back to the script, which is written
        return False
    for s in specs:
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(root / s["onnx"])):
            errs = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise RuntimeError(f"TensorRT cannot parse {s['onnx']}: " + "; ".join(errs))
        cfg = builder.create_builder_config()
        cfg.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 2 << 30)
        if s["precision"] == "fp16":
            cfg.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for name in s["min"]:
            profile.set_shape(name, s["min"][name], s["opt"][name], s["max"][name])
        cfg.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, cfg)
        if plan is None:
            raise RuntimeError(f"TensorRT failed to build an engine for {s['onnx']}.")
        out = root / s["engine"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(bytes(plan))
        if progress:
            progress(f"  built {s['engine']}")
    return True
