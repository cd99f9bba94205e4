"""How often a cue misleads in a deployment, from an imperfect text detector (seed 002, Sec. 3.4).

For cue j, the detector flags a share ``q_j`` of the deployment's frames. On a labelled
calibration set it has sensitivity ``sens_j`` (flagged share of scenes that carry j's text)
and false-positive rate ``fpr_j`` (flagged share of the others: the other cue's text or no
claim). The corrected share of frames that carry j's text is the standard correction for an
imperfect test::

    d̂_j = clip((q_j − fpr_j) / (sens_j − fpr_j), 0, 1)

undefined (NaN with :class:`UndefinedMetricWarning`, never 0) when ``sens_j <= fpr_j``. A cue
misleads only on scenes whose label it contradicts (Sec. H.1), so the misleading share is
``d̂ · π̂`` for reassuring text (π̂ the unsafe share) and ``d̂ · (1 − π̂)`` for alarming text;
π̂ comes from the decision log's labels where there are some, else from a stated prior.

Intervals: percentile intervals of a bootstrap that resamples the calibration scenes and,
independently, the deployment frames (whole situations where the log names them, so frames
of one place stay together), with :func:`spotstop.diagnostics.draw_group_counts`; so they carry
the calibration set's uncertainty as well as the deployment sample's. π̂ from labels is
resampled with its frames.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._resample import as_rng as _as_rng
from spotstop.diagnostics._resample import draw_group_counts
from spotstop.diagnostics._resample import percentile_ci as _percentile_ci
from spotstop.diagnostics._results import NAN_CI, Estimate
from spotstop.diagnostics.cues._results import fmt_estimate
from spotstop.diagnostics.cues._templates import CUES
from spotstop.guard import GuardError, ImageRefused
from spotstop.guard.cues import TextDetector

__all__ = [
    "CueShift",
    "ShiftResult",
    "corrected_share",
    "detect_flags",
    "estimate_shift",
]

SHIFT_SCHEMA_VERSION = 1


def corrected_share(
    q: NDArray[np.float64] | float,
    sens: NDArray[np.float64] | float,
    fpr: NDArray[np.float64] | float,
) -> NDArray[np.float64]:
    """``clip((q − fpr)/(sens − fpr), 0, 1)``, NaN where ``sens <= fpr`` or an input is NaN."""
    q, sens, fpr = (np.asarray(x, dtype=np.float64) for x in (q, sens, fpr))
    gap = sens - fpr
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.clip((q - fpr) / gap, 0.0, 1.0)
    return np.asarray(np.where(gap > 0, d, np.nan), dtype=np.float64)


def detect_flags(
    detector: TextDetector,
    images: Sequence[tuple[str, Callable[[], bytes]]],
    *,
    progress: bool = False,
    desc: str = "reading text",
) -> tuple[NDArray[np.bool_], dict[str, Any]]:
    """Run the detector on each ``(name, load)``; returns flags ``(n, len(CUES))`` and the
    detector's provenance (the OCR model and lexicon digests when the readings carry them)."""
    flags = np.zeros((len(images), len(CUES)), dtype=bool)
    prov: dict[str, Any] = {"detector": type(detector).__name__}
    it: Any = images
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(images, desc=desc, unit="frame", leave=False)
    for i, (name, load) in enumerate(it):
        try:
            reading = detector.detect(load())
        except ImageRefused as e:
            raise DataError(f"the text detector cannot read {name}: {e}") from e
        except GuardError as e:  # the OCR itself failed: not bad input; say on which image
            e.add_note(f"while reading {name}")
            raise
        found = {str(k): bool(v) for k, v in reading.flags.items()}
        for j, cue in enumerate(CUES):
            flags[i, j] = bool(found[cue])
        if i == 0:
            prov["ocr_model"] = reading.ocr_model.to_dict()
            prov["lexicon_sha256"] = reading.lexicon_sha256
    return flags, prov


