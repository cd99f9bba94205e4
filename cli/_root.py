"""The table of subcommands, lazy parser loading, install hints and exit codes.

Nothing here imports a room at import time: a room's parser module is imported when its
command is chosen (``spotstop check ...``, ``spotstop check --help``), and ``spotstop
--help`` lists the commands from the table alone.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["COMMANDS", "MODULE_EXTRAS", "Command", "build_parser", "install_hint", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: where its parser lives and what it needs.

    ``adder(subparsers)`` in ``module`` adds the command's parser and sets ``func`` (the
    handler, ``func(args) -> exit status``). ``extras`` are the optional dependency groups it
    needs beyond the base install (named in ``spotstop --help`` and used for the install hint
    of a missing library the extras table does not know). ``summary`` is the line of
    ``spotstop --help``; it equals the parser's own ``help`` (tests/cli/test_commands.py
    checks it), so that listing the commands imports no room.
    """

    module: str
    adder: str
    extras: tuple[str, ...]
    summary: str


#: name -> the room module that owns the command, its parser's adder, the extras it needs.
COMMANDS: dict[str, Command] = {
    "demo": Command(
        "spotstop.cli._demo",
        "add_demo_parser",
        ("export", "diag"),
        "run the guard end to end on the tiny TEST pair trained on the toy world",
    ),
    "check": Command(
        "spotstop.guard._cli",
        "add_check_parser",
        (),
        "judge one scene; exit 0 SAFE, 1 UNSAFE (scored or fail-closed), 2 usage error",
    ),
    "serve": Command(
        "spotstop.guard._cli",
        "add_serve_parser",
        (),
        "run the guard as a local HTTP sidecar (FastAPI; /v1/check, /metrics, /docs)",
    ),
    "score": Command(
        "spotstop.guard._cli",
        "add_score_parser",
        ("export",),
        "teacher-forced member scores of a scene, or of many (a folder or a CSV; --ray)",
    ),
    "policy": Command(
        "spotstop.calibrate._cli",
        "add_policy_parser",
        (),
        "fit a first policy (init), list, diff and activate policy versions",
    ),
    "recalibrate": Command(
        "spotstop.calibrate._cli",
        "add_recalibrate_parser",
        (),
        "refit the policy from the decision log and write a new policy version",
    ),
    "card": Command(
        "spotstop.diagnostics._cli",
        "add_card_parser",
        ("diag",),
        "write the per-deployment card (verdict, what the guard delivers, Spot-Stop, checks)",
    ),
    "reliance": Command(
        "spotstop.diagnostics.cues._cli",
        "add_reliance_parser",
        ("diag",),
        "measure how much the members and the guard follow text in the scene",
    ),
    "shift": Command(
        "spotstop.diagnostics.cues._cli",
        "add_shift_parser",
        ("diag", "cues"),
        "estimate how often reassuring/alarming text misleads in a deployment",
    ),
    "select": Command(
        "spotstop.diagnostics.cues._cli",
        "add_select_parser",
        ("diag", "cues"),
        "rank candidate members, pairs and guards for a deployment (SRA)",
    ),
    "tiny": Command(
        "spotstop.export._cli",
        "add_tiny_parser",
        ("export",),
        "build the tiny test pair (random weights, or --trained on the toy world)",
    ),
    "world": Command(
        "spotstop.export._cli",
        "add_world_parser",
        ("export", "diag"),
        "render the toy situational-safety world (scenes, requests, labels by a rule)",
    ),
    "export": Command(
        "spotstop.export._cli",
        "add_export_parser",
        ("export",),
        "export members to ONNX scoring graphs in a verified bundle (workstation)",
    ),
    "verify-bundle": Command(
        "spotstop.export._cli",
        "add_verify_bundle_parser",
        (),
        "check an exported bundle as the robot runs it, and against the torch reference",
    ),
    "cost": Command(
        "spotstop.export._cli",
        "add_cost_parser",
        (),
        "FLOPs, weight bytes and roofline lower bound of one scene, per member and device",
    ),
}

#: top-level module -> the extra that installs it (pyproject.toml's optional dependencies).
MODULE_EXTRAS: dict[str, str] = {
    "torch": "export",
    "transformers": "export",
    "safetensors": "export",
    "onnx": "export",
    "onnxscript": "export",
    "huggingface_hub": "export",
    "scipy": "diag",
    "matplotlib": "diag",
    "rapidocr": "cues",
    "cv2": "cues",
    "tensorrt": "gpu",
    "cuda": "gpu",
    "ray": "ray",
    "pandas": "ray",
}

_DESCRIPTION = """\
spotstop — a pre-action safety guard for robots.

Before the robot acts, spotstop scores the camera scene and the request with two small
vision-language models (teacher-forced score s = log p(UNSAFE) − log p(SAFE)), fuses the two
scores, applies a threshold policy, answers SAFE or UNSAFE and logs the decision.
"""

