"""What an export may replace, and what a derived or half-written bundle says of itself.

The export replaced its output folder before it looked at a member: a re-export into a
deployed bundle deleted the guard's decision log beside it (even when the export then refused
its arguments), an output folder holding the members deleted the models, and a failed
``derive_bundle`` left a copy of the fp32 bundle, manifest and all, under the new name.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml

from tests._support.pair import fp32_bundle

pytest.importorskip("torch")


def _export(member: Path, out: Path, *extra: str) -> int:
    from spotstop.cli import main

    argv = ["export", "--out", str(out), "--precision", "fp32", "--trt", "off"]
    if "--buckets" not in extra:
        argv += ["--buckets", "256"]
    return main([*argv, *extra, "--member", str(member)])


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_an_export_never_replaces_a_decision_log_nor_its_sources(
    tiny_pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    member = tiny_pair / "tiny-lfm2_vl"
    served = tmp_path / "served"
    assert _export(member, served) == 0
    (served / "decisions.sqlite").write_bytes(b"the robot's decisions")
    before = _tree(served)
    # refused before anything is written (exit 2: bad input), the log and bundle as they were
    assert _export(member, served) == 2
    assert "holds a guard's decision log (decisions.sqlite)" in capsys.readouterr().err
    assert _tree(served) == before
    # an output folder that holds the member, or lies inside it: the models stay
    copy = tmp_path / "models"
    shutil.copytree(member, copy / "tiny-lfm2_vl")
    models = _tree(copy)
    for out in (copy, copy / "tiny-lfm2_vl" / "bundle"):
        assert _export(copy / "tiny-lfm2_vl", out) == 2
        assert "overlaps the source folder" in capsys.readouterr().err
    assert _tree(copy) == models
    # a folder that is not a bundle is not emptied
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert _export(member, other) == 2
    assert "not empty and not a spotstop bundle" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"


def test_a_failed_export_leaves_the_bundle_it_would_replace(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """What export_member checks (here a bucket too small for the prompt, or smooth_alpha
    outside int8) failed after the output was deleted; the bundle is now built beside it and
    swapped in only when whole."""
    member = tiny_pair / "tiny-lfm2_vl"
    out = tmp_path / "b"
    assert _export(member, out) == 0
    before = _tree(out)
    assert _export(member, out, "--buckets", "128") != 0
    assert _export(member, out, "--smooth-alpha", "0.5") != 0
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no staging folder left


def test_a_derived_bundle_claims_no_parity_it_never_measured(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.guard import load_bundle

    b32 = fp32_bundle(request, "lfm2_vl")
    d = derive_bundle(b32, tmp_path / "d8", precision="int8")
    meta = yaml.safe_load(
        (d / "members" / "tiny-lfm2_vl" / "spotstop_onnx.yaml").read_text(encoding="utf-8")
    )
    src = yaml.safe_load(
        (b32 / "members" / "tiny-lfm2_vl" / "spotstop_onnx.yaml").read_text(encoding="utf-8")
    )
    assert "max_abs_diff" in src and "max_abs_diff" not in meta  # fp32's record, not int8's
    assert meta["derived_from"]["bundle_id"] == load_bundle(b32).bundle_id
    assert "verify-bundle" in meta["derived_from"]["validated"]


def test_a_derived_bundle_inherits_no_policy_versions_nor_state(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """derive_bundle copied the fp32 bundle's policies/ (versions fitted on fp32 scores) and
    the guard's state/ (situation windows of fp32 scores) into the derived bundle, and listed
    them in its manifest as part of its content."""
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.guard import load_bundle

    b32 = tmp_path / "b32"
    shutil.copytree(fp32_bundle(request, "lfm2_vl"), b32)
    (b32 / "policy.yaml").write_text("fitted: on fp32 scores\n", encoding="utf-8")
    (b32 / "policies").mkdir()
    (b32 / "policies" / "policy-v0001.yaml").write_text("fitted: on fp32 scores\n")
    (b32 / "state").mkdir()
    (b32 / "state" / "state-v0001+abc.json").write_text('{"state": "fp32 windows"}\n')
    d = derive_bundle(b32, tmp_path / "d8", precision="int8")
    assert not (d / "policy.yaml").exists()
    assert not (d / "policies").exists() and not (d / "state").exists()
    files = load_bundle(d).manifest["files"]
    assert not [f for f in files if f.startswith(("policies/", "state/"))]
    assert (b32 / "policies" / "policy-v0001.yaml").is_file()  # the source keeps its own


def test_a_derive_that_fails_leaves_no_bundle_under_its_name(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fp32 bundle was copied, manifest included, before the conversion: a derive that
    raised left a folder that loaded (and verified) as a bundle under the new name."""
    import spotstop.export.precision as precision
    from spotstop.export.onnx_bundle import derive_bundle

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("the converter fell over")

    monkeypatch.setattr(precision, "convert_precision", boom)
    with pytest.raises(RuntimeError, match="fell over"):
        derive_bundle(fp32_bundle(request, "lfm2_vl"), tmp_path / "d4", precision="int4")
    assert list(tmp_path.iterdir()) == []


def test_a_fused_bundle_is_not_derived_at_a_precision_that_cannot_be_fused(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """The export refuses the fused form at fp16 and int4-trt; derive_bundle wrote one, and
    onnxruntime could not load its decoder."""
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.export.precision import PRECISION_SPECS

    unfusable = sorted(p for p, s in PRECISION_SPECS.items() if not s.fusable)
    assert unfusable  # fp16, int4-trt
    fused = tmp_path / "fused"
    assert _export(tiny_pair / "tiny-lfm2_vl", fused, "--graph-form", "fused") == 0
    for p in unfusable:
        with pytest.raises(ValueError, match="holds fused graphs"):
            derive_bundle(fused, tmp_path / f"d-{p}", precision=p)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["fused"]


def test_verify_bundle_refuses_a_source_that_names_no_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt --source name was ignored: the check compared with the manifest's source and
    said PASS. A wrong reference folder raised a traceback with exit 1 (a FAIL)."""
    from spotstop.cli import main
    from spotstop.export.verify import pass_spearman, spearman

    bundle = Path(__file__).parents[1] / "_support" / "tiny_bundle"
    argv = ["verify-bundle", str(bundle), "--scenes", "2"]
    assert main([*argv, "--source", "tiny-qwen3.5=/nonexistent/folder"]) == 2
    err = capsys.readouterr().err
    assert "--source names ['tiny-qwen3.5'], not members of this bundle" in err
    assert main([*argv, "--source", "tiny-qwen3_5="]) == 2
    assert "--source must be NAME=FOLDER" in capsys.readouterr().err
    # a NaN score is no rank at all: scipy says NaN, and so does the rank check now
    assert math.isnan(spearman([1.0, 2.0, math.nan], [1.0, 2.0, 3.0]))
    rho, varies, _ = pass_spearman([1.0, 2.0, math.nan], [1.0, 2.0, 3.0], ("scene",))
    assert math.isnan(rho) and varies
