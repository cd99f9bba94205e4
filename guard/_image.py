"""Decode and validate a scene image before any model sees it.

:func:`decode_image` turns encoded bytes (or a path to them) into a :class:`DecodedImage`:
an RGB, 8-bit, upright Pillow image plus the facts the decision log records about the file
(sha256 of the original bytes, size, format, an estimated JPEG quality). Everything that
is not a complete, modest-sized JPEG, PNG or WebP is refused with :class:`ImageRefused`
(an :class:`~spotstop.guard._errors.ImageError`), whose ``kind`` says why.

Choices made here (the runtime depends on them, so they are fixed and documented):

* Only JPEG, PNG and WebP are accepted. Other formats are recognised by their leading bytes
  and refused *before* any Pillow plugin parses them, so no other decoder ever runs on
  untrusted input. A multi-picture JPEG (MPO) counts as JPEG; of animated PNG/WebP files and
  MPOs only the first frame is used.
* EXIF orientation is applied (:func:`PIL.ImageOps.exif_transpose`); ``width`` and
  ``height`` are the upright size.
* Transparency is composited onto **white** (RGBA, LA, PA, and palette/L/RGB images with a
  ``tRNS`` transparency entry). A transparent pixel carries no scene content; white is what
  most viewers show, and it is deterministic (``convert("RGB")`` would expose whatever
  colour the encoder left under the alpha).
* 16-bit and 32-bit integer grayscale (``I;16``, ``I``) is scaled to 8 bits by
  ``round(v / 257)`` (``I`` clipped to 0..65535 first), not clipped at 255; its ``tRNS``
  grey level is white. CMYK JPEGs
  (Adobe inversion handled by Pillow) and every other mode go through ``convert("RGB")``.
* Decompression bombs are refused from the header, before pixels are decoded: the size in
  the header is checked against ``max_pixels`` here, independent of Pillow's global
  ``Image.MAX_IMAGE_PIXELS``, which this module never changes (nor
  ``ImageFile.LOAD_TRUNCATED_IMAGES``). Pillow's own ``DecompressionBombError`` and
  ``DecompressionBombWarning`` also become a refusal, so the effective limit is the
  smaller of ``max_pixels`` and Pillow's global limit. A JPEG with more than
  :data:`MAX_JPEG_SCANS` scans is refused as one too (each scan decodes the frame again).
* A frame without visible content is refused when ``min_contrast`` asks for it (the guard
  does, :data:`DEFAULT_MIN_CONTRAST`): see :func:`image_contrast` and
  :func:`check_visible_content`.
* Truncation is refused: pixels are decoded fully (``load()``), a JPEG must hold its
  end-of-image marker after its image data (trailing bytes after it are allowed, as an MPO's
  second picture), a PNG must reach its ``IEND`` chunk and a WebP must be as long as its
  RIFF header says. A JPEG cut short that still ends with the marker (libjpeg fills the rest
  of the frame with flat gray, and Pillow drops its warning) is refused by the MCU count of
  :func:`~spotstop.guard._jpeg_scan.jpeg_cut_short`, which runs when the frame's last MCU is
  exact gray (a progressive one: when its scans leave a coefficient short of full
  precision). It adds 0.15 ms to a 640x480 camera frame's decode (about 2 ms) and 0.3 ms at
  1920x1080 (about 12 ms); a valid frame with an exact-gray last MCU is counted, 12 ms at
  640x480 and 109 ms at 1920x1080 with a gray lower half (``bench/jpeg_cut_short.py``,
  2026-12-06, load average 3.1 on 2 cores). Not caught: a progressive JPEG cut inside its
  last scan, a WebP zero-padded to its declared size (``docs/limits.md``).
* Warnings Pillow raises while decoding (e.g. about odd EXIF data) are recorded and dropped,
  except the decompression-bomb warning, which is a refusal. This uses
  :class:`warnings.catch_warnings`, which in Python 3.11 is process-global: a warning raised
  by another thread during a decode may be dropped too.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from spotstop.guard._errors import ConfigError, ImageError
from spotstop.guard._jpeg_scan import jpeg_cut_short
from spotstop.guard.validate import is_int, is_real

__all__ = [
    "CONTENT_SHARE",
    "CONTRAST_CELL_PX",
    "CONTRAST_GRID",
    "CONTRAST_THIN_PX",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_CONTRAST",
    "DEFAULT_MIN_SIDE",
    "MAX_JPEG_SCANS",
    "SUPPORTED_FORMATS",
    "DecodedImage",
    "ImageRefused",
    "RefusalKind",
    "check_min_contrast",
    "check_min_side",
    "check_visible_content",
    "decode_image",
    "gray_image",
    "image_contrast",
    "read_image_bytes",
]

DEFAULT_MAX_PIXELS: Final[int] = 40_000_000
"""Largest accepted ``width * height`` (a 40-megapixel frame; 160 MB as RGB uint8)."""

DEFAULT_MIN_SIDE: Final[int] = 32
"""Smallest side (in pixels) the guard and the sidecar accept: a smaller frame cannot show a
scene (a 1x1 image is a placeholder, not a camera frame). :func:`decode_image` itself defaults
to 1 (any non-empty image); the guard passes its ``min_image_side``."""

CONTRAST_CELL_PX: Final[int] = 16
"""Smallest side (pixels) of the cells :func:`image_contrast` averages (noise / 16 or less)."""

CONTRAST_GRID: Final[int] = 32
"""Most cells :func:`image_contrast` lays along a frame's longest side."""

CONTRAST_THIN_PX: Final[int] = 5
"""Side (pixels of the frame reduced to under 640 px) of the square with which
:func:`image_contrast` opens and closes a frame: narrower structures (an overlay's strokes,
a crosshair) are taken out before content is measured."""

CONTENT_SHARE: Final[float] = 0.02
"""Share of the frame's cells that content must cover for :func:`image_contrast` to see it
(the 98th percentile of the cells' distances from the background)."""

OVERLAY_BAND: Final[float] = 0.12
"""Share of the frame's height, from its top and from its bottom edge, in which
:func:`image_contrast` looks for a camera's on-screen display (a line or two of text, on a
filled box or not): rows of text there, and the box's rows around them, are not measured."""

#: a row of the reduced frame is text where, within some :data:`_OVERLAY_WINDOW` pixels of it,
#: at least this many edges begin: runs of steps of one sign between neighbours of more than
#: :data:`_OVERLAY_STEP` levels in a channel (a few characters of a timestamp; each side of a
#: flat object is one edge, however blurred)
_OVERLAY_EDGES: Final[int] = 8
_OVERLAY_STEP: Final[int] = 32
_OVERLAY_WINDOW: Final[int] = 48
#: a row past the text belongs to its box while its median differs from the rows beyond it by
#: more than this many levels in a channel
_OVERLAY_SAME: Final[float] = 6.0

