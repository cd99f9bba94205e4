"""The guard: scene → member scores → Avg-2 fusion → policy → Decision → log.

:class:`Guard` is the public facade: it loads the bundle, its members and the policy, and
answers ``check``/``check_batch`` by running one call through the pipeline (``_pipeline.py``:
decode → score within the deadline → decide → records) and handing the rows to the log writer
(``_log_writer.py``) before it answers.

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

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._bundle import STATE_DIR, Bundle, load_bundle
from spotstop.guard._call import (
    _UNSET,
    _Active,
    _Clock,
    _Outcome,
    _reason,
    _Unset,
    _Work,
    check_deadline,
)
from spotstop.guard._errors import GuardError
from spotstop.guard._image import DEFAULT_MIN_CONTRAST, DEFAULT_MIN_SIDE, check_min_contrast
from spotstop.guard._log import DecisionLog
from spotstop.guard._log_archive import RetentionResult
from spotstop.guard._log_options import LogOptions, LogStatus
from spotstop.guard._log_writer import Committed, LogWriter
from spotstop.guard._member import Member, load_bundle_member
from spotstop.guard._pipeline import Pipeline, situation_windows, works_for
from spotstop.guard._record import Decision
from spotstop.guard._state import StateStore
from spotstop.guard._types import Scene, Variant
from spotstop.guard.cues._types import TextDetector
from spotstop.guard.policies import (
    CascadePolicy,
    PolicyConfig,
    PolicyError,
    SituationPolicy,
    check_policy_fits,
    check_policy_matches,
    load_policy,
)

__all__ = ["Decision", "DecisionNotLogged", "Guard", "PolicyMissingError", "SituationInfo"]

logger = logging.getLogger(__name__)

#: seconds before a member that failed to load is tried again (then twice as long each time)
DEFAULT_RETRY_LOAD_S = 5.0
#: the longest wait between two tries
MAX_RETRY_LOAD_S = 300.0


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
    the fallback has no fixed threshold, e.g. ``direct``). ``prior_weight`` /
    ``prior_threshold``: the pseudo-references the mean is shrunk towards (0 / NaN: none).
    """

    situation_id: str
    policy: str
    references: tuple[float, ...]
    rule: str
    threshold: float
    min_refs: int
    window: int
    prior_weight: float = 0.0
    prior_threshold: float = float("nan")

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
            "prior_weight": self.prior_weight,
            "prior_threshold": self.prior_threshold if np.isfinite(self.prior_threshold) else None,
        }


