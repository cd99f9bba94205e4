"""bench/gelu_fusion.py: the export's own GELU rewrite on a COPY of a bundle's vision graph,
both timed in one run; the bundle is left as it was. Run here on the committed tiny bundle's
graphs (the real-size run is the script's own)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests._support.bench import load_bench
from tests._support.make_bundle import BUNDLE_DIR

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("member", ["tiny-qwen3_5", "tiny-lfm2_vl"])
def test_times_a_copy_rewritten_by_the_exports_function(member: str, tmp_path: Path) -> None:
    b = load_bench("gelu_fusion")
    src = BUNDLE_DIR / "members" / member / "onnx"
    before = _digest(src)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    work = tmp_path / "work"
    argv = [str(src / "vision.onnx"), "--rounds", "2", "--threads", "1", "--work", str(work)]
    assert b.main([*argv, "--results", str(results)]) == 0
    assert _digest(src) == before  # the bundle's files are not touched
    # copies, not links (onnx refuses a hard-linked data file), beside the rewritten graph
    for f in ("vision.onnx", "vision.onnx.data"):
        assert (work / f).stat().st_nlink == 1 and (work / f).stat().st_ino != (
            src / f
        ).stat().st_ino
    assert (work / "vision.gelu.onnx").is_file()
    text = results.read_text(encoding="utf-8")
    assert "kept" in text and "<!-- gelu-fusion:begin -->" in text and "2 FastGelu" in text

    t = b.measure(src / "vision.onnx", rounds=3, threads=1, seed=0, work=tmp_path / "again")
    assert (t.fast_gelu, t.gelu) == (2, 1) and t.nodes_after < t.nodes_before
    assert len(t.exported_all) == len(t.fused_all) == 3
    assert t.ratio > 0 and t.paired_ratio > 0
    # an fp32 graph: the GELU's few ulps through two blocks (tests/export/test_gelu.py)
    assert t.max_abs_diff <= 1e-5 * max(1.0, t.max_abs_output)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        b.measure(src / "vision.onnx", rounds=0, threads=1, seed=0, work=tmp_path / "x")
