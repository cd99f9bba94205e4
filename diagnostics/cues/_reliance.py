"""Reliance on a text cue (seed 002, Eq. 2), with a group-bootstrap interval.

For a candidate f and cue j, over the source scenes that j misleads on (UNSAFE scenes for
reassuring text, SAFE scenes for alarming text)::

    R_fj = mean over templates t of [ err(misleading edit_t) − err(matched control_t) ]

where the matched control's error is the mean of the agreeing-text and the neutral-text
controls (same box, font, size, colours, position). The templates come in families
(:data:`~spotstop.diagnostics.cues._templates.FAMILIES`: ``sign`` and ``sticker``): each
family's statistics average over its own templates (:attr:`CueRelianceByFamily.families`),
and the reported reliance, placebo and control differences are the mean of the family means,
so each family weighs the same whatever its number of templates. An edit set of one family
(the sign templates alone) gives that family's numbers as the overall ones. Alongside it:

* ``placebo``: error under the placebo edit (a non-word in the same box) minus error on the
  unedited scene; an interval that excludes 0 means the edit itself, not what the text says,
  moves the answers (:attr:`CueReliance.placebo_moves`);
* ``source_error``: error on the unedited scenes the cue misleads on (per cue) and on all
  source scenes (per candidate: the intercept of Eq. 1);
* ``held_out``: the same difference under the held-out template alone (transfer);
* ``vs_agreeing`` / ``vs_neutral``: the difference against each control alone.

Errors: a member's probability of the wrong answer, ``σ(s)`` for P(UNSAFE) under the
two-answer normalisation, and its hard-answer error (``s > 0`` is the answer UNSAFE, the
paper's and the card's direct answer); an Avg-2 pair's and a guard's error is the error of
their decisions (:mod:`spotstop.diagnostics.cues._deployed`, the guard's own tie rule).

Every statistic is a ratio of per-scene sums, so a bootstrap draw (group multiplicities from
:func:`spotstop.diagnostics.draw_group_counts`, every edit of a scene in its scene's group) is one
matrix product for all candidates and statistics at once; all of them come from the same
draws, so differences between candidates are paired. The groups are the source set's
situations and contrasts where it names them (scenes sharing either stay together, as in the
card's bootstrap: :meth:`SourceSet.groups`), else each source scene alone; ``reliance.json``
says which (``resampling_unit``, ``n_groups``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import direct_answer
from spotstop.diagnostics._resample import (
    MIN_GROUPS,
    FewGroupsWarning,
    draw_group_counts,
    few_groups_message,
)
from spotstop.diagnostics._resample import as_rng as _as_rng
from spotstop.diagnostics._resample import percentile_ci as _percentile_ci
from spotstop.diagnostics._results import Estimate
from spotstop.diagnostics.cues._deployed import fitted_cut_policy, label_as_deployed, source_pool
from spotstop.diagnostics.cues._edits import EditSet
from spotstop.diagnostics.cues._results import (
    CandidateReliance,
    CueReliance,
    RelianceResult,
)
from spotstop.diagnostics.cues._scoring import ScoreTable
from spotstop.diagnostics.cues._templates import CUES, FAMILIES

__all__ = [
    "CueRelianceByFamily",
    "FamilyReliance",
    "GuardSpec",
    "answer_errors",
    "estimate_reliance",
    "probability_errors",
]

_CUE_STATS = ("reliance", "placebo", "source_error", "held_out", "vs_agreeing", "vs_neutral")
#: The statistics measured per family of templates (source error and held-out are not).
_FAMILY_STATS = ("reliance", "placebo", "vs_agreeing", "vs_neutral")


@dataclass(frozen=True)
class FamilyReliance:
    """One candidate's reliance on one cue under one family of templates (``sign`` or
    ``sticker``): the same statistics as :class:`CueReliance`, averaged over that family's
    measurement templates only."""

    family: str
    templates: tuple[str, ...]
    reliance: Estimate
    placebo: Estimate
    vs_agreeing: Estimate
    vs_neutral: Estimate

    @property
    def placebo_moves(self) -> bool:
        """True when the placebo's interval excludes 0 (see :attr:`CueReliance.placebo_moves`)."""
        return self.placebo.ci.excludes(0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "templates": list(self.templates),
            "reliance": self.reliance.to_dict(),
            "placebo": self.placebo.to_dict(),
            "placebo_moves": self.placebo_moves,
            "reliance_vs_agreeing": self.vs_agreeing.to_dict(),
            "reliance_vs_neutral": self.vs_neutral.to_dict(),
        }


