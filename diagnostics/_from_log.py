"""The case table from the guard's decision log (``spotstop card LOG``).

:func:`log_cases` reads a :class:`spotstop.guard._log.DecisionLog` file and returns the
:class:`~spotstop.diagnostics.CaseTable` of its labelled decisions together with a provenance dict;
:func:`case_table_from_log` returns the table only.

Rows
    One case per decision; ``case_id`` is the ``decision_id``.  A decision enters the table
    only when it did not fail closed, has a reviewer label and has a finite fused score.
    The others are dropped and counted in ``provenance["dropped"]``, each under the *first*
    reason that applies, in this order: ``fail_closed`` (a fail-closed UNSAFE is not a
    score-based answer, so it never enters the statistics, labelled or not),
    ``unlabelled``, ``nonfinite_score``.

Scores
    ``score`` is the logged fused score S (the score the policy compared with its
    threshold); ``member_scores`` are the logged per-member scene scores (NaN kept).

Gray and request-only scores
    The log holds them per member only.  Avg-2 fusion is affine in the member scores
    (``S = Σ_m a_m s_m + c``, with ``a_m = w_m / (IQR_m Σ w)``), but its reference
    statistics are not logged.  Within each ``(bundle_id, prompt_hash)`` -- one fusion --
    the map is therefore recovered by least squares of S on the member scores over that
    bundle's scored decisions (labelled or not).  When the fit is exact (the residuals are
    at rounding level, which they are whenever the log came from one Avg-2 fusion) the
    same map is applied to the member gray and text scores, giving ``score_gray`` and
    ``score_text`` on the fused scale: the fused score the guard would have given the gray
    image / the request alone.  Where the fit is not exact or not identified (too few
    decisions, collinear members) or a member's gray/text score is missing, the value is NaN
    and ``provenance["gray_text"]`` says why.  A column that is NaN for every case is left
    out (None).

Labels
    From the log's ``labels`` table, or from a ``labels`` file (CSV or JSONL) whose rows
    override the table's.  Each row is keyed by ``decision_id`` or ``image_sha256`` (a row
    may hold either; ``decision_id`` wins when both are filled).  An ``image_sha256`` key
    labels every decision with that image.  Columns: ``label`` (safe/unsafe or 0/1,
    required), optional ``contrast_id`` and ``situation_id``; an empty or missing cell keeps
    the log's value (the table's contrast id, the logged situation).  A key that matches no
    decision is an error listing a few; so is a decision given two different labels by the
    file.

Situations
    ``situation_id`` is the logged one (a labels-file value overrides it); ``contrast_id``
    comes from the labels.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError
from spotstop.guard._labels import LabelsFileError, _cell, apply_labels_file

__all__ = ["LogCases", "apply_labels_file", "case_table_from_log", "log_cases"]

_EXACT_RTOL = 1e-6  # residual / scale below which the affine fusion fit counts as exact


@dataclass(frozen=True)
class LogCases:
    """A :class:`CaseTable` read from a decision log and where it came from.

    ``provenance``: ``log`` (path), ``labels`` (file or ``"log labels table"``),
    ``bundle_ids``, ``prompt_hashes``, ``policies``, ``time_range`` (ISO-8601 UTC of the
    cases kept) and ``time_range_log`` (all decisions), ``n_decisions``, ``n_cases``,
    ``n_labelled_from_file``, ``dropped`` (count per reason), ``thresholds`` (logged
    thresholds of the cases kept: median, min, max, n) and ``gray_text`` (how
    ``score_gray``/``score_text`` were obtained).
    """

    table: CaseTable
    provenance: dict[str, Any]


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).isoformat()


def _time_range(t: NDArray[np.float64]) -> list[str] | None:
    t = t[np.isfinite(t)]
    return None if t.size == 0 else [_iso(float(t.min())), _iso(float(t.max()))]


def _fused_scale(
    fused: NDArray[np.float64],
    members: Mapping[str, NDArray[np.float64]],
    others: Mapping[str, Mapping[str, NDArray[np.float64]]],
    group: NDArray[np.object_],
    usable: NDArray[np.bool_],
) -> tuple[dict[str, NDArray[np.float64]], dict[str, Any]]:
    """Map per-member gray/text scores to the fused scale (see the module docstring)."""
    n = fused.size
    names = list(members)
    out = {kind: np.full(n, np.nan) for kind in others}
    notes: dict[str, Any] = {"method": "affine Avg-2 map fitted per (bundle_id, prompt_hash)"}
    fits: dict[str, str] = {}
    if not names:
        notes["reason"] = "no member scores logged"
        return out, notes
    m = np.column_stack([members[k] for k in names])
    for g in dict.fromkeys(group.tolist()):
        in_g = group == g
        rows = in_g & usable & np.all(np.isfinite(m), axis=1)
        x = np.column_stack([m[rows], np.ones(int(rows.sum()))])
        y = fused[rows]
        if rows.sum() < len(names) + 2 or np.linalg.matrix_rank(x) < len(names) + 1:
            fits[str(g)] = "not identified (too few scored decisions or collinear members)"
            continue
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        resid = float(np.max(np.abs(x @ coef - y)))
        scale = max(float(np.max(np.abs(y))), 1.0)
        if resid > _EXACT_RTOL * scale:
            fits[str(g)] = f"not exact (max residual {resid:.3g}); left NaN"
            continue
        fits[str(g)] = "exact"
        for kind, per_member in others.items():
            if not all(k in per_member for k in names):
                continue
            mk = np.column_stack([per_member[k][in_g] for k in names])
            out[kind][in_g] = mk @ coef[:-1] + coef[-1]
    notes["fits"] = fits
    return out, notes


def log_cases(log_path: str | Path, *, labels: str | Path | None = None) -> LogCases:
    """Read a decision log into a :class:`LogCases` (table + provenance); see the module doc."""
    from spotstop.guard._errors import GuardError
    from spotstop.guard._log import DecisionLog

    path = Path(log_path)
    if not path.is_file():
        raise DataError(f"decision log {str(path)!r} does not exist; pass the log's SQLite file.")
    try:
        with DecisionLog(path) as log:
            arr = log.to_arrays()
            sha_of = {r.decision_id: r.image_sha256 for r in log.records()}
    except GuardError as exc:
        raise DataError(f"cannot read the decision log {str(path)!r}: {exc}") from exc
    n = arr.n
    if n == 0:
        raise DataError(f"decision log {str(path)!r} holds no decisions.")
    decision_id = np.asarray(arr.decision_id, dtype=object)
    sha = np.array([sha_of.get(d) or "" for d in decision_id], dtype=object)
    label = np.array(arr.label, dtype=np.int8, copy=True)
    contrast = np.array([_cell(c) for c in arr.contrast_id], dtype=object)
    situation = np.array([_cell(s) for s in arr.situation_id], dtype=object)
    n_from_file = 0
    if labels is not None:
        try:
            n_from_file = apply_labels_file(
                Path(labels), decision_id, sha, label, contrast, situation
            )
        except LabelsFileError as exc:
            raise DataError(str(exc)) from exc

    fused = np.asarray(arr.fused, dtype=np.float64)
    fail = np.asarray(arr.fail_closed, dtype=bool)
    unlabelled = ~fail & (label < 0)
    nonfinite = ~fail & ~unlabelled & ~np.isfinite(fused)
    keep = ~(fail | unlabelled | nonfinite)
    dropped = {
        "fail_closed": int(fail.sum()),
        "fail_closed_labelled": int((fail & (label >= 0)).sum()),
        "unlabelled": int(unlabelled.sum()),
        "nonfinite_score": int(nonfinite.sum()),
    }
    if not keep.any():
        raise DataError(
            f"decision log {str(path)!r}: no decision is labelled, scored and not fail-closed "
            f"({n} decisions; dropped {dropped}). Attach labels with --labels FILE or "
            "DecisionLog.set_labels."
        )

    group = np.array(
        [f"{b}|{p}" for b, p in zip(arr.bundle_id, arr.prompt_hash, strict=True)], dtype=object
    )
    scored = ~fail & np.isfinite(fused)
    fused_others, gray_notes = _fused_scale(
        fused,
        arr.member_scores,
        {"score_gray": arr.member_scores_gray, "score_text": arr.member_scores_text},
        group,
        scored,
    )
    extra: dict[str, Any] = {}
    for kind, values in fused_others.items():
        v = values[keep]
        extra[kind] = v if np.isfinite(v).any() else None
        gray_notes[f"{kind}_n"] = int(np.isfinite(v).sum())
    fmt = np.array([_cell(f) for f in arr.image_format[keep]], dtype=object)
    table = CaseTable(
        case_id=decision_id[keep],
        label=label[keep],
        score=fused[keep],
        contrast_id=contrast[keep],
        situation_id=situation[keep],
        member_scores={k: np.asarray(v)[keep] for k, v in arr.member_scores.items()},
        width=np.asarray(arr.width)[keep],
        height=np.asarray(arr.height)[keep],
        n_bytes=np.asarray(arr.n_bytes)[keep],
        format=fmt if any(fmt) else None,
        request=np.asarray(arr.request, dtype=object)[keep],
        **extra,
    )
    thr = np.asarray(arr.threshold, dtype=np.float64)[keep]
    thr = thr[np.isfinite(thr)]
    provenance: dict[str, Any] = {
        "log": str(path),
        "labels": str(labels) if labels is not None else "log labels table",
        "bundle_ids": sorted({str(b) for b in arr.bundle_id[keep]}),
        "prompt_hashes": sorted({str(p) for p in arr.prompt_hash[keep]}),
        "policies": sorted({str(p) for p in arr.policy[keep]}),
        "time_range": _time_range(np.asarray(arr.time)[keep]),
        "time_range_log": _time_range(np.asarray(arr.time)),
        "n_decisions": n,
        "n_cases": int(keep.sum()),
        "n_labelled_from_file": n_from_file,
        "dropped": dropped,
        "thresholds": {
            "n": int(thr.size),
            "median": float(np.median(thr)) if thr.size else None,
            "min": float(thr.min()) if thr.size else None,
            "max": float(thr.max()) if thr.size else None,
        },
        "gray_text": gray_notes,
    }
    return LogCases(table=table, provenance=provenance)


def case_table_from_log(log_path: str | Path, *, labels: str | Path | None = None) -> CaseTable:
    """The :class:`CaseTable` of a decision log's labelled, scored, not fail-closed decisions.

    ``labels``: optional CSV/JSONL file overriding the log's labels table (see the module
    docstring).  Use :func:`log_cases` for the provenance (drop counts, bundles, time range).
    """
    return log_cases(log_path, labels=labels).table
