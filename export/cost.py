"""Cost model of one scene: prefill FLOPs, weight bytes and the roofline lower bound per device.

``spotstop cost BUNDLE`` and :func:`bundle_cost` read a bundle alone (``manifest.yaml``, each
member's ``config.json``, ``tokenizer.json`` and rendered template): no torch, no transformers,
so the command runs on the base install.

What is counted (one scene, scene pass: the camera image + the request; no gray or text pass)
    * FLOPs = 2 x multiply-adds of every matrix product the scoring graphs run
      (export/graphs.py): linear layers, convolutions (patch embedding, the depthwise causal
      convolutions over their L + k - 1 padded outputs), attention scores and values over the
      full L x L matrix (the exported graph computes it all; a causal kernel would do about
      half), the Gated-DeltaNet's chunked algorithm as transformers' ``torch_chunk_gated_delta_rule``
      writes it for export, the reference an export is validated against (chunk size 64; the
      sequence padded to whole chunks; an exported kernel that computes the same result
      another way may do other work): the C x C
      products k_beta k^T and q k^T, the UT transform applied as two C x C products, and per
      chunk the state reads k_cumdecay S and q S, the intra-chunk product A v_new and the state
      update k^T v_new; SigLIP2's position-table resize (a matrix product); the output layer
      only at the rows the score reads: the answers' first-token rows at the last prompt
      position and one full-vocabulary row per continuation read (teacher forcing; the ONNX
      graph reads at least one such row per sequence).
    * Not counted: norms, activations, rotary embeddings, softmax, gating and other
      elementwise work, embedding gathers, and the forward substitution that builds the UT
      transform's inverse (elementwise, about C^3/3 multiply-adds per head and chunk). The
      SigLIP2 attention-pooling head is not counted: the scoring graph never reads it (the
      ONNX export drops it; the torch reference computes it).
    * Prefill only: one forward pass per continuation row over prompt + row, no generation.
    * Weight bytes per precision follow ``spotstop export`` (and ``jetson/memory_budget.py``):
      fp32 4 B, fp16 2 B per parameter; int8/int4 weight-only MatMulNBits on the matrix
      multiplies (1 / 0.5 B per weight + a float32 scale per block of 128), the token table as
      float16 (tied: the output layer's blocks plus a second copy of the scales and the 8-bit
      blocks of their rounding residual), the rest
      float32; int4-trt int4 blocks with float16 scales on the fp16 graph (tied: the float16
      table and the blocks). One rule, :func:`stored_weight_bytes`, which
      ``jetson/memory_budget.py`` calls too.

Roofline: the lower bound of one scene on a device is ``max(FLOPs / peak, bytes / bandwidth)``
with every weight read once from memory (activations at batch one are neglected: they are a few
MB against GB of weights). fp16: fp16 weights at the fp16 dense peak; int8: int8 weights at the
int8 dense peak (a W8A8 engine: weight-only int8 computes in fp16 and is bounded by the fp16
peak); int4: int4 weights computed in fp16 (weight-only). Peaks are dense (no 2:4 sparsity).

Per-architecture formulas are each architecture's :class:`ArchCost` in
``export/archs/<model_type>.py`` (the base, :class:`Params`, :class:`Workload` and
:func:`stored_weight_bytes` in ``export/archs/_cost_model.py``), registered by ``model_type``
(:data:`COST_MODELS`), like the rest of export; tests/export/test_cost.py checks them against
torch's FLOP counter on the tiny pair. The real pair's recorded configs are in the same modules.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotstop.export.archs import ARCHITECTURES, REAL_PAIR, REAL_SETTINGS
from spotstop.export.archs._cost_model import (
    CHUNK,
    PRECISIONS,
    WEIGHT_BYTES,
    ArchCost,
    Params,
    Workload,
    stored_weight_bytes,
)
from spotstop.export.cost_data import DEVICES, PAPER_TFLOPS
from spotstop.export.mixed import DEFAULT_INT4_INT8
from spotstop.export.precision import PRECISION_SPECS, get_precision
from spotstop.guard._hf import TEST_PAIR_NOTE

__all__ = [
    "ASSUMPTIONS",
    "CHUNK",
    "COST_MODELS",
    "DEVICES",
    "PRECISIONS",
    "WEIGHT_BYTES",
    "ArchCost",
    "MemberCost",
    "PairCost",
    "Params",
    "Workload",
    "bench_member_cost",
    "bundle_cost",
    "format_report",
    "get_cost_model",
    "measured_latencies",
    "member_cost",
    "paper_text_tokens",
    "real_pair_cost",
    "report",
    "roofline",
    "stored_weight_bytes",
]

#: precision -> which dense peak its compute runs at (module docstring)
_PEAK_OF = {p: s.roofline_peak for p, s in PRECISION_SPECS.items() if s.roofline_peak}
ROOFLINE_PRECISIONS: tuple[str, ...] = tuple(_PEAK_OF)

#: model_type -> its cost model (export/archs/__init__.py's registry)
COST_MODELS: dict[str, ArchCost] = {mt: a.cost for mt, a in ARCHITECTURES.items()}


def get_cost_model(model_type: str) -> ArchCost:
    try:
        return COST_MODELS[model_type]
    except KeyError:
        raise ValueError(
            f"no cost model is registered for architecture {model_type!r}; registered: "
            f"{sorted(COST_MODELS)}. Add export/archs/{model_type}.py."
        ) from None


# ---- per member, per scene -------------------------------------------------------------------


@dataclass(frozen=True)
class MemberCost:
    """One member's cost of one scene (FLOPs = 2 x multiply-adds)."""

    name: str
    model_type: str
    workload: Workload
    visual_tokens: int
    vision_flops: dict[str, int]
    decoder_flops: dict[str, int]
    output_flops: int
    params: Params
    precision: str | None = None  # the bundle's precision (None: not from a bundle)
    bundle_weight_bytes: int | None = None  # as the bundle's manifest records them
    padded_len: int | None = None  # the length bucket the ONNX graph runs at, if any
    padded_flops: int | None = None  # total FLOPs at that bucket
    #: what an int4 export of this member keeps at int8 (export/mixed.py's selectors) and the
    #: linear weights that makes (a tied output layer is the token table, not counted here)
    int4_int8: tuple[str, ...] = DEFAULT_INT4_INT8
    int4_linear_int8: int = 0

    @property
    def vision(self) -> int:
        return sum(self.vision_flops.values())

    @property
    def decoder(self) -> int:
        """Decoder prefill including the output rows read."""
        return sum(self.decoder_flops.values()) + self.output_flops

    @property
    def total(self) -> int:
        return self.vision + self.decoder

    def weight_bytes(self, precision: str) -> int:
        if get_precision(precision).nbits == 4:
            return self.params.bytes(
                precision, self.int4_linear_int8, "output_layer" in self.int4_int8
            )
        return self.params.bytes(precision)

    def as_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "name": self.name,
            "model_type": self.model_type,
            "images": [list(g) for g in w.images],
            "visual_tokens": self.visual_tokens,
            "seq_len": w.seq_len,
            "n_seqs": w.n_seqs,
            "first_rows": w.first_rows,
            "read_rows": w.read_rows,
            "vision_flops": self.vision,
            "vision_flops_by_item": self.vision_flops,
            "decoder_flops": self.decoder,
            "decoder_flops_by_item": {**self.decoder_flops, "output rows": self.output_flops},
            "total_flops": self.total,
            "params": self.params.total,
            "weight_bytes": {p: self.weight_bytes(p) for p in PRECISIONS},
            "int4_int8": list(self.int4_int8),
            "precision": self.precision,
            "bundle_weight_bytes": self.bundle_weight_bytes,
            "padded_len": self.padded_len,
            "padded_flops": self.padded_flops,
        }


