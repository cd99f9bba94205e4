"""Folders replaced whole (export/_outdir.py): a bundle's, a world's.

The new folder is built beside the old one and swapped in by two renames; what may go wrong
between them, or around them, must leave the old folder in place and nothing else behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def _dead_pid() -> int:
    """The pid of a process that has ended (reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_staging_clears_what_killed_runs_left_and_puts_an_old_folder_back(tmp_path: Path) -> None:
    """A run killed outright (SIGKILL) left its ``.out.partial-PID`` behind, for good; one
    killed between swap_in's two renames left the user's folder moved aside as
    ``.out.old-PID``. The next staging beside ``out`` removes the first and puts the second
    back; a live process's folders, and names that are not ours, are left alone."""
    root, dead = tmp_path / "out", _dead_pid()
    for name in (f".out.partial-{dead}", f".out.old-{dead}", f".out.partial-{os.getppid()}",
                 ".out.partial-x", f".other.partial-{dead}"):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(name)
    work = staging(root)
    assert _tree(root) == {"a.txt": f".out.old-{dead}"}  # put back, not deleted
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            work.name,
            "out",
            f".out.partial-{os.getppid()}",
            ".out.partial-x",
            f".other.partial-{dead}",
        ]
    )
    (tmp_path / f".out.old-{dead}").mkdir()  # killed after both renames: out is the new one
    staging(root)
    assert _tree(root) == {"a.txt": f".out.old-{dead}"}
    assert not (tmp_path / f".out.old-{dead}").exists()


def test_a_sigterm_inside_leaves_the_folder_and_no_staging(tmp_path: Path) -> None:
    """SIGTERM's default action ended the process with the staging folder left behind (a
    `spotstop world` stopped by a service manager left `.out.partial-PID`). It is now raised
    as SystemExit(143) inside replaced_whole, whose clean-up runs."""
    root = tmp_path / "out"
    root.mkdir()
    (root / "a.txt").write_text("old")
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from spotstop.export._outdir import replaced_whole\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as from a shell (not inherited)\n"
        f"with replaced_whole(Path({str(tmp_path / 'first')!r})) as work:\n"
        "    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after\n"
        f"with replaced_whole(Path({str(root)!r})) as work:\n"
        "    (work / 'a.txt').write_text('new')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    signal.pause()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 143, done.stderr
    assert _tree(root) == {"a.txt": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "out"]
