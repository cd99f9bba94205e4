"""The text detector on RapidOCR: PP-OCRv6 text detection + recognition on onnxruntime.

``rapidocr`` (the optional extra ``spotstop[cues]``) ships its ONNX models inside its wheel.
:class:`RapidOcrDetector` points RapidOCR at those files explicitly, so RapidOCR never takes
its download path: no network access, nothing written outside the process. The models run on
onnxruntime's CPU provider.

Nothing is imported or loaded when this module is imported, nor when a detector is
constructed (that only checks that ``rapidocr`` is installed and its model files are there);
the models load on the first :meth:`RapidOcrDetector.detect` (or an explicit
:meth:`RapidOcrDetector.load`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from spotstop.guard._errors import BackendUnavailableError, ConfigError, ImageError
from spotstop.guard._image import DecodedImage, decode_image
from spotstop.guard.cues._lexicon import ClaimLexicon
from spotstop.guard.cues._reader import claim_reader
from spotstop.guard.cues._types import (
    ClaimReader,
    CueMatch,
    CueReading,
    DetectorInput,
    OcrModel,
    TextDetectionError,
)
from spotstop.guard.validate import is_real

__all__ = ["INSTALL_HINT", "RapidOcrDetector", "TextDetectionError"]

logger = logging.getLogger("spotstop.guard.cues")

INSTALL_HINT: Final[str] = "pip install 'spotstop[cues]'"

#: The model files RapidOCR 3.10+ ships in its wheel (``rapidocr/models/``), by role.
_MODEL_GLOBS: Final[dict[str, str]] = {
    "Det": "PP-OCRv6_det_*.onnx",
    "Rec": "PP-OCRv6_rec_*.onnx",
    "Cls": "*_cls_*.onnx",
}


class RapidOcrDetector:
    """OCR a scene with RapidOCR's bundled PP-OCRv6 models, then flag claims with a claim
    reader (the lexicon by default).

    Parameters
    ----------
    lexicon
        A :class:`ClaimLexicon`, a path to a lexicon YAML file, or ``None`` for the packaged
        default.
    reader
        The claim reader: ``None`` or ``"lexicon"`` (the ``lexicon``), a reader name such as
        ``"member:/path/to/member"`` (:func:`~spotstop.guard.cues.claim_reader`), or a built
        :class:`~spotstop.guard.cues.ClaimReader` (e.g. a
        :class:`~spotstop.guard.cues.MemberClaimReader` over a guard's member).
    threads
        onnxruntime intra-op threads per model (None: onnxruntime's default, all cores). Values
        above ``os.cpu_count()`` are capped to it.
    max_side
        Longest side, in pixels, of the image the text *detector* (which finds the text
        boxes) sees; larger frames are scaled down to it. Recognition reads the boxes from the
        frame itself (RapidOCR first scales frames with a side over 2000 px down to 2000).
        Smaller text needs a larger value, at a cost in speed.
    min_text_score
        Recognised lines with a lower confidence (0..1) are dropped.
    upside_down
        Also run RapidOCR's 0°/180° line classifier, so text printed upside down is read
        (its model file is then part of :attr:`model`).

    Thread safety: a detector may be shared between threads. Loading happens once, and calls
    to :meth:`detect` / :meth:`read_text` are serialised by a lock (each already uses
    ``threads`` cores inside onnxruntime).

    RapidOCR's own logger (``"RapidOCR"``) is set to ERROR level on load: it would otherwise
    warn on every frame without text. This is process-wide for that logger.
    """

    def __init__(
        self,
        lexicon: ClaimLexicon | str | os.PathLike[str] | None = None,
        *,
        reader: ClaimReader | str | None = None,
        threads: int | None = None,
        max_side: int = 960,
        min_text_score: float = 0.5,
        upside_down: bool = False,
    ) -> None:
        _check_settings(threads=threads, max_side=max_side, min_text_score=min_text_score)
        self.reader: ClaimReader = (
            claim_reader(reader, lexicon=lexicon, threads=threads)
            if reader is None or isinstance(reader, str)
            else reader
        )
        self.threads = None if threads is None else min(threads, os.cpu_count() or threads)
        self.max_side = max_side
        self.min_text_score = float(min_text_score)
        self.upside_down = bool(upside_down)
        roles = ("Det", "Rec", "Cls") if self.upside_down else ("Det", "Rec")
        self._files = {role: _bundled_model(role) for role in roles}
        self._lock = threading.Lock()
        self._engine: Any = None
        self._model: OcrModel | None = None

    def __repr__(self) -> str:
        state = "loaded" if self._engine is not None else "not loaded"
        return (
            f"RapidOcrDetector({', '.join(p.name for p in self._files.values())}; threads="
            f"{self.threads}, max_side={self.max_side}, min_text_score={self.min_text_score}, "
            f"upside_down={self.upside_down}; {state}; reader {self.reader.name} "
            f"sha256={self.reader.sha256[:12]}…)"
        )

    # -- loading ----------------------------------------------------------------------------
    def load(self) -> RapidOcrDetector:
        """Load the models now (otherwise the first :meth:`detect` does); returns ``self``."""
        with self._lock:
            self._load_locked()
        return self

    @property
    def model(self) -> OcrModel:
        """The OCR's name and the sha256 of its model files (loads the models)."""
        with self._lock:
            return self._load_locked()[1]

    def _load_locked(self) -> tuple[Any, OcrModel]:
        if self._engine is not None and self._model is not None:
            return self._engine, self._model
        try:
            from rapidocr import RapidOCR
        except ImportError as e:
            raise BackendUnavailableError(
                f"the text detector needs rapidocr and its dependencies ({e.name or e}); "
                f"install them with: {INSTALL_HINT}"
            ) from e
        version = importlib.metadata.version("rapidocr")
        files = tuple((p.name, _sha256_file(p)) for p in self._files.values())
        params: dict[str, Any] = {
            "Global.use_cls": self.upside_down,
            "Global.text_score": self.min_text_score,
            "Global.log_level": "error",
            "Det.limit_type": "max",
            "Det.limit_side_len": self.max_side,
            "EngineConfig.onnxruntime.intra_op_num_threads": self.threads or -1,
        }
        # Explicit model paths: RapidOCR downloads only when a role has no model_path.
        params.update({f"{role}.model_path": str(path) for role, path in self._files.items()})
        try:
            engine = RapidOCR(params=params)
            engine(_warmup_image())  # RapidOCR loads each model on first use: do it now
        except ImportError as e:
            raise BackendUnavailableError(
                f"rapidocr could not load its onnxruntime engine ({e}); install it with: "
                f"{INSTALL_HINT}"
            ) from e
        except Exception as e:  # rapidocr/onnxruntime raise their own types; name the files
            raise TextDetectionError(
                f"RapidOCR could not load {[p.name for p in self._files.values()]} "
                f"({type(e).__name__}: {e}). Reinstall rapidocr ({INSTALL_HINT})."
            ) from e
        threads = "default" if self.threads is None else self.threads
        model = OcrModel(
            name=f"rapidocr {version} PP-OCRv6 {'det+rec+cls' if self.upside_down else 'det+rec'} "
            f"(onnxruntime CPU)",
            files=files,
        )
        logger.info("text detector: %s, %s threads, max_side %d", model, threads, self.max_side)
        self._engine, self._model = engine, model
        return engine, model

    # -- reading ----------------------------------------------------------------------------
    def read_text(self, image: DetectorInput) -> str:
        """The text in ``image``: boxes in reading order, one space between, whitespace collapsed."""
        return _joined(self.read_boxes(image))

    def read_boxes(self, image: DetectorInput) -> list[_Box]:
        """Each text box read in ``image`` as ``(text, left x, top y, right x)``, in RapidOCR's
        reading order (rows of the whole frame), its whitespace collapsed; empty boxes left
        out."""
        bgr = np.ascontiguousarray(_rgb_array(image)[:, :, ::-1])  # RapidOCR takes arrays as BGR
        with self._lock:
            engine, _ = self._load_locked()
            try:
                out = engine(bgr)
            except Exception as e:  # onnxruntime/opencv errors inside RapidOCR
                raise TextDetectionError(
                    f"OCR failed on a {bgr.shape[1]}x{bgr.shape[0]} image "
                    f"({type(e).__name__}: {e}). The scene's text is unknown."
                ) from e
        # No text box: RapidOCR returns an empty result (txts None); boxes found but nothing
        # recognised: a detection-only result without txts. Both read as no text.
        lines = getattr(out, "txts", None) or ()
        boxes = getattr(out, "boxes", None)
        got = []
        for i, line in enumerate(lines):
            text = " ".join(str(line).split())
            if not text:
                continue
            try:  # a box's corners (4 x 2); without them, its place in the reading order
                corners = np.asarray(boxes[i], dtype=np.float64).reshape(-1, 2)  # type: ignore[index]
                x0, y0 = float(corners[:, 0].min()), float(corners[:, 1].min())
                x1 = float(corners[:, 0].max())
            except (TypeError, IndexError, ValueError):
                x0 = y0 = x1 = float(i)
            got.append((text, x0, y0, x1))
        return got

    @property
    def lexicon(self) -> ClaimLexicon | None:
        """The claim lexicon when the reader is the lexicon, else None."""
        return self.reader if isinstance(self.reader, ClaimLexicon) else None

    def detect(self, image: DetectorInput) -> CueReading:
        """OCR ``image`` (:meth:`read_boxes`) and apply the claim reader to the text read.

        The boxes of one frame belong to several signs, and the frame's reading order need not
        be a sign's: two two-line signs side by side read "ALL BAY CLEAR 12", and "NO SMOKING"
        beside "ALL CLEAR" reads as one negated claim. So the claims are those of the text in
        reading order (:attr:`CueReading.text`), in column order (boxes whose spans across
        overlap form a column; columns left to right, each top to bottom) and, with the lexicon, of each box alone: any claim any of them finds is a
        flag (a flag can only make a decision fail closed, never SAFE)."""
        boxes = self.read_boxes(image)
        text = _joined(boxes)
        readings = [text, _joined(_column_order(boxes))]
        if isinstance(self.reader, ClaimLexicon):  # cheap; a model reader: one pass a text
            readings += [b[0] for b in boxes]
        matches: dict[CueMatch, None] = {}
        for t in dict.fromkeys(readings):
            matches.update(dict.fromkeys(self.reader.find(t)))
        return CueReading(
            text=text,
            matches=tuple(matches),
            ocr_model=self.model,
            lexicon_sha256=self.reader.sha256,
            reader=self.reader.name,
        )


# --------------------------------------------------------------------------- helpers


#: a text box: its text, left x, top y, right x (pixels)
_Box = tuple[str, float, float, float]


def _joined(boxes: list[_Box]) -> str:
    return " ".join(b[0] for b in boxes)


def _column_order(boxes: list[_Box]) -> list[_Box]:
    """The boxes column by column: a box whose span across overlaps a column's joins it;
    columns left to right, each read top to bottom (a sign's lines in order)."""
    columns: list[list[_Box]] = []
    spans: list[list[float]] = []
    for b in sorted(boxes, key=lambda b: b[1]):
        for col, span in zip(columns, spans, strict=True):
            if b[1] <= span[1] and b[3] >= span[0]:
                col.append(b)
                span[0], span[1] = min(span[0], b[1]), max(span[1], b[3])
                break
        else:
            columns.append([b])
            spans.append([b[1], b[3]])
    return [b for col in columns for b in sorted(col, key=lambda b: b[2])]


def _check_settings(*, threads: object, max_side: object, min_text_score: object) -> None:
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ConfigError(
            f"threads must be a positive int or None (onnxruntime's default); got {threads!r}."
        )
    if not isinstance(max_side, int) or isinstance(max_side, bool) or not 32 <= max_side <= 4096:
        raise ConfigError(
            f"max_side must be an int in 32..4096 (pixels of the detector's input); got "
            f"{max_side!r}. 960 reads 16-px text in a 1920x1080 frame."
        )
    if not is_real(min_text_score) or not 0.0 <= float(min_text_score) <= 1.0:
        raise ConfigError(
            f"min_text_score must be a number in [0, 1]; got {min_text_score!r}. 0.5 is "
            "RapidOCR's default."
        )


def _bundled_model(role: str) -> Path:
    """The one model file of ``role`` in the installed rapidocr wheel (no import, no download)."""
    spec = importlib.util.find_spec("rapidocr")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailableError(
            f"the text detector needs rapidocr, which is not installed; install it with: "
            f"{INSTALL_HINT}"
        )
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    found = sorted(models.glob(_MODEL_GLOBS[role]))
    if len(found) != 1:
        present = sorted(p.name for p in models.glob("*.onnx")) if models.is_dir() else []
        raise BackendUnavailableError(
            f"expected one bundled {role} model {_MODEL_GLOBS[role]!r} in {models}; found "
            f"{[p.name for p in found]} (all models there: {present}). spotstop needs a rapidocr "
            f"wheel that ships PP-OCRv6 (3.10 or later, below 4); install it with: {INSTALL_HINT}"
        )
    return found[0]


def _warmup_image() -> np.ndarray:
    """A small frame with one dark word on white, so the first call loads and warms up the
    detector and the recogniser (the first onnxruntime run of a model is the slowest)."""
    img = Image.new("RGB", (256, 96), (255, 255, 255))
    ImageDraw.Draw(img).text((16, 20), "WARM UP", fill=(0, 0, 0), font=ImageFont.load_default(40))
    return np.ascontiguousarray(np.asarray(img)[:, :, ::-1])


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rgb_array(image: DetectorInput) -> np.ndarray:
    """An ``H×W×3`` uint8 RGB array from any :data:`DetectorInput`."""
    if isinstance(image, bytes | bytearray | memoryview | str | os.PathLike):
        image = decode_image(image)
    if isinstance(image, DecodedImage):
        return np.asarray(image.image)
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray):
        raise TypeError(
            "image must be encoded bytes, a path, a DecodedImage, a PIL image or a uint8 numpy "
            f"array (H×W×3 RGB); got {type(image).__name__}."
        )
    if image.dtype != np.uint8:
        raise ImageError(
            f"an image array must be uint8 (0..255); got dtype {image.dtype}. Convert it, e.g. "
            "np.clip(a * 255, 0, 255).astype(np.uint8) for floats in [0, 1]."
        )
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0:
        raise ImageError(
            f"an image array must have shape (height, width, 3) in RGB order (or (height, "
            f"width) for gray) with both sides ≥ 1; got {image.shape}. Drop an alpha channel "
            "by compositing it first, or pass the encoded file bytes."
        )
    return image
