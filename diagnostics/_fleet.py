"""A fleet's decision logs as one log: ``spotstop card LOG [LOG ...]`` with many robots.

:func:`read_fleet` reads SQLite decision logs (each with its registered Parquet archives, as
:class:`~spotstop.guard.DecisionLog` reads them) and stand-alone archive files (a fleet's
collected ``*.parquet``, each carrying its robot and the policies that decided its rows in its
metadata) into one :class:`~spotstop.diagnostics._from_log.LogData`, robots interleaved in
time order, each file's decisions in its own log order:

* **Inputs.** Each item is a file (a log, or an archive), a folder (every ``*.sqlite`` log
  under it, and every ``*.parquet`` archive under it that no log given registers), or a glob.
  An item that matches nothing is an error that names it.
* **Robots.** Each decision keeps its robot: the log's ``robot_id`` (``spotstop serve
  --robot-id``), else the archive's, else one taken from the file's path
  (:func:`~spotstop.diagnostics._from_log.robot_of_path`).  Resampling groups are contrasts
  and situations *within a robot*, and each robot's decisions are replayed apart (its guard
  kept its own policy state).
* **One rule for which rows count.** A decision id read twice (a log given twice, an archive
  given beside its log) is an error naming both files, never a decision counted twice; a
  collected archive that another collected one of its log supersedes (``spotstop.replaces``:
  rewritten to take a late fail-closed amendment) is left out.  Two
  files that store different documents under one policy version id are an error too.
* **Labels** come from each log's labels table (they may name archived decisions), and an
  optional labels file over all of them (by decision id or image sha256).

:class:`FleetCheck` (``checks.fleet`` of the card) compares each robot with the rest of the
fleet: its delivered balanced accuracy and, where its decisions were made by a conformal cut,
its miss rate on the labelled unsafe ones, each with the difference from the rest and a
Bonferroni-adjusted interval over the robots. A robot is flagged when that interval puts it
*worse* than the rest (lower accuracy, more misses); a better one is not flagged, since one
bad robot makes every other one look better than "the rest".
"""

from __future__ import annotations

import glob
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._conformal_audit import decided_by_conformal
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import LogData, _log_data, robot_of_path
from spotstop.diagnostics._resample import MIN_GROUPS, group_sum_draws, nan_divide, percentile_ci
from spotstop.diagnostics._results import ConfidenceInterval, Estimate
from spotstop.guard import (
    GuardError,
    LabelsFileError,
    LogArrays,
    PendingAnswers,
    PolicyRow,
    read_reviewed,
)
from spotstop.guard._log_archive import archive_folder, read_archive_file
from spotstop.guard._log_read import arrays_from_rows

__all__ = ["FleetCheck", "FleetRobot", "expand_inputs", "read_fleet"]

FLEET_LEVEL = 0.95
"""Family-wise coverage of the per-robot intervals (Bonferroni over the robots)."""


def expand_inputs(items: Sequence[str | Path]) -> list[Path]:
    """The logs and stand-alone archives that ``items`` name, each once, logs first.

    An archive registered by a log that is also read is left out (the log reads it)."""
    if not items:
        raise DataError("give at least one decision log, archive, folder or glob.")
    found: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_file():
            hits = [p]
        elif p.is_dir():
            hits = sorted([*p.rglob("*.sqlite"), *p.rglob("*.parquet")])
        else:
            hits = [Path(h) for h in sorted(glob.glob(str(item), recursive=True))]
            hits = [h for h in hits if h.is_file()]
        hits = [h for h in hits if h.suffix in (".sqlite", ".parquet")]
        if not hits:
            raise DataError(
                f"{str(item)!r} names no decision log (*.sqlite) or archive (*.parquet): give "
                "a log file, an archive, a folder that holds them, or a glob."
            )
        found += hits
    unique = list(dict.fromkeys(h.resolve() for h in found))
    logs = [h for h in unique if h.suffix == ".sqlite"]
    beside = {archive_folder(log) for log in logs}
    archives = [h for h in unique if h.suffix == ".parquet" and h.parent not in beside]
    return logs + archives


