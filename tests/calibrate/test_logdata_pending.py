"""`CalibrationLog.pending` says what the log does not say yet of its own bundle's decisions.

It held the whole log's pending answers (every bundle's), so a recalibration of bundle 1 warned
of bundle 2's late answers, as the card did before `pending_of_bundle`. It is now selected by
the card's rule, and its counts are those of the whole log's reader selected by bundle, on a log
with archives and amendments waiting in the journal and the dead letter.
"""

from __future__ import annotations

from pathlib import Path

from spotstop.calibrate import read_calibration_log
from spotstop.guard import pending_of_bundle, read_reviewed
from spotstop.guard._journal import (
    DeadLetter,
    Journal,
    JournalEntry,
    default_dead_letter_path,
    default_journal_path,
)
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import Protect, Retention

from tests._support.records import make_record

_DAY = 86400.0


def test_pending_is_this_bundle_s_and_equals_the_whole_log_s_selected(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    # bundle 1: even i, bundle 2: odd i; all SAFE, so each amendment changes its row
    recs = [
        make_record(i, label="SAFE", bundle_id=f"bundle-{1 + i % 2}", request=f"r{i}")
        for i in range(10)
    ]
    with DecisionLog(log) as d:
        d.append_many(recs)
        d.apply_retention(Retention(keep_days=1.0), Protect(min_age_s=0), now=recs[5].time + _DAY)
        archived = d.archived_ids()
    ids = [r.decision_id for r in recs]
    assert {ids[0], ids[1], ids[4]} <= archived and ids[9] not in archived
    # amendments waiting: in the dead letter (archived rows of both bundles, an id in no row)
    # and in the journal (live rows of both bundles); a row of each bundle the log lacks
    dead = DeadLetter(default_dead_letter_path(log))
    dead.append("amend", error="x", amend_ids=[ids[0], ids[1], "nowhere"], amend_reason="late")
    dead.append("amend", error="x", amend_ids=[ids[4]], amend_reason="late")
    lacked = [
        make_record(20 + k, label="UNSAFE", fail_closed=True, bundle_id=f"bundle-{1 + k}")
        for k in range(2)
    ]
    dead.append("rows", error="y", records=lacked)
    Journal(default_journal_path(log), owner=str(log.resolve())).append(
        [JournalEntry("amend", amend_ids=(ids[8], ids[9]), amend_reason="later")]
    )

    whole = read_reviewed(log).pending
    for bundle, mine in (("bundle-1", {0, 4, 8}), ("bundle-2", {1, 9})):
        got = read_calibration_log(
            log, bundle_id=bundle, prompt_hash="abc123", members=["qwen", "smol"]
        ).pending
        assert got == pending_of_bundle(whole, bundle, "abc123")
        # counted by hand: this bundle's amended rows, its one row the log lacks; "nowhere"
        # names no bundle and is kept
        assert (got.amended, got.missing_dead_letter, got.missing_journal) == (len(mine), 1, 0)
        assert {d[0] for d in got.decisions if d[1] == "amended"} == {ids[i] for i in mine}
        assert got.unknown == 1
    assert (whole.amended, whole.missing_dead_letter) == (5, 2)
