"""The house's import rules (DESIGN.md, "may import"), checked on every import statement.

Every ``import`` and ``from ... import`` at any depth (module level, inside functions, under
``TYPE_CHECKING``) and every ``importlib.import_module("...")`` with a literal name counts:
a lazy import is still an import. The runtime on the robot (``guard/``) imports no other room,
so its commands run on the base install; the offline rooms and the workstation room build on
the runtime only; the CLI, the composition root, may import every room.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: room -> the other rooms it may import (DESIGN.md's table; the CLI is the composition root)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "guard": frozenset(),
    "calibrate": frozenset({"guard"}),
    "diagnostics": frozenset({"guard"}),
    "export": frozenset({"guard"}),
    "cli": frozenset({"guard", "calibrate", "diagnostics", "export"}),
}

#: one module -> the further rooms it alone may import (docs/architecture.md, "Import rules")
MODULE_MAY_IMPORT: dict[str, frozenset[str]] = {
    # the test pair's trainer sizes its SAFE lean with the card's own Spot-Stop statistic
    "export/train.py": frozenset({"diagnostics"}),
}


def _room_of(module: str) -> str | None:
    """``spotstop.<room>...`` -> room; anything else (a library) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "spotstop" else None


def _imported(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``; ``package`` resolves relative imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append(
                    (node.lineno, ".".join([*base, *([node.module] if node.module else [])]))
                )
            elif node.module:
                found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _sources(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def _violations(room: str) -> list[str]:
    bad = []
    for path in _sources(room):
        rel = path.relative_to(ROOT)
        package = ".".join(["spotstop", *rel.parent.parts])
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        extra = MODULE_MAY_IMPORT.get(rel.as_posix(), frozenset())
        for line, module in _imported(tree, package):
            other = _room_of(module)
            if other is not None and other != room and other not in MAY_IMPORT[room] | extra:
                bad.append(f"{rel}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("room", list(MAY_IMPORT))
def test_each_room_imports_only_what_design_allows(room: str) -> None:
    assert _sources(room), f"{room}/ holds no Python file"
    bad = _violations(room)
    allowed = ", ".join(sorted(MAY_IMPORT[room])) or "no other room"
    assert not bad, f"{room}/ may import {allowed}:\n" + "\n".join(bad)


def test_each_module_exception_names_an_existing_module_that_uses_it() -> None:
    """An exception that no longer serves (its module gone, or no longer importing the room)
    is removed, not left to widen the rule."""
    for rel, rooms in MODULE_MAY_IMPORT.items():
        path = ROOT / rel
        assert path.is_file(), rel
        package = ".".join(["spotstop", *Path(rel).parent.parts])
        used = {_room_of(m) for _, m in _imported(ast.parse(path.read_text("utf-8")), package)}
        assert rooms <= used, f"{rel} no longer imports {sorted(rooms - used)}"


def test_every_mapped_folder_has_a_rule() -> None:
    import tomllib

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-dir"]
    assert {name.split(".", 1)[1] for name in mapping} == set(MAY_IMPORT)


def test_the_scan_sees_lazy_relative_and_dynamic_imports() -> None:
    code = """
def f():
    from spotstop.export.tiny import build_tiny_pair
    import spotstop.calibrate
    from . import _x
    from .._y import z
    importlib.import_module("spotstop.diagnostics._cli")
"""
    got = [m for _, m in _imported(ast.parse(code), "spotstop.guard.backends")]
    assert got == [
        "spotstop.export.tiny",
        "spotstop.calibrate",
        "spotstop.guard.backends",
        "spotstop.guard._y",
        "spotstop.diagnostics._cli",
    ]
