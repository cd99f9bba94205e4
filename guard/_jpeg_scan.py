"""Whether a JPEG's image data holds the whole frame: the check behind
:func:`~spotstop.guard._image.decode_image`'s refusal of a JPEG cut short and re-terminated.

A JPEG whose transfer stopped part-way and that still ends with an end-of-image marker
(``FF D9`` appended by a sender, a driver or a proxy, or a buffer cut where its last bytes
happened to end it) decodes in Pillow without an error: libjpeg meets the marker before the
last MCU, warns "Premature end of JPEG file" (Pillow drops libjpeg's warnings: its
``JpegDecode.c`` sets an ``output_message`` that does nothing and never reads
``num_warnings``) and leaves every MCU after the one it was decoding with zero
coefficients. In a sequential JPEG those blocks are exact mid gray (Y = Cb = Cr = 128, RGB
128, 128, 128; restart markers do not change it); in a progressive one they keep what the
earlier scans gave them.

:func:`jpeg_cut_short` answers from the bytes, exactly:

* **Sequential JPEG** (baseline or extended, Huffman-coded; one scan or one scan per
  component): every component must be in a scan, and the last scan's entropy-coded data must
  hold all its MCUs. With restart markers, the intervals are counted first (one missing is a
  cut) and only the last interval is decoded; without them the whole scan is. The decoder
  here only walks the Huffman codes (no dequantization, no IDCT) and counts the MCUs whose
  bits all lie in the data: a cut anywhere, at an MCU's boundary or inside it, leaves fewer.
  It is pure Python (12 ms for a 640x480 frame, 109 ms at 1920x1080, by
  ``bench/jpeg_cut_short.py``; 1.0-1.3 s for a crafted 2.4 MB frame of pixel noise at
  1920x1080, measured apart), so for a one-scan RGB or
  grayscale frame it runs only when the decoded frame's last MCU (less its first row and
  column, which chroma upsampling mixes with its neighbours) is exact mid gray in every
  channel, as every frame cut before its last MCU is; a camera frame with sensor noise never
  has such a corner. A CMYK frame or one of several sequential scans is always counted.
* **Progressive JPEG**: the scans must bring every coefficient of every component to full
  precision (``Al = 0``). A file cut before its last scan lacks that scan and is refused.
  Not refused: a cut inside the last scan itself (libjpeg's script: the luma AC
  refinement), which would need a decode of every earlier AC scan to count; the blocks
  after the cut then lack the last bit of the luma AC coefficients (each such coefficient
  off by one quantization step at most; the scene is there, at a lower quality).
* Arithmetic-coded and lossless JPEGs are not checked here (no camera sends them).

A cut inside the frame's very last MCU of a one-scan frame is found only when that corner
decodes to exact gray (the trigger above); it loses at most that MCU (16x16 px).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

import numpy as np
from PIL import Image

__all__ = ["jpeg_cut_short"]

#: SOF markers of Huffman-coded sequential (baseline, extended) and progressive frames
_SEQUENTIAL: Final[frozenset[int]] = frozenset({0xC0, 0xC1})
_PROGRESSIVE: Final[int] = 0xC2
#: the other SOF markers (lossless, hierarchical, arithmetic): not checked here
_OTHER_SOF: Final[frozenset[int]] = frozenset(
    {0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
#: a marker that ends entropy-coded data: FF followed by neither 00 (a stuffed FF) nor RSTn
_DATA_END: Final = re.compile(rb"\xff[^\x00\xd0-\xd7]")
_RST: Final = re.compile(rb"\xff[\xd0-\xd7]")
_MAX_SEGMENTS: Final[int] = 8192

# an AC code's entry in its lookup table: bits to skip | coefficients to step << 5 | EOB << 10
_EOB: Final[int] = 1 << 10
#: zero bytes read past a segment's end: more than one block's codes (64 of 16 + 15 bits)
_TAIL: Final[int] = 512


@dataclass(frozen=True)
class _Component:
    ident: int
    h: int
    v: int


@dataclass(frozen=True)
class _Scan:
    components: tuple[int, ...]  # indices into the frame's components
    dc: tuple[int, ...]  # DC table ids, per scan component
    ac: tuple[int, ...]
    ss: int
    se: int
    ah: int
    al: int
    start: int  # first byte of the entropy-coded data
    end: int  # the marker that ends it
    restart: int  # the restart interval in force (MCUs; 0: none)
    tables: dict[tuple[int, int], bytes]  # (class, id) -> BITS + HUFFVAL in force


@dataclass(frozen=True)
class _Frame:
    sof: int
    width: int
    height: int
    components: tuple[_Component, ...]
    scans: tuple[_Scan, ...]


def jpeg_cut_short(data: bytes, image: Image.Image) -> str | None:
    """What shows that the JPEG ``data`` (decoded by Pillow into ``image``, before any EXIF
    rotation) was cut short and re-terminated, or ``None``: see the module's docstring."""
    frame = _parse(data)
    if frame is None or frame.sof in _OTHER_SOF:
        return None
    missing = _uncovered(frame)
    if missing is not None:
        return missing
    if frame.sof == _PROGRESSIVE:
        return None
    last = frame.scans[-1]
    single = len(frame.scans) == 1 and image.mode in ("L", "RGB")
    if single and not _gray_corner(frame, image):
        return None
    return _short_scan(frame, last, data)


