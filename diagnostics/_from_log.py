"""The guard's decision log as the card reads it (``spotstop card LOG``).

:func:`read_log` opens a :class:`spotstop.guard.DecisionLog` (schema 2; schema-1 logs are
migrated on open) and returns :class:`LogData`: its arrays, the reviewer labels (after an
optional labels file), and the policies that decided, loaded with
:func:`spotstop.guard.policies.load_policy`.  :func:`log_cases` builds the card's
:class:`~spotstop.diagnostics.CaseTable` from it; :func:`case_table_from_log` returns the
table only.

Rows
    One case per decision; ``case_id`` is the ``decision_id``.  A decision enters the table
    when it counts by the log's one rule, :func:`spotstop.guard.decisions_that_count` with
    the fused score and a label (``calibrate`` calls the same rule): it did not fail closed,
    has a reviewer label and has a finite fused score.  Archived decisions count like live
    ones.  The others are dropped and counted in ``provenance["dropped"]``, each under the
    *first* reason that applies, in this order: ``fail_closed`` (a fail-closed UNSAFE is not
    a score-based answer, so it never enters the statistics, labelled or not),
    ``unlabelled``, ``nonfinite_score``.  (What the guard delivered is computed on all
    labelled decisions that did not fail closed, NaN scores included: see ``_delivered``.)

Scores
    ``score`` is the logged fused score S: S under the deciding policy's frozen reference
    fusion (``fusion_key``); ``member_scores`` are the logged per-member scene scores (NaN
    kept).  Decisions of policies with different fusions are on different scales; the
    provenance lists the fusion keys and the card warns when there are several.

Gray and request-only scores
    Logged per member.  Each decision's are fused with ITS deciding policy's fusion (the
    ``policies`` table, keyed by ``policy_version``; the row's ``fusion_key`` must match),
    exactly as the guard fuses the scene score: ``score_gray`` and ``score_text`` are the
    fused score the guard would have given the gray image / the request alone.  Decisions
    of an unknown policy (schema-1 rows, or a version without a stored document) stay NaN,
    and ``provenance["gray_text"]`` says so per version.  A column that is NaN for every
    case is left out (None).

Answers the log does not say yet
    Fail-closed amendments waiting in the log's journal or dead letter are applied (the
    decision reads as the fail-closed UNSAFE the robot received, and is dropped as
    ``fail_closed``); decisions answered that the log lacks are counted.  ``provenance["pending"]``
    holds the counts and the card warns (:class:`spotstop.guard.PendingAnswers`).

One bundle
    A card reads one bundle's decisions (bundle id and prompt hash): the scores of two bundles
    (other members, precisions or prompts) are on two scales, and an AUROC, a cut or a
    conformal figure over both describes neither. A log of several is refused with each
    bundle's count unless ``bundle_id`` (``--bundle-id``) picks one (:func:`one_bundle`);
    the others are then left out of everything (``provenance["dropped"]["other_bundle"]``,
    ``provenance["bundle_filter"]``). Policy versions (and their fusions) change within one
    bundle's log: they are read together, the card warns when the fusions differ.

Labels
    From the log's ``labels`` table, or from a ``labels`` file (CSV or JSONL; see
    :func:`spotstop.guard._labels.apply_labels_file`) whose rows override the table's,
    keyed by ``decision_id`` or ``image_sha256``; optional ``contrast_id`` and
    ``situation_id`` columns override the log's.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError
from spotstop.guard import (
    CountedDecisions,
    GuardError,
    LabelsFileError,
    LogArrays,
    PendingAnswers,
    PolicyRow,
    Reviewed,
    bundles_of,
    decisions_that_count,
    of_bundle,
    pending_of_bundle,
    read_reviewed,
)
from spotstop.guard.policies import PolicyConfig, load_policy

__all__ = [
    "UNKNOWN_VERSION",
    "DirectCut",
    "LogCases",
    "LogData",
    "case_table_from_log",
    "log_cases",
    "one_bundle",
    "read_log",
    "read_logs",
    "robot_of_path",
]

UNKNOWN_VERSION = "unknown (schema 1)"
"""The version key of decisions that do not say which policy made them."""

#: policy kinds whose threshold on S is one fixed number
_CONSTANT_KINDS = ("frozen", "conformal")


@dataclass(frozen=True, eq=False)
class LogData:
    """A decision log as the card reads it (aligned arrays, one entry per decision, in order).

    arrays: :meth:`DecisionLog.to_arrays`. label: reviewer label after the labels file (1
    unsafe, 0 safe, -1 none). contrast_id / situation_id: str ('' for none), labels-file
    values applied. image_sha256: str ('' for none). version: the deciding policy's version
    id (:data:`UNKNOWN_VERSION` where the row does not say). policies: version id →
    :class:`PolicyConfig` for every stored document that loads; policy_errors: version id →
    why its document did not load. first_time: version id → when the log first saw it.
    """

    path: Path
    arrays: LogArrays
    label: NDArray[np.int8]
    contrast_id: NDArray[np.object_]
    situation_id: NDArray[np.object_]
    image_sha256: NDArray[np.object_]
    version: NDArray[np.object_]
    policies: Mapping[str, PolicyConfig]
    policy_errors: Mapping[str, str]
    first_time: Mapping[str, float]
    labels_source: str
    n_labelled_from_file: int
    archived: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Decisions read from the log's Parquet archives: ``{"files": …, "rows": …}`` ({} none)."""
    robot_id: NDArray[np.object_] | None = None
    """The robot of each decision (a fleet); None: one robot, the log's."""
    sources: tuple[str, ...] = ()
    """The files read (a fleet's logs and stand-alone archives); () for one log."""
    idle_robots: tuple[str, ...] = ()
    """Robots of a fleet whose files hold no decision (their guard logged nothing there)."""
    pending: PendingAnswers = dataclasses.field(default_factory=PendingAnswers)
    """What the robot was answered that the log does not say yet (its journal and dead
    letter): applied to ``arrays`` where the log holds the decision, counted where it lacks it
    (:func:`spotstop.guard.read_reviewed`)."""

    @property
    def n(self) -> int:
        """Number of decisions."""
        return self.arrays.n

    def take(self, rows: NDArray[np.intp]) -> LogData:
        """These decisions only (indices, in the order given): e.g. one period's."""
        return dataclasses.replace(
            self,
            arrays=self.arrays.take(rows),
            label=self.label[rows],
            contrast_id=self.contrast_id[rows],
            situation_id=self.situation_id[rows],
            image_sha256=self.image_sha256[rows],
            version=self.version[rows],
            robot_id=None if self.robot_id is None else self.robot_id[rows],
        )

    @property
    def robots(self) -> list[str]:
        """The robots, in order of first appearance ([] for one log)."""
        return [] if self.robot_id is None else list(dict.fromkeys(self.robot_id.tolist()))

    def by_robot(self, rows: NDArray[np.intp]) -> list[NDArray[np.intp]]:
        """``rows`` (indices, in log order) split by robot, each part in log order: what a
        replay runs on, since each robot's guard kept its own policy state."""
        if self.robot_id is None:
            return [rows]
        robots = self.robot_id[rows]
        return [rows[robots == r] for r in dict.fromkeys(robots.tolist())]

    def group_ids(self) -> tuple[NDArray[np.object_], NDArray[np.object_]]:
        """Contrast and situation ids as the resampling groups use them: within a robot (the
        robot's id in front) when the decisions come from several robots."""
        return self.within_robot(self.contrast_id), self.within_robot(self.situation_id)

    def within_robot(self, ids: NDArray[Any]) -> NDArray[Any]:
        """``ids`` (one per decision; '' or None for none) as ids within a robot: unchanged
        for one robot, else ``"<robot>/<id>"`` (a situation of one robot is not another's)."""
        if len(self.robots) <= 1 or self.robot_id is None:
            return ids
        return np.array(
            [f"{r}/{i}" if i else i for r, i in zip(self.robot_id, ids, strict=True)],
            dtype=object,
        )

    def counting(
        self, *, needs: str | Sequence[str] | None = "fused", labelled: bool = False
    ) -> CountedDecisions:
        """Which decisions count, by the log's one rule
        (:func:`spotstop.guard.decisions_that_count`, the rule ``calibrate`` uses too)."""
        return decisions_that_count(self.arrays, needs=needs, labelled=labelled)

    @property
    def delivered(self) -> NDArray[np.bool_]:
        """Labelled decisions that did not fail closed: where the guard's answer is graded
        (:meth:`counting` with no score needed)."""
        return self.counting(needs=None, labelled=True).mask

    def versions(self) -> list[str]:
        """The version keys in order of first appearance."""
        return list(dict.fromkeys(self.version.tolist()))

    def kind_of(self, version: str) -> str | None:
        """The policy kind of a version (from its document, else the rows' ``policy_kind``)."""
        cfg = self.policies.get(version)
        if cfg is not None:
            return cfg.kind
        kinds = {k for k in self.arrays.policy_kind[self.version == version] if k}
        return next(iter(kinds)) if len(kinds) == 1 else None

    def deployed_version(self, *, kind: str | None = None, loaded_only: bool = True) -> str | None:
        """The version in force: the stored policy (of ``kind``, when given) that made the
        log's last decision (of that kind), in log order — a version activated again after a
        later one is the one in force — else the last stored one (of that kind); None when
        the log stores none. ``loaded_only=False`` counts a stored document that does not load
        too (the card names it as deployed; what needs its settings reads loaded ones only).
        The one rule the card, its batch rule and its recommendation read the deployment by."""
        stored = set(self.policies) if loaded_only else set(self.policies) | set(self.policy_errors)
        decided = [
            v
            for v in dict.fromkeys(reversed(self.version.tolist()))
            if v in stored and (kind is None or self.kind_of(v) == kind)
        ]
        if decided:
            return str(decided[0])
        rest = [v for v in self.policies if kind is None or self.policies[v].kind == kind]
        return rest[-1] if rest else None


