"""The journal: where decisions wait, on disk, while the decision log cannot take them.

When the log cannot be written (a full disk, a read-only file system, a lock held too long)
the guard still answers every scene (fail-closed UNSAFE) and keeps the rows it could not
write. It holds them in memory up to a stated bound, then *spills* them here: an append-only
file in a second place (by default ``$XDG_STATE_HOME/spotstop/journal/``, or wherever the
robot's config names it; put it on another file system than the log). The log imports the
journal as soon as it can write again, and on the next start.

Format: one line per entry, ``<sha256 of the JSON> <JSON>\\n``; an entry is a batch of rows
(``{"v": 2, "kind": "rows", "columns": [...], "rows": [...], "policy": {...}, "images":
[...]}``, each row the log's own SQL row under its named columns, so NaN and infinities
survive, and a row of an older log schema gets the columns added since as the log's
migration gives them; version 1 lines, positional rows of this or the previous log schema,
are read too) or a pending amendment (``"kind": "amend"``:
decision ids and the fail-closed reason), stamped with the log it is for. The JSON is ASCII
(``\\uXXXX`` escapes), so any text a row holds, a lone surrogate included, is kept exactly
and cannot make the journal fail (lines written before as UTF-8 are read as well). Every
append is one ``write`` followed by ``fsync`` (after a newline, if a killed writer left a torn
last line); the journal's lock file (``<journal>.lock``, ``flock``) is held while it is
written, read or emptied, so two processes, even of different logs, may share it. A caller on
a deadline passes ``timeout_s``: the lock is then tried without blocking until that time is
up, and a lock held longer is a :class:`JournalError` of kind ``locked`` (what waits stays
where it was). Emptying and setting lines apart replace the file (temp file, fsync, rename):
a crash leaves the old journal or the new one. A line whose hash does not match (a write cut
short by a crash) is moved to ``<journal>.rejected`` and reported, never imported and never
silently dropped; so is a line another spotstop wrote in a form this one cannot read (a newer
entry version), reported as such.

:class:`DeadLetter` is the last place on disk, for what the log can *never* store (a row whose
text has no UTF-8 encoding, a policy document with a NaN): ``<log>.dead-letter.jsonl`` beside
the log, one JSON object per line in an encoding that cannot fail, each append fsynced (under
an ``flock`` on the file, which :meth:`DeadLetter.replace_lines` takes too). Its rows are read
by people, not imported; its fail-closed amendments of rows the log holds are applied to them
and then removed (``_log_dead_letter.py``; see ``docs/log.md``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from spotstop.guard._files import atomic_write_bytes, fsync_dir
from spotstop.guard._log_schema import (
    ADDED_COLUMNS,
    COLUMNS,
    LogError,
    PolicyRow,
    fault_kind,
    upgrade_columns,
)
from spotstop.guard._record import DecisionRecord, record_from_row, record_to_row

__all__ = [
    "DeadLetter",
    "DeadLetterRead",
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalRead",
    "amendments_of",
    "default_dead_letter_path",
    "default_journal_path",
    "encodable_text",
]

#: the entry format written: 2 names its rows' columns (1: positional rows, in the column
#: order of the log schema that wrote them; still read)
_VERSION: Final = 2
_READ_VERSIONS: Final = (1, 2)


class JournalVersionError(ValueError):
    """A journal line another spotstop wrote, in a form this one cannot read (a newer entry
    version or columns it does not know): not torn, so said apart from torn lines."""


def _row_columns(version: int, body: Mapping[str, Any], n: int) -> tuple[str, ...]:
    """The column names of an entry's rows of ``n`` values."""
    if version >= 2:
        names = tuple(str(c) for c in body["columns"])
        unknown = sorted(set(names) - set(COLUMNS))
        if unknown:
            raise JournalVersionError(
                f"its rows hold columns {unknown} this spotstop does not know (a newer one "
                "wrote it)"
            )
        return names
    if n == len(COLUMNS):  # version 1: positional, in the order of the schema that wrote it
        return COLUMNS
    older = tuple(c for c in COLUMNS if c not in ADDED_COLUMNS)
    if n == len(older):  # written before the later schemas added their columns
        return older
    raise ValueError(f"a row has {n} columns: neither the log's {len(COLUMNS)} nor an older count")


