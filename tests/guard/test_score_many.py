"""Many scenes in this process: the scene table, the local engine and ``spotstop score``
over a folder or a CSV (no model: a stand-in member; the tiny pair runs in test_score_ray.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from spotstop.cli import main
from spotstop.guard import ConfigError, ImageError
from spotstop.guard._batch import LocalEngine, MemberRef, get_engine, score_scenes
from spotstop.guard._hf import TEST_PAIR_NOTE
from spotstop.guard._scene_table import SCORE_COLUMNS, read_scene_table

from tests._support.images import make_image_bytes
from tests._support.scoring_fakes import RequestNumber, load_numbers


def _scenes(root: Path, n: int = 5, fail: int | None = None) -> Path:
    (root / "img").mkdir(parents=True)
    rows = ["image,request,situation_id"]
    for i in range(n):
        (root / "img" / f"{i}.png").write_bytes(make_image_bytes(i))
        rows.append(f"img/{i}.png,go {'fail' if i == fail else i},{'s' if i % 2 else ''}")
    (root / "scenes.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root / "scenes.csv"


def test_a_csv_and_a_folder_read_in_order(tmp_path: Path) -> None:
    table = read_scene_table(_scenes(tmp_path))
    assert [r.image for r in table.rows] == [f"img/{i}.png" for i in range(5)]
    assert [r.request for r in table.rows][:2] == ["go 0", "go 1"]
    assert [r.situation_id for r in table.rows][:2] == [None, "s"]
    (tmp_path / "img" / "sub").mkdir()
    (tmp_path / "img" / "sub" / "z.webp").write_bytes(make_image_bytes(9, fmt="WEBP"))
    (tmp_path / "img" / "notes.txt").write_text("not an image")
    folder = read_scene_table(tmp_path / "img", "go 3")
    assert [r.image for r in folder.rows] == [*(f"{i}.png" for i in range(5)), "sub/z.webp"]
    assert {r.request for r in folder.rows} == {"go 3"}
    scenes = folder.scenes([5, 0])
    assert [s.image.sha256 for s in scenes] == [folder.rows[5].sha256, folder.rows[0].sha256]


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        (
            "image,request,situation\nimg/0.png,go,k\n",
            r"column 'situation'.*did you mean 'situation_id'",
        ),
        ("image\nimg/0.png\n", r"missing request"),
        ("image,request\n", r"no data rows"),
        ("image,request\nimg/nope.png,go\n", r"row 1 .*'image'.*does not exist"),
        ("image,request\nimg/0.png,\n", r"row 1 .*'request'.*empty"),
        ("image,request\nimg/bad.png,go\n", r"row 1 .*refuses this image"),
    ],
)
def test_a_bad_csv_names_the_row_and_the_fix(tmp_path: Path, csv_text: str, message: str) -> None:
    _scenes(tmp_path, n=1)
    (tmp_path / "img" / "bad.png").write_bytes(b"not a png")
    (tmp_path / "bad.csv").write_text(csv_text, encoding="utf-8")
    with pytest.raises((ConfigError, ImageError), match=message):
        read_scene_table(tmp_path / "bad.csv")


def test_the_request_goes_with_a_folder_not_a_csv(tmp_path: Path) -> None:
    csv_path = _scenes(tmp_path, n=1)
    with pytest.raises(ConfigError, match="drop --request"):
        read_scene_table(csv_path, "go")
    with pytest.raises(ConfigError, match="give the request"):
        read_scene_table(tmp_path / "img")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no JPEG, PNG or WebP"):
        read_scene_table(tmp_path / "empty", "go")


def test_an_image_changed_after_reading_is_refused(tmp_path: Path) -> None:
    table = read_scene_table(_scenes(tmp_path, n=2))
    (tmp_path / "img" / "1.png").write_bytes(make_image_bytes(99))
    assert len(table.scenes([0])) == 1
    with pytest.raises(ImageError, match="changed since the scene table was read"):
        table.scenes([1])


def test_the_local_engine_keeps_order_and_nan_with_a_warning(tmp_path: Path) -> None:
    table = read_scene_table(_scenes(tmp_path, n=5, fail=3))
    refs = [MemberRef("a", RequestNumber), MemberRef("b", lambda: RequestNumber("b"))]
    with pytest.warns(RuntimeWarning) as seen:
        res = score_scenes(table, refs, ("scene",), engine=LocalEngine(chunk_size=2))
    assert [str(w.message).split(";")[0] for w in seen] == [
        f"member {m} gave 1 non-finite score(s)" for m in "ab"
    ]
    np.testing.assert_array_equal(res.members["a"].scores["scene"], [0, 1, 2, np.nan, 4])
    assert res.engine == "local" and res.n == 5 and res.members["a"].prompt_hash == "numbers-hash"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"members": []}, "at least one member"),
        ({"members": [MemberRef("a", RequestNumber)] * 2}, "names must be unique"),
        ({"variants": ()}, "at least one variant"),
        ({"variants": ("scene", "scene")}, "distinct values"),
        ({"variants": ("colour",)}, "distinct values"),
    ],
)
def test_scoring_inputs_are_checked_first(tmp_path: Path, kwargs: dict, message: str) -> None:
    table = read_scene_table(_scenes(tmp_path, n=1))
    args = {"members": [MemberRef("a", RequestNumber)], "variants": ("scene",), **kwargs}
    with pytest.raises(ConfigError, match=message):
        score_scenes(table, args["members"], args["variants"])


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine must be one of \['local', 'ray'\]"):
        get_engine("dask")


def test_score_over_a_csv_writes_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("spotstop.guard._member.load_member", load_numbers)
    csv_path = _scenes(tmp_path, n=3, fail=1)
    argv = ["score", str(csv_path), "--member", "m", "--variant", "scene", "--variant", "text"]
    with pytest.warns(RuntimeWarning, match="member m gave 2 non-finite"):
        assert main(argv) == 1  # a scene has no score
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(SCORE_COLUMNS)
    assert [(r["scene"], r["variant"], r["score"]) for r in rows] == [
        ("0", "scene", "0.0"), ("0", "text", "0.5"), ("1", "scene", ""), ("1", "text", ""),
        ("2", "scene", "2.0"), ("2", "text", "2.5"),
    ]  # fmt: skip
    assert [r["error"] for r in rows[1:4]] == ["", *["member m gave a non-finite score."] * 2]
    assert rows[2]["situation_id"] == "s" and rows[0]["situation_id"] == ""
    assert "on the local engine" in err and TEST_PAIR_NOTE in err
    assert "1 of 3 scene(s) have no score (0 refused, 1 with a non-finite score)" in err
    with pytest.warns(RuntimeWarning):
        assert main([*argv, "--json", "--quiet", "--out", str(tmp_path / "o.jsonl")]) == 1
    lines = (tmp_path / "o.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and '"score": null' in lines[2]
    assert main(["score", str(_scenes(tmp_path / "ok", n=2)), "--member", "m", "--quiet"]) == 0


def test_score_names_each_row_whose_request_the_member_refuses_and_scores_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request the member refuses (too long for it) ended the whole run (exit 2, nothing
    written). The rows are checked first (Member.check_request, the guard's rule): each
    refused one is named, never reaches the member, and is written with no score and the
    reason; the others are scored, and the exit status is 1."""
    monkeypatch.setattr("spotstop.guard._member.load_member", load_numbers)
    scored: list[str] = []
    real = RequestNumber.score
    monkeypatch.setattr(
        RequestNumber,
        "score",
        lambda self, sc, *a, **k: scored.extend(s.request for s in sc) or real(self, sc, *a, **k),
    )
    (tmp_path / "img").mkdir()
    rows = ["image,request"]
    for i, req in enumerate(["go 1", "go 2", "go refuse", "go 4", "go refuse"]):
        (tmp_path / "img" / f"{i}.png").write_bytes(make_image_bytes(i))
        rows.append(f"img/{i}.png,{req}")
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert main(["score", str(tmp_path / "s.csv"), "--member", "m", "--chunk-size", "2"]) == 1
    out, err = capsys.readouterr()
    for i in (2, 4):
        assert f"s.csv, scene {i} (img/{i}.png): not scored: request 'go refuse' is refused" in err
    assert "2 of 5 scene(s) have no score (2 refused" in err and "Traceback" not in err
    assert scored == ["go 1", "go 2", "go 4"]  # the refused ones never reach the member
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["score"] for r in rows] == ["1.0", "2.0", "", "4.0", ""]
    assert rows[2]["error"] == "request 'go refuse' is refused by member m."
    assert not rows[1]["error"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ray"], "--ray goes with many scenes"),
        (["--out", "x.csv", "--actors", "2"], "--out, --actors go with many scenes"),
    ],
)
def test_one_image_refuses_the_many_scene_options(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    img = tmp_path / "a.png"
    img.write_bytes(make_image_bytes(0))
    assert main(["score", str(img), "--member", "m", "--request", "go", *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "x.parquet"], "--out must end in .csv or .jsonl"),
        (["--actors", "2"], "--actors and --gpus-per-actor go with --ray"),
        (["--gpus-per-actor", "1"], "--actors and --gpus-per-actor go with --ray"),
        (["--ray", "--device", "cuda"], "--device cuda on Ray needs GPUs reserved per actor"),
        (["--chunk-size", "0"], "--chunk-size must be >= 1"),
    ],
)
def test_many_scene_options_are_checked(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path = _scenes(tmp_path, n=1)
    assert main(["score", str(csv_path), "--member", "m", *extra]) == 2
    assert message in capsys.readouterr().err


def test_reliance_actors_go_with_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["reliance", "--bundle", "B", "--source", "S", "--out", str(tmp_path), "--actors", "2"]
    assert main(argv) == 2
    assert "--actors and --gpus-per-actor go with --ray" in capsys.readouterr().err


def test_score_with_a_bundle_s_exported_member_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle's member folder (its ONNX graphs, no weights) given to `spotstop score` (the
    torch reference) ended in a transformers traceback ("chat_template is not set")."""
    from tests._support.make_bundle import BUNDLE_DIR

    img = tmp_path / "a.png"
    img.write_bytes(make_image_bytes(0, size=(64, 64)))
    member = BUNDLE_DIR / "members" / "tiny-qwen3_5"
    assert (
        main(["score", str(img), "--member", str(member), "--request", "go"]) == 1
    )  # as a missing folder
    err = capsys.readouterr().err
    assert "is a bundle's exported member (ONNX scoring graphs, no weights)" in err
    assert "Traceback" not in err
