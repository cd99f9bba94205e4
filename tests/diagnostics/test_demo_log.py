"""The packaged demo log (``spotstop card --demo``): the trained tiny TEST pair on a toy world.

``diagnostics/data/demo_log.sqlite`` is a real decision log written by ``spotstop demo
--write-card-log`` (:func:`spotstop.cli._demo.write_demo_log`): the guard checked a held-out
toy world one scene at a time, first under situation recentering, then under a conformal cut
recalibrated from the first half's labels, and every decision carries the world's label.
These tests read it as the card does, check that it replays, that it says what it is, and
(slow) that the same seed writes the same decisions again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.diagnostics._build import demo_log_meta, demo_log_path
from spotstop.diagnostics._cli import card_main
from spotstop.diagnostics._errors import DataError
from spotstop.guard import DecisionLog

from tests._support import REPO_ROOT

ROOT = REPO_ROOT

#: what the packaged log reaches (this file reads it; see docs/world.md), with
#: margin: the guard's delivered balanced accuracy and the pair's AUROC on the world
DELIVERED_FLOOR = 0.8
AUROC_FLOOR = 0.85


def _copy(tmp_path: Path) -> Path:
    """A copy of the packaged log: opening a log writes to it (WAL mode, schema check)."""
    dst = tmp_path / "demo_log.sqlite"
    shutil.copyfile(demo_log_path(), dst)
    return dst


@pytest.fixture(scope="module")
def demo_card(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo-card")
    assert card_main(["--demo", "--out", str(out), "--n-boot", "300", "--quiet"]) == 0
    return dict(json.loads((out / "card.json").read_text(encoding="utf-8")))


def test_the_packaged_log_is_small_and_matches_its_description(tmp_path: Path) -> None:
    path = demo_log_path()
    meta = demo_log_meta()  # checks the sha256
    assert path.stat().st_size <= 1_500_000
    assert meta["bytes"] == path.stat().st_size
    assert "TEST pair" in meta["what"] and "TOY WORLD" in meta["what"]
    with DecisionLog(_copy(tmp_path)) as log:
        arr = log.to_arrays()
    assert arr.n == meta["n_decisions"] == meta["n_labelled"]
    assert (arr.label >= 0).all() and int(arr.label.sum()) == meta["n_unsafe"]
    assert int((arr.guard_label == arr.label).sum()) == meta["n_agree"]
    assert not arr.fail_closed.any()
    # every scene with its room as the situation and its contrast from the labels
    assert all(s.startswith("room-") for s in arr.situation_id)
    assert all(
        c and c.startswith(s) for c, s in zip(arr.contrast_id, arr.situation_id, strict=True)
    )
    assert set(arr.policy_kind) == {"situation", "conformal"}
    for variant in (arr.member_scores_gray, arr.member_scores_text):
        assert sorted(variant) == sorted(meta["members"])
        assert all(np.isfinite(v).all() for v in variant.values())


def test_an_altered_demo_log_is_refused(tmp_path: Path) -> None:
    dst = _copy(tmp_path)
    shutil.copyfile(demo_log_path().with_suffix(".json"), dst.with_suffix(".json"))
    assert demo_log_meta(dst)["sha256"]
    dst.write_bytes(dst.read_bytes() + b"\0")
    with pytest.raises(DataError, match=r"was altered\. Write both again"):
        demo_log_meta(dst)


def test_card_demo_reads_the_packaged_log_and_says_what_it_is(demo_card: dict[str, Any]) -> None:
    prov = demo_card["provenance"]
    assert prov["source"].startswith("demo: the packaged decision log ")
    assert "TEST pair" in prov["source"] and "TOY WORLD" in prov["source"]
    assert prov["demo"]["log"] == str(demo_log_path())
    assert prov["demo"]["test_pair"] is True and prov["demo"]["toy_world"] is True
    assert prov["log"]["log"] == str(demo_log_path())  # not the temporary copy it was read from
    meta = demo_log_meta()
    assert prov["log"]["n_cases"] == meta["n_decisions"]
    # what the guard delivered, per policy version, well above chance
    ba = demo_card["delivered_balanced_accuracy"]
    assert ba["value"] >= DELIVERED_FLOOR and ba["ci"][0] > 0.5, ba
    kinds = sorted(p["kind"] for p in demo_card["delivered_by_policy"].values())
    assert kinds == ["conformal", "situation"]
    # the Spot-Stop fields, on the logged fused score
    fields = demo_card["fields"]
    assert fields["auroc"]["value"] >= AUROC_FLOOR
    assert fields["R"]["value"] >= fields["auroc"]["value"] - 0.05
    for key in ("A", "A_star", "threshold_part", "overlap_part", "within_part", "A_batch"):
        assert fields[key]["value"] is not None, key
    assert fields["R"]["n"] == meta["n_decisions"] // 2  # every scene has its contrast twin
    # the checks a log gives: the conformal audit of the recalibrated cut, situation share,
    # the scene-blind readers (the world saves 30 % of the unsafe scenes as a bigger JPEG)
    checks = demo_card["checks"]
    assert {"conformal_audit", "situation_share", "scene_blind"} <= set(checks)


def test_the_packaged_decisions_replay(demo_card: dict[str, Any]) -> None:
    by_policy = demo_card["delivered_by_policy"]
    assert len(by_policy) == 2
    for version, p in by_policy.items():
        rp = p["replay"]
        assert rp["n"] > 0 and rp["n_agree"] == rp["n"], (version, rp)


#: the CLI with torch and transformers unimportable: the robot's base install plus the diag extra
_NO_TORCH = """
import sys
from importlib.abc import MetaPathFinder

