"""The ``reliance``, ``shift`` and ``select`` subcommands (seed 002, SRA).

Each command has ``add_<cmd>_parser(subparsers)`` (adds its parser and sets ``func``) and
``run_<cmd>(args) -> int`` (0 done; 2 bad input, with one line on stderr; 1 when the work
itself failed). The composition root registers them; nothing here is imported until a
command runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from spotstop.guard._cli import add_ray_args

__all__ = [
    "add_reliance_parser",
    "add_select_parser",
    "add_shift_parser",
    "run_reliance",
    "run_select",
    "run_shift",
]

_RELIANCE_EPILOG = """\
The source set is a CSV image,request,label[,situation_id] (label SAFE or UNSAFE; image paths
relative to the CSV), or a folder holding exactly one such CSV. For every source scene and each
of four templates (plus one held-out template) the command pastes: the misleading text
(reassuring on UNSAFE scenes, alarming on SAFE ones), two matched controls in the same box,
font, size, colours and position (text agreeing with the label, and neutral text), and a
placebo non-word. Reliance = error under the misleading edit minus error under the matched
control, averaged over the four templates (seed 002, Eq. 2), with a group-bootstrap interval
(groups = source scenes).

A member's error is its probability of the wrong answer (sigma(s) for P(UNSAFE)) and also its
hard-answer error (s > 0 is UNSAFE); the guard's error is the error of its decisions (its
fusion, policy and tie rule, each probe scene as one check without a situation).

With --ray the edited scenes are scored on a Ray cluster (pip install 'spotstop[ray]'): a Ray
Data map_batches per member, one member per actor, each actor rendering the edits it scores;
the scores and the cache are those of a local run. Every node must read the candidates and the
source images at the same paths.

Writes OUT/reliance.json: candidates[name][cue] with reliance, placebo, source_error as
{"value","ci","n"} (names: the members and "guard"). Member scores are cached per member,
prompt hash and edit set in --cache, so a rerun scores nothing.

example:
  spotstop reliance --bundle bundle/ --source source/ --out cues/
"""

_SHIFT_EPILOG = """\
The text detector (OCR + claim lexicon) flags each frame's reassuring and alarming claims.
Its sensitivity and false-positive rate per cue are measured on the calibration CSV image,cue
(cue: reassuring, alarming or none). The corrected share of frames with a cue's text is
d = clip((q - fpr)/(sens - fpr), 0, 1) (seed 002, Sec. 3.4), undefined when sens <= fpr;
the misleading share is d * pi for reassuring text and d * (1 - pi) for alarming text, pi the
unsafe share from the log's labels (or --labels), else --prior. Intervals resample the
calibration scenes and the frames (whole situations from a log).

Writes OUT/shift.json: cues[cue] with q, sens, fpr, d_hat, misleading_share as
{"value","ci","n"}, plus prevalence and prevalence_source.

examples:
  spotstop shift --frames frames/ --calibration cal.csv --prior 0.1 --out cues/
  spotstop shift --log decisions.sqlite --calibration cal.csv --out cues/
"""

_SELECT_EPILOG = """\
Candidates: each member of every --candidate (a bundle or a member folder), every pair of
those members fused as Avg-2 (reference statistics and frozen cut fitted on the unedited
source scenes), and each bundle's guard as deployed. Each is ranked by its predicted error
E = source error + sum over cues of reliance * misleading share (seed 002, Eq. 1), on the
hard-answer scale shared by members, pairs and guards; the ranking by source error alone is
printed beside it, with where SRA changes it and why. Reliance runs as `spotstop reliance`
(cached per member; --ray scores the edits on a Ray cluster), the shift as `spotstop shift`.

Writes OUT/reliance.json, OUT/shift.json and OUT/select.json (candidates in rank order with
name, predicted_error {"value","ci"}, source_error and rank_by_source_error).

example:
  spotstop select --candidate bundleA/ --candidate bundleB/ --source source/ \\
      --log decisions.sqlite --calibration cal.csv --out select/
