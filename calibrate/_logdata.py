"""The decisions a recalibration learns from: one bundle's scored decisions in a time window.

:func:`read_calibration_log` reads a decision log (``spotstop.guard.DecisionLog``) and labels
(the log's labels table, overridden by a CSV/JSONL labels file) through the log's one reader,
:func:`spotstop.guard.read_reviewed` (the card's too), into a :class:`CalibrationLog`: the window
of one bundle that a fit uses.

Which decisions
    Decisions with ``since ≤ time < until`` (times as UTC), live and archived. Only decisions
    of the given bundle id AND prompt hash are kept (member scores of another bundle or
    prompt are on another scale); the others are counted in ``dropped["other_bundle"]``. Of
    the kept ones, the *usable* decisions are those that count by the log's one rule,
    :func:`spotstop.guard.decisions_that_count` with the fusion members' scene scores
    (``needs=members``, no label needed): not fail-closed, and every member of the fusion
    with a finite scene score. The others are counted (``fail_closed``; ``member_not_run``:
    a member the guard did not run on the scene, as a ``cascade`` policy skips its second
    member far from the cut (``members_run``, log schema 3); ``nonfinite_member_score``: any
    other missing score) and never enter a fit. Labels play no part in usability: frozen
    statistics and situation state use usable decisions whatever their label.
    ``member_not_run`` is only listed when some decision has it.

Answers the log does not say yet
    Fail-closed amendments waiting in the log's journal or dead letter are applied first (such
    a decision counts as ``fail_closed``); decisions answered that the log lacks are counted
    in ``pending`` and said by :meth:`~spotstop.calibrate.Recalibrator.summary` and
    ``spotstop policy diff --log``. ``pending`` counts this bundle's decisions alone, selected
    as the decisions are (:func:`spotstop.guard.pending_of_bundle`, the card's rule); what
    names no bundle (amended ids in no row, unreadable lines) is kept.

Labels file
    Applied to the whole log before the time window is cut, so rows for decisions outside
    the window are not errors. See :mod:`spotstop.guard._labels` for its columns.

Before the window
    With ``since``, the same bundle's decisions before it (``time < since``) come along as
    ``earlier``: a :class:`CalibrationLog` of the window ``[start, since)``, read in the same
    pass by the same rules. A fit never reads them; a replay of a stateful policy
    (``calibrate.predict_effect``) runs them first, so that its state at ``since`` holds what
    the guard's did.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard import BundleShare, GuardError, PendingAnswers
from spotstop.guard.validate import is_real

__all__ = ["CalibrationError", "CalibrationLog", "parse_time", "read_calibration_log"]


class CalibrationError(GuardError, ValueError):
    """The log or labels cannot support the requested fit; the message says what is missing."""


@dataclass(frozen=True, eq=False)
class CalibrationLog:
    """One bundle's decisions in a time window, aligned arrays in log (time) order.

    decision_id, time, situation_id ('' for none; a labels file's regrouping where it gives
    one), logged_situation_id (the guard's, as logged: what replays and state seeds read),
    contrast_id ('' for none), label (int8:
    1 unsafe, 0 safe, -1 unlabelled), fused_logged (the fused score as logged: made with
    the fusion active at the time), member_scores (fusion member -> raw scene scores),
    policy_score (what the policy compared, as logged: NaN where the scene never entered the
    policy, :func:`~spotstop.guard.policies.entered_scores`'s test),
    usable (bool: not fail-closed, all member scores finite), batch_id (the guard call each
    decision came from; None for schema-1 rows), member_text (request-only scores per member,
    NaN where that pass did not run; None when it never ran), policy_version (the version id
    of the policy that decided; None for schema-1 rows), members_run (fusion member -> int8:
    1 the guard ran it on the scene, 0 not, -1 not known: rows before log schema 3).
    bundle_id, prompt_hash, members: what the decisions were filtered to.
    log, labels: sources; since/until: the window asked for (ISO-8601 or None);
    n_decisions: decisions of any bundle in the window; dropped: counts per reason;
    other_bundles: the window's decisions of other bundles, per bundle; pending: what the log does not say yet (below).
    earlier: with ``since``, this bundle's decisions before it, as the window ``[start,
    since)`` (None without ``since``): what primes a stateful policy's replay, never a fit.
    """

    decision_id: np.ndarray
    time: np.ndarray
    situation_id: np.ndarray
    logged_situation_id: np.ndarray
    contrast_id: np.ndarray
    label: np.ndarray
    fused_logged: np.ndarray
    member_scores: dict[str, np.ndarray]
    policy_score: np.ndarray
    usable: np.ndarray
    batch_id: np.ndarray
    member_text: dict[str, np.ndarray] | None
    policy_version: np.ndarray
    members_run: dict[str, np.ndarray]
    bundle_id: str
    prompt_hash: str
    members: tuple[str, ...]
    log: str
    labels: str | None
    since: str | None
    until: str | None
    n_decisions: int
    dropped: dict[str, int] = field(default_factory=dict)
    earlier: CalibrationLog | None = None
    other_bundles: tuple[BundleShare, ...] = ()
    """The window's decisions of other bundles (or prompts), left out (``dropped["other_bundle"]``
    in all), per bundle: what the log holds instead when this bundle has too few."""
    pending: PendingAnswers = field(default_factory=PendingAnswers)
    """What the robot was answered that the log does not say yet, of this bundle's decisions
    (its journal and dead letter, :func:`spotstop.guard.read_reviewed`, selected by
    :func:`spotstop.guard.pending_of_bundle`): amendments applied (such a decision is
    ``fail_closed``), decisions the log lacks counted. Not cut to the time window (as the
    card's)."""

    @property
    def n(self) -> int:
        """Decisions of this bundle and prompt in the window (usable or not)."""
        return int(self.decision_id.size)

    def counts(self) -> dict[str, int]:
        """Usable decisions per class: ``unsafe``, ``safe``, ``unlabelled``, ``usable``."""
        u = self.usable
        return {
            "usable": int(u.sum()),
            "unsafe": int((u & (self.label == 1)).sum()),
            "safe": int((u & (self.label == 0)).sum()),
            "unlabelled": int((u & (self.label < 0)).sum()),
        }

    def time_range(self) -> list[str] | None:
        """ISO-8601 UTC of the first and last usable decision, or None."""
        t = self.time[self.usable]
        if t.size == 0:
            return None
        return [iso_time(float(t.min())), iso_time(float(t.max()))]

    def __repr__(self) -> str:
        return f"CalibrationLog(bundle={self.bundle_id}, n={self.n}, {self.counts()}, dropped={self.dropped})"


def iso_time(t: float) -> str:
    """Seconds since the epoch as ISO-8601 UTC (the form the provenance records times in)."""
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).isoformat()


