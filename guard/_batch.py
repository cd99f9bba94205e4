"""Scoring many scenes offline with several members: engines in a registry with lazy imports.

Offline work scores many scenes with each member: ``spotstop score`` over a folder or a CSV,
and the edit sets of ``reliance`` and ``select``. An engine does that work and nothing else:

* ``local`` (:class:`LocalEngine`): in this process, chunk by chunk through
  :meth:`Member.score <spotstop.guard._member.Member.score>`, each chunk's scenes built once
  and scored by every member.
* ``ray`` (:class:`spotstop.guard._batch_ray.RayEngine`, the ``ray`` extra): a Ray Data
  ``map_batches`` over the scene indices per member, with one member loaded per actor, the
  results joined back in input order. Imported only when asked for; without it nothing
  imports Ray.

Both return the same :class:`BatchScores` (the same numbers, up to the backend's score
bound: other batch shapes run other kernels), keep a non-finite score as NaN and name it in
a :class:`RuntimeWarning` (the guard fails such a scene closed). The offline rooms share this
through the runtime room because it is the one room they all build on; nothing on the robot
calls it.
"""

from __future__ import annotations

import importlib
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from spotstop.guard._errors import ConfigError, ScoringError
from spotstop.guard._types import VARIANTS, MemberScore, Scene, Variant

__all__ = [
    "ENGINES",
    "BatchScores",
    "Engine",
    "LocalEngine",
    "MemberRef",
    "MemberRun",
    "SceneSource",
    "Scorer",
    "get_engine",
    "progress_bar",
    "score_chunk",
    "score_scenes",
    "warn_non_finite",
]


class Scorer(Protocol):
    """What scores scenes: :class:`spotstop.guard.Member` (or a test double)."""

    @property
    def name(self) -> str: ...

    @property
    def prompt_hash(self) -> str: ...

    def score(
        self, scenes: Sequence[Scene], variant: Variant = "scene", *, strict: bool = True
    ) -> list[MemberScore]: ...


class SceneSource(Protocol):
    """Scenes by index. Small to pickle: an engine may build the scenes in another process
    (:class:`~spotstop.guard._scene_table.SceneTable`, an edit set's renderer)."""

    def __len__(self) -> int: ...

    def scenes(self, indices: Sequence[int]) -> list[Scene]: ...


@dataclass(frozen=True)
class MemberRef:
    """A member to score with: ``name``; ``load``, a picklable callable that returns the ready
    :class:`Scorer` (a distributed engine calls it in each of its workers); ``loaded``, the
    member when this process already holds it (an in-process engine uses it instead of
    loading again; a distributed engine never ships it)."""

    name: str
    load: Callable[[], Scorer] = field(repr=False, compare=False)
    loaded: Scorer | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class MemberRun:
    """One member's scores: ``scores[variant]`` in input order (float64, NaN where the member
    failed), the ``prompt_hash`` that made them, whether it is a TEST PAIR member, and
    ``seconds`` spent in its own score calls (summed over workers)."""

    name: str
    prompt_hash: str
    scores: Mapping[str, NDArray[np.float64]] = field(repr=False)
    test_pair: bool
    seconds: float


@dataclass(frozen=True)
class BatchScores:
    """Every member's scores of ``n`` scenes for each of ``variants``; ``engine`` names what
    computed them, ``seconds`` the wall time and ``scene_seconds`` the time spent building
    scenes (reading, decoding, rendering; summed over workers)."""

    n: int
    variants: tuple[Variant, ...]
    members: Mapping[str, MemberRun]
    engine: str
    seconds: float = field(repr=False)
    scene_seconds: float = field(repr=False, default=0.0)

    def __repr__(self) -> str:
        names = ", ".join(f"{m} ({r.prompt_hash})" for m, r in self.members.items())
        return f"BatchScores({self.n} scenes × {list(self.variants)} × [{names}], {self.engine})"


class Engine(Protocol):
    """What scores a :class:`SceneSource` with members (the registry's classes)."""

    name: str

    def run(
        self,
        source: SceneSource,
        members: Sequence[MemberRef],
        variants: Sequence[Variant],
        *,
        progress: bool = False,
    ) -> BatchScores: ...


@dataclass(frozen=True)
class ChunkScores:
    """One member's scores of one chunk of scenes (:func:`score_chunk`)."""

    scores: Mapping[str, NDArray[np.float64]]
    prompt_hash: str
    test_pair: bool
    seconds: float


def score_chunk(
    scorer: Scorer, scenes: Sequence[Scene], variants: Sequence[Variant]
) -> ChunkScores:
    """Score ``scenes`` with ``scorer`` for each variant (non-finite kept), as every engine does."""
    t0 = time.perf_counter()
    out: dict[str, NDArray[np.float64]] = {}
    hashes: set[str] = set()
    test_pair = False
    for v in variants:
        res = scorer.score(scenes, v, strict=False)
        if len(res) != len(scenes):
            raise ScoringError(
                f"member {scorer.name} returned {len(res)} scores for {len(scenes)} scene(s); "
                "a member must return one score per scene."
            )
        out[v] = np.array([r.score for r in res], dtype=np.float64)
        hashes.update(r.prompt_hash for r in res)
        test_pair = test_pair or any(r.test_pair for r in res)
    ph = hashes.pop() if len(hashes) == 1 else scorer.prompt_hash
    return ChunkScores(out, ph, test_pair, time.perf_counter() - t0)


