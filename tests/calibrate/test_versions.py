"""Stored policy versions: the number a version file holds is the number it is stored as."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from spotstop.calibrate import activate_policy_version, list_policy_versions, write_policy_version
from spotstop.guard.policies import FrozenPolicy, PolicyConfig, load_policy


def _frozen(bundle: Path, t0: float) -> PolicyConfig:
    cfg = load_policy(bundle / "policy.yaml")
    return PolicyConfig(
        bundle_id=cfg.bundle_id,
        prompt_hash=cfg.prompt_hash,
        fusion=cfg.fusion,
        policy=FrozenPolicy(threshold=t0),
        fitted_on={"test": True},
        created=datetime.now(UTC),
    )


def test_a_stored_policy_stored_again_names_its_new_number(bundle_copy: Path) -> None:
    """A loaded version file carries ``fitted_on.version`` and ``previous``; storing it again
    (what the message for a file outside ``policies/`` advises) kept them, so v0004's file said
    it was v0002: the log and the state file named another version."""
    v2 = write_policy_version(bundle_copy, _frozen(bundle_copy, 100.0))
    activate_policy_version(bundle_copy, v2.number)
    write_policy_version(bundle_copy, _frozen(bundle_copy, -100.0))
    v4 = write_policy_version(bundle_copy, load_policy(v2.path))
    assert v4.number == 4
    cfg = load_policy(v4.path)
    assert cfg.fitted_on["version"] == 4 and cfg.version_id.startswith("v0004+")
    assert cfg.fitted_on["previous"]["version"] == 2  # the version active when it was stored
    assert cfg.policy == load_policy(v2.path).policy
    assert [v.number for v in list_policy_versions(bundle_copy) if v.active] == [2]
