"""Guard helpers: a scene, a frozen policy written into a bundle, a text detector double."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from spotstop.guard import (
    Scene,
    load_policy,
)
from spotstop.guard.policies import FrozenPolicy, PolicyConfig, dump_policy

from tests._support.images import make_image_bytes


def frozen_policy(bundle: Path, t0: float) -> PolicyConfig:
    """A frozen cut t0 for the bundle (its policy's bundle id, prompt hash and fusion)."""
    cfg = load_policy(bundle / "policy.yaml")
    return PolicyConfig(
        bundle_id=cfg.bundle_id,
        prompt_hash=cfg.prompt_hash,
        fusion=cfg.fusion,
        policy=FrozenPolicy(threshold=t0),
        fitted_on={"test": True},
        created=datetime.now(UTC),
    )


def set_frozen(bundle: Path, t0: float) -> None:
    """Replace the bundle's policy by a frozen cut t0 (same bundle id, prompt hash, fusion)."""
    dump_policy(frozen_policy(bundle, t0), bundle / "policy.yaml")


def make_scene(i: int = 0, sit: str | None = None) -> Scene:
    return Scene(make_image_bytes(i, fmt="JPEG"), "pick up the knife", sit)


class SignReader:
    """A TEST DOUBLE text detector: reads the text the test wrote into a scene's image bytes.

    The image's sha256 is looked up in ``texts``; the claim lexicon is the real one, so the
    flags follow the same rules as the OCR detector's.
    """

    def __init__(self, texts: dict[str, str], *, fail_on: str | None = None, delay: float = 0.0):
        from spotstop.guard.cues import default_lexicon

        self.texts, self.fail_on, self.delay = texts, fail_on, delay
        self.lexicon = default_lexicon()
        self.calls = 0

    def detect(self, image):  # the TextDetector protocol
        from spotstop.guard.cues import CueReading, OcrModel

        self.calls += 1
        time.sleep(self.delay)
        if image.sha256 == self.fail_on:
            raise RuntimeError("the OCR engine crashed on this frame")
        text = self.texts.get(image.sha256, "")
        return CueReading(
            text=text,
            matches=self.lexicon.find(text),
            ocr_model=OcrModel("test-sign", ()),
            lexicon_sha256=self.lexicon.sha256,
        )
