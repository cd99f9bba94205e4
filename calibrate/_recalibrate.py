"""Offline recalibration from the decision log: fusion, the chosen policy kind, its state seed.

:class:`Recalibrator` holds the settings; ``fit(data)`` learns from a
:class:`~spotstop.calibrate.CalibrationLog` (one bundle's decisions in a window):

1. fusion statistics (per-member median and IQR) and the frozen cut t₀ = mean fused score,
   on the *usable* decisions, labels unused (:func:`spotstop.calibrate.fit_frozen`). With
   ``refit_fusion=False`` the current policy's fusion is kept and only t₀ is refitted.
2. fused scores RECOMPUTED from the logged member scores with the new fusion: the logged
   ``fused_score`` was made with the fusion active at decision time, so it is on the old
   scale and is never used for fitting.
3. the policy of the requested kind, fitted by the kind itself from that context
   (:meth:`spotstop.guard.policies.Policy.fit`; the kinds are the registry's, so a new kind
   needs nothing here), and for a stateful kind its starting state from the log (the
   situation windows the guard would hold had it run the new fusion: over every decision
   that entered the policy, :func:`~spotstop.guard.policies.entered_scores`'s test, which
   includes one that failed closed after its decision, e.g. past the deadline), stored in the
   policy file as ``state_seed``.
4. the conformal cut on the recomputed fused scores of usable decisions labelled unsafe,
   one case per situation, both guarantees reported whatever the kind (the ``conformal``
   kind refuses when it is not feasible). Note: the fusion is fitted without labels on a
   pool that includes the calibration cases; the guarantee treats the fusion as fixed. With a
   pool much larger than the calibration set this dependence is negligible;
   ``refit_fusion=False`` removes it.

Which policy fits the deployment is the card's question (``spotstop card``: its verdict and
its prevalence, situation and threshold checks), not this module's.

``to_config()`` returns the new :class:`spotstop.guard.policies.PolicyConfig` with
provenance; :func:`spotstop.calibrate.write_policy_version` writes it next to the old ones.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Self

import numpy as np
from spotstop.calibrate._conformal import ConformalCalibrator
from spotstop.calibrate._frozen import FrozenFit, fit_frozen
from spotstop.calibrate._logdata import CalibrationError, CalibrationLog, iso_time
from spotstop.guard import Avg2Fusion
from spotstop.guard.policies import (
    POLICY_KINDS,
    CascadePolicy,
    CutChoice,
    FitContext,
    FrozenPolicy,
    NotFittedError,
    Policy,
    PolicyConfig,
    PolicyError,
    SituationPolicy,
    TextInScene,
    check_prior_weight,
    policy_class,
    situation_prior_weight,
)
from spotstop.guard.validate import is_real

__all__ = ["Recalibrator", "tool_version"]


def tool_version() -> str:
    """The installed spotstop version (``"unknown"`` when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("spotstop")
    except metadata.PackageNotFoundError:
        return "unknown"


class Recalibrator:
    """Refit a policy from a decision log (see the module docstring for the steps).

    policy: the kind to write, any registered kind (:data:`~spotstop.guard.policies.POLICY_KINDS`).
    alpha, delta, guarantee, cluster_rule: the conformal settings
        (:class:`~spotstop.calibrate.ConformalCalibrator`); both guarantees are always reported.
    refit_fusion: refit the fusion statistics (default) or keep the current policy's.
    settings: the kind's other settings by name (``window``, ``min_refs``, ``min_batch``,
        ``weights``, ``member``); absent ones take the current policy's value, else the
        kind's default.
    min_pool: fewest usable decisions for the frozen statistics.
    rng: seed or Generator; the fitted policy depends on it only through
        ``cluster_rule="random"``.

    Learned: ``frozen_`` (:class:`FrozenFit`), ``fusion_``, ``fused_`` (recomputed fused
    scores, NaN where unusable), ``conformal_`` (fitted calibrator, or None without unsafe
    labels), ``policy_``, ``state_seed_`` (None for stateless kinds), ``data_``.
    """

    def __init__(
        self,
        policy: str = "conformal",
        *,
        alpha: float = 0.1,
        delta: float = 0.1,
        guarantee: Literal["marginal", "pac"] = "pac",
        cluster_rule: Literal["min", "random"] = "min",
        refit_fusion: bool = True,
        settings: dict[str, Any] | None = None,
        min_pool: int = 8,
        rng: np.random.Generator | int | None = 0,
    ) -> None:
        self.policy = policy
        self.alpha = alpha
        self.delta = delta
        self.guarantee = guarantee
        self.cluster_rule = cluster_rule
        self.refit_fusion = refit_fusion
        self.settings = settings
        self.min_pool = min_pool
        self.rng = rng

    # ------------------------------------------------------------------ learning
    def fit(self, data: CalibrationLog, current: PolicyConfig | None = None) -> Self:
        """Learn everything from ``data``; ``current`` is the active policy (may be None)."""
        _check_recalibrator(self, data, current)
        self.text_in_scene_ = TextInScene() if current is None else current.text_in_scene
        gen = (
            self.rng
            if isinstance(self.rng, np.random.Generator)
            else np.random.default_rng(self.rng)
        )
        not_run = data.dropped.get("member_not_run", 0)
        if not_run:
            raise CalibrationError(
                f"{not_run} of the {data.n} decisions of bundle {data.bundle_id} in the window "
                "did not run every member (a cascade policy runs its second member only near "
                "the cut). The decisions where every member ran were chosen by the first "
                "member's score, so statistics, cuts and bands fitted on them alone would be "
                "biased (scenes near the cut only). Fit on a window where the pair ran on "
                "every scene (--since/--until around a policy that is not a cascade), or on an "
                "unlabelled pool of camera frames with `spotstop policy init`."
            )
        use = data.usable
        pool = {m: data.member_scores[m][use] for m in data.members}
        n_pool = int(use.sum())
        if n_pool < self.min_pool:
            raise CalibrationError(
                f"the log has {n_pool} usable decisions of bundle {data.bundle_id} in the window "
                f"(not fail-closed, all member scores finite); at least {self.min_pool} are "
                f"needed for the frozen statistics. Dropped: {data.dropped}. Widen "
                "--since/--until or collect more decisions." + _other_bundles_note(data)
            )
        if self.refit_fusion:
            frozen = fit_frozen(pool, min_n=self.min_pool)
        else:
            assert current is not None  # checked in _check_recalibrator
            fusion, t0 = FrozenPolicy.fit_pool(pool, min_n=self.min_pool, fusion=current.fusion)
            frozen = FrozenFit(fusion=fusion, policy=t0, n=n_pool)
        settings = {
            **dict(self.settings or {}),
            "alpha": float(self.alpha),
            "delta": float(self.delta),
            "guarantee": self.guarantee,
            "cluster_rule": self.cluster_rule,
        }

        def context_on(
            rows: np.ndarray, rng: np.random.Generator, sids: np.ndarray = data.situation_id
        ) -> FitContext:
            """The fit context of the decisions ``rows`` (a mask), fused with this fit."""
            return frozen.context(
                {m: data.member_scores[m][rows] for m in data.members},
                label=data.label[rows],
                situation_id=sids[rows],
                member_text=None
                if data.member_text is None
                else {m: v[rows] for m, v in data.member_text.items()},
                settings=settings,
                current=None if current is None else current.policy,
                rng=rng,
                guard_situation_id=data.logged_situation_id[rows],
            )

        ctx = context_on(use, gen)
        fused = np.full(data.n, np.nan)
        fused[use] = ctx.fused  # recomputed: the logged fused is on the old scale
        self._frozen, self._fusion, self._fused, self._data = frozen, frozen.fusion, fused, data

        unsafe = ctx.label == 1
        self._conformal: ConformalCalibrator | None = None
        if unsafe.any():
            self._conformal = ConformalCalibrator(
                self.alpha,
                self.delta,
                guarantee=self.guarantee,
                cluster_rule=self.cluster_rule,
                # a copy in the state the policy's own fit (below) starts from: a random
                # one-per-situation draw is then the same for the report and the policy file
                rng=copy.deepcopy(gen),
            ).fit(ctx.fused[unsafe], ctx.situation_id[unsafe], refuse=False)
        policy = policy_class(self.policy).fit(ctx)
        self._policy: Policy = policy
        self._prior: dict[str, Any] | None = situation_prior_record(policy, ctx)
        self._seed: Any = None
        self._seed_decisions: list[str] | None = None
        if policy.stateful:  # the windows hold what entered the policy, as the guard's do
            entered = np.isfinite(data.policy_score) & np.all(
                [np.isfinite(data.member_scores[m]) for m in data.members], axis=0
            )
            # keyed by the ids the guard keys its windows by (a labels file may regroup them)
            logged = data.logged_situation_id
            same = np.array_equal(entered, use) and all(
                (a or None) == (b or None)
                for a, b in zip(logged.tolist(), data.situation_id.tolist(), strict=True)
            )
            seed_ctx = ctx if same else context_on(entered, copy.deepcopy(gen), logged)
            self._seed = policy.seed_from_fit(seed_ctx)
            # which decisions the seed holds: a replay of these decisions must not start from
            # it (each would see its own and later scores; calibrate._diff.replay_start)
            t = data.time[entered]
            if t.size:
                self._seed_decisions = [iso_time(float(t.min())), iso_time(float(t.max()))]
        return self

    # ------------------------------------------------------------------ learned state
    def _fitted(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise NotFittedError(
                "This Recalibrator is not fitted yet; call fit(read_calibration_log(...)) first."
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
    def policy_(self) -> Policy:
        """The new threshold policy."""
        return self._fitted("_policy")

    @property
    def state_seed_(self) -> Any:
        """The fitted starting state of a stateful policy (None for stateless kinds)."""
        return self._fitted("_seed")

    @property
    def data_(self) -> CalibrationLog:
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
        seed = self.state_seed_
        return {
            "what": "spotstop recalibrate: refit from the decision log",
            "tool": {"name": "spotstop", "version": tool_version()},
            "settings": {
                "policy": self.policy,
                "alpha": float(self.alpha),
                "delta": float(self.delta),
                "guarantee": self.guarantee,
                "cluster_rule": self.cluster_rule,
                "refit_fusion": bool(self.refit_fusion),
                **{k: v for k, v in (self.settings or {}).items() if v is not None},
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
            "situation_prior": self._fitted("_prior"),
            "conformal": conf,
            "state_seed": None
            if seed is None
            else {
                "n_scores": _seed_size(self.policy_.seed_to_dict(seed)),
                # first and last decision time of the scores it holds (ISO-8601 UTC)
                "decisions": self._fitted("_seed_decisions"),
            },
        }

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
            state_seed=self.state_seed_,
            # an operator's setting, not fitted: the policy in force keeps reading the scene
            text_in_scene=self.text_in_scene_,
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
        if d.other_bundles:
            lines.append("note:" + _other_bundles_note(d))
        if d.pending:
            lines.append(
                "warning: the log does not say every answer the robot got: " + d.pending.message()
            )
        cal = self.conformal_
        if cal is None:
            lines.append("conformal: no usable decision is labelled unsafe")
        else:
            lines.append(f"conformal: {cal.cluster_note_}")
            for ch in (cal.marginal_, cal.pac_):
                mark = " <- chosen" if ch.guarantee == self.guarantee else ""
                cut = f"k={ch.k}, cut {ch.threshold:+.6g}; " if ch.feasible else ""
                lines.append(f"  {cut}{ch.statement}{mark}")
        seed = self.state_seed_
        if seed is not None:
            n = _seed_size(self.policy_.seed_to_dict(seed))
            lines.append(f"state seed: {n} scores from the log")
        prior = self._fitted("_prior")
        if prior is not None:
            lines.append(
                f"situation prior: {prior['weight']:.3g} pseudo-references at the frozen cut "
                f"({prior['how']})"
            )
        lines.append(f"policy: {self.policy_.describe()}")
        lines.append(
            "which policy fits this deployment: see `spotstop card LOG` (its verdict and its "
            "prevalence, situation and threshold checks)."
        )
        return "\n".join(lines)


def _other_bundles_note(data: CalibrationLog) -> str:
    """What the window holds of other bundles, left out ('' for none)."""
    if not data.other_bundles:
        return ""
    return (
        " The window also holds decisions of other bundles, left out (their scores are on "
        f"another scale): {'; '.join(str(b) for b in data.other_bundles)}; recalibrate those "
        "with their own bundle folder."
    )


def _seed_size(d: Any) -> int:
    """How many scores a seed holds (lists anywhere inside its plain form)."""
    if isinstance(d, dict):
        return sum(_seed_size(v) for v in d.values())
    if isinstance(d, list):
        return len(d)
    return 0


def _choice_dict(c: CutChoice) -> dict[str, Any]:
    d = c.to_dict()
    d["statement"] = c.statement
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def situation_prior_record(policy: Policy, ctx: FitContext) -> dict[str, Any] | None:
    """``fitted_on.situation_prior`` of a fitted policy: the situation prior's weight, its cut
    and how the weight came about (``given``, or :func:`situation_prior_weight`'s account);
    None when neither the policy nor a cascade's cut is a ``situation`` one."""
    sit = policy.cut if isinstance(policy, CascadePolicy) else policy
    if not isinstance(sit, SituationPolicy):
        return None
    how = (
        "given"
        if ctx.settings.get("prior_weight") is not None
        else situation_prior_weight(ctx.fused, ctx.window_ids, cap=sit.window)[1]
    )
    return {"weight": sit.prior_weight, "threshold": sit.prior_threshold, "how": how}


def check_kind_settings(settings: Mapping[str, Any] | None) -> None:
    """The kinds' numeric settings checked before any work (None: not given): ``window``,
    ``min_refs``, ``min_batch`` positive integers, ``prior_weight`` a finite number ≥ 0,
    a cascade's ``share`` in (0, 1]."""
    for name, v in (settings or {}).items():
        if (
            name in ("window", "min_refs", "min_batch")
            and v is not None
            and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
        ):
            raise PolicyError(f"{name} must be a positive integer or None; got {v!r}.")
    check_prior_weight((settings or {}).get("prior_weight"))
    share = (settings or {}).get("share")
    if share is not None and not (is_real(share) and 0 < share <= 1):
        raise PolicyError(f"share must be in (0, 1] or None; got {share!r}.")


def _check_recalibrator(r: Recalibrator, data: Any, current: PolicyConfig | None) -> None:
    """Validate settings once, apart from the algorithm."""
    if r.policy not in POLICY_KINDS:
        raise PolicyError(
            f"policy must be one of {', '.join(POLICY_KINDS)}; got {r.policy!r}. Pass --policy."
        )
    # the conformal settings, whatever the kind: both guarantees are fitted and reported
    for name, v in (("alpha", r.alpha), ("delta", r.delta)):
        if not is_real(v) or not 0 < v < 1:
            raise PolicyError(f"{name} must be in (0, 1); got {v!r}. Pass --{name}.")
    if r.guarantee not in ("marginal", "pac"):
        raise PolicyError(f"guarantee must be 'marginal' or 'pac'; got {r.guarantee!r}.")
    if r.cluster_rule not in ("min", "random"):
        raise PolicyError(f"cluster_rule must be 'min' or 'random'; got {r.cluster_rule!r}.")
    if not isinstance(data, CalibrationLog):
        raise CalibrationError(
            f"fit needs a CalibrationLog from read_calibration_log(); got {type(data).__name__}."
        )
    if not r.refit_fusion and current is None:
        raise CalibrationError(
            "refit_fusion=False keeps the current policy's fusion, but no current policy was "
            "given (the bundle has no policy.yaml). Refit the fusion instead."
        )
    if (
        current is not None
        and not r.refit_fusion
        and (current.bundle_id, current.prompt_hash) != (data.bundle_id, data.prompt_hash)
    ):
        raise CalibrationError(
            "refit_fusion=False keeps the current policy's fusion, but that policy was fitted "
            f"for bundle {current.bundle_id} / prompt {current.prompt_hash}, not for "
            f"{data.bundle_id} / {data.prompt_hash} (the decisions'): its reference statistics "
            "are another bundle's scale. Refit the fusion (drop --keep-fusion)."
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
    check_kind_settings(r.settings)
    if not isinstance(r.min_pool, int) or r.min_pool < 2:
        raise PolicyError(f"min_pool must be an integer ≥ 2; got {r.min_pool!r}.")