@dataclass(frozen=True)
class CueRelianceByFamily(CueReliance):
    """A :class:`CueReliance` (overall: the mean of the family means) with each family's own
    numbers in ``families`` (``reliance.json``: ``candidates[name][cue]["families"]``)."""

    families: Mapping[str, FamilyReliance] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["families"] = {f: r.to_dict() for f, r in self.families.items()}
        return d


@dataclass(frozen=True)
class GuardSpec:
    """A guard to measure: its name, its ``policy.yaml`` (path or dict), and its members as
    ``{name in the policy: name in the score table}``."""

    name: str
    policy: Any = field(repr=False)
    members: Mapping[str, str]


def probability_errors(score: NDArray[np.float64], label: NDArray[Any]) -> NDArray[np.float64]:
    """Probability of the wrong answer: ``σ(s)`` = P(UNSAFE) on a SAFE scene, ``1 − σ(s)`` on an
    UNSAFE one. A non-finite score counts as P(UNSAFE) = 1 (the guard fails it closed)."""
    s = np.where(np.isfinite(score), score, np.inf)
    return np.asarray(expit(np.where(np.asarray(label) == 1, -s, s)), dtype=np.float64)


def answer_errors(unsafe: NDArray[np.bool_], label: NDArray[Any]) -> NDArray[np.float64]:
    """1.0 where the answer (True = UNSAFE) disagrees with the label (1 = UNSAFE)."""
    return (np.asarray(unsafe, dtype=bool) != (np.asarray(label) == 1)).astype(np.float64)


def _member_unsafe(score: NDArray[np.float64]) -> NDArray[np.bool_]:
    """The member's direct answer: ``s > 0`` is UNSAFE; a non-finite score fails closed."""
    return direct_answer(score, 0.0)


