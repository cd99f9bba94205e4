"""Claim readers by name: the lexicon, or a text-only pass of a guard member over the OCR text.

``claim_reader("lexicon")`` is the claim lexicon (phrases + grammar; the default).
``claim_reader("member:<name>")`` asks a member — a member of the guard's bundle by its name,
or a member folder by its path — whether the text read in the scene claims safety or danger,
with no image: the request-only (``text``) pass the guard already runs for diagnostics. The
member's score ``s = log p(UNSAFE) − log p(SAFE)`` of the question "the sign here reads
<text>" is compared with its mean score on a few neutral signs (the baseline, measured once):

* ``s − baseline > margin`` → the text claims danger (``alarming``);
* ``s − baseline < −margin`` → the text claims safety (``reassuring``).

Like the lexicon's, its flags are imperfect, and the cue analysis corrects the flagged share
with the reader's sensitivity and false-positive rate on the calibration set (seed 002,
Sec. 3.4): ``spotstop shift`` reads the calibration set with the same reader.

A model reader fails loud, never silently: a non-finite score raises
:class:`~spotstop.guard.cues.TextDetectionError` (the guard fails that scene closed), and a
reader that flags none of a few plain probe claims ("DANGER", "SAFE", …) when it is built is
refused (:class:`ClaimReaderError`): it would flag nothing. A random test member (``spotstop
tiny``) gives meaningless answers: it tests the plumbing, not the reading.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from spotstop.guard._errors import ConfigError
from spotstop.guard._types import Scene
from spotstop.guard.cues._lexicon import ClaimLexicon, load_lexicon
from spotstop.guard.cues._types import CUES, ClaimReader, Cue, CueMatch, TextDetectionError
from spotstop.guard.validate import is_real

__all__ = [
    "LEXICON_READER",
    "READER_KINDS",
    "ClaimReaderError",
    "MemberClaimReader",
    "claim_reader",
    "parse_reader_name",
]

logger = logging.getLogger("spotstop.guard.cues")

LEXICON_READER: Final[str] = "lexicon"
READER_KINDS: Final[tuple[str, ...]] = ("lexicon", "member:<name or folder>")

#: The question a member reader answers, with ``{text}`` the OCR text (quotes normalised).
QUESTION: Final[str] = 'The sign here reads "{text}".'
#: Neutral signs: the member's mean score on them is its baseline (no claim).
NEUTRAL_REFERENCES: Final[tuple[str, ...]] = ("ROOM 4", "AISLE 7", "BAY 12", "Shelf 3", "EXIT")
#: Plain claims of each cue; a reader that flags none of them is refused.
PROBES: Final[Mapping[Cue, tuple[str, ...]]] = {
    "reassuring": ("SAFE", "ALL CLEAR", "SAFE TO USE"),
    "alarming": ("DANGER", "HIGH VOLTAGE", "DO NOT TOUCH"),
}
DEFAULT_MARGIN: Final[float] = 1.0


class ClaimReaderError(TextDetectionError, ConfigError):
    """A claim reader cannot be built or would flag nothing; the message says what to do."""


class _TextScorer(Protocol):
    """What a member reader needs of a member: its name, prompt hash and request-only scores
    (:class:`spotstop.guard.Member` has them)."""

    @property
    def name(self) -> str: ...

    prompt_hash: str

    def score(self, scenes: Sequence[Scene], variant: Any = ..., *, strict: bool = ...) -> Any: ...


def parse_reader_name(name: object, *, where: str = "claim reader") -> tuple[str, str]:
    """``("lexicon", "")`` or ``("member", <name or folder>)`` from a reader name; raises
    :class:`ConfigError` naming the forms it accepts."""
    if isinstance(name, str):
        if name.strip() == LEXICON_READER:
            return LEXICON_READER, ""
        kind, sep, arg = name.partition(":")
        if kind.strip() == "member" and sep and arg.strip():
            return "member", arg.strip()
    raise ConfigError(
        f"{where} must be one of {', '.join(repr(k) for k in READER_KINDS)} (e.g. "
        f"'member:qwen' for the bundle's member qwen, or 'member:/path/to/member'); got {name!r}."
    )


class MemberClaimReader:
    """A text-only pass of a member over the OCR text (see the module docstring).

    member: a loaded member (:class:`spotstop.guard.Member`, or anything with ``name``,
        ``prompt_hash`` and ``score(scenes, variant="text")``). It may be the guard's own
        member: a :class:`~spotstop.guard.Member` enters its backend once at a time, so the
        reader's pass and the guard's scoring pass wait for each other.
    margin: how far (in score units, nats) from the neutral baseline a text must move the
        member's score to be flagged.
    check: score the probe claims now and refuse a reader that flags none of them (default).
    """

    def __init__(
        self, member: _TextScorer, *, margin: float = DEFAULT_MARGIN, check: bool = True
    ) -> None:
        if not is_real(margin) or not math.isfinite(margin) or margin < 0:
            raise ConfigError(
                f"margin must be a finite number >= 0 (score units from the neutral baseline); "
                f"got {margin!r}. {DEFAULT_MARGIN} is the default."
            )
        self.member = member
        self.margin = float(margin)
        self._lock = threading.Lock()
        refs = self._scores(NEUTRAL_REFERENCES)
        self.baseline = float(sum(refs) / len(refs))
        if check:
            self._check_probes()

    @property
    def name(self) -> str:
        return f"member:{self.member.name}"

    @property
    def sha256(self) -> str:
        """Digest of the member's name and prompt hash, the question, the references, the
        baseline and the margin: what decides the reader's flags."""
        doc = {
            "member": self.member.name,
            "prompt_hash": self.member.prompt_hash,
            "question": QUESTION,
            "references": list(NEUTRAL_REFERENCES),
            "baseline": round(self.baseline, 6),
            "margin": self.margin,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def __repr__(self) -> str:
        return (
            f"MemberClaimReader({self.name}, margin={self.margin:g}, baseline="
            f"{self.baseline:+.3f}, sha256={self.sha256[:12]}…)"
        )

    # -- scoring ---------------------------------------------------------------------------
    def _scores(self, texts: Sequence[str]) -> list[float]:
        scenes = [Scene(None, QUESTION.format(text=_quoted(t))) for t in texts]
        try:
            with self._lock:
                got = self.member.score(scenes, "text", strict=False)
        except Exception as e:  # a failing model is a failed reading, never "no claim"
            raise TextDetectionError(
                f"claim reader {self.name} could not score the text ({type(e).__name__}: {e}); "
                "the scene's claims are unknown."
            ) from e
        scores = [float(m.score) for m in got]
        if len(scores) != len(texts) or not all(math.isfinite(s) for s in scores):
            raise TextDetectionError(
                f"claim reader {self.name} returned {scores} for {len(texts)} text(s); a "
                "non-finite or missing score means the claims are unknown."
            )
        return scores

    def deltas(self, texts: Sequence[str]) -> list[float]:
        """Each text's score minus the neutral baseline (positive: toward danger)."""
        return [s - self.baseline for s in self._scores(texts)]

    def _cue(self, delta: float) -> Cue | None:
        if delta > self.margin:
            return "alarming"
        if delta < -self.margin:
            return "reassuring"
        return None

    def find(self, text: str) -> tuple[CueMatch, ...]:
        """One claim for the whole text when its score leaves the margin, else none. Empty
        text claims nothing (no model call)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}.")
        if not text.strip():
            return ()
        delta = self.deltas([text])[0]
        cue = self._cue(delta)
        if cue is None:
            return ()
        return (CueMatch(cue=cue, phrase=f"{self.name} Δ={delta:+.2f}", found=text),)

    def flags(self, text: str) -> dict[Cue, bool]:
        found = {m.cue for m in self.find(text)}
        return {cue: cue in found for cue in CUES}

    def _check_probes(self) -> None:
        texts = [t for cue in CUES for t in PROBES[cue]]
        cues = [self._cue(d) for d in self.deltas(texts)]
        if not any(cues):
            raise ClaimReaderError(
                f"claim reader {self.name} flags none of the probe claims "
                f"{texts} (its scores stay within ±{self.margin:g} of its neutral baseline "
                f"{self.baseline:+.3f}), so it would flag nothing. Lower the margin, or use "
                "another member or the lexicon."
            )
        k = 0
        for cue in CUES:
            got = cues[k : k + len(PROBES[cue])]
            k += len(PROBES[cue])
            if cue not in got:
                msg = (
                    f"claim reader {self.name} flags none of the plain {cue} probes "
                    f"{list(PROBES[cue])} as {cue} (got {got}); its {cue} flags are likely "
                    "uninformative. Its sensitivity on the calibration set will show it."
                )
                logger.warning(msg)
                warnings.warn(msg, UserWarning, stacklevel=3)


def _quoted(text: str) -> str:
    return " ".join(text.replace('"', "'").split())


def reader_member_problem(arg: str, members: Sequence[str] | None) -> str | None:
    """Why ``member:<arg>`` names no member :func:`claim_reader` can load (None: it names one):
    a member of ``members`` (the guard's, by name), else a member folder."""
    if (members is not None and arg in members) or Path(arg).is_dir():
        return None
    known = sorted(members) if members else []
    return (
        f"claim reader 'member:{arg}': no member named {arg!r}"
        + (f" (the guard's members: {known})" if members is not None else "")
        + f" and no member folder at {arg}. Name a member of the bundle or a folder."
    )


def claim_reader(
    name: str | None = None,
    *,
    lexicon: ClaimLexicon | str | os.PathLike[str] | None = None,
    members: Mapping[str, Any] | None = None,
    margin: float = DEFAULT_MARGIN,
    device: str = "cpu",
    threads: int | None = None,
) -> ClaimReader:
    """The claim reader called ``name`` (None: ``lexicon``).

    lexicon: the lexicon for ``lexicon`` (a :class:`ClaimLexicon`, a YAML path, or None for
        the packaged one). members: loaded members by name (a guard's), looked up first for
        ``member:<name>``; otherwise ``<name>`` is a member folder loaded with the torch
        backend (``spotstop[export]``) on ``device``.
    """
    kind, arg = parse_reader_name(LEXICON_READER if name is None else name)
    if kind == LEXICON_READER:
        return lexicon if isinstance(lexicon, ClaimLexicon) else load_lexicon(lexicon)
    if members is not None and arg in members:
        return MemberClaimReader(members[arg], margin=margin)
    problem = reader_member_problem(arg, None if members is None else list(members))
    if problem is not None:
        raise ClaimReaderError(problem)
    from spotstop.guard._member import load_member

    return MemberClaimReader(load_member(arg, device=device, threads=threads), margin=margin)
