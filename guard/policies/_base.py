"""What every threshold policy is: its protocol, its inputs and outputs, and its errors.

A policy kind is a frozen dataclass deriving from :class:`Policy`, in its own module, listed
in the registry (:mod:`spotstop.guard.policies._registry`). It

* reads and writes its ``policy:`` section of ``policy.yaml`` (``from_dict`` / ``to_dict``,
  every key validated and named in messages);
* computes each scene's score and threshold for a batch as a PURE function of the batch's
  scores and an injected state (``thresholds``) — it never opens a file;
* for stateful kinds, returns the state after the batch (``update``); the guard owns that
  state and persists it, calibrate seeds it from the log (``seed_from_fit``);
* fits itself from a :class:`FitContext` (``fit``), so ``spotstop recalibrate --policy KIND``
  and ``spotstop policy init --kind KIND`` need no code of their own per kind.
* says what the guard scores for a batch (``scoring_plan``: a
  :class:`~spotstop.guard.policies.ScoringPlan`; every member on every scene unless the kind
  says otherwise), so the guard runs a plan and knows no kind;
* names, per scene, the kind whose threshold decided (``Thresholds.kind``, ``Verdict.kind``:
  the log's ``deciding_kind``).

The label itself is never decided here: :func:`~spotstop.guard.policies.decide_batch` applies
the one rule (:mod:`spotstop.guard.policies._rule`) to what ``thresholds`` returns.
"""

from __future__ import annotations

import difflib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from spotstop.guard._errors import ConfigError, GuardError
from spotstop.guard._fusion import Avg2Fusion
from spotstop.guard.policies._rule import Label
from spotstop.guard.validate import is_int, is_real

if TYPE_CHECKING:
    from spotstop.guard.policies._plan import ScoringPlan

__all__ = [
    "BatchInputs",
    "DecisionError",
    "FitContext",
    "LoadContext",
    "NotFittedError",
    "Policy",
    "PolicyError",
    "PolicyMismatchError",
    "SituationWindows",
    "Thresholds",
    "Verdict",
    "check_fallback",
]


class PolicyError(ConfigError):
    """A policy file, policy value or calibration set is invalid; the message names the key."""


class PolicyMismatchError(PolicyError):
    """A valid policy file that was fitted for another bundle or prompt."""


class DecisionError(GuardError, ValueError):
    """Inputs to :func:`decide_batch` do not fit together (lengths, a missing member)."""


class NotFittedError(GuardError, AttributeError):
    """A learned attribute (``threshold_``, ``k_``, ``n_``) was read before ``fit``."""


# ---------------------------------------------------------------------- inputs and outputs


@dataclass(frozen=True, eq=False)
class BatchInputs:
    """One batch as a policy sees it (built and checked by :func:`batch_inputs`).

    fused: ``S`` per scene under the policy file's reference fusion; NaN where a scene was
        not scored (such a scene is UNSAFE whatever the policy says).
    members: member name -> raw scene scores ``s_m`` (NaN where missing).
    situation_ids: one id or None per scene.
    fusion: the policy file's Avg-2 fusion (members, reference statistics, weights).
    members_text: member name -> request-only scores, when that pass ran (else None).
    ran: member name -> int8 per scene: whether the guard ran that member on the scene (what
        its scoring plan chose, logged as ``members_run``): 1 ran, 0 not, -1 not known for
        that scene; or None when not known for any (a fit, a what-if replay). Where it is not
        known, a kind whose plan leaves members out of some scenes works out again where it
        would have run them.
    """

    fused: np.ndarray
    members: Mapping[str, np.ndarray]
    situation_ids: tuple[str | None, ...]
    fusion: Avg2Fusion
    members_text: Mapping[str, np.ndarray] | None = None
    ran: Mapping[str, np.ndarray] | None = None

    @property
    def n(self) -> int:
        """Scenes in the batch."""
        return int(self.fused.shape[0])

    def subset(self, idx: np.ndarray) -> BatchInputs:
        """The scenes at positions ``idx`` (in that order)."""
        pick = np.asarray(idx, dtype=np.intp)
        return BatchInputs(
            fused=self.fused[pick],
            members={m: v[pick] for m, v in self.members.items()},
            situation_ids=tuple(self.situation_ids[i] for i in pick.tolist()),
            fusion=self.fusion,
            members_text=None
            if self.members_text is None
            else {m: v[pick] for m, v in self.members_text.items()},
            ran=None if self.ran is None else {m: v[pick] for m, v in self.ran.items()},
        )


