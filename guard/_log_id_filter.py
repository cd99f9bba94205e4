"""Which archive may hold a decision: a Bloom filter of each archive's decision ids.

A late fail-closed amendment, or a label, that names a decision no longer in the live table
must find the archive that holds it. The archives' registry (the log's ``archives`` table)
keeps each file's time span, but an amendment names its decisions by id alone, and the ids are
uuid4 (random): the smallest and largest id of an archive of a few hundred rows span nearly
every id, so a range of ids would rule out no archive. Each registration therefore keeps a
Bloom filter of the archive's ids (``archives.id_filter``): an id not in it is certainly not in
the archive, so a lookup reads only the archives whose filter may hold one of its ids. An id
in the archive is always in its filter (no false negative, tested); an id not in it passes
with probability about :data:`FALSE_POSITIVE_RATE` (then its archive is read for nothing).

Size: :data:`BITS_PER_ID` bits (1.25 bytes) per archived decision, in the live database
(counted in the log's budget: about 1.2 MB per million archived decisions). A registration
without a filter (written before it existed, or by an older spotstop of the same log schema)
says nothing: its archive is read, as every archive was before.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Final

import numpy as np

__all__ = ["BITS_PER_ID", "FALSE_POSITIVE_RATE", "HASHES", "build", "may_hold"]

BITS_PER_ID: Final = 10
"""Bits of filter per archived id."""

HASHES: Final = 7
"""Bit positions per id (``round(BITS_PER_ID · ln 2)``, the rate's minimum)."""

FALSE_POSITIVE_RATE: Final = (1.0 - math.exp(-HASHES / BITS_PER_ID)) ** HASHES
"""The chance that an id not in an archive passes its filter (about 0.8 %), for a filter of
many ids; a smaller one (at least 64 bits) passes fewer."""

_MIN_BITS: Final = 64
_FORMAT: Final = b"\x01"  # the first byte: the filter's layout (this module's)


def _positions(decision_id: str, n_bits: int) -> list[int]:
    """The filter's bit positions of ``decision_id`` (double hashing of its sha256)."""
    h = hashlib.sha256(decision_id.encode("utf-8", "surrogatepass")).digest()
    a = int.from_bytes(h[:8], "little")
    b = int.from_bytes(h[8:16], "little") | 1
    return [(a + i * b) % n_bits for i in range(HASHES)]


def build(decision_ids: Iterable[str]) -> bytes:
    """The filter of ``decision_ids`` (what ``archives.id_filter`` holds)."""
    ids = list(decision_ids)
    n_bits = max(_MIN_BITS, 8 * math.ceil(BITS_PER_ID * len(ids) / 8))
    bits = np.zeros(n_bits, dtype=np.uint8)
    if ids:
        bits[np.fromiter((p for i in ids for p in _positions(i, n_bits)), dtype=np.int64)] = 1
    return _FORMAT + np.packbits(bits, bitorder="little").tobytes()


def may_hold(id_filter: bytes | None, decision_ids: Iterable[str]) -> bool:
    """Whether the archive whose filter is ``id_filter`` may hold one of ``decision_ids``: False
    only when none is in it. A missing filter (None), or one of a layout this spotstop does not
    know, says nothing: True."""
    if id_filter is None or id_filter[:1] != _FORMAT or len(id_filter) < 2:
        return True
    bits = np.unpackbits(np.frombuffer(id_filter, dtype=np.uint8, offset=1), bitorder="little")
    n_bits = int(bits.size)
    return any(all(bits[p] for p in _positions(i, n_bits)) for i in decision_ids)