def _records(version: int, body: Mapping[str, Any]) -> tuple[DecisionRecord, ...]:
    rows = body["rows"]
    if not rows:
        return ()
    names = _row_columns(version, body, len(rows[0]))
    if any(len(r) != len(names) for r in rows):
        raise ValueError(f"a row has not its entry's {len(names)} columns")
    missing = sorted(set(COLUMNS) - set(names) - set(ADDED_COLUMNS))
    if missing:
        raise ValueError(f"its rows lack the columns {missing}")
    cols = upgrade_columns({c: [r[i] for r in rows] for i, c in enumerate(names)})
    return tuple(record_from_row([cols[c][k] for c in COLUMNS]) for k in range(len(rows)))


def amendments_of(kept: Iterable[tuple[str, str | None]]) -> list[tuple[tuple[str, ...], str]]:
    """The fail-closed amendments that kept rows make to their copies the log already holds.

    ``kept``: ``(decision_id, fail_reason)`` of rows as their callers were answered (each a
    fail-closed UNSAFE) that wait in the journal or the dead letter. A write reported failed
    may have committed all the same, so the log may hold such a row as it was decided (SAFE);
    the row must then say what was answered: its ids, grouped by reason, are amended with
    :meth:`~spotstop.guard.DecisionLog.mark_fail_closed` (which changes SAFE rows only). The
    writer's import and the log's readers (``_log_pending.py``) both take them from here."""
    by_reason: dict[str, list[str]] = {}
    for decision_id, reason in kept:
        by_reason.setdefault(reason or "", []).append(decision_id)
    return [(tuple(ids), reason) for reason, ids in by_reason.items()]


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
    log: str | None = None
    """The log the entry is for (its absolute path); a journal may be shared by guards."""

    @property
    def n_rows(self) -> int:
        return len(self.records)

    @property
    def amendments(self) -> list[tuple[tuple[str, ...], str]]:
        """What this entry changes in rows the log already holds: an ``amend`` entry its ids
        and reason; a ``rows`` entry :func:`amendments_of` its rows (what the import does
        when the log holds them already)."""
        if self.kind == "amend":
            return [(self.amend_ids, self.amend_reason)]
        return amendments_of((r.decision_id, r.fail_reason) for r in self.records)

    def to_line(self) -> bytes:
        body: dict[str, Any] = {"v": _VERSION, "kind": self.kind, "log": self.log}
        if self.kind == "rows":
            body["columns"] = list(COLUMNS)
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
        # ASCII: a lone surrogate is written as its \\uXXXX escape and read back as it was
        text = json.dumps(body, ensure_ascii=True, separators=(",", ":"), default=str)
        digest = hashlib.sha256(text.encode("ascii")).hexdigest()
        return f"{digest} {text}\n".encode("ascii")

    @classmethod
    def from_line(cls, line: bytes) -> JournalEntry:
        """Parse one line; ValueError when it is torn or altered."""
        digest, _, text = line.rstrip(b"\n").partition(b" ")
        if hashlib.sha256(text).hexdigest().encode() != digest:
            raise ValueError("sha256 mismatch (a torn or altered line)")
        body = json.loads(text)
        version = body.get("v")
        if version not in _READ_VERSIONS:
            raise JournalVersionError(
                f"journal entry version {version!r}; this spotstop reads {list(_READ_VERSIONS)}"
            )
        log = body.get("log")
        if body["kind"] == "amend":
            return cls(
                "amend", amend_ids=tuple(body["ids"]), amend_reason=str(body["reason"]), log=log
            )
        if body["kind"] != "rows":
            raise ValueError(f"unknown journal entry kind {body['kind']!r}")
        images = body.get("images")
        return cls(
            "rows",
            records=_records(version, body),
            policy=None if body.get("policy") is None else PolicyRow(**body["policy"]),
            images=None
            if images is None
            else tuple(None if b is None else base64.b64decode(b) for b in images),
            log=log,
        )