@dataclass
class _Part:
    source: Path
    arrays: LogArrays
    robot: str
    policies: Mapping[str, PolicyRow]
    archived: int = 0
    archive_files: int = 0
    first_seq: int | None = None  # a collected archive's first position in its log
    log_id: str | None = None  # which log a collected archive's positions are of
    replaces: tuple[str, ...] = ()  # the archive files a collected archive supersedes
    pending: PendingAnswers | None = None  # a log's journal and dead letter (read_reviewed)


def _read_part(path: Path, journal: str | Path | None = None) -> _Part:
    try:
        if path.suffix == ".parquet":
            af = read_archive_file(path)
            arrays = arrays_from_rows(af.rows, [(None, None, None, None)] * len(af.rows))
            robot = af.robot_id or robot_of_path(path)
            first = min(af.seqs) if af.seqs else None
            return _Part(
                path, arrays, robot, af.policies, len(af.rows), 1, first, af.log_id, af.replaces
            )
        r = read_reviewed(path, journal=journal)  # a labels file goes over the whole fleet
        return _Part(
            path,
            r.arrays,
            r.robot_id or robot_of_path(path),
            r.policies,
            r.archived.get("rows", 0),
            r.archived.get("files", 0),
            pending=r.pending,
        )
    except GuardError as exc:
        raise DataError(f"cannot read {str(path)!r}: {exc}") from exc


def _current(parts: list[_Part]) -> list[_Part]:
    """Leave out each collected archive that another one collected of the same log
    supersedes: its log rewrote it to take a fail-closed amendment that came after its rows
    were archived (guard/_log_archive.py, ``ArchiveStore.amend_archived``), and the newer
    file holds the same decisions as the robot received them."""
    gone = {(p.log_id, name) for p in parts for name in p.replaces}
    return [
        p for p in parts if p.source.suffix != ".parquet" or (p.log_id, p.source.name) not in gone
    ]


def _in_log_order(parts: list[_Part]) -> list[_Part]:
    """Each robot's files in its own log order: its replay must run in the order its guard
    decided (guard/_log_read.py: log order). The collected archives of one log go by their
    positions (``log_seq``); each log (which reads its own archives), each older archive
    without a log id, and each group of one log's archives is a run, and a robot's runs go by
    their first decision's time (different logs, one after another). read_fleet then keys each
    robot's rows by the running maximum of their times in this order, which a clock stepped
    back cannot reorder, and robots interleave by that key."""
    runs: dict[tuple[str, str], list[_Part]] = {}
    for i, p in enumerate(parts):
        key = f"log:{p.log_id}" if p.log_id is not None else f"file:{i}"
        runs.setdefault((p.robot, key), []).append(p)

    def start(run: list[_Part]) -> float:
        times = [float(np.min(p.arrays.time)) for p in run if p.arrays.n]
        return min(times) if times else math.inf

    out: list[_Part] = []
    for robot in sorted({r for r, _ in runs}):
        mine = [
            sorted(v, key=lambda p: p.first_seq or 0) for (r, _), v in runs.items() if r == robot
        ]
        for run in sorted(mine, key=start):
            out.extend(run)
    return out


