"""Labelling a batch with a policy: inputs checked once, the one rule applied, state threaded.

:func:`batch_inputs` checks and fuses a batch's member scores; :func:`decide_batch` asks the
policy for scores and thresholds and applies the rule of :mod:`._rule`; :func:`replay` runs a
policy over a sequence of logged batches in order, carrying its state, exactly as the guard
did (the card and ``policy diff`` use it; the guard calls :func:`decide_batch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard.policies._base import BatchInputs, DecisionError, Policy, Verdict
from spotstop.guard.policies._rule import label_of
from spotstop.guard.validate import as_1d_float

__all__ = ["Decided", "batch_inputs", "decide_batch", "entered_scores", "replay"]


@dataclass(frozen=True, eq=False)
class Decided:
    """The verdicts of a batch (or a replay) and the policy's state after it."""

    verdicts: tuple[Verdict, ...]
    state: Any

    @property
    def labels(self) -> tuple[str, ...]:
        """``"SAFE"``/``"UNSAFE"`` per scene."""
        return tuple(v.label for v in self.verdicts)

    @property
    def unsafe(self) -> np.ndarray:
        """True where the verdict is UNSAFE."""
        return np.array([v.label == "UNSAFE" for v in self.verdicts], dtype=bool)

    def __repr__(self) -> str:
        n_unsafe = int(self.unsafe.sum())
        return f"Decided(n={len(self.verdicts)}, unsafe={n_unsafe})"


def _array(x: Any, what: str, n: int | None) -> np.ndarray:
    return as_1d_float(x, what=what, error=DecisionError, n=n)


def batch_inputs(
    fusion: Avg2Fusion,
    member_scores: Mapping[str, Any],
    situation_ids: Sequence[str | None] | None = None,
    members_text: Mapping[str, Any] | None = None,
    ran: Mapping[str, Any] | None = None,
) -> BatchInputs:
    """Check a batch and fuse it: ``S`` is NaN for a scene with a missing or non-finite score.

    member_scores: member name -> 1-D raw scene scores (every fusion member, same length).
    situation_ids: one id or None per scene (None for the argument: no situations).
    members_text: member name -> request-only scores, when that pass ran.
    ran: member name -> one bool per scene, whether the guard ran the member on it (the log's
    ``members_run``), or the log's int8 form of it (1 ran, 0 not, -1 not known for that
    scene); None when not known for any scene.
    Raises :class:`DecisionError` when the inputs do not fit together.
    """
    missing = [m for m in fusion.members if m not in member_scores]
    if missing:
        raise DecisionError(
            f"member_scores has no scores for fusion member(s) {missing}; it has "
            f"{sorted(member_scores)}. Score every member of the bundle."
        )
    first = _array(member_scores[fusion.members[0]], f"member_scores[{fusion.members[0]!r}]", None)
    n = first.shape[0]
    members = {m: _array(v, f"member_scores[{m!r}]", n) for m, v in member_scores.items()}
    text = (
        None
        if members_text is None
        else {m: _array(v, f"members_text[{m!r}]", n) for m, v in members_text.items()}
    )
    if situation_ids is None:
        sids: tuple[str | None, ...] = (None,) * n
    else:
        sids = tuple(situation_ids)
        if len(sids) != n:
            raise DecisionError(
                f"situation_ids must have one entry per scene ({n}); got {len(sids)}."
            )
        for s in sids:
            if s is not None and not isinstance(s, str):
                raise DecisionError(
                    f"situation_ids must be strings or None; got {type(s).__name__} {s!r}."
                )
    flags = None
    if ran is not None:
        flags = {}
        for m, v in ran.items():
            a = np.asarray(v)
            if a.shape != (n,) or a.dtype.kind not in "bui":
                raise DecisionError(
                    f"ran[{m!r}] must hold one bool per scene ({n}); got {a.dtype} {a.shape}."
                )
            # 1 ran, 0 not, -1 not known (a negative int, as the log's members_run)
            known = a >= 0 if a.dtype.kind == "i" else np.ones(n, dtype=bool)
            flags[m] = np.where(known, a != 0, -1).astype(np.int8)
    fused = fusion.fuse_many({m: members[m] for m in fusion.members}, nan_policy="propagate")
    return BatchInputs(
        fused=fused,
        members=members,
        situation_ids=sids,
        fusion=fusion,
        members_text=text,
        ran=flags,
    )


