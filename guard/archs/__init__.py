"""The runtime's member architectures: one module per Hugging Face ``model_type``.

Each module (``qwen3_5.py``, ``lfm2_vl.py``) holds its architecture's :class:`ArchSpec`
subclass and the registered instance ``SPEC``: the image grid, the numpy/Pillow preprocessing,
the image text of the prompt, the reasoning-off switches, the model's extra text inputs. This
package lists them (:data:`ARCHS`, in registration order); :func:`get_arch` looks one up.
Backends, prompts and members have no per-architecture branches.

The export side of an architecture (export config, cost model, mixed-precision roles, the
recorded real member) is its module of the same name in ``export/archs/``, which refers to the
``SPEC`` here. The runtime must not import ``export/`` (the robot has no torch), so an
architecture is two modules, one per room (docs/architecture.md). Adding one: its module here,
its module in ``export/archs/``, its name in both registries, and their tests
(tests/test_archs.py fails on a module that is not registered, or registered in one room only).
"""

from __future__ import annotations

from spotstop.guard._errors import ConfigError
from spotstop.guard.archs import lfm2_vl, qwen3_5
from spotstop.guard.archs._base import ArchSpec, ImageGeometry

__all__ = ["ARCHS", "ArchSpec", "ImageGeometry", "get_arch"]

#: model_type -> spec, in registration order
ARCHS: dict[str, ArchSpec] = {spec.model_type: spec for spec in (qwen3_5.SPEC, lfm2_vl.SPEC)}


def get_arch(model_type: str) -> ArchSpec:
    """The spec for ``model_type``; a clear error lists the supported ones."""
    try:
        return ARCHS[model_type]
    except KeyError:
        raise ConfigError(
            f"member architecture {model_type!r} is not supported; supported: "
            f"{sorted(ARCHS)}. Check config.json's model_type of the member folder."
        ) from None
