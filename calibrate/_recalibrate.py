"""Offline recalibration from the decision log: fusion, frozen cut, conformal cut, situations.

:class:`Recalibrator` holds the settings; ``fit(data)`` learns from a
:class:`~spotstop.calibrate.LogData` (one bundle's decisions in a window):

1. fusion statistics (per-member median and IQR) and the frozen cut t₀ = mean fused score,
   on the *usable* decisions, labels unused (:func:`calibrate.fit_frozen`). With
   ``refit_fusion=False`` the current policy's fusion is kept and only t₀ is refitted.
2. fused scores RECOMPUTED from the logged member scores with the new fusion: the logged
   ``fused_score`` was made with the fusion active at decision time, so it is on the old
   scale and is never used for fitting.
3. the conformal cut (:class:`~spotstop.calibrate.ConformalCalibrator`) on the recomputed fused
   scores of usable decisions labelled unsafe, one case per situation, both guarantees
   reported; it refuses (``PolicyError``) only when the requested policy is ``conformal``.
   Note: fusion statistics are fitted without labels on a pool that includes the
   calibration cases; the guarantee treats the fusion as fixed. With a pool much larger than
   the calibration set this dependence is negligible; ``refit_fusion=False`` removes it.
4. situation state: per situation, the last ``window`` recomputed fused scores of its usable
   decisions, in time order (what the guard would hold had it run the new fusion).
5. the recommendation (:func:`calibrate.recommend_policy`).

``to_config()`` returns the new :class:`spotstop.guard._policy.PolicyConfig` with provenance;
:func:`calibrate.write_policy_version` writes it next to the old ones.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Self

import numpy as np
from spotstop.calibrate._conformal import ConformalCalibrator, CutChoice
from spotstop.calibrate._frozen import FrozenFit, fit_frozen
from spotstop.calibrate._logdata import CalibrationError, LogData
from spotstop.calibrate._recommend import Recommendation, recommend_policy, situation_repeat_share
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard._policy import (
    AnyPolicy,
    BatchPolicy,
    FrozenPolicy,
    NotFittedError,
    PolicyConfig,
    PolicyError,
    SituationPolicy,
)

__all__ = ["POLICY_KINDS", "Recalibrator", "tool_version"]

POLICY_KINDS = ("frozen", "batch", "situation", "conformal")
PolicyKind = Literal["frozen", "batch", "situation", "conformal"]


def tool_version() -> str:
    """The installed spotstop version (``"unknown"`` when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("spotstop")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class _Defaults:
    window: int = 8
    min_refs: int = 3
    min_batch: int = 2


class Recalibrator:
    """Refit a policy from a decision log (see the module docstring for the steps).

    policy: the kind to write: ``frozen``, ``batch`` (batch mean, frozen fallback),
        ``situation`` (situation mean, frozen fallback, state from the log) or ``conformal``.
    alpha, delta, guarantee, cluster_rule: the conformal settings
        (:class:`~spotstop.calibrate.ConformalCalibrator`); both guarantees are always reported.
    refit_fusion: refit the fusion statistics (default) or keep the current policy's.
    window, min_refs, min_batch: situation/batch settings; None takes the current policy's
        value when it has one, else 8, 3 and 2.
    min_pool: fewest usable decisions for the frozen statistics.
    recommend: run the diagnostics for the recommendation (``n_resamples`` each).
    rng: seed or Generator for the random cluster rule and the diagnostics; the fitted
        policy itself depends on it only through ``cluster_rule="random"``.

    Learned: ``frozen_`` (:class:`FrozenFit`), ``fusion_``, ``fused_`` (recomputed fused
    scores, NaN where unusable), ``conformal_`` (fitted calibrator, or None without unsafe
    labels), ``situation_refs_`` (situation -> scores, oldest first), ``policy_``,
    ``recommendation_`` (or None), ``data_`` (the :class:`LogData`).
    """

    def __init__(
        self,
        policy: PolicyKind = "conformal",
        *,
        alpha: float = 0.1,
        delta: float = 0.1,
        guarantee: Literal["marginal", "pac"] = "pac",
        cluster_rule: Literal["min", "random"] = "min",
        refit_fusion: bool = True,
        window: int | None = None,
        min_refs: int | None = None,
        min_batch: int | None = None,
        min_pool: int = 8,
        recommend: bool = True,
        n_resamples: int = 200,
        rng: np.random.Generator | int | None = 0,
    ) -> None:
        self.policy = policy
        self.alpha = alpha
        self.delta = delta
        self.guarantee = guarantee
        self.cluster_rule = cluster_rule
        self.refit_fusion = refit_fusion
        self.window = window
        self.min_refs = min_refs
        self.min_batch = min_batch
        self.min_pool = min_pool
        self.recommend = recommend
        self.n_resamples = n_resamples
        self.rng = rng

    # ------------------------------------------------------------------ learning
    def fit(self, data: LogData, current: PolicyConfig | None = None) -> Self:
        """Learn everything from ``data``; ``current`` is the active policy (may be None)."""
        _check_recalibrator(self, data, current)
        gen = (
            self.rng
            if isinstance(self.rng, np.random.Generator)
            else np.random.default_rng(self.rng)
        )
        use = data.usable
        pool = {m: data.member_scores[m][use] for m in data.members}
        n_pool = int(use.sum())
        if n_pool < self.min_pool:
            raise CalibrationError(
                f"the log has {n_pool} usable decisions of bundle {data.bundle_id} in the window "
                f"(not fail-closed, all member scores finite); at least {self.min_pool} are "
                f"needed for the frozen statistics. Dropped: {data.dropped}. Widen "
                "--since/--until or collect more decisions."
            )
        if self.refit_fusion:
            frozen = fit_frozen(pool, min_n=self.min_pool)
        else:
            assert current is not None  # checked
            fusion = current.fusion
            fused_pool = fusion.fuse_many(pool)
            frozen = FrozenFit(
                fusion=fusion, policy=FrozenPolicy(float(np.mean(fused_pool))), n=n_pool
            )
        fusion = frozen.fusion
        fused = np.full(data.n, np.nan)
        fused[use] = fusion.fuse_many(pool)  # recomputed: the logged fused is on the old scale
        self._frozen, self._fusion, self._fused, self._data = frozen, fusion, fused, data

        unsafe = use & (data.label == 1)
        cal: ConformalCalibrator | None = None
        if unsafe.any():
            cal = ConformalCalibrator(
                self.alpha,
                self.delta,
                guarantee=self.guarantee,
                cluster_rule=self.cluster_rule,
                rng=gen,
            ).fit(fused[unsafe], data.situation_id[unsafe], refuse=self.policy == "conformal")
        elif self.policy == "conformal":
            ConformalCalibrator(
                self.alpha, self.delta, guarantee=self.guarantee, cluster_rule=self.cluster_rule
            ).fit(np.zeros(0))  # raises the refusal with the number needed
        self._conformal = cal

        defaults = _current_defaults(current)
        window = self.window if self.window is not None else defaults.window
        min_refs = self.min_refs if self.min_refs is not None else defaults.min_refs
        min_batch = self.min_batch if self.min_batch is not None else defaults.min_batch
        refs: dict[str, deque[float]] = {}
        for i in np.flatnonzero(use):
            sid = str(data.situation_id[i])
            if sid:
                refs.setdefault(sid, deque(maxlen=window)).append(float(fused[i]))
        self._refs = {s: tuple(w) for s, w in sorted(refs.items())}

        fallback = frozen.policy
        policy: AnyPolicy
        if self.policy == "frozen":
            policy = fallback
        elif self.policy == "batch":
            policy = BatchPolicy(fallback=fallback, min_batch=min_batch)
        elif self.policy == "situation":
            policy = SituationPolicy(window=window, min_refs=min_refs, fallback=fallback)
        else:
            assert cal is not None
            policy = cal.to_policy()
        self._policy = policy

        self._recommendation: Recommendation | None = None
        if self.recommend:
            self._recommendation = self._recommend(gen, min_refs)
        return self

    def _recommend(self, gen: np.random.Generator, min_refs: int) -> Recommendation:
        from spotstop.diagnostics import CaseTable

        d = self._data
        lab = d.usable & (d.label >= 0)
        table = None
        if lab.any():
            table = CaseTable(
                case_id=d.decision_id[lab],
                label=d.label[lab],
                score=self._fused[lab],
                contrast_id=d.contrast_id[lab],
                situation_id=d.situation_id[lab],
            )
        cal = self._conformal
        chosen = None if cal is None else cal.chosen_
        need = (
            chosen.n_needed
            if chosen is not None
            else ConformalCalibrator(self.alpha, self.delta, guarantee=self.guarantee)
            .fit(np.zeros(0), refuse=False)
            .chosen_.n_needed
        )
        return recommend_policy(
            table,
            frozen_cut=self._frozen.policy.threshold,
            conformal_feasible=chosen is not None and chosen.feasible,
            conformal_needed=need,
            n_unsafe_situations=0 if cal is None else cal.n_situations_,
            guarantee=self.guarantee,
            alpha=float(self.alpha),
            delta=float(self.delta),
            repeat_share=situation_repeat_share(d.situation_id, d.usable, min_refs=min_refs),
            min_refs=min_refs,
            n_resamples=self.n_resamples,
            rng=gen,
        )

    # ------------------------------------------------------------------ learned state
    def _fitted(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise NotFittedError(
                "This Recalibrator is not fitted yet; call fit(read_log(...)) first."
            ) from None

    @property
    def frozen_(self) -> FrozenFit:
        """Fusion statistics and frozen cut t₀ (fitted on usable decisions, labels unused)."""
        return self._fitted("_frozen")

    @property
    def fusion_(self) -> Avg2Fusion:
        """The fusion of the new policy."""
        return self._fitted("_fusion")

    @property
    def fused_(self) -> np.ndarray:
        """Fused scores recomputed with ``fusion_`` (NaN where the decision is unusable)."""
        return self._fitted("_fused")

    @property
    def conformal_(self) -> ConformalCalibrator | None:
        """The fitted conformal calibrator, or None when no usable decision is labelled unsafe."""
        return self._fitted("_conformal")

    @property
    def situation_refs_(self) -> dict[str, tuple[float, ...]]:
        """Situation -> its last ``window`` recomputed fused scores, oldest first."""
        return dict(self._fitted("_refs"))

    @property
    def policy_(self) -> AnyPolicy:
        """The new threshold policy."""
        return self._fitted("_policy")

    @property
    def recommendation_(self) -> Recommendation | None:
        """The recommendation (None when ``recommend=False``)."""
        return self._fitted("_recommendation")

    @property
    def data_(self) -> LogData:
        """The data the fit used."""
        return self._fitted("_data")

    # ------------------------------------------------------------------ output
    def provenance(self) -> dict[str, Any]:
        """The ``fitted_on`` section: data window, n per class, fitted values, guarantee."""
        d = self.data_
        counts = d.counts()
        cal = self.conformal_
        conf: dict[str, Any] | None = None
        if cal is not None:
            conf = {
                "guarantee": self.guarantee,
                "alpha": float(self.alpha),
                "delta": float(self.delta),
                "marginal": _choice_dict(cal.marginal_),
                "pac": _choice_dict(cal.pac_),
                "n_unsafe_cases": cal.n_cases_,
                "n_unsafe_situations": cal.n_situations_,
                "cluster_rule": self.cluster_rule,
                "cluster_note": cal.cluster_note_,
                "statement": cal.chosen_.statement,
            }
        out: dict[str, Any] = {
            "what": "spotstop recalibrate: refit from the decision log",
            "tool": {"name": "spotstop", "version": tool_version()},
            "settings": {
                "policy": self.policy,
                "alpha": float(self.alpha),
                "delta": float(self.delta),
                "guarantee": self.guarantee,
                "cluster_rule": self.cluster_rule,
                "refit_fusion": bool(self.refit_fusion),
                "window": self.window,
                "min_refs": self.min_refs,
                "min_batch": self.min_batch,
                "seed": self.rng if isinstance(self.rng, int) else None,
            },
            "log": d.log,
            "labels": d.labels or "log labels table",
            "window": {"since": d.since, "until": d.until, "decisions": d.time_range()},
            "n": {
                "decisions_in_window": d.n_decisions,
                "decisions_of_bundle": d.n,
                **counts,
                "dropped": dict(d.dropped),
            },
            "fusion": {
                "refit": bool(self.refit_fusion),
                "n_pool": self.frozen_.n,
                "note": (
                    "fused scores recomputed from the logged member scores with this fusion; "
                    "the fusion is fitted without labels on a pool that includes the "
                    "calibration cases, and the conformal guarantee treats it as fixed"
                ),
            },
            "frozen_t0": self.frozen_.policy.threshold,
            "conformal": conf,
            "situations": {
                "n": len(self._refs),
                "n_scores": int(sum(len(v) for v in self._refs.values())),
            },
        }
        rec = self.recommendation_
        if rec is not None:
            out["recommendation"] = {"policy": rec.policy, "reasons": list(rec.reasons)}
        return out

    def to_config(self, *, created: datetime | None = None) -> PolicyConfig:
        """The new ``policy.yaml`` contents (``created`` defaults to now, UTC)."""
        d = self.data_
        return PolicyConfig(
            bundle_id=d.bundle_id,
            prompt_hash=d.prompt_hash,
            fusion=self.fusion_,
            policy=self.policy_,
            fitted_on=self.provenance(),
            created=created or datetime.now(UTC),
        )

    def summary(self) -> str:
        """A readable report of what was fitted."""
        d = self.data_
        c = d.counts()
        lines = [
            f"bundle {d.bundle_id} (prompt {d.prompt_hash}); log {d.log}",
            f"window: since {d.since or '-'} until {d.until or '-'}; decisions "
            f"{', '.join(d.time_range() or ['none'])}",
            f"decisions: {d.n} of this bundle ({d.n_decisions} in window); usable {c['usable']} "
            f"(unsafe {c['unsafe']}, safe {c['safe']}, unlabelled {c['unlabelled']}); "
            f"dropped {d.dropped}",
            f"fusion ({'refit' if self.refit_fusion else 'kept'}, n={self.frozen_.n}): "
            + ", ".join(
                f"{m} median {s.median:+.4f} IQR {s.iqr:.4f}" for m, s in self.fusion_.stats.items()
            ),
            f"frozen cut t0 = {self.frozen_.policy.threshold:+.6g} (fused scores recomputed "
            "from the logged member scores)",
        ]
        cal = self.conformal_
        if cal is None:
            lines.append("conformal: no usable decision is labelled unsafe")
        else:
            lines.append(f"conformal: {cal.cluster_note_}")
            for ch in (cal.marginal_, cal.pac_):
                mark = " <- chosen" if ch.guarantee == self.guarantee else ""
                cut = f"k={ch.k}, cut {ch.threshold:+.6g}; " if ch.feasible else ""
                lines.append(f"  {cut}{ch.statement}{mark}")
        if self._refs:
            lines.append(
                f"situation state: {len(self._refs)} situations, "
                f"{sum(len(v) for v in self._refs.values())} scores"
            )
        lines.append(f"policy: {_describe(self.policy_)}")
        if self.recommendation_ is not None:
            lines.append(str(self.recommendation_))
        return "\n".join(lines)


def _choice_dict(c: CutChoice) -> dict[str, Any]:
    d = c.to_dict()
    d["statement"] = c.statement
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _describe(p: AnyPolicy) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.to_dict().items())


def _current_defaults(current: PolicyConfig | None) -> _Defaults:
    if current is None:
        return _Defaults()
    p: Any = current.policy
    if isinstance(p, SituationPolicy):
        return _Defaults(window=p.window, min_refs=p.min_refs)
    if isinstance(p, BatchPolicy):
        return _Defaults(min_batch=p.min_batch)
    return _Defaults()


def _check_recalibrator(r: Recalibrator, data: Any, current: PolicyConfig | None) -> None:
    """Validate settings once, apart from the algorithm."""
    if r.policy not in POLICY_KINDS:
        raise PolicyError(
            f"policy must be one of {', '.join(POLICY_KINDS)}; got {r.policy!r}. Pass --policy."
        )
    if not isinstance(data, LogData):
        raise CalibrationError(f"fit needs a LogData from read_log(); got {type(data).__name__}.")
    if not r.refit_fusion and current is None:
        raise CalibrationError(
            "refit_fusion=False keeps the current policy's fusion, but no current policy was "
            "given (the bundle has no policy.yaml). Refit the fusion instead."
        )
    if (
        current is not None
        and tuple(current.fusion.members) != tuple(data.members)
        and not r.refit_fusion
    ):
        raise CalibrationError(
            f"the current fusion has members {list(current.fusion.members)} but the bundle "
            f"has {list(data.members)}; refit the fusion."
        )
    for name in ("window", "min_refs", "min_batch"):
        v = getattr(r, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PolicyError(f"{name} must be a positive integer or None; got {v!r}.")
    if not isinstance(r.min_pool, int) or r.min_pool < 2:
        raise PolicyError(f"min_pool must be an integer ≥ 2; got {r.min_pool!r}.")
