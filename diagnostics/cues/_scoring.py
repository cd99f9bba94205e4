"""Scoring the edit set with members, through a small JSON cache.

A member's scores on an edit set depend only on the member (weights and prompt) and the
pixels and requests of the scenes, so they are cached per member, prompt hash and
:attr:`EditSet.digest` (one JSON file each). Reliance and source error are computed from the
scores (a fraction of a second), so with a warm cache a new deployment costs only the
detector's pass over its frames (seed 002: each model is measured once).

The scores that are not cached come from a scoring engine (:mod:`spotstop.guard._batch`): in
this process by default, or on a Ray cluster (``engine=get_engine("ray", ...)``, ``--ray`` on
the command line), where each actor loads one member and renders the edits it scores.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._edits import EditSet
from spotstop.guard import Scene
from spotstop.guard._batch import Engine, LocalEngine, MemberRef, Scorer, warn_non_finite
from spotstop.guard._files import atomic_write_text

__all__ = [
    "CACHE_VERSION",
    "EditScenes",
    "MemberSpec",
    "MemberTiming",
    "ScoreTable",
    "Scorer",
    "score_edit_set",
]

CACHE_VERSION = 1


@dataclass(frozen=True)
class MemberSpec:
    """A member to score, loaded only when its scores are not cached.

    name: the member's name. identity: what identifies its weights (e.g. a digest of its
    bundle files); with ``prompt_hash`` and the edit set it keys the cache. prompt_hash: the
    prompt hash when known without loading (a bundle's manifest), else None (the member is
    loaded to learn it). load: returns the ready :class:`Scorer`.
    """

    name: str
    identity: str
    prompt_hash: str | None
    load: Callable[[], Scorer] = field(repr=False, compare=False)


@dataclass(frozen=True)
class MemberTiming:
    """How a member's scores were obtained: ``n`` scenes in ``seconds`` of scoring (the
    member's own calls, rendering excluded), or from the cache (``cached``; then the
    seconds are those of the run that filled it)."""

    n: int
    seconds: float
    cached: bool

    @property
    def scenes_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class ScoreTable:
    """Every member's raw score ``s = log p(UNSAFE) − log p(SAFE)`` on every scene of an
    edit set (in :attr:`EditSet.records` order; NaN where the member failed)."""

    edits: EditSet
    scores: Mapping[str, NDArray[np.float64]]
    prompt_hashes: Mapping[str, str]
    timings: Mapping[str, MemberTiming] = field(repr=False)
    render_seconds: float = field(repr=False, default=0.0)

    def __repr__(self) -> str:
        names = ", ".join(f"{m} ({self.prompt_hashes[m]})" for m in self.scores)
        return f"ScoreTable({len(self.edits)} scenes × [{names}])"


@dataclass(frozen=True)
class EditScenes:
    """An edit set as a scene source for a scoring engine: scenes rendered on demand, where
    the engine scores them (a Ray actor renders its own chunks)."""

    edits: EditSet

    def __len__(self) -> int:
        return len(self.edits)

    def scenes(self, indices: Sequence[int]) -> list[Scene]:
        return [Scene(img, r.request) for r, img in self.edits.images([int(i) for i in indices])]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] or "member"


def _cache_file(cache_dir: Path, spec: MemberSpec, prompt_hash: str, digest: str) -> Path:
    key = hashlib.sha256(f"{spec.identity}|{prompt_hash}|{digest}".encode()).hexdigest()[:16]
    return cache_dir / f"{_slug(spec.name)}-{prompt_hash}-{key}.json"


def _read_cache(path: Path, n: int, digest: str) -> tuple[NDArray[np.float64], float] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        ok = (
            doc.get("cache_version") == CACHE_VERSION
            and doc.get("edit_set") == digest
            and len(doc["scores"]) == n
        )
        if not ok:
            return None
        scores = np.array([math.nan if v is None else float(v) for v in doc["scores"]])
        return scores, float(doc.get("seconds", math.nan))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable entry is a miss; it is rewritten below


def _write_cache(
    path: Path, spec: MemberSpec, prompt_hash: str, digest: str, s: NDArray[np.float64], sec: float
) -> None:
    doc = {
        "cache_version": CACHE_VERSION,
        "member": spec.name,
        "prompt_hash": prompt_hash,
        "identity": spec.identity,
        "edit_set": digest,
        "created": datetime.now(UTC).isoformat(),
        "seconds": sec,
        "scores": [None if not math.isfinite(v) else float(v) for v in s.tolist()],
    }
    atomic_write_text(path, json.dumps(doc))


def score_edit_set(
    edits: EditSet,
    members: Sequence[MemberSpec],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    chunk_size: int = 16,
    progress: bool = False,
    engine: Engine | None = None,
) -> ScoreTable:
    """Score every scene of ``edits`` with every member (from the cache where it has them).

    The members the cache lacks are scored on ``engine`` (default: in this process, in
    chunks of ``chunk_size`` scenes; a Ray engine has its own chunk size), and their scores
    cached. A tqdm bar counts scenes while scoring. A non-finite score is kept as NaN (the
    guard fails such a scene closed) and reported with a warning.
    """
    if chunk_size < 1:
        raise DataError(f"chunk_size must be >= 1; got {chunk_size!r}.")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise DataError(f"member names must be unique; got {names}. Rename one candidate.")
    cache = Path(cache_dir) if cache_dir is not None else None
    n = len(edits)
    scores: dict[str, NDArray[np.float64]] = {}
    hashes: dict[str, str] = {}
    timings: dict[str, MemberTiming] = {}
    todo: list[tuple[MemberSpec, Scorer | None, Path | None]] = []
    for spec in members:
        loaded: Scorer | None = None
        ph = spec.prompt_hash
        if ph is None:
            loaded = spec.load()
            ph = loaded.prompt_hash
        path = _cache_file(cache, spec, ph, edits.digest) if cache is not None else None
        hit = _read_cache(path, n, edits.digest) if path is not None else None
        hashes[spec.name] = ph
        if hit is not None:
            scores[spec.name] = hit[0]
            timings[spec.name] = MemberTiming(n=n, seconds=hit[1], cached=True)
        else:
            todo.append((spec, loaded, path))
    render_s = 0.0
    if todo:
        refs = [MemberRef(spec.name, spec.load, loaded) for spec, loaded, _ in todo]
        run = (engine or LocalEngine(chunk_size=chunk_size)).run(
            EditScenes(edits), refs, ("scene",), progress=progress
        )
        render_s = run.scene_seconds
        for spec, _, path in todo:
            got = run.members[spec.name]
            if got.prompt_hash != hashes[spec.name]:
                raise DataError(
                    f"member {spec.name} scored with prompt hash {got.prompt_hash}, but "
                    f"{hashes[spec.name]} was expected; re-export its bundle."
                )
            scores[spec.name] = got.scores["scene"]
            timings[spec.name] = MemberTiming(n=n, seconds=got.seconds, cached=False)
            if path is not None:
                _write_cache(path, spec, hashes[spec.name], edits.digest, scores[spec.name],
                             got.seconds)  # fmt: skip
    for name, s in scores.items():
        warn_non_finite(name, s)
    return ScoreTable(
        edits=edits,
        scores={m: scores[m] for m in names},
        prompt_hashes={m: hashes[m] for m in names},
        timings={m: timings[m] for m in names},
        render_seconds=render_s,
    )