def read_log(
    log_path: str | Path, *, labels: str | Path | None = None, journal: str | Path | None = None
) -> LogData:
    """Read a decision log (and an optional labels file) into :class:`LogData`; ``journal``:
    the guard's journal when not the log's default one (:func:`spotstop.guard.read_reviewed`)."""
    path = Path(log_path)
    if not path.is_file():
        raise DataError(f"decision log {str(path)!r} does not exist; pass the log's SQLite file.")
    try:
        # the log's one reader: live rows and archives, its journal and dead letter applied
        reviewed = read_reviewed(path, labels, journal=journal)
    except LabelsFileError as exc:
        raise DataError(str(exc)) from exc
    except GuardError as exc:
        raise DataError(f"cannot read the decision log {str(path)!r}: {exc}") from exc
    robot = reviewed.robot_id or robot_of_path(path)
    robots = np.full(reviewed.arrays.n, robot, dtype=object)
    return _log_data(
        path, reviewed, reviewed.policies, reviewed.archived, robots, pending=reviewed.pending
    )


def robot_of_path(path: Path) -> str:
    """The robot of a log that does not name one: its file name without ``.sqlite``, or its
    folder's name when the file is the default ``decisions.sqlite`` (``fleet/arm-07/decisions.sqlite``
    → ``arm-07``); an archive's is its log's (``…/decisions.sqlite.archive/x.parquet``)."""
    if path.suffix == ".parquet" and path.parent.name.endswith(".archive"):
        path = path.parent.with_name(path.parent.name.removesuffix(".archive"))
    stem = path.name.removesuffix(".sqlite")
    return path.parent.name if stem == "decisions" and path.parent.name else stem


