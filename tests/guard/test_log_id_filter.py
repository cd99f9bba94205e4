"""A late amendment (or a label) of an archived decision reads only the archive that holds it.

``mark_fail_closed`` with ids that are not live read every registered archive, twice (the
archived ids, then ``amend_archived``). The registry kept no ids, and a range of uuid4 ids
would rule out no archive; each registration now keeps a Bloom filter of its ids
(``guard/_log_id_filter.py``), and a lookup reads only the archives that may hold its ids.
"""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spotstop.guard import _log_archive
from spotstop.guard import _log_id_filter as idf
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import Protect, Retention
from spotstop.guard._log_schema import RecordError

from tests._support.records import make_record

_REASON = "deadline exceeded (writing the decision log)"
_DAY = 86400.0


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.text(max_size=40), max_size=300, unique=True))
def test_every_id_of_an_archive_is_in_its_filter(ids: list[str]) -> None:
    f = idf.build(ids)
    assert all(idf.may_hold(f, [i]) for i in ids)
    assert idf.may_hold(f, ids) is bool(ids)


def test_the_false_positive_rate_is_what_the_filter_s_fill_predicts() -> None:
    """Against an independent computation: an id not in the filter passes when its HASHES
    positions are all set, so at the filter's share of set bits rho, with probability about
    rho ** HASHES; both near the stated rate (0.8 %)."""
    rng = random.Random(20261206)
    members = [f"{rng.getrandbits(128):032x}" for _ in range(5000)]
    others = [f"{rng.getrandbits(128):032x}" for _ in range(40000)]
    f = idf.build(members)
    bits = np.unpackbits(np.frombuffer(f[1:], dtype=np.uint8))
    assert bits.size >= idf.BITS_PER_ID * len(members)
    rho = float(bits.mean())
    predicted = rho**idf.HASHES
    passed = sum(idf.may_hold(f, [i]) for i in others)
    rate = passed / len(others)
    sd = math.sqrt(predicted * (1 - predicted) / len(others))
    assert abs(rate - predicted) < 4 * sd, (rate, predicted)
    assert abs(idf.FALSE_POSITIVE_RATE - 0.0082) < 0.0005
    assert predicted < 1.2 * idf.FALSE_POSITIVE_RATE
    assert len(f) == 1 + math.ceil(idf.BITS_PER_ID * len(members) / 8)


def test_no_filter_or_an_unknown_layout_says_nothing() -> None:
    assert idf.may_hold(None, ["a"]) and idf.may_hold(b"\x07abc", ["a"])
    assert not idf.may_hold(idf.build(["b"]), [])


def _archives_of_one_row(tmp_path: Path, n: int = 5) -> tuple[Path, list[str]]:
    """``n`` SAFE decisions, the ``n - 1`` oldest archived one per file."""
    log = tmp_path / "log.sqlite"
    recs = [make_record(i, label="SAFE", decision_id=f"d{i}") for i in range(n)]
    with DecisionLog(log) as d:
        d.append_many(recs)
        d.apply_retention(
            Retention(keep_days=1.0),
            Protect(min_age_s=0),
            now=recs[-1].time + _DAY,
            max_rows_per_file=1,
        )
        assert len(d.archives()) == n - 1
    return log, [r.decision_id for r in recs]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the archive files read (whole: every lookup and amendment reads so)."""
    names: list[str] = []
    real = _log_archive._read_registered

    def spy(folder: Path, info: Any) -> Any:
        names.append(info.name)
        return real(folder, info)

    monkeypatch.setattr(_log_archive, "_read_registered", spy)
    return names


def test_a_late_amendment_reads_only_the_archive_that_holds_its_row(
    tmp_path: Path, opened: list[str]
) -> None:
    """The repro: with four archives, an amendment of one archived decision read all four
    (twice without ``skip_unknown``)."""
    log, ids = _archives_of_one_row(tmp_path)
    with DecisionLog(log) as d:
        by_id = {a.name: a for a in d.archives()}
        where = {
            i: next(n for n, a in by_id.items() if a.first_time == make_record(k).time)
            for k, i in enumerate(ids[:-1])
        }
        opened.clear()
        assert d.mark_fail_closed([ids[1]], _REASON, skip_unknown=True) == ()
        assert opened == [where[ids[1]]]  # the guard's writer's call
        opened.clear()
        assert d.mark_fail_closed([ids[2]], _REASON) == ()  # all or nothing: looked up first
        assert set(opened) == {where[ids[2]]} and len(opened) == 2
        opened.clear()
        with pytest.raises(RecordError, match="unknown decision_id 'nowhere'"):
            d.mark_fail_closed(["nowhere"], _REASON)
        assert opened == []  # no filter holds it
        assert d.mark_fail_closed(["nowhere"], _REASON, skip_unknown=True) == ("nowhere",)
        assert opened == []
        opened.clear()
        d.set_labels([(ids[3], "safe", None, None)])  # a label of an archived decision
        assert opened == [where[ids[3]]]
        opened.clear()
        assert d.get(ids[2]).label == "UNSAFE"  # type: ignore[union-attr]
        assert d.get("nowhere") is None
        assert opened == [next(a.name for a in d.archives() if a.may_hold([ids[2]]))]
        answered = {r.decision_id: r.label for r in d.records(raw=True)}
    assert answered == {
        ids[0]: "SAFE",
        ids[1]: "UNSAFE",
        ids[2]: "UNSAFE",
        ids[3]: "SAFE",
        ids[4]: "SAFE",
    }


def test_a_registry_without_filters_is_read_whole_and_gets_the_column(
    tmp_path: Path, opened: list[str]
) -> None:
    """A log registered by an older spotstop (no ``id_filter`` column): read-only readers read
    it as it is; opened for writing it gets the column (NULL: its archives are read, as
    before), and an archive written again for an amendment gets its filter."""
    log, ids = _archives_of_one_row(tmp_path, n=3)
    with sqlite3.connect(log) as c:
        c.execute("ALTER TABLE archives DROP COLUMN id_filter")
    with DecisionLog(log, read_only=True) as d:
        assert [a.id_filter for a in d.archives()] == [None, None]
        assert len(list(d.records())) == 3
    with DecisionLog(log) as d:
        assert [a.id_filter for a in d.archives()] == [None, None]
        opened.clear()
        assert d.mark_fail_closed([ids[0]], _REASON, skip_unknown=True) == ()
        assert len(opened) == 2  # no filter: both read, as before
        filters = {a.first_time: a.id_filter for a in d.archives()}
        assert filters[make_record(0).time] is not None and filters[make_record(1).time] is None
        assert d.get(ids[0], raw=True).label == "UNSAFE"  # type: ignore[union-attr]
