"""TensorRT engines for an exported bundle: built here when possible, else a script for the device.

Engines are specific to the GPU and the TensorRT release that build them, so on a workstation
without the target device the export writes ``trt/build.sh``: the exact ``trtexec`` commands
and shapes, to run on the device (``jetson/build_engines.sh`` runs it in the L4T container).
With ``tensorrt``, cuda-python and a CUDA GPU present, :func:`build_engines` builds the same
engines with the TensorRT Python API. Either way each member's engines land next to its ONNX
graphs (``members/<name>/trt/<graph>.plan``) with an engine record
(``members/<name>/trt/engines.yaml``: TensorRT version, GPU, precision, sha256 of the ONNX
files and of every engine) that the ``tensorrt`` backend checks before it runs them
(:mod:`spotstop.guard.backends._trt`). Engines are not in the bundle manifest's sha256 list.

Typing. Networks are built **strongly typed**: every tensor keeps the type the ONNX graph
gives it. Our fp16 graphs (onnxruntime's ``convert_float_to_float16(keep_io_types=True)``)
are float32 at the inputs/outputs and fp16 inside, so strong typing builds exactly them;
fp32 graphs build fp32 (TF32 where the GPU has it). The weakly typed precision switches
(``BuilderFlag.FP16``, ``trtexec --fp16``) are deprecated in TensorRT 10.12 and removed in
11, where every network is strongly typed (``STRONGLY_TYPED`` / ``--stronglyTyped`` accepted
but ignored). So: TensorRT 10.x → ``--stronglyTyped`` /
``NetworkDefinitionCreationFlag.STRONGLY_TYPED``; 11.x → no flag; older releases without
strong typing → weak typing with ``--fp16`` for fp16 graphs (int4-trt refused).
``SPOTSTOP_TRT_TYPING=weak`` forces the weak build on 10.x.

Precisions. ``fp32``, ``fp16`` and ``int4-trt`` (weight-only int4 as blocked, symmetric
``DequantizeLinear`` nodes, opset 21, fp16/fp32 scales: what nvidia-modelopt or onnxruntime's
QDQ quantizer write; TensorRT needs strong typing for them). ``int8``/``int4`` graphs use
onnxruntime's ``MatMulNBits`` contrib operator, which the TensorRT ONNX parser cannot read:
the script refuses them and says to re-export with ``--precision fp16`` or ``int4-trt``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spotstop.guard._config import DEFAULT_BATCH_SIZE
from spotstop.guard.backends._graphs import GRAPHS_FILE, graph_files
from spotstop.guard.backends._trt_record import TRT_PRECISIONS, engine_path, write_engine_record
from spotstop.guard.validate import load_yaml

__all__ = ["build_engines", "engine_specs", "network_typing", "write_trt_script"]

#: trtexec's and the builder's workspace pool (MiB); WORKSPACE_MIB overrides it in build.sh.
WORKSPACE_MIB = 2048


def _input_shapes(onnx_path: Path) -> dict[str, list[int | str]]:
    import onnx

    m = onnx.load(str(onnx_path), load_external_data=False)
    out: dict[str, list[int | str]] = {}
    for i in m.graph.input:
        dims = i.type.tensor_type.shape.dim
        out[i.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    return out


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.resolve().as_posix()


#: continuation rows per prompt a decoder profile admits (one unless the two answers part
#: after their first token): its largest batch is ``max_batch`` prompts times this
MAX_CONTINUATION_ROWS = 2


def engine_specs(
    root: Path, exports: Sequence[Any], *, max_batch: int = DEFAULT_BATCH_SIZE
) -> list[dict[str, Any]]:
    """One spec per graph: member folder, onnx and engine paths, min/opt/max shapes, precision.

    ``member_dir`` is relative to the bundle root; ``graph`` and ``engine`` are relative to the
    member folder (as in the engine record); ``onnx`` is the graph relative to the root.
    ``static`` graphs (no dynamic axis) get no optimization profile.
    """
    specs = []
    for e in exports:
        buckets = [int(b) for b in e.buckets]
        fixed: dict[str, int] = {}  # graph → its length bucket (one decoder per bucket)
        meta_path = e.path / GRAPHS_FILE
        if meta_path.is_file():  # what the backends read: the graphs and their buckets
            meta = load_yaml(meta_path.read_text(encoding="utf-8"), source=str(meta_path))
            vision, decoders = graph_files(meta)
            buckets = [int(b) for b in meta["decoder"]["buckets"]]
            if meta["decoder"]["fixed_length"]:
                fixed = {g: int(k) for k, g in decoders.items()}
            graphs = [e.path / g for g in dict.fromkeys([vision, *decoders.values()])]
        else:
            graphs = sorted((e.path / "onnx").glob("*.onnx"))
        for g in graphs:
            shapes = _input_shapes(g)
            own = fixed.get(g.relative_to(e.path).as_posix())
            lo: dict[str, list[int]] = {}
            opt: dict[str, list[int]] = {}
            hi: dict[str, list[int]] = {}
            static = True
            for name, dims in shapes.items():
                a, b, c = [], [], []
                for d in dims:
                    if isinstance(d, int) and d > 0:
                        a.append(d)
                        b.append(d)
                        c.append(d)
                        continue
                    static = False
                    if d == "batch":  # (prompts x continuation rows) per decoder call
                        a.append(1)
                        b.append(2)
                        c.append(max_batch * MAX_CONTINUATION_ROWS)
                    elif d == "reads":
                        a.append(1)
                        b.append(2)
                        c.append(8)
                    elif own is not None:  # this graph serves one length bucket
                        a.append(own)
                        b.append(own)
                        c.append(own)
                    else:  # dynamic sequence length: the member's buckets
                        a.append(min(buckets))
                        b.append(min(buckets))
                        c.append(max(buckets))
                lo[name], opt[name], hi[name] = a, b, c
            graph = g.relative_to(e.path).as_posix()
            specs.append(
                {
                    "member": e.name,
                    "precision": e.precision,
                    "member_dir": _rel(e.path, root),
                    "graph": graph,
                    "engine": engine_path(graph),
                    "onnx": _rel(g, root),
                    "static": static,
                    "min": lo,
                    "opt": opt,
                    "max": hi,
                }
            )
    return specs


def _shape_arg(shapes: dict[str, list[int]]) -> str:
    return ",".join(f"{k}:{'x'.join(str(d) for d in v)}" for k, v in shapes.items())


#: Writes a member's engine record from trtexec's log (stdlib only: the L4T container has
#: python3 but not spotstop). Same format as spotstop.guard.backends._trt_record.write_engine_record (JSON is
#: YAML). argv: MEMBER_DIR PRECISION STRONG(0/1) LOG GRAPH=ENGINE...
_RECORD_PY = r"""
import datetime, hashlib, json, pathlib, re, sys
member, precision, strong, log = sys.argv[1:5]
pairs = [a.split("=", 1) for a in sys.argv[5:]]
m = pathlib.Path(member)
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for c in iter(lambda: f.read(1 << 20), b""):
            h.update(c)
    return h.hexdigest()
