"""The export configs by ``model_type``: the registry's view for the export (optimum-onnx style).

Each supported architecture has exactly one :class:`ExportConfig` subclass, in its module
``export/archs/<model_type>.py`` with the rest of what the workstation knows about it (cost
model, int4 roles, recorded real members); the base classes are in
``export/archs/_export_config.py``. This module lists the registered configs
(:data:`EXPORT_CONFIGS`, in registration order: the tiny TEST pair's member order) and looks one
up (:func:`get_export_config`). The runtime's counterpart of an architecture is its spec in
``guard/archs/<model_type>.py``; no other module branches on an architecture. The export tests
are parametrized over this registry and run on each architecture's tiny member, and
``tests/export/test_onnx.py`` fails when a registered architecture lacks a case.
(``Qwen35ExportConfig`` and ``Lfm2VlExportConfig`` are re-exported for their callers' import
path; a new architecture adds nothing here.)
"""

from __future__ import annotations

from spotstop.export.archs import ARCHITECTURES
from spotstop.export.archs._export_config import ExportConfig, MemberRecipe
from spotstop.export.archs.lfm2_vl import Lfm2VlExportConfig
from spotstop.export.archs.qwen3_5 import Qwen35ExportConfig
from spotstop.export.precision import PRECISION_SPECS

__all__ = [
    "EXPORT_CONFIGS",
    "PRECISIONS",
    "ExportConfig",
    "Lfm2VlExportConfig",
    "MemberRecipe",
    "Qwen35ExportConfig",
    "get_export_config",
]

#: Precisions an export can write, in order of decreasing size (export/precision.py's registry).
PRECISIONS: tuple[str, ...] = tuple(PRECISION_SPECS)

#: model_type -> its export config (export/archs/__init__.py's registry)
EXPORT_CONFIGS: dict[str, type[ExportConfig]] = {
    model_type: a.export_config for model_type, a in ARCHITECTURES.items()
}


def get_export_config(model_type: str) -> type[ExportConfig]:
    """The registered config of ``model_type``; the error lists the registered ones."""
    try:
        return EXPORT_CONFIGS[model_type]
    except KeyError:
        raise ValueError(
            f"no export config is registered for architecture {model_type!r}; registered: "
            f"{sorted(EXPORT_CONFIGS)}. Add export/archs/{model_type}.py (and "
            f"guard/archs/{model_type}.py)."
        ) from None
