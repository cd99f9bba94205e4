"""Which threshold policy fits a deployment, and why (from the diagnostics of seed 000).

:func:`recommend_policy` reads the labelled, scored decisions (a
:class:`spotstop.diagnostics.CaseTable` with the fused scores of the fusion being fitted) and what
the log says about situations, runs three diagnostics and applies a fixed rule.

Evidence
    * conformal: whether the labelled unsafe cases (one per situation) suffice for the
      requested guarantee, and how many are missing.
    * prevalence (``diagnostics.prevalence_check`` at 50 %, 10 % and 100 % unsafe, the guard's
      rule ``score ≥ t``): balanced accuracy of the batch rule and of the frozen cut at 10 %
      unsafe, and the share of unsafe scenes each flags in all-unsafe batches (TPR at π = 1).
      The batch rule is the guard's ``batch`` policy itself (Avg-2 refitted on each batch's
      member scores, the settings ``recalibrate --policy batch`` would fit) where the cases
      hold member scores, else ``batch_frozen_iqr`` (the batch mean of the fixed S);
      ``evidence["batch_rule"]`` names it, and its numbers are the ``batch_*`` evidence.
    * situation share (``diagnostics.situation_share``): ICC of the label-adjusted score at
      situation level and the balanced-accuracy gain of recentering on real over artificial
      situations (with its group-bootstrap interval).
    * threshold part (``diagnostics.cross_fitted_threshold_part`` at the frozen cut t₀):
      balanced accuracy a shared cut fitted on other groups would add over t₀.
    * repeat: the share of usable logged decisions whose situation already had ``min_refs``
      earlier decisions (how often a situation policy would be active rather than falling
      back).

Rule (first match)
    1. conformal, when the labelled unsafe situations suffice for the requested guarantee:
       the only policy with a stated miss-rate guarantee; it labels single scenes and does
       not move with prevalence. (Situation recentering is named as an alternative when its
       gain interval lies above zero.)
    2. situation, when the recentering gain interval lies above zero AND at least half of the
       decisions would have ``min_refs`` references (repeat ≥ 0.5); falls back to frozen.
    3. the measured batch rule (``batch``, or ``batch_frozen_iqr`` without member scores: the
       kind whose numbers decided), when it is no worse than frozen at 10 % unsafe AND flags at
       least as many unsafe scenes as frozen in all-unsafe batches (both measured with the
       guard's rule; the reason names the rule and whichever failed).
    4. frozen otherwise; a threshold part above 2 points is reported as room a conformal
       cut could take once enough unsafe situations are labelled.
    Without labelled cases of both classes only rules 2 (on repeat alone) and 4 can apply,
    and the recommendation says that nothing was measured.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from spotstop.diagnostics._batch_rule import BatchRule, batch_rule_for
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._engine import cross_fitted_threshold_part
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._prevalence import PrevalenceCheck, prevalence_check
from spotstop.diagnostics._resample import UnboundedRatioWarning, as_rng
from spotstop.diagnostics._situation import situation_share
from spotstop.guard.policies import conformal_cut

if TYPE_CHECKING:
    from spotstop.diagnostics._from_log import LogData

__all__ = [
    "Recommendation",
    "recommend_for_card",
    "recommend_policy",
    "situation_repeat_share",
]

THRESHOLD_PART_ROOM = 0.02
"""A threshold part above this (2 points of balanced accuracy) is reported as room."""

REPEAT_MIN = 0.5
"""The situation policy needs references for at least this share of decisions."""


@dataclass(frozen=True)
class Recommendation:
    """The recommended policy kind, the reasons in words, and the numbers behind them.

    policy: ``"conformal"``, ``"situation"``, ``"batch"``, ``"batch_frozen_iqr"`` (the batch
    rule measured, when member scores were missing) or ``"frozen"``.
    reasons: sentences, most important first. alternatives: other kinds worth a look, with
    why. evidence: the diagnostics' values (NaN where undefined). warnings: messages of the
    diagnostics' :class:`~spotstop.diagnostics.UndefinedMetricWarning` (collected, not raised).
    """

    policy: str
    reasons: tuple[str, ...]
    alternatives: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"recommended policy: {self.policy}"]
        lines += [f"  - {r}" for r in self.reasons]
        lines += [f"  alternative: {a}" for a in self.alternatives]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (NaN as None) for JSON and ``policy.yaml`` provenance."""

        def plain(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, Mapping):
                return {k: plain(x) for k, x in v.items()}
            return v

        return {
            "policy": self.policy,
            "reasons": list(self.reasons),
            "alternatives": list(self.alternatives),
            "evidence": plain(dict(self.evidence)),
            "warnings": list(self.warnings),
        }