_BIWEIGHT_ROUNDS: Final[int] = 6

#: the attribute on a DecodedImage that records the min_contrast its image passed
_CHECKED_AT: Final[str] = "_visible_content_checked_at"

DEFAULT_MIN_CONTRAST: Final[float] = 8.0
"""Default ``min_image_contrast``: a frame whose :func:`image_contrast` is below 8 levels (of
255) shows (almost) nothing of the scene and is refused (kind ``blank``).

Measured by ``python bench/blank_frames.py`` (2026-12-08, with the on-screen display's rows
left out, :data:`OVERLAY_BAND`; before it, 2026-12-06, the background-split filter of step 2
of :func:`image_contrast`). Frames that show a scene: the test world's scenes at least
14.1 (576 scenes at 64x64; 23.6 and more at 160x120, 58.7 at 640x480, the rooms' lighting
moved as far as ``--offsets 1`` moves it), 10,000 demo scenes at least 15.9, a photograph
darkened to 10 % of its exposure 13.9 (12.9 with noise of sigma 3); with an on-screen display
on a filled box along the top or bottom edge, the world scenes at least 64.0, the demo scenes
51.5, the photograph at 10 % 14.0. Frames that show nothing: black, black at 16, mid gray,
white and one colour, 32x32 to 1920x1080, with sensor noise up to sigma 10 at most 3.0
(sigma 20: 5.1). A covered lens (black, video black 16 or 32, noise up to sigma 10, 160x120
to 1920x1080) with a burned-in overlay: a white timestamp with a black outline at 3 to 8 % of
the frame's height, with a camera name, or on a dark box, at most 4.1 (1.8 from 640x480 up);
on a mid-gray frame a timestamp 2.4, with a camera name 1.6 from 640x480 up (was up to 110);
a crosshair 2.3, a reticle 6.2; a logo of at most 1 % of the frame 4.4 (from 640x480 up); a
lens covered but for a corner of at most 1.5 % of the frame 1.7; a linear light-leak ramp
of up to 200 levels at most 3.0, with a timestamp on it 3.7. A camera's on-screen display on
a filled box (dark, semi-transparent or a light shade; as wide as the text, half or all the
frame; along the top or bottom edge; with or without an outline) on a gray, light-gray or
white frame: at most 7.6 (a full-width dark box on light gray at 160x120), 1.9 from 640x480
up; it was up to 235 (a full-width dark box on white) before those rows were left out. A
rule that replaced such a box by the rows beside it (2026-12-06) and one that left out the
whole band along the edge where it held thin strokes (2026-12-08) were tried and not kept:
both took out the objects of flat demo scenes cut by the frame's bottom edge (the second
took 8 of the 10,000 from 22-146 to under 3), the second also lifted an edge light leak with
a timestamp to 35.0; the rule kept leaves out only rows of dense edges (letters), and none
of the 10,000 changed below 15.9.

Not refused (the same script measures them): a camera name under a timestamp on a mid-gray
frame at 160x120 (12.2; was 19.7): there, letters of 6 to 10 px with their outline are as
wide as the square that takes out thin structures; an on-screen display away from the top and
bottom edges (not measured); a logo or a corner of the scene over 2 % of the cells (a 1 %
logo on a 160x120 frame: 39.7); a light leak that is a glow from a corner or the centre (up
to 32.2; with a timestamp at 160x120 29.9 and 75.9, whose rows left out leave the glow's rest
to a fit it does not follow). Refused since 2026-12-08 and not before: an outlined timestamp
on a white frame at 160x120 (1.4; was 36.6) and one with a camera name (4.5; was 21.9 from
640x480 up, 41.6 at 160x120), a timestamp on the lit end of a vertical light leak at 160x120
(2.2; was 19.8), a light leak from an edge with a timestamp (4.4 at 640x480, was 10.0; 7.7 at
160x120). Refused since 2026-12-06: a photograph at 5 % of its
exposure (its brightest pixel about 12; 6.5, was 10.8)."""


DEFAULT_MAX_BYTES: Final[int] = 50 * 1024 * 1024
"""Largest accepted encoded size in bytes (50 MiB)."""

MAX_JPEG_SCANS: Final[int] = 32
"""Most scans a JPEG may hold. Each scan decodes a colour plane of the whole frame again
(baseline JPEG: 1; libjpeg's progressive script: 10; 6 for grayscale), so the pixel limit alone
does not bound the work: 50 kB of one scan repeated held a decode for seconds, past the call's
deadline. More are refused before decoding, as a decompression bomb."""

SUPPORTED_FORMATS: Final[tuple[str, ...]] = ("JPEG", "PNG", "WEBP")
"""Pillow format names that :func:`decode_image` accepts."""

RefusalKind = Literal[
    "empty",
    "too_large_bytes",
    "not_found",
    "unsupported_format",
    "corrupt",
    "truncated",
    "zero_size",
    "decompression_bomb",
    "too_small",
    "blank",
]

_REFUSAL_KINDS: Final[frozenset[str]] = frozenset(get_args(RefusalKind))

_SUPPORTED_HINT: Final[str] = "Send the camera frame as JPEG, PNG or WebP."

# IJG (libjpeg) standard luminance quantization table, ITU-T T.81 Annex K, natural order.
_IJG_LUMA: Final[tuple[int, ...]] = (
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
)  # fmt: skip


class ImageRefused(ImageError):
    """An image was refused; ``kind`` says why (one of :data:`RefusalKind`).

    It is an :class:`~spotstop.guard._errors.ImageError`, hence also a ``GuardError`` and a
    ``ValueError``. The message names what was wrong, the limit, what came and what to do.
    """

    kind: RefusalKind

    def __init__(self, message: str, *, kind: RefusalKind) -> None:
        if kind not in _REFUSAL_KINDS:
            raise ValueError(
                f"unknown refusal kind {kind!r}; expected one of {sorted(_REFUSAL_KINDS)}"
            )
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:
        # Keep ``kind`` across pickling (e.g. from a worker process).
        return (_rebuild_refusal, (str(self), self.kind))


def _rebuild_refusal(message: str, kind: RefusalKind) -> ImageRefused:
    return ImageRefused(message, kind=kind)


