"""The runtime room's subcommands: ``check``, ``serve`` and ``score``.

Each has ``add_<cmd>_parser(subparsers)`` (adds its parser and sets ``func``) and
``run_<cmd>(args) -> int``. The composition root (``spotstop.cli``) registers them; this
module imports only the standard library, and each handler imports what it needs when it
runs, so building a parser loads no model library. ``check`` and ``serve`` run on the base
install; ``score`` uses the torch reference backend (the ``export`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from spotstop.guard._errors import GuardError
from spotstop.guard._hf import describe_test_pair

__all__ = [
    "add_backend_args",
    "add_check_parser",
    "add_ray_args",
    "add_score_parser",
    "add_serve_parser",
    "backend_device",
    "ray_engine",
    "ray_threads",
    "run_check",
    "run_score",
    "run_serve",
]


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--device``: where a bundle's members run."""
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


def backend_device(args: argparse.Namespace) -> str:
    """The device of :func:`add_backend_args`' flags: given, else cuda for TensorRT, else cpu."""
    if args.device is not None:
        return str(args.device)
    return "cuda" if args.backend == "tensorrt" else "cpu"


def _bytes(text: str) -> int:
    """argparse type: a byte count such as 536870912, 512M or 1GiB."""
    from spotstop.guard._log_options import parse_bytes

    try:
        return parse_bytes(text, "the value")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _deadline_arg(value: float | None) -> float | None:
    """``--deadline``: 0 (or unset) is no deadline; else seconds in (0, 3600], the guard's one
    rule (:func:`~spotstop.guard._call.check_deadline`); raises :class:`GuardError`."""
    from spotstop.guard._call import check_deadline

    if value is None or value == 0:
        return None
    try:
        return check_deadline(value, "--deadline")
    except GuardError:
        raise GuardError(
            f"--deadline must be a number of seconds in (0, 3600], or 0 for none; got {value!r}."
        ) from None


def _add_log_and_deadline(p: argparse.ArgumentParser, deadline_help: str) -> None:
    """``--log`` (default: next to the bundle), its journal and floor, and ``--deadline``."""
    p.add_argument(
        "--log", type=Path, default=None, help="decision log (default: <bundle>/decisions.sqlite)"
    )
    p.add_argument(
        "--journal",
        type=Path,
        default=None,
        help="file where decisions wait while the log cannot be written (a full disk, a "
        "read-only file system); the log imports it as soon as it can, and on the next start. "
        "Put it on another file system than the log (default: "
        "$XDG_STATE_HOME/spotstop/journal/, i.e. ~/.local/state/spotstop/journal/)",
    )
    p.add_argument(
        "--log-min-free-bytes",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="free space the log's file system must keep, e.g. 64M; below it the log counts "
        "as full and checks fail closed, before SQLite fills the disk (default 32M)",
    )
    p.add_argument(
        "--log-sync",
        choices=["full", "normal"],
        default=None,
        help="full (default): a decision is answered only once its row is on disk, so it "
        "survives a power cut; normal: it survives a crash of the process, not a power cut "
        "(one fsync less per check)",
    )
    p.add_argument(
        "--robot-id",
        default=None,
        help="the robot this log belongs to (kept in the log; a fleet card tells robots apart "
        "by it); a log of another robot is refused",
    )
    p.add_argument("--deadline", type=float, default=None, help=deadline_help)


def _log_options(args: argparse.Namespace) -> Any:
    """The ``LogOptions`` of ``check``'s flags."""
    from spotstop.guard._log_options import LogOptions

    kw: dict[str, Any] = {"journal": args.journal, "robot_id": args.robot_id}
    if args.log_sync is not None:
        kw["synchronous"] = args.log_sync.upper()
    if args.log_min_free_bytes is not None:
        kw["min_free_bytes"] = args.log_min_free_bytes
    return LogOptions(**kw)


# ---- check -----------------------------------------------------------------------------------