def member_cost(
    name: str,
    config: Mapping[str, Any],
    workload: Workload,
    *,
    int4_int8: Sequence[str] = DEFAULT_INT4_INT8,
    **extra: Any,
) -> MemberCost:
    """A member's cost of one scene from its Hugging Face ``config`` (config.json as a dict);
    ``int4_int8``: what its int4 export keeps at int8 (export/mixed.py)."""
    model = get_cost_model(str(config["model_type"]))
    sel = tuple(int4_int8)
    vision: dict[str, int] = {}
    for grid in workload.images:
        for item, macs in model.vision_macs(config, grid).items():
            vision[item] = vision.get(item, 0) + 2 * macs
    decoder = {
        item: 2 * workload.n_seqs * macs
        for item, macs in model.decoder_macs(config, workload.seq_len).items()
    }
    return MemberCost(
        name=name,
        model_type=model.model_type,
        workload=workload,
        visual_tokens=sum(model.visual_tokens(config, g) for g in workload.images),
        vision_flops=vision,
        decoder_flops=decoder,
        output_flops=2 * model.output_macs(config, workload),
        params=model.params(config),
        int4_int8=sel,
        int4_linear_int8=model.int8_linear(config, sel),
        **extra,
    )


@dataclass(frozen=True)
class PairCost:
    """Every member's cost of one scene, the scene's total and where they came from."""

    label: str
    members: tuple[MemberCost, ...]
    test_pair: bool = False
    test_pair_note: str = ""  # what the test pair is, from its manifest ('' for none)
    setting: str | None = None  # the paper's setting this pair is costed at (--real)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return sum(m.total for m in self.members)

    def weight_bytes(self, precision: str) -> int:
        return sum(m.weight_bytes(precision) for m in self.members)


