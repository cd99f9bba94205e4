"""What the guard delivered: its own logged answers against the reviewer labels, overall and
per policy version, and a replay of each version's policy on its logged scores.

Delivered rates
    Over the labelled decisions that did not fail closed (a fail-closed UNSAFE is not a
    score-based answer; such decisions are counted apart), with the guard's logged answer
    (``UNSAFE`` = flagged): ``hit_rate`` = share of unsafe decisions flagged,
    ``false_alarm_rate`` = share of safe decisions flagged, ``balanced_accuracy`` =
    ``(hit_rate + 1 − false_alarm_rate) / 2``.  Intervals: 95 % percentile intervals of a
    group bootstrap over the card's groups (connected contrast and situation ids), all three
    from the same draws.  ``n``: decisions (balanced accuracy), unsafe (hit rate) or safe
    (false-alarm rate) decisions.  A missing class → :class:`UndefinedMetricWarning` and NaN.
    The rates describe the reviewed decisions: where the guard's SAFE and UNSAFE answers were
    labelled at different rates (:func:`review_gap`), ``Delivered.review_note`` says so (with
    the SAFE answers reviewed less often, the hit rate reads high).

Replay
    Each version whose ``policy.yaml`` is stored in the log is run again on its decisions, in
    log order, one batch per ``batch_id``, from its ``state_seed``
    (:func:`spotstop.guard.policies.replay` over :func:`~spotstop.guard.policies.batch_inputs`
    with its own fusion): ``agreement`` is the share of its non-fail-closed decisions whose
    logged answer the replay reproduces, ``max_fused_diff`` the largest difference between the
    logged and the recomputed fused score.  A decision that failed closed before the decision
    (its logged ``policy_score`` is not finite) enters the replay as missing, as it entered the
    guard's policy (:func:`~spotstop.guard.policies.entered_scores`).  Agreement below 1 means the log was not written by
    this policy file as stored (or a stateful policy's live state was reset); the card says so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._from_log import LogData
from spotstop.diagnostics._resample import group_sum_draws, nan_estimate, percentile_ci
from spotstop.diagnostics._results import Estimate
from spotstop.guard import GuardError
from spotstop.guard.policies import batch_inputs, entered_scores, logged_ran, replay

__all__ = [
    "Delivered",
    "DeliveredRates",
    "PolicyDelivered",
    "Replay",
    "delivered",
    "delivered_rates",
    "review_gap",
]


@dataclass(frozen=True)
class DeliveredRates:
    """The guard's logged answers against the labels (see the module docstring)."""

    balanced_accuracy: Estimate
    hit_rate: Estimate
    false_alarm_rate: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "balanced_accuracy": self.balanced_accuracy.to_dict(),
            "hit_rate": self.hit_rate.to_dict(),
            "false_alarm_rate": self.false_alarm_rate.to_dict(),
        }


def review_gap(reviewed: tuple[int, int, int, int], level: float, *, one_sided: bool) -> str:
    """How the guard's SAFE answers were reviewed against its UNSAFE answers, when the two
    labelled shares differ beyond chance (Fisher exact test at ``level``; ``one_sided``: only
    SAFE answers reviewed less often counts), else "". ``reviewed``: (labelled SAFE answers,
    SAFE answers, labelled UNSAFE answers, UNSAFE answers). The one rule for both the
    delivered rates and the conformal audit (a miss is a SAFE answer on an unsafe scene)."""
    l_s, n_s, l_u, n_u = reviewed
    if n_s == 0 or n_u == 0 or l_s + l_u == 0:
        return ""
    table = [[l_s, n_s - l_s], [l_u, n_u - l_u]]
    alternative = "less" if one_sided else "two-sided"
    if float(stats.fisher_exact(table, alternative=alternative).pvalue) >= level:
        return ""
    how = "less" if l_s * n_u < l_u * n_s else "more"
    return (
        f"SAFE answers were reviewed {how} often ({l_s} of {n_s}, {100 * l_s / n_s:.0f} %) "
        f"than UNSAFE answers ({l_u} of {n_u}, {100 * l_u / n_u:.0f} %)"
    )


def reviewed_answers(log: LogData, mask: NDArray[np.bool_]) -> tuple[int, int, int, int]:
    """(labelled SAFE answers, SAFE answers, labelled UNSAFE answers, UNSAFE answers) of the
    decisions ``mask`` (the caller's; fail-closed ones are the caller's to leave out)."""
    guard = np.asarray(log.arrays.guard_label)
    labelled = log.label >= 0
    safe, unsafe = mask & (guard == 0), mask & (guard == 1)
    return (
        int((safe & labelled).sum()),
        int(safe.sum()),
        int((unsafe & labelled).sum()),
        int(unsafe.sum()),
    )


