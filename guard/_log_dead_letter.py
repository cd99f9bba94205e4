"""Amendments in the dead letter whose rows the log holds: applied to the log, then removed.

The guard's writer sets a fail-closed amendment aside in the dead letter
(``<log>.dead-letter.jsonl``, :class:`~spotstop.guard._journal.DeadLetter`) when the log cannot
take it: its ids are in no row of the log, live or archived; an archive that may hold them is
missing or changed; or the log refused it for a reason of its own. Every reader through the log
applies it (``_log_pending.py``), but the files alone do not: the SQLite file read directly,
and above all an archive file read on its own (a fleet's collected archives, ``spotstop card``
on a folder of them, DuckDB), said SAFE for a decision the robot was answered UNSAFE. Older
versions also set aside amendments of rows the log did hold: before archived rows could be
amended, an amendment whose row was archived was "unknown"; before that, an amendment naming
a live row and an unknown id went to the dead letter whole.

:func:`apply_dead_letter` (:meth:`DecisionLog.apply_dead_letter
<spotstop.guard.DecisionLog.apply_dead_letter>`; run when the log opens for writing and at
the start of each retention pass) applies each ``amend`` entry with the one path of a
late amendment, :meth:`~spotstop.guard.DecisionLog.mark_fail_closed` (``skip_unknown``: the
live rows in one transaction, an archived row by writing its archive again,
:meth:`~spotstop.guard._log_archive.ArchiveStore.amend_archived`), in the file's order (a
decision's first amendment gives its reason, as readers apply them). Only after those commits
is the entry removed from the dead letter, or narrowed to the ids in no row of the log, which
stay with their message (:meth:`DeadLetter.replace_lines`, under the lock every append takes,
one atomic rename): a crash in between leaves the entry, and applying it again finds its rows
UNSAFE already and removes it. An entry whose application fails (a busy log, an archive
missing or changed, a fault injected in the rewrite) stays as it was. Entries of rows set
aside (``"kind": "rows"``) are decisions the log may lack: never removed here.

Cheap when there is nothing to do: no dead letter is one failed ``open``; a dead letter with
no amendment, or whose amendments name only ids in no row (looked for once in the archives
that may hold them, ``mark_fail_closed``), is noted final: the log keeps the file's sha256 with
its archives' registrations (``meta.dead_letter_checked``), and the next opening reads the file
and hashes it, but parses no line and reads no archive until one of them changes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from spotstop.guard._journal import DeadLetter, default_dead_letter_path, encodable_text
from spotstop.guard._log_schema import LogError, RecordError

if TYPE_CHECKING:
    from spotstop.guard._log import DecisionLog

__all__ = ["CHECKED_KEY", "DeadLetterApplied", "apply_dead_letter"]

_log = logging.getLogger("spotstop.guard")

CHECKED_KEY: Final = "dead_letter_checked"
"""The ``meta`` key holding what the last :func:`apply_dead_letter` found final: the dead
letter's sha256 and the archives' registrations it was checked against."""


@dataclass(frozen=True)
class DeadLetterApplied:
    """What :func:`apply_dead_letter` did.

    applied: ids of dead-lettered amendments now in the log's rows (live or archived; rows
        that were UNSAFE already included), whose entries were removed or narrowed.
    kept: ids in no row of the log, live or archived: their entries stay.
    failed: ``(ids, why)`` of entries that could not be applied now; they stay as they were.
    skipped: nothing was read again (the dead letter and the archives are as last checked).
    """

    applied: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    failed: tuple[tuple[tuple[str, ...], str], ...] = ()
    skipped: bool = False

    def __repr__(self) -> str:
        if self.skipped:
            return "DeadLetterApplied(skipped: as last checked)"
        return (
            f"DeadLetterApplied(applied {len(self.applied)}, kept {len(self.kept)} in no row, "
            f"failed {len(self.failed)} entr(y/ies))"
        )


def _state(data: bytes, archives: Iterable[tuple[str, str]]) -> str:
    """What ``meta.dead_letter_checked`` holds: the dead letter's sha256 and a digest of the
    archives' registrations (name and sha256 of each)."""
    regs = hashlib.sha256("\n".join(f"{n} {s}" for n, s in sorted(archives)).encode()).hexdigest()
    return f"{hashlib.sha256(data).hexdigest()} {regs}"


