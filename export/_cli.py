"""The export room's subcommands: ``tiny``, ``export``, ``verify-bundle`` and ``cost``.

Each has ``add_<cmd>_parser(subparsers)`` (adds its parser and sets ``func``) and
``run_<cmd>(args) -> int``. The composition root (``spotstop.cli``) registers them; this
module imports only the standard library, and each handler imports what it needs when it
runs. ``tiny`` and ``export`` need the ``export`` extra (torch, transformers, onnx);
``verify-bundle`` runs its runtime half on the base install and its torch-reference half
where the extra is installed; ``cost`` runs on the base install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "add_cost_parser",
    "add_export_parser",
    "add_tiny_parser",
    "add_verify_bundle_parser",
    "add_world_parser",
    "run_cost",
    "run_export",
    "run_tiny",
    "run_verify_bundle",
    "run_world",
]


# ---- tiny ------------------------------------------------------------------------------------


def add_tiny_parser(sub: Any) -> None:
    """``spotstop tiny``: build the tiny TEST pair (random, or trained on the toy world)."""
    p = sub.add_parser(
        "tiny",
        help="build the tiny test pair (random weights, or --trained on the toy world)",
        description=(
            "Build two tiny Hugging Face model folders from the real architectures' config "
            "classes (qwen3_5: Gated-DeltaNet + full attention with the Qwen3.5 vision tower; "
            "lfm2_vl: LFM2 short-conv + attention with a SigLIP2 vision tower) and a locally "
            "trained byte-level BPE tokenizer whose chat template is shaped like each real "
            "model's. THIS IS A TEST PAIR. Without --trained its weights are seeded random "
            "numbers: its scores and decisions mean nothing (same seed → byte-identical "
            "files). With --trained it is the pair taught the toy world's rule (`spotstop "
            "world --rules`): the committed weights, checked against their sha256, or with "
            "--retrain the same training run again here (11 to 16 minutes on 2 cores, on "
            "two threads), then compared with the committed weights: the same sha256, or how "
            "far apart their scores are (another CPU or library version trains another "
            "pair). Its scores carry a signal in that toy world only."
        ),
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder to write (default: $SPOTSTOP_HOME/tiny, or $SPOTSTOP_HOME/tiny-trained "
        "with --trained)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="weight and tokenizer seed, 0..2**63-1 (default 0; with --trained, the seed the "
        "committed weights were trained from, which trained.json records: another applies "
        "only with --retrain)",
    )
    p.add_argument(
        "--trained",
        action="store_true",
        help="the pair trained on the toy world (a test pair whose scores carry a signal there)",
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="with --trained: train again from --seed instead of using the committed weights",
    )
    p.set_defaults(func=run_tiny)


def run_tiny(args: argparse.Namespace) -> int:
    """Run ``spotstop tiny``."""
    from spotstop.export.tiny import (
        build_tiny_pair,
        check_pair_out,
        check_seed,
        default_tiny_dir,
        tree_digest,
    )

    if args.retrain and not args.trained:
        print("spotstop tiny: --retrain needs --trained.", file=sys.stderr)
        return 2
    if args.trained:
        from spotstop.export.train import (
            TrainedWeightsError,
            build_trained_pair,
            compare_with_committed,
            default_trained_dir,
            environment_drift,
        )

        out = args.out or default_trained_dir()
    else:
        out = args.out or default_tiny_dir()
    try:  # before anything is written: a bad seed or --out is bad input
        if args.seed is not None:
            check_seed(args.seed, "--seed")
        check_pair_out(out)
    except ValueError as e:
        print(f"spotstop tiny: {e}", file=sys.stderr)
        return 2
    if args.trained:
        drift = environment_drift() if args.retrain else ()
        if drift:
            print(
                "spotstop tiny: warning: retraining with "
                + ", ".join(drift)
                + ": the run will not reproduce the committed weights and may give a pair "
                "that learned less (docs/world.md, The trained pair).",
                file=sys.stderr,
            )
        try:
            trained = build_trained_pair(out, seed=args.seed, retrain=args.retrain, progress=True)
        except TrainedWeightsError as e:  # checked before anything is written
            print(f"spotstop tiny: {e}", file=sys.stderr)
            # a seed other than the committed weights' without --retrain is bad input (2);
            # committed weights missing or altered are a broken install (1)
            return 2 if isinstance(e, ValueError) else 1
        for m in trained.members:
            weights = tree_digest(m).get("model.safetensors", "?")
            print(f"{m}  (model.safetensors sha256 {weights[:16]}…)")
        for run in trained.runs:
            print(run)
        for rep in compare_with_committed(trained) if args.retrain else ():
            print(rep)
        print(
            "TEST PAIR trained on a toy world: its scores carry a signal in that world only "
            "(`spotstop world --rules`), never about real safety."
        )
        return 0
    pair = build_tiny_pair(out, seed=0 if args.seed is None else args.seed, progress=True)
    for m in pair.members:
        weights = tree_digest(m).get("model.safetensors", "?")
        print(f"{m}  (model.safetensors sha256 {weights[:16]}…)")
    print("TEST PAIR: seeded random weights — its scores and decisions mean nothing.")
    return 0


# ---- world -----------------------------------------------------------------------------------


def add_world_parser(sub: Any) -> None:
    """``spotstop world``: render the toy situational-safety world."""
    from spotstop.export.world import WorldOptions

    d = WorldOptions()
    p = sub.add_parser(
        "world",
        help="render the toy situational-safety world (scenes, requests, labels by a rule)",
        description=(
            "Render a procedural situational-safety world: rooms (situations) with their own "
            "lighting, camera and clutter; in each, contrasts of two scenes with one request "
            "that differ only in the state of the object the request names (burner on/off, "
            "floor wet/dry, cable bare/insulated, knife at the edge by the child/in the "
            "middle). Labels follow a rule table (--rules prints it; rules.txt stores it). "
            "Optional cues, each at a stated rate: signs with reassuring, alarming or neutral "
            "text, a share of which mislead; a file cue (UNSAFE scenes saved as JPEG at another "
            "size). Writes OUT/images/, OUT/world.csv (case_id,image,request,label,contrast_id,"
            "situation_id and the cue columns), OUT/rules.txt and OUT/world.json. The same "
            "seed and options give byte-identical files. A TOY WORLD of drawn shapes: a member "
            "scored on it is checked on this world's rule, not on real safety."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  spotstop world --rules\n"
            "  spotstop world --out world/ --seed 3 --offsets 0.8\n"
            "  spotstop world --out signs/ --signs 0.6 --misleading 0.5 --file-cue 0.3\n"
            "  spotstop score --member ./tiny-trained/tiny-qwen3_5 world/world.csv --out scores.csv"
        ),
    )
    p.add_argument(
        "--out",
        type=Path,
        help="folder to write (required unless --rules): new, empty, or a world folder "
        "(replaced whole once the new world is complete); refused otherwise",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the world (default 0)")
    p.add_argument("--rules", action="store_true", help="print the rule table and exit")
    p.add_argument("--rooms", type=int, default=d.rooms, help=f"rooms (situations; {d.rooms})")
    p.add_argument(
        "--contrasts-per-room",
        type=int,
        default=d.contrasts_per_room,
        help=f"contrasts (two scenes each) per room ({d.contrasts_per_room})",
    )
    p.add_argument(
        "--test-share",
        type=float,
        default=d.test_share,
        help=f"share of rooms in the held-out 'test' split ({d.test_share})",
    )
    p.add_argument(
        "--offsets",
        type=float,
        default=d.offsets,
        help="how far a room's lighting moves from neutral, 0..1 (0: all rooms alike)",
    )
    p.add_argument("--signs", type=float, default=d.signs, help="share of scenes with a sign")
    p.add_argument(
        "--misleading",
        type=float,
        default=d.misleading,
        help="share of signed scenes whose sign contradicts the label",
    )
    p.add_argument(
        "--neutral-signs",
        type=float,
        default=d.neutral_signs,
        help=f"share of the other signs that are neutral ({d.neutral_signs})",
    )
    p.add_argument(
        "--file-cue",
        type=float,
        default=d.file_cue,
        help="share of UNSAFE scenes saved as JPEG at another size",
    )
    p.add_argument(
        "--occluded",
        type=float,
        default=d.occluded,
        help="share of contrasts with signs whose object is hidden behind a crate (only the "
        "sign tells its state)",
    )
    p.add_argument(
        "--sign-styles",
        type=int,
        default=d.sign_styles,
        metavar="N",
        help="signs use the first N wordings per polarity, fonts and colours only (0: all)",
    )
    p.set_defaults(func=run_world)


def run_world(args: argparse.Namespace) -> int:
    """Run ``spotstop world``."""
    from spotstop.export.world import (
        WorldOptions,
        build_world,
        check_world_out,
        rules_text,
        text_layout,
    )

    if args.rules:
        print(rules_text())
        return 0
    if args.out is None:
        print(
            "spotstop world: --out DIR is required (or --rules to print the rule).", file=sys.stderr
        )
        return 2
    try:
        opts = WorldOptions(
            rooms=args.rooms,
            contrasts_per_room=args.contrasts_per_room,
            test_share=args.test_share,
            offsets=args.offsets,
            signs=args.signs,
            misleading=args.misleading,
            neutral_signs=args.neutral_signs,
            file_cue=args.file_cue,
            occluded=args.occluded,
            sign_styles=args.sign_styles,
        )
    except ValueError as e:
        msg = str(e)
        for name in WorldOptions.__dataclass_fields__:  # name the flag, not the field
            msg = msg.replace(f"WorldOptions.{name}", "--" + name.replace("_", "-"))
        print(f"spotstop world: {msg}", file=sys.stderr)
        return 2
    try:  # before anything is drawn: an --out the world must not replace is bad input
        check_world_out(args.out)
    except ValueError as e:
        print(f"spotstop world: {e}", file=sys.stderr)
        return 2
    try:
        world = build_world(args.out, seed=args.seed, options=opts, progress=True)
    except OSError as e:  # e.g. a folder this user may not write: the old folder is kept
        print(f"spotstop world: could not write {args.out}: {e}", file=sys.stderr)
        return 1
    print(world)
    print(
        f"wrote {world.csv_path} and {len(world.cases)} images; the rule: {world.root / 'rules.txt'}"
    )
    if opts.signs or opts.file_cue:
        print(f"cues as drawn (each a share of what its option's is of): {world.cue_rates()}")
    if world.cue_rates().signs > 0 and text_layout() != "raqm":
        print(
            "spotstop world: warning: Pillow here lays text out without Raqm (libraqm or "
            "libfribidi is missing), so the signs' letters sit up to a pixel from where a "
            "machine with Raqm draws them: these sign images differ from the same seed's there "
            "(world.json records text_layout), and the trained pair learned its signs from "
            "Raqm's. Install libfribidi (Debian: libfribidi0) for the same images.",
            file=sys.stderr,
        )
    print("A TOY WORLD: drawn shapes labelled by a rule table, not real safety.")
    return 0


# ---- export ----------------------------------------------------------------------------------


def add_export_parser(sub: Any) -> None:
    """``spotstop export``: Hugging Face members → ONNX scoring graphs → a verified bundle."""
    from spotstop.export.gptq import CALIBRATION_SCENES, CALIBRATION_SEED
    from spotstop.export.int8 import KEEP_ERROR, SYMMETRIC_SLACK
    from spotstop.export.int8_math import ROTATE_BLOCK
    from spotstop.export.precision import PRECISION_SPECS

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
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="bundle folder to write: new, empty, or a bundle (replaced once the new one is "
        "whole); refused when it holds a guard's decision log or overlaps a member's folder",
    )
    p.add_argument(
        "--precision",
        choices=list(PRECISION_SPECS),
        default="fp32",
        help="graph weights (export/precision.py): "
        + "; ".join(f"{p}: {s.summary}" for p, s in PRECISION_SPECS.items())
        + ". int8 is the CPU's fastest (onnxruntime's int8 GEMM); int8-nbits/int4 also run "
        "on onnxruntime's CUDA provider; int4-trt is TensorRT's",
    )
    p.add_argument(
        "--graph-form",
        choices=["auto", "standard", "fused"],
        default="auto",
        help="fused: onnxruntime's contrib operators where its CPU kernels are faster "
        "(LinearAttention for Gated-DeltaNet, GroupQueryAttention, fused RMSNorms; "
        "export/fused.py), onnxruntime only; standard: standard ONNX operators (what TensorRT "
        "parses). auto (default): fused for int8, int8-nbits and int4, standard for fp32 (its "
        "TensorRT script), fp16 and int4-trt. A fused fp32 bundle needs --trt off",
    )
    p.add_argument(
        "--smooth-alpha",
        default="auto",
        metavar="A",
        help="int8: SmoothQuant's migration strength in [0, 1]: each activation's outlier "
        "channels are moved into the weights that read it, from the calibration scenes (needs "
        "--quantizer gptq). auto (default): none, as off: int8's activations are quantized per "
        "token, and smoothing fitted on the calibration scenes moved unseen requests further "
        "(export/int8.py, default_smooth_alpha)",
    )
    p.add_argument(
        "--int8-keep-error",
        type=float,
        default=None,
        metavar="E",
        help="int8: a layer whose relative output error at int8 activations, measured on the "
        "calibration scenes, exceeds E stays weight-only 8-bit (default "
        f"{KEEP_ERROR}; the output layer always does)",
    )
    p.add_argument(
        "--int8-rotate-block",
        type=int,
        default=None,
        metavar="B",
        help="int8: a layer over --int8-keep-error is measured again with its input rotated "
        "in blocks of 128 channels (of B if smaller), then of 256 and so on up to B (a "
        "randomized Hadamard matrix, computed in the graph before the activation is quantized; "
        "a smaller block costs less but, at the real pair's size, 64 cost score accuracy) and "
        "computes in int8 in the first block within the bound "
        f"(default {ROTATE_BLOCK}; 0: no rotation, such layers stay weight-only)",
    )
    p.add_argument(
        "--int8-symmetric",
        action="store_true",
        help="int8: let a layer whose calibration rows are two-sided take the symmetric form "
        "(step max|a|/127, no midpoint: fewer passes over its output) where its measured error "
        f"is at most {SYMMETRIC_SLACK * 100:g} %% above the midpoint form's. Off by default: at "
        "the real pair's size it moved verify-bundle's 95th percentile |ds| over 48 scores "
        "+42 %% on one member and -15 %% on the other (docs/limits.md); check the bundle with "
        "verify-bundle --scenes 24 before you ship one",
    )
    p.add_argument(
        "--int8-reads",
        choices=("exact", "int8"),
        default=None,
        help="int8: how the decoder multiplies the rows the score reads (the last prompt "
        "position and the answer's tokens). 'exact' (the default): their per-token codes and "
        "the residual those leave, quantized again, so those few rows compute at about 16-bit "
        "activations; at the real Qwen3.5-2B size (seeded random weights) rounding them like "
        "the other rows moved the score 0.32 where exact reads moved it 0.09 (docs/limits.md). "
        "'int8': like every other row (for comparison)",
    )
    p.add_argument(
        "--int8-weights",
        choices=("auto", "s8", "u8"),
        default="auto",
        help="int8: how the integer GEMM's weight codes are stored (the same codes, the same "
        "scores). 's8': int8, onnxruntime's u8·s8 kernel, native with AVX512-VNNI, AVX-VNNI, "
        "AMX and ARM's dot products; on an x86 CPU with AVX2 and no VNNI (e.g. AMD Zen 2/3) "
        "that kernel adds two products into a saturating int16 and gets them wrong. 'u8': the "
        "codes +128 as uint8, its u8·u8 kernel, exact on every CPU (as fast there; 2.2x slower "
        "than s8 on a CPU with AVX512-VNNI, bench/RESULTS.md). 'auto' "
        "(the default): s8 where this host computes it exactly, else u8. A host that would not "
        "compute a bundle's form exactly refuses to load it",
    )
    p.add_argument(
        "--visual-tokens",
        default=None,
        metavar="BUDGETS",
        help="each member's visual-token budget, its own bundle setting: a count for every "
        "member (256) or member=count pairs keyed by member name or model type "
        "(qwen=256,lfm=64); a square grid of that many tokens (default: the paper's "
        "low-resolution rule, qwen3_5 256 = 512x512, lfm2_vl 64 = 256x256 without tiling; a "
        "member folder's spotstop_member.yaml image_size hint before that). Recorded in the "
        "manifest and the bundle id: a policy fitted at another budget is refused",
    )
    p.add_argument(
        "--image-size",
        default=None,
        help="HxW grid for every member, e.g. 512x384 (non-square grids; prefer --visual-tokens)",
    )
    p.add_argument(
        "--buckets",
        default=None,
        help="comma-separated right-padded sequence lengths (default 384,512,1024)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="scoring YAML (prompt, answers, visual_tokens, image size)",
    )
    p.add_argument(
        "--quantizer",
        choices=["gptq", "rtn"],
        default="gptq",
        help="int8/int4: how each weight's codes are chosen. gptq (default): GPTQ, each "
        "weight's rounding error moved onto the weights not yet rounded so that the layer's "
        "output on calibration inputs changes least (the member's torch model scores "
        "--calibration-scenes generated scenes; minutes of CPU per member at the real size); "
        "rtn: round to nearest, as onnxruntime's quantizer. Same operator and bytes",
    )
    p.add_argument(
        "--calibration-scenes",
        type=int,
        default=CALIBRATION_SCENES,
        metavar="N",
        help="scenes GPTQ (and int8's keep rule) calibrates on, each scored with its image "
        f"and request-only (default {CALIBRATION_SCENES}): generated shapes (seed "
        f"{CALIBRATION_SEED}, not the scenes verify-bundle checks), or N rows of "
        "--calibration-frames",
    )
    p.add_argument(
        "--calibration-frames",
        type=Path,
        default=None,
        metavar="TABLE",
        help="int8/int4 with --quantizer gptq: calibrate on the deployment's own frames instead "
        "of generated shapes: a scene table (a CSV with image,request columns, as "
        "verify-bundle --scene-table and spotstop world write) of which "
        "--calibration-scenes rows are drawn (seeded); the manifest records the table's "
        "sha256 and the rows. Check the bundle on other frames than these",
    )
    p.add_argument(
        "--int4-int8",
        default="auto",
        metavar="SELECTORS",
        help="int4: the weights kept at 8 bits. auto (default): chosen by measurement on 32 "
        "check scenes (generated: the calibration scenes first; --calibration-frames: 32 rows "
        "drawn by the same seed): the vision tower at 8 bits when its 4 "
        "bits move their scores over half the score tolerance, and over the other half for the "
        "decoder, the decoder group below (output_layer,mixed_layers or linear_attn) whose 8 "
        "bits move them least; the manifest records the moves and the choice "
        "(export/mixed.py). Else comma-separated selectors ('none': every weight at "
        "int4): output_layer (the output layer, and the token table tied to it), "
        "mixed_layers (attention's value and the feed-forward down projections in the first "
        "and last eighth of the layers and every third between: llama.cpp's Q4_K_M mix), "
        "linear_attn (every Qwen3.5 Gated-DeltaNet layer's projections and feed-forward), "
        "vision (the vision tower and projector). The selectors of onnxruntime-genai's "
        "matmul_mixed_precision; 'output_layer,mixed_layers' is llama.cpp's Q4_K_M mix. ",
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
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON (per member: seconds, peak RSS, weight bytes, whether it "
        "was exported streamed, max |Δ| against torch)",
    )
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Run ``spotstop export``: 0 written, 1 beyond tolerance, 2 bad input."""
    from spotstop.export.mixed import parse_selectors
    from spotstop.export.onnx import DEFAULT_BUCKETS
    from spotstop.export.onnx_bundle import write_onnx_bundle
    from spotstop.guard import ConfigError, ScoringConfig, load_scoring_config
    from spotstop.guard._config import parse_image_size
    from spotstop.guard._member import parse_visual_tokens

    cfg = load_scoring_config(args.config) if args.config else ScoringConfig()
    try:
        size = parse_image_size(args.image_size, "--image-size") if args.image_size else None
        budgets = parse_visual_tokens(args.visual_tokens) if args.visual_tokens else None
    except ConfigError as e:
        print(f"spotstop export: {e}", file=sys.stderr)
        return 2
    if args.calibration_frames is not None:  # its error before any member is loaded
        from spotstop.guard import GuardError
        from spotstop.guard._scene_table import read_scene_table

        try:
            read_scene_table(args.calibration_frames)
        except GuardError as e:
            print(f"spotstop export: --calibration-frames: {e}", file=sys.stderr)
            return 2
    smooth: float | str | None = args.smooth_alpha
    if smooth == "off":
        smooth = None
    elif smooth != "auto":
        try:
            smooth = float(args.smooth_alpha)
        except ValueError:
            print(
                f"spotstop export: --smooth-alpha must be a number in [0, 1], auto or off; "
                f"got {args.smooth_alpha!r}.",
                file=sys.stderr,
            )
            return 2
    try:
        int4_int8 = None if args.int4_int8 == "auto" else parse_selectors(args.int4_int8)
    except ValueError as e:
        print(f"spotstop export: --int4-int8: {e}", file=sys.stderr)
        return 2
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
    # with --json, stdout is the JSON alone: what the exporters print goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    import onnx  # noqa: F401  (the export extra is said missing before any member is read)
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from spotstop.export.onnx_bundle import check_bundle_out
    from spotstop.guard import GuardError
    from spotstop.guard._hf import resolve_member

    try:  # before any member is exported: an --out the export must not replace is bad input
        check_bundle_out(args.out, [resolve_member(m).path for m in args.member])
    except (ValueError, GuardError) as e:
        print(f"spotstop export: {e}", file=sys.stderr)
        return 2
    try:
        with quiet:
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
                visual_tokens=budgets,
                quantizer=args.quantizer,
                calibration_scenes=args.calibration_scenes,
                calibration_frames=args.calibration_frames,
                int4_int8=int4_int8,
                smooth_alpha=smooth,
                keep_error=args.int8_keep_error,
                graph_form=args.graph_form,
                rotate_block=args.int8_rotate_block,
                symmetric=True if args.int8_symmetric else None,
                exact_reads=False if args.int8_reads == "int8" else None,
                int8_weights=None if args.int8_weights == "auto" else args.int8_weights,
            )
    except ConfigError as e:  # a budget that names no member or has no square grid
        print(f"spotstop export: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # validation failures list every output beyond tolerance
        print(f"spotstop export: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_export_json(b), indent=2))
        return 0
    for m in b.members:
        rss = f"peak RSS {m.peak_rss_bytes / 2**30:.1f} GiB" if m.peak_rss_bytes else "peak RSS n/a"
        print(
            f"{m.name:<24} exported in {m.seconds:.0f} s, {rss}"
            + (" (streamed: weights over 2 GiB)" if m.streamed else "")
        )
        print(
            f"{m.name:<24} {m.model_type:<8} {m.precision:<8} {m.weight_bytes / 2**20:9.2f} MiB  "
            f"{m.n_image_tokens} visual tokens ({m.image_size[0]}x{m.image_size[1]})  "
            f"buckets {list(m.buckets)}"
        )
    print(f"{'pair':<24} {'':<8} {b.precision:<8} {b.weight_bytes / 2**20:9.2f} MiB")
    print(f"bundle {b.path}  id {b.bundle_id}  prompt_hash {b.prompt_hash}  tensorrt: {b.trt}")
    if any(
        (m.quantizer or {}).get("dynamic_int8", {}).get("weight_form") == "u8" for m in b.members
    ):
        print(
            "int8 weights in the u8 form (--int8-weights): exact on every CPU, but on a CPU with "
            "AVX512-VNNI its GEMMs take about 2.2x as long as the s8 form's (bench/RESULTS.md, "
            "int8-gemm-epyc). For a VNNI, AMX or ARM target, export on such a host (s8)."
        )
    print(
        f"next: `spotstop verify-bundle {b.path}`, then fit its first policy on unlabelled "
        f"frames: `spotstop policy init {b.path} --pool FRAMES --request TEXT`."
    )
    return 0


def _export_json(b: Any) -> dict[str, Any]:
    """``spotstop export --json``: the bundle and, per member, what its export cost."""
    return {
        "bundle": str(b.path),
        "bundle_id": b.bundle_id,
        "prompt_hash": b.prompt_hash,
        "precision": b.precision,
        "tensorrt": b.trt,
        "weight_bytes": int(b.weight_bytes),
        "members": [
            {
                "name": m.name,
                "model_type": m.model_type,
                "precision": m.precision,
                "seconds": round(float(m.seconds), 3),
                "peak_rss_bytes": m.peak_rss_bytes,
                "streamed": bool(m.streamed),
                "weight_bytes": int(m.weight_bytes),
                "visual_tokens": int(m.n_image_tokens),
                "image_size": list(m.image_size),
                "buckets": list(m.buckets),
                "max_abs_diff": _finite_or_null(float(m.max_abs_diff)),
                "quantizer": m.quantizer,
            }
            for m in b.members
        ],
    }


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
            "member and the pair's Avg-2 decision agreement. Exit 0 PASS; 1 when a member "
            "fails either half (reference: beyond its per-precision tolerance, fp32 |Δs| ≤ "
            "1e-3); 2 when the bundle is refused before anything is scored (altered files, a "
            "damaged manifest) or an option is wrong."
        ),
    )
    p.add_argument("bundle", type=Path, help="bundle folder")
    p.add_argument("--scenes", type=int, default=12, help="generated scenes (default 12)")
    p.add_argument("--seed", type=int, default=0, help="scene seed")
    p.add_argument(
        "--scene-table",
        type=Path,
        default=None,
        metavar="CSV",
        help="score these scenes instead of generated ones: a CSV image,request[,situation_id] "
        "(e.g. `spotstop world`'s world.csv); every row is scored",
    )
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
        if not sep or not name or not path:
            print(
                f"spotstop verify-bundle: --source must be NAME=FOLDER; got {item!r}.",
                file=sys.stderr,
            )
            return 2
        sources[name] = path
    if args.scenes < 1:
        print(
            f"spotstop verify-bundle: --scenes must be at least 1; got {args.scenes}.",
            file=sys.stderr,
        )
        return 2
    scenes = None
    if args.scene_table is not None:
        from spotstop.guard import GuardError
        from spotstop.guard._scene_table import read_scene_table

        try:
            table = read_scene_table(args.scene_table)
        except GuardError as e:
            print(f"spotstop verify-bundle: --scene-table: {e}", file=sys.stderr)
            return 2
        scenes = table.scenes(range(len(table)))
    from spotstop.guard import GuardError

    try:
        v = verify_bundle(
            args.bundle,
            n_scenes=args.scenes,
            seed=args.seed,
            sources=sources,
            reference=False if args.runtime_only else None,
            scenes=scenes,
        )
    except (ValueError, GuardError) as e:  # a wrong --source, an altered bundle: not a FAIL
        print(f"spotstop verify-bundle: {e}", file=sys.stderr)
        return 2
    if args.json:
        doc = {
            "bundle_id": v.bundle_id,
            "ok": v.ok,
            "runtime": [{**asdict(r), "ok": r.ok} for r in v.runtime],
            "reference_skipped": v.skipped,
            "pair_decision_agreement": v.pair_decision_agreement if v.members else None,
            "pair_decision_agreement_by_pass": dict(v.pair_agreement_by_pass),
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


# ---- cost ------------------------------------------------------------------------------------

_COST_DESCRIPTION = """\
Cost of one scene, per member and for the pair, from the members' config.json and the
bundle's real token counts (its rendered prompt with --request, the member's image grid, the
score plan of its answers): FLOPs of the vision tower and of the decoder prefill, weight bytes
per precision, and the roofline lower bound on named devices. Runs on the base install (no
torch): the formulas are per architecture in spotstop.export.cost.

The model:
  * prefill only: one forward pass per continuation row over prompt + row (the scene pass;
    no gray or request-only pass, no generation); FLOPs = 2 x multiply-adds.
  * counted: every matrix product of the scoring graphs: linear layers, convolutions (patch
    embedding; depthwise causal convolutions over L + k - 1 outputs), attention scores and
    values over the full L x L matrix (as the exported graph computes them), Gated-DeltaNet
    as the chunked algorithm of transformers' torch_chunk_gated_delta_rule, the reference
    an export is validated against (chunk 64, sequence padded to whole chunks: k_beta k^T,
    q k^T, the UT transform applied as two C x C products, per chunk the state reads, the
    intra-chunk product and the state update; an exported kernel that computes the same
    result another way may do other work), SigLIP2's position-table resize;
    output rows actually read: the bundle scores with teacher forcing, so only the answers'
    first-token rows at the last prompt position and one full-vocabulary row per
    continuation read (the ONNX graph reads at least one) — not the L x vocabulary logits.
  * not counted: norms, activations, rotary embeddings, softmax, elementwise gates,
    embedding gathers, the UT inverse's forward substitution (elementwise), SigLIP2's
    attention-pooling head (never read). tests/export/test_cost.py checks the count against
    torch's FLOP counter on the tiny pair (within 1 %).
  * an ONNX member runs its decoder at a right-padded length bucket: the FLOPs at that
    length are printed too ("as run").
  * weight bytes as spotstop export writes them: fp32 4 B, fp16 2 B; int8/int4 weight-only
    blocks of 128 with float32 scales on the matrix multiplies, the token table float16.
  * roofline: max(FLOPs / dense peak, weight bytes / bandwidth), weights read once,
    activations neglected; fp16 at the fp16 peak, int8 at the int8 peak (a W8A8 engine),
    int4 weight-only at the fp16 peak. Device figures (dense, GPU share of the Jetson
    modules) and their sources: spotstop.export.cost_data.DEVICES.
  * beside the pair's total: the paper's 7.4 TFLOPs (lowest resolution: Qwen3.5-2B at 256
    visual tokens, LFM2.5-VL-3B without tiling at 32-64) and 16.8 TFLOPs (default) per case;
    --real costs the real pair (recorded configs) at those settings.
  * measured / bound: where --results (bench/RESULTS.md) has a median latency for the
    same bundle id (or, with --real, a bench/gpu.py run at the real dimensions) on a named
    device, the ratio of measured to the fp16 bound.
"""


def add_cost_parser(sub: Any) -> None:
    """``spotstop cost``: FLOPs, weight bytes and roofline bounds of one scene."""
    from spotstop.export.cost_data import DEVICES

    p = sub.add_parser(
        "cost",
        help="FLOPs, weight bytes and roofline lower bound of one scene, per member and device",
        description=_COST_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("bundle", type=Path, nargs="?", help="bundle folder (or --real)")
    p.add_argument(
        "--real",
        action="store_true",
        help="cost the real pair (Qwen3.5-2B + LFM2.5-VL-3B, recorded configs) at the "
        "paper's settings instead of a bundle",
    )
    p.add_argument(
        "--setting",
        choices=["low", "default", "both"],
        default="both",
        help="with --real: low (Qwen 256 visual tokens, LFM 64 without tiling), default "
        "(Qwen 1024, LFM tiled 4x256 + 256 thumbnail) or both (default)",
    )
    p.add_argument(
        "--text-tokens",
        type=int,
        default=None,
        help="with --real: prompt tokens besides the visual ones (default 72)",
    )
    p.add_argument(
        "--request",
        default=None,
        help="the request whose tokens count in the bundle's prompt (default: a short one)",
    )
    p.add_argument(
        "--device",
        action="append",
        choices=sorted(DEVICES),
        default=None,
        help="device for the roofline; repeat (default: all)",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="MD",
        help="measured latencies to set beside the bound: a results file in the format "
        "bench/gpu.py writes (e.g. a checkout's bench/RESULTS.md); none by default",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_cost)


def run_cost(args: argparse.Namespace) -> int:
    """Run ``spotstop cost``: 0 printed, 2 bad input."""
    from spotstop.export import cost

    if (args.bundle is None) == (not args.real):
        print("spotstop cost: give a BUNDLE folder or --real (not both).", file=sys.stderr)
        return 2
    devices = args.device or list(cost.DEVICES)
    if args.results is not None and not args.results.is_file():
        print(
            f"spotstop cost: --results {str(args.results)!r} is not a file; pass a results file "
            "written by bench/gpu.py (e.g. bench/RESULTS.md of a checkout), or leave it out.",
            file=sys.stderr,
        )
        return 2
    docs = []
    if args.real:
        settings = ["low", "default"] if args.setting == "both" else [args.setting]
        measured = (
            []
            if args.results is None
            else cost.measured_latencies(
                args.results, lambda sec: "--tiny" not in sec.splitlines()[0]
            )
        )
        text = cost.DEFAULT_TEXT_TOKENS if args.text_tokens is None else args.text_tokens
        if text < 1:
            print("spotstop cost: --text-tokens must be positive.", file=sys.stderr)
            return 2
        for s in settings:
            pair = cost.real_pair_cost(s, text_tokens=text)
            docs.append(
                cost.report(
                    pair, devices=devices, measured=measured, bound_for=cost.bench_member_cost
                )
            )
    else:
        pair = cost.bundle_cost(args.bundle, request=args.request or cost.DEFAULT_REQUEST)
        measured = (
            []
            if args.results is None
            else cost.measured_latencies(args.results, lambda sec: pair.label in sec)
        )
        docs.append(cost.report(pair, devices=devices, measured=measured))
    if args.json:
        print(json.dumps(docs if len(docs) > 1 else docs[0], indent=2, allow_nan=False))
    else:
        print("\n\n".join(cost.format_report(d) for d in docs))
    return 0
