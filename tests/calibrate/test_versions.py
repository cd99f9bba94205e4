"""Stored policy versions: the number a version file holds is the number it is stored as."""

from __future__ import annotations

from pathlib import Path

import pytest
from spotstop.calibrate import activate_policy_version, list_policy_versions, write_policy_version
from spotstop.guard.policies import load_policy

from tests._support.guard import frozen_policy


def test_a_stored_policy_stored_again_names_its_new_number(bundle_copy: Path) -> None:
    """A loaded version file carries ``fitted_on.version`` and ``previous``; storing it again
    (what the message for a file outside ``policies/`` advises) kept them, so v0004's file said
    it was v0002: the log and the state file named another version."""
    v2 = write_policy_version(bundle_copy, frozen_policy(bundle_copy, 100.0))
    activate_policy_version(bundle_copy, v2.number)
    write_policy_version(bundle_copy, frozen_policy(bundle_copy, -100.0))
    v4 = write_policy_version(bundle_copy, load_policy(v2.path))
    assert v4.number == 4
    cfg = load_policy(v4.path)
    assert cfg.fitted_on["version"] == 4 and cfg.version_id.startswith("v0004+")
    assert cfg.fitted_on["previous"]["version"] == 2  # the version active when it was stored
    assert cfg.policy == load_policy(v2.path).policy
    assert [v.number for v in list_policy_versions(bundle_copy) if v.active] == [2]


def test_two_writers_archiving_the_policy_in_force_at_once_store_it_once(
    bundle_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """policy.yaml not yet stored: two processes storing a version at once each archived it,
    giving v0001 and v0002 with the same bytes (both shown active) and new versions whose
    ``previous`` named either. Here the other process's archive lands between this one's check
    and its claim: this one removes its own copy and names the other's."""
    from spotstop.calibrate import _versions

    policy_yaml = (bundle_copy / "policy.yaml").read_bytes()
    real = _versions._claim

    def other_writer_first(pdir: Path, data: bytes, start: int) -> tuple[int, Path]:
        if data == policy_yaml and not (pdir / "policy-v0001.yaml").exists():
            real(pdir, data, start)  # the other process's archive: v0001
        return real(pdir, data, start)

    monkeypatch.setattr(_versions, "_claim", other_writer_first)
    v = write_policy_version(bundle_copy, frozen_policy(bundle_copy, 1.0))
    versions = list_policy_versions(bundle_copy)
    same = [x.number for x in versions if x.path.read_bytes() == policy_yaml]
    assert same == [1] and [x.number for x in versions if x.active] == [1]
    assert load_policy(v.path).fitted_on["previous"]["version"] == 1
