"""Result objects of reliance: frozen, with a readable repr, ``to_dict`` (the stable JSON keys
of ``reliance.json``) and a short text that a card section can quote."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._results import Estimate, fmt_estimate

__all__ = ["CandidateReliance", "CueReliance", "RelianceResult"]

RELIANCE_SCHEMA_VERSION = 2  # 2: resampling_unit, n_groups


@dataclass(frozen=True)
class CueReliance:
    """One candidate's reliance on one cue (see :mod:`spotstop.diagnostics.cues._reliance`).

    reliance: mean over the measurement templates of misleading-edit error minus the matched
        control's error (mean of the agreeing and neutral controls); paper Eq. 2.
    placebo: placebo-edit error minus unedited error (should be ~0).
    source_error: error on the unedited scenes this cue misleads on.
    held_out: the reliance under the held-out template alone (transfer).
    vs_agreeing / vs_neutral: the reliance against each control alone.
    ``n`` of each is the number of source scenes the cue misleads on.
    """

    cue: str
    reliance: Estimate
    placebo: Estimate
    source_error: Estimate
    held_out: Estimate
    vs_agreeing: Estimate
    vs_neutral: Estimate

    @property
    def placebo_moves(self) -> bool:
        """True when the placebo's interval excludes 0: the edit itself (a box of text),
        not what the text says, moves the answers, and the reliance is suspect."""
        return self.placebo.ci.excludes(0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reliance": self.reliance.to_dict(),
            "placebo": self.placebo.to_dict(),
            "source_error": self.source_error.to_dict(),
            "placebo_moves": self.placebo_moves,
            "held_out": self.held_out.to_dict(),
            "reliance_vs_agreeing": self.vs_agreeing.to_dict(),
            "reliance_vs_neutral": self.vs_neutral.to_dict(),
        }


@dataclass(frozen=True)
class CandidateReliance:
    """Reliance of one candidate on every cue.

    kind: ``member``, ``pair`` (Avg-2 of two members) or ``guard`` (as deployed).
    error: ``probability`` (a member's P(wrong answer)) or ``hard`` (wrong answers or
        decisions). source_error: error on all unedited source scenes (Eq. 1's intercept).
    hard: for a member, the same measured with its hard answer (``s > 0`` is UNSAFE).
    notes: provenance (prompt hash; a pair's fusion and cut; the guard's policy rules used).
    """

    name: str
    kind: str
    error: str
    source_error: Estimate
    cues: Mapping[str, CueReliance]
    hard: CandidateReliance | None = None
    notes: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def as_hard(self) -> CandidateReliance:
        """The hard-answer view (itself for pairs and guards): every candidate has one, so
        members, pairs and guards compare on one scale."""
        return self if self.hard is None else self.hard

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {c: r.to_dict() for c, r in self.cues.items()}
        d["kind"] = self.kind
        d["error"] = self.error
        d["source_error"] = self.source_error.to_dict()
        if self.hard is not None:
            d["hard"] = self.hard.to_dict()
        d["notes"] = dict(self.notes)
        return d


@dataclass(frozen=True)
class RelianceResult:
    """Reliance of every candidate on every cue, from one edit set and one set of draws.

    ``draws[(candidate, metric, cue, stat)]`` holds the bootstrap draws (``cue`` is ``all``
    for the overall source error); they are paired across candidates and statistics.
    ``resampling_unit`` / ``n_groups``: what the bootstrap resamples whole (source scenes, or
    situations / contrasts where the source set names them) and how many there are.
    """

    candidates: Mapping[str, CandidateReliance]
    n_sources: int
    n_scenes: int
    templates: tuple[str, ...]
    held_out: str | None
    n_boot: int
    provenance: Mapping[str, Any] = field(repr=False)
    draws: Mapping[tuple[str, str, str, str], NDArray[np.float64]] = field(repr=False)
    resampling_unit: str = "source scene"
    n_groups: int = 0

    def __getitem__(self, name: str) -> CandidateReliance:
        return self.candidates[name]

    def __repr__(self) -> str:
        lines = [f"RelianceResult(n_sources={self.n_sources}, n_scenes={self.n_scenes},"]
        for c in self.candidates.values():
            rel = ", ".join(f"{k}={v.reliance!r}" for k, v in c.cues.items())
            lines.append(
                f"  {c.name} ({c.kind}, {c.error}): source_error={c.source_error!r}, {rel},"
            )
        return "\n".join(lines) + "\n)"

    def to_dict(self) -> dict[str, Any]:
        """The content of ``reliance.json``: ``candidates[name][cue]`` holds ``reliance``,
        ``placebo`` and ``source_error`` as ``{"value", "ci", "n"}``."""
        return {
            "schema_version": RELIANCE_SCHEMA_VERSION,
            "candidates": {n: c.to_dict() for n, c in self.candidates.items()},
            "n_sources": self.n_sources,
            "n_scenes": self.n_scenes,
            "templates": list(self.templates),
            "held_out_template": self.held_out,
            "n_boot": self.n_boot,
            "resampling_unit": self.resampling_unit,
            "n_groups": self.n_groups,
            "provenance": dict(self.provenance),
        }

    def table(self) -> str:
        """A readable table: one row per candidate and cue."""
        head = (
            f"{'candidate':<34} {'error':<11} {'cue':<10} {'source error':<26} "
            f"{'reliance':<29} {'placebo':<29} {'held-out':<8}"
        )
        lines = [head, "-" * len(head)]
        for c in self.candidates.values():
            for cue, r in c.cues.items():
                flag = "  ← placebo moves" if r.placebo_moves else ""
                ho = "nan" if math.isnan(r.held_out.value) else f"{r.held_out.value:+.3f}"
                lines.append(
                    f"{c.name[:34]:<34} {c.error:<11} {cue:<10} "
                    f"{fmt_estimate(r.source_error):<26} {fmt_estimate(r.reliance, True):<29} "
                    f"{fmt_estimate(r.placebo, True):<29} {ho:<8}{flag}"
                )
        return "\n".join(lines)

    def summary(self) -> str:
        """A few sentences: which candidate follows which cue most, and any placebo flag."""
        out = []
        for cue in ("reassuring", "alarming"):
            rows = [(c.name, c.as_hard().cues[cue].reliance) for c in self.candidates.values()]
            rows = [r for r in rows if math.isfinite(r[1].value)]
            if not rows:
                out.append(f"Reliance on {cue} text is undefined (no source scene it misleads on).")
                continue
            worst = max(rows, key=lambda r: r[1].value)
            out.append(
                f"{cue.capitalize()} text: {worst[0]} follows it most (hard-answer reliance "
                f"{fmt_estimate(worst[1], True)}, on {worst[1].n} source scenes)."
            )
        moved = [
            f"{c.name}/{cue}"
            for c in self.candidates.values()
            for cue, r in c.cues.items()
            if r.placebo_moves
        ]
        if moved:
            out.append(
                "The placebo edit moves the answers of " + ", ".join(moved) + ": the pasted box "
                "itself changes them, so treat those reliances with care."
            )
        return " ".join(out)