@dataclass(frozen=True)
class Thresholds:
    """What a policy computes for a batch, before labelling (one entry per scene).

    score: the value each scene is compared with (``S`` for most kinds; a member's raw score
        for ``direct``; ``S`` refitted on the batch for ``batch``). threshold: each scene's
        threshold. rule: the rule that set it, for people (e.g. ``"situation->frozen"``).
        detail: why. kind: the kind whose threshold it is, per scene (``"frozen"`` for a
        situation that fell back to its frozen cut): the deciding kind the guard logs.
    """

    score: np.ndarray
    threshold: np.ndarray
    rule: tuple[str, ...]
    detail: tuple[str, ...]
    kind: tuple[str, ...]

    @classmethod
    def constant(cls, score: np.ndarray, threshold: float, kind: str, detail: str) -> Thresholds:
        """Every scene compared with the same threshold, set by ``kind`` itself (its rule is
        its name)."""
        n = int(np.asarray(score).shape[0])
        return cls(
            score=np.asarray(score, dtype=float),
            threshold=np.full(n, threshold, dtype=float),
            rule=(kind,) * n,
            detail=(detail,) * n,
            kind=(kind,) * n,
        )

    def prefixed(self, rule: str, why: str) -> Thresholds:
        """The same numbers, labelled as a fallback used by ``rule`` because ``why`` (the
        deciding kind stays the fallback's)."""
        return Thresholds(
            score=self.score,
            threshold=self.threshold,
            rule=tuple(f"{rule}->{r}" for r in self.rule),
            detail=tuple(f"{why}: {d}" for d in self.detail),
            kind=self.kind,
        )


@dataclass(frozen=True)
class Verdict:
    """The label of one scene.

    label: ``"UNSAFE"`` when ``score ≥ threshold``, when either is not finite or when a
    member score the policy needs is missing, else ``"SAFE"``.
    score: the value compared with the threshold (NaN kept). threshold: the threshold applied
    to this scene (NaN kept). policy: the rule that set it, for people, e.g. ``"batch"`` or
    ``"situation->frozen"`` (configured kind, then the fallback actually used). detail: why.
    fail_closed: the label is UNSAFE because something was missing or not finite, not by
    the comparison (the guard logs such a decision as failed closed). kind: the kind whose
    threshold decided (``"frozen"`` for ``"situation->frozen"``; a cascade's cut), logged as
    ``deciding_kind``; readers use it, never the rule's text.
    """

    label: Label
    score: float
    threshold: float
    policy: str
    detail: str
    fail_closed: bool = False
    kind: str = ""


@dataclass(frozen=True)
class SituationWindows:
    """Per-situation windows of recent unlabelled fused scores: the ``situation`` kind's state.

    An immutable value: :meth:`appended` returns a new one. ``window`` scores are kept per
    situation (older ones drop out); only finite scores are stored.
    """

    window: int
    situations: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def references(self, situation_id: str) -> tuple[float, ...]:
        """The stored scores of one situation, oldest first."""
        return tuple(self.situations.get(situation_id, ()))

    def appended(self, items: Iterable[tuple[str, float]]) -> SituationWindows:
        """A copy with ``(situation_id, score)`` pairs appended in order (finite scores only)."""
        out = {s: list(v) for s, v in self.situations.items()}
        for sid, score in items:
            if math.isfinite(score):
                out.setdefault(sid, []).append(float(score))
        return SituationWindows(self.window, {s: tuple(v[-self.window :]) for s, v in out.items()})

    def to_dict(self) -> dict[str, list[float]]:
        """situation id -> scores (oldest first), for JSON/YAML."""
        return {s: list(v) for s, v in sorted(self.situations.items())}

    @classmethod
    def from_dict(
        cls, d: Any, *, window: int, where: str, source: str, error: type[Exception] = PolicyError
    ) -> SituationWindows:
        """Validate ``{situation id: [finite scores]}``; longer lists keep the most recent."""
        if not isinstance(d, Mapping):
            raise error(
                f"{where} must map situation ids to lists of scores; got {type(d).__name__}. "
                f"Fix it in {source}."
            )
        out: dict[str, tuple[float, ...]] = {}
        for sid, scores in d.items():
            if not isinstance(sid, str) or not sid:
                raise error(f"{where} keys must be situation ids (strings); got {sid!r}.")
            if not isinstance(scores, list) or not all(
                is_real(s) and math.isfinite(s) for s in scores
            ):
                raise error(
                    f"{where}[{sid!r}] must be a list of finite numbers; got {scores!r}. "
                    f"Fix it in {source}."
                )
            out[sid] = tuple(float(s) for s in scores[-window:])
        return cls(window, out)


