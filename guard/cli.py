"""The ``spotstop`` command line.

Each subcommand imports what it needs when it runs, so ``spotstop --help`` is instant and
the robot's runtime commands never import torch.

Exit status: 0 success (for ``check``: SAFE), 1 UNSAFE or a failure of the work itself,
2 usage or input errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

_DESCRIPTION = """\
spotstop — a pre-action safety guard for robots.

Before the robot acts, spotstop scores the camera scene and the request with two small
vision-language models (teacher-forced score s = log p(UNSAFE) − log p(SAFE)), fuses the two
scores, applies a threshold policy, answers SAFE or UNSAFE and logs the decision.
"""

_EPILOG = """\
examples:
  spotstop demo                                   the guard end to end on the tiny TEST pair
  spotstop check cam.jpg --request "open the door" --bundle BUNDLE && open_door
  spotstop card --demo --out card/               the per-deployment card on a simulated log
  spotstop tiny --out ./tiny                      build the tiny TEST pair (decisions mean nothing)
  spotstop score --member ./tiny/tiny-qwen3_5 scene.jpg --request "pick up the knife"

Run `spotstop COMMAND --help` for each command's options.
"""


def _add_tiny(sub: Any) -> None:
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
    p.set_defaults(func=_cmd_tiny)


def _cmd_tiny(args: argparse.Namespace) -> int:
    from spotstop.export.tiny import build_tiny_pair, tree_digest

    pair = build_tiny_pair(args.out, seed=args.seed, progress=True)
    for m in pair.members:
        weights = tree_digest(m).get("model.safetensors", "?")
        print(f"{m}  (model.safetensors sha256 {weights[:16]}…)")
    print("TEST PAIR: seeded random weights — its scores and decisions mean nothing.")
    return 0


def _add_score(sub: Any) -> None:
    p = sub.add_parser(
        "score",
        help="print one member's teacher-forced score of a scene",
        description=(
            "Score IMAGE and --request with one member: s = log p(UNSAFE | x, q) − log p(SAFE | x, q), "
            "the answers appended right after the member's own generation prompt (reasoning "
            "off) and summed over their tokens. s > 0 is the member's direct answer UNSAFE. "
            "Prints the score and the prompt hash (which identifies prompt, answers and chat "
            "template). Uses the torch reference backend."
        ),
    )
    p.add_argument("image", type=Path, help="the camera image (JPEG, PNG or WebP)")
    p.add_argument(
        "--member", required=True, help="member folder (Hugging Face snapshot) or hub id"
    )
    p.add_argument("--request", required=True, help="what the robot was asked to do")
    p.add_argument(
        "--config", type=Path, default=None, help="scoring YAML (prompt, answers, image size)"
    )
    p.add_argument(
        "--image-size",
        default=None,
        help="HxW grid for the image, e.g. 512x512 (overrides the config)",
    )
    p.add_argument(
        "--variant",
        action="append",
        choices=["scene", "gray", "text"],
        help="inputs to score: scene (default), gray (content-free image), text (no image); repeatable",
    )
    p.add_argument("--revision", default=None, help="hub revision when --member is a hub id")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cmd_score)


def _cmd_score(args: argparse.Namespace) -> int:
    from spotstop.guard._config import ScoringConfig, load_scoring_config, parse_image_size
    from spotstop.guard._image import decode_image
    from spotstop.guard._member import load_member
    from spotstop.guard._types import Scene

    cfg = load_scoring_config(args.config) if args.config else ScoringConfig()
    size = parse_image_size(args.image_size, "--image-size") if args.image_size else None
    image = decode_image(args.image)  # bad images fail before any model is loaded
    member = load_member(
        args.member,
        config=cfg,
        image_size=size,
        revision=args.revision,
        device=args.device,
        dtype=args.dtype,
    )
    scene = Scene(image=image, request=args.request)
    variants = args.variant or ["scene"]
    results = [member.score([scene], v)[0] for v in variants]
    if args.json:
        print(
            json.dumps(
                {
                    "member": member.name,
                    "model_type": member.info.model_type,
                    "test_pair": member.info.test_pair,
                    "prompt_hash": member.prompt_hash,
                    "image_sha256": image.sha256,
                    "scores": {r.variant: r.score for r in results},
                },
                indent=2,
            )
        )
    else:
        if member.info.test_pair:
            print("TEST PAIR member: its scores mean nothing.", file=sys.stderr)
        for r in results:
            verdict = "UNSAFE" if r.score > 0 else "SAFE"
            print(f"{member.name}  {r.variant:5s}  score {r.score:+.6f}  (direct answer {verdict})")
        print(f"prompt_hash {member.prompt_hash}")
    return 0


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the guard end to end on the tiny TEST pair",
        description=(
            "Build the tiny test pair if absent, write a bundle, fit the frozen reference "
            "statistics and cut on an unlabelled pool of generated scenes, then check a dozen "
            "generated scenes (several from one situation, to show situation recentering) and "
            "print the decisions and where the log is. The pair has random weights: the "
            "decisions show the machinery, not safety."
        ),
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="working folder (default: $SPOTSTOP_HOME/demo, ~/.cache/spotstop/demo)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from spotstop.guard._config import spotstop_home
    from spotstop.guard._demo import run_demo

    root = args.dir or spotstop_home() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    run_demo(root, seed=args.seed)
    return 0


def _add_check(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="judge one scene; exit 0 SAFE, 1 UNSAFE (scored or fail-closed), 2 usage error",
        description=(
            "Judge IMAGE with --request using a bundle (members, policy) and log the decision. "
            "Exit status: 0 SAFE, 1 UNSAFE (scored or fail-closed), 2 usage error — so a shell "
            'script can gate an action: `spotstop check cam.jpg --request "..." && do_it`.'
        ),
    )
    p.add_argument("image", type=Path, help="the camera image (JPEG, PNG or WebP)")
    p.add_argument("--request", required=True, help="what the robot was asked to do")
    p.add_argument("--situation", default=None, help="situation id (place/task) for recentering")
    p.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="bundle folder (default: the demo bundle, $SPOTSTOP_HOME/demo/bundle)",
    )
    p.add_argument(
        "--log", type=Path, default=None, help="decision log (default: <bundle>/decisions.sqlite)"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds; past it the answer is UNSAFE (fail-closed)",
    )
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    _add_backend_args(p)
    p.set_defaults(func=_cmd_check)


def _add_backend_args(p: Any) -> None:
    p.add_argument(
        "--backend",
        choices=["onnx", "tensorrt", "torch"],
        default=None,
        help=(
            "run the members on this backend instead of the manifest's (tensorrt: the engines "
            "built on this device by BUNDLE/trt/build.sh)"
        ),
    )
    p.add_argument(
        "--device",
        default=None,
        help=(
            "members' device: cpu, cuda, cuda:N, or tensorrt (onnx backend: onnxruntime's "
            "TensorRT provider); default cpu, cuda with --backend tensorrt"
        ),
    )


def _device(args: argparse.Namespace) -> str:
    if args.device is not None:
        return str(args.device)
    return "cuda" if args.backend == "tensorrt" else "cpu"


def _cmd_check(args: argparse.Namespace) -> int:

    from spotstop.guard._config import spotstop_home
    from spotstop.guard._guard import Guard
    from spotstop.guard._types import Scene

    bundle = args.bundle or spotstop_home() / "demo" / "bundle"
    if not args.image.is_file():
        print(
            f"spotstop check: image {args.image} does not exist or is not a file.", file=sys.stderr
        )
        return 2
    if not (bundle / "manifest.yaml").is_file():
        print(
            f"spotstop check: {bundle} is not a bundle (run `spotstop demo` to make the demo bundle, or pass --bundle).",
            file=sys.stderr,
        )
        return 2
    with Guard(
        bundle,
        log=args.log,
        deadline_s=args.deadline,
        device=_device(args),
        backend=args.backend,
    ) as guard:
        d = guard.check(Scene(args.image.read_bytes(), args.request, args.situation))
    if args.json:
        print(json.dumps(d.to_dict(), indent=2))
    else:
        if d.test_pair:
            print("TEST PAIR bundle: this decision means nothing.", file=sys.stderr)
        print(f"{d.label}  S={d.fused_score:+.4f}  threshold={d.threshold:+.4f}  policy={d.policy}")
        if d.fail_closed:
            print(f"fail-closed: {d.fail_reason}")
        print(f"decision {d.decision_id}  bundle {d.bundle_id}")
    return 0 if d.label == "SAFE" else 1


def _add_card(sub: Any) -> None:
    p = sub.add_parser(
        "card",
        help="write the per-deployment card (Spot-Stop with intervals, checks, plots)",
        description="Run `spotstop card --help` for the card's options.",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_card)


def _cmd_card(args: argparse.Namespace) -> int:
    from spotstop.diagnostics._cli import card_main

    return card_main(list(args.rest))


def _add_serve(sub: Any) -> None:
    # Defaults live in spotstop.guard.serve.ServeSettings (None here = its default); this parser
    # imports nothing from spotstop.guard.serve, so `spotstop --help` needs no fastapi.
    p = sub.add_parser(
        "serve",
        help="run the guard as a local HTTP sidecar (FastAPI; /v1/check, /metrics, /docs)",
        description=(
            "Serve the guard over HTTP for a planner: POST /v1/check (multipart or JSON), "
            "/v1/check/batch, /v1/situations/{id}, /v1/labels, /v1/policy/reload (also "
            "SIGHUP), /healthz, /readyz, /metrics, /docs. Binds 127.0.0.1 by default; any "
            "other address needs a bearer token ($SPOTSTOP_TOKEN or --token-file) or the "
            "server refuses to start. Needs the serve extra: pip install 'spotstop[serve]'."
        ),
    )
    p.add_argument("--bundle", type=Path, required=True, help="bundle folder")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8750, help="port (default 8750)")
    p.add_argument("--token-file", type=Path, default=None, help="file holding the bearer token")
    p.add_argument(
        "--token-env",
        default="SPOTSTOP_TOKEN",
        help="environment variable holding the token (default SPOTSTOP_TOKEN)",
    )
    p.add_argument(
        "--log", type=Path, default=None, help="decision log (default: <bundle>/decisions.sqlite)"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds per check from arrival, queue wait + scoring (default 10; 0 = none)",
    )
    limits = [
        ("--queue-size", "scenes admitted to the model queue at once (default 32)"),
        ("--max-batch", "most scenes in one /v1/check/batch call (default 16)"),
        ("--max-body-bytes", "largest request body (default 16 MiB)"),
        ("--max-image-bytes", "largest encoded image (default 12 MiB)"),
        ("--max-pixels", "largest width*height (default 40000000)"),
        ("--max-request-chars", "longest request text (default 4000)"),
    ]
    for flag, text in limits:
        p.add_argument(flag, type=int, default=None, help=text)
    p.add_argument(
        "--variant",
        action="append",
        choices=["scene", "gray", "text"],
        help="passes per scene (default scene; gray/text add diagnostic scores); repeatable",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="folder for the live state of a stateful policy (default: state/ next to the log)",
    )
    _add_backend_args(p)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for the models (default: all cores but one, at least 1)",
    )
    p.add_argument("--no-warmup", action="store_true", help="skip the startup warm-up")
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="server log level (default info)",
    )
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    import os

    try:
        from spotstop.guard.serve import ServeSettings, load_guard, resolve_token, serve
    except ImportError as e:
        print(
            f"spotstop serve: {e}. Install the server: pip install 'spotstop[serve]'.",
            file=sys.stderr,
        )
        return 2
    if not (args.bundle / "manifest.yaml").is_file():
        print(f"spotstop serve: {args.bundle} is not a bundle (no manifest.yaml).", file=sys.stderr)
        return 2
    given = {
        k: getattr(args, k)
        for k in (
            "queue_size",
            "max_batch",
            "max_body_bytes",
            "max_image_bytes",
            "max_pixels",
            "max_request_chars",
        )
        if getattr(args, k) is not None
    }
    if args.deadline is not None:
        given["deadline_s"] = args.deadline if args.deadline > 0 else None
    settings = ServeSettings(  # validated here: bad limits or an insecure bind stop us now
        bundle=args.bundle,
        host=args.host,
        port=args.port,
        token=resolve_token(args.token_file, args.token_env),
        log=args.log,
        variants=tuple(dict.fromkeys(["scene", *(args.variant or [])])),
        state_dir=args.state_dir,
        device=_device(args),
        backend=args.backend,
        threads=args.threads if args.threads is not None else max(1, (os.cpu_count() or 2) - 1),
        warmup=not args.no_warmup,
        **given,
    )
    guard = load_guard(settings)  # before binding: a bad bundle is reported plainly
    return serve(settings, guard=guard, log_level=args.log_level)  # closes the guard


def _add_recalibrate(sub: Any) -> None:
    from spotstop.calibrate._cli import add_recalibrate_parser

    add_recalibrate_parser(sub)


def _add_policy(sub: Any) -> None:
    from spotstop.calibrate._cli import add_policy_parser

    add_policy_parser(sub)


def _add_export(sub: Any) -> None:
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
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
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


def _add_verify_bundle(sub: Any) -> None:
    p = sub.add_parser(
        "verify-bundle",
        help="compare an exported bundle's scores with the torch reference (exit 1 beyond tolerance)",
        description=(
            "Score the same generated scenes (scene and request-only passes) with each member's "
            "torch reference and with the bundle; print max |Δs|, Spearman and decision "
            "agreement per member and the pair's Avg-2 decision agreement. Exit 1 when a member "
            "is beyond its per-precision tolerance (fp32: |Δs| ≤ 1e-3)."
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
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_verify_bundle)


def _cmd_verify_bundle(args: argparse.Namespace) -> int:
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
    v = verify_bundle(args.bundle, n_scenes=args.scenes, seed=args.seed, sources=sources)
    if args.json:
        print(
            json.dumps(
                {
                    "bundle_id": v.bundle_id,
                    "ok": v.ok,
                    "pair_decision_agreement": v.pair_decision_agreement,
                    "members": [{**asdict(m), "ok": m.ok} for m in v.members],
                },
                indent=2,
            )
        )
    else:
        print(v)
    return 0 if v.ok else 1


_COMMANDS: list[Callable[[Any], None]] = [
    _add_demo,
    _add_check,
    _add_card,
    _add_tiny,
    _add_score,
    _add_serve,
    _add_recalibrate,
    _add_policy,
    _add_export,
    _add_verify_bundle,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotstop",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def _quiet_third_party() -> None:
    """Per-file weight-loading bars of transformers drown the CLI's own output."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "transformers" in sys.modules:  # only when already imported: never import it for this
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    from spotstop.guard._errors import GuardError

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["card"]:  # the card command owns its whole argument list (and --help)
        from spotstop.diagnostics._cli import card_main

        return card_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_third_party()
    if args.version:
        from importlib.metadata import version

        print(f"spotstop {version('spotstop')}")
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except GuardError as e:
        kind = type(e).__name__
        print(f"spotstop {args.command}: {kind}: {e}", file=sys.stderr)
        # Bad input / configuration is a usage error (2); anything else is a failure (1).
        return 2 if isinstance(e, ValueError | FileNotFoundError) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