def situation_repeat_share(
    situation_id: Any, usable: Any | None = None, *, min_refs: int = 3
) -> float:
    """Share of (usable) decisions whose situation had ``min_refs`` earlier usable decisions.

    Decisions are taken in the given (time) order; ``''``/None is no situation (never
    active). NaN for no decisions.
    """
    sids = list(situation_id)
    ok = [True] * len(sids) if usable is None else [bool(u) for u in usable]
    seen: dict[str, int] = {}
    active = total = 0
    for s, u in zip(sids, ok, strict=True):
        if not u:
            continue
        total += 1
        if s:
            if seen.get(s, 0) >= min_refs:
                active += 1
            seen[s] = seen.get(s, 0) + 1
    return active / total if total else math.nan


def recommend_policy(
    table: CaseTable | None,
    *,
    frozen_cut: float,
    conformal_feasible: bool,
    conformal_needed: int,
    n_unsafe_situations: int,
    guarantee: str = "pac",
    alpha: float = 0.1,
    delta: float = 0.1,
    repeat_share: float = math.nan,
    min_refs: int = 3,
    n_resamples: int = 200,
    rng: np.random.Generator | int | None = 0,
    batch_rule: BatchRule | Literal["auto"] | None = "auto",
    prevalence: PrevalenceCheck | None = None,
) -> Recommendation:
    """Recommend a policy kind from the diagnostics (see the module docstring for the rule).

    table: a :class:`spotstop.diagnostics.CaseTable` of labelled scored decisions (score = fused
        score under the fusion being fitted), or None when nothing is labelled.
    frozen_cut: t₀ on the same scale. conformal_feasible / conformal_needed /
        n_unsafe_situations: from the conformal fit of the requested ``guarantee``.
    repeat_share: from :func:`situation_repeat_share` on the log. rng: seed or Generator
        for the resampling diagnostics (``n_resamples`` each). batch_rule: the batch rule to
        measure (:func:`~spotstop.diagnostics._batch_rule.batch_rule_for`; ``"auto"``: built
        from the table with its fallback at ``frozen_cut``; None: ``batch_frozen_iqr`` only).
    prevalence: a prevalence check already run on ``table`` at 50 %, 10 % and 100 % unsafe
        (among others) with the same batch rule: the card's, so that the recommendation quotes
        the numbers of the card's prevalence table, not a second draw of them.
    """
    gen = as_rng(rng)
    g_text = (
        f"PAC (alpha={alpha:g}, delta={delta:g})"
        if guarantee == "pac"
        else f"marginal (alpha={alpha:g})"
    )
    ev: dict[str, Any] = {
        "conformal_feasible": conformal_feasible,
        "unsafe_situations": n_unsafe_situations,
        "unsafe_situations_needed": conformal_needed,
        "repeat_share": repeat_share,
    }
    labelled = table is not None and len(set(np.asarray(table.label).tolist())) == 2
    caught: list[str] = []
    if labelled and table is not None:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always", UndefinedMetricWarning)
            # the recommendation reads no recovery ratio: its warning is not this rule's
            warnings.simplefilter("ignore", UnboundedRatioWarning)
            needed = {0.5, 0.1, 1.0}
            prev = (
                prevalence
                if prevalence is not None and needed <= set(prevalence.rules)
                else prevalence_check(
                    table,
                    policy_cut=frozen_cut,
                    prevalences=(0.5, 0.1, 1.0),
                    n_resamples=n_resamples,
                    alpha=alpha,
                    delta=delta,
                    guarantee="pac" if guarantee == "pac" else "marginal",
                    rng=gen,
                    batch_rule=batch_rule,
                )
            )
            sit = situation_share(table, n_boot=n_resamples, n_permutations=50, rng=gen)
            cf = cross_fitted_threshold_part(table, cut=frozen_cut, n_splits=n_resamples, rng=gen)
        caught = sorted({str(w.message) for w in rec})
        kind = prev.batch_kind
        ev.update(
            batch_rule=kind,
            batch_rule_note=prev.batch_note,
            batch_ba_50=prev.rules[0.5][kind].balanced_accuracy.value,
            frozen_ba_50=prev.rules[0.5]["frozen"].balanced_accuracy.value,
            batch_ba_10=prev.rules[0.1][kind].balanced_accuracy.value,
            frozen_ba_10=prev.rules[0.1]["frozen"].balanced_accuracy.value,
            batch_tpr_all_unsafe=prev.rules[1.0][kind].tpr.value,
            frozen_tpr_all_unsafe=prev.rules[1.0]["frozen"].tpr.value,
            situation_icc=sit.icc.value,
            situation_ba_gain=sit.ba_gain.value,
            situation_ba_gain_low=sit.ba_gain.ci.low,
            situation_ba_gain_high=sit.ba_gain.ci.high,
            threshold_part=cf.value,
        )
    sit_gain_low = float(ev.get("situation_ba_gain_low", math.nan))
    sit_helps = math.isfinite(sit_gain_low) and sit_gain_low > 0
    repeats = math.isfinite(repeat_share) and repeat_share >= REPEAT_MIN
    reasons: list[str] = []
    alts: list[str] = []

    pct = _pct

    if conformal_feasible:
        policy = "conformal"
        reasons.append(
            f"{n_unsafe_situations} labelled unsafe situations suffice for the {g_text} "
            "guarantee: conformal is the only policy with a stated miss-rate guarantee, labels "
            "single scenes, and does not move with the share of unsafe scenes."
        )
        if sit_helps and repeats:
            alts.append(
                "situation: recentering on the situation gains "
                f"{pct(ev['situation_ba_gain'])} balanced accuracy over artificial situations "
                f"(interval above zero) and {pct(repeat_share)} of decisions have references, "
                "but it carries no miss-rate guarantee."
            )
    elif sit_helps and repeats:
        policy = "situation"
        reasons.append(
            f"recentering on the situation gains {pct(ev['situation_ba_gain'])} balanced "
            f"accuracy over artificial situations (interval [{pct(sit_gain_low)}, "
            f"{pct(ev['situation_ba_gain_high'])}] above zero; situation share ICC "
            f"{ev['situation_icc']:.2f}), and {pct(repeat_share)} of decisions have ≥ {min_refs} "
            "earlier decisions of their situation."
        )
        reasons.append(
            "caveat: it needs both classes among a situation's references; in an all-safe "
            "situation it calls some safe scenes unsafe."
        )
    elif not labelled and repeats:
        policy = "situation"
        reasons.append(
            f"no labelled cases of both classes, so nothing was measured; {pct(repeat_share)} "
            f"of decisions have ≥ {min_refs} earlier decisions of their situation, which a "
            "situation policy needs. Label decisions to check that recentering helps."
        )
    elif labelled and _batch_holds(ev):
        policy = str(ev["batch_rule"])
        reasons.append(
            f"{_rule_words(ev)} holds at 10% unsafe (balanced accuracy "
            f"{pct(ev['batch_ba_10'])} vs frozen {pct(ev['frozen_ba_10'])}) and flags "
            f"{pct(ev['batch_tpr_all_unsafe'])} of an all-unsafe batch (frozen "
            f"{pct(ev['frozen_tpr_all_unsafe'])})."
        )
    else:
        policy = "frozen"
        if labelled:
            reasons.append(_batch_reason(ev))
            if not sit_helps:
                reasons.append(
                    "recentering on the situation shows no gain over artificial situations "
                    f"(lower bound {pct(sit_gain_low)})."
                )
            elif not repeats:
                reasons.append(
                    f"recentering would help, but only {pct(repeat_share)} of decisions have "
                    f"≥ {min_refs} references from their situation."
                )
        else:
            reasons.append(
                "no labelled cases of both classes, so the diagnostics could not run; the frozen "
                "cut needs no labels and labels single scenes."
            )
    if not conformal_feasible:
        tp = ev.get("threshold_part", math.nan)
        room = (
            f" (the frozen cut leaves {pct(tp)} to a better cut)"
            if isinstance(tp, float) and math.isfinite(tp) and tp > THRESHOLD_PART_ROOM
            else ""
        )
        reasons.append(
            f"conformal ({g_text}) needs {conformal_needed} labelled unsafe situations; the log "
            f"has {n_unsafe_situations}, so {max(0, conformal_needed - n_unsafe_situations)} "
            f"more are needed{room}."
        )
    return Recommendation(policy, tuple(reasons), tuple(alts), ev, tuple(caught))


