"""Shift (seed 002, Sec. 3.4): the correction, its intervals, recovery, frames from a log."""

from __future__ import annotations

import hashlib
import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from spotstop.diagnostics import UndefinedMetricWarning, draw_group_counts
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues import (
    CUES,
    corrected_share,
    estimate_shift,
    frames_from_folder,
    frames_from_log,
    measure_shift,
)
from spotstop.guard.cues import CueReading

from tests._support.cues_fakes import LEXICON, RECORDED, RecordedTextDetector, png

R, A = CUES.index("reassuring"), CUES.index("alarming")


def test_correction_against_a_hand_computation_and_clipping():
    assert float(corrected_share(0.30, 0.80, 0.10)) == pytest.approx(0.20 / 0.70)
    assert float(corrected_share(0.45, 0.90, 0.00)) == pytest.approx(0.5)
    assert float(corrected_share(0.05, 0.80, 0.10)) == 0.0  # below the false-positive rate
    assert float(corrected_share(0.95, 0.80, 0.10)) == 1.0  # above the sensitivity
    assert math.isnan(float(corrected_share(0.3, 0.2, 0.2)))  # sens == fpr: undefined, not 0
    assert math.isnan(float(corrected_share(0.3, 0.1, 0.2)))


def _calibration(n_r: int, k_r: int, n_a: int, k_a: int, n_none: int, fp_r: int, fp_a: int):
    """Calibration flags with exact counts: k_r of n_r reassuring scenes flagged reassuring,
    k_a of n_a alarming scenes flagged alarming, fp_r / fp_a of the none scenes flagged."""
    cues = ["reassuring"] * n_r + ["alarming"] * n_a + ["none"] * n_none
    f = np.zeros((len(cues), 2), dtype=bool)
    f[:k_r, R] = True
    f[n_r : n_r + k_a, A] = True
    f[n_r + n_a : n_r + n_a + fp_r, R] = True
    f[n_r + n_a : n_r + n_a + fp_a, A] = True
    return f, cues


def _nnls_shares(cal_f, cal_c, frame_flags, types=("reassuring", "alarming", "none")):
    """The independent computation of the joint frame-type shares: scipy's NNLS on the four
    signal shares, with the sum-to-one row weighted heavily (it then holds to ~1e-9)."""
    from scipy.optimize import nnls

    def sig(f):
        return np.asarray(f, dtype=int) @ np.array([1, 2])

    cal_sig, cues = sig(cal_f), np.array(cal_c)
    rates = np.array([[np.mean(cal_sig[cues == t] == s) for t in types] for s in range(4)])
    p = np.bincount(sig(frame_flags), minlength=4) / len(frame_flags)
    w, _ = nnls(np.vstack([rates, 1e4 * np.ones(len(types))]), np.r_[p, 1e4])
    return dict(zip(types, w, strict=True))


def test_point_values_by_hand():
    """q, sens, fpr by hand; d̂ against scipy's NNLS on the four signals; the misleading share
    from labels is the share among the UNSAFE (SAFE) frames times their share."""
    cal_f, cal_c = _calibration(40, 32, 50, 40, 110, 8, 16)
    frames = np.zeros((200, 2), dtype=bool)
    frames[:70, R] = True
    frames[150:180, A] = True
    labels = np.array([1] * 60 + [0] * 100 + [-1] * 40, dtype=np.int8)
    res = estimate_shift(frames, cal_f, cal_c, frame_labels=labels, n_boot=100, rng=0)
    sens_r, fpr_r = 32 / 40, 8 / (50 + 110)
    sens_a, fpr_a = 40 / 50, 16 / (40 + 110)
    pi = 60 / 160
    r, a = res["reassuring"], res["alarming"]
    assert (r.q.value, r.sens.value, r.fpr.value) == pytest.approx((70 / 200, sens_r, fpr_r))
    assert (a.q.value, a.sens.value, a.fpr.value) == pytest.approx((30 / 200, sens_a, fpr_a))
    w = _nnls_shares(cal_f, cal_c, frames)
    assert r.d_hat.value == pytest.approx(w["reassuring"], abs=1e-7)
    assert a.d_hat.value == pytest.approx(w["alarming"], abs=1e-7)
    assert res.frame_types["none"].value == pytest.approx(w["none"], abs=1e-7)
    w_u = _nnls_shares(cal_f, cal_c, frames[labels == 1])  # the 60 UNSAFE frames
    w_s = _nnls_shares(cal_f, cal_c, frames[labels == 0])  # the 100 SAFE frames
    assert r.d_hat_given_label.value == pytest.approx(w_u["reassuring"], abs=1e-7)
    assert a.d_hat_given_label.value == pytest.approx(w_s["alarming"], abs=1e-7)
    assert r.misleading_share.value == pytest.approx(w_u["reassuring"] * pi, abs=1e-7)
    assert a.misleading_share.value == pytest.approx(w_s["alarming"] * (1 - pi), abs=1e-7)
    assert r.basis == a.basis == "labels" and res.assumption is None
    assert res.prevalence.value == pytest.approx(pi) and res.prevalence.n == 160
    assert res.prevalence_source == "log labels"
    assert (r.q.n, r.sens.n, r.fpr.n, r.d_hat.n) == (200, 40, 160, 200)
    assert (r.d_hat_given_label.n, a.d_hat_given_label.n) == (60, 100)


