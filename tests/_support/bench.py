"""The bench scripts (``bench/*.py``, not a package) loaded as modules."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from tests._support import REPO_ROOT


def load_bench(name: str, module: str | None = None) -> Any:
    """``bench/NAME.py`` as a module (the bench scripts are not a package), registered in
    ``sys.modules`` as ``module`` (default ``name``)."""
    path = REPO_ROOT / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module or name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
