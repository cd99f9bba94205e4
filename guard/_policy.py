"""Threshold policies: turn fused scores into a threshold and a SAFE/UNSAFE label.

Label rule, for every policy: a scene is UNSAFE when ``score ≥ threshold`` (a tie is
UNSAFE: fail-safe), and also UNSAFE when the score or the threshold is not finite (NaN
never yields SAFE). The ``score`` is the fused Avg-2 score ``S`` for every policy except
``direct``, which compares one member's raw score with 0.

Kinds (DESIGN.md, "Threshold policies"):

- ``direct``: threshold 0 on ONE member's raw score; the fused score is not used.
- ``frozen``: a fixed cut ``t0`` on ``S``.
- ``batch``: the mean of ``S`` over the current batch. A batch of one is its own mean and
  so always flagged (tie → UNSAFE); such a label carries no information. Batches with
  fewer than ``min_batch`` (default 2) finite scores therefore use the declared fallback.
- ``situation``: per situation id, the mean of the last ``window`` fused scores of that
  situation, once it has ``min_refs`` of them; before that the declared fallback.
- ``conformal``: the class-conditional split-conformal cut on unsafe calibration scores.

Public entry points: :func:`decide_batch` and :func:`decide` (label scenes),
:class:`ConformalCut` (fit a conformal cut), :func:`load_policy` / :func:`dump_policy`
(``policy.yaml``) and :func:`check_policy_matches` (policy ↔ bundle).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import os
import tempfile
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, Self, runtime_checkable

import numpy as np
import yaml
from spotstop.guard._errors import ConfigError, GuardError
from spotstop.guard._fusion import (
    Avg2Fusion,
    FusionError,
    _check_keys,
    _check_mapping,
    _check_number,
    _fusion_from_dict,
    _is_real,
    _join,
)

__all__ = [
    "POLICY_SCHEMA_VERSION",
    "AnyPolicy",
    "BatchPolicy",
    "ConformalCut",
    "ConformalPolicy",
    "DecisionError",
    "DirectPolicy",
    "FallbackPolicy",
    "FrozenPolicy",
    "Label",
    "NotFittedError",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "PolicyMismatchError",
    "SituationPolicy",
    "SituationState",
    "Thresholds",
    "Verdict",
    "check_policy_matches",
    "conformal_min_n",
    "conformal_pac_min_n",
    "conformal_pac_rank",
    "conformal_rank",
    "decide",
    "decide_batch",
    "dump_policy",
    "load_policy",
]

POLICY_SCHEMA_VERSION = 1
"""The ``version`` that ``policy.yaml`` files must carry."""

Label = Literal["SAFE", "UNSAFE"]


class PolicyError(ConfigError):
    """A policy file, policy value or calibration set is invalid; the message names the key."""


class PolicyMismatchError(PolicyError):
    """A valid policy file that was fitted for another bundle or prompt."""


class DecisionError(GuardError, ValueError):
    """Inputs to :func:`decide_batch` do not fit together (lengths, a missing member)."""


class NotFittedError(GuardError, AttributeError):
    """A learned attribute (``threshold_``, ``k_``, ``n_``) was read before ``fit``."""


# ---------------------------------------------------------------------- results


@dataclass(frozen=True)
class Verdict:
    """The label of one scene.

    label: ``"UNSAFE"`` when ``score ≥ threshold`` or either is not finite, else ``"SAFE"``.
    score: the value compared with the threshold (fused ``S``; a raw member score for
        ``direct``). NaN kept as NaN.
    threshold: the threshold applied to this scene. NaN kept as NaN.
    policy: the rule that set the threshold, e.g. ``"batch"`` or ``"situation->frozen"``
        (configured kind, then the fallback actually used).
    detail: a readable reason (batch size, references used, why it failed closed).
    """

    label: Label
    score: float
    threshold: float
    policy: str
    detail: str


@dataclass(frozen=True)
class Thresholds:
    """What a policy computes for a batch, before labelling (one entry per scene).

    score: the value each scene is compared with. threshold: each scene's threshold.
    rule: the rule that set each threshold. detail: why, readable.
    """

    score: np.ndarray
    threshold: np.ndarray
    rule: tuple[str, ...]
    detail: tuple[str, ...]


# ---------------------------------------------------------------------- policies


@runtime_checkable
class Policy(Protocol):
    """A threshold policy. Use it through :func:`decide_batch`, which checks the inputs."""

    kind: ClassVar[str]

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score and threshold for each scene of a batch (inputs already checked)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml``."""
        ...


def _constant(score: np.ndarray, threshold: float, rule: str, detail: str) -> Thresholds:
    n = score.shape[0]
    return Thresholds(
        score=np.asarray(score, dtype=float),
        threshold=np.full(n, threshold, dtype=float),
        rule=(rule,) * n,
        detail=(detail,) * n,
    )