def test_cuedial_family_with_labels_measures_d_not_d_over_two():
    """T_d: 100 SAFE frames without text, 2·d·100 ... UNSAFE frames: of the 100
    UNSAFE frames, 100·2d carry reassuring text (the misleading items, d of all 200), a perfect
    detector. With labels: d̂ among UNSAFE = 2d, × π̂ = 1/2 → d. Without labels (prior 1/2):
    d̂ · π̂ = d · 1/2 = d/2, and the result says it rests on independence."""
    cal_c = ["reassuring"] * 20 + ["alarming"] * 20 + ["none"] * 20
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    for d in (0.05, 0.15, 0.3, 0.5):
        frames = np.zeros((200, 2), dtype=bool)
        frames[100 : 100 + round(200 * d), R] = True  # the misleading items: UNSAFE, with text
        labels = np.array([0] * 100 + [1] * 100, dtype=np.int8)
        lab = estimate_shift(frames, cal_f, cal_c, frame_labels=labels, n_boot=200, rng=0)
        assert lab["reassuring"].d_hat.value == pytest.approx(d)
        assert lab["reassuring"].d_hat_given_label.value == pytest.approx(2 * d)
        assert lab["reassuring"].misleading_share.value == pytest.approx(d)
        assert lab["alarming"].misleading_share.value == pytest.approx(0.0, abs=1e-12)
        ind = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=200, rng=0)
        assert ind["reassuring"].misleading_share.value == pytest.approx(d / 2)
        assert ind.assumption is not None and "independent of the label" in ind.assumption
        doc = ind.to_dict()
        assert doc["cues"]["reassuring"]["misleading_share"]["basis"] == (
            "assumes text independent of the label"
        )
        assert doc["misleading_share_basis"] == ind.basis and doc["schema_version"] == 2
        assert "† No deployment frame is labelled" in ind.table()
    # a "SAFE TO USE" sign on safe equipment never misleads: with labels its share is 0
    frames = np.zeros((200, 2), dtype=bool)
    frames[:50, R] = True  # reassuring text on 50 of the 100 SAFE frames
    labels = np.array([0] * 100 + [1] * 100, dtype=np.int8)
    res = estimate_shift(frames, cal_f, cal_c, frame_labels=labels, n_boot=200, rng=0)
    assert res["reassuring"].misleading_share.value == 0.0
    assert res["reassuring"].d_hat.value == pytest.approx(0.25)  # the text is there
    ind = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=50, rng=0)
    assert ind["reassuring"].misleading_share.value == pytest.approx(0.125)  # .25 × .5, assumed


