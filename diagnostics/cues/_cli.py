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
The source set is a CSV image,request,label[,situation_id][,contrast_id] (label SAFE or
UNSAFE; image paths relative to the CSV), or a folder holding exactly one such CSV. For every
source scene and each of six templates (four sign and two sticker templates, plus one held-out
sign template) the command pastes: the
misleading text (reassuring on UNSAFE scenes, alarming on SAFE ones), two matched controls in
the same box, font, size, colours and position (text agreeing with the label, and neutral text), and a
placebo non-word. Reliance = error under the misleading edit minus error under the matched
control, averaged within each template family and then over the two families (seed 002,
Eq. 2), with a group-bootstrap interval
(groups: scenes sharing a situation or contrast id, where the CSV names them, else each source
scene; every edit of a scene with its scene; reliance.json says which: resampling_unit).

A member's error is its probability of the wrong answer (sigma(s) for P(UNSAFE)) and also its
hard-answer error at the cut it would be deployed at: its frozen cut (the mean robust z-score
of the unedited source scenes, no labels), or the cut you state with --member-cut NAME=CUT on
its raw score s (UNSAFE when s >= CUT; --member-cut NAME=0 is the member's own answer). A pair
uses the same frozen rule on its Avg-2 score; the guard's error is the error of its decisions
(its fusion, policy and tie rule, each probe scene as one check without a situation).
reliance.json notes each candidate's operating_point (rule and cut).

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
(cue: reassuring, alarming or none; it must hold none scenes). The shares of frames with reassuring text, alarming text
and neither are estimated jointly from the two flags (least squares on the four flag
combinations with shares >= 0 summing to 1, seed 002 Sec. E.2); with one flag this is the
correction d = clip((q - fpr)/(sens - fpr), 0, 1) of Sec. 3.4. A cue with sens <= fpr is
undefined: no number and no interval, and it drops out of select's prediction.

Reassuring text misleads only on UNSAFE scenes, alarming text only on SAFE ones. With enough
labelled frames of each class (a labelled log, or --labels; see --prior) the misleading share
is measured: the corrected share among the UNSAFE frames times their share pi (reassuring),
among the SAFE frames times 1 - pi (alarming), never above d. Without labels it ASSUMES TEXT INDEPENDENT OF THE LABEL: d * pi and d * (1 - pi),
pi the --prior; shift.json then states the assumption and marks every misleading share with
"basis": "assumes text independent of the label" (a sign saying SAFE on safe equipment is then
counted as misleading pi of the time). Intervals resample the calibration scenes and the
frames (whole situations from a log).

Writes OUT/shift.json (schema 2): cues[cue] with q, sens, fpr, d_hat, d_hat_given_label and
misleading_share (with its basis) as {"value","ci","n"}, frame_types, prevalence,
prevalence_source, misleading_share_basis and assumption.

examples:
  spotstop shift --frames frames/ --calibration cal.csv --prior 0.1 --out cues/
  spotstop shift --log decisions.sqlite --calibration cal.csv --out cues/
"""

_SELECT_EPILOG = """\
Candidates: each member of every --candidate (a bundle or a member folder) at its frozen cut
(or --member-cut NAME=CUT), every pair of those members fused as Avg-2 (reference statistics
and frozen cut fitted on the unedited source scenes), and each bundle's guard as deployed.
Each is ranked by its predicted error (seed 002, Eq. 1)

  E = intercept + sum over cues of cost * reliance * misleading share
  intercept = miss_cost * pi * error on UNSAFE source scenes + (1 - pi) * error on SAFE ones

on the hard-answer scale shared by members, pairs and guards. pi is the deployment's unsafe
share (labels or --prior; --weighting source uses the source set's own mix instead); a miss
counts --miss-cost false stops (default 1: E is an error rate), so reassuring text, which
causes misses, is weighted by it. The ranking by the intercept alone is printed beside it,
with where SRA changes it and why. Without labelled frames the misleading shares, and so
every predicted error, ASSUME TEXT INDEPENDENT OF THE LABEL (marked with a dagger and in
select.json). Reliance runs as `spotstop reliance` (cached per member; --ray scores the edits
on a Ray cluster), the shift as `spotstop shift`.

The selection then checks itself (seed 002, Sec. 3.5): from the unedited scenes and the
held-out template's misleading edits it draws --check-sets test sets T_d per d = 0, 0.05, ...,
0.5 for each cue and reports each selector's mean regret and worst case W_s (SRA given the
true d, source error, and ATC), with a warning when they disagree.

Writes OUT/reliance.json, OUT/shift.json and OUT/select.json (schema 2: candidates in rank
order with name, predicted_error {"value","ci","basis"}, intercept, source_error,
rank_by_source_error and operating_point; weighting; dropped_cues; assumption; check).

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
                   help="labelled source set: CSV image,request,label[,situation_id][,contrast_id] or its folder")  # fmt: skip
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="score cache (default: $SPOTSTOP_HOME/cues-cache)")  # fmt: skip
    p.add_argument("--no-cache", action="store_true", help="score everything, write no cache")
    p.add_argument("--device", default="cpu", help="device of the members (default: cpu)")
    p.add_argument("--backend", default=None,
                   help="override the bundle's backend (onnx, tensorrt, torch)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads per member")
    from spotstop.diagnostics.cues._templates import TEMPLATES

    p.add_argument("--templates", metavar="NAMES", default=None,
                   help="measurement templates, comma-separated (default: all of them: "
                   + ", ".join(t.name for t in TEMPLATES) + ")")  # fmt: skip
    add_ray_args(p)


