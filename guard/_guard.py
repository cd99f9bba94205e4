"""The guard: scene → member scores → Avg-2 fusion → policy → Decision → log.

It fails closed. Any error while decoding, scoring or fusing, a NaN or infinite score, a
member that failed to load, a deadline exceeded, or a log that cannot be written gives
UNSAFE with the reason in ``Decision.fail_reason``, never SAFE. A caller tells a fail-closed
UNSAFE from a scored one by ``Decision.fail_closed``. Every decision is written to the log
before it is returned; a decision whose log write failed is kept (in memory, then in the
journal: ``_log_writer.py``), written as soon as the log takes writes again, and returned as
a fail-closed UNSAFE (or, with ``require_logged=True``, raised as :class:`DecisionNotLogged`:
the sidecar answers 503 rather than a 200 that is not in the log). The wait for the log is
bounded by the call's deadline.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._bundle import Bundle, load_bundle
from spotstop.guard._call import (
    _UNSET,
    _Active,
    _Clock,
    _Outcome,
    _read_text,
    _reason,
    _Scored,
    _storable,
    _Unset,
    _Work,
)
from spotstop.guard._errors import GuardError
from spotstop.guard._image import DEFAULT_MIN_SIDE, DecodedImage, check_min_side, decode_image
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import RetentionResult
from spotstop.guard._log_writer import LogOptions, LogStatus, LogWriter
from spotstop.guard._member import Member, load_bundle_member
from spotstop.guard._record import Decision, DecisionRecord
from spotstop.guard._state import StateStore
from spotstop.guard._types import Scene, Variant
from spotstop.guard.cues._types import TextDetector
from spotstop.guard.policies import (
    PolicyConfig,
    ScoringPlan,
    SituationPolicy,
    batch_inputs,
    check_policy_matches,
    decide_batch,
    load_policy,
)

__all__ = ["Decision", "DecisionNotLogged", "Guard", "PolicyMissingError", "SituationInfo"]


class PolicyMissingError(GuardError, FileNotFoundError):
    """The bundle has no ``policy.yaml``."""


class DecisionNotLogged(GuardError, RuntimeError):
    """The call's decisions could not be written to the log within its deadline.

    Raised by :meth:`Guard.check_batch` with ``require_logged=True`` only (the sidecar: a 200
    must be a logged decision). ``decisions`` are what the call would have answered, each a
    fail-closed UNSAFE; ``reason`` says why the write failed. The rows are not lost: the
    guard keeps them (in memory, then in its journal) and writes them first on its next call
    (or :meth:`Guard.flush_pending`), as the fail-closed UNSAFE they are; :meth:`Guard.close`
    leaves what it could not write in the journal, which the next start imports. When the
    guard could not even keep them (memory at its bound and the journal unwritable) no
    decision was made: ``decisions`` are then unlogged (empty ``decision_id``).
    """

    def __init__(self, reason: str, decisions: list[Decision]) -> None:
        super().__init__(
            f"{reason}. No answer may be acknowledged: the {len(decisions)} decision(s) of "
            "this call are not in the log."
        )
        self.reason = reason
        self.decisions = decisions


@dataclass(frozen=True)
class SituationInfo:
    """What the guard knows of one situation: its reference scores and the next threshold.

    ``threshold`` is what a new scene of this situation would be compared with now (NaN when
    the fallback has no fixed threshold, e.g. ``direct``).
    """

    situation_id: str
    policy: str
    references: tuple[float, ...]
    rule: str
    threshold: float
    min_refs: int
    window: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "situation_id": self.situation_id,
            "policy": self.policy,
            "references": list(self.references),
            "n_references": len(self.references),
            "rule": self.rule,
            "threshold": self.threshold if np.isfinite(self.threshold) else None,
            "min_refs": self.min_refs,
            "window": self.window,
        }


class Guard:
    """Loads a bundle and answers ``check(scene)`` / ``check_batch(scenes)``.

    log: a :class:`DecisionLog`, a path for one, or None for the bundle's default
        (``<bundle>/decisions.sqlite``).
    deadline_s: wall-clock budget of one whole ``check_batch`` call; past it every scene of
        the call is UNSAFE (fail-closed, "deadline exceeded"). None = no deadline.
    variants: which passes to run: always ``scene``; ``gray`` and ``text`` add the
        content-free and request-only scores to the log (for diagnostics). Passes the policy
        reads (``text`` for ``batch`` with reliance weights) are added.
    state_dir: where the guard keeps the live state of a stateful policy (the situation
        windows), one file per policy version (default: ``state/`` next to the log). The
        guard owns this state; the policy file only holds its fitted starting value.
    store_images: also keep each scene's encoded image in the log (off by default; the log's
        size/age retention applies). Only used when ``log`` is a path.
    threads: CPU threads per member backend (None: the library default, all cores).
    text_detector: the text detector to use when the policy's ``text_in_scene.detect`` is on
        (default: :class:`~spotstop.guard.cues.RapidOcrDetector` with the policy's lexicon,
        built when the policy is loaded). A detector that cannot be built or fails on a scene
        makes those decisions fail-closed UNSAFE; a flag never makes a decision SAFE.
    backend: run every member on this backend instead of the one the manifest names, e.g.
        ``"tensorrt"`` (with ``device="cuda"``) for the engines built on the device from an
        exported bundle's graphs. A member that cannot load on it (library, GPU or engines
        missing) makes every decision a fail-closed UNSAFE that says why.
    min_image_side: the smallest width and height (pixels) of a scene image; a smaller one
        cannot show a scene and makes its decision a fail-closed UNSAFE (default 32).
    log_options: how the log is kept when it cannot be written and how big it may grow: the
        journal, the disk budget and the free-space floor (:class:`LogOptions`; its defaults
        are stated there).
    """

    def __init__(
        self,
        bundle: str | os.PathLike[str] | Bundle,
        *,
        log: DecisionLog | str | os.PathLike[str] | None = None,
        deadline_s: float | None = None,
        variants: Sequence[Variant] = ("scene",),
        state_dir: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        verify: bool = True,
        store_images: bool = False,
        threads: int | None = None,
        backend: str | None = None,
        text_detector: TextDetector | None = None,
        min_image_side: int = DEFAULT_MIN_SIDE,
        log_options: LogOptions | None = None,
    ) -> None:
        if (
            isinstance(min_image_side, bool)
            or not isinstance(min_image_side, int)
            or (min_image_side < 1)
        ):
            raise GuardError(
                f"min_image_side must be a positive int (pixels); got {min_image_side!r}."
            )
        self.min_image_side = min_image_side
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, verify=verify)
        if deadline_s is not None and not deadline_s > 0:
            raise GuardError(f"deadline_s must be > 0 or None; got {deadline_s!r}.")
        bad = [v for v in variants if v not in ("scene", "gray", "text")]
        if bad or "scene" not in variants:
            raise GuardError(
                f"variants must include 'scene' and only scene/gray/text; got {list(variants)}."
            )
        self._requested_variants: tuple[Variant, ...] = tuple(dict.fromkeys(variants))
        self._threads = threads
        self._text_detector = text_detector
        self.deadline_s = deadline_s
        self._member_names = tuple(m.name for m in self.bundle.members)
        self.members: dict[str, Member] = {}
        self.member_errors: dict[str, str] = {}
        for bm in self.bundle.members:
            try:
                self.members[bm.name] = load_bundle_member(
                    self.bundle, bm, device=device, threads=threads, backend=backend
                )
            except Exception as e:  # a member that cannot load makes every decision fail closed
                self.member_errors[bm.name] = _reason("load", e)
        self.store_images = store_images and not isinstance(log, DecisionLog)
        opts = log_options if log_options is not None else LogOptions()
        robot = opts.robot_id
        if isinstance(log, DecisionLog):
            self.log = log
            if robot is not None:
                log._claim_robot(robot)
        else:
            self.log = DecisionLog(
                log if log is not None else self.bundle.path / "decisions.sqlite",
                store_images=store_images,
                robot_id=robot,
                synchronous=opts.synchronous,
            )
        self.state_dir = (
            Path(state_dir) if state_dir is not None else self.log.path.parent / "state"
        )
        self._active = self._activate(self._load_policy(self.bundle.policy_path))
        self.policy_path = self.bundle.policy_path
        # writes the log, keeps what it cannot take yet (memory, journal), runs retention
        self._writer = LogWriter(self.log, log_options, windows=self._state_windows)
        self._lock = threading.Lock()  # one call at a time through decode → score → decide
        self._closed = False
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotstop-score")
        # the text detector runs beside the members (its own thread), on the same deadline
        self._text_pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotstop-text")

    # -- public ------------------------------------------------------------------------------
    @property
    def bundle_id(self) -> str:
        return self.bundle.bundle_id

    @property
    def ready(self) -> bool:
        """All members loaded (a guard that is not ready answers every scene UNSAFE)."""
        return not self.member_errors and len(self.members) == len(self.bundle.members)

    @property
    def policy_config(self) -> PolicyConfig:
        """The policy in force."""
        return self._active.cfg

    @property
    def variants(self) -> tuple[Variant, ...]:
        """The passes run per scene: those asked for, plus those the policy reads."""
        return self._active.variants

    def __repr__(self) -> str:
        state = "ready" if self.ready else f"NOT READY ({'; '.join(self.member_errors.values())})"
        cfg = self.policy_config
        return f"<Guard {self.bundle.bundle_id} policy={cfg.kind} {cfg.version_id} {state}>"

    def _load_policy(self, path: str | os.PathLike[str]) -> PolicyConfig:
        if not Path(path).is_file():
            raise PolicyMissingError(
                f"{path} does not exist: the bundle has no policy yet. Fit one on unlabelled "
                f"frames of the deployment with `spotstop policy init {self.bundle.path} --pool "
                "DIR --request TEXT`, or activate a stored version with `spotstop policy activate`."
            )
        cfg = load_policy(path)
        check_policy_matches(cfg, self.bundle.bundle_id, self.bundle.prompt_hash)
        return cfg

    def _activate(self, cfg: PolicyConfig) -> _Active:
        extra = [v for v in cfg.variants_needed() if v not in self._requested_variants]
        detector, detector_error = self._detector_for(cfg)
        return _Active(
            cfg=cfg,
            store=StateStore(cfg, self.state_dir),
            row=cfg.log_row(),
            variants=(*self._requested_variants, *extra),  # type: ignore[arg-type]
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

    def reload_policy(self, path: str | os.PathLike[str] | None = None) -> PolicyConfig:
        """Swap in a new policy file atomically, between two batches.

        The new file is loaded and checked (schema, bundle id, prompt hash, its state file)
        before the swap; if anything is wrong the old policy stays and the error is raised. A
        call in progress finishes with the old policy; the next one uses the new. Returns the
        new policy.
        """
        new = self._activate(
            self._load_policy(path if path is not None else self.bundle.policy_path)
        )
        with self._lock:
            self._active = new
            self.policy_path = Path(path) if path is not None else self.bundle.policy_path
        return new.cfg

    def situation(self, situation_id: str) -> SituationInfo:
        """The recentering state of one situation under the current policy."""
        active = self._active
        pol = active.cfg.policy
        if not isinstance(pol, SituationPolicy):
            return SituationInfo(situation_id, pol.kind, (), pol.kind, float("nan"), 0, 0)
        rule, thr, refs = pol.next_threshold(active.store.state, situation_id)
        return SituationInfo(situation_id, pol.kind, refs, rule, thr, pol.min_refs, pol.window)

    def check(
        self,
        scene: Scene,
        *,
        deadline_s: float | _Unset | None = _UNSET,
        require_logged: bool = False,
    ) -> Decision:
        """Judge one scene (see :meth:`check_batch`)."""
        return self.check_batch([scene], deadline_s=deadline_s, require_logged=require_logged)[0]

    def check_batch(
        self,
        scenes: Sequence[Scene],
        *,
        deadline_s: float | _Unset | None = _UNSET,
        require_logged: bool = False,
    ) -> list[Decision]:
        """Judge scenes together (one batch per member); one logged Decision per scene.

        ``deadline_s`` overrides the guard's deadline for this call (None: no deadline). The
        deadline bounds the whole call, from entry: waiting for another call to finish,
        decoding, scoring, fusion and the policy. Whatever is not done by then is a logged
        fail-closed UNSAFE ("deadline exceeded"); a scene the policy called SAFE after the
        deadline is UNSAFE too, and so is one whose log write finished after it (its row is
        amended to say so). A scoring call that overruns is abandoned, not killed: its thread
        finishes in the background, its late scores are discarded, and the next call waits
        for it (the members run one batch at a time), on that call's own budget.

        The log write waits for a busy log at most until the deadline. A call whose rows
        could not be written answers fail-closed UNSAFE and keeps the rows for the next write
        (``require_logged=False``, the library's default), or raises
        :class:`DecisionNotLogged` (``require_logged=True``: nothing is acknowledged before it
        is logged).
        """
        t_start = time.perf_counter()
        deadline = self.deadline_s if isinstance(deadline_s, _Unset) else deadline_s
        if deadline is not None and not deadline > 0:
            raise GuardError(f"deadline_s must be > 0 or None; got {deadline!r}.")
        clock = _Clock(deadline)
        if self._closed:
            raise GuardError("this guard is closed; make a new Guard to check scenes.")
        if not self._writer.accepting:
            # memory is at its bound and the journal took nothing: try the log once more
            with contextlib.suppress(GuardError):
                self._writer.flush(clock.remaining())
            if not self._writer.accepting:
                return self._refuse(scenes, require_logged)
        works = [_Work(s if isinstance(s, Scene) else Scene(None, "")) for s in scenes]
        for w, s in zip(works, scenes, strict=True):
            if not isinstance(s, Scene):
                w.fail_with(f"input: expected a Scene, got {type(s).__name__}")
        if not self._lock.acquire(timeout=clock.lock_timeout()):
            # Another call holds the guard past this call's deadline: answer without it.
            for w in works:
                w.fail_with(clock.reason("waiting for another call to finish"))
            active = self._active
            outcomes = [_Outcome.none()] * len(works)
            return self._write_log(works, outcomes, active, t_start, clock, require_logged)
        try:
            active = self._active
            self._decode(works, clock)
            self._score_with_deadline(works, active, clock)
            outcomes = self._decide(works, active, clock)
            return self._write_log(works, outcomes, active, t_start, clock, require_logged)
        finally:
            self._lock.release()

    @property
    def pending(self) -> int:
        """Decisions made but not yet in the log (in memory or in the journal)."""
        return self._writer.status().waiting_rows

    def log_status(self) -> LogStatus:
        """Where the decision log stands: writable or why not, what waits, what was archived."""
        return self._writer.status()

    def flush_pending(self, timeout_s: float | None = None) -> int:
        """Write the decisions that wait (journal first, then memory) and pending amendments
        now, or probe the log when nothing waits.

        Returns how many rows were written; raises :class:`~spotstop.guard.LogError` (its
        ``kind`` says why) when the log still cannot be written (they keep waiting).
        ``timeout_s`` bounds the wait for the log (None: the log's own timeout).
        """
        return self._writer.flush(timeout_s)

    def apply_retention(self) -> RetentionResult:
        """Run one retention pass now (the guard also runs them in the background when the
        log has a budget), never moving what the active policy's state needs."""
        return self._writer.apply_retention()

    def _state_windows(self) -> dict[str, int]:
        """Policy version → situation window, for the policies in force that keep one."""
        active = self._active
        todo = [active.cfg.policy]
        out: dict[str, int] = {}
        while todo:
            pol = todo.pop()
            if isinstance(pol, SituationPolicy):
                out[active.cfg.version_id] = max(out.get(active.cfg.version_id, 0), pol.window)
            todo.extend(pol.inner())
        return out

    def close(self) -> None:
        """Wait for a check in progress, stop the worker threads, write what waits (or leave
        it in the journal for the next start), close the log. Checking after this raises."""
        with self._lock:  # a check in flight finishes, and is logged or kept, first
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._text_pool.shutdown(wait=False, cancel_futures=True)
        self._writer.close()
        self.log.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refuse(self, scenes: Sequence[Scene], require_logged: bool) -> list[Decision]:
        """No decision at all: the log cannot be written, memory holds all it may, and the
        journal cannot take more. Each scene gets an unlogged fail-closed UNSAFE."""
        status = self._writer.status()
        reason = (
            f"no decision made: the decision log cannot be written ({status.reason}), "
            f"{status.pending_rows} waiting decisions fill the memory bound and the journal "
            f"{status.journal} cannot take more"
        )
        out = [
            Decision.unlogged(
                reason,
                made_by="guard",
                request=s.request if isinstance(s, Scene) and isinstance(s.request, str) else "",
                situation_id=s.situation_id
                if isinstance(s, Scene) and isinstance(s.situation_id, str)
                else None,
            )
            for s in scenes
        ]
        if require_logged:
            raise DecisionNotLogged(reason, out)
        return out

    # -- stages ------------------------------------------------------------------------------
    def _decode(self, works: list[_Work], clock: _Clock) -> None:
        for w in works:
            if w.fail:
                continue
            if clock.expired():
                w.fail_with(clock.reason("decoding"))
                continue
            t = time.perf_counter()
            try:
                img = w.scene.image
                if img is None:
                    raise GuardError("the scene has no image")
                if isinstance(img, DecodedImage):
                    check_min_side(img.width, img.height, self.min_image_side)
                    w.image = img
                else:
                    w.image = decode_image(img, min_side=self.min_image_side)
                if self.store_images and not isinstance(img, DecodedImage):
                    w.raw = (
                        bytes(img)
                        if isinstance(img, bytes | bytearray | memoryview)
                        else Path(img).read_bytes()
                    )
                for m in self.members.values():
                    m.encoder.check_request(w.scene.request)
            except Exception as e:  # bad input fails this scene closed, not the batch
                w.fail_with(_reason("input", e))
            w.latency["decode_ms"] = (time.perf_counter() - t) * 1e3

    def _score_with_deadline(self, works: list[_Work], active: _Active, clock: _Clock) -> None:
        for name, err in self.member_errors.items():
            for w in works:
                w.fail_with(f"member {name} unavailable: {err}")
        if active.detector_error is not None:
            for w in works:
                w.fail_with(f"the policy reads the text in the scene, but {active.detector_error}")
        live = [w for w in works if not w.fail]
        if not live:
            return
        if clock.expired():
            for w in live:
                w.fail_with(clock.reason("before scoring"))
            return
        try:  # what the policy asks to be scored, from its state before this call
            plan = self._plan(active, live)
        except Exception as e:  # no plan, no scores: every scene fails closed
            for w in live:
                w.fail_with(_reason("scoring plan", e))
            return
        scenes = [Scene(w.image, w.scene.request, w.scene.situation_id) for w in live]
        fut = self._pool.submit(self._score, scenes, active.variants, plan)
        text_fut = None
        if active.detector is not None:
            text_fut = self._text_pool.submit(_read_text, active.detector, [w.image for w in live])
        try:
            results = fut.result(timeout=clock.remaining())
            readings = None if text_fut is None else text_fut.result(timeout=clock.remaining())
        except cf.TimeoutError:
            for f in (fut, text_fut):
                if f is not None:
                    f.cancel()  # a running call cannot be cancelled; its results are dropped
            for w in live:
                w.fail_with(clock.reason("scoring" if not fut.done() else "reading the text"))
            return
        except Exception as e:  # any scoring or detection fault fails the scenes closed
            for w in live:
                w.fail_with(_reason("scoring", e))
            return
        # Results are copied only when they came in time: an abandoned run writes nowhere.
        for i, (w, r) in enumerate(zip(live, results, strict=True)):
            w.scores.update(r.scores)
            w.gray.update(r.gray)
            w.text.update(r.text)
            w.latency.update(r.latency)
            w.ran = set(r.ran)
            if r.fail is not None:
                w.fail_with(r.fail)
            if readings is not None:
                reading, ms = readings[i]
                w.latency["text_ms"] = ms
                if isinstance(reading, str):
                    w.fail_with(reading)
                else:
                    w.reading = reading

    def _plan(self, active: _Active, live: list[_Work]) -> ScoringPlan:
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

    def _score(
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
                if variant == "scene" and not np.isfinite(s.score):
                    r.fail_with(f"member {name} produced a non-finite score ({s.score})")

    def _decide(self, works: list[_Work], active: _Active, clock: _Clock) -> list[_Outcome]:
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
            for m in self.bundle_member_names
        }
        text = None
        if "text" in active.variants:
            text = {
                m: [
                    np.nan if bad else w.text.get(m, np.nan)
                    for w, bad in zip(works, failed, strict=True)
                ]
                for m in self.bundle_member_names
            }
        sids = [
            w.scene.situation_id if isinstance(w.scene.situation_id, str) else None for w in works
        ]
        out = [_Outcome.none()] * len(works)
        try:
            x = batch_inputs(cfg.fusion, members, sids, text)
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
            # (replaying the log gives the same windows).
            try:
                active.store.commit(decided.state)
            except Exception as e:  # the state file could not be written: fail closed
                for w in works:
                    w.fail_with(_reason("policy state", e))
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

    @property
    def bundle_member_names(self) -> tuple[str, ...]:
        return self._member_names

    def _record(self, w: _Work, o: _Outcome, active: _Active, batch_id: str) -> DecisionRecord:
        img = w.image
        req = w.scene.request if isinstance(w.scene.request, str) else repr(w.scene.request)
        sid = w.scene.situation_id if isinstance(w.scene.situation_id, str) else None
        cfg = active.cfg
        return DecisionRecord(
            decision_id=w.decision_id,
            batch_id=batch_id,
            situation_id=None if sid is None else _storable(sid),
            request=_storable(req),
            image_sha256=img.sha256 if img else None,
            width=img.width if img else None,
            height=img.height if img else None,
            n_bytes=img.n_bytes if img else None,
            image_format=img.format if img else None,
            member_scores={m: w.scores.get(m, float("nan")) for m in self.bundle_member_names},
            member_scores_gray=dict(w.gray) if "gray" in active.variants else None,
            member_scores_text=dict(w.text) if "text" in active.variants else None,
            members_run={m: m in w.ran for m in self.bundle_member_names},
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
            fail_reason=w.fail,
            detail=o.detail,
            cue_flags=None
            if w.reading is None
            else {str(k): v for k, v in w.reading.flags.items()},
            cue_text=None if w.reading is None else w.reading.text,
            latency_ms=dict(w.latency),
            bundle_id=self.bundle.bundle_id,
            prompt_hash=self.bundle.prompt_hash,
            test_pair=self.bundle.test_pair,
        )

    def _write_log(
        self,
        works: list[_Work],
        outcomes: list[_Outcome],
        active: _Active,
        t_start: float,
        clock: _Clock,
        require_logged: bool = False,
    ) -> list[Decision]:
        for w in works:
            w.latency["total_ms"] = (time.perf_counter() - t_start) * 1e3
        batch_id = uuid.uuid4().hex
        records = [
            self._record(w, o, active, batch_id) for w, o in zip(works, outcomes, strict=True)
        ]
        t = time.perf_counter()
        images = self._images(works, records)
        error = self._writer.write(
            records,
            images=images,
            policy=active.row,
            timeout_s=clock.remaining(),
            lock_timeout_s=clock.lock_timeout(),
        )
        if error is None:
            records = self._amend_late(records, clock)
        else:  # never SAFE without a log row; keep the rows for the next write
            records = [
                r
                if r.fail_closed
                else replace(r, label="UNSAFE", fail_closed=True, fail_reason=error)
                for r in records
            ]
            self._writer.keep(records, images=images, policy=active.row)
        log_ms = (time.perf_counter() - t) * 1e3
        out = [Decision.of(r, latency_ms={**r.latency_ms, "log_ms": log_ms}) for r in records]
        if error is not None and require_logged:
            raise DecisionNotLogged(error, out)
        return out

    def _images(
        self, works: list[_Work], records: list[DecisionRecord]
    ) -> list[bytes | None] | None:
        """The encoded images to keep beside ``records`` (None: the guard keeps none)."""
        if not self.store_images:
            return None
        return [w.raw if r.image_sha256 else None for w, r in zip(works, records, strict=True)]

    def _amend_late(self, records: list[DecisionRecord], clock: _Clock) -> list[DecisionRecord]:
        """SAFE rows whose write finished after the deadline become fail-closed UNSAFE.

        The row is amended in the log first (SAFE → UNSAFE only); if even that fails, the
        amendment is kept and retried before the next write, and the answer is UNSAFE anyway.
        """
        if not clock.expired():
            return records
        reason = clock.reason("writing the decision log")
        late = [r for r in records if r.label == "SAFE"]
        if not late:
            return records
        self._writer.amend_late([r.decision_id for r in late], reason)
        return [
            replace(r, label="UNSAFE", fail_closed=True, fail_reason=reason)
            if r.label == "SAFE"
            else r
            for r in records
        ]