def parse_time(value: str | float | _dt.datetime | None, name: str) -> float | None:
    """A window end as seconds since the epoch: ISO date/time (naive = UTC), number, or None."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        v = value if value.tzinfo else value.replace(tzinfo=_dt.UTC)
        return v.timestamp()
    if is_real(value):
        if not math.isfinite(value):
            raise CalibrationError(f"{name} must be a finite time; got {value!r}.")
        return float(value)
    if isinstance(value, str):
        try:
            d = _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise CalibrationError(
                f"{name} must be an ISO-8601 date or time such as 2026-05-01 or "
                f"2026-05-01T12:00:00+00:00 (no offset = UTC); got {value!r}."
            ) from None
        return parse_time(d, name)
    raise CalibrationError(f"{name} must be an ISO-8601 string or a number; got {value!r}.")


def read_calibration_log(
    log_path: str | Path,
    *,
    bundle_id: str,
    prompt_hash: str,
    members: Sequence[str],
    labels: str | Path | None = None,
    since: str | float | _dt.datetime | None = None,
    until: str | float | _dt.datetime | None = None,
    journal: str | Path | None = None,
) -> CalibrationLog:
    """Read one bundle's decisions in ``[since, until)`` with labels; see the module doc.
    ``journal``: the guard's journal when not the log's default one."""
    from spotstop.guard import (
        LabelsFileError,
        bundles_of,
        decisions_that_count,
        of_bundle,
        pending_of_bundle,
        read_reviewed,
    )

    path = Path(log_path)
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    if t0 is not None and t1 is not None and t1 <= t0:
        raise CalibrationError(f"until ({until}) must be later than since ({since}).")
    if not members:
        raise CalibrationError("members must name at least one fusion member.")
    if not path.is_file():
        raise CalibrationError(
            f"decision log {str(path)!r} does not exist; pass the guard's SQLite log file "
            "(by default <bundle>/decisions.sqlite)."
        )
    try:
        # the log's one reader (the card's too)
        reviewed = read_reviewed(path, labels, journal=journal)
    except LabelsFileError as e:
        raise CalibrationError(f"labels file: {e}") from e
    arr = reviewed.arrays
    decision_id = np.asarray(arr.decision_id, dtype=object)
    label, contrast, situation = arr.label, arr.contrast_id, arr.situation_id
    t = np.asarray(arr.time, dtype=np.float64)
    same = of_bundle(arr, bundle_id, prompt_hash)  # the readers' one selection by bundle
    missing = [m for m in members if m not in arr.member_scores]
    counted = decisions_that_count(arr, needs=tuple(members))  # the log's one rule
    with_text = any(m in arr.member_scores_text for m in members)
    # what the log does not say yet of this bundle's decisions (the card's selection)
    pending = pending_of_bundle(reviewed.pending, bundle_id, prompt_hash)

    def window(
        lo: float | None, hi: float | None, earlier: CalibrationLog | None
    ) -> CalibrationLog:
        """This bundle's decisions with ``lo <= time < hi`` (None: open)."""
        in_window = np.ones(t.size, dtype=bool)
        if lo is not None:
            in_window &= t >= lo
        if hi is not None:
            in_window &= t < hi
        keep = in_window & same
        scores: dict[str, np.ndarray] = {}
        for m in members:
            col = arr.member_scores.get(m)
            scores[m] = (np.full(t.size, np.nan) if col is None else np.asarray(col, float))[keep]
        text: dict[str, np.ndarray] | None = None
        if with_text:
            text = {
                m: np.asarray(arr.member_scores_text.get(m, np.full(t.size, np.nan)), float)[keep]
                for m in members
            }
        fail, unscored = counted.fail_closed[keep], counted.unscored[keep]
        not_run = counted.member_not_run[keep]
        dropped = {
            "other_bundle": int((in_window & ~same).sum()),
            "fail_closed": int(fail.sum()),
            "nonfinite_member_score": int((unscored & ~not_run).sum()),
        }
        if not_run.any():
            dropped["member_not_run"] = int(not_run.sum())
        if missing and keep.any():
            dropped["members_missing_from_log"] = len(missing)
        return CalibrationLog(
            decision_id=decision_id[keep],
            time=t[keep],
            situation_id=situation[keep],
            logged_situation_id=arr.logged_situation_id[keep],
            contrast_id=contrast[keep],
            label=label[keep],
            fused_logged=np.asarray(arr.fused, dtype=np.float64)[keep],
            member_scores=scores,
            policy_score=np.asarray(arr.policy_score, dtype=np.float64)[keep],
            usable=counted.mask[keep],
            batch_id=np.asarray(arr.batch_id, dtype=object)[keep],
            member_text=text,
            policy_version=np.asarray(arr.policy_version, dtype=object)[keep],
            members_run={
                m: np.asarray(arr.members_run.get(m, np.full(t.size, -1)), dtype=np.int8)[keep]
                for m in members
            },
            bundle_id=bundle_id,
            prompt_hash=prompt_hash,
            members=tuple(members),
            log=str(path),
            labels=None if labels is None else str(labels),
            since=None if lo is None else iso_time(lo),
            until=None if hi is None else iso_time(hi),
            n_decisions=int(in_window.sum()),
            dropped=dropped,
            earlier=earlier,
            other_bundles=bundles_of(arr, in_window & ~same),
            pending=pending,
        )

    return window(t0, t1, None if t0 is None else window(None, t0, None))


def read_log_for_bundle(
    log_path: str | Path,
    bundle: Any,
    **kwargs: Any,
) -> CalibrationLog:
    """:func:`read_calibration_log` keyed by a loaded ``spotstop.guard._bundle.Bundle``."""
    return read_calibration_log(
        log_path,
        bundle_id=bundle.bundle_id,
        prompt_hash=bundle.prompt_hash,
        members=[m.name for m in bundle.members],
        **kwargs,
    )