def read_fleet(
    inputs: Sequence[str | Path],
    *,
    labels: str | Path | None = None,
    journal: str | Path | None = None,
) -> LogData:
    """Many robots' logs and archives as one :class:`LogData` (see the module docstring);
    ``journal``: a journal the robots' guards share (its entries name their log), read for
    each log instead of its default one."""
    paths = expand_inputs(inputs)
    parts = _current([_read_part(p, journal) for p in paths])
    seen: dict[str, Path] = {}
    for part in parts:
        for i in part.arrays.decision_id.tolist():
            if i in seen:
                raise DataError(
                    f"decision {i!r} is in {str(seen[i])!r} and in {str(part.source)!r}: give "
                    "each log or archive once (a log reads its own archives)."
                )
            seen[i] = part.source
    policies: dict[str, PolicyRow] = {}
    origin: dict[str, Path] = {}
    for part in parts:
        for v, row in part.policies.items():
            old = policies.get(v)
            if old is not None and dict(old.document) != dict(row.document):
                raise DataError(
                    f"policy version {v!r} is stored differently in {str(origin[v])!r} and "
                    f"{str(part.source)!r}: one version id must name one policy file."
                )
            if old is None or row.first_time < old.first_time:
                policies[v], origin[v] = row, part.source
    parts = _in_log_order(parts)
    arrays = LogArrays.concat([p.arrays for p in parts])
    robots = (
        np.concatenate([np.full(p.arrays.n, p.robot, dtype=object) for p in parts])
        if parts
        else np.zeros(0, dtype=object)
    )
    times = np.asarray(arrays.time, dtype=float)
    key = np.empty_like(times)
    for r in dict.fromkeys(robots.tolist()):
        mine = np.flatnonzero(robots == r)
        key[mine] = np.maximum.accumulate(times[mine])
    order = np.lexsort((np.arange(arrays.n), key))
    arrays, robots = arrays.take(order), robots[order]
    try:
        reviewed = read_reviewed(arrays, labels)
    except LabelsFileError as exc:
        raise DataError(str(exc)) from exc
    n_arch = sum(p.archived for p in parts)
    archived = {"files": sum(p.archive_files for p in parts), "rows": n_arch} if n_arch else {}
    root = Path(paths[0]).parent
    busy = set(robots.tolist())
    idle = tuple(dict.fromkeys(p.robot for p in parts if p.robot not in busy))
    pending = PendingAnswers.total([p.pending for p in parts if p.pending is not None])
    return _log_data(
        root, reviewed, policies, archived, robots, tuple(str(p) for p in paths), idle, pending
    )


# -- the card's per-robot section ------------------------------------------------------------


@dataclass(frozen=True)
class FleetRobot:
    """One robot against the rest of the fleet.

    ``balanced_accuracy``: its delivered balanced accuracy (95 % interval);
    ``vs_rest``: that minus the rest's, with the family-wise interval; ``miss_rate`` and
    ``miss_vs_rest``: the same for the share of its labelled unsafe decisions that a
    conformal cut let through (NaN without any); ``flagged``: why it is worse than the rest
    (empty when it is not, beyond chance). ``groups``: its resampling groups; with fewer than
    ``MIN_GROUPS`` the percentile intervals undercover at the Bonferroni level, so it is not
    compared (never flagged; ``note`` says so).
    """

    robot: str
    n: int
    balanced_accuracy: Estimate
    vs_rest: Estimate
    miss_rate: Estimate
    miss_vs_rest: Estimate
    flagged: tuple[str, ...]
    groups: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "robot": self.robot,
            "n": self.n,
            "balanced_accuracy": self.balanced_accuracy.to_dict(),
            "vs_rest": self.vs_rest.to_dict(),
            "miss_rate": self.miss_rate.to_dict(),
            "miss_vs_rest": self.miss_vs_rest.to_dict(),
            "groups": self.groups,
            "note": self.note,
            "flagged": list(self.flagged),
        }


