"""``spotstop verify-bundle``: an exported bundle, run as the robot runs it and against torch.

Two halves. The **runtime half** needs the base install only: the manifest's sha256 list is
checked, every member is loaded with the bundle's own backend (onnxruntime for an exported
bundle) and scores generated scenes (scene and request-only passes); every score must be
finite. The **reference half** needs the ``export`` extra (torch, transformers): the same
scenes are scored with each member's torch reference (its Hugging Face folder, from the
manifest's ``source`` or an override), and per member the largest |Δs|, the Spearman rank
correlation (within each pass, the worst pass judged: pooled, a gap between the passes' means
would rank the two groups apart and hide scenes scrambled within one) and the agreement of
direct decisions (``s > 0``) are reported, plus the pair's
agreement under Avg-2 with the reference's own median/IQR (within each pass, the worst pass
reported). It fails when any member is beyond
its architecture's tolerance at the bundle's precision (``export/configs.py``: fp32
|Δs| ≤ 1e-3). Without the extra the reference half is skipped, and the result says so.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from spotstop.export.configs import get_export_config
from spotstop.export.scenes import demo_scenes
from spotstop.guard import (
    Bundle,
    BundleError,
    BundleMember,
    Scene,
    ScoringConfig,
    ScoringError,
    load_bundle,
    load_bundle_member,
    load_member,
)

__all__ = [
    "REFERENCE_HINT",
    "BundleVerification",
    "MemberRuntime",
    "MemberVerification",
    "diff_summary",
    "pair_agreement",
    "pass_spearman",
    "reference_available",
    "score_inputs",
    "spearman",
    "verify_bundle",
]

#: The line printed when the reference half is skipped because torch/transformers are missing.
REFERENCE_HINT = (
    "the torch-reference comparison needs torch and transformers: "
    "pip install 'spotstop[export]' (only the runtime half ran)"
)


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # average ranks over ties
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return np.asarray(sums[inv] / counts[inv], dtype=np.float64)


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant
    or holds a non-finite score (ranked, a NaN would sort last and could pass the check)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    x, y = _rank(a), _rank(b)
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
    #: the 95th percentile of |Δs| (linear interpolation): one scene's tail, or every score's
    p95_abs_diff: float = math.nan
    #: where max |Δs| was: the scene's index in the checked scenes, the pass, the request
    worst: str = ""
    #: whether the reference scores of some pass differ at all (≥ 2 scores, not all equal): a
    #: rank check is then owed, and a bundle whose scores do not vary (Spearman undefined)
    #: fails it
    reference_varies: bool = True
    #: Spearman within each pass (``scene``, ``text``, ...); ``spearman`` is the worst of the
    #: passes whose reference varies
    spearman_by_pass: Mapping[str, float] = field(default_factory=dict)
    #: max |Δs| within each pass: which pass carries the error (the one with the image: the
    #: vision graph and the decoder's image rows; request-only: the decoder alone)
    max_abs_diff_by_pass: Mapping[str, float] = field(default_factory=dict)

    @property
    def rank_ok(self) -> bool:
        """The rank check: Spearman ≥ its minimum; undefined only passes when the reference
        itself has nothing to rank (the tolerance on |Δs| then judges alone)."""
        if math.isnan(self.spearman):
            return not self.reference_varies
        return self.spearman >= self.min_spearman

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.rank_ok

    def __str__(self) -> str:
        flag = "ok" if self.ok else "FAIL"
        rho = f"{self.spearman:.4f}"
        if math.isnan(self.spearman):
            per_pass = self.n // max(1, len(self.spearman_by_pass))
            rho = (
                "n/a (one scene per pass: nothing to rank)"
                if not self.reference_varies and per_pass < 2
                else "n/a (the reference does not vary)"
                if not self.reference_varies
                else ("undefined: the bundle's scores do not vary")
            )
        if len(self.spearman_by_pass) > 1:
            rho += " (" + ", ".join(f"{k} {v:.4f}" for k, v in self.spearman_by_pass.items()) + ")"
        return (
            f"{self.name:<20} {self.precision:<5} n={self.n:<3} max|Δs|={self.max_abs_diff:.3g} "
            f"(≤ {self.tolerance:g})  spearman={rho} (≥ {self.min_spearman:g})  "
            f"decisions agree {self.decision_agreement:.1%}  {flag}"
            + (
                f"\n{'':<33}p95 |Δs|={self.p95_abs_diff:.3g}; max at {self.worst}"
                if self.worst
                else ""
            )
            + (
                "; max|Δs| by pass: "
                + ", ".join(f"{k} {v:.3g}" for k, v in self.max_abs_diff_by_pass.items())
                if self.worst and len(self.max_abs_diff_by_pass) > 1
                else ""
            )
        )


@dataclass(frozen=True)
class MemberRuntime:
    """One member run by the bundle's own backend on the generated scenes (the runtime half)."""

    name: str
    backend: str
    precision: str
    n: int
    low: float
    high: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.n > 0

    def __str__(self) -> str:
        if self.error is not None:
            return f"{self.name:<20} {self.backend:<8} {self.precision:<5} FAIL: {self.error}"
        return (
            f"{self.name:<20} {self.backend:<8} {self.precision:<5} n={self.n:<3} "
            f"all finite, s in [{self.low:+.4g}, {self.high:+.4g}]  ok"
        )


