"""The conformal audit: does each deployed conformal cut keep its guarantee?  And its card check.

Audit of a deployed cut
    For each ``conformal`` policy version the log holds (its ``policy.yaml``: alpha, delta for
    the PAC guarantee or none for the marginal one, n, k, threshold, created), and each
    ``cascade`` whose cut is conformal (its answers are on the cascade's score, which is the
    first member's alone outside the band, so the cut's guarantee on the pair's S need not
    carry over: the audit is how to know), and each policy whose fallback is a conformal cut
    (``situation``, ``batch``: only the decisions the fallback made, whose logged
    ``deciding_kind`` is ``conformal``), the unit is the
    guarantee's: ONE labelled unsafe decision per situation (its first in time; a decision
    without a situation is its own), among the decisions that version made with that cut
    after it was created and that did not fail closed.  A miss is the guard's logged answer SAFE.  The
    card reports the misses ``x`` of ``n`` situations, the miss rate ``x/n`` with its exact
    two-sided 95 % Clopper–Pearson interval, and the one-sided exact binomial test of
    ``H0: miss rate ≤ alpha`` against ``miss rate > alpha``: ``p = P(Binomial(n, alpha) ≥ x)``.

    status: ``violated`` when ``p < level`` (0.05); else ``not enough data`` when ``n`` is
    below :func:`audit_min_n` (the fewest situations from which a miss rate of twice alpha is
    significant at that level for every larger count; 0 situations included), or when the
    cut's SAFE answers were reviewed less often than its UNSAFE answers (one-sided Fisher
    exact test at that level, over its decisions since created that did not fail closed: a
    miss is a SAFE answer, so misses left unreviewed make the miss rate look lower than it
    is; ``label_note`` says so); else ``holds``.

    The PAC guarantee says the miss rate exceeds alpha for at most a share delta of
    calibration sets, so ``violated`` is strong evidence against it.  The marginal guarantee
    holds on average over calibrations only: a given cut's miss rate exceeds alpha with
    probability ``p_cut_above_alpha = P(Binomial(n_cal, alpha) ≤ k − 1)``
    (:func:`spotstop.guard.policies.binom_cdf`), which the card states beside the test.

Split simulation (what if)
    Without a deployed conformal cut (a scores CSV, the demo, a log of other policies) the
    card can still say what the guard's conformal cut would do here:
    :func:`conformal_split_simulation` fits :func:`spotstop.guard.policies.conformal_cut` on
    the unsafe cases of a random ``calibration_share`` of the groups (one case per situation)
    and counts, with the guard's rule (``S ≥ cut``), the held-out unsafe situations it misses
    and the safe cases it allows, over many splits (bands over splits, not intervals).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt, fmt_p
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._delivered import review_gap, reviewed_answers
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import LogData
from spotstop.diagnostics._metrics import _undefined
from spotstop.diagnostics._resample import as_rng, band, nan_estimate, split_groups
from spotstop.diagnostics._results import ConfidenceInterval, Estimate
from spotstop.guard.policies import (
    ConformalPolicy,
    Policy,
    binom_cdf,
    unsafe_mask,
)
from spotstop.guard.policies import conformal_cut as guard_conformal_cut

__all__ = [
    "AUDIT_LEVEL",
    "ConformalAuditCheck",
    "DeployedAudit",
    "SplitSimulation",
    "audit_deployed",
    "audit_min_n",
    "binomial_upper_p",
    "clopper_pearson",
    "conformal_cut",
    "conformal_split_simulation",
]

AUDIT_LEVEL = 0.05
"""Level of the one-sided binomial test of the audit."""

_TEST = (
    "one-sided exact binomial test of H0: miss rate ≤ alpha, p = P(Binomial(n, alpha) ≥ misses), "
    "at level {level:g}; one case per situation; exact (Clopper–Pearson) 95 % interval"
)


def _check_counts(x: int, n: int, **rates: float) -> None:
    if not (isinstance(n, int | np.integer) and isinstance(x, int | np.integer) and 0 <= x <= n):
        raise DataError(f"need whole counts 0 <= x <= n; got x={x!r}, n={n!r}.")
    for name, r in rates.items():
        if not 0.0 < r < 1.0:
            raise DataError(f"{name} must be in (0, 1); got {r!r}.")


def clopper_pearson(x: int, n: int, confidence: float = 0.95) -> ConfidenceInterval:
    """Exact two-sided interval of a binomial proportion: ``Beta(a/2; x, n−x+1)`` to
    ``Beta(1−a/2; x+1, n−x)`` (0 and 1 at the ends); NaN for ``n = 0``."""
    _check_counts(x, n, confidence=confidence)
    if n == 0:
        return ConfidenceInterval(math.nan, math.nan)
    a = 1.0 - confidence
    lo = 0.0 if x == 0 else float(stats.beta.ppf(a / 2, x, n - x + 1))
    hi = 1.0 if x == n else float(stats.beta.ppf(1 - a / 2, x + 1, n - x))
    return ConfidenceInterval(lo, hi)


def binomial_upper_p(x: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) ≥ x)``: the one-sided p value of ``x`` successes against rate ``p``;
    NaN for ``n = 0``."""
    _check_counts(x, n, p=p)
    return float(stats.binom.sf(x - 1, n, p)) if n else math.nan


