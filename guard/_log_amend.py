"""A fail-closed amendment: the one rule of what it does to a decision row.

A SAFE decision whose log write ended after the call's deadline was answered fail-closed
UNSAFE, and its row must say so. :func:`amendment` declares the change once, in the record's
fields: a row that says SAFE (:data:`AMENDS`) becomes a fail-closed UNSAFE with the
amendment's reason; any other row stays as it is (the change goes only towards safety).
Everything that applies it is derived from that declaration, through the record's own SQL
codecs:

* :func:`amend_sql`: the log's ``UPDATE`` (:meth:`~spotstop.guard.DecisionLog.mark_fail_closed`);
* :func:`amend_row`: a row read back (live or archived) while its amendment waits in the
  journal or the dead letter (:class:`~spotstop.guard._log_pending.PendingChanges`): the
  records, exports and arrays the log's readers get, and the rows a retention pass archives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from spotstop.guard._log_schema import COLUMNS
from spotstop.guard._record import _FIELDS, _to_sql

__all__ = ["AMENDS", "amend_row", "amend_sql", "amendment"]

_CODEC: Final = {f.name: f.metadata["codec"] for f in _FIELDS}
_AT: Final = {c: i for i, c in enumerate(COLUMNS)}

AMENDS: Final = ("label", "SAFE")
"""The field and the value a decision must have for an amendment to change it: a SAFE one."""


def amendment(reason: str) -> dict[str, Any]:
    """Record field -> the value a fail-closed amendment with ``reason`` gives a SAFE decision."""
    return {"label": "UNSAFE", "fail_closed": True, "fail_reason": reason}


def _sql_values(reason: str) -> dict[str, Any]:
    """:func:`amendment` as the ``decisions`` table stores it (column -> SQL value)."""
    return {name: _to_sql(_CODEC[name], v) for name, v in amendment(reason).items()}


def _amends_sql() -> Any:
    name, value = AMENDS
    return _to_sql(_CODEC[name], value)


def amend_sql(ids: Sequence[str], reason: str) -> tuple[str, list[Any]]:
    """The ``UPDATE`` of the ``decisions`` table that amends the rows of ``ids`` with
    ``reason``, and its parameters (rows that are not SAFE are left as they are)."""
    values = _sql_values(reason)
    sets = ", ".join(f"{name} = ?" for name in values)
    q = ", ".join("?" * len(ids))
    sql = f"UPDATE decisions SET {sets} WHERE decision_id IN ({q}) AND {AMENDS[0]} = ?"
    return sql, [*values.values(), *ids, _amends_sql()]


def amend_row(row: Sequence[Any], reason: str) -> tuple[Any, ...] | None:
    """The ``decisions`` row ``row`` (its values in :data:`COLUMNS` order, live or archived)
    as :func:`amend_sql` leaves it; None when the amendment does not change it (not SAFE)."""
    if row[_AT[AMENDS[0]]] != _amends_sql():
        return None
    out = list(row)
    for name, v in _sql_values(reason).items():
        out[_AT[name]] = v
    return tuple(out)
