"""The decision log as the offline rooms read it: one reader, one rule for which decisions count.

:func:`read_reviewed` is the one reader of a log for ``calibrate``, the card and the cue shift:
the live rows and the registered Parquet archives as one log, in log order
(:meth:`~spotstop.guard.DecisionLog.to_arrays`), or a fleet's logs and archives already read
as one :class:`~spotstop.guard.LogArrays`; with the reviewers' labels (a labels file over the
log's labels table, :func:`~spotstop.guard._labels.apply_labels_file`).

:func:`decisions_that_count` is the one rule for which of those decisions enter a fit, a
statistic or a grade; ``calibrate`` (its fits) and ``diagnostics`` (the card's cases, what the
guard delivered, the checks) call it, each saying only which score it uses and whether it needs
a label.

:func:`bundles_of` and :func:`of_bundle` say which bundle (bundle id and prompt hash) made
which decisions: the scores of two bundles (other members, precisions or prompts) are not on
one scale, so a reader pools one bundle's decisions; ``calibrate`` keeps its bundle's, the
card refuses a log of several unless told which.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from spotstop.guard._labels import _cell, apply_labels_file
from spotstop.guard._log_pending import PendingAnswers, PendingChanges, read_pending
from spotstop.guard._log_read import LogArrays
from spotstop.guard._log_schema import LogError, PolicyRow

if TYPE_CHECKING:
    from spotstop.guard._log import DecisionLog

__all__ = [
    "BundleShare",
    "CountedDecisions",
    "Reviewed",
    "bundles_of",
    "decisions_that_count",
    "of_bundle",
    "pending_of_bundle",
    "read_reviewed",
]


@dataclass(frozen=True, eq=False)
class Reviewed:
    """A log's decisions as arrays with the reviewers' labels (see :func:`read_reviewed`).

    arrays: the log's :class:`~spotstop.guard._log_read.LogArrays` with ``label``,
        ``contrast_id`` and ``situation_id`` as the reviewers have them (the labels file over
        the labels table); those ids, ``image_sha256`` and ``image_format`` as cleaned
        strings (``""`` for none), so no reader cleans them again.
    n_from_file: decisions the labels file labelled (0 without a file).
    labels: the labels file's path, or ``"log labels table"``.
    policies: the log's ``policies`` table: every policy that decided something, by version
        id ({} when arrays were given).
    archived: ``{"files": …, "rows": …}`` of the log's Parquet archives read with its live
        rows ({} when it has none, or when arrays were given).
    robot_id: the robot the log says it belongs to (None when it does not say, or when
        arrays were given).
    pending: what the robot was answered that the log does not say yet (amendments and
        rows waiting in the journal or set aside in the dead letter), already applied to
        ``arrays`` where the log holds the decision (:mod:`~spotstop.guard._log_pending`);
        empty when arrays were given.
    """

    arrays: LogArrays
    n_from_file: int
    labels: str
    policies: Mapping[str, PolicyRow] = field(default_factory=dict)
    archived: Mapping[str, int] = field(default_factory=dict)
    robot_id: str | None = None
    pending: PendingAnswers = field(default_factory=PendingAnswers)

    def counting(
        self, *, needs: str | Sequence[str] | None = "fused", labelled: bool = False
    ) -> CountedDecisions:
        """:func:`decisions_that_count` on these decisions."""
        return decisions_that_count(self.arrays, needs=needs, labelled=labelled)


def read_reviewed(
    log: DecisionLog | LogArrays | str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    journal: str | os.PathLike[str] | None = None,
) -> Reviewed:
    """The log's decisions with the reviewers' labels: the one reader of a log for the card,
    ``calibrate`` and the cue shift.

    ``log``: the path of a decision log's SQLite file (opened, read and closed here), an open
    :class:`~spotstop.guard.DecisionLog` (its live rows and archives, as one log, with its
    policies), or decisions already read as arrays (a fleet's logs and archives, with their
    labels tables). ``labels``: a labels file over the log's labels table.

    The decisions are as the robot received them: fail-closed amendments that wait in the
    log's journal (``journal``, else its default one) or its dead letter are applied, and
    what the log lacks is counted (``Reviewed.pending``; both places are read, never
    written: :mod:`~spotstop.guard._log_pending`).

    Raises :class:`~spotstop.guard.LogError` for a path that is not a file, and
    :class:`~spotstop.guard.LabelsFileError` for a bad labels file.
    """
    from spotstop.guard._log import DecisionLog, LogChangedError

    read: dict[str, Any] = {}
    if isinstance(log, LogArrays):
        arr = log
    elif isinstance(log, DecisionLog):
        # first: what the guard imports meanwhile is then in the log (applying it again
        # changes nothing)
        pending = log.pending_changes() if journal is None else read_pending(log.path, journal)
        arr, read = _read_open(log, pending)
    else:
        path = Path(log)
        if not path.is_file():
            raise LogError(
                f"decision log {str(path)!r} does not exist; pass the guard's SQLite log file "
                "(by default <bundle>/decisions.sqlite)."
            )
        pending = read_pending(path, journal)  # first, as above
        try:
            with DecisionLog(path, read_only=True) as opened:
                arr, read = _read_open(opened, pending)
        except LogChangedError:
            # a guard wrote it meanwhile: read it again, with the guard's locks while a guard
            # holds it, else through a copy no guard can change while it is read
            with DecisionLog(path, read_only=True) as opened:
                opened.read_a_still_copy()
                arr, read = _read_open(opened, pending)
    ids = np.asarray(arr.decision_id, dtype=object)
    sha = np.array([_cell(s) for s in arr.image_sha256], dtype=object)
    label = np.array(arr.label, dtype=np.int8, copy=True)
    contrast = np.array([_cell(c) for c in arr.contrast_id], dtype=object)
    situation = np.array([_cell(s) for s in arr.situation_id], dtype=object)
    n = 0
    if labels is not None:
        n = apply_labels_file(Path(labels), ids, sha, label, contrast, situation)
    fmt = np.array([_cell(f) for f in arr.image_format], dtype=object)
    reviewed = dataclasses.replace(
        arr,
        label=label,
        contrast_id=contrast,
        situation_id=situation,
        image_sha256=sha,
        image_format=fmt,
    )
    source = "log labels table" if labels is None else str(labels)
    return Reviewed(reviewed, n, source, **read)


def _read_open(log: DecisionLog, pending: PendingChanges) -> tuple[LogArrays, dict[str, Any]]:
    """The arrays of an open log as the robot received them (``pending`` applied), then its
    policies, archives, robot id and what ``pending`` did. The archives are those the arrays
    were read with: when a retention pass registered one meanwhile (the guard's, beside the
    reader), or a late amendment replaced one (whose old file may be gone before it was
    read), the log is read again."""
    while True:
        before = log.archives()
        try:
            arr, amended = log.arrays_as_answered(None, None, None, pending)
        except LogError:
            if log.archives() == before:  # not a registration that changed: a real fault
                raise
            continue
        infos = log.archives()
        if infos == before:
            break
    archived = {"files": len(infos), "rows": sum(a.n_rows for a in infos)} if infos else {}
    return arr, {
        "policies": log.policies(),
        "archived": archived,
        "robot_id": log.robot_id,
        "pending": pending.answers(
            zip(
                arr.decision_id.tolist(),
                arr.bundle_id.tolist(),
                arr.prompt_hash.tolist(),
                strict=True,
            ),
            amended,
        ),
    }


@dataclass(frozen=True, eq=False, repr=False)
class CountedDecisions:
    """Which decisions count, and why each other one does not (see :func:`decisions_that_count`).

    Every array has one bool per decision, in log order. A decision that does not count is
    under exactly one reason, the first that applies in the order below.

    mask: the decisions that count.
    fail_closed: the guard failed closed on it (whatever its label or score).
    unlabelled: it did not fail closed and has no reviewer label (all False unless
        ``labelled``).
    unscored: it did not fail closed (and is labelled, when ``labelled``) but lacks the
        score the reader uses (missing or not finite).
    member_not_run: the part of ``unscored`` where the guard did not run a needed member on
        the scene (a cascade's second member far from the cut, ``members_run``, log schema 3);
        all False unless ``needs`` names members.
    needs, labelled: what was asked.
    """

    mask: NDArray[np.bool_]
    fail_closed: NDArray[np.bool_]
    unlabelled: NDArray[np.bool_]
    unscored: NDArray[np.bool_]
    member_not_run: NDArray[np.bool_]
    needs: str | tuple[str, ...] | None
    labelled: bool

    @property
    def n(self) -> int:
        """Decisions that count."""
        return int(np.count_nonzero(self.mask))

    def __repr__(self) -> str:
        return (
            f"CountedDecisions(n={self.n} of {self.mask.size}, needs={self.needs!r}, "
            f"labelled={self.labelled}, fail_closed={int(self.fail_closed.sum())}, "
            f"unlabelled={int(self.unlabelled.sum())}, unscored={int(self.unscored.sum())})"
        )


_NEEDS_FUSED = "fused"


def decisions_that_count(
    arrays: LogArrays,
    *,
    needs: str | Sequence[str] | None = "fused",
    labelled: bool = False,
) -> CountedDecisions:
    """The decisions of a log that count, with the reason each other one does not.

    The rule, checked in this order (the first test a decision fails is its reason):

    1. **It did not fail closed.** A fail-closed UNSAFE (a bad image or request, a member that
       raised or gave NaN, the deadline, a fusion or policy fault, a failed log write, and a
       SAFE whose write ended after the deadline, which the log amends in place to a
       fail-closed UNSAFE) is the guard refusing to score, not an answer from a score: it
       enters no fit, statistic or grade, labelled or not.
    2. **It has a reviewer label** (only when ``labelled``): the label after the labels file
       (:func:`read_reviewed`), 1 unsafe or 0 safe.
    3. **It has the score the reader uses, finite**: ``needs="fused"`` the logged fused score
       S (the card's statistics); a sequence of member names, each member's logged scene
       score (a refit, which fuses the raw scores again: a member the guard did not run on
       the scene, as a cascade skips its second member far from the cut, is missing there);
       ``None``, no score (grading the guard's logged answer).

    Archived decisions count like live ones: :func:`read_reviewed` gives both as one log.
    Which bundle, time window or policy version a reader looks at is its own selection, made
    apart from this rule. The rule is about the guard's scores and answers: a share of the
    deployment's *scenes* (the text flags logged at decision time, the cue shift's frames)
    counts every scene the guard saw, fail-closed ones too (a scene refused for its text is
    still a scene of the deployment).

    ``arrays``: the decisions as :func:`read_reviewed` gives them (``Reviewed.arrays``), or
    a subset of them.
    """
    if not isinstance(arrays, LogArrays):
        raise TypeError(
            "decisions_that_count needs the log's arrays (read_reviewed(log).arrays); got "
            f"{type(arrays).__name__}."
        )
    n = arrays.n
    fail = np.asarray(arrays.fail_closed, dtype=bool).reshape(n)
    no_label = ~fail & (np.asarray(arrays.label) < 0) if labelled else np.zeros(n, dtype=bool)
    ahead = ~fail & ~no_label
    not_run = np.zeros(n, dtype=bool)
    members: tuple[str, ...] = ()
    if needs is None:
        scored = np.ones(n, dtype=bool)
    elif isinstance(needs, str):
        if needs != _NEEDS_FUSED:
            raise ValueError(
                f"decisions_that_count: needs must be 'fused', a sequence of member names or "
                f"None; got {needs!r}. Pass needs=('member_a', ...) for member scores."
            )
        scored = np.isfinite(np.asarray(arrays.fused, dtype=np.float64))
    else:
        members = tuple(needs)
        if not members or not all(isinstance(m, str) and m for m in members):
            raise ValueError(
                f"decisions_that_count: needs must name at least one member; got {needs!r}."
            )
        scored = np.ones(n, dtype=bool)
        for m in members:
            col = arrays.member_scores.get(m)
            scored &= False if col is None else np.isfinite(np.asarray(col, dtype=np.float64))
            ran = arrays.members_run.get(m)
            if ran is not None:
                not_run |= np.asarray(ran) == 0
    unscored = ahead & ~scored
    return CountedDecisions(
        mask=ahead & scored,
        fail_closed=fail,
        unlabelled=no_label,
        unscored=unscored,
        member_not_run=unscored & not_run,
        needs=members or (None if needs is None else _NEEDS_FUSED),
        labelled=labelled,
    )


@dataclass(frozen=True)
class BundleShare:
    """The decisions one bundle made in a log (see :func:`bundles_of`): its ``bundle_id`` and
    ``prompt_hash`` as logged, and ``n``, how many."""

    bundle_id: str
    prompt_hash: str
    n: int

    def __str__(self) -> str:
        return f"bundle {self.bundle_id} (prompt {self.prompt_hash}): {self.n} decision(s)"


def _made_by(b: object, p: object, bundle_id: str, prompt_hash: str | None) -> bool:
    """Whether a decision logged with bundle ``b`` and prompt ``p`` is of bundle ``bundle_id``
    (and prompt ``prompt_hash``, when given)."""
    return b == bundle_id and (prompt_hash is None or p == prompt_hash)


def of_bundle(
    arrays: LogArrays, bundle_id: str, prompt_hash: str | None = None
) -> NDArray[np.bool_]:
    """Which decisions (one bool each, in log order) were made by bundle ``bundle_id`` (and
    prompt ``prompt_hash``, when given): the one selection by bundle of every offline reader."""
    pairs = zip(arrays.bundle_id, arrays.prompt_hash, strict=True)
    return np.fromiter(
        (_made_by(b, p, bundle_id, prompt_hash) for b, p in pairs), dtype=bool, count=arrays.n
    )


def pending_of_bundle(
    pending: PendingAnswers, bundle_id: str, prompt_hash: str | None = None
) -> PendingAnswers:
    """What ``pending`` says of the decisions of bundle ``bundle_id`` (and prompt
    ``prompt_hash``) alone, selected as :func:`of_bundle` selects them: its decisions read as
    amended and those answered that the log lacks (``PendingAnswers.decisions``). What names
    no bundle (amended ids in no row of the log, unreadable lines, places not read) is kept:
    it may be this bundle's."""
    mine = tuple(d for d in pending.decisions if _made_by(d[2], d[3], bundle_id, prompt_hash))

    def n(where: str) -> int:
        return sum(1 for d in mine if d[1] == where)

    return dataclasses.replace(
        pending,
        amended=n("amended"),
        missing_journal=n("journal"),
        missing_dead_letter=n("dead_letter"),
        decisions=mine,
    )


def bundles_of(arrays: LogArrays, mask: NDArray[np.bool_] | None = None) -> tuple[BundleShare, ...]:
    """The bundles (bundle id and prompt hash) that made the decisions (those of ``mask``,
    when given), each with its count, in the order of their first decision.

    Member scores of two bundles are on two scales (other members, precisions or prompts),
    and so is every fused score made from them: an AUROC, a cut or a conformal rank over
    both is a statement about neither. More than one here means a reader must pick one
    (:func:`of_bundle`)."""
    rows = np.ones(arrays.n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    counts: dict[tuple[str, str], int] = {}
    for b, p, keep in zip(arrays.bundle_id, arrays.prompt_hash, rows, strict=True):
        if keep:
            key = (str(b), str(p))
            counts[key] = counts.get(key, 0) + 1
    return tuple(BundleShare(b, p, n) for (b, p), n in counts.items())