text = pathlib.Path(log).read_text(errors="replace")
def last(pattern):
    found = re.findall(pattern, text)
    return found[-1].strip() if found else None
version = last(r"TensorRT version: *([0-9][0-9.]*)")
if version is None:
    n = last(r"\[TensorRT v([0-9]+)\]")
    if n:
        n = int(n)
        version = f"{n // 10000}.{n // 100 % 100}.{n % 100}"
gpu = last(r"Selected Device: *(.+)")
cc = last(r"Compute Capability: *([0-9.]+)")
if not (version and gpu and cc):
    sys.exit(f"could not read the TensorRT version, GPU and compute capability from {log}")
record = {
    "format": "spotstop-trt-engines",
    "version": 1,
    "tensorrt": version,
    "gpu": gpu,
    "compute_capability": cc,
    "precision": precision,
    "strongly_typed": strong == "1",
    "built_by": "trtexec",
    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "graphs": {
        p.relative_to(m).as_posix(): sha(p)
        for p in sorted((m / "onnx").rglob("*")) if p.is_file()
    },
    "engines": {g: {"file": e, "sha256": sha(m / e)} for g, e in sorted(pairs)},
}
(m / "trt" / "engines.yaml").write_text(json.dumps(record, indent=2) + "\n")
print(f"  {m}/trt/engines.yaml: TensorRT {version} on {gpu} (sm {cc}), {len(pairs)} engine(s)")
"""

_SCRIPT_HEAD = """\
#!/usr/bin/env bash
# Build the TensorRT engines of this bundle ON THE TARGET DEVICE (engines are specific to the
# GPU and the TensorRT release). Written by `spotstop export`; run from anywhere:
#   bash BUNDLE/trt/build.sh            (jetson/build_engines.sh BUNDLE runs it in the container)
# Each member's engines go to members/<name>/trt/*.plan with members/<name>/trt/engines.yaml,
# the record the `tensorrt` backend checks (TensorRT version, GPU, sha256 of graphs and engines).
# Networks are strongly typed (TensorRT 10: --stronglyTyped; 11: always); precision comes from
# the ONNX graphs. SPOTSTOP_TRT_TYPING=weak forces the deprecated weak typing (--fp16) on 10.x.
# Env: TRTEXEC (trtexec binary), PYTHON (python3, for the record), WORKSPACE_MIB.
set -euo pipefail
cd "$(dirname "$0")/.."
TRTEXEC="${TRTEXEC:-trtexec}"
PYTHON="${PYTHON:-python3}"
WORKSPACE_MIB="${WORKSPACE_MIB:-%(workspace)d}"

