"""One guard call's pipeline: decode → score within the deadline → decide → records.

Private to :mod:`spotstop.guard._guard`. A :class:`Pipeline` holds what every call runs on
(the members, the bundle's identity, the image rules) and its two worker threads: the
members' scoring thread and the text detector's. What may change between calls comes in with
each call: the policy in force (:class:`~spotstop.guard._call._Active`: the policy and its
fusion, its live state, the passes to run, the text detector) and the call's
:class:`~spotstop.guard._call._Clock`, whose deadline bounds every stage. One call at a time:
the guard holds its lock around :meth:`Pipeline.run`.

It fails closed: a bad image or request, a member that failed to load or raised, a NaN or
infinite score, a scoring plan, fusion or policy fault, a text detector the policy needs but
cannot run or the deadline marks the scene's
:class:`~spotstop.guard._call._Work` with the first reason, and its record is a fail-closed
UNSAFE. The pipeline writes no log and no state file: :meth:`Pipeline.records` hands the rows
to the guard, whose log writer writes them before anything is answered, and then the guard
writes the policy's new state (a state file that cannot be written fails the call closed).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._call import (
    _Active,
    _Clock,
    _Outcome,
    _read_text,
    _reason,
    _Scored,
    _storable,
    _Work,
)
from spotstop.guard._errors import GuardError, ScoringError
from spotstop.guard._image import (
    DEFAULT_MIN_CONTRAST,
    DEFAULT_MIN_SIDE,
    DecodedImage,
    check_min_side,
    check_visible_content,
    decode_image,
    read_image_bytes,
)
from spotstop.guard._member import Member, score_problem
from spotstop.guard._record import DecisionRecord
from spotstop.guard._state import StateStore
from spotstop.guard._types import Scene, Variant
from spotstop.guard.cues._types import TextDetector
from spotstop.guard.policies import (
    PolicyConfig,
    ScoringPlan,
    SituationPolicy,
    batch_inputs,
    decide_batch,
)
from spotstop.guard.validate import situation_id_problem

__all__ = ["Pipeline", "situation_windows", "works_for"]


class _ReadTimeout(Exception):
    """An image file still being read when the call's deadline came."""


class _ReadsStalled(Exception):
    """Too many earlier reads of image files are still blocked to start another."""


#: reads of image files left blocked at a deadline (a FIFO without a writer, a stalled mount)
#: that may still hold their threads; past this many, a scene given as a path fails closed at
#: once instead of starting another reader thread, so a long stall cannot pile up threads
#: until the process can start none (each holds its stack)
MAX_STALLED_READS = 4


