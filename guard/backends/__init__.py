"""Scoring backends, in a registry with lazy imports.

A backend turns prompt token ids and preprocessed pixels into member scores under a
:class:`spotstop.guard._prompt.ScorePlan`. Importing this package imports no backend library; a
backend's library is imported when the backend is first asked for, and a missing library
gives an install hint instead of an ImportError deep in a stack.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from spotstop.guard._errors import BackendUnavailableError, ConfigError
from spotstop.guard._prompt import ScorePlan

__all__ = ["BACKENDS", "Backend", "get_backend_class"]


class Backend(Protocol):
    """What a member's scoring backend does."""

    name: str

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> np.ndarray:
        """Scores (float64, one per prompt) for prompts with images (``pixels``) or without."""
        ...


#: name → (module, class, what to install when its import fails)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "torch": ("spotstop.guard.backends._torch", "TorchBackend", "pip install 'spotstop[export]'"),
    "onnx": (
        "spotstop.guard.backends._onnx",
        "OnnxBackend",
        "pip install onnxruntime (or onnxruntime-gpu)",
    ),
    "tensorrt": (
        "spotstop.guard.backends._trt",
        "TensorRTBackend",
        "pip install 'spotstop[gpu]' (tensorrt>=10 and cuda-python; on a Jetson, JetPack's "
        "python3-libnvinfer and pip install cuda-python)",
    ),
}


def get_backend_class(name: str) -> Any:
    """The backend class registered as ``name``, importing its module now."""
    try:
        module, cls, hint = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"backend must be one of {sorted(BACKENDS)}; got {name!r}.") from None
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise BackendUnavailableError(
            f"the {name!r} backend needs a library that is not installed ({e.name or e}); "
            f"install it with: {hint}"
        ) from e
