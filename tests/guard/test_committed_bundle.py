"""The committed tiny ONNX bundle that the torch-free runtime tests run on.

``tests/_support/tiny_bundle`` (written by ``python -m tests._support.make_bundle``) must be
there and whole (a missing bundle fails, it is never skipped), the guard must serve it without
importing torch, and it must declare what the current exporter declares: the bundle and graph
format versions, the default prompt, the export settings; a fresh export (slow, needs torch)
must write the same manifest, graph metadata and policy kind. When one of these fails after a
change to the exporter, regenerate the bundle with the script and commit it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from spotstop.export.tiny import TINY_MEMBERS
from spotstop.guard import load_bundle, load_policy
from spotstop.guard._bundle import BUNDLE_FORMAT, BUNDLE_VERSION
from spotstop.guard._prompt import PromptSpec
from spotstop.guard.backends._graphs import GRAPHS_FORMAT, GRAPHS_VERSION

from tests._support import REPO_ROOT
from tests._support import make_bundle as recipe
from tests._support.images import make_image_bytes

#: what the committed bundle may weigh: it lives in git
MAX_BYTES = 8 * 2**20


def _manifest(bundle: Path) -> dict[str, Any]:
    return yaml.safe_load((bundle / "manifest.yaml").read_text(encoding="utf-8"))


def _graphs(bundle: Path, member: dict[str, Any]) -> dict[str, Any]:
    text = (bundle / member["path"] / "spotstop_onnx.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def test_the_committed_bundle_is_there_and_whole(committed_bundle: Path) -> None:
    b = load_bundle(committed_bundle)  # every listed file's sha256, the manifest's version
    assert [m.name for m in b.members] == list(TINY_MEMBERS) and b.test_pair
    cfg = load_policy(committed_bundle / "policy.yaml")
    assert (cfg.bundle_id, cfg.prompt_hash) == (b.bundle_id, b.prompt_hash)
    size = sum(p.stat().st_size for p in committed_bundle.rglob("*") if p.is_file())
    assert size <= MAX_BYTES


def test_the_committed_bundle_declares_what_the_exporter_declares(committed_bundle: Path) -> None:
    m = _manifest(committed_bundle)
    assert (m["format"], m["version"]) == (BUNDLE_FORMAT, BUNDLE_VERSION)
    assert m["prompt"] == asdict(PromptSpec())
    assert m["export"]["precision"] == recipe.PRECISION and m["export"]["trt"] == "off"
    buckets = [int(b) for b in recipe.BUCKETS.split(",")]
    for member in m["members"]:
        assert (member["backend"], member["precision"]) == ("onnx", recipe.PRECISION)
        assert member["buckets"] == buckets
        graphs = _graphs(committed_bundle, member)
        assert (graphs["format"], graphs["version"]) == (GRAPHS_FORMAT, GRAPHS_VERSION)
        assert graphs["decoder"]["buckets"] == buckets


def test_the_guard_serves_the_committed_bundle_without_torch(
    committed_bundle: Path, tmp_path: Path
) -> None:
    """A process that cannot import torch, transformers or scipy checks a scene on it."""
    img = tmp_path / "cam.jpg"
    img.write_bytes(make_image_bytes(3, fmt="JPEG"))
    script = f"""
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "scipy"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from spotstop.guard import Guard, Scene
with Guard({str(committed_bundle)!r}, log={str(tmp_path / "log.sqlite")!r}) as g:
    d = g.check(Scene(open({str(img)!r}, "rb").read(), "pick up the knife"))
print(json.dumps({{"fail_closed": d.fail_closed, "members": sorted(d.member_scores)}}))
"""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"fail_closed": False, "members": sorted(TINY_MEMBERS)}


@pytest.mark.slow
def test_a_fresh_export_declares_what_the_committed_bundle_declares(
    committed_bundle: Path, tmp_path: Path
) -> None:
    """The script run again writes the same manifest (but its files' bytes, which another torch
    may write otherwise, and the folder the pair was built in), the same graph metadata (but
    the measured export error) and a policy
    of the same kind and settings."""
    pytest.importorskip("torch")
    fresh = recipe.make_bundle(tmp_path / "fresh")

    def manifest(bundle: Path) -> dict[str, Any]:
        m = _manifest(bundle)
        m["files"] = sorted(m["files"])
        m.pop("bundle_id")
        for member in m["members"]:
            member.pop("source")  # the folder the pair was built in
        return m

    assert manifest(fresh) == manifest(committed_bundle)
    for member in _manifest(committed_bundle)["members"]:
        old, new = _graphs(committed_bundle, member), _graphs(fresh, member)
        for graphs in (old, new):
            graphs.pop("max_abs_diff")
            graphs.pop("source")
        assert new == old
    old_policy = load_policy(committed_bundle / "policy.yaml").policy
    new_policy = load_policy(fresh / "policy.yaml").policy
    assert type(new_policy) is type(old_policy)
    assert (new_policy.window, new_policy.min_refs) == (old_policy.window, old_policy.min_refs)  # type: ignore[attr-defined]
