"""Output folders the export room writes: refused when they are files, or replaced whole.

A folder that a command replaces (a bundle, a world) is written into a staging folder beside
it and swapped in only when complete (:func:`replaced_whole`), so a failed or interrupted run
(an error, Ctrl-C, or a SIGTERM, which is raised as ``SystemExit(143)`` there) leaves the old
folder as it was and no staging folder behind. A run killed outright (SIGKILL, a power cut)
cannot clean up: the next :func:`staging` beside the same folder removes the staging folders
of processes that are gone, and puts back an old folder such a process had moved aside. Which
folders may be replaced is each writer's own rule (``check_bundle_out``, ``check_world_out``).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import threading
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


def _gone(pid_text: str) -> bool:
    """Whether the process of a leftover's pid suffix has ended (not a pid: not ours, kept)."""
    if not pid_text.isdigit() or int(pid_text) in (0, os.getpid()):
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive under another user (EPERM), or not ours to judge
        return False
    return False


def _clear_leftovers(real: Path) -> None:
    """Remove what killed runs left beside ``real``: their staging folders; and an old folder
    moved aside is put back when ``real`` is missing (killed between the two renames of
    :func:`swap_in`), else removed (killed after them)."""
    if not real.parent.is_dir():
        return
    stem = glob.escape(f".{real.name}")
    for kind in ("partial", "old"):
        for p in sorted(real.parent.glob(f"{stem}.{kind}-*")):
            if not (p.is_dir() and not p.is_symlink() and _gone(p.name.rsplit("-", 1)[1])):
                continue
            if kind == "old" and not real.exists():
                os.replace(p, real)
            else:
                shutil.rmtree(p, ignore_errors=True)


def staging(root: Path) -> Path:
    """A new, empty folder beside ``root`` (hidden, named for this process) to build in;
    :func:`swap_in` moves it to ``root`` once it is whole. What killed runs left beside
    ``root`` is cleared first (see the module doc)."""
    real = _real(root)
    _clear_leftovers(real)
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
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` (128 + 15, the exit status a terminated process
    has) for the length of the block, so its clean-up runs; only in the main thread and where
    SIGTERM still has its default action (a caller's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def replaced_whole(root: Path) -> Iterator[Path]:
    """Yield a staging folder beside ``root``; on leaving the block it replaces ``root``, and
    on an error, Ctrl-C (KeyboardInterrupt) or SIGTERM it is deleted and ``root`` is left as
    it was."""
    with _sigterm_raises():
        work = staging(root)
        try:
            yield work
            swap_in(work, root)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
