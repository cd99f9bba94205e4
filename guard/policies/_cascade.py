"""``cascade``: the second member only where the first is least certain (seed 000, "Cost").

The first member scores every scene. Its robust z-score ``z1 = (s1 − median1) / IQR1`` (the
policy's own reference statistics) is compared with the cut the scene would meet; only when
``|z1 − cut| ≤ band`` does the second member run, and the scene is then decided on the
pair's fused ``S``. Every other scene is decided on ``z1`` alone, against the same cut: the
cascade's score is ``C = S`` inside the band and ``C = z1`` outside it. The cut is an inner
single-threshold policy (``frozen``, ``conformal`` or ``situation``) applied to ``C``.

The band is fitted on the unlabelled pool so that the second member runs on a chosen share
``q`` of scenes (``share``; the paper's point is 0.9): ``band`` is the q-quantile of
``|z1 − cut|`` over the pool. The paper's cascade calls LFM2.5-VL-3B only where Qwen3.5-2B is
least certain and loses 0.002 AUROC at 90 %.

Where the cut comes from: before the second member runs, the cut of each scene is the inner
policy's threshold with the state before the batch, every scene scored by ``z1``
(:meth:`CascadePolicy.second_needed`); the label then uses the inner policy on ``C``. For
``frozen`` and ``conformal`` the two cuts are the same number; for ``situation`` they can
differ only through earlier scenes of the same batch. Which scenes are inside the band is
decided once, before scoring: the label reads it from the batch (``BatchInputs.ran``, the
log's ``members_run``) wherever it is known (:meth:`CascadePolicy.inside_band`).

Fail closed: a scene inside the band whose pair score is missing (the second member did not
run or failed) gets a NaN score, hence UNSAFE; a scene whose first score is missing is UNSAFE.

What the guard scores is this policy's :meth:`CascadePolicy.scoring_plan`: the first member
on every scene, then the others exactly where :meth:`second_needed` says. The guard runs the
plan (it has no cascade branch) and logs which members ran (``members_run``) and which kind
decided (``deciding_kind``: the cut's kind, or its fallback's); whether a scene was decided
by the first member alone or by the pair is ``members_run`` (and, for people, the rule:
``cascade[<first>]->frozen`` or ``cascade[pair]->frozen``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
)
from spotstop.guard.policies._plan import ScoringPlan, ScoringStage
from spotstop.guard.validate import is_real

__all__ = ["CUT_KINDS", "CascadePolicy", "cascade_band"]

#: The cuts a cascade composes with (single-threshold kinds on one score).
CUT_KINDS: tuple[str, ...] = ("frozen", "conformal", "situation")

#: The paper's operating point: the second member on 90 % of scenes.
DEFAULT_SHARE = 0.9


def cascade_band(distance: np.ndarray, share: float) -> float:
    """The band half-width that sends ``share`` of the pool to the second member.

    ``distance`` holds ``|z1 − cut|`` per pool scene (finite). The band is the
    ``ceil(share · n)``-th smallest distance, so that (with ``≤``) at least ``share`` of the
    pool falls inside it and, without ties, exactly ``ceil(share · n)`` scenes; ``share`` 1
    gives the largest distance (every pool scene).
    """
    d = np.sort(np.asarray(distance, dtype=float))
    if d.size == 0 or not np.all(np.isfinite(d)):
        raise PolicyError(
            "cascade: the band needs finite first-member scores on the pool; got "
            f"{d.size} scenes ({int(np.sum(~np.isfinite(d)))} not finite)."
        )
    if not (is_real(share) and 0 < share <= 1):
        raise PolicyError(f"cascade share must be in (0, 1]; got {share!r}.")
    k = max(1, math.ceil(share * d.size - 1e-9))
    return float(d[k - 1])


def _raw_score_problem(cut: Policy) -> str | None:
    """Why ``cut`` cannot be a cascade's cut, or None: it must decide on the cascade's score
    ``C``; one that reads a member's raw score (a situation cut's ``direct`` fallback) cannot
    have the band chosen around it before the second member scores."""
    raw = list(cut.members_needed())
    if not raw:
        return None
    return (
        f"must decide on the cascade's score C; its {cut.kind} cut reads the raw score of "
        f"member(s) {raw} (a direct fallback): give it a frozen or conformal fallback"
    )


@dataclass(frozen=True)
class CascadePolicy(Policy):
    """First member alone outside a band around the cut; the pair inside it.

    first: the member that scores every scene. share: the share of the pool that went to the
    second member when the band was fitted (reported; the band is what decides). band: the
    half-width on ``|z1 − cut|`` (≥ 0). cut: the inner policy (frozen, conformal, situation).
    centre: where the band is centred when not on the cut itself (None: on each scene's cut).
    A conformal cut is fitted on the cascade's own score, which depends on the band; so its
    band has a fixed centre near the cut, and the guarantee is exact for that score.
    """

    kind: ClassVar[str] = "cascade"
    summary: ClassVar[str] = (
        "first member alone far from the cut; the second only inside a band (share q)"
    )
    single_scene: ClassVar[bool] = False  # it changes what is scored: never a fallback
    first: str
    share: float
    band: float
    cut: Policy
    centre: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.first, str) or not self.first:
            raise PolicyError(f"CascadePolicy.first must name a member; got {self.first!r}.")
        if not (is_real(self.share) and 0 < self.share <= 1):
            raise PolicyError(f"CascadePolicy.share must be in (0, 1]; got {self.share!r}.")
        if not (is_real(self.band) and math.isfinite(self.band) and self.band >= 0):
            raise PolicyError(f"CascadePolicy.band must be a finite number ≥ 0; got {self.band!r}.")
        if not isinstance(self.cut, Policy) or self.cut.kind not in CUT_KINDS:
            got = getattr(self.cut, "kind", type(self.cut).__name__)
            raise PolicyError(
                f"CascadePolicy.cut must be one of {', '.join(CUT_KINDS)}; got {got!r}."
            )
        problem = _raw_score_problem(self.cut)
        if problem is not None:
            raise PolicyError(f"CascadePolicy.cut {problem}.")
        if self.centre is not None and not (is_real(self.centre) and math.isfinite(self.centre)):
            raise PolicyError(
                f"CascadePolicy.centre must be a finite number or None; got {self.centre!r}."
            )
        object.__setattr__(self, "share", float(self.share))
        object.__setattr__(self, "band", float(self.band))
        if self.centre is not None:
            object.__setattr__(self, "centre", float(self.centre))

    # -- the stateful parts follow the cut's ------------------------------------------------
    @property
    def stateful(self) -> bool:  # type: ignore[override]
        return self.cut.stateful

    def initial_state(self, seed: Any) -> Any:
        return self.cut.initial_state(seed)

    def seed_from_fit(self, ctx: FitContext) -> Any:
        """The cut's state as the guard builds it under this cascade: the context's decisions
        checked one at a time, in order, so a situation cut's windows hold the cascade's
        score ``C`` (``S`` inside the band, ``z1`` outside), not the pair's ``S``; None when
        the cut keeps no state or no decision had a situation."""
        if not self.cut.stateful or self.cut.seed_from_fit(ctx) is None:
            return None
        from spotstop.guard.policies._decide import batch_inputs, replay

        sids = [str(s) if s else None for s in np.asarray(ctx.window_ids, dtype=object)]
        x = batch_inputs(ctx.fusion, ctx.member_scores, sids)
        return replay(self, x, state=self.cut.initial_state(None)).state

    def seed_to_dict(self, seed: Any) -> Any:
        return self.cut.seed_to_dict(seed)

    def seed_from_dict(self, d: Any, ctx: LoadContext) -> Any:
        return self.cut.seed_from_dict(d, ctx)

    # -- YAML --------------------------------------------------------------------------------
    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("first", "share", "band", "cut"), ("centre",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> CascadePolicy:
        from spotstop.guard.policies._registry import policy_from_dict

        first = d["first"]
        if first not in ctx.members:
            raise PolicyError(
                f"{ctx.key('first')} must name a fusion member, one of {list(ctx.members)}; "
                f"got {first!r}. Set it in {ctx.source}."
            )
        sub = d["cut"]
        if not isinstance(sub, Mapping) or sub.get("kind") not in CUT_KINDS:
            got = sub.get("kind") if isinstance(sub, Mapping) else sub
            raise PolicyError(
                f"{ctx.key('cut')}.kind must be one of {', '.join(CUT_KINDS)}; got {got!r}. "
                f"Set it in {ctx.source}."
            )
        cut = policy_from_dict(sub, where=ctx.key("cut"), source=ctx.source, members=ctx.members)
        problem = _raw_score_problem(cut)
        if problem is not None:
            raise PolicyError(f"{ctx.key('cut')} {problem}. Set it in {ctx.source}.")
        share = ctx.number(d, "share")
        band = ctx.number(d, "band")
        if not 0 < share <= 1:
            raise PolicyError(
                f"{ctx.key('share')} must be in (0, 1]; got {share!r}. Set it in {ctx.source}."
            )
        if band < 0:
            raise PolicyError(
                f"{ctx.key('band')} must be ≥ 0; got {band!r}. Set it in {ctx.source}."
            )
        centre = ctx.number(d, "centre") if d.get("centre") is not None else None
        return cls(first=str(first), share=share, band=band, cut=cut, centre=centre)

    def inner(self) -> tuple[Policy, ...]:
        return (self.cut,)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "first": self.first,
            "share": self.share,
            "band": self.band,
        }
        if self.centre is not None:
            out["centre"] = self.centre
        out["cut"] = self.cut.to_dict()
        return out

    def members_needed(self) -> tuple[str, ...]:
        return (self.first,)

    def variants_needed(self) -> tuple[str, ...]:
        return self.cut.variants_needed()

    # -- the rule ----------------------------------------------------------------------------
    def scoring_plan(
        self,
        members: Sequence[str],
        fusion: Avg2Fusion,
        situation_ids: Sequence[str | None],
        state: Any,
    ) -> ScoringPlan:
        """Two stages: :attr:`first` on every scene, then the other members only where
        :meth:`second_needed` says (inside the band), from the state before the batch."""
        sids = tuple(situation_ids)

        def inside_band(scores: Mapping[str, np.ndarray]) -> np.ndarray:
            return self.second_needed(fusion, scores[self.first], sids, state)

        rest = tuple(m for m in members if m != self.first)
        stages = [ScoringStage((self.first,))]
        if rest:
            stages.append(ScoringStage(rest, where=inside_band))
        return ScoringPlan(tuple(stages))

    def z_first(self, fusion: Avg2Fusion, scores: np.ndarray) -> np.ndarray:
        """The first member's robust z-score under the policy's reference statistics."""
        st = fusion.stats[self.first]
        return (np.asarray(scores, dtype=float) - st.median) / st.iqr

    def _pre_cut(
        self, fusion: Avg2Fusion, z1: np.ndarray, sids: Sequence[str | None], state: Any
    ) -> np.ndarray:
        pre = BatchInputs(
            fused=z1,
            members={self.first: z1},
            situation_ids=tuple(sids),
            fusion=fusion,
        )
        return np.asarray(self.cut.thresholds(pre, state).threshold, dtype=float)

    def second_needed(
        self,
        fusion: Avg2Fusion,
        first_scores: np.ndarray,
        situation_ids: Sequence[str | None],
        state: Any,
    ) -> np.ndarray:
        """True where the rest of the pair must score the scene: ``|z1 − cut| ≤ band`` (or
        ``|z1 − centre| ≤ band`` when the band has a fixed centre).

        A scene whose first score is not finite is never sent on (it is UNSAFE anyway).
        """
        z1 = self.z_first(fusion, first_scores)
        mid = (
            self._pre_cut(fusion, z1, situation_ids, state)
            if self.centre is None
            else np.full(z1.shape, self.centre)
        )
        with np.errstate(invalid="ignore"):
            return np.asarray(np.abs(z1 - mid) <= self.band, dtype=bool)

    def inside_band(self, x: BatchInputs, state: Any) -> np.ndarray:
        """Where the batch's scenes are decided on the pair: where the guard ran the rest of
        the pair (``x.ran``, what its plan chose before scoring), else (no ``x.ran``, or -1:
        not known for that scene) where :meth:`second_needed` says. The band is chosen once,
        by the plan: deciding it again would move it for a situation cut when an earlier scene
        of the batch failed after the plan (its windows differ), and a scene the pair scored
        could then be decided on the first member alone, or one the pair never saw be sent to
        the pair's missing score."""
        rest = [m for m in x.fusion.members if m != self.first]
        if x.ran is not None and rest and all(m in x.ran for m in rest):
            runs = np.array([np.asarray(x.ran[m]) for m in rest])
            known = np.all(runs >= 0, axis=0)  # -1: not known for that scene (another policy's)
            chosen = np.any(runs > 0, axis=0)
            if known.all():
                return chosen
            worked_out = self.second_needed(x.fusion, x.members[self.first], x.situation_ids, state)
            return np.where(known, chosen, worked_out)
        return self.second_needed(x.fusion, x.members[self.first], x.situation_ids, state)

    def _cascade_inputs(self, x: BatchInputs, state: Any) -> tuple[BatchInputs, np.ndarray]:
        inside = self.inside_band(x, state)
        z1 = self.z_first(x.fusion, x.members[self.first])
        c = np.where(inside, x.fused, z1)  # inside the band without a pair score: NaN
        return dataclasses.replace(x, fused=c), inside

    def complete(self, x: BatchInputs, state: Any) -> np.ndarray:
        """The first member's score, and inside the band the pair's ``S`` (the second member
        is not needed outside it)."""
        xc, _ = self._cascade_inputs(x, state)
        return np.isfinite(xc.fused)

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score ``C`` (``S`` inside the band, ``z1`` outside); the cut's threshold on it."""
        xc, inside = self._cascade_inputs(x, state)
        t = self.cut.thresholds(xc, state)
        rule = tuple(
            f"cascade[{'pair' if i else self.first}]->{r}"
            for i, r in zip(inside.tolist(), t.rule, strict=True)
        )
        detail = tuple(
            (f"inside the band ±{self.band:.4g}: pair S; " if i else f"{self.first} alone: ") + d
            for i, d in zip(inside.tolist(), t.detail, strict=True)
        )
        return Thresholds(
            score=t.score, threshold=t.threshold, rule=rule, detail=detail, kind=t.kind
        )

    def update(self, state: Any, x: BatchInputs) -> Any:
        xc, _ = self._cascade_inputs(x, state)
        return self.cut.update(state, xc)

    @classmethod
    def fit(cls, ctx: FitContext) -> CascadePolicy:
        """Settings ``first`` (the fusion's first member), ``share`` (0.9), ``cut``
        (``frozen``; or ``conformal``/``situation`` with their own settings).

        The cut is fitted as that kind on the context (on the pair's ``S``); the band is the
        ``share``-quantile of ``|z1 − cut|`` over the context's scenes with a finite first
        score (:func:`cascade_band`). A ``conformal`` cut is then refitted on the cascade's
        own score ``C`` (its miss guarantee is about what the guard compares), alternating
        with the band until both agree.
        """
        from spotstop.guard.policies._registry import policy_class

        first = ctx.setting("first", ctx.fusion.members[0])
        if first not in ctx.fusion.members:
            raise PolicyError(
                f"cascade: first must name a fusion member, one of {list(ctx.fusion.members)}; "
                f"got {first!r}."
            )
        share = float(ctx.setting("share", DEFAULT_SHARE))
        cut_kind = ctx.settings.get("cut")
        if cut_kind is None:
            cur = getattr(ctx.current, "cut", None)
            cut_kind = cur.kind if isinstance(cur, Policy) else "frozen"
        if cut_kind not in CUT_KINDS:
            raise PolicyError(
                f"cascade: cut must be one of {', '.join(CUT_KINDS)}; got {cut_kind!r}."
            )
        inner_ctx = dataclasses.replace(
            ctx, current=getattr(ctx.current, "cut", None) if ctx.current else None
        )
        cut = policy_class(cut_kind).fit(inner_ctx)
        s1 = np.asarray(ctx.member_scores[first], dtype=float)
        ok = np.isfinite(s1)
        probe = cls(first=first, share=share, band=0.0, cut=cut)
        z1 = probe.z_first(ctx.fusion, s1[ok])
        sids = tuple(s or None for s in np.asarray(ctx.window_ids, dtype=object)[ok].tolist())

        def band_for(c: Policy) -> tuple[float, np.ndarray]:
            state = c.initial_state(c.seed_from_fit(inner_ctx)) if c.stateful else None
            dist = np.abs(z1 - probe._pre_cut(ctx.fusion, z1, sids, state))
            return cascade_band(dist, share), dist

        band, _ = band_for(cut)
        if cut_kind != "conformal":
            return cls(first=first, share=share, band=band, cut=cut)
        return cls._fit_conformal(ctx, inner_ctx, first, share, z1, ok, cut)

    @classmethod
    def _fit_conformal(
        cls,
        ctx: FitContext,
        inner_ctx: FitContext,
        first: str,
        share: float,
        z1: np.ndarray,
        ok: np.ndarray,
        pair_cut: Policy,
    ) -> CascadePolicy:
        """A conformal cut fitted on the cascade's own score ``C``.

        The guarantee is about the score the guard compares, ``C`` (``z1`` outside the
        band), not the pair's ``S``; and ``C`` depends on the band. So the band gets a fixed
        centre ``m`` (``|z1 − m| ≤ band``, ``band`` the ``share``-quantile of ``|z1 − m|``)
        and the cut is the conformal cut of ``C_m``: exact for that score, whatever ``m``.
        ``m`` is chosen near the cut it gives: bisection of ``g(m) − m`` between the pair's
        cut and ``g`` of it (simple iteration can cycle), else the pair's cut.
        """
        from spotstop.guard.policies._registry import policy_class

        fused = np.asarray(ctx.fused, dtype=float)

        def fit_at(m: float) -> tuple[Policy, float]:
            dist = np.abs(z1 - m)
            band = cascade_band(dist, share)
            c = np.full(fused.shape, np.nan)
            c[ok] = np.where(dist <= band, fused[ok], z1)
            cut = policy_class("conformal").fit(dataclasses.replace(inner_ctx, fused=c))
            return cut, band

        def gap(m: float) -> float:
            return float(fit_at(m)[0].threshold) - m  # type: ignore[attr-defined]

        lo = float(pair_cut.threshold)  # type: ignore[attr-defined]
        hi = lo + gap(lo)
        centre = lo
        g_lo, g_hi = gap(lo), gap(hi)
        if g_lo != 0 and hi != lo and np.sign(g_lo) != np.sign(g_hi):
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                g_mid = gap(mid)
                if g_mid == 0:
                    lo = hi = mid
                    break
                if np.sign(g_mid) == np.sign(g_lo):
                    lo, g_lo = mid, g_mid
                else:
                    hi = mid
            centre = 0.5 * (lo + hi)
        cut, band = fit_at(centre)
        return cls(first=first, share=share, band=band, cut=cut, centre=centre)