class Guard:
    """Loads a bundle and answers ``check(scene)`` / ``check_batch(scenes)``.

    log: a :class:`DecisionLog`, a path for one, or None for the bundle's default
        (``<bundle>/decisions.sqlite``). A log the guard opens commits with
        ``log_options.synchronous`` (FULL by default); a :class:`DecisionLog` given keeps the
        setting it was opened with (NORMAL by default).
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
    min_image_contrast: the smallest :func:`~spotstop.guard._image.image_contrast` of a scene
        image (levels 0..255; default 8, 0 turns the check off); a frame below it shows
        nothing (a covered lens, a frame blown out to white, a blank fill) and makes its
        decision a fail-closed UNSAFE instead of a judgement of the request alone.
    log_options: how the log is kept when it cannot be written and how big it may grow: the
        journal, the disk budget and the free-space floor (:class:`LogOptions`; its defaults
        are stated there).
    retry_load_s: a member that failed to load (a file not yet there, the GPU busy or out of
        memory at start) is loaded again in the background after this many seconds, then
        after twice as long each time, up to 5 minutes between tries, until it loads; the guard
        answers UNSAFE meanwhile and is ready once every member is loaded (between two calls:
        the policy is activated again, so a claim reader that is that member is built too).
        None: never try again (a new Guard is the only way back). Default 5.
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
        min_image_contrast: float = DEFAULT_MIN_CONTRAST,
        log_options: LogOptions | None = None,
        retry_load_s: float | None = DEFAULT_RETRY_LOAD_S,
    ) -> None:
        if retry_load_s is not None and (
            isinstance(retry_load_s, bool)
            or not isinstance(retry_load_s, int | float)
            or not 0 < retry_load_s < float("inf")
        ):
            raise GuardError(
                f"retry_load_s must be a positive number of seconds or None; got {retry_load_s!r}."
            )
        if (
            isinstance(min_image_side, bool)
            or not isinstance(min_image_side, int)
            or (min_image_side < 1)
        ):
            raise GuardError(
                f"min_image_side must be a positive int (pixels); got {min_image_side!r}."
            )
        min_image_contrast = check_min_contrast(min_image_contrast)
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, verify=verify)
        deadline_s = check_deadline(deadline_s)
        bad = [v for v in variants if v not in ("scene", "gray", "text")]
        if bad or "scene" not in variants:
            raise GuardError(
                f"variants must include 'scene' and only scene/gray/text; got {list(variants)}."
            )
        self._requested_variants: tuple[Variant, ...] = tuple(dict.fromkeys(variants))
        self.deadline_s = deadline_s
        self.members: dict[str, Member] = {}
        self.member_errors: dict[str, str] = {}
        self._load_member = functools.partial(
            load_bundle_member, self.bundle, device=device, threads=threads, backend=backend
        )
        for bm in self.bundle.members:
            try:
                self.members[bm.name] = self._load_member(bm)
            except Exception as e:  # a member that cannot load makes every decision fail closed
                self.member_errors[bm.name] = _reason("load", e)
        # decode → score → decide → records, with its scoring and text-detector threads
        self._pipeline = Pipeline(
            self.members,
            self.member_errors,
            member_names=[m.name for m in self.bundle.members],
            bundle_id=self.bundle.bundle_id,
            prompt_hash=self.bundle.prompt_hash,
            test_pair=self.bundle.test_pair,
            min_image_side=min_image_side,
            min_image_contrast=min_image_contrast,
            store_images=store_images and not isinstance(log, DecisionLog),
            threads=threads,
            text_detector=text_detector,
        )
        opts = log_options if log_options is not None else LogOptions()
        robot = opts.robot_id
        if isinstance(log, DecisionLog):
            self.log = log
            if robot is not None:
                log._claim_robot(robot)
            if log_options is not None and log.synchronous != opts.synchronous:
                warnings.warn(
                    f"log_options.synchronous is {opts.synchronous!r} but the DecisionLog given "
                    f"was opened with {log.synchronous!r}, which it keeps; open it with "
                    f"DecisionLog(..., synchronous={opts.synchronous!r}) or pass its path.",
                    stacklevel=2,
                )
        else:
            self.log = DecisionLog(
                log if log is not None else self.bundle.path / "decisions.sqlite",
                store_images=store_images,
                robot_id=robot,
                synchronous=opts.synchronous,
            )
        self.state_dir = (
            Path(state_dir) if state_dir is not None else self.log.path.parent / STATE_DIR
        )
        self._active = self._activate(self._load_policy(self.bundle.policy_path))
        self.policy_path = self.bundle.policy_path
        # writes the log, keeps what it cannot take yet (memory, journal), runs retention
        self._writer = LogWriter(
            self.log, log_options, windows=lambda: situation_windows(self._active)
        )
        self._lock = threading.Lock()  # one call at a time through decode → score → decide
        self._closed = False
        # calls between their entry and their answer: close() waits for them all, also for one
        # that timed out waiting for the lock and answers (and logs) without it
        self._calls = 0
        self._calls_done = threading.Condition()
        # members that failed to load are tried again in the background until they load
        self._stop = threading.Event()
        self._retry: threading.Thread | None = None
        self._reload_lock = threading.Lock()  # one reload at a time: the last file read wins
        if (self.member_errors or self._active.detector_error is not None) and (
            retry_load_s is not None
        ):
            self._retry = threading.Thread(
                target=self._retry_members,
                args=(float(retry_load_s),),
                name="spotstop-member-retry",
                daemon=True,
            )
            self._retry.start()

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
    def text_detector_error(self) -> str | None:
        """Why the text detector the policy asks for is missing (every check then fails
        closed; the guard keeps trying to build it), or None."""
        return self._active.detector_error

    @property
    def variants(self) -> tuple[Variant, ...]:
        """The passes run per scene: those asked for, plus those the policy reads."""
        return self._active.variants

    @property
    def bundle_member_names(self) -> tuple[str, ...]:
        """The bundle's members, in its order."""
        return self._pipeline.member_names

    @property
    def min_image_side(self) -> int:
        """The smallest width and height (pixels) of a scene image."""
        return self._pipeline.min_image_side

    @property
    def min_image_contrast(self) -> float:
        """The smallest :func:`~spotstop.guard._image.image_contrast` of a scene image."""
        return self._pipeline.min_image_contrast

    @property
    def store_images(self) -> bool:
        """Whether each scene's encoded image is kept in the log."""
        return self._pipeline.store_images

    def __repr__(self) -> str:
        state = (
            "ready" if self.ready else f"NOT READY ({'; '.join(dict(self.member_errors).values())})"
        )
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
        check_policy_fits(cfg, [m.name for m in self.bundle.members], cfg.base_dir)
        return cfg

    def _activate(self, cfg: PolicyConfig) -> _Active:
        return self._pipeline.activate(
            cfg, variants=self._requested_variants, state_dir=self.state_dir
        )

    def reload_policy(self, path: str | os.PathLike[str] | None = None) -> PolicyConfig:
        """Swap in a new policy file atomically, between two batches.

        The new file is loaded and checked (schema, bundle id, prompt hash, its state file,
        the text detector it asks for) before the swap; if anything is wrong the old policy
        stays and the error is raised. A call in progress finishes with the old policy; the
        next one uses the new. Reloads run one at a time, so the file read last is the one in
        force. Returns the new policy.
        """
        with self._reload_lock:
            new = self._activate(  # loaded and checked (its state file too) outside the lock
                self._load_policy(path if path is not None else self.bundle.policy_path)
            )
            if new.detector_error is not None:
                raise PolicyError(
                    f"the new policy reads the text in the scene, but {new.detector_error}; "
                    f"the policy in force ({self._active.cfg.version_id}) stays. Fix its "
                    "text_in_scene (lexicon, reader) or the OCR install, then reload again."
                )
            with self._lock:
                # The live state is taken under the lock, after a call in flight committed
                # its windows: the same version keeps its store (reading the file earlier
                # would drop that call's scores); another version reads its file now.
                old = self._active
                same = old.cfg.version_id == new.cfg.version_id
                store = old.store if same else StateStore(new.cfg, self.state_dir)
                new = dataclasses.replace(new, store=store)
                self._active = new
                self.policy_path = Path(path) if path is not None else self.bundle.policy_path
            if not same:
                _flush(old.store)  # a failed write of the version left behind, if any
        return new.cfg

    def _retry_members(self, wait_s: float) -> None:
        """Load again each member that failed to, after ``wait_s``, then twice as long each
        time (at most :data:`MAX_RETRY_LOAD_S`), until every one has loaded or the guard is
        closed. A member is loaded without the guard's lock (it may take long) and put in
        between two calls, with the policy activated again (its claim reader may be it). A
        text detector the policy asks for that failed to build is built again on the same
        schedule, until it builds."""
        while (
            self.member_errors or self._active.detector_error is not None
        ) and not self._stop.wait(wait_s):
            loaded: dict[str, Member] = {}
            for bm in self.bundle.members:
                if bm.name not in self.member_errors:
                    continue
                try:
                    loaded[bm.name] = self._load_member(bm)
                except Exception as e:  # still failing: say the latest reason
                    self.member_errors[bm.name] = _reason("load", e)
            if loaded:
                with self._lock:
                    if self._closed:
                        return
                    for name, member in loaded.items():
                        self.members[name] = member
                        del self.member_errors[name]
            old = self._active
            if old.detector_error is not None:  # its claim reader may be that member, or the
                with contextlib.suppress(Exception):  # OCR failed to load; else it stays
                    new = self._activate(old.cfg)  # outside the lock: it loads the OCR
                    with self._lock:
                        if self._active is old and not self._closed:
                            self._active = dataclasses.replace(new, store=old.store)
            wait_s = min(2.0 * wait_s, MAX_RETRY_LOAD_S)

    def situation(self, situation_id: str) -> SituationInfo:
        """The recentering state of one situation under the current policy: the ``situation``
        kind's, or a cascade's whose cut is one (its state is the cut's; the threshold is then
        what the cascade's score ``C`` of a new scene would meet)."""
        active = self._active
        top = active.cfg.policy
        pol = top.cut if isinstance(top, CascadePolicy) else top
        if not isinstance(pol, SituationPolicy):
            return SituationInfo(situation_id, top.kind, (), top.kind, float("nan"), 0, 0)
        rule, thr, refs = pol.next_threshold(active.store.state, situation_id)
        if pol is not top:
            rule = f"{top.kind}->{rule}"
        prior = pol.prior_threshold if pol.prior_threshold is not None else float("nan")
        return SituationInfo(
            situation_id,
            top.kind,
            refs,
            rule,
            thr,
            pol.min_refs,
            pol.window,
            pol.prior_weight,
            prior,
        )

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
        deadline = self.deadline_s if isinstance(deadline_s, _Unset) else check_deadline(deadline_s)
        clock = _Clock(deadline)
        if isinstance(scenes, Scene | str | bytes) or not isinstance(scenes, Iterable):
            raise GuardError(
                f"scenes must be a list of Scene; got {type(scenes).__name__}. Judge one scene "
                "with check(scene)."
            )
        scenes = list(scenes)  # a generator is read once, here
        with self._calls_done:
            if self._closed:
                raise GuardError("this guard is closed; make a new Guard to check scenes.")
            self._calls += 1
        try:
            return self._check_batch(scenes, clock, t_start, require_logged)
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()

    def _check_batch(
        self, scenes: list[Scene], clock: _Clock, t_start: float, require_logged: bool
    ) -> list[Decision]:
        if not self._writer.accepting:
            # memory is at its bound and the journal took nothing: try the log once more
            with contextlib.suppress(GuardError):
                self._writer.flush(clock.remaining())
            if not self._writer.accepting:
                return self._refuse(scenes, require_logged)
        works = works_for(scenes)
        if not self._lock.acquire(timeout=clock.lock_timeout()):
            # Another call holds the guard past this call's deadline: answer without it.
            for w in works:
                w.fail_with(clock.reason("waiting for another call to finish"))
            outcomes = [_Outcome.none()] * len(works)
            return self._answer(works, outcomes, self._active, t_start, clock, require_logged)
        try:
            if self._closed:  # closed while this call waited for the lock: nothing was decided
                raise GuardError("this guard was closed while the call waited; nothing was judged.")
            active = self._active
            outcomes = self._pipeline.run(works, active, clock)
            return self._answer(
                works, outcomes, active, t_start, clock, require_logged, persist=True
            )
        finally:
            self._lock.release()

    def _answer(
        self,
        works: list[_Work],
        outcomes: list[_Outcome],
        active: _Active,
        t_start: float,
        clock: _Clock,
        require_logged: bool,
        *,
        persist: bool = False,
    ) -> list[Decision]:
        """The call's decisions, once the log writer has written (or kept) their rows: a row
        not in the log is answered fail-closed UNSAFE, or raised with ``require_logged``.
        ``persist``: then write the policy's state, which the call moved (never before the
        rows: :meth:`_persist_state`)."""
        records = self._pipeline.records(works, outcomes, active, t_start=t_start)
        t = time.perf_counter()
        images = self._pipeline.images(works, records)
        done = self._writer.commit(records, images=images, policy=active.row, clock=clock)
        if persist:
            done = self._persist_state(active, done, clock)
        log_ms = (time.perf_counter() - t) * 1e3
        out = [Decision.of(r, latency_ms={**r.latency_ms, "log_ms": log_ms}) for r in done.records]
        if done.error is not None and require_logged:
            raise DecisionNotLogged(done.error, out)
        return out

    def _persist_state(self, active: _Active, done: Committed, clock: _Clock) -> Committed:
        """Write the policy's state file after the call's rows are in the log (or kept for
        it), so that a crash between the two leaves the file behind the log, never holding
        scores of decisions the log never got. A write that fails, or ends past the
        deadline, makes the call's SAFE decisions fail-closed UNSAFE, amended in the log as a
        late write's are (the windows keep the scores all the same; the next call, a switch
        of version or close writes them). Rows the log did not take (kept for the next
        write, answered UNSAFE) leave the file as it is: the next call that logs writes it."""
        if done.error is not None:
            return done
        try:
            active.store.flush()
        except Exception as e:  # the state file could not be written: fail closed
            reason = _reason("policy state", e)
        else:
            if not clock.expired():
                return done
            reason = clock.reason("writing the policy state")
        safe = [r.decision_id for r in done.records if r.label == "SAFE"]
        if not safe:
            return done
        kept = self._writer.amend_late(safe, reason, timeout_s=clock.remaining())
        records = [
            dataclasses.replace(r, label="UNSAFE", fail_closed=True, fail_reason=reason)
            if r.label == "SAFE"
            else r
            for r in done.records
        ]
        error = None
        if not kept:
            error = (
                "decision log: the row of a decision whose policy state could not be written "
                "still says SAFE; its fail-closed amendment could not be written to the log or "
                "the journal and waits in memory"
            )
        return Committed(records, error)

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

    def close(self) -> None:
        """Wait for a check in progress, stop the worker threads, write what waits (or leave
        it in the journal for the next start), close the log. Checking after this raises."""
        # a check in flight finishes, and is logged or kept, first
        with self._lock, self._calls_done:
            if self._closed:
                return
            self._closed = True
        self._stop.set()  # a member loading in the background is dropped when it is done
        with self._calls_done:  # and so does one answering without the lock (past its wait)
            self._calls_done.wait_for(lambda: self._calls == 0)
        self._pipeline.close()
        _flush(self._active.store)
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


def _flush(store: StateStore) -> None:
    """Write a state store the file is behind (a failed write); a failure is logged, and the
    windows then restart from the older file (the log still holds every decision)."""
    try:
        store.flush()
    except Exception as e:
        logger.warning("the policy state %s could not be written: %s", store.path, e)
