"""What a policy asks the guard to score for a batch: a :class:`ScoringPlan`.

A policy decides on scores; which scores exist is its to say, not the guard's. Before a batch
is scored the guard asks the policy in force for its plan
(:meth:`~spotstop.guard.policies.Policy.scoring_plan`, built from the state before the batch)
and runs it: the stages in order, each stage's members on the scenes the stage keeps, one
batch per member and pass. Most kinds score every member on every scene (one stage:
:meth:`ScoringPlan.every_member`); ``cascade`` scores its first member on every scene and the
others only inside its band (two stages, the second with a :attr:`ScoringStage.where`).

The plan says what is scored, never how a scene is labelled: that stays the policy's
``thresholds`` and the one rule (:mod:`._rule`). A scene a stage did not score has no score
for that stage's members, so a policy that needs one labels the scene UNSAFE
(:meth:`~spotstop.guard.policies.Policy.complete`). A plan that cannot run (it names a member
twice or one the guard does not have, or its ``where`` fails) fails every scene of the batch
closed; the guard says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from spotstop.guard.policies._base import PolicyError

__all__ = ["ScoringPlan", "ScoringStage", "StageFilter"]

#: A stage's choice of scenes: the scene scores of the stages before it (member name -> one
#: score per scene of the batch, NaN where the member did not score the scene or failed) ->
#: True where this stage scores the scene.
StageFilter = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True, eq=False)
class ScoringStage:
    """One stage of a plan: ``members`` (in order), on the scenes ``where`` keeps.

    where: None (every scene of the batch) or a :data:`StageFilter`, called with the scene
    scores of the stages before; a scene it does not keep is not scored by this stage's
    members (they are logged as not run on it, ``members_run``).
    """

    members: tuple[str, ...]
    where: StageFilter | None = None

    def __post_init__(self) -> None:
        names = tuple(self.members)
        if not names or not all(isinstance(m, str) and m for m in names):
            raise PolicyError(
                f"ScoringStage.members must be one or more member names; got {self.members!r}."
            )
        object.__setattr__(self, "members", names)


@dataclass(frozen=True, eq=False)
class ScoringPlan:
    """The stages the guard runs for a batch, in order (see the module docstring).

    Each member is named by at most one stage; the first stage has no ``where`` (a scene
    every stage left out would have no score at all).
    """

    stages: tuple[ScoringStage, ...]

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        if not stages or not all(isinstance(s, ScoringStage) for s in stages):
            raise PolicyError(
                f"ScoringPlan.stages must be one or more ScoringStage; got {self.stages!r}."
            )
        if stages[0].where is not None:
            raise PolicyError("ScoringPlan: the first stage scores every scene (where=None).")
        named = [m for s in stages for m in s.members]
        twice = sorted({m for m in named if named.count(m) > 1})
        if twice:
            raise PolicyError(f"ScoringPlan names member(s) {twice} in more than one stage.")
        object.__setattr__(self, "stages", stages)

    @classmethod
    def every_member(cls, members: Iterable[str]) -> ScoringPlan:
        """One stage: every member on every scene (the plan of most kinds)."""
        return cls((ScoringStage(tuple(members)),))

    @property
    def members(self) -> tuple[str, ...]:
        """Every member the plan scores, in the order it scores them."""
        return tuple(m for s in self.stages for m in s.members)

    @property
    def staged(self) -> bool:
        """Whether some stage scores only some scenes."""
        return any(s.where is not None for s in self.stages)

    def check(self, members: Iterable[str]) -> None:
        """Raise :class:`PolicyError` when the plan names a member not in ``members`` (the
        members the guard can run)."""
        have = tuple(members)
        unknown = [m for m in self.members if m not in have]
        if unknown:
            raise PolicyError(
                f"the scoring plan names member(s) {unknown} the guard does not have; it has "
                f"{list(have)}."
            )
