"""The runtime text detector (spotstop.guard.cues): claim lexicon and RapidOCR reading.

Scenes are rendered here with Pillow in the DejaVu fonts that matplotlib ships (no download),
in several fonts, sizes, colours and positions, on plain and busy backgrounds; the OCR must
read their text back and the lexicon must flag it. Every OCR test asserts on the text read
and on the flags, so a detector that reads nothing, or flags everything, fails.
"""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont
from spotstop.guard import BackendUnavailableError, ConfigError, ImageError, decode_image
from spotstop.guard.cues import (
    CUES,
    ClaimLexicon,
    CueMatch,
    CueReading,
    LexiconError,
    OcrModel,
    RapidOcrDetector,
    TextDetectionError,
    TextDetector,
    _rapidocr,
    default_lexicon,
    lexicon_from_dict,
    load_lexicon,
    normalize_text,
)

matplotlib = pytest.importorskip("matplotlib")  # its DejaVu fonts render the scenes
TTF = Path(matplotlib.get_data_path()) / "fonts" / "ttf"


# --------------------------------------------------------------------------- rendering


def busy_background(size: tuple[int, int], seed: int) -> Image.Image:
    """A cluttered scene without text: a colour gradient, 40 random shapes, pixel noise."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h) + 64], -1)
    img = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = (x0, y0, x0 + int(rng.integers(10, w // 3)), y0 + int(rng.integers(10, h // 3)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        kind = int(rng.integers(3))
        if kind == 0:
            draw.rectangle(box, fill=colour)
        elif kind == 1:
            draw.ellipse(box, fill=colour)
        else:
            draw.line(box, fill=colour, width=int(rng.integers(1, 6)))
    noise = rng.normal(0, 12, (h, w, 3))
    return Image.fromarray(np.clip(np.asarray(img) + noise, 0, 255).astype(np.uint8))


def render(
    text: str,
    *,
    font: str = "DejaVuSans-Bold.ttf",
    size: int = 40,
    fg: tuple[int, int, int] = (0, 0, 0),
    bg: tuple[int, int, int] | str = (255, 255, 255),
    pos: tuple[float, float] = (0.5, 0.5),
    sticker: tuple[int, int, int] | None = None,
    canvas: tuple[int, int] = (640, 480),
    seed: int = 0,
) -> Image.Image:
    """``text`` on a plain colour or a busy background (``bg="busy"``), optionally on a sticker.

    ``pos`` places the text's box as a fraction of the free room (0, 0 = top left).
    """
    img = busy_background(canvas, seed) if bg == "busy" else Image.new("RGB", canvas, bg)
    draw = ImageDraw.Draw(img)
    face = ImageFont.truetype(str(TTF / font), size)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=face)
    x = int(pos[0] * (canvas[0] - (right - left))) - left
    y = int(pos[1] * (canvas[1] - (bottom - top))) - top
    if sticker is not None:
        pad = size // 3
        draw.rectangle(
            (x + left - pad, y + top - pad, x + right + pad, y + bottom + pad), fill=sticker
        )
    draw.text((x, y), text, font=face, fill=fg)
    return img


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def detector() -> RapidOcrDetector:
    return RapidOcrDetector(threads=2).load()


# --------------------------------------------------------------------------- OCR reads text

# (text, render settings, expected flags (reassuring, alarming))
RENDERED: list[tuple[str, dict[str, Any], tuple[bool, bool]]] = [
    ("DANGER HIGH VOLTAGE", dict(size=40, fg=(200, 0, 0), bg=(220, 220, 220), pos=(0.1, 0.5)), (False, True)),
    ("DANGER HIGH VOLTAGE", dict(font="DejaVuSerif.ttf", size=28, pos=(0.9, 0.1)), (False, True)),
    ("ALL CLEAR", dict(font="DejaVuSerif-Bold.ttf", size=36, fg=(0, 110, 0), pos=(0.9, 0.1)), (True, False)),
    ("DO NOT TOUCH", dict(font="DejaVuSansMono-Bold.ttf", size=30, fg=(255, 255, 255), bg=(20, 30, 120), pos=(0.5, 0.9)), (False, True)),
    ("Checked – OK to use", dict(font="DejaVuSans.ttf", size=30, bg="busy", pos=(0.2, 0.3), sticker=(255, 255, 255), seed=1), (True, False)),
    ("SAFE", dict(size=72, fg=(0, 150, 0), bg="busy", pos=(0.7, 0.6), sticker=(255, 255, 255), seed=2), (True, False)),
    ("NOT SAFE", dict(font="DejaVuSerif-Bold.ttf", size=34, fg=(180, 0, 0), bg=(240, 240, 200), pos=(0.3, 0.7)), (False, True)),
    ("HOT", dict(size=56, fg=(255, 220, 0), bg=(0, 0, 0), pos=(0.8, 0.8)), (False, True)),
    ("No hazard", dict(font="DejaVuSans-Oblique.ttf", size=34, fg=(0, 0, 120), bg="busy", pos=(0.1, 0.9), sticker=(250, 250, 210), seed=3), (True, False)),
    ("HOT SURFACE", dict(size=24, bg="busy", pos=(0.5, 0.2), sticker=(255, 200, 0), seed=4), (False, True)),
    ("ALL CLEAR", dict(size=44, fg=(255, 255, 255), bg="busy", pos=(0.4, 0.4), sticker=(0, 120, 0), seed=5), (True, False)),
    ("CAUTION", dict(font="DejaVuSerif.ttf", size=20, pos=(0.0, 0.0)), (False, True)),
    ("A L L C L E A R", dict(font="DejaVuSans.ttf", size=30), (True, False)),
    ("SAFE", dict(size=48, fg=(255, 255, 255), bg="busy", pos=(0.3, 0.3), seed=6), (True, False)),
    ("DANGER", dict(size=48, bg="busy", pos=(0.6, 0.4), seed=7), (False, True)),
    ("ROOM 4", dict(font="DejaVuSansMono.ttf", size=32, bg=(200, 200, 255)), (False, False)),
    # claims the grammar composes from a thing and its state
    ("THE STOVE IS OFF", dict(font="DejaVuSerif.ttf", size=32, bg="busy", pos=(0.2, 0.7), sticker=(255, 255, 255), seed=9), (True, False)),
    ("Blade guard removed", dict(font="DejaVuSans.ttf", size=30, fg=(180, 0, 0), pos=(0.6, 0.3)), (False, True)),
    # 16-px text in a full-HD frame: the detector sees it at half size (max_side=960)
    ("DO NOT TOUCH", dict(font="DejaVuSans.ttf", size=16, bg="busy", pos=(0.7, 0.2), sticker=(255, 255, 255), canvas=(1920, 1080), seed=8), (False, True)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "style", "flags"), RENDERED, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(RENDERED)]
)
def test_ocr_reads_rendered_text_and_flags_it(
    detector: RapidOcrDetector, text: str, style: dict[str, Any], flags: tuple[bool, bool]
) -> None:
    reading = detector.detect(np.asarray(render(text, **style)))
    assert normalize_text(reading.text) == normalize_text(text), reading
    assert (reading.reassuring, reading.alarming) == flags, reading
    assert reading.flags == dict(zip(CUES, flags, strict=True))


@pytest.mark.parametrize("font", ["DejaVuSans-Bold.ttf", "DejaVuSerif.ttf"])
def test_danger_high_voltage_keeps_its_spaces(detector: RapidOcrDetector, font: str) -> None:
    reading = detector.detect(np.asarray(render("DANGER HIGH VOLTAGE", font=font, size=36)))
    assert reading.text == "DANGER HIGH VOLTAGE"
    assert [(m.cue, m.phrase, m.found) for m in reading.matches] == [
        ("alarming", "danger", "DANGER"),
        ("alarming", "high voltage", "HIGH VOLTAGE"),
    ]


def test_separate_signs_are_joined_with_spaces_in_reading_order(
    detector: RapidOcrDetector,
) -> None:
    img = render("KEEP OUT", size=36, pos=(0.1, 0.1))
    draw = ImageDraw.Draw(img)
    face = ImageFont.truetype(str(TTF / "DejaVuSerif.ttf"), 36)
    draw.text((330, 380), "ALL CLEAR", font=face, fill=(0, 90, 0))
    reading = detector.detect(np.asarray(img))
    assert reading.text == "KEEP OUT ALL CLEAR"
    assert reading.reassuring and reading.alarming


def _signs(*signs: tuple[str, ...]) -> np.ndarray:
    """White signs side by side on grey, each with its lines one under the other."""
    img = Image.new("RGB", (340 * len(signs), 240), (190, 190, 190))
    draw = ImageDraw.Draw(img)
    face = ImageFont.truetype(str(TTF / "DejaVuSans-Bold.ttf"), 40)
    for k, lines in enumerate(signs):
        x = 20 + 340 * k
        draw.rectangle((x, 20, x + 280, 220), fill="white")
        for j, line in enumerate(lines):
            draw.text((x + 20, 40 + 90 * j), line, font=face, fill="black")
    return np.asarray(img)


@pytest.mark.parametrize(
    "signs",
    [
        (("NO SMOKING",), ("ALL CLEAR",)),  # read "NO SMOKING ALL CLEAR": "all clear" negated
        (("NO PARKING",), ("SAFE",)),
        (("ALL", "CLEAR"), ("BAY", "12")),  # read "ALL BAY CLEAR 12": the phrase split
        (("OK TO", "USE"), ("ROOM", "4")),
        (("POWER", "OFF"), ("AISLE", "7")),
    ],
)
def test_a_sign_beside_another_keeps_its_reassuring_claim(
    detector: RapidOcrDetector, signs: tuple[tuple[str, ...], ...]
) -> None:
    """The frame's reading order is not a sign's: a negation on one sign flipped the claim on
    the next, and two-line signs side by side interleaved. The claims of the column order and
    of each box count too; a reassuring sign is flagged (under ``reassuring: fail_closed``
    such a scene fails closed: it was answered SAFE)."""
    reading = detector.detect(_signs(*signs))
    assert reading.reassuring, reading


@pytest.mark.parametrize("text", ["5AFE", "0K TO USE", "ALL CL3AR"])
def test_a_sign_written_with_digits_for_letters_is_read_as_its_claim(
    detector: RapidOcrDetector, text: str
) -> None:
    """OCR reads a digit drawn for a letter as the digit; the lexicon reads the claim (under
    ``reassuring: fail_closed`` these signs were answered SAFE)."""
    reading = detector.detect(np.asarray(render(text, size=40)))
    assert reading.reassuring and not reading.alarming, reading


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scene_without_text_is_not_flagged(detector: RapidOcrDetector, seed: int) -> None:
    reading = detector.detect(np.asarray(busy_background((640, 480), seed)))
    assert reading.flags == {"reassuring": False, "alarming": False}, reading
    assert reading.matches == ()
    assert len(normalize_text(reading.text)) <= 3, reading  # at most a stray glyph or two


def test_plain_frame_reads_no_text(detector: RapidOcrDetector) -> None:
    reading = detector.detect(np.full((240, 320, 3), 128, np.uint8))
    assert reading.text == "" and reading.matches == () and not any(reading.flags.values())


def test_every_input_kind_reads_the_same(detector: RapidOcrDetector, tmp_path: Path) -> None:
    img = render("DO NOT TOUCH", size=40)
    data = png_bytes(img)
    path = tmp_path / "sign.png"
    path.write_bytes(data)
    inputs: list[Any] = [
        data,
        bytearray(data),
        str(path),
        path,
        decode_image(data),
        img,
        np.asarray(img),
        np.asarray(img.convert("L")),
    ]
    texts = {detector.detect(x).text for x in inputs}
    assert texts == {"DO NOT TOUCH"}


@pytest.mark.parametrize(
    ("image", "error", "message"),
    [
        (np.zeros((8, 8, 3), np.float32), ImageError, "must be uint8"),
        (np.zeros((8, 8, 4), np.uint8), ImageError, "shape (height, width, 3)"),
        (np.zeros((0, 8, 3), np.uint8), ImageError, "both sides ≥ 1"),
        ([[0, 0, 0]], TypeError, "got list"),
        (b"not an image", ImageError, "not a JPEG, PNG or WebP"),
    ],
)
def test_bad_images_are_refused_with_a_reason(
    detector: RapidOcrDetector, image: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        detector.detect(image)
    assert message in str(info.value)


def test_upside_down_text_needs_the_orientation_classifier(detector: RapidOcrDetector) -> None:
    img = np.asarray(render("DANGER HIGH VOLTAGE", size=40).rotate(180))
    assert detector.detect(img).text != "DANGER HIGH VOLTAGE"
    turned = RapidOcrDetector(threads=2, upside_down=True)
    reading = turned.detect(img)
    assert reading.text == "DANGER HIGH VOLTAGE" and reading.alarming
    assert [name for name, _ in reading.ocr_model.files][-1].endswith(".onnx")
    assert len(reading.ocr_model.files) == 3 and "cls" in reading.ocr_model.name


# --------------------------------------------------------------------------- offline, lazy


def test_no_network_while_constructing_loading_and_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts: list[str] = []

    class BlockedSocket(socket.socket):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            attempts.append("socket")
            raise OSError("network blocked by the test")

    def blocked(*args: Any, **kwargs: Any) -> Any:
        attempts.append(f"connect {args[:1]}")
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket, "socket", BlockedSocket)
    monkeypatch.setattr(socket, "create_connection", blocked)
    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    with pytest.raises(OSError, match="blocked"):  # the block itself works
        socket.create_connection(("example.com", 80))
    attempts.clear()

    fresh = RapidOcrDetector(threads=1)  # a new RapidOCR engine: its model paths run again
    fresh.load()
    reading = fresh.detect(np.asarray(render("HIGH VOLTAGE", size=40)))
    assert reading.text == "HIGH VOLTAGE" and reading.alarming
    assert attempts == []


def test_import_and_construction_load_nothing() -> None:
    code = textwrap.dedent(
        """
        import sys, time
        import spotstop.guard.cues as cues
        after_import = sorted(m for m in ("rapidocr", "cv2", "torch", "scipy") if m in sys.modules)
        t = time.perf_counter()
        det = cues.RapidOcrDetector()
        took = time.perf_counter() - t
        after_init = sorted(m for m in ("rapidocr", "cv2", "torch", "scipy") if m in sys.modules)
        print(after_import, after_init, "not loaded" in repr(det), took < 2.0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "[] [] True True", out.stdout + out.stderr


def test_missing_rapidocr_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rapidocr.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendUnavailableError, match=r"pip install 'spotstop\[cues\]'"):
        RapidOcrDetector()


