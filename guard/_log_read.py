"""Reading the decision log back: aligned numpy arrays for the offline rooms, CSV and Parquet.

:func:`log_arrays` turns joined (record, review label) rows into :class:`LogArrays`;
:func:`write_csv` and :func:`write_parquet` write them flat, one column per record field
(dict fields expanded to ``<field>.<name>``), derived from the record's own field list.
:class:`~spotstop.guard.DecisionLog` calls these from ``to_arrays``/``export_*``.

*Log order* is the order the log took the decisions in: a row's position (its SQLite rowid;
an archived row keeps it in the archive's ``log_seq`` column). The guard writes each call's
rows after everything still waiting, oldest first, so this is the order it decided in, which
its stateful policies' windows followed. It is not the ``time`` column's order: a wall clock
stepped back (NTP on a robot whose clock ran ahead) gives later decisions earlier times, and a
replay sorted by time would run the situation windows in another order than the guard did.
``time`` still selects (``since``/``until``). Positions never repeat: retention never archives
a log's newest row, so the next rowid is always above every archived one.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as _dt
import heapq
import json
import logging
import math
import os
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from spotstop.guard._errors import GuardError
from spotstop.guard._log_archive import ArchiveInfo, check_present, read_archive
from spotstop.guard._log_pending import PendingChanges, read_pending
from spotstop.guard._log_schema import (
    COLUMNS,
    ID_COLUMN,
    SELECT,
    TIME_COLUMN,
    LogError,
    PolicyRow,
    RecordError,
    as_migrated,
    to_epoch,
)
from spotstop.guard._record import (
    _FIELDS,
    SCHEMA_VERSION,
    DecisionRecord,
    _from_sql,
    record_from_row,
)

__all__ = [
    "EXPORT_ROWS",
    "LogArrays",
    "LogReader",
    "arrays_from_rows",
    "export_columns",
    "log_arrays",
    "write_csv",
    "write_parquet",
]

_PAGE_ROWS: Final = 1000  # rows per read page of DecisionLog.records
_logger = logging.getLogger("spotstop.guard")


def _record(row: Sequence[Any]) -> DecisionRecord:
    """The record of a ``decisions`` row (live or archived), read as the log's migration gives
    it (:func:`~spotstop.guard._log_schema.as_migrated`)."""
    return record_from_row(as_migrated(row))


def _position(item: tuple[Any, ...]) -> int:
    """The merge key of a ``(time, position, row, ...)`` item: the log's order (module doc)."""
    return int(item[1])


_SITUATION_COLUMN: Final = COLUMNS.index("situation_id")

Joined = Sequence[tuple[DecisionRecord, tuple[Any, ...]]]
"""(record, (review label, contrast id, reviewer, review time)) per decision, in log order."""