def add_check_parser(sub: Any) -> None:
    """``spotstop check``: judge one scene with a bundle."""
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
    _add_log_and_deadline(
        p, "seconds; past it the answer is UNSAFE (fail-closed) (default and 0: none)"
    )
    p.add_argument(
        "--min-image-side",
        type=int,
        default=None,
        help="smallest image width/height in pixels; a smaller image is UNSAFE (default 32)",
    )
    p.add_argument(
        "--min-image-contrast",
        type=float,
        default=None,
        metavar="LEVELS",
        help="smallest contrast of the frame (0..255; 0: off): a frame that shows nothing (a "
        "covered lens, blown out to white, a blank fill) is UNSAFE (default 8)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the decision as JSON (also when the guard cannot start: the fail-closed "
        "decision, with its reason, that no log holds)",
    )
    add_backend_args(p)
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    """Run ``spotstop check``: 0 SAFE, 1 UNSAFE, 2 bad input."""
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
    from spotstop.guard._image import DEFAULT_MIN_CONTRAST, DEFAULT_MIN_SIDE, check_min_contrast
    from spotstop.guard._record import Decision

    try:
        deadline = _deadline_arg(args.deadline)
    except GuardError as e:
        print(f"spotstop check: {e}", file=sys.stderr)
        return 2
    try:
        image = args.image.read_bytes()
    except OSError as e:  # (a permission, a file gone since)
        print(f"spotstop check: image {args.image} cannot be read: {e}.", file=sys.stderr)
        return 2
    if args.min_image_side is not None and args.min_image_side < 1:
        print(
            f"spotstop check: --min-image-side must be a positive number of pixels; got "
            f"{args.min_image_side}.",
            file=sys.stderr,
        )
        return 2
    contrast = DEFAULT_MIN_CONTRAST if args.min_image_contrast is None else args.min_image_contrast
    try:
        contrast = check_min_contrast(contrast, "--min-image-contrast")
    except GuardError as e:
        print(f"spotstop check: {e}", file=sys.stderr)
        return 2
    try:
        guard = Guard(
            bundle,
            log=args.log,
            deadline_s=deadline,
            device=backend_device(args),
            backend=args.backend,
            min_image_side=args.min_image_side or DEFAULT_MIN_SIDE,  # None → default
            min_image_contrast=contrast,
            log_options=_log_options(args),
        )
    except Exception as e:  # no guard, no log: the answer is still a fail-closed UNSAFE
        d = Decision.unlogged(
            f"guard could not start: {type(e).__name__}: {e}",
            made_by="cli",
            request=args.request,
            situation_id=args.situation,
        )
        print(f"spotstop check: {d.fail_reason} (not logged)", file=sys.stderr)
    else:
        with guard:
            d = guard.check(Scene(image, args.request, args.situation))
    if args.json:
        print(json.dumps(d.to_dict(), indent=2))
    else:
        if d.test_pair:  # what the pair is, from its manifest
            print(guard.bundle.test_pair_note, file=sys.stderr)
        print(f"{d.label}  S={d.fused_score:+.4f}  threshold={d.threshold:+.4f}  policy={d.policy}")
        if d.fail_closed:
            print(f"fail-closed: {d.fail_reason}")
        print(f"decision {d.decision_id or '(none: not logged)'}  bundle {d.bundle_id or '-'}")
    return 0 if d.label == "SAFE" else 1


# ---- serve -----------------------------------------------------------------------------------

#: flag -> help of the sidecar's limits (defaults live in spotstop.guard.serve.ServeSettings)
_LIMITS = {
    "--queue-size": "scenes admitted to the model queue at once (default 32)",
    "--max-batch": "most scenes in one /v1/check/batch call (default 16)",
    "--max-body-bytes": "largest request body (default 16 MiB)",
    "--max-image-bytes": "largest encoded image (default 12 MiB)",
    "--max-pixels": "largest width*height (default 40000000)",
    "--min-image-side": "smallest image width/height in pixels (default 32)",
    "--max-request-chars": "longest request text (default 4000)",
}


