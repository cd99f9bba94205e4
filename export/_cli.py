"""The export room's subcommands: ``tiny``, ``export`` and ``verify-bundle``.

Each has ``add_<cmd>_parser(subparsers)`` (adds its parser and sets ``func``) and
``run_<cmd>(args) -> int``. The composition root (``spotstop.cli``) registers them; this
module imports only the standard library, and each handler imports what it needs when it
runs. ``tiny`` and ``export`` need the ``export`` extra (torch, transformers, onnx);
``verify-bundle`` runs its runtime half on the base install and its torch-reference half
where the extra is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "add_export_parser",
    "add_tiny_parser",
    "add_verify_bundle_parser",
    "run_export",
    "run_tiny",
    "run_verify_bundle",
]


# ---- tiny ------------------------------------------------------------------------------------


def add_tiny_parser(sub: Any) -> None:
    """``spotstop tiny``: build the tiny TEST pair."""
    p = sub.add_parser(
        "tiny",
        help="build the tiny test pair (seeded random weights; its decisions mean nothing)",
        description=(
            "Build two tiny Hugging Face model folders from the real architectures' config "
            "classes (qwen3_5: Gated-DeltaNet + full attention with the Qwen3.5 vision tower; "
            "lfm2_vl: LFM2 short-conv + attention with a SigLIP2 vision tower), with seeded "
            "random weights and a locally trained byte-level BPE tokenizer whose chat template "
            "is shaped like each real model's. THIS IS A TEST PAIR: its scores and decisions "
            "mean nothing. Same seed → byte-identical files."
        ),
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder to write (default: $SPOTSTOP_HOME/tiny, ~/.cache/spotstop/tiny)",
    )
    p.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed (default 0)")
    p.set_defaults(func=run_tiny)


def run_tiny(args: argparse.Namespace) -> int:
    """Run ``spotstop tiny``."""
    from spotstop.export.tiny import build_tiny_pair, tree_digest

    pair = build_tiny_pair(args.out, seed=args.seed, progress=True)
    for m in pair.members:
        weights = tree_digest(m).get("model.safetensors", "?")
        print(f"{m}  (model.safetensors sha256 {weights[:16]}…)")
    print("TEST PAIR: seeded random weights — its scores and decisions mean nothing.")
    return 0


# ---- export ----------------------------------------------------------------------------------


def add_export_parser(sub: Any) -> None:
    """``spotstop export``: Hugging Face members → ONNX scoring graphs → a verified bundle."""
    p = sub.add_parser(
        "export",
        help="export members to ONNX scoring graphs in a verified bundle (workstation)",
        description=(
            "Export each --member (a Hugging Face folder or hub id) to two ONNX scoring graphs "
            "(vision tower at a fixed image grid; decoder over right-padded length buckets that "
            "returns only what the score reads), validate every output against the torch "
            "reference, convert to --precision, and write a bundle (manifest with every "
            "file's sha256, tokenizer.json, rendered templates, answer token ids) that "
            "`spotstop check --bundle` serves with onnxruntime, without torch. policy.yaml is "
            "fitted afterwards (`spotstop policy init BUNDLE --pool FRAMES --request TEXT`). TensorRT engines are "
            "built when tensorrt and a GPU are present; otherwise trt/build.sh holds the "
            "trtexec commands for the device."
        ),
    )
    p.add_argument(
        "--member", action="append", required=True, help="member folder or hub id; repeat"
    )
    p.add_argument("--out", type=Path, required=True, help="bundle folder to write (replaced)")
    p.add_argument(
        "--precision",
        choices=["fp32", "fp16", "int8", "int4", "int4-trt"],
        default="fp32",
        help="graph weights: fp32, fp16, weight-only int8/int4 (MatMulNBits, block 128, "
        "onnxruntime only) or int4-trt (INT4 DequantizeLinear -> MatMul, block 128: TensorRT "
        "and onnxruntime; nvidia-modelopt's quantizer when installed)",
    )
    p.add_argument(
        "--image-size",
        default=None,
        help="HxW grid, e.g. 512x512 (default: 512x512 = 256 visual tokens)",
    )
    p.add_argument(
        "--buckets",
        default=None,
        help="comma-separated right-padded sequence lengths (default 384,512,1024)",
    )
    p.add_argument(
        "--config", type=Path, default=None, help="scoring YAML (prompt, answers, image size)"
    )
    p.add_argument("--name", default="bundle", help="bundle id prefix")
    p.add_argument(
        "--trt",
        choices=["auto", "script", "off"],
        default="auto",
        help="TensorRT engines or build script",
    )
    p.add_argument("--triton", action="store_true", help="also lay out a Triton model repository")
    p.add_argument(
        "--sessions",
        choices=["resident", "on-demand"],
        default="resident",
        help="on-demand: a member loads its graphs to score and releases them after (members run one after the other)",
    )
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Run ``spotstop export``: 0 written, 1 beyond tolerance, 2 bad input."""
    from spotstop.export.onnx import DEFAULT_BUCKETS
    from spotstop.export.onnx_bundle import write_onnx_bundle
    from spotstop.guard._config import ScoringConfig, load_scoring_config, parse_image_size

    cfg = load_scoring_config(args.config) if args.config else ScoringConfig()
    size = parse_image_size(args.image_size, "--image-size") if args.image_size else None
    try:
        buckets = (
            [int(b) for b in args.buckets.split(",")] if args.buckets else list(DEFAULT_BUCKETS)
        )
    except ValueError:
        print(
            f"spotstop export: --buckets must be integers like 384,512; got {args.buckets!r}.",
            file=sys.stderr,
        )
        return 2
    try:
        b = write_onnx_bundle(
            args.member,
            args.out,
            config=cfg,
            precision=args.precision,
            image_size=size,
            buckets=buckets,
            name=args.name,
            trt=args.trt,
            triton=args.triton,
            sessions=args.sessions,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except ValueError as e:  # validation failures list every output beyond tolerance
        print(f"spotstop export: {e}", file=sys.stderr)
        return 1
    for m in b.members:
        print(
            f"{m.name:<24} {m.model_type:<8} {m.precision:<8} {m.weight_bytes / 2**20:9.2f} MiB  buckets {list(m.buckets)}"
        )
    print(f"{'pair':<24} {'':<8} {b.precision:<8} {b.weight_bytes / 2**20:9.2f} MiB")
    print(f"bundle {b.path}  id {b.bundle_id}  prompt_hash {b.prompt_hash}  tensorrt: {b.trt}")
    print(
        f"next: `spotstop verify-bundle {b.path}`, then fit its first policy on unlabelled "
        f"frames: `spotstop policy init {b.path} --pool FRAMES --request TEXT`."
    )
    return 0


# ---- verify-bundle ---------------------------------------------------------------------------


def add_verify_bundle_parser(sub: Any) -> None:
    """``spotstop verify-bundle``: the runtime half, then the torch-reference half."""
    p = sub.add_parser(
        "verify-bundle",
        help="check an exported bundle as the robot runs it, and against the torch reference",
        description=(
            "Runtime half (base install): check the manifest's sha256 list, load every member "
            "with the bundle's own backend and score generated scenes (scene and request-only "
            "passes); every score must be finite. Reference half (needs pip install "
            "'spotstop[export]'; skipped with a note without it): score the same scenes with "
            "each member's torch reference; print max |Δs|, Spearman and decision agreement per "
            "member and the pair's Avg-2 decision agreement. Exit 1 when a member fails either "
            "half (reference: beyond its per-precision tolerance, fp32 |Δs| ≤ 1e-3)."
        ),
    )
    p.add_argument("bundle", type=Path, help="bundle folder")
    p.add_argument("--scenes", type=int, default=12, help="generated scenes (default 12)")
    p.add_argument("--seed", type=int, default=0, help="scene seed")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        help="NAME=HF_FOLDER reference for a member (default: the manifest's source); repeatable",
    )
    p.add_argument(
        "--runtime-only",
        action="store_true",
        help="run the runtime half only, even where torch is installed",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_verify_bundle)