def _pct(x: Any) -> str:
    return "n/a" if not isinstance(x, float) or not math.isfinite(x) else f"{100 * x:.1f}%"


def _rule_words(ev: Mapping[str, Any]) -> str:
    """The measured batch rule in words, by its kind."""
    if ev.get("batch_rule") == "batch":
        return (
            "the batch rule (`batch`: Avg-2 refitted on each batch, medians, IQRs and weights, "
            "cut at its mean)"
        )
    return (
        "the batch mean of the fixed score (`batch_frozen_iqr`: frozen medians and IQRs, only "
        "the mean refitted; no member scores to measure the `batch` rule)"
    )


def _batch_reason(ev: Mapping[str, Any]) -> str:
    """Why the batch rule was not chosen, from the values that decided it (rule 3)."""
    b10, f10 = ev.get("batch_ba_10", math.nan), ev.get("frozen_ba_10", math.nan)
    bt, ft = ev.get("batch_tpr_all_unsafe", math.nan), ev.get("frozen_tpr_all_unsafe", math.nan)
    if not all(isinstance(v, float) and math.isfinite(v) for v in (b10, f10, bt, ft)):
        return (
            f"{_rule_words(ev)} is not chosen: how it holds against the frozen cut when "
            "prevalence moves was not measured (too few labelled cases)."
        )
    at10 = f"at 10% unsafe its balanced accuracy is {_pct(b10)} (frozen {_pct(f10)})"
    allu = f"it flags {_pct(bt)} of an all-unsafe batch (frozen {_pct(ft)})"
    fails = []
    if b10 < f10:
        fails.append(at10)
    if bt < ft:
        fails.append(allu)
    held = [x for x in (at10, allu) if x not in fails]
    return (
        f"{_rule_words(ev)} falls behind the frozen cut when prevalence moves: "
        + " and ".join(fails)
        + (f" (while {held[0]})" if held else "")
        + "."
    )