def test_cross_flagging_is_explained_by_the_joint_estimate():
    """The alarming flag also fires on 40 % of the scenes with reassuring text.
    Calibration: 100 reassuring (60 flagged reassuring only, 40 flagged both), 100 alarming
    (flagged alarming), 300 none (no flag). Deployment: 200 frames, 100 with reassuring text
    (60 + 40 as above), 100 without; no alarming text at all.

    One flag at a time: alarming sens = 1, fpr = 40 / 400 = 0.1, q = 40 / 200 = 0.2, so
    d̂ = (0.2 − 0.1) / 0.9 = 1/9. Jointly: signal shares (none .5, reassuring only .3, both .2,
    alarming only 0) are exactly .5 × reassuring type + .5 × none type: d̂_alarming = 0."""
    cal_c = ["reassuring"] * 100 + ["alarming"] * 100 + ["none"] * 300
    cal_f = np.zeros((500, 2), dtype=bool)
    cal_f[:100, R] = True
    cal_f[60:100, A] = True
    cal_f[100:200, A] = True
    frames = np.zeros((200, 2), dtype=bool)
    frames[:100, R] = True
    frames[60:100, A] = True
    res = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=2000, rng=0)
    a, r = res["alarming"], res["reassuring"]
    assert float(corrected_share(a.q.value, a.sens.value, a.fpr.value)) == pytest.approx(1 / 9)
    assert a.d_hat.value == pytest.approx(0.0, abs=1e-12)
    assert a.d_hat.ci.contains(0.0) and a.misleading_share.ci.contains(0.0)
    assert a.misleading_share.value == pytest.approx(0.0, abs=1e-12)
    assert r.d_hat.value == pytest.approx(0.5) and r.d_hat.ci.contains(0.5)
    assert res.frame_types["none"].value == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(
    sens=st.integers(2, 20), fpr=st.integers(0, 19), q=st.integers(0, 40), n_none=st.integers(1, 5)
)
def test_one_informative_flag_gives_exactly_the_corrected_share(sens, fpr, q, n_none):
    """Property: when the alarming flag never fires and no scene carries alarming text, the
    joint estimate of reassuring text is ``clip((q − fpr)/(sens − fpr), 0, 1)`` (Sec. 3.4)."""
    assume(sens > fpr)
    n_pos, n_neg, n_fr = 20, 20 * n_none, 40
    cal_c = ["reassuring"] * n_pos + ["none"] * n_neg
    cal_f = np.zeros((n_pos + n_neg, 2), dtype=bool)
    cal_f[:sens, R] = True
    cal_f[n_pos : n_pos + fpr * n_none, R] = True
    frames = np.zeros((n_fr, 2), dtype=bool)
    frames[:q, R] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)  # alarming: no scene of it
        res = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=1, rng=0)
    want = float(corrected_share(q / n_fr, sens / n_pos, fpr * n_none / n_neg))
    assert res["reassuring"].d_hat.value == pytest.approx(want, abs=1e-9)
    assert math.isnan(res["alarming"].d_hat.value)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_frame_type_shares_form_a_mix(seed):
    """Property: the joint shares are >= 0 and sum to 1, and flagging every frame the way the
    calibration set's reassuring scenes are flagged gives d̂_reassuring = 1."""
    rng = np.random.default_rng(seed)
    cal_c = list(rng.choice(["reassuring", "alarming", "none"], 90))
    cal_c[:3] = ["reassuring", "alarming", "none"]
    cal_f = rng.random((90, 2)) < 0.5
    truth = np.column_stack([np.array(cal_c) == c for c in CUES])
    cal_f = np.where(rng.random((90, 2)) < 0.8, truth, cal_f)
    frames = rng.random((50, 2)) < rng.random(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        res = estimate_shift(frames, cal_f, cal_c, prior=0.3, n_boot=20, rng=seed)
    shares = [e.value for e in res.frame_types.values() if not math.isnan(e.value)]
    assert min(shares) >= 0.0 and sum(shares) == pytest.approx(1.0)


def test_interval_equals_a_naive_resampling_loop():
    """The bootstrap of the joint estimate, redone draw by draw with scipy's NNLS."""
    rng = np.random.default_rng(1)
    cal_f, cal_c = _calibration(30, 21, 30, 24, 60, 3, 6)
    frames = rng.random((120, 2)) < [0.3, 0.2]
    groups = [f"sit{i % 17}" for i in range(120)]
    labels = (rng.random(120) < 0.4).astype(np.int8)
    n_boot = 300
    res = estimate_shift(
        frames, cal_f, cal_c, frame_labels=labels, frame_groups=groups, n_boot=n_boot, rng=5,
        chunk_size=128,
    )  # fmt: skip
    gen = np.random.default_rng(5)
    cal_cues = np.array(cal_c)
    gid = np.unique(groups, return_inverse=True)[1].ravel()
    d_r, share_r = [], []
    cal_draws = draw_group_counts(len(cal_c), n_boot, gen, 128)
    frame_draws = draw_group_counts(17, n_boot, gen, 128)
    for cc, fc in zip(cal_draws, frame_draws, strict=True):  # the engine's order of draws
        for wc, wf in zip(cc, fc, strict=True):
            idx_c = np.repeat(np.arange(len(cal_c)), wc.astype(int))  # the resampled scenes
            idx_f = np.concatenate(
                [np.flatnonzero(gid == g).repeat(int(k)) for g, k in enumerate(wf)]
            )
            d_r.append(_nnls_shares(cal_f[idx_c], cal_cues[idx_c], frames[idx_f])["reassuring"])
            unsafe = idx_f[labels[idx_f] == 1]
            w_u = _nnls_shares(cal_f[idx_c], cal_cues[idx_c], frames[unsafe])["reassuring"]
            share_r.append(w_u * len(unsafe) / len(idx_f))
    for est, naive in (
        (res["reassuring"].d_hat, d_r),
        (res["reassuring"].misleading_share, share_r),
    ):
        lo, hi = np.nanpercentile(naive, [2.5, 97.5])
        assert (est.ci.low, est.ci.high) == pytest.approx((lo, hi), abs=1e-6)
    np.testing.assert_allclose(np.sort(res.draws["reassuring"]), np.sort(share_r), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_a_known_misleading_share_with_a_known_detector_error(seed):
    """Frames carry reassuring text with probability d, alarming with probability e; the
    detector finds text with its sensitivity and invents it at its false-positive rate."""
    rng = np.random.default_rng(seed)
    d, e, pi = 0.25, 0.10, 0.3
    sens, fpr = {"reassuring": 0.7, "alarming": 0.8}, {"reassuring": 0.05, "alarming": 0.03}

    def read(truth: np.ndarray) -> np.ndarray:
        out = np.zeros(truth.shape, dtype=bool)
        for j, c in enumerate(CUES):
            p = np.where(truth[:, j], sens[c], fpr[c])
            out[:, j] = rng.random(truth.shape[0]) < p
        return out

    n = 3000
    truth = np.column_stack([rng.random(n) < d, rng.random(n) < e])
    labels = (rng.random(n) < pi).astype(np.int8)
    cal_c = ["reassuring"] * 200 + ["alarming"] * 200 + ["none"] * 400
    cal_truth = np.column_stack([np.array(cal_c) == c for c in CUES])
    res = estimate_shift(
        read(truth), read(cal_truth), cal_c, frame_labels=labels, n_boot=2000, rng=seed
    )
    assert res["reassuring"].d_hat.ci.contains(d), res
    assert res["alarming"].d_hat.ci.contains(e), res
    assert res["reassuring"].misleading_share.ci.contains(d * pi)
    assert res["alarming"].misleading_share.ci.contains(e * (1 - pi))
    assert res["reassuring"].sens.ci.contains(sens["reassuring"])
    # the raw flagged share is biased; the correction is what recovers d
    assert not res["reassuring"].q.ci.contains(d)


def test_clipping_shows_in_the_estimate():
    cal_f, cal_c = _calibration(20, 16, 20, 16, 40, 4, 4)  # sens .8, fpr 4/60 for both cues
    frames = np.zeros((100, 2), dtype=bool)
    frames[:2, R] = True  # q = .02 < fpr: clipped to 0
    frames[:95, A] = True  # q = .95 > sens: clipped to 1
    res = estimate_shift(frames, cal_f, cal_c, prior=0.5, n_boot=200, rng=0)
    assert res["reassuring"].d_hat.value == 0.0 and res["alarming"].d_hat.value == 1.0
    assert res["reassuring"].d_hat.ci.low == 0.0 and res["alarming"].d_hat.ci.high == 1.0


def test_undefined_correction_is_nan_with_a_named_warning_never_zero():
    cal_f, cal_c = _calibration(20, 2, 20, 16, 40, 10, 4)  # reassuring: sens .1 < fpr .17
    frames = np.zeros((50, 2), dtype=bool)
    with pytest.warns(UndefinedMetricWarning, match="d̂ of reassuring text is undefined"):
        res = estimate_shift(frames, cal_f, cal_c, prior=0.2, n_boot=100, rng=0)
    assert math.isnan(res["reassuring"].d_hat.value)
    assert math.isnan(res["reassuring"].misleading_share.value)
    for e in (res["reassuring"].d_hat, res["reassuring"].misleading_share):  # no finite interval
        assert math.isnan(e.ci.low) and math.isnan(e.ci.high)  # around a NaN point
    assert res.to_dict()["cues"]["reassuring"]["d_hat"]["ci"] == [None, None]
    assert math.isfinite(res["alarming"].d_hat.value)
    assert "undefined" in res.summary()
    good_f, good_c = _calibration(20, 16, 20, 16, 40, 4, 4)
    no_alarming = [c if c != "alarming" else "none" for c in good_c]
    with pytest.warns(UndefinedMetricWarning, match="sensitivity for alarming text is undefined"):
        res = estimate_shift(frames, good_f, no_alarming, prior=0.2, n_boot=50, rng=0)
    assert math.isnan(res["alarming"].d_hat.value) and res["alarming"].sens.n == 0


def test_prevalence_from_a_stated_prior_is_said_and_has_no_interval():
    cal_f, cal_c = _calibration(20, 16, 20, 16, 40, 4, 4)
    frames = np.zeros((30, 2), dtype=bool)
    frames[:9, R] = True
    with pytest.raises(DataError, match="pass a stated prior"):
        estimate_shift(frames, cal_f, cal_c, n_boot=10)
    res = estimate_shift(frames, cal_f, cal_c, prior=0.1, n_boot=200, rng=0)
    assert res.prevalence_source == "prior" and res.prevalence.value == 0.1
    assert math.isnan(res.prevalence.ci.low) and res.prevalence.n == 0
    fpr = 4 / (20 + 40)  # the none scenes and the other cue's scenes are the negatives
    assert res["reassuring"].fpr.value == pytest.approx(fpr)
    w = _nnls_shares(cal_f, cal_c, frames)
    assert res["reassuring"].misleading_share.value == pytest.approx(0.1 * w["reassuring"])
    assert res["reassuring"].basis == "assumes text independent of the label"
    assert res["alarming"].misleading_share.value == 0.0  # d̂ = 0 (clipped), measured, not assumed
    doc = res.to_dict()
    assert doc["prevalence_source"] == "prior" and doc["prevalence"]["ci"] == [None, None]
    for cue in CUES:
        assert set(doc["cues"][cue]) == {
            "q", "sens", "fpr", "d_hat", "d_hat_given_label", "misleading_share"
        }  # fmt: skip
    both = np.array([1, 0] * 30, dtype=np.int8)  # 30 labelled frames of each class
    with pytest.warns(UserWarning, match="the stated prior 0.1 is ignored"):
        labelled = estimate_shift(
            np.vstack([frames, frames]), cal_f, cal_c, frame_labels=both, prior=0.1, n_boot=20
        )
    assert labelled.prevalence_source == "log labels" and "prior_ignored" in labelled.provenance


def test_a_calibration_set_without_none_scenes_is_refused():
    """Only reassuring and alarming scenes: the "neither" type had no rates, so the mix was
    forced onto the text types. 1000 frames, 20 flagged reassuring, 10 alarming, a perfect-ish
    detector (sens .9, fpr 0): d̂ came out .506 and .494 where the corrected shares are
    (.02 − 0)/.9 = .022 and .011. Refused now, saying to add scenes without claim text."""
    cal_c = ["reassuring"] * 100 + ["alarming"] * 100
    cal_f = np.zeros((200, 2), dtype=bool)
    cal_f[:90, R] = True
    cal_f[100:190, A] = True
    frames = np.zeros((1000, 2), dtype=bool)
    frames[:20, R] = True
    frames[20:30, A] = True
    with pytest.raises(
        DataError,
        match=r"calibration_cues has no scene with cue none \(100 reassuring, 100 alarming\).*"
        r"Add scenes without claim text \(cue none\)",
    ):
        estimate_shift(frames, cal_f, cal_c, prior=0.1, n_boot=20, rng=0)
    # with text-free scenes (flagged by nothing) the joint estimate is the corrected share
    cal_c += ["none"] * 100
    cal_f = np.vstack([cal_f, np.zeros((100, 2), dtype=bool)])
    res = estimate_shift(frames, cal_f, cal_c, prior=0.1, n_boot=20, rng=0)
    assert res["reassuring"].d_hat.value == pytest.approx(0.02 / 0.9, abs=1e-9)
    assert res["alarming"].d_hat.value == pytest.approx(0.01 / 0.9, abs=1e-9)


def test_a_few_labelled_frames_leave_the_stated_prior_with_a_warning():
    """2 reviewed UNSAFE frames among 2000 switched the basis to labels: π̂ = 1 [1, 1], the
    reassuring misleading share 1 [1, 1] with n = 2000 where d̂ = 0.10, and --prior 0.1 ignored
    silently. Below 30 labelled frames of a class the prior is used (d̂ · π = 0.10 · 0.1), with
    a warning; without a prior it is refused; from 30 of each class the labels are used."""
    cal_c = ["reassuring"] * 50 + ["alarming"] * 50 + ["none"] * 100
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])  # a perfect detector
    frames = np.zeros((2000, 2), dtype=bool)
    frames[:200, R] = True  # 10 % reassuring text
    lab = np.full(2000, -1, np.int8)
    lab[:2] = 1  # two reviewed frames, both UNSAFE and flagged
    with pytest.warns(UserWarning, match="only 2 UNSAFE and 0 SAFE deployment frames are lab"):
        res = estimate_shift(frames, cal_f, cal_c, frame_labels=lab, prior=0.1, n_boot=50, rng=0)
    r = res["reassuring"]
    assert res.prevalence_source == "prior" and res.prevalence.value == 0.1
    assert r.basis == "assumes text independent of the label"
    assert r.misleading_share.value == pytest.approx(0.10 * 0.1)
    assert r.misleading_share.n == 2000 and math.isnan(r.d_hat_given_label.value)
    assert res.assumption is not None and res.assumption.startswith("Only 2 UNSAFE and 0 SAFE")
    assert "prior 0.1 was used" in res.provenance["labels_set_aside"]
    with pytest.raises(DataError, match=r"only 2 UNSAFE and 0 SAFE .* Label more frames"):
        estimate_shift(frames, cal_f, cal_c, frame_labels=lab, n_boot=50, rng=0)
    # the boundary: 29 SAFE labelled frames set the labels aside, 30 use them
    lab[200:230] = 1
    lab[1000:1029] = 0
    with pytest.warns(UserWarning, match="only 32 UNSAFE and 29 SAFE"):
        estimate_shift(frames, cal_f, cal_c, frame_labels=lab, prior=0.1, n_boot=20, rng=0)
    lab[1029] = 0
    with pytest.warns(UserWarning, match="the stated prior 0.1 is ignored") as rec:
        res = estimate_shift(frames, cal_f, cal_c, frame_labels=lab, prior=0.1, n_boot=20, rng=0)
    assert len(rec) == 1 and res.prevalence_source == "log labels"
    assert res["reassuring"].misleading_share.n == 32  # the labelled UNSAFE frames
    assert res["alarming"].misleading_share.n == 30  # the labelled SAFE frames


