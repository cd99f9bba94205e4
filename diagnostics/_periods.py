"""Drift between periods: the card's key fields per day, week or month (``--period``).

For a decision log (or a fleet's), :class:`PeriodsCheck` (``checks.periods``) splits the
decisions by the UTC calendar period of their time (``day``: ``2026-11-30``; ``week``: the ISO
week, ``2026-W48``; ``month``: ``2026-11``) and computes per period, each with its 95 %
group-bootstrap interval (groups as the card's: contrasts and situations, within a robot):

* ``delivered_balanced_accuracy`` — the guard's own logged answers against the labels;
* ``unsafe_share`` — the share of labelled decisions that are unsafe (the prevalence);
* ``auroc``, ``threshold_part``, ``overlap_part``, ``within_part`` — the Spot-Stop fields of
  the period's cases at the card's direct cut;
* the conformal audit of each deployed conformal cut on the period's decisions (exact:
  misses among one labelled unsafe decision per situation, Clopper–Pearson, and the binomial
  test against the cut's alpha; ``holds``, ``violated`` or ``not enough data``).

**The test of change.** Each period is compared with a baseline: the first period
(``--drift-baseline first``, default) or the one before it (``previous``).  Periods are
disjoint samples, so the difference's draws are the difference of the two periods'
independent bootstrap draws; its interval is family-wise 95 % over the compared periods and
the fields together (Bonferroni over periods × fields: the verdict warns when any field of the
latest period changed), and a field *changed* when that interval excludes 0.  A period with
fewer than 30 groups (or whose baseline has fewer) is not compared, and says so: percentile
intervals from a handful of groups are too narrow (AUROC near 1 most of all), and a test on
them would flag change far more often than 5 %.

The verdict's ``drift`` sentence (only with ``--period``) fails when the deployed cut does not
keep its stated miss rate in the latest period (its audit there is ``violated``), warns when a
field changed in the latest period, and is ``ok`` otherwise.

The check draws from its own stream, spawned from the card's generator, so the rest of the
card is the same with and without ``--period``.
"""

from __future__ import annotations

import datetime as _dt
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._bootstrap import group_bootstrap
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._conformal_audit import DeployedAudit, audit_deployed
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._plots import PeriodDisplay
from spotstop.diagnostics._resample import MIN_GROUPS, group_sum_draws, nan_divide, percentile_ci
from spotstop.diagnostics._results import ConfidenceInterval, Estimate

__all__ = ["PERIODS", "Period", "PeriodsCheck", "PeriodsResult", "period_key", "periods"]

PERIODS = ("day", "week", "month")
BASELINES = ("first", "previous")
FIELDS = (
    "delivered_balanced_accuracy",
    "unsafe_share",
    "auroc",
    "threshold_part",
    "overlap_part",
    "within_part",
)
LEVEL = 0.95
_SPOT_STOP = ("auroc", "threshold_part", "overlap_part", "within_part")


def period_key(t: float, period: str) -> str:
    """The UTC calendar period of epoch time ``t``."""
    d = _dt.datetime.fromtimestamp(t, _dt.UTC)
    if period == "day":
        return d.strftime("%Y-%m-%d")
    if period == "week":
        year, week, _ = d.isocalendar()
        return f"{year}-W{week:02d}"
    if period == "month":
        return d.strftime("%Y-%m")
    raise DataError(f"period must be one of {list(PERIODS)}; got {period!r}.")


@dataclass(frozen=True)
class Period:
    """One period: its key, decisions, fields (``Estimate``), the change of each field
    against the baseline (``None`` for the baseline itself), which fields changed, and the
    audits of the deployed conformal cuts on its decisions."""

    key: str
    n: int
    fields: Mapping[str, Estimate]
    change: Mapping[str, Estimate] | None
    changed: tuple[str, ...]
    audits: tuple[DeployedAudit, ...]
    n_groups: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "period": self.key,
            "n": self.n,
            "fields": {k: v.to_dict() for k, v in self.fields.items()},
            "change": None
            if self.change is None
            else {k: v.to_dict() for k, v in self.change.items()},
            "changed": list(self.changed),
            "n_groups": self.n_groups,
            "note": self.note,
            "audits": [
                {
                    "version_id": a.version_id,
                    "alpha": a.alpha,
                    "n_decisions": a.n_decisions,
                    "misses": a.misses,
                    "miss_rate": a.miss_rate.to_dict(),
                    "p_value": a.p_value if math.isfinite(a.p_value) else None,
                    "status": a.status,
                }
                for a in self.audits
            ],
        }