@dataclass(frozen=True)
class JournalRead:
    """The entries of a journal, and the lines that could not be read."""

    entries: tuple[JournalEntry, ...]
    rejected: int
    n_bytes: int
    #: of the ``rejected`` lines, why each that another spotstop wrote could not be read (a
    #: newer entry version or columns): not torn, they wait for that version to import them
    foreign: tuple[str, ...] = ()
    #: the entries :meth:`keep` was called for (by identity): :meth:`Journal.draining`
    #: leaves them in the journal
    kept: list[JournalEntry] = field(default_factory=list, compare=False, repr=False)

    @property
    def n_rows(self) -> int:
        """Decisions in the entries (amendments hold none)."""
        return sum(e.n_rows for e in self.entries)

    def rejected_message(self, path: Path) -> str:
        """What to say of the lines set apart (``""`` when none were)."""
        if not self.rejected:
            return ""
        torn = self.rejected - len(self.foreign)
        parts = []
        if torn:
            parts.append(f"{torn} journal line(s) could not be read (torn or altered)")
        if self.foreign:
            parts.append(
                f"{len(self.foreign)} journal line(s) were written by another spotstop version "
                f"({self.foreign[0]}): import them with that version"
            )
        return "; ".join(parts) + f"; kept in {path}.rejected"

    def keep(self, entry: JournalEntry) -> None:
        """Leave ``entry`` in the journal when the draining block ends: its rows are not yet
        durable anywhere else (an entry leaves the journal only into the log or the dead
        letter)."""
        if not any(k is entry for k in self.kept):
            self.kept.append(entry)


class JournalError(LogError):
    """The journal (not the log) cannot be read or written; ``kind`` says why."""


