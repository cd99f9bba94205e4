"""Deployment frames for the shift: a folder of images, or a decision log's stored images.

A decision log keeps the encoded image of each decision when the guard runs with
``store_images=True``; its labels table (or a labels file) gives the unsafe share π̂, and
its situation ids group the frames for the bootstrap.
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
from spotstop.guard.cues import TextDetector

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
    0 SAFE, -1 unlabelled) and ``groups`` (resampling groups), and where they came from."""

    items: tuple[tuple[str, Callable[[], bytes]], ...] = field(repr=False)
    labels: NDArray[np.int8] = field(repr=False)
    groups: tuple[str, ...] = field(repr=False)
    source: Mapping[str, Any]

    def __len__(self) -> int:
        return len(self.items)


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
    """The decisions of a log whose image is stored, with the log's labels (or a labels file's,
    as for the card) and situation ids. Decisions without a stored image are counted and left
    out, with a warning; a log with none is an error."""
    from spotstop.diagnostics._from_log import _cell, apply_labels_file
    from spotstop.guard import DecisionLog, GuardError

    path = Path(log_path)
    if not path.is_file():
        raise DataError(f"decision log {str(path)!r} does not exist; pass the log's SQLite file.")
    try:
        with DecisionLog(path) as log:
            arr = log.to_arrays()
            sha_of = {r.decision_id: r.image_sha256 for r in log.records()}
            stored = {s for s in set(sha_of.values()) if s and log.image(s) is not None}
    except GuardError as exc:
        raise DataError(f"cannot read the decision log {str(path)!r}: {exc}") from exc
    ids = np.asarray(arr.decision_id, dtype=object)
    sha = np.array([sha_of.get(d) or "" for d in ids], dtype=object)
    lab = np.array(arr.label, dtype=np.int8, copy=True)
    contrast = np.array([_cell(c) for c in arr.contrast_id], dtype=object)
    situation = np.array([_cell(s) for s in arr.situation_id], dtype=object)
    if labels is not None:
        apply_labels_file(Path(labels), ids, sha, lab, contrast, situation)
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
            stacklevel=2,
        )

    def load(s: str) -> bytes:
        with DecisionLog(path) as log:
            data = log.image(s)
        if data is None:
            raise DataError(f"the image {s} left decision log {str(path)!r} while reading it.")
        return data

    idx = np.flatnonzero(keep)
    return DeploymentFrames(
        items=tuple((f"decision {ids[i]}", partial(load, str(sha[i]))) for i in idx),
        labels=lab[idx],
        groups=tuple(str(situation[i]) or f"decision {ids[i]}" for i in idx),
        source={
            "log": str(path),
            "labels": str(labels) if labels is not None else "log labels table",
            "n_decisions": len(ids),
            "n_with_image": int(keep.sum()),
        },
    )


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
    frame_flags, _ = detect_flags(detector, list(frames.items), progress=progress, desc="frames")
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