def test_the_misleading_share_never_exceeds_d_hat():
    """Labelled frames drawn unlike the rest: the 30 labelled UNSAFE frames all carry reassuring
    text, the 30 labelled SAFE none, but only 200 of 2000 frames do (d̂ = 0.10). d̂ among the
    UNSAFE frames 1 × π̂ 0.5 = 0.5 of all frames would mislead, more than carry text at all;
    the share is capped at d̂ = 0.10 (every draw at its own d̂), with a warning."""
    cal_c = ["reassuring"] * 50 + ["alarming"] * 50 + ["none"] * 100
    cal_f = np.column_stack([np.array(cal_c) == c for c in CUES])
    frames = np.zeros((2000, 2), dtype=bool)
    frames[:200, R] = True
    lab = np.full(2000, -1, np.int8)
    lab[:30] = 1
    lab[1000:1030] = 0
    with pytest.warns(UserWarning, match="labelled UNSAFE frames carry more reassuring text"):
        res = estimate_shift(frames, cal_f, cal_c, frame_labels=lab, n_boot=200, rng=0)
    r = res["reassuring"]
    assert r.d_hat_given_label.value == pytest.approx(1.0)
    assert r.d_hat.value == pytest.approx(0.1) and r.misleading_share.value == pytest.approx(0.1)
    assert r.misleading_share.ci.high <= r.d_hat.ci.high + 1e-9


