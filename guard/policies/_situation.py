"""``situation``: recentering on unlabelled scenes of the same situation (seed 000, Sec. 6.2).

For a scene of situation ``sid`` the threshold is the mean of the last ``window`` finite fused
scores of ``sid`` seen BEFORE this scene, once there are at least ``min_refs`` of them; before
that (and for scenes without a situation id) the ``fallback`` decides. Scenes of one batch are
taken in order, so a later scene sees the earlier ones. Leaving the scene out of its own
references does not change the label of the mean rule (``S ≥ (ΣR + S)/(m + 1)`` iff
``S ≥ ΣR/m``); it keeps the reference count honest and the threshold independent of the scene.

The prior (``prior_weight`` κ, ``prior_threshold`` t). The paper's rule takes the mean of all
six images of a query; a robot has only the few scenes it met before, and their mean moves with
their class mix as much as with the room (with 3 references of a pair whose classes lie 10
nats apart, that mix alone moves it by nats). With κ > 0 the threshold is the mean of the
references and κ pseudo-references at t (the frozen cut ``t0``)::

    threshold = (ΣR + κ·t) / (k + κ)        k = number of references

the best linear predictor of the situation's mean when situation means scatter around t with
variance τ² and one scene around its situation's mean with variance σ² (κ = σ²/τ²): a new
room starts near ``t0`` and moves to its own mean as its scenes come. κ = 0 is the paper's
rule. :func:`situation_prior_weight` fits κ from unlabelled scores grouped by situation (the
one-way random-effects moment estimator), at most ``window`` (the prior never weighs more than
a full window), and ``fit`` uses it unless ``prior_weight`` is given.

The windows are a :class:`~spotstop.guard.policies.SituationWindows` value: this module reads
it and returns the next one; the guard owns it and persists it, and ``calibrate`` fits its
starting value (``state_seed`` in ``policy.yaml``) from the log.

Caveat: the rule needs unlabelled scenes of both classes among the references; in an all-safe
situation it will call some safe scenes unsafe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    SituationWindows,
    Thresholds,
    check_fallback,
)
from spotstop.guard.policies._frozen import FrozenPolicy
from spotstop.guard.policies._rule import mean_cut
from spotstop.guard.validate import is_int, is_real

__all__ = ["SituationPolicy", "check_prior_weight", "situation_prior_weight"]


def check_prior_weight(value: Any) -> float | None:
    """A ``prior_weight`` setting: None (not given: fitted) or a finite number ≥ 0, as a
    float; anything else raises :class:`PolicyError` naming the setting."""
    if value is None:
        return None
    if not is_real(value) or not math.isfinite(value) or value < 0:
        raise PolicyError(f"prior_weight must be a finite number ≥ 0 or None; got {value!r}.")
    return float(value)


def situation_prior_weight(fused: Any, situation_id: Any, *, cap: float) -> tuple[float, str]:
    """κ = σ²/τ² fitted from unlabelled scores grouped by situation, at most ``cap``.

    fused: one finite score per scene; situation_id: its situation (``""``/None: none; those
    scenes are left out). One-way random-effects ANOVA, method of moments for unequal group
    sizes: ``MSW = SSW/(N − J)``, ``MSB = SSB/(J − 1)``, ``n0 = (N − Σn_j²/N)/(J − 1)``,
    ``τ² = (MSB − MSW)/n0``, ``σ² = MSW``. Returns ``(κ, how)``: ``how`` says how it was
    fitted, or why it is the cap (fewer than 2 situations, no situation with 2 scenes, or no
    situation-level variance above the within-situation noise).
    """
    s = np.asarray(fused, dtype=np.float64).reshape(-1)
    sid = np.asarray([x or "" for x in situation_id], dtype=object)
    if sid.shape != s.shape:
        raise PolicyError(f"situation_prior_weight: {s.size} scores but {sid.size} situation ids.")
    keep = (sid != "") & np.isfinite(s)
    s, sid = s[keep], sid[keep]
    _, codes = np.unique(sid.astype(str), return_inverse=True)
    n = np.bincount(codes).astype(np.float64)
    big_n, j = float(s.size), int(n.size)
    if j < 2 or big_n <= j:
        return float(cap), (
            f"the cap: {j} situation(s), {int(big_n)} scenes with a situation id "
            "(need 2 situations and one with 2 scenes)"
        )
    means = np.bincount(codes, weights=s) / n
    msw = float(((s - means[codes]) ** 2).sum()) / (big_n - j)
    msb = float((n * (means - s.mean()) ** 2).sum()) / (j - 1)
    n0 = (big_n - float((n**2).sum()) / big_n) / (j - 1)
    tau2 = (msb - msw) / n0
    if msw <= 0.0:
        return 0.0, f"0: no spread within situations ({j} situations, {int(big_n)} scenes)"
    if tau2 * cap <= msw:
        return float(cap), (
            f"the cap: between-situation variance {max(tau2, 0.0):.3g} is not above the "
            f"within-situation variance {msw:.3g} / {cap:g} ({j} situations, {int(big_n)} scenes)"
        )
    return msw / tau2, (f"σ²/τ² = {msw:.3g}/{tau2:.3g} from {j} situations, {int(big_n)} scenes")


@dataclass(frozen=True)
class SituationPolicy(Policy):
    """Threshold = mean of the situation's earlier scores (see the module docstring).

    window: scores kept per situation. min_refs: references needed before recentering
    (1 ≤ min_refs ≤ window). fallback: a single-scene policy used until then. prior_weight:
    κ ≥ 0 pseudo-references at ``prior_threshold`` (0: none, the paper's rule; then
    ``prior_threshold`` is None).
    """

    kind: ClassVar[str] = "situation"
    summary: ClassVar[str] = "mean S of recent unlabelled scenes of the same situation"
    single_scene: ClassVar[bool] = False
    stateful: ClassVar[bool] = True
    window: int
    min_refs: int
    fallback: Policy
    prior_weight: float = 0.0
    prior_threshold: float | None = None

    def __post_init__(self) -> None:
        check_fallback(self.fallback, "SituationPolicy")
        if not is_int(self.window) or self.window < 1:
            raise PolicyError(
                f"SituationPolicy.window must be an integer ≥ 1; got {self.window!r}."
            )
        if not is_int(self.min_refs) or not (1 <= self.min_refs <= self.window):
            raise PolicyError(
                f"SituationPolicy.min_refs must be an integer in [1, window={self.window}]; "
                f"got {self.min_refs!r}."
            )
        k = self.prior_weight
        if not is_real(k) or not math.isfinite(k) or k < 0:
            raise PolicyError(
                f"SituationPolicy.prior_weight must be a finite number ≥ 0; got {k!r}."
            )
        object.__setattr__(self, "prior_weight", float(k))
        t = self.prior_threshold
        if k > 0 and (t is None or not is_real(t) or not math.isfinite(t)):
            raise PolicyError(
                "SituationPolicy.prior_threshold must be a finite number when prior_weight > 0 "
                f"(the cut the prior's pseudo-references sit at, e.g. the frozen t0); got {t!r}."
            )
        if k == 0 and t is not None:
            raise PolicyError(
                f"SituationPolicy.prior_threshold is {t!r} but prior_weight is 0, so it would be "
                "ignored; give a prior_weight > 0 or drop prior_threshold."
            )
        if t is not None:
            object.__setattr__(self, "prior_threshold", float(t))

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("window", "min_refs", "fallback"), ("prior_weight", "prior_threshold")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> SituationPolicy:
        window = ctx.integer(d, "window", low=1)
        has = [k for k in ("prior_weight", "prior_threshold") if k in d]
        if len(has) == 1:
            missing = ({"prior_weight", "prior_threshold"} - set(has)).pop()
            raise PolicyError(
                f"{ctx.key(has[0])} is set but {ctx.key(missing)} is not; give both (κ "
                f"pseudo-references at a cut) or neither. Set it in {ctx.source}."
            )
        weight = ctx.number(d, "prior_weight") if has else 0.0
        if weight < 0:
            raise PolicyError(
                f"{ctx.key('prior_weight')} must be ≥ 0; got {weight!r}. Set it in {ctx.source}."
            )
        # checked even when a weight of 0 makes it unused: every key of the file is read
        threshold = ctx.number(d, "prior_threshold") if has else None
        return cls(
            window=window,
            min_refs=ctx.integer(d, "min_refs", low=1, high=window),
            fallback=ctx.parse_fallback(d["fallback"], ctx.key("fallback")),
            prior_weight=weight,
            prior_threshold=threshold if weight > 0 else None,
        )

    def inner(self) -> tuple[Policy, ...]:
        return (self.fallback,)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "window": self.window, "min_refs": self.min_refs}
        if self.prior_weight > 0:
            d["prior_weight"] = self.prior_weight
            d["prior_threshold"] = self.prior_threshold
        d["fallback"] = self.fallback.to_dict()
        return d

    def recentred(self, refs: Sequence[float]) -> float:
        """The threshold ``refs`` give (at least ``min_refs`` of them): their mean, or with a
        prior ``(ΣR + κ·t)/(k + κ)``. The one place the rule is written."""
        if self.prior_weight == 0:
            return mean_cut(refs)
        assert self.prior_threshold is not None  # __post_init__
        return mean_cut(refs, prior_weight=self.prior_weight, prior_threshold=self.prior_threshold)

    def _why(self, k: int, sid: str) -> str:
        if self.prior_weight == 0:
            return f"mean of {k} earlier scores of situation {sid!r}"
        return (
            f"mean of {k} earlier scores of situation {sid!r} and {self.prior_weight:.3g} "
            f"prior references at {self.prior_threshold:.6g}"
        )

    def members_needed(self) -> tuple[str, ...]:
        return self.fallback.members_needed()

    # -- state -----------------------------------------------------------------------------
    def initial_state(self, seed: Any) -> SituationWindows:
        """The seed's windows (cut to ``window``), or empty windows."""
        if seed is None:
            return SituationWindows(self.window)
        if not isinstance(seed, SituationWindows):
            raise PolicyError(
                f"a situation seed must be SituationWindows; got {type(seed).__name__}."
            )
        return SituationWindows(
            self.window, {s: v[-self.window :] for s, v in seed.situations.items()}
        )

    def _state(self, state: Any) -> SituationWindows:
        if state is None:
            return SituationWindows(self.window)
        if not isinstance(state, SituationWindows) or state.window != self.window:
            raise PolicyError(
                "the situation policy needs SituationWindows of the same window "
                f"({self.window}); got {state!r}."
            )
        return state

    def update(self, state: Any, x: BatchInputs) -> SituationWindows:
        """Each scene's finite ``S`` appended to its situation's window, in batch order."""
        return self._state(state).appended(
            (sid, float(s))
            for sid, s in zip(x.situation_ids, x.fused.tolist(), strict=True)
            if sid is not None
        )

    def seed_from_fit(self, ctx: FitContext) -> SituationWindows | None:
        """The last ``window`` fused scores of each situation's decisions in the context, in time
        order, keyed by the guard's ids (``ctx.window_ids``); None when no decision had a
        situation (the windows start empty anyway)."""
        seed = self.initial_state(None).appended(
            (str(sid), float(s))
            for sid, s in zip(ctx.window_ids.tolist(), ctx.fused.tolist(), strict=True)
            if sid
        )
        return seed if seed.situations else None

    def seed_to_dict(self, seed: Any) -> Any:
        return {"situations": self._state(seed).to_dict()}

    def seed_from_dict(self, d: Any, ctx: LoadContext) -> SituationWindows:
        # ctx.where: ``state_seed`` in a policy file, ``state`` in the guard's state file
        if not isinstance(d, Mapping) or set(d) != {"situations"}:
            refit = ", or refit with `spotstop recalibrate`" if ctx.where == "state_seed" else ""
            raise PolicyError(
                f"{ctx.where} must be a mapping with one key, situations; got {d!r}. "
                f"Fix it in {ctx.source}{refit}."
            )
        return SituationWindows.from_dict(
            d["situations"], window=self.window, where=ctx.key("situations"), source=ctx.source
        )

    # -- thresholds ------------------------------------------------------------------------
    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: ``S``; threshold: mean of earlier scores of the situation, or the fallback's."""
        windows = self._state(state)
        fb = self.fallback.thresholds(x, None)
        score = np.asarray(x.fused, dtype=float).copy()
        thr = np.empty_like(score)
        rule: list[str] = []
        detail: list[str] = []
        kind: list[str] = []
        for i, sid in enumerate(x.situation_ids):
            refs = windows.references(sid) if sid is not None else ()
            if sid is not None and len(refs) >= self.min_refs:
                thr[i] = self.recentred(refs)
                rule.append("situation")
                kind.append(self.kind)
                detail.append(self._why(len(refs), sid))
            else:
                score[i] = fb.score[i]
                thr[i] = fb.threshold[i]
                rule.append(f"situation->{fb.rule[i]}")
                kind.append(fb.kind[i])
                why = (
                    "no situation id"
                    if sid is None
                    else f"situation {sid!r} has {len(refs)} < min_refs {self.min_refs} references"
                )
                detail.append(f"{why}; fallback {self.fallback.kind}: {fb.detail[i]}")
            if sid is not None:
                windows = windows.appended([(sid, float(x.fused[i]))])
        return Thresholds(
            score=score, threshold=thr, rule=tuple(rule), detail=tuple(detail), kind=tuple(kind)
        )

    def next_threshold(self, state: Any, situation_id: str) -> tuple[str, float, tuple[float, ...]]:
        """(rule, threshold, references) a new scene of ``situation_id`` would get now.

        The threshold is NaN when the fallback has no fixed threshold (e.g. ``direct``).
        """
        refs = self._state(state).references(situation_id)
        if len(refs) >= self.min_refs:
            return "situation", self.recentred(refs), refs
        fixed = getattr(self.fallback, "threshold", float("nan"))
        return f"situation->{self.fallback.kind}", float(fixed), refs

    @classmethod
    def fit(cls, ctx: FitContext) -> SituationPolicy:
        """Frozen fallback t0; settings ``window`` (8), ``min_refs`` (3) and ``prior_weight``
        (given: that κ, 0 for the paper's rule; not given: :func:`situation_prior_weight` on
        the context's fused scores by the situations the guard keys its windows by,
        ``ctx.window_ids``, capped at ``window``); the prior sits at t0."""
        window = int(ctx.setting("window", 8))
        given = check_prior_weight(ctx.settings.get("prior_weight"))
        if given is None:
            weight, _ = situation_prior_weight(ctx.fused, ctx.window_ids, cap=window)
        else:
            weight = given
        return cls(
            window=window,
            min_refs=int(ctx.setting("min_refs", min(3, window))),
            fallback=FrozenPolicy(threshold=ctx.frozen_t0),
            prior_weight=weight,
            prior_threshold=ctx.frozen_t0 if weight > 0 else None,
        )
