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

Shrinking the reference mean (``icc`` < 1). A mean of ``k`` references is a noisy estimate of
where the situation sits: besides the situation's own offset it carries the mix of SAFE and
UNSAFE scenes among the references and each scene's noise. With ``icc = ρ``, the share of the
fused score's variance that sits between situations on an unlabelled pool (one-way ICC(1),
:func:`situation_icc`; the label mix counts as noise, since the guard cannot see labels), the
reliability of a mean of ``k`` references is Spearman-Brown's ``w_k = kρ / (1 + (k − 1)ρ)``,
and the threshold is Kelley's true-score estimate of the situation's centre: the frozen cut
``t0`` (the pool's mean ``S``) moved towards the reference mean by that share,
``t = t0 + w_k (mean − t0)``. ``icc = 1`` (``w_k = 1``) is the paper's rule, the plain mean;
``icc = 0`` never moves off ``t0``. It needs a ``frozen`` fallback (its ``t0`` is the centre
shrunk to). ``fit`` estimates ``icc`` from the fitting scenes' situations (setting ``icc``:
``"auto"``, the default, or a number in [0, 1]).

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
from spotstop.guard.validate import is_int, is_real

__all__ = ["SituationPolicy", "reference_weight", "situation_icc"]


def situation_icc(values: Any, situation_ids: Any) -> float | None:
    """One-way intraclass correlation ICC(1) of ``values`` grouped by ``situation_ids``.

    Unbalanced form: ``(MSB − MSW) / (MSB + (n0 − 1) MSW)`` with
    ``n0 = (N − Σn_j² / N) / (J − 1)``, clipped to [0, 1] (a negative estimate means no
    between-situation variance was seen). Only finite values with a non-empty id count, and only
    situations with at least two of them. None when fewer than two such situations remain, or
    when every value is the same (nothing to apportion).
    """
    v = np.asarray(values, dtype=float).reshape(-1)
    ids = np.asarray(situation_ids, dtype=object).reshape(-1)
    if v.shape != ids.shape:
        raise PolicyError(
            f"situation_icc needs one situation id per value; got {v.size} values and "
            f"{ids.size} ids."
        )
    ok = np.isfinite(v) & np.array([isinstance(s, str) and s != "" for s in ids], dtype=bool)
    _, codes = np.unique(ids[ok].astype(str), return_inverse=True)
    codes = codes.reshape(-1)
    v = v[ok]
    n_j = np.bincount(codes)
    keep = n_j[codes] >= 2
    _, codes = np.unique(codes[keep], return_inverse=True)
    codes, v = codes.reshape(-1), v[keep]
    if v.size == 0:
        return None
    n_j = np.bincount(codes).astype(float)
    j, n = n_j.size, float(v.size)
    if j < 2:
        return None
    means = np.bincount(codes, weights=v) / n_j
    ssb = float(np.sum(n_j * (means - v.mean()) ** 2))
    ssw = float(np.sum((v - means[codes]) ** 2))
    msb, msw = ssb / (j - 1), ssw / (n - j)
    n0 = (n - float(np.sum(n_j**2)) / n) / (j - 1)
    den = msb + (n0 - 1) * msw
    if not den > 0:
        return None
    return float(min(1.0, max(0.0, (msb - msw) / den)))


def reference_weight(k: int, icc: float) -> float:
    """Spearman-Brown reliability ``kρ / (1 + (k − 1)ρ)`` of a mean of ``k ≥ 1`` references whose
    share of between-situation variance is ``ρ = icc``: how far the threshold moves from the
    frozen cut towards their mean (1 at ``icc = 1``, the paper's rule)."""
    if icc >= 1.0:
        return 1.0
    return k * icc / (1.0 + (k - 1) * icc)