@dataclass(frozen=True, eq=False, repr=False)
class LogArrays:
    """The log as aligned numpy arrays, one entry per decision, in log order.

    Every array has length ``n``; index i of every array refers to the same decision.
    """

    decision_id: np.ndarray
    """Decision ids (object array of str)."""

    time: np.ndarray
    """Decision times, seconds since the Unix epoch (float64)."""

    situation_id: np.ndarray
    """Situation ids (object array of str or None): the guard's, or a reviewer's regrouping
    where a labels file gives one (:func:`~spotstop.guard._reviewed.read_reviewed`)."""

    logged_situation_id: np.ndarray
    """The situation ids the guard was given and keyed its windows by, as logged (object
    array of str or None): what a replay of the guard's decisions reads."""

    request: np.ndarray
    """Requests (object array of str)."""

    image_sha256: np.ndarray
    """SHA-256 of each decision's encoded image (object array of str or None)."""

    batch_id: np.ndarray
    """Guard-call (batch) ids (object array of str or None for schema-1 rows)."""

    fused: np.ndarray
    """Fused scores S under the deciding policy's reference fusion (float64, NaN kept)."""

    policy_score: np.ndarray
    """The scores the policy compared with its thresholds (float64, NaN kept)."""

    threshold: np.ndarray
    """Thresholds the policy applied (float64, NaN kept)."""

    member_scores: dict[str, np.ndarray]
    """Member name -> scene scores (float64; NaN where the member has no score)."""

    member_scores_gray: dict[str, np.ndarray]
    """Member name -> gray-image scores (float64; NaN where not run)."""

    member_scores_text: dict[str, np.ndarray]
    """Member name -> request-only scores (float64; NaN where not run)."""

    guard_label: np.ndarray
    """The guard's answer as int8: 1 UNSAFE, 0 SAFE."""

    label: np.ndarray
    """Reviewer label from the labels table as int8: 1 unsafe, 0 safe, -1 unlabelled."""

    contrast_id: np.ndarray
    """Contrast id from the labels table (object array of str or None)."""

    width: np.ndarray
    """Image width in pixels (float64; NaN where missing)."""

    height: np.ndarray
    """Image height in pixels (float64; NaN where missing)."""

    n_bytes: np.ndarray
    """Encoded image size in bytes (float64; NaN where missing)."""

    image_format: np.ndarray
    """Image format (object array of str or None)."""

    fail_closed: np.ndarray
    """Whether the guard failed closed (bool)."""

    policy: np.ndarray
    """The rule that set each threshold, e.g. ``situation->frozen`` (object array of str)."""

    policy_kind: np.ndarray
    """Configured policy kinds (object array of str or None)."""

    deciding_kind: np.ndarray
    """The kinds whose thresholds decided (``conformal`` for ``situation->conformal``; object
    array of str, None where no policy decided): the column, never the rule's text."""

    policy_version: np.ndarray
    """Version ids of the deciding policies (object array of str or None for schema-1 rows)."""

    fusion_key: np.ndarray
    """Fusion fingerprints (object array of str or None for schema-1 rows)."""

    cue_flags: dict[str, np.ndarray]
    """Cue name -> flag as int8: 1 flagged, 0 not, -1 not detected."""

    members_run: dict[str, np.ndarray]
    """Member name -> whether it was run on the scene as int8: 1 run, 0 not, -1 unknown
    (rows of schema 1 and 2, before the log recorded it)."""

    bundle_id: np.ndarray
    """Bundle ids (object array of str)."""

    prompt_hash: np.ndarray
    """Prompt hashes (object array of str)."""

    @property
    def n(self) -> int:
        """Number of decisions."""
        return int(self.decision_id.shape[0])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        labelled = int(np.count_nonzero(self.label >= 0))
        return (
            f"LogArrays(n={self.n}, members={sorted(self.member_scores)}, "
            f"labelled={labelled}, fail_closed={int(np.count_nonzero(self.fail_closed))})"
        )

    def take(self, idx: NDArray[np.intp]) -> LogArrays:
        """These decisions in the order ``idx`` gives (a subset or a permutation)."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            kw[f.name] = {k: a[idx] for k, a in v.items()} if isinstance(v, dict) else v[idx]
        return LogArrays(**kw)

    @classmethod
    def concat(cls, parts: Sequence[LogArrays]) -> LogArrays:
        """The decisions of ``parts`` one after the other. A member or cue some part lacks is
        NaN (scores) or -1 (flags, members run) there, as for a decision that has none."""
        if not parts:
            return log_arrays([])
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            vals = [getattr(p, f.name) for p in parts]
            if not isinstance(vals[0], dict):
                kw[f.name] = np.concatenate(vals)
                continue
            keys = list(dict.fromkeys(k for v in vals for k in v))
            flags = f.name in ("cue_flags", "members_run")
            dtype, fill = (np.int8, -1) if flags else (np.float64, math.nan)
            kw[f.name] = {
                k: np.concatenate(
                    [
                        v.get(k, np.full(q.n, fill, dtype=dtype))
                        for v, q in zip(vals, parts, strict=True)
                    ]
                )
                for k in keys
            }
        return cls(**kw)


def log_arrays(joined: Joined) -> LogArrays:
    """The joined records as aligned arrays (see :class:`LogArrays`)."""
    recs = [r for r, _ in joined]
    cols = {f.name: [getattr(r, f.name) for r in recs] for f in _FIELDS}
    return _arrays(cols, [lab for _, lab in joined])


def arrays_from_rows(rows: Sequence[Sequence[Any]], review: Sequence[tuple[Any, ...]]) -> LogArrays:
    """Rows of the ``decisions`` table (live or archived) and their review labels as aligned
    arrays: :func:`log_arrays` without building a validated record per row (they were
    validated when written), decoded column by column: twice as fast on a big log. Each row
    is read as the log's migration gives it (:func:`~spotstop.guard._log_schema.as_migrated`)."""
    rows = [as_migrated(r) for r in rows]
    cols = {
        f.name: [_from_sql(f.metadata["codec"], r[i]) for r in rows] for i, f in enumerate(_FIELDS)
    }
    return _arrays(cols, list(review))