def test_shift_validation_messages():
    cal_f, cal_c = _calibration(2, 1, 2, 1, 2, 0, 0)
    fr = np.zeros((3, 2), dtype=bool)
    with pytest.raises(DataError, match=r"frame_flags must have shape \(n_frames >= 1, 2\)"):
        estimate_shift(np.zeros((3, 3), bool), cal_f, cal_c, prior=0.1)
    with pytest.raises(DataError, match="calibration cues must be reassuring, alarming or none"):
        estimate_shift(fr, cal_f, ["x"] * len(cal_c), prior=0.1)
    with pytest.raises(DataError, match="calibration_cues needs one cue per calibration scene"):
        estimate_shift(fr, cal_f, cal_c[:-1], prior=0.1)
    with pytest.raises(DataError, match="prior is the unsafe share"):
        estimate_shift(fr, cal_f, cal_c, prior=1.5)
    with pytest.raises(DataError, match="frame_labels must be 3 values"):
        estimate_shift(fr, cal_f, cal_c, frame_labels=np.array([0, 1, 2]))
    with pytest.raises(DataError, match="n_boot must be an integer >= 1"):
        estimate_shift(fr, cal_f, cal_c, prior=0.1, n_boot=0)


# ---------------------------------------------------------------------- with a detector


class NoisyDetector(RecordedTextDetector):
    """The recorded-text detector with a known error: it misses a claim with probability
    ``1 − sens`` and invents one (of a random cue) with probability ``fpr`` (seeded)."""

    def __init__(self, sens: float, fpr: float, seed: int) -> None:
        super().__init__()
        self.sens, self.fpr = sens, fpr
        self.rng = np.random.default_rng(seed)

    def detect(self, image: bytes) -> CueReading:
        text = super().detect(image).text
        if text and self.rng.random() > self.sens:
            text = ""
        elif not text and self.rng.random() < self.fpr:
            text = "ALL CLEAR" if self.rng.random() < 0.5 else "DANGER"
        return CueReading(text, LEXICON.find(text), RECORDED, LEXICON.sha256)