class Journal:
    """An append-only journal file (see the module docstring).

    ``owner``: the log this guard writes (its absolute path). Entries are stamped with it;
    :meth:`draining` gives and removes only the owner's entries (and unstamped ones), so
    guards of different logs may share one journal file.
    """

    def __init__(self, path: str | os.PathLike[str], owner: str | None = None) -> None:
        self.path = Path(path)
        self.owner = owner
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        if self.path.exists() and not self.path.is_file():
            raise LogError(
                f"journal {str(self.path)!r} exists and is not a file. Name a file path for "
                "the journal (e.g. /var/lib/spotstop/decisions.journal)."
            )

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    def _error(self, what: str, exc: OSError) -> JournalError:
        return JournalError(
            f"journal {str(self.path)!r} cannot be {what} ({exc}). Give the journal a writable "
            "place on another file system than the log (--journal).",
            fault_kind(exc),
        )

    @contextlib.contextmanager
    def _locked(self, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the journal's lock file (not the journal itself: it is replaced by rename).

        ``timeout_s`` None waits as long as the lock is held; a number tries without
        blocking until that many seconds have passed (at least once), then raises
        :class:`JournalError` (``locked``): a guard call never waits past its deadline for
        another process's journal work."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if timeout_s is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                self._lock_within(fd, max(0.0, float(timeout_s)))
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _lock_within(self, fd: int, timeout_s: float) -> None:
        due = time.monotonic() + timeout_s
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                left = due - time.monotonic()
                if left <= 0:
                    raise JournalError(
                        f"journal {str(self.path)!r}: its lock {str(self._lock_path)!r} was "
                        f"held by another process or guard for more than {timeout_s:g} s (the "
                        "call's time); what waits stays where it is and the next write or "
                        "flush retries. If this lasts, find the process that holds the lock "
                        "(fuser / lsof on the lock file).",
                        "locked",
                    ) from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.05)

    def append(self, entries: Sequence[JournalEntry], *, timeout_s: float | None = None) -> None:
        """Append ``entries`` durably (one write, then fsync); :class:`JournalError` when the
        journal cannot take them (nothing is half-written that a reader would import), or
        when its lock is held longer than ``timeout_s`` (None: no bound). An entry that cannot
        be encoded at all raises what encoding raised (ValueError, TypeError), before any
        byte is written."""
        if not entries:
            return
        data = b"".join(dataclasses.replace(e, log=self.owner).to_line() for e in entries)
        try:
            with self._locked(timeout_s):
                append_durably(self.path, data)
        except OSError as exc:
            raise self._error("written", exc) from exc

    def _load(self) -> tuple[list[JournalEntry], list[bytes], list[str], int]:
        """All entries, the unreadable lines, why those another spotstop wrote cannot be
        read, and the bytes read (the lock is held)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [], [], [], 0
        entries: list[JournalEntry] = []
        bad: list[bytes] = []
        foreign: list[str] = []
        for line in data.splitlines(keepends=True):
            try:
                entries.append(JournalEntry.from_line(line))
            except (ValueError, KeyError, TypeError) as e:  # kept apart, counted
                bad.append(line if line.endswith(b"\n") else line + b"\n")
                if isinstance(e, JournalVersionError):
                    foreign.append(str(e))
        return entries, bad, foreign, len(data)

    def _set_aside(self, bad: list[bytes]) -> None:
        rejected = self.path.with_name(self.path.name + ".rejected")
        with open(rejected, "ab") as fh:
            fh.write(b"".join(bad))
            fh.flush()
            os.fsync(fh.fileno())

    def _rewrite(self, entries: list[JournalEntry]) -> None:
        """Replace the journal by ``entries`` (temp file, fsync, rename): a crash leaves the
        old journal or the new one, never an empty one in between."""
        if not entries:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            fsync_dir(self.path.parent)
            return
        atomic_write_bytes(self.path, b"".join(e.to_line() for e in entries))
        fsync_dir(self.path.parent)

    def _mine(self, e: JournalEntry) -> bool:
        return e.log is None or self.owner is None or e.log == self.owner

    def read(self, *, timeout_s: float | None = None) -> JournalRead:
        """This log's readable entries, oldest first; unreadable lines are set apart in the
        rejected file (and counted). ``timeout_s``: as for :meth:`append`."""
        if not self.path.exists():
            return JournalRead((), 0, 0)
        with self._locked_read(timeout_s) as (entries, bad, foreign, n):
            return JournalRead(tuple(e for e in entries if self._mine(e)), bad, n, foreign)

    def peek(self) -> JournalRead:
        """This log's readable entries, read without the journal's lock and without changing
        anything (no lock file, no folder, nothing set apart): for the log's readers, which
        must never write nor hold up the guard. A line being appended while it is read, or
        a torn one, counts as ``rejected`` (it stays where it is); a journal replaced while
        it is read is read whole, old or new (replacing is a rename)."""
        entries, bad, foreign, n = self._load()
        return JournalRead(tuple(e for e in entries if self._mine(e)), len(bad), n, tuple(foreign))

    @contextlib.contextmanager
    def _locked_read(
        self, timeout_s: float | None = None
    ) -> Iterator[tuple[list[JournalEntry], int, tuple[str, ...], int]]:
        """Hold the lock; give every entry (unreadable lines set apart first), how many lines
        were set apart, and the bytes read."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._locked(timeout_s))
                entries, bad, foreign, n = self._load()
                if bad:
                    self._set_aside(bad)
                    self._rewrite(entries)
            except OSError as exc:
                raise self._error("read", exc) from exc
            yield entries, len(bad), tuple(foreign), n

    @contextlib.contextmanager
    def draining(self, *, timeout_s: float | None = None) -> Iterator[JournalRead]:
        """Hold the journal locked, give this log's entries, and remove them if the block
        ends without an exception (the caller imported them), but for those the caller
        asked to keep (:meth:`JournalRead.keep`); other logs' entries stay. ``timeout_s`` bounds the wait
        for the lock, as for :meth:`append`."""
        if not self.path.exists():
            yield JournalRead((), 0, 0)
            return
        with self._locked_read(timeout_s) as (entries, bad, foreign, n):
            mine = [e for e in entries if self._mine(e)]
            read = JournalRead(tuple(mine), bad, n, foreign)
            yield read
            if mine:
                kept = {id(e) for e in read.kept}
                try:
                    self._rewrite([e for e in entries if not self._mine(e) or id(e) in kept])
                except OSError as exc:
                    raise self._error("emptied", exc) from exc