def fleet_robots(
    log: LogData, *, n_boot: int, rng: np.random.Generator, level: float = FLEET_LEVEL
) -> tuple[FleetRobot, ...]:
    """Each robot against the rest (see :class:`FleetRobot`), all from one group bootstrap of
    the fleet's delivered decisions (groups: contrasts and situations within a robot)."""
    robots = log.robots
    use = np.flatnonzero(log.delivered)
    if len(robots) < 2 or use.size == 0 or log.robot_id is None:
        return ()
    contrast, situation = log.group_ids()
    group = group_codes(contrast[use], situation[use])
    unsafe = log.label[use] == 1
    flagged = log.arrays.guard_label[use] == 1
    conformal = decided_by_conformal(log)[use]  # the conformal audit's own rule
    rid = log.robot_id[use]
    # per case: hits, unsafe, false alarms, safe, conformal misses, conformal unsafe
    base = np.stack(
        [
            unsafe & flagged,
            unsafe,
            ~unsafe & flagged,
            ~unsafe,
            conformal & unsafe & ~flagged,
            conformal & unsafe,
        ]
    ).astype(np.float64)
    values = np.concatenate([base, *[base * (rid == r) for r in robots]])
    point, draws = group_sum_draws(values, group, n_boot=n_boot, rng=rng)
    sums = np.vstack([point[None, :], draws])  # row 0: the data; then the draws

    def rates(cols: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        ba = 0.5 * (nan_divide(cols[:, 0], cols[:, 1]) + 1.0 - nan_divide(cols[:, 2], cols[:, 3]))
        return ba, nan_divide(cols[:, 4], cols[:, 5])

    total = sums[:, :6]
    width = 1.0 - (1.0 - level) / len(robots)

    def est(v: NDArray[np.float64], n: int, lv: float) -> Estimate:
        ci = (
            percentile_ci(v[1:], lv)
            if math.isfinite(v[0])
            else ConfidenceInterval(math.nan, math.nan)
        )
        return Estimate(float(v[0]), ci, n)

    out = []
    for k, r in enumerate(robots):
        mine = sums[:, 6 * (k + 1) : 6 * (k + 2)]
        ba, miss = rates(mine)
        ba_rest, miss_rest = rates(total - mine)
        n = int(point[6 * (k + 1) + 1] + point[6 * (k + 1) + 3])
        n_conf = int(point[6 * (k + 1) + 5])
        vs, mvs = est(ba - ba_rest, n, width), est(miss - miss_rest, n_conf, width)
        n_groups = int(np.unique(group[rid == r]).size)
        why = []  # worse than the rest only: one bad robot makes all others look better
        note = ""
        if n_groups < MIN_GROUPS:  # the same rule as the periods': too few to compare
            note = (
                f"not compared: {n_groups} groups (contrasts and situations), fewer than "
                f"{MIN_GROUPS}; percentile intervals undercover with so few"
            )
        else:
            if math.isfinite(vs.ci.high) and vs.ci.high < 0:
                why.append("balanced accuracy below the rest's")
            if math.isfinite(mvs.ci.low) and mvs.ci.low > 0:
                why.append("conformal miss rate above the rest's")
        out.append(
            FleetRobot(
                r,
                n,
                est(ba, n, 0.95),
                vs,
                est(miss, n_conf, 0.95),
                mvs,
                tuple(why),
                n_groups,
                note,
            )
        )
    return tuple(out)


class FleetCheck(CardCheck):
    """``checks.fleet``: each robot against the rest (only for decisions of several robots)."""

    name: ClassVar[str] = "fleet"
    title: ClassVar[str] = "Robots of the fleet"
    explanation: ClassVar[str] = (
        "Each robot's delivered balanced accuracy, and its conformal miss rate where a "
        "conformal cut decided, against the rest of the fleet: the difference with a "
        f"{FLEET_LEVEL:.0%} family-wise interval (Bonferroni over the robots). A flagged robot "
        "is worse than the rest beyond chance: look at its camera, its situations, its policy."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        log = ctx.log
        if log is None or len(log.robots) + len(log.idle_robots) < 2:
            return CheckResult({"applicable": False}, (("fleet", "one robot: not applicable"),))
        # its own stream, spawned from the card's: the sections after this one draw what they
        # draw for one robot, so a fleet card equals the card of the merged log but for this
        rows = fleet_robots(log, n_boot=ctx.n_boot, rng=ctx.rng.spawn(1)[0])
        table = []
        for r in rows:
            flag = (
                "FLAGGED: " + "; ".join(r.flagged)
                if r.flagged
                else (r.note or "in line with the rest")
            )
            table.append(
                (
                    f"robot {r.robot} (n={r.n})",
                    f"BA {fmt(r.balanced_accuracy)}, vs rest {fmt(r.vs_rest, signed=True)}; "
                    f"conformal miss {fmt(r.miss_rate)}, vs rest "
                    f"{fmt(r.miss_vs_rest, signed=True)} — {flag}",
                )
            )
        for robot in log.idle_robots:  # a robot that logged nothing is said, not left out
            table.append(
                (
                    f"robot {robot} (n=0)",
                    "its files hold no decision: check that its guard runs and logs, and that "
                    "its log was collected",
                )
            )
        data = {
            "applicable": True,
            "level": FLEET_LEVEL,
            "robots": [r.to_dict() for r in rows],
            "flagged": [r.robot for r in rows if r.flagged],
            "idle": list(log.idle_robots),
        }
        return CheckResult(data, tuple(table), result=rows)
