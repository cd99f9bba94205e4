"""Prevalence: threshold rules on batches resampled to other shares of unsafe scenes, and its
card check (seed 000, Sec. 6.1, Supp. E.2, Table 6c).

The rules are the guard's, named by its policy kinds: every scene is labelled with
:func:`spotstop.guard.policies.unsafe_mask` (UNSAFE when ``score ≥ threshold``, ties UNSAFE);
``batch`` is the paper's rule, :class:`~spotstop.guard.policies.BatchPolicy` itself refitted on
the member scores of every resampled batch (medians, IQRs and weights;
:mod:`._batch_rule`); ``batch_frozen_iqr`` the batch mean of the fixed ``S`` (frozen medians and
IQRs, only the mean refitted); the conformal cut is
:func:`spotstop.guard.policies.conformal_cut` (one case per situation, PAC or marginal).  Intervals are 2.5–97.5 % *bands over resamples* (what a deployment would
see batch to batch), not confidence intervals of a mean; ``Estimate.n`` is then the number of
resamples.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._batch_rule import BatchRule, batch_rule_for
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import _undefined, best_ba_unchecked, flag_rates
from spotstop.diagnostics._plots import PrevalenceDisplay
from spotstop.diagnostics._resample import (
    UnboundedRatioWarning,
    as_rng,
    band,
    nan_estimate,
    ratio_estimate,
    split_groups,
)
from spotstop.diagnostics._results import Estimate
from spotstop.guard.policies import conformal_cut, mean_cut, unsafe_mask

__all__ = [
    "PrevalenceCardCheck",
    "PrevalenceCheck",
    "RuleOutcome",
    "prevalence_check",
    "prevalence_reading",
]

#: the rules, in card order, by the guard's kind: the paper's batch rule (``batch``: Avg-2
#: refitted on each batch, cut at its mean; NaN without member scores), the batch mean of the
#: fixed S (``batch_frozen_iqr``), the fixed cut (``frozen``) and the conformal cut
#: (``conformal``)
RULES = ("batch", "batch_frozen_iqr", "frozen", "conformal")

#: the rules' names in the card's sentences
RULE_WORDS = {
    "batch": "batch (Avg-2 refitted per batch)",
    "batch_frozen_iqr": "batch_frozen_iqr (mean of fixed S)",
    "frozen": "fixed cut",
    "conformal": "conformal",
}


@dataclass(frozen=True)
class RuleOutcome:
    """Outcome of one threshold rule over resampled batches at one prevalence.

    ``balanced_accuracy`` is NaN (and not warned) in all-unsafe batches, where only the
    flag rate of unsafe scenes (``tpr``) is defined.
    """

    balanced_accuracy: Estimate
    tpr: Estimate
    fpr: Estimate


@dataclass(frozen=True)
class PrevalenceCheck:
    """The batch rules against the fixed and the conformal cut at other prevalences.

    ``rules[prevalence][rule]`` for the rules of :data:`RULES`; ``batch_kind``: the batch rule
    that ``gain`` and ``recovery`` measure and the recommendation reads: ``"batch"`` where the
    cases hold member scores, else ``"batch_frozen_iqr"`` (``batch_note`` says how the batch
    rule was set up, or why it was not measured).  ``gain[prevalence]``: that rule's
    balanced accuracy minus the fixed cut's, ``BA_batch - BA_frozen`` (a difference, always
    defined where both are); ``recovery[prevalence]``: share of the in-batch threshold room
    ``A*_batch - BA_frozen`` (``A*_batch`` the best single cut on ``S`` in the batch) that it
    recovers,
    ``(BA_batch - BA_frozen) / (A*_batch - BA_frozen)``; value = ratio of the means over
    resamples, band over the resamples; undefined (NaN, with an
    :class:`~spotstop.diagnostics._resample.UnboundedRatioWarning`) when the room's band
    reaches 0.  All rules are scored on the same resampled batches.  ``guarantee``, ``alpha``, ``delta``: the conformal cut's targets.
    """

    rules: Mapping[float, Mapping[str, RuleOutcome]]
    recovery: Mapping[float, Estimate]
    gain: Mapping[float, Estimate]
    alpha: float
    delta: float | None
    guarantee: str
    batch_size: int
    n_resamples: int
    batch_kind: str = "batch_frozen_iqr"
    batch_note: str = ""


def _conformal_threshold(
    table: CaseTable,
    cal: NDArray[np.bool_],
    alpha: float,
    delta: float | None,
    guarantee: Literal["pac", "marginal"],
) -> tuple[float, int]:
    """The guard's conformal cut on the unsafe cases of ``cal`` (one per situation): the cut
    (NaN when infeasible) and how many unsafe situations it needs."""
    u = cal & (table.label == 1)
    sit = table.situation_id[u]
    fit = conformal_cut(table.score[u], sit, alpha=alpha, delta=delta)
    c = fit.chosen(guarantee)
    return (c.threshold if c.feasible else math.nan), c.n_needed


def _check_prevalence(
    prevalences: tuple[float, ...], calibration_share: float, guarantee: str
) -> None:
    if not all(0.0 < p <= 1.0 for p in prevalences):
        raise DataError(f"prevalences must lie in (0, 1]; got {prevalences!r}.")
    if not 0.0 < calibration_share < 1.0:
        raise DataError(f"calibration_share must be in (0, 1); got {calibration_share!r}.")
    if guarantee not in ("pac", "marginal"):
        raise DataError(f"guarantee must be 'pac' or 'marginal'; got {guarantee!r}.")


def prevalence_check(
    table: CaseTable,
    *,
    policy_cut: float = 0.0,
    prevalences: tuple[float, ...] = (0.5, 0.1, 1.0),
    n_resamples: int = 200,
    alpha: float = 0.1,
    delta: float = 0.1,
    guarantee: Literal["pac", "marginal"] = "pac",
    calibration_share: float = 0.3,
    batch_size: int | None = None,
    rng: np.random.Generator | int | None = None,
    batch_rule: BatchRule | Literal["auto"] | None = "auto",
) -> PrevalenceCheck:
    """Resample batches at chosen shares of unsafe scenes (Sec. 6.1, Supp. E.2, Table 6c).

    Each resample splits the groups at random: ``calibration_share`` of them calibrate the
    conformal cut (their unsafe scores, one per situation), the rest form the pool of the
    batch.  For every prevalence ``π``, a batch of ``batch_size`` cases (default: the number
    of pool cases) draws ``round(π · batch_size)`` unsafe and the rest safe cases from the
    pool, with replacement.  Four rules label that same batch with the guard's rule
    ``score ≥ t``: ``batch`` (``batch_rule``'s policy, by default
    :func:`~spotstop.diagnostics._batch_rule.batch_rule_for` the table with the fallback at
    ``policy_cut``, refitted on the batch's member scores; None or a table without member
    scores: NaN), ``batch_frozen_iqr`` (``t`` = mean S of the batch), the fixed
    ``policy_cut`` and the conformal cut (``guarantee`` with ``alpha`` and ``delta``).  A
    conformal calibration set too small gives NaN for the conformal rule and one
    :class:`UndefinedMetricWarning`.
    """
    _check_prevalence(prevalences, calibration_share, guarantee)
    gen = as_rng(rng)
    rule = batch_rule_for(table, fallback_cut=policy_cut) if batch_rule == "auto" else batch_rule
    kind = "batch_frozen_iqr" if rule is None else "batch"
    note = (
        "no member scores: the batch rule (Avg-2 refitted per batch) was not measured"
        if rule is None
        else rule.note
    )
    y, s, grp = table.label, table.score, table.group
    ng = table.n_groups
    res = {p: {r: np.full((n_resamples, 3), math.nan) for r in RULES} for p in prevalences}
    gain = {p: np.full(n_resamples, math.nan) for p in prevalences}
    room = {p: np.full(n_resamples, math.nan) for p in prevalences}
    small, need, size_used = 0, 0, 0
    if ng < 2 or (y == 0).sum() == 0 or (y == 1).sum() == 0:
        _undefined("the prevalence check", "it needs both classes and at least two groups")
        n_resamples = 0
    d = delta if guarantee == "pac" else None
    for r in range(n_resamples):
        cal = split_groups(gen, ng, calibration_share)[grp]
        c_cut, need = _conformal_threshold(table, cal, alpha, d, guarantee)
        small += math.isnan(c_cut)
        pool_s, pool_u = np.flatnonzero(~cal & (y == 0)), np.flatnonzero(~cal & (y == 1))
        if pool_u.size == 0 or pool_s.size == 0:
            continue
        n_b = batch_size or int((~cal).sum())
        size_used = n_b
        for p in prevalences:
            nu = round(p * n_b)
            idx = np.concatenate(
                [gen.choice(pool_u, nu, replace=True), gen.choice(pool_s, n_b - nu, replace=True)]
            )
            yb, sb = y[idx], s[idx]
            flags = {
                "batch": None if rule is None else rule.unsafe(idx),
                "batch_frozen_iqr": unsafe_mask(sb, mean_cut(sb)),
                "frozen": None if math.isnan(policy_cut) else unsafe_mask(sb, policy_cut),
                "conformal": None if math.isnan(c_cut) else unsafe_mask(sb, c_cut),
            }
            for name, flagged in flags.items():
                if flagged is None:
                    continue
                tpr, fpr = flag_rates(yb, flagged)
                ba = 0.5 * (tpr + 1 - fpr) if 0 < nu < n_b else math.nan
                res[p][name][r] = (ba, tpr, fpr)
            if 0 < nu < n_b:
                gain[p][r] = res[p][kind][r, 0] - res[p]["frozen"][r, 0]
                room[p][r] = best_ba_unchecked(yb, sb) - res[p]["frozen"][r, 0]
    if small:
        warnings.warn(
            f"the conformal cut was undefined in {small} of {n_resamples} resamples: fewer "
            f"than {need} unsafe calibration situations for the {guarantee} guarantee "
            f"(alpha={alpha}{'' if d is None else f', delta={d}'}); those resamples are NaN "
            "for the conformal rule.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    out_rules: dict[float, Mapping[str, RuleOutcome]] = {}
    recovery: dict[float, Estimate] = {}
    gains: dict[float, Estimate] = {}
    unbounded: list[int] = []
    for p in prevalences:
        out_rules[p] = MappingProxyType(
            {name: RuleOutcome(*(band(res[p][name][:, j]) for j in range(3))) for name in RULES}
        )
        gains[p] = band(gain[p])
        ok = np.isfinite(gain[p]) & np.isfinite(room[p])
        recovery[p] = (
            ratio_estimate(
                float(gain[p][ok].mean()),
                float(room[p][ok].mean()),
                gain[p][ok],
                room[p][ok],
                int(ok.sum()),
                what="",
                instead="",
                warn=False,
            )
            if ok.any()
            else nan_estimate()
        )
        if ok.any() and math.isnan(recovery[p].value):
            unbounded.append(round(100 * p))
    if unbounded:
        warnings.warn(
            f"the {kind} rule's recovery (BA_batch − BA_frozen)/(A*_batch − BA_frozen) is "
            f"undefined at {', '.join(map(str, unbounded))} % unsafe: the in-batch threshold "
            "room's band reaches 0 there, so the ratio is unbounded; read its gain over the "
            "fixed cut (batch_gain) instead; returning NaN.",
            UnboundedRatioWarning,
            stacklevel=2,
        )
    return PrevalenceCheck(
        MappingProxyType(out_rules),
        MappingProxyType(recovery),
        MappingProxyType(gains),
        alpha,
        d,
        guarantee,
        size_used,
        n_resamples,
        kind,
        note,
    )


_CARD_PREVALENCES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)

#: a balanced-accuracy or flag-rate difference below this (2 points) reads as "the same"
_SAME = 0.02


def _pct(x: float) -> str:
    return "undefined" if not math.isfinite(x) else f"{100 * x:.1f} %"


def prevalence_reading(prev: PrevalenceCheck) -> str:
    """The "what to do" line, chosen from the computed values (never fixed text).

    Compares the batch rule the check measured (``prev.batch_kind``, named by its kind) with
    the fixed cut at the lowest mixed prevalence (balanced accuracy) and in all-unsafe batches
    (share flagged), quotes both comparisons with their numbers, and advises from whichever is
    behind by more than 2 points.
    """
    mixed = sorted(p for p in prev.rules if p < 1.0)
    if not mixed:
        return "no mixed batch was simulated."
    kind = prev.batch_kind
    name = f"the {kind} rule"
    lo = mixed[0]
    b_lo = prev.rules[lo][kind].balanced_accuracy.value
    f_lo = prev.rules[lo]["frozen"].balanced_accuracy.value
    all_u = prev.rules.get(1.0)
    bt = all_u[kind].tpr.value if all_u else math.nan
    ft = all_u["frozen"].tpr.value if all_u else math.nan
    if not all(math.isfinite(v) for v in (b_lo, f_lo)):
        return "the rules could not be compared here (a class is missing from the batches)."
    at = f"{round(100 * lo)} % unsafe"
    ba = f"balanced accuracy at {at}: {kind} {_pct(b_lo)}, fixed cut {_pct(f_lo)}"
    has_all = math.isfinite(bt) and math.isfinite(ft)
    flag = f"share flagged in all-unsafe batches: {kind} {_pct(bt)}, fixed cut {_pct(ft)}"
    behind = [
        c for c, bad in ((ba, b_lo < f_lo - _SAME), (flag, has_all and bt < ft - _SAME)) if bad
    ]
    level = [c for c in (ba, flag) if c not in behind and (c is ba or has_all)]
    if behind:
        also = f" ({'; '.join(level)})" if level else ""
        return (
            f"{name} falls behind the fixed cut: {'; '.join(behind)}{also} → use a "
            "frozen or conformal cut where prevalence moves."
        )
    if b_lo > f_lo + _SAME:
        return (
            f"{name} beats the fixed cut even at {at} ({'; '.join(level)}) → the fixed "
            "cut is misplaced for this score: refit it (frozen or conformal) before relying on "
            "either."
        )
    return (
        f"{name} and the fixed cut agree within {100 * _SAME:.0f} points "
        f"({'; '.join(level)}) → prevalence does not separate the rules on this score; prefer "
        "the one that needs no batch (frozen or conformal)."
    )


class PrevalenceCardCheck(CardCheck):
    """:func:`prevalence_check` at six prevalences with the card's direct cut as the fixed cut
    and the guard's default conformal target (PAC, alpha and delta of the context)."""

    name: ClassVar[str] = "prevalence"
    title: ClassVar[str] = "Prevalence"
    explanation: ClassVar[str] = (
        "Threshold rules the guard would run (its own rule score ≥ t, ties UNSAFE) on batches "
        "resampled to 10–100 % unsafe, named by the guard's kinds: batch (the paper's rule: "
        "Avg-2 refitted on the member scores of each batch, medians, IQRs and weights, cut at "
        "its mean), batch_frozen_iqr (the batch mean of the fixed S: only the mean refitted), "
        "the fixed cut and the PAC conformal cut; balanced accuracy and share flagged per "
        "level (bands over resamples). The gain and recovery rows are the batch rule named in "
        "batch_rule. The last row reads these numbers and says what to do."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        prev = prevalence_check(
            ctx.table,
            policy_cut=ctx.direct_cut,
            prevalences=_CARD_PREVALENCES,
            alpha=ctx.alpha,
            delta=ctx.delta,
            rng=ctx.rng,
            batch_rule=batch_rule_for(ctx.table, ctx.log, fallback_cut=ctx.direct_cut),
        )
        levels = sorted(prev.rules)
        data: dict[str, object] = {
            f"unsafe_{round(100 * p)}": {
                "rules": {
                    rule: {"balanced_accuracy": o.balanced_accuracy, "tpr": o.tpr, "fpr": o.fpr}
                    for rule, o in prev.rules[p].items()
                },
                "batch_gain": prev.gain[p],
                "batch_recovery": prev.recovery[p],
            }
            for p in levels
        }
        data["batch_rule"] = prev.batch_kind
        data["batch_rule_note"] = prev.batch_note
        kind = prev.batch_kind
        rows: list[tuple[str, str]] = [("batch rule measured", f"{kind}: {prev.batch_note}")]

        def each(r: Mapping[str, RuleOutcome], what: str) -> str:
            return ", ".join(
                f"{RULE_WORDS[name]} "
                + (
                    "not measured (no member scores)"
                    if name == "batch" and prev.batch_kind != "batch"
                    else fmt(getattr(r[name], what))
                )
                for name in RULES
            )

        for p in levels:
            r = prev.rules[p]
            if p < 1.0:
                rows.append(
                    (
                        f"{round(100 * p)} % unsafe: balanced accuracy",
                        f"{each(r, 'balanced_accuracy')}; {kind} − fixed cut "
                        f"{fmt(prev.gain[p], signed=True)}, recovery "
                        f"{fmt(prev.recovery[p], pct=False)}",
                    )
                )
            rows.append(
                (
                    "all unsafe: share flagged"
                    if p == 1.0
                    else f"{round(100 * p)} % unsafe: share of unsafe flagged",
                    each(r, "tpr"),
                )
            )
        reading = prevalence_reading(prev)
        data["reading"] = reading
        rows.append(("what to do", reading))
        ps = np.array(sorted(prev.rules))
        display = PrevalenceDisplay(
            ps,
            {
                rule: np.array([prev.rules[p][rule].balanced_accuracy.value for p in ps])
                for rule in RULES
            },
            {rule: np.array([prev.rules[p][rule].tpr.value for p in ps]) for rule in RULES},
        )
        return CheckResult(data, tuple(rows), {"prevalence": display}, prev)
