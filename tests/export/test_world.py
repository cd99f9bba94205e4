"""The toy world (spotstop world): deterministic files, labels by the rule, contrasts, cues."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from PIL import Image
from spotstop.export.tiny import tree_digest
from spotstop.export.world import (
    HAZARDS,
    RULES,
    WORLD_COLUMNS,
    CueRates,
    WorldOptions,
    build_world,
    read_world,
    render_case,
    world_cases,
)

SMALL = WorldOptions(rooms=4, contrasts_per_room=3, signs=0.5, misleading=0.5, file_cue=0.5)


def test_same_seed_gives_identical_files_and_another_seed_does_not(tmp_path: Path) -> None:
    a = build_world(tmp_path / "a", seed=3, options=SMALL)
    b = build_world(tmp_path / "b", seed=3, options=SMALL)
    c = build_world(tmp_path / "c", seed=4, options=SMALL)
    assert tree_digest(a.root) == tree_digest(b.root)
    assert tree_digest(a.root)["world.csv"] != tree_digest(c.root)["world.csv"]


def test_csv_has_the_documented_columns_and_one_row_per_image(tmp_path: Path) -> None:
    w = build_world(tmp_path, seed=0, options=SMALL)
    with w.csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == WORLD_COLUMNS
    assert len(rows) == 2 * 4 * 3 == len(w.cases)
    for r in rows:
        assert (tmp_path / r["image"]).is_file()
        assert r["label"] in ("SAFE", "UNSAFE")
        assert r["request"] in RULES[r["hazard"]]["requests"]


def test_every_contrast_is_one_safe_and_one_unsafe_scene_with_one_request() -> None:
    cases = world_cases(1, SMALL)
    by: dict[str, list] = {}
    for c in cases:
        by.setdefault(c.contrast_id, []).append(c)
    assert all(len(v) == 2 for v in by.values())
    for safe, unsafe in by.values():
        assert (safe.label, unsafe.label) == (0, 1)
        assert safe.request == unsafe.request and safe.room == unsafe.room
        assert safe.hazard == unsafe.hazard and safe.distractor == unsafe.distractor
        assert safe.distractor_unsafe == unsafe.distractor_unsafe
        assert safe.layout_seed == unsafe.layout_seed


def test_contrast_scenes_differ_only_where_the_target_object_is_drawn() -> None:
    """Without signs the two scenes of a contrast differ in the target object's pixels only:
    the label is in the image, and nothing else moves between them."""
    opts = WorldOptions(rooms=2, contrasts_per_room=6)
    cases = world_cases(0, opts)
    for safe, unsafe in zip(cases[0::2], cases[1::2], strict=True):
        a = np.asarray(render_case(safe, opts), dtype=int)
        b = np.asarray(render_case(unsafe, opts), dtype=int)
        diff = np.abs(a - b).sum(axis=2) > 0
        assert diff.any(), safe.case_id
        assert diff.mean() < 0.2, (safe.case_id, diff.mean())


def test_the_distractor_state_does_not_decide_the_label() -> None:
    cases = world_cases(2, WorldOptions(rooms=6, contrasts_per_room=8))
    both = {(c.distractor_unsafe, c.label) for c in cases}
    assert both == {(False, 0), (False, 1), (True, 0), (True, 1)}
    assert {c.hazard for c in cases} == set(HAZARDS)


def test_sign_rates_follow_the_options() -> None:
    opts = WorldOptions(rooms=40, contrasts_per_room=20, signs=0.6, misleading=0.5)
    cases = world_cases(0, opts)
    signed = [c for c in cases if c.sign_cue != "none"]
    share = len(signed) / len(cases)
    n = len(cases)
    assert abs(share - 0.6) < 4 * np.sqrt(0.6 * 0.4 / n)
    mis = np.mean([c.sign_misleading for c in signed])
    assert abs(mis - 0.5) < 4 * np.sqrt(0.25 / len(signed))
    for c in signed:  # misleading means: reassuring on UNSAFE, alarming on SAFE
        expect = (c.sign_cue == "reassuring" and c.label == 1) or (
            c.sign_cue == "alarming" and c.label == 0
        )
        assert c.sign_misleading == expect


def test_the_file_cue_marks_unsafe_scenes_only_and_changes_the_file(tmp_path: Path) -> None:
    w = build_world(tmp_path, seed=0, options=SMALL)
    cued = [c for c in w.cases if c.file_cue]
    assert cued and all(c.label == 1 for c in cued)
    for c in w.cases:
        with Image.open(tmp_path / c.image_name) as im:
            assert im.format == ("JPEG" if c.file_cue else "PNG")
            assert im.size == ((200, 150) if c.file_cue else SMALL.size)


def test_test_split_holds_whole_rooms() -> None:
    cases = world_cases(0, WorldOptions(rooms=8, contrasts_per_room=2, test_share=0.25))
    rooms = {c.room.room_id: c.split for c in cases}
    assert sorted(rooms.values()).count("test") == 2
    assert all(c.split == rooms[c.room.room_id] for c in cases)


def test_offsets_zero_lights_every_room_alike() -> None:
    rooms = {c.room for c in world_cases(0, WorldOptions(rooms=5, contrasts_per_room=1))}
    assert {(r.brightness, r.tint) for r in rooms} == {(1.0, (0.0, 0.0, 0.0))}
    lit = {c.room for c in world_cases(0, WorldOptions(rooms=5, contrasts_per_room=1, offsets=1))}
    assert len({r.brightness for r in lit}) == 5


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("signs", 1.5),
        ("misleading", -0.1),
        ("rooms", 0),
        ("size", (10, 10)),
        ("sign_styles", 6),
        ("sign_styles", -1),
        ("sign_styles", 1.0),
    ],
)
def test_bad_options_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        WorldOptions(**{field: value})  # type: ignore[arg-type]


def test_read_world_recreates_the_cases_and_refuses_an_edited_csv(tmp_path: Path) -> None:
    w = build_world(tmp_path, seed=5, options=SMALL)
    assert read_world(tmp_path).cases == w.cases
    text = w.csv_path.read_text()
    w.csv_path.write_text(text.replace("UNSAFE", "SAFE", 1))
    with pytest.raises(ValueError, match="sha256"):
        read_world(tmp_path)


def test_cli_prints_the_rules_and_names_a_bad_flag(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "spotstop.cli", "world"]
    out = subprocess.run([*run, "--rules"], capture_output=True, text=True, check=True).stdout
    for hz in HAZARDS:
        assert f"{hz}: UNSAFE when {RULES[hz]['unsafe']}" in out
    bad = subprocess.run(
        [*run, "--out", str(tmp_path), "--signs", "2"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--signs must be a share" in bad.stderr
    ok = subprocess.run(
        [*run, "--out", str(tmp_path / "w"), "--rooms", "2", "--contrasts-per-room", "1"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "w" / "rules.txt").read_text().startswith("spotstop world")


def test_world_csv_is_a_scene_table_and_a_source_set(tmp_path: Path) -> None:
    """`spotstop score --scenes world.csv` and `spotstop reliance --source world.csv` read it:
    the labelled table's other columns are passed over."""
    from spotstop.diagnostics.cues import read_source_set
    from spotstop.guard._scene_table import read_scene_table

    w = build_world(tmp_path, seed=0, options=WorldOptions(rooms=2, contrasts_per_room=2))
    table = read_scene_table(w.csv_path)
    assert [r.request for r in table.rows] == [c.request for c in w.cases]
    assert [r.situation_id for r in table.rows] == [c.room.room_id for c in w.cases]
    src = read_source_set(w.csv_path)
    assert [s.label for s in src.scenes] == [c.label for c in w.cases]


