"""Input validation that every room shares: numbers, integers, key sets, mappings, 1-D arrays.

One behaviour per check, so a config value, a record field or a score array is accepted or
refused alike wherever it enters (``guard``, ``calibrate``, ``diagnostics``, ``export`` and the
CLI may all import this module; DESIGN.md, "may import"). The checks raise the caller's error
type (``error=``), so each room keeps its own exception hierarchy, and the messages name the
key, what was allowed, what came and where to fix it.

- :func:`is_real` — a real number: ``int``/``float`` and numpy's integer and floating
  scalars; ``bool`` and ``numpy.bool_`` are not numbers here. NaN and inf count as real (the
  caller decides about finiteness).
- :func:`is_int` — an integer: ``int`` and numpy's integer scalars; never a ``bool``.
- :func:`check_mapping`, :func:`check_keys`, :func:`check_number` — one section of a YAML
  document: a mapping, with its required keys and no unknown key (a close match suggested),
  and a finite number (> 0 when ``positive``).
- :func:`as_1d_float` — a 1-D float array (of length ``n`` when given).
- :func:`situation_id_problem` — what keeps a value from being a situation id (None when it is
  one): the guard fails such a scene closed, the sidecar answers 422.
- :func:`is_blank` — text with no visible character (only whitespace, control and format
  characters): a request that says nothing, refused like an empty one.
- :func:`load_yaml` — every YAML file spotstop reads (a policy, a scoring or serve config, a
  lexicon, a bundle's manifest and member files), read as written: YAML 1.2's core schema
  (:data:`YAML_RULES`; ``no`` and ``1:30`` stay text, ``012`` is 12), with a key given twice
  refused by its path and lines (PyYAML keeps the last one silently).
- :func:`dump_yaml` — every YAML file spotstop writes, read back equal by :func:`load_yaml`
  (and by YAML 1.1 tools).
- :func:`csv_header` — a CSV table's header, its names stripped, a name given twice refused
  (the csv module keeps the last cell of such a column, silently). Open the file with
  :data:`CSV_ENCODING`, which drops the byte-order mark a spreadsheet's "CSV UTF-8" writes.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import numpy as np
from spotstop.guard._errors import ConfigError

__all__ = [
    "CSV_ENCODING",
    "YAML_RULES",
    "as_1d_float",
    "check_keys",
    "check_mapping",
    "check_number",
    "csv_header",
    "dump_yaml",
    "is_blank",
    "is_int",
    "is_real",
    "join_key",
    "load_yaml",
    "situation_id_problem",
]


def load_yaml(text: str, *, source: str, error: type[Exception] = ConfigError) -> Any:
    """The YAML document in ``text``, read as it is written; raises ``error`` naming ``source``.

    Every YAML file spotstop reads comes through here (a test keeps it so). Plain scalars are
    read by the YAML 1.2 core schema (:data:`YAML_RULES`), not PyYAML's YAML 1.1:

    - only ``true``/``false`` are booleans: ``yes``, ``no``, ``on``, ``off`` stay strings (a
      robot id ``no`` is the text ``no``; ``warmup: off`` is refused by the setting's own check
      as not true or false, where YAML 1.1 made it ``False`` silently);
    - integers are decimal (``012`` is 12, not octal 10), ``0o17`` or ``0x1f``; ``1:30`` is the
      text ``1:30`` (YAML 1.1 made it 90, a sexagesimal number); ``1_000`` is text;
    - floats: ``1.5``, ``1e-3`` (text in YAML 1.1), ``.inf``, ``-.inf``, ``.nan``;
    - ``null``, ``~`` or nothing is None; a date is text (``created: 2026-05-01T12:00:00Z``);
      ``<<`` is an ordinary key (no merge keys).

    Only safe types are built. A key given twice in one mapping (twice as written, or twice
    once read: ``1`` and ``01``) is refused with its dotted path and both lines: PyYAML would
    keep the last one and lose the first silently. Text that is not YAML is refused too.
    """
    import yaml

    loader = _yaml_types()[0](text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _no_key_twice(node, loader, source, "", error)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise error(f"{source} is not valid YAML: {e}") from e
    finally:
        loader.dispose()


def dump_yaml(data: Any) -> str:
    """``data`` as YAML text that :func:`load_yaml` reads back equal (keys in their order,
    Unicode as it is); every YAML file spotstop writes comes through here.

    A string that either YAML 1.2 or YAML 1.1 would read as something else (``yes``,
    ``1:30``, ``012``, ``1e5``, ``0o17``, ``null``, a date) is quoted, so the file also reads
    the same in a YAML 1.1 tool. Dates and times are refused: write them as ISO 8601 strings.
    """
    import yaml

    return str(yaml.dump(data, Dumper=_yaml_types()[1], sort_keys=False, allow_unicode=True))


#: the plain scalars :func:`load_yaml` reads as something other than a string (YAML 1.2 core
#: schema): tag → pattern of the whole scalar
YAML_RULES: dict[str, str] = {
    "null": r"~|null|Null|NULL|",
    "bool": r"true|True|TRUE|false|False|FALSE",
    "int": r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+",
    "float": (
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
    ),
}
_FIRST: dict[str, list[str]] = {
    "null": ["~", "n", "N", ""],
    "bool": list("tTfF"),
    "int": list("-+0123456789"),
    "float": list("-+.0123456789"),
}


@functools.cache
def _yaml_types() -> tuple[Any, Any]:
    """The loader and the dumper classes (built on first use: no yaml import at import time)."""
    import yaml

    class Loader(yaml.SafeLoader):
        """Reads plain scalars by YAML_RULES only (none of YAML 1.1's)."""

    Loader.yaml_implicit_resolvers = {}

    class Dumper(yaml.SafeDumper):
        """Quotes a string that YAML 1.1 (SafeDumper's rules) or YAML 1.2 would not read as
        a string."""

    for tag, pattern in YAML_RULES.items():  # int before float: "1" is an int
        rx = re.compile(rf"^(?:{pattern})$")
        for cls in (Loader, Dumper):
            cls.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", rx, _FIRST[tag])

    def scalar(loader: Any, node: Any, tag: str) -> str:
        value = str(loader.construct_scalar(node))
        if not re.fullmatch(YAML_RULES[tag], value):
            raise yaml.constructor.ConstructorError(
                None, None, f"{value!r} is not a YAML 1.2 {tag}", node.start_mark
            )
        return value

    def to_bool(loader: Any, node: Any) -> bool:
        return scalar(loader, node, "bool").lower() == "true"

    def to_int(loader: Any, node: Any) -> int:
        value = scalar(loader, node, "int")
        base = {"0o": 8, "0x": 16}.get(value[:2], 10)
        return int(value[2:] if base != 10 else value, base)

    def to_float(loader: Any, node: Any) -> float:
        value = scalar(loader, node, "float").lower()
        special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
        return special[value] if value in special else float(value)

    Loader.add_constructor("tag:yaml.org,2002:bool", to_bool)
    Loader.add_constructor("tag:yaml.org,2002:int", to_int)
    Loader.add_constructor("tag:yaml.org,2002:float", to_float)

    def no_time(dumper: Any, data: Any) -> Any:
        raise yaml.representer.RepresenterError(
            f"{data!r}: a date or time is written as an ISO 8601 string (.isoformat()), "
            "which spotstop's YAML reader reads back as it is"
        )

    Dumper.add_representer(datetime.date, no_time)
    Dumper.add_representer(datetime.datetime, no_time)

    return Loader, Dumper


def _no_key_twice(
    node: Any,
    loader: Any,
    source: str,
    where: str,
    error: type[Exception],
    done: set[int] | None = None,
    inside: frozenset[int] = frozenset(),
) -> None:
    """Refuse a mapping (at any depth below ``node``) that holds a key twice: as written, or
    as read (``1`` and ``01``, ``0x10`` and ``16``: the dict would keep one); and a node that
    holds itself through an alias (``a: &x [*x]``: no config is endless). A node reached again
    through an alias is checked once."""
    import yaml

    done = set() if done is None else done
    if id(node) in inside:
        raise error(
            f"{where} holds itself through an alias (an endless value); write the value out "
            f"in {source}."
        )
    if id(node) in done:
        return
    done.add(id(node))
    inside = inside | {id(node)}
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_key_twice(item, loader, source, f"{where}[{i}]", error, done, inside)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[Any, int] = {}
    for key_node, value_node in node.value:
        path = join_key(where, str(key_node.value))
        if isinstance(key_node, yaml.ScalarNode):
            key = loader.construct_object(key_node)  # str, number, bool, None: hashable
            line = key_node.start_mark.line + 1
            if key in seen:
                raise error(
                    f"{path} appears twice (line {line}), first at line {seen[key]}; each key "
                    f"may appear once, and the first one would be lost. Merge them in {source}."
                )
            seen[key] = line
        _no_key_twice(value_node, loader, source, path, error, done, inside)


#: the encoding every CSV table is read in: UTF-8, with a leading byte-order mark dropped
CSV_ENCODING = "utf-8-sig"


def csv_header(
    fieldnames: Iterable[str] | None, *, source: str, error: type[Exception] = ConfigError
) -> list[str]:
    """The header of a CSV table (``csv.DictReader.fieldnames``), each name stripped; raises
    ``error`` naming ``source`` when a name appears twice."""
    header = [h.strip() for h in (fieldnames or [])]
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise error(
            f"{source}: the header names {', '.join(map(repr, twice))} more than once; each "
            "column may appear once."
        )
    return header


def is_real(x: object) -> TypeGuard[float]:
    """True for ``int``/``float`` and numpy integer/floating scalars; False for ``bool``,
    ``numpy.bool_`` and everything else (strings, ``None``, arrays, ``Fraction``, ``Decimal``).

    NaN and ±inf are real: check ``math.isfinite`` where the value must be finite.
    """
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(
        x, bool | np.bool_
    )


def is_int(x: object) -> TypeGuard[int]:
    """True for ``int`` and numpy integer scalars; False for ``bool``, ``numpy.bool_``, floats
    (``2.0`` too) and everything else."""
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def join_key(where: str, key: str) -> str:
    """The dotted key path of ``key`` inside the section ``where`` (``""``: the top level)."""
    return f"{where}.{key}" if where else key


def check_mapping(x: Any, *, where: str, source: str, error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` unless ``x`` is a mapping; ``where`` names it (``""``: the document),
    ``source`` says where to fix it (``"the policy file"``, a path)."""
    if not isinstance(x, Mapping):
        raise error(
            f"{where or 'the document'} must be a mapping (key: value); "
            f"got {type(x).__name__} {x!r}. Fix it in {source}."
        )


def check_keys(
    d: Mapping[Any, Any],
    *,
    where: str,
    required: Iterable[str] = (),
    optional: Iterable[str] = (),
    source: str,
    error: type[Exception] = ConfigError,
) -> None:
    """Raise ``error`` for an unknown key (with a close match suggested) or a missing required
    key of the section ``d`` at key path ``where``; unknown keys are reported first."""
    required = list(required)
    allowed = sorted({*required, *optional})
    for k in d:
        if not isinstance(k, str) or k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise error(
                f"{join_key(where, str(k))} is not a known key.{suggestion} "
                f"Allowed keys of {where or 'the top level'}: {', '.join(allowed)}. "
                f"Remove or rename it in {source}."
            )
    for k in required:
        if k not in d:
            raise error(f"{join_key(where, k)} is required but missing. Add it in {source}.")


def check_number(
    x: Any,
    *,
    where: str,
    source: str,
    error: type[Exception] = ConfigError,
    positive: bool = False,
) -> float:
    """``x`` as a float when it is a finite real number (and > 0 when ``positive``), else
    ``error`` naming the key ``where``."""
    if not is_real(x) or not math.isfinite(x) or (positive and x <= 0):
        allowed = "a finite number > 0" if positive else "a finite number"
        raise error(f"{where} must be {allowed}; got {x!r}. Set it in {source}.")
    return float(x)


def as_1d_float(
    x: Any, *, what: str, error: type[Exception] = ValueError, n: int | None = None
) -> np.ndarray:
    """``x`` as a 1-D float array (of shape ``(n,)`` when ``n`` is given), else ``error``
    naming ``what``. NaN and inf are kept: finiteness is the caller's rule."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise error(f"{what} must be a 1-D array of numbers; could not convert: {e}") from e
    if arr.ndim != 1:
        raise error(f"{what} must be a 1-D array; got shape {arr.shape}.")
    if n is not None and arr.shape != (n,):
        raise error(f"{what} must have shape ({n},), one entry per scene; got shape {arr.shape}.")
    return arr


def is_blank(text: str) -> bool:
    """True when ``text`` holds no character but whitespace, control characters (Unicode
    category Cc, e.g. NUL) and format characters (Cf: zero-width spaces and joiners, bidi
    marks, a byte-order mark): nothing a person reads. ``str.strip`` leaves the last two, so
    a request read from an empty UTF-8 file with a byte-order mark (``"\\ufeff"``) or made of
    NULs passed for an instruction and was judged."""
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in text)


#: the longest situation id (characters) the library takes; the sidecar's own limit
#: (``max_situation_chars``, 256 by default) may only be lower
MAX_SITUATION_CHARS = 4096


def situation_id_problem(sid: object) -> str | None:
    """Why ``sid`` cannot group scenes for situation recentering, or None when it can.

    A situation id is None (the scene belongs to no situation) or text that is not empty nor
    only whitespace, holds no control characters, is valid Unicode (no lone surrogate) and is
    at most :data:`MAX_SITUATION_CHARS` long: it keys the policy's windows, its state file and
    the log, which must read back what was written. The guard fails a scene with
    another id closed and leaves its windows alone; the sidecar answers 422 (its length limit
    apart)."""
    if sid is None:
        return None
    if not isinstance(sid, str):
        return f"must be text or None; got {type(sid).__name__} {sid!r}"
    if not sid.strip():
        return f"is empty ({sid!r}); give the place or task the scene belongs to, or None"
    if any(unicodedata.category(c) == "Cc" for c in sid):
        return "holds control characters; use printable text"
    try:
        sid.encode("utf-8")
    except UnicodeEncodeError as e:  # the log would store another id than the window keys
        return (
            f"is not valid Unicode text: it holds the lone surrogate {sid[e.start]!r} at "
            f"position {e.start}; decode it as UTF-8 text"
        )
    if len(sid) > MAX_SITUATION_CHARS:
        return (
            f"has {len(sid)} characters, more than {MAX_SITUATION_CHARS}; a situation id names "
            "a place or task, e.g. 'kitchen'"
        )
    return None
