"""Generate jetson/README.md: the memory budget of the pair on Orin NX / Orin Nano 8 GB.

    python jetson/memory_budget.py                 # recorded config values (below)
    python jetson/memory_budget.py --config-dir Qwen3.5-2B=/models/Qwen3.5-2B \\
                                   --config-dir LFM2.5-VL-3B=/models/LFM2.5-VL-3B
    python jetson/memory_budget.py --print         # print instead of writing the README

Parameter counts are not typed by hand: each member's config object is built with its
transformers config class (``Qwen3_5Config``, ``Lfm2VlConfig``); the parameters are split by
role with the cost model's per-architecture formulas (``spotstop.export.cost``, tested against
the tiny pair's torch modules), whose total must equal the model instantiated on the meta device
(no memory, no weights). Weights the scoring graph never reads (SigLIP2's attention-pooling
head, 15 M in LFM2.5-VL-3B) are not stored and not counted.
Bytes per precision follow what ``spotstop export`` writes (one rule,
``spotstop.export.cost.stored_weight_bytes``):

* fp32 4 B, fp16 2 B per parameter;
* int8-nbits / int4: weight-only MatMulNBits on every matrix multiply (1 B / 0.5 B per weight
  plus one float32 scale per block of 128 / 32), token-embedding tables stored as float16, the
  rest (norms, convolutions, biases) float32; int4 keeps at int8 what export/mixed.py's default
  selectors choose (``DEFAULT_INT4_INT8``; none unless that default changes);
* int8 (computes in int8, DynamicQuantizeMatMul): 1 B per weight plus one float32 scale per
  output column, counted as int8-nbits' one per 128 rows (an upper bound: every layer has at
  least 128 input rows), and the output layer as int8-nbits';
* a tied output layer (word embeddings = output layer, both members) is stored ONCE, as the
  exported graph holds it (export/onnx.py ``tie_output_layer``): at fp32/fp16 the token
  Gather and the output layer's ``Gemm(transB=1)`` read the same table; at int8/int4 the
  table is the output layer's MatMulNBits blocks, which ``GatherBlockQuantized`` reads too
  (plus a second copy of the block scales, 4 B per block of 128, in the layout it needs), and
  the 8-bit blocks of their rounding residual (1 B per weight and a scale per block), which a
  second ``GatherBlockQuantized`` adds to every token embedding (export/weights.py);
  at int4-trt (INT4 ``DequantizeLinear`` → MatMul, the form TensorRT parses; TensorRT has no
  quantized Gather) the output layer is int4 blocks and the Gather table float16: twice;
* int4-trt quantizes the fp16 graph: float16 scales (2 B per block of 128), the rest (norms,
  convolutions, biases) float16 as at fp16, and float16 activations as at fp16;
* at int8, int8-nbits and int4 the vision graph's first and last layers (a Linear patch
  embedding, the projector's last layer) stay float32: 4 B per weight;
* the first-token rows of the output layer (two rows) are not counted.

The CONFIG VALUES below were recorded from the members' published ``config.json`` files and
could not be re-read here (no model hub in this environment). Check them against the real
snapshots with ``--config-dir`` (which reads config.json and replaces the recorded values).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotstop.export.archs import REAL_PAIR
from spotstop.export.cost import PRECISIONS as _PRECISIONS
from spotstop.export.cost import stored_weight_bytes
from spotstop.export.mixed import DEFAULT_INT4_INT8
from spotstop.export.onnx import DEFAULT_BUCKETS
from spotstop.export.precision import get_precision
from spotstop.export.trt import MAX_CONTINUATION_ROWS
from spotstop.guard._config import DEFAULT_BATCH_SIZE

HERE = Path(__file__).resolve().parent

#: Recorded config values. Source: the members' config.json on the Hugging Face hub
#: (Qwen/Qwen3.5-2B; LiquidAI/LFM2.5-VL-3B, whose text backbone is LFM2.5-2.6B with the
#: 128K vocabulary and whose vision tower is SigLIP2 NaFlex so400m). UNVERIFIED offline.
#: Kept once, in each architecture's module ``export/archs/<model_type>.py`` (``spotstop cost
#: --real`` reads them too; ``spotstop.export.archs.REAL_PAIR`` lists them).
RECORDED: dict[str, dict[str, Any]] = REAL_PAIR

#: Scoring shapes: each member's default visual-token budget (the paper's low-resolution
#: rule: Qwen3.5 256 tokens at 512x512, LFM2-VL 64 without tiling at 256x256, from
#: ``spotstop.guard._arch``); the largest default length bucket (the guard scores any prompt
#: up to it); the guard's default scenes per backend call.
SEQ = max(DEFAULT_BUCKETS)
BATCH = DEFAULT_BATCH_SIZE
#: A TensorRT engine's context reserves activation memory for its profile's largest shape:
#: ``BATCH`` prompts times the continuation rows a profile admits (``export/trt.py``).
TRT_ROWS = DEFAULT_BATCH_SIZE * MAX_CONTINUATION_ROWS
#: Assumptions (state them, do not hide them): JetPack 6 with the desktop off leaves about
#: 6.5 GiB of the 8 GiB shared memory to applications; one process's CUDA context + cuBLAS/
#: cuDNN + TensorRT / onnxruntime libraries take about 1 GiB.
DEVICE_GIB = {"Orin NX 8GB": 8.0, "Orin Nano 8GB": 8.0}
OS_RESERVED_GIB = 1.5
RUNTIME_GIB = 1.0

#: bytes per parameter by role and precision: the export's one rule (export/cost.py)
PRECISIONS = _PRECISIONS


def build_config(name: str, recorded: dict[str, Any]) -> Any:
    """The member's transformers config object, built with the config class its architecture's
    registered export config names (``MemberRecipe.config_class``)."""
    import transformers
    from spotstop.export.configs import get_export_config

    values = dict(recorded)
    model_type = values.pop("model_type")
    cls = getattr(transformers, get_export_config(model_type).member_recipe.config_class)
    return cls(**values)


@dataclass(frozen=True)
class Counts:
    """Parameters by role: matrix-multiply weights, embedding tables, everything else."""

    name: str
    vision_linear: int
    vision_other: int
    text_linear: int
    embed: int
    tied: bool  # the output layer is the embedding table (stored once, see the module doc)
    text_other: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    vision_patches: int
    #: what ``spotstop export --precision int4`` keeps at int8 by default (export/mixed.py):
    #: linear weights, and whether the tied table is one of them
    int4_linear_int8: int = 0
    int4_table_int8: bool = False
    #: of ``vision_linear``: the vision graph's first and last layers (int8/int4: float32)
    vision_ends: int = 0

    @property
    def total(self) -> int:
        return (
            self.vision_linear + self.vision_other + self.text_linear + self.embed + self.text_other
        )


def count(name: str, config: Any) -> Counts:
    """Parameters by role as the export stores them: the cost model's split
    (``spotstop.export.cost``: matrix multiplies, the token table, the rest; weights the
    scoring graph never reads, such as SigLIP2's attention-pooling head, left out), checked
    against the parameters of the model instantiated on the meta device."""
    import torch
    from spotstop.export.cost import get_cost_model
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    on_meta = sum(p.numel() for p in model.parameters())  # a tied table counts once
    params = get_cost_model(str(config.model_type)).params(config.to_dict())
    if params.total != on_meta:
        raise RuntimeError(
            f"{name}: the cost model counts {params.total:,} parameters, transformers "
            f"instantiates {on_meta:,}; export/cost.py's {config.model_type} formulas are stale."
        )
    vl = params.vision_linear - params.unused[0]
    vo = params.vision_other - params.unused[1]
    tl, em, to = params.text_linear + params.head, params.embed, params.other
    text = config.get_text_config()
    tied = not params.head
    v = config.vision_config
    patch = int(getattr(v, "patch_size", 16))
    return Counts(
        name=name,
        vision_linear=vl,
        vision_other=vo,
        text_linear=tl,
        embed=em,
        tied=tied,
        text_other=to,
        hidden=int(text.hidden_size),
        intermediate=int(getattr(text, "intermediate_size", 4 * text.hidden_size)),
        heads=int(text.num_attention_heads),
        vocab=int(text.vocab_size),
        vision_hidden=int(v.hidden_size),
        vision_intermediate=int(v.intermediate_size),
        vision_heads=int(getattr(v, "num_heads", getattr(v, "num_attention_heads", 16))),
        vision_patches=_vision_patches(config, patch),
        int4_linear_int8=get_cost_model(str(config.model_type)).int8_linear(
            config.to_dict(), DEFAULT_INT4_INT8
        ),
        int4_table_int8=tied and "output_layer" in DEFAULT_INT4_INT8,
        vision_ends=params.vision_ends,
    )


def _vision_patches(config: Any, patch: int) -> int:
    """Vision patches of one image at the member's default visual-token budget."""
    from spotstop.guard._arch import get_arch

    arch = get_arch(config.model_type)
    h, w = arch.grid_for_tokens(config.to_dict(), arch.default_visual_tokens)
    return (h // patch) * (w // patch)


def weight_bytes(c: Counts, precision: str) -> float:
    """Weight bytes as ``spotstop export`` stores them (the export's rule,
    ``spotstop.export.cost.stored_weight_bytes``)."""
    return stored_weight_bytes(
        precision,
        linear=c.vision_linear + c.text_linear,
        table=c.embed,
        other=c.vision_other + c.text_other,
        tied=c.tied,
        linear_int8=c.int4_linear_int8,
        table_int8=c.int4_table_int8,
        image_ends=c.vision_ends,
    )


def on_trt(precision: str) -> bool:
    """Whether the precision runs on TensorRT (its engines fix their profile at export)."""
    return "tensorrt" in get_precision(precision).targets


def activation_bytes(c: Counts, precision: str, batch: int = BATCH) -> float:
    """Peak activations of one scoring call of ``batch`` scenes at the largest bucket (float32
    compute where onnxruntime keeps it); on TensorRT the profile's maximum rows, whatever
    ``batch``."""
    act = get_precision(precision).activation_bytes  # int4-trt: the fp16 graph
    trt = on_trt(precision)
    n, images = (TRT_ROWS, BATCH) if trt else (batch, batch)
    # vision, each scene's image: a few live (patches × hidden) tensors, the MLP, one
    # head-group of scores
    vis = c.vision_patches * (4 * c.vision_hidden + c.vision_intermediate) * act
    vis += c.vision_heads * c.vision_patches**2 * act
    vis *= images
    # decoder: residual + attention/MLP temporaries, one layer's attention scores, the
    # full-vocabulary log-softmax at a few read positions
    dec = n * SEQ * (6 * c.hidden + 2 * c.intermediate) * act
    dec += n * c.heads * SEQ * SEQ * act
    dec += n * 4 * c.vocab * 4
    return vis + dec


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def render(counts: list[Counts]) -> str:
    lines = [
        "# jetson/ — the Avg-2 pair on Orin NX / Orin Nano 8 GB",
        "",
        "<!-- GENERATED by jetson/memory_budget.py — edit the script, not this file. -->",
        "",
        "One self-describing deployable: an L4T container running the spotstop sidecar with an",
        "exported bundle (`spotstop export`), TensorRT engines built on the device, and a systemd",
        "unit. The runtime imports no torch and no transformers.",
        "",
        "| file | what |",
        "| --- | --- |",
        "| `Dockerfile` | L4T base (JetPack 6, `nvcr.io/nvidia/l4t-jetpack:r36.4.0`), onnxruntime-gpu, spotstop runtime; in-container smoke test |",
        "| `build_engines.sh` | runs the bundle's `trt/build.sh` (exact `trtexec` commands written at export) on the device |",
        "| `spotstop-sidecar.service` | systemd unit: `spotstop serve --bundle /opt/spotstop/bundle` in the container |",
        "| `memory_budget.py` | writes this README from the members' real config classes (meta-device parameter counts) |",
        "",
        "Platform constraints: aarch64, JetPack 6.x (L4T r36, CUDA 12.6, TensorRT 10.3); engines are",
        "built on the device that runs them. TensorRT (`--backend tensorrt`) takes fp32, fp16",
        "and int4-trt bundles (int4-trt: the fp16 graph with INT4 DequantizeLinear weights and",
        "float16 scales, fp16 GEMMs and activations; strongly typed engines);",
        "int8-nbits/int4 weight-only bundles (onnxruntime MatMulNBits) run on onnxruntime's",
        "CUDA provider (`--backend onnx --device cuda`); int8 (DynamicQuantizeMatMul) is a CPU",
        "precision (onnxruntime's int8 GEMM on x86 VNNI/AMX and ARM dot products).",
        "",
        "## Deploy",
        "",
        "```bash",
        "# workstation",
        "spotstop export --member Qwen/Qwen3.5-2B --member LiquidAI/LFM2.5-VL-3B --out bundle --precision int4-trt",
        "spotstop policy init bundle --pool frames/ --requests requests.txt   # first policy, unlabelled frames",
        "# copy bundle/ to the device",
        "# device",
        "docker build -t spotstop-jetson -f jetson/Dockerfile .",
        "jetson/build_engines.sh /opt/spotstop/bundle     # TensorRT engines + engines.yaml, on the device",
        "# the unit serves with onnxruntime on CUDA; for the engines add `--backend tensorrt` to its serve line",
        "sudo cp jetson/spotstop-sidecar.service /etc/systemd/system/ && sudo systemctl enable --now spotstop-sidecar",
        "```",
        "",
        "## Memory budget (generated)",
        "",
        "Shapes: each member's default visual-token budget (Qwen3.5 256 tokens at 512x512, "
        f"LFM2-VL 64 at 256x256 without tiling), sequence bucket {SEQ} (the largest default "
        f"bucket), {BATCH} scenes per call (the guard's default `batch_size`); precisions that "
        f"run on TensorRT are sized at the engines' profile maximum, {TRT_ROWS} decoder rows "
        "(a TensorRT context reserves its activation memory for the largest shape). A smaller "
        "`batch_size` in the scoring config, and `--buckets` at export, lower the activations. "
        f"Assumed: {OS_RESERVED_GIB} GiB for L4T/OS, {RUNTIME_GIB} GiB for the CUDA context and "
        "runtime libraries, per process.",
        "",
        "**Config values.** Without `--config-dir` the dimensions are the ones recorded in "
        "`RECORDED` in this script from the members' published `config.json`; they could not be "
        "checked offline here. Regenerate with `python jetson/memory_budget.py --config-dir "
        "Qwen3.5-2B=/models/Qwen3.5-2B --config-dir LFM2.5-VL-3B=/models/LFM2.5-VL-3B` (the real "
        "snapshot folders) before relying on the numbers.",
        "",
        "Parameters the bundle stores (the cost model's split by role; its total checked against the meta-device model of the config classes):",
        "",
        "| member | vision | text matmul | embeddings | other | total |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in counts:
        lines.append(
            f"| {c.name} | {(c.vision_linear + c.vision_other) / 1e6:.0f} M | "
            f"{c.text_linear / 1e6:.0f} M | {c.embed / 1e6:.0f} M | {c.text_other / 1e6:.1f} M | "
            f"{c.total / 1e9:.2f} B |"
        )
    lines += [
        "",
        "Weights, activations and total per member and precision (GiB):",
        "",
        "| member | precision | weights | activations | + runtime | member total |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    totals: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    weights: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for c in counts:
        for p in PRECISIONS:
            w, a = weight_bytes(c, p), activation_bytes(c, p)
            t = w + a
            totals[p].append(t)
            weights[p].append(w)
            lines.append(
                f"| {c.name} | {p} | {_gib(w)} | {_gib(a)} | {RUNTIME_GIB:.2f} | "
                f"{_gib(t + RUNTIME_GIB * 2**30)} |"
            )
    lines += [
        "",
        "The pair on an 8 GB Orin (one process; members resident together, or one after the other):",
        "",
        "| precision | pair weights | both resident | one at a time (peak) | available | mode | both resident up to `batch_size` |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    avail = min(DEVICE_GIB.values()) - OS_RESERVED_GIB
    for p in PRECISIONS:
        both = sum(totals[p]) / 2**30 + RUNTIME_GIB
        one = max(totals[p]) / 2**30 + RUNTIME_GIB
        if both <= avail:
            mode = "both resident"
        elif one <= avail:
            mode = "one after the other (`spotstop export --sessions on-demand`)"
        else:
            mode = "does not fit"
        fits = [
            b
            for b in range(1, BATCH + 1)
            if sum(weights[p]) / 2**30
            + sum(activation_bytes(c, p, b) for c in counts) / 2**30
            + RUNTIME_GIB
            <= avail
        ]
        smaller = (
            "— (profile fixed at export)" if on_trt(p) else (str(max(fits)) if fits else "none")
        )
        lines.append(
            f"| {p} | {sum(weights[p]) / 2**30:.2f} | {both:.2f} | {one:.2f} | {avail:.2f} | "
            f"{mode} | {smaller} |"
        )
    lines += [
        "",
        '"One after the other": the bundle\'s members load their onnxruntime sessions when they',
        "score and release them after, so only one member's weights are resident at a time (the",
        "guard scores members in turn); it costs a session load per check.",
        "",
        "## Triton (GPU server option)",
        "",
        "`spotstop export ... --triton` lays out `triton/<member>__<graph>/config.pbtxt` for",
        "Triton Inference Server (`onnxruntime_onnx` platform); `triton/populate.sh` links the",
        "graphs into the version folders. The client computes s from `first_logits` and",
        "`read_logprob` as `spotstop.guard.backends._onnx.combine_scores` does.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--config-dir", action="append", default=[], help="NAME=FOLDER with config.json"
    )
    ap.add_argument("--print", action="store_true", help="print instead of writing README.md")
    args = ap.parse_args(argv)
    recorded = {k: dict(v) for k, v in RECORDED.items()}
    for item in args.config_dir:
        name, eq, folder = item.partition("=")
        if not eq or name not in recorded:
            ap.error(f"--config-dir {item!r}: give NAME=FOLDER with NAME one of {sorted(RECORDED)}")
        if not (Path(folder) / "config.json").is_file():
            ap.error(f"--config-dir {item!r}: {folder!r} holds no config.json")
        data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        data.pop("architectures", None)
        recorded[name] = data
    counts = [count(name, build_config(name, r)) for name, r in recorded.items()]
    text = render(counts)
    if args.print:
        print(text)
    else:
        (HERE / "README.md").write_text(text, encoding="utf-8")
        print(f"wrote {HERE / 'README.md'}")
    assert all(math.isfinite(weight_bytes(c, "fp32")) for c in counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
