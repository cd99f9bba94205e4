"""The card's batch figures are the numbers of the rule they name (audit 05: the card called
the batch mean of a fixed S "batch" and recommended the guard's ``batch`` policy, which refits
medians, IQRs and weights on every batch, from it).

Cases: contrasts of one strong member (``a``, bimodal by label) and one weak, wide one
(``b``), fused with frozen statistics fitted on the 50 % unsafe pool.  In batches of 10 %
unsafe the ``batch`` rule rescales ``a`` by its (now small) batch IQR and beats the frozen
cut, while the batch mean of the fixed S falls behind it.  Every expected number is computed
here by calling the guard's :class:`BatchPolicy` directly, batch by batch, through
:func:`decide_batch`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from spotstop.diagnostics import CaseTable
from spotstop.diagnostics._batch_rule import (
    BatchRule,
    batch_rule_bootstrap,
    batch_rule_for,
    pair_accuracy,
)
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._metrics import flag_rates
from spotstop.diagnostics._prevalence import prevalence_check
from spotstop.diagnostics._recommend import _batch_holds, recommend_policy
from spotstop.diagnostics._resample import percentile_ci
from spotstop.guard import Avg2Fusion
from spotstop.guard.policies import (
    BatchPolicy,
    FrozenPolicy,
    batch_inputs,
    decide_batch,
    unsafe_mask,
)


def _audit_table(
    n_pairs: int = 300, seed: int = 0, members: bool = True, n_safe: int = 1
) -> CaseTable:
    """``n_pairs`` contrasts of ``n_safe`` safe scenes and one unsafe scene; S fused with the
    statistics of an unlabelled pool at 50 % unsafe (the policy file's frozen fusion)."""
    rng = np.random.default_rng(seed)

    def members_of(y: np.ndarray) -> dict[str, np.ndarray]:
        a = np.where(y == 1, 3.0, -3.0) + rng.normal(0, 1.0, y.size)
        return {"a": a, "b": 0.5 * y + rng.normal(0, 4.0, y.size)}

    frozen = Avg2Fusion.fit(members_of(np.tile([0, 1], 1000)))
    y = np.tile([0] * n_safe + [1], n_pairs)
    ms = members_of(y)
    a, b = ms["a"], ms["b"]
    s = frozen.fuse_many(ms)
    return CaseTable(
        case_id=[f"x{i}" for i in range(y.size)],
        label=y,
        score=s,
        contrast_id=np.repeat([f"c{i}" for i in range(n_pairs)], n_safe + 1),
        situation_id=None,
        member_scores={"a": a, "b": b} if members else {},
    )


class _Recording(BatchRule):
    """The card's batch rule, remembering every batch it labelled (for the by-hand replay)."""

    def unsafe(self, idx: np.ndarray) -> np.ndarray:
        self.__dict__.setdefault("seen", []).append(np.array(idx, copy=True))
        return super().unsafe(idx)


def _recording(table: CaseTable, cut: float) -> _Recording:
    rule = batch_rule_for(table, fallback_cut=cut)
    assert rule is not None
    return _Recording(**{f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})


def _by_hand(table: CaseTable, idx: np.ndarray, cut: float) -> np.ndarray:
    """The guard's ``batch`` policy on the batch ``idx``: BatchPolicy through decide_batch."""
    ms = {m: np.asarray(v)[idx] for m, v in table.member_scores.items()}
    fusion = Avg2Fusion.fit(dict(table.member_scores))  # BatchPolicy reads only its members
    x = batch_inputs(fusion, ms)
    return decide_batch(BatchPolicy(fallback=FrozenPolicy(cut)), x).unsafe


def test_the_card_rule_labels_as_decide_batch():
    t = _audit_table(60)
    rule = batch_rule_for(t, fallback_cut=0.1)
    assert rule is not None and rule.kind == "batch" and rule.policy.weights == "equal"
    idx = np.random.default_rng(1).integers(0, len(t), 90)
    np.testing.assert_array_equal(rule.unsafe(idx), _by_hand(t, idx, 0.1))
    # a batch too small to refit on falls back to the frozen cut, as the guard does
    np.testing.assert_array_equal(rule.unsafe(idx[:1]), _by_hand(t, idx[:1], 0.1))
    assert batch_rule_for(_audit_table(60, members=False)) is None


def test_prevalence_batch_figure_is_batchpolicy_per_batch_and_differs_from_frozen_iqr():
    t = _audit_table()
    cut = float(np.mean(t.score))
    rule = _recording(t, cut)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        p = prevalence_check(
            t, policy_cut=cut, prevalences=(0.1,), n_resamples=30, rng=3, batch_rule=rule
        )
    assert p.batch_kind == "batch"
    seen = rule.__dict__["seen"]
    assert len(seen) == 30
    ba, ba_fixed_s = [], []
    for idx in seen:  # independently: BatchPolicy on each resampled batch
        yb = t.label[idx]
        tpr, fpr = flag_rates(yb, _by_hand(t, idx, cut))
        ba.append(0.5 * (tpr + 1 - fpr))
        sb = t.score[idx]
        tpr, fpr = flag_rates(yb, unsafe_mask(sb, float(sb.mean())))
        ba_fixed_s.append(0.5 * (tpr + 1 - fpr))
    got = p.rules[0.1]
    assert got["batch"].balanced_accuracy.value == pytest.approx(np.mean(ba), abs=1e-12)
    assert got["batch_frozen_iqr"].balanced_accuracy.value == pytest.approx(
        np.mean(ba_fixed_s), abs=1e-12
    )
    # the audit's finding: the two rules differ, on either side of the frozen cut
    frozen = got["frozen"].balanced_accuracy.value
    assert got["batch"].balanced_accuracy.value > frozen + 0.02
    assert got["batch_frozen_iqr"].balanced_accuracy.value < frozen - 0.02
    gain = got["batch"].balanced_accuracy.value - frozen
    assert p.gain[0.1].value == pytest.approx(gain, abs=1e-12)  # the gain is the batch rule's


def test_bootstrap_batch_fields_refit_batchpolicy_on_every_draw():
    t = _audit_table(40, n_safe=6)  # 1 in 7 unsafe; each unsafe scene in 6 pairs
    cut = 0.0
    rule = _recording(t, cut)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        est = batch_rule_bootstrap(t, rule, cut=cut, n_boot=40, rng=5)
    seen = rule.__dict__["seen"]
    assert len(seen) == 41  # the full table, then one batch per draw
    pw = t.pairs.weight

    def a_batch(idx: np.ndarray) -> float:
        mult = np.bincount(idx, minlength=len(t))
        lab = np.zeros(len(t), dtype=bool)
        lab[idx] = _by_hand(t, idx, cut)
        return pair_accuracy(lab, t.label, pw * mult)

    draws = np.array([a_batch(idx) for idx in seen[1:]])
    assert est["A_batch"].value == pytest.approx(a_batch(seen[0]), abs=1e-12)
    ci = percentile_ci(draws)
    assert (est["A_batch"].ci.low, est["A_batch"].ci.high) == pytest.approx((ci.low, ci.high))
    # each draw's batch is its resampled cases, every contrast whole
    for idx in seen[1:]:
        assert idx.size == len(t)  # G groups drawn, each of 7 cases
    # the batch rule is not the batch mean of the fixed S
    fixed = pair_accuracy(unsafe_mask(t.score, float(t.score.mean())), t.label, pw)
    assert abs(est["A_batch"].value - fixed) > 0.01


def test_bootstrap_batch_fields_without_member_scores_are_undefined():
    t = _audit_table(40, members=False)
    with pytest.warns(UndefinedMetricWarning, match="no member scores"):
        est = batch_rule_bootstrap(t, batch_rule_for(t), n_boot=10, rng=0)
    assert all(math.isnan(e.value) for e in est.values())


def _recommend(table: CaseTable, cut: float, **kw: object):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recommend_policy(
            table,
            frozen_cut=cut,
            conformal_feasible=False,
            conformal_needed=22,
            n_unsafe_situations=0,
            repeat_share=0.0,
            n_resamples=40,
            rng=0,
            **kw,  # type: ignore[arg-type]
        )


def test_recommendation_names_the_rule_whose_numbers_decided_it():
    t = _audit_table()
    cut = float(np.mean(t.score))
    rec = _recommend(t, cut)
    ev = rec.evidence
    assert ev["batch_rule"] == "batch"
    # the evidence is the batch rule's, from the same draws as the prevalence check
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = prevalence_check(t, policy_cut=cut, prevalences=(0.5, 0.1, 1.0), n_resamples=40, rng=0)
    assert ev["batch_ba_10"] == p.rules[0.1]["batch"].balanced_accuracy.value
    assert ev["batch_ba_10"] > ev["frozen_ba_10"]  # holds at 10 %: refitted, it is ahead
    # it flags about half of an all-unsafe batch: frozen, and the reason says why in numbers
    assert rec.policy == "frozen"
    reason = rec.reasons[0]
    assert "`batch`" in reason and "`batch_frozen_iqr`" not in reason
    assert f"while at 10% unsafe its balanced accuracy is {100 * ev['batch_ba_10']:.1f}%" in reason
    # without member scores only the batch mean of the fixed S is measured, and named
    rec2 = _recommend(_audit_table(members=False), cut)
    assert rec2.evidence["batch_rule"] == "batch_frozen_iqr"
    assert "`batch_frozen_iqr`" in rec2.reasons[0]
    assert rec2.evidence["batch_ba_10"] < rec2.evidence["frozen_ba_10"]


def test_recommended_kind_is_the_measured_rule():
    # a high fixed cut: both batch rules hold against it; the kind recommended is the one
    # measured (the guard's batch policy only where it was measured)
    t = _audit_table()
    rec = _recommend(t, 0.5)
    assert rec.policy == "batch" and _batch_holds(rec.evidence)
    assert "`batch`" in rec.reasons[0]
    rec2 = _recommend(t, 0.5, batch_rule=None)
    assert rec2.policy == "batch_frozen_iqr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = prevalence_check(t, policy_cut=0.5, prevalences=(0.5, 0.1, 1.0), n_resamples=40, rng=0)
    assert rec2.evidence["batch_ba_10"] == p.rules[0.1]["batch_frozen_iqr"].balanced_accuracy.value


def test_card_fields_name_the_rule_they_measure():
    from spotstop.diagnostics import compute_card, group_bootstrap

    t = _audit_table(60, n_safe=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        card = compute_card(t, n_boot=100, n_boot_checks=40, n_boot_kernel=5, rng=0)
        boot = group_bootstrap(t, n_boot=20, rng=0)
    f = card.fields
    # the paper's batch rule: BatchPolicy on the whole table (the point estimate)
    lab = _by_hand(t, np.arange(len(t)), 0.0)
    assert f["A_batch"].value == pytest.approx(pair_accuracy(lab, t.label, t.pairs.weight))
    assert f["batch_gain"].value == pytest.approx(f["A_batch"].value - f["A"].value)
    # the engine's batch mean of the fixed S is shown under its own kind
    assert f["A_batch_frozen_iqr"].value == boot["A_batch"].value
    assert f["batch_frozen_iqr_gain"].value == boot["batch_gain"].value
    assert abs(f["A_batch"].value - f["A_batch_frozen_iqr"].value) > 0.01
    doc = card.to_json()
    assert doc["checks"]["prevalence"]["batch_rule"] == "batch"
    assert doc["recommendation"]["evidence"]["batch_rule"] == "batch"
    assert "batch_frozen_iqr" in doc["explanations"]["A_batch_frozen_iqr"]
    assert "BatchPolicy" in doc["explanations"]["A_batch"]
    assert doc["settings"]["batch_rule"].startswith("the batch rule")