def add_serve_parser(sub: Any) -> None:
    """``spotstop serve``: the HTTP sidecar (its defaults live in ``ServeSettings``; None here =
    its default, so this parser imports nothing from ``spotstop.guard.serve``)."""
    p = sub.add_parser(
        "serve",
        help="run the guard as a local HTTP sidecar (FastAPI; /v1/check, /metrics, /docs)",
        description=(
            "Serve the guard over HTTP for a planner: POST /v1/check (multipart or JSON), "
            "/v1/check/batch, /v1/situations/{id}, /v1/labels, /v1/policy/reload (also "
            "SIGHUP), /healthz, /readyz, /metrics, /docs. Binds 127.0.0.1 by default; any "
            "other address needs a bearer token ($SPOTSTOP_TOKEN or --token-file) or the "
            "server refuses to start."
        ),
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML file of settings: the keys of ServeSettings (bundle, host, port, log, "
        "journal, log_max_bytes, log_keep_days, log_min_free_bytes, deadline_s, queue_size, "
        "...; token_file or token_env, never the token); a flag given here wins over the file",
    )
    p.add_argument("--bundle", type=Path, default=None, help="bundle folder (or in --config)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8750)")
    p.add_argument("--token-file", type=Path, default=None, help="file holding the bearer token")
    p.add_argument(
        "--token-env",
        default=None,
        help="environment variable holding the token (default SPOTSTOP_TOKEN)",
    )
    _add_log_and_deadline(
        p,
        "seconds per check from the moment its body is in: queue wait, decoding, scoring, "
        "policy and log write (default 10; 0 = none)",
    )
    p.add_argument(
        "--log-max-bytes",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="disk budget of the live log, e.g. 2G: older decisions are archived as Parquet "
        "in <log>.archive/ beside it, then removed from it, oldest first (default: no budget)",
    )
    p.add_argument(
        "--log-keep-days",
        type=float,
        default=None,
        metavar="DAYS",
        help="archive decisions older than this many days the same way (default: no limit)",
    )
    p.add_argument(
        "--upload-timeout",
        type=float,
        default=None,
        help="seconds a request body may take to arrive; past it 408 and the connection is "
        "closed (default 10)",
    )
    for flag, text in _LIMITS.items():
        p.add_argument(flag, type=int, default=None, help=text)
    p.add_argument(
        "--min-image-contrast",
        type=float,
        default=None,
        metavar="LEVELS",
        help="smallest contrast of a frame (0..255; 0: off): a frame that shows nothing (a "
        "covered lens, blown out to white, a blank fill) is refused, 422 image_blank (default 8)",
    )
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
    add_backend_args(p)
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
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Run ``spotstop serve`` until it is stopped."""
    from spotstop.guard.serve import ServeSettings, load_guard, resolve_token, serve
    from spotstop.guard.serve._settings import load_serve_config

    conf = load_serve_config(args.config) if args.config is not None else {}
    token_file = args.token_file or conf.pop("token_file", None)
    token_env = args.token_env or conf.pop("token_env", None) or "SPOTSTOP_TOKEN"
    conf.pop("token_file", None)
    conf.pop("token_env", None)
    limits = [flag[2:].replace("-", "_") for flag in _LIMITS]  # argparse's dest of each flag
    flags: dict[str, Any] = {k: getattr(args, k) for k in limits}
    flags.update(
        bundle=args.bundle,
        host=args.host,
        port=args.port,
        log=args.log,
        state_dir=args.state_dir,
        backend=args.backend,
        threads=args.threads,
        journal=args.journal,
        log_max_bytes=args.log_max_bytes,
        log_keep_days=args.log_keep_days,
        log_min_free_bytes=args.log_min_free_bytes,
        robot_id=args.robot_id,
        log_synchronous=None if args.log_sync is None else args.log_sync.upper(),
        upload_timeout_s=args.upload_timeout,
        min_image_contrast=args.min_image_contrast,
    )
    if args.variant:
        flags["variants"] = tuple(dict.fromkeys(["scene", *args.variant]))
    if args.no_warmup:
        flags["warmup"] = False
    given = {**conf, **{k: v for k, v in flags.items() if v is not None}}
    if args.deadline is not None:  # 0: no deadline (None would fall back to the default)
        try:
            given["deadline_s"] = _deadline_arg(args.deadline)
        except GuardError as e:
            print(f"spotstop serve: {e}", file=sys.stderr)
            return 2
    if given.get("bundle") is None:
        print(
            "spotstop serve: name the bundle (--bundle, or bundle: in --config).", file=sys.stderr
        )
        return 2
    bundle = Path(given["bundle"])
    if not (bundle / "manifest.yaml").is_file():
        print(f"spotstop serve: {bundle} is not a bundle (no manifest.yaml).", file=sys.stderr)
        return 2
    given.setdefault("threads", max(1, (os.cpu_count() or 2) - 1))
    if args.device is not None or "device" not in given:
        given["device"] = args.device or ("cuda" if given.get("backend") == "tensorrt" else "cpu")
    settings = ServeSettings(  # validated here: bad limits or an insecure bind stop us now
        token=resolve_token(token_file, token_env), **given
    )
    if hasattr(signal, "SIGHUP"):
        # a SIGHUP while the bundle loads (minutes on a real pair) would end the process by
        # default: ignored until the server installs its reload handler (`spotstop` ignores
        # it from its start); without reload on SIGHUP it keeps its default action
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGHUP, signal.SIG_IGN if settings.sighup else signal.SIG_DFL)
    guard = load_guard(settings)  # before binding: a bad bundle is reported plainly
    return serve(settings, guard=guard, log_level=args.log_level)  # closes the guard


# ---- score -----------------------------------------------------------------------------------

_SCORE_EPILOG = """\
Many scenes: IMAGE may be a folder of JPEG/PNG/WebP images (sorted by path; --request is
their request) or a CSV image,request[,situation_id] (image paths relative to the CSV). Every
image is decoded and every request checked first, as the guard checks a scene: a scene whose
image the guard refuses (unreadable, too small, ...) or whose request the member refuses (too
long for it) is named on stderr and not scored, and the others are (on --ray the actors
refuse a request, ending the run naming no scene). The scores go to --out FILE (.csv or
.jsonl) or to stdout (CSV; JSONL with --json), one row per scene and variant, in input order,
with the columns
  scene,image,image_sha256,request,situation_id,member,variant,score,prompt_hash,error
(scene: the 0-based input position; score: s, empty in CSV / null in JSONL where the scene
was refused or the member gave a non-finite score (with a warning); error: then why, else
empty / null). A progress bar counts scenes on stderr. Exit status: 0 every scene scored,
1 some scenes have no score (named above the summary), 2 a usage error (nothing written).

Ray (pip install 'spotstop[ray]'): --ray scores the scenes as a Ray Data map_batches with one
member per actor. --ray alone connects to $RAY_ADDRESS, else starts a local Ray; --ray auto
joins the cluster `ray start --head` started on this machine; --ray ray://HOST:10001 a remote
one (Ray Client). Every node must read the member folder and the images at the same paths.
Put IMAGE before a bare --ray (or write --ray=ADDRESS).

examples:
  spotstop score --member tiny/tiny-qwen3_5 scene.jpg --request "open the door"
  spotstop score --member tiny/tiny-qwen3_5 scenes.csv --out scores.csv
  spotstop score --member M frames/ --request "pick up the knife" --out s.jsonl --ray auto
"""


def add_ray_args(p: Any) -> None:
    """``--ray [ADDRESS]``, ``--actors``, ``--cpus-per-actor``, ``--gpus-per-actor``: scoring
    many scenes on Ray (``score``, ``reliance``, ``select``); see :func:`ray_engine`."""
    p.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="score on Ray (the ray extra), one member per actor: $RAY_ADDRESS or a local "
        "Ray, 'auto', or ray://HOST:10001",
    )  # fmt: skip
    p.add_argument(
        "--actors", type=int, default=None, metavar="N",
        help="Ray actors per member (default: the cluster's CPUs / --cpus-per-actor)",
    )  # fmt: skip
    p.add_argument(
        "--cpus-per-actor", type=float, default=1.0, metavar="C",
        help="CPUs Ray reserves per actor, and the member's threads (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--gpus-per-actor", type=float, default=0.0, metavar="G",
        help="GPUs Ray reserves per actor (default 0; give one with --device cuda)",
    )  # fmt: skip


def ray_threads(args: argparse.Namespace, threads: int | None = None) -> int | None:
    """A member's CPU threads: ``threads`` when given, else on Ray the actor's CPUs."""
    if threads is None and args.ray is not None:
        return max(1, int(args.cpus_per_actor))
    return threads


def ray_engine(args: argparse.Namespace, chunk_size: int | None = None) -> Any:
    """The Ray engine of :func:`add_ray_args`' flags, or None without ``--ray``.

    Building it imports Ray (a missing extra raises its ImportError, which the CLI turns into
    the install hint) but connects to nothing yet. Raises ConfigError for flags that need
    ``--ray`` without it, and for a CUDA device on actors that reserve no GPU.
    """
    from spotstop.guard._errors import ConfigError

    if args.ray is None:
        if args.actors is not None or args.gpus_per_actor:
            raise ConfigError(
                "--actors and --gpus-per-actor go with --ray (without it the members score "
                "in this process)."
            )
        return None
    if str(args.device).startswith("cuda") and not args.gpus_per_actor:
        raise ConfigError(
            f"--device {args.device} on Ray needs GPUs reserved per actor: add "
            "--gpus-per-actor 1 (or a share, e.g. 0.5 for two actors per GPU)."
        )
    from spotstop.guard._batch import get_engine

    settings = {} if chunk_size is None else {"chunk_size": chunk_size}
    return get_engine(
        "ray",
        address=args.ray or None,
        actors=args.actors,
        cpus_per_actor=args.cpus_per_actor,
        gpus_per_actor=args.gpus_per_actor,
        **settings,
    )


def add_score_parser(sub: Any) -> None:
    """``spotstop score``: one member's teacher-forced score (torch reference backend) of one
    scene, or of many (a folder or a CSV), in this process or on Ray."""
    p = sub.add_parser(
        "score",
        help="teacher-forced member scores of a scene, or of many (a folder or a CSV; --ray)",
        description=(
            "Score IMAGE and --request with one member: s = log p(UNSAFE | x, q) − log p(SAFE | x, q), "
            "the answers appended right after the member's own generation prompt (reasoning "
            "off) and summed over their tokens. s > 0 is the member's direct answer UNSAFE. "
            "Prints the score and the prompt hash (which identifies prompt, answers and chat "
            "template). Uses the torch reference backend. IMAGE may also be a folder of images "
            "or a CSV of scenes: then a table of scores is written (see below)."
        ),
        epilog=_SCORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "image",
        type=Path,
        metavar="IMAGE",
        help="the camera image (JPEG, PNG or WebP), a folder of images, or a CSV "
        "image,request[,situation_id]",
    )
    p.add_argument(
        "--member", required=True, help="member folder (Hugging Face snapshot) or hub id"
    )
    p.add_argument(
        "--request",
        default=None,
        help="what the robot was asked to do (one image or a folder; a CSV has a request per row)",
    )
    p.add_argument(
        "--config", type=Path, default=None, help="scoring YAML (prompt, answers, image size)"
    )
    p.add_argument(
        "--image-size",
        default=None,
        help="HxW grid for the image, e.g. 512x512 (overrides the config)",
    )
    p.add_argument(
        "--visual-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the member's visual-token budget: a square grid of N tokens (default: the "
        "folder's hint, else the architecture's, qwen3_5 256 and lfm2_vl 64)",
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
    p.add_argument("--json", action="store_true", help="print JSON instead of text (many: JSONL)")
    many = p.add_argument_group("many scenes (IMAGE a folder or a CSV)")
    many.add_argument(
        "--out", type=Path, default=None, metavar="FILE",
        help="write the scores to FILE.csv or FILE.jsonl (default: stdout)",
    )  # fmt: skip
    add_ray_args(many)
    many.add_argument(
        "--chunk-size", type=int, default=16, metavar="N",
        help="scenes per chunk (a Ray batch) (default 16)",
    )  # fmt: skip
    many.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    p.set_defaults(func=run_score)


def _member_loader(args: argparse.Namespace, threads: int | None = None) -> Any:
    """A no-argument loader of ``--member`` as the score flags say (the scoring config, grid
    and size are read and checked now, the member loads when called)."""
    import functools

    from spotstop.guard._config import ScoringConfig, load_scoring_config, parse_image_size
    from spotstop.guard._member import load_member

    cfg = load_scoring_config(args.config) if args.config else ScoringConfig()
    size = parse_image_size(args.image_size, "--image-size") if args.image_size else None
    kw: dict[str, Any] = {"threads": threads} if threads is not None else {}
    return functools.partial(
        load_member,
        args.member,
        config=cfg,
        image_size=size,
        visual_tokens=args.visual_tokens,
        revision=args.revision,
        device=args.device,
        dtype=args.dtype,
        **kw,
    )


def _request_encoder(args: argparse.Namespace) -> Any:
    """``--member``'s prompt encoder as :func:`_member_loader`'s member has it (no weights)."""
    from spotstop.guard import _member
    from spotstop.guard._config import ScoringConfig, load_scoring_config

    cfg = load_scoring_config(args.config) if args.config else ScoringConfig()
    return _member.load_encoder(args.member, config=cfg, revision=args.revision)


def run_score(args: argparse.Namespace) -> int:
    """Run ``spotstop score``."""
    from spotstop.guard._errors import ConfigError
    from spotstop.guard._image import DEFAULT_MIN_CONTRAST, DEFAULT_MIN_SIDE, decode_image
    from spotstop.guard._types import Scene

    if args.image.is_dir() or args.image.suffix.lower() == ".csv":
        return _run_score_many(args)
    flags = (("--out", args.out), ("--ray", args.ray), ("--actors", args.actors))
    given = [f for f, v in flags if v is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with many scenes; "
            f"{args.image} is one image. Pass a "
            "folder of images or a CSV image,request[,situation_id]."
        )
    if args.request is None:
        raise ConfigError("--request is required: what the robot was asked to do.")
    load = _member_loader(args)  # a bad config or size fails before the image is read
    # an image the guard refuses (too small included) fails before any model is loaded
    image = decode_image(args.image, min_side=DEFAULT_MIN_SIDE, min_contrast=DEFAULT_MIN_CONTRAST)
    member = load()
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
                    "visual_tokens": member.info.n_image_tokens,
                    "image_size": list(member.info.image_size),
                    "image_sha256": image.sha256,
                    "scores": {r.variant: r.score for r in results},
                },
                indent=2,
            )
        )
    else:
        if member.info.test_pair:
            print(member.info.test_pair_note, file=sys.stderr)
        for r in results:
            verdict = "UNSAFE" if r.score > 0 else "SAFE"
            print(f"{member.name}  {r.variant:5s}  score {r.score:+.6f}  (direct answer {verdict})")
        print(f"prompt_hash {member.prompt_hash}")
    return 0


#: refused scenes named one per line on stderr; past them a count (the error column has all)
_REFUSED_SHOWN = 20


def _report_refused(table: Any) -> int:
    """Name each refused scene of ``table`` on stderr (up to :data:`_REFUSED_SHOWN`, then a
    count) with why; return how many there are. Raise ConfigError when none is left to score."""
    from spotstop.guard._errors import ConfigError

    refused = [(i, r) for i, r in enumerate(table.rows) if r.refused is not None]
    for i, row in refused[:_REFUSED_SHOWN]:
        print(
            f"spotstop score: {table.source}, scene {i} ({row.image}): not scored: {row.refused}",
            file=sys.stderr,
        )
    if len(refused) > _REFUSED_SHOWN:
        print(
            f"spotstop score: ... and {len(refused) - _REFUSED_SHOWN} more refused scene(s); "
            "the error column names each.",
            file=sys.stderr,
        )
    if refused and len(refused) == len(table):
        raise ConfigError(
            f"{table.source}: every one of its {len(table)} scene(s) is refused (named above); "
            "there is nothing to score."
        )
    return len(refused)


def _run_score_many(args: argparse.Namespace) -> int:
    """``spotstop score FOLDER|CSV``: a table of scores, on the local or the Ray engine; exit 1
    when a scene has no score (refused, or non-finite), its rows saying why."""
    import numpy as np
    from spotstop.guard._batch import MemberRef, get_engine, score_scenes
    from spotstop.guard._errors import ConfigError
    from spotstop.guard._hf import resolve_member
    from spotstop.guard._scene_table import read_scene_table, write_scores

    fmt = "jsonl" if args.json else "csv"
    if args.out is not None:
        fmt = {".csv": "csv", ".jsonl": "jsonl"}.get(args.out.suffix.lower(), "")
        if not fmt:
            raise ConfigError(f"--out must end in .csv or .jsonl; got {str(args.out)!r}.")
    if args.chunk_size < 1:
        raise ConfigError(f"--chunk-size must be >= 1; got {args.chunk_size}.")
    engine = ray_engine(args, args.chunk_size)  # Ray flags checked before any image is read
    load = _member_loader(args, threads=ray_threads(args))
    # an image the guard refuses is refused here (named, the others scored), before any model
    table = read_scene_table(args.image, args.request, keep_refused=True)
    if all(r.refused is not None for r in table.rows):
        _report_refused(table)  # nothing to score: no member is loaded
    kind: str | None = None  # the member's test-pair kind, from its folder
    if engine is None:
        member = load()
        kind = member.info.test_pair_kind
        # each request as the guard checks it (Member.check_request: its encoder's rules and
        # check_fits); a refused one is named and not scored, the others are
        table = table.refuse_requests(member.check_request)
        ref = MemberRef(member.name, load, loaded=member)
        engine = get_engine("local", chunk_size=args.chunk_size)
    else:  # the member loads in the actors; find its folder here, so a bad one fails now
        folder = resolve_member(args.member, revision=args.revision)
        kind = folder.test_pair_kind
        ref = MemberRef(Path(folder.path).name, load)
        # the actors' torch member checks a request with its encoder alone (it takes any
        # length): the same check here names each refused row before any chunk is sent
        table = table.refuse_requests(_request_encoder(args).check_request)
    refused = _report_refused(table)
    res = score_scenes(table.accepted(), [ref], args.variant or ["scene"], engine=engine,
                       progress=not args.quiet)  # fmt: skip
    write_scores(table, res, sys.stdout if args.out is None else args.out, fmt)
    run = res.members[ref.name]
    non_finite = int((~np.isfinite(np.stack(list(run.scores.values())))).any(axis=0).sum())
    if run.test_pair:
        print(describe_test_pair([kind]), file=sys.stderr)
    where = "stdout" if args.out is None else str(args.out)
    if not args.quiet:
        print(
            f"scored {res.n} scene(s) × {len(res.variants)} variant(s) with {ref.name} (prompt "
            f"{run.prompt_hash}) on the {res.engine} engine in {res.seconds:.1f} s; wrote {where}",
            file=sys.stderr,
        )
    if refused or non_finite:  # exit 1: some scenes have no score (their rows say why)
        print(
            f"spotstop score: {refused + non_finite} of {len(table)} scene(s) have no score "
            f"({refused} refused, {non_finite} with a non-finite score); their rows in {where} "
            "have an empty score and the reason in the error column.",
            file=sys.stderr,
        )
        return 1
    return 0