@dataclass(frozen=True)
class CueShift:
    """The shift of one cue: flagged share ``q``, the detector's ``sens`` and ``fpr`` on the
    calibration set, the corrected share ``d_hat`` and the ``misleading_share``."""

    cue: str
    q: Estimate
    sens: Estimate
    fpr: Estimate
    d_hat: Estimate
    misleading_share: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k).to_dict() for k in ("q", "sens", "fpr", "d_hat", "misleading_share")
        }


@dataclass(frozen=True)
class ShiftResult:
    """Per cue the deployment's shift, the prevalence used and where it came from.

    ``prevalence_source`` is ``"log labels"`` (π̂ measured, with an interval) or ``"prior"``
    (stated by the caller: no interval). ``draws[cue]`` holds the misleading share's draws.
    """

    cues: Mapping[str, CueShift]
    prevalence: Estimate
    prevalence_source: str
    n_frames: int
    n_calibration: int
    n_boot: int
    provenance: Mapping[str, Any] = field(repr=False)
    draws: Mapping[str, NDArray[np.float64]] = field(repr=False)

    def __getitem__(self, cue: str) -> CueShift:
        return self.cues[cue]

    def __repr__(self) -> str:
        lines = [
            f"ShiftResult(n_frames={self.n_frames}, n_calibration={self.n_calibration}, "
            f"prevalence={self.prevalence!r} ({self.prevalence_source}),"
        ]
        for c in self.cues.values():
            lines.append(f"  {c.cue}: d_hat={c.d_hat!r}, misleading_share={c.misleading_share!r},")
        return "\n".join(lines) + "\n)"

    def to_dict(self) -> dict[str, Any]:
        """The content of ``shift.json``."""
        return {
            "schema_version": SHIFT_SCHEMA_VERSION,
            "cues": {c: s.to_dict() for c, s in self.cues.items()},
            "prevalence": self.prevalence.to_dict(),
            "prevalence_source": self.prevalence_source,
            "n_frames": self.n_frames,
            "n_calibration": self.n_calibration,
            "n_boot": self.n_boot,
            "provenance": dict(self.provenance),
        }

    def table(self) -> str:
        head = (
            f"{'cue':<11} {'flagged q':<23} {'sens':<23} {'fpr':<23} {'d̂':<23} "
            f"{'misleading share':<23}"
        )
        lines = [head, "-" * len(head)]
        for c in self.cues.values():
            cells = (c.q, c.sens, c.fpr, c.d_hat, c.misleading_share)
            lines.append(f"{c.cue:<11} " + " ".join(f"{fmt_estimate(e):<23}" for e in cells))
        lines.append(
            f"prevalence π̂ (unsafe share) = {fmt_estimate(self.prevalence)} from "
            f"{self.prevalence_source}"
        )
        return "\n".join(lines)

    def summary(self) -> str:
        parts = []
        for c in self.cues.values():
            if math.isnan(c.d_hat.value):
                parts.append(
                    f"The share of frames with {c.cue} text is undefined: the detector does not "
                    "separate such text from the rest on the calibration set (sens <= fpr)."
                )
                continue
            parts.append(
                f"{c.cue.capitalize()} text: the detector flags {100 * c.q.value:.1f}% of "
                f"{c.q.n} frames (sens {c.sens.value:.2f}, fpr {c.fpr.value:.2f}); corrected "
                f"share {fmt_estimate(c.d_hat)}, of which it misleads on "
                f"{fmt_estimate(c.misleading_share)} of all frames."
            )
        return " ".join(parts) + f" Prevalence from {self.prevalence_source}."


def _undefined(what: str, why: str) -> None:
    warnings.warn(
        f"{what} is undefined: {why}; returning NaN.", UndefinedMetricWarning, stacklevel=3
    )