# ---------------------------------------------------------------------- contexts


@dataclass(frozen=True)
class LoadContext:
    """What a kind needs to read its YAML section: where it is, and the fusion members.

    source: how to name the file in messages ("Set it in <source>"). where: the key path of
    the section (``policy`` or ``policy.fallback``). members: the fusion's member names.
    parse_fallback: reads a nested fallback section (single-scene kinds only).
    """

    source: str
    where: str
    members: tuple[str, ...]
    parse_fallback: Callable[[Any, str], Policy]

    def key(self, name: str) -> str:
        """The dotted path of one key of this section."""
        return f"{self.where}.{name}" if self.where else name

    def number(self, d: Mapping[str, Any], name: str) -> float:
        x = d[name]
        if not is_real(x) or not math.isfinite(x):
            raise PolicyError(
                f"{self.key(name)} must be a finite number; got {x!r}. Set it in {self.source}."
            )
        return float(x)

    def integer(
        self,
        d: Mapping[str, Any],
        name: str,
        *,
        low: int,
        high: int | None = None,
        default: Any = None,
    ) -> int:
        x = d.get(name, default)
        ok = is_int(x) and x >= low and (high is None or x <= high)
        if not ok:
            allowed = f"an integer ≥ {low}" if high is None else f"an integer in [{low}, {high}]"
            raise PolicyError(
                f"{self.key(name)} must be {allowed}; got {x!r}. Set it in {self.source}."
            )
        return int(x)

    def choice(self, d: Mapping[str, Any], name: str, allowed: Sequence[str], default: str) -> str:
        x = d.get(name, default)
        if x not in allowed:
            hint = difflib.get_close_matches(str(x), allowed, n=1, cutoff=0.6)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise PolicyError(
                f"{self.key(name)} must be one of {', '.join(allowed)}; got {x!r}.{suggestion} "
                f"Set it in {self.source}."
            )
        return str(x)


@dataclass(frozen=True, eq=False)
class FitContext:
    """What calibrate hands a kind's :meth:`Policy.fit`: fitted pieces, the data, settings.

    fusion: the fusion the new policy will carry. frozen_t0: the frozen cut (mean fused score
    of the pool). fused: ``S`` under ``fusion`` per usable decision, in log order. label: 1
    unsafe, 0 safe, -1 unlabelled. situation_id: str per decision ("" for none), as the
    statistics group them (a labels file may regroup the log's ids: conformal's one case per
    situation). member_scores / member_text: raw scores per member (text: None if not logged).
    settings: the user's settings by name (alpha, delta, guarantee, cluster_rule, window,
    min_refs, min_batch, weights, ...); ``None`` means "not given" (use the current policy's
    value, else the kind's default). current: the active policy, or None. rng: a Generator.
    guard_situation_id: str per decision ("" for none), the ids the guard was given and keys
    its situation windows by (the logged ones); None when they are ``situation_id``. What
    shapes the windows (their seed, the situation prior κ, a cascade's band) reads
    :attr:`window_ids`.
    """

    fusion: Avg2Fusion
    frozen_t0: float
    fused: np.ndarray
    label: np.ndarray
    situation_id: np.ndarray
    member_scores: Mapping[str, np.ndarray]
    member_text: Mapping[str, np.ndarray] | None
    settings: Mapping[str, Any]
    current: Policy | None
    rng: np.random.Generator
    guard_situation_id: np.ndarray | None = None

    @property
    def window_ids(self) -> np.ndarray:
        """The situation ids the guard keys its windows by (``guard_situation_id``, else
        ``situation_id``)."""
        return self.situation_id if self.guard_situation_id is None else self.guard_situation_id

    def setting(self, name: str, default: Any) -> Any:
        """The user's value, else the current policy's attribute of that name, else default."""
        v = self.settings.get(name)
        if v is not None:
            return v
        cur = getattr(self.current, name, None)
        return cur if cur is not None else default


