"""``batch``: the paper's batch rule — Avg-2 refitted on the batch, cut at the batch mean.

Seed 000, the line after Supp. Algorithm 1: with ``s̄_m`` the batch mean of member m's score,
``S − S̄ = Σ_m (w_m / IQR_B(s_m)) (s_m − s̄_m) / Σ_m w_m``: a scene is UNSAFE when the weighted
sum of its centred, batch-scaled member scores is ≥ 0. Medians (they cancel), IQRs and
weights are refitted on every batch; the policy file's frozen reference statistics are not
used (``batch_frozen_iqr`` is the variant that keeps them). The score reported per scene is
``S_B = Σ_m w_m (s_m − median_B(s_m)) / IQR_B(s_m) / Σ_m w_m`` and the threshold the batch mean
of ``S_B``, so the one rule ``S_B ≥ mean`` gives exactly the paper's label.

Weights: ``equal`` (default; the paper finds reliance weights tie equal weights within
0.004 AUROC, Table S22) or ``reliance``: ``w_m = max(1 − ρ_m², 0.05)`` with ρ_m the Pearson
correlation, over the batch, between member m's scene score and its request-only score (the
text pass, which Avg-2 with weights runs: Table S31's caption). A member whose score the
request alone explains gets little weight. Our copy of the paper lost the typeset formula of
Eq. (S2); this is the label-free, batch-refitted reliance weight its text describes (see the
README's "Known limits"). ρ is taken as 0 (w = 1) when either score is constant on the batch
(e.g. one shared request), where reliance on the request cannot be measured.

Scenes whose member scores are not all finite are UNSAFE and left out of the batch
statistics. Batches with fewer than ``min_batch`` scored scenes, or where some member's
batch IQR is 0, use the ``fallback``. Caveat: the rule labels about half of any batch UNSAFE,
so it fails when the share of unsafe scenes moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from spotstop.guard._fusion import FLAT_IQR, member_spread
from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
    check_fallback,
)
from spotstop.guard.policies._frozen import FrozenPolicy
from spotstop.guard.policies._rule import mean_cut
from spotstop.guard.validate import is_int

__all__ = [
    "FLAT_IQR",
    "RELIANCE_WEIGHT_FLOOR",
    "WEIGHTS",
    "BatchPolicy",
    "batch_scores",
    "reliance_weights",
]

WEIGHTS = ("equal", "reliance")
RELIANCE_WEIGHT_FLOOR = 0.05
"""The smallest reliance weight: no member drops out of the average entirely."""


def reliance_weights(
    scene: Mapping[str, np.ndarray], text: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """``w_m = max(1 − ρ_m², floor)``, ρ_m = corr(scene score, request-only score) over the batch.

    Only scenes where both scores are finite count; with fewer than 2 such scenes or a
    constant score, ρ_m = 0.
    """
    out: dict[str, float] = {}
    for m, s in scene.items():
        t = text.get(m)
        rho = 0.0
        if t is not None:
            ok = np.isfinite(s) & np.isfinite(t)
            if ok.sum() >= 2 and np.std(s[ok]) > 0 and np.std(t[ok]) > 0:
                rho = float(np.corrcoef(s[ok], t[ok])[0, 1])
        out[m] = max(1.0 - rho * rho, RELIANCE_WEIGHT_FLOOR)
    return out


def batch_scores(
    scene: Mapping[str, np.ndarray], weights: Mapping[str, float], ok: np.ndarray
) -> tuple[np.ndarray, dict[str, tuple[float, float]]]:
    """``S_B`` per scene (NaN outside ``ok``) and each member's (batch median, batch IQR).

    Medians and IQRs are :func:`spotstop.guard._fusion.member_spread` over the ``ok`` scenes,
    the frozen fit's rule. A flat member — IQR 0, or at rounding level (``≤ FLAT_IQR`` times
    its largest score's magnitude), where dividing by it would only amplify rounding — makes
    ``S_B`` all NaN (its IQR is reported as 0).
    """
    n = int(ok.shape[0])
    num = np.zeros(n)
    stats: dict[str, tuple[float, float]] = {}
    for m, s in scene.items():
        sp = member_spread(s[ok])
        iqr = 0.0 if sp.flat else sp.iqr
        stats[m] = (sp.median, iqr)
        if iqr == 0.0:
            return np.full(n, np.nan), stats
        with np.errstate(invalid="ignore"):
            num += weights[m] * (s - sp.median) / iqr
    with np.errstate(invalid="ignore", over="ignore"):
        out = num / sum(weights[m] for m in scene)
    out[~ok | ~np.isfinite(out)] = np.nan  # an overflow is no score: UNSAFE
    return out, stats


@dataclass(frozen=True)
class BatchPolicy(Policy):
    """The paper's batch rule (see the module docstring).

    fallback: a single-scene policy for batches too small to refit on. min_batch: fewest
    scored scenes to refit (≥ 2). weights: ``"equal"`` or ``"reliance"``.
    """

    kind: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "the paper's batch rule: medians, IQRs and weights refitted on each batch, cut at its mean"
    )
    single_scene: ClassVar[bool] = False
    fallback: Policy
    min_batch: int = 2
    weights: str = "equal"

    def __post_init__(self) -> None:
        check_fallback(self.fallback, "BatchPolicy")
        if not is_int(self.min_batch) or self.min_batch < 2:
            raise PolicyError(
                f"BatchPolicy.min_batch must be an integer ≥ 2; got {self.min_batch!r} "
                "(a batch of one is its own mean and carries no label)."
            )
        if self.weights not in WEIGHTS:
            raise PolicyError(
                f"BatchPolicy.weights must be one of {', '.join(WEIGHTS)}; got {self.weights!r}."
            )

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("fallback",), ("min_batch", "weights")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> BatchPolicy:
        return cls(
            fallback=ctx.parse_fallback(d["fallback"], ctx.key("fallback")),
            min_batch=ctx.integer(d, "min_batch", low=2, default=2),
            weights=ctx.choice(d, "weights", WEIGHTS, "equal"),
        )

    def inner(self) -> tuple[Policy, ...]:
        return (self.fallback,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "min_batch": self.min_batch,
            "weights": self.weights,
            "fallback": self.fallback.to_dict(),
        }

    def members_needed(self) -> tuple[str, ...]:
        return self.fallback.members_needed()

    def variants_needed(self) -> tuple[str, ...]:
        return ("text",) if self.weights == "reliance" else ()

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: ``S_B`` refitted on the batch; threshold: its batch mean (or the fallback's)."""
        members = x.fusion.members
        scene = {m: np.asarray(x.members[m], dtype=float) for m in members}
        ok = np.isfinite(x.fused)
        for s in scene.values():
            ok &= np.isfinite(s)
        n_ok = int(ok.sum())
        if n_ok < self.min_batch:
            return self.fallback.thresholds(x, None).prefixed(
                "batch",
                f"batch has {n_ok} scored scene(s) < min_batch {self.min_batch}; "
                f"fallback {self.fallback.kind}",
            )
        if self.weights == "reliance":
            text = {m: np.asarray(v, dtype=float) for m, v in (x.members_text or {}).items()}
            w = reliance_weights(
                {m: s[ok] for m, s in scene.items()}, {m: t[ok] for m, t in text.items()}
            )
        else:
            w = dict.fromkeys(members, 1.0)
        score, stats = batch_scores(scene, w, ok)
        flat = [m for m, (_, iqr) in stats.items() if not iqr > 0]
        if flat:
            return self.fallback.thresholds(x, None).prefixed(
                "batch",
                f"member {flat[0]!r} scores the {n_ok} scenes of this batch alike (IQR 0); "
                f"fallback {self.fallback.kind}",
            )
        mean = mean_cut(score[ok])
        wtxt = (
            ""
            if self.weights == "equal"
            else ", reliance weights " + ", ".join(f"{m} {v:.3g}" for m, v in w.items())
        )
        return Thresholds.constant(
            score,
            mean,
            "batch",
            f"Avg-2 refitted on the {n_ok} scored scenes of the batch{wtxt}; cut at their mean",
        )

    @classmethod
    def fit(cls, ctx: FitContext) -> BatchPolicy:
        """Frozen fallback t0; settings ``min_batch`` (2) and ``weights`` (``"equal"``)."""
        return cls(
            fallback=FrozenPolicy(threshold=ctx.frozen_t0),
            min_batch=int(ctx.setting("min_batch", 2)),
            weights=str(ctx.setting("weights", "equal")),
        )
