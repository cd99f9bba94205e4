"""Writing a file so that a reader never sees half of it: temp file, fsync, ``os.replace``."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir"]


#: the mode of a file written anew (a temp file is made 0600): readable by the service user a
#: sidecar may run as, as a file written with ``open`` under the usual umask 022 would be
NEW_FILE_MODE = 0o644


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` via a temp file in the same folder, fsync, then ``os.replace``, then
    fsync the folder.

    A crash leaves either the old file or the new one, never a mix; the folder is created.
    The file keeps the mode of the one it replaces (:data:`NEW_FILE_MODE` when new): a
    ``policy.yaml`` activated by an operator stays readable by the sidecar's own user.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # a folder some file systems cannot fsync
        fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """fsync a folder, so that a file created or renamed in it survives a power cut."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
