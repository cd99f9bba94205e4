"""The live state of a stateful policy (the situation windows) and the decision log agree.

The guard keeps the windows in a file per policy version (``guard/_state.py``); the decision
log is where every decision is kept. A crash between the two writes must never leave the
windows holding a score the log has not got: after a restart they would hold a decision that
exists nowhere else, and a caller that got no answer and asks again would enter its scene
twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spotstop.guard import Guard

from tests._support.guard import make_scene


def _windows(path: Path) -> list[float]:
    if not path.is_file():
        return []
    return list(json.loads(path.read_text(encoding="utf-8"))["state"]["situations"].get("k", []))


@contextmanager
def _one_reference(bundle: Path, tmp_path: Path) -> Iterator[tuple[Guard, Path, list[float]]]:
    """A guard whose situation ``k`` holds one scene: the guard, its state file, the window."""
    sd = tmp_path / "state"
    with Guard(bundle, log=tmp_path / "l.sqlite", state_dir=sd) as g:
        g.check(make_scene(0, "k"))
        path = sd / f"state-{g.policy_config.version_id}.json"
        yield g, path, _windows(path)


def test_the_state_file_takes_a_batch_only_after_the_log_has_its_rows(
    bundle_copy: Path, tmp_path: Path
) -> None:
    with _one_reference(bundle_copy, tmp_path) as (g, path, before):
        assert len(before) == 1
        seen: dict[str, Any] = {}
        real = g._writer.commit

        def commit(records: Any, **kw: Any) -> Any:  # the moment a power cut may come
            seen["windows"] = _windows(path)
            return real(records, **kw)

        g._writer.commit = commit  # type: ignore[method-assign]
        d = g.check(make_scene(1, "k"))
        assert seen["windows"] == before  # nothing the log does not hold yet
        assert g.log.get(d.decision_id) is not None
        assert _windows(path) == [*before, d.fused_score]  # written once the row is logged


def _situation_all_safe(bundle: Path) -> None:
    """The bundle's situation policy with a fallback cut no tiny score reaches (SAFE)."""
    from dataclasses import replace

    from spotstop.guard.policies import FrozenPolicy, dump_policy, load_policy

    cfg = load_policy(bundle / "policy.yaml")
    pol = replace(cfg.policy, fallback=FrozenPolicy(threshold=1e9))
    dump_policy(replace(cfg, policy=pol), bundle / "policy.yaml")


def test_a_state_write_that_fails_after_the_log_amends_the_safe_row(
    bundle_copy: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    from spotstop.guard import _state

    def full(path: Any, text: str) -> None:
        raise OSError(28, "No space left on device")

    _situation_all_safe(bundle_copy)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=tmp_path / "state") as g:
        assert g.check(make_scene(0, "k")).label == "SAFE"
        monkeypatch.setattr(_state, "atomic_write_text", full)
        d = g.check(make_scene(1, "k"))
        assert d.label == "UNSAFE" and d.fail_closed and "policy state" in (d.fail_reason or "")
        rec = g.log.get(d.decision_id)  # the log says what was answered
        assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed
        assert "policy state" in (rec.fail_reason or "")
        monkeypatch.undo()


def test_a_batch_the_log_did_not_take_leaves_the_state_file_behind(
    bundle_copy: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    with _one_reference(bundle_copy, tmp_path) as (g, path, before):

        def down(*a: Any, **kw: Any) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(g.log, "append_many", down)
        d = g.check(make_scene(1, "k"))
        assert d.label == "UNSAFE" and d.fail_closed and g.pending == 1
        assert _windows(path) == before  # the row waits; so does the file
        assert len(g.situation("k").references) == 2  # the windows hold it all the same
        monkeypatch.undo()
        g.check(make_scene(2))  # the log takes the waiting row; the file catches up
        assert g.pending == 0 and _windows(path) == list(g.situation("k").references)


def test_a_damaged_state_file_is_named_by_its_own_keys_with_the_way_out(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """The message named ``state_seed.situations['k']`` (a key of policy.yaml, not of the
    state file) and advised a refit, which does not help: deleting the file does."""
    import pytest
    from spotstop.guard import PolicyError

    sd = tmp_path / "state"
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=sd) as g:
        g.check(make_scene(0, "k"))
        vid = g.policy_config.version_id
    path = sd / f"state-{vid}.json"
    for state, key in (
        ({"situations": {"k": [1.0, "x"]}}, "state.situations['k'] must be a list"),
        (None, "state must be a mapping with one key, situations"),
    ):
        path.write_text(json.dumps({"format": 1, "policy_version": vid, "state": state}))
        with pytest.raises(PolicyError) as e:
            Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=sd)
        msg = str(e.value)
        assert msg.startswith(key) and "recalibrate" not in msg
        assert str(path) in msg and "Delete it to start again" in msg