def _log_data(
    path: Path,
    reviewed: Reviewed,
    rows: Mapping[str, PolicyRow],
    archived: Mapping[str, int],
    robot_id: NDArray[np.object_] | None = None,
    sources: tuple[str, ...] = (),
    idle_robots: tuple[str, ...] = (),
    pending: PendingAnswers | None = None,
) -> LogData:
    arr = reviewed.arrays
    if arr.n == 0:
        raise DataError(f"decision log {str(path)!r} holds no decisions.")
    label, contrast, situation = arr.label, arr.contrast_id, arr.situation_id
    policies: dict[str, PolicyConfig] = {}
    errors: dict[str, str] = {}
    # in the order the log's decisions first name them (log order, not the wall clock's:
    # the last is the deployed one); a stored version that decided nothing comes after
    named = list(dict.fromkeys(v for v in arr.policy_version.tolist() if v in rows))
    order = named + sorted(
        (v for v in rows if v not in set(named)), key=lambda v: rows[v].first_time
    )
    for vid in order:
        row = rows[vid]
        try:
            policies[vid] = load_policy(row.document, where=f"policy {vid} in {path.name}")
        except GuardError as exc:
            errors[vid] = str(exc)
    version = np.array(
        [UNKNOWN_VERSION if v is None else str(v) for v in arr.policy_version], dtype=object
    )
    return LogData(
        path=path,
        arrays=arr,
        label=label,
        contrast_id=contrast,
        situation_id=situation,
        image_sha256=arr.image_sha256,  # cleaned by read_reviewed
        version=version,
        policies=policies,
        policy_errors=errors,
        first_time={vid: row.first_time for vid, row in rows.items()},
        labels_source=reviewed.labels,
        n_labelled_from_file=reviewed.n_from_file,
        archived=dict(archived),
        robot_id=robot_id,
        sources=sources,
        idle_robots=idle_robots,
        pending=pending or PendingAnswers(),
    )


