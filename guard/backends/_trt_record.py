"""The TensorRT engine record: which engines were built, by what, on what, from which graphs.

Engines are built on the device (``trt/build.sh`` or :func:`spotstop.export.trt.build_engines`)
into ``members/<m>/trt/*.plan`` with ``trt/engines.yaml`` beside them: the TensorRT release,
the GPU and its compute capability, the precision, and the sha256 of every ONNX graph and of
every engine. :func:`check_engine_record` refuses engines of another release or GPU, stale
engines (their graphs changed) and altered engines, and names the command that rebuilds them.
The backend that runs the engines is :mod:`spotstop.guard.backends._trt`; this module needs
neither tensorrt nor a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotstop.guard._bundle import sha256_file
from spotstop.guard._errors import MemberLoadError
from spotstop.guard.backends._graphs import graph_files
from spotstop.guard.validate import dump_yaml, load_yaml

__all__ = [
    "ENGINES_FILE",
    "ENGINES_FORMAT",
    "ENGINES_VERSION",
    "TRT_PRECISIONS",
    "EngineRecord",
    "check_engine_record",
    "engine_path",
    "graph_digests",
    "read_engine_record",
    "rebuild_hint",
    "write_engine_record",
]

ENGINES_FILE = "trt/engines.yaml"
ENGINES_FORMAT = "spotstop-trt-engines"
ENGINES_VERSION = 1
#: Precisions whose graphs TensorRT parses: float graphs, and int4 weights as blocked
#: DequantizeLinear nodes ("int4-trt"). int8/int4 use onnxruntime's MatMulNBits: onnx only.
TRT_PRECISIONS = ("fp32", "fp16", "int4-trt")


def engine_path(graph: str) -> str:
    """Where the engine of ``graph`` (a path in the member folder) lives in that folder."""
    return f"trt/{Path(graph).stem}.plan"


def _sha256(path: Path) -> str:
    return sha256_file(path)  # cached per (inode, size, mtime): the manifest check read them


def graph_digests(member_dir: Path) -> dict[str, str]:
    """sha256 of every file of the member's ONNX graphs (``onnx/``, external data included)."""
    onnx_dir = member_dir / "onnx"
    return {
        p.relative_to(member_dir).as_posix(): _sha256(p)
        for p in sorted(onnx_dir.rglob("*"))
        if p.is_file()
    }


def _same_version(a: str, b: str) -> bool:
    """Same TensorRT release: major.minor.patch equal (a build number may be appended)."""
    return str(a).split(".")[:3] == str(b).split(".")[:3]


@dataclass(frozen=True)
class EngineRecord:
    """What built a member's engines, and which engine runs which graph."""

    path: Path
    tensorrt: str
    gpu: str
    compute_capability: str
    precision: str
    strongly_typed: bool
    built_by: str
    engines: Mapping[str, str]  # graph (in the member folder) → engine (in the member folder)


def write_engine_record(
    member_dir: Path,
    engines: Mapping[str, str],
    *,
    tensorrt_version: str,
    gpu: str,
    compute_capability: str,
    precision: str,
    strongly_typed: bool,
    built_by: str,
) -> Path:
    """Write ``trt/engines.yaml`` for engines just built in ``member_dir`` (hashes them)."""
    rec = {
        "format": ENGINES_FORMAT,
        "version": ENGINES_VERSION,
        "tensorrt": str(tensorrt_version),
        "gpu": str(gpu),
        "compute_capability": str(compute_capability),
        "precision": str(precision),
        "strongly_typed": bool(strongly_typed),
        "built_by": str(built_by),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "graphs": graph_digests(member_dir),
        "engines": {
            g: {"file": e, "sha256": _sha256(member_dir / e)} for g, e in sorted(engines.items())
        },
    }
    path = member_dir / ENGINES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(rec), encoding="utf-8")
    return path


def rebuild_hint(member_dir: Path) -> str:
    root = member_dir.parent.parent
    if (root / "trt" / "build.sh").is_file():
        return (
            f"rebuild them on this device with `bash {root}/trt/build.sh` (on a Jetson: "
            f"jetson/build_engines.sh {root}), or serve with backend 'onnx'"
        )
    return (
        "rebuild them on this device with the bundle's trt/build.sh (on a Jetson: "
        "jetson/build_engines.sh BUNDLE), or serve with backend 'onnx'"
    )