def audit_min_n(alpha: float, level: float = AUDIT_LEVEL, limit: int = 100_000) -> int:
    """The fewest situations from which a miss rate of twice ``alpha`` is significant at
    ``level`` for every count of situations: ``n`` such that ``ceil(2 alpha m)`` misses of
    ``m`` give ``P(Binomial(m, alpha) ≥ ceil(2 alpha m)) < level`` for all ``m ≥ n`` (up to
    ``limit``). Fewer cannot tell a doubled miss rate from chance.

    Not the first ``m`` at which it is significant: rounding the misses up makes that a far
    higher rate at small ``m`` (at ``alpha`` 0.01, one miss of one situation, p = 0.01), and
    significance comes and goes with the rounding before it settles."""
    _check_counts(0, 0, alpha=alpha, level=level)
    m = np.arange(1, limit + 1)
    misses = np.ceil(2 * alpha * m - 1e-9)
    p = stats.binom.sf(misses - 1, m, alpha)
    not_yet = np.flatnonzero(p >= level)
    return 1 if not_yet.size == 0 else min(int(m[not_yet[-1]]) + 1, limit)


@dataclass(frozen=True)
class DeployedAudit:
    """The audit of one deployed conformal cut (see the module docstring).

    The policy's own values: version_id, guarantee, alpha, delta, n_calibration, k, threshold,
    created (ISO 8601), p_cut_above_alpha.  The audit: n_decisions (labelled unsafe, not
    fail-closed, after created), miss_rate (value x/n, Clopper–Pearson interval, n =
    situations), misses, p_value, status, n_min, level.
    """

    version_id: str
    guarantee: str
    alpha: float
    delta: float | None
    n_calibration: int
    k: int
    threshold: float
    created: str
    p_cut_above_alpha: float
    n_decisions: int
    misses: int
    miss_rate: Estimate
    p_value: float
    status: Literal["holds", "violated", "not enough data"]
    n_min: int
    level: float
    kind: str = "conformal"
    """The deployed kind: ``conformal``; ``cascade`` for a cascade whose cut is conformal
    (its answers, on the cascade's score, are audited against the cut's guarantee); or the
    kind whose fallback is the conformal cut (``situation``, ``batch``; its fallback's
    decisions only)."""
    reviewed: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Its decisions since created that did not fail closed: (labelled SAFE answers, SAFE
    answers, labelled UNSAFE answers, UNSAFE answers)."""
    label_note: str = ""
    """Why the miss rate may be under-counted (its SAFE answers reviewed less often than its
    UNSAFE ones); "" when they were not."""

    @property
    def n_situations(self) -> int:
        """Situations audited (one decision each)."""
        return self.miss_rate.n

    def policy_text(self) -> str:
        """``PAC alpha 0.1, delta 0.1; n 150, k 9, threshold -0.312``."""
        g = (
            f"PAC alpha {self.alpha:g}, delta {self.delta:g}"
            if self.delta is not None
            else f"marginal alpha {self.alpha:g}"
        )
        via = {"conformal": "", "cascade": "cascade with a conformal cut, "}.get(
            self.kind, f"{self.kind} with a conformal fallback (its decisions), "
        )
        return f"{via}{g}; n {self.n_calibration}, k {self.k}, threshold {self.threshold:.4g}"

    def to_dict(self) -> dict[str, Any]:
        p = self.p_value
        return {
            "version_id": self.version_id,
            "kind": self.kind,
            "guarantee": self.guarantee,
            "alpha": self.alpha,
            "delta": self.delta,
            "n": self.n_calibration,
            "k": self.k,
            "threshold": self.threshold,
            "created": self.created,
            "p_cut_above_alpha": self.p_cut_above_alpha,
            "n_decisions": self.n_decisions,
            "n_situations": self.n_situations,
            "misses": self.misses,
            "miss_rate": self.miss_rate.to_dict(),
            "p_value": None if math.isnan(p) else p,
            "status": self.status,
            "n_min": self.n_min,
            "level": self.level,
            "test": _TEST.format(level=self.level),
            "reviewed": dict(zip(_REVIEWED, self.reviewed, strict=True)),
            "label_note": self.label_note,
        }


_REVIEWED = ("labelled_safe_answers", "safe_answers", "labelled_unsafe_answers", "unsafe_answers")


def _review_note(reviewed: tuple[int, int, int, int], level: float) -> str:
    """Why the audit cannot say the guarantee holds when the cut's SAFE answers were reviewed
    less often than its UNSAFE ones (:func:`~spotstop.diagnostics._delivered.review_gap`,
    one-sided at ``level``), else ""."""
    gap = review_gap(reviewed, level, one_sided=True)
    if not gap:
        return ""
    return (
        f"its {gap}; a miss is a SAFE answer, so the misses among the unreviewed ones are not "
        "counted: review SAFE answers drawn at random"
    )


def _first_per_situation(
    situation: NDArray[np.object_], rows: NDArray[np.intp]
) -> NDArray[np.intp]:
    """Of ``rows`` (in log order), the first of each situation ('' = its own situation)."""
    seen: set[str] = set()
    out = []
    for i in rows.tolist():
        sid = str(situation[i])
        if sid == "" or sid not in seen:
            out.append(i)
            seen.add(sid)
    return np.asarray(out, dtype=np.intp)


def _conformal_cut_of(pol: Policy) -> ConformalPolicy | None:
    """The conformal cut a deployed policy decides with: itself, a cascade's cut or a fallback
    (:meth:`~spotstop.guard.policies.Policy.inner`, depth first), or None."""
    if isinstance(pol, ConformalPolicy):
        return pol
    for inner in pol.inner():
        found = _conformal_cut_of(inner)
        if found is not None:
            return found
    return None


def decided_by_conformal(log: LogData) -> NDArray[np.bool_]:
    """Per decision of ``log``: whether a conformal cut decided it (its logged
    ``deciding_kind``), whichever policy held the cut (conformal itself, a situation policy's
    fallback, a cascade's cut). The one rule for which decisions a miss-rate guarantee covers:
    the audit and the fleet check read it."""
    return np.asarray(log.arrays.deciding_kind == ConformalPolicy.kind, dtype=bool)


def audit_deployed(log: LogData, *, level: float = AUDIT_LEVEL) -> tuple[DeployedAudit, ...]:
    """Audit every conformal policy version of the log (in order of first appearance), every
    cascade whose cut is conformal and every policy with a conformal fallback: the logged
    answers of the decisions that cut made, against its alpha."""
    out = []
    arr = log.arrays
    by_cut = decided_by_conformal(log)
    answered = log.counting(needs=None).mask  # not fail-closed, labelled or not
    for v, cfg in log.policies.items():
        pol = _conformal_cut_of(cfg.policy)
        if pol is None:
            continue
        created = cfg.created.timestamp()
        mine = (
            (log.version == v) & answered & (np.asarray(arr.time, dtype=float) > created) & by_cut
        )
        reviewed = reviewed_answers(log, mine)
        note = _review_note(reviewed, level)
        use = (
            (log.version == v)
            & log.delivered  # labelled, not fail-closed: the log's one rule
            & (log.label == 1)
            & (np.asarray(arr.time, dtype=float) > created)
            & by_cut  # the decisions the conformal cut made (all of them, but for a fallback)
        )
        rows = _first_per_situation(log.group_ids()[1], np.flatnonzero(use))
        n = int(rows.size)
        x = int((arr.guard_label[rows] == 0).sum())
        p = binomial_upper_p(x, n, pol.alpha)
        n_min = audit_min_n(pol.alpha, level)
        status: Literal["holds", "violated", "not enough data"]
        if n > 0 and p < level:
            status = "violated"  # SAFE answers reviewed less often only hide misses
        elif n < n_min or note:
            status = "not enough data"
        else:
            status = "holds"
        out.append(
            DeployedAudit(
                version_id=v,
                guarantee=pol.guarantee,
                alpha=pol.alpha,
                delta=pol.delta,
                n_calibration=pol.n,
                k=pol.k,
                threshold=pol.threshold,
                created=cfg.created.astimezone(dt.UTC).isoformat(),
                p_cut_above_alpha=binom_cdf(pol.k - 1, pol.n, pol.alpha),
                n_decisions=int(use.sum()),
                misses=x,
                miss_rate=Estimate(x / n if n else math.nan, clopper_pearson(x, n), n),
                p_value=p,
                status=status,
                n_min=n_min,
                level=level,
                kind=cfg.kind,
                reviewed=reviewed,
                label_note="" if status == "violated" else note,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------------------------
# what if: the guard's conformal cut on random splits of these cases


def conformal_cut(unsafe_scores: NDArray[np.float64], alpha: float) -> float:
    """The guard's marginal conformal cut on unsafe scores, each its own situation
    (:func:`spotstop.guard.policies.conformal_cut`): flag UNSAFE when ``S ≥ u_(k)``,
    ``k = floor(alpha (n + 1))``.  Too few scores (k = 0) → :class:`DataError`."""
    if not 0.0 < alpha < 1.0:
        raise DataError(f"alpha must be in (0, 1); got {alpha!r}.")
    c = guard_conformal_cut(np.asarray(unsafe_scores, dtype=np.float64), alpha=alpha).marginal
    if not c.feasible:
        raise DataError(
            f"the conformal cut needs at least {c.n_needed} unsafe calibration scores for "
            f"alpha={alpha}; got {c.n}. Calibrate on more unsafe cases or raise alpha."
        )
    return float(c.threshold)


@dataclass(frozen=True)
class SplitSimulation:
    """What the guard's conformal cut would do on these cases (see the module docstring).

    miss_rate: share of held-out unsafe situations (one case each) allowed; safe_allowed:
    share of held-out safe cases allowed (value: mean over splits; band: 2.5–97.5 % over
    splits; ``n`` = splits).  expected_miss: mean ``k/(n+1)`` over the splits' fits.
    n_infeasible: splits whose calibration part was too small for the guarantee.
    """

    guarantee: str
    alpha: float
    delta: float | None
    miss_rate: Estimate
    safe_allowed: Estimate
    expected_miss: float
    n_splits: int
    n_infeasible: int

    def to_dict(self) -> dict[str, Any]:
        e = self.expected_miss
        return {
            "guarantee": self.guarantee,
            "alpha": self.alpha,
            "delta": self.delta,
            "miss_rate": self.miss_rate.to_dict(),
            "safe_allowed": self.safe_allowed.to_dict(),
            "expected_miss": None if math.isnan(e) else e,
            "n_splits": self.n_splits,
            "n_infeasible": self.n_infeasible,
        }


def conformal_split_simulation(
    table: CaseTable,
    *,
    alpha: float = 0.1,
    delta: float | None = 0.1,
    calibration_share: float = 0.3,
    n_splits: int = 200,
    rng: np.random.Generator | int | None = None,
) -> SplitSimulation:
    """Fit the guard's conformal cut (PAC with ``delta``; marginal when ``delta`` is None) on
    random group splits and count what it misses and allows on the held-out part."""
    gen = as_rng(rng)
    guarantee: Literal["pac", "marginal"] = "marginal" if delta is None else "pac"
    y, s, grp, sit = table.label, table.score, table.group, table.situation_id
    miss, allowed, expect = [], [], []
    infeasible = 0
    if table.n_groups < 2 or (y == 1).sum() == 0:
        _undefined("the conformal split simulation", "it needs unsafe cases in two groups")
        n_splits = 0
    for _ in range(n_splits):
        cal = split_groups(gen, table.n_groups, calibration_share)[grp]
        u = cal & (y == 1)
        c = guard_conformal_cut(s[u], sit[u], alpha=alpha, delta=delta).chosen(guarantee)
        if not c.feasible:
            infeasible += 1
            continue
        ev_u = _first_per_situation(sit, np.flatnonzero(~cal & (y == 1)))
        ev_s = ~cal & (y == 0)
        if ev_u.size == 0:
            continue
        miss.append(float((~unsafe_mask(s[ev_u], c.threshold)).mean()))
        allowed.append(
            float((~unsafe_mask(s[ev_s], c.threshold)).mean()) if ev_s.any() else math.nan
        )
        expect.append(c.expected_miss)
    if n_splits and not miss:
        _undefined(
            "the conformal split simulation",
            f"no split had enough unsafe calibration situations ({infeasible} too small)",
        )
    return SplitSimulation(
        guarantee=guarantee,
        alpha=alpha,
        delta=delta,
        miss_rate=band(np.asarray(miss)) if miss else nan_estimate(),
        safe_allowed=band(np.asarray(allowed)) if miss else nan_estimate(),
        expected_miss=float(np.mean(expect)) if expect else math.nan,
        n_splits=len(miss),
        n_infeasible=infeasible,
    )


# --------------------------------------------------------------------------------------------
# the card check


@dataclass(frozen=True)
class ConformalAuditResult:
    """The audits of the deployed cuts, the split simulation, and a note in words."""

    deployed: tuple[DeployedAudit, ...]
    simulation: SplitSimulation
    note: str
    reason: str = ""
    """Why nothing was audited (empty when something was)."""
    unread: tuple[str, ...] = ()
    """Versions whose conformal cut decided in the log but whose document does not load."""


def _unread(log: LogData | None) -> tuple[str, ...]:
    """The versions whose conformal cut decided in ``log`` but whose stored document does
    not load (their alpha cannot be read, so they cannot be audited)."""
    if log is None:
        return ()
    by_cut = decided_by_conformal(log)
    return tuple(v for v in log.policy_errors if bool((by_cut & (log.version == v)).any()))


def _reason(log: LogData | None, deployed: tuple[DeployedAudit, ...]) -> str:
    """Why nothing was audited, in words ('' when something was)."""
    if log is None:
        return "a scores CSV or the simulated log holds no deployed policy"
    if not deployed:
        unread = _unread(log)
        if unread:  # a conformal cut decided, but its document (its alpha) cannot be read
            return (
                f"the policy document of {', '.join(unread)}, whose conformal cut decided in "
                f"this log, does not load ({log.policy_errors[unread[0]]})"
            )
        kinds = sorted({str(log.kind_of(v)) for v in log.versions()})
        return f"no conformal policy decided in this log (policies: {', '.join(kinds)})"
    return ""


def _audit_row(a: DeployedAudit) -> tuple[str, str]:
    return (
        f"{a.version_id} ({a.policy_text()})",
        f"{a.status}: {a.misses} of {a.n_situations} unsafe situations missed since "
        f"{a.created[:10]}, {fmt(a.miss_rate)} %; {fmt_p(a.p_value)} (test needs ≥ {a.n_min})"
        + (f"; {a.label_note}" if a.label_note else ""),
    )


class ConformalAuditCheck(CardCheck):
    """The deployed conformal cuts' audits and the split simulation."""

    name: ClassVar[str] = "conformal_audit"
    title: ClassVar[str] = "Conformal audit"
    explanation: ClassVar[str] = (
        "Each deployed conformal cut, on the labelled unsafe decisions it made since it was "
        "created (one per situation): the miss rate with an exact interval and a one-sided "
        "binomial test against alpha; violated → recalibrate on recent labelled decisions; "
        "not enough data → label more unsafe decisions. The split simulation is a what-if, "
        "not an audit."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        deployed = () if ctx.log is None else audit_deployed(ctx.log)
        sim = conformal_split_simulation(
            ctx.table, alpha=ctx.alpha, delta=ctx.delta, n_splits=200, rng=ctx.rng
        )
        reason = _reason(ctx.log, deployed)
        note = (
            f"{len(deployed)} conformal policy version(s) audited on their decisions since created."
            if deployed
            else f"Nothing to audit: {reason}. The simulation below is a what-if on these cases."
        )
        data: Mapping[str, Any] = {
            "note": note,
            "test": _TEST.format(level=AUDIT_LEVEL),
            "deployed": [a.to_dict() for a in deployed],
            "simulation": sim.to_dict(),
        }
        rows = [("deployed cut", note)] + [_audit_row(a) for a in deployed]
        rows.append(
            (
                f"what if: the guard's {sim.guarantee} cut (alpha {sim.alpha:g}) fitted on 30 % "
                "of the groups",
                f"misses {fmt(sim.miss_rate)} % of held-out unsafe situations, allows "
                f"{fmt(sim.safe_allowed)} % of safe cases ({sim.n_splits} splits, "
                f"{sim.n_infeasible} too small)",
            )
        )
        return CheckResult(
            data,
            tuple(rows),
            result=ConformalAuditResult(deployed, sim, note, reason, _unread(ctx.log)),
        )