class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
from spotstop.cli import main
rc = main(sys.argv[1:])
assert not any(m.split(".")[0] in ("torch", "transformers") for m in sys.modules)
sys.exit(rc)
"""


def test_card_demo_needs_no_torch(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NO_TORCH), "card", "--demo", "--n-boot", "50",
         "--out", str(tmp_path / "card")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    first = out.stdout.splitlines()[0]
    assert first.startswith("demo: ") and "TEST pair on a TOY WORLD" in first
    assert (tmp_path / "card" / "card.html").is_file()


@pytest.mark.slow
def test_the_same_seed_writes_the_same_decisions(tmp_path: Path) -> None:
    """Regenerating the demo log from its seed gives the packaged decisions: the same scenes in
    the same order, labels, policy kinds and answers, member scores within the backend's
    tolerance (the answers compared where the fused score is further than its tolerance from
    the threshold)."""
    pytest.importorskip("torch")
    from spotstop.cli._demo import write_demo_log
    from spotstop.guard._guard import Guard

    from tests._support.tolerance import fused_tolerance, score_tolerances

    meta = demo_log_meta()
    run = write_demo_log(
        tmp_path / "demo_log.sqlite", seed=meta["seed"], work_dir=tmp_path / "work", progress=False
    )
    assert run.meta["world"] == meta["world"] and run.meta["n_decisions"] == meta["n_decisions"]
    with Guard(tmp_path / "work" / "bundle", log=tmp_path / "tol.sqlite") as guard:
        tol = score_tolerances(guard.members)
        s_tol = fused_tolerance(guard.policy_config.fusion, tol)
    (tmp_path / "packaged").mkdir()
    with DecisionLog(_copy(tmp_path / "packaged")) as lg:
        old = lg.to_arrays()
    with DecisionLog(run.path) as lg:
        new = lg.to_arrays()
    for name in ("request", "situation_id", "contrast_id", "label", "policy_kind", "width"):
        np.testing.assert_array_equal(getattr(new, name), getattr(old, name), err_msg=name)
    for kind in ("member_scores", "member_scores_gray", "member_scores_text"):
        for m, t in tol.items():
            got, want = getattr(new, kind)[m], getattr(old, kind)[m]
            np.testing.assert_allclose(got, want, rtol=0, atol=t, err_msg=f"{kind}[{m}]")
    clear = np.abs(old.fused - old.threshold) > 2 * s_tol
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(new.guard_label[clear], old.guard_label[clear])


def test_a_deployed_conformal_cut_whose_document_does_not_load_is_said(tmp_path: Path) -> None:
    """The conformal version that made the log's last 240 decisions, its stored document
    broken (alpha 1.5): the card left it out of the audit in silence, said "no conformal
    policy decided in this log (policies: conformal, situation)" and "switch from the deployed
    situation policy". It now names the version, why it does not load, and that it decided."""
    import sqlite3

    log = _copy(tmp_path)
    with sqlite3.connect(log) as c:
        (v, doc), *_ = c.execute(
            "SELECT policy_version, document FROM policies WHERE policy_kind = 'conformal'"
        ).fetchall()
        d = json.loads(doc)
        d["policy"]["alpha"] = 1.5
        c.execute("UPDATE policies SET document = ? WHERE policy_version = ?", (json.dumps(d), v))
    out = tmp_path / "card"
    assert card_main([str(log), "--out", str(out), "--n-boot", "100", "--quiet"]) == 0
    card = json.loads((out / "card.json").read_text(encoding="utf-8"))
    said = {i["topic"]: i["sentence"] for i in card["verdict"]}
    assert f"the policy document of {v}, whose conformal cut decided" in said["guarantee"]
    assert "policy.alpha must be in (0, 1)" in said["guarantee"]
    assert "no conformal policy decided" not in said["guarantee"]
    assert "deployed situation policy" not in said["policy"] and v in said["policy"]
    assert any(v in w and "does not load" in w for w in card["settings"]["warnings"])