def read_engine_record(member_dir: Path) -> dict[str, Any]:
    """The raw record of ``member_dir``; raises :class:`MemberLoadError` when absent or invalid."""
    path = member_dir / ENGINES_FILE
    hint = rebuild_hint(member_dir)
    if not path.is_file():
        raise MemberLoadError(
            f"member {member_dir.name} has no TensorRT engines ({path} is missing): engines "
            f"are built on the device after export; {hint}."
        )
    try:
        rec = load_yaml(path.read_text(encoding="utf-8"), source=str(path), error=MemberLoadError)
    except MemberLoadError as e:  # not YAML, or a key twice
        raise MemberLoadError(
            f"{e} The record is written when the engines are built: {hint}."
        ) from e
    if not isinstance(rec, dict) or rec.get("format") != ENGINES_FORMAT:
        raise MemberLoadError(f"{path} is not a spotstop TensorRT engine record; {hint}.")
    if rec.get("version") != ENGINES_VERSION:
        raise MemberLoadError(
            f"{path} version {rec.get('version')!r} is not supported (this spotstop reads "
            f"{ENGINES_VERSION}); {hint}."
        )
    for key in ("tensorrt", "gpu", "compute_capability", "precision", "graphs", "engines"):
        if key not in rec:
            raise MemberLoadError(f"{path}: key {key!r} is missing; {hint}.")
    return rec


def check_engine_record(
    member_dir: Path,
    meta: Mapping[str, Any],
    *,
    tensorrt_version: str,
    gpu: str,
    compute_capability: str,
) -> EngineRecord:
    """The member's engine record, refused unless its engines run here on these graphs.

    Checks, cheapest first: the record exists and is valid; built by this TensorRT release
    on this GPU (name and compute capability); at the member's precision; from exactly the
    member's ONNX files (sha256 of each); one engine per graph, each present with its sha256.
    """
    path = member_dir / ENGINES_FILE
    rec = read_engine_record(member_dir)
    hint = rebuild_hint(member_dir)
    if not _same_version(rec["tensorrt"], tensorrt_version):
        raise MemberLoadError(
            f"{path}: the engines were built with TensorRT {rec['tensorrt']}, but this is "
            f"TensorRT {tensorrt_version}; an engine runs only on the TensorRT release that "
            f"built it: {hint}."
        )
    if str(rec["gpu"]) != str(gpu) or str(rec["compute_capability"]) != str(compute_capability):
        raise MemberLoadError(
            f"{path}: the engines were built on {rec['gpu']} (compute capability "
            f"{rec['compute_capability']}), but this GPU is {gpu} (compute capability "
            f"{compute_capability}); engines are specific to the GPU: {hint}."
        )
    if str(rec["precision"]) != str(meta["precision"]):
        raise MemberLoadError(
            f"{path}: the engines were built from {rec['precision']} graphs, but the member's "
            f"graphs are {meta['precision']}: {hint}."
        )
    recorded = {str(k): str(v) for k, v in dict(rec["graphs"]).items()}
    current = graph_digests(member_dir)
    changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
    if changed:
        raise MemberLoadError(
            f"{path}: the member's ONNX graphs changed since its engines were built "
            f"({', '.join(changed[:4])} differ); the engines are stale: {hint}."
        )
    vision, decoders = graph_files(meta)
    engines: dict[str, str] = {}
    for graph in [vision, *decoders.values()]:
        entry = dict(rec["engines"]).get(graph)
        if not isinstance(entry, dict) or "file" not in entry or "sha256" not in entry:
            raise MemberLoadError(f"{path} lists no engine for {graph}: {hint}.")
        f = member_dir / str(entry["file"])
        if not f.is_file():
            raise MemberLoadError(f"engine {f} (for {graph}) is missing: {hint}.")
        if _sha256(f) != entry["sha256"]:
            raise MemberLoadError(
                f"engine {f} does not match its sha256 in {path} (altered, or rebuilt without "
                f"updating the record): {hint}."
            )
        engines[graph] = str(entry["file"])
    return EngineRecord(
        path=path,
        tensorrt=str(rec["tensorrt"]),
        gpu=str(rec["gpu"]),
        compute_capability=str(rec["compute_capability"]),
        precision=str(rec["precision"]),
        strongly_typed=bool(rec.get("strongly_typed", False)),
        built_by=str(rec.get("built_by", "?")),
        engines=engines,
    )