def check_chunk_size(chunk_size: object) -> None:
    """Raise :class:`ConfigError` unless ``chunk_size`` is a positive integer (every engine)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive integer; got {chunk_size!r}.")


class LocalEngine:
    """Score in this process: ``chunk_size`` scenes at a time are built once and scored by
    every member (each member's backend batches within the chunk)."""

    name = "local"

    def __init__(self, *, chunk_size: int = 16) -> None:
        check_chunk_size(chunk_size)
        self.chunk_size = chunk_size

    def __repr__(self) -> str:
        return f"LocalEngine(chunk_size={self.chunk_size})"

    def run(
        self,
        source: SceneSource,
        members: Sequence[MemberRef],
        variants: Sequence[Variant],
        *,
        progress: bool = False,
    ) -> BatchScores:
        t_start = time.perf_counter()
        n = len(source)
        scorers = [m.loaded if m.loaded is not None else m.load() for m in members]
        out: dict[str, dict[str, NDArray[np.float64]]] = {
            m.name: {v: np.full(n, np.nan) for v in variants} for m in members
        }
        secs = dict.fromkeys(out, 0.0)
        hashes = {m.name: s.prompt_hash for m, s in zip(members, scorers, strict=True)}
        test_pair = dict.fromkeys(out, False)
        scene_s = 0.0
        bar = progress_bar(n * len(members), progress)
        for start in range(0, n, self.chunk_size):
            t0 = time.perf_counter()
            scenes = source.scenes(range(start, min(n, start + self.chunk_size)))
            scene_s += time.perf_counter() - t0
            for ref, scorer in zip(members, scorers, strict=True):
                chunk = score_chunk(scorer, scenes, variants)
                for v, s in chunk.scores.items():
                    out[ref.name][v][start : start + len(scenes)] = s
                secs[ref.name] += chunk.seconds
                hashes[ref.name] = chunk.prompt_hash
                test_pair[ref.name] = test_pair[ref.name] or chunk.test_pair
                if bar is not None:
                    bar.update(len(scenes))
        if bar is not None:
            bar.close()
        runs = {
            m.name: MemberRun(m.name, hashes[m.name], out[m.name], test_pair[m.name], secs[m.name])
            for m in members
        }
        return BatchScores(
            n, tuple(variants), runs, self.name, time.perf_counter() - t_start, scene_s
        )


#: name → (module, class); a module is imported when its engine is first asked for, so a
#: missing library (``ray``) raises its ImportError there, which the CLI turns into the
#: install hint of its extra.
ENGINES: dict[str, tuple[str, str]] = {
    "local": ("spotstop.guard._batch", "LocalEngine"),
    "ray": ("spotstop.guard._batch_ray", "RayEngine"),
}


def get_engine(name: str = "local", **settings: Any) -> Engine:
    """The engine registered as ``name``, built with ``settings`` (its module imported now).

    ``local``: ``chunk_size``. ``ray``: ``address``, ``actors``, ``cpus_per_actor``,
    ``chunk_size`` (see :class:`spotstop.guard._batch_ray.RayEngine`).
    """
    try:
        module, cls = ENGINES[name]
    except KeyError:
        raise ConfigError(f"engine must be one of {sorted(ENGINES)}; got {name!r}.") from None
    engine: Engine = getattr(importlib.import_module(module), cls)(**settings)
    return engine


def _check_scoring(
    source: SceneSource, members: Sequence[MemberRef], variants: Sequence[Variant]
) -> None:
    if not members:
        raise ConfigError("give at least one member to score with.")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError(f"member names must be unique; got {names}. Rename one member.")
    if not variants:
        raise ConfigError(f"give at least one variant of {list(VARIANTS)}.")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or len(set(variants)) != len(variants):
        raise ConfigError(
            f"variants must be distinct values of {list(VARIANTS)}; got {list(variants)}."
        )
    if len(source) < 1:
        raise ConfigError("there is no scene to score.")


def score_scenes(
    source: SceneSource,
    members: Sequence[MemberRef],
    variants: Sequence[Variant] = ("scene",),
    *,
    engine: Engine | None = None,
    progress: bool = False,
) -> BatchScores:
    """Score every scene of ``source`` with every member for each variant, on ``engine``
    (default: :class:`LocalEngine`); a non-finite score is kept as NaN and warned about."""
    _check_scoring(source, members, variants)
    res = (engine or LocalEngine()).run(source, members, variants, progress=progress)
    for name, run in res.members.items():
        warn_non_finite(name, np.concatenate([run.scores[v] for v in res.variants]))
    return res


def warn_non_finite(name: str, scores: NDArray[np.float64], stacklevel: int = 3) -> None:
    """The one warning for a member's non-finite scores (kept as NaN, never a number)."""
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        warnings.warn(
            f"member {name} gave {bad} non-finite score(s); kept as NaN (the guard fails such "
            "a scene closed, i.e. answers UNSAFE).",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def progress_bar(total: int, enabled: bool, desc: str = "scoring scenes") -> Any:
    """A tqdm bar on stderr counting scored scenes (one per scene and member), or None."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="scene", leave=False)
