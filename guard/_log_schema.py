"""The decision log's schema: its tables, its migrations, and the checks of what goes in.

The ``decisions`` table's columns derive from :class:`~spotstop.guard._record.DecisionRecord`
(one shape per decision). ``labels`` holds reviewers' labels, ``images`` the stored images
(off by default), ``policies`` every policy file that decided something (so readers replay
exactly what decided), ``meta`` the schema version. :data:`MIGRATE_1_TO_2` to
:data:`MIGRATE_4_TO_5` upgrade an older log in place, in turn;
:class:`~spotstop.guard._log.DecisionLog` runs them when it opens one (:func:`migrate`). Log
schema 4 kept the record's shape (record schema 3) and added ``archives``: the Parquet files
beside the log that hold the decisions retention moved out of it (``_log_archive.py``); its
``labels`` may name an archived decision. Log schema 5 (:data:`LOG_SCHEMA_VERSION`, record
schema 4) adds the ``deciding_kind`` column; rows written before it get it from their rule's
text, read here once (:func:`kind_of_old_rule`), in the migration and for older archives
(:func:`upgrade_columns`). No reader parses a rule.
"""

from __future__ import annotations

import datetime as _dt
import errno
import math
import numbers
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from spotstop.guard._errors import GuardError
from spotstop.guard._record import DecisionRecord, RecordError, sql_columns
from spotstop.guard.validate import is_real

__all__ = [
    "ADDED_COLUMNS",
    "ADDED_IN_RECORD_SCHEMA",
    "COLUMNS",
    "FAULT_KINDS",
    "INSERT",
    "LOG_SCHEMA_VERSION",
    "MIGRATE_1_TO_2",
    "MIGRATE_2_TO_3",
    "MIGRATE_3_TO_4",
    "MIGRATE_4_TO_5",
    "SCHEMA_SQL",
    "SELECT",
    "FaultKind",
    "LogError",
    "PolicyRow",
    "add_archive_filter",
    "as_migrated",
    "fault_kind",
    "kind_of_old_rule",
    "migrate",
    "upgrade_columns",
]

REVIEW_LABELS: Final = ("safe", "unsafe")

LOG_SCHEMA_VERSION: Final = 5
"""Version of the log's tables (``meta.schema_version``): 4 = record schema 3 + archives;
5 = record schema 4 (``deciding_kind``). A log of a higher version is refused (an older
spotstop would miss the archived rows)."""

FaultKind = Literal["disk_full", "read_only", "locked", "io_error", "closed", "other"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "disk_full",
    "read_only",
    "locked",
    "io_error",
    "closed",
    "other",
)
"""Why a log write failed, as the guard's reasons and the sidecar's metrics name it:
``disk_full`` (SQLITE_FULL, ENOSPC, or free space below the floor), ``read_only`` (a read-only
file or file system), ``locked`` (another process held the write lock past the wait),
``io_error`` (other I/O errors, a file that cannot be opened), ``closed`` (the log was
closed), ``other``."""

# SQLite primary result codes (sqlite3.h); Python exposes them on sqlite3.Error since 3.11
_SQLITE_KIND: Final[dict[int, FaultKind]] = {
    5: "locked",  # SQLITE_BUSY
    6: "locked",  # SQLITE_LOCKED
    8: "read_only",  # SQLITE_READONLY
    10: "io_error",  # SQLITE_IOERR
    13: "disk_full",  # SQLITE_FULL
    14: "io_error",  # SQLITE_CANTOPEN
}


def fault_kind(exc: BaseException) -> FaultKind:
    """The :data:`FaultKind` of an exception from SQLite or the file system."""
    if isinstance(exc, LogError):
        return exc.kind
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _SQLITE_KIND:
        return _SQLITE_KIND[code & 0xFF]
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full"
        if exc.errno == errno.EROFS:
            return "read_only"
        return "io_error"
    msg = str(exc).lower()
    if "disk is full" in msg or "no space" in msg:
        return "disk_full"
    if "readonly" in msg or "read-only" in msg:
        return "read_only"
    if "locked" in msg or "busy" in msg:
        return "locked"
    return "other"


