"""The decision, declared once: the logged record, the Python ``Decision``, their JSON and SQL.

:class:`DecisionRecord` lists every field of a decision with its docstring and its *codec*
(how it is stored and sent). Everything else derives from that list:

* the SQLite columns of the decision log and the row mapping (:func:`sql_columns`,
  :func:`record_to_row`, :func:`record_from_row`);
* the JSON the sidecar answers and the client parses (:meth:`DecisionRecord.to_json`,
  :meth:`DecisionRecord.from_json`; non-finite numbers are ``null``);
* the sidecar's response schema (:func:`json_field_types`, turned into a pydantic model by
  the sidecar).

:class:`Decision` is the same record as the guard returns it (plus ``safe`` and a short repr).
A round-trip test checks record → row → record and record → JSON → record.

Versions: schema 2 added ``batch_id``, ``policy_score``, ``policy_kind``, ``policy_version``,
``fusion_key``, ``detail``, ``cue_flags``, ``cue_text`` and ``test_pair``; schema 3 added
``members_run`` (which members scored the scene: the ``cascade`` policy runs the second
member only on some scenes); schema 4 added ``deciding_kind`` (the kind whose threshold
decided, a value of its own instead of the tail of the ``policy`` rule's text). Rows written
under schema 1 to 3 are migrated when a log is opened (see ``_log_schema.py``) and read back
with their ``schema_version`` and the new fields at their documented values.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import numbers
import time as _time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Self

import numpy as np
from spotstop.guard._errors import GuardError
from spotstop.guard.validate import is_real

__all__ = [
    "SCHEMA_VERSION",
    "Decision",
    "DecisionRecord",
    "RecordError",
    "json_field_types",
    "record_from_row",
    "record_to_row",
    "sql_columns",
]

SCHEMA_VERSION: Final = 4
"""Version of the decision schema this module writes (1 to 3 are read and migrated)."""

_LABELS: Final = ("SAFE", "UNSAFE")
_NONFINITE_TO_JSON: Final = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_JSON_TO_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class RecordError(GuardError, ValueError):
    """A record, label or argument handed to the decision log is invalid."""


def _new_id() -> str:
    return uuid.uuid4().hex


# codecs: how a field is checked, stored in SQLite and sent as JSON
#   str        text, required          | opt_str   text or None
#   float      real, NaN kept          | opt_int   non-negative int or None
#   scores     {name: float}, NaN kept  | opt_scores same or None
#   flags      {name: bool} or None     | bool      bool
#   label      "SAFE" / "UNSAFE"        | int       int
def _m(codec: str, sql: str) -> dict[str, str]:
    return {"codec": codec, "sql": sql}


@dataclass(frozen=True, kw_only=True)
class DecisionRecord:
    """One guard decision as it is logged and answered.

    All fields are keyword-only; ``time`` and ``decision_id`` default to now and a fresh
    uuid4. A record is validated when it is built; an invalid one raises
    :class:`RecordError` naming the field.
    """

    time: float = field(default_factory=_time.time, metadata=_m("float", "REAL NOT NULL"))
    """Decision time, seconds since the Unix epoch (UTC), finite. See ``time_utc``."""

    decision_id: str = field(default_factory=_new_id, metadata=_m("str", "TEXT PRIMARY KEY"))
    """Unique id of the decision (uuid4 hex by default); the log's primary key. Empty only for
    a fail-closed UNSAFE made outside the guard and never logged (:meth:`Decision.unlogged`:
    ``GuardClient``'s answers to faults, ``spotstop check`` when the guard could not start)."""

    batch_id: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Id shared by the decisions of one guard call (one batch); None if unknown (schema 1)."""

    situation_id: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Deployment situation (place, task, camera) the scene belongs to; None if unknown."""

    request: str = field(metadata=_m("str", "TEXT NOT NULL"))
    """What the robot was asked to do, verbatim (any unicode)."""

    image_sha256: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """SHA-256 hex digest of the encoded image bytes; None when no image was given."""

    width: int | None = field(default=None, metadata=_m("opt_int", "INTEGER"))
    """Decoded image width in pixels; None if no image or decoding failed."""

    height: int | None = field(default=None, metadata=_m("opt_int", "INTEGER"))
    """Decoded image height in pixels; None if no image or decoding failed."""

    n_bytes: int | None = field(default=None, metadata=_m("opt_int", "INTEGER"))
    """Size of the encoded image file in bytes; None if no image."""

    image_format: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Encoded image format as decoded (e.g. ``"JPEG"``, ``"PNG"``); None if unknown."""

    member_scores: dict[str, float] = field(metadata=_m("scores", "TEXT NOT NULL"))
    """Per member: scene score ``log p(UNSAFE) - log p(SAFE)``; NaN where the member failed."""

    member_scores_gray: dict[str, float] | None = field(
        default=None, metadata=_m("opt_scores", "TEXT")
    )
    """Per member: score on the content-free gray image with the same request; None if not run."""

    member_scores_text: dict[str, float] | None = field(
        default=None, metadata=_m("opt_scores", "TEXT")
    )
    """Per member: request-only score (no image); None if that pass was not run."""

    members_run: dict[str, bool] | None = field(default=None, metadata=_m("flags", "TEXT"))
    """Per member: whether it was run on this scene (False: not asked, e.g. a ``cascade``
    scene decided by its first member alone, or a scene that failed before scoring). None for
    rows of schema 1 and 2, where every member that loaded was run."""

    fused_score: float = field(metadata=_m("float", "REAL"))
    """Avg-2 fused score S under the policy's reference (frozen) fusion; NaN when not computed."""

    policy_score: float = field(default=math.nan, metadata=_m("float", "REAL"))
    """The score the policy compared with ``threshold``: S for most kinds, one member's raw
    score for ``direct``, S refitted on the batch for ``batch``. NaN when none."""

    threshold: float = field(metadata=_m("float", "REAL"))
    """Threshold the policy applied to ``policy_score``; NaN when none applied (fail closed)."""

    policy: str = field(metadata=_m("str", "TEXT NOT NULL"))
    """The rule that set the threshold, e.g. ``situation`` or ``situation->frozen``."""

    policy_kind: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """The configured policy kind (``frozen``, ``batch``, ...); None if unknown."""

    deciding_kind: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """The kind whose threshold decided the scene: the configured kind, or the fallback or cut
    it used (``frozen`` for ``situation->frozen``; a cascade's cut kind whichever of its
    stages decided; which members ran is ``members_run``). Readers use this, never the text
    of ``policy``. None when no policy set a threshold for the scene (fusion or the policy
    failed, or the call ran out of time before it). Rows of record schema 1 to 3 get it from
    their rule when the log is migrated (log schema 5), None where their threshold is NaN."""

    policy_version: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Which policy decided: its version id (``v0002+3f9a1c2b``); None if unknown (schema 1)."""

    fusion_key: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Fingerprint of the fusion statistics that made ``fused_score``; None if unknown."""

    label: Literal["SAFE", "UNSAFE"] = field(
        metadata=_m("label", "TEXT NOT NULL CHECK (label IN ('SAFE', 'UNSAFE'))")
    )
    """The guard's answer: ``"SAFE"`` or ``"UNSAFE"``."""

    fail_closed: bool = field(metadata=_m("bool", "INTEGER NOT NULL"))
    """True when the guard answered UNSAFE because something failed, not because of the score."""

    fail_reason: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """Why the guard failed closed (stage, error class and message); None otherwise."""

    detail: str = field(default="", metadata=_m("str", "TEXT NOT NULL DEFAULT ''"))
    """Why the policy set this threshold, readable (references used, fallback, batch size)."""

    cue_flags: dict[str, bool] | None = field(default=None, metadata=_m("flags", "TEXT"))
    """Text-in-the-scene flags per cue (``reassuring``, ``alarming``); None when not detected."""

    cue_text: str | None = field(default=None, metadata=_m("opt_str", "TEXT"))
    """The text the detector read in the scene; None when detection was off."""

    latency_ms: dict[str, float] = field(metadata=_m("scores", "TEXT NOT NULL"))
    """Wall time per stage in milliseconds (e.g. ``decode_ms``, ``total_ms``)."""

    bundle_id: str = field(metadata=_m("str", "TEXT NOT NULL"))
    """Id of the model bundle that scored the scene."""

    prompt_hash: str = field(metadata=_m("str", "TEXT NOT NULL"))
    """Hash of the prompt template the bundle used; with ``bundle_id`` it keys the policy."""

    test_pair: bool = field(default=False, metadata=_m("bool", "INTEGER NOT NULL DEFAULT 0"))
    """True when the bundle is the tiny TEST pair: the decision means nothing."""

    schema_version: int = field(default=SCHEMA_VERSION, metadata=_m("int", "INTEGER NOT NULL"))
    """Schema version the record was written with (1 for rows migrated from a v1 log)."""

    def __post_init__(self) -> None:
        _check_record(self)

    @property
    def time_utc(self) -> str:
        """``time`` as ISO-8601 UTC, e.g. ``2025-01-31T12:00:00.123456+00:00``."""
        return _dt.datetime.fromtimestamp(self.time, tz=_dt.UTC).isoformat()

    @property
    def safe(self) -> bool:
        """True only for a SAFE answer."""
        return self.label == "SAFE"

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this decision (non-finite numbers as ``null``)."""
        return {f.name: _to_json(f.metadata["codec"], getattr(self, f.name)) for f in _FIELDS}

    to_dict = to_json

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        """A record from :meth:`to_json`'s object (``null`` numbers → NaN).

        Raises :class:`RecordError` naming the field when one is missing or of the wrong
        type. Fields absent from ``d`` that have a default take it.
        """
        if not isinstance(d, Mapping):
            raise RecordError(f"a decision must be a JSON object; got {type(d).__name__}.")
        kw: dict[str, Any] = {}
        for f in _FIELDS:
            if f.name not in d:
                if _has_default(f):
                    continue
                raise RecordError(f"decision field {f.name!r} is missing.")
            kw[f.name] = _from_json(f.name, f.metadata["codec"], d[f.name])
        return cls(**kw)


@dataclass(frozen=True, kw_only=True, repr=False)
class Decision(DecisionRecord):
    """The guard's answer for one scene: the logged :class:`DecisionRecord` itself.

    ``label`` is SAFE only when every member scored the scene, the fused score and the
    threshold are finite, the policy said SAFE within the deadline and the decision was
    logged. Otherwise it is UNSAFE; ``fail_closed`` is True when that UNSAFE came from a
    fault, not from a score, and ``fail_reason`` says which. Its ``latency_ms`` also holds
    ``log_ms``, measured after the row was written.
    """

    def __repr__(self) -> str:
        why = f", FAIL-CLOSED: {self.fail_reason}" if self.fail_closed else ""
        tp = ", TEST PAIR" if self.test_pair else ""
        return (
            f"Decision({self.label}, S={self.fused_score:+.3f}, score={self.policy_score:+.3f}, "
            f"t={self.threshold:+.3f}, policy={self.policy}, id={self.decision_id[:8]}{why}{tp})"
        )

    @classmethod
    def unlogged(
        cls,
        reason: str,
        *,
        made_by: str,
        request: str = "",
        situation_id: str | None = None,
        latency_ms: Mapping[str, float] | None = None,
        detail: str = "",
    ) -> Decision:
        """A fail-closed UNSAFE made outside the guard, which no log holds: empty
        ``decision_id``, ``policy == made_by`` (``"client"``, ``"cli"``), NaN scores."""
        return cls(
            request=request,
            decision_id="",
            label="UNSAFE",
            fused_score=math.nan,
            threshold=math.nan,
            policy=made_by,
            member_scores={},
            fail_closed=True,
            fail_reason=reason,
            latency_ms=dict(latency_ms or {}),
            bundle_id="",
            prompt_hash="",
            situation_id=situation_id,
            detail=detail,
        )

    @classmethod
    def of(cls, record: DecisionRecord, **changes: Any) -> Decision:
        """The record as a Decision (with ``changes`` applied)."""
        values = {f.name: getattr(record, f.name) for f in _FIELDS}
        values.update(changes)
        return cls(**values)


_FIELDS: Final = tuple(dataclasses.fields(DecisionRecord))


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


# ---------------------------------------------------------------------- validation


def _check_field(name: str, codec: str, v: Any) -> None:
    def bad(allowed: str, fix: str = "") -> RecordError:
        return RecordError(
            f"DecisionRecord.{name} must be {allowed}; got {v!r} ({type(v).__name__}).{fix}"
        )

    if codec == "str":
        if not isinstance(v, str):
            raise bad("a str")
    elif codec == "opt_str":
        if v is not None and not isinstance(v, str):
            raise bad("a str or None")
    elif codec == "float":
        if not is_real(v):
            raise bad("a float (NaN allowed)", " Use float('nan') when there is none.")
    elif codec == "opt_int":
        if v is not None and (
            not isinstance(v, numbers.Integral) or isinstance(v, bool | np.bool_) or v < 0
        ):
            raise bad("a non-negative int or None")
    elif codec in ("scores", "opt_scores", "flags"):
        if v is None and codec != "scores":
            return
        want = "a dict of name -> bool" if codec == "flags" else "a dict of name -> float"
        if not isinstance(v, Mapping):
            raise bad(
                want + (" or None" if codec != "scores" else ""), " Pass e.g. {'member_a': 1.25}."
            )
        for key, x in v.items():
            if not isinstance(key, str) or not key:
                raise RecordError(
                    f"DecisionRecord.{name} keys must be non-empty strings; got {key!r}."
                )
            ok = isinstance(x, bool | np.bool_) if codec == "flags" else is_real(x)
            if not ok:
                raise RecordError(
                    f"DecisionRecord.{name}[{key!r}] must be "
                    f"{'a bool' if codec == 'flags' else 'a real number (NaN allowed)'}; got {x!r}."
                )
    elif codec == "bool":
        if not isinstance(v, bool | np.bool_):
            raise bad("a bool")
    elif codec == "label":
        if v not in _LABELS:
            raise RecordError(
                f"DecisionRecord.label must be one of {list(_LABELS)}; got {v!r}. Labels of the "
                "guard are upper case; reviewer labels go to DecisionLog.set_labels."
            )
    elif codec == "int" and (not isinstance(v, int) or isinstance(v, bool)):
        raise bad("an int")


def _check_record(r: DecisionRecord) -> None:
    for f in _FIELDS:
        _check_field(f.name, f.metadata["codec"], getattr(r, f.name))
    if not math.isfinite(float(r.time)):
        raise RecordError(
            f"DecisionRecord.time must be a finite float (seconds since the Unix epoch, UTC); "
            f"got {r.time!r}. Use time.time()."
        )
    if r.schema_version not in range(1, SCHEMA_VERSION + 1):
        raise RecordError(
            f"DecisionRecord.schema_version must be 1 to 3 (migrated) or {SCHEMA_VERSION}; got "
            f"{r.schema_version!r}. Leave it at its default."
        )
    if r.label == "SAFE" and r.fail_closed:
        raise RecordError(
            "DecisionRecord: a fail-closed decision is UNSAFE; got label SAFE with fail_closed."
        )


# ---------------------------------------------------------------------- JSON


def _encode_float(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else _NONFINITE_TO_JSON[repr(x)]


def _decode_float(x: float | int | str) -> float:
    return _JSON_TO_NONFINITE[x] if isinstance(x, str) else float(x)


def _num_or_null(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def _to_json(codec: str, v: Any) -> Any:
    if v is None:
        return None
    if codec == "float":
        return _num_or_null(v)
    if codec in ("scores", "opt_scores"):
        return {k: _num_or_null(x) for k, x in v.items()}
    if codec == "flags":
        return {k: bool(x) for k, x in v.items()}
    if codec == "bool":
        return bool(v)
    if codec in ("opt_int", "int"):
        return int(v)
    return v


def _from_json(name: str, codec: str, v: Any) -> Any:
    def bad(want: str) -> RecordError:
        return RecordError(f"decision field {name!r} must be {want}; got {v!r}.")

    def num(x: Any) -> float:
        if x is None:
            return math.nan
        if not is_real(x):
            raise bad("a number or null")
        return float(x)

    if codec == "float":
        return num(v)
    if codec in ("scores", "opt_scores"):
        if v is None and codec == "opt_scores":
            return None
        if not isinstance(v, Mapping):
            raise bad("an object of numbers")
        return {str(k): num(x) for k, x in v.items()}
    if codec == "flags":
        if v is None:
            return None
        if not isinstance(v, Mapping) or not all(isinstance(x, bool) for x in v.values()):
            raise bad("an object of booleans or null")
        return dict(v)
    return v  # str, opt_str, opt_int, bool, label, int: the record's own check names the field


def json_field_types() -> dict[str, tuple[Any, bool]]:
    """Field name -> (JSON-side Python type, required) for a response schema (e.g. pydantic)."""
    types: dict[str, Any] = {
        "str": str,
        "opt_str": str | None,
        "float": float | None,
        "opt_int": int | None,
        "scores": dict[str, float | None],
        "opt_scores": dict[str, float | None] | None,
        "flags": dict[str, bool] | None,
        "bool": bool,
        "label": Literal["SAFE", "UNSAFE"],
        "int": int,
    }
    return {f.name: (types[f.metadata["codec"]], True) for f in _FIELDS}


# ---------------------------------------------------------------------- SQL rows


def sql_columns() -> tuple[tuple[str, str], ...]:
    """(column, SQL type) of the ``decisions`` table, in field order."""
    return tuple((f.name, f.metadata["sql"]) for f in _FIELDS)


def _to_sql(codec: str, v: Any) -> Any:
    if codec == "float":
        x = float(v)
        return None if math.isnan(x) else x  # SQLite stores NaN as NULL: say so explicitly
    if codec in ("scores", "opt_scores"):
        if v is None:
            return None
        return json.dumps(
            {k: _encode_float(x) for k, x in v.items()},
            allow_nan=False,
            ensure_ascii=False,
            separators=(",", ":"),
        )
    if codec == "flags":
        return (
            None
            if v is None
            else json.dumps({k: bool(x) for k, x in v.items()}, separators=(",", ":"))
        )
    if codec == "bool":
        return int(bool(v))
    if codec in ("opt_int", "int"):
        return None if v is None else int(v)
    return v


def _from_sql(codec: str, v: Any) -> Any:
    if codec == "float":
        return math.nan if v is None else float(v)
    if codec in ("scores", "opt_scores"):
        if v is None:
            return {} if codec == "scores" else None
        return {k: _decode_float(x) for k, x in json.loads(v).items()}
    if codec == "flags":
        return None if v is None else {k: bool(x) for k, x in json.loads(v).items()}
    if codec == "bool":
        return bool(v)
    return v


def record_to_row(r: DecisionRecord) -> tuple[Any, ...]:
    """The record as a row of :func:`sql_columns`."""
    return tuple(_to_sql(f.metadata["codec"], getattr(r, f.name)) for f in _FIELDS)


def record_from_row(row: tuple[Any, ...] | list[Any]) -> DecisionRecord:
    """A record from a row of :func:`sql_columns` (same order)."""
    return DecisionRecord(
        **{f.name: _from_sql(f.metadata["codec"], v) for f, v in zip(_FIELDS, row, strict=True)}
    )