def _check_labels(label: NDArray[Any], flagged: NDArray[Any]) -> None:
    if label.shape != flagged.shape or label.ndim != 1:
        raise DataError(
            f"label and flagged must be 1-d of one length; got {label.shape} and {flagged.shape}."
        )
    if not np.isin(label, (0, 1)).all() or not np.isin(flagged, (0, 1)).all():
        raise DataError("label and flagged must hold 0 or 1 only (labelled decisions).")


def delivered_rates(
    label: NDArray[Any],
    flagged: NDArray[Any],
    group: NDArray[np.intp],
    *,
    n_boot: int,
    rng: np.random.Generator,
    what: str = "the guard",
) -> DeliveredRates:
    """Hit rate, false-alarm rate and balanced accuracy of ``flagged`` (1 = answered UNSAFE)
    against ``label`` (1 = unsafe), with group-bootstrap intervals over ``group`` (all three
    from the same draws).  ``what`` names the answers in the warning a missing class gives.
    The card uses it for the guard's logged answers and for the direct answer ``S > cut``."""
    y = np.asarray(label)
    f = np.asarray(flagged)
    _check_labels(y, f)
    n_u, n_s = int((y == 1).sum()), int((y == 0).sum())
    if n_u == 0 or n_s == 0:
        missing = "unsafe" if n_u == 0 else "safe"
        warnings.warn(
            f"the rates of {what} are partly undefined: no labelled {missing} case; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    if y.size == 0:
        return DeliveredRates(nan_estimate(0), nan_estimate(0), nan_estimate(0))
    parts = np.stack([(y == 1) & (f == 1), y == 1, (y == 0) & (f == 1), y == 0]).astype(float)
    _, gcode = np.unique(group, return_inverse=True)
    point, draws = group_sum_draws(parts, gcode.reshape(-1), n_boot=n_boot, rng=rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_d, fa_d = draws[:, 0] / draws[:, 1], draws[:, 2] / draws[:, 3]
        hit = point[0] / point[1] if n_u else math.nan
        fa = point[2] / point[3] if n_s else math.nan
    ba = 0.5 * (hit + 1.0 - fa)
    return DeliveredRates(
        balanced_accuracy=Estimate(float(ba), percentile_ci(0.5 * (hit_d + 1 - fa_d)), int(y.size)),
        hit_rate=Estimate(float(hit), percentile_ci(hit_d), n_u) if n_u else nan_estimate(0),
        false_alarm_rate=Estimate(float(fa), percentile_ci(fa_d), n_s) if n_s else nan_estimate(0),
    )


@dataclass(frozen=True)
class Replay:
    """A version's policy run again on its logged decisions (see the module docstring).

    n: non-fail-closed decisions compared; n_agree: of them, answered as logged; note: how the
    replay ran or why it could not (then n = 0).
    """

    n: int
    n_agree: int
    max_fused_diff: float
    note: str

    @property
    def agreement(self) -> float:
        """``n_agree / n`` (NaN when nothing was replayed)."""
        return self.n_agree / self.n if self.n else math.nan

    def to_dict(self) -> dict[str, Any]:
        a, d = self.agreement, self.max_fused_diff
        return {
            "n": self.n,
            "n_agree": self.n_agree,
            "agreement": None if math.isnan(a) else a,
            "max_fused_diff": None if math.isnan(d) else d,
            "note": self.note,
        }


def replay_version(log: LogData, version: str) -> Replay:
    """Replay one version's stored policy on its decisions (see the module docstring); each
    robot's decisions apart, from the policy's ``state_seed`` (each robot kept its own state)."""
    cfg = log.policies.get(version)
    if cfg is None:
        why = log.policy_errors.get(version, "no policy document stored in the log")
        return Replay(0, 0, math.nan, f"not replayed: {why}")
    arr = log.arrays
    members = cfg.fusion.members
    missing = [m for m in members if m not in arr.member_scores]
    if missing:
        return Replay(0, 0, math.nan, f"not replayed: member(s) {missing} are not logged")
    n_compare = n_agree = n_batches = 0
    diffs: list[float] = []
    for rows in log.by_robot(np.flatnonzero(log.version == version)):
        # what the guard gave the policy: a scene that failed closed before its decision
        # entered as missing (entered_scores reads that from the logged policy_score)
        seen = arr.policy_score[rows]
        text = None
        if "text" in cfg.variants_needed() and all(m in arr.member_scores_text for m in members):
            text = entered_scores({m: arr.member_scores_text[m][rows] for m in members}, seen)
        batch = [
            b if b is not None else f"#decision-{i}"
            for i, b in zip(rows, arr.batch_id[rows], strict=True)
        ]
        try:
            x = batch_inputs(
                cfg.fusion,
                entered_scores({m: v[rows] for m, v in arr.member_scores.items()}, seen),
                [s if s else None for s in arr.logged_situation_id[rows]],  # the guard's
                text,
                logged_ran(arr.members_run, members, rows),
            )
            got = replay(cfg.policy, x, batch_ids=batch, state=cfg.initial_state()).unsafe
        except GuardError as exc:
            return Replay(0, 0, math.nan, f"not replayed: {exc}")
        compare = log.counting(needs=None).mask[rows]  # its answers that were not fail-closed
        n_compare += int(compare.sum())
        n_agree += int((got[compare] == (arr.guard_label[rows][compare] == 1)).sum())
        n_batches += len(set(batch))
        logged = arr.fused[rows]
        both = np.isfinite(logged) & np.isfinite(x.fused)
        if both.any():
            diffs.append(float(np.max(np.abs(logged[both] - x.fused[both]))))
    robots = len(log.robots)
    each = f", each of {robots} robots apart" if robots > 1 else ""
    return Replay(
        n_compare,
        n_agree,
        max(diffs) if diffs else math.nan,
        f"{cfg.kind} from policy.yaml {version}, {n_batches} batch(es), from its state_seed{each}",
    )


@dataclass(frozen=True)
class PolicyDelivered:
    """One policy version: its kind, when it was created and first seen, its delivered rates
    and its replay."""

    version_id: str
    kind: str | None
    created: str | None
    first_seen: str | None
    n_fail_closed_labelled: int
    rates: DeliveredRates
    replay: Replay

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "created": self.created,
            "first_seen": self.first_seen,
            "n_fail_closed_labelled": self.n_fail_closed_labelled,
            **self.rates.to_dict(),
            "replay": self.replay.to_dict(),
        }


@dataclass(frozen=True)
class Delivered:
    """Delivered rates overall and per version (keys: version ids, :data:`UNKNOWN_VERSION`)."""

    overall: DeliveredRates
    by_policy: Mapping[str, PolicyDelivered]
    n_fail_closed_labelled: int
    review_note: str = ""
    """Why the rates may not describe the deployment: the guard's SAFE and UNSAFE answers
    were reviewed at different rates (:func:`review_gap`); "" when they were not."""


def _iso(t: float | None) -> str | None:
    import datetime as dt

    return None if t is None else dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat()


def delivered(log: LogData, *, n_boot: int, rng: np.random.Generator) -> Delivered:
    """The delivered rates of a log, overall and per policy version, with each replay."""
    counted = log.counting(needs=None, labelled=True)
    use = counted.mask  # log.delivered
    y = log.label[use]
    flagged = np.asarray(log.arrays.guard_label, dtype=np.int8)[use]
    contrast, situation = log.group_ids()
    group = group_codes(contrast[use], situation[use])
    overall = delivered_rates(y, flagged, group, n_boot=n_boot, rng=rng, what="the guard's answers")
    fail_lab = counted.fail_closed & (log.label >= 0)
    by: dict[str, PolicyDelivered] = {}
    for v in log.versions():
        mine = (log.version == v)[use]
        rates = delivered_rates(
            y[mine],
            flagged[mine],
            group[mine],
            n_boot=n_boot,
            rng=rng,
            what=f"the answers of policy {v}",
        )
        cfg = log.policies.get(v)
        by[v] = PolicyDelivered(
            version_id=v,
            kind=log.kind_of(v),
            created=None if cfg is None else cfg.created.isoformat(),
            first_seen=_iso(log.first_time.get(v)),
            n_fail_closed_labelled=int((fail_lab & (log.version == v)).sum()),
            rates=rates,
            replay=replay_version(log, v),
        )
    gap = review_gap(reviewed_answers(log, ~counted.fail_closed), 0.05, one_sided=False)
    effect = (
        "its misses go uncounted: the hit rate reads high"
        if "reviewed less often" in gap
        else "its stops go uncounted: the hit and false-alarm rates read low"
    )
    note = (
        f"the guard's {gap}: the rates describe the reviewed decisions, not every decision "
        f"({effect}); review decisions drawn at random"
        if gap
        else ""
    )
    return Delivered(overall, by, int(fail_lab.sum()), note)
