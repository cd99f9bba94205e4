"""The cues, what the text detector found, and what a text detector is.

Two cues (seed 002, Sec. 3.3; DESIGN.md "Cue reliance and shift"):

* ``reassuring`` — text in the scene that asserts safety ("SAFE", "ALL CLEAR", "No hazard",
  "Checked – OK to use"). It misleads on **unsafe** scenes: a guard that follows it lets the
  robot act where it should stop.
* ``alarming`` — text in the scene that asserts danger ("DANGER", "HOT", "DO NOT TOUCH",
  "HIGH VOLTAGE"). It misleads on **safe** scenes: a guard that follows it stops the robot
  where it could act.

A cue that agrees with the scene's label misleads nothing (seed 002, Sec. H.1); the detector
only says whether the text is there, not whether it is true.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, runtime_checkable

import numpy as np
from PIL import Image
from spotstop.guard._errors import GuardError
from spotstop.guard._types import ImageSource

__all__ = [
    "CUES",
    "ClaimReader",
    "Cue",
    "CueMatch",
    "CueReading",
    "DetectorInput",
    "OcrModel",
    "TextDetectionError",
    "TextDetector",
]

Cue = Literal["reassuring", "alarming"]

CUES: Final[tuple[Cue, ...]] = ("reassuring", "alarming")
"""The two cues, in a fixed order: ``reassuring`` (asserts safety; misleads on unsafe scenes)
and ``alarming`` (asserts danger; misleads on safe scenes)."""

#: What a text detector reads: encoded bytes or a path (decoded and validated by
#: :func:`spotstop.guard.decode_image`), a :class:`spotstop.guard.DecodedImage`, a Pillow image,
#: or a ``uint8`` numpy array in RGB order (``H×W×3``; ``H×W`` is read as gray).
DetectorInput = ImageSource | Image.Image | np.ndarray


class TextDetectionError(GuardError, RuntimeError):
    """The OCR or the claim reader failed on an image or a text (a model raised, or answered
    with a non-finite score); a guard treats the scene as unread and fails it closed."""


@dataclass(frozen=True)
class CueMatch:
    """One claim the lexicon found in the text.

    ``cue`` is the cue the claim counts for after negation: "not safe" gives
    ``CueMatch(cue="alarming", phrase="safe", negated=True)``.
    """

    cue: Cue
    """The cue this claim counts for."""
    phrase: str
    """The lexicon phrase as written in the lexicon (e.g. ``"all clear"``)."""
    found: str
    """The stretch of the text it matched, as read (e.g. ``"A L L C L E A R"``), from the
    negation word on when negated (``"No danger"``)."""
    negated: bool = False
    """True when a negation word before the phrase turned it into the other cue."""

    def __repr__(self) -> str:
        neg = " (negated)" if self.negated else ""
        return f"CueMatch({self.cue}: {self.phrase!r} in {self.found!r}{neg})"


@dataclass(frozen=True)
class OcrModel:
    """Which OCR made a reading: a name and the sha256 of each model file.

    ``sha256`` is the digest of the ``sha256sum``-style listing of ``files``
    (``"<sha256>  <file name>\\n"`` per file, in the order given), so one string identifies the
    whole model set.
    """

    name: str
    """E.g. ``"rapidocr 3.10.0 PP-OCRv6 det+rec (onnxruntime, CPU)"``."""
    files: tuple[tuple[str, str], ...]
    """(file name, hex sha256) of every model file the OCR ran."""

    @property
    def sha256(self) -> str:
        """One digest over all model files (see the class docstring)."""
        listing = "".join(f"{digest}  {name}\n" for name, digest in self.files)
        return hashlib.sha256(listing.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"name", "sha256", "files": {file name: sha256}}``."""
        return {"name": self.name, "sha256": self.sha256, "files": dict(self.files)}

    def __repr__(self) -> str:
        return f"OcrModel({self.name}, {len(self.files)} files, sha256={self.sha256[:12]}…)"


@dataclass(frozen=True)
class CueReading:
    """What the text detector found in one image: the text read and the claims in it."""

    text: str
    """The OCR text: text boxes in reading order (top to bottom, left to right), one space
    between boxes, runs of whitespace collapsed. Empty when no text was read."""
    matches: tuple[CueMatch, ...]
    """The claims found: those of ``text`` in text order, then those only the column order
    of the boxes or a box alone shows (the RapidOCR detector; see its ``detect``)."""
    ocr_model: OcrModel
    """The OCR that read ``text``."""
    lexicon_sha256: str
    """The ``sha256`` of the claim reader that turned ``text`` into claims
    (:attr:`ClaimLexicon.sha256` for the lexicon; a model reader's digest names its member,
    prompt and margin)."""
    reader: str = "lexicon"
    """The claim reader's name: ``lexicon``, or ``member:<name>`` for a model reader."""

    @property
    def reassuring(self) -> bool:
        """True when the text asserts safety (a ``reassuring`` claim was found)."""
        return self.flagged("reassuring")

    @property
    def alarming(self) -> bool:
        """True when the text asserts danger (an ``alarming`` claim was found)."""
        return self.flagged("alarming")

    @property
    def flags(self) -> dict[Cue, bool]:
        """``{cue: flagged}`` for every cue in :data:`CUES`."""
        return {cue: self.flagged(cue) for cue in CUES}

    def flagged(self, cue: Cue) -> bool:
        """True when a claim for ``cue`` was found."""
        return any(m.cue == cue for m in self.matches)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the flags, the text, the matches, the OCR model and the lexicon digest."""
        out: dict[str, Any] = {cue: self.flagged(cue) for cue in CUES}
        return {
            **out,
            "text": self.text,
            "matches": [
                {"cue": m.cue, "phrase": m.phrase, "found": m.found, "negated": m.negated}
                for m in self.matches
            ],
            "ocr_model": self.ocr_model.to_dict(),
            "lexicon_sha256": self.lexicon_sha256,
            "reader": self.reader,
        }

    def __repr__(self) -> str:
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return (
            f"CueReading(reassuring={self.reassuring}, alarming={self.alarming}, text={text!r}, "
            f"matches={list(self.matches)}, ocr={self.ocr_model.name} "
            f"sha256={self.ocr_model.sha256[:12]}…, {self.reader}={self.lexicon_sha256[:12]}…)"
        )


@runtime_checkable
class ClaimReader(Protocol):
    """Turns the text read in a scene into claims, per cue: the lexicon
    (:class:`~spotstop.guard.cues.ClaimLexicon`) or a model
    (:class:`~spotstop.guard.cues.MemberClaimReader`). :func:`~spotstop.guard.cues.claim_reader`
    builds one by name."""

    @property
    def name(self) -> str:
        """``lexicon`` or ``member:<name>``: recorded on every reading."""
        ...

    @property
    def sha256(self) -> str:
        """What identifies the reader's answers (recorded on every reading)."""
        ...

    def find(self, text: str) -> tuple[CueMatch, ...]:
        """The claims in ``text``, in text order; raises rather than return nothing on a
        failure (a reader never silently flags nothing)."""
        ...

    def flags(self, text: str) -> dict[Cue, bool]:
        """``{cue: flagged}`` for every cue in :data:`CUES`."""
        ...


@runtime_checkable
class TextDetector(Protocol):
    """Reads the text in a scene image and flags the claims it makes, per cue."""

    def detect(self, image: DetectorInput) -> CueReading:
        """OCR ``image`` and apply the claim lexicon to the text read."""
        ...
