"""A JPEG cut short that still ends with an end-of-image marker (FF D9): Pillow decoded it
without an error (libjpeg warns "Premature end of JPEG file", Pillow drops the warning) and
the rest of the frame came out flat gray, which the guard scored. It is refused as
``truncated``; valid frames with gray in them are not."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from spotstop.guard import Guard, Scene
from spotstop.guard._image import DEFAULT_MIN_CONTRAST, ImageRefused, decode_image

from tests._support.guard import set_frozen
from tests._support.images import make_scene_array

# (Pillow's save arguments, the MCU's height in px)
_LAYOUTS = {
    "baseline-420": ({"quality": 75}, 16),
    "baseline-444": ({"quality": 90, "subsampling": 0}, 8),
    "baseline-422": ({"quality": 75, "subsampling": 1}, 8),
    "optimized-95": ({"quality": 95, "optimize": True}, 16),
    "restart-blocks": ({"quality": 75, "restart_marker_blocks": 7}, 16),
    "restart-rows": ({"quality": 75, "restart_marker_rows": 2}, 16),
    "restart-444": ({"quality": 90, "subsampling": 0, "restart_marker_rows": 1}, 8),
}
_SIZE = (320, 240)


def _jpeg(array: np.ndarray, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    mode = "L" if array.ndim == 2 else "RGB"
    Image.fromarray(array, mode).save(buffer, "JPEG", **kwargs)
    return buffer.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB")).astype(np.int16)


def _scan_data(data: bytes) -> tuple[int, int]:
    """The first and the last byte offsets of the (last) scan's entropy-coded data."""
    sos = data.rindex(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    return start, data.rindex(b"\xff\xd9")


def _cut(data: bytes, at: int) -> bytes:
    """``data`` cut after ``at`` bytes and re-terminated, as a stopped transfer whose sender
    appended the end-of-image marker."""
    return data[:at] + b"\xff\xd9"


def _first_changed_row(whole: bytes, cut: bytes) -> int:
    diff = np.abs(_pixels(whole) - _pixels(cut)).max(axis=(1, 2))
    rows = np.flatnonzero(diff)
    assert rows.size, "the cut changed no pixel"
    return int(rows[0])


def _refused(data: bytes, *words: str, **kwargs: object) -> ImageRefused:
    with pytest.raises(ImageRefused) as info:
        decode_image(data, **kwargs)  # type: ignore[arg-type]
    assert info.value.kind == "truncated", str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)
    return info.value


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("where", ["first MCU row", "mid-frame", "last MCU row"])
def test_a_jpeg_cut_short_and_re_terminated_is_refused(layout: str, where: str) -> None:
    kwargs, mcu_h = _LAYOUTS[layout]
    whole = _jpeg(make_scene_array(7, _SIZE), **kwargs)
    assert decode_image(whole).format == "JPEG"
    start, end = _scan_data(whole)
    rows = _SIZE[1] // mcu_h
    at = {
        "first MCU row": start + (end - start) // (3 * rows),
        "mid-frame": (start + end) // 2,
        "last MCU row": end - (end - start) // (3 * rows),
    }[where]
    cut = _cut(whole, at)
    # (the cut lands where it says: checked on the pixels, apart from the rule under test;
    # chroma upsampling carries a change one row up)
    first = _first_changed_row(whole, cut) + 1
    band = {"first MCU row": (0, 1), "mid-frame": (1, rows - 1), "last MCU row": (rows - 1, rows)}
    low, high = band[where]
    assert low * mcu_h <= first < high * mcu_h, (first, where)
    # libjpeg left the frame's tail exact mid gray: what the guard would have scored
    assert (_pixels(cut)[-mcu_h + 1 :, -mcu_h + 1 :] == 128).all()
    error = _refused(cut, "truncated", "MCUs", "end-of-image marker (FF D9)", "complete file")
    assert "gray" in str(error)