def test_an_occluded_contrast_hides_its_object_and_always_carries_a_claim() -> None:
    """Only the sign tells the state: the two scenes' pixels differ inside the sign only."""
    opts = WorldOptions(rooms=3, contrasts_per_room=6, signs=0.2, occluded=1.0)
    cases = world_cases(0, opts)
    assert all(c.occluded for c in cases)
    assert all(c.sign_cue in ("reassuring", "alarming") for c in cases)
    safe, unsafe = cases[0], cases[1]
    a = np.asarray(render_case(replace(safe, sign_cue="none"), opts), dtype=int)
    b = np.asarray(render_case(replace(unsafe, sign_cue="none"), opts), dtype=int)
    np.testing.assert_array_equal(a, b)  # the crate hides the only difference
    assert not any(c.occluded for c in world_cases(0, replace(opts, signs=0.0)))


def test_cue_rates_count_what_was_drawn_and_show_occlusion_raising_the_sign_share(
    tmp_path: Path, capsys
) -> None:
    """`--occluded` contrasts always carry a claiming sign, so the realised share of signed
    scenes is occluded + (1 - occluded) x signs, not `--signs`: the world says what it drew,
    counted here again from world.csv."""
    from spotstop.cli import main

    opts = WorldOptions(
        rooms=40, contrasts_per_room=20, signs=0.2, occluded=0.5, file_cue=0.3, misleading=0.25
    )
    rates = CueRates.of(world_cases(3, opts))
    n = 40 * 20
    assert abs(rates.signs - (0.5 + 0.5 * 0.2)) < 4 * np.sqrt(0.25 / n) + 4 * np.sqrt(0.16 / n)
    assert abs(rates.occluded - 0.5) < 4 * np.sqrt(0.25 / n)
    out = tmp_path / "w"
    args = ["world", "--out", str(out), "--seed", "3", "--rooms", "4", "--contrasts-per-room", "5"]
    args += ["--signs", "0.5", "--occluded", "0.3", "--file-cue", "0.4", "--neutral-signs", "0.5"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    with (out / "world.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    signed = [r for r in rows if r["sign_cue"] != "none"]
    honest = [r for r in signed if r["sign_misleading"] == "0"]
    unsafe = [r for r in rows if r["label"] == "UNSAFE"]
    contrasts = {r["contrast_id"]: r["occluded"] == "1" for r in rows}
    want = CueRates(
        signs=len(signed) / len(rows),
        misleading=sum(r["sign_misleading"] == "1" for r in signed) / len(signed),
        neutral=sum(r["sign_cue"] == "neutral" for r in honest) / len(honest),
        file_cue=sum(r["file_cue"] == "1" for r in unsafe) / len(unsafe),
        occluded=sum(contrasts.values()) / len(contrasts),
    )
    assert read_world(out).cue_rates() == want
    assert f"cues as drawn (each a share of what its option's is of): {want}" in printed
    assert str(want).startswith("signs ") and "file-cue" in str(want)


def test_sign_styles_keep_the_first_wordings_fonts_and_colours() -> None:
    """sign_styles=1: every sign is the first wording of its polarity ("ALL CLEAR", "DANGER",
    "ROOM 4": the sign-bold template's) in the first font and colours (white on black); the
    rates and the rest of the scene are as without it; 0 draws from all."""
    from spotstop.diagnostics.cues import SIGN_TEMPLATES
    from spotstop.export.world import SIGN_TEXTS

    base = WorldOptions(rooms=8, contrasts_per_room=8, signs=1.0, neutral_signs=0.3)
    one = replace(base, sign_styles=1)
    a, b = world_cases(0, base), world_cases(0, one)
    assert [c.sign_cue for c in a] == [c.sign_cue for c in b]
    bold = SIGN_TEMPLATES[0]
    assert {c.sign_text for c in b} == {
        bold.texts[k] for k in ("reassuring", "alarming", "neutral")
    }
    assert {c.sign_text for c in b} == {SIGN_TEXTS[k][0] for k in SIGN_TEXTS}
    assert len({c.sign_text for c in a}) > 6
    # drawn in white on black: the sign's box holds only those two colours (and their blend)
    img = np.asarray(render_case(b[0], replace(one, offsets=0.0)), dtype=int)
    dark = (img < 40).all(axis=-1)
    assert dark.sum() > 50  # the sign's black box
    assert len({c.sign_text for c in world_cases(0, replace(base, sign_styles=2))}) == 6


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_cli_refuses_a_file_or_a_folder_that_is_not_a_world_as_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out naming a file ended in a NotADirectoryError traceback; a folder of the user's
    would now be replaced whole, so it is refused and left as it was."""
    from spotstop.cli import main

    small = ["--rooms", "1", "--contrasts-per-room", "1"]
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main(["world", "--out", str(afile), *small]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert afile.read_text() == "mine"
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    assert main(["world", "--out", str(home), *small]) == 2
    assert "not empty and not a world" in capsys.readouterr().err
    assert _tree(home) == {"notes.txt": b"mine"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["world", "--out", str(empty), *small]) == 0


def test_a_world_written_over_another_replaces_it_whole(tmp_path: Path) -> None:
    """The old world's images (here its JPEG file-cue scenes and its other rooms) stayed
    beside the new world's."""
    build_world(tmp_path / "w", seed=1, options=replace(SMALL, rooms=4))
    build_world(tmp_path / "w", seed=1, options=replace(SMALL, rooms=2, file_cue=0.0))
    build_world(tmp_path / "fresh", seed=1, options=replace(SMALL, rooms=2, file_cue=0.0))
    assert _tree(tmp_path / "w") == _tree(tmp_path / "fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "w"]  # no staging left
    assert read_world(tmp_path / "w").cases == read_world(tmp_path / "fresh").cases


def test_an_interrupted_rewrite_leaves_the_old_world_and_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun stopped midway (Ctrl-C) left the old world.csv and world.json beside images of
    the new world, and read_world accepted the mixed folder."""
    import spotstop.export.world as W

    build_world(tmp_path / "w", seed=1, options=SMALL)
    before = _tree(tmp_path / "w")
    drawn = []
    real = W.case_image

    def interrupted(case: W.WorldCase, opts: WorldOptions) -> bytes:
        if len(drawn) == 5:
            raise KeyboardInterrupt
        drawn.append(case.case_id)
        return real(case, opts)

    monkeypatch.setattr(W, "case_image", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_world(tmp_path / "w", seed=2, options=SMALL)
    assert len(drawn) == 5
    assert _tree(tmp_path / "w") == before
    assert [p.name for p in tmp_path.iterdir()] == ["w"]


def test_read_world_refuses_images_that_are_not_the_worlds(tmp_path: Path) -> None:
    """world.json records each image's sha256; an image of another world (the same name, from
    another seed), a missing one and one world.json does not name are each refused."""
    a = build_world(tmp_path / "a", seed=1, options=SMALL)
    b = build_world(tmp_path / "b", seed=2, options=SMALL)
    name = a.cases[3].image_name
    assert b.cases[3].image_name == name
    assert (a.root / name).read_bytes() != (b.root / name).read_bytes()
    (a.root / name).write_bytes((b.root / name).read_bytes())
    with pytest.raises(ValueError, match=rf"{re.escape(name)}.*not an image of the world"):
        read_world(a.root)
    (a.root / name).unlink()
    with pytest.raises(ValueError, match=re.escape(name)):
        read_world(a.root)
    c = build_world(tmp_path / "c", seed=1, options=SMALL)
    (c.root / "images" / "old-scene.png").write_bytes(b"a scene of an older world")
    with pytest.raises(ValueError, match=r"images/old-scene\.png"):
        read_world(c.root)


def test_the_sign_text_layout_is_recorded_and_a_world_without_raqm_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pillow lays text out with Raqm where it finds libraqm and libfribidi, else with
    FreeType alone; the two put some of the signs' glyphs a pixel apart, so the same seed gave
    other sign images on a machine without libfribidi, and nothing said so. world.json now
    records the layout, the font is asked for it explicitly, and `spotstop world` warns
    where Raqm is missing (a signed world's images differ from the same seed's elsewhere)."""
    import json

    from PIL import ImageFont, features
    from spotstop.cli import main
    from spotstop.export import world as W

    opts = WorldOptions(rooms=2, contrasts_per_room=2, signs=1.0)
    build_world(tmp_path / "w", seed=3, options=opts)
    meta = json.loads((tmp_path / "w" / "world.json").read_text(encoding="utf-8"))
    assert (
        meta["text_layout"]
        == W.text_layout()
        == ("raqm" if features.check_feature("raqm") else "basic")
    )
    asked: list[object] = []
    real = ImageFont.truetype
    monkeypatch.setattr(
        ImageFont, "truetype", lambda *a, **k: asked.append(k.get("layout_engine")) or real(*a, **k)
    )
    monkeypatch.setattr(W, "text_layout", lambda: "basic")  # a machine without libfribidi
    W._font.cache_clear()
    try:
        args = ["world", "--rooms", "1", "--contrasts-per-room", "2", "--seed", "3"]
        assert main([*args, "--signs", "1", "--out", str(tmp_path / "basic")]) == 0
        assert set(asked) == {ImageFont.Layout.BASIC}
        meta = json.loads((tmp_path / "basic" / "world.json").read_text(encoding="utf-8"))
        assert meta["text_layout"] == "basic"
        assert "warning: Pillow here lays text out without Raqm" in capsys.readouterr().err
        assert main([*args, "--signs", "0", "--out", str(tmp_path / "plain")]) == 0
        assert "Raqm" not in capsys.readouterr().err  # no sign, no text: nothing differs
    finally:
        W._font.cache_clear()