# --------------------------------------------------------------------------- parsing


def _parse(data: bytes) -> _Frame | None:
    """The frame header and every scan of ``data``, walked as libjpeg reads them (segments by
    their lengths, entropy-coded data to the marker that ends it); None if malformed (Pillow
    decoded it: nothing is refused here that Pillow refused not)."""
    n = len(data)
    i = 2
    tables: dict[tuple[int, int], bytes] = {}
    restart = 0
    sof: tuple[int, int, int, tuple[_Component, ...]] | None = None
    scans: list[_Scan] = []
    for _ in range(_MAX_SEGMENTS):
        if i + 3 >= n:
            break
        if data[i] != 0xFF:
            i = data.find(b"\xff", i)
            if i < 0:
                break
            continue
        while i + 1 < n and data[i + 1] == 0xFF:  # fill bytes before a marker
            i += 1
        if i + 1 >= n:
            break
        marker = data[i + 1]
        if marker == 0xD9:
            break
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        body = data[i + 4 : i + 2 + length]
        if length < 2 or len(body) != length - 2:
            return None
        if marker in _SEQUENTIAL or marker == _PROGRESSIVE or marker in _OTHER_SOF:
            if sof is not None or len(body) < 6:
                return None
            count = body[5]
            if len(body) < 6 + 3 * count or count == 0:
                return None
            comps = tuple(
                _Component(body[6 + 3 * c], body[7 + 3 * c] >> 4, body[7 + 3 * c] & 15)
                for c in range(count)
            )
            if any(not (1 <= c.h <= 4 and 1 <= c.v <= 4) for c in comps):
                return None
            height = int.from_bytes(body[1:3], "big")
            width = int.from_bytes(body[3:5], "big")
            sof = (marker, width, height, comps)
        elif marker == 0xC4:
            if not _read_tables(body, tables):
                return None
        elif marker == 0xDD and len(body) >= 2:
            restart = int.from_bytes(body[:2], "big")
        elif marker == 0xDA:
            if sof is None:
                return None
            scan = _read_scan(body, sof[3], i + 2 + length, data, restart, tables)
            if scan is None:
                return None
            scans.append(scan)
            i = scan.end
            continue
        i += 2 + length
    if sof is None or not scans:
        return None
    return _Frame(sof[0], sof[1], sof[2], sof[3], tuple(scans))


def _read_tables(body: bytes, tables: dict[tuple[int, int], bytes]) -> bool:
    j = 0
    while j < len(body):
        if j + 17 > len(body):
            return False
        kind, ident = body[j] >> 4, body[j] & 15
        total = sum(body[j + 1 : j + 17])
        if kind > 1 or j + 17 + total > len(body):
            return False
        tables[(kind, ident)] = bytes(body[j + 1 : j + 17 + total])
        j += 17 + total
    return True


