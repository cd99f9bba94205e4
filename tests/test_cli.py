"""The command line: help texts, `tiny`, `score`, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from spotstop.guard.cli import build_parser, main

from tests.conftest import make_image_bytes


def test_every_command_has_help(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "safety guard" in out
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert len(capsys.readouterr().out) > 200, name


def test_help_does_not_import_torch():
    code = "import sys; from spotstop.guard.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")


def test_runtime_package_imports_without_torch():
    code = (
        "import sys, spotstop.guard; print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


@pytest.mark.parametrize("name", ["tiny-qwen3_5", "tiny-lfm2_vl"])
def test_score_prints_a_finite_score_and_the_prompt_hash(
    tiny_pair: Path, tmp_path: Path, capsys, name
):
    img = tmp_path / "scene.jpg"
    img.write_bytes(make_image_bytes(3, fmt="JPEG"))
    rc = main(
        [
            "score",
            "--member",
            str(tiny_pair / name),
            str(img),
            "--request",
            "open the door",
            "--json",
            "--variant",
            "scene",
            "--variant",
            "text",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["test_pair"] is True and len(data["prompt_hash"]) == 16
    assert set(data["scores"]) == {"scene", "text"}
    assert all(abs(v) < 1e6 for v in data["scores"].values())


def test_score_bad_image_is_a_usage_error(tiny_pair: Path, tmp_path: Path, capsys):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"")
    rc = main(["score", "--member", str(tiny_pair / "tiny-qwen3_5"), str(bad), "--request", "x"])
    assert rc == 2
    assert "empty" in capsys.readouterr().err.lower()


def test_score_missing_member_is_explained(tmp_path: Path, capsys):
    img = tmp_path / "scene.png"
    img.write_bytes(make_image_bytes(0))
    rc = main(["score", "--member", str(tmp_path / "nope"), str(img), "--request", "x"])
    assert rc == 1
    assert "does not exist" in capsys.readouterr().err
