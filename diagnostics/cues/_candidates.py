"""Candidates from bundles and member folders, and the reliance run end to end.

A candidate folder is a bundle (``manifest.yaml``: its members and its guard as deployed) or
a member folder (a Hugging Face model folder: one member). Members are identified for the
score cache by their files (a bundle's manifest digests, or a member folder's file sizes and
modification times) and their prompt hash.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._edits import plan_edits
from spotstop.diagnostics.cues._reliance import GuardSpec, estimate_reliance
from spotstop.diagnostics.cues._results import RelianceResult
from spotstop.diagnostics.cues._scoring import MemberSpec, ScoreTable, score_edit_set
from spotstop.diagnostics.cues._source import SourceSet
from spotstop.guard._batch import Engine

__all__ = ["CandidateSet", "RelianceRun", "load_candidates", "measure_reliance"]


@dataclass(frozen=True)
class CandidateSet:
    """The members and guards of the candidate folders (members once each, names unique)."""

    members: tuple[MemberSpec, ...]
    guards: tuple[GuardSpec, ...]
    folders: tuple[str, ...]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of candidate members (fused as Avg-2)."""
        return list(itertools.combinations([m.name for m in self.members], 2))


def _digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _folder_identity(folder: Path) -> str:
    """Cheap identity of a member folder: its files' relative paths, sizes and mtimes."""
    rows = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            rows.append(f"{p.relative_to(folder)}|{st.st_size}|{st.st_mtime_ns}")
    return "folder:" + _digest(rows)


def load_candidates(
    folders: Sequence[str | os.PathLike[str]],
    *,
    device: str = "cpu",
    backend: str | None = None,
    threads: int | None = None,
) -> CandidateSet:
    """Read each candidate folder (no model is loaded until its scores are needed)."""
    from spotstop.guard import BundleError, load_bundle, load_member
    from spotstop.guard._member import load_bundle_member

    if not folders:
        raise DataError("give at least one candidate: --candidate BUNDLE_OR_MEMBER_DIR.")
    members: dict[str, MemberSpec] = {}
    guards: list[GuardSpec] = []
    bundles = []

    def add(spec: MemberSpec, alias: str) -> str:
        old = members.get(spec.name)
        if old is not None and old.identity == spec.identity:
            return spec.name  # the same member in two candidates: score it once
        if old is not None:
            spec = MemberSpec(f"{spec.name}@{alias}", spec.identity, spec.prompt_hash, spec.load)
        members[spec.name] = spec
        return spec.name

    for f in folders:
        root = Path(f)
        if not root.is_dir():
            raise DataError(
                f"candidate {str(root)!r} is not a folder; pass a bundle or a member folder."
            )
        if (root / "manifest.yaml").is_file():
            try:
                b = load_bundle(root)
            except BundleError as e:
                raise DataError(f"candidate {root}: {e}") from e
            bundles.append(b)
            files = dict(b.manifest.get("files", {}))
            mapping = {}
            for bm in b.members:
                try:
                    prefix = str(bm.path.relative_to(b.path))
                    ident = "bundle:" + _digest(
                        sorted(f"{k}|{v}" for k, v in files.items() if k.startswith(prefix + "/"))
                    )
                except ValueError:  # a member outside the bundle folder
                    ident = _folder_identity(bm.path)

                def load(b: Any = b, bm: Any = bm) -> Any:
                    return load_bundle_member(
                        b, bm, device=device, threads=threads, backend=backend
                    )

                mapping[bm.name] = add(
                    MemberSpec(bm.name, ident, bm.prompt_hash, load), b.bundle_id
                )
            if b.policy_path.is_file():
                guards.append(GuardSpec(name=b.bundle_id, policy=b.policy_path, members=mapping))
            else:
                warnings.warn(
                    f"bundle {b.bundle_id} has no policy.yaml, so its guard is not a candidate; "
                    "fit one with `spotstop policy init`.",
                    UserWarning,
                    stacklevel=2,
                )
        else:

            def load_folder(root: Path = root) -> Any:
                return load_member(root, backend=backend or "torch", device=device, threads=threads)

            add(MemberSpec(root.name, _folder_identity(root), None, load_folder), str(root))
    named = [
        GuardSpec(
            name="guard" if len(guards) == 1 else f"guard:{g.name}",
            policy=g.policy,
            members=g.members,
        )
        for g in guards
    ]
    return CandidateSet(
        members=tuple(members.values()), guards=tuple(named), folders=tuple(map(str, folders))
    )


@dataclass(frozen=True)
class RelianceRun:
    """A reliance measurement and how long it took: ``result``, the members' ``scores``, the
    wall time of the whole run and the scenes it covered (for ``bench/``)."""

    result: RelianceResult
    scores: ScoreTable = field(repr=False)
    seconds: float

    @property
    def scenes_per_s(self) -> float:
        return self.result.n_scenes / self.seconds if self.seconds > 0 else float("nan")


def measure_reliance(
    candidates: CandidateSet,
    source: SourceSet,
    *,
    pairs: bool = False,
    seed: int = 0,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    engine: Engine | None = None,
) -> RelianceRun:
    """Plan the edits, score them with every member (cache first; the rest on ``engine``,
    default in this process), and estimate reliance for the members, their Avg-2 pairs
    (``pairs=True``) and the guards."""
    t0 = time.perf_counter()
    edits = plan_edits(source, seed=seed)
    table = score_edit_set(
        edits, candidates.members, cache_dir=cache_dir, progress=progress, engine=engine
    )
    result = estimate_reliance(
        table,
        pairs=candidates.pairs if pairs else (),
        guards=candidates.guards,
        n_boot=n_boot,
        rng=rng,
        provenance={
            "source": str(source.csv_path),
            "candidates": list(candidates.folders),
            "edit_seed": seed,
            "edit_set_sha256": edits.digest,
            "timings": {
                m: {"n": t.n, "seconds": t.seconds, "cached": t.cached}
                for m, t in table.timings.items()
            },
        },
    )
    return RelianceRun(result=result, scores=table, seconds=time.perf_counter() - t0)