TRT_HELP="$("$TRTEXEC" --help 2>&1 || true)"
TRT_NUM=0
if [[ "$TRT_HELP" =~ \\[TensorRT\\ v([0-9]+)\\] ]]; then TRT_NUM="${BASH_REMATCH[1]}"; fi
TRT_MAJOR=$(( 10#$TRT_NUM / 10000 ))
TYPE_FLAGS=()
if [ "${SPOTSTOP_TRT_TYPING:-strong}" = weak ]; then
  STRONG=0
elif [ "$TRT_MAJOR" -ge 11 ]; then
  STRONG=1  # TensorRT 11+: every network is strongly typed
elif [[ "$TRT_HELP" == *--stronglyTyped* ]]; then
  STRONG=1; TYPE_FLAGS=(--stronglyTyped)
elif [[ "$TRT_HELP" != *--fp16* ]]; then
  STRONG=1  # no weak typing flags at all: a release where strong typing is the only mode
else
  STRONG=0  # a TensorRT release without strong typing
fi

build() {  # build MEMBER_DIR GRAPH ENGINE PRECISION [trtexec shape flags...]
  local m="$1" g="$2" e="$3" p="$4"; shift 4
  local flags=(${TYPE_FLAGS[@]+"${TYPE_FLAGS[@]}"})
  if [ "$STRONG" = 0 ]; then
    if [ "$p" = int4-trt ]; then
      echo "$m/$g is int4-trt (blocked DequantizeLinear): it needs a strongly typed build," \\
        "TensorRT 10 or newer (this trtexec: ${TRT_NUM})." >&2
      exit 1
    fi
    if [ "$p" = fp16 ]; then flags+=(--fp16); fi
  fi
  echo "building $m/$e from $m/$g ($p, $([ "$STRONG" = 1 ] && echo strongly || echo weakly) typed)"
  if ! "$TRTEXEC" --onnx="$m/$g" --saveEngine="$m/$e" ${flags[@]+"${flags[@]}"} \\
      --memPoolSize=workspace:"$WORKSPACE_MIB" "$@" >>"$m/trt/build.log" 2>&1; then
    tail -n 40 "$m/trt/build.log" >&2
    echo "trtexec failed on $m/$g (full log: $m/trt/build.log)" >&2
    exit 1
  fi
}

record() {  # record MEMBER_DIR PRECISION GRAPH=ENGINE...
  local m="$1" p="$2"; shift 2
  "$PYTHON" - "$m" "$p" "$STRONG" "$m/trt/build.log" "$@" <<'PY'
%(record)s
PY
}

begin() {  # begin MEMBER_DIR: no record until every engine of the member is built
  mkdir -p "$1/trt"
  rm -f "$1/trt/engines.yaml" "$1/trt/"*.plan
  : >"$1/trt/build.log"
}
"""


def write_trt_script(
    root: Path, exports: Sequence[Any], *, max_batch: int = DEFAULT_BATCH_SIZE
) -> Path:
    """Write ``trt/build.sh``: the trtexec commands that build every engine on the device.

    A bundle whose graphs TensorRT cannot parse (int8/int4 ``MatMulNBits``) gets a script that
    says so and exits 1.
    """
    specs = engine_specs(root, exports, max_batch=max_batch)
    lines = (_SCRIPT_HEAD % {"workspace": WORKSPACE_MIB, "record": _RECORD_PY.strip()}).split("\n")
    bad = sorted({s["precision"] for s in specs if s["precision"] not in TRT_PRECISIONS})
    if bad:
        lines += [
            f"# {', '.join(bad)} weight-only graphs use onnxruntime's MatMulNBits, which "
            "TensorRT cannot parse.",
            f"echo 'this bundle is {', '.join(bad)}: TensorRT cannot parse MatMulNBits; "
            "re-export with --precision fp16 (or int4-trt) for TensorRT, or serve it with "
            "the onnx backend' >&2",
            "exit 1",
        ]
    else:
        members: dict[str, list[dict[str, Any]]] = {}
        for s in specs:
            members.setdefault(s["member_dir"], []).append(s)
        for mdir, ms in members.items():
            q = shlex.quote(mdir)
            lines += ["", f"# member {ms[0]['member']} ({ms[0]['precision']})", f"begin {q}"]
            for s in ms:
                cmd = ["build", q, shlex.quote(s["graph"]), shlex.quote(s["engine"])]
                cmd.append(s["precision"])
                if not s["static"]:
                    cmd += [
                        f"--minShapes={_shape_arg(s['min'])}",
                        f"--optShapes={_shape_arg(s['opt'])}",
                        f"--maxShapes={_shape_arg(s['max'])}",
                    ]
                lines.append(" ".join(cmd))
            pairs = " ".join(shlex.quote(f"{s['graph']}={s['engine']}") for s in ms)
            lines.append(f"record {q} {ms[0]['precision']} {pairs}")
        lines += ["", 'echo "engines built; serve with: spotstop serve --backend tensorrt"']
    path = root / "trt" / "build.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def network_typing(trt: Any) -> tuple[bool, int]:
    """(strongly typed?, ``create_network`` flags) for this TensorRT module.

    11.x: always strongly typed, no flag (``STRONGLY_TYPED`` is deprecated and ignored);
    10.x: ``STRONGLY_TYPED``; older: weak typing with an explicit batch.
    """
    major = int(str(trt.__version__).split(".")[0])
    flags = trt.NetworkDefinitionCreationFlag
    if major >= 11:
        return True, 0
    strong = getattr(flags, "STRONGLY_TYPED", None)
    if strong is not None:
        return True, 1 << int(strong)
    return False, 1 << int(flags.EXPLICIT_BATCH)


def build_engines(
    root: Path,
    exports: Sequence[Any],
    *,
    max_batch: int = DEFAULT_BATCH_SIZE,
    progress: Callable[[str], Any] | None = None,
) -> bool:
    """Build the engines and their records with the TensorRT Python API.

    False (the script is still written by the caller) when tensorrt, cuda-python or a GPU is
    absent, or the graphs are a precision TensorRT cannot parse.
    """
    say = progress or (lambda _msg: None)
    try:
        import tensorrt as trt
    except ImportError:
        return False
    specs = engine_specs(root, exports, max_batch=max_batch)
    if any(s["precision"] not in TRT_PRECISIONS for s in specs):
        say("  TensorRT cannot parse int8/int4 (MatMulNBits) graphs: no engines built")
        return False
    from spotstop.guard import GuardError
    from spotstop.guard.backends._trt import open_device

    try:
        mem = open_device(0)
    except GuardError as e:  # no cuda-python or no GPU: the script is written instead
        say(f"  no TensorRT engines built here: {e}")
        return False
    logger = trt.Logger(trt.Logger.WARNING)
    try:
        builder = trt.Builder(logger)
    except Exception:  # no CUDA device / driver: fall back to the script, which is written
        mem.close()
        return False
    strong, net_flags = network_typing(trt)
    if not strong and any(s["precision"] == "int4-trt" for s in specs):
        mem.close()
        raise RuntimeError(
            f"TensorRT {trt.__version__} cannot build strongly typed networks, which int4-trt "
            "graphs (blocked DequantizeLinear) need: use TensorRT 10 or newer."
        )
    members: dict[str, list[dict[str, Any]]] = {}
    for s in specs:
        members.setdefault(s["member_dir"], []).append(s)
    try:
        for mdir, ms in members.items():
            member_dir = root / mdir
            (member_dir / "trt").mkdir(parents=True, exist_ok=True)
            (member_dir / "trt" / "engines.yaml").unlink(missing_ok=True)
            for s in ms:
                _build_one(trt, builder, logger, root, s, net_flags, strong)
                say(f"  built {mdir}/{s['engine']}")
            write_engine_record(
                member_dir,
                {s["graph"]: s["engine"] for s in ms},
                tensorrt_version=str(trt.__version__),
                gpu=mem.gpu_name,
                compute_capability=mem.compute_capability,
                precision=ms[0]["precision"],
                strongly_typed=strong,
                built_by="tensorrt-python",
            )
    finally:
        mem.close()
    return True


def _build_one(
    trt: Any, builder: Any, logger: Any, root: Path, s: dict[str, Any], flags: int, strong: bool
) -> None:
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    onnx_path = root / s["onnx"]
    if not parser.parse_from_file(str(onnx_path)):
        errs = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"TensorRT cannot parse {s['onnx']}: " + "; ".join(errs))
    cfg = builder.create_builder_config()
    cfg.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_MIB << 20)
    if not strong and s["precision"] == "fp16":
        cfg.set_flag(trt.BuilderFlag.FP16)  # weak typing: only releases without strong typing
    if not s["static"]:
        profile = builder.create_optimization_profile()
        for name in s["min"]:
            profile.set_shape(name, s["min"][name], s["opt"][name], s["max"][name])
        cfg.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, cfg)
    if plan is None:
        raise RuntimeError(f"TensorRT failed to build an engine for {s['onnx']}.")
    out = root / s["member_dir"] / s["engine"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        f.write(plan)
