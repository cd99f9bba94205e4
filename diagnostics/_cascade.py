"""The cascade: how often the second member ran, and what skipping it costs: the numbers.

The card's cascade check (:mod:`spotstop.diagnostics._cascade_check`) says them in words.

The ``cascade`` policy (:class:`spotstop.guard.policies.CascadePolicy`; seed 000, "Cost")
runs its first member on every scene and the second only inside a band around the cut; the
guard logs which members ran (``members_run``, log schema 3).  For each cascade policy
version of the log this check reports:

Share
    Of the version's decisions on which the first member ran (its ``members_run`` is known
    and true), the share on which every other member of the fusion ran too: the share that
    went to the second member, with the exact (Clopper–Pearson) 95 % interval of
    :func:`~spotstop.diagnostics._conformal_audit.clopper_pearson` and ``n``, next to the
    ``share`` the band was fitted for on the unlabelled pool (the policy document stored in
    the log).  A configured share outside the interval means the first member's scores sit
    differently around the cut here than on the pool (refit the band:
    ``spotstop recalibrate LOG --policy cascade``).  Rows logged before schema 3
    (``members_run`` unknown) and decisions where the first member did not run (a fail-closed
    scene that was never scored) are counted apart.

Cost
    On the labelled decisions (any policy version; not fail-closed) where every member of the
    version's fusion has a finite score, i.e. where the full pair ran: the AUROC and the
    balanced accuracy of the full pair (``S`` of the version's own fusion, labelled with the
    version's cut) against the cascade at the version's band.  The cascade is simulated with
    the guard's own functions, never a copy of its band rule: per batch (the log's
    ``batch_id``, in log order; the cut's state threaded from the version's ``state_seed``
    and keyed by the situation ids the guard logged, not a labels file's regrouping),
    :meth:`CascadePolicy.second_needed` says where the second member would run, the other
    members' scores are masked to NaN elsewhere, and
    :func:`~spotstop.guard.policies.decide_batch` with the cascade policy gives its score
    (``S`` inside the band, the first member's ``z1`` outside) and its labels; the pair is the
    version's cut (:attr:`CascadePolicy.cut`) through the same ``decide_batch`` on the
    unmasked scores.  Intervals: 95 % percentile intervals of a group bootstrap over the
    card's groups (contrast and situation ids), both rules and their difference from the same
    draws; the labels stay fixed (the band and the cut are the policy's, not refitted).

    The sample is the labelled scenes where the pair ran whatever a band said: decisions of
    any policy that runs both members (or of a cascade with share 1), of the version's own
    bundle and prompt (another bundle's member scores are on another scale).  A cascade's own
    second-member decisions (share < 1, or a cascade whose document is not stored) are left
    out (``n_from_cascade`` counts them): its band chose them, so they sit near the cut more
    often than the deployment's scenes, and there the cascade and the pair agree by
    construction; a short pair run beside a long cascade run would otherwise dilute the cost
    towards 0.  The cost is measured only when some of the sample lies outside the band
    (``n_first_only``); when none does, or the sample lacks a class, the section says the
    cost is not measurable from this log and how to measure it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from spotstop.diagnostics._conformal_audit import clopper_pearson
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._from_log import LogData
from spotstop.diagnostics._metrics import curve_auroc
from spotstop.diagnostics._resample import (
    draw_group_counts,
    group_sum_draws,
    nan_estimate,
    percentile_ci,
)
from spotstop.diagnostics._results import Estimate
from spotstop.guard.policies import (
    CascadePolicy,
    PolicyConfig,
    batch_inputs,
    decide_batch,
)

__all__ = [
    "CascadeCost",
    "CascadeShare",
    "SimulatedCascade",
    "cascade_cost",
    "cascade_shares",
    "simulate_cascade",
]


# --------------------------------------------------------------------------------------------
# the share that went to the second member


@dataclass(frozen=True)
class CascadeShare:
    """One cascade version's share of decisions that ran the second member (see the module
    docstring).  ``configured_share``, ``band``, ``first`` and ``cut_kind`` come from the
    stored policy document (None when it is not stored or does not load)."""

    version_id: str
    first: str | None
    configured_share: float | None
    band: float | None
    cut_kind: str | None
    n_decisions: int
    n_second: int
    share: Estimate
    n_unknown: int
    n_first_not_run: int
    n_first_only_in_log: int
    """Decisions decided by the first member alone (their fused S does not exist)."""

    @property
    def configured_inside(self) -> bool | None:
        """Whether the configured share lies in the share's interval (None: not comparable)."""
        if self.configured_share is None or math.isnan(self.share.ci.low):
            return None
        return self.share.ci.contains(self.configured_share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version_id": self.version_id,
            "first": self.first,
            "configured_share": self.configured_share,
            "band": self.band,
            "cut": self.cut_kind,
            "n_decisions": self.n_decisions,
            "n_second": self.n_second,
            "share": self.share.to_dict(),
            "interval": "exact (Clopper–Pearson) 95 %",
            "configured_inside_interval": self.configured_inside,
            "n_members_run_unknown": self.n_unknown,
            "n_first_not_run": self.n_first_not_run,
        }


