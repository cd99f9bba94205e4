"""The guard's pipeline without a Guard: decode → score within the deadline → decide → records.

Members are fakes (no model, no bundle, no log): member ``a`` and ``b`` score the number at the
end of the request (``tests/_support/scoring_fakes.py``; NaN for a request that ends in
"fail"), fused with median 0 and IQR 1, so ``S`` is their mean; the policy is a frozen cut.
Each call's inputs are explicit: the policy in force (``Pipeline.activate``) and the clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from spotstop.guard import Scene
from spotstop.guard._call import _Clock
from spotstop.guard._pipeline import Pipeline, works_for
from spotstop.guard._record import DecisionRecord
from spotstop.guard.policies import BatchPolicy, FrozenPolicy, SituationPolicy

from tests._support.images import make_image_bytes
from tests._support.log_writer import BUNDLE, PROMPT, policy_config
from tests._support.scoring_fakes import RequestNumber
from tests._support.tolerance import SCHEDULING_SLACK_S


class _Encoder:
    """The one thing the pipeline asks of a member's prompt encoder: is the request text?"""

    def check_request(self, request: object) -> str:
        if not isinstance(request, str) or not request.strip():
            raise ValueError(f"request must be a non-empty string; got {request!r}")
        return request


class Numbers(RequestNumber):
    """A member whose score is the request's last number (NaN for "... fail")."""

    encoder = _Encoder()

    def check_request(self, request: str) -> None:
        """The encoder's rules; any length fits (no length buckets)."""
        self.encoder.check_request(request)


class Raising(Numbers):
    def score(self, scenes: Sequence[Scene], variant: str = "scene", **_: Any) -> list[Any]:
        raise RuntimeError("member broke")