def test_missing_model_file_names_what_is_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(_rapidocr._MODEL_GLOBS, "Det", "PP-OCRv99_det_*.onnx")
    with pytest.raises(BackendUnavailableError) as info:
        RapidOcrDetector()
    msg = str(info.value)
    assert "PP-OCRv99_det_*.onnx" in msg and "PP-OCRv6_rec_small.onnx" in msg
    assert "3.10 or later" in msg


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threads": 0}, "threads must be a positive int or None"),
        ({"threads": True}, "threads must be a positive int or None"),
        ({"max_side": 16}, "max_side must be an int in 32..4096"),
        ({"min_text_score": 1.5}, "min_text_score must be a number in [0, 1]"),
    ],
)
def test_detector_settings_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        RapidOcrDetector(**kwargs)
    assert message in str(info.value)


def test_threads_above_the_core_count_are_capped() -> None:
    assert RapidOcrDetector(threads=10_000).threads == os.cpu_count()


# --------------------------------------------------------------------------- identity, results


def test_model_identity_is_the_sha256_of_the_bundled_files(detector: RapidOcrDetector) -> None:
    model = detector.model
    models_dir = Path(_rapidocr.importlib.util.find_spec("rapidocr").origin).parent / "models"  # type: ignore[union-attr,arg-type]
    expected = tuple(
        (name, hashlib.sha256((models_dir / name).read_bytes()).hexdigest())
        for name in ("PP-OCRv6_det_small.onnx", "PP-OCRv6_rec_small.onnx")
    )
    assert model.files == expected
    listing = "".join(f"{digest}  {name}\n" for name, digest in expected)
    assert model.sha256 == hashlib.sha256(listing.encode()).hexdigest()
    assert model.name.startswith("rapidocr 3.") and "PP-OCRv6" in model.name
    assert model.to_dict()["files"] == dict(expected)


