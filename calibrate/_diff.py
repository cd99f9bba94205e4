"""What changed between two policies, and the effect each would have had on the logged data.

:func:`predict_effect` replays a policy over a :class:`~spotstop.calibrate.CalibrationLog` with the
guard's own replay (:func:`spotstop.guard.policies.replay`): fused scores are recomputed from
the logged member scores with THAT policy's fusion (the logged fused score belongs to
whatever fusion was active then), decisions are taken in log order, grouped into the batches
the guard saw (the log's ``batch_id``; ``batch_size=N`` regroups consecutive decisions into
batches of N instead), and a stateful policy carries its state from batch to batch, as a
guard would. No live state file is read.

Where a stateful policy starts (:func:`replay_start`): from the state the guard would have
held BEFORE the first replayed decision. Its ``state_seed`` qualifies only when it holds no
replayed or later decision: a seed ``recalibrate`` fitted on decisions that all precede the
replayed ones, or one not fitted on logged decisions at all (``policy init``'s pool, a
written-out seed). A seed fitted on the replayed decisions themselves (``recalibrate`` shows
the effect of its new policy on the log it fitted it on) would let each decision's cut see its
own and later scores, an in-sample number: the replay then starts from empty state, and the
note says which start it used.

A window that starts after the policy was already deciding (``since``; the guard's windows
held the decisions before it): the replay of a stateful policy runs the log's earlier
decisions (:attr:`CalibrationLog.earlier`) first, from the start the rule above picks for the
first of THOSE, only to fill its state; they count in no rate, and the note says how many
primed it. Without them, each situation's window would restart empty at ``since``.

The policy is run on every decision of the policy's bundle and prompt as the guard ran its
own (:func:`~spotstop.guard.policies.entered_scores`: a scene that failed closed before the
decision enters as missing, one that failed after it still moved the situation windows; on
the decisions the policy's own version made, a cascade's band is the one its plan chose, the
log's ``members_run``, as the card's replay reads it);
only the usable ones (not fail-closed, all member scores finite) count in the rates. ``flag_rate`` is the share labelled UNSAFE; ``miss_rate`` the share of
labelled-unsafe decisions labelled SAFE; ``safe_flag_rate`` the share of labelled-safe
ones labelled UNSAFE (NaN without such labels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from spotstop.calibrate._logdata import CalibrationError, CalibrationLog, iso_time, parse_time
from spotstop.guard.policies import PolicyConfig, batch_inputs, entered_scores, replay

__all__ = [
    "Change",
    "PolicyDiff",
    "PredictedEffect",
    "diff_policies",
    "predict_effect",
    "replay_start",
]

_PROVENANCE_KEYS = ("version", "window", "n", "frozen_t0")


@dataclass(frozen=True)
class Change:
    """One changed value: dotted key, old value (None: absent), new value (None: absent)."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"


