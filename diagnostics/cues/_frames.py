"""Deployment frames for the shift: a folder of images, or a decision log.

From a decision log, the frames are, in this order of preference:

* the text flags the guard wrote at decision time (``text_in_scene.detect`` in its policy:
  the ``cue_flags`` of each decision) — no OCR pass is needed for the deployment;
* else the encoded images the guard stored (``store_images=True``), read with the detector.

Its labels table (or a labels file) gives the unsafe share π̂, and its situation ids group
the frames for the bootstrap. Either way the calibration set is read with the detector here,
which must be the guard's (same OCR model and lexicon) for the logged flags to be corrected
by its sensitivity and false-positive rate.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._shift import ShiftResult, detect_flags, estimate_shift
from spotstop.diagnostics.cues._source import read_calibration_csv
from spotstop.guard.cues import CUES, TextDetector

__all__ = [
    "IMAGE_SUFFIXES",
    "DeploymentFrames",
    "frames_from_folder",
    "frames_from_log",
    "measure_shift",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@dataclass(frozen=True)
class DeploymentFrames:
    """Frames to read: ``items[i] = (name, load)``, with per-frame ``labels`` (1 UNSAFE,
    0 SAFE, -1 unlabelled) and ``groups`` (resampling groups), and where they came from.

    Frames of a decision log's stored images read them through the one opening of the log
    that listed them: use them inside ``with frames_from_log(...) as frames:`` (or call
    :meth:`close` after reading them); a ``load`` after that raises :class:`DataError`.
    """

    items: tuple[tuple[str, Callable[[], bytes]], ...] = field(repr=False)
    labels: NDArray[np.int8] = field(repr=False)
    groups: tuple[str, ...] = field(repr=False)
    source: Mapping[str, Any]
    flags: NDArray[np.bool_] | None = field(default=None, repr=False)
    """Flags already read, ``(n, len(CUES))`` (logged at decision time); None: read ``items``."""
    closer: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """What :meth:`close` calls: it releases what ``items`` read from (None: nothing held)."""

    def __len__(self) -> int:
        return len(self.items)

    def close(self) -> None:
        """Release what the frames read from (a decision log's opening, with its private copy
        where it has one); the frames' loads fail after. Closing twice is harmless."""
        if self.closer is not None:
            self.closer()

    def __enter__(self) -> DeploymentFrames:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frames_from_folder(folder: str | os.PathLike[str]) -> DeploymentFrames:
    """Every JPEG/PNG/WebP image under ``folder`` (sorted), unlabelled, each its own group."""
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"frames folder {str(root)!r} does not exist; pass a folder to --frames.")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"frames folder {str(root)!r} holds no JPEG, PNG or WebP image.")
    return DeploymentFrames(
        items=tuple((str(p), p.read_bytes) for p in files),
        labels=np.full(len(files), -1, dtype=np.int8),
        groups=tuple(str(p) for p in files),
        source={"frames": str(root), "n_images": len(files)},
    )


def frames_from_log(
    log_path: str | os.PathLike[str], *, labels: str | os.PathLike[str] | None = None
) -> DeploymentFrames:
    """The decisions of a log as deployment frames, with the log's labels (or a labels file's,
    as for the card) and situation ids: the decisions with text flags logged at decision time
    when the log has any (the others are counted and left out, with a warning), else the
    decisions whose image is stored (likewise). A log with neither is an error.

    Frames of stored images keep the log open (one read-only opening for the listing and
    every image: a log of an older schema is read through ONE private migrated copy) until
    :meth:`DeploymentFrames.close`: ``with frames_from_log(...) as frames: ...``."""
    from spotstop.guard import DecisionLog, GuardError, LabelsFileError
    from spotstop.guard._log import LogChangedError

    path = Path(log_path)
    if not path.is_file():
        raise DataError(f"decision log {str(path)!r} does not exist; pass the log's SQLite file.")
    images: _StoredImages | None = None
    frames: DeploymentFrames | None = None
    try:
        images = _StoredImages(path, DecisionLog(path, read_only=True))
        try:
            frames = _frames(path, images, labels)
        except LogChangedError:  # a guard wrote it meanwhile: read it again, as read_reviewed
            images.close()
            images = _StoredImages(path, DecisionLog(path, read_only=True))
            images.log.read_a_still_copy()
            frames = _frames(path, images, labels)
        return frames
    except LabelsFileError as exc:
        raise DataError(str(exc)) from exc
    except GuardError as exc:
        raise DataError(f"cannot read the decision log {str(path)!r}: {exc}") from exc
    finally:
        if images is not None and (frames is None or frames.closer is None):
            images.close()  # it failed, or the flags were logged: no image is read


