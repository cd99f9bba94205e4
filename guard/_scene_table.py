"""Many scenes to score offline: a folder of images or a CSV, and the table of their scores.

* :func:`read_scene_table`: a folder of JPEG/PNG/WebP images (sorted by path, one request for
  all) or a CSV ``image,request[,situation_id]`` (image paths relative to the CSV's folder, or
  absolute; other columns, such as a labelled table's, are passed over). Every image is
  decoded the way the guard decodes it (:data:`~spotstop.guard._image.DEFAULT_MIN_SIDE`
  and :data:`~spotstop.guard._image.DEFAULT_MIN_CONTRAST` included), before any model is loaded, and its sha256 recorded: an image the guard would
  refuse is an error naming the row, or with ``keep_refused`` a row refused with the reason.
* :meth:`SceneTable.refuse_requests`: the rows whose request a member refuses (the member's
  rule, :meth:`Member.check_request <spotstop.guard._member.Member.check_request>`) refused
  with its reason; :meth:`SceneTable.accepted` the rows left to score.
* :class:`SceneTable`: the scenes by index (:meth:`SceneTable.scenes`), small to pickle, so an
  engine may read the images where it scores them (a Ray worker; the images must be readable
  at the same paths there). A file whose bytes changed since it was read is refused.
* :func:`write_scores`: one row per scene and variant, CSV or JSONL (:data:`SCORE_COLUMNS`);
  a refused scene's rows carry no score and the reason.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

from spotstop.guard._errors import ConfigError, ImageError, RequestError
from spotstop.guard._types import Scene
from spotstop.guard.validate import CSV_ENCODING, csv_header

if TYPE_CHECKING:
    from spotstop.guard._batch import BatchScores

__all__ = [
    "IMAGE_SUFFIXES",
    "SCORE_COLUMNS",
    "SceneRow",
    "SceneTable",
    "image_csv_rows",
    "read_scene_table",
    "write_scores",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")

#: the columns of :func:`write_scores`, in order (JSONL: the same keys)
SCORE_COLUMNS = (
    "scene",
    "image",
    "image_sha256",
    "request",
    "situation_id",
    "member",
    "variant",
    "score",
    "prompt_hash",
    "error",
)


@dataclass(frozen=True)
class SceneRow:
    """One scene of a table: ``image`` as the input names it (the CSV's cell, or the path
    relative to the folder), ``path`` the file read, ``sha256`` of its bytes when read (empty
    for an image the guard refuses); ``refused``: why the scene is not scored (the guard
    refuses its image, or the member its request), None when it is to be scored."""

    image: str
    path: Path
    request: str
    situation_id: str | None
    sha256: str
    refused: str | None = None


@dataclass(frozen=True)
class SceneTable:
    """Scenes to score, in input order (a folder sorted by path, a CSV in row order)."""

    rows: tuple[SceneRow, ...]
    source: Path

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        refused = sum(r.refused is not None for r in self.rows)
        return f"SceneTable({self.source}, n={len(self)}" + (
            f", {refused} refused)" if refused else ")"
        )

    def accepted(self) -> SceneTable:
        """The rows not refused, in input order: the table an engine scores (and
        :func:`write_scores` joins back with the refused rows)."""
        return SceneTable(tuple(r for r in self.rows if r.refused is None), self.source)

    def refuse_requests(self, check: Callable[[str], None]) -> SceneTable:
        """A copy in which every row not yet refused whose request ``check`` refuses (raises
        :class:`RequestError`) is refused with that error's message. ``check`` is the
        member's own rule (:meth:`Member.check_request
        <spotstop.guard._member.Member.check_request>`, as the guard checks a scene)."""
        rows = []
        for row in self.rows:
            if row.refused is None:
                try:
                    check(row.request)
                except RequestError as e:
                    row = replace(row, refused=str(e))
            rows.append(row)
        return SceneTable(tuple(rows), self.source)

    def scenes(self, indices: Sequence[int]) -> list[Scene]:
        """The scenes at ``indices``, their images decoded now (wherever this runs)."""
        from spotstop.guard._image import DEFAULT_MIN_CONTRAST, DEFAULT_MIN_SIDE, decode_image

        out = []
        for i in indices:
            row = self.rows[int(i)]
            if row.refused is not None:
                raise ConfigError(
                    f"{self.source}, scene {int(i)} ({row.image}) is refused and cannot be "
                    f"scored: {row.refused} Score the table's accepted() rows."
                )
            img = decode_image(
                row.path, min_side=DEFAULT_MIN_SIDE, min_contrast=DEFAULT_MIN_CONTRAST
            )
            if img.sha256 != row.sha256:
                raise ImageError(
                    f"{row.path} changed since the scene table was read (sha256 "
                    f"{img.sha256[:12]}…, was {row.sha256[:12]}…); on a cluster every node "
                    "must read the same files. Score again once the images are settled."
                )
            out.append(Scene(img, row.request, row.situation_id))
        return out


def read_scene_table(
    source: str | os.PathLike[str], request: str | None = None, *, keep_refused: bool = False
) -> SceneTable:
    """Read a folder of images (``request`` for every scene) or a CSV
    ``image,request[,situation_id]`` (``request`` must then be None), and decode every image.

    An image the guard refuses (unreadable, not JPEG/PNG/WebP, smaller than
    :data:`~spotstop.guard._image.DEFAULT_MIN_SIDE`, showing nothing, ...) raises :class:`ImageError` naming
    its row; with ``keep_refused`` its row is kept, refused with the reason, and the others
    are read on (``spotstop score`` scores those and reports the refused ones)."""
    p = Path(source)
    if p.is_dir():
        if request is None or not request.strip():
            raise ConfigError(
                f"{p} is a folder of images: give the request its scenes share with --request "
                "(or score a CSV image,request[,situation_id] with a request per scene)."
            )
        files = sorted(
            f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise ConfigError(f"the folder {p} holds no JPEG, PNG or WebP image.")
        cells: list[tuple[str, str, Path, str, str | None]] = [
            (str(f), f.relative_to(p).as_posix(), f, request, None) for f in files
        ]
    elif p.is_file() and p.suffix.lower() == ".csv":
        if request is not None:
            raise ConfigError(
                f"{p} is a CSV with a request per scene; drop --request (it is for one image "
                "or a folder of images)."
            )
        cells = _csv_cells(p)
    else:
        raise ConfigError(
            f"{p} is not a folder of images or a .csv file; pass one image, a folder of "
            "JPEG/PNG/WebP images or a CSV image,request[,situation_id]."
        )
    return SceneTable(rows=tuple(_decoded_row(*c, keep_refused) for c in cells), source=p)


def _decoded_row(
    where: str,
    name: str,
    path: Path,
    request: str,
    situation_id: str | None,
    keep_refused: bool,
) -> SceneRow:
    from spotstop.guard._image import (
        DEFAULT_MIN_CONTRAST,
        DEFAULT_MIN_SIDE,
        ImageRefused,
        decode_image,
    )

    try:
        img = decode_image(path, min_side=DEFAULT_MIN_SIDE, min_contrast=DEFAULT_MIN_CONTRAST)
    except ImageRefused as e:
        if not keep_refused:
            raise ImageError(f"{where}: the guard refuses this image: {e}") from e
        return SceneRow(name, path, request, situation_id, "", f"the guard refuses the image: {e}")
    return SceneRow(
        image=name, path=path, request=request, situation_id=situation_id, sha256=img.sha256
    )


def image_csv_rows(
    path: Path,
    required: tuple[str, ...],
    optional: tuple[str, ...],
    *,
    error: type[Exception] = ConfigError,
    other_columns: bool = False,
) -> Iterator[tuple[str, int, dict[str, str], Path]]:
    """Yield ``(where, row_no, cells, image_path)`` per data row of a CSV that names an image
    per row (column ``image``, relative to the CSV's folder), checking the header, each row's
    shape and that its image exists; ``error`` is the exception raised, naming row and line.
    The one reader of such CSVs: ``spotstop score``'s scenes and the cue analysis's sets.

    ``other_columns``: columns beyond ``required`` and ``optional`` are passed over (a
    labelled table such as ``spotstop world``'s ``world.csv`` read for its scenes), except one
    so close to a known column's name that it is likely a misspelling, which is an error."""
    import difflib

    with path.open(newline="", encoding=CSV_ENCODING) as fh:
        reader = csv.DictReader(fh)
        header = csv_header(reader.fieldnames, source=str(path), error=error)
        missing = [c for c in required if c not in header]
        extra = [c for c in header if c not in required + optional]
        known = required + optional
        if other_columns:
            for c in extra:
                near = difflib.get_close_matches(c, known, n=1, cutoff=0.8)
                if near and near[0] not in header:
                    raise error(
                        f"{path}: column {c!r} is not one this reader knows; did you mean "
                        f"{near[0]!r}? Rename it (the known columns: {', '.join(known)})."
                    )
            extra = []
        if missing or extra:
            raise error(
                f"{path}: the header must be {','.join(required)}"
                + (f"[,{','.join(optional)}]" if optional else "")
                + f"; got {','.join(header) or 'no header'}"
                + (f" (missing {', '.join(missing)})" if missing else "")
                + (f" (unknown {', '.join(extra)})" if extra else "")
                + "."
            )
        reader.fieldnames = header
        n = 0
        for row_no, row in enumerate(reader, start=1):
            where = f"{path}, row {row_no} (line {reader.line_num})"
            if None in row:
                raise error(f"{where}: more cells than header columns; check the quoting.")
            cells = {c: (row[c] or "").strip() for c in header if row[c] is not None}
            if len(cells) != len(header):
                raise error(f"{where}: the row is too short; every column needs a cell.")
            if not cells["image"]:
                raise error(f"{where}, column 'image': a file name is required.")
            img = Path(cells["image"])
            img = img if img.is_absolute() else path.parent / img
            if not img.is_file():
                raise error(
                    f"{where}, column 'image': {str(img)!r} does not exist; paths are relative "
                    "to the CSV's folder."
                )
            n += 1
            yield where, row_no, cells, img
        if n == 0:
            raise error(f"{path}: no data rows after the header.")


def _csv_cells(path: Path) -> list[tuple[str, str, Path, str, str | None]]:
    """(where, image cell, image path, request, situation_id) per data row, checked."""
    out = []
    for where, _, cells, img in image_csv_rows(
        path, ("image", "request"), ("situation_id",), other_columns=True
    ):
        if not cells["request"]:
            raise ConfigError(f"{where}, column 'request': the request text is empty.")
        out.append(
            (where, cells["image"], img, cells["request"], cells.get("situation_id") or None)
        )
    return out


def _records(table: SceneTable, scores: BatchScores) -> list[dict[str, object]]:
    n_scored = len(table.accepted())
    if scores.n != n_scored:
        raise ConfigError(
            f"the scores are of {scores.n} scene(s), but {table.source} has {n_scored} not "
            "refused; score the table's accepted() rows."
        )
    out: list[dict[str, object]] = []
    j = -1  # the row's position among the scored rows
    for i, row in enumerate(table.rows):
        j += row.refused is None
        for name, run in scores.members.items():
            for variant in scores.variants:
                s = math.nan if row.refused is not None else float(run.scores[variant][j])
                error = row.refused
                if error is None and not math.isfinite(s):
                    error = f"member {name} gave a non-finite score."
                out.append(
                    {
                        "scene": i,
                        "image": row.image,
                        "image_sha256": row.sha256 or None,
                        "request": row.request,
                        "situation_id": row.situation_id,
                        "member": name,
                        "variant": variant,
                        "score": s if math.isfinite(s) else None,
                        "prompt_hash": run.prompt_hash,
                        "error": error,
                    }
                )
    return out


def write_scores(
    table: SceneTable, scores: BatchScores, out: IO[str] | str | os.PathLike[str], fmt: str
) -> None:
    """Write one row per scene, member and variant (scene order, then member, then variant),
    with the columns :data:`SCORE_COLUMNS`, as ``fmt`` ``"csv"`` or ``"jsonl"``. ``scores``
    are those of ``table.accepted()`` (every row when none is refused).

    A scene without a score (refused, or the member gave a non-finite score) has an empty
    ``score`` cell in CSV and ``null`` in JSONL, never a number, and ``error`` says why
    (empty / ``null`` for a scored scene); ``situation_id`` is empty / ``null`` when the scene
    has none, ``image_sha256`` when the guard refuses the image.
    """
    if fmt not in ("csv", "jsonl"):
        raise ConfigError(f"the scores' format must be csv or jsonl; got {fmt!r}.")
    records = _records(table, scores)
    buf = io.StringIO()
    if fmt == "csv":
        w = csv.DictWriter(buf, fieldnames=SCORE_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in records)
    else:
        buf.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
    if isinstance(out, str | os.PathLike):
        from spotstop.guard._files import atomic_write_text

        atomic_write_text(Path(out), buf.getvalue())
    else:
        out.write(buf.getvalue())
