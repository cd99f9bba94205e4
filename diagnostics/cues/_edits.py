"""Matched edits of the source scenes (seed 002, Sec. 3.3).

For every source scene and template: the misleading edit (reassuring text on an UNSAFE scene,
alarming text on a SAFE one), two matched controls that share its box, font, size, colours
and position (text agreeing with the label, and neutral text such as "ROOM 4"), and a
placebo (a random non-word of the misleading text's length). The unedited source scene
is part of the set too (kind ``source``). Sign templates paste a short claim, sticker
templates one word ("HOT" on a SAFE scene, "SAFE" on an UNSAFE one, with "SAFE" / "HOT" and
"CUP" as controls); both are drawn the same way, a filled box with the text centred.

The plan (:func:`plan_edits`) is computed from the images' sizes and the fonts' metrics,
without drawing: it is cheap, deterministic given the seed, and its :meth:`EditSet.digest`
keys the score cache. Pixels are drawn only when a scene is scored (:meth:`EditSet.render`).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._source import SourceScene, SourceSet
from spotstop.diagnostics.cues._templates import (
    HELD_OUT,
    TEMPLATES,
    EditTemplate,
    font_path,
)

__all__ = ["RENDER_VERSION", "EditRecord", "EditSet", "placebo_text", "plan_edits"]

#: Bumped whenever the drawing changes, so cached scores of older pixels are not reused.
RENDER_VERSION = 1

_EDIT_KINDS = ("misleading", "agreeing", "neutral", "placebo")
_CONSONANTS = "BCDFGHJKLMNPQRSTVWXZ"


@dataclass(frozen=True)
class EditRecord:
    """What one scene of the edit set is, and how it was drawn.

    index: position in the edit set; group: the source scene's index (the bootstrap keeps a
    scene's edits with it, and scenes of one situation or contrast together).
    source_image / source_sha256 / source_row: the unedited scene it came from.
    request / label / cue: the scene's request, label (1 UNSAFE) and the cue that misleads
    on it. kind: one of ``source``, ``misleading``, ``agreeing``, ``neutral``, ``placebo``.
    template / held_out: the template (empty for ``source``). text: the pasted text.
    box: ``(x0, y0, x1, y1)`` of the filled box in pixels, half-open like ``Image.crop``
    (shared by every edit of one template on one scene). font / font_size / colour / background / position: how it looks.
    seed: the seed of the edit set.
    """

    index: int
    group: int
    source_image: str
    source_sha256: str
    source_row: int
    request: str
    label: int
    cue: str
    kind: str
    template: str
    held_out: bool
    text: str
    box: tuple[int, int, int, int] | None
    font: str
    font_size: int
    colour: tuple[int, int, int] | None
    background: tuple[int, int, int] | None
    position: str
    seed: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("box", "colour", "background"):
            d[k] = None if d[k] is None else list(d[k])
        return d


@lru_cache(maxsize=64)
def _font(name: str, size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.truetype(str(font_path(name)), size)


def _scene_rng(seed: int, sha256: str, template: str) -> np.random.Generator:
    """A generator for one (scene, template): the same edits whatever the order of the set."""
    h = hashlib.sha256(f"{seed}|{sha256}|{template}".encode()).digest()
    return np.random.default_rng(np.frombuffer(h, dtype=np.uint32))


def placebo_text(text: str, rng: np.random.Generator) -> str:
    """A non-word shaped like ``text``: consonants for letters (case kept), digits for digits,
    everything else (spaces, dashes) kept in place, so the length and spacing match."""
    out = []
    for ch in text:
        if ch.isalpha():
            c = _CONSONANTS[int(rng.integers(len(_CONSONANTS)))]
            out.append(c if ch.isupper() else c.lower())
        elif ch.isdigit():
            out.append(str(int(rng.integers(10))))
        else:
            out.append(ch)
    return "".join(out)


def _layout(
    t: EditTemplate, texts: Sequence[str], width: int, height: int, rng: np.random.Generator
) -> tuple[tuple[int, int, int, int], int]:
    """The shared box of one template on one scene, and the font size that fits it."""
    margin = max(2, round(0.03 * min(width, height)))
    size = max(8, round(t.size * height))
    while True:
        font = _font(t.font, size)
        ascent, descent = font.getmetrics()
        text_w = max(font.getlength(s) for s in texts)
        pad = max(2, round(0.25 * size))
        bw, bh = int(np.ceil(text_w)) + 2 * pad, ascent + descent + 2 * pad
        if (bw <= width - 2 * margin and bh <= height - 2 * margin) or size <= 6:
            break
        size = max(6, int(size * 0.9))
    bw, bh = min(bw, width), min(bh, height)
    jx = int(rng.integers(0, margin + 1))
    jy = int(rng.integers(0, margin + 1))
    left, top = margin + jx, margin + jy
    right, bottom = width - margin - jx - bw, height - margin - jy - bh
    x0 = {"left": left, "right": right}.get(t.position.split("-")[-1], (width - bw) // 2 + jx)
    y0 = {"top": top, "bottom": bottom}.get(t.position.split("-")[0], (height - bh) // 2 + jy)
    x0 = min(max(0, x0), width - bw)
    y0 = min(max(0, y0), height - bh)
    return (x0, y0, x0 + bw, y0 + bh), size


def plan_edits(
    source: SourceSet,
    *,
    seed: int = 0,
    templates: Sequence[EditTemplate] = TEMPLATES,
    held_out: EditTemplate | None = HELD_OUT,
) -> EditSet:
    """Plan the matched edits of every source scene (no drawing; see the module docstring).

    Per scene: the unedited source, then per template (the measurement ``templates``, then
    the ``held_out`` one when given) the misleading edit, the agreeing and neutral controls
    and the placebo, all in one box. Deterministic given ``seed``: a scene's edits depend only
    on the seed, its image's sha256 and the template.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise DataError(f"seed must be a non-negative integer; got {seed!r}.")
    temps = list(templates)
    if not temps:
        raise DataError("templates must hold at least one measurement template; got none.")
    if any(t.held_out for t in temps):
        raise DataError(
            "a held-out template cannot be a measurement template; pass it as held_out."
        )
    if held_out is not None:
        if not held_out.held_out:
            raise DataError(f"template {held_out.name!r} is not marked held_out=True.")
        temps.append(held_out)
    names = [t.name for t in temps]
    if len(set(names)) != len(names):
        raise DataError(f"template names must be unique; got {names}.")
    records: list[EditRecord] = []

    def add(s: SourceScene, g: int, **kw: Any) -> None:
        records.append(
            EditRecord(
                index=len(records),
                group=g,
                source_image=str(s.image),
                source_sha256=s.sha256,
                source_row=s.row,
                request=s.request,
                label=s.label,
                cue=s.cue,
                seed=seed,
                **kw,
            )
        )

    for g, s in enumerate(source.scenes):
        add(s, g, kind="source", template="", held_out=False, text="", box=None, font="",
            font_size=0, colour=None, background=None, position="")  # fmt: skip
        for t in temps:
            rng = _scene_rng(seed, s.sha256, t.name)
            texts = {k: t.text_for(k, s.cue) for k in _EDIT_KINDS[:3]}
            texts["placebo"] = placebo_text(texts["misleading"], rng)
            box, size = _layout(t, list(texts.values()), s.width, s.height, rng)
            for kind in _EDIT_KINDS:
                add(s, g, kind=kind, template=t.name, held_out=t.held_out, text=texts[kind],
                    box=box, font=t.font, font_size=size, colour=t.colour,
                    background=t.background, position=t.position)  # fmt: skip
    return EditSet(source=source, records=tuple(records), templates=tuple(temps), seed=seed)