def _registrations(log: DecisionLog) -> list[tuple[str, str]]:
    return [(a.name, a.sha256) for a in log.archives()]


def _checked(log: DecisionLog) -> str | None:
    row = log._retry(
        lambda: (
            log._conn().execute("SELECT value FROM meta WHERE key = ?", (CHECKED_KEY,)).fetchone()
        ),
        what="read the dead letter's last check",
    )
    return None if row is None else str(row[0])


def _store_checked(log: DecisionLog, state: str) -> None:
    def body(conn: Any) -> None:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CHECKED_KEY, state))

    log._write(body, what="note the dead letter's check")


def apply_dead_letter(log: DecisionLog, *, timeout_s: float | None = None) -> DeadLetterApplied:
    """Apply the fail-closed amendments of ``log``'s dead letter to the rows the log holds,
    live or archived, then remove them from the dead letter (see the module).

    ``timeout_s`` bounds each wait for a busy log or a retention pass holding the archives
    (None: the log's own). Raises :class:`OSError` or :class:`LogError` when the dead letter
    cannot be read or rewritten, or the log's ``meta`` cannot be read or written; what was
    committed before stays (an entry still in the dead letter is applied again, harmlessly).
    """
    dead = DeadLetter(default_dead_letter_path(log.path), log=str(log.path))
    try:
        data = dead.path.read_bytes()
    except FileNotFoundError:
        return DeadLetterApplied()
    state = _state(data, _registrations(log))
    if _checked(log) == state:  # before parsing: its rows' lines may be long (images)
        return DeadLetterApplied(skipped=True)
    # a line without '"amend"' is no amend entry (a quote inside a JSON string is escaped):
    # its parsing is spared
    entries = [
        (line, dead.amendment_of(line) if b'"amend"' in line else None)
        for line in data.split(b"\n")
    ]
    amends = [(line, a) for line, a in entries if a is not None and a[0]]
    if not amends:
        _store_checked(log, state)
        return DeadLetterApplied()

    new: dict[bytes, bytes | None] = {}  # line -> what replaces it (None: removed)
    seen: set[bytes] = set()
    applied: list[str] = []
    kept: list[str] = []
    failed: list[tuple[tuple[str, ...], str]] = []
    for line, (ids, reason) in amends:
        if line in seen:  # the same entry twice (a crash between setting aside and emptying)
            continue
        seen.add(line)
        try:
            unknown = log.mark_fail_closed(ids, reason, timeout_s=timeout_s, skip_unknown=True)
        except (LogError, RecordError, OSError) as e:  # stays as it is; tried again next time
            failed.append((ids, str(e)))
            continue
        applied += [i for i in ids if i not in unknown]
        kept += unknown
        if len(unknown) < len(ids):  # an entry whose ids are all in no row stays as it is
            new[line] = dead.narrowed(line, unknown) if unknown else None
    replaced = dead.replace_lines(new) if new else (data, data)
    if applied:
        _log.info(
            "dead letter %s: the fail-closed amendment(s) of %s applied to the log's rows "
            "(live or in their archives) and removed from it",
            dead.path,
            [encodable_text(i) for i in applied],
        )
    if kept:
        _log.warning(
            "dead letter %s: fail-closed amendment(s) of %s name decisions in no row of the "
            "log %s, live or archived; they stay in the dead letter, which every reader of "
            "the log applies should such a row come in later",
            dead.path,
            [encodable_text(i) for i in kept],
            log.path,
        )
    for ids, why in failed:
        _log.warning(
            "dead letter %s: the fail-closed amendment of %s could not be applied now (%s); it "
            "stays in the dead letter and is tried again when the log opens for writing or "
            "retention runs",
            dead.path,
            [encodable_text(i) for i in ids],
            why,
        )
    # final: nothing failed and nothing was appended meanwhile; the next check reads nothing
    # again until the dead letter or the archives' registrations change
    if not failed and replaced is not None and replaced[0] == data:
        _store_checked(log, _state(replaced[1], _registrations(log)))
    return DeadLetterApplied(tuple(applied), tuple(kept), tuple(failed))
