"""What the robot was answered that its log does not say yet, for the log's readers.

While the log cannot take a change, the guard keeps it elsewhere (``_log_writer.py``):

* a fail-closed **amendment**: a SAFE row whose write ended after the call's deadline was
  answered UNSAFE; the row is amended in place, and until then the change waits in the
  journal (``_journal.py``), or for good in the dead letter beside the log when the log
  cannot store it;
* **rows** the log did not take: answered fail-closed UNSAFE, they wait in the journal, or
  in the dead letter when the log can never store them. The log lacks them, or (a write
  reported failed that committed all the same) holds them as they were decided: the
  import then amends them to what was answered.

A reader of the log alone would count such a decision as the log has it (SAFE, or not at
all). :func:`read_pending` reads both places, without writing to either (no lock, no file
set apart: :meth:`Journal.peek`, :meth:`DeadLetter.changes`), with the writer's own parser
and its own rule for what each entry changes (:attr:`JournalEntry.amendments`,
:func:`~spotstop.guard._journal.amendments_of`); :meth:`PendingChanges.amend` applies them
to the log's rows with the rule the log's ``UPDATE`` is derived from
(:mod:`~spotstop.guard._log_amend`: a SAFE row becomes a fail-closed UNSAFE; an UNSAFE one
stays as it is) and :meth:`PendingChanges.answers` counts what it could not apply: decisions
the log lacks. Every reader of the log applies them (:meth:`DecisionLog.records
<spotstop.guard.DecisionLog.records>`, ``get``, ``to_arrays``, the CSV and Parquet exports,
:func:`~spotstop.guard.read_reviewed` and so the card, ``calibrate`` and every reader
through it), and so does a retention pass to the rows it archives: each sees what the robot
received unless it asks for the log's rows as stored (``raw=True``).

The journal read is the log's default one (``default_journal_path``, as the reader's
``$XDG_STATE_HOME`` gives it) unless the reader names the guard's ``--journal``; read it
while the guard runs, as the guard's user, for the figures to include it. Changes held in the
guard's memory only (the journal could not take them either) are in its ``/readyz`` and
``/metrics``, not here.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotstop.guard._journal import (
    DeadLetter,
    Journal,
    default_dead_letter_path,
    default_journal_path,
)
from spotstop.guard._log_amend import amend_row
from spotstop.guard._log_schema import ID_COLUMN, LogError

__all__ = ["PendingAnswers", "PendingChanges", "read_pending"]


@dataclass(frozen=True)
class PendingAnswers:
    """What a reader's figures make of the answers the log does not say yet.

    amended: decisions the log holds as SAFE that the robot was answered fail-closed UNSAFE
        (an amendment waits in the journal or the dead letter): read as answered.
    missing_journal, missing_dead_letter: decisions the robot was answered (fail-closed
        UNSAFE) that the log lacks: waiting in the journal, or set aside in the dead letter.
        Not among the decisions read; a fail-closed decision never enters a statistic.
    unknown: amended ids the log does not hold at all.
    unreadable: journal and dead-letter lines that could not be read (torn, or written by
        another spotstop); ``faults``: why a place could not be read at all.
    journal, dead_letter: the files read (None: absent).
    decisions: ``(decision id, where, bundle id, prompt hash)`` of each decision counted in
        ``amended`` (where ``"amended"``), ``missing_journal`` (``"journal"``) and
        ``missing_dead_letter`` (``"dead_letter"``): what a reader of one bundle's decisions
        counts of them (:func:`~spotstop.guard.pending_of_bundle`). ``unknown``,
        ``unreadable`` and ``faults`` name no bundle.
    """

    amended: int = 0
    missing_journal: int = 0
    missing_dead_letter: int = 0
    unknown: int = 0
    unreadable: int = 0
    faults: tuple[str, ...] = ()
    journal: str | None = None
    dead_letter: str | None = None
    decisions: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def missing(self) -> int:
        """Decisions answered that the log lacks."""
        return self.missing_journal + self.missing_dead_letter

    def __bool__(self) -> bool:
        return bool(self.amended or self.missing or self.unknown or self.unreadable or self.faults)

    def message(self) -> str:
        """One paragraph for a reader's output ("" when the log says everything)."""
        parts: list[str] = []
        if self.amended:
            parts.append(
                f"{self.amended} decision(s) the log still holds as SAFE were answered "
                "fail-closed UNSAFE (their amendment waits in the journal or the dead letter): "
                "read as answered, so they are left out as fail-closed"
            )
        if self.missing:
            parts.append(
                f"{self.missing} decision(s) answered fail-closed UNSAFE are not in the log "
                f"({self.missing_journal} waiting in the journal, {self.missing_dead_letter} "
                "set aside in the dead letter): not in these figures"
            )
        if self.unknown:
            parts.append(f"{self.unknown} amended decision id(s) are in no row of the log")
        if self.unreadable:
            parts.append(
                f"{self.unreadable} journal or dead-letter line(s) could not be read; what "
                "they hold is not applied"
            )
        parts += [f"not read: {f}" for f in self.faults]
        if not parts:
            return ""
        where = ", ".join(p for p in (self.journal, self.dead_letter) if p)
        return "; ".join(parts) + (f" ({where})" if where else "") + "."

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["decisions"]  # the counts say it; the ids are in the journal and dead letter
        return {**out, "faults": list(self.faults), "missing": self.missing}

    @classmethod
    def total(cls, parts: Sequence[PendingAnswers]) -> PendingAnswers:
        """Several logs' (a fleet's) together; the files are named when there is one."""
        if len(parts) == 1:
            return parts[0]
        counts = {
            f.name: sum(getattr(p, f.name) for p in parts)
            for f in dataclasses.fields(cls)
            if f.type == "int"
        }
        return cls(
            **counts,
            faults=tuple(f for p in parts for f in p.faults),
            decisions=tuple(d for p in parts for d in p.decisions),
        )