_EPILOG = """\
examples:
  spotstop demo                                   the guard end to end on the tiny TEST pair (toy world)
  spotstop check cam.jpg --request "open the door" --bundle BUNDLE && open_door
  spotstop policy init BUNDLE --pool frames/ --request "..."   a first policy, no labels
  spotstop card --demo --out card/               the card of the demo log (trained TEST pair, toy world)
  spotstop tiny --out ./tiny                      build the tiny TEST pair (decisions mean nothing)
  spotstop score --member ./tiny/tiny-qwen3_5 scene.jpg --request "pick up the knife"

The robot's commands (check, serve, policy, recalibrate, verify-bundle's runtime half) run on
the base install; a command marked [needs spotstop[X]] needs `pip install 'spotstop[X]'`.
Run `spotstop COMMAND --help` for each command's options.
"""


def install_hint(error: ImportError, extras: Sequence[str] = ()) -> str | None:
    """The one line for a missing library, or None when ``error`` is not a missing extra.

    The library is looked up in :data:`MODULE_EXTRAS`; one it does not list (a dependency of
    an extra's library) falls back to ``extras``, the command's. A missing ``spotstop``
    module, or an unknown library of a command that needs no extra, is a bug: None.
    """
    name = (error.name or "").partition(".")[0]
    if not name or name == "spotstop":
        return None
    needed = (MODULE_EXTRAS[name],) if name in MODULE_EXTRAS else tuple(extras)
    if not needed:
        return None
    if isinstance(error, ModuleNotFoundError):
        why = f"{name} is not installed"
    else:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        why = f"{name} failed to import: {first}"
    which = " and ".join(f"'{x}'" for x in needed) + (" extras" if len(needed) > 1 else " extra")
    return f"needs the {which} ({why}): pip install 'spotstop[{','.join(needed)}]'"


def _listing(cmd: Command) -> str:
    needs = f"  [needs spotstop[{','.join(cmd.extras)}]]" if cmd.extras else ""
    return cmd.summary + needs


def _adder(cmd: Command) -> Callable[[Any], None]:
    """The function that adds ``cmd``'s parser: imports its room module now."""
    adder: Callable[[Any], None] = getattr(importlib.import_module(cmd.module), cmd.adder)
    return adder


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``spotstop`` parser; ``command``'s own parser is built (its room module imported),
    every other command is listed from the table only."""
    parser = argparse.ArgumentParser(
        prog="spotstop",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        if name == command:
            _adder(cmd)(sub)
        else:
            sub.add_parser(name, help=_listing(cmd), add_help=False)
    return parser


def _command_name(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the top level has flags only), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _quiet_third_party() -> None:
    """Per-file weight-loading bars of transformers drown the CLI's own output."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "transformers" in sys.modules:  # only when already imported: never import it for this
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _run(name: str | None, argv: list[str]) -> int:
    parser = build_parser(name if name in COMMANDS else None)
    args = parser.parse_args(argv)
    _quiet_third_party()
    if args.version:
        from importlib.metadata import version

        print(f"spotstop {version('spotstop')}")
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


def _exit_status(name: str | None, cmd: Command | None, e: Exception) -> int | None:
    """Print the one line for an error we expect and return the exit status; None: a bug."""
    if isinstance(e, ImportError):
        hint = install_hint(e, cmd.extras if cmd else ())
        if hint is not None:
            print(f"spotstop {name}: {hint}", file=sys.stderr)
            return 2
    from spotstop.guard import BackendUnavailableError, GuardError

    if isinstance(e, BackendUnavailableError):  # its message names what to install
        print(f"spotstop {name}: {e}", file=sys.stderr)
        return 2
    if isinstance(e, GuardError):
        print(f"spotstop {name}: {type(e).__name__}: {e}", file=sys.stderr)
        # Bad input / configuration is a usage error (2); anything else is a failure (1).
        return 2 if isinstance(e, ValueError | FileNotFoundError) else 1
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``spotstop``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = _command_name(args)
    if name == "serve" and hasattr(signal, "SIGHUP"):
        # SIGHUP reloads a running sidecar; while it starts (imports, the bundle's load) the
        # default action would end it: ignored until the server installs its handler, and
        # given back when serve returns (main called in a process that goes on)
        previous = signal.getsignal(signal.SIGHUP)
        try:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        except ValueError:  # not the main thread: nothing to guard
            return _main(name, args)
        try:
            return _main(name, args)
        finally:
            signal.signal(signal.SIGHUP, previous)
    return _main(name, args)


def _main(name: str | None, args: list[str]) -> int:
    try:
        return _run(name, args)
    except Exception as e:
        status = _exit_status(name, COMMANDS.get(name or ""), e)
        if status is None:
            raise
        return status