def _read_scan(
    body: bytes,
    comps: tuple[_Component, ...],
    start: int,
    data: bytes,
    restart: int,
    tables: dict[tuple[int, int], bytes],
) -> _Scan | None:
    if not body:
        return None
    count = body[0]
    if count == 0 or len(body) < 1 + 2 * count + 3:
        return None
    ids = [c.ident for c in comps]
    index, dc, ac = [], [], []
    for c in range(count):
        ident, sel = body[1 + 2 * c], body[2 + 2 * c]
        if ident not in ids:
            return None
        index.append(ids.index(ident))
        dc.append(sel >> 4)
        ac.append(sel & 15)
    ss, se, a = body[1 + 2 * count], body[2 + 2 * count], body[3 + 2 * count]
    found = _DATA_END.search(data, start)
    end = len(data) if found is None else found.start()
    return _Scan(
        components=tuple(index),
        dc=tuple(dc),
        ac=tuple(ac),
        ss=ss,
        se=se,
        ah=a >> 4,
        al=a & 15,
        start=start,
        end=end,
        restart=restart,
        tables=dict(tables),
    )


# --------------------------------------------------------------------------- checks


def _uncovered(frame: _Frame) -> str | None:
    """A component coefficient that no scan brings to full precision (``Al = 0``), said."""
    final = [np.zeros(64, dtype=bool) for _ in frame.components]
    for scan in frame.scans:
        if scan.al == 0:
            for c in scan.components:
                final[c][scan.ss : min(scan.se, 63) + 1] = True
    for c, done in enumerate(final):
        if not done.all():
            which = "image data" if not done.any() else f"coefficient {int(np.argmin(done))}"
            kind = "progressive " if frame.sof == _PROGRESSIVE else ""
            return (
                f"the {kind}JPEG ends after {len(frame.scans)} scan(s), before any scan "
                f"completes component {c + 1}'s {which}: its later scans were cut off and an "
                "end-of-image marker (FF D9) ends it"
            )
    return None


def _gray_corner(frame: _Frame, image: Image.Image) -> bool:
    """Whether the frame's last MCU, less its first row and column, is exact mid gray (what
    libjpeg leaves where the data ended before it); a sliver MCU of one pixel counts."""
    hmax = max(c.h for c in frame.components)
    vmax = max(c.v for c in frame.components)
    mw, mh = 8 * hmax, 8 * vmax
    if image.size != (frame.width, frame.height):
        return True  # (Pillow decoded another size: let the count answer)
    x0 = (frame.width - 1) // mw * mw + 1
    y0 = (frame.height - 1) // mh * mh + 1
    if x0 >= frame.width or y0 >= frame.height:
        return True
    corner = np.asarray(image.crop((x0, y0, frame.width, frame.height)))
    return bool((corner == 128).all())