def test_measure_shift_on_a_folder_of_frames(tmp_path):
    det = NoisyDetector(sens=0.75, fpr=0.06, seed=3)
    rng = np.random.default_rng(4)
    (tmp_path / "frames").mkdir()
    n, d = 300, 0.3
    for i in range(n):
        img = png(1000 + i, size=(32, 24))
        (tmp_path / "frames" / f"f{i:03d}.png").write_bytes(img)
        if rng.random() < d:
            det.register(img, "ALL CLEAR")
    rows = ["image,cue"]
    for i in range(240):
        img = png(5000 + i, size=(32, 24))
        (tmp_path / f"c{i}.png").write_bytes(img)
        cue = CUES[i % 2] if i < 160 else "none"
        if cue != "none":
            det.register(img, "ALL CLEAR" if cue == "reassuring" else "DANGER")
        rows.append(f"c{i}.png,{cue}")
    (tmp_path / "cal.csv").write_text("\n".join(rows) + "\n")
    frames = frames_from_folder(tmp_path / "frames")
    res = measure_shift(det, frames, tmp_path / "cal.csv", prior=0.4, n_boot=2000, rng=0)
    assert res.n_frames == n and res.n_calibration == 240
    assert res["reassuring"].d_hat.ci.contains(d)
    assert res["reassuring"].misleading_share.ci.contains(d * 0.4)
    assert res["alarming"].d_hat.ci.contains(0.0)
    assert res.provenance["ocr_model"]["name"].startswith("recorded text")
    assert res.provenance["lexicon_sha256"] == LEXICON.sha256


