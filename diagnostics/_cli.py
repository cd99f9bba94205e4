"""``spotstop card``: write the deployment card from a decision log, a scores CSV or a demo.

``spotstop card LOG [--labels F]`` reads the guard's decision log (see
:mod:`spotstop.diagnostics._from_log`); the CLI entry point calls :func:`card_main`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from spotstop.diagnostics._errors import DiagnosticsError

__all__ = ["card_main"]

_EPILOG = """\
Exactly one input: LOG (the guard's decision-log SQLite file), --scores CSV or --demo.
From LOG the cases are the labelled decisions that did not fail closed and have a finite
fused score (the others are counted in the card's provenance). Labels come from the log's
labels table, or from --labels F (CSV or JSONL keyed by decision_id or image_sha256, with
columns label [safe/unsafe or 0/1], optional contrast_id and situation_id), which override
the table's. With LOG the policy cut defaults to the median logged threshold.

The scores CSV needs the columns case_id,label,score,contrast_id,situation_id
(label: safe/unsafe or 0/1; contrast_id and situation_id may be empty). Optional columns:
score_<member>, score_gray, score_text, width, height, bytes, jpeg_quality, format, request.

Writes OUT/card.json (every number as {"value","ci":[low,high],"n"}), OUT/card.md and a
self-contained OUT/card.html.

examples:
  spotstop card decisions.sqlite --labels labels.csv --out card/
  spotstop card --demo --out card/ --n-boot 2000
  spotstop card --scores scores.csv --out card/ --seed 7
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spotstop card",
        description="Write a deployment card: what the guard's label measures on these cases "
        "(Spot-Stop decomposition with group-bootstrap intervals, prevalence, situation share, "
        "scene-blind readers, conformal audit).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", nargs="?", metavar="LOG", help="the guard's decision log (SQLite)")
    p.add_argument("--labels", metavar="F",
                   help="labels file (CSV or JSONL) for LOG; overrides the log's labels")  # fmt: skip
    p.add_argument("--scores", metavar="CSV", help="scores CSV (see below)")
    p.add_argument("--demo", action="store_true", help="use a simulated log of 600 contrasts")
    p.add_argument("--out", metavar="DIR", required=True, help="output folder (created if needed)")
    p.add_argument("--n-boot", type=int, default=10_000, metavar="N",
                   help="group-bootstrap draws (default: 10000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    p.add_argument("--policy-cut", type=float, default=None, metavar="T",
                   help="direct cut: score > T is UNSAFE (default: the median logged "
                   "threshold with LOG, else 0)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    return p


def card_main(argv: list[str] | None = None) -> int:
    """Run ``spotstop card``; returns the exit status (0 ok, 2 bad input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    n_src = (args.log is not None) + (args.scores is not None) + bool(args.demo)
    if n_src != 1:
        parser.error("give exactly one input: LOG, --scores CSV or --demo.")
    if args.labels is not None and args.log is None:
        parser.error("--labels goes with a decision LOG; a scores CSV carries its own labels.")
    import numpy as np
    from spotstop.diagnostics._card import write_card
    from spotstop.diagnostics._data import read_scores_csv
    from spotstop.diagnostics._from_log import log_cases
    from spotstop.diagnostics._simulate import simulate_log

    if args.n_boot < 1:
        print(f"spotstop card: --n-boot must be >= 1; got {args.n_boot}.", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    policy_cut = 0.0 if args.policy_cut is None else args.policy_cut
    cut_source = "default 0" if args.policy_cut is None else "--policy-cut"
    extra: dict[str, Any] = {}
    try:
        if args.demo:
            table = simulate_log(600, rng=rng, size_leak=0.3)
            source = "demo: simulate_log(600, size_leak=0.3)"
        elif args.log is not None:
            cases = log_cases(args.log, labels=args.labels)
            table, source = cases.table, f"decision log: {args.log}"
            extra["log"] = cases.provenance
            median = cases.provenance["thresholds"]["median"]
            if args.policy_cut is None and median is not None:
                policy_cut = float(median)
                cut_source = "median logged threshold"
            elif args.policy_cut is None:
                cut_source = "default 0 (no finite threshold logged)"
        else:
            table = read_scores_csv(args.scores)
            source = args.scores
        card = write_card(
            table,
            args.out,
            policy_cut=policy_cut,
            n_boot=args.n_boot,
            rng=rng,
            provenance={
                "source": source,
                "seed": args.seed,
                "policy_cut": policy_cut,
                "policy_cut_source": cut_source,
                **extra,
            },
            progress=not args.quiet,
        )
    except DiagnosticsError as exc:
        print(f"spotstop card: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        f = card.fields
        print(
            f"wrote {args.out}/card.{{json,md,html}}: R − A = {100 * f['R_minus_A'].value:.1f} "
            f"points (threshold {100 * f['threshold_part'].value:.1f}, overlap "
            f"{100 * f['overlap_part'].value:.1f}, within {100 * f['within_part'].value:.1f})"
        )
    return 0