def _frames(
    path: Path, images: _StoredImages, labels: str | os.PathLike[str] | None
) -> DeploymentFrames:
    """:func:`frames_from_log` on its opened log (``images``)."""
    from spotstop.guard import read_reviewed

    reviewed = read_reviewed(images.log, labels)
    arr = reviewed.arrays
    ids = np.asarray(arr.decision_id, dtype=object)
    sha = arr.image_sha256  # "" for none (read_reviewed)
    lab, situation = arr.label, arr.situation_id
    source = {
        "log": str(path),
        "labels": reviewed.labels,
        "n_decisions": len(ids),
    }
    logged = np.ones(len(ids), dtype=bool)
    for cue in CUES:
        logged &= np.asarray(arr.cue_flags.get(cue, np.full(len(ids), -1)), dtype=np.int8) >= 0
    if logged.any():  # flags written at decision time: no OCR pass over the deployment
        idx = np.flatnonzero(logged)
        flags = np.column_stack([np.asarray(arr.cue_flags[c])[idx] == 1 for c in CUES])
        if not logged.all():
            warnings.warn(
                f"{int((~logged).sum())} of {len(ids)} decisions have no logged text flags "
                "(detection was off for them) and are left out of the shift.",
                UserWarning,
                stacklevel=3,  # frames_from_log's caller
            )
        return DeploymentFrames(
            items=tuple((f"decision {ids[i]}", _no_image) for i in idx),
            labels=lab[idx],
            groups=tuple(str(situation[i]) or f"decision {ids[i]}" for i in idx),
            source={**source, "frame_flags": "logged at decision time", "n_with_flags": len(idx)},
            flags=flags,
        )
    stored = images.log.stored_images(sha)
    keep = np.array([s in stored for s in sha], dtype=bool)
    if not keep.any():
        raise DataError(
            f"decision log {str(path)!r} has no stored image ({len(ids)} decisions); run the "
            "guard with store_images=True, or pass a folder of frames with --frames."
        )
    if not keep.all():
        warnings.warn(
            f"{int((~keep).sum())} of {len(ids)} decisions have no stored image (never stored, "
            "or pruned) and are left out of the shift.",
            UserWarning,
            stacklevel=3,  # frames_from_log's caller
        )

    idx = np.flatnonzero(keep)
    return DeploymentFrames(
        items=tuple((f"decision {ids[i]}", partial(images.load, str(sha[i]))) for i in idx),
        labels=lab[idx],
        groups=tuple(str(situation[i]) or f"decision {ids[i]}" for i in idx),
        source={
            **source,
            "frame_flags": "read from the stored images",
            "n_with_image": int(keep.sum()),
        },
        closer=images.close,
    )


class _StoredImages:
    """The images a decision log stored, read through the one read-only opening of the log
    that listed them (an older schema's log is read through a private migrated copy: one per
    opening, so opening it per frame made one copy of the whole log per image)."""

    def __init__(self, path: Path, log: Any) -> None:
        self._path = path
        self._log = log

    @property
    def log(self) -> Any:
        """The open :class:`~spotstop.guard.DecisionLog`."""
        if self._log is None:
            raise DataError(
                f"the frames of decision log {str(self._path)!r} were closed "
                "(DeploymentFrames.close); read them before, inside `with frames_from_log(...) "
                "as frames:`."
            )
        return self._log

    def load(self, sha256: str) -> bytes:
        """The stored image ``sha256``; :class:`DataError` when it left the log meanwhile."""
        from spotstop.guard import DecisionLog
        from spotstop.guard._log import LogChangedError

        log = self.log
        try:
            data = log.image(sha256)
        except LogChangedError:  # a guard wrote the log meanwhile: read it again, as read_reviewed
            log.close()
            self._log = None
            self._log = DecisionLog(self._path, read_only=True)
            self._log.read_a_still_copy()
            data = self._log.image(sha256)
        if data is None:
            raise DataError(
                f"the image {sha256} left decision log {str(self._path)!r} while reading it."
            )
        return data

    def close(self) -> None:
        """Close the log (and remove its private copy, where it has one)."""
        log, self._log = self._log, None
        if log is not None:
            log.close()


def _no_image() -> bytes:
    raise DataError("this frame's flags were logged at decision time; its image was not stored.")


def measure_shift(
    detector: TextDetector,
    frames: DeploymentFrames,
    calibration: str | os.PathLike[str],
    *,
    prior: float | None = None,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    progress: bool = False,
) -> ShiftResult:
    """Read the calibration set and the frames with ``detector``, then :func:`estimate_shift`."""
    cal = read_calibration_csv(calibration)
    cal_items = [(str(c.image), c.image.read_bytes) for c in cal.images]
    cal_flags, prov = detect_flags(detector, cal_items, progress=progress, desc="calibration set")
    if frames.flags is not None:
        frame_flags = frames.flags
    else:
        frame_flags, _ = detect_flags(
            detector, list(frames.items), progress=progress, desc="frames"
        )
    return estimate_shift(
        frame_flags,
        cal_flags,
        [c.cue for c in cal.images],
        frame_labels=frames.labels,
        frame_groups=frames.groups,
        prior=prior,
        n_boot=n_boot,
        rng=rng,
        provenance={**prov, **frames.source, "calibration": str(cal.csv_path)},
    )