@dataclass(frozen=True)
class PeriodsResult:
    """The periods in time order, how they were cut and compared."""

    period: str
    baseline: Literal["first", "previous"]
    rows: tuple[Period, ...]

    @property
    def latest(self) -> Period | None:
        return self.rows[-1] if self.rows else None

    def latest_violations(self) -> tuple[DeployedAudit, ...]:
        """Audits of the latest period that say the deployed cut does not keep its alpha."""
        last = self.latest
        return () if last is None else tuple(a for a in last.audits if a.status == "violated")


def periods(
    ctx: CardContext,
    *,
    period: str,
    baseline: str = "first",
    rng: np.random.Generator,
) -> PeriodsResult:
    """The card's key fields per period, and their change against the baseline (module doc)."""
    if period not in PERIODS:
        raise DataError(f"--period must be one of {list(PERIODS)}; got {period!r}.")
    if baseline not in BASELINES:
        raise DataError(f"--drift-baseline must be one of {list(BASELINES)}; got {baseline!r}.")
    log = ctx.log
    if log is None:
        raise DataError("--period needs a decision log (its decisions' times).")
    arr = log.arrays
    keys_all = np.array([period_key(float(t), period) for t in arr.time], dtype=object)
    use = log.delivered
    contrast, situation = log.group_ids()
    table = ctx.table
    where = {str(i): k for k, i in enumerate(arr.decision_id.tolist())}
    case_key = np.array([keys_all[where[str(c)]] for c in table.case_id], dtype=object)
    order = sorted(set(keys_all[use].tolist()))
    draws: dict[str, dict[str, NDArray[np.float64]]] = {}
    rows: list[tuple[str, int, dict[str, Estimate], tuple[DeployedAudit, ...], int]] = []
    for key in order:
        mine = np.flatnonzero(use & (keys_all == key))
        y = log.label[mine]
        f = arr.guard_label[mine] == 1
        group = group_codes(contrast[mine], situation[mine])
        parts = np.stack([(y == 1) & f, y == 1, (y == 0) & f, y == 0]).astype(np.float64)
        point, d = group_sum_draws(parts, group, n_boot=ctx.n_boot, rng=rng)
        ba_d = 0.5 * (nan_divide(d[:, 0], d[:, 1]) + 1.0 - nan_divide(d[:, 2], d[:, 3]))
        ba = (
            0.5 * (nan_divide(point[0:1], point[1:2]) + 1.0 - nan_divide(point[2:3], point[3:4]))[0]
        )
        share_d = nan_divide(d[:, 1], d[:, 1] + d[:, 3])
        share = float(point[1] / (point[1] + point[3]))
        fields = {
            "delivered_balanced_accuracy": Estimate(
                float(ba), percentile_ci(ba_d, LEVEL), mine.size
            ),
            "unsafe_share": Estimate(share, percentile_ci(share_d, LEVEL), mine.size),
        }
        fd = {"delivered_balanced_accuracy": ba_d, "unsafe_share": share_d}
        sub = table.subset(np.flatnonzero(case_key == key))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a short period is NaN: said in its row
            boot = (
                group_bootstrap(sub, cut=ctx.direct_cut, n_boot=ctx.n_boot, rng=rng, n_splits=20)
                if sub.pairs.n
                else None
            )
        for name in _SPOT_STOP:
            if boot is None:
                fields[name] = Estimate(math.nan, ConfidenceInterval(math.nan, math.nan), 0)
                fd[name] = np.full(ctx.n_boot, np.nan)
            else:
                fields[name] = boot.estimates[name]
                fd[name] = np.asarray(boot.draws[name], dtype=np.float64)
        draws[key] = fd
        n_groups = int(group.max()) + 1 if group.size else 0
        # the conformal versions that decided in this period (a version created after it
        # has nothing to audit here)
        part = log.take(mine)
        audits = tuple(
            a for a in audit_deployed(part) if bool((part.version == a.version_id).any())
        )
        rows.append((key, int(mine.size), fields, audits, n_groups))
    # family-wise over every test the verdict reads: each field of each compared period
    compared = max(1, len(order) - 1) * len(FIELDS)
    width = 1.0 - (1.0 - LEVEL) / compared
    out = []
    for i, (key, n, fields, audits, n_groups) in enumerate(rows):
        base = None if i == 0 else (order[0] if baseline == "first" else order[i - 1])
        change: dict[str, Estimate] | None = None
        changed: list[str] = []
        note = ""
        if base is not None:
            change = {}
            bi = order.index(base)
            few = min(n_groups, rows[bi][4]) < MIN_GROUPS
            if few:
                note = (
                    f"fewer than {MIN_GROUPS} groups here or in {base}: percentile intervals "
                    "from so few are too narrow to test a change; not compared"
                )
            for name in FIELDS:
                value = fields[name].value - rows[bi][2][name].value
                nan = ConfidenceInterval(math.nan, math.nan)
                ci = nan if few else percentile_ci(draws[key][name] - draws[base][name], width)
                change[name] = Estimate(float(value), ci, n)
                if ci.excludes(0.0):
                    changed.append(name)
        out.append(Period(key, n, fields, change, tuple(changed), audits, n_groups, note))
    return PeriodsResult(period, baseline, tuple(out))  # type: ignore[arg-type]


