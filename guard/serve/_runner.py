"""The bounded queue in front of the models and the one thread that runs them.

Every guard call of the sidecar (checks, the warm-up) runs on one dedicated worker thread,
in arrival order, never on the event loop. Admission is counted in *scenes*: at most
``capacity`` scenes are admitted at once (the one running plus those waiting). A request
takes its place (a :class:`Ticket`) *before* its body is read and grows it to its number of
scenes once the body is parsed; one that does not fit is refused at once with
:class:`Overloaded` (503, ``Retry-After``), so the backlog, and the memory it holds, never
grows past ``capacity``.

Images are decoded on the model thread, one request at a time, just before that request's
guard call: at most one request's frames (``max_batch`` at most) are decoded at once, however
many requests are waiting.

Each HTTP request is its own guard call (no merging of requests into one batch: under the
``batch`` policy that would let one client's scenes move another's threshold).

The deadline covers a request from the moment its body is in (the upload has its own
timeout): when the worker picks a request up after its budget is spent, or its images took
the rest of it, no decision is made (503, ``deadline_exceeded_in_queue``); otherwise the
guard is given the remaining budget for its whole call (scoring, policy, log). A call whose
decisions cannot be logged within that budget is a 503 (``decision_not_logged``), never a
200: every 200 is a logged decision. The unlogged rows (fail-closed UNSAFE) are kept by the
guard (memory, then its journal) and written by the next call, or by the sidecar's log watch,
which retries the log every ``log_retry_s`` on this thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from spotstop.guard._call import MAX_DEADLINE_S
from spotstop.guard._guard import DecisionNotLogged, Guard
from spotstop.guard._record import Decision
from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER
from spotstop.guard.serve._errors import NotLogged, Overloaded
from spotstop.guard.serve._metrics import SidecarMetrics
from spotstop.guard.serve._parse import Limits, ParsedScene

__all__ = ["ModelRunner", "Ticket"]


class Ticket:
    """A request's places in the queue: taken before its body is read, grown to its number
    of scenes after parsing, released once (by the route if it never reached the models,
    else when its guard call ends)."""

    def __init__(self, runner: ModelRunner, n: int) -> None:
        self._runner = runner
        self.n = n
        self._released = False
        self.handed_over = False

    def grow_to(self, n: int) -> None:
        """Hold ``n`` places (refused with 503 when the extra ones do not fit)."""
        if n > self.n:
            self._runner._admit(n - self.n, shown=n)
            self.n = n

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._runner._release(self.n)


_T = TypeVar("_T")


class ModelRunner:
    """Runs guard calls on one worker thread behind a bounded, scene-counted queue."""

    def __init__(
        self,
        guard: Guard,
        *,
        capacity: int,
        deadline_s: float | None,
        metrics: SidecarMetrics,
    ) -> None:
        self.guard = guard
        self.capacity = capacity
        self.deadline_s = deadline_s
        self.metrics = metrics
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotstop-serve")
        self._lock = threading.Lock()
        self._depth = 0
        self._per_scene_s = 0.1  # running estimate of the service time, for Retry-After
        metrics.queue_capacity.set(capacity)
        metrics.queue_depth.set(0)

    @property
    def depth(self) -> int:
        """Scenes admitted and not yet finished."""
        return self._depth

    def retry_after_s(self) -> int:
        """Whole seconds after which the queue has likely drained (1 … 60)."""
        return int(min(60, max(1, math.ceil(max(1, self._depth) * self._per_scene_s))))

    def _full(self, n: int) -> Overloaded:
        self.metrics.queue_rejected.labels(reason="queue_full").inc()
        return Overloaded(
            f"the model queue is full ({self._depth} of {self.capacity} scenes admitted; this "
            f"request has {n}). No decision was made; treat it as UNSAFE and retry after the "
            "Retry-After delay.",
            retry_after_s=self.retry_after_s(),
        )

    def _admit(self, n: int, *, shown: int | None = None) -> None:
        with self._lock:
            if self._depth + n > self.capacity:
                raise self._full(n if shown is None else shown)
            self._depth += n
            self.metrics.queue_depth.set(self._depth)

    def reserve(self, n: int = 1) -> Ticket:
        """Take ``n`` places now (before the body is read), or raise :class:`Overloaded`."""
        self._admit(n)
        return Ticket(self, n)

    def _release(self, n: int) -> None:
        with self._lock:
            self._depth -= n
            self.metrics.queue_depth.set(self._depth)

    async def check(
        self,
        scenes: Sequence[ParsedScene],
        *,
        arrived: float,
        ticket: Ticket,
        limits: Limits,
        caller_due: float | None = None,
    ) -> list[Decision]:
        """Decode and judge ``scenes`` in one guard call on the model thread.

        ``arrived``: ``time.monotonic()`` when the body was in; ``ticket``: the request's
        places (grown to ``len(scenes)`` here; released when the call ends); ``caller_due``:
        the ``time.monotonic()`` after which the caller no longer waits (its budget header),
        or None. The call's deadline is the earlier of the sidecar's and the caller's.
        """
        ticket.grow_to(len(scenes))
        fut = self._executor.submit(self._run_check, list(scenes), arrived, limits, caller_due)
        ticket.handed_over = True
        fut.add_done_callback(lambda _f: ticket.release())
        waiting = asyncio.wrap_future(fut)
        left, whose = self._left(arrived, caller_due)
        if left is None:
            return await waiting
        try:  # the deadline bounds the wait in the queue too
            return await asyncio.wait_for(asyncio.shield(waiting), max(0.0, left))
        except TimeoutError:
            if fut.cancel():  # never started: nothing was judged, nothing logged
                raise self._spent(time.monotonic() - arrived, "was still queued", whose) from None
            # Started: the guard has the same deadline for its whole call, log included, so
            # the answer comes right after it (a late one is a logged fail-closed UNSAFE).
            # Waiting for it keeps the caller's answer and the log's row the same.
            return await waiting

    def _spent(self, waited: float, where: str, whose: str) -> Overloaded:
        self.metrics.queue_rejected.labels(reason="deadline_exceeded_in_queue").inc()
        return Overloaded(
            f"the request {where} {waited:.3g} s after its body was in, past {whose}. No "
            "decision was made; treat it as UNSAFE.",
            retry_after_s=self.retry_after_s(),
            code="deadline_exceeded_in_queue",
        )

    def _left(self, arrived: float, caller_due: float | None) -> tuple[float | None, str]:
        """Seconds left of the request's deadline (None: none) and whose deadline it is."""
        now = time.monotonic()
        left, whose = None, ""
        if self.deadline_s is not None:
            left, whose = arrived + self.deadline_s - now, f"its deadline of {self.deadline_s:g} s"
        if caller_due is not None and (left is None or caller_due - now < left):
            left, whose = caller_due - now, f"the caller's budget ({BUDGET_HEADER}, {DUE_HEADER})"
        if left is not None and left > MAX_DEADLINE_S:  # a due time far ahead: no tighter bound
            left, whose = MAX_DEADLINE_S, f"the guard's longest deadline ({MAX_DEADLINE_S:g} s)"
        return left, whose

    def _run_check(
        self,
        parsed: list[ParsedScene],
        arrived: float,
        limits: Limits,
        caller_due: float | None = None,
    ) -> list[Decision]:
        waited = time.monotonic() - arrived
        self.metrics.stage.labels(stage="queue_wait").observe(waited)
        left, whose = self._left(arrived, caller_due)
        if left is not None and left <= 0:
            raise self._spent(waited, "reached the models", whose)
        t = time.perf_counter()
        scenes = []
        for p in parsed:  # ImageInputError → 422, nothing logged
            left, whose = self._left(arrived, caller_due)
            if left is not None and left <= 0:  # checked between images, not after them all
                raise self._spent(time.monotonic() - arrived, "was decoding its images", whose)
            scenes.append(p.decode(limits))
        self.metrics.stage.labels(stage="image_decode").observe(time.perf_counter() - t)
        remaining, whose = self._left(arrived, caller_due)
        if remaining is not None and remaining <= 0:
            raise self._spent(time.monotonic() - arrived, "had its images decoded", whose)
        t = time.perf_counter()
        try:
            # The guard's deadline is the rest of this request's budget, log write included.
            decisions = self.guard.check_batch(scenes, deadline_s=remaining, require_logged=True)
        except DecisionNotLogged as e:
            self.metrics.not_logged.inc(len(scenes))
            raise NotLogged(
                f"the decision could not be logged within the deadline ({e.reason}). No "
                "decision was made; treat it as UNSAFE and retry after the Retry-After delay.",
                retry_after_s=self.retry_after_s(),
            ) from None
        per_scene = (time.perf_counter() - t) / max(1, len(scenes))
        self._per_scene_s = 0.8 * self._per_scene_s + 0.2 * per_scene
        self.metrics.observe_decisions(decisions)
        return decisions

    async def call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the model thread (between checks), outside the queue's count."""
        return await asyncio.wrap_future(self._executor.submit(fn))

    def shutdown(self) -> None:
        """Finish what was admitted, then stop the thread."""
        self._executor.shutdown(wait=True)