@dataclass(frozen=True)
class _Layout:
    """Scene indices per source scene (group): the unedited scene, and per kind the edits of
    every measurement template (G, T) and of the held-out template (G,); the measurement
    templates' columns per family."""

    cue: NDArray[np.object_]
    label: NDArray[np.int8]
    src: NDArray[np.intp]
    group: NDArray[np.intp]  # bootstrap group (0..G-1) of each source scene
    unit: str  # what a group is
    meas: Mapping[str, NDArray[np.intp]]
    held: Mapping[str, NDArray[np.intp]] | None
    families: Mapping[str, tuple[str, ...]]  # family -> its measurement templates, in order
    columns: Mapping[str, NDArray[np.intp]]  # family -> its columns of meas

    @classmethod
    def build(cls, edits: EditSet) -> _Layout:
        g_n = len(edits.source)
        meas_t = [t.name for t in edits.templates if not t.held_out]
        held_t = [t.name for t in edits.templates if t.held_out]
        col = {name: i for i, name in enumerate(meas_t)}
        kinds = ("misleading", "agreeing", "neutral", "placebo")
        src = np.full(g_n, -1, dtype=np.intp)
        meas = {k: np.full((g_n, len(meas_t)), -1, dtype=np.intp) for k in kinds}
        held = {k: np.full(g_n, -1, dtype=np.intp) for k in kinds}
        for r in edits.records:
            if r.kind == "source":
                src[r.group] = r.index
            elif r.held_out:
                held[r.kind][r.group] = r.index
            else:
                meas[r.kind][r.group, col[r.template]] = r.index
        missing = (src < 0).any() or any((a < 0).any() for a in meas.values())
        if missing or (held_t and any((a < 0).any() for a in held.values())):
            raise DataError(
                "the edit set is incomplete: every source scene needs its unedited scene and "
                "all four kinds of edit for every template. Build it with plan_edits."
            )
        cue = np.array([s.cue for s in edits.source.scenes], dtype=object)
        label = np.array([s.label for s in edits.source.scenes], dtype=np.int8)
        family = {t.name: t.family for t in edits.templates}
        families = {
            f: tuple(n for n in meas_t if family[n] == f)
            for f in FAMILIES
            if any(family[n] == f for n in meas_t)
        }
        columns = {f: np.array([col[n] for n in ts], dtype=np.intp) for f, ts in families.items()}
        group, unit = edits.source.groups()
        return cls(
            cue=cue,
            label=label,
            src=src,
            group=group,
            unit=unit,
            meas=meas,
            held=held if held_t else None,
            families=families,
            columns=columns,
        )

    def group_values(self, e: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        """Per source scene: each statistic's contribution (see the module docstring): per
        family (``"reliance@sticker"``) and overall, the mean of the family means."""
        src = e[self.src]
        out: dict[str, NDArray[np.float64]] = {}
        for fam, cols in self.columns.items():
            mis, agr, neu, plc = (
                e[self.meas[k][:, cols]] for k in ("misleading", "agreeing", "neutral", "placebo")
            )
            out[f"reliance@{fam}"] = (mis - (agr + neu) / 2).mean(axis=1)
            out[f"placebo@{fam}"] = plc.mean(axis=1) - src
            out[f"vs_agreeing@{fam}"] = (mis - agr).mean(axis=1)
            out[f"vs_neutral@{fam}"] = (mis - neu).mean(axis=1)
        for stat in _FAMILY_STATS:
            out[stat] = np.mean([out[f"{stat}@{f}"] for f in self.columns], axis=0)
        out["source_error"] = src
        if self.held is not None:
            h = self.held
            out["held_out"] = e[h["misleading"]] - (e[h["agreeing"]] + e[h["neutral"]]) / 2
        else:
            out["held_out"] = np.full(src.shape, np.nan)
        return out

    @property
    def family_stats(self) -> tuple[str, ...]:
        """The per-family statistic keys (``"reliance@sign"``, …), family by family."""
        return tuple(f"{s}@{f}" for f in self.columns for s in _FAMILY_STATS)


def _pair_errors(
    table: ScoreTable, a: str, b: str, lay: _Layout
) -> tuple[NDArray[np.float64], dict[str, Any]]:
    """Avg-2 of members a and b: reference statistics and the frozen cut t0 = mean fused score
    fitted on the unedited source scenes (unlabelled use), then the guard's decision rule."""
    pool = source_pool(table, [a, b], name=f"{a}+{b}")
    policy, t0 = fitted_cut_policy(pool, name=f"{a}+{b}", what="unedited source scenes")
    labels = label_as_deployed(policy, {m: table.scores[m] for m in (a, b)})
    return answer_errors(labels.unsafe, _scene_labels(table.edits)), {
        "fusion": policy["fusion"],
        "frozen_t0": t0,
        "rules": dict(labels.rules),
    }


def _scene_labels(edits: EditSet) -> NDArray[np.int8]:
    return np.array([r.label for r in edits.records], dtype=np.int8)


def estimate_reliance(
    table: ScoreTable,
    *,
    members: Sequence[str] | None = None,
    pairs: Sequence[tuple[str, str]] = (),
    guards: Sequence[GuardSpec] = (),
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    chunk_size: int = 500,
    provenance: Mapping[str, Any] | None = None,
) -> RelianceResult:
    """Reliance, placebo and source error per cue for members, Avg-2 pairs and guards.

    table: the members' scores on the edit set (:func:`score_edit_set`).
    members: the members to report (default: every member in ``table``).
    pairs: member pairs to fuse as Avg-2 (frozen reference fitted on the source scenes).
    guards: guards as deployed (their policy, fusion and tie rule).
    n_boot: bootstrap draws; rng: a Generator or a seed (never the global RNG).

    A cue with no source scene of its class gives NaN with an :class:`UndefinedMetricWarning`.
    """
    _check_reliance(table, members, pairs, guards, n_boot)
    gen = _as_rng(rng)
    lay = _Layout.build(table.edits)
    y = _scene_labels(table.edits)
    names = list(table.scores) if members is None else list(members)
    # (candidate, metric) -> per-scene error; notes per candidate
    errors: dict[tuple[str, str], NDArray[np.float64]] = {}
    kinds: dict[str, str] = {}
    notes: dict[str, dict[str, Any]] = {}
    for m in names:
        s = table.scores[m]
        errors[(m, "probability")] = probability_errors(s, y)
        errors[(m, "hard")] = answer_errors(_member_unsafe(s), y)
        kinds[m] = "member"
        notes[m] = {"prompt_hash": table.prompt_hashes[m]}
    for a, b in pairs:
        name = f"{a}+{b}"
        errors[(name, "hard")], notes[name] = _pair_errors(table, a, b, lay)
        kinds[name] = "pair"
    for g in guards:
        labels = label_as_deployed(g.policy, {p: table.scores[m] for p, m in g.members.items()})
        errors[(g.name, "hard")] = answer_errors(labels.unsafe, y)
        kinds[g.name] = "guard"
        notes[g.name] = {
            "policy": "a policy dict" if isinstance(g.policy, Mapping) else str(g.policy),
            "members": dict(g.members),
            "rules": dict(labels.rules),
        }

    for cue in CUES:
        if not (lay.cue == cue).any():
            side = "UNSAFE" if cue == "reassuring" else "SAFE"
            warnings.warn(
                f"reliance on {cue} text is undefined: the source set has no {side} scene "
                f"(the only scenes {cue} text misleads on); returning NaN. Add {side} scenes.",
                UndefinedMetricWarning,
                stacklevel=2,
            )
    keys: list[tuple[str, str, str, str]] = []  # (candidate, metric, cue or "all", stat)
    cols, masks = [], []
    for (cand, metric), e in errors.items():
        per_group = lay.group_values(e)
        for cue in CUES:
            mask = lay.cue == cue
            for stat in (*_CUE_STATS, *lay.family_stats):
                keys.append((cand, metric, cue, stat))
                cols.append(per_group[stat])
                masks.append(mask)
        keys.append((cand, metric, "all", "source_error"))
        cols.append(per_group["source_error"])
        masks.append(np.ones(lay.src.shape, dtype=bool))
    mask_m = np.column_stack(masks).astype(np.float64)
    mv = mask_m * np.nan_to_num(np.column_stack(cols), nan=0.0)
    # per bootstrap group (situation / contrast, or the source scene alone): its scenes' sums
    n_groups = int(lay.group.max()) + 1
    if n_groups < MIN_GROUPS:  # the card's bootstrap says the same (diagnostics/_resample.py)
        warnings.warn(few_groups_message(n_groups, lay.unit), FewGroupsWarning, stacklevel=2)
    mv_g, mask_g = np.zeros((n_groups, mv.shape[1])), np.zeros((n_groups, mv.shape[1]))
    np.add.at(mv_g, lay.group, mv)
    np.add.at(mask_g, lay.group, mask_m)
    undefined_held = lay.held is None
    with np.errstate(invalid="ignore", divide="ignore"):
        point = mv.sum(axis=0) / mask_m.sum(axis=0)
        chunks = [
            (c @ mv_g) / (c @ mask_g) for c in draw_group_counts(n_groups, n_boot, gen, chunk_size)
        ]
    draws = np.concatenate(chunks, axis=0)
    n_of = {"all": int(lay.src.shape[0]), **{c: int((lay.cue == c).sum()) for c in CUES}}
    est: dict[tuple[str, str, str, str], Estimate] = {}
    for k, key in enumerate(keys):
        d = draws[:, k]
        value = float(point[k])
        if undefined_held and key[3] == "held_out":
            value, d = math.nan, np.full(d.shape, np.nan)
        est[key] = Estimate(value, _percentile_ci(d), n_of[key[2]])

    def families(cand: str, metric: str, cue: str) -> dict[str, FamilyReliance]:
        return {
            f: FamilyReliance(
                family=f,
                templates=ts,
                **{s: est[(cand, metric, cue, f"{s}@{f}")] for s in _FAMILY_STATS},
            )
            for f, ts in lay.families.items()
        }

    def candidate(cand: str, metric: str) -> CandidateReliance:
        cues: dict[str, CueReliance] = {
            cue: CueRelianceByFamily(
                cue=cue,
                **{s: est[(cand, metric, cue, s)] for s in _CUE_STATS},
                families=families(cand, metric, cue),
            )
            for cue in CUES
        }
        hard = candidate(cand, "hard") if metric == "probability" else None
        return CandidateReliance(
            name=cand,
            kind=kinds[cand],
            error=metric,
            source_error=est[(cand, metric, "all", "source_error")],
            cues=cues,
            hard=hard,
            notes=notes[cand],
        )

    cands = {c: candidate(c, "probability" if kinds[c] == "member" else "hard") for c in kinds}
    return RelianceResult(
        candidates=cands,
        n_sources=int(lay.src.shape[0]),
        n_scenes=len(table.edits),
        templates=tuple(t.name for t in table.edits.templates if not t.held_out),
        held_out=next((t.name for t in table.edits.templates if t.held_out), None),
        n_boot=n_boot,
        provenance={
            **dict(provenance or {}),
            "template_families": {f: list(ts) for f, ts in lay.families.items()},
        },
        draws={k: draws[:, i] for i, k in enumerate(keys)},
        resampling_unit=lay.unit,
        n_groups=n_groups,
    )


def _check_reliance(
    table: ScoreTable,
    members: Sequence[str] | None,
    pairs: Sequence[tuple[str, str]],
    guards: Sequence[GuardSpec],
    n_boot: int,
) -> None:
    if not isinstance(n_boot, (int, np.integer)) or isinstance(n_boot, bool) or n_boot < 1:
        raise DataError(f"n_boot must be an integer >= 1; got {n_boot!r}.")
    known = set(table.scores)
    wanted = list(members or []) + [m for p in pairs for m in p]
    wanted += [m for g in guards for m in g.members.values()]
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise DataError(
            f"member(s) {unknown} have no scores in the table (it has {sorted(known)}); "
            "score them with score_edit_set first."
        )
    names = list(members or known) + [f"{a}+{b}" for a, b in pairs] + [g.name for g in guards]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DataError(f"candidate names must be unique; {dupes} appear twice. Rename them.")