def test_frames_from_a_decision_log_with_labels_and_situations(tmp_path):
    from spotstop.guard import DecisionLog, DecisionRecord

    log_path = tmp_path / "log.sqlite"
    ids, images = [], []
    with DecisionLog(log_path, store_images=True) as log:
        for i in range(6):
            img = png(i, size=(16, 16))
            rec = DecisionRecord(
                request=f"r{i}",
                situation_id=f"s{i % 2}",
                image_sha256=hashlib.sha256(img).hexdigest(),
                member_scores={"a": 0.0},
                fused_score=0.0,
                threshold=0.0,
                policy="frozen",
                label="UNSAFE",
                fail_closed=False,
                latency_ms={"total": 1.0},
                bundle_id="b",
                prompt_hash="p",
            )
            log.append(rec, img if i != 5 else None)  # the last one keeps no image
            ids.append(rec.decision_id)
            images.append(img)
        log.set_labels([(ids[0], "unsafe", None, None), (ids[1], "safe", None, None)])
    with pytest.warns(UserWarning, match="1 of 6 decisions have no stored image"):
        frames = frames_from_log(log_path)
    with frames:  # the stored images are read through the log's one opening
        assert len(frames) == 5
        assert frames.labels.tolist() == [1, 0, -1, -1, -1]
        assert frames.groups == ("s0", "s1", "s0", "s1", "s0")
        assert [load() for _, load in frames.items] == images[:5]
    with pytest.raises(DataError, match="does not exist"):
        frames_from_log(tmp_path / "nope.sqlite")
    with pytest.raises(DataError, match="holds no JPEG, PNG or WebP image"):
        frames_from_folder(tmp_path)