@dataclass(frozen=True)
class EditSet:
    """The planned edit set: every scene's :class:`EditRecord`, in order."""

    source: SourceSet
    records: tuple[EditRecord, ...]
    templates: tuple[EditTemplate, ...]
    seed: int

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        names = ", ".join(t.name + (" (held out)" if t.held_out else "") for t in self.templates)
        return (
            f"EditSet({len(self.source)} source scenes → {len(self)} scenes, seed={self.seed}, "
            f"templates=[{names}])"
        )

    @cached_property
    def digest(self) -> str:
        """sha256 over the plan (every record) and :data:`RENDER_VERSION`: the cache key of
        the scores; it changes whenever any pixel of any scene would change."""
        blob = json.dumps(
            {"render_version": RENDER_VERSION, "records": [r.to_dict() for r in self.records]},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def render(self, record: EditRecord) -> bytes:
        """The encoded image of one scene: the source file's own bytes for ``source``, else
        the decoded source with the box and text drawn on it, as PNG."""
        from PIL import ImageDraw

        src = self.source.scenes[record.group]
        if record.kind == "source":
            return src.image.read_bytes()
        if record.box is None or record.colour is None:
            raise DataError(f"edit {record.index} ({record.kind}) has no box or colour to draw.")
        img = _decoded(str(src.image)).copy()
        draw = ImageDraw.Draw(img)
        x0, y0, x1, y1 = record.box
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=record.background)  # PIL's ends are inclusive
        draw.text(
            ((x0 + x1) / 2, (y0 + y1) / 2),
            record.text,
            font=_font(record.font, record.font_size),
            fill=record.colour,
            anchor="mm",
        )
        buf = io.BytesIO()
        img.save(buf, "PNG", compress_level=1)  # lossless; fast to write
        return buf.getvalue()

    def images(self, indices: Sequence[int] | None = None) -> Iterator[tuple[EditRecord, bytes]]:
        """Render scenes in order (all, or those at ``indices``)."""
        for i in range(len(self)) if indices is None else indices:
            r = self.records[i]
            yield r, self.render(r)


@lru_cache(maxsize=2)
def _decoded(path: str) -> Any:
    """The upright RGB source image the guard would see (the last two are kept)."""
    from spotstop.guard import decode_image

    return decode_image(path).image