def read_logs(
    inputs: str | Path | Sequence[str | Path],
    *,
    labels: str | Path | None = None,
    journal: str | Path | None = None,
) -> LogData:
    """One decision log (a SQLite file) as :func:`read_log` reads it; anything else (several
    files, a folder, a glob, stand-alone archives) as :func:`~spotstop.diagnostics._fleet.read_fleet`."""
    items = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    one = Path(items[0]) if len(items) == 1 else None
    if (
        one is not None
        and not one.is_dir()
        and one.suffix != ".parquet"
        and not any(c in str(one) for c in "*?[")
    ):
        return read_log(one, labels=labels, journal=journal)
    from spotstop.diagnostics._fleet import read_fleet

    return read_fleet(items, labels=labels, journal=journal)


def one_bundle(log: LogData, bundle_id: str | None = None) -> tuple[LogData, dict[str, int]]:
    """The decisions of one bundle: ``log`` itself when all its decisions are of one bundle
    (and ``bundle_id``, when given, is it), else those of ``bundle_id`` (its stored policies
    only), with the decisions left out per other bundle (``"<bundle> (prompt <hash>)"`` →
    count). Raises :class:`DataError` naming each bundle and its count when the log holds
    several and ``bundle_id`` is None, or none of ``bundle_id``."""
    shares = bundles_of(log.arrays)
    listed = "; ".join(str(b) for b in shares)
    where = f"decision log {str(log.path)!r}" if not log.sources else "the fleet's decisions"
    if bundle_id is None:
        if len(shares) <= 1:
            return log, {}
        raise DataError(
            f"{where} holds decisions of {len(shares)} bundles, whose scores are not on one "
            f"scale (other members, precisions or prompts): {listed}. An AUROC, a cut or a "
            "conformal figure over them all would describe none of them: write one card per "
            f"bundle with --bundle-id (bundle_id=), e.g. --bundle-id {shares[0].bundle_id}."
        )
    rows = of_bundle(log.arrays, bundle_id)
    if not rows.any():
        raise DataError(
            f"{where} holds no decision of bundle {bundle_id!r} (--bundle-id); it holds {listed}."
        )
    mine = [b for b in shares if b.bundle_id == bundle_id]
    if len(mine) > 1:
        raise DataError(
            f"{where}: bundle {bundle_id} logged decisions under {len(mine)} prompt hashes "
            f"({'; '.join(str(b) for b in mine)}), but a bundle id names its prompt: the log "
            "was written by hand or by an edited bundle. Its scores are not on one scale; "
            "read each prompt's decisions apart."
        )
    # what the log does not say yet, of this bundle's decisions alone (the same selection)
    pending = pending_of_bundle(log.pending, bundle_id)
    if rows.all():
        return dataclasses.replace(log, pending=pending), {}
    left_out = {f"{b.bundle_id} (prompt {b.prompt_hash})": b.n for b in shares if b not in mine}
    sub = log.take(np.flatnonzero(rows))
    policies = {v: c for v, c in sub.policies.items() if c.bundle_id == bundle_id}
    return dataclasses.replace(sub, policies=policies, pending=pending), left_out