def run_verify_bundle(args: argparse.Namespace) -> int:
    """Run ``spotstop verify-bundle``: 0 pass, 1 fail, 2 bad input."""
    from dataclasses import asdict

    from spotstop.export.verify import verify_bundle

    sources = {}
    for item in args.source:
        name, sep, path = item.partition("=")
        if not sep:
            print(
                f"spotstop verify-bundle: --source must be NAME=FOLDER; got {item!r}.",
                file=sys.stderr,
            )
            return 2
        sources[name] = path
    v = verify_bundle(
        args.bundle,
        n_scenes=args.scenes,
        seed=args.seed,
        sources=sources,
        reference=False if args.runtime_only else None,
    )
    if args.json:
        doc = {
            "bundle_id": v.bundle_id,
            "ok": v.ok,
            "runtime": [{**asdict(r), "ok": r.ok} for r in v.runtime],
            "reference_skipped": v.skipped,
            "pair_decision_agreement": v.pair_decision_agreement if v.members else None,
            "members": [{**asdict(m), "ok": m.ok} for m in v.members],
        }
        print(json.dumps(_finite_or_null(doc), indent=2, allow_nan=False))
    else:
        print(v)
    return 0 if v.ok else 1


def _finite_or_null(x: Any) -> Any:
    """JSON has no NaN or infinity: such a number is written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_null(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite_or_null(v) for v in x]
    return x
