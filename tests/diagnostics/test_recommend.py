"""Which policy fits a deployment, from the diagnostics (the card's verdict uses it)."""

from __future__ import annotations

from spotstop.diagnostics import recommend_policy


def test_recommendation_follows_the_diagnostics():
    from spotstop.diagnostics import simulate_log

    # strong situation offsets and contrasts: recentering gains; enough unsafe: conformal
    table = simulate_log(150, situation_sd=0.8, rng=1)
    rec = recommend_policy(
        table, frozen_cut=0.0, conformal_feasible=True, conformal_needed=22,
        n_unsafe_situations=150, repeat_share=0.8, n_resamples=60, rng=0,
    )  # fmt: skip
    assert rec.policy == "conformal" and any("situation" in a for a in rec.alternatives)
    rec2 = recommend_policy(
        table, frozen_cut=0.0, conformal_feasible=False, conformal_needed=22,
        n_unsafe_situations=5, repeat_share=0.8, n_resamples=60, rng=0,
    )  # fmt: skip
    assert rec2.policy == "situation" and rec2.evidence["situation_ba_gain_low"] > 0
    assert any("17 more" in r for r in rec2.reasons)
    rec3 = recommend_policy(
        table, frozen_cut=0.0, conformal_feasible=False, conformal_needed=22,
        n_unsafe_situations=5, repeat_share=0.1, n_resamples=60, rng=0,
    )  # fmt: skip
    assert rec3.policy == "frozen"
    assert any("prevalence" in r for r in rec3.reasons)
    assert rec3.to_dict()["evidence"]["batch_tpr_all_unsafe"] < 0.8
    rec4 = recommend_policy(
        None, frozen_cut=0.0, conformal_feasible=False, conformal_needed=22, n_unsafe_situations=0
    )
    assert rec4.policy == "frozen" and "could not run" in rec4.reasons[0]


def test_batch_reason_names_the_criterion_that_failed():
    from spotstop.diagnostics._recommend import _batch_reason

    only_all = _batch_reason(
        {"batch_ba_10": 0.734, "frozen_ba_10": 0.734,
         "batch_tpr_all_unsafe": 0.613, "frozen_tpr_all_unsafe": 0.889}
    )  # fmt: skip
    assert "it flags 61.3% of an all-unsafe batch (frozen 88.9%)" in only_all
    assert "(while at 10% unsafe its balanced accuracy is 73.4% (frozen 73.4%))" in only_all
    only_10 = _batch_reason(
        {"batch_ba_10": 0.60, "frozen_ba_10": 0.70,
         "batch_tpr_all_unsafe": 1.0, "frozen_tpr_all_unsafe": 1.0}
    )  # fmt: skip
    # no batch_rule in the evidence: the batch mean of the fixed S, named by its kind
    assert only_10.startswith("the batch mean of the fixed score (`batch_frozen_iqr`")
    assert "falls behind the frozen cut when prevalence moves: at 10% unsafe" in only_10
    assert "while it flags 100.0% of an all-unsafe batch" in only_10


def test_batch_reason_says_what_was_not_measured():
    from spotstop.diagnostics._recommend import _batch_reason

    nan = float("nan")
    text = _batch_reason(
        {"batch_ba_10": nan, "frozen_ba_10": nan,
         "batch_tpr_all_unsafe": nan, "frozen_tpr_all_unsafe": nan}
    )  # fmt: skip
    assert "was not measured (too few labelled cases)" in text and "falls behind" not in text


def test_the_card_recommends_on_the_numbers_its_prevalence_table_shows():
    """The recommendation ran a prevalence check of its own (other draws, other levels): the
    policy sentence quoted 79.4 % where the card's prevalence table showed 80.3 %."""
    from spotstop.diagnostics import simulate_log
    from spotstop.diagnostics._card import compute_card

    card = compute_card(simulate_log(40, rng=0), n_boot=100, n_boot_checks=100, rng=0)
    ev = card.recommendation.evidence
    shown = card.checks["prevalence"].result
    kind = ev["batch_rule"]
    assert ev["batch_ba_10"] == shown.rules[0.1][kind].balanced_accuracy.value
    assert ev["frozen_tpr_all_unsafe"] == shown.rules[1.0]["frozen"].tpr.value


def test_the_conformal_target_is_the_version_in_force(tmp_path):
    """v1 (PAC alpha 0.02) decided, v2 (alpha 0.2) replaced it, then v1 was activated again
    and made the latest decisions: the recommendation checked v2's alpha 0.2 (90 unsafe
    situations "suffice"); it now checks v1's, the version in force."""
    import numpy as np
    from spotstop.diagnostics import log_cases
    from spotstop.diagnostics._recommend import recommend_for_card
    from spotstop.guard.policies import ConformalPolicy

    from tests._support.log_writer import Segment, policy_config, write_log

    rng = np.random.default_rng(0)
    v1 = policy_config(ConformalPolicy(alpha=0.02, n=300, k=3, threshold=-1.0, delta=0.1))
    v2 = policy_config(ConformalPolicy(alpha=0.2, n=30, k=3, threshold=-1.0, delta=0.1), version=2)
    segments, labels = [], []
    for prefix, cfg, t0 in (("a-", v1, 1.7e9), ("b-", v2, 1.8e9), ("c-", v1, 1.9e9)):
        s = np.empty(60)
        s[0::2], s[1::2] = rng.normal(1.0, 1.0, 30), rng.normal(-1.0, 1.0, 30)
        sit = [f"{prefix}{i // 2}" for i in range(60)]
        segments.append((Segment(cfg, {"a": s, "b": s}, sit, t0), prefix))
        labels += [
            (f"{prefix}{i:05d}", "safe" if i % 2 else "unsafe", f"{prefix}{i // 2}", "r")
            for i in range(60)
        ]
    write_log(tmp_path / "log.sqlite", segments, labels)
    lc = log_cases(tmp_path / "log.sqlite")
    assert lc.log.version[-1] == v1.version_id
    rec = recommend_for_card(lc.table, lc.log, frozen_cut=0.0, n_resamples=20, rng=0)
    said = " ".join(rec.reasons)
    assert "PAC (alpha=0.02, delta=0.1)" in said and "alpha=0.2," not in said
