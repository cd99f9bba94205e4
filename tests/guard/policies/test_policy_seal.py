"""A policy file spotstop writes is sealed, so that one read while being written is refused.

A writer that does not replace the file atomically (``cp`` over it, an editor saving in place)
leaves a prefix of the file there for a moment; a reload in that moment read the prefix. YAML
cut at a line end parses, and a prefix cut inside ``fitted_on`` (the last key) loaded as
another policy version: fresh situation windows, a version id that no file holds.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import pytest
import yaml
from spotstop.guard.policies import PolicyError, dump_policy, load_policy, policy_text

from tests.guard.policies.test_policies import _doc


def _cfg():  # type: ignore[no-untyped-def]
    doc = _doc(
        {
            "kind": "situation",
            "window": 6,
            "min_refs": 3,
            "fallback": {"kind": "frozen", "threshold": 0.25},
        }
    )
    doc["state_seed"] = {"situations": {"hall": [0.5, -0.25]}}
    doc["text_in_scene"] = {"detect": True, "reassuring": "fail_closed", "alarming": "log"}
    doc["fitted_on"] = {"version": 3, "dataset": "dev-pool", "n": 400, "tool": "spotstop test"}
    return load_policy(doc)


def test_a_sealed_file_ends_in_the_sha256_of_the_lines_above_it(tmp_path: Path) -> None:
    cfg = _cfg()
    path = tmp_path / "policy.yaml"
    dump_policy(cfg, path)
    text = path.read_text(encoding="utf-8")
    assert text == policy_text(cfg)
    lines = text.splitlines(keepends=True)
    assert lines[0].startswith("# spotstop policy file, sealed")
    body = "".join(lines[:-1])
    assert lines[-1] == f"# sha256: {hashlib.sha256(body.encode()).hexdigest()}\n"
    again = load_policy(path)
    assert again.digest == cfg.digest and again.version_id == cfg.version_id


def test_no_prefix_of_a_sealed_file_loads(tmp_path: Path) -> None:
    cfg = _cfg()
    text = policy_text(cfg)
    data = text.encode("utf-8")
    path = tmp_path / "policy.yaml"
    loaded_unsealed: list[str] = []
    for cut in range(len(data) - 1):  # the last byte is the final newline (below)
        path.write_bytes(data[:cut])
        with pytest.raises(PolicyError):
            load_policy(path)
        # the same prefix without the seal's first line: what the old format read
        bare = data[:cut].split(b"\n", 1)[1] if b"\n" in data[:cut] else b""
        path.write_bytes(bare)
        with contextlib.suppress(PolicyError):
            loaded_unsealed.append(load_policy(path).version_id)
    # the hazard the seal closes: unsealed prefixes cut inside fitted_on load, as another version
    assert set(loaded_unsealed) - {cfg.version_id}
    # the whole file, with or without its last newline, loads as itself
    for whole in (data, data.removesuffix(b"\n")):
        path.write_bytes(whole)
        assert load_policy(path).digest == cfg.digest


def test_an_edited_sealed_file_is_refused_and_loads_once_unsealed(tmp_path: Path) -> None:
    cfg = _cfg()
    path = tmp_path / "policy.yaml"
    dump_policy(cfg, path)
    edited = path.read_text().replace("threshold: 0.25", "threshold: 0.5")
    path.write_text(edited)
    with pytest.raises(PolicyError, match="not the sha256 of the lines above it") as e:
        load_policy(path)
    assert str(path) in str(e.value) and "delete its first and last lines" in str(e.value)
    # the seal's line damaged: refused, saying so
    path.write_text(edited.rsplit("# sha256: ", 1)[0] + "# sha256: abc\n")
    with pytest.raises(PolicyError, match="its last line is not a seal"):
        load_policy(path)
    # as its message says: delete the first and the last line, and the edit is read
    lines = edited.splitlines(keepends=True)
    path.write_text("".join(lines[1:-1]))
    hand = load_policy(path)
    assert hand.policy.to_dict()["fallback"]["threshold"] == 0.5
    assert yaml.safe_load(path.read_text())["fitted_on"] == cfg.fitted_on


def test_a_policy_file_that_is_not_utf8_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(policy_text(_cfg()).encode("utf-8")[:40] + b"\xff\xfe")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(path)
