"""Frames that show (almost) nothing of the scene are refused, though something is drawn on them.

``image_contrast`` was the widest 1st-99th percentile range of the cells' means: a covered
lens on a camera that burns a timestamp into its frames (black with sensor noise and a white
text band over more than 1 % of the cells), a crosshair, a logo, a lens covered but for a
small corner, or a smooth light leak over a covered lens (a wide ramp with no detail) had a
contrast far above ``min_image_contrast`` and was judged from its request alone. The rule
(``check_visible_content``, one function for the library, ``spotstop check``, the sidecar and
a pool) now takes thin overlays out, measures against the frame's smooth background and asks
content to cover 2 % of the frame.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont
from spotstop.guard import Guard, Scene
from spotstop.guard._image import (
    DEFAULT_MIN_CONTRAST,
    ImageRefused,
    check_visible_content,
    decode_image,
    image_contrast,
)

from tests._support.guard import make_scene, set_frozen

_REASON = "image shows no visible content"


def _jpeg(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _covered(
    size: tuple[int, int], level: float = 3, sigma: float = 6, seed: int = 0
) -> np.ndarray:
    """A covered lens: one level with Gaussian sensor noise."""
    w, h = size
    noise = np.random.default_rng(seed).normal(level, sigma, (h, w, 3))
    return np.clip(np.rint(noise), 0, 255).astype(np.uint8)


def _stamp(
    arr: np.ndarray, height: float, xy: tuple[int, int], lines: int = 1, outline: int = 0
) -> np.ndarray:
    """Burn a white timestamp (black outline, ``outline`` px or a twelfth of the letters'
    height) of ``height`` of the frame's height at ``xy``."""
    image = Image.fromarray(arr)
    px = max(6, round(height * image.height))
    font = ImageFont.load_default(size=px)
    d = ImageDraw.Draw(image)
    for i, text in enumerate(["2026-12-05 23:55:01", "CAM 03  LOADING DOCK"][:lines]):
        d.text(
            (xy[0], xy[1] + i * round(1.3 * px)),
            text,
            font=font,
            fill=(255, 255, 255),
            stroke_width=outline or max(1, px // 12),
            stroke_fill=(0, 0, 0),
        )
    return np.asarray(image).copy()


def _crosshair(arr: np.ndarray) -> np.ndarray:
    image = Image.fromarray(arr)
    w, h = image.size
    d = ImageDraw.Draw(image)
    d.line([(0, h // 2), (w, h // 2)], fill=(255, 255, 255), width=3)
    d.line([(w // 2, 0), (w // 2, h)], fill=(255, 255, 255), width=3)
    return np.asarray(image).copy()


def _logo(arr: np.ndarray, share: float = 0.01) -> np.ndarray:
    image = Image.fromarray(arr)
    w, h = image.size
    s = round(2 * np.sqrt(share * w * h / np.pi))
    d = ImageDraw.Draw(image)
    d.ellipse([w - s - 8, 8, w - 8, 8 + s], fill=(230, 230, 230))
    d.rectangle(
        [w - 8 - 3 * s // 4, 8 + s // 4, w - 8 - s // 4, 8 + 3 * s // 4], fill=(200, 30, 30)
    )
    return np.asarray(image).copy()


def _ramp(size: tuple[int, int], amplitude: float, sigma: float = 4) -> np.ndarray:
    """A light leak over a covered lens: a smooth diagonal ramp and sensor noise."""
    w, h = size
    ys, xs = np.mgrid[0:h, 0:w]
    leak = amplitude * (xs / w + ys / h) / 2
    noise = np.random.default_rng(5).normal(0, sigma, (h, w, 3))
    return np.clip(np.rint(leak[..., None] + noise), 0, 255).astype(np.uint8)


def _osd_box(
    arr: np.ndarray, height: float, width: float, top: bool, shade: float, outline: int = 2
) -> np.ndarray:
    """An on-screen display on a filled box: a box of the text's height (3 px above and
    below) along the top or bottom edge, ``width`` of the frame wide (from the left), that
    darkens what is under it by ``shade`` (0.92 a dark box, 0.5 a semi-transparent one), and
    a white timestamp on it (a black outline of ``outline`` px)."""
    image = Image.fromarray(arr)
    w, h = image.size
    font = ImageFont.load_default(size=max(6, round(height * h)))
    d = ImageDraw.Draw(image)
    left, top_, right, bottom = (round(v) for v in d.textbbox((0, 0), _STAMP, font=font))
    bw, bh = max(round(width * w), right - left + 6), bottom - top_ + 6
    y0 = 0 if top else h - bh
    out = arr.astype(np.float64)
    out[y0 : y0 + bh, :bw] *= 1.0 - shade
    image = Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))
    ImageDraw.Draw(image).text(
        (3 - left, y0 + 3 - top_),
        _STAMP,
        font=font,
        fill=(255, 255, 255),
        stroke_width=outline,
        stroke_fill=(0, 0, 0),
    )
    return np.asarray(image).copy()


_STAMP = "2026-12-05 23:55:01"


def _world_640() -> np.ndarray:
    from spotstop.export import world as W

    opts = W.WorldOptions(offsets=1.0, size=(640, 480), rooms=8, contrasts_per_room=6)
    return np.asarray(decode_image(W.case_image(W.world_cases(3, opts)[0], opts)).image)


def _demo_frames(n: int) -> list[bytes]:
    from spotstop.export.scenes import demo_scenes

    return [s.image for s in demo_scenes(n, seed=11)]  # type: ignore[misc]


def _hand_over_lens(share: float) -> np.ndarray:
    """A lens covered but for a bottom-right corner of ``share`` of the frame."""
    scene = _world_640()
    out = _covered((640, 480), sigma=6, seed=9)
    ch, cw = round(480 * share**0.5), round(640 * share**0.5)
    out[-ch:, -cw:] = scene[-ch:, -cw:]
    return out


#: frames that show (almost) nothing, each of which the old rule let through
SHOW_NOTHING = {
    "covered lens and a timestamp": _jpeg(_stamp(_covered((640, 480)), 0.05, (10, 10))),
    "covered lens and two lines of large text": _jpeg(
        _stamp(_covered((640, 480), sigma=10), 0.08, (10, 380), lines=2)
    ),
    "blown out and a timestamp": _jpeg(_stamp(_covered((640, 480), 252, 6), 0.03, (330, 450))),
    "covered lens at 1080p and a timestamp": _jpeg(_stamp(_covered((1920, 1080)), 0.05, (30, 30))),
    "covered lens and a crosshair": _jpeg(_crosshair(_covered((640, 480)))),
    "covered lens and a logo": _jpeg(_logo(_covered((640, 480)))),
    "a hand over the lens": _jpeg(_hand_over_lens(0.01)),
    "a light leak": _jpeg(_ramp((640, 480), 180)),
    "a light leak and a timestamp": _jpeg(_stamp(_ramp((640, 480), 120), 0.05, (10, 10))),
    # an outlined timestamp on a frame brighter than black: filtered together, the black
    # outline and the white letters joined into a band, which counted as content
    "covered lens at video black 16, outlined text": _jpeg(
        _stamp(_covered((640, 480), 16, 4), 0.1, (10, 10), outline=3)
    ),
    "covered lens at black 32, outlined text": _jpeg(
        _stamp(_covered((640, 480), 32, 4), 0.05, (300, 420), outline=2)
    ),
    "gray fill, outlined text": _jpeg(_stamp(_covered((640, 480), 128, 4), 0.05, (10, 10))),
    "blown out to 235, outlined text": _jpeg(
        _stamp(_covered((640, 480), 235, 4), 0.05, (10, 430), outline=2)
    ),
}


#: a camera's on-screen display on a filled box over a covered, fogged or blown-out lens: the
#: box (of the text's height, over part or all of the width) counts as content (known limit,
#: DEFAULT_MIN_CONTRAST's docstring; a rule that took such boxes out also took out objects cut
#: by the frame's edge in demo scenes)
OSD_BOX_FRAMES = {
    "gray fill, a dark box under the timestamp": _jpeg(
        _osd_box(_covered((640, 480), 128, 4), 0.08, 0.0, False, 0.92)
    ),
    "gray fill, a semi-transparent full-width box": _jpeg(
        _osd_box(_covered((640, 480), 128, 10), 0.08, 1.0, False, 0.5, outline=0)
    ),
    "fogged lens, a dark half-width box": _jpeg(
        _osd_box(_covered((640, 480), 200, 4), 0.05, 0.5, False, 0.92)
    ),
    "fogged lens at 720p, a light full-width shade": _jpeg(
        _osd_box(_covered((1280, 720), 200, 4), 0.03, 1.0, True, 0.3)
    ),
    "blown out, a dark full-width box": _jpeg(
        _osd_box(_covered((640, 480), 252, 6), 0.05, 1.0, True, 0.92)
    ),
    "blown out at 1080p, a semi-transparent full-width box": _jpeg(
        _osd_box(_covered((1920, 1080), 252, 6), 0.05, 1.0, False, 0.5)
    ),
}


def test_frames_that_show_nothing_but_an_overlay_have_no_contrast() -> None:
    for name, data in SHOW_NOTHING.items():
        image = decode_image(data).image
        c = image_contrast(image)
        assert c < DEFAULT_MIN_CONTRAST, (name, c)
        with pytest.raises(ImageRefused, match=_REASON) as info:
            check_visible_content(image, DEFAULT_MIN_CONTRAST)
        assert info.value.kind == "blank"


def test_a_scene_behind_the_overlay_or_past_the_hand_still_counts() -> None:
    scene = _world_640()
    stamped = decode_image(_jpeg(_stamp(scene, 0.05, (10, 10)))).image
    assert image_contrast(stamped) > 2 * DEFAULT_MIN_CONTRAST
    # a scene that fills a tenth of the frame is seen
    assert image_contrast(decode_image(_jpeg(_hand_over_lens(0.1))).image) > DEFAULT_MIN_CONTRAST
    # an object on a ramp is content, though the ramp is not
    lit = _ramp((640, 480), 120)
    lit[200:280, 260:380] = (200, 40, 40)
    assert image_contrast(Image.fromarray(lit)) > 2 * DEFAULT_MIN_CONTRAST


def test_no_small_overlay_makes_a_blank_frame_pass() -> None:
    """Property: white or gray text, plain or with a black outline of 1-2 px, and lines (as a
    camera's on-screen display draws them) anywhere on a covered lens (black 0 to video
    black 16-32, or a gray fill; noise up to sigma 10), with a disc (a logo, a speck of
    light) of at most 0.2 % of the frame, never lift it to the default. (Documented limits:
    outlined text on the lit part of a light leak, and saturated colour text in a JPEG,
    whose chroma subsampling widens its strokes.)"""
    rng = np.random.default_rng(2026)
    for trial in range(40):
        size = ((640, 480), (320, 240), (1280, 720))[trial % 3]
        level = float(rng.choice([0, 3, 8, 16, 24, 32, 128]))
        arr = _covered(size, level, float(rng.uniform(0, 10)), seed=trial)
        image = Image.fromarray(arr)
        w, h = size
        d = ImageDraw.Draw(image)
        colour = (int(rng.integers(128, 256)),) * 3
        for i in range(int(rng.integers(1, 4))):
            kind = rng.integers(3) if i == 0 else rng.integers(2)  # (one disc at most)
            x, y = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 20))
            if kind == 0:  # text of 3..8 % of the height
                px = max(6, round(h * float(rng.uniform(0.03, 0.08))))
                font = ImageFont.load_default(size=px)
                outline = int(rng.integers(0, 3))
                d.text(
                    (x, y),
                    "2026-12-05 23:55:01",
                    font=font,
                    fill=colour,
                    stroke_width=outline,
                    stroke_fill=(0, 0, 0),
                )
            elif kind == 1:  # a line of 1..3 px
                x2, y2 = int(rng.integers(0, w)), int(rng.integers(0, h))
                d.line([(x, y), (x2, y2)], fill=colour, width=int(rng.integers(1, 4)))
            else:  # a disc of at most 0.2 % of the frame
                s = round(2 * np.sqrt(float(rng.uniform(0.0005, 0.002)) * w * h / np.pi))
                d.ellipse([x, y, x + s, y + s], fill=colour)
        c = image_contrast(decode_image(_jpeg(np.asarray(image))).image)
        assert c < DEFAULT_MIN_CONTRAST, (trial, size, level, c)


def test_frames_with_an_osd_box_have_no_contrast() -> None:
    for name, data in OSD_BOX_FRAMES.items():
        image = decode_image(data).image
        c = image_contrast(image)
        assert c < DEFAULT_MIN_CONTRAST, (name, c)
        with pytest.raises(ImageRefused, match=_REASON) as info:
            check_visible_content(image, DEFAULT_MIN_CONTRAST)
        assert info.value.kind == "blank"


def test_texture_that_goes_on_past_the_edge_band_is_not_an_overlay() -> None:
    """Rows full of steps along the bottom edge are a display only where they stop inside
    ``OVERLAY_BAND``: stripes over the bottom 30 % of a gray frame (the scene's texture) are
    kept, and measured; the same stripes over its bottom 5 % are left out."""
    from spotstop.guard._image import _overlay_strips

    frame = np.full((240, 320, 3), 128, np.uint8)
    stripes = np.where((np.arange(320) // 6) % 2 == 0, 200, 60).astype(np.uint8)
    tall = frame.copy()
    tall[-72:] = stripes[None, :, None]
    assert _overlay_strips(tall) == []
    assert image_contrast(Image.fromarray(tall)) > 2 * DEFAULT_MIN_CONTRAST
    short = frame.copy()
    short[-12:] = stripes[None, :, None]
    [(start, stop)] = _overlay_strips(short)
    assert stop == 240 and 240 - 16 <= start <= 240 - 12


def test_taking_thin_structures_out_never_leaves_the_frames_range() -> None:
    """``_thin_out`` only takes out: no pixel comes out darker than the darkest of the frame
    or brighter than its brightest. Beside a step of its rounded background level a filter's
    square took a neighbour's level, and the sum wrapped: 256 became a black row along the
    bottom of a white frame with a display at its top, 11 levels of "content"."""
    from spotstop.guard._image import _thin_out

    arr = _osd_box(_covered((160, 120), 255, 0), 0.03, 1.0, True, 0.5, outline=0)
    a = np.asarray(decode_image(_jpeg(arr)).image)
    thinned = _thin_out(a, 2, 160)
    assert a.min() > 100  # (no outline: the darkest is the box)
    assert thinned.min() >= a.min() and thinned.max() <= a.max()


def test_no_osd_box_makes_a_gray_fogged_or_white_frame_pass() -> None:
    """Property: an on-screen display on a filled box (dark, semi-transparent or a light
    shade; of the text's height, 3 to 8 % of the frame's, as wide as the text or up to the
    whole width; along the top or bottom edge; the text with or without an outline) on a
    gray, fogged or blown-out lens (110 to 255, noise up to sigma 10), 160x120 to 1920x1080,
    never lifts it to the default (it did to 235 before the rows of such a display were
    left out of the measure: ``OVERLAY_BAND``)."""
    rng = np.random.default_rng(2027)
    for trial in range(32):
        size = ((160, 120), (640, 480), (1280, 720), (1920, 1080))[trial % 4]
        level = float(rng.uniform(110, 255))
        arr = _covered(size, level, float(rng.uniform(0, 10)), seed=100 + trial)
        arr = _osd_box(
            arr,
            float(rng.uniform(0.03, 0.08)),
            float(rng.choice([0.0, 0.5, 1.0])),
            bool(rng.integers(2)),
            float(rng.choice([0.3, 0.5, 0.92])),
            outline=int(rng.integers(0, 3)),
        )
        c = image_contrast(decode_image(_jpeg(arr)).image)
        assert c < DEFAULT_MIN_CONTRAST, (trial, size, level, c)


def test_a_scene_with_an_osd_box_still_counts() -> None:
    """A scene with its camera's timestamp on a box (dark or semi-transparent, as wide as
    the text or the whole frame) keeps its contrast: taking the box out leaves the scene."""
    from spotstop.export import world as W

    opts = W.WorldOptions(offsets=1.0)
    scenes = [
        np.asarray(decode_image(W.case_image(c, opts)).image) for c in W.world_cases(1, opts)[:4]
    ]
    scenes += [np.asarray(decode_image(f).image) for f in _demo_frames(4)] + [_world_640()]
    for i, scene in enumerate(scenes):
        for width, top, shade in ((0.0, True, 0.92), (1.0, False, 0.92), (1.0, True, 0.5)):
            c = image_contrast(decode_image(_jpeg(_osd_box(scene, 0.05, width, top, shade))).image)
            assert c > 1.5 * DEFAULT_MIN_CONTRAST, (i, width, top, shade, c)


def test_a_frame_with_an_overlay_fails_closed_and_is_logged(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """With a policy that allows every scored scene, each of these frames was SAFE (those
    with an on-screen display on a box until 2026-12-08)."""
    set_frozen(bundle_copy, 1e9)
    named = {**SHOW_NOTHING, **OSD_BOX_FRAMES}
    frames = list(named.values())
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        got = g.check_batch([*(Scene(f, "open the door") for f in frames), make_scene(0)])
        for name, d in zip(named, got, strict=False):
            assert d.label == "UNSAFE" and d.fail_closed, (name, d)
            assert (d.fail_reason or "").startswith("input: ImageRefused"), d.fail_reason
            assert _REASON in (d.fail_reason or ""), d.fail_reason
        assert got[-1].label == "SAFE"
        decoded = g.check(Scene(decode_image(frames[0]), "open the door"))
        assert decoded.label == "UNSAFE" and _REASON in (decoded.fail_reason or "")
        g.flush_pending()
        rows = list(g.log.records())
    assert sum(_REASON in (r.fail_reason or "") for r in rows) == len(frames) + 1


def test_spotstop_check_and_a_pool_refuse_a_frame_with_an_overlay(
    bundle_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotstop.calibrate import CalibrationError
    from spotstop.calibrate._pool import pool_scenes
    from spotstop.cli import main

    set_frozen(bundle_copy, 1e9)
    img = tmp_path / "stamped.jpg"
    img.write_bytes(SHOW_NOTHING["covered lens and a timestamp"])
    args = ["check", str(img), "--request", "x", "--bundle", str(bundle_copy), "--json"]
    assert main([*args, "--log", str(tmp_path / "cli.sqlite")]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["label"] == "UNSAFE" and d["fail_closed"] and _REASON in d["fail_reason"]
    folder = tmp_path / "pool"
    folder.mkdir()
    (folder / "leak.jpg").write_bytes(SHOW_NOTHING["a light leak and a timestamp"])
    for i, data in enumerate(_demo_frames(8)):
        (folder / f"frame{i}.png").write_bytes(data)
    with pytest.raises(CalibrationError) as info:
        pool_scenes(folder, ["open the door"])
    assert "1 of the 9 pool images" in str(info.value)
    assert f"{folder / 'leak.jpg'}: {_REASON}" in str(info.value)


def test_the_sidecar_refuses_a_frame_with_an_overlay(runtime_bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from spotstop.guard.serve import load_guard

    from tests._support.serve import jpeg, live_server, multipart, settings_for, stand_in

    settings = settings_for(runtime_bundle, tmp_path, warmup=False)
    with live_server(settings, stand_in(load_guard(settings))) as srv, srv.client() as c:
        for name in ("covered lens and a timestamp", "a light leak", "covered lens and a logo"):
            r = c.post("/v1/check", **multipart(SHOW_NOTHING[name]))
            assert r.status_code == 422 and r.json()["code"] == "image_blank", (name, r.text)
        assert c.post("/v1/check", **multipart(jpeg(2))).status_code == 200
        assert srv.guard.log.count() == 1  # the refused frames made no decision


# --------------------------------------------------------------------------- computed once


def test_the_sidecar_computes_the_contrast_once_and_a_hand_built_image_is_checked(
    runtime_bundle: Path, bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar checked a frame for its 422 and the guard checked the same object again
    (about 9 ms each at 640x480). A DecodedImage that decode_image checked is not measured
    twice; one built by hand, or by dataclasses.replace, still is."""
    pytest.importorskip("fastapi")
    import dataclasses

    import spotstop.guard._image as image_module
    from spotstop.guard._image import DecodedImage
    from spotstop.guard.serve import load_guard

    from tests._support.serve import live_server, multipart, settings_for, stand_in

    calls: list[int] = []
    real = image_module.image_contrast

    def counted(image: Image.Image) -> float:
        calls.append(1)
        return real(image)

    monkeypatch.setattr(image_module, "image_contrast", counted)
    scene = _jpeg(_world_640())
    settings = settings_for(runtime_bundle, tmp_path, warmup=False)
    with live_server(settings, stand_in(load_guard(settings))) as srv, srv.client() as c:
        calls.clear()
        assert c.post("/v1/check", **multipart(scene)).status_code == 200
        assert len(calls) == 1
    set_frozen(bundle_copy, 1e9)  # every scored scene is SAFE
    blank = Image.fromarray(_stamp(_covered((640, 480)), 0.05, (10, 10)))
    checked = decode_image(scene, min_contrast=DEFAULT_MIN_CONTRAST)
    by_hand = DecodedImage(
        image=blank,
        sha256=checked.sha256,
        width=640,
        height=480,
        n_bytes=checked.n_bytes,
        format="JPEG",
        jpeg_quality=None,
    )
    replaced = dataclasses.replace(checked, image=blank)
    lowered = decode_image(SHOW_NOTHING["covered lens and a logo"], min_contrast=1.0)  # (3.0)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        calls.clear()
        assert g.check(Scene(checked, "open the door")).label == "SAFE"
        assert calls == []  # decode_image measured it, against the guard's setting
        for img in (by_hand, replaced, lowered):
            d = g.check(Scene(img, "open the door"))
            assert d.label == "UNSAFE" and d.fail_closed and _REASON in (d.fail_reason or "")
        assert len(calls) == 3
