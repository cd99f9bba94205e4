"""Output folders the export room writes: refused when they are files, or replaced whole.

A folder that a command replaces (a bundle, a world) is written into a staging folder beside
it and swapped in only when complete (:func:`replaced_whole`), so a failed or interrupted run
leaves the old folder as it was and no staging folder behind. Which folders may be replaced
is each writer's own rule (``check_bundle_out``, ``check_world_out``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["check_out_folder", "replaced_whole", "staging", "swap_in"]


def check_out_folder(out: str | os.PathLike[str], what: str = "the output") -> Path:
    """``out`` as a Path; ValueError when it exists and is not a folder (nothing is changed)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{what} {str(root)!r} is a file; give a folder.")
    return root


def _real(root: Path) -> Path:
    """``root`` with links resolved: the folder itself is replaced, never a link to it."""
    real = root.resolve()
    if not real.name:
        raise ValueError(f"{str(root)!r} is the file system's root; give a folder inside it.")
    return real


def staging(root: Path) -> Path:
    """A new, empty folder beside ``root`` (hidden, named for this process) to build in;
    :func:`swap_in` moves it to ``root`` once it is whole."""
    real = _real(root)
    work = real.with_name(f".{real.name}.partial-{os.getpid()}")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def swap_in(work: Path, root: Path) -> None:
    """Replace ``root`` by the finished folder ``work`` (two renames in one folder). Should the
    second rename fail, the old folder is put back."""
    real = _real(root)
    old = real.with_name(f".{real.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    had_old = real.exists()
    if had_old:
        os.replace(real, old)
    try:
        os.replace(work, real)
    except BaseException:
        if had_old:
            os.replace(old, real)
        raise
    if had_old:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def replaced_whole(root: Path) -> Iterator[Path]:
    """Yield a staging folder beside ``root``; on leaving the block it replaces ``root``, and
    on an error or Ctrl-C (KeyboardInterrupt) it is deleted and ``root`` is left as it was."""
    work = staging(root)
    try:
        yield work
        swap_in(work, root)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
