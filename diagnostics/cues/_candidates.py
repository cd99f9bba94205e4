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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics.cues._deployed import (
    DeployedLabels,
    fitted_cut_policy,
    label_as_deployed,
    source_pool,
    stated_cut_policy,
)
from spotstop.diagnostics.cues._edits import plan_edits
from spotstop.diagnostics.cues._reliance import GuardSpec, estimate_reliance
from spotstop.diagnostics.cues._results import RelianceResult
from spotstop.diagnostics.cues._scoring import MemberSpec, ScoreTable, score_edit_set
from spotstop.diagnostics.cues._source import SourceSet
from spotstop.diagnostics.cues._templates import TEMPLATES, EditTemplate
from spotstop.guard._batch import Engine

__all__ = [
    "CandidateSet",
    "RelianceRun",
    "load_candidates",
    "measure_reliance",
    "operating_points",
    "reliance_at_operating_points",
]


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
    from spotstop.guard import BundleError, load_bundle, load_bundle_member, load_member

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


#: How each kind of candidate is put at its operating point (said in select.json).
FITTED_CUT_RULE = "frozen cut: mean robust z-score of the unedited source scenes (no labels)"
PAIR_CUT_RULE = "frozen cut: mean Avg-2 score of the unedited source scenes (no labels)"
STATED_CUT_RULE = "cut stated by the user on the raw score s (UNSAFE when s >= cut)"
GUARD_CUT_RULE = "its own policy (policy.yaml), each probe scene as one check"


@dataclass(frozen=True)
class RelianceRun:
    """A reliance measurement and how long it took: ``result``, the members' ``scores``, the
    wall time of the whole run and the scenes it covered (for ``bench/``), and ``answers``:
    every candidate's decisions on every edited scene at its operating point (a member at
    its cut, a pair at its frozen cut, a guard by its policy), the per-scene errors behind the
    hard-answer reliance, which the selection check draws its test sets from."""

    result: RelianceResult
    scores: ScoreTable = field(repr=False)
    seconds: float
    answers: Mapping[str, DeployedLabels] = field(repr=False, default_factory=dict)

    @property
    def scenes_per_s(self) -> float:
        return self.result.n_scenes / self.seconds if self.seconds > 0 else float("nan")


def operating_points(
    table: ScoreTable,
    candidates: CandidateSet,
    *,
    pairs: bool,
    member_cuts: Mapping[str, float] | None = None,
) -> dict[str, tuple[Any, dict[str, Any], Mapping[str, str]]]:
    """Every candidate's policy at its operating point: name -> (policy, note, members).

    A member: its frozen cut fitted on the unedited source scenes (:func:`fitted_cut_policy`),
    or the cut ``member_cuts[name]`` on its raw score; a pair: the same frozen rule on its
    Avg-2 score; a guard: its own policy. ``note`` is ``{"rule", "cut"}`` (cut None for a
    guard), and ``members`` maps the policy's member names to the score table's.
    """
    cuts = dict(member_cuts or {})
    names = [m.name for m in candidates.members]
    unknown = sorted(set(cuts) - set(names))
    if unknown:
        raise DataError(
            f"--member-cut names {unknown}, which are not candidate members; the members are "
            f"{names}."
        )
    out: dict[str, tuple[Any, dict[str, Any], Mapping[str, str]]] = {}
    for m in names:
        if m in cuts:
            policy, note = stated_cut_policy(m, cuts[m]), {"rule": STATED_CUT_RULE, "cut": cuts[m]}
        else:
            policy, t0 = fitted_cut_policy(
                source_pool(table, [m], name=m), name=m, what="the unedited source scenes"
            )
            note = {"rule": FITTED_CUT_RULE, "cut": t0}
        out[m] = (policy, note, {m: m})
    for a, b in candidates.pairs if pairs else ():
        policy, t0 = fitted_cut_policy(
            source_pool(table, [a, b], name=f"{a}+{b}"),
            name=f"{a}+{b}",
            what="the unedited source scenes",
        )
        out[f"{a}+{b}"] = (policy, {"rule": PAIR_CUT_RULE, "cut": t0}, {a: a, b: b})
    for g in candidates.guards:
        out[g.name] = (g.policy, {"rule": GUARD_CUT_RULE, "cut": None}, g.members)
    return out