class LogError(GuardError, RuntimeError):
    """The decision log could not be opened, read or written (schema, lock, closed, I/O).

    ``kind`` says why, as one of :data:`FAULT_KINDS` (``other`` for schema and usage errors).
    """

    def __init__(self, message: str, kind: FaultKind = "other") -> None:
        super().__init__(message)
        self.kind: FaultKind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.kind))


class ArchiveAmendError(LogError):
    """``mark_fail_closed(..., skip_unknown=True)`` amended the live rows but could not amend
    the archives (or tell whether they hold ``ids``): ``ids`` are the decisions not amended,
    ``kind`` why (``locked``: a retention pass held the archives; ``other``: an archive is
    missing or changed, which trying again does not mend)."""

    def __init__(self, message: str, kind: FaultKind, ids: tuple[str, ...]) -> None:
        super().__init__(message, kind)
        self.ids = ids

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.kind, self.ids))


POLICIES_SQL: Final = """
CREATE TABLE IF NOT EXISTS policies (
    policy_version TEXT PRIMARY KEY,
    policy_kind TEXT NOT NULL,
    fusion_key TEXT NOT NULL,
    bundle_id TEXT NOT NULL,
    prompt_hash TEXT NOT NULL,
    created TEXT NOT NULL,
    document TEXT NOT NULL,
    first_time REAL NOT NULL
)"""


# Labels name a decision of the log or of one of its archives, so no foreign key (log
# schema 4; set_labels checks the ids itself).
LABELS_SQL: Final = """
CREATE TABLE IF NOT EXISTS labels (
    decision_id TEXT PRIMARY KEY,
    label TEXT NOT NULL CHECK (label IN ('safe', 'unsafe')),
    contrast_id TEXT,
    reviewer TEXT,
    time REAL NOT NULL
)"""

# One row per archive file (a Parquet file in the ``<log>.archive/`` folder beside the log):
# its rows left the decisions table in the transaction that registered it, so a decision is
# in the live table or in exactly one registered archive, never both. ``id_filter``: a Bloom
# filter of its decision ids (``_log_id_filter.py``), NULL where not known: registered before
# it existed, or by an older spotstop of this schema, which leaves the column alone.
ARCHIVES_SQL: Final = """
CREATE TABLE IF NOT EXISTS archives (
    name TEXT PRIMARY KEY,
    n_rows INTEGER NOT NULL,
    first_time REAL NOT NULL,
    last_time REAL NOT NULL,
    n_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created REAL NOT NULL,
    id_filter BLOB
)"""

ARCHIVE_FILTER_COLUMN: Final = "id_filter"
"""The ``archives`` column added to schema 5 without a new version (nullable; an older spotstop
of schema 5 reads and writes the table without it): :func:`add_archive_filter` adds it."""


def add_archive_filter(conn: Any) -> None:
    """Add ``archives.id_filter`` to a log whose table lacks it (its registrations NULL: their
    archives are read whole when an id is looked for), in the caller's transaction."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(archives)")}
    if have and ARCHIVE_FILTER_COLUMN not in have:
        conn.execute(f"ALTER TABLE archives ADD COLUMN {ARCHIVE_FILTER_COLUMN} BLOB")


COLUMNS: Final = tuple(name for name, _ in sql_columns())
ID_COLUMN: Final = COLUMNS.index("decision_id")
TIME_COLUMN: Final = COLUMNS.index("time")
SELECT: Final = "SELECT " + ", ".join(f"d.{c}" for c in COLUMNS)
INSERT: Final = (
    f"INSERT INTO decisions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
)
#: :data:`INSERT` at a given position (the rowid first), for a row whose position SQLite
#: would give wrongly (guard/_log.py ``_first_position``)
INSERT_AT: Final = (
    f"INSERT INTO decisions (rowid, {', '.join(COLUMNS)}) "
    f"VALUES (?, {', '.join('?' * len(COLUMNS))})"
)

SCHEMA_SQL: Final = (
    """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
