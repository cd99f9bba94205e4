"""Drift between periods: ``spotstop card LOG --period day|week|month`` (diagnostics/_periods.py)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics._check_base import CardContext
from spotstop.diagnostics._cli import card_main
from spotstop.diagnostics._from_log import log_cases
from spotstop.diagnostics._periods import period_key, periods
from spotstop.guard._log import DecisionLog

from tests._support.log_writer import CONFORMAL_CONFIG, Segment, policy_row, segment_records

WEEK = 7 * 86400.0
MONDAY = dt.datetime(2026, 10, 5, 9, tzinfo=dt.UTC).timestamp()  # ISO week 41


@pytest.mark.parametrize(
    ("when", "period", "key"),
    [
        ("2026-11-30T12:00:00", "day", "2026-11-30"),
        ("2026-11-30T12:00:00", "week", "2026-W49"),
        ("2026-11-30T12:00:00", "month", "2026-11"),
        ("2024-12-31T23:59:59", "week", "2025-W01"),  # the ISO year, not the calendar's
        ("2027-01-01T00:00:00", "week", "2026-W53"),
    ],
)
def test_period_keys_are_utc_calendar_periods(when: str, period: str, key: str) -> None:
    t = dt.datetime.fromisoformat(when).replace(tzinfo=dt.UTC).timestamp()
    assert period_key(t, period) == key


def _week(k: int, *, n_pairs: int, seed: int, unsafe_shift: float = 1.6, extra_unsafe: int = 0):
    """One week of decisions: contrasts (one situation each) and ``extra_unsafe`` unsafe
    decisions of their own situations (the unsafe share grows)."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.tile([0, 1], n_pairs), np.ones(extra_unsafe, dtype=int)])
    a = rng.normal(0, 1, y.size) + unsafe_shift * y
    b = rng.normal(0, 1, y.size) + unsafe_shift * y
    sit = [f"w{k}-s{j // 2}" if j < 2 * n_pairs else f"w{k}-x{j}" for j in range(y.size)]
    recs = segment_records(
        Segment(CONFORMAL_CONFIG, {"a": a, "b": b}, sit, MONDAY + k * WEEK), f"w{k}-"
    )
    labels = [
        (r.decision_id, "unsafe" if y[j] else "safe", f"w{k}-c{j // 2}" if j < 2 * n_pairs else None,
         "rev")
        for j, r in enumerate(recs)
    ]  # fmt: skip
    return recs, labels


def _log(path: Path, weeks: list[tuple[list, list]]) -> Path:
    with DecisionLog(path) as log:
        for recs, labels in weeks:
            log.append_many(recs, policy=policy_row(CONFORMAL_CONFIG))
            log.set_labels(labels)
    return path


def _periods(path: Path, *, n_boot: int = 400, seed: int = 0, baseline: str = "first"):
    cases = log_cases(path)
    ctx = CardContext(cases.table, 0.6, np.random.default_rng(seed), n_boot=n_boot, log=cases.log)
    return periods(ctx, period="week", baseline=baseline, rng=np.random.default_rng(seed))


def test_a_doubled_unsafe_share_and_a_cut_that_misses_are_flagged(tmp_path: Path) -> None:
    weeks = [_week(k, n_pairs=40, seed=k) for k in range(2)]
    weeks.append(_week(2, n_pairs=40, seed=2, unsafe_shift=0.5, extra_unsafe=80))
    res = _periods(_log(tmp_path / "log.sqlite", weeks))
    assert [p.key for p in res.rows] == ["2026-W41", "2026-W42", "2026-W43"]
    first, _, last = res.rows
    assert first.change is None and not first.changed
    assert first.fields["unsafe_share"].value == pytest.approx(0.5)
    assert last.fields["unsafe_share"].value == pytest.approx(120 / 160)
    assert "unsafe_share" in last.changed and "delivered_balanced_accuracy" in last.changed
    assert last.change is not None
    assert last.change["unsafe_share"].value == pytest.approx(120 / 160 - 0.5)
    [audit] = last.audits
    assert audit.status == "violated" and [a.status for a in first.audits] == ["holds"]
    assert res.latest_violations() == (audit,)


def test_a_stationary_log_is_flagged_at_no_more_than_the_stated_rate(tmp_path: Path) -> None:
    flagged: dict[str, int] = {}
    any_field = 0
    for seed in range(100):
        weeks = [_week(k, n_pairs=80, seed=100 * seed + k, unsafe_shift=1.0) for k in range(3)]
        res = _periods(_log(tmp_path / f"{seed}.sqlite", weeks), n_boot=300, seed=seed)
        changed = {name for p in res.rows for name in p.changed}
        for name in changed:
            flagged[name] = flagged.get(name, 0) + 1
        any_field += bool(changed)  # what the verdict reads
    # family-wise 5 % per log over periods and fields: P(11 or more of 100 | 5 %) = 0.011
    # (per field only, some field of a log changed in 16 of 100 such logs)
    assert any_field <= 10 and all(n <= 10 for n in flagged.values()), (any_field, flagged)


