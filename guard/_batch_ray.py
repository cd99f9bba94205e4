"""The ``ray`` scoring engine: Ray Data ``map_batches`` with one member per actor.

Imported only when ``--ray`` (or ``get_engine("ray")``) asks for it: it imports Ray at the
top, so a missing ``ray`` extra raises its ImportError here, which the CLI turns into the
install hint. For each member, the scene indices become a Ray Data dataset (one block per
chunk of scenes); ``map_batches`` runs :class:`_MemberActor` on a pool of ``actors`` actors,
each of which loads the ONE member and builds the scenes of the chunks it is given (reading
or rendering them where it runs); the scores come back with their indices and are joined in
input order. The members are scored one after another, each on the whole pool.

On a cluster every node must see the member folders and the scenes' images at the same
paths (a shared filesystem), and run the same spotstop; a scene table refuses an image
whose bytes differ from those read on the driver, and a member whose actors report different
prompt hashes is an error.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray
import ray.data
from numpy.typing import NDArray
from spotstop.guard._batch import (
    BatchScores,
    MemberRef,
    MemberRun,
    SceneSource,
    Scorer,
    check_chunk_size,
    progress_bar,
    score_chunk,
)
from spotstop.guard._errors import ConfigError, GuardError, ScoringError
from spotstop.guard._types import Variant

__all__ = ["RayEngine", "connect_ray"]


def connect_ray(address: str | None = None) -> None:
    """Connect this process to Ray unless it is connected: ``address`` as :class:`RayEngine`
    takes it (None: ``$RAY_ADDRESS`` if set, else a new local Ray; ``"auto"``;
    ``"ray://HOST:10001"``). A process already connected to Ray is left as it is."""
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)


class _MemberActor:
    """One Ray Data actor: loads one member once, then scores the chunks it is given."""

    def __init__(
        self, load: Callable[[], Scorer], source: SceneSource, variants: Sequence[Variant]
    ) -> None:
        self.scorer = load()
        self.source = source
        self.variants = tuple(variants)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = np.asarray(batch["data"], dtype=np.int64)
        k = len(ids)
        t0 = time.perf_counter()
        scenes = self.source.scenes(ids.tolist())
        scene_s = time.perf_counter() - t0
        chunk = score_chunk(self.scorer, scenes, self.variants)
        out = {"index": ids, **{f"score_{v}": chunk.scores[v] for v in self.variants}}
        out["prompt_hash"] = np.array([chunk.prompt_hash] * k)
        out["test_pair"] = np.full(k, chunk.test_pair)
        out["seconds"] = np.full(k, chunk.seconds / k)
        out["scene_seconds"] = np.full(k, scene_s / k)
        return out


#: how many times a dead scoring actor is restarted and its chunk tried again
RAY_RETRIES = 3


def _check_settings(
    address: str | None,
    actors: int | None,
    cpus_per_actor: float,
    gpus_per_actor: float,
    chunk_size: int,
) -> None:
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"the Ray address must be a string or None; got {address!r}.")
    if actors is not None and (
        isinstance(actors, bool) or not isinstance(actors, int) or actors < 1
    ):
        raise ConfigError(
            f"actors must be a positive integer (or None: as many as the cluster's CPUs "
            f"hold); got {actors!r}."
        )
    if isinstance(cpus_per_actor, bool) or not cpus_per_actor > 0:
        raise ConfigError(f"cpus_per_actor must be > 0; got {cpus_per_actor!r}.")
    if isinstance(gpus_per_actor, bool) or not gpus_per_actor >= 0:
        raise ConfigError(f"gpus_per_actor must be >= 0; got {gpus_per_actor!r}.")
    check_chunk_size(chunk_size)


class RayEngine:
    """Score on a Ray cluster.

    address: what :func:`ray.init` connects to: None (``$RAY_ADDRESS`` if set, else a new
    local Ray), ``"auto"`` (the cluster ``ray start --head`` started on this machine) or
    ``"ray://HOST:10001"`` (Ray Client). A process already connected to Ray is used as it
    is, and left connected. actors: actors per member (default: the cluster's CPUs divided
    by ``cpus_per_actor``). cpus_per_actor: CPUs Ray reserves for each actor (give the
    member as many threads). gpus_per_actor: GPUs Ray reserves for each actor (a member on
    ``cuda`` needs one, or a share). chunk_size: scenes per ``map_batches`` batch.
    """

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        actors: int | None = None,
        cpus_per_actor: float = 1.0,
        gpus_per_actor: float = 0.0,
        chunk_size: int = 16,
    ) -> None:
        _check_settings(address, actors, cpus_per_actor, gpus_per_actor, chunk_size)
        self.address = address
        self.actors = actors
        self.cpus_per_actor = cpus_per_actor
        self.gpus_per_actor = gpus_per_actor
        self.chunk_size = chunk_size

    def __repr__(self) -> str:
        return (
            f"RayEngine(address={self.address!r}, actors={self.actors}, "
            f"cpus_per_actor={self.cpus_per_actor}, gpus_per_actor={self.gpus_per_actor}, "
            f"chunk_size={self.chunk_size})"
        )

    def connect(self) -> int:
        """Connect to Ray unless connected; the number of actors a member gets."""
        connect_ray(self.address)
        if self.actors is not None:
            return self.actors
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        return max(1, int(cpus // self.cpus_per_actor))

    def run(
        self,
        source: SceneSource,
        members: Sequence[MemberRef],
        variants: Sequence[Variant],
        *,
        progress: bool = False,
    ) -> BatchScores:
        t_start = time.perf_counter()
        actors = self.connect()
        n = len(source)
        bar = progress_bar(n * len(members), progress)
        runs: dict[str, MemberRun] = {}
        scene_s = 0.0
        try:
            for ref in members:
                run, s = self._score_member(source, ref, tuple(variants), actors, bar)
                runs[ref.name] = run
                scene_s += s
        finally:
            if bar is not None:
                bar.close()
        return BatchScores(
            n, tuple(variants), runs, self.name, time.perf_counter() - t_start, scene_s
        )

    def _score_member(
        self,
        source: SceneSource,
        ref: MemberRef,
        variants: tuple[Variant, ...],
        actors: int,
        bar: Any,
    ) -> tuple[MemberRun, float]:
        n = len(source)
        chunks = [np.arange(a, min(n, a + self.chunk_size)) for a in range(0, n, self.chunk_size)]
        with warnings.catch_warnings():
            # Ray Data restarts a dead actor and retries its task forever by default: a chunk
            # that kills its worker every time (out of memory on one image) never ended the
            # run. Its own way to bound that (map_batches' remote args) is deprecated in
            # 2.60 (the version pinned) with no named replacement yet; it goes in Ray 2.64.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            ds = ray.data.from_numpy(chunks).map_batches(
                _MemberActor,
                fn_constructor_kwargs={"load": ref.load, "source": source, "variants": variants},
                batch_size=self.chunk_size,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=min(actors, len(chunks))),
                num_cpus=self.cpus_per_actor,
                num_gpus=self.gpus_per_actor or None,
                max_restarts=RAY_RETRIES,
                max_task_retries=RAY_RETRIES,
            )
        scores: dict[str, NDArray[np.float64]] = {v: np.full(n, np.nan) for v in variants}
        seen = np.zeros(n, dtype=bool)
        hashes: set[str] = set()
        test_pair = False
        seconds = scene_s = 0.0
        with _quiet_data(), _guard_errors(), _worker_deaths(ref.name):
            for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
                idx = np.asarray(b["index"], dtype=np.int64)
                for v in variants:
                    scores[v][idx] = b[f"score_{v}"]
                seen[idx] = True
                hashes.update(str(h) for h in b["prompt_hash"])
                test_pair = test_pair or bool(np.any(b["test_pair"]))
                seconds += float(np.sum(b["seconds"]))
                scene_s += float(np.sum(b["scene_seconds"]))
                if bar is not None:
                    bar.update(len(idx))
        if not seen.all():  # never a silent hole: every scene comes back or the run fails
            raise ScoringError(
                f"member {ref.name}: Ray returned no score for scene(s) "
                f"{np.flatnonzero(~seen)[:10].tolist()}; score again."
            )
        if len(hashes) != 1:
            raise ScoringError(
                f"member {ref.name} scored with prompt hashes {sorted(hashes)} on different "
                "Ray workers; every node must hold the same member folder and spotstop."
            )
        return MemberRun(ref.name, hashes.pop(), scores, test_pair, seconds), scene_s


@contextmanager
def _quiet_data() -> Iterator[None]:
    """No Ray Data progress bars or per-operator INFO lines (spotstop draws its own bar)."""
    ctx = ray.data.DataContext.get_current()
    old = ctx.enable_progress_bars, ctx.print_on_execution_start
    logger = logging.getLogger("ray.data")
    level = logger.level
    ctx.enable_progress_bars, ctx.print_on_execution_start = False, False
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ctx.enable_progress_bars, ctx.print_on_execution_start = old
        logger.setLevel(level)


@contextmanager
def _worker_deaths(member: str) -> Iterator[None]:
    """A scoring actor that died on every try (:data:`RAY_RETRIES`) ends the run with a
    :class:`ScoringError` naming the member, not with Ray's own error."""
    try:
        yield
    except ray.exceptions.ActorDiedError as e:
        raise ScoringError(
            f"member {member}: a Ray worker scoring it died {RAY_RETRIES + 1} times on the same "
            f"scenes ({str(e).splitlines()[0]}); a scene that kills its worker (out of memory "
            "on one image, a crash in the backend) leaves no score. Find it with a smaller "
            "chunk_size or the local engine."
        ) from e


@contextmanager
def _guard_errors() -> Iterator[None]:
    """A spotstop error raised in an actor is raised here as itself (Ray wraps it)."""
    try:
        yield
    except GuardError:
        raise
    except Exception as e:
        cause: BaseException | None = e
        while cause is not None:
            if isinstance(cause, GuardError):
                raise cause from e
            cause = cause.__cause__
        raise