class Blocking(Numbers):
    """Scores only once ``release`` is set (the scoring thread waits on it)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = threading.Event()
        self.entered = threading.Event()

    def score(self, scenes: Sequence[Scene], variant: str = "scene", **k: Any) -> list[Any]:
        self.entered.set()
        self.release.wait(10.0)
        return super().score(scenes, variant, **k)


def _scene(value: float | str, seed: int = 0, sit: str | None = None) -> Scene:
    return Scene(make_image_bytes(seed), f"pick up the knife {value}", sit)


def _pipeline(
    members: dict[str, Any],
    errors: dict[str, str] | None = None,
    names: Sequence[str] | None = None,
    **kw: Any,
) -> Pipeline:
    return Pipeline(
        members,
        errors if errors is not None else {},
        member_names=list(members) if names is None else names,
        bundle_id=BUNDLE,
        prompt_hash=PROMPT,
        **kw,
    )


def _run(
    pipe: Pipeline, scenes: Sequence[Any], *, t0: float = 0.0, deadline_s: float | None = None
) -> list[DecisionRecord]:
    """One call: the policy (a frozen cut ``t0``) and the clock passed in explicitly."""
    active = pipe.activate(
        policy_config(FrozenPolicy(threshold=t0)), variants=("scene",), state_dir=None
    )
    t_start = time.perf_counter()
    clock = _Clock(deadline_s)
    works = works_for(scenes)
    outcomes = pipe.run(works, active, clock)
    return pipe.records(works, outcomes, active, t_start=t_start)


def _assert_fail_closed(r: DecisionRecord, *needles: str) -> None:
    assert r.label == "UNSAFE" and r.fail_closed, r
    for n in needles:
        assert n in (r.fail_reason or ""), (n, r.fail_reason)


@pytest.fixture
def pipe() -> Any:
    p = _pipeline({"a": Numbers("a"), "b": Numbers("b")})
    yield p
    p.close()


def test_decisions_follow_the_inputs_in_order(pipe: Pipeline) -> None:
    values = [-3.0, 2.0, -1.0, 5.0, 0.0]  # S = the value; UNSAFE when S >= 0
    recs = _run(pipe, [_scene(v, seed=i) for i, v in enumerate(values)])
    assert [r.request for r in recs] == [f"pick up the knife {v}" for v in values]
    assert [r.label for r in recs] == ["SAFE", "UNSAFE", "SAFE", "UNSAFE", "UNSAFE"]
    assert [r.fused_score for r in recs] == values
    assert [r.member_scores for r in recs] == [{"a": v, "b": v} for v in values]
    assert not any(r.fail_closed for r in recs)
    assert all(r.members_run == {"a": True, "b": True} for r in recs)
    assert len({r.batch_id for r in recs}) == 1 and len({r.decision_id for r in recs}) == 5
    assert all(r.bundle_id == BUNDLE and r.prompt_hash == PROMPT for r in recs)
    assert all({"decode_ms", "decide_ms", "total_ms"} <= set(r.latency_ms) for r in recs)


def test_bad_inputs_fail_their_scene_only(pipe: Pipeline) -> None:
    scenes = [
        _scene(-1, seed=0),
        "not a scene",
        Scene(
            make_image_bytes(1, size=(8, 8)), "pick up the knife -1"
        ),  # smaller than the minimum side
        Scene(None, "pick up the knife -1"),
        _scene(-2, seed=2),
    ]
    recs = _run(pipe, scenes, t0=1e9)  # every scored scene is SAFE
    assert recs[0].label == "SAFE" and recs[4].label == "SAFE"
    _assert_fail_closed(recs[1], "input: expected a Scene, got str")
    _assert_fail_closed(recs[2], "input")
    _assert_fail_closed(recs[3], "input", "no image")


def test_a_nan_score_is_unsafe(pipe: Pipeline) -> None:
    recs = _run(pipe, [_scene(-1), _scene("fail", seed=1), _scene(-2, seed=2)], t0=1e9)
    assert recs[0].label == "SAFE" and recs[2].label == "SAFE"
    _assert_fail_closed(recs[1], "member a produced a non-finite score (nan)")
    # a scene that failed before the decision enters the policy as missing
    assert np.isnan(recs[1].policy_score)


class TextNaN(Numbers):
    """Finite on the scene pass, NaN on the request-only pass for a request ending in 1."""

    def score(self, scenes: Sequence[Scene], variant: str = "scene", **k: Any) -> list[Any]:
        out = super().score(scenes, variant, **k)
        if variant == "text":
            out = [replace(r, score=math.nan) if r.score == 1.5 else r for r in out]
        return out


def test_a_nan_score_on_the_text_pass_the_policy_reads_is_unsafe() -> None:
    """The batch rule's reliance weights read the request-only pass: a NaN there fails its
    scene closed (as a raise on that pass does), and never reaches the weights as a silent
    drop that leaves the scene SAFE."""
    pipe = _pipeline({"a": TextNaN("a"), "b": Numbers("b")})
    try:
        policy = BatchPolicy(fallback=FrozenPolicy(threshold=1e9), min_batch=2, weights="reliance")
        active = pipe.activate(policy_config(policy), variants=("scene",), state_dir=None)
        assert "text" in active.variants
        works = works_for([_scene(v, seed=i) for i, v in enumerate([-3.0, 1.0, -2.0, 4.0])])
        recs = pipe.records(works, pipe.run(works, active, _Clock(None)), active, t_start=0.0)
    finally:
        pipe.close()
    _assert_fail_closed(recs[1], "member a produced a non-finite score (nan) on its text pass")
    assert np.isnan(recs[1].policy_score)
    assert not any(r.fail_closed for i, r in enumerate(recs) if i != 1)
    # the other three refit the batch on their own, finite, text scores
    assert [r.member_scores_text["a"] for i, r in enumerate(recs) if i != 1] == [-2.5, -1.5, 4.5]


def test_a_member_exception_is_unsafe() -> None:
    pipe = _pipeline({"a": Numbers("a"), "b": Raising("b")})
    try:
        recs = _run(pipe, [_scene(-1), _scene(-2, seed=1)], t0=1e9)
    finally:
        pipe.close()
    for r in recs:
        _assert_fail_closed(r, "member b (scene): RuntimeError: member broke")
    # member a scored before b raised; its scores are logged, the decision is still UNSAFE
    assert [r.member_scores["a"] for r in recs] == [-1.0, -2.0]
    assert all(np.isnan(r.member_scores["b"]) for r in recs)


class Short(Numbers):
    """Returns one score fewer than it was given scenes."""

    def score(self, scenes: Sequence[Scene], variant: str = "scene", **k: Any) -> list[Any]:
        return super().score(scenes, variant, **k)[:-1]


def test_a_member_returning_too_few_scores_is_named() -> None:
    """A member that returns another number of scores than scenes fails the scenes it was given
    closed, and the reason names the member and the counts (not a bare zip error)."""
    pipe = _pipeline({"a": Numbers("a"), "b": Short("b")})
    try:
        recs = _run(pipe, [_scene(-1), _scene(-2, seed=1), _scene(-3, seed=2)], t0=1e9)
    finally:
        pipe.close()
    for r in recs:
        _assert_fail_closed(r, "member b (scene)", "2 score(s) for 3 scene(s)")
    assert all(np.isnan(r.member_scores["b"]) for r in recs)  # none was put on a wrong scene


def _run_policy(pipe: Pipeline, policy: Any, batches: Sequence[Sequence[Scene]]) -> list[Any]:
    """The batches, one call each, under one policy (its state kept in memory between them)."""
    active = pipe.activate(policy_config(policy), variants=("scene",), state_dir=None)
    out = []
    for scenes in batches:
        works = works_for(scenes)
        out.append(pipe.records(works, pipe.run(works, active, _Clock(None)), active, t_start=0.0))
    return out


@pytest.mark.parametrize("bad", [1e6, -1e6, 1e300])
def test_a_score_out_of_range_fails_its_scene_and_moves_no_other(pipe: Pipeline, bad: float):
    """A member score no log-probability ratio reaches (|s| > MAX_ABS_SCORE) is a broken pass:
    its scene fails closed like a NaN, so it enters no batch statistic. Taken as a score, one
    such scene lifted the batch mean above every other scene (all SAFE)."""
    policy = BatchPolicy(fallback=FrozenPolicy(threshold=1e9), min_batch=2)
    values = [-3.0, 2.0, -1.0]
    (recs,) = _run_policy(pipe, policy, [[_scene(v, seed=i) for i, v in enumerate([*values, bad])]])
    _assert_fail_closed(recs[3], "member a produced a score out of range")
    assert np.isnan(recs[3].policy_score)
    # the other three are the batch rule on their own: S_B = (v + 1) / 2.5, cut at its mean
    assert [r.label for r in recs[:3]] == ["SAFE", "UNSAFE", "SAFE"]
    assert not any(r.fail_closed for r in recs[:3])


def test_a_score_out_of_range_enters_no_situation_window(pipe: Pipeline) -> None:
    """One scene with a huge score must not lift its situation's threshold for the scenes
    after it (they would all be SAFE until it left the window)."""
    policy = SituationPolicy(window=8, min_refs=1, fallback=FrozenPolicy(threshold=0.0))
    first, second = _run_policy(pipe, policy, [[_scene(1e6, sit="k")], [_scene(2.0, sit="k")]])
    _assert_fail_closed(first[0], "out of range")
    assert second[0].label == "UNSAFE" and not second[0].fail_closed  # 2 ≥ the frozen cut 0
    assert second[0].policy == "situation->frozen"


def test_a_member_that_failed_to_load_is_unsafe() -> None:
    pipe = _pipeline({"a": Numbers("a")}, {"b": "load: OSError: no such file"}, names=("a", "b"))
    try:
        (rec,) = _run(pipe, [_scene(-1)], t0=1e9)
    finally:
        pipe.close()
    _assert_fail_closed(rec, "member b unavailable: load: OSError: no such file")


def test_a_deadline_that_expires_mid_scoring_is_unsafe() -> None:
    slow = Blocking("b")
    pipe = _pipeline({"a": Numbers("a"), "b": slow})
    deadline = 0.3
    try:
        t = time.perf_counter()
        recs = _run(pipe, [_scene(-1), _scene(-2, seed=1)], t0=1e9, deadline_s=deadline)
        took = time.perf_counter() - t
        assert slow.entered.is_set()  # the deadline passed while member b was scoring
        assert took < deadline + SCHEDULING_SLACK_S
        for r in recs:
            _assert_fail_closed(r, "deadline exceeded", f"{deadline:g} s (scoring)")
            # the abandoned run's scores are dropped, member a's too
            assert np.isnan(r.member_scores["a"]) and np.isnan(r.member_scores["b"])
    finally:
        slow.release.set()  # the abandoned run finishes; the next call waits for it
    (late,) = _run(pipe, [_scene(-3, seed=2)], t0=1e9, deadline_s=10.0)
    assert late.label == "SAFE" and not late.fail_closed
    pipe.close()


def test_a_deadline_spent_before_the_call_scores_nothing(pipe: Pipeline) -> None:
    clock = _Clock(1e-9)
    time.sleep(0.01)
    active = pipe.activate(
        policy_config(FrozenPolicy(threshold=1e9)), variants=("scene",), state_dir=None
    )
    works = works_for([_scene(-1)])
    (rec,) = pipe.records(works, pipe.run(works, active, clock), active, t_start=0.0)
    _assert_fail_closed(rec, "deadline exceeded", "(decoding)")


def test_stored_images_are_the_encoded_bytes() -> None:
    pipe = _pipeline({"a": Numbers("a"), "b": Numbers("b")}, store_images=True)
    active = pipe.activate(
        policy_config(FrozenPolicy(threshold=0.0)), variants=("scene",), state_dir=None
    )
    scenes = [_scene(-1), Scene(None, "pick up the knife 1")]
    works = works_for(scenes)
    recs = pipe.records(works, pipe.run(works, active, _Clock(None)), active, t_start=0.0)
    pipe.close()
    assert pipe.images(works, recs) == [scenes[0].image, None]
    other = _pipeline({})
    assert other.images(works, recs) is None
    other.close()
