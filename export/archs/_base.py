"""What one member architecture's registry entry holds: :class:`Architecture`.

Everything the workstation knows about an architecture, in one object built by its module
``export/archs/<model_type>.py``: the runtime spec it shares with the robot (``guard/archs/``:
image grid, preprocessing, prompt text), the export config, the cost model, the roles of its
weights for the int4 mixed-precision rule, and the real members of the architecture whose
configs are recorded here (``spotstop cost --real``, ``jetson/memory_budget.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotstop.export.archs._cost_model import ArchCost
from spotstop.export.archs._export_config import ExportConfig
from spotstop.export.mixed import MixedRoles
from spotstop.guard.archs import ArchSpec

__all__ = ["Architecture", "RecordedMember"]


@dataclass(frozen=True)
class RecordedMember:
    """A real member of the architecture, as far as it is recorded here (no model hub needed).

    ``config``: its ``config.json`` values the cost model reads (RECORDED from the Hugging Face
    hub, ``hub_id``; not re-read here); ``settings``: the paper's resolution settings (seed 000,
    Supp. F.4) as vision passes, each (patch rows, patch columns) of one image or tile.
    """

    name: str
    hub_id: str
    config: Mapping[str, Any]
    settings: Mapping[str, list[tuple[int, int]]]


@dataclass(frozen=True)
class Architecture:
    """One member architecture: every part of it, registered once (export/archs/__init__.py)."""

    model_type: str
    #: what the robot needs without export (guard/archs/<model_type>.py)
    runtime: ArchSpec
    #: exporters, tolerances, graph patches, position ids, the tiny TEST member's recipe
    export_config: type[ExportConfig]
    #: FLOP and parameter formulas (export/cost.py)
    cost: ArchCost
    #: where its weights sit for the int4 mixed-precision rule (export/mixed.py)
    mixed_roles: MixedRoles
    #: the real members whose configs are recorded (may be empty)
    recorded: tuple[RecordedMember, ...] = ()

    def __post_init__(self) -> None:
        parts = {
            "runtime": self.runtime.model_type,
            "export_config": self.export_config.model_type,
            "cost": self.cost.model_type,
            **{f"recorded {m.name}": str(m.config.get("model_type")) for m in self.recorded},
        }
        wrong = {k: v for k, v in parts.items() if v != self.model_type}
        if wrong:
            raise ValueError(
                f"architecture {self.model_type!r}: parts of another model_type: {wrong}."
            )