# ---------------------------------------------------------------------- the protocol


class Policy(ABC):
    """A threshold policy kind (see the module docstring). Subclasses are frozen dataclasses.

    Class attributes: ``kind`` (its name in ``policy.yaml``), ``summary`` (one line for
    ``--help``), ``label_free`` (fitted without labels), ``single_scene`` (labels a scene on
    its own, so it may serve as a fallback), ``stateful`` (keeps state between batches).
    """

    kind: ClassVar[str]
    summary: ClassVar[str]
    label_free: ClassVar[bool] = True
    single_scene: ClassVar[bool] = True
    stateful: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> Policy:
        """Build from the validated keys of its ``policy:`` section (``kind`` already checked)."""

    @classmethod
    @abstractmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional) keys of its YAML section, besides ``kind``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Its ``policy:`` section of ``policy.yaml``."""

    @abstractmethod
    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score and threshold per scene; pure (no I/O, no mutation of ``state``)."""

    @classmethod
    @abstractmethod
    def fit(cls, ctx: FitContext) -> Policy:
        """The policy fitted from calibrate's context (raises :class:`PolicyError` if it cannot)."""

    def initial_state(self, seed: Any) -> Any:
        """The state before the first batch, from a fitted seed (None: stateless)."""
        return None

    def update(self, state: Any, x: BatchInputs) -> Any:
        """The state after a batch (called after ``thresholds``; stateless kinds return it)."""
        return state

    def seed_from_fit(self, ctx: FitContext) -> Any:
        """The fitted starting state for ``policy.yaml``'s ``state_seed`` (None: none)."""
        return None

    def seed_to_dict(self, seed: Any) -> Any:
        """``state_seed`` as plain YAML values."""
        return None

    def seed_from_dict(self, d: Any, ctx: LoadContext) -> Any:
        """Validate a ``state_seed`` section; stateless kinds refuse one."""
        raise PolicyError(
            f"state_seed is only for stateful policies; policy kind {self.kind!r} keeps no "
            f"state. Remove state_seed from {ctx.source}."
        )

    def members_needed(self) -> tuple[str, ...]:
        """Members whose raw scores must be finite for this policy to score a scene."""
        return ()

    def complete(self, x: BatchInputs, state: Any) -> np.ndarray:
        """True where a scene has every score this kind decides it on; elsewhere
        :func:`~spotstop.guard.policies.decide_batch` labels it UNSAFE (fail closed), whatever
        its score and threshold say. Default: the fused ``S`` is finite, i.e. every fusion
        member scored the scene (a ``direct`` policy reads one member, but a scene another
        member failed on is missing a part). A kind whose scoring plan leaves members out of
        some scenes (``cascade``) says which scores it needed."""
        return np.isfinite(x.fused)

    def variants_needed(self) -> tuple[str, ...]:
        """Extra scoring passes this policy reads (e.g. ``"text"``); the guard runs them."""
        return ()

    def scoring_plan(
        self,
        members: Sequence[str],
        fusion: Avg2Fusion,
        situation_ids: Sequence[str | None],
        state: Any,
    ) -> ScoringPlan:
        """What the guard scores for a batch (:class:`~spotstop.guard.policies.ScoringPlan`):
        ``members`` are the members the guard runs, ``situation_ids`` the batch's scenes and
        ``state`` the policy's state before the batch. Default: every member on every scene.
        A kind that needs fewer scores (``cascade``) returns its own stages; the guard runs
        whatever plan it gets and has no branch per kind."""
        from spotstop.guard.policies._plan import ScoringPlan

        return ScoringPlan.every_member(members)

    def inner(self) -> tuple[Policy, ...]:
        """The policies this one decides some scenes with (a fallback, a cascade's cut); the
        logged rule of such a scene ends with the inner kind (``"situation->conformal"``)."""
        return ()

    def describe(self) -> str:
        """One line: the kind and its settings."""
        return ", ".join(f"{k}={v}" for k, v in self.to_dict().items())


def check_fallback(fallback: Any, owner: str) -> None:
    """A fallback must be a policy that labels one scene on its own."""
    if not isinstance(fallback, Policy) or not fallback.single_scene:
        raise PolicyError(
            f"{owner}.fallback must be a policy that labels one scene on its own (direct, "
            f"frozen or conformal); got {type(fallback).__name__}."
        )