"""
    + ",\n".join(f"    {name} {sql}" for name, sql in sql_columns())
    + """
);
CREATE INDEX IF NOT EXISTS decisions_time ON decisions (time);
CREATE INDEX IF NOT EXISTS decisions_situation ON decisions (situation_id, time);
"""
    + LABELS_SQL
    + """;
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    n_bytes INTEGER NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS images_time ON images (time);
"""
    + POLICIES_SQL
    + ";"
    + ARCHIVES_SQL
)

# Schema 1 -> 2: the columns schema 2 added, with what schema-1 rows get. A schema-1 row's
# ``fused_score`` was the score its policy compared, so it becomes ``policy_score`` too; its
# kind is the rule's first part ("situation->frozen" -> "situation"). Nothing is dropped.
MIGRATE_1_TO_2: Final = (
    "ALTER TABLE decisions ADD COLUMN batch_id TEXT",
    "ALTER TABLE decisions ADD COLUMN policy_score REAL",
    "ALTER TABLE decisions ADD COLUMN policy_kind TEXT",
    "ALTER TABLE decisions ADD COLUMN policy_version TEXT",
    "ALTER TABLE decisions ADD COLUMN fusion_key TEXT",
    "ALTER TABLE decisions ADD COLUMN detail TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE decisions ADD COLUMN cue_flags TEXT",
    "ALTER TABLE decisions ADD COLUMN cue_text TEXT",
    "ALTER TABLE decisions ADD COLUMN test_pair INTEGER NOT NULL DEFAULT 0",
    "UPDATE decisions SET policy_score = fused_score, policy_kind = CASE "
    "WHEN instr(policy, '->') > 0 THEN substr(policy, 1, instr(policy, '->') - 1) "
    "ELSE policy END",
    POLICIES_SQL,
    "UPDATE meta SET value = '2' WHERE key = 'schema_version'",
)

# Schema 2 -> 3: ``members_run`` (NULL for older rows: every member that loaded was run).
MIGRATE_2_TO_3: Final = (
    "ALTER TABLE decisions ADD COLUMN members_run TEXT",
    "UPDATE meta SET value = '3' WHERE key = 'schema_version'",
)


# Schema 3 -> 4: archives, and labels without the foreign key (a label may name an archived
# decision). The labels are copied whole.
MIGRATE_3_TO_4: Final = (
    LABELS_SQL.replace("EXISTS labels", "EXISTS labels_v4"),
    "INSERT INTO labels_v4 (decision_id, label, contrast_id, reviewer, time) "
    "SELECT decision_id, label, contrast_id, reviewer, time FROM labels",
    "DROP TABLE labels",
    "ALTER TABLE labels_v4 RENAME TO labels",
    ARCHIVES_SQL,
    "UPDATE meta SET value = '4' WHERE key = 'schema_version'",
)


# Schema 4 -> 5: ``deciding_kind``, the kind whose threshold decided. Older rows get it from
# their rule's text (its last part: "situation->conformal" -> "conformal", "cascade[pair]->
# frozen" -> "frozen"), by the SQL function :func:`migrate` registers for this (the only
# reading of a rule's text); NULL where no threshold was applied.
MIGRATE_4_TO_5: Final = (
    "ALTER TABLE decisions ADD COLUMN deciding_kind TEXT",
    "UPDATE decisions SET deciding_kind = spotstop_kind_of_old_rule(policy, threshold)",
    "UPDATE meta SET value = '5' WHERE key = 'schema_version'",
)

_RULE_SEP: Final = "->"


def kind_of_old_rule(rule: str | None, threshold: float | None) -> str | None:
    """``deciding_kind`` of a row written before log schema 5: the kind at the end of its rule
    (``"situation->conformal"`` → ``"conformal"``, ``"frozen"`` → ``"frozen"``), None where
    no threshold was applied (``threshold`` NULL or NaN: no policy decided the scene).

    The one place that reads a rule's text: :data:`MIGRATE_4_TO_5` calls it (as the SQL
    function ``spotstop_kind_of_old_rule``), :func:`upgrade_columns` for an archive
    written before the column existed and :func:`as_migrated` for a row of an older record
    schema written after the migration. Every reader after that uses the column.
    """
    if rule is None or threshold is None or not math.isfinite(float(threshold)):
        return None
    return str(rule).rsplit(_RULE_SEP, 1)[-1] or None


#: columns a later log schema added -> how a row written before it gets its value from its
#: other columns (name -> value); archives written under an older log schema lack them.
ADDED_COLUMNS: Final[dict[str, Callable[[Mapping[str, Any]], Any]]] = {
    "deciding_kind": lambda row: kind_of_old_rule(row["policy"], row["threshold"]),
}


#: the record schema that added each of :data:`ADDED_COLUMNS`
ADDED_IN_RECORD_SCHEMA: Final[dict[str, int]] = {"deciding_kind": 4}

_SCHEMA_VERSION_COLUMN: Final = COLUMNS.index("schema_version")
_ADDED_AT: Final = tuple(
    (COLUMNS.index(name), ADDED_IN_RECORD_SCHEMA[name], value)
    for name, value in ADDED_COLUMNS.items()
)


def as_migrated(row: Sequence[Any]) -> tuple[Any, ...]:
    """A ``decisions`` row (:data:`COLUMNS` order) as the migration gives it: each of
    :data:`ADDED_COLUMNS` that a row of an older record schema holds as NULL gets the
    migration's value. A row the migration met has it already; one a guard of an older log
    schema wrote after a newer spotstop migrated the log (it kept running, and inserts without
    the column) has not, and would read as if no policy had decided it."""
    version = row[_SCHEMA_VERSION_COLUMN]
    fix = [(i, value) for i, added, value in _ADDED_AT if row[i] is None and version < added]
    if not fix:
        return tuple(row)
    named = dict(zip(COLUMNS, row, strict=True))
    out = list(row)
    for i, value in fix:
        out[i] = value(named)
    return tuple(out)


def upgrade_columns(cols: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """Columns of ``decisions`` rows (name -> values) with every :data:`ADDED_COLUMNS` that
    ``cols`` lacks filled in as the migration fills it; other columns as given."""
    out = dict(cols)
    n = len(next(iter(cols.values()), []))
    for name, value in ADDED_COLUMNS.items():
        if name not in out:
            rows = ({k: v[i] for k, v in cols.items()} for i in range(n))
            out[name] = [value(r) for r in rows]
    return out


def migrate(conn: sqlite3.Connection, found: int) -> None:
    """Upgrade a log of schema ``found`` (1 to 4) to :data:`LOG_SCHEMA_VERSION` in place, in
    the caller's transaction: each step's statements in turn."""
    conn.create_function("spotstop_kind_of_old_rule", 2, kind_of_old_rule, deterministic=True)
    steps = (MIGRATE_1_TO_2, MIGRATE_2_TO_3, MIGRATE_3_TO_4, MIGRATE_4_TO_5)
    for statements in steps[found - 1 :]:
        for statement in statements:
            conn.execute(statement)


@dataclass(frozen=True)
class PolicyRow:
    """A policy as the log keeps it, so that readers can replay what decided.

    version_id / kind / fusion_key: as in the decisions' columns. bundle_id, prompt_hash,
    created: from the policy file. document: the whole ``policy.yaml`` as a JSON object.
    first_time: when the log first saw a decision of it.
    """

    version_id: str
    kind: str
    fusion_key: str
    bundle_id: str
    prompt_hash: str
    created: str
    document: Mapping[str, Any]
    first_time: float = 0.0


def check_log_args(
    path: str | os.PathLike[str],
    image_retention_bytes: int | None,
    image_retention_days: float | None,
    timeout_s: float,
    synchronous: str,
) -> Path:
    if str(path) in ("", ":memory:") or str(path).startswith("file:"):
        raise RecordError(
            f"DecisionLog path must be a file path; got {str(path)!r}. The log opens one "
            "connection per thread and process, so an in-memory database cannot be shared. "
            "Pass e.g. 'decisions.sqlite'."
        )
    if image_retention_bytes is not None and (
        not isinstance(image_retention_bytes, numbers.Integral)
        or isinstance(image_retention_bytes, bool)
        or image_retention_bytes < 0
    ):
        raise RecordError(
            "DecisionLog image_retention_bytes must be a non-negative int or None (no size "
            f"limit); got {image_retention_bytes!r}."
        )
    if image_retention_days is not None and (
        not is_real(image_retention_days) or not float(image_retention_days) > 0
    ):
        raise RecordError(
            "DecisionLog image_retention_days must be a positive number or None (no age "
            f"limit); got {image_retention_days!r}."
        )
    if not is_real(timeout_s) or not (0 < float(timeout_s) < math.inf):
        raise RecordError(
            f"DecisionLog timeout_s must be a positive finite number of seconds; got {timeout_s!r}."
        )
    if synchronous not in ("NORMAL", "FULL"):
        raise RecordError(
            f"DecisionLog synchronous must be 'NORMAL' or 'FULL'; got {synchronous!r}. "
            "NORMAL survives a process kill; FULL also survives power loss."
        )
    return Path(path)


def to_epoch(name: str, value: float | _dt.datetime | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise RecordError(
                f"{name} is a naive datetime ({value!r}); the log's times are UTC. Pass an "
                "aware datetime (e.g. datetime.now(timezone.utc)) or seconds since the epoch."
            )
        return value.timestamp()
    if not is_real(value) or math.isnan(float(value)):
        raise RecordError(
            f"{name} must be seconds since the Unix epoch (float), an aware datetime or None; "
            f"got {value!r}."
        )
    return float(value)


def check_append(record: object, image_bytes: object) -> None:
    if not isinstance(record, DecisionRecord):
        raise RecordError(
            f"append expects a DecisionRecord; got {type(record).__name__}. Build one with "
            "DecisionRecord(request=..., member_scores=..., ...)."
        )
    if not record.decision_id:
        raise RecordError(
            "DecisionRecord.decision_id must be a non-empty str to be logged; leave it out to "
            "get a fresh uuid4."
        )
    if image_bytes is not None and not isinstance(image_bytes, bytes | bytearray | memoryview):
        raise RecordError(
            f"append image_bytes must be bytes or None; got {type(image_bytes).__name__}."
        )


def check_labels(labels: object) -> list[tuple[str, str, str | None, str | None]]:
    if isinstance(labels, str | bytes) or not isinstance(labels, Iterable):
        raise RecordError(
            "set_labels expects a list of (decision_id, label, contrast_id, reviewer) tuples; "
            f"got {type(labels).__name__}."
        )
    out: list[tuple[str, str, str | None, str | None]] = []
    seen: set[str] = set()
    for i, item in enumerate(labels):
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 4:
            raise RecordError(
                f"set_labels item {i} must be a 4-tuple (decision_id, label, contrast_id, "
                f"reviewer); got {item!r}. Use None for a missing contrast_id or reviewer."
            )
        decision_id, label, contrast_id, reviewer = item
        if not isinstance(decision_id, str) or not decision_id:
            raise RecordError(
                f"set_labels item {i}: decision_id must be a non-empty str; got {decision_id!r}."
            )
        if label not in REVIEW_LABELS:
            raise RecordError(
                f"set_labels item {i} (decision_id {decision_id!r}): label must be one of "
                f"{list(REVIEW_LABELS)}; got {label!r}. Reviewer labels are lower case."
            )
        for name, v in (("contrast_id", contrast_id), ("reviewer", reviewer)):
            if v is not None and not isinstance(v, str):
                raise RecordError(
                    f"set_labels item {i} (decision_id {decision_id!r}): {name} must be a str "
                    f"or None; got {v!r}."
                )
        if decision_id in seen:
            raise RecordError(
                f"set_labels: decision_id {decision_id!r} appears twice in one call; give "
                "each decision one label per call."
            )
        seen.add(decision_id)
        out.append((decision_id, label, contrast_id, reviewer))
    return out