class PeriodsCheck(CardCheck):
    """``checks.periods``: the key fields per period and their change (with ``--period``)."""

    name: ClassVar[str] = "periods"
    title: ClassVar[str] = "Drift between periods"
    explanation: ClassVar[str] = (
        "The card's key fields per calendar period (UTC), with 95 % intervals, and their "
        "change against the first (or the previous) period with a family-wise 95 % interval "
        "(Bonferroni over the periods compared and the fields); a field changed when that "
        "interval excludes "
        "0. The conformal audit runs per period: a cut that no longer keeps its miss rate in "
        "the latest period fails the verdict."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        if ctx.period is None or ctx.log is None:
            why = "no --period" if ctx.period is None else "no decision log"
            return CheckResult({"applicable": False}, (("periods", f"not applicable: {why}"),))
        # its own stream: the rest of the card is the same with and without --period
        res = periods(ctx, period=ctx.period, baseline=ctx.drift_baseline, rng=ctx.rng.spawn(1)[0])
        table = []
        for p in res.rows:
            f = p.fields
            audit = "; ".join(f"{a.version_id} {a.status}" for a in p.audits) or "no conformal cut"
            moved = (
                ", ".join(p.changed)
                if p.changed
                else ("not compared (too few groups)" if p.note else "nothing changed")
            )
            table.append(
                (
                    f"{p.key} (n={p.n})",
                    f"BA {fmt(f['delivered_balanced_accuracy'])}, unsafe "
                    f"{fmt(f['unsafe_share'])}, AUROC {fmt(f['auroc'], pct=False)}, threshold "
                    f"part {fmt(f['threshold_part'])}; audit: {audit}; "
                    + ("baseline" if p.change is None else moved),
                )
            )
        data = {
            "applicable": True,
            "period": res.period,
            "baseline": res.baseline,
            "level": LEVEL,
            "periods": [p.to_dict() for p in res.rows],
            "latest_changed": [] if res.latest is None else list(res.latest.changed),
            "latest_violated": [a.version_id for a in res.latest_violations()],
        }
        display = PeriodDisplay(
            periods=tuple(p.key for p in res.rows),
            values={k: np.array([p.fields[k].value for p in res.rows]) for k in FIELDS[:3]},
            low={k: np.array([p.fields[k].ci.low for p in res.rows]) for k in FIELDS[:3]},
            high={k: np.array([p.fields[k].ci.high for p in res.rows]) for k in FIELDS[:3]},
        )
        return CheckResult(data, tuple(table), {"periods": display}, res)