def _batch_holds(ev: Mapping[str, Any]) -> bool:
    b10, f10 = ev.get("batch_ba_10", math.nan), ev.get("frozen_ba_10", math.nan)
    bt, ft = ev.get("batch_tpr_all_unsafe", math.nan), ev.get("frozen_tpr_all_unsafe", math.nan)
    vals = (b10, f10, bt, ft)
    return all(isinstance(v, float) and math.isfinite(v) for v in vals) and b10 >= f10 and bt >= ft


def _latest(log: LogData | None, kind: str) -> Any:
    """The policy of ``kind`` that made the log's latest decision of that kind (its Policy
    object: a version activated again after a later one is the one in force), else the last
    stored one of that kind, or None."""
    v = None if log is None else log.deployed_version(kind=kind)
    return None if v is None or log is None else log.policies[v].policy


def recommend_for_card(
    table: CaseTable,
    log: LogData | None,
    *,
    frozen_cut: float,
    n_resamples: int = 200,
    rng: np.random.Generator | int | None = 0,
    prevalence: PrevalenceCheck | None = None,
) -> Recommendation:
    """:func:`recommend_policy` with what it needs taken from the card's inputs (and the
    card's own prevalence check, ``prevalence``, when it ran one).

    The batch rule is :func:`~spotstop.diagnostics._batch_rule.batch_rule_for` the table and
    the log (the deployed fusion's members, the settings ``recalibrate --policy batch`` would
    fit), with its fallback at ``frozen_cut``.

    The conformal target is the log's latest conformal policy's (alpha, delta or marginal),
    else PAC alpha = delta = 0.1 (the guard's default); its feasibility is the guard's
    :func:`~spotstop.guard.policies.conformal_cut` on the labelled unsafe cases (one per
    situation).  The repeat share is :func:`situation_repeat_share` over the logged decisions
    that did not fail closed and have a finite fused score, in log order (the table's cases
    in its order for a scores CSV), with ``min_refs`` of the log's latest situation policy
    (else 3).
    """
    conf = _latest(log, "conformal")
    alpha = 0.1 if conf is None else conf.alpha
    delta = 0.1 if conf is None else conf.delta
    guarantee: Literal["pac", "marginal"] = (
        "marginal" if conf is not None and delta is None else "pac"
    )
    unsafe = table.label == 1
    fit = conformal_cut(
        table.score[unsafe], table.situation_id[unsafe], alpha=alpha, delta=delta or 0.1
    ).chosen(guarantee)
    sit_policy = _latest(log, "situation")
    min_refs = 3 if sit_policy is None else int(sit_policy.min_refs)
    if log is None:
        repeat = situation_repeat_share(table.situation_id, min_refs=min_refs)
    else:
        arr = log.arrays
        usable = log.counting(needs="fused").mask  # the log's one rule, no label needed
        sids = log.within_robot(arr.situation_id)  # a fleet: situations within a robot
        repeat = situation_repeat_share(sids, usable, min_refs=min_refs)
    return recommend_policy(
        table,
        frozen_cut=frozen_cut,
        conformal_feasible=fit.feasible,
        conformal_needed=fit.n_needed,
        n_unsafe_situations=fit.n,
        guarantee=guarantee,
        alpha=alpha,
        delta=0.1 if delta is None else delta,
        repeat_share=repeat,
        min_refs=min_refs,
        n_resamples=n_resamples,
        rng=rng,
        batch_rule=batch_rule_for(table, log, fallback_cut=frozen_cut),
        prevalence=prevalence,
    )