def test_a_grayscale_jpeg_cut_short_is_refused() -> None:
    whole = _jpeg(make_scene_array(3, _SIZE)[..., 1])
    start, end = _scan_data(whole)
    _refused(_cut(whole, (start + end) // 2), "MCUs", "(8x8 px)")


def test_a_cmyk_jpeg_is_always_counted() -> None:
    """No gray corner is looked for in a CMYK frame: every one is counted."""
    buffer = io.BytesIO()
    Image.fromarray(make_scene_array(3, _SIZE)).convert("CMYK").save(buffer, "JPEG")
    whole = buffer.getvalue()
    assert decode_image(whole).format == "JPEG"
    start, end = _scan_data(whole)
    _refused(_cut(whole, (start + end) // 2), "MCUs")


@pytest.mark.parametrize("subsampling", [0, 2])
def test_a_progressive_jpeg_cut_before_its_last_scan_is_refused(subsampling: int) -> None:
    """A progressive frame cut in any scan but its last lacks the scans that bring its
    coefficients to full precision (libjpeg's script: 10 scans, the last the luma AC
    refinement)."""
    whole = _jpeg(make_scene_array(5, _SIZE), progressive=True, subsampling=subsampling)
    sos = [i for i in range(len(whole)) if whole.startswith(b"\xff\xda", i)]
    assert len(sos) == 10
    for k in (0, 1, 5, 8):  # inside scans 1, 2, 6 and 9
        nxt = sos[k + 1]
        error = _refused(_cut(whole, (sos[k] + nxt) // 2), "progressive", f"after {k + 1} scan")
        assert "later scans were cut off" in str(error)


def test_a_progressive_jpeg_cut_inside_its_last_scan_decodes_coarser_and_is_not_refused() -> None:
    """The documented gap: the last scan (libjpeg's luma AC refinement, over half the bytes)
    cut short is not counted (that needs a decode of every earlier AC scan); the blocks after
    the cut lack the last bit of the luma AC coefficients and no block is gray."""
    whole = _jpeg(make_scene_array(5, _SIZE), progressive=True)
    start, end = _scan_data(whole)
    cut = _cut(whole, (start + end) // 2)
    assert decode_image(cut).format == "JPEG"
    diff = np.abs(_pixels(whole) - _pixels(cut))
    assert diff.mean() > 0 and not (_pixels(cut)[-15:, -15:] == 128).all()


# --------------------------------------------------------------------------- valid frames


def _with_gray(where: str) -> np.ndarray:
    array = make_scene_array(11, _SIZE)
    h, w = array.shape[:2]
    if where == "bottom half":
        array[h // 2 :] = 128
    elif where == "bottom-right corner":
        array[h - 40 :, w - 56 :] = 128
    elif where == "last MCU only":
        array[h - 16 :, w - 16 :] = 128
    return array


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("where", ["bottom half", "bottom-right corner", "last MCU only"])
def test_a_valid_frame_with_exact_gray_at_its_end_is_accepted(layout: str, where: str) -> None:
    """The gray tail alone wrongly refused such frames; the MCUs are counted instead."""
    kwargs, _ = _LAYOUTS[layout]
    data = _jpeg(_with_gray(where), **kwargs)
    assert (_pixels(data)[-7:, -7:] == 128).all()  # (the corner that makes the check count)
    decoded = decode_image(data, min_contrast=DEFAULT_MIN_CONTRAST)
    assert decoded.format == "JPEG" and (decoded.width, decoded.height) == _SIZE


@pytest.mark.parametrize("kwargs", [{}, {"progressive": True}, {"subsampling": 0}])
def test_a_frame_entirely_mid_gray_is_whole_and_refused_only_as_blank(kwargs: dict) -> None:
    data = _jpeg(np.full((_SIZE[1], _SIZE[0], 3), 128, np.uint8), **kwargs)
    assert decode_image(data).format == "JPEG"  # whole: not truncated
    with pytest.raises(ImageRefused) as info:
        decode_image(data, min_contrast=DEFAULT_MIN_CONTRAST)
    assert info.value.kind == "blank"


def test_valid_camera_like_frames_and_an_mpo_are_accepted() -> None:
    for seed in range(4):
        for kwargs in ({}, {"progressive": True}, {"restart_marker_rows": 1}):
            assert decode_image(_jpeg(make_scene_array(seed, _SIZE), **kwargs)).format == "JPEG"
    mpo = io.BytesIO()
    first = Image.fromarray(_with_gray("bottom half"))
    first.save(mpo, "MPO", save_all=True, append_images=[Image.fromarray(make_scene_array(2))])
    assert decode_image(mpo.getvalue()).format == "JPEG"  # (the bytes after FF D9: picture 2)


def test_a_frame_without_a_gray_corner_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path: the MCU count runs only where the last MCU is exact gray."""
    import spotstop.guard._jpeg_scan as jpeg_scan

    calls: list[int] = []
    real = jpeg_scan._count

    def counting(*args: object) -> int:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(jpeg_scan, "_count", counting)
    decode_image(_jpeg(make_scene_array(1, _SIZE)))
    assert calls == []
    decode_image(_jpeg(_with_gray("bottom half")))
    assert calls == [1]


# --------------------------------------------------------------------------- the guard


def test_the_guard_fails_a_cut_short_jpeg_closed_under_a_permissive_policy(
    bundle_copy: Path, tmp_path: Path
) -> None:
    """Every scene scored is SAFE under this policy: the cut frame, its lower part gray,
    was one of them."""
    set_frozen(bundle_copy, 1e9)
    whole = _jpeg(make_scene_array(4, _SIZE))
    start, end = _scan_data(whole)
    cut = _cut(whole, (start + end) // 2)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        good, bad = g.check_batch([Scene(whole, "open the door"), Scene(cut, "open the door")])
    assert good.label == "SAFE" and not good.fail_closed
    assert bad.label == "UNSAFE" and bad.fail_closed
    assert "truncated" in (bad.fail_reason or "") and "MCUs" in (bad.fail_reason or "")


# --------------------------------------------------------------------------- WebP (not caught)


def _webp(array: np.ndarray, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "WEBP", **kwargs)
    return buffer.getvalue()


def test_a_zero_padded_webp_is_not_caught_and_why() -> None:
    """The documented gap (docs/limits.md), as measured: a lossy WebP cut short and
    zero-padded to the size its RIFF header declares decodes without an error, its lost part
    neither flat nor a repeated row; and zero bytes at the end of the data are no sign of it,
    since a valid frame with a flat lower half ends with thousands of them."""
    scene = make_scene_array(1, (640, 480))
    whole = _webp(scene, quality=80)
    cut = len(whole) // 2
    padded = whole[:cut] + bytes(len(whole) - cut)
    assert decode_image(padded).format == "WEBP"
    got, want = _pixels(padded), _pixels(whole)
    first = int(np.flatnonzero(np.abs(got - want).max(axis=(1, 2)))[0])
    tail = got[first + 16 :]
    assert len({row.tobytes() for row in tail}) > 100 and tail.std() > 10
    flat = scene.copy()
    flat[240:] = 128
    valid = _webp(flat, quality=90, method=0)
    assert decode_image(valid).format == "WEBP"
    assert len(valid) - len(valid.rstrip(b"\x00")) > 1000