@dataclass(frozen=True)
class DecodedImage:
    """A decoded, validated scene image and the facts about its file.

    ``image`` is excluded from equality, hashing and ``repr``: two results are equal when
    they came from the same bytes.
    """

    image: Image.Image = field(repr=False, compare=False)
    """RGB, 8-bit, EXIF orientation applied, alpha composited on white."""
    sha256: str
    """Hex sha256 of the original encoded bytes (not of the pixels)."""
    width: int
    """Width in pixels after EXIF orientation."""
    height: int
    """Height in pixels after EXIF orientation."""
    n_bytes: int
    """Size of the encoded bytes."""
    format: str
    """``"JPEG"``, ``"PNG"`` or ``"WEBP"``."""
    jpeg_quality: int | None
    """IJG-equivalent JPEG quality 1..100 estimated from the luminance table; ``None`` otherwise.

    An estimate: exact for files written by libjpeg/Pillow with a ``quality=`` setting, the
    nearest IJG quality for encoders with their own tables (phones, hardware encoders).
    """

    def __post_init__(self) -> None:
        # A caller may build one (a frame decoded elsewhere, dataclasses.replace): each field
        # is checked here, so a bad one is refused where it is made, never half-way through a
        # guard call (the log stores these fields as they are).
        def bad(field_name: str, want: str, got: object) -> ImageError:
            return ImageError(
                f"DecodedImage.{field_name} must be {want}; got {got!r}. Build it with "
                "decode_image(), or pass the encoded file's bytes or path instead."
            )

        if not isinstance(self.image, Image.Image):
            raise bad("image", "a PIL image", type(self.image).__name__)
        if self.image.mode != "RGB":  # the members read RGB; decode_image converts every mode
            raise bad("image", "an RGB PIL image (decode_image converts any mode)", self.image.mode)
        for name in ("width", "height", "n_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "n_bytes" else 1):
                raise bad(name, "a non-negative int" if name == "n_bytes" else "a positive int", v)
        if (self.width, self.height) != self.image.size:
            raise bad(
                "width, height", f"the image's size {self.image.size}", (self.width, self.height)
            )
        if (
            not isinstance(self.sha256, str)
            or len(self.sha256) != 64
            or any(c not in "0123456789abcdef" for c in self.sha256)
        ):
            raise bad("sha256", "64 lower-case hex digits (of the encoded bytes)", self.sha256)
        if self.format not in SUPPORTED_FORMATS:
            raise bad("format", f"one of {', '.join(SUPPORTED_FORMATS)}", self.format)
        q = self.jpeg_quality
        if q is not None and (isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100):
            raise bad("jpeg_quality", "None or an int in 1..100", q)

    @property
    def longest_side(self) -> int:
        """``max(width, height)``."""
        return max(self.width, self.height)

    def __repr__(self) -> str:
        quality = "" if self.jpeg_quality is None else f", quality≈{self.jpeg_quality}"
        return (
            f"DecodedImage({self.format} {self.width}x{self.height}, {self.n_bytes} bytes"
            f"{quality}, sha256={self.sha256[:12]}…)"
        )


def decode_image(
    source: bytes | bytearray | memoryview | str | os.PathLike[str],
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    min_side: int = 1,
    min_contrast: float = 0.0,
) -> DecodedImage:
    """Decode a JPEG, PNG or WebP scene image into an upright RGB image, or refuse it.

    Parameters
    ----------
    source
        The encoded bytes (``bytes``, ``bytearray``, ``memoryview``), or a path to a file
        holding them (``str`` or ``os.PathLike``). A ``str`` is always a path.
    max_pixels
        Largest accepted ``width * height``, checked from the header before decoding.
    max_bytes
        Largest accepted encoded size; a file is checked by ``stat`` before it is read.
    min_side
        Smallest accepted width and height, checked from the header before decoding (the
        guard uses :data:`DEFAULT_MIN_SIDE`, 32 px).
    min_contrast
        Smallest accepted :func:`image_contrast` of the decoded frame
        (:func:`check_visible_content`); 0, the default here, accepts any (the guard uses
        :data:`DEFAULT_MIN_CONTRAST`).

    Returns
    -------
    DecodedImage

    Raises
    ------
    ImageRefused
        With ``kind`` one of ``empty``, ``too_large_bytes``, ``not_found``,
        ``unsupported_format``, ``corrupt``, ``truncated``, ``zero_size``,
        ``decompression_bomb``, ``too_small``, ``blank``.
    ConfigError
        If ``max_pixels``, ``max_bytes`` or ``min_side`` is not a positive int, or
        ``min_contrast`` not a number in [0, 255].
    TypeError
        If ``source`` is neither bytes-like nor a path.
    """
    _check_decode_args(source, max_pixels=max_pixels, max_bytes=max_bytes)
    if not is_int(min_side) or min_side <= 0:
        raise ConfigError(
            f"min_side must be a positive int; got {min_side!r}. The guard's default is "
            f"{DEFAULT_MIN_SIDE} (min_image_side)."
        )
    min_contrast = check_min_contrast(min_contrast, "min_contrast")
    data = _read_source(source, max_bytes=max_bytes)
    decoded = _decode_bytes(data, max_pixels=max_pixels, min_side=int(min_side))
    check_visible_content(decoded, min_contrast)
    return decoded


def read_image_bytes(
    source: bytes | bytearray | memoryview | str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
    """The encoded bytes of ``source`` as :func:`decode_image` reads them (a copy of given
    bytes; a file read once, refused past ``max_bytes``): decode these and store these, and
    what is scored is what is stored, though the file or buffer changes meanwhile."""
    _check_decode_args(source, max_pixels=DEFAULT_MAX_PIXELS, max_bytes=max_bytes)
    return _read_source(source, max_bytes=max_bytes)


def check_min_side(width: int, height: int, min_side: int) -> None:
    """Refuse an image whose width or height is below ``min_side`` (kind ``too_small``)."""
    if min(width, height) < min_side:
        raise ImageRefused(
            f"image is {width}x{height} pixels; both sides must be at least {min_side} px "
            "(min_image_side) to show a scene. Send the camera frame itself, not a thumbnail "
            "or placeholder (or lower min_image_side).",
            kind="too_small",
        )


def image_contrast(image: Image.Image) -> float:
    """How much of the scene the frame shows: the contrast (levels 0..255) that at least
    :data:`CONTENT_SHARE` (2 %) of the frame shows against the frame's own smooth background,
    once thin overlays and an on-screen display's rows are taken out; 0 for a uniform frame.
    It is the largest, over R, G and B, of the 98th percentile of the cells' distances from
    that background.

    Four steps, each against one way a frame that shows nothing passed for content:

    1. *Reduce.* A frame whose longest side is 640 px or more is box-averaged by an integer
       factor to a longest side under 640 px (320 px at least).
    2. *Take thin structures out.* Split at the frame's smooth background (step 4's surface,
       at pixel scale), the part above it gets a grey opening and the part below it a grey
       closing, each with a square of :data:`CONTRAST_THIN_PX` px of the reduced frame (3 px
       under 128 px, none under 64 px); they remove whatever bright or dark is narrower: the
       strokes of a burned-in timestamp or camera name and their dark outline, a crosshair,
       a hot pixel (10 px at 640x480, 30 px at 1920x1080). A covered lens that shows only an
       overlay keeps nothing of it (:func:`_thin_out`).
    3. *Cells.* Means over a grid of squares of at least :data:`CONTRAST_CELL_PX` px of the
       frame, at most :data:`CONTRAST_GRID` along its longest side (640x480: 32x24 cells;
       160x120: 10x7; under 32 px: two along the longest side). Averaging divides
       independent sensor noise by 16 at least.
    4. *Background.* A quadratic surface in the cell's position, fitted per channel by
       iteratively reweighted least squares with Tukey's biweight (so it follows the frame's
       majority, not the content on it), is the frame's smooth background; a plane where the
       grid has fewer than 6 cells along a side, one level under 4. A light leak or a vignette over a covered
       lens (a wide, smooth ramp) is background, not content.

    Rows of an on-screen display are not measured: within :data:`OVERLAY_BAND` of the top or
    bottom edge, rows of text (dense edges between neighbouring pixels) and the rows of the
    box it is drawn on, found on the reduced frame before step 2, take their rows of cells out
    of step 4's fit and of the percentile (:func:`_overlay_strips`). A display on a filled box
    (dark, semi-transparent or a light shade) over a gray, fogged or blown-out lens was content
    before: the box is wider than step 2's square. Rows of text that go on past the band are
    the scene's texture and stay.

    The 98th percentile asks content to cover 2 % of the cells at least: a logo, a speck of
    light or a corner of the scene left by a hand over the lens covers less. Colour is read
    per channel, so a red object on a green wall of the same brightness counts. Measured by
    ``bench/blank_frames.py`` (see :data:`DEFAULT_MIN_CONTRAST`).
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    longest = max(image.size)
    k = max(1, longest // 320)
    small = image.reduce(k) if k > 1 else image
    a = np.asarray(small)
    # (a frame under 128 px gets a smaller square: under 64 px, none, or it takes all)
    radius = min(CONTRAST_THIN_PX // 2, max(a.shape[:2]) // 64)
    strips = _overlay_strips(a) if radius > 0 else []
    if radius > 0:
        a = _thin_out(a, radius, longest)
    means = _cell_means(a.astype(np.float64), longest)
    residual = _background(means[_rows_outside(strips, a.shape[0], means.shape[0])])[0]
    share = 100.0 * (1.0 - CONTENT_SHARE)
    return float(np.max(np.percentile(np.abs(residual), share, axis=0)))


def _overlay_strips(a: np.ndarray) -> list[tuple[int, int]]:
    """The rows (start, stop) of ``a`` (the reduced frame, uint8 RGB) that hold an on-screen
    display along its top or bottom edge: within :data:`OVERLAY_BAND` of the edge, the rows
    of text (each with at least :data:`_OVERLAY_EDGES` edges, steps of more than
    :data:`_OVERLAY_STEP` levels between neighbours, within :data:`_OVERLAY_WINDOW` pixels:
    letters are dense, the sides of objects are not), the rows past them that still differ
    from what lies beyond (the box the text is drawn on), and everything between them and
    the edge. No strip where the text rows reach past the band or go on right after it
    (texture of the scene, not a line of text)."""
    h = a.shape[0]
    d = np.diff(a.astype(np.int16), axis=1)  # (h, w - 1, 3)
    big = np.take_along_axis(d, np.abs(d).argmax(axis=2)[..., None], axis=2)[..., 0]
    sign = np.where(np.abs(big) > _OVERLAY_STEP, np.sign(big), 0)
    # a step starts an edge where the one before it is not of its sign: a soft or JPEG-blurred
    # side of an object is several steps of one sign, one edge; a letter's stroke is two
    steps = (sign != 0) & (sign != np.pad(sign, ((0, 0), (1, 0)))[:, :-1])
    run = np.cumsum(steps, axis=1, dtype=np.int32)
    window = min(_OVERLAY_WINDOW, run.shape[1])
    dense = run[:, window - 1 :] - np.pad(run, ((0, 0), (1, 0)))[:, : run.shape[1] - window + 1]
    text = dense.max(axis=1) >= _OVERLAY_EDGES
    band = math.ceil(OVERLAY_BAND * h)
    out = []
    for top in (True, False):
        inward = slice(None) if top else slice(None, None, -1)  # rows from the edge inward
        rows, text_in, steps_in = a[inward], text[inward], steps[inward]
        hit = np.flatnonzero(text_in[:band])
        if hit.size == 0:
            continue
        cols = np.flatnonzero(steps_in[hit].any(axis=0))
        c0, c1 = int(cols[0]), int(cols[-1]) + 2  # the text's columns
        end = int(hit[-1]) + 1
        while end < band:  # the box's rows past the text
            beyond = rows[end + 2 : end + 6, c0:c1].reshape(-1, 3)
            if beyond.size == 0:
                break
            row = np.median(rows[end, c0:c1].reshape(-1, 3), axis=0)
            if np.abs(row - np.median(beyond, axis=0)).max() <= _OVERLAY_SAME:
                break
            end += 1
        end += 1  # the row a JPEG blurs across the box's side
        if end > band or text_in[end : end + 3].any():
            continue
        out.append((0, end) if top else (h - end, h))
    return out


def _rows_outside(strips: list[tuple[int, int]], height: int, n_rows: int) -> np.ndarray:
    """Which of the ``n_rows`` rows of cells :func:`_cell_means` lays on a frame of ``height``
    rows touch none of ``strips``; all of them where fewer than two would be left."""
    edges = np.linspace(0, height, n_rows + 1).round().astype(np.intp)
    keep = np.ones(n_rows, dtype=bool)
    for start, stop in strips:
        keep &= ~((edges[:-1] < stop) & (edges[1:] > start))
    return keep if keep.sum() >= 2 else np.ones(n_rows, dtype=bool)


def _thin_out(a: np.ndarray, radius: int, longest: int) -> np.ndarray:
    """``a`` without what is narrower than a square of ``2 radius + 1``, bright or dark.

    Each channel is split at its smooth background (step 4's surface, fitted on the frame
    opened and closed as one, at pixel scale): the part above it (``max(a, level)``) gets a
    grey opening, which takes out bright structures narrower than the square (a timestamp's
    letters, a crosshair), then a closing; the part below it (``min(a, level)``) a grey
    closing, which takes out dark ones (the black outline around those letters), then an
    opening; the two are put back together. Each part is filtered both ways, so a thin
    bright stroke on a region darker than the background (white text on a dark box), which
    the split leaves in the dark part as a stroke at the background's level, goes too.

    Filtered as one (an opening, then a closing), the outline and the letters joined into a
    band as wide as the text, which counted as content on a covered lens at video black 16,
    a gray or a white frame. Split at one level for the whole frame, a light leak's ramp put
    letters below it on its bright side, where the closing joined them into a band; split at
    a background fitted on the frame before filtering, large text on a small frame raised
    the level under it, with the same result. Opened and closed as one, the frame keeps no
    letter to raise it (only the bands, thin enough for the fit's biweight to set aside).
    """
    planes = np.ascontiguousarray(a.transpose(2, 0, 1))  # (3, height, width): rows inner
    opened_closed = _closing(_opening(planes, radius), radius).transpose(1, 2, 0)
    level = _background(_cell_means(opened_closed.astype(np.float64), longest), a.shape[:2])[1]
    assert level is not None  # (given a shape, _background returns the surface)
    split = np.clip(np.rint(level), 0, 255).astype(a.dtype)
    bright = _closing(_opening(np.maximum(planes, split), radius), radius)
    dark = _opening(_closing(np.minimum(planes, split), radius), radius)
    # the sum can leave 0..255 where the split level varies: a filter's square takes values
    # clipped to a neighbour's level, so beside a step of the rounded surface ``dark`` can
    # exceed ``split`` (255 + 255 - 254) or ``bright`` fall below it; cast unclipped, 256
    # wrapped to a black pixel on a white frame (a frame blown out to white with an on-screen
    # display then measured 11 levels of "content"), so it is clipped
    out = np.clip(bright.astype(np.int16) + dark - split, 0, 255)
    return out.astype(a.dtype).transpose(1, 2, 0)


def _rank(x: np.ndarray, op: np.ufunc, radius: int) -> np.ndarray:
    """The minimum (``op=np.minimum``) or maximum of each plane of ``x`` (channels, height,
    width) over a square of ``2 radius + 1`` (separable; the frame's edge repeats nothing:
    the square is cut)."""
    for axis in (1, 2):
        out = x.copy()
        n = x.shape[axis]
        for s in range(1, min(radius, n - 1) + 1):
            head = [slice(None)] * x.ndim
            tail = [slice(None)] * x.ndim
            head[axis], tail[axis] = slice(s, None), slice(0, n - s)
            op(out[tuple(head)], x[tuple(tail)], out=out[tuple(head)])
            op(out[tuple(tail)], x[tuple(head)], out=out[tuple(tail)])
        x = out
    return x


def _opening(x: np.ndarray, radius: int) -> np.ndarray:
    """Grey opening: takes out bright structures narrower than the square."""
    return _rank(_rank(x, np.minimum, radius), np.maximum, radius)


def _closing(x: np.ndarray, radius: int) -> np.ndarray:
    """Grey closing: takes out dark structures narrower than the square."""
    return _rank(_rank(x, np.maximum, radius), np.minimum, radius)


def _cell_means(a: np.ndarray, longest: int) -> np.ndarray:
    """(rows, cols, 3) means of the cells :func:`image_contrast` lays on ``a`` (a frame whose
    original longest side was ``longest``)."""
    h, w = a.shape[:2]
    # cells along the longest side: two at least (a frame under 32 px, which only a lowered
    # min_image_side lets through, gets smaller cells rather than one, which shows nothing)
    cells = max(2, min(CONTRAST_GRID, longest // CONTRAST_CELL_PX))
    side = max(h, w) / cells  # a cell's side in the reduced frame
    n_rows, n_cols = (min(n, max(1, int(n / side))) for n in (h, w))  # (1 px a cell at least)
    rows = np.linspace(0, h, n_rows + 1).round().astype(np.intp)[:-1]
    cols = np.linspace(0, w, n_cols + 1).round().astype(np.intp)[:-1]
    sums = np.add.reduceat(np.add.reduceat(a, rows, axis=0), cols, axis=1)
    counts = np.outer(np.diff(np.append(rows, h)), np.diff(np.append(cols, w)))
    return sums / counts[..., None]


def _background(
    means: np.ndarray, shape: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each cell's distance from its channel's smooth background, ``(cells, 3)``: a quadratic
    surface (a plane on a grid under 6 cells a side, a level under 4) fitted with Tukey's
    biweight. With ``shape`` (the frame's height and width, over which ``means`` was laid by
    :func:`_cell_means`), also that surface at each pixel, ``(3, height, width)`` float32."""
    n_rows, n_cols, channels = means.shape
    # the surface's terms as powers (of y, of x): a slope along a side of 4 cells or more, a
    # quadratic on 6 or more both ways (on fewer cells the surface would take the content for
    # background: 2 cells fit any slope)
    powers = [(0, 0)]
    powers += [(0, 1)] if n_cols >= 4 else []
    powers += [(1, 0)] if n_rows >= 4 else []
    if min(n_rows, n_cols) >= 6:
        powers += [(0, 2), (1, 1), (2, 0)]
    rows, cols = np.meshgrid(
        np.linspace(-1.0, 1.0, n_rows), np.linspace(-1.0, 1.0, n_cols), indexing="ij"
    )
    y, x = rows.ravel(), cols.ravel()
    basis = np.stack([y**p * x**q for p, q in powers], axis=1)
    values = means.reshape(-1, channels)
    offset = np.median(values, axis=0)
    values = values - offset  # (a uniform frame: exactly 0 everywhere)
    outer = (basis[:, :, None] * basis[:, None, :]).reshape(len(basis), -1)
    weights = np.ones_like(values)
    residual = values
    coef = np.zeros((channels, basis.shape[1]))
    for _ in range(_BIWEIGHT_ROUNDS):  # every channel at once: weighted normal equations
        gram = (weights.T @ outer).reshape(channels, basis.shape[1], basis.shape[1])
        rhs = (weights * values).T @ basis
        coef = (np.linalg.pinv(gram, hermitian=True) @ rhs[..., None])[..., 0]
        residual = values - basis @ coef.T
        # the scale: the residuals' MAD, not under half a level (a noise-free fill)
        scale = np.maximum(np.median(np.abs(residual), axis=0) / 0.6745, 0.5)
        u = residual / (4.685 * scale)
        weights = np.where(np.abs(u) < 1.0, (1.0 - u * u) ** 2, 0.0)
    if shape is None:
        return residual, None
    # a pixel's coordinate on the cells' axis: cell i's centre is at -1 + 2 i / (n - 1)
    y_px, x_px = _pixel_axis(shape[0], n_rows), _pixel_axis(shape[1], n_cols)
    # the sum over x's powers q of (the terms' parts in y with that q) * x**q, a plane per
    # channel, in float32 and in place (a frame's worth of float64 temporaries per term, or
    # the channel as the innermost axis, took milliseconds)
    surface = np.empty((channels, *shape), np.float32)
    term = np.empty_like(surface)
    for i, q in enumerate(sorted({q for _, q in powers})):
        along_y = np.zeros((channels, shape[0])) + (offset[:, None] if q == 0 else 0.0)
        for t, (p, qt) in enumerate(powers):
            if qt == q:
                along_y += coef[:, t, None] * y_px[None, :] ** p
        np.multiply(
            along_y.astype(np.float32)[:, :, None],
            (x_px**q).astype(np.float32)[None, None, :],
            out=surface if i == 0 else term,
        )
        if i:
            surface += term
    return residual, surface


def _pixel_axis(n: int, cells: int) -> np.ndarray:
    """The coordinate of each of ``n`` pixels on the axis on which :func:`_background` puts
    the centres of ``cells`` cells (laid by :func:`_cell_means`) at -1 .. 1."""
    if cells < 2:
        return np.zeros(n)
    edges = np.linspace(0, n, cells + 1).round()
    centres = (edges[:-1] + edges[1:] - 1.0) / 2.0
    return -1.0 + 2.0 * (np.arange(n) - centres[0]) / (centres[-1] - centres[0])


def check_min_contrast(value: object, key: str = "min_image_contrast") -> float:
    """``value`` as a ``min_image_contrast`` (a number of levels in [0, 255]), or a
    :class:`ConfigError` naming ``key``."""
    if not is_real(value) or not 0.0 <= float(value) <= 255.0:  # (NaN fails both)
        raise ConfigError(
            f"{key} must be a number of levels in [0, 255] (0 turns the check off); got "
            f"{value!r}. The default is {DEFAULT_MIN_CONTRAST:g}: a frame whose "
            "image_contrast() is below it shows nothing (a covered lens, a blown-out or blank "
            "frame)."
        )
    return float(value)


def check_visible_content(image: Image.Image | DecodedImage, min_contrast: float) -> None:
    """Refuse a frame without visible content (kind ``blank``): one whose
    :func:`image_contrast` is below ``min_contrast`` (0: nothing is refused).

    A covered lens (black with sensor noise, or with nothing but a burned-in timestamp, a
    crosshair, a logo or a light leak on it), a frame blown out to white, a gray or one-colour
    fill from a broken pipeline: scored, such a frame leaves the decision to the request
    alone, for a scene nobody saw. The guard, the sidecar, batch checks, ``spotstop check``
    and a calibration pool refuse it here.

    Given a :class:`DecodedImage` that :func:`decode_image` checked itself, against at least
    ``min_contrast``, the statistic is not computed again (the sidecar decodes and checks a
    frame for its 422, then hands that object to the guard). The record is kept on that
    object only: a :class:`DecodedImage` built by hand, or by :func:`dataclasses.replace`,
    is checked here. (Pixels changed in place after :func:`decode_image` no longer match its
    ``sha256`` either; send the changed frame encoded.)
    """
    if min_contrast <= 0:
        return
    if isinstance(image, DecodedImage):
        checked = image.__dict__.get(_CHECKED_AT)
        if checked is not None and checked >= min_contrast:
            return
        frame = image.image
    else:
        frame = image
    contrast = image_contrast(frame)
    if not contrast >= min_contrast:  # (a NaN would be refused too)
        raise ImageRefused(
            f"image shows no visible content: its contrast is {contrast:.1f} levels (what at "
            f"least {CONTENT_SHARE:.0%} of the frame shows against its smooth background, "
            "thin overlays such as a timestamp and an on-screen display's rows along the top "
            f"or bottom edge taken out, over cells of at least "
            f"{CONTRAST_CELL_PX} px); at least {min_contrast:g} is needed "
            "(min_image_contrast). A covered or blocked lens (with only an overlay, a logo or "
            "a light leak on it), a frame blown out to white or black, or a blank frame from "
            "the camera pipeline: check the camera and send a frame that shows the scene (or "
            "lower min_image_contrast, measured on this camera's frames).",
            kind="blank",
        )
    if isinstance(image, DecodedImage):
        object.__setattr__(image, _CHECKED_AT, float(min_contrast))


def gray_image(width: int, height: int, value: int = 128) -> Image.Image:
    """A uniform RGB image, the content-free input of the gray pass.

    ``gray_image(w, h)`` has every channel of every pixel equal to ``value`` (128 by
    default, mid gray). Use the scene's own size so the member preprocesses both alike.
    """
    for name, side in (("width", width), ("height", height)):
        if not is_int(side) or side <= 0:
            raise ConfigError(
                f"gray_image {name} must be a positive int; got {side!r}. "
                "Pass the scene image's width and height."
            )
    if not is_int(value) or not 0 <= value <= 255:
        raise ConfigError(
            f"gray_image value must be an int in 0..255; got {value!r}. Use 128 for mid gray."
        )
    return Image.new("RGB", (width, height), (value, value, value))


# --------------------------------------------------------------------------- validation


def _check_decode_args(source: object, *, max_pixels: object, max_bytes: object) -> None:
    if not isinstance(source, bytes | bytearray | memoryview | str | os.PathLike):
        raise TypeError(
            "decode_image source must be bytes, bytearray, memoryview, str or os.PathLike; "
            f"got {type(source).__name__}. Pass the encoded file bytes or a path to the file."
        )
    if not is_int(max_pixels) or max_pixels <= 0:
        raise ConfigError(
            f"max_pixels must be a positive int; got {max_pixels!r}. "
            f"The default is {DEFAULT_MAX_PIXELS} (guard.limits.max_pixels)."
        )
    if not is_int(max_bytes) or max_bytes <= 0:
        raise ConfigError(
            f"max_bytes must be a positive int; got {max_bytes!r}. "
            f"The default is {DEFAULT_MAX_BYTES} (guard.limits.max_bytes)."
        )


def _too_large(n_bytes: int, max_bytes: int) -> ImageRefused:
    return ImageRefused(
        f"image has {n_bytes} bytes; the limit is {max_bytes} bytes (max_bytes). "
        "Re-encode the camera frame smaller (lower resolution or JPEG quality) "
        "or raise guard.limits.max_bytes.",
        kind="too_large_bytes",
    )


def _empty(what: str) -> ImageRefused:
    return ImageRefused(
        f"image is empty: {what} has 0 bytes. Check that the camera frame was captured "
        "and sent completely.",
        kind="empty",
    )


def _read_source(
    source: bytes | bytearray | memoryview | str | os.PathLike[str], *, max_bytes: int
) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        if view.nbytes == 0:
            raise _empty("the given bytes")
        if view.nbytes > max_bytes:
            raise _too_large(view.nbytes, max_bytes)
        return view.tobytes()

    path = os.fspath(source)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ImageRefused(
            f"image file {path!r} does not exist. Check the path.", kind="not_found"
        ) from None
    except OSError as exc:
        raise ImageRefused(
            f"image file {path!r} could not be read ({exc.strerror or exc}). "
            "Check the path and its permissions.",
            kind="not_found",
        ) from exc
    if stat.S_ISDIR(info.st_mode):
        raise ImageRefused(
            f"image path {path!r} is a directory, not a file. Pass the path of an image file.",
            kind="not_found",
        )
    if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
        raise _too_large(info.st_size, max_bytes)
    try:
        with open(path, "rb") as handle:
            # Read one byte past the limit: a non-regular file (pipe, device) has no size.
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ImageRefused(
            f"image file {path!r} could not be read ({exc.strerror or exc}). "
            "Check the path and its permissions.",
            kind="not_found",
        ) from exc
    if not data:
        raise _empty(f"file {path!r}")
    if len(data) > max_bytes:
        raise _too_large(len(data), max_bytes)
    return data


# --------------------------------------------------------------------------- sniffing


def _sniff_format(data: bytes) -> str | None:
    """Name a format from its leading bytes; ``None`` if unknown."""
    if data.startswith(b"\xff\xd8"):  # SOI; Pillow itself wants a marker after it
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if data[:2] == b"BM":
        return "BMP"
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in (b"avif", b"avis"):
            return "AVIF"
        if brand in (b"heic", b"heix", b"hevc", b"hevx", b"mif1", b"msf1", b"heim", b"heis"):
            return "HEIF"
        return "ISO media (MP4/MOV/HEIF family)"
    if data.startswith((b"\x00\x00\x00\x0cjP  \r\n\x87\n", b"\xff\x4f\xff\x51")):
        return "JPEG 2000"
    if data.startswith((b"\xff\x0a", b"\x00\x00\x00\x0cJXL \r\n\x87\n")):
        return "JPEG XL"
    if data[:4] == b"\x00\x00\x01\x00":
        return "ICO"
    if data[:4] == b"8BPS":
        return "PSD"
    if data[:4] == b"%PDF":
        return "PDF"
    if data[:4] == b"qoif":
        return "QOI"
    if data[:4] == b"DDS ":
        return "DDS"
    if data[:4] == b"icns":
        return "ICNS"
    if data[:4] == b"RIFF":
        return "RIFF (not WebP)"
    if len(data) >= 2 and data[0:1] == b"P" and data[1:2] in b"1234567":
        return "PNM"
    head = data[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")):
        return "SVG/XML"
    return None


def _png_header_size(data: bytes) -> tuple[int, int] | None:
    if len(data) >= 24 and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None


#: most segments (and runs of bytes between them) a JPEG may hold before its first scan
_MAX_JPEG_HEADER_SEGMENTS: Final[int] = 4096
_FILL = re.compile(rb"\xff+")


def _jpeg_scans(data: bytes) -> tuple[int, bool] | None:
    """``(scans, ended)`` of a JPEG: how many start-of-scan segments it holds before its
    end-of-image marker, and whether it has that marker; None when no scan begins (Pillow then
    refuses the file as corrupt or truncated).

    The segments before the first scan are walked by their lengths, as libjpeg reads them (so
    the markers of an EXIF thumbnail inside ``APP1`` are passed over; bytes between segments
    are skipped to the next ``FF``). After it, markers are found by search: scan data holds no
    ``FF`` but as ``FF 00`` or a restart marker, so ``FF DA`` and ``FF D9`` there are markers
    (walking its bytes in Python took seconds on 12 MB of ``FF 00``). A file with more than
    :data:`_MAX_JPEG_HEADER_SEGMENTS` segments (or junk runs) before its first scan is refused
    as corrupt: a camera frame has a few dozen."""
    i, n = 2, len(data)
    for _ in range(_MAX_JPEG_HEADER_SEGMENTS):
        if i + 1 >= n:
            return None
        if data[i] != 0xFF:  # not a marker: skipped, as libjpeg does (with a warning)
            i = data.find(b"\xff", i)
            if i < 0:
                return None
            continue
        fill = _FILL.match(data, i)  # (FF may repeat before a marker, as fill)
        i = (i + 1 if fill is None else fill.end()) - 1
        if i + 1 >= n:
            return None
        marker = data[i + 1]
        if marker == 0xDA:
            break
        if marker == 0xD9:  # the end before any scan
            return None
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    else:
        raise _corrupt(
            "JPEG", f"it holds more than {_MAX_JPEG_HEADER_SEGMENTS} segments before its image data"
        )
    end = data.find(b"\xff\xd9", i + 2)
    return 1 + data.count(b"\xff\xda", i + 2, n if end < 0 else end), end >= 0


def _truncation_problem(data: bytes, fmt: str) -> str | None:
    """Structural truncation checks that Pillow does not make."""
    if fmt == "PNG":
        end = data.rfind(b"IEND")
        if end < 0 or end + 8 > len(data):
            return "the PNG ends before its IEND chunk"
    if fmt == "WEBP" and len(data) >= 8:
        declared = int.from_bytes(data[4:8], "little") + 8
        if len(data) < declared:
            return f"the WebP's RIFF header declares {declared} bytes but {len(data)} came"
    return None


def _truncated(detail: str) -> ImageRefused:
    return ImageRefused(
        f"image file is truncated: {detail}. The frame was cut off in capture or "
        "transfer; send the complete file.",
        kind="truncated",
    )


def _corrupt(fmt: str, detail: str) -> ImageRefused:
    return ImageRefused(
        f"image looks like {fmt} but could not be decoded ({detail}). The file is corrupt; "
        "re-capture or re-encode the camera frame.",
        kind="corrupt",
    )


def _bomb(detail: str, max_pixels: int) -> ImageRefused:
    return ImageRefused(
        f"{detail}; the limit is {max_pixels:.3g} pixels (max_pixels), and larger images are "
        "refused before decoding as a possible decompression bomb. Downscale the camera "
        "frame or raise guard.limits.max_pixels.",
        kind="decompression_bomb",
    )


# --------------------------------------------------------------------------- decoding


def _decode_bytes(data: bytes, *, max_pixels: int, min_side: int = 1) -> DecodedImage:
    sniffed = _sniff_format(data)
    if sniffed is not None and sniffed not in SUPPORTED_FORMATS:
        raise ImageRefused(
            f"image format {sniffed} is not supported; supported are JPEG, PNG and WebP. "
            f"{_SUPPORTED_HINT}",
            kind="unsupported_format",
        )
    if sniffed is None:
        raise ImageRefused(
            f"image bytes are not a JPEG, PNG or WebP file (they start with {data[:8]!r}). "
            f"{_SUPPORTED_HINT}",
            kind="unsupported_format",
        )
    problem = _truncation_problem(data, sniffed)
    if problem is not None:
        raise _truncated(problem)
    jpeg = _jpeg_scans(data) if sniffed == "JPEG" else None
    if jpeg is not None and jpeg[0] > MAX_JPEG_SCANS:
        raise ImageRefused(
            f"the JPEG has {jpeg[0]} scans; at most {MAX_JPEG_SCANS} are accepted. Each scan "
            "decodes a colour plane of the whole frame again (a baseline JPEG has 1, a "
            "progressive one about 10), so more are refused before decoding as a possible "
            "decompression bomb. Send the camera frame as a baseline JPEG.",
            kind="decompression_bomb",
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = _open_and_load(
            data, sniffed, max_pixels=max_pixels, min_side=min_side, caught=caught
        )

    fmt = sniffed
    if jpeg is not None and not jpeg[1]:  # (after Pillow: a file it refuses keeps its reason)
        # Pillow decodes a JPEG whose scan data is followed by any bytes without asking for
        # its end-of-image marker: a frame cut short inside a zero-filled (or reused) buffer
        # decoded, its lost rows made of the padding. Only one that ended there was refused.
        image.close()
        raise _truncated("the JPEG has no end-of-image marker (FF D9) after its image data")
    cut = jpeg_cut_short(data, image) if fmt == "JPEG" else None
    if cut is not None:  # (one that ends there, but too early: libjpeg filled the rest gray)
        image.close()
        raise _truncated(cut)
    quality = _estimate_jpeg_quality(image) if fmt == "JPEG" else None
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        rgb = _to_rgb(_upright(image, fmt))
    image.close()
    return DecodedImage(
        image=rgb,
        sha256=hashlib.sha256(data).hexdigest(),
        width=rgb.width,
        height=rgb.height,
        n_bytes=len(data),
        format=fmt,
        jpeg_quality=quality,
    )


def _check_bomb_warnings(caught: list[warnings.WarningMessage], max_pixels: int) -> None:
    for message in caught:
        if issubclass(message.category, Image.DecompressionBombWarning):
            raise _bomb(f"Pillow flagged the image: {message.message}", max_pixels)


def _open_and_load(
    data: bytes,
    fmt: str,
    *,
    max_pixels: int,
    min_side: int,
    caught: list[warnings.WarningMessage],
) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as exc:
        raise _bomb(f"Pillow flagged the image: {exc}", max_pixels) from exc
    except UnidentifiedImageError as exc:
        header = _png_header_size(data) if fmt == "PNG" else None
        if header is not None and 0 in header:
            raise _zero_size(*header) from exc
        raise _corrupt(fmt, "Pillow could not read its header") from exc
    except MemoryError:
        raise
    except Exception as exc:  # any parser error on untrusted bytes means a corrupt file
        raise _corrupt(fmt, f"{type(exc).__name__}: {exc}") from exc
    _check_bomb_warnings(caught, max_pixels)

    width, height = image.size
    if width <= 0 or height <= 0:
        image.close()
        raise _zero_size(width, height)
    if width * height > max_pixels:
        image.close()
        raise _bomb(f"image has {width}x{height} = {width * height:.3g} pixels", max_pixels)
    if min(width, height) < min_side:  # from the header: no pixel is decoded
        image.close()
        check_min_side(width, height, min_side)

    try:
        image.load()
    except MemoryError:
        image.close()
        raise
    except Exception as exc:  # decoder errors on untrusted bytes: truncated or corrupt
        image.close()
        text = str(exc)
        if isinstance(exc, EOFError) or "truncated" in text.lower():
            raise _truncated(f"Pillow stopped decoding ({text or type(exc).__name__})") from exc
        raise _corrupt(fmt, f"{type(exc).__name__}: {text}") from exc
    _check_bomb_warnings(caught, max_pixels)
    return image


def _zero_size(width: int, height: int) -> ImageRefused:
    return ImageRefused(
        f"image has zero size ({width}x{height}); width and height must both be at least 1. "
        "Check the camera capture.",
        kind="zero_size",
    )


def _upright(image: Image.Image, fmt: str) -> Image.Image:
    try:
        upright = ImageOps.exif_transpose(image)
    except MemoryError:
        raise
    except Exception as exc:  # a broken EXIF block on untrusted bytes
        raise _corrupt(fmt, f"its EXIF orientation could not be applied: {exc}") from exc
    if upright is None:  # only with in_place=True; kept for the type checker
        return image
    return upright


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode == "RGB" and "transparency" not in image.info:
        return image
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        values = np.asarray(image).astype(np.float64)
        gray = np.clip(np.rint(np.clip(values, 0, 65535) / 257.0), 0, 255).astype(np.uint8)
        key = image.info.get("transparency")
        if isinstance(key, int) and not isinstance(key, bool):  # tRNS: that grey is transparent
            gray[values == key] = 255  # white, as every other transparent pixel
        return Image.fromarray(gray, mode="L").convert("RGB")
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


@functools.cache
def _ijg_luma_tables() -> np.ndarray:
    """(100, 64): libjpeg's luminance table scaled for quality 1..100 (row ``q - 1``)."""
    base = np.asarray(_IJG_LUMA, dtype=np.int64)
    q = np.arange(1, 101, dtype=np.int64)
    scale = np.where(q < 50, 5000 // q, 200 - 2 * q)
    tables = np.clip((base[None, :] * scale[:, None] + 50) // 100, 1, 255)
    tables.setflags(write=False)
    return tables


def _estimate_jpeg_quality(image: Image.Image) -> int | None:
    """IJG quality whose scaled standard luminance table is nearest to table 0.

    libjpeg scales the Annex K table by ``s = 5000 / q`` for ``q < 50`` and
    ``s = 200 - 2 q`` otherwise, entry ``max(1, min(255, (base * s + 50) // 100))``. We
    invert it by comparing with the tables of every ``q`` in 1..100 (computed once) and
    keeping the one with the smallest summed absolute difference (ties go to the higher
    quality). It is an estimate: encoders with their own tables get the nearest IJG quality.
    """
    tables = getattr(image, "quantization", None)
    if not tables or 0 not in tables:
        return None
    table = np.asarray(list(tables[0]), dtype=np.int64)
    if table.size != 64:
        return None
    err = np.abs(_ijg_luma_tables() - table).sum(axis=1)
    return 100 - int(np.argmin(err[::-1]))  # the last minimum: ties go to the higher q