@dataclass(frozen=True)
class SituationPolicy(Policy):
    """Threshold = mean of the situation's earlier scores (see the module docstring).

    window: scores kept per situation. min_refs: references needed before recentering
    (1 ≤ min_refs ≤ window). fallback: a single-scene policy used until then. icc: the
    situation share the reference mean is shrunk by (1: the plain mean, the paper's rule; below 1
    needs a ``frozen`` fallback, whose cut is the centre shrunk to).
    """

    kind: ClassVar[str] = "situation"
    summary: ClassVar[str] = "mean S of recent unlabelled scenes of the same situation"
    single_scene: ClassVar[bool] = False
    stateful: ClassVar[bool] = True
    window: int
    min_refs: int
    fallback: Policy
    icc: float = 1.0

    def __post_init__(self) -> None:
        check_fallback(self.fallback, "SituationPolicy")
        if not is_real(self.icc) or not (0.0 <= self.icc <= 1.0):
            raise PolicyError(f"SituationPolicy.icc must be a number in [0, 1]; got {self.icc!r}.")
        object.__setattr__(self, "icc", float(self.icc))
        if self.icc < 1.0 and not isinstance(self.fallback, FrozenPolicy):
            raise PolicyError(
                f"SituationPolicy.icc {self.icc:g} < 1 shrinks the reference mean towards a frozen "
                f"cut, but the fallback is {self.fallback.kind!r}; use a frozen fallback, or "
                "icc 1 (the plain mean)."
            )
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
        return ("window", "min_refs", "fallback"), ("icc",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> SituationPolicy:
        window = ctx.integer(d, "window", low=1)
        icc = ctx.number(d, "icc") if "icc" in d else 1.0
        if not 0.0 <= icc <= 1.0:
            raise PolicyError(
                f"{ctx.key('icc')} must be a number in [0, 1]; got {icc!r}. Set it in {ctx.source}."
            )
        fallback = ctx.parse_fallback(d["fallback"], ctx.key("fallback"))
        if icc < 1.0 and not isinstance(fallback, FrozenPolicy):
            raise PolicyError(
                f"{ctx.key('icc')} {icc:g} < 1 needs a frozen fallback (the cut the reference "
                f"mean is shrunk to); {ctx.key('fallback')} is {fallback.kind!r}. Set icc: 1 or "
                f"a frozen fallback in {ctx.source}."
            )
        return cls(
            window=window,
            min_refs=ctx.integer(d, "min_refs", low=1, high=window),
            fallback=fallback,
            icc=icc,
        )

    def inner(self) -> tuple[Policy, ...]:
        return (self.fallback,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "window": self.window,
            "min_refs": self.min_refs,
            "fallback": self.fallback.to_dict(),
            # the plain mean (icc 1) writes no key, as before the key existed
            **({"icc": self.icc} if self.icc < 1.0 else {}),
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
                thr[i] = self.centre(refs)
                rule.append("situation")
                kind.append(self.kind)
                detail.append(self._describe(refs, sid))
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

    def centre(self, refs: tuple[float, ...]) -> float:
        """THE threshold of a scene with references ``refs`` (at least ``min_refs``): their mean,
        or with ``icc < 1`` the frozen cut moved towards it by :func:`reference_weight`."""
        mean = float(np.mean(refs))
        if self.icc >= 1.0:
            return mean
        assert isinstance(self.fallback, FrozenPolicy)  # __post_init__ holds it
        t0 = self.fallback.threshold
        return t0 + reference_weight(len(refs), self.icc) * (mean - t0)

    def _describe(self, refs: tuple[float, ...], sid: str) -> str:
        what = f"mean of {len(refs)} earlier scores of situation {sid!r}"
        if self.icc >= 1.0:
            return what
        w = reference_weight(len(refs), self.icc)
        return f"frozen cut moved {w:.2f} of the way to the {what} (icc {self.icc:.3g})"

    def next_threshold(self, state: Any, situation_id: str) -> tuple[str, float, tuple[float, ...]]:
        """(rule, threshold, references) a new scene of ``situation_id`` would get now.

        The threshold is NaN when the fallback has no fixed threshold (e.g. ``direct``).
        """
        refs = self._state(state).references(situation_id)
        if len(refs) >= self.min_refs:
            return "situation", self.centre(refs), refs
        fixed = getattr(self.fallback, "threshold", float("nan"))
        return f"situation->{self.fallback.kind}", float(fixed), refs

    @classmethod
    def fit(cls, ctx: FitContext) -> SituationPolicy:
        """Frozen fallback t0; settings ``window`` (8), ``min_refs`` (3) and ``icc``: ``"auto"``
        (the default) estimates it, like ``t0``, from the context's scenes of situations with at
        least two of them (:func:`situation_icc` on ``S``; 1, the plain mean, when fewer than
        two such situations exist); a number in [0, 1] is used as given."""
        window = int(ctx.setting("window", 8))
        icc = ctx.settings.get("icc")  # fitted, as t0 is: the current policy's is not kept
        if icc is None or icc == "auto":
            est = situation_icc(ctx.fused, ctx.situation_id)
            icc = 1.0 if est is None else est
        return cls(
            window=window,
            min_refs=int(ctx.setting("min_refs", min(3, window))),
            fallback=FrozenPolicy(threshold=ctx.frozen_t0),
            icc=icc,
        )