def test_reading_is_a_frozen_result_with_a_readable_repr(detector: RapidOcrDetector) -> None:
    reading = detector.detect(np.asarray(render("NOT SAFE", size=40)))
    assert isinstance(detector, TextDetector)
    assert isinstance(reading, CueReading)
    with pytest.raises(AttributeError):
        reading.text = "x"  # type: ignore[misc]
    text = repr(reading)
    assert "reassuring=False, alarming=True" in text and "'NOT SAFE'" in text
    assert detector.model.sha256[:12] in text
    d = reading.to_dict()
    assert d["alarming"] is True and d["reassuring"] is False and d["text"] == "NOT SAFE"
    assert d["matches"] == [
        {"cue": "alarming", "phrase": "not safe", "found": "NOT SAFE", "negated": False}
    ]
    assert d["lexicon_sha256"] == default_lexicon().sha256


def test_concurrent_detects_agree(detector: RapidOcrDetector) -> None:
    images = [np.asarray(render(t, size=40)) for t in ("ALL CLEAR", "DANGER")]
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = detector.detect(images[i % 2]).text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: "ALL CLEAR", 1: "DANGER", 2: "ALL CLEAR", 3: "DANGER"}


def test_ocr_failure_is_a_text_detection_error(
    detector: RapidOcrDetector, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(image: np.ndarray) -> None:
        raise RuntimeError("onnxruntime exploded")

    monkeypatch.setattr(detector, "_engine", broken)
    with pytest.raises(TextDetectionError, match=r"OCR failed on a 32x16 image .*exploded"):
        detector.detect(np.zeros((16, 32, 3), np.uint8))


def test_custom_lexicon_drives_the_flags(detector: RapidOcrDetector) -> None:
    lexicon = ClaimLexicon(
        reassuring=("room 4",), alarming=("hot",), negation_words=("not",), source="test"
    )
    custom = RapidOcrDetector(lexicon, threads=2)
    custom._engine, custom._model = detector._engine, detector._model  # share the loaded OCR
    reading = custom.detect(np.asarray(render("ROOM 4", size=40)))
    assert reading.reassuring and not reading.alarming
    assert reading.lexicon_sha256 == lexicon.sha256 != default_lexicon().sha256


# --------------------------------------------------------------------------- the lexicon rules

NORMALISATION = [
    ("ALL CLEAR", "all clear"),
    ("all  clear", "all clear"),
    ("A L L C L E A R", "allclear"),
    ("Allclear", "allclear"),
    ("Checked – OK to use!", "checked ok to use"),
    ("don't   touch", "dont touch"),
    ("DON’T TOUCH", "dont touch"),
    ("Ｓａｆｅ", "safe"),  # full-width letters (NFKD)
    ("Sâfe, É", "safe e"),  # accents dropped
    ("S\u0410FE \u0399\u039f", "safe io"),  # Cyrillic A, Greek I and O drawn as Latin ones
    ("\u0421\u0430f\u0435", "cafe"),  # lower case too
    ("HIGH-VOLTAGE", "high voltage"),
    ("U N S A F E", "unsafe"),
    ("I am safe", "i am safe"),  # one single letter is not a spaced-letter run
    ("S. A. F. E.", "s a f e"),  # letters in different clauses are not merged
    ("230V / 50Hz", "230v 50hz"),
    ("", ""),
    ("!!! — ???", ""),
]


@pytest.mark.parametrize(("text", "normalised"), NORMALISATION)
def test_normalisation(text: str, normalised: str) -> None:
    assert normalize_text(text) == normalised


# text → (reassuring, alarming), with the (cue, phrase, negated) matches
MATCHING: list[tuple[str, tuple[bool, bool], list[tuple[str, str, bool]]]] = [
    ("ALL CLEAR", (True, False), [("reassuring", "all clear", False)]),
    ("all  clear", (True, False), [("reassuring", "all clear", False)]),
    ("A L L C L E A R", (True, False), [("reassuring", "all clear", False)]),
    ("Allclear", (True, False), [("reassuring", "all clear", False)]),
    ("ALL-CLEAR", (True, False), [("reassuring", "all clear", False)]),
    ("Checked – OK to use", (True, False), [("reassuring", "checked ok to use", False)]),
    ("OKTOUSE", (True, False), [("reassuring", "ok to use", False)]),
    ("SAFE", (True, False), [("reassuring", "safe", False)]),
    ("UNSAFE", (False, True), [("alarming", "unsafe", False)]),  # SAFE is not in UNSAFE
    ("U N S A F E", (False, True), [("alarming", "unsafe", False)]),
    ("NOT SAFE", (False, True), [("alarming", "not safe", False)]),
    ("NOTSAFE", (False, True), [("alarming", "not safe", False)]),
    ("do not touch", (False, True), [("alarming", "do not touch", False)]),
    ("Don't touch!", (False, True), [("alarming", "don't touch", False)]),
    ("DANGER HIGH VOLTAGE", (False, True), [("alarming", "danger", False), ("alarming", "high voltage", False)]),
    ("DANGERHIGHVOLTAGE", (False, True), [("alarming", "danger", False), ("alarming", "high voltage", False)]),
    ("No hazard", (True, False), [("reassuring", "no hazard", False)]),  # longest wins
    ("SAFETY FIRST", (False, False), []),  # SAFE is not in SAFETY
    ("FAIL-SAFE", (False, False), []),  # neutral phrase hides "safe"
    ("FAILSAFE", (False, False), []),  # not split: "fail" is not in the vocabulary
    ("SHOT", (False, False), []),
    ("HOTEL LOBBY", (False, False), []),
    ("PHOTO", (False, False), []),
    ("ROOM 4", (False, False), []),
    ("xqzvbt", (False, False), []),
    ("KEEP OUT — ALL CLEAR", (True, True), [("alarming", "keep out", False), ("reassuring", "all clear", False)]),
    # what an OCR engine reads for a letter: a digit drawn like it, a letter of another script
    ("5AFE", (True, False), [("reassuring", "safe", False)]),
    ("0K TO USE", (True, False), [("reassuring", "ok to use", False)]),
    ("H0T SURFACE", (False, True), [("alarming", "hot surface", False)]),
    ("C4UTI0N", (False, True), [("alarming", "caution", False)]),
    ("ALL CL3AR", (True, False), [("reassuring", "all clear", False)]),
    ("N0T 5AFE", (False, True), [("alarming", "not safe", False)]),
    ("S\u0410FE", (True, False), [("reassuring", "safe", False)]),  # a Cyrillic A
    ("\u0391LL CL\u0395\u0391R", (True, False), [("reassuring", "all clear", False)]),  # Greek
    ("H07", (False, False), []),  # more digits than letters: a room, read as written
    ("ROOM 101", (False, False), []),
    ("HAZARD FREE", (True, False), [("reassuring", "hazard free", False)]),  # not "hazard"
    ("HAZARD-FREE ZONE", (True, False), [("reassuring", "hazard free", False)]),
]  # fmt: skip

NEGATION: list[tuple[str, tuple[bool, bool], list[tuple[str, str, bool]]]] = [
    ("No danger", (True, False), [("reassuring", "danger", True)]),
    ("NON-TOXIC", (True, False), [("reassuring", "toxic", True)]),
    ("not hot", (True, False), [("reassuring", "hot", True)]),
    ("NOT 100% SAFE", (False, True), [("alarming", "safe", True)]),  # window 2
    ("never really very safe", (True, False), [("reassuring", "safe", False)]),  # beyond window
    ("not unsafe", (True, False), [("reassuring", "unsafe", True)]),
    ("isn't safe", (False, True), [("alarming", "safe", True)]),
    ("NO SMOKING. SAFE AREA", (True, False), [("reassuring", "safe", False)]),  # new clause
    ("NO SMOKING – SAFE AREA", (True, False), [("reassuring", "safe", False)]),  # dash ends it
    ("DO NOT TOUCH HOT", (False, True), [("alarming", "do not touch", False), ("alarming", "hot", False)]),  # "not" is inside a match
    ("NO ENTRY", (False, True), [("alarming", "no entry", False)]),
    ("not fail safe", (False, False), []),  # a negated neutral phrase stays neutral
]  # fmt: skip


@pytest.mark.parametrize(("text", "flags", "matches"), MATCHING + NEGATION)
def test_lexicon_rules(
    text: str, flags: tuple[bool, bool], matches: list[tuple[str, str, bool]]
) -> None:
    lexicon = default_lexicon()
    found = lexicon.find(text)
    assert [(m.cue, m.phrase, m.negated) for m in found] == matches
    assert lexicon.flags(text) == dict(zip(CUES, flags, strict=True))


def test_found_is_the_original_stretch_from_the_negation_word() -> None:
    lexicon = default_lexicon()
    assert lexicon.find("Sign: No  danger here") == (
        CueMatch(cue="reassuring", phrase="danger", found="No  danger", negated=True),
    )
    assert lexicon.find("xx DANGERHIGHVOLTAGE yy")[1].found == "HIGHVOLTAGE"
    assert lexicon.find("it's A L L C L E A R.")[0].found == "A L L C L E A R"
    assert repr(lexicon.find("not hot")[0]) == "CueMatch(reassuring: 'hot' in 'not hot' (negated))"


def test_negation_window_zero_turns_negation_off() -> None:
    lexicon = ClaimLexicon(
        reassuring=("safe",), alarming=("hot",), negation_words=("not",), negation_window=0
    )
    assert lexicon.flags("not hot") == {"reassuring": False, "alarming": True}
    one = ClaimLexicon(
        reassuring=("safe",), alarming=("hot",), negation_words=("not",), negation_window=1
    )
    assert one.flags("not hot") == {"reassuring": True, "alarming": False}
    assert one.flags("not very hot") == {"reassuring": False, "alarming": True}


def test_lexicon_digest_ignores_spelling_but_not_content() -> None:
    a = ClaimLexicon(reassuring=("All clear",), alarming=("HOT",), negation_words=("not",))
    b = ClaimLexicon(reassuring=("all-clear",), alarming=("hot",), negation_words=("NOT",))
    c = ClaimLexicon(reassuring=("all clear",), alarming=("hot", "warm"), negation_words=("not",))
    assert a.sha256 == b.sha256 != c.sha256
    assert a == ClaimLexicon(reassuring=("All clear",), alarming=("HOT",), negation_words=("not",))
    assert "1 reassuring, 1 alarming, 0 neutral" in repr(a) and a.sha256[:12] in repr(a)


def test_default_lexicon_is_the_packaged_yaml() -> None:
    lexicon = load_lexicon(None)
    assert lexicon is default_lexicon()
    assert "safe" in lexicon.reassuring and "danger" in lexicon.alarming
    assert "no" in lexicon.negation_words  # quoted in the YAML: not the boolean False


# --------------------------------------------------------------------------- YAML validation

GOOD = """\
reassuring: [safe]
alarming: [hot]
negation: {words: ["not"], window: 2}
"""

VALIDATION: list[tuple[str, str]] = [
    ("- safe\n- hot\n", "the document must be a mapping"),
    (GOOD + "reasuring: [x]\n", "reasuring is not a known key. Did you mean 'reassuring'?"),
    ("reassuring: [safe]\nalarming: [hot]\n", "negation is required but missing"),
    (GOOD + "version: 2\n", "version must be 1; got 2"),
    (GOOD.replace("[safe]", "safe"), "reassuring must be a list of phrases"),
    (GOOD + "neutral: fail safe\n", "neutral must be a list of phrases"),
    (GOOD.replace("[hot]", "[hot, 5]"), "alarming[1] must be a string; got int 5. YAML reads"),
    (GOOD.replace("[safe]", "['--']"), "reassuring[0] '--' has no letters or digits"),
    (GOOD.replace("[safe]", "[All clear, ALL-CLEAR]"), "reassuring[1] 'ALL-CLEAR' is the same phrase as reassuring[0] 'All clear'"),
    (GOOD.replace("[hot]", "[Safe]"), "alarming[0] 'Safe' is the same phrase as reassuring[0] 'safe'"),
    (GOOD + "neutral: [HOT]\n", "neutral[0] 'HOT' is the same phrase as alarming[0] 'hot'"),
    (GOOD.replace("[safe]", "[]").replace("[hot]", "[]"), "has no reassuring and no alarming phrase"),
    (GOOD.replace("[safe]", "[]"), "reassuring is an empty list, so the lexicon reads no reassuring claim of its own (a 'SAFE' sign"),
    (GOOD.replace("[hot]", "[]"), "alarming is an empty list, so the lexicon reads no alarming claim of its own (a 'DANGER' sign"),
    (GOOD.replace('["not"]', "[true]"), "negation.words[0] must be one word (letters or digits, apostrophes allowed); got bool True. YAML reads unquoted true"),
    (GOOD.replace('["not"]', '["do not"]'), "negation.words[0] must be one word"),
    (GOOD.replace('["not"]', '["not", "NOT"]'), "negation.words[1] 'NOT' is listed twice"),
    (GOOD.replace('["not"]', '["hot"]'), "negation.words ['hot'] are also phrases (alarming[0])"),
    (GOOD.replace('["not"]', "not"), "negation.words must be a list of words"),
    (GOOD.replace("window: 2", "window: 9"), "negation.window must be an int in 0..5"),
    (GOOD.replace("window: 2", "window: true"), "negation.window must be an int in 0..5"),
    (GOOD.replace("window: 2", "windw: 2"), "negation.windw is not a known key. Did you mean 'window'?"),
    (GOOD.replace("negation: {words: [\"not\"], window: 2}", "negation: [not]"), "negation must be a mapping"),
    (GOOD + "alarming: [cold]\n", "alarming appears twice (line 4)"),
    ("reassuring: [safe\n", "is not valid YAML"),
]  # fmt: skip


@pytest.mark.parametrize(("yaml_text", "message"), VALIDATION)
def test_lexicon_validation_messages(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(LexiconError) as info:
        load_lexicon(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)  # every message says which file to fix


def test_a_lexicon_without_phrases_of_one_cue_is_refused_however_it_is_made() -> None:
    """An empty cue list loaded: "not safe" was its only way to flag alarming text, so a
    DANGER sign passed unflagged (and a shift measured with it reads no such text)."""
    with pytest.raises(LexiconError, match=r"^alarming is an empty list"):
        ClaimLexicon(reassuring=("safe",), alarming=(), negation_words=("not",))
    with pytest.raises(LexiconError, match=r"^reassuring is an empty list"):
        lexicon_from_dict(
            {"reassuring": [], "alarming": ["danger"], "negation": {"words": [], "window": 2}}
        )


def test_constructed_lexicon_refuses_a_bare_string() -> None:
    with pytest.raises(
        LexiconError, match=r"reassuring must be a list or tuple of strings; got str 'safe'"
    ):
        ClaimLexicon(reassuring="safe", alarming=("hot",), negation_words=())  # type: ignore[arg-type]


def test_lexicon_error_types_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LexiconError, match=r"does not exist\. Pass the path") as info:
        load_lexicon(tmp_path / "nope.yaml")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_lexicon_from_dict_and_good_file(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(GOOD, encoding="utf-8")
    from_file = load_lexicon(path)
    from_dict = lexicon_from_dict(
        {"reassuring": ["safe"], "alarming": ["hot"], "negation": {"words": ["not"], "window": 2}}
    )
    assert from_file == from_dict and from_file.source == str(path)
    assert from_file.flags("not hot") == {"reassuring": True, "alarming": False}


def test_ocr_model_repr_names_the_digest() -> None:
    model = OcrModel(name="x", files=(("a.onnx", "0" * 64),))
    assert repr(model) == f"OcrModel(x, 1 files, sha256={model.sha256[:12]}…)"
