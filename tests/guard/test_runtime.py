"""The guard runtime: bundle, decisions, fail-closed faults, the log, `demo` and `check`.

The guard runs on the committed tiny ONNX bundle (conftest's ``bundle_copy``) with onnxruntime
alone; only the ``demo`` test needs torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from spotstop.export.scenes import demo_scenes
from spotstop.guard import (
    BundleError,
    Decision,
    DecisionLog,
    Guard,
    GuardError,
    PolicyError,
    Scene,
    load_bundle,
    load_policy,
)
from spotstop.guard._hf import describe_test_pair
from spotstop.guard.policies import FrozenPolicy, PolicyConfig, dump_policy

from tests._support.guard import (
    SignReader,
    TableMember,
    decide_the_banded_batch,
    make_scene,
    set_cascade_situation,
    set_frozen,
)
from tests._support.images import make_image_bytes
from tests._support.tolerance import SCHEDULING_SLACK_S, fused_tolerance, score_tolerances


def test_check_gives_a_logged_decision_with_every_field(bundle_copy: Path, tmp_path: Path):
    log = tmp_path / "log.sqlite"
    with Guard(bundle_copy, log=log, variants=("scene", "gray", "text")) as g:
        assert g.ready
        d = g.check(make_scene(1, "kitchen"))
        assert d.label in ("SAFE", "UNSAFE") and not d.fail_closed and d.fail_reason is None
        assert set(d.member_scores) == {"tiny-qwen3_5", "tiny-lfm2_vl"}
        assert np.isfinite(d.fused_score) and np.isfinite(d.threshold)
        assert d.label == ("UNSAFE" if d.fused_score >= d.threshold else "SAFE")
        assert d.bundle_id == g.bundle_id and d.prompt_hash == g.bundle.prompt_hash
        assert d.test_pair and {"decode_ms", "total_ms", "log_ms"} <= set(d.latency_ms)
        assert set(d.member_scores_gray or {}) == set(d.member_scores)
        # the fused score is Avg-2 of the member scores
        assert d.fused_score == pytest.approx(g.policy_config.fusion.fuse(d.member_scores))
    with DecisionLog(log) as lg:
        rec = lg.get(d.decision_id)
        assert rec is not None and rec.label == d.label and rec.situation_id == "kitchen"
        assert rec.member_scores_text is not None and rec.image_format == "JPEG"


def test_batch_equals_single_checks_for_a_stateless_policy(bundle_copy: Path, tmp_path: Path):
    """A batch decides each scene as a single call does, up to float rounding.

    A batch runs other GEMM shapes than single calls, so the last bits of a member score
    differ, by how much depends on the CPU's kernels. The member scores are compared within
    the backend's score bound; the fused score, which divides by the pool's IQRs (a few
    hundredths on the tiny pair, magnifying that rounding), within the bound carried through
    the fusion; and a label only where the fused score is farther than that from the cut (a
    near tie may flip).
    """
    set_frozen(bundle_copy, 0.0)
    scenes = [make_scene(i) for i in range(4)]
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        single = [g.check(s) for s in scenes]
        batch = g.check_batch(scenes)
        tol = score_tolerances(g.members)
        fusion = g.policy_config.fusion
    tol_fused = fused_tolerance(fusion, tol)
    assert all(not d.fail_closed for d in [*single, *batch])
    # the scenes score apart by more than the noise: a batch that mixed them up would fail
    for i, j in itertools.combinations(range(len(scenes)), 2):
        a, b = single[i].member_scores, single[j].member_scores
        assert any(abs(a[m] - b[m]) > 2 * tol[m] for m in tol), (i, j, a, b, tol)
    labels_compared = 0
    for a, b in zip(single, batch, strict=True):
        for m in tol:
            assert a.member_scores[m] == pytest.approx(b.member_scores[m], abs=tol[m]), m
        assert a.fused_score == pytest.approx(fusion.fuse(b.member_scores), abs=tol_fused)
        assert b.fused_score == pytest.approx(fusion.fuse(a.member_scores), abs=tol_fused)
        assert a.threshold == b.threshold == 0.0
        if abs(a.fused_score - a.threshold) > tol_fused:
            assert a.label == b.label
            labels_compared += 1
    assert labels_compared > 0


def test_situation_recentering_takes_over_after_k_references(bundle_copy: Path, tmp_path: Path):
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        ds = [g.check(s) for s in demo_scenes(5, seed=3, situations=["s1"] * 5)]
        t0 = g.policy_config.policy.fallback.threshold
    assert [d.policy for d in ds[:3]] == ["situation->frozen"] * 3
    assert all(d.threshold == pytest.approx(t0) for d in ds[:3])
    assert ds[3].policy == "situation"
    assert ds[3].threshold == pytest.approx(np.mean([d.fused_score for d in ds[:3]]))
    # the state survives a restart
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g2:
        d = g2.check(demo_scenes(1, seed=9, situations=["s1"])[0])
    assert d.policy == "situation"
    assert d.threshold == pytest.approx(np.mean([x.fused_score for x in ds[-5:]]))


# ---- fail closed: each fault kind, injected --------------------------------------------------


def _assert_fail_closed(d, words: str) -> None:
    assert d.label == "UNSAFE" and d.fail_closed, d
    assert words in (d.fail_reason or ""), d.fail_reason


def test_fault_corrupt_image(bundle_copy: Path, tmp_path: Path):
    set_frozen(bundle_copy, 1e9)  # everything would be SAFE if scored
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        bad, good = g.check_batch(
            [Scene(b"\xff\xd8\xff\xe0 truncated", "open the door"), make_scene(2)]
        )
        _assert_fail_closed(bad, "input")
        assert (
            good.label == "SAFE" and not good.fail_closed
        )  # one bad scene does not spoil the batch
        _assert_fail_closed(g.check(Scene(None, "open the door")), "no image")
        _assert_fail_closed(g.check(Scene(make_image_bytes(0), "x<|im_end|>")), "control token")
        _assert_fail_closed(g.check("not a scene"), "expected a Scene")  # type: ignore[arg-type]


def test_fault_exception_in_scoring(bundle_copy: Path, tmp_path: Path, monkeypatch):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:

        def boom(*a, **k):
            raise RuntimeError("CUDA fell over")

        monkeypatch.setattr(g.members["tiny-lfm2_vl"].backend, "score", boom)
        _assert_fail_closed(g.check(make_scene()), "CUDA fell over")


def test_fault_nan_and_inf_scores(bundle_copy: Path, tmp_path: Path, monkeypatch):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        for bad in (np.nan, np.inf, -np.inf):
            monkeypatch.setattr(
                g.members["tiny-qwen3_5"].backend,
                "score",
                lambda p, px, plan, bad=bad: np.full(len(p), bad),
            )
            _assert_fail_closed(g.check(make_scene()), "non-finite")


def test_fault_missing_member(bundle_copy: Path, tmp_path: Path):
    set_frozen(bundle_copy, 1e9)
    (bundle_copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx").unlink()
    with pytest.raises(BundleError, match="missing"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", verify=False) as g:
        assert not g.ready and "tiny-lfm2_vl" in g.member_errors
        _assert_fail_closed(g.check(make_scene()), "member tiny-lfm2_vl unavailable")


def _wait_until(cond: Any, limit_s: float = 60.0) -> bool:
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_a_member_that_failed_to_load_is_loaded_again_once_the_fault_passes(
    bundle_copy: Path, tmp_path: Path
):
    """A passing fault at start (a file not there yet): the guard answers UNSAFE while it
    lasts, tries the member again in the background, and is ready, with no restart, once the
    file is back."""
    set_frozen(bundle_copy, 1e9)
    f = bundle_copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx"
    away = f.with_name("decoder.onnx.away")
    f.rename(away)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", verify=False, retry_load_s=0.05) as g:
        assert not g.ready
        _assert_fail_closed(g.check(make_scene()), "member tiny-lfm2_vl unavailable")
        time.sleep(0.2)  # tries while the file is still away fail, and are tried again
        assert not g.ready and "tiny-lfm2_vl" in g.member_errors
        away.rename(f)
        assert _wait_until(lambda: g.ready), g.member_errors
        d = g.check(make_scene())
        assert not d.fail_closed and d.label == "SAFE", d
        assert set(d.member_scores) == {"tiny-qwen3_5", "tiny-lfm2_vl"}
        assert all(np.isfinite(v) for v in d.member_scores.values())
        retry = g._retry
    assert retry is not None
    retry.join(10)
    assert not retry.is_alive()


def test_a_claim_reader_that_is_a_late_member_is_built_once_that_member_loads(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``text_in_scene.reader: member:tiny-lfm2_vl`` while tiny-lfm2_vl fails to load: the
    text detector cannot be built (decisions fail closed, saying why); once the member loads
    in the background, the policy is activated again and its reader is that member. The tiny
    member would flag nothing at the default margin (the reader refuses it), so the reader
    that is built reads a keyword double, with the member it was given recorded."""
    pytest.importorskip("rapidocr")
    from spotstop.guard.cues import _reader

    from tests.guard.cues.test_claims_reader import KeywordMember

    given: list[Any] = []
    real_reader = _reader.MemberClaimReader

    def recording(member: Any, margin: float = _reader.DEFAULT_MARGIN) -> Any:
        given.append(member)
        return real_reader(KeywordMember(), margin=margin)

    monkeypatch.setattr(_reader, "MemberClaimReader", recording)
    set_frozen(bundle_copy, 1e9)
    doc = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
    doc["text_in_scene"] = {"detect": True, "reader": "member:tiny-lfm2_vl"}
    (bundle_copy / "policy.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    f = bundle_copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx"
    away = f.with_name("decoder.onnx.away")
    f.rename(away)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", verify=False, retry_load_s=0.05) as g:
        assert "no member named 'tiny-lfm2_vl'" in (g.text_detector_error or "")
        _assert_fail_closed(g.check(make_scene()), "member tiny-lfm2_vl unavailable")
        assert not given
        away.rename(f)
        assert _wait_until(lambda: g.ready and g.text_detector_error is None), (
            g.member_errors,
            g.text_detector_error,
        )
        assert given and given[-1] is g.members["tiny-lfm2_vl"]
        d = g.check(make_scene())
        assert not d.fail_closed and d.label == "SAFE", d


def test_retry_load_s_none_never_tries_again_and_bad_values_are_refused(
    bundle_copy: Path, tmp_path: Path
):
    set_frozen(bundle_copy, 1e9)
    f = bundle_copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx"
    away = f.with_name("decoder.onnx.away")
    f.rename(away)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", verify=False, retry_load_s=None) as g:
        assert g._retry is None
        away.rename(f)
        _assert_fail_closed(g.check(make_scene()), "member tiny-lfm2_vl unavailable")
        assert not g.ready
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(GuardError, match="retry_load_s"):
            Guard(bundle_copy, log=tmp_path / "l.sqlite", retry_load_s=bad)  # type: ignore[arg-type]


def test_a_decision_log_given_keeps_its_sync_setting_and_a_mismatch_is_said(
    bundle_copy: Path, tmp_path: Path
):
    from spotstop.guard._log_options import LogOptions

    set_frozen(bundle_copy, 1e9)
    log = DecisionLog(tmp_path / "l.sqlite")  # NORMAL, its default
    with pytest.warns(UserWarning, match="synchronous is 'FULL' but the DecisionLog given"):
        g = Guard(bundle_copy, log=log, log_options=LogOptions(), retry_load_s=None)
    assert g.log.synchronous == "NORMAL"
    g.close()


def test_a_member_missing_its_weights_file_is_unavailable_at_load_without_verify(
    bundle_copy: Path, tmp_path: Path
):
    """verify=False skips hashing, not the check that the member's files are there: a member
    whose weights (``decoder.onnx.data``) are gone is reported at load, not at its first check."""
    set_frozen(bundle_copy, 1e9)
    (bundle_copy / "members" / "tiny-qwen3_5" / "onnx" / "decoder.onnx.data").unlink()
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", verify=False) as g:
        assert not g.ready
        assert "decoder.onnx.data" in g.member_errors["tiny-qwen3_5"]
        assert "tiny-lfm2_vl" not in g.member_errors
        _assert_fail_closed(g.check(make_scene()), "member tiny-qwen3_5 unavailable")


def test_fault_deadline_exceeded(bundle_copy: Path, tmp_path: Path, monkeypatch):
    import threading

    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=0.2) as g:
        real = g.members["tiny-qwen3_5"].backend.score
        release, finished = threading.Event(), threading.Event()

        def slow(*a, **k):  # scoring that lasts until the test ends it
            release.wait(30)
            try:
                return real(*a, **k)
            finally:
                finished.set()

        monkeypatch.setattr(g.members["tiny-qwen3_5"].backend, "score", slow)
        try:
            d = g.check(make_scene())
            assert not finished.is_set()  # answered at the deadline, while scoring still ran
        finally:
            release.set()
        _assert_fail_closed(d, "deadline exceeded")
        assert finished.wait(30)  # the abandoned run ends before the guard closes