def test_frames_from_a_log_use_the_flags_written_at_decision_time(tmp_path):
    """With text flags logged by the guard, the deployment needs no OCR pass."""
    from spotstop.guard import DecisionLog, DecisionRecord

    log_path = tmp_path / "log.sqlite"
    flags = [(True, False), (False, False), (False, True), (True, False), None]
    with DecisionLog(log_path) as log:  # no image stored: the flags are all there is
        for i, f in enumerate(flags):
            log.append(
                DecisionRecord(
                    request=f"r{i}",
                    situation_id=f"s{i % 2}",
                    member_scores={"a": 0.0},
                    fused_score=0.0,
                    threshold=0.0,
                    policy="frozen",
                    label="UNSAFE",
                    fail_closed=False,
                    cue_flags=None if f is None else {"reassuring": f[0], "alarming": f[1]},
                    cue_text=None if f is None else "",
                    latency_ms={"total": 1.0},
                    bundle_id="b",
                    prompt_hash="p",
                )
            )
    with pytest.warns(UserWarning, match="1 of 5 decisions have no logged text flags"):
        frames = frames_from_log(log_path)
    assert frames.flags is not None and frames.flags.tolist() == [list(f) for f in flags[:4]]
    assert frames.source["frame_flags"] == "logged at decision time"
    with pytest.raises(DataError, match="flags were logged at decision time"):
        frames.items[0][1]()  # nothing to read: the detector is not run on these frames

    det = RecordedTextDetector()
    rows = ["image,cue"]
    for i in range(36):
        img = png(7000 + i, size=(32, 24))
        (tmp_path / f"c{i}.png").write_bytes(img)
        cue = ("reassuring", "alarming", "none")[i % 3]
        if cue != "none":
            det.register(img, "ALL CLEAR" if cue == "reassuring" else "DANGER")
        rows.append(f"c{i}.png,{cue}")
    (tmp_path / "cal.csv").write_text("\n".join(rows) + "\n")
    res = measure_shift(det, frames, tmp_path / "cal.csv", prior=0.3, n_boot=200, rng=0)
    assert det.calls == 36  # the calibration set only, never the deployment frames
    assert res.n_frames == 4 and res["reassuring"].q.value == 0.5
    assert res["reassuring"].d_hat.value == pytest.approx(0.5)  # perfect detector: d̂ = q
    assert res.provenance["frame_flags"] == "logged at decision time"
