"""The member architectures on the workstation: one module per Hugging Face ``model_type``.

Each module (``qwen3_5.py``, ``lfm2_vl.py``) holds everything the export side knows about its
architecture and builds one :class:`Architecture` entry, ``ARCH``: the runtime spec (from the
module of the same name in ``guard/archs/``), the export config, the cost model, the roles of
its weights for the int4 mixed-precision rule, and the recorded configs of its real members.
This package registers them (:data:`ARCHITECTURES`, in registration order: the tiny TEST
pair's member order); ``export/configs.py``, ``export/cost.py`` and ``export/mixed.py`` read
their parts from here, and no other module branches on an architecture.

The runtime must not import ``export/`` (the robot has no torch), so an architecture is two
modules, one per room. Adding one: its module in ``guard/archs/``, its module here, its name in
both registries, and their tests (tests/test_archs.py checks that every registered
architecture has every part, that every module is registered, and that no other module names
a model type).
"""

from __future__ import annotations

from typing import Any

from spotstop.export.archs import lfm2_vl, qwen3_5
from spotstop.export.archs._base import Architecture, RecordedMember

__all__ = [
    "ARCHITECTURES",
    "REAL_PAIR",
    "REAL_SETTINGS",
    "Architecture",
    "RecordedMember",
    "get_architecture",
]

#: model_type -> its entry, in registration order
ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (qwen3_5.ARCH, lfm2_vl.ARCH)}


def get_architecture(model_type: str) -> Architecture:
    """The registered entry of ``model_type``; the error lists the registered ones."""
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise ValueError(
            f"no member architecture {model_type!r} is registered; registered: "
            f"{sorted(ARCHITECTURES)}. Add export/archs/{model_type}.py (and "
            f"guard/archs/{model_type}.py)."
        ) from None


#: the real pair: every recorded member's config, by name (``spotstop cost --real`` and
#: ``jetson/memory_budget.py`` read them)
REAL_PAIR: dict[str, dict[str, Any]] = {
    m.name: dict(m.config) for a in ARCHITECTURES.values() for m in a.recorded
}


def _settings() -> dict[str, dict[str, list[tuple[int, int]]]]:
    out: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for a in ARCHITECTURES.values():
        for m in a.recorded:
            for setting, passes in m.settings.items():
                out.setdefault(setting, {})[m.name] = list(passes)
    return out


#: the paper's resolution settings of the real pair (seed 000, Supp. F.4), as vision passes
#: per member: setting -> member name -> (patch rows, patch columns) of each image or tile
REAL_SETTINGS: dict[str, dict[str, list[tuple[int, int]]]] = _settings()