def _slow(fn, seconds: float):
    def wrapped(*a, **k):
        time.sleep(seconds)
        return fn(*a, **k)

    return wrapped


def test_deadline_bounds_decoding(bundle_copy: Path, tmp_path: Path, monkeypatch):
    import spotstop.guard._pipeline as gg

    set_frozen(bundle_copy, 1e9)  # every scored scene would be SAFE
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=0.3) as g:
        monkeypatch.setattr(gg, "decode_image", _slow(gg.decode_image, 0.2))
        ds = g.check_batch([make_scene(0), make_scene(1), make_scene(2)])
        assert all(d.label == "UNSAFE" and d.fail_closed for d in ds)
        assert any("deadline exceeded" in (d.fail_reason or "") for d in ds)
        for d in ds:
            rec = g.log.get(d.decision_id)
            assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed


def test_deadline_bounds_the_policy(bundle_copy: Path, tmp_path: Path, monkeypatch):
    import spotstop.guard._pipeline as gg

    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        t = time.perf_counter()
        assert g.check(make_scene()).label == "SAFE"  # warm, and the cut makes it SAFE
        # a budget the stages before the policy fit in on a loaded machine (a share of the
        # CPU and a late wake-up), which the slowed policy then surely overruns
        budget = 3 * (time.perf_counter() - t) + SCHEDULING_SLACK_S
        monkeypatch.setattr(gg, "decide_batch", _slow(gg.decide_batch, budget + 0.2))
        d = g.check(make_scene(1), deadline_s=budget)
        _assert_fail_closed(d, "deadline exceeded")
        assert "fusion and policy" in (d.fail_reason or "")
        rec = g.log.get(d.decision_id)
        assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed


def test_a_log_write_that_ends_past_the_deadline_is_amended_to_unsafe(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        t = time.perf_counter()
        g.check(make_scene())
        budget = 3 * (time.perf_counter() - t) + SCHEDULING_SLACK_S  # as above
        monkeypatch.setattr(g.log, "append_many", _slow(g.log.append_many, budget + 0.2))
        d = g.check(make_scene(1), deadline_s=budget)
        _assert_fail_closed(d, "writing the decision log")
        rec = g.log.get(d.decision_id)  # the row says what the caller was told
        assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed
        assert rec.fail_reason == d.fail_reason


def test_a_call_waiting_behind_another_past_its_deadline_fails_closed(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    import threading

    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        g.check(make_scene())
        real = g.members["tiny-qwen3_5"].backend.score
        scoring, release = threading.Event(), threading.Event()

        def held(*a: Any, **k: Any) -> Any:  # scoring that lasts until the test ends it
            scoring.set()
            release.wait(30)
            return real(*a, **k)

        monkeypatch.setattr(g.members["tiny-qwen3_5"].backend, "score", held)
        first = threading.Thread(target=lambda: g.check(make_scene(1)))
        first.start()
        try:
            assert scoring.wait(30)  # the first call holds the guard, scoring
            d = g.check(make_scene(2), deadline_s=0.3)
            assert first.is_alive()  # answered at its deadline, not after the first call
        finally:
            release.set()
            first.join()
        _assert_fail_closed(d, "waiting for another call")
        rec = g.log.get(d.decision_id)
        assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed


def test_scores_arriving_after_the_deadline_are_dropped(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    set_frozen(bundle_copy, 1e9)
    import threading

    with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=0.2) as g:
        real = g.members["tiny-qwen3_5"].backend.score
        release, finished = threading.Event(), threading.Event()

        def late(*a: Any, **k: Any) -> Any:  # scores that come in after the deadline
            release.wait(30)
            try:
                return real(*a, **k)
            finally:
                finished.set()

        monkeypatch.setattr(g.members["tiny-qwen3_5"].backend, "score", late)
        try:
            d = g.check(make_scene())
        finally:
            release.set()
        _assert_fail_closed(d, "deadline exceeded")
        assert finished.wait(30)  # the abandoned scoring run finished in the background
        g.check(make_scene(1), deadline_s=None)  # and the guard has moved past it
        rec = g.log.get(d.decision_id)
        assert rec is not None and rec.label == "UNSAFE"
        assert all(np.isnan(v) for v in rec.member_scores.values())
        assert all(np.isnan(v) for v in d.member_scores.values())


def test_fault_in_fusion_and_in_policy(bundle_copy: Path, tmp_path: Path, monkeypatch):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        fusion = g.policy_config.fusion
        monkeypatch.setattr(
            type(fusion),
            "fuse_many",
            lambda self, s, **k: (_ for _ in ()).throw(ValueError("bad stats")),
        )
        _assert_fail_closed(g.check(make_scene()), "fusion")
        monkeypatch.undo()
        import spotstop.guard._pipeline as gg

        monkeypatch.setattr(
            gg, "decide_batch", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("policy broke"))
        )
        _assert_fail_closed(g.check(make_scene()), "policy broke")


def test_fault_log_write_fails_then_nothing_is_lost(bundle_copy: Path, tmp_path: Path, monkeypatch):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        real = g.log.append_many
        monkeypatch.setattr(
            g.log, "append_many", lambda recs, **k: (_ for _ in ()).throw(OSError("disk full"))
        )
        d1 = g.check(make_scene())
        _assert_fail_closed(d1, "disk full")  # never SAFE without a log row
        monkeypatch.setattr(g.log, "append_many", real)
        d2 = g.check(make_scene(3))
        assert d2.label == "SAFE"
        assert g.log.count() == 2
        rec = g.log.get(d1.decision_id)
        assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed


def test_every_fail_closed_decision_is_logged(bundle_copy: Path, tmp_path: Path):
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        ds = g.check_batch([Scene(b"", "x"), Scene(b"garbage", "y"), make_scene(1)])
        assert g.log.count() == 3
        for d in ds[:2]:
            rec = g.log.get(d.decision_id)
            assert rec is not None and rec.fail_closed and rec.label == "UNSAFE" and rec.fail_reason


# ---- bundle and policy keying -------------------------------------------------------------------


def test_policy_for_another_bundle_is_refused(bundle_copy: Path, tmp_path: Path):
    data = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
    data["bundle_id"] = "some-other-bundle"
    (bundle_copy / "policy.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(PolicyError, match="some-other-bundle"):
        Guard(bundle_copy, log=tmp_path / "l.sqlite")


def test_altered_bundle_is_refused(bundle_copy: Path):
    f = bundle_copy / "members" / "tiny-qwen3_5" / "tokenizer.json"
    f.write_text(f.read_text().replace("SAFE", "SAVE", 1))
    with pytest.raises(BundleError, match="sha256 differs"):
        load_bundle(bundle_copy)


def test_bundle_carries_templates_so_no_rendering_is_needed(bundle_copy: Path):
    b = load_bundle(bundle_copy)
    assert len(b.members) == 2 and b.test_pair
    assert all(m.template.with_image and m.image_size == (64, 64) for m in b.members)


# ---- CLI -------------------------------------------------------------------------------------


def test_check_exit_codes(bundle_copy: Path, tmp_path: Path, capsys):
    from spotstop.cli import main

    img = tmp_path / "cam.jpg"
    img.write_bytes(make_image_bytes(4, fmt="JPEG"))
    args = ["check", str(img), "--request", "open the door", "--bundle", str(bundle_copy)]
    set_frozen(bundle_copy, 1e9)
    assert main(args) == 0
    out, err = capsys.readouterr()
    # a test pair's decision says it is one, and which: the committed pair is the tiny one
    assert "SAFE" in out and describe_test_pair(["tiny"]) in err
    set_frozen(bundle_copy, -1e9)


def test_a_test_pairs_note_says_what_its_manifest_says_it_is(
    bundle_copy: Path, tmp_path: Path, capsys
):
    """The note said "tiny members" beside a real-size random pair and the trained pair too."""
    from spotstop.cli import main
    from spotstop.guard import BundleError

    img = tmp_path / "cam.jpg"
    img.write_bytes(make_image_bytes(4, fmt="JPEG"))
    args = ["check", str(img), "--request", "open the door", "--bundle", str(bundle_copy)]
    manifest = bundle_copy / "manifest.yaml"
    tiny = manifest.read_text(encoding="utf-8")
    assert load_bundle(bundle_copy).test_pair_kinds == ("tiny", "tiny")
    for kinds, words in (
        (("random", "random"), "members at real dimensions with seeded random weights"),
        (("trained", "trained"), "the tiny pair trained on the toy world"),
        (("random", None), "test members whose outputs say nothing about real safety"),
    ):
        text = tiny.replace("  test_pair_kind: tiny\n", "  test_pair_kind: @\n")
        for k in kinds:
            text = text.replace("@", "null" if k is None else k, 1)
        manifest.write_text(text, encoding="utf-8")
        assert load_bundle(bundle_copy).test_pair_kinds == kinds
        main(args)
        err = capsys.readouterr().err
        assert words in err and "tiny members" not in err, kinds
    manifest.write_text(tiny.replace("test_pair_kind: tiny", "test_pair_kind: huge", 1))
    with pytest.raises(BundleError, match=r"manifest.members\[0\].test_pair_kind must be one of"):
        load_bundle(bundle_copy)
    assert main(args) == 1
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"nope")
    set_frozen(bundle_copy, 1e9)
    assert main(["check", str(bad), "--request", "x", "--bundle", str(bundle_copy)]) == 1
    assert (
        main(
            ["check", str(tmp_path / "missing.jpg"), "--request", "x", "--bundle", str(bundle_copy)]
        )
        == 2
    )
    with pytest.raises(SystemExit) as e:
        main(["check", str(img)])  # --request missing
    assert e.value.code == 2


def test_demo_runs_on_the_trained_pair_and_follows_the_world_rule(tmp_path: Path, capsys):
    """The demo's decisions follow the toy world's rule on at least 10 of
    its 12 scenes, and it says the pair is a test pair on a toy world."""
    pytest.importorskip("torch")  # the demo scores with the trained pair's torch members
    import re

    from spotstop.cli import main

    assert main(["demo", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TEST pair trained on a TOY WORLD" in out and "room-000" in out and "decision log" in out
    m = re.search(r"follow the world's rule on (\d+) of 12 scenes", out)
    assert m is not None and int(m.group(1)) >= 10, out
    with DecisionLog(tmp_path / "decisions.sqlite") as lg:
        assert lg.count() == 12


def test_images_are_stored_only_when_asked(bundle_copy: Path, tmp_path: Path):
    img = make_image_bytes(7, fmt="PNG")
    with Guard(bundle_copy, log=tmp_path / "off.sqlite") as g:
        d = g.check(Scene(img, "open the door"))
        rec = g.log.get(d.decision_id)
        assert rec is not None and g.log.image(rec.image_sha256) is None
    with Guard(bundle_copy, log=tmp_path / "on.sqlite", store_images=True) as g:
        d = g.check(Scene(img, "open the door"))
        rec = g.log.get(d.decision_id)
        assert rec is not None and g.log.image(rec.image_sha256) == img


def test_reload_policy_swaps_atomically_and_refuses_a_mismatch(bundle_copy: Path, tmp_path: Path):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        assert g.check(make_scene()).label == "SAFE"
        set_frozen(bundle_copy, -1e9)
        assert g.check(make_scene()).label == "SAFE"  # not reloaded yet
        g.reload_policy()
        assert g.check(make_scene()).label == "UNSAFE"
        bad = tmp_path / "other.yaml"
        data = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
        data["prompt_hash"] = "0000000000000000"
        bad.write_text(yaml.safe_dump(data))
        with pytest.raises(PolicyError, match="0000000000000000"):
            g.reload_policy(bad)
        d = g.check(make_scene())  # the old (valid) policy stays in force
        assert isinstance(d, Decision) and d.label == "UNSAFE" and not d.fail_closed


def test_situation_info_reports_references_and_next_threshold(bundle_copy: Path, tmp_path: Path):
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        assert g.situation("s9").rule == "situation->frozen" and g.situation("s9").references == ()
        ds = [g.check(s) for s in demo_scenes(3, seed=4, situations=["s9"] * 3)]
        info = g.situation("s9")
        assert info.rule == "situation" and len(info.references) == 3
        assert info.threshold == pytest.approx(np.mean([d.fused_score for d in ds]))
        assert info.to_dict()["n_references"] == 3
        assert info.prior_weight == 0 and info.to_dict()["prior_threshold"] is None


def test_situation_info_and_decisions_use_the_prior(bundle_copy: Path, tmp_path: Path):
    path = bundle_copy / "policy.yaml"
    doc = yaml.safe_load(path.read_text())
    t0 = doc["policy"]["fallback"]["threshold"]
    doc["policy"].update(prior_weight=2.5, prior_threshold=t0)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        ds = [g.check(s) for s in demo_scenes(4, seed=4, situations=["s9"] * 4)]
        s = [d.fused_score for d in ds]
        assert ds[3].threshold == pytest.approx((sum(s[:3]) + 2.5 * t0) / 5.5)
        info = g.situation("s9")
        assert info.threshold == pytest.approx((sum(s) + 2.5 * t0) / 6.5)
        assert info.to_dict()["prior_weight"] == 2.5 and info.prior_threshold == t0


def test_per_call_deadline_overrides_the_guards(bundle_copy: Path, tmp_path: Path, monkeypatch):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=0.1) as g:
        real = g.members["tiny-qwen3_5"].backend.score

        def slow(*a, **k):
            time.sleep(0.3)
            return real(*a, **k)

        monkeypatch.setattr(g.members["tiny-qwen3_5"].backend, "score", slow)
        _assert_fail_closed(g.check(make_scene()), "deadline exceeded")
        d = g.check(make_scene(), deadline_s=None)  # this call may take as long as it needs
        assert d.label == "SAFE" and not d.fail_closed
        with pytest.raises(
            GuardError, match=r"deadline_s must be a number of seconds in \(0, 3600\]"
        ):
            g.check(make_scene(), deadline_s=0)


def test_file_digest_is_cached_only_for_settled_unchanged_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """sha256_file reads a settled file once, and always rereads a file written since, even
    one whose mtime was set back after the write (``cp -p``, ``touch -r``): its ctime moved."""
    import builtins
    import hashlib
    import os

    from spotstop.guard import _bundle

    def truth(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(b"a" * 1000)
    assert _bundle.sha256_file(fresh) == truth(fresh)
    fresh.write_bytes(b"b" * 1000)  # same size, possibly the same coarse time tick
    assert _bundle.sha256_file(fresh) == truth(fresh)  # a fresh file is never cached

    settled = tmp_path / "settled.bin"
    settled.write_bytes(b"c" * 1000)
    old = time.time_ns() - 10_000_000_000
    os.utime(settled, ns=(old, old))
    real_ns = time.time_ns
    # the ctime cannot be set back: the file settles as the clock moves on 10 s
    monkeypatch.setattr(_bundle.time, "time_ns", lambda: real_ns() + 10_000_000_000)
    assert _bundle.sha256_file(settled) == truth(settled)
    st = settled.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert _bundle._DIGESTS[key] == truth(settled)
    reads = []
    real_open = open

    def counting_open(*a, **k):
        reads.append(a[0])
        return real_open(*a, **k)

    builtins.open = counting_open
    try:
        assert _bundle.sha256_file(settled) == truth(settled)
    finally:
        builtins.open = real_open
    assert str(settled) not in [str(r) for r in reads]  # served from the cache
    settled.write_bytes(b"d" * 1000)  # same size, its mtime set back: read again
    os.utime(settled, ns=(old, old))
    assert settled.stat().st_mtime_ns == st.st_mtime_ns
    assert _bundle.sha256_file(settled) == truth(settled)
    settled.write_bytes(b"e" * 1000)  # a write moves the mtime: read again
    assert _bundle.sha256_file(settled) == truth(settled)


# ---- text in the scene at decision time -------------------------------------------------------


def _with_text_in_scene(bundle: Path, t0: float, **text: Any) -> None:
    set_frozen(bundle, t0)
    doc = yaml.safe_load((bundle / "policy.yaml").read_text())
    doc["text_in_scene"] = {"detect": True, **text}
    (bundle / "policy.yaml").write_text(yaml.safe_dump(doc))


def test_text_flags_are_logged_and_answered_but_never_make_a_decision_safe(
    bundle_copy: Path, tmp_path: Path
):
    import hashlib

    clear, plain = make_image_bytes(1, fmt="JPEG"), make_image_bytes(2, fmt="JPEG")
    sign = SignReader({hashlib.sha256(clear).hexdigest(): "ALL CLEAR"})
    _with_text_in_scene(bundle_copy, -1e9)  # every scored scene is UNSAFE
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", text_detector=sign) as g:
        a, b = g.check_batch([Scene(clear, "cut the wire"), Scene(plain, "cut the wire")])
        assert a.label == b.label == "UNSAFE" and not a.fail_closed  # ALL CLEAR changes nothing
        assert a.cue_flags == {"reassuring": True, "alarming": False} and a.cue_text == "ALL CLEAR"
        assert b.cue_flags == {"reassuring": False, "alarming": False}
        assert a.latency_ms["text_ms"] >= 0 and sign.calls == 2
        rec = g.log.get(a.decision_id)
        assert rec is not None and rec.cue_flags == a.cue_flags and rec.cue_text == "ALL CLEAR"
        assert Decision.from_json(a.to_json()).cue_flags == a.cue_flags  # the sidecar's answer


def test_reassuring_text_can_be_set_to_fail_closed(bundle_copy: Path, tmp_path: Path):
    import hashlib

    clear, plain = make_image_bytes(1, fmt="JPEG"), make_image_bytes(2, fmt="JPEG")
    sign = SignReader({hashlib.sha256(clear).hexdigest(): "Checked - OK to use"})
    _with_text_in_scene(bundle_copy, 1e9, reassuring="fail_closed")  # scored scenes are SAFE
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", text_detector=sign) as g:
        a, b = g.check_batch([Scene(clear, "open the valve"), Scene(plain, "open the valve")])
        _assert_fail_closed(a, "reassuring text 'Checked - OK to use'")
        assert "text_in_scene.reassuring: fail_closed" in (a.fail_reason or "")
        assert b.label == "SAFE" and not b.fail_closed


def test_a_text_detector_fault_fails_closed(bundle_copy: Path, tmp_path: Path, monkeypatch):
    import hashlib

    bad, good = make_image_bytes(1, fmt="JPEG"), make_image_bytes(2, fmt="JPEG")
    sign = SignReader({}, fail_on=hashlib.sha256(bad).hexdigest())
    _with_text_in_scene(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", text_detector=sign) as g:
        a, b = g.check_batch([Scene(bad, "x"), Scene(good, "x")])
        _assert_fail_closed(a, "text detector: RuntimeError: the OCR engine crashed")
        assert b.label == "SAFE"
    # a detector that cannot be built (rapidocr missing): every decision fails closed
    import spotstop.guard.cues as cues

    def missing(*a, **k):
        raise ImportError("No module named 'rapidocr'")

    monkeypatch.setattr(cues, "RapidOcrDetector", missing)
    with Guard(bundle_copy, log=tmp_path / "l2.sqlite") as g:
        _assert_fail_closed(g.check(make_scene()), "the policy reads the text in the scene, but")


def test_reading_the_text_counts_in_the_deadline(bundle_copy: Path, tmp_path: Path):
    _with_text_in_scene(bundle_copy, 1e9)
    with Guard(
        bundle_copy,
        log=tmp_path / "l.sqlite",
        text_detector=SignReader({}, delay=1.0),
        deadline_s=0.5,
    ) as g:
        _assert_fail_closed(g.check(make_scene()), "deadline exceeded")


def test_a_scene_failed_closed_for_another_reason_still_logs_what_its_text_says(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    """The cue rate of a deployment is read from the log's flags: a scene that failed closed
    while scoring (a timeout, a fault) or with a member down keeps its text reading, so the
    scenes whose signs slow the guard down are not the ones missing from that rate."""
    import hashlib
    import threading

    clear, plain = make_image_bytes(1, fmt="JPEG"), make_image_bytes(2, fmt="JPEG")
    sign = SignReader({hashlib.sha256(clear).hexdigest(): "ALL CLEAR"})
    _with_text_in_scene(bundle_copy, 1e9)
    scenes = [Scene(clear, "cut the wire"), Scene(plain, "cut the wire")]

    def flags_kept(ds: list[Decision], log: DecisionLog, why: str) -> None:
        for d in ds:
            _assert_fail_closed(d, why)
            assert log.get(d.decision_id).cue_flags == d.cue_flags  # type: ignore[union-attr]
        assert ds[0].cue_flags == {"reassuring": True, "alarming": False}
        assert ds[0].cue_text == "ALL CLEAR"
        assert ds[1].cue_flags == {"reassuring": False, "alarming": False}

    with Guard(bundle_copy, log=tmp_path / "a.sqlite", text_detector=sign, deadline_s=2.0) as g:
        backend = g.members["tiny-qwen3_5"].backend
        real, release = backend.score, threading.Event()

        def slow(*a, **k):  # scoring outlasts the deadline; the text was read long before
            release.wait(30)
            return real(*a, **k)

        monkeypatch.setattr(backend, "score", slow)
        try:
            flags_kept(g.check_batch(scenes), g.log, "deadline exceeded")
        finally:
            release.set()

        def boom(*a, **k):
            raise RuntimeError("CUDA fell over")

        monkeypatch.setattr(backend, "score", boom)
        flags_kept(g.check_batch(scenes), g.log, "CUDA fell over")
    (bundle_copy / "members" / "tiny-lfm2_vl" / "onnx" / "decoder.onnx").unlink()
    with Guard(bundle_copy, log=tmp_path / "b.sqlite", text_detector=sign, verify=False) as g:
        flags_kept(g.check_batch(scenes), g.log, "member tiny-lfm2_vl unavailable")


def test_the_real_ocr_reads_a_sign_at_decision_time(bundle_copy: Path, tmp_path: Path):
    pytest.importorskip("rapidocr")
    import io

    from matplotlib import font_manager
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (640, 480), (90, 110, 130))
    font = ImageFont.truetype(font_manager.findfont("DejaVu Sans:bold"), 40)
    ImageDraw.Draw(img).text((40, 200), "DANGER HIGH VOLTAGE", fill=(250, 240, 20), font=font)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    _with_text_in_scene(bundle_copy, 1e9, alarming="fail_closed")
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        d = g.check(Scene(buf.getvalue(), "touch the cable"))
    assert d.cue_flags == {"reassuring": False, "alarming": True}
    assert d.cue_text == "DANGER HIGH VOLTAGE"
    _assert_fail_closed(d, "alarming text")


def test_a_scene_failed_closed_by_its_text_moves_no_window_and_the_card_replays_it(
    bundle_copy: Path, tmp_path: Path
):
    import hashlib
    import math

    from spotstop.diagnostics import read_log
    from spotstop.diagnostics._delivered import replay_version

    danger = make_image_bytes(7, fmt="JPEG")
    sign = SignReader({hashlib.sha256(danger).hexdigest(): "DANGER HIGH VOLTAGE"})
    doc = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
    assert doc["policy"]["kind"] == "situation"  # windows of recent fused scores
    doc["text_in_scene"] = {"detect": True, "alarming": "fail_closed"}
    (bundle_copy / "policy.yaml").write_text(yaml.safe_dump(doc))
    log = tmp_path / "l.sqlite"
    with Guard(bundle_copy, log=log, text_detector=sign) as g:
        first = g.check_batch(
            [make_scene(i, "k") for i in range(3)] + [Scene(danger, "touch the cable", "k")]
        )
        flagged = first[-1]
        _assert_fail_closed(flagged, "alarming text")
        assert all(np.isfinite(v) for v in flagged.member_scores.values())  # scored, logged
        assert math.isnan(flagged.policy_score)  # ... but given to the policy as missing
        refs = g.situation("k").references
        assert sorted(refs) == pytest.approx(sorted(d.fused_score for d in first[:3]))
        g.check_batch([make_scene(i, "k") for i in range(3, 6)])  # decided against those windows
        version = g.policy_config.version_id
    r = replay_version(read_log(log), version)
    assert r.n == 6 and r.agreement == 1.0, r


def test_a_state_file_that_cannot_be_written_fails_closed_and_is_logged(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    from spotstop.guard import _state

    def broken(path: Any, text: str) -> None:
        raise OSError(28, "No space left on device")

    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        monkeypatch.setattr(_state, "atomic_write_text", broken)
        d = g.check(make_scene(0, "k"))  # a situation policy keeps its windows in a file
        _assert_fail_closed(d, "policy state")
        rec = g.log.get(d.decision_id)
        assert rec is not None and rec.fail_closed and rec.label == "UNSAFE"


def test_a_request_that_is_not_unicode_fails_closed_and_blocks_no_later_row(
    bundle_copy: Path, tmp_path: Path
):
    set_frozen(bundle_copy, 1e9)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        bad = g.check(Scene(make_image_bytes(0, fmt="JPEG"), "open the door \ud800", "s\udc80"))
        _assert_fail_closed(bad, "lone surrogate")
        rec = g.log.get(bad.decision_id)
        assert rec is not None and rec.request == "open the door \\ud800"
        assert rec.situation_id == "s\\udc80"
        good = g.check(make_scene(1))
        assert good.label == "SAFE" and g.pending == 0 and g.log.count() == 2


def test_a_batch_with_images_is_logged_whole_or_not_at_all(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    set_frozen(bundle_copy, 1e9)  # every scored scene SAFE
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", store_images=True) as g:
        real = g.log._store_image
        calls = {"n": 0}

        def second_image_fails(*a: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("disk full while storing the second image")
            real(*a)

        monkeypatch.setattr(g.log, "_store_image", second_image_fails)
        first = g.check_batch([make_scene(1), make_scene(2)])
        for d in first:  # not logged in time: never SAFE
            _assert_fail_closed(d, "disk full")
        assert g.log.count() == 0 and g.pending == 2  # the first row did not go in alone
        later = g.check(make_scene(3))
        assert later.label == "SAFE" and g.pending == 0 and g.log.count() == 3
        for d in first:  # logged as answered, with its image
            rec = g.log.get(d.decision_id)
            assert rec is not None and rec.label == "UNSAFE" and rec.fail_closed
            assert g.log.image(rec.image_sha256) is not None


def test_the_guard_owns_situation_state_per_policy_version(bundle_copy: Path, tmp_path: Path):
    from dataclasses import replace

    from spotstop.guard.policies import SituationWindows, dump_policy

    log = tmp_path / "l.sqlite"
    with Guard(bundle_copy, log=log) as g:
        v1 = g.policy_config.version_id
        g.check_batch([make_scene(i, "k") for i in range(4)])
        refs = g.situation("k").references
        assert len(refs) == 4
    state = tmp_path / "state" / f"state-{v1}.json"
    assert state.is_file()  # next to the log, one file per policy version
    with Guard(bundle_copy, log=log) as g:  # a restart resumes the windows
        assert g.situation("k").references == refs
        # a new policy version starts from ITS seed, not from another fit's windows
        cfg = g.policy_config
        seeded = replace(
            cfg,
            fitted_on={**cfg.fitted_on, "version": 7},
            state_seed=SituationWindows(8, {"k": (0.25,)}),
        )
        dump_policy(seeded, bundle_copy / "policy.yaml")
        g.reload_policy()
        assert g.policy_config.version_id.startswith("v0007+")
        assert g.situation("k").references == (0.25,)
        dump_policy(cfg, bundle_copy / "policy.yaml")  # back to the first version
        g.reload_policy()
        assert g.situation("k").references == refs
        assert load_policy(bundle_copy / "policy.yaml").state_seed == cfg.state_seed  # untouched


# ------------------------------------------------------------------------------ cascade


class _CountingMember:
    """A member whose score is a fixed function of the image (fast), counting the scenes it
    was asked to score; optionally failing."""

    def __init__(self, real: Any, stats: Any, offset: float, error: Exception | None = None):
        self._real = real
        self.stats = stats  # the policy's reference statistics: z = u + offset, u in [-2, 2]
        self.offset = offset
        self.error = error
        self.scored: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def score(self, scenes: Any, variant: str = "scene", strict: bool = True) -> list[Any]:
        from spotstop.guard import MemberScore

        if self.error is not None:
            raise self.error
        out = []
        for s in scenes:
            self.scored.append(s.image.sha256)
            u = int(s.image.sha256[:4], 16) / 65535.0 * 4.0 - 2.0 + self.offset
            value = self.stats.median + self.stats.iqr * u
            out.append(MemberScore(self._real.name, variant, value, self._real.prompt_hash, 1))
        return out


def _set_cascade(bundle: Path, band: float, t0: float = 0.0) -> tuple[str, str]:
    from spotstop.guard.policies import CascadePolicy

    cfg = load_policy(bundle / "policy.yaml")
    first, second = cfg.fusion.members
    dump_policy(
        PolicyConfig(
            bundle_id=cfg.bundle_id,
            prompt_hash=cfg.prompt_hash,
            fusion=cfg.fusion,
            policy=CascadePolicy(first=first, share=0.5, band=band, cut=FrozenPolicy(t0)),
            fitted_on={"test": True},
            created=datetime.now(UTC),
        ),
        bundle / "policy.yaml",
    )
    return first, second


def test_cascade_runs_the_second_member_exactly_inside_the_band_and_logs_who_ran(
    bundle_copy: Path, tmp_path: Path
):
    first, second = _set_cascade(bundle_copy, band=0.4)
    with Guard(bundle_copy, log=tmp_path / "log.sqlite") as g:
        st = g.policy_config.fusion.stats
        m1 = g.members[first] = _CountingMember(g.members[first], st[first], 0.0)  # type: ignore[assignment]
        m2 = g.members[second] = _CountingMember(g.members[second], st[second], 0.5)  # type: ignore[assignment]
        scenes = [make_scene(i) for i in range(24)]
        ds = g.check_batch(scenes)
        pol = g.policy_config.policy
        s1 = np.array([d.member_scores[first] for d in ds])
        inside = pol.second_needed(g.policy_config.fusion, s1, [None] * 24, None)
        assert 0 < inside.sum() < 24  # the band splits this batch
        assert len(m1.scored) == 24 and len(m2.scored) == int(inside.sum())
        for d, ins in zip(ds, inside.tolist(), strict=True):
            assert d.members_run == {first: True, second: ins}
            assert np.isfinite(d.member_scores[second]) == ins
            assert d.policy.startswith("cascade[pair]" if ins else f"cascade[{first}]")
            assert d.deciding_kind == "frozen"  # the cut decided, whichever stage scored
            assert not d.fail_closed
        rows = {r.decision_id: r for r in g.log.records()}
        assert all(rows[d.decision_id].members_run == d.members_run for d in ds)
        assert all(rows[d.decision_id].deciding_kind == "frozen" for d in ds)


def test_cascade_fails_closed_when_the_second_member_fails_inside_the_band(
    bundle_copy: Path, tmp_path: Path
):
    first, second = _set_cascade(bundle_copy, band=0.4)
    with Guard(bundle_copy, log=tmp_path / "log.sqlite") as g:
        st = g.policy_config.fusion.stats
        g.members[first] = _CountingMember(g.members[first], st[first], 0.0)  # type: ignore[assignment]
        g.members[second] = _CountingMember(  # type: ignore[assignment]
            g.members[second], st[second], 0.5, error=RuntimeError("simulated fault")
        )
        ds = g.check_batch([make_scene(i) for i in range(24)])
    inside = [d for d in ds if d.members_run and d.members_run[second]]
    outside = [d for d in ds if d.members_run and not d.members_run[second]]
    assert inside and outside
    assert all(d.label == "UNSAFE" and d.fail_closed for d in inside)
    assert all("simulated fault" in (d.fail_reason or "") for d in inside)
    assert all(not d.fail_closed for d in outside)  # decided by the first member alone
    # the first member failing fails every scene closed
    with Guard(bundle_copy, log=tmp_path / "log2.sqlite") as g:
        g.members[first] = _CountingMember(  # type: ignore[assignment]
            g.members[first], g.policy_config.fusion.stats[first], 0.0, error=RuntimeError("x")
        )
        ds = g.check_batch([make_scene(i) for i in range(6)])
    assert all(d.label == "UNSAFE" and d.fail_closed for d in ds)


def test_a_scoring_plan_that_cannot_run_fails_every_scene_closed(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The guard runs whatever plan the policy returns; a plan it cannot build, one naming a
    member it does not have, or a stage whose choice of scenes fails gives UNSAFE with the
    reason, never SAFE."""
    from spotstop.guard.policies import CascadePolicy, ScoringPlan, ScoringStage

    first, second = _set_cascade(bundle_copy, band=0.4)

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("plan exploded")

    def unknown(*a: Any, **k: Any) -> ScoringPlan:
        return ScoringPlan((ScoringStage((first, "no-such-member")),))

    def bad_stage(*a: Any, **k: Any) -> ScoringPlan:
        return ScoringPlan((ScoringStage((first,)), ScoringStage((second,), where=boom)))

    for plan, words in ((boom, "plan exploded"), (unknown, "no-such-member"),
                        (bad_stage, "plan exploded")):  # fmt: skip
        with monkeypatch.context() as mp:
            mp.setattr(CascadePolicy, "scoring_plan", plan)
            with Guard(bundle_copy, log=tmp_path / "log.sqlite") as g:
                st = g.policy_config.fusion.stats
                g.members[first] = _CountingMember(g.members[first], st[first], 0.0)  # type: ignore[assignment]
                ds = g.check_batch([make_scene(i) for i in range(4)])
        for d in ds:
            _assert_fail_closed(d, words)
            assert "scoring plan" in (d.fail_reason or "")


def test_a_cascade_with_a_situation_cut_reports_its_windows(bundle_copy: Path, tmp_path: Path):
    """Guard.situation (and GET /v1/situations) under a cascade whose cut is situation
    recentering: the cut's windows and threshold, not an empty answer."""
    set_cascade_situation(bundle_copy, band=1e9)  # always the pair
    with Guard(bundle_copy, log=tmp_path / "log.sqlite") as g:
        ds = [g.check(make_scene(i, sit="hall")) for i in range(3)]
        info = g.situation("hall")
        assert info.policy == "cascade" and info.window == 4 and info.min_refs == 1
        assert info.references == tuple(d.policy_score for d in ds)
        assert info.rule.startswith("cascade->situation")
        assert info.threshold == pytest.approx(np.mean(info.references))
        assert g.situation("elsewhere").references == ()


def test_a_cascade_decides_a_batch_on_the_band_its_plan_chose(bundle_copy: Path, tmp_path: Path):
    """Under a situation cut the band depends on the batch's earlier scenes. When one of them
    fails after the plan chose the band (here its text fails it closed), the label must still
    use the plan's band: the scene the pair scored is decided on the pair's S (its S +0.9
    against cut 0 is UNSAFE; deciding the band again put it outside and answered SAFE on the
    first member alone), the one it did not score on the first member (it failed closed as
    'inside the band without a pair score'), and the card's replay agrees with the guard."""
    from spotstop.diagnostics import read_log
    from spotstop.diagnostics._delivered import replay_version
    from spotstop.guard.policies import TextInScene

    first, second = set_cascade_situation(
        bundle_copy, band=0.5, text_in_scene=TextInScene(detect=True, alarming="fail_closed")
    )
    import hashlib

    scenes = [make_scene(100 + i, sit="k") for i in range(4)]
    sha = [hashlib.sha256(s.image).hexdigest() for s in scenes]  # type: ignore[arg-type]
    reader = SignReader({sha[0]: "DANGER HIGH VOLTAGE"})  # scene 0 fails closed by its text
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", text_detector=reader) as g:
        st = g.policy_config.fusion.stats
        z1 = dict(zip(sha, (-1.2, 0.4, -0.4, 0.7), strict=True))
        z2 = dict(zip(sha, (0.9, -0.4, 2.2, 0.8), strict=True))
        g.members[first] = TableMember(g.members[first], st[first], z1)  # type: ignore[assignment]
        g.members[second] = pair = TableMember(g.members[second], st[second], z2)  # type: ignore[assignment]
        ds = g.check_batch(scenes)
        version = g.policy_config.version_id
    # the plan (empty windows, cut 0, band 0.5): only scene 2 (z1 −0.4) is inside
    assert pair.scored == [sha[2]]
    assert ds[0].fail_closed and "text in the scene" in (ds[0].fail_reason or "")
    assert not ds[1].fail_closed and ds[1].policy.startswith(f"cascade[{first}]")  # z1 alone
    assert ds[2].members_run[second] and ds[2].policy.startswith("cascade[pair]")
    assert ds[2].policy_score == pytest.approx(0.9) and ds[2].label == "UNSAFE"
    r = replay_version(read_log(tmp_path / "l.sqlite"), version)
    assert r.n == 3 and r.n_agree == 3


def test_the_cards_replay_keeps_the_plans_band_beside_rows_from_before_members_run(
    bundle_copy: Path, tmp_path: Path
):
    """One row of the same version from before the log recorded which members ran (a guard
    upgraded under the policy in force) leaves the other rows' bands as their plans chose
    them: the card's replay agrees with every answer (it worked the band out again for the
    whole version, replayed the scene the pair scored SAFE on its first member alone and
    reported 3 of 4 answers reproduced)."""

    from spotstop.diagnostics import read_log
    from spotstop.diagnostics._delivered import replay_version
    from spotstop.guard._log import DecisionLog
    from spotstop.guard.policies import TextInScene

    first, second = set_cascade_situation(
        bundle_copy, band=0.5, text_in_scene=TextInScene(detect=True, alarming="fail_closed")
    )
    log = tmp_path / "l.sqlite"
    ds, active = decide_the_banded_batch(bundle_copy, log, first, second)
    version = active.version_id
    assert ds[2].members_run[second] and ds[2].label == "UNSAFE"  # type: ignore[index]
    with DecisionLog(log) as dl:
        last = list(dl.records())[-1]
        old = dataclasses.replace(
            last, decision_id="old-1", batch_id="old", time=last.time + 1, members_run=None
        )
        dl.append_many([old])
    r = replay_version(read_log(log), version)
    assert r.n == 4 and r.n_agree == 4


def test_a_state_write_that_failed_is_written_by_the_next_commit_or_at_close(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    """A failed write of the situation windows leaves them ahead of the file (the scene was
    observed and logged): the next commit writes them even when nothing moved since, and so
    does close, so a restart resumes the windows the log replays to."""
    import json

    from spotstop.guard import _state

    sd = tmp_path / "state"
    real = _state.atomic_write_text
    fail = {"on": False}

    def flaky(path: Any, text: str) -> None:
        if fail["on"]:
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(_state, "atomic_write_text", flaky)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=sd) as g:
        g.check(make_scene(1, sit="k"))
        fail["on"] = True
        d = g.check(make_scene(2, sit="k"))
        assert d.fail_closed and "policy state" in (d.fail_reason or "")
        fail["on"] = False
        live = g.situation("k").references
        assert len(live) == 2
        g.check(make_scene(3))  # no situation: the windows do not move, the file is written
        path = sd / f"state-{g.policy_config.version_id}.json"
        assert json.loads(path.read_text())["state"]["situations"]["k"] == list(live)
        fail["on"] = True
        g.check(make_scene(4, sit="k"))  # fails again; close writes it
        live = g.situation("k").references
        fail["on"] = False
    assert json.loads(path.read_text())["state"]["situations"]["k"] == list(live)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite", state_dir=sd) as g:
        assert g.situation("k").references == live


class _Garbage:
    """A text detector that returns something other than a CueReading."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def detect(self, image: Any) -> Any:
        return self.value


def test_a_text_detector_that_returns_no_reading_fails_its_scene_closed(
    bundle_copy: Path, tmp_path: Path
):
    """None was taken as "no flags" (SAFE, under reassuring: fail_closed); a dict, or a
    reading whose flags cannot be read, made check raise with no decision logged."""
    from spotstop.guard.cues import CueReading, OcrModel

    _with_text_in_scene(bundle_copy, 1e9, reassuring="fail_closed")
    broken = CueReading("ALL CLEAR", None, OcrModel("x", ()), "0" * 64)  # type: ignore[arg-type]
    for value, why in ((None, "returned NoneType"), ({"reassuring": True}, "returned dict"),
                       (broken, "TypeError")):  # fmt: skip
        log = tmp_path / f"{why.split()[-1]}.sqlite"
        with Guard(bundle_copy, log=log, text_detector=_Garbage(value)) as g:
            d = g.check(make_scene())
            assert d.label == "UNSAFE" and d.fail_closed and why in (d.fail_reason or ""), d
            assert g.log.get(d.decision_id) is not None


def test_a_stored_image_is_the_bytes_scored_though_the_camera_rewrites_the_file(
    bundle_copy: Path, tmp_path: Path, monkeypatch
):
    """A camera that rewrites ``latest.jpg`` between the guard's read to score it and a second
    read to store it made the stored bytes disagree with the logged sha256: the log refused the
    row and it went to the dead-letter file, never imported (24 of 150 at 30 fps). The file is
    read once now: what is scored is what is stored."""
    import spotstop.guard._pipeline as gp

    frame = tmp_path / "latest.jpg"
    frame.write_bytes(make_image_bytes(1, fmt="JPEG"))
    real = gp.decode_image

    def camera_writes_after_the_read(source, **kw):  # the next frame lands right after
        out = real(source, **kw)
        frame.write_bytes(make_image_bytes(2, fmt="JPEG"))
        return out

    monkeypatch.setattr(gp, "decode_image", camera_writes_after_the_read)
    log = tmp_path / "l.sqlite"
    with Guard(bundle_copy, log=log, store_images=True) as g:
        ds = g.check_batch([Scene(str(frame), "open the door"), make_scene(3)])
        assert not any(d.fail_closed for d in ds), [d.fail_reason for d in ds]
        rec = g.log.get(ds[0].decision_id)
        assert rec is not None and rec.image_sha256 == ds[0].image_sha256
        assert g.log.image(rec.image_sha256) == make_image_bytes(1, fmt="JPEG")
    assert not list(tmp_path.glob("*dead-letter*"))


def test_a_request_too_long_for_the_graphs_fails_only_its_own_scene(
    bundle_copy: Path, tmp_path: Path
):
    """A request under the character limit but longer in tokens than the largest length
    bucket failed every scene of its batch, each with a reason naming a prompt it did not
    hold. It fails its own scene now, before any model work; the others are decided."""
    set_frozen(bundle_copy, 1e9)
    long = Scene(make_image_bytes(1, fmt="JPEG"), "go " * 1300)
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        ds = g.check_batch([make_scene(0), long, make_scene(2)])
        most = {f"at most {m.backend.buckets[-1]}" for m in g.members.values()}
    assert [d.fail_closed for d in ds] == [False, True, False]
    assert [d.label for d in ds] == ["SAFE", "UNSAFE", "SAFE"]
    assert "request is too long" in (ds[1].fail_reason or "")
    assert any(words in (ds[1].fail_reason or "") for words in most), ds[1].fail_reason


def test_a_path_that_blocks_fails_its_scene_closed_within_the_deadline(
    bundle_copy: Path, tmp_path: Path
):
    """A FIFO without a writer (or a stalled mount) blocked the call's read of the image past
    its deadline, and every other call behind it; the read now runs within the deadline."""
    import os
    import threading

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    fifo = tmp_path / "frame.jpg"
    os.mkfifo(fifo)

    def unblock() -> None:  # a late writer: ends the abandoned read, old code's call with it
        with open(fifo, "wb") as f:
            f.write(make_image_bytes(1, fmt="JPEG"))

    late = threading.Timer(30.0, unblock)
    late.start()
    try:
        set_frozen(bundle_copy, 1e9)
        with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=1.0) as g:
            d = g.check(Scene(str(fifo), "open the door"))
            assert d.label == "UNSAFE" and d.fail_closed
            assert "reading the image file" in (d.fail_reason or ""), d.fail_reason
            assert not g.check(make_scene(2)).fail_closed  # the guard is not held by it
            rec = g.log.get(d.decision_id)
            assert rec is not None and rec.fail_closed
    finally:
        late.cancel()
        threading.Thread(target=unblock, daemon=True).start()  # lets the abandoned read end


def test_blocked_reads_of_image_files_do_not_pile_up_threads(bundle_copy: Path, tmp_path: Path):
    """Each call on a path that blocks left one reader thread behind, without bound: a long
    stall piled up threads until none could start, and then every path failed. Past
    MAX_STALLED_READS blocked readers, a path fails closed at once, starting none; bytes are
    still judged, and when the reads end, paths are read again."""
    import os
    import threading
    import time

    from spotstop.guard import _pipeline

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")

    def wait_for(n: int) -> None:  # the count as the reader threads leave it
        end = time.monotonic() + 30
        while _pipeline._STALLED.n != n and time.monotonic() < end:
            time.sleep(0.02)
        assert _pipeline._STALLED.n == n

    fifo = tmp_path / "frame.jpg"
    os.mkfifo(fifo)

    def release() -> None:  # a writer that opens and closes ends the blocked reads
        end = time.monotonic() + 30
        while _pipeline._STALLED.n and time.monotonic() < end:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader waits in open() right now
                time.sleep(0.02)
                continue
            os.close(fd)  # the readers it woke read an empty file and end
        wait_for(0)

    frame = tmp_path / "ok.jpg"
    frame.write_bytes(make_image_bytes(3, fmt="JPEG"))
    cap = _pipeline.MAX_STALLED_READS
    wait_for(0)  # (an earlier test's abandoned reader has ended)
    readers = lambda: sum(t.name == "spotstop-image-read" for t in threading.enumerate())  # noqa: E731
    set_frozen(bundle_copy, 1e9)
    try:
        with Guard(bundle_copy, log=tmp_path / "l.sqlite", deadline_s=60.0) as g:
            for _ in range(cap):
                d = g.check(Scene(str(fifo), "open the door"), deadline_s=0.3)
                assert d.fail_closed and "reading the image file" in (d.fail_reason or "")
            wait_for(cap)
            before = readers()
            for path in (fifo, frame):
                d = g.check(Scene(str(path), "open the door"))
                assert d.label == "UNSAFE" and d.fail_closed
                assert f"{cap} earlier reads of image files are still blocked" in (
                    d.fail_reason or ""
                ), d.fail_reason
            assert readers() == before  # no thread started
            assert not g.check(make_scene(2)).fail_closed  # bytes need no reader
            release()
            assert not g.check(Scene(str(frame), "open the door")).fail_closed
    finally:
        release()  # never leave a blocked reader to the next test


def test_a_policy_naming_a_member_the_bundle_lacks_is_refused_at_load_and_reload(
    bundle_copy: Path, tmp_path: Path
):
    """A policy whose fusion named a member the bundle lacks loaded, and every scene then
    failed closed ("member_scores has no scores for fusion member(s)"); a reload swapped it in.
    It is refused where it is loaded (guard/policies check_policy_fits), the old one stays."""
    from spotstop.guard.policies import PolicyMismatchError

    doc = yaml.safe_load((bundle_copy / "policy.yaml").read_text())
    first = doc["fusion"]["members"][0]
    doc["fusion"]["members"][0] = first + "-typo"
    for key in ("stats", "weights"):
        if key in doc["fusion"]:
            doc["fusion"][key][first + "-typo"] = doc["fusion"][key].pop(first)
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with Guard(bundle_copy, log=tmp_path / "l.sqlite") as g:
        before = g.policy_config.version_id
        with pytest.raises(PolicyMismatchError, match="typo"):
            g.reload_policy(bad)
        assert g.policy_config.version_id == before
        assert not g.check(make_scene(1)).fail_closed
    (bundle_copy / "policy.yaml").write_text(bad.read_text())
    with pytest.raises(PolicyMismatchError, match="typo"):
        Guard(bundle_copy, log=tmp_path / "l2.sqlite")
