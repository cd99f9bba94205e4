"""The guard's ``batch`` rule as the card measures it: on the member scores of every resampled
batch and every bootstrap draw (seed 000, Supp. Sec. C: "These intervals refit the batch
statistics (the batch mean, and for the average its medians, IQRs and weights) on every draw").

The card evaluates two batch rules and names each by the guard's kind:

``batch``
    The paper's rule, :class:`~spotstop.guard.policies.BatchPolicy`: Avg-2 refitted on the
    batch (medians, IQRs and weights), cut at its mean.  It needs the member scores of each
    case (``CaseTable.member_scores``); :func:`batch_rule_for` builds it, and
    :meth:`BatchRule.unsafe` labels a batch of cases by calling the policy's own
    ``thresholds`` and ``complete`` and the guard's rule
    :func:`~spotstop.guard.policies.unsafe_mask`, exactly as
    :func:`~spotstop.guard.policies.decide_batch` labels it (without building a verdict
    object per scene).  No statistic of the rule is computed here.
``batch_frozen_iqr``
    The batch mean of the fixed fused score ``S`` (the policy file's frozen medians and IQRs;
    only the mean is refitted): :class:`~spotstop.guard.policies.BatchFrozenIqrPolicy`.  The
    vectorized group bootstrap (:mod:`._engine`) measures this one, cheaply, over all its
    draws; the card reports it under its own name.

Which settings: those ``spotstop recalibrate --policy batch`` would fit: ``weights`` and
``min_batch`` of the deployed policy where it has them, else the kind's defaults (equal
weights, ``min_batch`` 2); the fallback is the frozen cut at the card's direct cut.  Reliance
weights read each member's request-only score, which only a decision log holds; without it
they cannot be evaluated and the card says so (:attr:`BatchRule.note`) and evaluates equal
weights.

:func:`batch_rule_bootstrap` gives ``A_batch``, ``batch_gain`` and ``batch_recovery`` of the
``batch`` rule with a group-bootstrap interval: each draw's resampled cases form one batch
(each case repeated as often as its group was drawn), the rule is refitted on it, and its
labels are scored on the draw's paired cases with the pair weights of ``A``; ``A`` and
``A*`` come from :class:`~spotstop.diagnostics._engine.CurveEngine` on the same draws.  It is a
Python loop over draws (about 0.2 ms a draw at 1,200 cases), so the card runs it with its
checks' draws (``n_boot_checks``), not the fields' 10,000.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._engine import ROOM_TOL, CurveEngine
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._resample import (
    as_rng,
    draw_group_counts,
    nan_estimate,
    percentile_ci,
    ratio_estimate,
    resampling_groups,
)
from spotstop.diagnostics._results import Estimate
from spotstop.guard import Avg2Fusion, FusionError
from spotstop.guard.policies import BatchInputs, BatchPolicy, FrozenPolicy, Policy, unsafe_mask

if TYPE_CHECKING:
    from spotstop.diagnostics._from_log import LogData

__all__ = [
    "BATCH_FIELDS",
    "BatchRule",
    "batch_rule_bootstrap",
    "batch_rule_for",
    "pair_accuracy",
]

#: the card fields of the ``batch`` rule (:func:`batch_rule_bootstrap`)
BATCH_FIELDS = ("A_batch", "batch_gain", "batch_recovery")


@dataclass(frozen=True, eq=False)
class BatchRule:
    """A batch policy and the table's scores it runs on (arrays aligned with the table rows).

    policy: the policy whose labels are measured (a :class:`BatchPolicy`; any batch kind
    works). fusion: its members (``BatchPolicy`` reads only which members fuse). fused: the
    table's ``S``. members: member name → the table's raw scores. members_text: member name →
    request-only scores (reliance weights), or None. note: how the rule was set up, in words.
    """

    policy: Policy
    fusion: Avg2Fusion
    fused: NDArray[np.float64]
    members: Mapping[str, NDArray[np.float64]]
    members_text: Mapping[str, NDArray[np.float64]] | None = None
    note: str = ""

    @property
    def kind(self) -> str:
        """The measured policy's kind (what ``spotstop recalibrate --policy`` takes)."""
        return self.policy.kind

    def inputs(self, idx: NDArray[np.intp]) -> BatchInputs:
        """The batch of the table's cases ``idx`` (in that order, repeats allowed)."""
        text = (
            None if self.members_text is None else {m: v[idx] for m, v in self.members_text.items()}
        )
        return BatchInputs(
            fused=self.fused[idx],
            members={m: v[idx] for m, v in self.members.items()},
            situation_ids=(None,) * int(idx.size),
            fusion=self.fusion,
            members_text=text,
        )

    def unsafe(self, idx: NDArray[np.intp]) -> NDArray[np.bool_]:
        """The guard's labels (True: UNSAFE) of the batch made of the cases ``idx``: the
        policy's thresholds, the one rule ``score ≥ threshold`` (ties and NaN UNSAFE) and
        fail-closed where a needed score is missing, as ``decide_batch`` labels."""
        x = self.inputs(np.asarray(idx, dtype=np.intp))
        t = self.policy.thresholds(x, None)
        complete = np.asarray(self.policy.complete(x, None), dtype=bool)
        return np.asarray(unsafe_mask(t.score, t.threshold) | ~complete, dtype=bool)


