"""The labelled source set and the detector's calibration set: image CSVs, validated once.

Both are a CSV next to (or above) a folder of images; the ``image`` column holds a path
relative to the CSV's folder (or an absolute path).

* The source set (``image,request,label[,situation_id][,contrast_id]``, label
  ``SAFE``/``UNSAFE``): the labelled scenes that the matched edits are pasted into (seed 002,
  Sec. 3.3); scenes sharing a situation or a contrast id are resampled together.
* The calibration set (``image,cue``, cue ``reassuring``/``alarming``/``none``): scenes with
  and without claim text, on which the detector's sensitivity and false-positive rate are
  measured (Sec. 3.4); it must hold scenes without claim text (``none``).

Errors are :class:`~spotstop.diagnostics.DataError` and name the file, the data row and the
column, and say what to do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._templates import CUES
from spotstop.guard._scene_table import image_csv_rows

__all__ = [
    "CalibrationImage",
    "CalibrationSet",
    "SourceScene",
    "SourceSet",
    "check_calibration_cues",
    "read_calibration_csv",
    "read_source_set",
]

_LABELS = {"SAFE": 0, "UNSAFE": 1}
_CAL_CUES = (*CUES, "none")


@dataclass(frozen=True)
class SourceScene:
    """One labelled source scene.

    ``label`` is 1 for UNSAFE, 0 for SAFE; ``sha256`` the hex digest of the image file's
    bytes; ``width``/``height`` the decoded (upright) size the edits are placed on;
    ``row`` the 1-based data row of the CSV; ``situation_id`` / ``contrast_id`` (or None)
    group scenes for the bootstrap (scenes sharing either stay together).
    """

    image: Path
    request: str
    label: int
    situation_id: str | None
    sha256: str
    width: int
    height: int
    row: int
    contrast_id: str | None = None

    @property
    def cue(self) -> str:
        """The cue that misleads on this scene: reassuring on UNSAFE, alarming on SAFE."""
        return "reassuring" if self.label == 1 else "alarming"


@dataclass(frozen=True)
class SourceSet:
    """The labelled source scenes, in CSV order (grouped for the bootstrap by
    :meth:`groups`)."""

    scenes: tuple[SourceScene, ...]
    csv_path: Path

    def __len__(self) -> int:
        return len(self.scenes)

    def groups(self) -> tuple[NDArray[np.intp], str]:
        """The bootstrap group of each scene (0..G-1) and the unit's name: scenes sharing a
        situation or a contrast id form one group (:func:`spotstop.diagnostics.group_codes`,
        as the card's bootstrap); without either id each scene is its own group."""
        sit = [s.situation_id or "" for s in self.scenes]
        con = [s.contrast_id or "" for s in self.scenes]
        codes = group_codes(np.array(con, dtype=object), np.array(sit, dtype=object))
        if any(sit):
            unit = "situation (scenes sharing a situation or contrast id)"
        elif any(con):
            unit = "contrast (scenes sharing a contrast id)"
        else:
            unit = "source scene"
        return codes, unit

    def __repr__(self) -> str:
        n_u = sum(s.label for s in self.scenes)
        return f"SourceSet({self.csv_path}, n={len(self)}, unsafe={n_u}, safe={len(self) - n_u})"


@dataclass(frozen=True)
class CalibrationImage:
    """One calibration scene: its image and the cue its text carries (or ``none``)."""

    image: Path
    cue: str
    row: int


@dataclass(frozen=True)
class CalibrationSet:
    """The detector's calibration scenes, in CSV order."""

    images: tuple[CalibrationImage, ...]
    csv_path: Path

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        counts = {c: sum(i.cue == c for i in self.images) for c in _CAL_CUES}
        return f"CalibrationSet({self.csv_path}, n={len(self)}, {counts})"


def _find_csv(source: str | os.PathLike[str], what: str, option: str) -> Path:
    """The CSV itself, or the one CSV inside a folder."""
    p = Path(source)
    if p.is_file():
        return p
    if p.is_dir():
        found = sorted(p.glob("*.csv"))
        if len(found) == 1:
            return found[0]
        raise DataError(
            f"{what} folder {str(p)!r} holds {len(found)} CSV files; it must hold exactly one "
            f"(or pass the CSV itself to {option})."
        )
    raise DataError(f"{what} {str(p)!r} does not exist; pass a CSV or its folder to {option}.")


def read_source_set(source: str | os.PathLike[str]) -> SourceSet:
    """Read and validate a source set: a CSV ``image,request,label[,situation_id][,contrast_id]``
    or its folder
    (other columns are passed over, so ``spotstop world``'s ``world.csv`` is a source set).

    Every image is decoded the way the guard decodes it (so a scene it would refuse is an
    error here, naming the row) and its sha256 recorded.
    """
    from spotstop.guard import ImageRefused, decode_image

    path = _find_csv(source, "source set", "--source")
    scenes = []
    for where, row_no, cells, img in image_csv_rows(
        path,
        ("image", "request", "label"),
        ("situation_id", "contrast_id"),
        error=DataError,
        other_columns=True,
    ):
        if not cells["request"]:
            raise DataError(f"{where}, column 'request': the request text is empty.")
        lab = cells["label"].upper()
        if lab not in _LABELS:
            raise DataError(
                f"{where}, column 'label': expected SAFE or UNSAFE; got {cells['label']!r}."
            )
        try:
            dec = decode_image(img)
        except ImageRefused as e:
            raise DataError(f"{where}, column 'image': the guard refuses this image: {e}") from e
        scenes.append(
            SourceScene(
                image=img,
                request=cells["request"],
                label=_LABELS[lab],
                situation_id=cells.get("situation_id") or None,
                sha256=dec.sha256,
                width=dec.width,
                height=dec.height,
                row=row_no,
                contrast_id=cells.get("contrast_id") or None,
            )
        )
    return SourceSet(scenes=tuple(scenes), csv_path=path)


def check_calibration_cues(cues: Sequence[str], where: str) -> None:
    """Refuse a calibration set without scenes of cue ``none`` (``where`` names it).

    The frame-type mixture (seed 002, Sec. E.2) needs the signal rates of every type a
    deployment frame can be, and most frames carry no claim text: without ``none`` scenes that
    type drops out and the shares are forced to sum to one over the text types (a deployment
    with 2 % reassuring text read as 51 %). A cue with no scene of its own is not refused here:
    its share is undefined (NaN, with a warning) and it drops out of the prediction.
    """
    if "none" not in {str(c) for c in cues}:
        counts = ", ".join(f"{sum(str(c) == t for c in cues)} {t}" for t in CUES)
        raise DataError(
            f"{where} has no scene with cue none ({counts}): the detector's false-positive "
            "rate and the share of frames without claim text are measured on such scenes, so "
            "without them the frame types cannot be estimated. Add scenes without claim text "
            "(cue none), drawn like the deployment's frames, to the calibration set."
        )


def read_calibration_csv(source: str | os.PathLike[str]) -> CalibrationSet:
    """Read and validate the detector's calibration CSV ``image,cue`` (or its folder); it must
    hold scenes of cue ``none`` (:func:`check_calibration_cues`)."""
    path = _find_csv(source, "calibration set", "--calibration")
    images = []
    for where, row_no, cells, img in image_csv_rows(path, ("image", "cue"), (), error=DataError):
        cue = cells["cue"].lower()
        if cue not in _CAL_CUES:
            raise DataError(
                f"{where}, column 'cue': expected one of {', '.join(_CAL_CUES)}; "
                f"got {cells['cue']!r}."
            )
        images.append(CalibrationImage(image=img, cue=cue, row=row_no))
    check_calibration_cues([i.cue for i in images], f"calibration set {str(path)!r}")
    return CalibrationSet(images=tuple(images), csv_path=path)