class _StalledReads:
    """How many abandoned reader threads are still blocked (one count per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0


_STALLED = _StalledReads()


def _read_in_time(source: Any, clock: _Clock) -> bytes:
    """:func:`read_image_bytes` of ``source``, a file read on its own thread within the call's
    deadline: a path that blocks (a FIFO without a writer, a stalled network mount) fails its
    scene closed in time (:class:`_ReadTimeout`) instead of holding the call past it. The
    thread is left to finish on its own; what it reads then is dropped. While
    :data:`MAX_STALLED_READS` such threads are still blocked, no other is started
    (:class:`_ReadsStalled`)."""
    if isinstance(source, bytes | bytearray | memoryview) or clock.remaining() is None:
        return read_image_bytes(source)
    box: list[bytes | BaseException] = []
    done = threading.Event()
    abandoned = False

    def read() -> None:
        nonlocal abandoned
        try:
            box.append(read_image_bytes(source))
        except BaseException as e:  # handed to the caller below
            box.append(e)
        finally:
            with _STALLED.lock:
                done.set()
                if abandoned:
                    _STALLED.n -= 1

    with _STALLED.lock:
        if _STALLED.n >= MAX_STALLED_READS:
            raise _ReadsStalled(_STALLED.n)
    threading.Thread(target=read, name="spotstop-image-read", daemon=True).start()
    if not done.wait(clock.remaining()):
        with _STALLED.lock:
            if not done.is_set():
                abandoned = True
                _STALLED.n += 1
        raise _ReadTimeout
    got = box[0]
    if isinstance(got, BaseException):
        raise got
    return got


def works_for(scenes: Sequence[Scene]) -> list[_Work]:
    """One :class:`_Work` per input, in order; anything but a Scene fails closed."""
    works = [_Work(s if isinstance(s, Scene) else Scene(None, "")) for s in scenes]
    for w, s in zip(works, scenes, strict=True):
        if not isinstance(s, Scene):
            w.fail_with(f"input: expected a Scene, got {type(s).__name__}")
    return works


def situation_windows(active: _Active) -> dict[str, int]:
    """Policy version → situation window, for the policies in force that keep one (the rows
    the log's retention must not move)."""
    todo = [active.cfg.policy]
    out: dict[str, int] = {}
    while todo:
        pol = todo.pop()
        if isinstance(pol, SituationPolicy):
            out[active.cfg.version_id] = max(out.get(active.cfg.version_id, 0), pol.window)
        todo.extend(pol.inner())
    return out


class Pipeline:
    """decode → score (members and text detector, within the deadline) → decide → records.

    members, member_errors: the loaded members by name and why the others failed to load;
        both are read at every call (not copied), and any member error fails every scene.
    member_names: the bundle's members, in its order (the columns of every record).
    bundle_id, prompt_hash, test_pair: the bundle's identity, stamped on every record.
    min_image_side: the smallest width and height of a scene image (pixels).
    min_image_contrast: the smallest :func:`~spotstop.guard._image.image_contrast` of a scene
        image (0: any); a frame below it shows nothing and fails closed.
    store_images: keep each scene's encoded image for the log.
    threads: CPU threads per member backend (passed to a claim reader built by
        :meth:`activate`).
    text_detector: the detector to use when a policy reads the text in the scene (None: the
        policy's own, built by :meth:`activate`).
    """

    def __init__(
        self,
        members: dict[str, Member],
        member_errors: Mapping[str, str],
        *,
        member_names: Sequence[str],
        bundle_id: str,
        prompt_hash: str,
        test_pair: bool = False,
        min_image_side: int = DEFAULT_MIN_SIDE,
        min_image_contrast: float = DEFAULT_MIN_CONTRAST,
        store_images: bool = False,
        threads: int | None = None,
        text_detector: TextDetector | None = None,
    ) -> None:
        self.members = members
        self.member_errors = member_errors
        self.member_names = tuple(member_names)
        self.bundle_id = bundle_id
        self.prompt_hash = prompt_hash
        self.test_pair = test_pair
        self.min_image_side = min_image_side
        self.min_image_contrast = min_image_contrast
        self.store_images = store_images
        self._threads = threads
        self._text_detector = text_detector
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotstop-score")
        # the text detector runs beside the members (its own thread), on the same deadline
        self._text_pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotstop-text")

    def close(self) -> None:
        """Stop the worker threads (a run in progress finishes in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._text_pool.shutdown(wait=False, cancel_futures=True)

    # -- the policy in force -----------------------------------------------------------------
    def activate(
        self, cfg: PolicyConfig, *, variants: Sequence[Variant], state_dir: Path | None
    ) -> _Active:
        """``cfg`` ready to run: its live state (from ``state_dir``), its log row, the passes
        (``variants`` plus those the policy reads) and its text detector (loaded now)."""
        extra = [v for v in cfg.variants_needed() if v not in variants]
        detector, detector_error = self._detector_for(cfg)
        return _Active(
            cfg=cfg,
            store=StateStore(cfg, state_dir),
            row=cfg.log_row(),
            variants=(*variants, *extra),  # type: ignore[arg-type]
            detector=detector,
            detector_error=detector_error,
        )

    def _detector_for(self, cfg: PolicyConfig) -> tuple[TextDetector | None, str | None]:
        """The text detector the policy asks for (loaded now), or why there is none."""
        text = cfg.text_in_scene
        if not text.detect:
            return None, None
        if self._text_detector is not None:
            return self._text_detector, None
        try:
            from spotstop.guard.cues import RapidOcrDetector

            lexicon = None
            if text.lexicon is not None:
                lex = Path(text.lexicon)
                lexicon = lex if lex.is_absolute() or cfg.base_dir is None else cfg.base_dir / lex
            reader = None
            if text.reader is not None:  # by name; a guard member is shared, not loaded twice
                from spotstop.guard.cues import claim_reader

                reader = claim_reader(
                    text.reader, lexicon=lexicon, members=self.members, threads=self._threads
                )
            return RapidOcrDetector(lexicon, reader=reader, threads=self._threads).load(), None
        except Exception as e:  # the policy asked for detection: without it, fail closed
            return None, _reason("text detector", e)

    # -- one call ----------------------------------------------------------------------------
    def run(self, works: list[_Work], active: _Active, clock: _Clock) -> list[_Outcome]:
        """Decode, score and decide ``works`` (in place: scores, latencies, the first fault)
        with ``active`` before ``clock``'s deadline; what the policy said of each, in order."""
        self.decode(works, clock)
        self.score_with_deadline(works, active, clock)
        return self.decide(works, active, clock)

    def decode(self, works: list[_Work], clock: _Clock) -> None:
        """Decode and check each scene's image and request; a bad one fails that scene."""
        for w in works:
            if w.fail:
                continue
            if clock.expired():
                w.fail_with(clock.reason("decoding"))
                continue
            t = time.perf_counter()
            try:
                problem = situation_id_problem(w.scene.situation_id)
                if problem is not None:  # it would key the windows, the state file, the log
                    raise GuardError(f"situation_id {problem}")
                img = w.scene.image
                if img is None:
                    raise GuardError("the scene has no image")
                if isinstance(img, DecodedImage):
                    check_min_side(img.width, img.height, self.min_image_side)
                    check_visible_content(img, self.min_image_contrast)
                    w.image = img
                else:
                    # read once: what is scored is what is stored and hashed, though the
                    # camera rewrites the file (or the caller the buffer) meanwhile
                    data = _read_in_time(img, clock)
                    w.image = decode_image(
                        data,
                        min_side=self.min_image_side,
                        min_contrast=self.min_image_contrast,
                    )
                    if self.store_images:
                        w.raw = data
                for m in self.members.values():
                    m.check_request(w.scene.request)  # one too long must not fail its batch
            except _ReadTimeout:
                w.fail_with(clock.reason("reading the image file"))
            except _ReadsStalled as e:
                w.fail_with(
                    f"input: {e.args[0]} earlier reads of image files are still blocked (a "
                    "FIFO without a writer, a stalled mount?); no other is started until they "
                    "end. Fix the image source, or pass the image as bytes."
                )
            except Exception as e:  # bad input fails this scene closed, not the batch
                w.fail_with(_reason("input", e))
            w.latency["decode_ms"] = (time.perf_counter() - t) * 1e3

    def score_with_deadline(self, works: list[_Work], active: _Active, clock: _Clock) -> None:
        """Score the scenes still live on the scoring thread (and read the text of every
        decoded scene on the text thread) and wait for both until the deadline; late results
        are dropped.

        The text is read even in a scene that failed closed for another reason (a member
        unavailable, a timeout while scoring, a bad request): its flags are a fact about the
        image that the deployment's cue rate needs, and a scene whose signs slow the reader
        down is the one a timeout would otherwise drop from that rate."""
        for name, err in self.member_errors.items():
            for w in works:
                w.fail_with(f"member {name} unavailable: {err}")
        if active.detector_error is not None:
            for w in works:
                w.fail_with(f"the policy reads the text in the scene, but {active.detector_error}")
        live = [w for w in works if not w.fail]
        if clock.expired():
            for w in live:
                w.fail_with(clock.reason("before scoring"))
            return
        fut = None
        if live:
            try:  # what the policy asks to be scored, from its state before this call
                plan = self.plan(active, live)
            except Exception as e:  # no plan, no scores: every scene fails closed
                for w in live:
                    w.fail_with(_reason("scoring plan", e))
            else:
                scenes = [Scene(w.image, w.scene.request, w.scene.situation_id) for w in live]
                fut = self._pool.submit(self.score, scenes, active.variants, plan)
        detector = active.detector
        readable = [] if detector is None else [w for w in works if w.image is not None]
        text_fut = None
        if detector is not None and readable:
            text_fut = self._text_pool.submit(_read_text, detector, [w.image for w in readable])
        if fut is not None:
            try:
                results = fut.result(timeout=clock.remaining())
            except cf.TimeoutError:
                fut.cancel()  # a running call cannot be cancelled; its results are dropped
                for w in live:
                    w.fail_with(clock.reason("scoring"))
            except Exception as e:  # any scoring fault fails the scenes closed
                for w in live:
                    w.fail_with(_reason("scoring", e))
            else:  # copied only when they came in time: an abandoned run writes nowhere
                for w, r in zip(live, results, strict=True):
                    w.scores.update(r.scores)
                    w.gray.update(r.gray)
                    w.text.update(r.text)
                    w.latency.update(r.latency)
                    w.ran = set(r.ran)
                    if r.fail is not None:
                        w.fail_with(r.fail)
        if text_fut is None:
            return
        try:  # (after a scoring timeout: only a reading already finished is taken)
            readings = text_fut.result(timeout=clock.remaining())
        except cf.TimeoutError:
            text_fut.cancel()
            for w in readable:
                w.fail_with(clock.reason("reading the text"))
        except Exception as e:  # the detection fault fails the scenes closed
            for w in readable:
                w.fail_with(_reason("text detector", e))
        else:
            for w, (reading, ms) in zip(readable, readings, strict=True):
                w.latency["text_ms"] = ms
                if isinstance(reading, str):
                    w.fail_with(reading)
                else:
                    w.reading = reading

    def plan(self, active: _Active, live: list[_Work]) -> ScoringPlan:
        """The policy's scoring plan for these scenes (built on the caller's thread from the
        state before this call), checked against the members the guard runs."""
        sids = [
            w.scene.situation_id if isinstance(w.scene.situation_id, str) else None for w in live
        ]
        members = tuple(self.members)
        plan = active.cfg.policy.scoring_plan(members, active.cfg.fusion, sids, active.store.state)
        if not isinstance(plan, ScoringPlan):
            raise GuardError(
                f"policy {active.cfg.kind!r} returned {type(plan).__name__}, not a ScoringPlan"
            )
        plan.check(members)
        return plan

    def score(
        self, scenes: list[Scene], variants: tuple[Variant, ...], plan: ScoringPlan
    ) -> list[_Scored]:
        """Run ``plan`` on ``scenes``: its stages in order, each stage's members (every
        variant) on the scenes the stage keeps. Runs on the scoring thread, touches no _Work.
        A stage whose choice of scenes fails fails every scene closed."""
        out = [_Scored() for _ in scenes]
        n = len(scenes)
        before: list[str] = []  # the members of the stages run so far
        for stage in plan.stages:
            idx = list(range(n))
            if stage.where is not None:
                sofar = {
                    m: np.array([r.scores.get(m, np.nan) for r in out], dtype=float) for m in before
                }
                try:
                    mask = np.asarray(stage.where(sofar), dtype=bool)
                    if mask.shape != (n,):
                        raise GuardError(
                            f"a stage chose scenes of shape {mask.shape} for {n} scenes"
                        )
                except Exception as e:  # the plan failed: every scene fails closed
                    for r in out:
                        r.fail_with(_reason("scoring plan", e))
                    return out
                idx = [i for i in range(n) if mask[i]]
            for name in stage.members:
                if idx:
                    self._score_member(name, [scenes[i] for i in idx], idx, variants, out)
            before.extend(stage.members)
        return out

    def _score_member(
        self,
        name: str,
        sub: list[Scene],
        idx: list[int],
        variants: tuple[Variant, ...],
        out: list[_Scored],
    ) -> None:
        """Every variant of member ``name`` on ``sub`` (the scenes at ``idx`` of ``out``)."""
        for i in idx:
            out[i].ran.add(name)
        for variant in variants:
            t = time.perf_counter()
            try:
                res = self.members[name].score(sub, variant, strict=False)
                if len(res) != len(sub):  # never a score on another scene's row
                    raise ScoringError(
                        f"it returned {len(res)} score(s) for {len(sub)} scene(s); a member "
                        "returns one score per scene, in order"
                    )
            except Exception as e:  # this member failed on this batch: fail those scenes
                for i in idx:
                    out[i].fail_with(_reason(f"member {name} ({variant})", e))
                continue
            dt = (time.perf_counter() - t) * 1e3 / max(1, len(sub))
            target = {"scene": "scores", "gray": "gray", "text": "text"}[variant]
            for i, s in zip(idx, res, strict=True):
                r = out[i]
                getattr(r, target)[name] = s.score
                r.latency[f"score_{name}_{variant}_ms"] = dt
                # every pass the guard runs is read by the policy or logged for the card: a
                # non-finite or out-of-range score from any of them fails the scene closed, as
                # a raise does (and so enters no batch statistic and no situation window)
                problem = score_problem(s.score)
                if problem is not None:
                    on = "" if variant == "scene" else f" on its {variant} pass"
                    r.fail_with(f"member {name} produced {problem}{on}")

    def decide(self, works: list[_Work], active: _Active, clock: _Clock) -> list[_Outcome]:
        """Fuse and label the batch with the active policy; commit the policy's new state."""
        t = time.perf_counter()
        cfg = active.cfg
        in_scene = cfg.text_in_scene
        for w in works:  # text in the scene: a flag can only make a decision fail closed
            if w.reading is None:
                continue
            for cue, flagged in w.reading.flags.items():
                if flagged and in_scene.action(cue) == "fail_closed":
                    said = ", ".join(repr(m.found) for m in w.reading.matches if m.cue == cue)
                    w.fail_with(
                        f"text in the scene: {cue} text {said} (policy text_in_scene.{cue}: "
                        "fail_closed)"
                    )
        # A scene that failed closed before the decision (a member or the text detector
        # failed, a flag above) enters the policy as missing: its scores move no batch
        # statistic and no situation window, and its logged policy_score is NaN
        # (policies.entered_scores reads that back from the log for the replay).
        failed = [w.fail is not None for w in works]
        members = {
            m: [
                np.nan if bad else w.scores.get(m, np.nan)
                for w, bad in zip(works, failed, strict=True)
            ]
            for m in self.member_names
        }
        text = None
        if "text" in active.variants:
            text = {
                m: [
                    np.nan if bad else w.text.get(m, np.nan)
                    for w, bad in zip(works, failed, strict=True)
                ]
                for m in self.member_names
            }
        sids = [  # a scene that failed closed keys no window (nor one its bad id would make)
            None if bad else w.scene.situation_id for w, bad in zip(works, failed, strict=True)
        ]
        # which members each scene was scored by: a cascade's band, chosen once by its plan
        ran = {m: [m in w.ran for w in works] for m in self.member_names}
        out = [_Outcome.none()] * len(works)
        try:
            x = batch_inputs(cfg.fusion, members, sids, text, ran)
        except Exception as e:  # fusion failed: every scene fails closed
            for w in works:
                w.fail_with(_reason("fusion", e))
            decided = None
        else:
            try:
                decided = decide_batch(cfg.policy, x, active.store.state)
            except Exception as e:  # the policy itself failed: every scene fails closed
                for w in works:
                    w.fail_with(_reason("policy", e))
                decided = None
        if decided is not None:
            # The scores are real observations whatever the clock says: the state moves on
            # (replaying the log gives the same windows). Its file is written by the guard
            # once the rows are logged, never before (Guard._persist_state).
            active.store.advance(decided.state)
            if clock.expired():  # a label reached after the deadline is not an answer
                for w in works:
                    w.fail_with(clock.reason("fusion and policy"))
            out = []
            for w, fused, v in zip(works, x.fused.tolist(), decided.verdicts, strict=True):
                if w.fail is None and v.fail_closed:
                    w.fail_with(f"policy: {v.detail}")
                out.append(
                    _Outcome(
                        v.label, fused, v.score, v.threshold, v.policy, v.detail, v.kind or None
                    )
                )
        dt = (time.perf_counter() - t) * 1e3 / max(1, len(works))
        for w in works:
            w.latency["decide_ms"] = dt
        return out

    # -- what the log gets -------------------------------------------------------------------
    def records(
        self, works: list[_Work], outcomes: list[_Outcome], active: _Active, *, t_start: float
    ) -> list[DecisionRecord]:
        """The call's rows, in order, as one batch (a fresh ``batch_id``); ``t_start`` is the
        call's entry on ``time.perf_counter`` (for ``total_ms``)."""
        for w in works:
            w.latency["total_ms"] = (time.perf_counter() - t_start) * 1e3
        batch_id = uuid.uuid4().hex
        out = []
        for w, o in zip(works, outcomes, strict=True):
            try:
                out.append(self.record(w, o, active, batch_id))
            except Exception as e:  # a field the log refuses: this scene's row says so, closed
                w.fail_with(_reason("record", e))
                out.append(self.record(w, _Outcome.none(), active, batch_id, bare=True))
        return out

    def record(
        self, w: _Work, o: _Outcome, active: _Active, batch_id: str, *, bare: bool = False
    ) -> DecisionRecord:
        """One scene's row: UNSAFE and fail-closed when anything failed on its way. ``bare``:
        the row of a scene whose full row the log refused: its text and id, no image facts,
        no scores (so nothing the caller passed can keep it out of the log)."""
        img = None if bare else w.image
        req = w.scene.request if isinstance(w.scene.request, str) else repr(w.scene.request)
        sid = w.scene.situation_id if isinstance(w.scene.situation_id, str) else None
        cfg = active.cfg
        nan = float("nan")
        return DecisionRecord(
            decision_id=w.decision_id,
            batch_id=batch_id,
            situation_id=None if sid is None else _storable(sid),
            request=_storable(req),
            image_sha256=img.sha256 if img else None,
            width=img.width if img else None,
            height=img.height if img else None,
            n_bytes=img.n_bytes if img else None,
            image_format=_storable(img.format) if img else None,
            member_scores={m: nan if bare else w.scores.get(m, nan) for m in self.member_names},
            member_scores_gray=dict(w.gray) if "gray" in active.variants and not bare else None,
            member_scores_text=dict(w.text) if "text" in active.variants and not bare else None,
            members_run={m: m in w.ran for m in self.member_names},
            fused_score=o.fused,
            policy_score=o.score,
            threshold=o.threshold,
            policy=o.rule or cfg.kind,
            policy_kind=cfg.kind,
            deciding_kind=o.kind,
            policy_version=cfg.version_id,
            fusion_key=cfg.fusion_key,
            label="UNSAFE" if w.fail else o.label,
            fail_closed=w.fail is not None,
            fail_reason=None if w.fail is None else _storable(w.fail),
            detail=None if o.detail is None else _storable(o.detail),
            cue_flags=None
            if w.reading is None or bare
            else {_storable(str(k)): v for k, v in w.reading.flags.items()},
            cue_text=None if w.reading is None or bare else _storable(w.reading.text),
            latency_ms={} if bare else dict(w.latency),
            bundle_id=self.bundle_id,
            prompt_hash=self.prompt_hash,
            test_pair=self.test_pair,
        )

    def images(
        self, works: list[_Work], records: list[DecisionRecord]
    ) -> list[bytes | None] | None:
        """The encoded images to keep beside ``records`` (None: the guard keeps none)."""
        if not self.store_images:
            return None
        return [w.raw if r.image_sha256 else None for w, r in zip(works, records, strict=True)]