def _arrays(cols: Mapping[str, list[Any]], review: list[tuple[Any, ...]]) -> LogArrays:
    n = len(review)

    def obj(values: Iterable[Any]) -> np.ndarray:
        out = np.empty(n, dtype=object)
        out[:] = list(values)
        return out

    def flt(values: Iterable[float | int | None]) -> np.ndarray:
        return np.array(
            [math.nan if v is None else float(v) for v in values], dtype=np.float64
        ).reshape(n)

    def names(col: list[Any]) -> list[str]:
        seen: dict[str, None] = {}
        for d in col:
            seen.update(dict.fromkeys(d or {}))
        return list(seen)

    def scores(col: list[Any]) -> dict[str, np.ndarray]:
        return {k: flt((d or {}).get(k, math.nan) for d in col) for k in names(col)}

    def flags(col: list[Any]) -> dict[str, np.ndarray]:
        return {
            k: np.array(
                [-1 if d is None or k not in d else int(d[k]) for d in col], dtype=np.int8
            ).reshape(n)
            for k in names(col)
        }

    label_code = {"unsafe": 1, "safe": 0, None: -1}
    return LogArrays(
        decision_id=obj(cols["decision_id"]),
        time=flt(cols["time"]),
        batch_id=obj(cols["batch_id"]),
        situation_id=obj(cols["situation_id"]),
        logged_situation_id=obj(cols["situation_id"]),
        request=obj(cols["request"]),
        image_sha256=obj(cols["image_sha256"]),
        fused=flt(cols["fused_score"]),
        policy_score=flt(cols["policy_score"]),
        threshold=flt(cols["threshold"]),
        member_scores=scores(cols["member_scores"]),
        member_scores_gray=scores(cols["member_scores_gray"]),
        member_scores_text=scores(cols["member_scores_text"]),
        guard_label=np.array([x == "UNSAFE" for x in cols["label"]], dtype=np.int8).reshape(n),
        label=np.array([label_code[lab[0]] for lab in review], dtype=np.int8).reshape(n),
        contrast_id=obj(lab[1] for lab in review),
        width=flt(cols["width"]),
        height=flt(cols["height"]),
        n_bytes=flt(cols["n_bytes"]),
        image_format=obj(cols["image_format"]),
        fail_closed=np.array([bool(x) for x in cols["fail_closed"]], dtype=bool).reshape(n),
        policy=obj(cols["policy"]),
        policy_kind=obj(cols["policy_kind"]),
        deciding_kind=obj(cols["deciding_kind"]),
        policy_version=obj(cols["policy_version"]),
        fusion_key=obj(cols["fusion_key"]),
        cue_flags=flags(cols["cue_flags"]),
        members_run=flags(cols["members_run"]),
        bundle_id=obj(cols["bundle_id"]),
        prompt_hash=obj(cols["prompt_hash"]),
    )


_FLAT_KIND = {
    "str": "str",
    "opt_str": "str",
    "label": "str",
    "float": "float",
    "opt_int": "int",
    "int": "int",
    "bool": "bool",
}
_PREFIX = {
    "member_scores": "score",
    "member_scores_gray": "score_gray",
    "member_scores_text": "score_text",
    "latency_ms": "latency_ms",
    "cue_flags": "cue",
    "members_run": "ran",
}


EXPORT_ROWS: Final = "export_rows"
"""The export column that says what every row is: ``as_answered`` (amendments waiting in the
journal or the dead letter applied) or ``raw`` (the rows as the log stores them)."""


