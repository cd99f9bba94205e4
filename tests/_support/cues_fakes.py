"""Test doubles for the cue tests (clearly doubles: none of them is a model or an OCR).

* :class:`RecordedTextDetector`: a text detector on the guard's ``TextDetector`` protocol
  that "reads" the text an edit recorded for the image's sha256 (a perfect OCR for images it
  was told about; anything else reads as no text) and flags it with the guard's claim
  lexicon, returning a real :class:`spotstop.guard.cues.CueReading`.
* :class:`TextDrivenMember`: a scorer on the member protocol whose score is a known base
  score of the scene it shows plus a known push from the text its detector reads:
  ``s = base + alarming_push · [alarming] − reassuring_push · [reassuring]``. With pushes
  of 0 it ignores text (the text-blind control).

The tests at the bottom check the doubles themselves.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from spotstop.diagnostics.cues import (
    EditSet,
    MemberTiming,
    ScoreTable,
    plan_edits,
    read_source_set,
)
from spotstop.guard import MemberScore, Scene
from spotstop.guard.cues import CueReading, OcrModel, default_lexicon

from tests._support.images import make_image_bytes

LEXICON = default_lexicon()
RECORDED = OcrModel("recorded text (test double, not an OCR)", ())


def lexicon_flags(text: str) -> dict[str, bool]:
    """The guard's default lexicon's flags for ``text``."""
    return dict(LEXICON.flags(text))


class RecordedTextDetector:
    """Reads the text recorded for an image's sha256 (see the module docstring)."""

    def __init__(self, texts: Mapping[str, str] | None = None) -> None:
        self.texts: dict[str, str] = dict(texts or {})
        self.calls = 0

    def register(self, image: bytes, text: str) -> None:
        self.texts[hashlib.sha256(image).hexdigest()] = text

    def detect(self, image: bytes) -> CueReading:
        self.calls += 1
        text = self.texts.get(hashlib.sha256(bytes(image)).hexdigest(), "")
        return CueReading(text, LEXICON.find(text), RECORDED, LEXICON.sha256)


class TextDrivenMember:
    """A scorer whose score is a known base plus a known push from the text it reads."""

    def __init__(
        self,
        name: str,
        detector: RecordedTextDetector,
        base: Mapping[str, float],
        *,
        reassuring_push: float = 0.0,
        alarming_push: float = 0.0,
        any_text_push: float = 0.0,
        pixel_noise: float = 0.0,
    ) -> None:
        self._name = name
        self.detector = detector
        self.base = dict(base)  # image sha256 -> base score of the scene it shows
        self.reassuring_push = reassuring_push
        self.alarming_push = alarming_push
        self.any_text_push = any_text_push  # reacts to a box of text, whatever it says
        self.pixel_noise = pixel_noise  # a fixed jitter per image (sensitive to pixels only)

    @property
    def name(self) -> str:
        return self._name

    @property
    def prompt_hash(self) -> str:
        return f"double-{self.reassuring_push:g}-{self.alarming_push:g}-{self.any_text_push:g}"

    def score(
        self, scenes: Sequence[Scene], variant: str = "scene", *, strict: bool = True
    ) -> list[MemberScore]:
        out = []
        for s in scenes:
            img = bytes(s.image)  # type: ignore[arg-type]
            reading = self.detector.detect(img)
            flags = reading.flags
            v = self.base[hashlib.sha256(img).hexdigest()]
            v += self.alarming_push * flags["alarming"] - self.reassuring_push * flags["reassuring"]
            v += self.any_text_push * bool(reading.text)
            if self.pixel_noise:
                seed = int.from_bytes(hashlib.sha256(img).digest()[:8], "little")
                v += self.pixel_noise * float(np.random.default_rng(seed).standard_normal())
            out.append(MemberScore(self.name, "scene", float(v), self.prompt_hash, 0, True))
        return out


def png(seed: int, size: tuple[int, int] = (96, 64)) -> bytes:
    """A small made-up scene as a PNG (width, height = size)."""
    return make_image_bytes(seed, size=size, fmt="PNG")


def write_source(root: Path, labels: Sequence[str], *, situation: bool = False) -> Path:
    """A source folder: ``img<i>.png`` + ``source.csv`` with the given labels."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "source.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["image", "request", "label"] + (["situation_id"] if situation else []))
        for i, lab in enumerate(labels):
            (root / f"img{i}.png").write_bytes(png(i))
            w.writerow([f"img{i}.png", f"request {i}", lab] + ([f"s{i % 3}"] if situation else []))
    return root / "source.csv"


def rendered_doubles(
    edits: EditSet, base_of_group: Sequence[float]
) -> tuple[RecordedTextDetector, dict[str, float]]:
    """Render every scene once: the detector learns each image's text, and each image's base
    score is its source scene's."""
    det = RecordedTextDetector()
    base: dict[str, float] = {}
    for r, img in edits.images():
        det.register(img, r.text)
        base[hashlib.sha256(img).hexdigest()] = float(base_of_group[r.group])
    return det, base


def make_edits(root: Path, n_unsafe: int, n_safe: int, seed: int = 0) -> EditSet:
    """The planned edit set of a generated source set (UNSAFE scenes first)."""
    labels = ["UNSAFE"] * n_unsafe + ["SAFE"] * n_safe
    return plan_edits(read_source_set(write_source(root / "src", labels)), seed=seed)


def score_table(edits: EditSet, scores: Mapping[str, np.ndarray]) -> ScoreTable:
    """A score table from given scores (no member runs)."""
    return ScoreTable(
        edits=edits,
        scores=dict(scores),
        prompt_hashes=dict.fromkeys(scores, "h"),
        timings={m: MemberTiming(len(edits), 1.0, False) for m in scores},
    )


def text_scores(edits: EditSet, base: Sequence[float], push_r: float, push_a: float) -> np.ndarray:
    """The text-driven double's scores computed from the records (no pixels): what the
    recorded-text detector would read, through the same lexicon."""
    out = np.empty(len(edits))
    for r in edits.records:
        f = lexicon_flags(r.text)
        out[r.index] = base[r.group] - push_r * f["reassuring"] + push_a * f["alarming"]
    return out


# ---------------------------------------------------------------------- the doubles' own tests