@dataclass(frozen=True)
class PendingChanges:
    """The changes waiting for one log (:func:`read_pending`), to apply to what it says."""

    amendments: tuple[tuple[tuple[str, ...], str], ...]
    journal_rows: frozenset[str]
    dead_letter_rows: frozenset[str]
    unreadable: int = 0
    faults: tuple[str, ...] = ()
    journal: str | None = None
    dead_letter: str | None = None
    row_bundles: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """Decision id -> (bundle id, prompt hash) of each row waiting in the journal or the dead
    letter."""

    @functools.cached_property
    def reasons(self) -> Mapping[str, str]:
        """Decision id -> the reason it is amended with: its first amendment's, as the log
        applies them in turn (a later one finds the row UNSAFE already and leaves it)."""
        out: dict[str, str] = {}
        for ids, reason in self.amendments:
            for i in ids:
                out.setdefault(i, reason)
        return out

    def amend(self, row: Sequence[Any]) -> tuple[Any, ...] | None:
        """A ``decisions`` row (live or archived) as the robot received its decision; None
        when nothing that waits changes it. The change is the log's own
        (:func:`~spotstop.guard._log_amend.amend_row`, the rule of
        :meth:`~spotstop.guard.DecisionLog.mark_fail_closed`): a SAFE row becomes a
        fail-closed UNSAFE with the amendment's reason; an UNSAFE one stays as it is."""
        reason = self.reasons.get(row[ID_COLUMN]) if self.amendments else None
        return None if reason is None else amend_row(row, reason)

    def amend_rows(
        self, rows: Sequence[Sequence[Any]]
    ) -> tuple[list[tuple[Any, ...]], tuple[str, ...]]:
        """``rows`` as the robot received them (:meth:`amend`), and the ids of those changed."""
        out: list[tuple[Any, ...]] = []
        changed: list[str] = []
        for row in rows:
            new = self.amend(row)
            if new is not None:
                changed.append(str(row[ID_COLUMN]))
            out.append(tuple(row) if new is None else new)
        return out, tuple(changed)

    def answers(
        self, decisions: Iterable[tuple[str, str, str]], amended: Iterable[str]
    ) -> PendingAnswers:
        """What a reader of every decision of the log (``decisions``: the id, bundle id and
        prompt hash of each) that applied these changes (``amended``: the ids of the rows
        they changed, :meth:`amend_rows`) should say of them."""
        made = {str(i): (str(b), str(p)) for i, b, p in decisions}
        kept = self.journal_rows | self.dead_letter_rows
        unknown = {i for i in self.reasons if i not in made and i not in kept}
        missing_dl = {i for i in self.dead_letter_rows if i not in made}
        missing_j = {i for i in self.journal_rows if i not in made} - missing_dl
        changed = sorted(set(amended))
        which = [(i, "amended", *made[i]) for i in changed if i in made]
        for where, ids in (("journal", missing_j), ("dead_letter", missing_dl)):
            which += [(i, where, *self.row_bundles.get(i, ("", ""))) for i in sorted(ids)]
        return PendingAnswers(
            amended=len(changed),
            missing_journal=len(missing_j),
            missing_dead_letter=len(missing_dl),
            unknown=len(unknown),
            unreadable=self.unreadable,
            faults=self.faults,
            journal=self.journal,
            dead_letter=self.dead_letter,
            decisions=tuple(which),
        )


def read_pending(
    log_path: str | os.PathLike[str], journal: str | os.PathLike[str] | None = None
) -> PendingChanges:
    """The changes waiting for the log at ``log_path`` in its journal (``journal``, else its
    default one) and its dead letter; read only, never written. A place that cannot be read
    (permissions) is named in ``faults``, not raised: the log itself is still read."""
    log_path = Path(os.path.abspath(log_path))
    jpath = Path(journal) if journal is not None else default_journal_path(log_path)
    amendments: list[tuple[tuple[str, ...], str]] = []
    journal_rows: set[str] = set()
    row_bundles: dict[str, tuple[str, str]] = {}
    unreadable = 0
    faults: list[str] = []
    read_journal = read_dead = None
    try:
        read = Journal(jpath, owner=str(log_path.resolve())).peek()
    except (OSError, LogError) as e:  # a folder at that path, or no permission to read
        faults.append(f"journal {str(jpath)!r} ({e})")
    else:
        if read.n_bytes:
            read_journal = str(jpath)
        unreadable += read.rejected
        for entry in read.entries:
            amendments += entry.amendments
            journal_rows |= {r.decision_id for r in entry.records}
            row_bundles.update((r.decision_id, (r.bundle_id, r.prompt_hash)) for r in entry.records)
    dead = DeadLetter(default_dead_letter_path(log_path))
    try:
        dl = dead.changes()
    except OSError as e:
        faults.append(f"dead letter {str(dead.path)!r} ({e})")
        dl = None
    if dl is not None:
        if dl.amendments or dl.rows or dl.unreadable:
            read_dead = str(dead.path)
        amendments += dl.amendments
        unreadable += dl.unreadable
        row_bundles.update((i, (b, p)) for i, b, p in dl.bundles)
    return PendingChanges(
        tuple(amendments),
        frozenset(journal_rows),
        frozenset(() if dl is None else dl.rows),
        unreadable,
        tuple(faults),
        read_journal,
        read_dead,
        row_bundles,
    )