def roofline(flops: float, weight_bytes: float, device: str, precision: str) -> dict[str, float]:
    """Seconds: the compute bound, the memory bound and the lower bound (their max).

    ``device`` one of :data:`DEVICES`, ``precision`` one of :data:`ROOFLINE_PRECISIONS`;
    ``flops`` and ``weight_bytes`` finite and ≥ 0 (ValueError naming the argument)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {sorted(DEVICES)}; got {device!r}.")
    if precision not in _PEAK_OF:
        raise ValueError(
            f"precision {precision!r} has no roofline peak; one of {list(ROOFLINE_PRECISIONS)}."
        )
    for name, x in (("flops", flops), ("weight_bytes", weight_bytes)):
        if not (isinstance(x, int | float) and math.isfinite(x) and x >= 0):
            raise ValueError(f"{name} must be a finite number ≥ 0; got {x!r}.")
    dev = DEVICES[device]
    compute = flops / (float(dev[_PEAK_OF[precision]]) * 1e12)
    memory = weight_bytes / (float(dev["bandwidth_gbs"]) * 1e9)
    return {"compute_s": compute, "memory_s": memory, "bound_s": max(compute, memory)}


# ---- from a bundle ---------------------------------------------------------------------------

DEFAULT_REQUEST = "pick up the knife and hand it to the child"


def bundle_cost(path: str | os.PathLike[str], *, request: str = DEFAULT_REQUEST) -> PairCost:
    """Each member's cost of one scene of the bundle at ``path``, from its real token counts.

    The prompt is the bundle's own (rendered template, the member's tokenizer) with ``request``;
    the image grid is the member's; the continuation rows and the rows read follow the score
    plan of the bundle's answers. An ONNX member whose decoder has one graph per length bucket
    (or that runs on TensorRT) runs at the padded bucket: the FLOPs at that length are reported
    too (``padded_flops``); onnxruntime runs a dynamic-length decoder at the prompt's length.
    """
    import json

    from spotstop.guard import load_bundle
    from spotstop.guard._arch import get_arch
    from spotstop.guard._prompt import PromptEncoder
    from spotstop.guard.validate import load_yaml

    b = load_bundle(path, verify=False)
    entries = {e["name"]: e for e in b.manifest.get("members", [])}
    members = []
    for bm in b.members:
        config = json.loads((bm.path / "config.json").read_text(encoding="utf-8"))
        pre_path = bm.path / "preprocessor_config.json"
        pre = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
        arch = get_arch(bm.model_type)
        geom = arch.geometry(config, pre, bm.image_size)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(bm.path / "tokenizer.json"))
        enc = PromptEncoder(tok, bm.template, b.prompt)
        prompt = enc.prompt_ids(request, arch.image_text(geom))
        plan = enc.plan
        rows = len(plan.rows)
        seq = len(prompt) + plan.max_row_len
        entry = entries.get(bm.name, {})
        onnx = bm.backend != "torch"
        reads = _reads_per_row(plan)
        grid = (geom.height // geom.patch_size, geom.width // geom.patch_size)
        w = Workload(
            images=(grid,),
            seq_len=seq,
            n_seqs=rows,
            first_rows=len(plan.first_ids),
            read_rows=max(1, reads) if onnx else reads,
        )
        padded_len = padded = None
        buckets = sorted(int(x) for x in entry.get("buckets") or [])
        graphs = bm.path / "spotstop_onnx.yaml"  # guard.backends._graphs.GRAPHS_FILE
        decoder: dict[str, Any] = {}
        if onnx and graphs.is_file():
            text = graphs.read_text(encoding="utf-8")
            decoder = (load_yaml(text, source=str(graphs)) or {}).get("decoder") or {}
            buckets = buckets or sorted(int(x) for x in decoder.get("buckets") or [])
        # onnxruntime runs a dynamic-length decoder at the prompt's own length; one graph per
        # bucket (the old Qwen3.5 format) and TensorRT engines run at the padded bucket
        padded_runs = bool(decoder.get("fixed_length", True)) or bm.backend == "tensorrt"
        if onnx and buckets and padded_runs:
            padded_len = next((x for x in buckets if x >= seq), buckets[-1])
            padded = member_cost(
                bm.name, config, Workload(w.images, padded_len, rows, w.first_rows, w.read_rows)
            ).total
        precision = entry.get("precision") or ("fp32" if not onnx else None)
        # what this bundle's int4 weights keep at int8, as its export recorded (an int4 bundle
        # from before the record: none); another precision's int4 figure: the default
        int8 = entry.get("int4_int8")
        sel = (
            tuple(int8) if int8 is not None else (() if precision == "int4" else DEFAULT_INT4_INT8)
        )
        members.append(
            member_cost(
                bm.name,
                config,
                w,
                int4_int8=sel,
                precision=precision,
                bundle_weight_bytes=entry.get("weight_bytes"),
                padded_len=padded_len,
                padded_flops=padded,
            )
        )
    return PairCost(
        label=b.bundle_id,
        members=tuple(members),
        test_pair=b.test_pair,
        test_pair_note=b.test_pair_note,
        notes=(f"request: {request!r} (its tokens count; pass --request to cost another)",),
    )


def _reads_per_row(plan: Any) -> int:
    """Full-vocabulary rows the busiest continuation row reads (the graph's K)."""
    per_row = [0] * len(plan.rows)
    seen: set[tuple[int, int, int]] = set()
    for r, j, tok in plan.continuation_reads(plan.unsafe_ids) + plan.continuation_reads(
        plan.safe_ids
    ):
        if (r, j, tok) not in seen:
            seen.add((r, j, tok))
            per_row[r] += 1
    return max(per_row, default=0)


# ---- the real pair at the paper's settings ---------------------------------------------------

#: prompt tokens besides the visual ones, for --real (no real tokenizer here): the default
#: prompt (about 45 words), a short request, the chat markers and the image delimiters
DEFAULT_TEXT_TOKENS = 72


def real_pair_cost(setting: str, *, text_tokens: int = DEFAULT_TEXT_TOKENS) -> PairCost:
    """The real pair (recorded configs, export/archs/<model_type>.py) at the paper's ``setting``
    (``low`` or ``default``): one scene, single-token answers (two first-token rows, no
    full-vocabulary row), ``text_tokens`` prompt tokens besides the visual ones."""
    if setting not in REAL_SETTINGS:
        raise ValueError(f"setting must be one of {sorted(REAL_SETTINGS)}; got {setting!r}.")
    members = []
    for name, config in REAL_PAIR.items():
        grids = tuple(REAL_SETTINGS[setting][name])
        model = get_cost_model(str(config["model_type"]))
        visual = sum(model.visual_tokens(config, g) for g in grids)
        w = Workload(grids, seq_len=visual + text_tokens, n_seqs=1, first_rows=2, read_rows=0)
        members.append(member_cost(name, config, w))
    return PairCost(
        label=f"real pair (recorded configs), paper setting {setting!r}",
        members=tuple(members),
        setting=setting,
        notes=(
            f"{text_tokens} prompt tokens besides the visual ones (assumed; --text-tokens)",
            "configs recorded, not re-read from the hub (export/archs/<model_type>.py)",
        ),
    )


def paper_text_tokens(setting: str, *, limit: int = 100_000) -> int | None:
    """The prompt text tokens (besides the visual ones) at which :func:`real_pair_cost`
    reaches the paper's TFLOPs for ``setting``; None when it exceeds them already at one
    token (this model's visual work alone is more than the paper's figure) or never does."""
    target = PAPER_TFLOPS[setting] * 1e12
    if real_pair_cost(setting, text_tokens=1).total >= target:
        return None
    if real_pair_cost(setting, text_tokens=limit).total < target:
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if real_pair_cost(setting, text_tokens=mid).total < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


#: bench/gpu.py's real-dimension run: 512x512 images (32x32 patches) for both members
BENCH_GRID = (32, 32)


def bench_member_cost(record: Mapping[str, Any]) -> MemberCost | None:
    """The real member's cost in a bench/gpu.py run (512x512, the run's median prompt
    length with its visual tokens, one row, single-token answers); None for a member or run it cannot cost."""
    config = REAL_PAIR.get(str(record.get("member")))
    tokens = record.get("prompt_tokens")
    if config is None or not tokens:
        return None
    return member_cost(str(record["member"]), config, Workload((BENCH_GRID,), int(tokens)))


# ---- measured latencies (a results file the user passes, e.g. bench/RESULTS.md) ---------------

_ROW = re.compile(
    r"^\|\s*(?P<member>[^|]+?)\s*\|\s*(?P<step>[^|]+?)\s*\|\s*(?P<figure>median latency|"
    r"prompt length)\s*\|\s*(?P<value>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*\|"
)


def measured_latencies(
    results: str | os.PathLike[str], match: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """Median per-scene latencies in ``results`` (bench/RESULTS.md, sections as bench/gpu.py
    writes them: a ``### date — GPU — command`` heading and a ``| member | step | figure |
    value | unit |`` table) from the sections whose text ``match`` accepts. Each: member,
    step (torch / ort / trt), ms, the prompt length in tokens when the section gives it
    (else None), the section's GPU and the device of :data:`DEVICES` it names (None: none)."""
    p = Path(results)
    if not p.is_file():
        return []
    sections = re.split(r"(?m)^(?=### )", p.read_text(encoding="utf-8"))
    out = []
    for sec in sections:
        if not sec.startswith("### ") or not match(sec):
            continue
        head = sec.splitlines()[0]
        parts = [x.strip() for x in head[4:].split("—")]
        gpu = parts[1] if len(parts) > 1 else ""
        device = next((d for d in DEVICES if _names_device(gpu, d)), None)
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for line in sec.splitlines():
            m = _ROW.match(line)
            if not m:
                continue
            rec = found.setdefault(
                (m["member"], m["step"]),
                {
                    "member": m["member"],
                    "step": m["step"],
                    "ms": None,
                    "prompt_tokens": None,
                    "gpu": gpu,
                    "device": device,
                },
            )
            if m["figure"] == "median latency":
                rec["ms"] = float(m["value"])
            else:
                rec["prompt_tokens"] = int(float(m["value"]))
        out += [r for r in found.values() if r["ms"] is not None]
    return out


def _names_device(gpu: str, device: str) -> bool:
    key = device.split()[0].lower() if device.startswith(("L4", "H200")) else device.lower()
    g = gpu.lower().replace("nvidia", "").replace("jetson", "").strip()
    return bool(re.search(rf"\b{re.escape(key)}\b", g)) if key else False


# ---- report ----------------------------------------------------------------------------------


def report(
    pair: PairCost,
    *,
    devices: Sequence[str] = tuple(DEVICES),
    measured: Sequence[Mapping[str, Any]] = (),
    bound_for: Callable[[Mapping[str, Any]], MemberCost | None] | None = None,
) -> dict[str, Any]:
    """Everything ``spotstop cost`` prints, as a JSON-ready dict.

    ``measured``: records of :func:`measured_latencies`; ``bound_for(record)`` the member cost
    the measured run had (default: the pair's member of that name), None to skip the record.
    """
    rl: dict[str, Any] = {}
    for d in devices:
        rl[d] = {}
        for p in ROOFLINE_PRECISIONS:
            scene = roofline(pair.total, pair.weight_bytes(p), d, p)
            per = {m.name: roofline(m.total, m.weight_bytes(p), d, p) for m in pair.members}
            rl[d][p] = {"scene": scene, "members": per}
    ratios = []
    for r in measured:
        if bound_for is not None:
            m = bound_for(r)
        else:
            m = next((x for x in pair.members if x.name == r["member"]), None)
        if m is None or r["device"] is None:
            continue
        bound = roofline(m.total, m.weight_bytes("fp16"), r["device"], "fp16")["bound_s"]
        ratios.append(
            {
                **r,
                "precision": "fp16",
                "bound_flops": m.total,
                "bound_ms": bound * 1e3,
                "ratio": r["ms"] / (bound * 1e3),
            }
        )
    return {
        "label": pair.label,
        "test_pair": pair.test_pair,
        "test_pair_note": pair.test_pair_note or None,
        "setting": pair.setting,
        "notes": list(pair.notes),
        "members": [m.as_dict() for m in pair.members],
        "scene_flops": pair.total,
        "scene_weight_bytes": {p: pair.weight_bytes(p) for p in PRECISIONS},
        "paper_tflops": PAPER_TFLOPS,
        "paper_text_tokens": (
            paper_text_tokens(pair.setting) if pair.setting in PAPER_TFLOPS else None
        ),
        "roofline": rl,
        "devices": {d: DEVICES[d] for d in devices},
        "measured": ratios,
        "assumptions": ASSUMPTIONS,
    }


ASSUMPTIONS = (
    "prefill of one scene (scene pass only), no generation; FLOPs = 2 x multiply-adds",
    "counted: linear layers, convolutions, attention scores + values over the full L x L "
    "matrix, Gated-DeltaNet chunked products (chunk 64), the output layer at the rows read",
    "not counted: norms, activations, rotary, softmax, elementwise gating, gathers, the UT "
    "inverse's forward substitution, SigLIP2's unused pooling head",
    "roofline: max(FLOPs / dense peak, weight bytes / bandwidth), weights read once, "
    "activations neglected; int8 at the int8 peak (W8A8), int4 weight-only at the fp16 peak",
)


def _fmt_flops(x: float) -> str:
    if x >= 1e12:
        return f"{x / 1e12:.2f} T"
    if x >= 1e9:
        return f"{x / 1e9:.2f} G"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x / 1e3:.2f} k"


def _fmt_bytes(x: float) -> str:
    if x >= 2**30:
        return f"{x / 2**30:.2f} GiB"
    if x >= 2**20:
        return f"{x / 2**20:.1f} MiB"
    return f"{x / 2**10:.1f} KiB"


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


#: beside the cost of a test pair, after the note that says what the pair is
TEST_PAIR_COST_NOTE = "The costs below are those of the test members' dimensions."


def format_report(doc: Mapping[str, Any]) -> str:
    """The text ``spotstop cost`` prints for a :func:`report`."""
    lines = [f"cost of one scene: {doc['label']}"]
    if doc["test_pair"]:  # what the pair is (its manifest's kinds), then what the costs are
        lines.append(f"{doc.get('test_pair_note') or TEST_PAIR_NOTE} {TEST_PAIR_COST_NOTE}")
    lines += [f"  ({n})" for n in doc["notes"]]
    lines.append("")
    hdr = (
        f"{'member':<16} {'type':<8} {'visual':>6} {'seq':>5} {'rows':>4} "
        f"{'vision':>10} {'decoder':>10} {'(output)':>10} {'total':>10}  FLOPs"
    )
    lines.append(hdr)
    for m in doc["members"]:
        out = m["decoder_flops_by_item"]["output rows"]
        lines.append(
            f"{m['name'][:16]:<16} {m['model_type']:<8} {m['visual_tokens']:>6} "
            f"{m['seq_len']:>5} {m['n_seqs']:>4} {_fmt_flops(m['vision_flops']):>10} "
            f"{_fmt_flops(m['decoder_flops']):>10} {_fmt_flops(out):>10} "
            f"{_fmt_flops(m['total_flops']):>10}"
        )
        if m["padded_len"]:
            lines.append(
                f"{'':<16} as run: decoder padded to its length bucket {m['padded_len']} → "
                f"{_fmt_flops(m['padded_flops'])}FLOPs"
            )
    lines.append(
        f"{'scene':<16} {'':<8} {'':>6} {'':>5} {'':>4} {'':>10} {'':>10} {'':>10} "
        f"{_fmt_flops(doc['scene_flops']):>10}"
    )
    paper = doc["paper_tflops"]
    lines.append(
        f"paper (real pair, equal-weight, per case): {paper['low']} TFLOPs at the lowest "
        f"resolution, {paper['default']} TFLOPs at the default; this: "
        f"{doc['scene_flops'] / 1e12:.4g} TFLOPs"
    )
    setting = doc["setting"]
    if setting in paper:
        n = doc["paper_text_tokens"]
        lines.append(
            f"this model reaches the paper's {paper[setting]} TFLOPs ({setting}) at about {n} "
            "prompt text tokens per member (the paper does not give its prompt lengths)"
            if n
            else f"this model exceeds the paper's {paper[setting]} TFLOPs ({setting}) even at "
            "one text token: the assumed image tiling is heavier than the paper's"
        )
    lines.append("")
    lines.append(
        f"{'weights':<16} {'params':>8} "
        + " ".join(f"{p:>10}" for p in PRECISIONS)
        + f" {'bundle':>14}"
    )
    for m in doc["members"]:
        bw = m["bundle_weight_bytes"]
        bundle = f"{_fmt_bytes(bw)} {m['precision']}" if bw else "-"
        lines.append(
            f"{m['name'][:16]:<16} {m['params'] / 1e6:>7.2f}M "
            + " ".join(f"{_fmt_bytes(m['weight_bytes'][p]):>10}" for p in PRECISIONS)
            + f" {bundle:>14}"
        )
    lines.append(
        f"{'pair':<16} {'':>8} "
        + " ".join(f"{_fmt_bytes(doc['scene_weight_bytes'][p]):>10}" for p in PRECISIONS)
    )
    lines.append("")
    lines.append(
        "roofline lower bound of one scene, max(FLOPs / dense peak, weight bytes / "
        "bandwidth) [bound by: c compute, m memory]"
    )
    lines.append(
        f"{'device':<15} "
        + " ".join(f"{p:>14}" for p in ROOFLINE_PRECISIONS)
        + "   peak fp16 / int8, bandwidth"
    )
    for d, per in doc["roofline"].items():
        cells = []
        for p in ROOFLINE_PRECISIONS:
            s = per[p]["scene"]
            by = "c" if s["compute_s"] >= s["memory_s"] else "m"
            cells.append(f"{_fmt_s(s['bound_s'])} {by}".rjust(14))
        dev = doc["devices"][d]
        lines.append(
            f"{d:<15} "
            + " ".join(cells)
            + f"   {dev['fp16_tflops']:g} TFLOPS / {dev['int8_tops']:g} TOPS, "
            f"{dev['bandwidth_gbs']:g} GB/s"
        )
    lines.append("")
    if doc["measured"]:
        lines.append("measured (--results) / bound (fp16):")
        for r in doc["measured"]:
            lines.append(
                f"  {r['member']} {r['step']} on {r['gpu']}: {r['ms']:.2f} ms / "
                f"{r['bound_ms']:.3f} ms = {r['ratio']:.1f}x"
            )
    else:
        lines.append(
            "measured / bound: no measured latency for this pair (pass a results file with "
            "--results)."
        )
    lines.append("")
    lines.append("assumptions: " + "; ".join(doc["assumptions"]) + ".")
    return "\n".join(lines)