"""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="DIR", required=True, help="output folder (created if needed)")
    p.add_argument("--n-boot", type=int, default=10_000, metavar="N",
                   help="bootstrap draws (default: 10000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the edits and the bootstrap (default: 0)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", metavar="DIR_OR_CSV", required=True,
                   help="labelled source set: CSV image,request,label[,situation_id] or its folder")  # fmt: skip
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="score cache (default: $SPOTSTOP_HOME/cues-cache)")  # fmt: skip
    p.add_argument("--no-cache", action="store_true", help="score everything, write no cache")
    p.add_argument("--device", default="cpu", help="device of the members (default: cpu)")
    p.add_argument("--backend", default=None,
                   help="override the bundle's backend (onnx, tensorrt, torch)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads per member")
    add_ray_args(p)


def _add_frames(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--frames", metavar="DIR", help="folder of deployment frames (JPEG/PNG/WebP)")
    src.add_argument("--log", metavar="LOG",
                     help="decision log whose images are stored (Guard(..., store_images=True))")  # fmt: skip
    p.add_argument(
        "--labels", metavar="F", help="labels file (CSV/JSONL) for --log, as for the card"
    )
    p.add_argument("--calibration", metavar="CSV", required=True,
                   help="detector calibration set: CSV image,cue (reassuring/alarming/none)")  # fmt: skip
    p.add_argument("--prior", type=float, default=None, metavar="P",
                   help="unsafe share to use when no frame is labelled (stated, not measured)")  # fmt: skip
    p.add_argument("--lexicon", metavar="YAML", default=None,
                   help="claim lexicon of the text detector (default: the bundled one)")  # fmt: skip


def _add_bundle(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", metavar="B", required=True, help="the guard's bundle folder")


def _add_candidates(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidate", metavar="DIR", action="append", required=True,
                   help="a bundle or a member folder (repeat for each candidate)")  # fmt: skip


def _command(subparsers: Any, name: str) -> argparse.ArgumentParser:
    summary, description, epilog, parts = _COMMANDS[name]
    p = subparsers.add_parser(
        name, help=summary, description=description, epilog=epilog, formatter_class=_formatter
    )
    for part in (*parts, _add_common):
        part(p)
    p.set_defaults(func=_RUN[name])
    return p


def add_reliance_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``spotstop reliance``: how much a bundle's members and guard follow scene text."""
    return _command(subparsers, "reliance")


def add_shift_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``spotstop shift``: how often scene text misleads in a deployment."""
    return _command(subparsers, "shift")


def add_select_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``spotstop select``: rank candidate members, pairs and guards for a deployment."""
    return _command(subparsers, "select")


#: name -> (one-line help, description, epilog, argument groups)
_COMMANDS: dict[str, tuple[str, str, str, tuple[Any, ...]]] = {
    "reliance": (
        "measure how much the members and the guard follow text in the scene",
        "Measure reliance on reassuring and alarming scene text with matched edits of a "
        "labelled source set (seed 002, Eq. 2), per member and for the guard as deployed.",
        _RELIANCE_EPILOG,
        (_add_bundle, _add_source),
    ),
    "shift": (
        "estimate how often reassuring/alarming text misleads in a deployment",
        "Estimate the share of deployment frames whose text misleads, per cue, with a text "
        "detector corrected for its error rates (seed 002, Sec. 3.4).",
        _SHIFT_EPILOG,
        (_add_frames,),
    ),
    "select": (
        "rank candidate members, pairs and guards for a deployment (SRA)",
        "Rank candidates by source error + reliance x shift (Shift-Reliance Alignment, seed "
        "002, Eq. 1) without running them on the deployment.",
        _SELECT_EPILOG,
        (_add_candidates, _add_source, _add_frames),
    ),
}


class _BadInput(Exception):
    """A bad argument found before any work (exit 2)."""


