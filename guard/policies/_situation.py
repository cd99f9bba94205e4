"""``situation``: recentering on unlabelled scenes of the same situation (seed 000, Sec. 6.2).

For a scene of situation ``sid`` the threshold is the mean of the last ``window`` finite fused
scores of ``sid`` seen BEFORE this scene, once there are at least ``min_refs`` of them; before
that (and for scenes without a situation id) the ``fallback`` decides. Scenes of one batch are
taken in order, so a later scene sees the earlier ones. Leaving the scene out of its own
references does not change the label of the mean rule (``S ≥ (ΣR + S)/(m + 1)`` iff
``S ≥ ΣR/m``); it keeps the reference count honest and the threshold independent of the scene.

The windows are a :class:`~spotstop.guard.policies.SituationWindows` value: this module reads
it and returns the next one; the guard owns it and persists it, and ``calibrate`` fits its
starting value (``state_seed`` in ``policy.yaml``) from the log.

Caveat: the rule needs unlabelled scenes of both classes among the references; in an all-safe
situation it will call some safe scenes unsafe.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from spotstop.guard.validate import is_int

__all__ = ["SituationPolicy"]


@dataclass(frozen=True)
class SituationPolicy(Policy):
    """Threshold = mean of the situation's earlier scores (see the module docstring).

    window: scores kept per situation. min_refs: references needed before recentering
    (1 ≤ min_refs ≤ window). fallback: a single-scene policy used until then.
    """

    kind: ClassVar[str] = "situation"
    summary: ClassVar[str] = "mean S of recent unlabelled scenes of the same situation"
    single_scene: ClassVar[bool] = False
    stateful: ClassVar[bool] = True
    window: int
    min_refs: int
    fallback: Policy

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

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("window", "min_refs", "fallback"), ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> SituationPolicy:
        window = ctx.integer(d, "window", low=1)
        return cls(
            window=window,
            min_refs=ctx.integer(d, "min_refs", low=1, high=window),
            fallback=ctx.parse_fallback(d["fallback"], ctx.key("fallback")),
        )

    def inner(self) -> tuple[Policy, ...]:
        return (self.fallback,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "window": self.window,
            "min_refs": self.min_refs,
            "fallback": self.fallback.to_dict(),
        }

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
        order; None when no decision had a situation (the windows start empty anyway)."""
        seed = self.initial_state(None).appended(
            (str(sid), float(s))
            for sid, s in zip(ctx.situation_id.tolist(), ctx.fused.tolist(), strict=True)
            if sid
        )
        return seed if seed.situations else None

    def seed_to_dict(self, seed: Any) -> Any:
        return {"situations": self._state(seed).to_dict()}

    def seed_from_dict(self, d: Any, ctx: LoadContext) -> SituationWindows:
        if not isinstance(d, Mapping) or set(d) != {"situations"}:
            raise PolicyError(
                f"state_seed must be a mapping with one key, situations; got {d!r}. "
                f"Fix it in {ctx.source}, or refit with `spotstop recalibrate`."
            )
        return SituationWindows.from_dict(
            d["situations"], window=self.window, where="state_seed.situations", source=ctx.source
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
            if len(refs) >= self.min_refs:
                thr[i] = float(np.mean(refs))
                rule.append("situation")
                kind.append(self.kind)
                detail.append(f"mean of {len(refs)} earlier scores of situation {sid!r}")
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
            return "situation", float(np.mean(refs)), refs
        fixed = getattr(self.fallback, "threshold", float("nan"))
        return f"situation->{self.fallback.kind}", float(fixed), refs

    @classmethod
    def fit(cls, ctx: FitContext) -> SituationPolicy:
        """Frozen fallback t0; settings ``window`` (8) and ``min_refs`` (3)."""
        window = int(ctx.setting("window", 8))
        return cls(
            window=window,
            min_refs=int(ctx.setting("min_refs", min(3, window))),
            fallback=FrozenPolicy(threshold=ctx.frozen_t0),
        )