def _cascade_versions(log: LogData) -> list[str]:
    """Versions decided by a cascade: a stored cascade document, or rows of kind cascade."""

    def is_cascade(v: str) -> bool:
        cfg = log.policies.get(v)
        if cfg is None:
            return log.kind_of(v) == "cascade"
        return isinstance(cfg.policy, CascadePolicy)

    return [v for v in log.versions() if is_cascade(v)]


def _first_from_members_run(log: LogData, rows: NDArray[np.bool_]) -> str | None:
    """The first member of a cascade version whose policy document is not stored: the one
    member that ran alone on some of its decisions (``members_run``); None when not exactly
    one did (or the log does not say which members ran)."""
    run = log.arrays.members_run
    alone = set()
    for m, r in run.items():
        only = rows & (r == 1)
        for other, q in run.items():
            if other != m:
                only &= q == 0
        if only.any():
            alone.add(m)
    return next(iter(alone)) if len(alone) == 1 else None


def cascade_shares(log: LogData) -> tuple[CascadeShare, ...]:
    """The share of each cascade version's decisions that ran the second member."""
    out = []
    run = log.arrays.members_run
    for v in _cascade_versions(log):
        rows = log.version == v
        cfg = log.policies.get(v)
        pol = cfg.policy if cfg is not None else None
        first = pol.first if isinstance(pol, CascadePolicy) else _first_from_members_run(log, rows)
        members = list(cfg.fusion.members) if cfg is not None else sorted(run)
        rest = [m for m in members if m != first]
        known = rows.copy()
        for m in members:
            known &= (run[m] >= 0) if m in run else np.zeros_like(rows)
        if first is None or first not in run:
            known[:] = False
            first_ran = np.zeros_like(rows)
        else:
            first_ran = run[first] == 1
        counted = known & first_ran
        second = counted.copy()
        for m in rest:
            second &= run[m] == 1
        n, x = int(counted.sum()), int(second.sum())
        share = Estimate(x / n if n else math.nan, clopper_pearson(x, n), n)
        out.append(
            CascadeShare(
                version_id=v,
                first=first,
                configured_share=pol.share if isinstance(pol, CascadePolicy) else None,
                band=pol.band if isinstance(pol, CascadePolicy) else None,
                cut_kind=pol.cut.kind if isinstance(pol, CascadePolicy) else None,
                n_decisions=int(rows.sum()),
                n_second=x,
                share=share,
                n_unknown=int((rows & ~known).sum()),
                n_first_not_run=int((known & ~first_ran).sum()),
                n_first_only_in_log=int((counted & ~second).sum()),
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------------------------
# the cascade simulated on scenes where the full pair ran


@dataclass(frozen=True, eq=False)
class SimulatedCascade:
    """What :func:`simulate_cascade` returns: a cascade policy and its cut run on scenes
    whose every member scored, one entry per scene in input order.

    inside: where :meth:`CascadePolicy.second_needed` sends the scene to the second member;
    score: the cascade's score (``S`` inside, ``z1`` outside); unsafe: its labels;
    pair_score: the pair's ``S``; pair_unsafe: the cut's labels on ``S``.
    """

    inside: NDArray[np.bool_]
    score: NDArray[np.float64]
    unsafe: NDArray[np.bool_]
    pair_score: NDArray[np.float64]
    pair_unsafe: NDArray[np.bool_]


def simulate_cascade(
    cfg: PolicyConfig,
    member_scores: Mapping[str, NDArray[np.float64]],
    situation_ids: Sequence[str | None],
    batch_ids: Sequence[Any] | None = None,
) -> SimulatedCascade:
    """What a cascade policy would have decided, and at what cost, on scenes where the full
    pair ran.

    ``cfg``: a policy version whose policy is a :class:`~spotstop.guard.policies.CascadePolicy`;
    ``member_scores``: each fused member's raw scores (finite on every scene), keyed by
    member name; ``situation_ids``: one per scene (None: none); ``batch_ids``: the batch each
    scene was checked in, scenes of one batch adjacent (default: one scene per batch). Per
    batch, in order, the policy's own :meth:`~CascadePolicy.second_needed` says where the
    second member would run, the other members' scores are masked to NaN elsewhere, and the
    guard's :func:`~spotstop.guard.policies.decide_batch` gives the cascade's scores and
    labels; the pair's labels are the policy's cut on the unmasked scores. The cut's state
    is threaded from ``cfg``'s initial state, as the guard does. The card's cascade check
    uses it (see the module docstring); a ``TypeError`` for a policy of another kind.
    """
    pol = cfg.policy
    if not isinstance(pol, CascadePolicy):
        raise TypeError(
            f"simulate_cascade needs a cascade policy; got kind {pol.kind!r}. Pass a policy "
            "version of kind 'cascade' (`spotstop policy init --kind cascade` or `spotstop recalibrate --policy cascade`)."
        )
    full = batch_inputs(cfg.fusion, member_scores, list(situation_ids))
    n = full.n
    ids = list(range(n)) if batch_ids is None else list(batch_ids)
    inside = np.zeros(n, dtype=bool)
    score = np.full(n, np.nan)
    unsafe = np.zeros(n, dtype=bool)
    pair_unsafe = np.zeros(n, dtype=bool)
    state = cfg.initial_state()
    pair_state = cfg.initial_state()
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and ids[stop] == ids[start]:
            stop += 1
        idx = np.arange(start, stop)
        x = full.subset(idx)
        need = pol.second_needed(cfg.fusion, x.members[pol.first], x.situation_ids, state)
        masked = {
            m: v if m == pol.first else np.where(need, v, np.nan) for m, v in x.members.items()
        }
        d = decide_batch(pol, batch_inputs(cfg.fusion, masked, list(x.situation_ids)), state)
        p = decide_batch(pol.cut, x, pair_state)
        inside[idx] = need
        score[idx] = [v.score for v in d.verdicts]
        unsafe[idx] = d.unsafe
        pair_unsafe[idx] = p.unsafe
        state, pair_state = d.state, p.state
        start = stop
    return SimulatedCascade(inside, score, unsafe, np.asarray(full.fused), pair_unsafe)


def _paired_auroc(
    y: NDArray[np.int8],
    scores: Sequence[NDArray[np.float64]],
    group: NDArray[np.intp],
    *,
    n_boot: int,
    rng: np.random.Generator,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """AUROC (ties 1/2) of each score and over the same group-bootstrap draws: (k,), (B, k)."""
    _, gcode = np.unique(group, return_inverse=True)
    gcode = gcode.reshape(-1)
    ng = int(gcode.max()) + 1
    mats = []
    for s in scores:
        v, col = np.unique(s, return_inverse=True)
        col = col.reshape(-1)
        ms = sparse.csr_matrix(((y == 0).astype(float), (gcode, col)), shape=(ng, v.size))
        mu = sparse.csr_matrix(((y == 1).astype(float), (gcode, col)), shape=(ng, v.size))
        mats.append((ms, mu))

    def auc(counts: NDArray[np.float64]) -> NDArray[np.float64]:
        cols = []
        for ms, mu in mats:
            ws = np.ascontiguousarray(np.asarray(ms.T @ counts.T).T)
            wu = np.ascontiguousarray(np.asarray(mu.T @ counts.T).T)
            cols.append(curve_auroc(ws, wu))
        return np.stack(cols, axis=1)

    point = auc(np.ones((1, ng)))[0]
    draws = np.concatenate([auc(c) for c in draw_group_counts(ng, n_boot, rng)])
    return point, draws


def _est(point: float, draws: NDArray[np.float64], n: int) -> Estimate:
    return Estimate(float(point), percentile_ci(draws), n)


@dataclass(frozen=True)
class CascadeCost:
    """The full pair against one cascade version on labelled scenes where both ran (see the
    module docstring).  ``n``: scenes; ``n_first_only``: of them, those the band would leave
    to the first member; ``n_from_cascade``: scenes where both ran left out of ``n``
    because a cascade's band chose to run the pair (see the module docstring);
    ``simulated_share``: ``1 − n_first_only / n``."""

    version_id: str
    n: int
    n_unsafe: int
    n_first_only: int
    n_from_cascade: int
    simulated_share: float
    auroc_pair: Estimate
    auroc_cascade: Estimate
    auroc_diff: Estimate
    ba_pair: Estimate
    ba_cascade: Estimate
    ba_diff: Estimate
    note: str = ""
    sim: SimulatedCascade | None = field(default=None, repr=False, compare=False)

    @property
    def measurable(self) -> bool:
        """Whether any scene differs between the rules (some scene outside the band)."""
        return self.n_first_only > 0 and not math.isnan(self.auroc_diff.value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version_id": self.version_id,
            "n": self.n,
            "n_unsafe": self.n_unsafe,
            "n_first_only": self.n_first_only,
            "n_from_cascade": self.n_from_cascade,
            "simulated_share": None if math.isnan(self.simulated_share) else self.simulated_share,
            "measurable": self.measurable,
            "auroc": {
                "pair": self.auroc_pair.to_dict(),
                "cascade": self.auroc_cascade.to_dict(),
                "cascade_minus_pair": self.auroc_diff.to_dict(),
            },
            "balanced_accuracy": {
                "pair": self.ba_pair.to_dict(),
                "cascade": self.ba_cascade.to_dict(),
                "cascade_minus_pair": self.ba_diff.to_dict(),
            },
            "note": self.note,
        }


def _undefined_cost(
    version: str, n: int, n_unsafe: int, note: str, *, n_from_cascade: int = 0
) -> CascadeCost:
    e = nan_estimate(n)
    return CascadeCost(version, n, n_unsafe, 0, n_from_cascade, math.nan, e, e, e, e, e, e, note)


def _simulate_by_robot(
    log: LogData, cfg: PolicyConfig, rows: NDArray[np.intp], batch: list[Any]
) -> SimulatedCascade:
    """:func:`simulate_cascade` on ``rows``, each robot's apart (each kept its own state),
    put back in the order of ``rows``."""
    arr = log.arrays
    where = {int(r): k for k, r in enumerate(rows.tolist())}
    n = rows.size
    out = SimulatedCascade(
        np.zeros(n, dtype=bool), np.full(n, np.nan), np.zeros(n, dtype=bool),
        np.full(n, np.nan), np.zeros(n, dtype=bool),
    )  # fmt: skip
    for part in log.by_robot(rows):
        pos = np.array([where[int(r)] for r in part], dtype=np.intp)
        sim = simulate_cascade(
            cfg,
            {m: np.asarray(arr.member_scores[m], dtype=float)[part] for m in cfg.fusion.members},
            # the ids the guard keyed its windows by (a labels file may regroup situations)
            [s if s else None for s in arr.logged_situation_id[part]],
            [batch[k] for k in pos],
        )
        for name in ("inside", "score", "unsafe", "pair_score", "pair_unsafe"):
            getattr(out, name)[pos] = getattr(sim, name)
    return out


def cascade_cost(
    log: LogData, version: str, *, n_boot: int, rng: np.random.Generator
) -> CascadeCost:
    """The full pair against ``version``'s cascade (see the module docstring)."""
    cfg = log.policies.get(version)
    if cfg is None or not isinstance(cfg.policy, CascadePolicy):
        why = log.policy_errors.get(version, "its policy document is not stored in the log")
        return _undefined_cost(version, 0, 0, f"not simulated: {why}")
    arr = log.arrays
    members = cfg.fusion.members
    if any(m not in arr.member_scores for m in members):
        return _undefined_cost(version, 0, 0, "not simulated: a member of its fusion is not logged")
    both = log.counting(needs=members, labelled=True).mask  # labelled, both members scored
    # of the policy's bundle and prompt: another's member scores are on another scale
    both &= (arr.bundle_id == cfg.bundle_id) & (arr.prompt_hash == cfg.prompt_hash)
    # A decision of a cascade with share < 1 ran the pair because its band chose it (inside
    # the band by selection, where cascade and pair agree by construction): it is left out,
    # so the sample is the scenes whose pair run did not depend on a band.
    banded = _banded_versions(log)
    selected = both & np.isin(log.version, sorted(banded))
    rows = np.flatnonzero(both & ~selected)
    n_banded = int(selected.sum())
    y = log.label[rows].astype(np.int8)
    n, n_u = int(rows.size), int((y == 1).sum())
    if n == 0 or n_u == 0 or n_u == n:
        left = (
            f" ({n_banded} more were a cascade's own second-member decisions, chosen by its "
            "band, and are left out)"
            if n_banded
            else ""
        )
        return _undefined_cost(
            version,
            n,
            n_u,
            f"not measured: {n} labelled decisions of its bundle where every member ran "
            f"whatever the band ({n_u} unsafe){left}; both classes are needed. Run the pair on "
            "a labelled sample "
            "(a frozen policy of the same fusion, or the cascade with share 1) and make the "
            "card again",
            n_from_cascade=n_banded,
        )
    batch = [
        b if b is not None else f"#decision-{i}"
        for i, b in zip(rows.tolist(), arr.batch_id[rows], strict=True)
    ]
    sim = _simulate_by_robot(log, cfg, rows, batch)
    contrast, situation = log.group_ids()
    group = group_codes(contrast[rows], situation[rows])
    point, draws = _paired_auroc(y, [sim.pair_score, sim.score], group, n_boot=n_boot, rng=rng)
    parts = np.stack(
        [y == 1, y == 0, sim.pair_unsafe & (y == 1), sim.pair_unsafe & (y == 0),
         sim.unsafe & (y == 1), sim.unsafe & (y == 0)]
    ).astype(float)  # fmt: skip
    _, gcode = np.unique(group, return_inverse=True)
    ps, ds = group_sum_draws(parts, gcode.reshape(-1), n_boot=n_boot, rng=rng)

    def ba(s: NDArray[np.float64], k: int) -> NDArray[np.float64]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(0.5 * (s[..., k] / s[..., 0] + 1.0 - s[..., k + 1] / s[..., 1]))

    ba_p, ba_c = float(ba(ps, 2)), float(ba(ps, 4))
    ba_pd, ba_cd = ba(ds, 2), ba(ds, 4)
    n_first_only = int((~sim.inside).sum())
    return CascadeCost(
        version_id=version,
        n=n,
        n_unsafe=n_u,
        n_first_only=n_first_only,
        n_from_cascade=n_banded,
        simulated_share=float(sim.inside.mean()),
        auroc_pair=_est(point[0], draws[:, 0], n),
        auroc_cascade=_est(point[1], draws[:, 1], n),
        auroc_diff=_est(point[1] - point[0], draws[:, 1] - draws[:, 0], n),
        ba_pair=_est(ba_p, ba_pd, n),
        ba_cascade=_est(ba_c, ba_cd, n),
        ba_diff=_est(ba_c - ba_p, ba_cd - ba_pd, n),
        note="" if n_first_only else _NOT_MEASURABLE,
        sim=sim,
    )


def _banded_versions(log: LogData) -> set[str]:
    """The log's policy versions whose pair runs a band chose: cascades with share < 1, and
    cascades whose document is not stored (their share is unknown)."""
    out = set()
    for v in {str(x) for x in np.unique(log.version) if x}:
        cfg = log.policies.get(v)
        if cfg is not None:
            if isinstance(cfg.policy, CascadePolicy) and cfg.policy.share < 1:
                out.add(v)
        elif log.kind_of(v) == "cascade":
            out.add(v)
    return out


_NOT_MEASURABLE = (
    "not measurable from this log: every labelled scene where both members ran lies inside "
    "the band (they are the cascade's own second-member scenes), where the cascade and the "
    "pair agree by construction. To measure the cost, run the pair on a labelled sample "
    "(a frozen policy of the same fusion, or the cascade with share 1) and make the card again"
)