def export_columns(joined: Joined, rows: str = "as_answered") -> list[tuple[str, str, list[Any]]]:
    """Flat columns ``(name, kind, values)``; kind is str, float, int or bool.

    One column per scalar field of :class:`DecisionRecord` (plus ``time_utc``), each dict
    field expanded to ``score.<member>``, ``score_gray.<member>``, ``score_text.<member>``,
    ``latency_ms.<stage>``, ``cue.<cue>`` and ``ran.<member>``, then the reviewer's ``review_*``
    columns, then :data:`EXPORT_ROWS` (``rows`` in every row: a copy of the file, or of any
    of its rows, still says whether a SAFE in it may have been answered UNSAFE).
    """
    if rows not in ("as_answered", "raw"):
        raise RecordError(f"rows must be 'as_answered' or 'raw'; got {rows!r}.")
    recs = [r for r, _ in joined]
    cols: list[tuple[str, str, list[Any]]] = []
    for f in dataclasses.fields(DecisionRecord):
        codec = f.metadata["codec"]
        if codec in _FLAT_KIND:
            cols.append((f.name, _FLAT_KIND[codec], [getattr(r, f.name) for r in recs]))
            if f.name == "time":
                cols.append(("time_utc", "str", [r.time_utc for r in recs]))
            continue
        keys: dict[str, None] = {}
        for r in recs:
            keys.update(dict.fromkeys(getattr(r, f.name) or {}))
        for k in keys:
            values = [(getattr(r, f.name) or {}).get(k) for r in recs]
            if codec == "flags":
                cols.append((f"{_PREFIX[f.name]}.{k}", "bool", values))
            else:
                floats = [math.nan if v is None else float(v) for v in values]
                cols.append((f"{_PREFIX[f.name]}.{k}", "float", floats))
    for i, name, kind in (
        (0, "review_label", "str"),
        (1, "review_contrast_id", "str"),
        (2, "review_reviewer", "str"),
        (3, "review_time", "float"),
    ):
        values = [lab[i] for _, lab in joined]
        if kind == "float":
            values = [math.nan if v is None else float(v) for v in values]
        cols.append((name, kind, values))
    cols.append((EXPORT_ROWS, "str", [rows] * len(joined)))
    return cols


def write_csv(joined: Joined, path: str | os.PathLike[str], *, rows: str = "as_answered") -> None:
    """Write :func:`export_columns` as CSV: floats with ``repr`` (exact), NaN as ``nan``,
    infinities as ``inf``/``-inf`` (``float()`` reads them all back); None is an empty cell.
    ``rows``: what the rows are (the :data:`EXPORT_ROWS` column, see
    ``DecisionLog.export_csv``)."""
    cols = export_columns(joined, rows)
    n = len(cols[0][2]) if cols else 0
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([name for name, _, _ in cols])
        for i in range(n):
            writer.writerow([_csv_cell(kind, values[i]) for _, kind, values in cols])