def _at_cut(name: str) -> str:
    return f"{name} @ operating point"


def _fold_member_cuts(
    result: RelianceResult, members: Sequence[str], points: Mapping[str, Any]
) -> RelianceResult:
    """Each member's hard-answer view becomes its view at its operating point (measured as a
    one-member guard under :func:`_at_cut`'s name), and every candidate notes its point."""
    cands = dict(result.candidates)
    draws = dict(result.draws)
    for m in members:
        at = cands.pop(_at_cut(m))
        hard = replace(at, name=m, kind="member", notes={"operating_point": points[m][1]})
        cands[m] = replace(
            cands[m], hard=hard, notes={**cands[m].notes, "operating_point": points[m][1]}
        )
        for key in [k for k in draws if k[0] == _at_cut(m)]:
            draws[(m, *key[1:])] = draws.pop(key)
    for name, c in cands.items():
        if c.kind != "member" and name in points:
            cands[name] = replace(c, notes={**c.notes, "operating_point": points[name][1]})
    return replace(result, candidates=cands, draws=draws)


def measure_reliance(
    candidates: CandidateSet,
    source: SourceSet,
    *,
    pairs: bool = False,
    member_cuts: Mapping[str, float] | None = None,
    seed: int = 0,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    engine: Engine | None = None,
    templates: Sequence[EditTemplate] = TEMPLATES,
) -> RelianceRun:
    """Plan the edits, score them with every member (cache first; the rest on ``engine``,
    default in this process), and estimate reliance for the members, their Avg-2 pairs
    (``pairs=True``) and the guards, each at its operating point (:func:`operating_points`:
    a member's hard answer at its frozen cut or at ``member_cuts[name]``). ``templates``: the
    measurement templates (default every one; :func:`templates_named` picks some)."""
    t0 = time.perf_counter()
    edits = plan_edits(source, seed=seed, templates=templates)
    table = score_edit_set(
        edits, candidates.members, cache_dir=cache_dir, progress=progress, engine=engine
    )
    run = reliance_at_operating_points(
        table,
        candidates,
        pairs=pairs,
        member_cuts=member_cuts,
        n_boot=n_boot,
        rng=rng,
        provenance={
            "source": str(source.csv_path),
            "candidates": list(candidates.folders),
            "edit_seed": seed,
            "edit_set_sha256": edits.digest,
            "templates": [t.name for t in templates],
            "timings": {
                m: {"n": t.n, "seconds": t.seconds, "cached": t.cached}
                for m, t in table.timings.items()
            },
        },
    )
    return replace(run, seconds=time.perf_counter() - t0)


def reliance_at_operating_points(
    table: ScoreTable,
    candidates: CandidateSet,
    *,
    pairs: bool = False,
    member_cuts: Mapping[str, float] | None = None,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> RelianceRun:
    """Reliance of every candidate from scores already in ``table``, each candidate at its
    operating point (:func:`operating_points`), with every candidate's decisions per scene."""
    t0 = time.perf_counter()
    points = operating_points(table, candidates, pairs=pairs, member_cuts=member_cuts)
    members = [m.name for m in candidates.members]
    member_guards = [GuardSpec(_at_cut(m), points[m][0], points[m][2]) for m in members]
    result = estimate_reliance(
        table,
        members=members,
        pairs=candidates.pairs if pairs else (),
        guards=(*candidates.guards, *member_guards),
        n_boot=n_boot,
        rng=rng,
        provenance=provenance,
    )
    answers = {
        name: label_as_deployed(policy, {p: table.scores[m] for p, m in mapping.items()})
        for name, (policy, _, mapping) in points.items()
    }
    return RelianceRun(
        result=_fold_member_cuts(result, members, points),
        scores=table,
        seconds=time.perf_counter() - t0,
        answers=answers,
    )
