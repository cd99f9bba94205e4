"""The journal: where decisions wait, on disk, while the decision log cannot take them.

When the log cannot be written (a full disk, a read-only file system, a lock held too long)
the guard still answers every scene (fail-closed UNSAFE) and keeps the rows it could not
write. It holds them in memory up to a stated bound, then *spills* them here: an append-only
file in a second place (by default ``$XDG_STATE_HOME/spotstop/journal/``, or wherever the
robot's config names it; put it on another file system than the log). The log imports the
journal as soon as it can write again, and on the next start.

Format: one line per entry, ``<sha256 of the JSON> <JSON>\\n``; an entry is a batch of rows
(``{"v": 1, "kind": "rows", "rows": [...], "policy": {...}, "images": [...]}``, each row the
log's own SQL row, so NaN and infinities survive) or a pending amendment (``"kind": "amend"``:
decision ids and the fail-closed reason). Every append is one ``write`` followed by
``fsync``; the file is locked (``flock``) while it is written, read or truncated, so two
processes may share it. A line whose hash does not match (a write cut short by a crash) is
moved to ``<journal>.rejected`` and reported, never imported and never silently dropped.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from spotstop.guard._files import fsync_dir
from spotstop.guard._log_schema import COLUMNS, LogError, PolicyRow, fault_kind
from spotstop.guard._record import DecisionRecord, record_from_row, record_to_row

__all__ = ["Journal", "JournalEntry", "JournalRead", "default_journal_path"]

_VERSION: Final = 1


def default_journal_path(log_path: Path) -> Path:
    """The journal of the log at ``log_path`` when none is configured.

    ``$XDG_STATE_HOME/spotstop/journal/<log name>-<hash of its absolute path>.journal``
    (``~/.local/state`` when the variable is unset): state that must survive a reboot, kept
    apart from the log's folder.
    """
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    key = hashlib.sha256(str(Path(log_path).resolve()).encode()).hexdigest()[:16]
    return Path(base) / "spotstop" / "journal" / f"{Path(log_path).name}-{key}.journal"


@dataclass(frozen=True)
class JournalEntry:
    """One journal line: a batch of decisions with the policy that decided them (``rows``),
    or a fail-closed amendment of logged SAFE rows (``amend``)."""

    kind: Literal["rows", "amend"]
    records: tuple[DecisionRecord, ...] = ()
    policy: PolicyRow | None = None
    images: tuple[bytes | None, ...] | None = None
    amend_ids: tuple[str, ...] = ()
    amend_reason: str = ""

    @property
    def n_rows(self) -> int:
        return len(self.records)

    def to_line(self) -> bytes:
        body: dict[str, Any] = {"v": _VERSION, "kind": self.kind}
        if self.kind == "rows":
            body["rows"] = [list(record_to_row(r)) for r in self.records]
            body["policy"] = None if self.policy is None else dataclasses.asdict(self.policy)
            body["images"] = (
                None
                if self.images is None
                else [None if b is None else base64.b64encode(b).decode() for b in self.images]
            )
        else:
            body["ids"] = list(self.amend_ids)
            body["reason"] = self.amend_reason
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return f"{digest} {text}\n".encode()

    @classmethod
    def from_line(cls, line: bytes) -> JournalEntry:
        """Parse one line; ValueError when it is torn or altered."""
        digest, _, text = line.rstrip(b"\n").partition(b" ")
        if hashlib.sha256(text).hexdigest().encode() != digest:
            raise ValueError("sha256 mismatch (a torn or altered line)")
        body = json.loads(text)
        if body.get("v") != _VERSION:
            raise ValueError(f"journal entry version {body.get('v')!r}; expected {_VERSION}")
        if body["kind"] == "amend":
            return cls("amend", amend_ids=tuple(body["ids"]), amend_reason=str(body["reason"]))
        if body["kind"] != "rows":
            raise ValueError(f"unknown journal entry kind {body['kind']!r}")
        rows = body["rows"]
        if any(len(r) != len(COLUMNS) for r in rows):
            raise ValueError(f"a row has not the log's {len(COLUMNS)} columns")
        images = body.get("images")
        return cls(
            "rows",
            records=tuple(record_from_row(r) for r in rows),
            policy=None if body.get("policy") is None else PolicyRow(**body["policy"]),
            images=None
            if images is None
            else tuple(None if b is None else base64.b64decode(b) for b in images),
        )


@dataclass(frozen=True)
class JournalRead:
    """The entries of a journal, and the lines that could not be read."""

    entries: tuple[JournalEntry, ...]
    rejected: int
    n_bytes: int

    @property
    def n_rows(self) -> int:
        return sum(e.n_rows for e in self.entries)


class Journal:
    """An append-only journal file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise LogError(
                f"journal {str(self.path)!r} exists and is not a file. Name a file path for "
                "the journal (e.g. /var/lib/spotstop/decisions.journal)."
            )

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[int]:
        fd = os.open(self.path, mode | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def append(self, entries: Sequence[JournalEntry]) -> None:
        """Append ``entries`` durably (one write, then fsync); :class:`LogError` when the
        journal cannot take them (nothing is half-written that a reader would import)."""
        if not entries:
            return
        data = b"".join(e.to_line() for e in entries)
        try:
            new = not self.path.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked(os.O_WRONLY | os.O_APPEND) as fd:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError:
                    # cut a partial write off again: the entries are still the caller's
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise
            if new:
                fsync_dir(self.path.parent)
        except OSError as exc:
            raise LogError(
                f"journal {str(self.path)!r} cannot be written ({exc}). Give the journal a "
                "writable place on another file system than the log (--journal).",
                fault_kind(exc),
            ) from exc

    def read(self) -> JournalRead:
        """Every readable entry, oldest first; unreadable lines are moved to the rejected
        file (and counted)."""
        if not self.path.exists():
            return JournalRead((), 0, 0)
        with self._locked(os.O_RDWR) as fd:
            return self._read_locked(fd)

    def _read_locked(self, fd: int) -> JournalRead:
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
        entries: list[JournalEntry] = []
        bad: list[bytes] = []
        for line in data.splitlines(keepends=True):
            try:
                entries.append(JournalEntry.from_line(line))
            except (ValueError, KeyError, TypeError):  # torn or altered: kept apart, counted
                bad.append(line if line.endswith(b"\n") else line + b"\n")
        if bad:
            rejected = self.path.with_name(self.path.name + ".rejected")
            with open(rejected, "ab") as fh:
                fh.write(b"".join(bad))
                fh.flush()
                os.fsync(fh.fileno())
            good = b"".join(e.to_line() for e in entries)
            os.ftruncate(fd, 0)
            os.pwrite(fd, good, 0)
            os.fsync(fd)
        return JournalRead(tuple(entries), len(bad), len(data))

    @contextlib.contextmanager
    def draining(self) -> Iterator[JournalRead]:
        """Hold the journal locked, give its entries, and empty it if the block ends
        without an exception (the caller imported them all)."""
        if not self.path.exists():
            yield JournalRead((), 0, 0)
            return
        with self._locked(os.O_RDWR) as fd:
            read = self._read_locked(fd)
            yield read
            if read.entries or read.n_bytes:
                os.ftruncate(fd, 0)
                os.fsync(fd)

    def n_rows(self) -> int:
        """Decisions waiting in the journal."""
        try:
            return self.read().n_rows
        except OSError:
            return 0