def test_a_period_with_few_groups_is_not_compared(tmp_path: Path) -> None:
    weeks = [_week(0, n_pairs=40, seed=0), _week(1, n_pairs=10, seed=1, unsafe_shift=-1.0)]
    res = _periods(_log(tmp_path / "log.sqlite", weeks))
    last = res.rows[-1]
    assert last.n_groups == 10 and not last.changed and "fewer than 30 groups" in last.note
    assert last.change is not None and np.isnan(last.change["auroc"].ci.low)


def test_the_previous_baseline_compares_neighbours(tmp_path: Path) -> None:
    weeks = [_week(k, n_pairs=30, seed=k) for k in range(3)]
    path = _log(tmp_path / "log.sqlite", weeks)
    res = _periods(path, baseline="previous")
    _, second, third = res.rows
    assert third.change is not None and second.change is not None
    want = third.fields["auroc"].value - second.fields["auroc"].value
    assert third.change["auroc"].value == pytest.approx(want, abs=1e-12)


def test_the_card_with_periods_adds_its_section_and_a_drift_sentence_only(
    tmp_path: Path,
) -> None:
    weeks = [_week(k, n_pairs=30, seed=k) for k in range(2)]
    weeks.append(_week(2, n_pairs=30, seed=2, unsafe_shift=0.3))
    path = _log(tmp_path / "log.sqlite", weeks)
    common = [str(path), "--n-boot", "300", "--quiet"]
    assert card_main([*common, "--out", str(tmp_path / "a"), "--period", "week"]) == 0
    assert card_main([*common, "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "card.json").read_text())
    b = json.loads((tmp_path / "b" / "card.json").read_text())
    per = a["checks"].pop("periods")
    assert per["applicable"] and per["latest_violated"] == [CONFORMAL_CONFIG.version_id]
    assert not b["checks"].pop("periods")["applicable"]
    drift = [v for v in a["verdict"] if v["topic"] == "drift"]
    assert len(drift) == 1 and drift[0]["status"] == "fail" and "2026-W43" in drift[0]["sentence"]
    a["verdict"] = [v for v in a["verdict"] if v["topic"] != "drift"]
    for doc in (a, b):
        doc["provenance"].pop("created_utc")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    md = (tmp_path / "a" / "card.md").read_text()
    assert "Drift between periods" in md and "2026-W41" in md
    html = (tmp_path / "a" / "card.html").read_text()
    assert "Key fields per period" in html  # the plot


def test_period_needs_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "c")
    assert card_main(["--simulated", "--period", "week", "--out", out]) == 2
    assert "--period goes with a decision LOG" in capsys.readouterr().err


def test_a_period_audits_only_the_conformal_versions_that_decided_in_it(tmp_path: Path) -> None:
    """Each period audited every conformal version of the log: a week before a version was
    created said "audit: v2 not enough data" of a cut that did not exist yet."""
    from spotstop.guard.policies import ConformalPolicy, FrozenPolicy

    from tests._support.log_writer import policy_config

    frozen = policy_config(FrozenPolicy(threshold=0.2), version=1, created=MONDAY - 10)
    conformal = policy_config(
        ConformalPolicy(alpha=0.1, n=100, k=10, threshold=-0.3),
        version=2,
        created=MONDAY + WEEK - 10,
    )
    path = tmp_path / "log.sqlite"
    with DecisionLog(path) as log:
        for k, cfg in enumerate((frozen, conformal)):
            rng = np.random.default_rng(k)
            y = np.tile([0, 1], 30)
            a, b = (rng.normal(0, 1, y.size) + 1.6 * y for _ in range(2))
            sit = [f"w{k}-s{j // 2}" for j in range(y.size)]
            recs = segment_records(Segment(cfg, {"a": a, "b": b}, sit, MONDAY + k * WEEK), f"w{k}-")
            log.append_many(recs, policy=policy_row(cfg))
            log.set_labels(
                [
                    (r.decision_id, "unsafe" if y[j] else "safe", f"w{k}-c{j // 2}", "rev")
                    for j, r in enumerate(recs)
                ]
            )
    got = {p.key: [a.version_id for a in p.audits] for p in _periods(path).rows}
    first, second = sorted(got)
    assert got[first] == []  # the frozen week: no conformal cut to audit
    assert got[second] == [conformal.version_id]


def _audit(status: str, *, misses: int, situations: int, decisions: int):
    from spotstop.diagnostics._conformal_audit import DeployedAudit
    from spotstop.diagnostics._results import ConfidenceInterval, Estimate

    return DeployedAudit(
        version_id="v2", guarantee="marginal", alpha=0.1, delta=None, n_calibration=24, k=2,
        threshold=-0.4, created="2026-10-05T00:00:00+00:00", p_cut_above_alpha=0.3,
        n_decisions=decisions, misses=misses,
        miss_rate=Estimate(misses / situations, ConfidenceInterval(0.2, 0.6), situations),
        p_value=0.0002 if status == "violated" else 0.9, status=status,  # type: ignore[arg-type]
        n_min=36, level=0.05,
    )  # fmt: skip


def _result(last_audit, *, note: str = "", changed: tuple[str, ...] = ()):
    from spotstop.diagnostics._periods import Period, PeriodsResult
    from spotstop.diagnostics._results import Estimate

    first = Period("2026-W41", 80, {}, None, (), (), 40)
    change = {"auroc": Estimate.point(0.0, 80)}
    last = Period("2026-W42", 80, {}, change, changed, (last_audit,), 40 if not note else 10, note)
    return PeriodsResult("week", "first", (first, last))


def test_the_drift_sentence_counts_a_violated_cut_in_situations_not_decisions() -> None:
    """It said "missed 9 of 86 unsafe situations (miss rate 39.1 %)": 86 was the labelled
    unsafe decisions, the miss rate's denominator the 23 situations audited."""
    from spotstop.diagnostics._verdict import drift_item

    item = drift_item(_result(_audit("violated", misses=9, situations=23, decisions=86)))
    assert item is not None and item.status == "fail"
    assert "missed 9 of 23 unsafe situations" in item.sentence and "86" not in item.sentence


def test_the_drift_sentence_is_no_ok_for_a_change_not_tested_or_an_audit_without_data() -> None:
    """A latest period with too few groups to compare, or a cut whose audit there had too few
    unsafe situations, read "ok: no key field moved ... every deployed conformal cut kept its
    miss rate there"."""
    from spotstop.diagnostics._verdict import drift_item

    few = "fewer than 30 groups here or in 2026-W41: ...; not compared"
    untested = drift_item(_result(_audit("holds", misses=0, situations=40, decisions=60), note=few))
    assert untested is not None and untested.status == "warn"
    assert "not tested" in untested.sentence and "No key field" not in untested.sentence
    thin = drift_item(_result(_audit("not enough data", misses=1, situations=12, decisions=20)))
    assert thin is not None and thin.status == "warn"
    assert "kept its miss rate there." not in thin.sentence and "1 of 12" in thin.sentence
    held = drift_item(_result(_audit("holds", misses=2, situations=40, decisions=60)))
    assert held is not None and held.status == "ok" and "kept its miss rate" in held.sentence


def test_a_period_row_not_compared_does_not_say_nothing_changed(tmp_path: Path) -> None:
    weeks = [_week(0, n_pairs=40, seed=0), _week(1, n_pairs=10, seed=1)]
    path = _log(tmp_path / "log.sqlite", weeks)
    out = tmp_path / "card"
    assert card_main([str(path), "--n-boot", "100", "--quiet", "--period", "week",
                      "--out", str(out)]) == 0  # fmt: skip
    md = (out / "card.md").read_text()
    [row] = [line for line in md.splitlines() if line.startswith("| 2026-W42")]
    assert "not compared" in row and "nothing changed" not in row
    doc = json.loads((out / "card.json").read_text())
    [drift] = [v for v in doc["verdict"] if v["topic"] == "drift"]
    assert drift["status"] == "warn" and "not tested" in drift["sentence"]


def test_an_interval_excludes_a_value_only_when_both_ends_are_finite_and_miss_it():
    """The one rule that a change, a placebo or a period's move is 'there' (both ends finite
    and on one side of the value), which the periods check and the cue placebo both read."""
    import math

    from spotstop.diagnostics._results import ConfidenceInterval as CI

    assert CI(0.1, 0.3).excludes(0.0) and CI(-0.3, -0.1).excludes(0.0)
    assert not CI(-0.1, 0.3).excludes(0.0) and not CI(0.0, 0.3).excludes(0.0)  # closed
    assert not CI(math.nan, math.nan).excludes(0.0) and not CI(0.1, math.inf).excludes(0.0)
    assert CI(0.1, 0.3).excludes(0.05) and not CI(0.1, 0.3).excludes(0.2)
