"""The member architectures' runtime specs: an import path kept for its callers.

The specs live one per module in ``guard/archs/`` (``qwen3_5.py``, ``lfm2_vl.py``; the base in
``guard/archs/_base.py``), and ``guard/archs/__init__.py`` registers them; this module
re-exports the registry (``from spotstop.guard._arch import get_arch`` keeps working).
"""

from __future__ import annotations

from spotstop.guard.archs import ARCHS, ArchSpec, ImageGeometry, get_arch

__all__ = ["ARCHS", "ArchSpec", "ImageGeometry", "get_arch"]