def _plain(x: Any) -> Any:
    """JSON-ready: NaN and infinities as null, tuples as lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _write(out: Path, name: str, doc: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(_plain(doc), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _check_args(args: argparse.Namespace) -> None:
    if args.n_boot < 1:
        raise _BadInput(f"--n-boot must be >= 1; got {args.n_boot}.")
    if args.seed < 0:
        raise _BadInput(f"--seed must be >= 0; got {args.seed}.")
    if getattr(args, "labels", None) is not None and getattr(args, "log", None) is None:
        raise _BadInput("--labels goes with --log (a folder of frames has no decisions to label).")
    prior = getattr(args, "prior", None)
    if prior is not None and not 0.0 <= prior <= 1.0:
        raise _BadInput(f"--prior is the unsafe share, in [0, 1]; got {prior}.")


def _cache_dir(args: argparse.Namespace) -> Path | None:
    if args.no_cache:
        return None
    if args.cache is not None:
        return Path(args.cache)
    from spotstop.guard._config import spotstop_home

    return spotstop_home() / "cues-cache"


def _make_detector(args: argparse.Namespace) -> Any:
    """The runtime text detector (the ``cues`` extra) with ``--lexicon`` when given, its
    models loaded now, so a missing extra fails before any other work."""
    from spotstop.guard import BackendUnavailableError
    from spotstop.guard.cues import RapidOcrDetector

    try:
        return RapidOcrDetector(lexicon=args.lexicon).load()
    except BackendUnavailableError as e:
        raise _BadInput(str(e)) from e


def _shift(args: argparse.Namespace, rng: Any, detector: Any) -> Any:
    from spotstop.diagnostics.cues._frames import frames_from_folder, frames_from_log, measure_shift

    frames = (
        frames_from_folder(args.frames)
        if args.frames is not None
        else frames_from_log(args.log, labels=args.labels)
    )
    return measure_shift(
        detector,
        frames,
        args.calibration,
        prior=args.prior,
        n_boot=args.n_boot,
        rng=rng,
        progress=not args.quiet,
    )


def _reliance(args: argparse.Namespace, folders: list[str], pairs: bool, rng: Any) -> Any:
    from spotstop.diagnostics.cues._candidates import load_candidates, measure_reliance
    from spotstop.diagnostics.cues._source import read_source_set
    from spotstop.guard._cli import ray_engine, ray_threads

    engine = ray_engine(args)  # Ray flags checked before any scene is read
    source = read_source_set(args.source)
    threads = ray_threads(args, args.threads)
    cands = load_candidates(folders, device=args.device, backend=args.backend, threads=threads)
    return measure_reliance(
        cands,
        source,
        pairs=pairs,
        seed=args.seed,
        n_boot=args.n_boot,
        rng=rng,
        cache_dir=_cache_dir(args),
        progress=not args.quiet,
        engine=engine,
    ).result


def _run(cmd: str, args: argparse.Namespace, body: Any) -> int:
    """Run ``body(rng)``; bad input → one line on stderr and 2, a failed run → 1."""
    import numpy as np
    from spotstop.guard import GuardError

    try:
        _check_args(args)
        return int(body(np.random.default_rng(args.seed)))
    except _BadInput as e:
        print(f"spotstop {cmd}: {e}", file=sys.stderr)
        return 2
    except GuardError as e:
        print(f"spotstop {cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError | FileNotFoundError) else 1


def _emit(args: argparse.Namespace, name: str, res: Any) -> int:
    """Write ``OUT/<name>.json`` and print the result's table and summary."""
    path = _write(Path(args.out), f"{name}.json", res.to_dict())
    if not args.quiet:
        print(res.table(), "", res.summary(), f"wrote {path}", sep="\n")
    return 0


def run_reliance(args: argparse.Namespace) -> int:
    """Run ``spotstop reliance``."""

    return _run(
        "reliance",
        args,
        lambda rng: _emit(args, "reliance", _reliance(args, [args.bundle], False, rng)),
    )


def run_shift(args: argparse.Namespace) -> int:
    """Run ``spotstop shift``."""

    return _run(
        "shift", args, lambda rng: _emit(args, "shift", _shift(args, rng, _make_detector(args)))
    )


def run_select(args: argparse.Namespace) -> int:
    """Run ``spotstop select``."""

    def body(rng: Any) -> int:
        from spotstop.diagnostics.cues._select import select

        detector = _make_detector(args)  # a missing extra fails before any scoring
        rel = _reliance(args, list(args.candidate), True, rng)
        sh = _shift(args, rng, detector)
        sel = select(rel, sh)
        out = Path(args.out)
        _write(out, "reliance.json", rel.to_dict())
        _write(out, "shift.json", sh.to_dict())
        path = _write(out, "select.json", sel.to_dict())
        if not args.quiet:
            print(sel.table(), f"wrote {path} (and reliance.json, shift.json)", sep="\n")
        return 0

    return _run("select", args, body)


_RUN = {"reliance": run_reliance, "shift": run_shift, "select": run_select}
