"""The log writer's settings and its report (the writer itself is ``_log_writer.py``).

:class:`LogOptions`: how the guard keeps its decision log (the journal, the disk budget, the
free-space floor, the memory bound, how long rows wait, the robot, the fsync level), checked
when made, each error naming the setting; :func:`parse_bytes` reads a byte count as the flags
and the sidecar's settings take it (``512M``, ``1GiB``). :class:`LogStatus`: where the log
stands, as :meth:`~spotstop.guard._log_writer.LogWriter.status` reports it (whether it takes
writes, what waits in memory and in the journal, totals since the start); the sidecar's
readiness, its log watch and its metrics read it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from spotstop.guard._log_archive import Retention
from spotstop.guard._log_schema import FaultKind, RecordError
from spotstop.guard.validate import is_real

__all__ = [
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_MIN_FREE_BYTES",
    "LogOptions",
    "LogStatus",
    "parse_bytes",
]

DEFAULT_MAX_PENDING_BYTES: Final = 8 << 20
DEFAULT_MIN_FREE_BYTES: Final = 32 << 20

_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str | int, name: str) -> int:
    """A byte count: an int, or a number with K, M, G or T (powers of 1024), e.g. ``512M``,
    ``1.5GiB``; :class:`RecordError` (a ValueError) naming ``name`` otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    if m is None:
        raise RecordError(
            f"{name} must be a number of bytes, e.g. 536870912, 512M or 1GiB; got {text!r}."
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _nonneg_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordError(f"{name} must be a non-negative int (bytes); got {value!r}.")


@dataclass(frozen=True)
class LogOptions:
    """How the guard keeps its decision log (all optional; the defaults are stated).

    journal:
        The journal file for rows the log cannot take yet. None: the default place,
        ``$XDG_STATE_HOME/spotstop/journal/`` (``~/.local/state/...``). Put it on another file
        system than the log, so one full disk does not stop both.
    max_bytes, keep_days:
        The log's disk budget (:class:`~spotstop.guard._log_archive.Retention`): older
        decisions are archived as Parquet beside the log, then removed from it. None: no
        budget (the default: nothing is archived).
    min_free_bytes:
        Free space the log's file system must keep (default 32 MiB); below it the log is
        treated as full (decisions fail closed and wait) before SQLite fills the disk.
    max_pending_bytes:
        Most bytes of unwritten rows (and their images) held in memory (default 8 MiB);
        beyond it they are spilled to the journal.
    spill_after_s:
        Rows wait in memory at most this long before they are spilled (default 5 s), so a
        crash during a long outage loses none that waited longer.
    retention_every_s:
        Least time between two retention passes (default 60 s).
    robot_id:
        The robot the log belongs to (kept in it; a fleet card tells robots apart by it).
        None: as the log says.
    synchronous:
        ``"FULL"`` (the guard's default): a decision is acknowledged only once its row is
        fsynced, so it survives a power cut too (one fsync per guard call). ``"NORMAL"``: it
        survives a kill of the process, not a power cut (the last calls may roll back).
    """

    journal: Path | None = None
    max_bytes: int | None = None
    keep_days: float | None = None
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    spill_after_s: float = 5.0
    retention_every_s: float = 60.0
    robot_id: str | None = None
    synchronous: Literal["NORMAL", "FULL"] = "FULL"

    def __post_init__(self) -> None:
        if self.synchronous not in ("NORMAL", "FULL"):
            raise RecordError(
                f"synchronous (--log-sync) must be 'NORMAL' or 'FULL'; got {self.synchronous!r}."
            )
        if self.journal is not None and not isinstance(self.journal, Path):
            object.__setattr__(self, "journal", Path(self.journal))
        _nonneg_int("min_free_bytes (--log-min-free-bytes)", self.min_free_bytes)
        _nonneg_int("max_pending_bytes", self.max_pending_bytes)
        for name in ("spill_after_s", "retention_every_s"):
            v = getattr(self, name)
            if not is_real(v) or not v >= 0:
                raise RecordError(f"{name} must be a non-negative number of seconds; got {v!r}.")
        self.retention  # noqa: B018 - validates max_bytes and keep_days now

    @property
    def retention(self) -> Retention:
        return Retention(max_bytes=self.max_bytes, keep_days=self.keep_days)


@dataclass(frozen=True)
class LogStatus:
    """Where the decision log stands.

    ``writable``: the last write succeeded and the free space is above the floor; else
    ``fault`` (a :data:`~spotstop.guard._log_schema.FAULT_KINDS` kind), ``reason`` and
    ``since`` (epoch seconds) say what and since when. ``pending_rows``/``pending_bytes``:
    rows waiting in memory, ``pending_amendments`` fail-closed amendments; ``journal_rows``
    and ``journal_entries``: what waits in the journal; ``journal_fault``: why the journal
    cannot be read or written (None: it can; the log itself may still take decisions). ``spilled_rows``,
    ``imported_rows``, ``archived_rows``: totals since the writer started; ``faults``: failed
    write attempts by kind since then. ``accepting``: False only when memory is at its bound
    and the journal cannot take more (the guard then makes no decision).

    ``dead_letter``: the file beside the log where rows the log can never store are set aside
    (a text with no UTF-8 encoding, a policy document with a NaN; one such batch no longer
    blocks the rows after it); ``dead_letter_rows`` and ``dead_letter_amendments``: how many
    were set aside since the writer started (any at all is a fault to look into: the rows
    are in that file, not in the log); ``dead_letter_fault``: why the last attempt to set a
    batch aside failed (the batch then waits in memory, counted in ``pending_rows``, and is
    retried), None when it did not.
    """

    log: str
    writable: bool
    fault: FaultKind | None
    reason: str | None
    since: float | None
    pending_rows: int
    pending_bytes: int
    pending_amendments: int
    max_pending_bytes: int
    journal: str
    journal_rows: int
    journal_entries: int
    journal_fault: str | None
    spilled_rows: int
    imported_rows: int
    rejected_lines: int
    archived_rows: int
    over_budget: bool
    faults: Mapping[str, int]
    free_bytes: int | None
    min_free_bytes: int
    accepting: bool
    dead_letter: str | None = None
    dead_letter_rows: int = 0
    dead_letter_amendments: int = 0
    dead_letter_fault: str | None = None

    @property
    def waiting_rows(self) -> int:
        """Decisions made and not yet in the log (memory + journal)."""
        return self.pending_rows + self.journal_rows

    @property
    def waiting(self) -> bool:
        """Anything not yet in the log: rows or amendments, in memory or in the journal, or
        a journal that could not be read (what it holds is not known until it can be)."""
        return bool(
            self.pending_rows
            or self.pending_amendments
            or self.journal_entries
            or self.journal_fault is not None
        )

    def __repr__(self) -> str:
        state = "writable" if self.writable else f"NOT WRITABLE ({self.fault}: {self.reason})"
        return (
            f"LogStatus({self.log!r} {state}, pending {self.pending_rows} rows in memory, "
            f"{self.journal_rows} in journal {self.journal!r}, spilled {self.spilled_rows}, "
            f"imported {self.imported_rows}, archived {self.archived_rows}"
            + (
                f", SET ASIDE {self.dead_letter_rows} in {self.dead_letter!r}"
                if self.dead_letter_rows
                else ""
            )
            + ")"
        )
