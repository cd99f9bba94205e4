"""Frames that show nothing are refused, never judged from the request alone.

A covered lens (black with sensor noise), a frame blown out to white, a gray fill from a
broken pipeline and a frame of one colour were decoded, scored and answered like any scene:
with a policy that allows the request, each was SAFE, for a scene nobody saw. Each is now
refused by one rule (``check_visible_content``, the statistic ``image_contrast``) in the
library (one check, a batch, a caller-decoded image), ``spotstop check``, the sidecar and a
calibration pool, and the setting ``min_image_contrast`` is validated where it is given.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from spotstop.guard import ConfigError, Guard, Scene
from spotstop.guard._image import (
    DEFAULT_MIN_CONTRAST,
    ImageRefused,
    check_visible_content,
    decode_image,
    image_contrast,
)

from tests._support.guard import make_scene, set_frozen

_REASON = "image shows no visible content"


def _encode(arr: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _noisy(level: float, sigma: float, size: tuple[int, int], fmt: str, seed: int = 0) -> bytes:
    """A frame of one level with Gaussian sensor noise (clipped to 0..255, as a camera's)."""
    w, h = size
    noise = np.random.default_rng(seed).normal(level, sigma, (h, w, 3))
    return _encode(np.clip(np.rint(noise), 0, 255).astype(np.uint8), fmt)


def _flat(colour: tuple[int, int, int], size: tuple[int, int], fmt: str) -> bytes:
    w, h = size
    return _encode(np.broadcast_to(np.asarray(colour, np.uint8), (h, w, 3)).copy(), fmt)


#: frames that show nothing, as cameras and pipelines send them
BLANK = {
    "covered lens": _noisy(3, 8, (640, 480), "JPEG"),
    "blown out": _noisy(252, 8, (320, 240), "JPEG", seed=1),
    "gray fill": _flat((128, 128, 128), (640, 480), "PNG"),
    "one colour": _flat((30, 160, 90), (200, 150), "WEBP"),
}


def _world_scenes() -> list[bytes]:
    from spotstop.export import world as W

    out = []
    for opts in (W.WorldOptions(offsets=1.0), W.WorldOptions(offsets=1.0, size=(64, 64))):
        out += [W.case_image(c, opts) for c in W.world_cases(1, opts)[:24]]
    return out


def _demo_scenes() -> list[bytes]:
    from spotstop.export.scenes import demo_scenes

    return [s.image for s in demo_scenes(24, seed=11)]  # type: ignore[misc]


# --------------------------------------------------------------------------- the statistic


def test_the_contrast_reads_content_not_noise() -> None:
    for name, data in BLANK.items():
        c = image_contrast(decode_image(data).image)
        assert c < DEFAULT_MIN_CONTRAST, (name, c)
    assert image_contrast(decode_image(BLANK["gray fill"]).image) == 0.0
    for data in [*_world_scenes(), *_demo_scenes()]:
        assert image_contrast(decode_image(data).image) > 2 * DEFAULT_MIN_CONTRAST
    # colour counts: a red and a green half of the same brightness (a luminance would see 0)
    halves = np.zeros((240, 320, 3), np.uint8)
    halves[:, :160] = (200, 0, 0)
    halves[:, 160:] = (0, 102, 0)  # 0.299 * 200 == 0.587 * 102 (to a level)
    # (two equal halves: the background surface runs between them, 92 of the 200 levels)
    assert image_contrast(Image.fromarray(halves)) >= 80
    # a dim room: a real scene at a tenth of the light still shows (levels 0..25)
    dim = np.asarray(decode_image(_world_scenes()[0]).image, np.float64) * 0.1
    assert image_contrast(Image.fromarray(np.rint(dim).astype(np.uint8))) > DEFAULT_MIN_CONTRAST
    # a hot pixel on a covered lens is not content (cells average it, percentiles drop it)
    speck = np.zeros((480, 640, 3), np.uint8)
    speck[100, 200] = 255
    assert image_contrast(Image.fromarray(speck)) < 1.0
    # a huge frame is reduced first, to the same answer
    assert image_contrast(Image.fromarray(np.tile(halves, (10, 10, 1)))) >= 80


def test_check_visible_content_refuses_below_the_setting_and_0_turns_it_off() -> None:
    image = decode_image(BLANK["covered lens"]).image
    with pytest.raises(ImageRefused, match=_REASON) as info:
        check_visible_content(image, DEFAULT_MIN_CONTRAST)
    assert info.value.kind == "blank" and "min_image_contrast" in str(info.value)
    check_visible_content(image, 0.0)  # off
    with pytest.raises(ImageRefused, match=_REASON) as info:
        decode_image(BLANK["gray fill"], min_contrast=DEFAULT_MIN_CONTRAST)
    assert info.value.kind == "blank"
    decode_image(BLANK["gray fill"])  # decode_image alone refuses nothing by default


# --------------------------------------------------------------------------- the library


def test_a_frame_that_shows_nothing_fails_closed_and_is_logged(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """With a policy that allows every scored scene, each blank frame was SAFE."""
    set_frozen(bundle_copy, 1e9)  # every scene that is scored is SAFE
    ordinary = [Scene(_world_scenes()[0], "open the door"), make_scene(0)]
    blank = [Scene(data, "open the door") for data in BLANK.values()]
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        got = g.check_batch([*blank, *ordinary])
        for name, d in zip(BLANK, got, strict=False):
            assert d.label == "UNSAFE" and d.fail_closed, (name, d)
            assert _REASON in (d.fail_reason or "") and "min_image_contrast" in (
                d.fail_reason or ""
            ), d.fail_reason
            assert (d.fail_reason or "").startswith("input: ImageRefused")  # (reason kind input)
        assert [d.label for d in got[len(blank) :]] == ["SAFE", "SAFE"]
        one = g.check(Scene(BLANK["covered lens"], "open the door"))
        decoded = g.check(Scene(decode_image(BLANK["blown out"]), "open the door"))
        for d in (one, decoded):
            assert d.label == "UNSAFE" and d.fail_closed and _REASON in (d.fail_reason or "")
        g.flush_pending()
        rows = list(g.log.records())
    assert len(rows) == len(blank) + len(ordinary) + 2
    assert sum(_REASON in (r.fail_reason or "") for r in rows) == len(blank) + 2
    # the setting turned off: the same frame is scored, and this policy allows it
    with Guard(bundle_copy, log=tmp_path / "off.sqlite", min_image_contrast=0) as g:
        assert g.min_image_contrast == 0.0
        assert g.check(Scene(BLANK["gray fill"], "open the door")).label == "SAFE"


def test_spotstop_check_answers_unsafe_for_a_blank_frame(
    bundle_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotstop.cli import main

    set_frozen(bundle_copy, 1e9)
    img = tmp_path / "covered.jpg"
    img.write_bytes(BLANK["covered lens"])
    args = ["check", str(img), "--request", "x", "--bundle", str(bundle_copy), "--json"]
    assert main([*args, "--log", str(tmp_path / "cli.sqlite")]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["label"] == "UNSAFE" and d["fail_closed"] and _REASON in d["fail_reason"]
    assert d["decision_id"]  # logged
    off = [*args, "--log", str(tmp_path / "off.sqlite"), "--min-image-contrast", "0"]
    assert main(off) == 0  # the flag reaches the guard (off: judged, and allowed)
    capsys.readouterr()
    assert main([*args, "--min-image-contrast", "-1"]) == 2
    assert "--min-image-contrast must be a number of levels in [0, 255]" in capsys.readouterr().err


def test_offline_scoring_and_a_pool_refuse_a_blank_frame_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spotstop score` and `policy init` check frames "as the guard checks a scene": a blank
    one was scored, or went into a pool's reference statistics, though the guard refuses it."""
    from spotstop.calibrate import CalibrationError
    from spotstop.calibrate._pool import pool_scenes
    from spotstop.cli import main

    folder = tmp_path / "img"
    folder.mkdir()
    (folder / "covered.jpg").write_bytes(BLANK["covered lens"])
    assert main(["score", str(folder), "--request", "go", "--member", "nope"]) == 2
    err = capsys.readouterr().err
    assert f"scene 0 (covered.jpg): not scored: the guard refuses the image: {_REASON}" in err
    assert main(["score", str(folder / "covered.jpg"), "--request", "go", "--member", "no"]) == 2
    assert _REASON in capsys.readouterr().err
    for i, data in enumerate(_demo_scenes()[:8]):
        (folder / f"frame{i}.png").write_bytes(data)
    with pytest.raises(CalibrationError) as info:
        pool_scenes(folder, ["open the door"])
    assert "1 of the 9 pool images" in str(info.value)
    assert f"{folder / 'covered.jpg'}: {_REASON}" in str(info.value)
    assert len(pool_scenes(folder, ["open the door"], min_contrast=0)) == 9


# --------------------------------------------------------------------------- the sidecar


def test_the_sidecar_refuses_a_blank_frame_and_the_client_fails_closed(
    runtime_bundle: Path, tmp_path: Path
) -> None:
    pytest.importorskip("fastapi")
    import base64

    from spotstop.guard.client import GuardClient
    from spotstop.guard.serve import load_guard

    from tests._support.serve import jpeg, live_server, multipart, settings_for, stand_in

    settings = settings_for(runtime_bundle, tmp_path, warmup=False)
    assert settings.min_image_contrast == DEFAULT_MIN_CONTRAST
    with live_server(settings, stand_in(load_guard(settings))) as srv, srv.client() as c:
        r = c.post("/v1/check", **multipart(BLANK["covered lens"]))
        assert r.status_code == 422 and r.json()["code"] == "image_blank", r.text
        assert r.json()["field"] == "image" and "min_image_contrast" in r.json()["message"]
        scenes = [
            {"image_base64": base64.b64encode(data).decode(), "request": "x"}
            for data in (jpeg(1), BLANK["one colour"])
        ]
        r = c.post("/v1/check/batch", json={"scenes": scenes})
        assert r.status_code == 422 and r.json()["code"] == "image_blank"
        assert r.json()["field"] == "scenes[1].image_base64"
        assert c.post("/v1/check", **multipart(jpeg(2))).status_code == 200
        m = c.get("/metrics").text
        assert 'spotstop_input_refused_total{code="image_blank"} 2.0' in m
        assert srv.guard.log.count() == 1  # the refused frames made no decision
        with GuardClient(srv.url, timeout_s=30) as gc:
            d = gc.check(Scene(BLANK["gray fill"], "open the door"))
        assert d.label == "UNSAFE" and d.fail_closed and "image_blank" in (d.fail_reason or "")
    (tmp_path / "off").mkdir()
    off = settings_for(runtime_bundle, tmp_path / "off", warmup=False, min_image_contrast=0)
    with live_server(off, stand_in(load_guard(off))) as srv, srv.client() as c:
        assert c.post("/v1/check", **multipart(BLANK["covered lens"])).status_code == 200


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("bad", [-1, 255.5, math.nan, math.inf, "8", True, None])
def test_min_image_contrast_is_validated_naming_the_key(
    bad: object, runtime_bundle: Path, tmp_path: Path
) -> None:
    words = "must be a number of levels in [0, 255] (0 turns the check off)"
    with pytest.raises(ConfigError) as info:
        Guard(runtime_bundle, log=tmp_path / "l.sqlite", min_image_contrast=bad)  # type: ignore[arg-type]
    assert f"min_image_contrast {words}; got {bad!r}" in str(info.value)
    assert not (tmp_path / "l.sqlite").exists()  # refused before anything is opened
    with pytest.raises(ConfigError, match=r"min_contrast must be a number of levels"):
        decode_image(BLANK["gray fill"], min_contrast=bad)  # type: ignore[arg-type]


def test_min_image_contrast_in_the_serve_config(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from spotstop.guard.serve import ServeSettings, SettingsError
    from spotstop.guard.serve._settings import load_serve_config

    cfg = tmp_path / "serve.yaml"
    cfg.write_text("bundle: b\nmin_image_contrast: 12.5\n")
    assert ServeSettings(**load_serve_config(cfg)).min_image_contrast == 12.5
    cfg.write_text("bundle: b\nmin_image_contrast: 0\n")
    assert ServeSettings(**load_serve_config(cfg)).min_image_contrast == 0.0
    for value in ("high", "-3", "300", "'8'", ".nan"):
        cfg.write_text(f"bundle: b\nmin_image_contrast: {value}\n")
        with pytest.raises(SettingsError, match=r"^min_image_contrast must be a number of lev"):
            ServeSettings(**load_serve_config(cfg))
    cfg.write_text("bundle: b\nmin_image_contrst: 8\n")
    with pytest.raises(SettingsError, match=r"Did you mean 'min_image_contrast'"):
        load_serve_config(cfg)


def test_spotstop_serve_takes_min_image_contrast_from_its_config_and_flag(
    runtime_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    import spotstop.guard.serve as serve_module
    from spotstop.cli import main

    seen = []
    monkeypatch.setattr(serve_module, "load_guard", lambda s: seen.append(s))
    monkeypatch.setattr(serve_module, "serve", lambda settings, guard, log_level: 0)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"bundle: {runtime_bundle}\nsighup: false\nmin_image_contrast: 12\n")
    assert main(["serve", "--config", str(cfg)]) == 0
    assert main(["serve", "--config", str(cfg), "--min-image-contrast", "3.5"]) == 0
    assert [s.min_image_contrast for s in seen] == [12.0, 3.5]  # a flag wins over the file
