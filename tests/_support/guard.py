"""Guard helpers: a scene, a frozen policy or a cascade written into a bundle, a text detector
double, a member scored from a table, and a cascade batch decided on such members."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


class TableMember:
    """A TEST DOUBLE member whose robust z-score per image is given by a table (NaN: a
    non-finite score); ``scored`` lists the images it was asked to score."""

    def __init__(self, real: Any, stats: Any, table: dict[str, float]):
        self._real, self.stats, self.table = real, stats, table
        self.scored: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def score(self, scenes: Any, variant: str = "scene", strict: bool = True) -> list[Any]:
        from spotstop.guard import MemberScore

        out = []
        for s in scenes:
            self.scored.append(s.image.sha256)
            v = self.stats.median + self.stats.iqr * self.table[s.image.sha256]
            out.append(MemberScore(self._real.name, variant, v, self._real.prompt_hash, 1))
        return out


def set_cascade_situation(bundle: Path, band: float, **extra: Any) -> tuple[str, str]:
    """A cascade (share 0.5, ``band``) over a situation cut (window 4, one reference, frozen
    fallback at 0) as the bundle's policy, with ``extra`` policy fields (``text_in_scene``);
    returns its (first, second) members."""
    import dataclasses

    from spotstop.guard.policies import CascadePolicy, SituationPolicy

    cfg = load_policy(bundle / "policy.yaml")
    first, second = cfg.fusion.members
    cut = SituationPolicy(window=4, min_refs=1, fallback=FrozenPolicy(0.0))
    dump_policy(
        dataclasses.replace(
            cfg,
            policy=CascadePolicy(first=first, share=0.5, band=band, cut=cut),
            state_seed=None,
            created=datetime.now(UTC),
            **extra,
        ),
        bundle / "policy.yaml",
    )
    return first, second


def decide_the_banded_batch(
    bundle: Path, log: Path, first: str, second: str
) -> tuple[list[Any], PolicyConfig]:
    """One batch of four scenes of situation "k" through the bundle's cascade (its policy,
    which alarming text fails closed), on members scored from tables: scene 0 reads DANGER
    and fails closed after the plan chose the band; the plan sends scene 2 to the pair (z1
    -0.4, z2 +2.2). Returns the decisions and the policy in force."""
    from spotstop.guard import Guard

    scenes = [make_scene(100 + i, sit="k") for i in range(4)]
    sha = [hashlib.sha256(s.image).hexdigest() for s in scenes]  # type: ignore[arg-type]
    with Guard(bundle, log=log, text_detector=SignReader({sha[0]: "DANGER"})) as g:
        st = g.policy_config.fusion.stats
        z1 = dict(zip(sha, (-1.2, 0.4, -0.4, 0.7), strict=True))
        z2 = dict(zip(sha, (0.9, -0.4, 2.2, 0.8), strict=True))
        g.members[first] = TableMember(g.members[first], st[first], z1)  # type: ignore[assignment]
        g.members[second] = TableMember(g.members[second], st[second], z2)  # type: ignore[assignment]
        return list(g.check_batch(scenes)), g.policy_config
