"""Guard helpers: a scene, a frozen policy written into a bundle."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from spotstop.guard import (
    Scene,
    load_policy,
)
from spotstop.guard.policies import FrozenPolicy, PolicyConfig, dump_policy

from tests._support.images import make_image_bytes


def set_frozen(bundle: Path, t0: float) -> None:
    """Replace the bundle's policy by a frozen cut t0 (same bundle id, prompt hash, fusion)."""
    cfg = load_policy(bundle / "policy.yaml")
    dump_policy(
        PolicyConfig(
            bundle_id=cfg.bundle_id,
            prompt_hash=cfg.prompt_hash,
            fusion=cfg.fusion,
            policy=FrozenPolicy(threshold=t0),
            fitted_on={"test": True},
            created=datetime.now(UTC),
        ),
        bundle / "policy.yaml",
    )


def make_scene(i: int = 0, sit: str | None = None) -> Scene:
    return Scene(make_image_bytes(i, fmt="JPEG"), "pick up the knife", sit)
