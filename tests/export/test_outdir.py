"""Folders replaced whole (export/_outdir.py): a bundle's, a world's.

The new folder is built beside the old one and swapped in by two renames; what may go wrong
between them, or around them, must leave the old folder in place and nothing else behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spotstop.export import _outdir
from spotstop.export._outdir import replaced_whole, staging, swap_in


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_a_failed_second_rename_puts_the_old_folder_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "a.txt").write_text("old")
    work = staging(root)
    (work / "a.txt").write_text("new")
    calls = []
    real = os.replace

    def second_fails(src: Path, dst: Path) -> None:
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(_outdir.os, "replace", second_fails)
    with pytest.raises(KeyboardInterrupt):
        swap_in(work, root)
    monkeypatch.undo()
    assert _tree(root) == {"a.txt": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".out.partial-{os.getpid()}", "out"]


def test_a_link_to_the_folder_stays_a_link_and_the_folder_is_replaced(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.txt").write_text("old")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with replaced_whole(link) as work:
        (work / "b.txt").write_text("new")
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert _tree(real) == {"b.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_an_error_inside_leaves_the_folder_and_no_staging(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="midway"), replaced_whole(root) as work:
        (work / "a.txt").write_text("half")
        raise RuntimeError("midway")
    assert _tree(root) == {"a.txt": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