@dataclass(frozen=True)
class LogCases:
    """A :class:`CaseTable` read from a decision log, where it came from, and the log itself.

    ``provenance``: ``log`` (path), ``labels`` (file or ``"log labels table"``),
    ``bundle_ids``, ``prompt_hashes``, ``policy_versions``, ``fusion_keys``, ``time_range``
    (ISO-8601 UTC of the cases kept) and ``time_range_log`` (all decisions), ``n_decisions``,
    ``n_cases``, ``n_labelled_from_file``, ``dropped`` (count per reason; ``other_bundle``
    with a ``bundle_id``), ``bundle_filter`` (with a ``bundle_id``: it and the decisions left
    out per other bundle), ``thresholds``
    (logged thresholds of the cases kept) and ``gray_text`` (how the gray and request-only
    scores were fused).  ``keep``: which decisions are the table's cases.
    """

    table: CaseTable
    provenance: dict[str, Any]
    log: LogData
    keep: NDArray[np.bool_]


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).isoformat()


def _time_range(t: NDArray[np.float64]) -> list[str] | None:
    t = t[np.isfinite(t)]
    return None if t.size == 0 else [_iso(float(t.min())), _iso(float(t.max()))]


def fused_variant(
    log: LogData, per_member: Mapping[str, NDArray[np.float64]]
) -> tuple[NDArray[np.float64], dict[str, str]]:
    """Member scores of a variant (gray image, request only) fused with each decision's
    deciding policy's fusion; NaN where that policy is unknown.  Returns the values and a
    note per version."""
    out = np.full(log.n, np.nan)
    notes: dict[str, str] = {}
    for v in log.versions():
        rows = log.version == v
        cfg = log.policies.get(v)
        if cfg is None:
            notes[v] = "no stored policy document: left NaN"
            continue
        keys = {k for k in log.arrays.fusion_key[rows] if k}
        if keys - {cfg.fusion_key}:
            notes[v] = f"fusion_key {sorted(keys)} differs from the policy's {cfg.fusion_key}: NaN"
            continue
        missing = [m for m in cfg.fusion.members if m not in per_member]
        if missing:
            notes[v] = f"member(s) {missing} not logged for this pass: left NaN"
            continue
        scores = {m: np.asarray(per_member[m])[rows] for m in cfg.fusion.members}
        out[rows] = cfg.fusion.fuse_many(scores, nan_policy="propagate")
        notes[v] = f"fused with the policy's own fusion {cfg.fusion_key}"
    return out, notes


@dataclass(frozen=True)
class DirectCut:
    """The cut of the paper's direct answer for the Spot-Stop fields: its value, a short
    label (the verdict quotes it) and why it is that cut."""

    value: float
    label: str
    note: str


def direct_cut_of(log: LogData, keep: NDArray[np.bool_]) -> DirectCut:
    """The cut of the paper's direct answer for the Spot-Stop fields, and why.

    When every kept decision was decided by a constant cut on S (``frozen`` or ``conformal``,
    no fallback) and they all share one threshold, that threshold: the Spot-Stop fields then
    describe the deployed cut (in the paper's convention ``S > t``, which differs from the
    guard's ``S ≥ t`` on exact ties only).  Otherwise 0 on S: the Avg-2 analogue of a model's
    direct answer (each member's robust z-score is 0 at its reference median), not a cut the
    guard used.
    """
    rules = sorted({str(r) for r in log.arrays.policy[keep]})
    thr = np.unique(np.asarray(log.arrays.threshold, dtype=float)[keep])
    if keep.any() and set(rules) <= set(_CONSTANT_KINDS) and thr.size == 1 and np.isfinite(thr[0]):
        label = f"the deployed {'/'.join(rules)} cut"
        return DirectCut(
            float(thr[0]), label, f"{label}: every case was decided by S ≥ {thr[0]:.6g}"
        )
    return DirectCut(
        0.0,
        "the Avg-2 direct answer",
        "on S, the Avg-2 analogue of a model's direct answer (each member's robust z-score "
        "is 0 at its reference median); no single constant cut decided every case (rules: "
        f"{', '.join(rules) or 'none'}), so this is not a cut the guard used",
    )


