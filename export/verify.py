"""``spotstop verify-bundle``: the exported bundle against the torch reference, scene by scene.

Scores the same generated scenes (and the request-only pass) with each member's torch
reference (its Hugging Face folder, from the manifest's ``source`` or an override) and with
the bundle's graphs, and reports per member the largest |Δs|, the Spearman rank correlation
and the agreement of direct decisions (``s > 0``), plus the pair's agreement under Avg-2 with
the reference's own median/IQR. It fails when any member is beyond its architecture's
tolerance at the bundle's precision (``export/configs.py``: fp32 |Δs| ≤ 1e-3).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from spotstop.export.configs import get_export_config
from spotstop.guard._bundle import load_bundle
from spotstop.guard._config import ScoringConfig

__all__ = ["BundleVerification", "MemberVerification", "spearman", "verify_bundle"]


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # average ranks over ties
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return np.asarray(sums[inv] / counts[inv], dtype=np.float64)


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    x, y = _rank(np.asarray(a, float)), _rank(np.asarray(b, float))
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


@dataclass(frozen=True)
class MemberVerification:
    """One member: bundle scores vs torch reference scores on the same scenes."""

    name: str
    precision: str
    n: int
    max_abs_diff: float
    spearman: float
    decision_agreement: float
    tolerance: float
    min_spearman: float

    @property
    def ok(self) -> bool:
        rho_ok = math.isnan(self.spearman) or self.spearman >= self.min_spearman
        return self.max_abs_diff <= self.tolerance and rho_ok

    def __str__(self) -> str:
        flag = "ok" if self.ok else "FAIL"
        return (
            f"{self.name:<20} {self.precision:<5} n={self.n:<3} max|Δs|={self.max_abs_diff:.3g} "
            f"(≤ {self.tolerance:g})  spearman={self.spearman:.4f} (≥ {self.min_spearman:g})  "
            f"decisions agree {self.decision_agreement:.1%}  {flag}"
        )


@dataclass(frozen=True)
class BundleVerification:
    """The whole bundle: its members' results and the pair's Avg-2 decision agreement."""

    bundle_id: str
    members: tuple[MemberVerification, ...]
    pair_decision_agreement: float

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.members)

    def __str__(self) -> str:
        lines = [f"bundle {self.bundle_id}"] + [f"  {m}" for m in self.members]
        lines.append(
            f"  pair (Avg-2, reference median/IQR): decisions agree {self.pair_decision_agreement:.1%}"
        )
        lines.append("PASS" if self.ok else "FAIL: beyond the per-precision tolerance")
        return "\n".join(lines)


def verify_bundle(
    bundle: str | os.PathLike[str],
    *,
    n_scenes: int = 12,
    seed: int = 0,
    sources: Mapping[str, str] | None = None,
    variants: Sequence[str] = ("scene", "text"),
) -> BundleVerification:
    """Score ``n_scenes`` generated scenes with the reference and with the bundle; compare."""
    from spotstop.guard._demo import demo_scenes
    from spotstop.guard._member import load_member

    b = load_bundle(bundle)
    cfg = ScoringConfig(prompt=b.prompt)
    scenes = demo_scenes(n_scenes, seed=seed)
    results = []
    z_ref: list[np.ndarray] = []
    z_got: list[np.ndarray] = []
    for bm in b.members:
        src = (sources or {}).get(bm.name) or b.manifest["members"][
            [m.name for m in b.members].index(bm.name)
        ].get("source")
        if not src:
            raise ValueError(
                f"member {bm.name} has no reference source in the manifest; pass "
                f"--source {bm.name}=HF_FOLDER."
            )
        got_m = load_member(
            bm.path,
            name=bm.name,
            config=cfg,
            image_size=bm.image_size,
            backend=bm.backend,
            template=bm.template,
        )
        ref_m = load_member(
            src, name=bm.name, config=cfg, image_size=bm.image_size, template=bm.template
        )
        if ref_m.prompt_hash != got_m.prompt_hash:
            raise ValueError(
                f"member {bm.name}: the reference at {src} builds prompt hash "
                f"{ref_m.prompt_hash}, the bundle {got_m.prompt_hash}; wrong reference folder."
            )
        got = np.concatenate([[r.score for r in got_m.score(scenes, v)] for v in variants])  # type: ignore[arg-type]
        ref = np.concatenate([[r.score for r in ref_m.score(scenes, v)] for v in variants])  # type: ignore[arg-type]
        precision = str(
            b.manifest["members"][[m.name for m in b.members].index(bm.name)].get(
                "precision", "fp32"
            )
        )
        ecfg = get_export_config(bm.model_type)
        results.append(
            MemberVerification(
                name=bm.name,
                precision=precision,
                n=len(ref),
                max_abs_diff=float(np.max(np.abs(got - ref))),
                spearman=spearman(got, ref),
                decision_agreement=float(np.mean((got > 0) == (ref > 0))),
                tolerance=float(ecfg.score_atol[precision]),
                min_spearman=float(ecfg.min_spearman[precision]),
            )
        )
        med = float(np.median(ref))
        iqr = float(np.subtract(*np.percentile(ref, [75, 25]))) or 1.0
        z_ref.append((ref - med) / iqr)
        z_got.append((got - med) / iqr)
    s_ref, s_got = np.mean(z_ref, axis=0), np.mean(z_got, axis=0)
    pair = float(np.mean((s_ref >= 0) == (s_got >= 0)))
    return BundleVerification(b.bundle_id, tuple(results), pair)
