"""The house: one import name (``spotstop``) over top-level room folders.

The rooms and the CLI (the composition root) stay top-level folders (DESIGN.md) and install as
``spotstop.<room>`` through a package-dir mapping in pyproject.toml. These tests keep that mapping, the mypy link tree and
the sources in step, so that a new package folder cannot be left out of the wheel and an old
top-level import name cannot creep back in.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("guard", "calibrate", "diagnostics", "export", "cli")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _package_folders() -> dict[str, Path]:
    """Installed name -> folder, for every folder with an ``__init__.py`` under a mapped root."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            parts = [p for p in rel.parts if p]
            if any(p.startswith((".", "__")) for p in parts):
                continue
            out[".".join([name, *parts])] = init.parent
    return out


def _sources() -> list[Path]:
    files: list[Path] = []
    for room in (*ROOMS, "tests", "bench", "jetson"):
        for p in (ROOT / room).rglob("*.py"):
            if "typecheck" in p.relative_to(ROOT).parts:
                continue
            files.append(p)
    return files


def test_every_package_folder_is_in_the_wheel() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set(_package_folders())
    assert found - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert listed - found == set(), "[tool.setuptools] packages lists folders that do not exist"


def test_rooms_map_to_spotstop_names() -> None:
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for room in ROOMS:
        assert mapping[f"spotstop.{room}"] == room
    assert all(k.startswith("spotstop.") for k in mapping)


def test_mypy_link_tree_covers_every_mapped_root() -> None:
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    tree = ROOT / PYPROJECT["tool"]["mypy"]["mypy_path"] / "spotstop"
    for name, folder in mapping.items():
        link = tree / name.split(".", 1)[1]
        assert link.is_symlink(), f"{link} must be a symlink to ../../../{folder}"
        assert link.resolve() == (ROOT / folder).resolve()


_OLD_IMPORT = re.compile(rf"^\s*(from|import)\s+({'|'.join(ROOMS)})(\.|\s|$)", re.M)
_OLD_STRING = re.compile(rf"[\"']({'|'.join(ROOMS)})\.(_\w+|backends|serve|client|cli)\b")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_old_top_level_import_names(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    hits = [m.group(0).strip() for m in _OLD_IMPORT.finditer(text)]
    hits += [m.group(0) for m in _OLD_STRING.finditer(text)]
    assert not hits, f"{path.relative_to(ROOT)} uses old top-level names: {hits[:3]}"


def test_imports_parse() -> None:
    """Every source parses (the scan above reads text; this catches a broken rewrite)."""
    for p in _sources():
        ast.parse(p.read_text(encoding="utf-8"), filename=str(p))


def test_the_console_script_is_the_composition_root() -> None:
    assert PYPROJECT["project"]["scripts"] == {"spotstop": "spotstop.cli:main"}


#: the one module that reads and writes YAML (``load_yaml``, ``dump_yaml``)
_YAML_HOME = ROOT / "guard" / "validate.py"


@pytest.mark.parametrize(
    "path",
    [p for p in _sources() if p.relative_to(ROOT).parts[0] != "tests" and p != _YAML_HOME],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_yaml_is_read_and_written_in_one_place(path: Path) -> None:
    """PyYAML's own functions read YAML 1.1 (``1:30`` is 90, ``no`` is False, ``012`` is 10)
    and keep the last of a key given twice; only guard/validate.py may import yaml, and every
    other module reads and writes through its ``load_yaml`` and ``dump_yaml``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits += [a.name for a in node.names if a.name.split(".")[0] == "yaml"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "yaml":
            hits.append(str(node.module))
    assert not hits, (
        f"{path.relative_to(ROOT)} imports {hits}: read YAML with "
        "spotstop.guard.validate.load_yaml and write it with dump_yaml"
    )