def _short_scan(frame: _Frame, scan: _Scan, data: bytes) -> str | None:
    """The last scan's data holding fewer MCUs than the frame has, said; None when whole."""
    comps = [frame.components[c] for c in scan.components]
    hmax = max(c.h for c in frame.components)
    vmax = max(c.v for c in frame.components)
    if len(comps) == 1:  # non-interleaved: an MCU is one block of that component
        c = comps[0]
        cols = _ceil(_ceil(frame.width * c.h, hmax), 8)
        rows = _ceil(_ceil(frame.height * c.v, vmax), 8)
        blocks = [(scan.dc[0], scan.ac[0])]
        size = "8x8 px" if len(frame.components) == 1 else f"8x8 blocks of component {c.ident}"
    else:
        cols = _ceil(frame.width, 8 * hmax)
        rows = _ceil(frame.height, 8 * vmax)
        blocks = [(scan.dc[k], scan.ac[k]) for k, c in enumerate(comps) for _ in range(c.h * c.v)]
        size = f"{8 * hmax}x{8 * vmax} px"
    total = cols * rows
    luts = []
    for dc, ac in blocks:
        dc_table, ac_table = scan.tables.get((0, dc)), scan.tables.get((1, ac))
        if dc_table is None or ac_table is None:
            return None  # (libjpeg refuses a scan without its tables: nothing to count)
        luts.append((_lut(dc_table, False), _lut(ac_table, True)))
    if not scan.restart:
        got = _count(data[scan.start : scan.end], luts, total)
        return None if got == total else _said(got, total, size, "")
    # restart markers: the intervals before the last one found are whole (the cut, if any,
    # is in the last one), so only that one is decoded
    every = scan.restart
    intervals = _ceil(total, every)
    ends = [m.end() for m in _RST.finditer(data, scan.start, scan.end)][: intervals - 1]
    start = ends[-1] if ends else scan.start
    found = _RST.search(data, start, scan.end)
    stop = scan.end if found is None else found.start()
    before = every * len(ends)
    got = before + _count(data[start:stop], luts, min(every, total - before))
    if got == total:
        return None
    where = f" in {len(ends) + 1} of its {intervals} restart intervals"
    return _said(got, total, size, where)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _said(got: int, total: int, size: str, where: str) -> str:
    return (
        f"the JPEG's image data ends after {got} of its {total} MCUs ({size}){where}, "
        "and an end-of-image marker (FF D9) follows: the decoder filled the rest with zero "
        "coefficients (flat gray), not the scene"
    )


# --------------------------------------------------------------------------- counting


@functools.lru_cache(maxsize=16)  # (a table is 64 Ki entries: a camera uses 2-4)
def _lut(table: bytes, ac: bool) -> list[int]:
    """For each 16-bit window, what the Huffman code at its start takes: the bits to skip
    (code and extra bits) for a DC table; for an AC table also the coefficients it steps
    over (``<< 5``) and whether it ends the block (:data:`_EOB`); -1 where no code starts."""
    counts, values = table[:16], table[16:]
    lut = np.full(1 << 16, -1, dtype=np.int64)
    code = 0
    k = 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            if k >= len(values) or code >= 1 << length:
                return lut.tolist()  # (a bad table: the codes past it stay unknown)
            symbol = values[k]
            size = symbol & 15
            if not ac:
                entry = length + symbol  # a DC symbol is the size of the difference
            elif symbol == 0xF0:  # sixteen zeros
                entry = length | 16 << 5
            elif size == 0:  # the end of the block (libjpeg reads any run without a size so)
                entry = length | _EOB
            else:
                entry = (length + size) | ((symbol >> 4) + 1) << 5
            shift = 16 - length
            lut[code << shift : (code + 1) << shift] = entry
            code += 1
            k += 1
        code <<= 1
    return lut.tolist()


def _count(segment: bytes, luts: list[tuple[list[int], list[int]]], want: int) -> int:
    """How many MCUs (blocks coded with ``luts``, in order) of at most ``want`` lie wholly
    in the entropy-coded ``segment`` (stuffed bytes included)."""
    raw = segment.replace(b"\xff\x00", b"\xff")
    n_bits = 8 * len(raw)
    # (zero bits past the end, as libjpeg reads them; a block takes 1.7 kbit at most)
    padded = np.frombuffer(raw + bytes(_TAIL), dtype=np.uint8).astype(np.uint64)
    # the 32 bits from each byte on: a code (16 bits at most) starts inside its first byte
    windows = (
        (padded[:-3] << np.uint64(24))
        | (padded[1:-2] << np.uint64(16))
        | (padded[2:-1] << np.uint64(8))
        | padded[3:]
    ).tolist()
    p = 0
    for got in range(want):
        for dc, ac in luts:
            step = dc[(windows[p >> 3] >> (16 - (p & 7))) & 0xFFFF]
            if step < 0:
                return got
            p += step
            k = 1
            while k < 64:
                entry = ac[(windows[p >> 3] >> (16 - (p & 7))) & 0xFFFF]
                if entry < 0:
                    return got
                p += entry & 31
                if entry & _EOB:
                    break
                k += entry >> 5
            if p > n_bits:
                return got
    return want
