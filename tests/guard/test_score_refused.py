"""``spotstop score FOLDER|CSV`` with scenes the guard refuses, on the tiny pair's exported
member (the committed bundle: onnxruntime, length buckets): a request too long for the
member's largest bucket and images the guard refuses are named and not scored, every other
scene is, and the exit status says some scenes have no score."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from spotstop.cli import main
from spotstop.guard import RequestError, load_bundle
from spotstop.guard._member import load_bundle_member
from spotstop.guard._prompt import MAX_REQUEST_CHARS

from tests._support.images import make_image_bytes

LONG = "go " * 1300  # under the character limit, longer in tokens than the largest bucket


@pytest.fixture(scope="module")
def onnx_member(committed_bundle: Path) -> object:
    """The committed bundle's tiny Qwen3.5 member on onnxruntime (buckets of its graphs)."""
    bundle = load_bundle(committed_bundle)
    member = next(m for m in bundle.members if m.name == "tiny-qwen3_5")
    return load_bundle_member(bundle, member, threads=1)


@pytest.fixture
def scenes(tmp_path: Path) -> Path:
    """Six scenes: 1 has a request too long for the member, 3 an image smaller than the
    guard takes (16x16), 4 a file that is no image; 0, 2 and 5 are fine."""
    (tmp_path / "img").mkdir()
    rows = ["image,request,situation_id"]
    for i in range(6):
        img = tmp_path / "img" / f"{i}.png"
        if i == 3:
            img.write_bytes(make_image_bytes(i, (16, 16)))
        elif i == 4:
            img.write_bytes(b"not an image")
        else:
            img.write_bytes(make_image_bytes(i))
        rows.append(f"img/{i}.png,{LONG if i == 1 else f'open door {i}'},room{i}")
    (tmp_path / "scenes.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return tmp_path / "scenes.csv"


def test_refused_scenes_are_named_and_the_others_scored(
    onnx_member, scenes: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A request longer than the member's largest length bucket ended the whole run (exit 2,
    nothing written), as did an image the guard refuses (a too small one was scored). Each
    is now refused by the guard's own rules (Member.check_request → check_fits, the guard's
    image decode), named on stderr with its reason, written with no score and the reason in
    the error column; the other scenes are scored, and the exit status is 1."""
    assert len(LONG) < MAX_REQUEST_CHARS  # the bucket refuses it, not the character limit
    with pytest.raises(RequestError, match="too long for member"):
        onnx_member.check_request(LONG)
    monkeypatch.setattr("spotstop.guard._member.load_member", lambda *a, **k: onnx_member)
    out = scenes.parent / "scores.jsonl"
    argv = ["score", str(scenes), "--member", "m", "--variant", "scene", "--variant", "text"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for i, why in [(1, "request is too long for member tiny-qwen3_5"), (3, "at least 32 px"),
                   (4, "refuses the image")]:  # fmt: skip
        assert f"scenes.csv, scene {i} (img/{i}.png): not scored: " in err
        assert why in err.split(f"scene {i} (img/{i}.png)")[1].splitlines()[0]
    assert "3 of 6 scene(s) have no score (3 refused, 0 with a non-finite score)" in err
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["scene"], r["variant"]) for r in rows] == [
        (i, v) for i in range(6) for v in ("scene", "text")
    ]
    for r in rows:
        refused = r["scene"] in (1, 3, 4)
        assert (r["score"] is None) == refused, r
        assert (r["error"] is not None) == refused, r
        assert r["situation_id"] == f"room{r['scene']}"
        assert r["prompt_hash"] == onnx_member.prompt_hash
    assert all(math.isfinite(r["score"]) for r in rows if r["score"] is not None)
    assert "too long for member tiny-qwen3_5" in rows[2]["error"]
    assert rows[6]["image_sha256"] is None and rows[0]["image_sha256"]


def test_a_csv_of_scores_carries_the_error_column(
    onnx_member, scenes: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr("spotstop.guard._member.load_member", lambda *a, **k: onnx_member)
    assert main(["score", str(scenes), "--member", "m", "--quiet"]) == 1
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["score"] == "" for r in rows] == [False, True, False, True, True, False]
    assert [r["error"] == "" for r in rows] == [True, False, True, False, False, True]


def test_a_table_whose_every_scene_is_refused_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to score: exit 2 with each scene named, before any member is loaded."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(make_image_bytes(0, (8, 8)))
    assert main(["score", str(tmp_path / "img"), "--request", "go", "--member", "nope"]) == 2
    err = capsys.readouterr().err
    assert "scene 0 (a.png): not scored: the guard refuses the image" in err
    assert "every one of its 1 scene(s) is refused" in err and "Traceback" not in err


def test_one_image_smaller_than_the_guard_takes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One image was decoded with no smallest side: a 16x16 image was scored, though the
    guard refuses it; it is refused now as in a table, before any member is loaded."""
    img = tmp_path / "small.png"
    img.write_bytes(make_image_bytes(0, (16, 16)))
    assert main(["score", str(img), "--request", "go", "--member", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "at least 32 px" in err and "Traceback" not in err
