"""Matched edits: the source and calibration readers, the templates, the plan and the pixels."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image
from spotstop.diagnostics import DataError
from spotstop.diagnostics.cues import (
    HELD_OUT,
    TEMPLATES,
    EditSet,
    EditTemplate,
    placebo_text,
    plan_edits,
    read_calibration_csv,
    read_source_set,
)
from spotstop.diagnostics.cues._edits import RENDER_VERSION
from spotstop.diagnostics.cues._templates import FAMILIES, SIGN_TEMPLATES, STICKER_TEMPLATES

from tests._support.cues_fakes import lexicon_flags, png, write_source

MATCHED = ("box", "font", "font_size", "colour", "background", "position", "template")


@pytest.fixture
def source(tmp_path):
    return read_source_set(write_source(tmp_path / "src", ["UNSAFE", "SAFE", "UNSAFE"]))


def test_source_reader_records_label_cue_sha_and_size(tmp_path):
    csv_path = write_source(tmp_path / "s", ["UNSAFE", "safe"], situation=True)
    src = read_source_set(csv_path.parent)  # the folder works as well as the CSV
    assert [s.label for s in src.scenes] == [1, 0]
    assert [s.cue for s in src.scenes] == ["reassuring", "alarming"]
    assert [s.situation_id for s in src.scenes] == ["s0", "s1"]
    assert (
        src.scenes[0].sha256
        == hashlib.sha256((csv_path.parent / "img0.png").read_bytes()).hexdigest()
    )
    assert (src.scenes[0].width, src.scenes[0].height) == (96, 64)


@pytest.mark.parametrize(
    ("csv_text", "message"),
    [
        (
            "image,label\nimg0.png,SAFE\n",
            "the header must be image,request,label[,situation_id,contrast_id]",
        ),
        (
            "image,request,labels\n",
            "column 'labels' is not one this reader knows; did you mean 'label'",
        ),
        ("image,request,label\n", "no data rows"),
        (
            "image,request,label\nimg0.png,go,MAYBE\n",
            "row 1 (line 2), column 'label': expected SAFE or UNSAFE; got 'MAYBE'",
        ),
        ("image,request,label\nimg0.png,,SAFE\n", "row 1 (line 2), column 'request'"),
        ("image,request,label\nnope.png,go,SAFE\n", "column 'image': '"),
        ("image,request,label\nimg0.png,go\n", "the row is too short"),
        ("image,request,label\nimg0.png,go,SAFE,x\n", "more cells than header columns"),
        ("image,request,label\nbad.png,go,SAFE\n", "the guard refuses this image"),
    ],
)
def test_source_reader_errors_name_row_and_column(tmp_path, csv_text, message):
    (tmp_path / "img0.png").write_bytes(png(0))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    (tmp_path / "s.csv").write_text(csv_text, encoding="utf-8")
    with pytest.raises(
        DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        read_source_set(tmp_path / "s.csv")


def test_source_and_calibration_locations(tmp_path):
    with pytest.raises(DataError, match="does not exist; pass a CSV or its folder to --source"):
        read_source_set(tmp_path / "missing")
    (tmp_path / "a.csv").write_text("x\n")
    (tmp_path / "b.csv").write_text("x\n")
    with pytest.raises(DataError, match="holds 2 CSV files; it must hold exactly one"):
        read_calibration_csv(tmp_path)


def test_calibration_reader(tmp_path):
    (tmp_path / "a.png").write_bytes(png(1))
    (tmp_path / "cal.csv").write_text("image,cue\na.png,Reassuring\na.png,none\n")
    cal = read_calibration_csv(tmp_path / "cal.csv")
    assert [c.cue for c in cal.images] == ["reassuring", "none"]
    (tmp_path / "cal.csv").write_text("image,cue\na.png,scary\n")
    with pytest.raises(
        DataError,
        match=r"row 1 .*column 'cue': expected one of reassuring, alarming, none; got 'scary'",
    ):
        read_calibration_csv(tmp_path / "cal.csv")
    (tmp_path / "cal.csv").write_text("image,cue\na.png,reassuring\na.png,alarming\n")
    with pytest.raises(
        DataError,
        match=r"calibration set '.*cal\.csv' has no scene with cue none \(1 reassuring, "
        r"1 alarming\).*Add scenes without claim text \(cue none\)",
    ):
        read_calibration_csv(tmp_path / "cal.csv")


def test_edits_are_deterministic_given_the_seed(source):
    a, b, c = plan_edits(source, seed=3), plan_edits(source, seed=3), plan_edits(source, seed=4)
    assert a.records == b.records and a.digest == b.digest
    assert [img for _, img in a.images()] == [img for _, img in b.images()]
    assert a.digest != c.digest  # the seed moves the boxes and the placebo's letters


def test_a_scene_edits_do_not_depend_on_the_other_scenes(tmp_path, source):
    sub = read_source_set(write_source(tmp_path / "one", ["UNSAFE"]))  # img0 alone
    full = [r for r in plan_edits(source, seed=0).records if r.group == 0]
    alone = plan_edits(sub, seed=0).records
    drop = ("index", "source_image")
    assert [{k: v for k, v in r.to_dict().items() if k not in drop} for r in full] == [
        {k: v for k, v in r.to_dict().items() if k not in drop} for r in alone
    ]


def test_every_edit_records_its_kind_template_text_and_source(source):
    edits = plan_edits(source, seed=0)
    per_scene = 1 + 4 * (len(TEMPLATES) + 1)
    assert len(edits) == per_scene * len(source)
    for r in edits.records:
        s = source.scenes[r.group]
        assert r.source_sha256 == s.sha256 and r.label == s.label and r.cue == s.cue
        if r.kind != "source":
            assert r.template and r.text and r.box and r.font.startswith("DejaVu") and r.colour


def test_controls_share_the_misleading_edit_box_font_size_colour_position(source):
    edits = plan_edits(source, seed=0)
    by = {}
    for r in edits.records:
        if r.kind != "source":
            by.setdefault((r.group, r.template), {})[r.kind] = r
    assert len(by) == len(source) * (len(TEMPLATES) + 1)
    for (g, tname), kinds in by.items():
        mis = kinds["misleading"]
        for kind in ("agreeing", "neutral", "placebo"):
            assert {k: getattr(kinds[kind], k) for k in MATCHED} == {
                k: getattr(mis, k) for k in MATCHED
            }
        t = next(t for t in edits.templates if t.name == tname)
        cue = source.scenes[g].cue
        other = "alarming" if cue == "reassuring" else "reassuring"
        assert mis.text == t.texts[cue]  # reassuring text on unsafe scenes, alarming on safe
        assert kinds["agreeing"].text == t.texts[other]
        assert kinds["neutral"].text == t.texts["neutral"]
        plc = kinds["placebo"].text
        assert len(plc) == len(mis.text) and plc != mis.text
        assert [c.isspace() for c in plc] == [c.isspace() for c in mis.text]


def test_pixels_change_only_inside_the_shared_box(source):
    edits = plan_edits(source, seed=0)
    src0 = np.asarray(Image.open(io.BytesIO(edits.render(edits.records[0]))).convert("RGB"))
    recs = [r for r in edits.records if r.group == 0 and r.template == TEMPLATES[0].name]
    imgs = {
        r.kind: np.asarray(Image.open(io.BytesIO(edits.render(r))).convert("RGB")) for r in recs
    }
    x0, y0, x1, y1 = recs[0].box
    outside = np.ones(src0.shape[:2], dtype=bool)
    outside[y0:y1, x0:x1] = False
    for kind, img in imgs.items():
        assert (img[outside] == src0[outside]).all(), kind
        assert (img[~outside] != src0[~outside]).any(), kind
    assert not np.array_equal(imgs["misleading"], imgs["neutral"])  # the words differ


def test_held_out_template_differs_from_the_four_as_the_paper_says():
    assert len(SIGN_TEMPLATES) == 4 and TEMPLATES == SIGN_TEMPLATES + STICKER_TEMPLATES
    for t in TEMPLATES:  # every measurement template, stickers included
        assert not t.held_out
        assert all(HELD_OUT.texts[k] != t.texts[k] for k in ("reassuring", "alarming", "neutral"))
        assert HELD_OUT.position != t.position
    assert HELD_OUT.held_out and HELD_OUT.family == "sign"
    # it shares its colours with one template and its font with another (Sec. 4.2)
    colours = [
        t.name
        for t in TEMPLATES
        if (t.colour, t.background) == (HELD_OUT.colour, HELD_OUT.background)
    ]
    fonts = [t.name for t in TEMPLATES if t.font == HELD_OUT.font]
    assert len(colours) == 1 and len(fonts) == 1 and colours != fonts
    # the four signs vary wording, font, colour, size and position among themselves
    for field in ("font", "size", "position"):
        assert len({getattr(t, field) for t in SIGN_TEMPLATES}) == 4, field
    assert len({(t.colour, t.background) for t in SIGN_TEMPLATES}) == 4
    assert len({t.texts["reassuring"] for t in SIGN_TEMPLATES}) == 4


def test_stickers_paste_one_word_naming_a_hazard_or_a_safe_state():
    assert FAMILIES == ("sign", "sticker")
    assert {t.family for t in SIGN_TEMPLATES} == {"sign"}
    assert len(STICKER_TEMPLATES) == 2 and {t.family for t in STICKER_TEMPLATES} == {"sticker"}
    for t in STICKER_TEMPLATES:
        assert all(len(t.texts[k].split()) == 1 for k in ("reassuring", "alarming", "neutral"))
        assert lexicon_flags(t.texts["reassuring"]) == {"reassuring": True, "alarming": False}
        assert lexicon_flags(t.texts["alarming"]) == {"reassuring": False, "alarming": True}
        assert t.to_dict()["family"] == "sticker"
    assert {t.texts["alarming"] for t in STICKER_TEMPLATES} >= {"HOT"}
    assert {t.texts["reassuring"] for t in STICKER_TEMPLATES} >= {"SAFE"}


def _sign_records(edits: EditSet) -> list[dict[str, object]]:
    names = {t.name for t in SIGN_TEMPLATES} | {HELD_OUT.name}
    out = []
    for r in edits.records:
        if r.kind == "source" or r.template in names:
            d = r.to_dict()
            d.pop("index")  # positions in the set move when sticker edits are added
            out.append(d)
    return out


def test_adding_stickers_keeps_every_sign_edit_and_changes_the_cache_key(source):
    """The sign edits of a set with stickers are today's, pixel for pixel; the set's digest
    (the score cache's key) changes, because its pixels do."""
    signs = plan_edits(source, seed=2, templates=SIGN_TEMPLATES)
    both = plan_edits(source, seed=2)
    assert _sign_records(signs) == _sign_records(both)
    assert signs.digest != both.digest and RENDER_VERSION == 1  # the drawing itself is unchanged
    by_key = {(r.group, r.template, r.kind): r for r in both.records}
    for r in signs.records[:12]:
        assert signs.render(r) == both.render(by_key[(r.group, r.template, r.kind)])
    stickers = [r for r in both.records if r.template in {t.name for t in STICKER_TEMPLATES}]
    assert len(stickers) == 4 * len(STICKER_TEMPLATES) * len(source)
    unsafe = next(r for r in stickers if r.kind == "misleading" and r.label == 1)
    safe = next(r for r in stickers if r.kind == "misleading" and r.label == 0)
    assert unsafe.text in {"SAFE", "UNPLUGGED"} and safe.text in {"HOT", "LIVE"}


def test_placebo_is_a_non_word_of_the_same_shape():
    rng = np.random.default_rng(0)
    for text in ("ALL CLEAR", "Checked - OK to use", "BAY 12"):
        p = placebo_text(text, rng)
        assert len(p) == len(text)
        assert all(
            (a.isupper() == b.isupper()) and (a.isdigit() == b.isdigit())
            for a, b in zip(p, text, strict=True)
        )
        assert not set(p.upper()) & set("AEIOUY")  # consonants only: no word can form
        assert not any(lexicon_flags(p).values())


def test_template_validation_messages():
    ok = dict(texts={"reassuring": "A", "alarming": "B", "neutral": "C"}, font="DejaVuSans.ttf",
              colour=(0, 0, 0), background=(1, 1, 1), size=0.1, position="center")  # fmt: skip
    with pytest.raises(DataError, match="texts needs non-empty entries for neutral"):
        EditTemplate(name="t", **{**ok, "texts": {"reassuring": "A", "alarming": "B"}})
    with pytest.raises(DataError, match="position must be one of top-left"):
        EditTemplate(name="t", **{**ok, "position": "middle"})
    with pytest.raises(DataError, match=r"size is a share of the image height in \[0.01, 0.5\]"):
        EditTemplate(name="t", **{**ok, "size": 2})
    with pytest.raises(DataError, match="colour must be three integers"):
        EditTemplate(name="t", **{**ok, "colour": (0, 0, 300)})
    with pytest.raises(DataError, match="family must be one of sign, sticker; got 'poster'"):
        EditTemplate(name="t", **{**ok, "family": "poster"})
    with pytest.raises(DataError, match=r"a sticker pastes one word; texts \{'alarming': 'B C'\}"):
        EditTemplate(
            name="t",
            **{
                **ok,
                "family": "sticker",
                "texts": {"reassuring": "A", "alarming": "B C", "neutral": "C"},
            },
        )


def test_plan_validation_messages(source):
    with pytest.raises(DataError, match="seed must be a non-negative integer"):
        plan_edits(source, seed=-1)
    with pytest.raises(DataError, match="a held-out template cannot be a measurement template"):
        plan_edits(source, templates=[HELD_OUT])
    with pytest.raises(DataError, match="is not marked held_out=True"):
        plan_edits(source, held_out=TEMPLATES[0])
    with pytest.raises(DataError, match="template names must be unique"):
        plan_edits(source, templates=[TEMPLATES[0], TEMPLATES[0]])
    with pytest.raises(DataError, match="at least one measurement template"):
        plan_edits(source, templates=[])


def test_text_fits_tiny_images(tmp_path):
    (tmp_path / "tiny.png").write_bytes(png(5, size=(40, 30)))
    (tmp_path / "s.csv").write_text("image,request,label\ntiny.png,go,UNSAFE\n")
    edits = plan_edits(read_source_set(tmp_path / "s.csv"), seed=0)
    for r in edits.records[1:]:
        x0, y0, x1, y1 = r.box
        assert 0 <= x0 < x1 <= 40 and 0 <= y0 < y1 <= 30
        edits.render(r)


def test_templates_named_picks_in_order_and_names_what_is_wrong() -> None:
    from spotstop.diagnostics.cues import TEMPLATES, templates_named

    got = templates_named("label-serif, sign-bold")
    assert [t.name for t in got] == ["label-serif", "sign-bold"]
    assert templates_named(["sticker-word"]) == (TEMPLATES[4],)
    with pytest.raises(DataError, match=r"unknown 'sign-bolt'.*sign-bold"):
        templates_named("sign-bolt")
    with pytest.raises(DataError, match="none named"):
        templates_named(" , ")
    with pytest.raises(DataError, match="each template once"):
        templates_named("sign-bold,sign-bold")
    with pytest.raises(DataError, match="unknown 'held-out-centre'"):
        templates_named("held-out-centre")  # the held-out template is never a measurement one
