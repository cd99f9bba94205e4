"""Tests of spotstop.guard._image: decoding, validation and refusal of scene images."""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile
from spotstop.guard._errors import ConfigError, GuardError, ImageError
from spotstop.guard._image import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PIXELS,
    SUPPORTED_FORMATS,
    DecodedImage,
    ImageRefused,
    decode_image,
    gray_image,
)

# --------------------------------------------------------------------------- helpers


def _noise(width: int = 80, height: int = 64, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def _encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def _crafted_png(width: int, height: int) -> bytes:
    """A valid-looking RGB PNG whose IHDR claims width x height but holds almost no data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + _png_chunk(b"IEND", b"")
    )


def _refusal(source: object, kind: str, *words: str, **kwargs: object) -> ImageRefused:
    with pytest.raises(ImageRefused) as info:
        decode_image(source, **kwargs)  # type: ignore[arg-type]
    error = info.value
    assert error.kind == kind, str(error)
    message = str(error).lower()
    for word in words:
        assert word.lower() in message, f"{word!r} not in {message!r}"
    return error


# --------------------------------------------------------------------------- good images


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_decode_good_image_from_bytes(fmt: str) -> None:
    data = _encode(_noise(), fmt)
    decoded = decode_image(data)
    assert isinstance(decoded, DecodedImage)
    assert decoded.format == fmt
    assert decoded.image.mode == "RGB"
    assert decoded.image.size == (80, 64)
    assert (decoded.width, decoded.height) == (80, 64)
    assert decoded.longest_side == 80
    assert decoded.n_bytes == len(data)
    assert decoded.sha256 == hashlib.sha256(data).hexdigest()
    assert (decoded.jpeg_quality is None) == (fmt != "JPEG")


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_decode_good_image_from_path(tmp_path: Path, fmt: str) -> None:
    data = _encode(_noise(), fmt)
    path = tmp_path / f"frame.{fmt.lower()}"
    path.write_bytes(data)
    from_str = decode_image(str(path))
    from_path = decode_image(path)
    assert from_str == from_path == decode_image(data)
    assert from_path.sha256 == hashlib.sha256(data).hexdigest()
    assert from_path.format == fmt


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = _encode(_noise(), "PNG")
    expected = decode_image(data)
    assert decode_image(bytearray(data)) == expected
    assert decode_image(memoryview(data)) == expected


def test_lossless_pixels_round_trip() -> None:
    image = _noise()
    decoded = decode_image(_encode(image, "PNG"))
    np.testing.assert_array_equal(np.asarray(decoded.image), np.asarray(image))


def test_sha256_is_of_original_bytes() -> None:
    data = _encode(_noise(seed=3), "JPEG", quality=80)
    decoded = decode_image(data)
    assert decoded.sha256 == hashlib.sha256(data).hexdigest()
    assert len(decoded.sha256) == 64


def test_repr_is_short_and_readable() -> None:
    decoded = decode_image(_encode(_noise(), "JPEG", quality=90))
    text = repr(decoded)
    assert text.startswith("DecodedImage(JPEG 80x64")
    assert "quality≈90" in text
    assert decoded.sha256[:12] in text
    assert "PIL" not in text and len(text) < 100


def test_equality_and_hash_ignore_the_pixels_object() -> None:
    data = _encode(_noise(), "PNG")
    first, second = decode_image(data), decode_image(data)
    assert first.image is not second.image
    assert first == second
    assert hash(first) == hash(second)


def test_decoded_image_is_frozen() -> None:
    decoded = decode_image(_encode(_noise(), "PNG"))
    with pytest.raises(AttributeError):
        decoded.width = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- orientation


def test_exif_orientation_6_rotates_clockwise() -> None:
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 8, 8))  # red block at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to display
    data = _encode(stored, "JPEG", quality=95, exif=exif.tobytes())

    decoded = decode_image(data)
    assert (decoded.width, decoded.height) == (20, 40)
    assert decoded.image.size == (20, 40)
    assert decoded.longest_side == 40
    # Rotating clockwise moves the stored top-left corner to the top-right corner.
    red, _, blue = decoded.image.getpixel((16, 3))  # type: ignore[misc]
    assert red > 200 and blue < 60
    red, _, blue = decoded.image.getpixel((3, 3))  # type: ignore[misc]
    assert red < 60 and blue > 200


def test_without_exif_orientation_size_is_unchanged() -> None:
    decoded = decode_image(_encode(Image.new("RGB", (40, 20), 0), "JPEG"))
    assert (decoded.width, decoded.height) == (40, 20)


# --------------------------------------------------------------------------- modes to RGB


def test_rgba_alpha_is_composited_on_white() -> None:
    image = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    image.putpixel((1, 1), (0, 0, 255, 255))  # one opaque blue pixel
    decoded = decode_image(_encode(image, "PNG"))
    assert decoded.image.mode == "RGB"
    assert decoded.image.getpixel((0, 0)) == (255, 255, 255)
    assert decoded.image.getpixel((1, 1)) == (0, 0, 255)


def test_half_transparent_is_blended_with_white() -> None:
    image = Image.new("RGBA", (2, 2), (0, 0, 0, 128))
    pixel = decode_image(_encode(image, "PNG")).image.getpixel((0, 0))
    assert pixel == pytest.approx((127, 127, 127), abs=1)


def test_la_image_becomes_rgb() -> None:
    image = Image.new("LA", (3, 3), (50, 255))
    decoded = decode_image(_encode(image, "PNG"))
    assert decoded.image.mode == "RGB"
    assert decoded.image.getpixel((0, 0)) == (50, 50, 50)


def test_palette_image_becomes_rgb() -> None:
    image = _noise().convert("P")
    decoded = decode_image(_encode(image, "PNG"))
    assert decoded.image.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(decoded.image), np.asarray(image.convert("RGB")))


def test_palette_transparency_is_white() -> None:
    image = Image.new("P", (4, 4), 0)
    image.putpalette([10, 20, 30] + [200, 100, 50] * 255)
    image.putpixel((2, 2), 1)
    image.info["transparency"] = 0
    decoded = decode_image(_encode(image, "PNG"))
    assert decoded.image.getpixel((0, 0)) == (255, 255, 255)
    assert decoded.image.getpixel((2, 2)) == (200, 100, 50)


def test_rgb_png_with_trns_colour_is_white() -> None:
    image = Image.new("RGB", (3, 3), (1, 2, 3))
    image.putpixel((1, 1), (9, 9, 9))
    decoded = decode_image(_encode(image, "PNG", transparency=(1, 2, 3)))
    assert decoded.image.getpixel((0, 0)) == (255, 255, 255)
    assert decoded.image.getpixel((1, 1)) == (9, 9, 9)


def test_grayscale_l_becomes_rgb() -> None:
    decoded = decode_image(_encode(Image.new("L", (5, 5), 77), "PNG"))
    assert decoded.image.mode == "RGB"
    assert decoded.image.getpixel((0, 0)) == (77, 77, 77)


def test_16_bit_gray_png_is_scaled_not_clipped() -> None:
    values = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    image = Image.fromarray(values)
    data = _encode(image, "PNG")
    assert Image.open(io.BytesIO(data)).mode in ("I;16", "I")
    decoded = decode_image(data)
    assert decoded.image.mode == "RGB"
    assert np.asarray(decoded.image).dtype == np.uint8
    assert [decoded.image.getpixel((x, 0)) for x in range(3)] == [
        (0, 0, 0),
        (100, 100, 100),
        (255, 255, 255),
    ]


def test_16_bit_gray_png_with_trns_is_white() -> None:
    """A 16-bit grayscale PNG's tRNS grey level is transparent: white, as in 8-bit L (it came
    out black, the scaled grey level under it)."""
    values = np.array([[0, 257 * 100, 0]], dtype=np.uint16)
    data = _encode(Image.fromarray(values), "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).info.get("transparency") == 0
    decoded = decode_image(data)
    assert [decoded.image.getpixel((x, 0)) for x in range(3)] == [
        (255, 255, 255),
        (100, 100, 100),
        (255, 255, 255),
    ]


def test_cmyk_jpeg_becomes_rgb() -> None:
    image = Image.new("CMYK", (16, 16), (0, 255, 0, 0))  # magenta
    data = _encode(image, "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    decoded = decode_image(data)
    assert decoded.image.mode == "RGB"
    assert decoded.image.getpixel((8, 8)) == pytest.approx((255, 0, 255), abs=8)


def test_grayscale_jpeg_becomes_rgb() -> None:
    decoded = decode_image(_encode(Image.new("L", (16, 16), 90), "JPEG"))
    assert decoded.image.mode == "RGB"
    assert decoded.jpeg_quality == 75


# --------------------------------------------------------------------------- jpeg quality


@pytest.mark.parametrize("quality", [50, 75, 90, 95])
def test_jpeg_quality_estimate(quality: int) -> None:
    decoded = decode_image(_encode(_noise(), "JPEG", quality=quality))
    assert decoded.jpeg_quality is not None
    assert abs(decoded.jpeg_quality - quality) <= 2


def test_jpeg_quality_estimate_over_the_whole_range() -> None:
    image = _noise(16, 16)
    for quality in (1, 10, 25, 49, 51, 60, 99, 100):
        estimate = decode_image(_encode(image, "JPEG", quality=quality)).jpeg_quality
        assert estimate is not None and abs(estimate - quality) <= 2, (quality, estimate)


def _nearest_ijg_quality_by_hand(table: list[int]) -> int:
    """The IJG quality nearest to ``table``, written out entry by entry (libjpeg's
    jpeg_quality_scaling and jpeg_add_quant_table), the higher quality on a tie."""
    from spotstop.guard._image import _IJG_LUMA

    best_q, best_err = 0, None
    for q in range(1, 101):
        scale = 5000 // q if q < 50 else 200 - 2 * q
        err = 0
        for base, got in zip(_IJG_LUMA, table, strict=True):
            err += abs(max(1, min(255, (base * scale + 50) // 100)) - got)
        if best_err is None or err <= best_err:
            best_q, best_err = q, err
    return best_q


class _Tables:
    def __init__(self, table: list[int]) -> None:
        self.quantization = {0: table}


def test_jpeg_quality_estimate_matches_the_formula_entry_by_entry() -> None:
    from spotstop.guard._image import _IJG_LUMA, _estimate_jpeg_quality

    rng = np.random.default_rng(3)
    tables = [
        [
            max(1, min(255, (b * (5000 // q if q < 50 else 200 - 2 * q) + 50) // 100))
            for b in _IJG_LUMA
        ]
        for q in range(1, 101)
    ]
    tables += [list(map(int, rng.integers(1, 256, 64))) for _ in range(200)]
    tables += [[1] * 64, [255] * 64, [2] * 64]  # flat tables: several qualities tie
    for table in tables:
        got = _estimate_jpeg_quality(_Tables(table))  # type: ignore[arg-type]
        assert got == _nearest_ijg_quality_by_hand(table), table
    for q in range(1, 101):  # an exact IJG table is its own quality
        assert _estimate_jpeg_quality(_Tables(tables[q - 1])) == q  # type: ignore[arg-type]


# --------------------------------------------------------------------------- refusals


def test_refusal_is_image_error_guard_error_and_value_error() -> None:
    error = _refusal(b"", "empty")
    assert isinstance(error, ImageError)
    assert isinstance(error, GuardError)
    assert isinstance(error, ValueError)


def test_refuse_empty_bytes() -> None:
    _refusal(b"", "empty", "empty", "0 bytes")


def test_refuse_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    _refusal(path, "empty", "empty", "0 bytes", "empty.jpg")


def test_refuse_too_many_bytes() -> None:
    data = _encode(_noise(), "PNG")
    _refusal(data, "too_large_bytes", str(len(data)), "max_bytes", str(1000), max_bytes=1000)


def test_refuse_too_large_file_before_reading(tmp_path: Path) -> None:
    data = _encode(_noise(), "PNG")
    path = tmp_path / "big.png"
    path.write_bytes(data)
    _refusal(path, "too_large_bytes", "limit", "max_bytes", max_bytes=100)


def test_refuse_missing_path(tmp_path: Path) -> None:
    _refusal(tmp_path / "nope.jpg", "not_found", "does not exist", "nope.jpg")


def test_refuse_directory(tmp_path: Path) -> None:
    _refusal(tmp_path, "not_found", "directory")


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("GIF", "GIF"), ("BMP", "BMP"), ("TIFF", "TIFF"), ("ICO", "ICO"), ("PPM", "PNM")],
)
def test_refuse_unsupported_format(fmt: str, name: str) -> None:
    data = _encode(_noise(32, 32), fmt)
    _refusal(data, "unsupported_format", name, "not supported", "JPEG, PNG", "WebP")


def test_refuse_unknown_bytes() -> None:
    _refusal(b"hello, this is not an image", "unsupported_format", "not a JPEG, PNG or WebP")


def test_refuse_corrupt_jpeg() -> None:
    data = bytearray(_encode(_noise(), "JPEG"))
    data[2:40] = b"\x00" * 38  # keep the SOI magic, destroy the markers after it
    _refusal(bytes(data), "corrupt", "JPEG", "corrupt")


def test_refuse_corrupt_png_data() -> None:
    data = bytearray(_encode(_noise(), "PNG"))
    start = data.index(b"IDAT") + 4
    data[start + 10 : start + 200] = bytes(range(190))  # garbage inside the zlib stream
    error = _refusal(bytes(data), "corrupt", "PNG", "corrupt")
    assert "re-capture" in str(error)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_refuse_truncated(fmt: str, keep: float) -> None:
    data = _encode(_noise(), fmt)
    _refusal(data[: int(len(data) * keep)], "truncated", "truncated", "complete file")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_refuse_truncated_by_two_bytes(fmt: str) -> None:
    data = _encode(_noise(), fmt)
    _refusal(data[:-2], "truncated", "truncated")


def _with_thumbnail_app1(jpeg: bytes) -> bytes:
    """``jpeg`` with an APP1 segment after its SOI that holds a whole small JPEG (an EXIF
    thumbnail: its own scan and end-of-image marker, inside the main file's headers)."""
    thumb = _encode(_noise(16, 16, seed=3), "JPEG")
    payload = b"Exif\x00\x00" + thumb
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


@pytest.mark.parametrize("thumbnail", [False, True])
@pytest.mark.parametrize("keep", [0.5, 0.95])
def test_refuse_jpeg_cut_short_in_a_padded_buffer(thumbnail: bool, keep: float) -> None:
    """A frame cut short inside a buffer of its full size (the rest zeros) has no end-of-image
    marker; Pillow decoded it, the lost rows made of the padding (an EXIF thumbnail's marker
    does not count)."""
    data = _encode(_noise(256, 256), "JPEG", quality=95)
    if thumbnail:
        data = _with_thumbnail_app1(data)
    assert decode_image(data).format == "JPEG"  # whole, it decodes
    cut = int(len(data) * keep)
    _refusal(data[:cut] + bytes(len(data) - cut), "truncated", "truncated", "end-of-image")


def test_a_jpeg_with_bytes_after_its_end_is_accepted() -> None:
    """What follows the end-of-image marker (an MPO's second picture, a camera's padding) is
    not the picture: such files decode as before."""
    data = _with_thumbnail_app1(_encode(_noise(), "JPEG"))
    assert decode_image(data + bytes(4096)).format == "JPEG"
    mpo = io.BytesIO()
    _noise().save(mpo, "MPO", save_all=True, append_images=[_noise(seed=1)])
    assert decode_image(mpo.getvalue()).format == "JPEG"


def _with_scans_repeated(jpeg: bytes, extra: int) -> bytes:
    """A progressive ``jpeg`` with its last scan (header and entropy-coded data) repeated
    ``extra`` more times before its end-of-image marker."""
    start = jpeg.rindex(b"\xff\xda")
    end = jpeg.rindex(b"\xff\xd9")
    return jpeg[:end] + jpeg[start:end] * extra + jpeg[end:]


def test_refuse_jpeg_with_too_many_scans_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each scan decodes a plane of the whole frame again: a small file of one scan repeated
    (50 kB, 2000 scans of a 2000x2000 frame) took seconds to decode, past a call's deadline."""
    from spotstop.guard._image import MAX_JPEG_SCANS

    data = _encode(Image.new("RGB", (64, 64), (128, 128, 128)), "JPEG", progressive=True)
    n = data.count(b"\xff\xda")  # (no EXIF thumbnail here: every one is a scan)
    assert 1 < n < MAX_JPEG_SCANS
    at_limit = _with_scans_repeated(data, MAX_JPEG_SCANS - n)
    assert decode_image(at_limit).format == "JPEG"  # a repeated scan alone decodes

    def fail_load(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", fail_load)
    over = _with_scans_repeated(data, MAX_JPEG_SCANS - n + 1)
    _refusal(over, "decompression_bomb", f"{MAX_JPEG_SCANS + 1} scans", "baseline JPEG")
    _refusal(_with_thumbnail_app1(over), "decompression_bomb", f"{MAX_JPEG_SCANS + 1} scans")


def test_jpeg_structure_is_read_without_walking_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan count and the end-of-image marker are found by search after the first scan (a
    walk over 12 MB of FF 00 took seconds); junk segments before it are bounded and refused."""
    data = _encode(_noise(), "JPEG")
    end = data.rindex(b"\xff\xd9")
    stuffed = data[:end] + b"\xff\x00" * 500_000 + b"\xff\xff" + data[end:]
    assert decode_image(stuffed).format == "JPEG"  # (ends in its marker after fill bytes)
    assert decode_image(data[:2] + b"\xff" * 10_000 + data[2:]).format == "JPEG"  # one fill run

    def fail_load(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", fail_load)
    junk = data[:2] + b"\xff\xfe\x00\x02" * 5000 + data[2:]  # 5000 empty comments
    _refusal(junk, "corrupt", "more than 4096 segments before its image data")


def test_refuse_truncated_webp() -> None:
    data = _encode(_noise(), "WEBP")
    _refusal(data[: len(data) // 2], "truncated", "truncated", "RIFF")


def test_refuse_zero_size_png() -> None:
    _refusal(_crafted_png(0, 10), "zero_size", "zero size", "0x10")


def test_refuse_header_bomb_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_load(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", fail_load)
    data = _crafted_png(5000, 5000)
    assert len(data) < 200
    _refusal(
        data,
        "decompression_bomb",
        "5000x5000",
        "2.5e+07",
        "max_pixels",
        "downscale",
        max_pixels=1_000_000,
    )


def test_refuse_huge_header_bomb() -> None:
    data = _crafted_png(100_000, 100_000)
    assert len(data) < 200
    _refusal(data, "decompression_bomb", "max_pixels", "decompression bomb")


def test_refuse_real_image_over_small_pixel_limit() -> None:
    data = _encode(_noise(), "JPEG")
    _refusal(data, "decompression_bomb", "80x64", "max_pixels", max_pixels=80 * 64 - 1)
    assert decode_image(data, max_pixels=80 * 64).width == 80


def test_pil_bomb_warning_becomes_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lower Pillow's limit for this test only, so its warning fires on a small header.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = _crafted_png(40, 40)  # 1600 pixels: above 1000 (warning), below 2000 (error)
    _refusal(data, "decompression_bomb", "Pillow")


def test_refusal_kind_survives_pickling() -> None:
    error = _refusal(b"", "empty")
    restored = pickle.loads(pickle.dumps(error))
    assert isinstance(restored, ImageRefused)
    assert restored.kind == "empty"
    assert str(restored) == str(error)


def test_refusal_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown refusal kind"):
        ImageRefused("x", kind="bogus")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- global state


def test_pil_global_settings_are_unchanged() -> None:
    before = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    good = _encode(_noise(), "JPEG")
    decode_image(good)
    for bad, kwargs in [
        (good[: len(good) // 2], {}),
        (_crafted_png(100_000, 100_000), {}),
        (_crafted_png(5000, 5000), {"max_pixels": 10}),
    ]:
        with pytest.raises(ImageRefused):
            decode_image(bad, **kwargs)
    after = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    assert after == before


# --------------------------------------------------------------------------- arguments


def test_defaults() -> None:
    assert DEFAULT_MAX_PIXELS == 40_000_000
    assert DEFAULT_MAX_BYTES == 50 * 1024 * 1024
    assert SUPPORTED_FORMATS == ("JPEG", "PNG", "WEBP")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_pixels": 0}, "max_pixels must be a positive int; got 0"),
        ({"max_pixels": -5}, "max_pixels must be a positive int; got -5"),
        ({"max_pixels": 1.5}, "max_pixels must be a positive int; got 1.5"),
        ({"max_pixels": True}, "max_pixels must be a positive int; got True"),
        ({"max_bytes": 0}, "max_bytes must be a positive int; got 0"),
        ({"max_bytes": "50MB"}, "max_bytes must be a positive int; got '50MB'"),
    ],
)
def test_invalid_limits_are_rejected(kwargs: dict[str, object], words: str) -> None:
    data = _encode(_noise(), "PNG")
    with pytest.raises(ConfigError) as info:
        decode_image(data, **kwargs)  # type: ignore[arg-type]
    assert words in str(info.value)
    assert "default" in str(info.value)


def test_invalid_source_type_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"bytes, bytearray, memoryview, str or os\.PathLike"):
        decode_image(12345)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- gray image


def test_gray_image() -> None:
    image = gray_image(30, 20)
    assert image.mode == "RGB"
    assert image.size == (30, 20)
    array = np.asarray(image)
    assert array.dtype == np.uint8
    assert (array == 128).all()
    assert (np.asarray(gray_image(2, 3, value=0)) == 0).all()
    assert (np.asarray(gray_image(2, 3, value=255)) == 255).all()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0, 10), "width must be a positive int; got 0"),
        ((10, -1), "height must be a positive int; got -1"),
        ((10.0, 10), "width must be a positive int; got 10.0"),
        ((10, 10, 256), "value must be an int in 0..255; got 256"),
        ((10, 10, -1), "value must be an int in 0..255; got -1"),
    ],
)
def test_gray_image_rejects_bad_arguments(args: tuple[object, ...], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        gray_image(*args)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_a_decoded_image_built_by_hand_must_be_rgb():
    """A caller-built DecodedImage of a 16-bit frame reached the member, whose RGB conversion
    clipped it to white (mean 255, where decode_image of the same PNG gives mean 127): the
    scene was scored blank under the file's sha256. Any mode but RGB is refused where it is
    built, as every other bad field is."""
    import dataclasses

    buf = io.BytesIO()
    Image.fromarray(np.full((40, 48), 32768, dtype=np.uint16)).save(buf, format="PNG")
    good = decode_image(buf.getvalue())
    assert good.image.mode == "RGB" and 120 < np.asarray(good.image).mean() < 135
    for mode in ("I;16", "RGBA", "L", "CMYK"):
        with pytest.raises(ImageError, match=f"DecodedImage.image must be an RGB.*got '{mode}'"):
            dataclasses.replace(good, image=good.image.convert(mode) if mode != "I;16" else
                                Image.new("I;16", good.image.size))  # fmt: skip