def write_parquet(
    joined: Joined,
    path: str | os.PathLike[str],
    error: type[GuardError],
    *,
    rows: str = "as_answered",
) -> None:
    """Write :func:`export_columns` as Parquet (needs pyarrow): scores float64 with NaN kept as
    NaN, missing ints, strings and flags null; metadata ``spotstop.schema_version`` and
    ``spotstop.rows`` (``rows``: what the rows are, see ``DecisionLog.export_parquet``)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise error(
            "export_parquet needs pyarrow, which is not installed. Install it with "
            "`pip install spotstop` (pyarrow is a base dependency), or use export_csv."
        ) from exc
    types = {"str": pa.string(), "float": pa.float64(), "int": pa.int64(), "bool": pa.bool_()}
    arrays = []
    names = []
    for name, kind, values in export_columns(joined, rows):
        if kind == "float":
            arrays.append(pa.array(np.asarray(values, dtype=np.float64), type=types[kind]))
        else:
            arrays.append(pa.array(values, type=types[kind]))
        names.append(name)
    table = pa.Table.from_arrays(arrays, names=names)
    table = table.replace_schema_metadata(
        {
            "spotstop.schema_version": str(SCHEMA_VERSION),
            "spotstop.table": "decisions",
            "spotstop.rows": rows,
        }
    )
    pq.write_table(table, str(path))


def _csv_cell(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "float":
        return repr(float(value))
    if kind == "bool":
        return "true" if value else "false"
    return str(value)


class LogReader:
    """The reading half of :class:`~spotstop.guard.DecisionLog` (mixed into it).

    Every read runs in one statement or transaction through the log's ``_retry`` (busy
    database waited on) on the calling thread's connection; rows come back in log order
    (time, then position). The log's decisions are the live table's rows and those of its
    registered archives (``_log_archive.py``): every read here returns both, as one log.

    The decisions are as the robot received them: a fail-closed amendment that waits in the
    log's journal or its dead letter (:meth:`pending_changes`) is applied to the row it
    amends, as the log will apply it. ``raw=True`` reads the rows as the log stores them
    (a SAFE there may have been answered fail-closed UNSAFE): for mending the log, never for
    saying what the robot was told.
    """

    _path: Path
    _journal: Path | None
    _retry: Callable[..., Any]
    _conn: Callable[[], sqlite3.Connection]
    archive_folder: Path
    archives: Callable[[], list[ArchiveInfo]]

    def _where(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
    ) -> tuple[str, list[Any], Callable[[tuple[Any, ...]], bool]]:
        """SQL ``WHERE`` clause, its parameters, and the same filter on an archived row."""
        clauses: list[str] = []
        params: list[Any] = []
        t0 = to_epoch("since", since)
        t1 = to_epoch("until", until)
        if t0 is not None:
            clauses.append("d.time >= ?")
            params.append(t0)
        if t1 is not None:
            clauses.append("d.time < ?")
            params.append(t1)
        if situation_id is not None:
            if not isinstance(situation_id, str):
                raise RecordError(
                    f"situation_id must be a str or None; got {type(situation_id).__name__}."
                )
            clauses.append("d.situation_id = ?")
            params.append(situation_id)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""

        def keep(row: tuple[Any, ...]) -> bool:
            t = row[TIME_COLUMN]
            return (
                (t0 is None or t >= t0)
                and (t1 is None or t < t1)
                and (situation_id is None or row[_SITUATION_COLUMN] == situation_id)
            )

        return where, params, keep

    def pending_changes(self) -> PendingChanges:
        """What waits for this log in its journal (the one it was opened with, else its
        default one) and its dead letter: read only, without a lock
        (:func:`~spotstop.guard._log_pending.read_pending`). A place that cannot be read is
        named in ``faults``."""
        return read_pending(self._path, self._journal)

    def _as_answered(self, raw: bool) -> PendingChanges | None:
        if not isinstance(raw, bool):
            raise RecordError(
                f"raw must be False (the decisions as the robot was answered, the default) or "
                f"True (the rows as the log stores them); got {raw!r}."
            )
        if raw:
            return None
        pending = self.pending_changes()
        for fault in pending.faults:  # read on: the log itself still says what it holds
            _logger.warning(
                "decision log %s: %s not read; a fail-closed amendment waiting there is not "
                "applied to what this read returns",
                self._path,
                fault,
            )
        return pending

    def records(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
        *,
        raw: bool = False,
    ) -> Iterator[DecisionRecord]:
        """Yield decisions with ``since <= time < until`` (and of one situation), in log order.

        ``since``/``until`` are seconds since the epoch or aware datetimes; None: open end.
        Archived decisions are included. Each is as the robot received it: an amendment
        waiting in the journal or the dead letter is applied (``raw=True``: the rows as the
        log stores them, see the class). Raises :class:`LogError` if retention moved rows
        while the iteration was under way (read again).
        """
        where, params, keep = self._where(since, until, situation_id)  # checked now
        return self._iter_records(where, params, keep, self._as_answered(raw))

    def _fetchall(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._retry(lambda: self._conn().execute(sql, params).fetchall(), what="read")

    def _iter_live(self, where: str, params: list[Any]) -> Iterator[tuple[float, int, Any]]:
        # Read in pages keyed on the rowid (the log's order, see _LOG_ORDER): no cursor stays
        # open between yields, so a slow consumer never pins a read snapshot (which would stall
        # WAL checkpoints).
        base = f"{SELECT}, d.rowid FROM decisions AS d{where}"
        joiner = " AND " if where else " WHERE "
        order = f" ORDER BY d.rowid LIMIT {_PAGE_ROWS}"
        rows = self._fetchall(base + order, params)
        while True:
            for row in rows:
                yield row[TIME_COLUMN], row[-1], row[:-1]
            if len(rows) < _PAGE_ROWS:
                return
            rows = self._fetchall(base + joiner + "d.rowid > ?" + order, [*params, rows[-1][-1]])

    def _iter_archived(
        self, infos: list[ArchiveInfo], keep: Callable[[tuple[Any, ...]], bool]
    ) -> list[Iterator[tuple[float, int, Any]]]:
        folder = self.archive_folder

        def one(info: ArchiveInfo) -> Iterator[tuple[float, int, Any]]:
            for seq, row in read_archive(folder, info):
                if keep(row):
                    yield row[TIME_COLUMN], seq, row

        return [one(info) for info in infos]

    def _iter_records(
        self,
        where: str,
        params: list[Any],
        keep: Callable[[tuple[Any, ...]], bool],
        pending: PendingChanges | None,
    ) -> Iterator[DecisionRecord]:
        infos = self.archives()
        streams = [*self._iter_archived(infos, keep), self._iter_live(where, params)]
        for _, _, row in heapq.merge(*streams, key=_position):
            amended = None if pending is None else pending.amend(row)
            yield _record(row if amended is None else amended)
        if [a.name for a in self.archives()] != [a.name for a in infos]:
            raise LogError(
                "the log's retention archived rows while they were being read; some may have "
                "been skipped. Read again (or read while the guard is stopped)."
            )

    def get(self, decision_id: str, *, raw: bool = False) -> DecisionRecord | None:
        """The decision with this id (live or archived), or None if the log has none; as the
        robot received it (``raw``: as :meth:`records`)."""
        pending = self._as_answered(raw)
        sql = f"{SELECT} FROM decisions AS d WHERE d.decision_id = ?"
        row = self._retry(lambda: self._conn().execute(sql, (decision_id,)).fetchone(), what="read")
        if row is None:
            row = next(
                (
                    arow
                    for info in self.archives()
                    if info.may_hold([decision_id])  # its id filter (none: read it)
                    for _, arow in read_archive(self.archive_folder, info)
                    if arow[ID_COLUMN] == decision_id
                ),
                None,
            )
        if row is None:
            return None
        amended = None if pending is None else pending.amend(row)
        return _record(row if amended is None else amended)

    def count(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
    ) -> int:
        """Number of decisions, live and archived (with the same filters as :meth:`records`)."""
        where, params, keep = self._where(since, until, situation_id)
        sql = f"SELECT COUNT(*) FROM decisions AS d{where}"

        def read() -> tuple[int, list[ArchiveInfo]]:
            with self._snapshot() as conn:
                return int(conn.execute(sql, params).fetchone()[0]), self.archives()

        n, infos = self._retry(read, what="count")
        if not where:
            check_present(self.archive_folder, infos)
            return n + sum(a.n_rows for a in infos)
        return n + sum(1 for stream in self._iter_archived(infos, keep) for _ in stream)

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction on this thread's connection: every read inside it sees the
        same log (live rows and the archives table agree)."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def archived_ids(self) -> set[str]:
        """The ids of every archived decision."""
        folder = self.archive_folder
        return {row[ID_COLUMN] for a in self.archives() for _, row in read_archive(folder, a)}

    def image(self, sha256: str) -> bytes | None:
        """The stored image bytes with this SHA-256, or None if not stored (or pruned)."""
        row = self._retry(
            lambda: (
                self._conn()
                .execute("SELECT data FROM images WHERE sha256 = ?", (sha256,))
                .fetchone()
            ),
            what="read an image",
        )
        return None if row is None else bytes(row[0])

    def stored_images(self, sha256s: Collection[str]) -> set[str]:
        """Which of ``sha256s`` the log holds an image for, without reading any image's bytes
        (one query per 500 digests)."""
        wanted = sorted({s for s in sha256s if s})
        found: set[str] = set()
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            sql = f"SELECT sha256 FROM images WHERE sha256 IN ({','.join('?' * len(part))})"
            rows = self._retry(
                lambda: self._conn().execute(sql, part).fetchall(),  # noqa: B023 - called now
                what="list the stored images",
            )
            found.update(r[0] for r in rows)
        return found

    def _joined_sql_rows(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
    ) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """(row of the decisions table, review label tuple) of every decision, live and
        archived, in log order."""
        where, params, keep = self._where(since, until, situation_id)
        sql = (
            f"{SELECT}, d.rowid, l.label, l.contrast_id, l.reviewer, l.time FROM decisions AS d "
            f"LEFT JOIN labels AS l ON l.decision_id = d.decision_id{where} "
            "ORDER BY d.rowid"
        )

        def read() -> tuple[list[Any], list[ArchiveInfo], dict[str, tuple[Any, ...]]]:
            # One read transaction: rows, labels and the archives list form one snapshot.
            with self._snapshot() as conn:
                rows = conn.execute(sql, params).fetchall()
                infos = self.archives()
                labels: dict[str, tuple[Any, ...]] = {}
                if infos:
                    labels = {
                        r[0]: tuple(r[1:])
                        for r in conn.execute(
                            "SELECT decision_id, label, contrast_id, reviewer, time FROM labels"
                        )
                    }
                return rows, infos, labels

        rows, infos, labels = self._retry(read, what="read")
        n = len(COLUMNS)
        live = [(row[TIME_COLUMN], row[n], row[:n], tuple(row[n + 1 :])) for row in rows]
        if not infos:
            return [(r[2], r[3]) for r in live]
        none = (None, None, None, None)
        archived = [
            [(t, seq, row, labels.get(row[ID_COLUMN], none)) for t, seq, row in stream]
            for stream in self._iter_archived(infos, keep)
        ]
        merged = heapq.merge(*archived, live, key=_position)
        return [(r[2], r[3]) for r in merged]

    def _answered_rows(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
        pending: PendingChanges | None,
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], tuple[str, ...]]:
        """The rows and review labels of :meth:`_joined_sql_rows`, the rows as the robot
        received them (``pending`` applied; None: as stored), and the ids of those it changed."""
        joined = self._joined_sql_rows(since, until, situation_id)
        rows = [r for r, _ in joined]
        changed: tuple[str, ...] = ()
        if pending is not None:
            rows, changed = pending.amend_rows(rows)
        return rows, [lab for _, lab in joined], changed

    def _joined_rows(self, pending: PendingChanges | None) -> Joined:
        rows, labels, _ = self._answered_rows(None, None, None, pending)
        return [(_record(row), lab) for row, lab in zip(rows, labels, strict=True)]

    def to_arrays(
        self,
        since: float | _dt.datetime | None = None,
        until: float | _dt.datetime | None = None,
        situation_id: str | None = None,
        *,
        raw: bool = False,
    ) -> LogArrays:
        """The decisions (same filters and ``raw`` as :meth:`records`) as aligned arrays with
        labels."""
        return self.arrays_as_answered(since, until, situation_id, self._as_answered(raw))[0]

    def arrays_as_answered(
        self,
        since: float | _dt.datetime | None,
        until: float | _dt.datetime | None,
        situation_id: str | None,
        pending: PendingChanges | None,
    ) -> tuple[LogArrays, tuple[str, ...]]:
        """:meth:`to_arrays` with ``pending`` (read before, :meth:`pending_changes`; None: the
        rows as stored) applied, and the ids of the decisions it changed."""
        rows, labels, changed = self._answered_rows(since, until, situation_id, pending)
        return arrays_from_rows(rows, labels), changed

    # -- export --------------------------------------------------------------------

    def export_csv(self, path: str | os.PathLike[str], *, raw: bool = False) -> None:
        """Write every decision (with reviewer labels) to a CSV file, one column per field.

        Dict fields are expanded to ``score.<member>``, ``score_gray.<member>``,
        ``score_text.<member>``, ``latency_ms.<stage>``, ``cue.<cue>``, ``ran.<member>``; reviewer columns
        start with ``review_``. Floats are written with ``repr`` (exact), NaN as ``nan`` and
        infinities as ``inf``/``-inf``; None is an empty cell. Each decision is as the robot
        received it (``raw=True``: as the log stores it, see :meth:`records`); the last column,
        ``export_rows``, says which in every row: ``as_answered`` or ``raw``.
        """
        rows = "raw" if raw else "as_answered"
        write_csv(self._joined_rows(self._as_answered(raw)), path, rows=rows)

    def export_parquet(self, path: str | os.PathLike[str], *, raw: bool = False) -> None:
        """Write every decision (with reviewer labels) to a Parquet file; needs pyarrow.

        Same columns and ``raw`` as :meth:`export_csv`; scores are float64 with NaN kept as
        NaN (not null); the schema metadata carries ``spotstop.schema_version`` and
        ``spotstop.rows``: ``as_answered`` (amendments waiting in the journal or the dead
        letter applied), or ``raw`` (the rows as the log stores them), as the ``export_rows``
        column does in every row.
        """
        rows = "raw" if raw else "as_answered"
        write_parquet(self._joined_rows(self._as_answered(raw)), path, LogError, rows=rows)

    def policies(self) -> dict[str, PolicyRow]:
        """Every policy that decided something in this log, by version id (first seen first)."""
        rows = self._fetchall(
            "SELECT policy_version, policy_kind, fusion_key, bundle_id, prompt_hash, created, "
            "document, first_time FROM policies ORDER BY first_time, policy_version",
            [],
        )
        return {
            r[0]: PolicyRow(
                version_id=r[0],
                kind=r[1],
                fusion_key=r[2],
                bundle_id=r[3],
                prompt_hash=r[4],
                created=r[5],
                document=json.loads(r[6]),
                first_time=float(r[7]),
            )
            for r in rows
        }
