"""``direct``: threshold 0 on ONE member's raw score — the member's own direct answer.

The fused score is not used; the caveat is the model's own bias (seed 000, Sec. 3).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from spotstop.guard.policies._base import (
    BatchInputs,
    FitContext,
    LoadContext,
    Policy,
    PolicyError,
    Thresholds,
)

__all__ = ["DirectPolicy"]


@dataclass(frozen=True)
class DirectPolicy(Policy):
    """Threshold 0 on one member's raw score ``s_m``: UNSAFE when ``s_m ≥ 0``."""

    kind: ClassVar[str] = "direct"
    summary: ClassVar[str] = "threshold 0 on one member's raw score (its own direct answer)"
    member: str

    def __post_init__(self) -> None:
        if not isinstance(self.member, str) or not self.member:
            raise PolicyError(
                f"DirectPolicy.member must be a member name; got {self.member!r}. "
                "Name one of the fusion members."
            )

    @classmethod
    def keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("member",), ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], ctx: LoadContext) -> DirectPolicy:
        member = d["member"]
        if member not in ctx.members:
            hint = difflib.get_close_matches(str(member), ctx.members, n=1, cutoff=0.6)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise PolicyError(
                f"{ctx.key('member')} must be one of the fusion members {list(ctx.members)}; "
                f"got {member!r}.{suggestion} Set it in {ctx.source}."
            )
        return cls(member=member)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "member": self.member}

    def members_needed(self) -> tuple[str, ...]:
        return (self.member,)

    def thresholds(self, x: BatchInputs, state: Any) -> Thresholds:
        """Score: the member's raw score; threshold: 0."""
        return Thresholds.constant(
            x.members[self.member], 0.0, "direct", f"raw score of {self.member!r} vs 0"
        )

    @classmethod
    def fit(cls, ctx: FitContext) -> DirectPolicy:
        """The member named by the ``member`` setting (nothing is learned)."""
        member = ctx.setting("member", None)
        if member not in ctx.fusion.members:
            raise PolicyError(
                f"the direct policy needs the member setting, one of {list(ctx.fusion.members)}; "
                f"got {member!r}. Pass --member NAME."
            )
        return cls(member=str(member))