def log_cases(
    log_path: str | Path | Sequence[str | Path],
    *,
    labels: str | Path | None = None,
    journal: str | Path | None = None,
    bundle_id: str | None = None,
) -> LogCases:
    """Read a decision log into a :class:`LogCases` (table + provenance); see the module doc.

    ``log_path``: one log, or a fleet (several logs and archives, a folder or a glob;
    :func:`~spotstop.diagnostics._fleet.read_fleet`), whose groups are then situations and
    contrasts within a robot. ``bundle_id``: the bundle whose decisions to read, required
    when the log holds several (:func:`one_bundle`)."""
    log, other_bundles = one_bundle(read_logs(log_path, labels=labels, journal=journal), bundle_id)
    arr = log.arrays
    fused = np.asarray(arr.fused, dtype=np.float64)
    counted = log.counting(needs="fused", labelled=True)  # the log's one rule
    keep = counted.mask
    dropped = {
        "fail_closed": int(counted.fail_closed.sum()),
        "fail_closed_labelled": int((counted.fail_closed & (log.label >= 0)).sum()),
        "unlabelled": int(counted.unlabelled.sum()),
        "nonfinite_score": int(counted.unscored.sum()),
    }
    if bundle_id is not None:
        dropped["other_bundle"] = sum(other_bundles.values())
    if not keep.any():
        raise DataError(
            f"decision log {str(log.path)!r}: no decision is labelled, scored and not "
            f"fail-closed ({arr.n} decisions; dropped {dropped}). Attach labels with --labels "
            "FILE or DecisionLog.set_labels."
        )
    extra: dict[str, Any] = {}
    gray_notes: dict[str, Any] = {"method": "each decision's own policy fusion"}
    for kind, per_member in (
        ("score_gray", arr.member_scores_gray),
        ("score_text", arr.member_scores_text),
    ):
        values, notes = fused_variant(log, per_member)
        v = values[keep]
        extra[kind] = v if np.isfinite(v).any() else None
        gray_notes[kind] = {"n": int(np.isfinite(v).sum()), "by_version": notes}
    fmt = arr.image_format[keep]  # cleaned by read_reviewed
    contrast_ids, situation_ids = log.group_ids()
    table = CaseTable(
        case_id=np.asarray(arr.decision_id, dtype=object)[keep],
        label=log.label[keep],
        score=fused[keep],
        contrast_id=contrast_ids[keep],
        situation_id=situation_ids[keep],
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
        "log": str(log.path) if not log.sources else list(log.sources),
        "labels": log.labels_source,
        "bundle_ids": sorted({str(b) for b in arr.bundle_id[keep]}),
        "prompt_hashes": sorted({str(p) for p in arr.prompt_hash[keep]}),
        "policy_versions": sorted({str(v) for v in log.version[keep]}),
        "fusion_keys": sorted({str(k) for k in arr.fusion_key[keep] if k}),
        "time_range": _time_range(np.asarray(arr.time)[keep]),
        "time_range_log": _time_range(np.asarray(arr.time)),
        "n_decisions": arr.n,
        "archived": dict(log.archived),
        "n_cases": int(keep.sum()),
        "n_labelled_from_file": log.n_labelled_from_file,
        "dropped": dropped,
        "thresholds": {
            "n": int(thr.size),
            "median": float(np.median(thr)) if thr.size else None,
            "min": float(thr.min()) if thr.size else None,
            "max": float(thr.max()) if thr.size else None,
        },
        "gray_text": gray_notes,
        "policy_errors": dict(log.policy_errors),
        "pending": log.pending.to_dict(),
    }
    if bundle_id is not None:
        provenance["bundle_filter"] = {"bundle_id": bundle_id, "left_out": other_bundles}
    if log.robot_id is not None:
        robots, counts = np.unique(log.robot_id, return_counts=True)
        provenance["robots"] = {str(r): int(c) for r, c in zip(robots, counts, strict=True)}
    return LogCases(table=table, provenance=provenance, log=log, keep=keep)


def case_table_from_log(
    log_path: str | Path, *, labels: str | Path | None = None, bundle_id: str | None = None
) -> CaseTable:
    """The :class:`CaseTable` of a decision log's labelled, scored, not fail-closed decisions.

    ``labels``: optional CSV/JSONL file overriding the log's labels table (see the module
    docstring); ``bundle_id``: the bundle to read when the log holds several.  Use
    :func:`log_cases` for the provenance (drop counts, bundles, time range).
    """
    return log_cases(log_path, labels=labels, bundle_id=bundle_id).table