@dataclass(frozen=True)
class DirectPolicy:
    """Threshold 0 on one member's raw score ``s_m`` (the member's own direct answer).

    The fused score is not used. UNSAFE when ``s_m ≥ 0``.
    """

    kind: ClassVar[str] = "direct"
    member: str

    def __post_init__(self) -> None:
        if not isinstance(self.member, str) or not self.member:
            raise PolicyError(
                f"DirectPolicy.member must be a member name; got {self.member!r}. "
                "Name one of the fusion members."
            )

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score: the member's raw score; threshold: 0."""
        return _constant(
            member_scores[self.member], 0.0, "direct", f"raw score of {self.member!r} vs 0"
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml``."""
        return {"kind": self.kind, "member": self.member}


@dataclass(frozen=True)
class FrozenPolicy:
    """A fixed cut ``t0`` on the fused score: UNSAFE when ``S ≥ threshold``."""

    kind: ClassVar[str] = "frozen"
    threshold: float

    def __post_init__(self) -> None:
        if not _is_real(self.threshold) or not math.isfinite(self.threshold):
            raise PolicyError(
                f"FrozenPolicy.threshold must be a finite number; got {self.threshold!r}."
            )
        object.__setattr__(self, "threshold", float(self.threshold))

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score: ``S``; threshold: ``t0``."""
        return _constant(fused, self.threshold, "frozen", f"fixed cut {self.threshold:.6g}")

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml``."""
        return {"kind": self.kind, "threshold": self.threshold}


def conformal_rank(alpha: float, n: int) -> int:
    """``k = ⌊α (n + 1)⌋``, the rank of the conformal cut among n sorted unsafe scores.

    α is read as the decimal it prints as (``Fraction(repr(alpha))``), so that e.g.
    ``α = 0.29, n = 99`` gives k = 29, not 28 from ``0.29 * 100 = 28.999…``. Then
    ``P(miss) = k / (n + 1) ≤ α`` holds exactly for that decimal α.
    """
    return math.floor(Fraction(repr(float(alpha))) * (n + 1))


def conformal_min_n(alpha: float) -> int:
    """The fewest unsafe calibration scores for which ``k ≥ 1``: ``⌈1/α⌉ − 1``."""
    return math.ceil(1 / Fraction(repr(float(alpha)))) - 1


_PAC_EXACT_MAX_N = 20_000  # above this, the binomial tail is summed in floating point


def conformal_pac_rank(alpha: float, delta: float, n: int) -> int:
    """The training-conditional (PAC) rank: the largest k with ``P(Binomial(n, α) ≤ k−1) ≤ δ``.

    With continuous scores the miss rate of the cut ``u(k)`` given the calibration set is
    ``F(u(k)) ~ Beta(k, n−k+1)``, and ``P(Beta(k, n−k+1) > α) = P(Binomial(n, α) ≤ k−1)``
    (at most k−1 of n uniforms fall below α). So this k gives ``P(miss > α) ≤ δ`` over
    calibration sets (Vovk 2012, "training-conditional" validity). Returns 0 when even
    k = 1 fails, i.e. ``(1−α)^n > δ``. α and δ are read as the decimals they print as;
    up to n = 20,000 the tail is summed exactly in integers, above it in floating point.
    """
    a_frac, d_frac = Fraction(repr(float(alpha))), Fraction(repr(float(delta)))
    if n > _PAC_EXACT_MAX_N:
        la, lb = math.log(float(a_frac)), math.log1p(-float(a_frac))
        ld = math.log(float(d_frac))
        acc = -math.inf
        for i in range(n + 1):
            lt = (
                math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * la + (n - i) * lb
            )  # fmt: skip
            acc = max(acc, lt) + math.log1p(math.exp(-abs(acc - lt)))
            if acc > ld:
                return i
        return n
    a, b = a_frac.numerator, a_frac.denominator  # α = a/b
    c, d = d_frac.numerator, d_frac.denominator  # δ = c/d
    bound = c * b**n  # compare d·Σ C(n,i) a^i (b−a)^(n−i) with c·b^n: all integers
    term = (b - a) ** n  # C(n,0) a^0 (b−a)^n
    acc = 0
    for i in range(n + 1):
        acc += term
        if acc * d > bound:
            return i  # CDF(i) > δ, so k − 1 = i − 1 is the last that holds
        term = term * (n - i) * a // ((i + 1) * (b - a))
    return n


def conformal_pac_min_n(alpha: float, delta: float) -> int:
    """The fewest unsafe calibration scores for which the PAC rank is ≥ 1: ``(1−α)^n ≤ δ``."""
    a = Fraction(repr(float(alpha)))
    d = Fraction(repr(float(delta)))
    n = max(1, math.floor(math.log(float(d)) / math.log1p(-float(a))) - 1)
    while (1 - a) ** n > d:
        n += 1
    return n


def _check_alpha(alpha: Any, *, where: str, source: str) -> float:
    if not _is_real(alpha) or not (0 < alpha < 1):
        raise PolicyError(f"{where} must be in (0, 1); got {alpha!r}. Set it in {source}.")
    return float(alpha)


def _check_delta(delta: Any, *, where: str, source: str) -> float:
    if not _is_real(delta) or not (0 < delta < 1):
        raise PolicyError(
            f"{where} must be in (0, 1) (or absent for the marginal guarantee); got {delta!r}. "
            f"Set it in {source}."
        )
    return float(delta)


def _too_few_pac_message(alpha: float, delta: float, n: int, where: str) -> str:
    need = conformal_pac_min_n(alpha, delta)
    return (
        f"{where}: {n} unsafe calibration case(s) are too few for the training-conditional "
        f"guarantee with alpha={alpha!r}, delta={delta!r}: no rank k ≥ 1 has "
        f"P(Binomial(n, alpha) ≤ k−1) ≤ delta, so the cut would flag everything. At least "
        f"{need} unsafe calibration cases are needed ((1−alpha)^n ≤ delta); collect more "
        "unsafe cases, raise alpha or delta, or use the marginal guarantee."
    )


def _too_few_message(alpha: float, n: int, where: str) -> str:
    need = conformal_min_n(alpha)
    return (
        f"{where}: {n} unsafe calibration case(s) are too few for alpha={alpha!r}: "
        f"k = floor(alpha*(n+1)) = 0 would flag everything. At least {need} unsafe "
        f"calibration cases are needed (n ≥ ceil(1/alpha) − 1 = {need}); "
        "collect more unsafe cases or raise alpha."
    )


@dataclass(frozen=True)
class ConformalPolicy:
    """Class-conditional split-conformal cut: UNSAFE when ``S ≥ u(k)``.

    ``u(1) ≤ … ≤ u(n)`` are the sorted unsafe calibration scores and ``k = ⌊α(n+1)⌋``;
    for an unsafe scene exchangeable with them, ``P(miss) = P(S < u(k)) ≤ α``. Build it
    with ``ConformalCut(alpha).fit(unsafe_scores).to_policy()``; ``k = 0`` is refused.

    delta: ``None`` (default) for that marginal guarantee. A number in (0, 1) selects the
    training-conditional (PAC) guarantee instead: ``k`` is then
    :func:`conformal_pac_rank` ``(α, δ, n)``, so that the miss rate given this calibration
    set exceeds α with probability at most δ over calibration sets.
    """

    kind: ClassVar[str] = "conformal"
    alpha: float
    n: int
    k: int
    threshold: float
    delta: float | None = None

    def __post_init__(self) -> None:
        alpha = _check_alpha(self.alpha, where="ConformalPolicy.alpha", source="the caller")
        if not _is_int(self.n) or self.n < 1:
            raise PolicyError(f"ConformalPolicy.n must be an integer ≥ 1; got {self.n!r}.")
        if self.delta is None:
            k = conformal_rank(alpha, int(self.n))
            if k == 0:
                raise PolicyError(_too_few_message(alpha, int(self.n), "ConformalPolicy"))
            rule = "floor(alpha*(n+1))"
        else:
            delta = _check_delta(self.delta, where="ConformalPolicy.delta", source="the caller")
            object.__setattr__(self, "delta", delta)
            k = conformal_pac_rank(alpha, delta, int(self.n))
            if k == 0:
                raise PolicyError(
                    _too_few_pac_message(alpha, delta, int(self.n), "ConformalPolicy")
                )
            rule = f"the PAC rank for delta={delta!r}"
        if not _is_int(self.k) or self.k != k:
            raise PolicyError(
                f"ConformalPolicy.k must be {rule} = {k} for alpha={alpha!r}, "
                f"n={self.n}; got {self.k!r}. Refit with ConformalCut or calibrate."
            )
        if not _is_real(self.threshold) or not math.isfinite(self.threshold):
            raise PolicyError(
                f"ConformalPolicy.threshold must be a finite number; got {self.threshold!r}."
            )
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "threshold", float(self.threshold))

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score: ``S``; threshold: ``u(k)``."""
        pac = "" if self.delta is None else f", delta={self.delta:g} (PAC)"
        return _constant(
            fused,
            self.threshold,
            "conformal",
            f"u({self.k}) of {self.n} unsafe calibration scores, alpha={self.alpha:g}{pac}",
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml`` (``delta`` only when set)."""
        d: dict[str, Any] = {
            "kind": self.kind,
            "alpha": self.alpha,
            "n": self.n,
            "k": self.k,
            "threshold": self.threshold,
        }
        if self.delta is not None:
            d["delta"] = self.delta
        return d


FallbackPolicy = DirectPolicy | FrozenPolicy | ConformalPolicy
"""Policies that can label a single scene without other scenes: the allowed fallbacks."""


def _check_fallback(fallback: Any, owner: str) -> None:
    if not isinstance(fallback, DirectPolicy | FrozenPolicy | ConformalPolicy):
        raise PolicyError(
            f"{owner}.fallback must be a DirectPolicy, FrozenPolicy or ConformalPolicy; "
            f"got {type(fallback).__name__}."
        )


@dataclass(frozen=True)
class BatchPolicy:
    """Recentering on the batch mean: threshold = mean of the finite ``S`` of the batch.

    With Avg-2 the reference medians cancel (``S − mean(S)`` does not depend on them).
    Scenes with a non-finite ``S`` are UNSAFE and are left out of the mean. A batch of
    one is its own mean, so it would always be flagged and says nothing; batches with
    fewer than ``min_batch`` finite scores use ``fallback`` instead. Caveat: this labels
    about half of any batch UNSAFE, and so fails when the unsafe share moves.
    """

    kind: ClassVar[str] = "batch"
    fallback: FallbackPolicy
    min_batch: int = 2

    def __post_init__(self) -> None:
        _check_fallback(self.fallback, "BatchPolicy")
        if not _is_int(self.min_batch) or self.min_batch < 2:
            raise PolicyError(
                f"BatchPolicy.min_batch must be an integer ≥ 2; got {self.min_batch!r} "
                "(a batch of one is its own mean and carries no label)."
            )

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score: ``S``; threshold: the batch mean, or the fallback's for small batches."""
        finite = np.isfinite(fused)
        n_ok = int(finite.sum())
        if n_ok < self.min_batch:
            t = self.fallback.thresholds(fused, member_scores, situation_ids)
            why = (
                f"batch has {n_ok} finite score(s) < min_batch {self.min_batch}; "
                f"fallback {self.fallback.kind}"
            )
            return Thresholds(
                score=t.score,
                threshold=t.threshold,
                rule=tuple(f"batch->{r}" for r in t.rule),
                detail=tuple(f"{why}: {d}" for d in t.detail),
            )
        mean = float(np.mean(fused[finite]))
        return _constant(fused, mean, "batch", f"mean of {n_ok} finite scores in the batch")

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml``."""
        return {"kind": self.kind, "min_batch": self.min_batch, "fallback": self.fallback.to_dict()}


class SituationState:
    """Per-situation windows of recent unlabelled fused scores; thread-safe, persistable.

    window: how many recent scores to keep per situation (older ones drop out).
    path: a JSON file; loaded if it exists, rewritten atomically (temp file +
        ``os.replace``) after every batch. ``None`` keeps the state in memory only, so it
        does not survive a restart.
    key: a fingerprint of the fusion the scores were made with (bundle, prompt, fusion
        statistics); a file written under another key is refused, since its scores are on
        another scale.

    One process should own a state file; two objects writing the same file overwrite each
    other. Only finite scores are stored. The number of situations is not capped.
    """

    SCHEMA_VERSION: ClassVar[int] = 1

    def __init__(
        self, window: int, path: str | os.PathLike[str] | None = None, *, key: str = ""
    ) -> None:
        if not _is_int(window) or window < 1:
            raise PolicyError(f"SituationState.window must be an integer ≥ 1; got {window!r}.")
        self._window = int(window)
        self._path = Path(path) if path is not None else None
        self._key = str(key)
        self._lock = threading.RLock()
        self._windows: dict[str, deque[float]] = {}
        if self._path is not None and self._path.exists():
            self._load()

    @property
    def window(self) -> int:
        """How many recent scores are kept per situation."""
        return self._window

    @property
    def path(self) -> Path | None:
        """The JSON file the state persists to, or ``None`` (memory only)."""
        return self._path

    @property
    def key(self) -> str:
        """The fingerprint of the fusion the stored scores were made with."""
        return self._key

    def references(self, situation_id: str) -> tuple[float, ...]:
        """The stored scores of one situation, oldest first."""
        with self._lock:
            return tuple(self._windows.get(situation_id, ()))

    def snapshot(self) -> dict[str, tuple[float, ...]]:
        """A copy of all windows: situation id -> scores, oldest first."""
        with self._lock:
            return {sid: tuple(w) for sid, w in self._windows.items()}

    # -- internal: the policy holds the lock around read-then-append, then saves.
    def _add_locked(self, situation_id: str, score: float) -> None:
        w = self._windows.get(situation_id)
        if w is None:
            w = self._windows[situation_id] = deque(maxlen=self._window)
        w.append(float(score))

    def _save_locked(self) -> None:
        if self._path is None:
            return
        doc = {
            "schema_version": self.SCHEMA_VERSION,
            "key": self._key,
            "window": self._window,
            "situations": {sid: list(w) for sid, w in self._windows.items()},
        }
        _atomic_write_text(self._path, json.dumps(doc, allow_nan=False, indent=1))

    def _load(self) -> None:
        if self._path is None:  # memory-only state: nothing to load
            return
        where = f"situation state file {str(self._path)!r}"
        fix = "Delete it to start with empty windows (situations fall back until refilled)."
        try:
            doc = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PolicyError(f"{where} could not be read as JSON: {e}. {fix}") from e
        if not isinstance(doc, dict) or doc.get("schema_version") != self.SCHEMA_VERSION:
            raise PolicyError(
                f"{where} must be a JSON object with schema_version {self.SCHEMA_VERSION}; "
                f"got {doc.get('schema_version') if isinstance(doc, dict) else doc!r}. {fix}"
            )
        if doc.get("key") != self._key:
            raise PolicyError(
                f"{where} was written for key {doc.get('key')!r}, but this policy's key is "
                f"{self._key!r} (another bundle, prompt or fusion fit; its scores are on "
                f"another scale). {fix}"
            )
        sits = doc.get("situations")
        if not isinstance(sits, dict):
            raise PolicyError(f"{where}: 'situations' must be an object; got {sits!r}. {fix}")
        for sid, scores in sits.items():
            if not isinstance(scores, list) or not all(
                _is_real(s) and math.isfinite(s) for s in scores
            ):
                raise PolicyError(
                    f"{where}: situations[{sid!r}] must be a list of finite numbers. {fix}"
                )
            # a smaller window than the file's keeps the most recent scores
            self._windows[sid] = deque((float(s) for s in scores), maxlen=self._window)


@dataclass(frozen=True)
class SituationPolicy:
    """Recentering on unlabelled scenes of the same situation.

    For a scene of situation ``sid``, the threshold is the mean of the last ``window``
    finite fused scores of ``sid`` seen BEFORE this scene, when there are at least
    ``min_refs`` of them; otherwise (and for ``sid = None``) the ``fallback`` policy.
    After labelling, the scene's finite ``S`` joins the window. Scenes of one batch are
    handled in order, so a later scene sees the earlier ones. Leaving the current scene
    out of its own references does not change the label of the mean rule
    (``S ≥ (ΣR + S)/(m + 1)`` iff ``S ≥ ΣR/m``); it only keeps the count of references
    honest and the reported threshold independent of the scene.

    Caveat (seed 000, Sec. 6.2): the rule needs unlabelled scenes of both classes among
    the references; in an all-safe situation it will call some safe scenes unsafe.

    The window lives in ``state`` (a :class:`SituationState`), persisted to
    ``state_file`` when given. ``state_file`` is stored as written in ``policy.yaml``;
    :func:`load_policy` resolves a relative one against the policy file's folder.
    """

    kind: ClassVar[str] = "situation"
    window: int
    min_refs: int
    fallback: FallbackPolicy
    state_file: str | None = None
    state: SituationState = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        _check_fallback(self.fallback, "SituationPolicy")
        if not _is_int(self.window) or self.window < 1:
            raise PolicyError(
                f"SituationPolicy.window must be an integer ≥ 1; got {self.window!r}."
            )
        if not _is_int(self.min_refs) or not (1 <= self.min_refs <= self.window):
            raise PolicyError(
                f"SituationPolicy.min_refs must be an integer in [1, window={self.window}]; "
                f"got {self.min_refs!r}."
            )
        if self.state is None:
            object.__setattr__(self, "state", SituationState(self.window, self.state_file))
        elif not isinstance(self.state, SituationState) or self.state.window != self.window:
            raise PolicyError(
                "SituationPolicy.state must be a SituationState with the same window "
                f"({self.window}); got {self.state!r}."
            )

    def thresholds(
        self,
        fused: np.ndarray,
        member_scores: Mapping[str, np.ndarray],
        situation_ids: Sequence[str | None],
    ) -> Thresholds:
        """Score: ``S``; threshold: mean of earlier scores of the situation, or fallback."""
        fb = self.fallback.thresholds(fused, member_scores, situation_ids)
        score = np.asarray(fused, dtype=float).copy()
        thr = np.empty_like(score)
        rule: list[str] = []
        detail: list[str] = []
        with self.state._lock:
            for i, sid in enumerate(situation_ids):
                refs = self.state.references(sid) if sid is not None else ()
                if len(refs) >= self.min_refs:
                    score[i] = fused[i]
                    thr[i] = float(np.mean(refs))
                    rule.append("situation")
                    detail.append(f"mean of {len(refs)} earlier scores of situation {sid!r}")
                else:
                    score[i] = fb.score[i]
                    thr[i] = fb.threshold[i]
                    rule.append(f"situation->{fb.rule[i]}")
                    why = (
                        "no situation id"
                        if sid is None
                        else f"situation {sid!r} has {len(refs)} < min_refs {self.min_refs} "
                        "references"
                    )
                    detail.append(f"{why}; fallback {self.fallback.kind}: {fb.detail[i]}")
                if sid is not None and math.isfinite(fused[i]):
                    self.state._add_locked(sid, float(fused[i]))
            self.state._save_locked()
        return Thresholds(score=score, threshold=thr, rule=tuple(rule), detail=tuple(detail))

    def to_dict(self) -> dict[str, Any]:
        """The ``policy:`` section of ``policy.yaml``."""
        d: dict[str, Any] = {
            "kind": self.kind,
            "window": self.window,
            "min_refs": self.min_refs,
            "fallback": self.fallback.to_dict(),
        }
        if self.state_file is not None:
            d["state_file"] = self.state_file
        return d


AnyPolicy = DirectPolicy | FrozenPolicy | ConformalPolicy | BatchPolicy | SituationPolicy
"""Every concrete policy kind."""


# ---------------------------------------------------------------------- conformal fitting


class ConformalCut:
    """Fit the class-conditional split-conformal cut on unsafe calibration scores.

    alpha: the allowed miss rate (unsafe scenes labelled SAFE), in (0, 1).

    ``fit(unsafe_scores)`` sorts the n scores ascending and sets ``k_ = ⌊α(n+1)⌋``,
    ``threshold_ = u(k_)``, ``n_ = n``. A scene is UNSAFE when ``S ≥ threshold_``, so an
    exchangeable unsafe scene is missed with probability ``k_/(n+1) ≤ α``. ``fit`` refuses
    (``PolicyError``) when ``k = 0``, i.e. ``n < ⌈1/α⌉ − 1``, and says how many are needed.

    >>> cut = ConformalCut(alpha=0.1).fit([0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    >>> cut.k_, cut.threshold_
    (1, 0.5)
    """

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha

    def fit(self, unsafe_scores: Any) -> Self:
        """Learn ``threshold_``, ``k_``, ``n_`` from unsafe calibration scores."""
        alpha, scores = _check_conformal_fit(self.alpha, unsafe_scores)
        n = scores.size
        k = conformal_rank(alpha, n)
        if k == 0:
            raise PolicyError(_too_few_message(alpha, n, "ConformalCut.fit"))
        u = np.sort(scores)
        self._n = n
        self._k = k
        self._threshold = float(u[k - 1])
        return self

    def _fitted(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise NotFittedError(
                "This ConformalCut is not fitted yet; call fit(unsafe_scores) first."
            ) from None

    @property
    def threshold_(self) -> float:
        """The cut ``u(k)``: UNSAFE when ``S ≥ threshold_``."""
        return float(self._fitted("_threshold"))

    @property
    def k_(self) -> int:
        """The rank ``⌊α(n+1)⌋`` (1-based) of the cut among the sorted scores."""
        return int(self._fitted("_k"))

    @property
    def n_(self) -> int:
        """The number of unsafe calibration scores."""
        return int(self._fitted("_n"))

    def to_policy(self) -> ConformalPolicy:
        """The fitted cut as a :class:`ConformalPolicy`."""
        return ConformalPolicy(
            alpha=float(self.alpha), n=self.n_, k=self.k_, threshold=self.threshold_
        )

    def __repr__(self) -> str:
        if hasattr(self, "_k"):
            return (
                f"ConformalCut(alpha={self.alpha!r}; n_={self._n}, k_={self._k}, "
                f"threshold_={self._threshold:.6g})"
            )
        return f"ConformalCut(alpha={self.alpha!r}; not fitted)"


def _check_conformal_fit(alpha: Any, unsafe_scores: Any) -> tuple[float, np.ndarray]:
    alpha = _check_alpha(alpha, where="ConformalCut.alpha", source="ConformalCut(alpha=...)")
    try:
        scores = np.asarray(unsafe_scores, dtype=float)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"unsafe_scores must be a 1-D array of numbers: {e}") from e
    if scores.ndim != 1:
        raise PolicyError(f"unsafe_scores must be a 1-D array; got shape {scores.shape}.")
    if scores.size == 0:
        raise PolicyError(
            f"unsafe_scores is empty; at least {conformal_min_n(alpha)} unsafe calibration "
            f"cases are needed for alpha={alpha!r}."
        )
    if not np.isfinite(scores).all():
        raise PolicyError(
            f"unsafe_scores has {int((~np.isfinite(scores)).sum())} non-finite value(s); "
            "remove or rescore those cases before fitting."
        )
    return alpha, scores


# ---------------------------------------------------------------------- deciding


def decide_batch(
    policy: Policy,
    fused: Any,
    member_scores: Mapping[str, Any] | None = None,
    situation_ids: Sequence[str | None] | None = None,
) -> list[Verdict]:
    """Label a batch of scenes.

    policy: any policy (:data:`AnyPolicy`).
    fused: 1-D fused scores ``S`` (NaN allowed: that scene is UNSAFE).
    member_scores: member name -> 1-D raw scores, same length; needed by ``direct`` (also
        as a fallback), may be omitted otherwise.
    situation_ids: one id (or ``None``) per scene; ``None`` for the whole argument means
        no situation for any scene.

    Each scene is UNSAFE when ``score ≥ threshold`` (ties UNSAFE), and also when the
    score or threshold is not finite; the verdict's ``detail`` says which. Raises
    :class:`DecisionError` when the inputs do not fit together. A ``situation`` policy
    updates (and persists) its state.
    """
    fused_a, members_a, sids = _check_decide_inputs(policy, fused, member_scores, situation_ids)
    t = policy.thresholds(fused_a, members_a, sids)
    n = fused_a.shape[0]
    if not (
        t.score.shape == (n,) and t.threshold.shape == (n,) and len(t.rule) == len(t.detail) == n
    ):
        raise DecisionError(
            f"policy {policy.kind!r} returned thresholds that do not match the {n} scenes."
        )
    out: list[Verdict] = []
    for s, thr, rule, det in zip(
        t.score.tolist(), t.threshold.tolist(), t.rule, t.detail, strict=True
    ):
        label: Label
        if not math.isfinite(s):
            label, det = "UNSAFE", f"score is {s!r}, not finite: fail closed ({det})"
        elif not math.isfinite(thr):
            label, det = "UNSAFE", f"threshold is {thr!r}, not finite: fail closed ({det})"
        else:
            label = "UNSAFE" if s >= thr else "SAFE"
        out.append(Verdict(label=label, score=s, threshold=thr, policy=rule, detail=det))
    return out


def decide(
    policy: Policy,
    fused: float,
    member_scores: Mapping[str, float] | None = None,
    situation_id: str | None = None,
) -> Verdict:
    """Label one scene; see :func:`decide_batch` (a ``batch`` policy uses its fallback)."""
    ms = {m: [v] for m, v in (member_scores or {}).items()}
    return decide_batch(policy, [fused], ms, [situation_id])[0]


def _check_decide_inputs(
    policy: Any,
    fused: Any,
    member_scores: Mapping[str, Any] | None,
    situation_ids: Sequence[str | None] | None,
) -> tuple[np.ndarray, dict[str, np.ndarray], list[str | None]]:
    if not isinstance(policy, Policy):
        raise DecisionError(f"policy must be a Policy; got {type(policy).__name__}.")
    try:
        fused_a = np.asarray(fused, dtype=float)
    except (TypeError, ValueError) as e:
        raise DecisionError(f"fused must be a 1-D array of numbers: {e}") from e
    if fused_a.ndim != 1:
        raise DecisionError(f"fused must be a 1-D array; got shape {fused_a.shape}.")
    n = fused_a.shape[0]
    members_a: dict[str, np.ndarray] = {}
    for m, x in (member_scores or {}).items():
        try:
            arr = np.asarray(x, dtype=float)
        except (TypeError, ValueError) as e:
            raise DecisionError(f"member_scores[{m!r}] must be numbers: {e}") from e
        if arr.shape != (n,):
            raise DecisionError(
                f"member_scores[{m!r}] must have shape ({n},) like fused; got {arr.shape}."
            )
        members_a[m] = arr
    for need in _members_needed(policy):
        if need not in members_a:
            raise DecisionError(
                f"policy {policy.kind!r} needs the raw scores of member {need!r}; "
                f"member_scores has {sorted(members_a)}. Pass member_scores."
            )
    if situation_ids is None:
        sids: list[str | None] = [None] * n
    else:
        sids = list(situation_ids)
        if len(sids) != n:
            raise DecisionError(
                f"situation_ids must have one entry per scene ({n}); got {len(sids)}."
            )
        for s in sids:
            if s is not None and not isinstance(s, str):
                raise DecisionError(
                    f"situation_ids must be strings or None; got {type(s).__name__} {s!r}."
                )
    return fused_a, members_a, sids


def _members_needed(policy: Any) -> list[str]:
    if isinstance(policy, DirectPolicy):
        return [policy.member]
    fb = getattr(policy, "fallback", None)
    return [fb.member] if isinstance(fb, DirectPolicy) else []


# ---------------------------------------------------------------------- policy.yaml


@dataclass(frozen=True)
class PolicyConfig:
    """The contents of ``policy.yaml``.

    version: schema version, :data:`POLICY_SCHEMA_VERSION`.
    bundle_id / prompt_hash: the bundle and prompt the policy was fitted for; see
        :func:`check_policy_matches`.
    fusion: the Avg-2 fusion (reference statistics and weights).
    policy: the threshold policy (with its live state for ``situation``).
    fitted_on: provenance, free-form (data set, split, n, tool versions).
    created: when the file was made, timezone-aware.
    """

    bundle_id: str
    prompt_hash: str
    fusion: Avg2Fusion
    policy: AnyPolicy
    fitted_on: Mapping[str, Any]
    created: datetime
    version: int = POLICY_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in the order of ``policy.yaml``."""
        return {
            "version": self.version,
            "bundle_id": self.bundle_id,
            "prompt_hash": self.prompt_hash,
            "created": self.created.isoformat(),
            "fusion": self.fusion.to_dict(),
            "policy": self.policy.to_dict(),
            "fitted_on": _plain(self.fitted_on),
        }


_TOP_KEYS = ("version", "bundle_id", "prompt_hash", "created", "fusion", "policy", "fitted_on")
_KIND_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (required, optional), besides "kind"
    "direct": (("member",), ()),
    "frozen": (("threshold",), ()),
    "conformal": (("alpha", "n", "k", "threshold"), ("delta",)),
    "batch": (("fallback",), ("min_batch",)),
    "situation": (("window", "min_refs", "fallback"), ("state_file",)),
}
_FALLBACK_KINDS = ("conformal", "direct", "frozen")


def load_policy(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    where: str | None = None,
    state_file: str | os.PathLike[str] | None = None,
) -> PolicyConfig:
    """Load and validate ``policy.yaml`` (a path) or its parsed dict.

    where: how to name the source in messages ("Set it in <where>"); defaults to the
        path, or ``"the policy dict"``.
    state_file: overrides ``policy.state_file`` of a ``situation`` policy (e.g. a
        writable folder on the robot); a relative ``policy.state_file`` from the YAML is
        resolved against the policy file's folder (the working directory for a dict).

    Every key is checked; a message names its key path (``policy.alpha``), what is
    allowed, what came, and where to fix it. Unknown keys are errors, with a suggestion.
    Raises :class:`PolicyError` (and ``FileNotFoundError`` for a missing file).
    """
    base_dir: Path | None = None
    if isinstance(source, Mapping):
        doc: Any = source
        src = where or "the policy dict"
    else:
        path = Path(source)
        src = where or str(path)
        text = path.read_text(encoding="utf-8")
        try:
            doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
        except yaml.YAMLError as e:
            raise PolicyError(f"{src} is not valid YAML: {e}") from e
        except PolicyError as e:  # a duplicate key
            raise PolicyError(f"{src}: {e}") from e
        base_dir = path.parent

    _check_mapping(doc, where="", source=src, error=PolicyError)
    _check_keys(doc, where="", required=_TOP_KEYS, source=src, error=PolicyError)
    version = doc["version"]
    if not _is_int(version) or version != POLICY_SCHEMA_VERSION:
        raise PolicyError(
            f"version must be {POLICY_SCHEMA_VERSION}; got {version!r}. This spotstop "
            f"reads policy files of version {POLICY_SCHEMA_VERSION}; regenerate {src} "
            "with `calibrate`."
        )
    for key in ("bundle_id", "prompt_hash"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise PolicyError(
                f"{key} must be a non-empty string; got {doc[key]!r}. Set it in {src} to "
                "the value in the bundle's manifest.yaml."
            )
    created = _check_created(doc["created"], src)
    try:
        fusion = _fusion_from_dict(doc["fusion"], where="fusion", source=src, error=PolicyError)
    except FusionError as e:  # from the constructor; the dict was validated before
        raise PolicyError(f"fusion: {e} Fix it in {src}.") from e
    fitted_on = doc["fitted_on"]
    _check_mapping(fitted_on, where="fitted_on", source=src, error=PolicyError)

    key = _state_key(doc["bundle_id"], doc["prompt_hash"], fusion)
    policy = _policy_from_dict(
        doc["policy"],
        where="policy",
        source=src,
        members=fusion.members,
        base_dir=base_dir,
        state_override=state_file,
        state_key=key,
        nested=False,
    )
    return PolicyConfig(
        bundle_id=doc["bundle_id"],
        prompt_hash=doc["prompt_hash"],
        fusion=fusion,
        policy=policy,
        fitted_on=dict(fitted_on),
        created=created,
        version=int(version),
    )


def dump_policy(cfg: PolicyConfig, path: str | os.PathLike[str]) -> None:
    """Write ``cfg`` as YAML to ``path`` atomically (temp file + ``os.replace``)."""
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)
    _atomic_write_text(Path(path), text)


def check_policy_matches(cfg: PolicyConfig, bundle_id: str, prompt_hash: str) -> None:
    """Raise :class:`PolicyMismatchError` unless the policy was fitted for this bundle and prompt."""
    wrong = []
    if cfg.bundle_id != bundle_id:
        wrong.append(f"bundle_id {cfg.bundle_id!r} but the bundle is {bundle_id!r}")
    if cfg.prompt_hash != prompt_hash:
        wrong.append(f"prompt_hash {cfg.prompt_hash!r} but the bundle's prompt is {prompt_hash!r}")
    if wrong:
        raise PolicyMismatchError(
            "policy.yaml was fitted for another bundle or prompt: it has "
            + "; and ".join(wrong)
            + ". Its fusion statistics and threshold do not carry over; refit the policy "
            "for this bundle with `calibrate`, or load the bundle it was made for."
        )


# ---------------------------------------------------------------------- loader helpers


def _is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def _check_int(x: Any, *, where: str, source: str, low: int, high: int | None = None) -> int:
    ok = _is_int(x) and x >= low and (high is None or x <= high)
    if not ok:
        allowed = f"an integer ≥ {low}" if high is None else f"an integer in [{low}, {high}]"
        raise PolicyError(f"{where} must be {allowed}; got {x!r}. Set it in {source}.")
    return int(x)


def _check_created(x: Any, source: str) -> datetime:
    value = x
    if isinstance(x, str):
        try:
            value = datetime.fromisoformat(x)
        except ValueError:
            value = None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise PolicyError(
            "created must be an ISO 8601 time with a UTC offset, e.g. "
            f"'2026-05-01T12:00:00+00:00'; got {x!r}. Set it in {source}."
        )
    return value


def _policy_from_dict(
    d: Any,
    *,
    where: str,
    source: str,
    members: tuple[str, ...],
    base_dir: Path | None,
    state_override: str | os.PathLike[str] | None,
    state_key: str,
    nested: bool,
) -> AnyPolicy:
    _check_mapping(d, where=where, source=source, error=PolicyError)
    kinds = _FALLBACK_KINDS if nested else tuple(sorted(_KIND_KEYS))
    kind = d.get("kind")
    if kind not in kinds:
        hint = difflib.get_close_matches(str(kind), kinds, n=1, cutoff=0.6)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        role = "a fallback" if nested else "a policy"
        raise PolicyError(
            f"{_join(where, 'kind')} must name {role} kind, one of {', '.join(kinds)}; "
            f"got {kind!r}.{suggestion} Set it in {source}."
        )
    required, optional = _KIND_KEYS[kind]
    _check_keys(
        d,
        where=where,
        required=("kind", *required),
        optional=optional,
        source=source,
        error=PolicyError,
    )

    def k(name: str) -> str:
        return _join(where, name)

    if kind == "direct":
        member = d["member"]
        if member not in members:
            hint = difflib.get_close_matches(str(member), members, n=1, cutoff=0.6)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise PolicyError(
                f"{k('member')} must be one of the fusion members {list(members)}; got "
                f"{member!r}.{suggestion} Set it in {source}."
            )
        return DirectPolicy(member=member)
    if kind == "frozen":
        return FrozenPolicy(
            threshold=_check_number(
                d["threshold"], where=k("threshold"), source=source, error=PolicyError
            )
        )
    if kind == "conformal":
        alpha = _check_alpha(d["alpha"], where=k("alpha"), source=source)
        n = _check_int(d["n"], where=k("n"), source=source, low=1)
        delta: float | None = None
        if d.get("delta") is None:
            if conformal_rank(alpha, n) == 0:
                raise PolicyError(_too_few_message(alpha, n, k("n")) + f" Refit for {source}.")
            kk = conformal_rank(alpha, n)
            rule = "floor(alpha*(n+1))"
        else:
            delta = _check_delta(d["delta"], where=k("delta"), source=source)
            kk = conformal_pac_rank(alpha, delta, n)
            if kk == 0:
                raise PolicyError(
                    _too_few_pac_message(alpha, delta, n, k("n")) + f" Refit for {source}."
                )
            rule = f"the PAC rank for delta={delta!r}"
        if not _is_int(d["k"]) or d["k"] != kk:
            raise PolicyError(
                f"{k('k')} must be {rule} = {kk} for alpha={alpha!r}, n={n}; got "
                f"{d['k']!r}. The file was edited by hand or is corrupt; refit {source}."
            )
        thr = _check_number(d["threshold"], where=k("threshold"), source=source, error=PolicyError)
        return ConformalPolicy(alpha=alpha, n=n, k=kk, threshold=thr, delta=delta)

    sub = {
        "source": source,
        "members": members,
        "base_dir": base_dir,
        "state_override": None,
        "state_key": state_key,
        "nested": True,
    }
    fallback = _policy_from_dict(d["fallback"], where=k("fallback"), **sub)  # type: ignore[arg-type]
    if not isinstance(fallback, DirectPolicy | FrozenPolicy | ConformalPolicy):
        raise PolicyError(f"{k('fallback')} must be a direct, frozen or conformal policy.")
    if kind == "batch":
        min_batch = _check_int(d.get("min_batch", 2), where=k("min_batch"), source=source, low=2)
        return BatchPolicy(fallback=fallback, min_batch=min_batch)

    # situation
    window = _check_int(d["window"], where=k("window"), source=source, low=1)
    min_refs = _check_int(d["min_refs"], where=k("min_refs"), source=source, low=1, high=window)
    state_file = d.get("state_file")
    if state_file is not None and (not isinstance(state_file, str) or not state_file):
        raise PolicyError(
            f"{k('state_file')} must be a file path (string) or absent; got {state_file!r}. "
            f"Set it in {source}."
        )
    resolved: Path | None = None
    if state_override is not None:
        resolved = Path(state_override)
    elif state_file is not None:
        resolved = Path(state_file)
        if not resolved.is_absolute() and base_dir is not None:
            resolved = base_dir / resolved
    state = SituationState(window, resolved, key=state_key)
    return SituationPolicy(
        window=window, min_refs=min_refs, fallback=fallback, state_file=state_file, state=state
    )


def _state_key(bundle_id: str, prompt_hash: str, fusion: Avg2Fusion) -> str:
    blob = json.dumps([bundle_id, prompt_hash, fusion.to_dict()], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _plain(x: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, for ``yaml.safe_dump``."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _construct_mapping_no_dupes(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise PolicyError(
                f"duplicate key {key!r} at line {key_node.start_mark.line + 1}; each key may "
                "appear once. Remove one of them."
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_no_dupes
)


def _atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same folder, fsync, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
