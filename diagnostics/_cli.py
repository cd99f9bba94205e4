"""``spotstop card``: write the deployment card from a decision log, a scores CSV or a demo.

``--demo`` reads the packaged demo log (the trained tiny TEST pair on a toy world, checked
through the guard and labelled by the world's rule) as a LOG; ``--simulated`` reads the
simulated log that ``--demo`` read before (no guard answers).

:func:`add_card_parser` adds the ``card`` parser to the composition root's subparsers and sets
``func=run_card``; :func:`run_card` runs it (0 done; 2 bad input, with one line on stderr).
:func:`card_main` parses an argument list on its own and calls :func:`run_card`. Nothing
heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_card_parser", "card_main", "run_card"]

_SUMMARY = "write the per-deployment card (verdict, what the guard delivers, Spot-Stop, checks)"

_DESCRIPTION = (
    "Write a deployment card: a verdict of four sentences or more, what the guard delivered "
    "(its own logged answers against the reviewer labels, per policy version), the conformal "
    "audit of each deployed cut, the Spot-Stop decomposition with group-bootstrap intervals, prevalence, "
    "situation share, scene-blind readers and, with --cues, text in the scene."
)

_EPILOG = """\
Exactly one input: LOG (the guard's decision-log SQLite file), --scores CSV, --demo or
--simulated.

--demo reads the packaged demo log as a LOG: the trained tiny TEST pair on a TOY WORLD
(`spotstop world --rules`: drawn shapes labelled by a rule table), ~480 scenes of 24 rooms
checked one by one through the guard (situation recentering, then a conformal cut
recalibrated from the first half's labels), every decision labelled by the world's rule. It
shows the method on that world (delivered rates, replay, conformal audit, situation share,
a file cue for the scene-blind readers), never anything about real safety. Maintainers write
it again with `spotstop demo --write-card-log PATH`. --simulated reads a simulated log of
600 contrasts instead (no guard, no deployed policy; what --demo read before).

A fleet: give several LOGs, a folder or a glob (quoted), with the logs (*.sqlite, each read
with its archives) and collected Parquet archives (*.parquet) of many robots: they are read
as one log. Each decision keeps its robot (the log's --robot-id, else the file's folder or
name); the bootstrap groups are contrasts and situations within a robot, each robot's
decisions are replayed apart, and the card's "Robots of the fleet" section flags a robot
whose delivered accuracy or conformal miss rate differs from the rest's.

From LOG:
  * delivered_* are the guard's own logged answers against the reviewer labels, over the
    labelled decisions that did not fail closed, overall and per policy version;
  * the Spot-Stop fields use the logged fused score S of the deciding policy, in the paper's
    convention (S > cut is the answer UNSAFE); the cut is the deployed constant threshold when
    every labelled decision was decided by one frozen/conformal cut, else 0 on S (see the
    card's settings.direct_cut_source); they are diagnostics, not what the guard delivered;
  * the conformal audit checks each conformal policy version in the log on the labelled
    unsafe decisions made after it was created (one case per situation);
  * gray and request-only scores are fused with the deciding policy's own fusion.
One bundle: a LOG whose decisions come from several bundles (bundle id and prompt hash:
other members, precisions or prompts, whose scores are on other scales) is refused with each
bundle's count; --bundle-id ID writes the card of that bundle's decisions (the others are left
out and counted in provenance.log.dropped.other_bundle). Policy versions and their fusions
change within one bundle's log: they are read together, and the card warns when the fusions
differ (the Spot-Stop fields then pool fused scores of several scales).
Labels come from the log's labels table, or from --labels F (CSV or JSONL keyed by
decision_id or image_sha256, with columns label [safe/unsafe or 0/1], optional contrast_id
and situation_id), which override the table's.

The scores CSV needs the columns case_id,label,score,contrast_id (label: safe/unsafe or
0/1; contrast_id may be empty) and may have situation_id (absent or empty: no situation).
Optional columns: score_<member>, score_gray, score_text, width, height, bytes, jpeg_quality,
format, request. A scores CSV or the simulated log has no deployed policy: the card says so
and has no delivered_*.

--scores needs --cut T, the score that separates the answers: no default fits every scale
(0 is the direct answer of a log-odds score, and "any refusal at all" for scores in [0, 1]).
The Spot-Stop fields answer UNSAFE for S > T (the paper's direct answer); the prevalence
check's fixed cut uses the guard's rule S >= T (a score equal to T is UNSAFE). The card
reports how many scores equal T and which side each rule puts them on, and warns when all
scores lie on one side of T or 5 % or more equal it.

--previous CARD_JSON compares with an earlier card of the same bundle (refused for another
bundle). --cues DIR reads reliance.json, shift.json and select.json (any subset) written by
`spotstop reliance`, `spotstop shift` or `spotstop select` for the card's "Text in the scene".

Writes OUT/card.json (every number as {"value","ci":[low,high],"n"}, the verdict as a list of
{status, topic, sentence}), OUT/card.md and a self-contained OUT/card.html.

examples:
  spotstop card decisions.sqlite --labels labels.csv --out card/
  spotstop card fleet/ --out fleet-card/                     # every robot's log and archives
  spotstop card decisions.sqlite --period week --out card/   # drift between weeks
  spotstop card decisions.sqlite --previous old_card/card.json --cues cues/ --out card/
  spotstop card --demo --out card/ --n-boot 2000         # the packaged demo log (TEST pair)
  spotstop card --simulated --out card/ --n-boot 2000    # a simulated log, no guard
  spotstop card --scores scores.csv --cut 0.5 --out card/ --seed 7
  spotstop card --simulated --out card/ --ray   # the bootstrap's draws as Ray tasks

--ray [ADDRESS] (pip install 'spotstop[ray]') runs the group bootstrap's blocks of draws as
Ray tasks, each block with its own seed derived from --seed: the card equals the local one.
Put LOG before a bare --ray (or write --ray=ADDRESS).
"""


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="*", metavar="LOG",
                   help="the guard's decision log (SQLite); several, a folder or a glob: a "
                   "fleet's logs and archives, read as one")  # fmt: skip
    p.add_argument("--scores", metavar="CSV", help="scores CSV instead of a log (see below)")
    p.add_argument("--demo", action="store_true",
                   help="read the packaged demo log: the trained tiny TEST pair on a toy world, "
                   "labelled by the world's rule (a LOG input)")  # fmt: skip
    p.add_argument("--simulated", action="store_true",
                   help="use a simulated log of 600 contrasts (no guard answers)")  # fmt: skip
    p.add_argument("--labels", metavar="F",
                   help="labels file (CSV or JSONL) for LOG; overrides the log's labels")  # fmt: skip
    p.add_argument("--journal", metavar="FILE",
                   help="the guard's journal (its --journal) for LOG: fail-closed amendments "
                   "waiting there are applied, decisions the log lacks counted (default: the "
                   "log's default journal; the dead letter beside the log is always read)")  # fmt: skip
    p.add_argument("--bundle-id", metavar="ID",
                   help="the bundle whose decisions LOG's card reads (required when the log "
                   "holds decisions of several bundles: their scores are on other scales)")  # fmt: skip
    p.add_argument("--previous", metavar="CARD_JSON",
                   help="an earlier card.json of the same bundle: the verdict says what changed")  # fmt: skip
    p.add_argument("--cues", metavar="DIR",
                   help="folder with reliance.json / shift.json / select.json (any subset)")  # fmt: skip
    p.add_argument("--cut", "--direct-cut", dest="direct_cut", type=float, default=None,
                   metavar="T", help="the card's cut on the score: S > T is the direct answer "
                   "UNSAFE in the Spot-Stop fields, S >= T the fixed cut of the prevalence check "
                   "(required with --scores; default for LOG: the deployed constant cut, else 0; "
                   "for --simulated: 0)")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="output folder (created if needed; required)")
    p.add_argument("--n-boot", type=int, default=10_000, metavar="N",
                   help="group-bootstrap draws of the Spot-Stop fields (default: 10000); the "
                   "checks and the delivered rates use min(N, 1000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    p.add_argument("--group-by", choices=("situation", "contrast"), default="situation",
                   help="resampling unit of the bootstrap: situation (default: both scenes of a "
                   "contrast and all scenes of a situation together) or contrast")  # fmt: skip
    p.add_argument("--period", choices=("day", "week", "month"), default=None,
                   help="drift between periods (LOG or --demo): the key fields per UTC day, ISO "
                   "week or month, and their change, with the conformal audit per period")  # fmt: skip
    p.add_argument("--drift-baseline", choices=("first", "previous"), default="first",
                   help="compare each period with the first one (default) or the previous")  # fmt: skip
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the bootstrap's blocks of draws as Ray tasks (the ray extra): "
                   "$RAY_ADDRESS or a local Ray, 'auto', or ray://HOST:10001; the same card")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")


def add_card_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``spotstop card`` to ``subparsers`` (``func=run_card``) and return its parser."""
    p = subparsers.add_parser(
        "card",
        help=_SUMMARY,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=_formatter,
    )
    _add_arguments(p)
    p.set_defaults(func=run_card)
    return p


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spotstop card",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=_formatter,
    )
    _add_arguments(p)
    return p


class _BadInput(Exception):
    """A bad argument found before any work (exit 2)."""


def _check_args(args: argparse.Namespace) -> None:
    if args.out is None:
        raise _BadInput("--out DIR is required: the folder to write card.json, card.md, card.html.")
    n_src = bool(args.log) + (args.scores is not None) + bool(args.demo) + bool(args.simulated)
    if n_src != 1:
        raise _BadInput("give exactly one input: LOG, --scores CSV, --demo or --simulated.")
    if args.scores is not None and args.direct_cut is None:
        raise _BadInput(
            "--scores needs --cut T, the score that separates SAFE from UNSAFE (S > T is the "
            "direct answer UNSAFE; the guard's rule S >= T puts a score equal to T on UNSAFE): "
            "0 is the direct answer of a log-odds score, for scores in [0, 1] it means 'any "
            "refusal at all'; pass the cut your guard uses (e.g. --cut 0.5 for a refusal "
            "share)."
        )
    if args.direct_cut is not None and not math.isfinite(args.direct_cut):
        raise _BadInput(f"--cut must be a finite number; got {args.direct_cut}.")
    if args.labels is not None and not args.log:
        raise _BadInput(
            "--labels goes with a decision LOG; a scores CSV, the demo log and the simulated "
            "log carry their own labels."
        )
    if args.bundle_id is not None and not args.log:
        raise _BadInput(
            "--bundle-id goes with a decision LOG: the bundle of its decisions to read."
        )
    if args.journal is not None and not args.log:
        raise _BadInput("--journal goes with a decision LOG: the guard's journal of that log.")
    if args.period is not None and not (args.log or args.demo):
        raise _BadInput(
            "--period goes with a decision LOG (or --demo): it splits decisions by their time."
        )
    if args.n_boot < 1:
        raise _BadInput(f"--n-boot must be >= 1; got {args.n_boot}.")
    if args.seed < 0:
        raise _BadInput(f"--seed must be >= 0; got {args.seed}.")
    if args.previous is not None and not Path(args.previous).is_file():
        raise _BadInput(f"--previous {args.previous!r} is not a file; pass an earlier card.json.")
    if args.cues is not None and not Path(args.cues).is_dir():
        raise _BadInput(
            f"--cues {args.cues!r} is not a folder; pass the --out folder of `spotstop "
            "reliance`, `shift` or `select`."
        )


def run_card(args: argparse.Namespace) -> int:
    """Run ``spotstop card`` from parsed arguments; returns the exit status."""
    from spotstop.diagnostics._errors import DiagnosticsError

    try:
        _check_args(args)
        from spotstop.diagnostics._build import card_from_inputs

        card = card_from_inputs(
            log=(args.log[0] if len(args.log) == 1 else args.log) or None,
            scores=args.scores,
            demo=bool(args.demo),
            simulated=bool(args.simulated),
            labels=args.labels,
            journal=args.journal,
            bundle_id=args.bundle_id,
            previous=args.previous,
            cues=args.cues,
            direct_cut=args.direct_cut,
            out=args.out,
            n_boot=args.n_boot,
            seed=args.seed,
            progress=not args.quiet,
            group_by=args.group_by,
            period=args.period,
            drift_baseline=args.drift_baseline,
            **({} if args.ray is None else {"ray": args.ray or True}),
        )
    except (_BadInput, DiagnosticsError) as exc:
        print(f"spotstop card: {exc}", file=sys.stderr)
        return 2
    if card.settings.get("pending"):
        print(f"spotstop card: warning: {card.settings['pending']}", file=sys.stderr)
    for msg in card.settings.get("cut_warnings", ()):
        print(f"spotstop card: warning: {msg}", file=sys.stderr)
    if not args.quiet:
        if args.demo:
            from spotstop.diagnostics._build import DEMO_WHAT

            print(f"demo: {card.provenance['demo']['log']}, {DEMO_WHAT}.")
        print(card.summary())
        print(f"wrote {args.out}/card.{{json,md,html}}")
    return 0


def card_main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` as ``spotstop card`` would and run it; returns the exit status."""
    return run_card(_parser().parse_args(argv))
