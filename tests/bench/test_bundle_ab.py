"""bench/bundle_ab.py on two tiny int8 bundles of one member, with and without exact reads
(`spotstop export --int8-reads`): both timed in one run, told apart by their manifests, the
ratios to the first; wrong inputs refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._support.bench import load_bench


@pytest.fixture(scope="module")
def two_bundles(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from spotstop.cli import main

    root = tmp_path_factory.mktemp("ab")
    out = []
    for reads in ("exact", "int8"):
        b = root / f"b-{reads}"
        args = ["export", "--out", str(b), "--precision", "int8", "--buckets", "256"]
        args += ["--quantizer", "rtn", "--trt", "off", "--int8-reads", reads]
        assert main([*args, "--member", str(tiny_pair / "tiny-qwen3_5")]) == 0
        out.append(b)
    return out


def test_two_bundles_are_timed_and_told_apart(two_bundles: list[Path], tmp_path: Path) -> None:
    ab = load_bench("bundle_ab")
    results = tmp_path / "RESULTS.md"
    argv = [*map(str, two_bundles), "--scenes", "1", "--rounds", "1", "--results", str(results)]
    assert ab.main(argv) == 0
    text = results.read_text(encoding="utf-8")
    assert "<!-- bundle-ab:begin -->" in text and "`tiny-qwen3_5`" in text
    rows = re.findall(
        r"^\| `(.+?)` \| (.+?) \| ([\d.]+) m?s \| ([\d.]+) m?s \| ([\d.]+)x \|", text, re.M
    )
    assert [Path(r[0]).name for r in rows] == ["b-exact", "b-int8"]
    assert float(rows[0][4]) == 1.0  # the first is the baseline
    assert float(rows[1][4]) > 0
    exact = re.search(r"exact_reads (\d+)", rows[0][1])
    assert exact and int(exact.group(1)) > 0 and "exact_reads 0" in rows[1][1]
    assert "Measured by `python bench/bundle_ab.py" in text
    # a tiny bundle's scene takes milliseconds: shown so, not as "0.00 s"
    assert ab.seconds(0.0042) == "4.20 ms" and ab.seconds(3.5) == "3.50 s"


def test_wrong_inputs_are_refused(two_bundles: list[Path], tmp_path: Path) -> None:
    ab = load_bench("bundle_ab")
    with pytest.raises(SystemExit):
        ab.main([str(two_bundles[0])])  # one bundle: nothing to compare
    with pytest.raises(SystemExit, match=r"no manifest\.yaml"):
        ab.main([str(two_bundles[0]), str(tmp_path)])
