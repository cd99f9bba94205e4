"""Lazy public names for the diagnostics packages: ``spotstop card --help`` on the base install.

``spotstop.diagnostics`` re-exports names from modules that need scipy and matplotlib (the
``diag`` extra). Importing them when the package is imported made every diagnostics command,
``--help`` included, fail on the robot's base install with an install hint. The package's
``__init__`` now lists its public names in an ``if TYPE_CHECKING:`` block of plain
``from spotstop.diagnostics._x import a, b`` lines (what mypy and readers see) and calls
:func:`attach`, which reads that block once from the ``__init__``'s own source and imports a
name's module on first use (PEP 562 ``__getattr__``), as scientific-python's ``lazy_loader``
does from a stub. One list, read by both.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["attach", "exported_names"]


def exported_names(init_file: str | Path) -> dict[str, str]:
    """Name -> module of every ``from M import name`` inside the ``if TYPE_CHECKING:`` blocks
    of ``init_file``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            if isinstance(imp, ast.ImportFrom) and imp.module and imp.level == 0:
                for alias in imp.names:
                    out[alias.asname or alias.name] = imp.module
    return out


def attach(
    package: str, init_file: str | Path
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` from its ``TYPE_CHECKING`` block."""
    table = exported_names(init_file)
    if not table:
        raise ImportError(f"{package}: no names in an `if TYPE_CHECKING:` block of {init_file}")

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)  # the next lookup is direct
        return value

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__