@dataclass(frozen=True)
class BundleVerification:
    """The whole bundle: the runtime half, and the reference half when it ran.

    ``members`` and ``pair_decision_agreement`` (NaN) are empty when the reference half was
    skipped; ``skipped`` then says why.
    """

    bundle_id: str
    runtime: tuple[MemberRuntime, ...]
    members: tuple[MemberVerification, ...]
    #: the worst pass's (:func:`pair_agreement`)
    pair_decision_agreement: float
    skipped: str | None = None
    #: the pair's decision agreement within each pass (``scene``, ``text``, ...)
    pair_agreement_by_pass: Mapping[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runtime) and all(m.ok for m in self.members)

    def __str__(self) -> str:
        lines = [f"bundle {self.bundle_id}: manifest sha256 ok"]
        lines.append("  runtime (each member on the bundle's own backend):")
        lines += [f"    {r}" for r in self.runtime]
        if self.skipped is not None:
            lines.append(self.skipped)
        else:
            lines.append("  against the torch reference:")
            lines += [f"    {line}" for m in self.members for line in str(m).splitlines()]
            by_pass = ""
            if len(self.pair_agreement_by_pass) > 1:
                by_pass = (
                    " ("
                    + ", ".join(f"{k} {v:.1%}" for k, v in self.pair_agreement_by_pass.items())
                    + ")"
                )
            lines.append(
                "    pair (Avg-2, reference median/IQR within each pass): decisions agree "
                f"{self.pair_decision_agreement:.1%}{by_pass}"
            )
        if not self.ok:
            lines.append("FAIL: see the lines marked FAIL")
        elif self.skipped is not None:  # a script reading the last line can tell it apart
            lines.append("PASS (runtime only: the scores were not compared with the reference)")
        else:
            lines.append("PASS")
        return "\n".join(lines)


def reference_available() -> bool:
    """Whether the reference half can run here (torch and transformers are installed)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _entry(b: Bundle, bm: BundleMember) -> Mapping[str, object]:
    """The member's entry in the manifest."""
    entry: Mapping[str, object] = b.manifest["members"][b.members.index(bm)]
    return entry


def _run_member(
    b: Bundle, bm: BundleMember, scenes: list[Scene], variants: Sequence[str]
) -> tuple[MemberRuntime, np.ndarray]:
    """Score the scenes with the member as the guard loads it; a non-finite score is a FAIL
    (its scores come back empty).

    The precision (hence the tolerance) is the one of the graphs that run: their own record
    (``spotstop_onnx.yaml``, sha256-checked; torch runs float32). The manifest's entry is
    covered by no sha256 and not named by the bundle id: one that disagrees is refused."""
    m = load_bundle_member(b, bm)
    precision = str(getattr(m.backend, "precision", "fp32"))
    listed = _entry(b, bm).get("precision")
    if listed is not None and str(listed) != precision:
        raise BundleError(
            f"manifest.yaml says member {bm.name} is {listed}, but its graphs are {precision} "
            "(their sha256-checked record, the member's spotstop_onnx.yaml): the manifest was "
            "edited by hand, and the check would apply another precision's tolerance. Copy the "
            "bundle again, or export it again."
        )
    try:
        got = np.concatenate([[r.score for r in m.score(scenes, v)] for v in variants])  # type: ignore[arg-type]
    except ScoringError as e:
        failed = MemberRuntime(bm.name, bm.backend, precision, 0, math.nan, math.nan, str(e))
        return failed, np.empty(0)
    run = MemberRuntime(
        bm.name, bm.backend, precision, len(got), float(got.min()), float(got.max())
    )
    return run, got