# -- the dead letter ---------------------------------------------------------------------------


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path``: one ``write`` loop, then ``fsync`` (and the
    folder's when the file is new). After a torn last line (a writer killed mid-line) a
    newline keeps it apart; a partial write is cut off again, so on :class:`OSError` nothing
    half-written stays and the lines are still the caller's."""
    new = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _append_to(fd, data)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def _append_to(fd: int, data: bytes) -> None:
    """:func:`append_durably`'s write to the open file ``fd`` (opened with ``O_APPEND``)."""
    start = os.fstat(fd).st_size
    if start and os.pread(fd, 1, start - 1) != b"\n":
        data = b"\n" + data
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def default_dead_letter_path(log_path: Path) -> Path:
    """``<log>.dead-letter.jsonl``, beside the log: what the log can never store is found
    where the log is."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.name + ".dead-letter.jsonl")


def encodable_text(s: str) -> str:
    """``s`` with what UTF-8 cannot encode (lone surrogates) spelled as ``\\udXXX`` text."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _plain(x: object, depth: int = 0) -> object:
    """``x`` as JSON can always write it: text made encodable, bytes in base64, dataclasses
    and mappings as objects with text keys, anything else by its ``repr``. NaN and the
    infinities stay floats (written ``NaN``/``Infinity``, as Python's json reads them)."""
    if depth > 32:
        return encodable_text(repr(x))
    if x is None or isinstance(x, bool | int | float):
        return x
    if isinstance(x, str):
        return encodable_text(x)
    if isinstance(x, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(x)).decode("ascii")}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name, None), depth + 1) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {encodable_text(str(k)): _plain(v, depth + 1) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [_plain(v, depth + 1) for v in x]
    return encodable_text(repr(x))


@dataclass(frozen=True)
class DeadLetterRead:
    """What the dead letter changes in what its log says (:meth:`DeadLetter.changes`).

    amendments: ``(ids, reason)`` of fail-closed amendments: the ``amend`` entries, and what
        the rows set aside make of their copies the log may hold (:func:`amendments_of`).
    rows: the ids of the rows set aside (decisions answered fail-closed UNSAFE that the log
        may lack).
    unreadable: lines that are not an entry (a torn last line, a body that could not be
        encoded).
    bundles: ``(decision id, bundle id, prompt hash)`` of each row set aside, as it was
        written (what a reader of one bundle's decisions counts of them).
    """

    amendments: tuple[tuple[tuple[str, ...], str], ...]
    rows: tuple[str, ...]
    unreadable: int
    bundles: tuple[tuple[str, str, str], ...] = ()


class DeadLetter:
    """Where the writer sets aside what the log can never store, so that it blocks nothing.

    A batch whose write fails for a reason of its own (its text has no UTF-8 encoding, its
    policy's document holds a NaN, a value of a type the log does not know) would fail again
    on every retry. The writer appends it here, one JSON object per line::

        {"v": 1, "kind": "rows", "time": <epoch s>, "log": <log path>, "error": <why>,
         "rows": [{<DecisionRecord field>: value, ...}], "policy": {...}, "images": [...]}

    (``"kind": "amend"`` with ``"ids"`` and ``"reason"`` for a fail-closed amendment). The
    rows are the records as their callers were answered (fail-closed UNSAFE). The encoding
    cannot fail: ASCII JSON, unencodable text spelled ``\\udXXX``, bytes in base64, unknown
    values by their ``repr``, NaN as ``NaN``. Each append is one ``write`` then ``fsync`` (the
    folder too when the file is new), so a set-aside decision survives a crash as a logged
    one does. An :class:`OSError` (a full disk) is the caller's: it keeps the batch and
    retries. An entry may appear twice (a crash or a timeout between setting a journal
    entry aside and emptying the journal; the decision ids tell). Its rows are never imported:
    a person reads it (``jq``, Python's ``json``), mends the cause and, if wanted, re-logs the
    rows. Its ``amend`` entries whose rows the log holds, live or archived, are applied to them
    and then removed (:meth:`replace_lines`), when the log opens for writing and by each
    retention pass (``_log_dead_letter.py``). Appends and that rewrite hold an ``flock`` on
    the file itself (:meth:`_open_locked`).
    """

    def __init__(self, path: str | os.PathLike[str], log: str | None = None) -> None:
        self.path = Path(path)
        self.log = log

    def __repr__(self) -> str:
        return f"DeadLetter({str(self.path)!r})"

    @staticmethod
    def encode(body: Mapping[str, object]) -> bytes:
        """One line for ``body``; never raises for its content."""
        try:
            text = json.dumps(
                _plain(body), ensure_ascii=True, allow_nan=True, default=repr, sort_keys=False
            )
        except Exception as e:  # the last place: keep a readable trace of what it was
            text = json.dumps(
                {
                    "v": _VERSION,
                    "unencodable": encodable_text(repr(body)),
                    "why": encodable_text(repr(e)),
                },
                ensure_ascii=True,
            )
        return text.encode("ascii") + b"\n"

    def append(
        self,
        kind: Literal["rows", "amend"],
        *,
        error: str,
        records: Sequence[object] = (),
        policy: object = None,
        images: Sequence[bytes | None] | None = None,
        amend_ids: Sequence[str] = (),
        amend_reason: str = "",
    ) -> None:
        """Append one entry durably (one write, then fsync); :class:`OSError` when the file
        cannot take it (nothing half-written stays: a partial write is cut off again)."""
        body: dict[str, object] = {
            "v": _VERSION,
            "kind": kind,
            "time": time.time(),
            "log": self.log,
            "error": error,
        }
        if kind == "rows":
            body["rows"] = list(records)
            body["policy"] = policy
            body["images"] = None if images is None else list(images)
        else:
            body["ids"] = list(amend_ids)
            body["reason"] = amend_reason
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.encode(body)
        fd = self._open_locked(create=True)
        if fd is None:  # never: the file is created when absent
            raise FileNotFoundError(f"dead letter {str(self.path)!r} could not be created")
        try:
            new = os.fstat(fd).st_size == 0  # created now (here, or after a rewrite removed it)
            _append_to(fd, data)
        finally:
            os.close(fd)
        if new:
            fsync_dir(self.path.parent)

    def _open_locked(self, *, create: bool) -> int | None:
        """The dead letter's file, opened for appending and locked (``flock`` on the file
        itself) against the other writers of it: an append, :meth:`replace_lines`. None when
        there is no file and ``create`` is false. A file replaced or removed while its lock
        was awaited (:meth:`replace_lines` renamed another in its place) is opened again, so
        a lock held is always on the file at the path. The caller closes the descriptor,
        which releases the lock."""
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
        while True:
            try:
                fd = os.open(self.path, flags, 0o600)
            except FileNotFoundError:
                if create:
                    raise
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held, there = os.fstat(fd), os.stat(self.path)
                if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                    return fd
            except FileNotFoundError:  # removed while the lock was awaited: open it again
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    @staticmethod
    def amendment_of(line: bytes) -> tuple[tuple[str, ...], str] | None:
        """The ``(ids, reason)`` of one ``amend`` line as :meth:`changes` reads it; None for
        any other line (rows set aside, a torn or unreadable line)."""
        try:
            body = json.loads(line)
            if body["kind"] != "amend":
                return None
            return tuple(str(i) for i in body["ids"]), str(body["reason"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def narrowed(self, line: bytes, ids: Sequence[str]) -> bytes:
        """The ``amend`` line ``line`` naming only ``ids`` (everything else as it was: time,
        log, error, reason), without its newline."""
        body = json.loads(line)
        body["ids"] = list(ids)
        return self.encode(body).rstrip(b"\n")

    def replace_lines(self, new: Mapping[bytes, bytes | None]) -> tuple[bytes, bytes] | None:
        """Replace each line of the file that is a key of ``new`` by its value (None: remove
        it; every copy of a line alike), under the lock every append takes, as one atomic
        replacement (temp file, fsync, rename, fsync of the folder): a crash leaves the old
        file or the new one. Lines appended meanwhile, and every other line, stay as they are;
        a file left with no line is removed. Returns the file's bytes before and after (None:
        no file). :class:`OSError` when it cannot be written (the file stays as it was)."""
        fd = self._open_locked(create=False)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            before = os.pread(fd, size, 0) if size else b""
            lines = before.split(b"\n")
            out: list[bytes] = []
            for line in lines:
                if line in new:
                    value = new[line]
                    if value is not None:
                        out.append(value)
                else:
                    out.append(line)
            after = b"\n".join(out)
            if after == before:
                return before, after
            if not after.strip():
                after = b""
                os.unlink(self.path)
                fsync_dir(self.path.parent)
            else:
                atomic_write_bytes(self.path, after)
            # a writer that does not take the lock (an older spotstop) may have appended to
            # the file replaced: what it added after the read goes to the new file too
            grown = os.fstat(fd).st_size
            if grown > size:
                tail = os.pread(fd, grown - size, size)
                append_durably(self.path, tail)
                after += tail
            return before, after
        finally:
            os.close(fd)

    def changes(self) -> DeadLetterRead:
        """What the entries change in what the log says, read as the writer wrote them (see
        :class:`DeadLetterRead`); nothing is written. :class:`OSError` when the file exists
        but cannot be read."""
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return DeadLetterRead((), (), 0)
        amendments: list[tuple[tuple[str, ...], str]] = []
        rows: list[str] = []
        bundles: list[tuple[str, str, str]] = []
        unreadable = 0
        for line in lines:
            try:
                body = json.loads(line)
                if body["kind"] == "amend":
                    amendments.append((tuple(str(i) for i in body["ids"]), str(body["reason"])))
                    continue
                if body["kind"] != "rows":
                    raise ValueError(f"unknown dead-letter entry kind {body['kind']!r}")
                kept = [(str(r["decision_id"]), r.get("fail_reason")) for r in body["rows"]]
                made = [
                    (str(r["decision_id"]), str(r.get("bundle_id")), str(r.get("prompt_hash")))
                    for r in body["rows"]
                ]
            except (ValueError, KeyError, TypeError, AttributeError):  # torn, or unencodable
                unreadable += 1
                continue
            rows += [i for i, _ in kept]
            bundles += made
            amendments += amendments_of(kept)
        return DeadLetterRead(tuple(amendments), tuple(rows), unreadable, tuple(bundles))

    def read(self) -> list[dict[str, object]]:
        """The entries, oldest first (a torn last line is skipped): for people and tests."""
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        out: list[dict[str, object]] = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out
