"""Benchmark: how well a claim reader reads held-out claims (issue 26, item 6).

Run: ``python bench/claims.py [--reader lexicon|member:<folder>] [--lexicon YAML] [--results]``.

Reads ``tests/data/claims_eval.yaml`` — reassuring and alarming claims about a hazard's state
and neutral signage, written before the lexicon's grammar and never used to build it (its
header says how) — with the claim reader, and prints per cue:

* recall: the share of that cue's claims the reader flags for that cue;
* crossed: the share it flags for the other cue (a reassuring claim read as alarming);
* false flags: neutral signs flagged for any cue (the goal is none).

For the lexicon it also prints the same numbers with its phrases alone (the grammar off), so
the grammar's share of the recall shows, and on the test world's sign wording
(``export/world.py``, written by another engineer), when it can be imported. Every miss of the
held-out set is listed. ``--results`` writes the
tables into bench/RESULTS.md (section ``claims-reader``). A member reader on a random test
member (``spotstop tiny``) gives meaningless numbers: it runs the plumbing, not the reading.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spotstop.guard.validate import load_yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

EVAL = ROOT / "tests" / "data" / "claims_eval.yaml"
KINDS = ("reassuring", "alarming", "neutral")


def load_eval(path: Path = EVAL) -> dict[str, list[str]]:
    doc = load_yaml(path.read_text(encoding="utf-8"), source=str(path))
    return {k: [str(t) for t in doc[k]] for k in KINDS}


def evaluate(reader: Any, claims: dict[str, list[str]]) -> dict[str, object]:
    """Recall and crossed share per cue, false flags on neutral, and the misses."""
    out: dict[str, object] = {}
    for cue in ("reassuring", "alarming"):
        other = "alarming" if cue == "reassuring" else "reassuring"
        flags = [reader.flags(t) for t in claims[cue]]
        out[cue] = {
            "n": len(flags),
            "recall": sum(f[cue] for f in flags) / len(flags),
            "crossed": sum(f[other] for f in flags) / len(flags),
            "missed": [t for t, f in zip(claims[cue], flags, strict=True) if not f[cue]],
            "crossed_texts": [t for t, f in zip(claims[cue], flags, strict=True) if f[other]],
        }
    neutral = [(t, reader.flags(t)) for t in claims["neutral"]]
    out["neutral"] = {
        "n": len(neutral),
        "false_flags": [t for t, f in neutral if any(f.values())],
    }
    return out


def render(rows: Sequence[tuple[str, dict[str, object]]]) -> list[str]:
    lines = [
        f"{'reader':<34} {'reassuring recall':>18} {'alarming recall':>16} "
        f"{'crossed (r/a)':>14} {'false flags':>12}",
    ]
    for name, r in rows:
        re_, al, ne = r["reassuring"], r["alarming"], r["neutral"]
        lines.append(
            f"{name:<34} {re_['recall']:>11.3f} ({re_['n']:>2}) "  # type: ignore[index]
            f"{al['recall']:>9.3f} ({al['n']:>2}) "  # type: ignore[index]
            f"{re_['crossed']:>6.3f}/{al['crossed']:.3f} "  # type: ignore[index]
            f"{len(ne['false_flags']):>5} of {ne['n']:<3}"  # type: ignore[index]
        )
    return lines


def misses(name: str, r: dict[str, object]) -> list[str]:
    out = []
    for cue in ("reassuring", "alarming"):
        c = r[cue]
        out.append(f"{name}: {cue} claims missed: {c['missed']}")  # type: ignore[index]
        if c["crossed_texts"]:  # type: ignore[index]
            out.append(f"{name}: {cue} claims flagged for the other cue: {c['crossed_texts']}")  # type: ignore[index]
    out.append(f"{name}: neutral signs flagged: {r['neutral']['false_flags']}")  # type: ignore[index]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reader", default="lexicon", help="claim reader name (default lexicon)")
    ap.add_argument("--lexicon", default=None, help="lexicon YAML (default: the packaged one)")
    ap.add_argument("--margin", type=float, default=None, help="a member reader's margin")
    ap.add_argument("--eval", type=Path, default=EVAL, help="the claims (default: tests/data)")
    ap.add_argument("--results", action="store_true", help="write bench/RESULTS.md's section")
    args = ap.parse_args(argv)

    from spotstop.guard.cues import ClaimLexicon, claim_reader

    claims = load_eval(args.eval)
    kw = {} if args.margin is None else {"margin": args.margin}
    reader = claim_reader(args.reader, lexicon=args.lexicon, **kw)
    rows = [
        (
            reader.name if args.lexicon is None else f"lexicon {args.lexicon}",
            evaluate(reader, claims),
        )
    ]
    if isinstance(reader, ClaimLexicon) and reader.grammar is not None:
        phrases_only = dataclasses.replace(reader, grammar=None)
        rows.append(("lexicon, phrases only (no grammar)", evaluate(phrases_only, claims)))
    try:  # the test world's sign wording (export/world.py), written by another hand
        from spotstop.export.world import SIGN_TEXTS

        world = {k: list(SIGN_TEXTS[k]) for k in KINDS}
        rows.append((f"{rows[0][0]}, world sign texts", evaluate(reader, world)))
    except ImportError:
        pass
    table = render(rows)
    detail = [line for name, r in rows[:1] for line in misses(name, r)]
    print(f"{reader!r}\n")
    print("\n".join(table))
    print()
    print("\n".join(detail))
    if args.results:
        cmd = " ".join(["python bench/claims.py", *(argv if argv is not None else sys.argv[1:])])
        text = (
            "### Claim reader on held-out claims (`bench/claims.py`, issue 26 item 6)\n\n"
            f"`{cmd}` on {_dt.date.today()}, Python {platform.python_version()}; claims: "
            f"`{args.eval.relative_to(ROOT) if args.eval.is_relative_to(ROOT) else args.eval}` "
            "(written before the grammar, never used to build it; its header says how). "
            "Recall: share of a cue's claims flagged for that cue; crossed: flagged for the "
            "other cue; false flags: neutral signs flagged for any cue. Caveat: one engineer "
            "wrote the claims and then the grammar in the same session, so the held-out "
            "recall is an upper estimate; the world's sign texts (another author) are few; "
            "a claim set written by someone else is the test that counts.\n\n"
            "```\n" + "\n".join(table) + "\n\n" + "\n".join(detail) + "\n```"
        )
        write_section(ROOT / "bench" / "RESULTS.md", "claims-reader", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