@dataclass(frozen=True)
class PredictedEffect:
    """A policy replayed on logged decisions (rates are NaN where undefined).

    n: usable decisions replayed. flags: bool per usable decision (UNSAFE). n_unsafe /
    n_safe: labelled ones. note: how the policy was replayed.
    """

    n: int
    flag_rate: float
    n_unsafe: int
    miss_rate: float
    n_safe: int
    safe_flag_rate: float
    note: str
    flags: np.ndarray
    start: str = ""

    def __str__(self) -> str:
        return (
            f"flag rate {_pct(self.flag_rate)} of {self.n}; miss rate {_pct(self.miss_rate)} "
            f"of {self.n_unsafe} labelled unsafe; safe flagged {_pct(self.safe_flag_rate)} of "
            f"{self.n_safe} labelled safe"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (NaN as None), without the per-decision flags."""
        return {
            "n": self.n,
            "flag_rate": _none(self.flag_rate),
            "n_unsafe": self.n_unsafe,
            "miss_rate": _none(self.miss_rate),
            "n_safe": self.n_safe,
            "safe_flag_rate": _none(self.safe_flag_rate),
            "note": self.note,
            "start": self.start or None,
        }


@dataclass(frozen=True)
class PolicyDiff:
    """The changes from policy A to policy B, and (with data) their predicted effects.

    n_changed: decisions whose label differs between A and B (None without data or when A
    cannot be replayed on B's decisions).
    """

    a: str
    b: str
    changes: tuple[Change, ...]
    effect_a: PredictedEffect | None
    effect_b: PredictedEffect | None
    n_changed: int | None
    notes: tuple[str, ...]

    def __str__(self) -> str:
        lines = [f"policy diff {self.a} -> {self.b}"]
        if self.changes:
            lines += [f"  {c}" for c in self.changes]
        else:
            lines.append("  no changes")
        if self.effect_a is not None:
            lines.append(f"  A on the log: {self.effect_a}")
        if self.effect_b is not None:
            lines.append(f"  B on the log: {self.effect_b}")
        if self.n_changed is not None and self.effect_b is not None:
            lines.append(f"  decisions that change label: {self.n_changed} of {self.effect_b.n}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {
            "a": self.a,
            "b": self.b,
            "changes": [{"key": c.key, "old": c.old, "new": c.new} for c in self.changes],
            "effect_a": None if self.effect_a is None else self.effect_a.to_dict(),
            "effect_b": None if self.effect_b is None else self.effect_b.to_dict(),
            "n_changed": self.n_changed,
            "notes": list(self.notes),
        }


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _show(v: Any) -> str:
    if v is None:
        return "(absent)"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, Mapping):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def _comparable(cfg: PolicyConfig) -> dict[str, Any]:
    d = cfg.to_dict()
    keep = {k: d[k] for k in ("bundle_id", "prompt_hash", "created", "fusion", "policy")}
    # what the guard does with text in the scene, and where its windows start, decide too
    keep["text_in_scene"] = cfg.text_in_scene.to_dict()
    keep["state_seed"] = d.get("state_seed")
    fitted = cfg.fitted_on
    keep["fitted_on"] = {k: fitted[k] for k in _PROVENANCE_KEYS if k in fitted}
    return _flatten(keep)


def _seed_decisions(fitted_on: Mapping[str, Any]) -> tuple[bool, Any]:
    """``(from_log, [first, last])``: whether the provenance says the state seed was fitted on
    logged decisions, and the times of the ones it holds (None where it does not say)."""
    rec = fitted_on.get("state_seed")
    if isinstance(rec, Mapping) and rec.get("decisions") is not None:
        return True, rec["decisions"]
    window = fitted_on.get("window")
    if isinstance(window, Mapping):  # a recalibrated file from before the seed's own record
        return True, window.get("decisions")
    return isinstance(rec, Mapping), None


def _primer(cfg: PolicyConfig, data: CalibrationLog) -> CalibrationLog | None:
    """The decisions a replay of ``cfg`` runs before ``data``'s to fill its state: the log's
    decisions before ``since`` for a stateful policy, None when there are none to run."""
    earlier = data.earlier
    if not cfg.policy.stateful or earlier is None or earlier.n == 0:
        return None
    return earlier


def replay_start(cfg: PolicyConfig, data: CalibrationLog) -> tuple[Any, str, str]:
    """The state a replay of ``cfg`` over ``data``'s decisions starts from: ``(state, start,
    why)``, ``start`` ``"seed"`` or ``"empty"`` (``(None, "", "")`` for a stateless policy).
    Where ``data`` cuts into the log (``since``), the replay begins with the decisions before
    it (:func:`_primer`): the start is then the state before the first of those, and ``why``
    says how many primed it.

    The guard's state before the first replayed decision: the ``state_seed`` when it holds
    only decisions earlier than the first replayed one, or was not fitted on logged decisions
    (a pool, a written-out seed); empty windows when it holds a replayed or later decision
    (the seed ``recalibrate`` fits on the log it then replays), or when its provenance says
    it came from a log without saying which decisions.
    """
    if not cfg.policy.stateful:
        return None, "", ""
    primer = _primer(cfg, data)
    state, start, why = _start(cfg, data.time if primer is None else primer.time)
    if primer is not None:
        why += (
            f"; primed with the {primer.n} decisions before --since ({data.since}), replayed "
            "first from that start: they fill its state and count in no rate"
        )
    return state, start, why


def _start(cfg: PolicyConfig, times: np.ndarray) -> tuple[Any, str, str]:
    """:func:`replay_start`'s rule for a replay whose decisions (all of them, in order) have
    ``times``."""
    empty = cfg.policy.initial_state(None)
    if cfg.state_seed is None:
        return empty, "empty", "from empty state (the policy has no state seed)"
    from_log, span = _seed_decisions(cfg.fitted_on)
    if not from_log:
        return (
            cfg.initial_state(),
            "seed",
            "from its state seed (not fitted on logged decisions)",
        )
    try:
        last = None if span is None else parse_time(span[1], "state_seed.decisions")
    except (CalibrationError, IndexError, KeyError, TypeError):
        last = None
    if last is None:
        return (
            empty,
            "empty",
            "from empty state: its state seed was fitted on a log, but its provenance does not "
            "say on which decisions, so it may hold the replayed ones",
        )
    t = times[np.isfinite(times)]
    if t.size == 0:
        return cfg.initial_state(), "seed", "from its state seed (no decision to replay)"
    # compared at the provenance's precision: the same decision is never "earlier"
    first = parse_time(iso_time(float(t.min())), "first decision")
    assert first is not None
    if last < first:
        return (
            cfg.initial_state(),
            "seed",
            f"from its state seed, fitted on decisions up to {span[1]}, before the first "
            f"replayed one ({iso_time(float(t.min()))})",
        )
    return (
        empty,
        "empty",
        f"from empty state, not its state seed: the seed holds decisions up to {span[1]}, "
        f"not all before the first replayed one ({iso_time(float(t.min()))}), so each "
        "decision's cut would already contain its own and later scores (an in-sample effect)",
    )


def _text_scores(data: CalibrationLog, member: str) -> np.ndarray:
    """``member``'s request-only scores as the guard gave them to its policy (NaN where that
    pass did not run)."""
    if data.member_text is None or member not in data.member_text:
        return np.full(data.n, np.nan)
    return entered_scores({member: data.member_text[member]}, data.policy_score)[member]


def _rate(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else math.nan


def predict_effect(
    cfg: PolicyConfig, data: CalibrationLog, *, batch_size: int | None = None
) -> PredictedEffect:
    """Replay ``cfg`` on the decisions of ``data`` as the guard ran its policy; rates on the
    usable ones (see the module docstring)."""
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise CalibrationError(
            f"batch_size must be a positive integer or None; got {batch_size!r}."
        )
    if (cfg.bundle_id, cfg.prompt_hash) != (data.bundle_id, data.prompt_hash):
        raise CalibrationError(
            f"the policy is for bundle {cfg.bundle_id} / prompt {cfg.prompt_hash}, but the data "
            f"are decisions of {data.bundle_id} / {data.prompt_hash}; their member scores are on "
            "another scale. Read the log for the policy's bundle."
        )
    missing = [m for m in cfg.fusion.members if m not in data.member_scores]
    if missing:
        raise CalibrationError(
            f"the policy's fusion members {missing} have no scores in the data (members "
            f"{list(data.members)})."
        )
    # The policy runs on what the guard ran it on (entered_scores: a scene that failed closed
    # before the decision enters as missing, one that failed after it, e.g. past the
    # deadline, moved the windows all the same), over every decision of the bundle in order,
    # after the decisions before the window that prime a stateful policy's state (_primer);
    # the rates are then read on the usable ones of the window.
    primer = _primer(cfg, data)
    runs = [data] if primer is None else [primer, data]
    use = data.usable
    members = {
        m: np.concatenate(
            [entered_scores({m: d.member_scores[m]}, d.policy_score)[m] for d in runs]
        )
        for m in cfg.fusion.members
    }
    text = None
    if any(d.member_text is not None for d in runs):
        text = {m: np.concatenate([_text_scores(d, m) for d in runs]) for m in data.members}
    sids = [s or None for d in runs for s in d.logged_situation_id.tolist()]  # the guard's ids
    n_all = int(use.size)
    n_first = len(sids) - n_all
    n = int(use.sum())
    logged = [b for d in runs for b in d.batch_id.tolist()]
    if batch_size is not None:
        # the window in batches of N from its first decision; the primer's end at the window
        batches: list[Any] | None = [
            *(-1 - (n_first - 1 - i) // batch_size for i in range(n_first)),
            *(i // batch_size for i in range(n_all)),
        ]
        how = f"in batches of {batch_size} consecutive decisions"
    elif any(b is not None for b in logged):
        # a decision logged without its call's id (a schema-1 row) is a batch of its own, as
        # the card replays it: consecutive ones are not one call
        batches = [b if b is not None else (None, i) for i, b in enumerate(logged)]
        how = "in the batches the guard saw"
        if any(b is None for b in logged):
            how += " (each decision logged without a batch id alone)"
    else:
        batches = None
        how = "each decision alone (the log holds no batch ids)"
    state, start, why = replay_start(cfg, data)
    note = f"{cfg.kind}: replayed in log order, {how}" + (f", {why}" if why else "")
    skipped = data.dropped.get("member_not_run", 0)
    if skipped:  # a cascade's log: only the scenes near its cut have every member's score
        note += (
            f"; rates on the {n} decisions every member scored: the {skipped} a cascade "
            "decided on its first member alone (far from its cut) have no pair score, so "
            "these rates describe the scenes near the cut, not the log"
        )
    # which members the guard ran, on the decisions this very version made (a cascade's band
    # as its plan chose it); -1 on the others (another policy decided them): worked out again
    ran = {
        m: np.concatenate(
            [np.where(d.policy_version == cfg.version_id, d.members_run[m], -1) for d in runs]
        )
        for m in cfg.fusion.members
    }
    x = batch_inputs(cfg.fusion, members, sids, text, ran)
    labels = list(replay(cfg.policy, x, batch_ids=batches, state=state).labels)[n_first:]
    flags = np.array([lab == "UNSAFE" for lab in labels], dtype=bool).reshape(n_all)[use]
    y = data.label[use]
    return PredictedEffect(
        n=n,
        flag_rate=_rate(flags),
        n_unsafe=int((y == 1).sum()),
        miss_rate=_rate(~flags[y == 1]),
        n_safe=int((y == 0).sum()),
        safe_flag_rate=_rate(flags[y == 0]),
        note=note,
        flags=flags,
        start=start,
    )


def diff_policies(
    a: PolicyConfig,
    b: PolicyConfig,
    data: CalibrationLog | None = None,
    *,
    names: tuple[str, str] = ("A", "B"),
    batch_size: int | None = None,
) -> PolicyDiff:
    """The changed values from ``a`` to ``b``; with ``data`` (decisions of B's bundle), the
    predicted effect of each on the log and how many decisions change label."""
    fa, fb = _comparable(a), _comparable(b)
    changes = tuple(
        Change(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
    )
    notes: list[str] = []
    ea = eb = None
    n_changed = None
    if data is not None:
        eb = predict_effect(b, data, batch_size=batch_size)
        if (a.bundle_id, a.prompt_hash) == (b.bundle_id, b.prompt_hash):
            ea = predict_effect(a, data, batch_size=batch_size)
            n_changed = int((ea.flags != eb.flags).sum())
        else:
            notes.append(
                f"{names[0]} is for another bundle or prompt ({a.bundle_id} / {a.prompt_hash}); "
                "its effect on these decisions is not defined."
            )
        notes.append(eb.note if ea is None or ea.note == eb.note else f"{names[1]}: {eb.note}")
        if ea is not None and ea.note != eb.note:
            notes.append(f"{names[0]}: {ea.note}")
    return PolicyDiff(names[0], names[1], changes, ea, eb, n_changed, tuple(notes))
