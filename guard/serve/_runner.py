"""The bounded queue in front of the models and the one thread that runs them.

Every guard call of the sidecar (checks, the warm-up) runs on one dedicated worker thread,
in arrival order, never on the event loop. Admission is counted in *scenes*: at most
``capacity`` scenes are admitted at once (the one running plus those waiting). A request
that does not fit is refused at once with :class:`Overloaded` (503, ``Retry-After``) —
the backlog never grows past ``capacity``.

Each HTTP request is its own guard call (no merging of requests into one batch: under the
``batch`` policy that would let one client's scenes move another's threshold).

The deadline covers a request from its arrival: when the worker picks a request up after
its budget is spent, no decision is made (503, ``deadline_exceeded_in_queue``); otherwise
the guard is given the remaining budget as its scoring deadline, and a scoring run that
overruns it ends in a logged fail-closed UNSAFE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from spotstop.guard._guard import Guard
from spotstop.guard._record import Decision
from spotstop.guard._types import Scene
from spotstop.guard.serve._errors import Overloaded
from spotstop.guard.serve._metrics import SidecarMetrics

__all__ = ["ModelRunner"]

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

    def precheck(self, n: int) -> None:
        """Refuse early (before parsing the body) when ``n`` scenes would not fit now."""
        if self._depth + n > self.capacity:
            raise self._full(n)

    def _admit(self, n: int) -> None:
        with self._lock:
            if self._depth + n > self.capacity:
                raise self._full(n)
            self._depth += n
            self.metrics.queue_depth.set(self._depth)

    def _release(self, n: int) -> None:
        with self._lock:
            self._depth -= n
            self.metrics.queue_depth.set(self._depth)

    async def check(self, scenes: Sequence[Scene], *, arrived: float) -> list[Decision]:
        """Judge ``scenes`` in one guard call; ``arrived`` is ``time.monotonic()`` at arrival."""
        n = len(scenes)
        self._admit(n)
        try:
            fut = self._executor.submit(self._run_check, list(scenes), arrived)
        except BaseException:
            self._release(n)
            raise
        fut.add_done_callback(lambda _f: self._release(n))
        return await asyncio.wrap_future(fut)

    def _run_check(self, scenes: list[Scene], arrived: float) -> list[Decision]:
        waited = time.monotonic() - arrived
        self.metrics.stage.labels(stage="queue_wait").observe(waited)
        if self.deadline_s is not None:
            remaining = self.deadline_s - waited
            if remaining <= 0:
                self.metrics.queue_rejected.labels(reason="deadline_exceeded_in_queue").inc()
                raise Overloaded(
                    f"the request waited {waited:.3g} s for the models, past its deadline of "
                    f"{self.deadline_s:g} s. No decision was made; treat it as UNSAFE.",
                    retry_after_s=self.retry_after_s(),
                    code="deadline_exceeded_in_queue",
                )
        t = time.perf_counter()
        # The guard's scoring deadline is the rest of this request's budget.
        decisions = self.guard.check_batch(
            scenes, deadline_s=None if self.deadline_s is None else remaining
        )
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