def estimate_shift(
    frame_flags: NDArray[np.bool_],
    calibration_flags: NDArray[np.bool_],
    calibration_cues: Sequence[str],
    *,
    frame_labels: NDArray[np.int8] | None = None,
    frame_groups: Sequence[Any] | None = None,
    prior: float | None = None,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    chunk_size: int = 500,
    provenance: Mapping[str, Any] | None = None,
) -> ShiftResult:
    """d̂ and the misleading share per cue, with bootstrap intervals (see the module docstring).

    frame_flags: ``(n_frames, len(CUES))`` detector flags on the deployment's frames.
    calibration_flags / calibration_cues: the detector's flags on the calibration scenes and
        each scene's true cue (``reassuring``, ``alarming`` or ``none``).
    frame_labels: per frame 1 UNSAFE, 0 SAFE, -1 unlabelled (a decision log's labels), or None.
    frame_groups: per frame a resampling group (e.g. the situation id), or None: each frame
        alone.
    prior: the unsafe share to use when no frame is labelled (stated, not measured).
    """
    ff, cf, cc, lab, gcode = _check_shift(
        frame_flags, calibration_flags, calibration_cues, frame_labels, frame_groups, prior, n_boot
    )
    gen = _as_rng(rng)
    n_f, n_c, n_g = ff.shape[0], cf.shape[0], int(gcode.max()) + 1
    labelled = lab >= 0
    use_labels = bool(labelled.any())
    if not use_labels and prior is None:
        raise DataError(
            "no deployment frame is labelled, so the unsafe share π̂ cannot be measured; pass "
            "a stated prior (--prior P, e.g. 0.1) for the share of unsafe scenes."
        )
    # per frame group: frames, flags per cue, labelled, unsafe
    fcols = np.column_stack([np.ones(n_f), ff.astype(float), labelled, lab == 1])
    per_g = np.zeros((n_g, fcols.shape[1]))
    np.add.at(per_g, gcode, fcols)
    # per calibration scene: positives of cue j, and flags of cue j among positives / negatives
    is_pos = np.column_stack([cc == c for c in CUES]).astype(float)
    ccols = np.column_stack([is_pos, is_pos * cf, (1 - is_pos) * cf])

    def stats(fc: NDArray[np.float64], cc_: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        k = len(CUES)
        with np.errstate(invalid="ignore", divide="ignore"):
            frames, fl, n_lab, n_uns = fc[:, 0], fc[:, 1 : 1 + k], fc[:, 1 + k], fc[:, 2 + k]
            q = fl / frames[:, None]
            pos = cc_[:, :k]
            sens = cc_[:, k : 2 * k] / pos
            fpr = cc_[:, 2 * k :] / (n_c - pos)
            pi = n_uns / n_lab if use_labels else np.full(frames.shape, float(prior or 0.0))
        d = corrected_share(q, sens, fpr)
        share = d * np.column_stack([pi if c == "reassuring" else 1 - pi for c in CUES])
        return {"q": q, "sens": sens, "fpr": fpr, "d_hat": d, "share": share, "pi": pi}

    point = stats(per_g.sum(axis=0)[None, :], ccols.sum(axis=0)[None, :])
    chunks: list[dict[str, NDArray[np.float64]]] = []
    for c_cal, c_fr in zip(
        draw_group_counts(n_c, n_boot, gen, chunk_size),
        draw_group_counts(n_g, n_boot, gen, chunk_size),
        strict=True,
    ):
        chunks.append(stats(c_fr @ per_g, c_cal @ ccols))
    draws = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    n_pos = is_pos.sum(axis=0)
    cues: dict[str, CueShift] = {}
    for j, cue in enumerate(CUES):
        sens, fpr = float(point["sens"][0, j]), float(point["fpr"][0, j])
        if n_pos[j] == 0:
            _undefined(
                f"the detector's sensitivity for {cue} text",
                f"the calibration set has no scene with cue {cue}",
            )
        elif n_pos[j] == n_c:
            _undefined(
                f"the detector's false-positive rate for {cue} text",
                f"every calibration scene has cue {cue}",
            )
        elif sens <= fpr:
            _undefined(
                f"the corrected share d̂ of {cue} text",
                f"the detector's sensitivity ({sens:.3f}) is not above its false-positive rate "
                f"({fpr:.3f}) on the calibration set, so its flags carry no information; "
                "improve the lexicon or the calibration set",
            )

        def est(key: str, n: int, j: int = j) -> Estimate:
            return Estimate(float(point[key][0, j]), _percentile_ci(draws[key][:, j]), n)

        cues[cue] = CueShift(
            cue=cue,
            q=est("q", n_f),
            sens=est("sens", int(n_pos[j])),
            fpr=est("fpr", int(n_c - n_pos[j])),
            d_hat=est("d_hat", n_f),
            misleading_share=est("share", n_f),
        )
    if use_labels:
        prevalence = Estimate(
            float(point["pi"][0]), _percentile_ci(draws["pi"]), int(labelled.sum())
        )
        source = "log labels"
    else:
        prevalence = Estimate(float(prior or 0.0), NAN_CI, 0)
        source = "prior"
    prov = dict(provenance or {})
    if use_labels and prior is not None:
        prov["prior_ignored"] = f"{prior} (the labels of {int(labelled.sum())} frames were used)"
    return ShiftResult(
        cues=cues,
        prevalence=prevalence,
        prevalence_source=source,
        n_frames=n_f,
        n_calibration=n_c,
        n_boot=n_boot,
        provenance=prov,
        draws={c: draws["share"][:, j] for j, c in enumerate(CUES)},
    )


def _check_shift(
    frame_flags: Any,
    calibration_flags: Any,
    calibration_cues: Any,
    frame_labels: Any,
    frame_groups: Any,
    prior: Any,
    n_boot: Any,
) -> tuple[
    NDArray[np.bool_], NDArray[np.bool_], NDArray[np.object_], NDArray[np.int8], NDArray[np.intp]
]:
    k = len(CUES)
    ff = np.asarray(frame_flags, dtype=bool)
    cf = np.asarray(calibration_flags, dtype=bool)
    if ff.ndim != 2 or ff.shape[1] != k or ff.shape[0] == 0:
        raise DataError(f"frame_flags must have shape (n_frames >= 1, {k}); got {ff.shape}.")
    if cf.ndim != 2 or cf.shape[1] != k or cf.shape[0] == 0:
        raise DataError(f"calibration_flags must have shape (n >= 1, {k}); got {cf.shape}.")
    cc = np.asarray(list(calibration_cues), dtype=object)
    if cc.shape != (cf.shape[0],):
        raise DataError(
            f"calibration_cues needs one cue per calibration scene ({cf.shape[0]}); got {cc.shape[0]}."
        )
    bad = sorted({str(c) for c in cc} - {*CUES, "none"})
    if bad:
        raise DataError(f"calibration cues must be reassuring, alarming or none; got {bad}.")
    n = ff.shape[0]
    lab = np.full(n, -1, dtype=np.int8) if frame_labels is None else np.asarray(frame_labels)
    if lab.shape != (n,) or not np.isin(lab, (-1, 0, 1)).all():
        raise DataError(
            f"frame_labels must be {n} values in -1 (unlabelled), 0 (SAFE), 1 (UNSAFE)."
        )
    if frame_groups is None:
        gcode = np.arange(n, dtype=np.intp)
    else:
        groups = np.asarray([str(g) for g in frame_groups], dtype=object)
        if groups.shape != (n,):
            raise DataError(f"frame_groups needs one group per frame ({n}); got {groups.shape[0]}.")
        _, gcode = np.unique(groups, return_inverse=True)
        gcode = gcode.reshape(-1).astype(np.intp)
    if prior is not None and not (isinstance(prior, (int, float)) and 0.0 <= float(prior) <= 1.0):
        raise DataError(f"prior is the unsafe share, a number in [0, 1]; got {prior!r}.")
    if not isinstance(n_boot, (int, np.integer)) or isinstance(n_boot, bool) or n_boot < 1:
        raise DataError(f"n_boot must be an integer >= 1; got {n_boot!r}.")
    return ff, cf, cc, lab.astype(np.int8), gcode