def _deployed_config(log: LogData | None) -> Any:
    """The stored policy that made the log's last decision (else the last stored), or None."""
    v = None if log is None else log.deployed_version()
    return None if v is None or log is None else log.policies[v]


def _log_text(
    table: CaseTable, log: LogData, members: tuple[str, ...]
) -> dict[str, NDArray[np.float64]] | None:
    """Each member's logged request-only score, aligned with the table's rows by decision id
    (None when the log lacks one for a member or a case)."""
    text = getattr(log.arrays, "member_scores_text", None) or {}
    if any(m not in text for m in members):
        return None
    row = {str(d): i for i, d in enumerate(np.asarray(log.arrays.decision_id).tolist())}
    try:
        rows = np.array([row[str(c)] for c in table.case_id.tolist()], dtype=np.intp)
    except KeyError:
        return None
    return {m: np.asarray(text[m], dtype=np.float64)[rows] for m in members}


def batch_rule_for(
    table: CaseTable, log: LogData | None = None, *, fallback_cut: float = 0.0
) -> BatchRule | None:
    """The ``batch`` rule the card measures (see the module docstring), or None when the
    table holds no member scores to refit it on.

    Members: the deployed policy's fusion members when the log has one and the table holds
    their scores; else every member of ``CaseTable.member_scores`` (a scores CSV's
    ``score_<member>`` columns).
    """
    cfg = _deployed_config(log)
    have = dict(table.member_scores)
    fusion: Avg2Fusion | None = None
    if cfg is not None and all(m in have for m in cfg.fusion.members):
        fusion = cfg.fusion
        where = f"the members of the deployed policy's fusion ({', '.join(fusion.members)})"
    elif have:
        try:
            fusion = Avg2Fusion.fit({m: v[np.isfinite(v)] for m, v in have.items()})
        except FusionError:
            return None
        where = f"the table's member scores ({', '.join(fusion.members)})"
    if fusion is None:
        return None
    members = {m: np.asarray(have[m], dtype=np.float64) for m in fusion.members}
    current = None if cfg is None else cfg.policy
    weights = str(getattr(current, "weights", "equal"))
    min_batch = int(getattr(current, "min_batch", 2))
    text = None
    note = f"the batch rule (Avg-2 refitted on every batch) on {where}"
    if weights == "reliance":
        text = None if log is None else _log_text(table, log, fusion.members)
        if text is None:
            weights = "equal"
            note += (
                "; the deployed policy's reliance weights need each member's request-only "
                "score, which these cases lack: evaluated with equal weights"
            )
        else:
            note += "; reliance weights (the deployed policy's)"
    policy = BatchPolicy(
        fallback=FrozenPolicy(threshold=float(fallback_cut)), min_batch=min_batch, weights=weights
    )
    return BatchRule(policy, fusion, np.asarray(table.score, dtype=np.float64), members, text, note)


def pair_accuracy(
    unsafe: NDArray[np.bool_], label: NDArray[np.int8], weight: NDArray[np.float64]
) -> float:
    """Balanced accuracy of the labels ``unsafe`` over cases weighted by ``weight`` (a case's
    number of pairs times how often it was drawn): the pair accuracy ``A`` is this for the
    direct answer. NaN when a class has no weight."""
    ws = weight * (label == 0)
    wu = weight * (label == 1)
    ts, tu = float(ws.sum()), float(wu.sum())
    if ts <= 0 or tu <= 0:
        return math.nan
    tnr = float((ws * ~unsafe).sum()) / ts
    tpr = float((wu * unsafe).sum()) / tu
    return 0.5 * (tpr + tnr)