def diff_summary(
    got: np.ndarray, ref: np.ndarray, scenes: Sequence[Scene], variants: Sequence[str]
) -> tuple[float, float, str]:
    """max |Δs|, its 95th percentile, and where the max is: ``got`` and ``ref`` hold each
    variant's scores of ``scenes`` one after the other, as :func:`verify_bundle` scores them."""
    d = np.abs(np.asarray(got, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    i = int(np.argmax(d))
    scene, variant = i % len(scenes), variants[i // len(scenes)]
    how = "with its image" if variant == "scene" else "request only"
    request = scenes[scene].request
    where = f"scene {scene} ({how}): {request[:60] + ('…' if len(request) > 60 else '')!r}"
    return float(d[i]), float(np.percentile(d, 95)), where


def _passes(total: int, variants: Sequence[str]) -> list[tuple[str, slice]]:
    """Each pass's scores among ``total`` (each variant's scores one after the other, as
    :func:`verify_bundle` scores them)."""
    n = total // max(1, len(variants))
    return [(v, slice(k * n, (k + 1) * n)) for k, v in enumerate(variants)]


def pass_max_abs_diff(
    got: np.ndarray, ref: np.ndarray, variants: Sequence[str]
) -> dict[str, float]:
    """max |Δs| within each pass (``got`` and ``ref`` hold each variant's scores one after the
    other, as :func:`verify_bundle` scores them)."""
    d = np.abs(np.asarray(got, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    return {v: float(d[at].max()) for v, at in _passes(len(d), variants) if d[at].size}


def pass_spearman(
    got: np.ndarray,
    ref: np.ndarray,
    variants: Sequence[str],
    inputs: Sequence[Hashable] | None = None,
) -> tuple[float, bool, dict[str, float]]:
    """The rank check's Spearman: within each pass (``got`` and ``ref`` hold each variant's
    scores one after the other, as :func:`verify_bundle` scores them), the worst of the passes
    whose reference varies; whether any does; and each pass's own.

    Within each pass, because the guard ranks scenes against scenes of the same pass: pooled,
    a gap between the passes' means puts one pass's scores above the other's whatever the
    order within each, and a Spearman near 1 would hide scenes scrambled inside a pass. A
    pass whose reference varies and whose bundle scores do not gives NaN (a fail).

    ``inputs`` (one per score, as ``got``): what each score was computed from; scores of the
    same input are one score (their mean, on each side) before ranking. A world table's
    request-only pass scores each contrast's request once per scene: the same prompt, scored
    1e-6 apart by differently batched runs on either side, and those copies' order is float
    noise, not a ranking (an fp32 bundle with max |Δs| 1.9e-5 got 0.994 on a 32-scene world
    table and failed its 0.999). See :func:`score_inputs`.
    """
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    by_pass: dict[str, float] = {}
    owed: list[float] = []
    for variant, at in _passes(len(ref), variants):
        g, r = got[at], ref[at]
        if inputs is not None:
            g, r = _input_means(g, r, list(inputs)[at])
        rho = spearman(g, r)
        by_pass[variant] = rho
        if len(r) >= 2 and np.ptp(r) > 0:
            owed.append(rho)
    if not owed:
        return math.nan, False, by_pass
    worst = math.nan if any(math.isnan(x) for x in owed) else min(owed)
    return worst, True, by_pass


def score_inputs(scenes: Sequence[Scene], variants: Sequence[str]) -> list[Hashable]:
    """What each of :func:`verify_bundle`'s scores was computed from, in its order (each
    variant's scenes one after the other): the request alone for the passes that do not show
    the scene's image (``text``, ``gray``: scenes with one request are one input), the scene
    itself for ``scene``."""
    return [
        (v, s.request) if v in ("text", "gray") else (v, i)
        for v in variants
        for i, s in enumerate(scenes)
    ]


def _input_means(
    got: np.ndarray, ref: np.ndarray, inputs: Sequence[Hashable]
) -> tuple[np.ndarray, np.ndarray]:
    """``got`` and ``ref`` with the scores of one input replaced by one score, their mean (in
    order of first appearance)."""
    index: dict[Hashable, int] = {}
    codes = np.array([index.setdefault(x, len(index)) for x in inputs], dtype=np.int64)
    counts = np.bincount(codes, minlength=len(index))

    def mean(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.bincount(codes, weights=v, minlength=len(index)) / counts)

    return mean(got), mean(ref)


def pair_agreement(
    got: Sequence[np.ndarray], ref: Sequence[np.ndarray], variants: Sequence[str]
) -> tuple[float, dict[str, float]]:
    """The pair's Avg-2 decisions, bundle against reference, within each pass: per member
    ``got[m]`` and ``ref[m]`` hold each variant's scores one after the other (as
    :func:`verify_bundle` scores them); each pass is centred and scaled by its own reference
    median/IQR, and a decision is the Avg-2 score ≥ 0. Returns the worst pass's share of equal
    decisions and each pass's.

    Within each pass, as :func:`pass_spearman`: over both passes pooled, one median between
    the passes' means puts most of each pass on one side of the cut whatever its scores, and
    the agreement reads high while decisions within a pass differ."""
    by_pass: dict[str, float] = {}
    for variant, at in _passes(len(ref[0]), variants):
        z_ref, z_got = [], []
        for g, r in zip(got, ref, strict=True):
            g = np.asarray(g, dtype=np.float64)[at]
            r = np.asarray(r, dtype=np.float64)[at]
            med = float(np.median(r))
            iqr = float(np.subtract(*np.percentile(r, [75, 25]))) or 1.0
            z_ref.append((r - med) / iqr)
            z_got.append((g - med) / iqr)
        s_ref, s_got = np.mean(z_ref, axis=0), np.mean(z_got, axis=0)
        by_pass[variant] = float(np.mean((s_ref >= 0) == (s_got >= 0)))
    return min(by_pass.values()), by_pass


def verify_bundle(
    bundle: str | os.PathLike[str],
    *,
    n_scenes: int = 12,
    seed: int = 0,
    sources: Mapping[str, str] | None = None,
    variants: Sequence[str] = ("scene", "text"),
    reference: bool | None = None,
    scenes: Sequence[Scene] | None = None,
) -> BundleVerification:
    """Score ``n_scenes`` generated scenes (or ``scenes``, the deployment's own, e.g. a
    ``spotstop world`` table) with the bundle and, with ``reference``, with each member's torch
    reference; compare.

    ``reference=None`` runs the reference half when :func:`reference_available`, else skips
    it with :data:`REFERENCE_HINT`; ``False`` skips it; ``True`` runs it (and fails without
    torch).
    """
    b = load_bundle(bundle)  # checks every listed file's sha256
    unknown = sorted(set(sources or {}) - {bm.name for bm in b.members})
    if unknown:  # a misspelt name would compare with the manifest's source and say PASS
        raise ValueError(
            f"--source names {unknown}, not members of this bundle; its members are "
            f"{[bm.name for bm in b.members]}."
        )
    scenes = list(scenes) if scenes is not None else demo_scenes(n_scenes, seed=seed)
    if not scenes:
        raise ValueError("verify_bundle needs at least one scene; the scene table is empty.")
    runs = [_run_member(b, bm, scenes, variants) for bm in b.members]
    runtime = tuple(r for r, _ in runs)
    if reference is None and not reference_available():
        return BundleVerification(b.bundle_id, runtime, (), math.nan, REFERENCE_HINT)
    if reference is False:
        return BundleVerification(
            b.bundle_id, runtime, (), math.nan, "the torch-reference comparison was not asked for"
        )
    if not all(r.ok for r in runtime):
        return BundleVerification(
            b.bundle_id, runtime, (), math.nan, "the runtime half failed: no reference comparison"
        )
    cfg = ScoringConfig(prompt=b.prompt)
    results = []
    refs: list[np.ndarray] = []
    for bm, (run, got) in zip(b.members, runs, strict=True):
        src = (sources or {}).get(bm.name) or _entry(b, bm).get("source")
        if not src:
            raise ValueError(
                f"member {bm.name} has no reference source in the manifest; pass "
                f"--source {bm.name}=HF_FOLDER."
            )
        ref_m = load_member(
            str(src), name=bm.name, config=cfg, image_size=bm.image_size, template=bm.template
        )
        if ref_m.prompt_hash != bm.prompt_hash:
            raise ValueError(
                f"member {bm.name}: the reference at {src} builds prompt hash "
                f"{ref_m.prompt_hash}, the bundle {bm.prompt_hash}; wrong reference folder."
            )
        ref = np.concatenate([[r.score for r in ref_m.score(scenes, v)] for v in variants])  # type: ignore[arg-type]
        del ref_m  # one reference member in memory at a time (the real pair: 8 + 12 GiB fp32)
        gc.collect()
        ecfg = get_export_config(bm.model_type)
        worst, p95, where = diff_summary(got, ref, scenes, variants)
        rho, varies, by_pass = pass_spearman(got, ref, variants, score_inputs(scenes, variants))
        results.append(
            MemberVerification(
                name=bm.name,
                precision=run.precision,
                n=len(ref),
                max_abs_diff=worst,
                p95_abs_diff=p95,
                worst=where,
                spearman=rho,
                reference_varies=varies,
                spearman_by_pass=by_pass,
                max_abs_diff_by_pass=pass_max_abs_diff(got, ref, variants),
                decision_agreement=float(np.mean((got > 0) == (ref > 0))),
                tolerance=float(ecfg.score_atol[run.precision]),
                min_spearman=float(ecfg.min_spearman[run.precision]),
            )
        )
        refs.append(ref)
    pair, pair_by_pass = pair_agreement([got for _, got in runs], refs, variants)
    return BundleVerification(
        b.bundle_id, runtime, tuple(results), pair, pair_agreement_by_pass=pair_by_pass
    )
