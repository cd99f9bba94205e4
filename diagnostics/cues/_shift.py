"""How often a cue misleads in a deployment, from an imperfect text detector (seed 002, Sec. 3.4).

For cue j, the detector flags a share ``q_j`` of the deployment's frames. On a labelled
calibration set it has sensitivity ``sens_j`` (flagged share of scenes that carry j's text)
and false-positive rate ``fpr_j`` (flagged share of the others: the other cue's text or no
claim). With one flag, the corrected share of frames that carry j's text is the standard
correction for an imperfect test::

    d̂_j = clip((q_j − fpr_j) / (sens_j − fpr_j), 0, 1)

The detector gives two flags at once, so the frame types (reassuring text, alarming text,
neither) are estimated jointly from the four flag signals by least squares with shares ≥ 0
that sum to one (Sec. E.2, :mod:`spotstop.diagnostics.cues._nnls`); with a single
informative flag it is the correction above, and a flag that also fires on the other cue's
text no longer counts that text as its own. The calibration set must hold scenes without claim
text (``none``): most frames are of that type, and without its rates the shares would be forced
to sum to one over the text types (a DataError says so). A cue with ``sens_j <= fpr_j`` is undefined: NaN
point and NaN interval (with :class:`UndefinedMetricWarning`, never 0); its text is counted
under "none" and the cue drops out of the prediction.

A cue misleads only on scenes whose label it contradicts (Sec. H.1): reassuring text on
UNSAFE scenes, alarming text on SAFE ones. The misleading share is

* with labelled frames (a labelled log, or ``--labels``), at least
  :data:`MIN_LABELLED_PER_CLASS` of each class: the corrected share among the UNSAFE frames ×
  π̂ (reassuring), among the SAFE frames × (1 − π̂) (alarming), never above d̂ (text that
  misleads is text); a stated prior is then ignored, with a warning;
* without (or with fewer labelled frames of a class, with a warning): ``d̂ · π̂`` and
  ``d̂ · (1 − π̂)``, which assumes that text is independent of the label
  (:data:`INDEPENDENCE_ASSUMPTION`, stated in the result and in ``shift.json``), with π̂ a
  stated prior.

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
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._resample import as_rng as _as_rng
from spotstop.diagnostics._resample import draw_group_counts, nan_divide, nan_estimate
from spotstop.diagnostics._resample import percentile_ci as _percentile_ci
from spotstop.diagnostics._results import NAN_CI, Estimate, fmt_estimate
from spotstop.diagnostics.cues._nnls import signal_codes, simplex_lstsq
from spotstop.diagnostics.cues._source import check_calibration_cues
from spotstop.diagnostics.cues._templates import CUES
from spotstop.guard import GuardError, ImageRefused
from spotstop.guard.cues import TextDetector
from spotstop.guard.validate import is_real

__all__ = [
    "BASIS_INDEPENDENCE",
    "BASIS_LABELS",
    "INDEPENDENCE_ASSUMPTION",
    "MIN_LABELLED_PER_CLASS",
    "MISLEADS_ON",
    "CueShift",
    "ShiftResult",
    "corrected_share",
    "detect_flags",
    "estimate_shift",
]

SHIFT_SCHEMA_VERSION = 2  # 2: frame types jointly, d_hat_given_label, basis, assumption


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
            prov["reader"] = reading.reader
    return flags, prov


#: The label each cue misleads on (Sec. H.1): reassuring text on UNSAFE scenes (1), alarming
#: text on SAFE ones (0).
MISLEADS_ON: Mapping[str, int] = MappingProxyType({"reassuring": 1, "alarming": 0})

#: How a misleading share was obtained (each share in shift.json and select.json says which).
BASIS_LABELS = "labels"
BASIS_INDEPENDENCE = "assumes text independent of the label"

_ASSUMES = (
    "the misleading share assumes that scene text is "
    "independent of the label: d̂ · π̂ for reassuring text and d̂ · (1 − π̂) for alarming text. "
    "Where signs say SAFE mostly on safe scenes (as they should), this overstates how often "
    "text misleads; label some frames (--labels) to measure it instead."
)

#: The assumption stated wherever a misleading share comes without labelled frames.
INDEPENDENCE_ASSUMPTION = "No deployment frame is labelled, so " + _ASSUMES

#: Labelled deployment frames of each class (UNSAFE and SAFE) needed before the labels, not the
#: stated prior, give π̂ and the misleading shares. A class share measured on 30 frames has a
#: standard error of at most 0.5/√30 ≈ 0.09, and its bootstrap interval is degenerate only
#: when the share is 0 or 1; on fewer frames the labels speak for those frames rather than the
#: deployment (2 reviewed UNSAFE frames among 2000 gave π̂ = 1 [1, 1], and a misleading share
#: of 1 where d̂ was 0.10).
MIN_LABELLED_PER_CLASS = 30

_NONE = "none"
_TYPES = (*CUES, _NONE)  # calibration scene types, in this order


@dataclass(frozen=True)
class CueShift:
    """The shift of one cue.

    q: flagged share of the frames. sens / fpr: the detector's flag rates on the calibration
    scenes with and without this cue's text. d_hat: share of frames carrying the cue's text,
    from the joint estimate of the frame types (Sec. E.2). d_hat_given_label: the same among
    the labelled frames the cue misleads on (UNSAFE for reassuring, SAFE for alarming; NaN
    without labels). misleading_share: share of all frames whose text misleads, and
    ``basis``: :data:`BASIS_LABELS` (``d_hat_given_label`` × that label's share) or
    :data:`BASIS_INDEPENDENCE` (``d_hat`` × the label's share, assumed independent).
    A cue whose detector does not separate its text (sens <= fpr) has NaN values and NaN
    intervals for d_hat, d_hat_given_label and misleading_share.
    """

    cue: str
    q: Estimate
    sens: Estimate
    fpr: Estimate
    d_hat: Estimate
    misleading_share: Estimate
    d_hat_given_label: Estimate = field(default_factory=lambda: nan_estimate(0))
    basis: str = BASIS_INDEPENDENCE

    @property
    def defined(self) -> bool:
        """Whether the detector separates this cue's text (its d̂ is a number)."""
        return not math.isnan(self.d_hat.value)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: getattr(self, k).to_dict()
            for k in ("q", "sens", "fpr", "d_hat", "d_hat_given_label")
        }
        out["misleading_share"] = {**self.misleading_share.to_dict(), "basis": self.basis}
        return out


@dataclass(frozen=True)
class ShiftResult:
    """Per cue the deployment's shift, the prevalence used and where it came from.

    ``prevalence_source`` is ``"log labels"`` (π̂ measured, with an interval) or ``"prior"``
    (stated by the caller: no interval). ``draws[cue]`` holds the misleading share's draws and
    ``prevalence_draws`` π̂'s. ``frame_types``: the joint estimate of the share of frames of
    each type (reassuring text, alarming text, none; a cue the detector does not separate is
    counted under none). ``assumption``: :data:`INDEPENDENCE_ASSUMPTION` when the misleading
    shares rest on it (no labelled frame), else None.
    """

    cues: Mapping[str, CueShift]
    prevalence: Estimate
    prevalence_source: str
    n_frames: int
    n_calibration: int
    n_boot: int
    provenance: Mapping[str, Any] = field(repr=False)
    draws: Mapping[str, NDArray[np.float64]] = field(repr=False)
    prevalence_draws: NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))
    frame_types: Mapping[str, Estimate] = field(repr=False, default_factory=dict)
    assumption: str | None = None

    def __getitem__(self, cue: str) -> CueShift:
        return self.cues[cue]

    @property
    def basis(self) -> str:
        """:data:`BASIS_LABELS` or :data:`BASIS_INDEPENDENCE` (the same for every cue)."""
        return BASIS_INDEPENDENCE if self.assumption else BASIS_LABELS

    def __repr__(self) -> str:
        lines = [
            f"ShiftResult(n_frames={self.n_frames}, n_calibration={self.n_calibration}, "
            f"prevalence={self.prevalence!r} ({self.prevalence_source}), basis={self.basis!r},"
        ]
        for c in self.cues.values():
            lines.append(f"  {c.cue}: d_hat={c.d_hat!r}, misleading_share={c.misleading_share!r},")
        return "\n".join(lines) + "\n)"

    def to_dict(self) -> dict[str, Any]:
        """The content of ``shift.json``."""
        return {
            "schema_version": SHIFT_SCHEMA_VERSION,
            "cues": {c: s.to_dict() for c, s in self.cues.items()},
            "frame_types": {t: e.to_dict() for t, e in self.frame_types.items()},
            "prevalence": self.prevalence.to_dict(),
            "prevalence_source": self.prevalence_source,
            "misleading_share_basis": self.basis,
            "assumption": self.assumption,
            "n_frames": self.n_frames,
            "n_calibration": self.n_calibration,
            "n_boot": self.n_boot,
            "provenance": dict(self.provenance),
        }

    def table(self) -> str:
        mark = " †" if self.assumption else ""
        head = (
            f"{'cue':<11} {'flagged q':<23} {'sens':<23} {'fpr':<23} {'d̂':<23} "
            f"{'misleading share' + mark:<23}"
        )
        lines = [head, "-" * len(head)]
        for c in self.cues.values():
            cells = (c.q, c.sens, c.fpr, c.d_hat, c.misleading_share)
            lines.append(f"{c.cue:<11} " + " ".join(f"{fmt_estimate(e):<23}" for e in cells))
        lines.append(
            f"prevalence π̂ (unsafe share) = {fmt_estimate(self.prevalence)} from "
            f"{self.prevalence_source}"
        )
        if self.assumption:
            lines.append(f"† {self.assumption}")
        else:
            lines.append(
                "misleading share from the labelled frames: d̂ among UNSAFE frames × π̂ "
                "(reassuring), among SAFE frames × (1 − π̂) (alarming)"
            )
        return "\n".join(lines)

    def summary(self) -> str:
        parts = []
        for c in self.cues.values():
            if not c.defined:
                parts.append(
                    f"The share of frames with {c.cue} text is undefined: the detector does not "
                    "separate such text from the rest on the calibration set (sens <= fpr)."
                )
                continue
            where = "UNSAFE" if MISLEADS_ON[c.cue] == 1 else "SAFE"
            given = (
                f" ({fmt_estimate(c.d_hat_given_label)} of the {where} frames)"
                if c.basis == BASIS_LABELS
                else ""
            )
            parts.append(
                f"{c.cue.capitalize()} text: the detector flags {100 * c.q.value:.1f}% of "
                f"{c.q.n} frames (sens {c.sens.value:.2f}, fpr {c.fpr.value:.2f}); corrected "
                f"share {fmt_estimate(c.d_hat)}{given}, of which it misleads on "
                f"{fmt_estimate(c.misleading_share)} of all frames."
            )
        basis = (
            "Misleading shares from the labelled frames."
            if self.assumption is None
            else self.assumption
        )
        return " ".join(parts) + f" Prevalence from {self.prevalence_source}. {basis}"


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
        With labelled frames the misleading share is measured among them; without, it
        assumes text independent of the label (said in the result).
    frame_groups: per frame a resampling group (e.g. the situation id), or None: each frame
        alone.
    prior: the unsafe share to use when fewer than :data:`MIN_LABELLED_PER_CLASS` frames of a
        class are labelled (stated, not measured); ignored, with a warning, when the labels
        suffice.
    """
    ff, cf, cc, lab, gcode = _check_shift(
        frame_flags, calibration_flags, calibration_cues, frame_labels, frame_groups, prior, n_boot
    )
    gen = _as_rng(rng)
    k = len(CUES)
    n_sig = 1 << k
    n_f, n_c, n_g = ff.shape[0], cf.shape[0], int(gcode.max()) + 1
    labelled = lab >= 0
    n_class = {1: int((lab == 1).sum()), 0: int((lab == 0).sum())}
    use_labels = _labels_suffice(n_class, prior)
    # per frame group: frames per signal, among all / UNSAFE / SAFE frames
    sig = np.eye(n_sig)[signal_codes(ff)]
    fcols = np.column_stack([sig, sig * (lab == 1)[:, None], sig * (lab == 0)[:, None]])
    per_g = np.zeros((n_g, fcols.shape[1]))
    np.add.at(per_g, gcode, fcols)
    # per calibration scene: its (type, signal) cell
    ctype = np.array([_TYPES.index(str(c)) for c in cc])
    ccols = np.eye(len(_TYPES) * n_sig)[ctype * n_sig + signal_codes(cf)]
    bit = ((np.arange(n_sig)[:, None] >> np.arange(k)) & 1).astype(float)  # (S, k)

    # which cues the detector separates, at the point: the others drop out of the mixture
    cnt0 = ccols.sum(axis=0).reshape(len(_TYPES), n_sig)
    n_type = cnt0.sum(axis=1)
    defined: list[bool] = []
    for j, cue in enumerate(CUES):
        pos = n_type[j]
        sens = (cnt0[j] @ bit[:, j]) / pos if pos else math.nan
        neg = n_c - pos
        fpr = (np.delete(cnt0, j, axis=0).sum(axis=0) @ bit[:, j]) / neg if neg else math.nan
        if pos == 0:
            _undefined(
                f"the detector's sensitivity for {cue} text",
                f"the calibration set has no scene with cue {cue}",
            )
        elif neg == 0:
            _undefined(
                f"the detector's false-positive rate for {cue} text",
                f"every calibration scene has cue {cue}",
            )
        elif sens <= fpr:
            _undefined(
                f"the corrected share d̂ of {cue} text",
                f"the detector's sensitivity ({sens:.3f}) is not above its false-positive rate "
                f"({fpr:.3f}) on the calibration set, so its flags carry no information; "
                "improve the lexicon or the calibration set. The cue drops out of the "
                "prediction",
            )
        defined.append(bool(pos and neg and sens > fpr))
    # mixture columns: each defined cue alone, then the rest pooled (none + undefined cues)
    columns = [[j] for j in range(k) if defined[j]]
    rest = [t for t in range(len(_TYPES)) if t >= k or not defined[t]]
    if n_type[rest].sum() > 0:
        columns.append(rest)
    col_of = {j: c for c, j in enumerate(j for j in range(k) if defined[j])}  # cue -> column
    has_rest = bool(n_type[rest].sum() > 0)

    def stats(fc: NDArray[np.float64], cc_: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        cnt = cc_.reshape(-1, len(_TYPES), n_sig)  # (B, T, S)
        all_, uns, saf = fc[:, :n_sig], fc[:, n_sig : 2 * n_sig], fc[:, 2 * n_sig :]
        frames, n_u, n_s = all_.sum(axis=1), uns.sum(axis=1), saf.sum(axis=1)
        pos = cnt.sum(axis=2)  # (B, T)
        flagged = cnt @ bit  # (B, T, k)
        sens = nan_divide(flagged[:, np.arange(k), np.arange(k)], pos[:, :k])
        neg_fl = flagged.sum(axis=1) - flagged[:, np.arange(k), np.arange(k)]
        fpr = nan_divide(neg_fl, cc_.sum(axis=1)[:, None] - pos[:, :k])
        q = nan_divide(all_ @ bit, frames[:, None])
        pooled = np.stack([cnt[:, cols, :].sum(axis=1) for cols in columns], axis=2)  # (B,S,C)
        rates = nan_divide(pooled, pooled.sum(axis=1, keepdims=True))
        w_all = simplex_lstsq(rates, nan_divide(all_, frames[:, None]))
        w_by = {
            1: simplex_lstsq(rates, nan_divide(uns, n_u[:, None])),
            0: simplex_lstsq(rates, nan_divide(saf, n_s[:, None])),
        }
        nan = np.full(frames.shape, np.nan)
        d = np.column_stack([w_all[:, col_of[j]] if j in col_of else nan for j in range(k)])
        n_lab = n_u + n_s
        pi = nan_divide(n_u, n_lab) if use_labels else np.full(frames.shape, float(prior or 0.0))
        d_given = np.column_stack(
            [w_by[MISLEADS_ON[c]][:, col_of[j]] if j in col_of else nan for j, c in enumerate(CUES)]
        )
        if use_labels:
            n_by = {1: n_u, 0: n_s}
            share = np.column_stack(
                [
                    np.where(n_by[MISLEADS_ON[c]] > 0, d_given[:, j], 0.0)
                    * nan_divide(n_by[MISLEADS_ON[c]], n_lab)
                    if j in col_of
                    else nan
                    for j, c in enumerate(CUES)
                ]
            )
            # text that misleads is text: the share of all frames cannot exceed d̂ (labelled
            # frames drawn unlike the rest can say otherwise; the point warns below)
            over = share > d + 1e-9  # beyond the solver's rounding (the cap holds regardless)
            share = np.minimum(share, d)
        else:
            over = np.zeros(d.shape, dtype=bool)
            share = d * np.column_stack([pi if MISLEADS_ON[c] == 1 else 1 - pi for c in CUES])
        types = np.column_stack(
            [w_all[:, col_of[j]] if j in col_of else nan for j in range(k)]
            + [w_all[:, -1] if has_rest else nan]
        )
        return {"q": q, "sens": sens, "fpr": fpr, "d_hat": d, "d_given": d_given,
                "share": share, "pi": pi, "types": types, "over": over}  # fmt: skip

    point = stats(per_g.sum(axis=0)[None, :], ccols.sum(axis=0)[None, :])
    chunks: list[dict[str, NDArray[np.float64]]] = []
    for c_cal, c_fr in zip(
        draw_group_counts(n_c, n_boot, gen, chunk_size),
        draw_group_counts(n_g, n_boot, gen, chunk_size),
        strict=True,
    ):
        chunks.append(stats(c_fr @ per_g, c_cal @ ccols))
    draws = {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}

    def est(key: str, j: int, n: int) -> Estimate:
        value = float(point[key][0, j])
        if math.isnan(value):  # no finite interval around an undefined point
            return nan_estimate(n)
        return Estimate(value, _percentile_ci(draws[key][:, j]), n)

    basis = BASIS_LABELS if use_labels else BASIS_INDEPENDENCE
    for j, cue in enumerate(CUES):
        if point["over"][0, j]:
            where = "UNSAFE" if MISLEADS_ON[cue] == 1 else "SAFE"
            warnings.warn(
                f"the labelled {where} frames carry more {cue} text than all {n_f} frames do "
                f"(d̂ {float(point['d_given'][0, j]):.3f} among the {n_class[MISLEADS_ON[cue]]} "
                f"labelled {where} frames, {float(point['d_hat'][0, j]):.3f} among all): the "
                "labelled frames are not drawn like the rest (e.g. flagged frames reviewed "
                "first); the misleading share is capped at d̂. Label frames drawn at random.",
                UserWarning,
                stacklevel=2,
            )
    cues: dict[str, CueShift] = {}
    for j, cue in enumerate(CUES):
        cues[cue] = CueShift(
            cue=cue,
            q=est("q", j, n_f),
            sens=est("sens", j, int(n_type[j])),
            fpr=est("fpr", j, int(n_c - n_type[j])),
            d_hat=est("d_hat", j, n_f),
            misleading_share=est("share", j, n_class[MISLEADS_ON[cue]] if use_labels else n_f),
            d_hat_given_label=(
                est("d_given", j, n_class[MISLEADS_ON[cue]]) if use_labels else nan_estimate(0)
            ),
            basis=basis,
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
    elif not use_labels and labelled.any():
        prov["labels_set_aside"] = (
            f"{n_class[1]} UNSAFE and {n_class[0]} SAFE labelled frames, fewer than "
            f"{MIN_LABELLED_PER_CLASS} of a class; the stated prior {prior} was used"
        )
    undefined = [c for j, c in enumerate(CUES) if not defined[j]]
    prov["frame_type_estimate"] = (
        "joint, by least squares on the four flag signals with shares >= 0 summing to 1 (seed "
        "002, Sec. E.2)"
        + (f"; {', '.join(undefined)} text counted under none (undefined)" if undefined else "")
    )
    return ShiftResult(
        cues=cues,
        prevalence=prevalence,
        prevalence_source=source,
        n_frames=n_f,
        n_calibration=n_c,
        n_boot=n_boot,
        provenance=prov,
        draws={c: draws["share"][:, j] for j, c in enumerate(CUES)},
        prevalence_draws=draws["pi"],
        frame_types={t: est("types", i, n_f) for i, t in enumerate(_TYPES)},
        assumption=None if use_labels else _assumption(n_class),
    )


def _assumption(n_class: Mapping[int, int]) -> str:
    """The independence assumption, saying why no labels were used."""
    if n_class[0] + n_class[1] == 0:
        return INDEPENDENCE_ASSUMPTION
    return (
        f"Only {n_class[1]} UNSAFE and {n_class[0]} SAFE deployment frames are labelled (fewer "
        f"than {MIN_LABELLED_PER_CLASS} of a class), so " + _ASSUMES
    )


def _labels_suffice(n_class: Mapping[int, int], prior: float | None) -> bool:
    """Whether π̂ and the misleading shares come from the labelled frames (at least
    :data:`MIN_LABELLED_PER_CLASS` of each class) rather than the stated prior; warns when the
    prior is ignored or the labels are set aside, and refuses when neither is at hand."""
    n_u, n_s = n_class[1], n_class[0]
    enough = min(n_u, n_s) >= MIN_LABELLED_PER_CLASS
    if not enough and prior is None:
        if n_u + n_s == 0:
            raise DataError(
                "no deployment frame is labelled, so the unsafe share π̂ cannot be measured; "
                "pass a stated prior (--prior P, e.g. 0.1) for the share of unsafe scenes."
            )
        raise DataError(
            f"only {n_u} UNSAFE and {n_s} SAFE deployment frames are labelled; the labels "
            f"measure π̂ and the misleading shares from {MIN_LABELLED_PER_CLASS} frames of each "
            "class up. Label more frames drawn at random (--labels), or pass a stated prior "
            "(--prior P, e.g. 0.1) for the share of unsafe scenes."
        )
    if enough and prior is not None:
        warnings.warn(
            f"the stated prior {prior} is ignored: π̂ and the misleading shares are measured on "
            f"the {n_u} UNSAFE and {n_s} SAFE labelled frames. Drop --prior to silence this.",
            UserWarning,
            stacklevel=3,
        )
    elif not enough and n_u + n_s > 0:
        warnings.warn(
            f"only {n_u} UNSAFE and {n_s} SAFE deployment frames are labelled, fewer than "
            f"{MIN_LABELLED_PER_CLASS} of a class: they are set aside, and the misleading shares "
            f"use the stated prior {prior} and assume text independent of the label. Label at "
            f"least {MIN_LABELLED_PER_CLASS} frames of each class to measure them.",
            UserWarning,
            stacklevel=3,
        )
    return enough


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
    check_calibration_cues(list(cc), "calibration_cues")
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
    if prior is not None and not (is_real(prior) and 0.0 <= float(prior) <= 1.0):
        raise DataError(f"prior is the unsafe share, a number in [0, 1]; got {prior!r}.")
    if not isinstance(n_boot, (int, np.integer)) or isinstance(n_boot, bool) or n_boot < 1:
        raise DataError(f"n_boot must be an integer >= 1; got {n_boot!r}.")
    return ff, cf, cc, lab.astype(np.int8), gcode