def _draw_accuracy(
    rule: BatchRule, mult: NDArray[np.intp], label: NDArray[np.int8], pw: NDArray[np.float64]
) -> float:
    """``A_batch`` of one draw: the rule refitted on the batch of the drawn cases (case ``i``
    ``mult[i]`` times), scored on the paired ones."""
    n = mult.size
    idx = np.repeat(np.arange(n, dtype=np.intp), mult)
    if idx.size == 0:
        return math.nan
    lab = rule.unsafe(idx)
    first = np.cumsum(mult) - mult  # where each drawn case's first copy sits
    case_lab = np.zeros(n, dtype=bool)
    drawn = mult > 0
    case_lab[drawn] = lab[first[drawn]]  # every copy of a case gets the same label
    return pair_accuracy(case_lab, label, pw * mult)


def batch_rule_bootstrap(
    table: CaseTable,
    rule: BatchRule | None,
    *,
    cut: float = 0.0,
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = None,
    group_by: str = "situation",
) -> Mapping[str, Estimate]:
    """``A_batch``, ``batch_gain = A_batch − A`` and ``batch_recovery = (A_batch − A)/(A* −
    A)`` of ``rule`` with group-bootstrap percentile intervals (``n_boot`` draws), the rule
    refitted on every draw's cases (see the module docstring).

    ``A`` and ``A*`` are the engine's, at the direct cut ``cut`` on ``S``, on the same draws.
    The recovery is undefined (NaN, with an
    :class:`~spotstop.diagnostics._resample.UnboundedRatioWarning`) when the threshold part's
    interval reaches 0.  ``rule`` None (no member scores) or no contrasts: NaN with an
    :class:`UndefinedMetricWarning`.
    """
    nan = MappingProxyType(dict.fromkeys(BATCH_FIELDS, nan_estimate(table.pairs.n)))
    if rule is None:
        warnings.warn(
            "the batch rule (A_batch, batch_gain, batch_recovery: Avg-2 refitted on every "
            "draw) is undefined: the cases hold no member scores to refit it on (give "
            "score_<member> columns); the card reports batch_frozen_iqr (only the mean "
            "refitted) instead; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return nan
    groups = resampling_groups(table, group_by)
    prep = CurveEngine.build(table, cut, groups)
    if prep.n_pairs == 0:
        return nan
    gen = as_rng(rng)
    ng = prep.n_groups
    label, pw = table.label, table.pairs.weight
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        full = prep.statistics(np.ones((1, ng)), None)
    a_pt, star_pt = float(full["A"][0]), float(full["A_star"][0])
    batch_pt = _draw_accuracy(rule, np.ones(len(table), dtype=np.intp), label, pw)
    a_d, star_d, batch_d = [], [], []
    for counts in draw_group_counts(ng, n_boot, gen):
        st = prep.statistics(counts, None)
        a_d.append(st["A"])
        star_d.append(st["A_star"])
        mult = counts[:, groups].astype(np.intp)
        batch_d.append(np.array([_draw_accuracy(rule, m, label, pw) for m in mult]))
    a, star, ab = np.concatenate(a_d), np.concatenate(star_d), np.concatenate(batch_d)
    n = prep.n_pairs

    def tidy(x: float) -> float:
        return 0.0 if abs(x) <= ROOM_TOL else x

    gain = np.where(np.abs(ab - a) <= ROOM_TOL, 0.0, ab - a)
    gain_pt = tidy(batch_pt - a_pt)
    return MappingProxyType(
        {
            "A_batch": Estimate(batch_pt, percentile_ci(ab), n),
            "batch_gain": Estimate(gain_pt, percentile_ci(gain), n),
            "batch_recovery": ratio_estimate(
                gain_pt,
                tidy(star_pt - a_pt),
                gain,
                star - a,
                n,
                what="batch_recovery (A_batch − A)/(A* − A) of the batch rule",
                instead="batch_gain = A_batch − A",
                tol=ROOM_TOL,
            ),
        }
    )