def _add_frames(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--frames", metavar="DIR", help="folder of deployment frames (JPEG/PNG/WebP)")
    src.add_argument("--log", metavar="LOG",
                     help="decision log whose images are stored (Guard(..., store_images=True))")  # fmt: skip
    p.add_argument(
        "--labels",
        metavar="F",
        help="labels file (CSV/JSONL) for --log, as for the card: labelled frames measure the "
        "misleading share instead of assuming text independent of the label",
    )
    p.add_argument("--calibration", metavar="CSV", required=True,
                   help="detector calibration set: CSV image,cue (reassuring/alarming/none)")  # fmt: skip
    from spotstop.diagnostics.cues._shift import MIN_LABELLED_PER_CLASS

    p.add_argument("--prior", type=float, default=None, metavar="P",
                   help=f"unsafe share to use when fewer than {MIN_LABELLED_PER_CLASS} frames "
                        "of a class are labelled (stated, not measured; ignored, with a "
                        "warning, otherwise)")  # fmt: skip
    p.add_argument("--lexicon", metavar="YAML", default=None,
                   help="claim lexicon of the text detector (default: the bundled one)")  # fmt: skip
    p.add_argument("--claim-reader", metavar="NAME", default=None,
                   help="what reads claims in the OCR text: 'lexicon' (default) or "
                   "'member:<member folder>', a text-only pass of a guard member, "
                   "calibrated by the same sens/fpr correction")  # fmt: skip


def _add_bundle(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", metavar="B", required=True, help="the guard's bundle folder")
    _add_member_cut(p)


def _add_member_cut(p: argparse.ArgumentParser) -> None:
    p.add_argument("--member-cut", metavar="NAME=CUT", action="append", default=[],
                   help="measure member NAME at the cut CUT on its raw score s (UNSAFE when "
                        "s >= CUT) instead of its frozen cut (repeat per member)")  # fmt: skip


def _add_weighting(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miss-cost", type=float, default=1.0, metavar="C",
                   help="cost of a missed hazard relative to a false stop (default: 1)")  # fmt: skip
    p.add_argument("--weighting", choices=("deployment", "source"), default="deployment",
                   help="weight the source error to the deployment's unsafe share (default) or "
                        "keep the source set's own mix")  # fmt: skip
    p.add_argument("--check-sets", type=int, default=30, metavar="N",
                   help="test sets per d for the selection check (default: 30; 0: no check)")  # fmt: skip


def _add_candidates(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidate", metavar="DIR", action="append", required=True,
                   help="a bundle or a member folder (repeat for each candidate)")  # fmt: skip
    _add_member_cut(p)
    _add_weighting(p)


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
    cost = getattr(args, "miss_cost", 1.0)
    if not (math.isfinite(cost) and cost > 0):
        raise _BadInput(
            f"--miss-cost is the cost of a missed hazard relative to a false stop, > 0; got {cost}."
        )
    if getattr(args, "check_sets", 0) < 0:
        raise _BadInput(f"--check-sets must be >= 0; got {args.check_sets}.")
    _member_cuts(args)
    _templates(args)


def _templates(args: argparse.Namespace) -> tuple[Any, ...]:
    """``--templates NAMES`` as templates (every one without it)."""
    from spotstop.diagnostics._errors import DataError
    from spotstop.diagnostics.cues._templates import TEMPLATES, templates_named

    names = getattr(args, "templates", None)
    if names is None:
        return TEMPLATES
    try:
        return templates_named(names)
    except DataError as e:
        raise _BadInput(f"--templates: {e}") from None


def _member_cuts(args: argparse.Namespace) -> dict[str, float]:
    """``--member-cut NAME=CUT`` (repeated) as ``{name: cut}``."""
    out: dict[str, float] = {}
    for item in getattr(args, "member_cut", None) or []:
        name, sep, value = str(item).rpartition("=")
        try:
            cut = float(value)
        except ValueError:
            cut = math.nan
        if not sep or not name or not math.isfinite(cut):
            raise _BadInput(
                f"--member-cut takes NAME=CUT with a finite number CUT (e.g. qwen=0); got {item!r}."
            )
        if name in out:
            raise _BadInput(f"--member-cut names {name!r} twice; give one cut per member.")
        out[name] = cut
    return out


def _cache_dir(args: argparse.Namespace) -> Path | None:
    if args.no_cache:
        return None
    if args.cache is not None:
        return Path(args.cache)
    from spotstop.guard import spotstop_home

    return spotstop_home() / "cues-cache"


def _make_detector(args: argparse.Namespace) -> Any:
    """The runtime text detector (the ``cues`` extra) with ``--lexicon`` when given, its
    models loaded now, so a missing extra fails before any other work."""
    from spotstop.guard import BackendUnavailableError, ConfigError
    from spotstop.guard.cues import RapidOcrDetector

    try:
        return RapidOcrDetector(lexicon=args.lexicon, reader=args.claim_reader).load()
    except (BackendUnavailableError, ConfigError) as e:
        raise _BadInput(str(e)) from e


def _shift(args: argparse.Namespace, rng: Any, detector: Any) -> Any:
    from spotstop.diagnostics.cues._frames import frames_from_folder, frames_from_log, measure_shift

    with (
        frames_from_folder(args.frames)
        if args.frames is not None
        else frames_from_log(args.log, labels=args.labels)
    ) as frames:  # a log's stored images are read through one opening of it
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
    """The reliance run (:class:`RelianceRun`: the result, the scores and every candidate's
    decisions at its operating point)."""
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
        member_cuts=_member_cuts(args),
        seed=args.seed,
        n_boot=args.n_boot,
        rng=rng,
        cache_dir=_cache_dir(args),
        progress=not args.quiet,
        engine=engine,
        templates=_templates(args),
    )


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
        lambda rng: _emit(args, "reliance", _reliance(args, [args.bundle], False, rng).result),
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
        from spotstop.diagnostics.cues._selfcheck import check_selection

        detector = _make_detector(args)  # a missing extra fails before any scoring
        run = _reliance(args, list(args.candidate), True, rng)
        sh = _shift(args, rng, detector)
        check = (
            check_selection(run, n_sets=args.check_sets, miss_cost=args.miss_cost, rng=rng)
            if args.check_sets
            else None
        )
        sel = select(
            run.result, sh, miss_cost=args.miss_cost, weighting=args.weighting, check=check
        )
        out = Path(args.out)
        _write(out, "reliance.json", run.result.to_dict())
        _write(out, "shift.json", sh.to_dict())
        path = _write(out, "select.json", sel.to_dict())
        if not args.quiet:
            print(sel.table(), f"wrote {path} (and reliance.json, shift.json)", sep="\n")
        return 0

    return _run("select", args, body)


_RUN = {"reliance": run_reliance, "shift": run_shift, "select": run_select}