def decide_batch(policy: Policy, x: BatchInputs, state: Any = None) -> Decided:
    """Label a batch: each scene is UNSAFE when ``score ≥ threshold`` or either is not finite,
    or when a score the policy decides it on is missing (:meth:`Policy.complete`).

    ``state`` is the policy's state before the batch (None for stateless kinds, or for a
    stateful one starting empty); the returned :class:`Decided` carries the state after it.
    The verdict's ``detail`` says why a scene failed closed.
    """
    if not isinstance(policy, Policy):
        raise DecisionError(f"policy must be a Policy; got {type(policy).__name__}.")
    for need in policy.members_needed():
        if need not in x.members:
            raise DecisionError(
                f"policy {policy.kind!r} needs the raw scores of member {need!r}; the batch has "
                f"{sorted(x.members)}."
            )
    if policy.stateful and state is None:
        state = policy.initial_state(None)
    t = policy.thresholds(x, state)
    complete = np.asarray(policy.complete(x, state), dtype=bool)
    n = x.n
    if not (
        t.score.shape == (n,)
        and t.threshold.shape == (n,)
        and len(t.rule) == len(t.detail) == len(t.kind) == n
        and complete.shape == (n,)
    ):
        raise DecisionError(
            f"policy {policy.kind!r} returned thresholds that do not match the {n} scenes."
        )
    out: list[Verdict] = []
    for s, thr, rule, det, kind, ok in zip(
        t.score.tolist(),
        t.threshold.tolist(),
        t.rule,
        t.detail,
        t.kind,
        complete.tolist(),
        strict=True,
    ):
        label, failed = label_of(s, thr), True
        if not np.isfinite(s):
            det = f"score is {s!r}, not finite: fail closed ({det})"
        elif not np.isfinite(thr):
            det = f"threshold is {thr!r}, not finite: fail closed ({det})"
        elif not ok:
            label = "UNSAFE"
            det = f"a member score it needs is missing or not finite: fail closed ({det})"
        else:
            failed = False
        out.append(
            Verdict(
                label=label,
                score=s,
                threshold=thr,
                policy=rule,
                detail=det,
                fail_closed=failed,
                kind=kind,
            )
        )
    return Decided(verdicts=tuple(out), state=policy.update(state, x))


def entered_scores(member_scores: Mapping[str, Any], policy_score: Any) -> dict[str, np.ndarray]:
    """Logged member scores as the guard gave them to its policy: NaN where it did not.

    The guard passes a scene that failed closed before its decision (a member or the text
    detector failed, text in the scene flagged it ``fail_closed``) to the policy as missing,
    so that its scores move no batch statistic and no situation window; such a scene's logged
    ``policy_score`` is then not finite, while every scene whose scores the policy saw has a
    finite one (a SAFE label needs it, and an UNSAFE one without it failed closed in the
    policy itself). A replay of the log (the card, ``policy diff``) calls this, so that it
    runs the policy on what the guard ran it on; a log written before the guard did this
    (text-flagged scenes entered then) replays as that guard decided, by the same test.
    """
    ps = np.asarray(policy_score, dtype=float).reshape(-1)
    entered = np.isfinite(ps)
    out: dict[str, np.ndarray] = {}
    for m, v in member_scores.items():
        a = np.asarray(v, dtype=float).reshape(-1)
        if a.shape != ps.shape:
            raise DecisionError(
                f"member_scores[{m!r}] has {a.shape[0]} scores; policy_score has {ps.shape[0]}."
            )
        out[m] = np.where(entered, a, np.nan)
    return out


def logged_ran(
    members_run: Mapping[str, Any], members: Sequence[str], rows: Any
) -> dict[str, np.ndarray] | None:
    """The log's ``members_run`` of ``rows`` as :func:`batch_inputs`' ``ran``: which of
    ``members`` the guard ran on each decision (1, 0; -1 where the log does not say: a row
    written before log schema 3, whose band the replay works out again), so that a replay
    decides a cascade's scenes inside the band the guard's plan chose; None when the log has
    no ``members_run`` of some member."""
    out = {}
    for m in members:
        v = members_run.get(m)
        if v is None:
            return None
        out[m] = np.asarray(v, dtype=np.int8)[rows]
    return out


def replay(
    policy: Policy,
    x: BatchInputs,
    *,
    batch_ids: Sequence[Any] | None = None,
    state: Any = None,
) -> Decided:
    """Run ``policy`` over logged scenes in order, one batch per run of equal ``batch_ids``.

    ``x`` holds the scenes in decision order; ``batch_ids`` groups consecutive scenes into the
    batches the guard saw (None: every scene its own batch). The state is threaded from
    ``state`` (e.g. the policy file's seed) through every batch.
    """
    n = x.n
    ids = list(range(n)) if batch_ids is None else list(batch_ids)
    if len(ids) != n:
        raise DecisionError(f"batch_ids must have one entry per scene ({n}); got {len(ids)}.")
    verdicts: list[Verdict] = []
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and ids[stop] == ids[start]:
            stop += 1
        d = decide_batch(policy, x.subset(np.arange(start, stop)), state)
        verdicts.extend(d.verdicts)
        state = d.state
        start = stop
    if n == 0 and policy.stateful and state is None:
        state = policy.initial_state(None)
    return Decided(verdicts=tuple(verdicts), state=state)
