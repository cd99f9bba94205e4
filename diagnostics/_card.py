"""The deployment card: compute every part, then write ``card.json``, ``card.md``, ``card.html``.

:func:`compute_card` returns a :class:`Card` (numbers only, no plotting); :func:`write_card`
computes it and writes the three files (see :mod:`._render`).  The card holds

* the verdict (:mod:`._verdict`): four sentences or more, each with a status;
* what the guard delivered (:mod:`._delivered`, only from a decision log): the guard's own
  logged answers against the labels, overall (``delivered_balanced_accuracy``,
  ``delivered_hit_rate``, ``delivered_false_alarm_rate``) and per policy version
  (``delivered_by_policy``), each ``{"value", "ci", "n"}``;
* the Spot-Stop fields (:data:`FIELD_KEYS`), in the paper's convention: ``S > cut`` is the
  answer UNSAFE, at the card's direct cut (``settings.direct_cut``);
* every registered check (:data:`~spotstop.diagnostics._checks.CARD_CHECKS`) under
  ``checks.<name>``.

Every number in ``card.json`` is ``{"value", "ci": [low, high], "n"}`` (NaN as ``null``).
All rates are fractions (0.69, not 69 %).
"""

from __future__ import annotations

import math
import platform
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._batch_rule import (
    BATCH_FIELDS,
    BatchRule,
    batch_rule_bootstrap,
    batch_rule_for,
)
from spotstop.diagnostics._bootstrap import bootstrap_auroc, group_bootstrap
from spotstop.diagnostics._check_base import CardContext, CheckResult
from spotstop.diagnostics._checks import run_checks
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._delivered import Delivered, delivered, delivered_rates
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._explanations import (
    CONVENTION,
    DELIVERED_EXPLANATIONS,
    EXPLANATIONS,
    FIELD_KEYS,
)
from spotstop.diagnostics._from_log import LogData
from spotstop.diagnostics._metrics import direct_answer, kernel_reference, spot_stop
from spotstop.diagnostics._plots import RocDisplay, ScoreDisplay, SplitDisplay
from spotstop.diagnostics._recommend import Recommendation, recommend_for_card
from spotstop.diagnostics._render import write_files
from spotstop.diagnostics._resample import (
    as_rng,
    nan_estimate,
    percentile_ci,
    regroup,
    resampling_note,
)
from spotstop.diagnostics._results import Estimate
from spotstop.diagnostics._verdict import VerdictItem, check_previous, verdict
from spotstop.guard.policies import mean_cut, unsafe_mask

__all__ = [
    "DELIVERED_EXPLANATIONS",
    "EXPLANATIONS",
    "FIELD_KEYS",
    "SCHEMA_VERSION",
    "Card",
    "CutWarning",
    "compute_card",
    "cut_ties",
    "write_card",
]

SCHEMA_VERSION = 2

#: a warning when this share of the scores (or more) equals the card's cut
TIE_SHARE_WARN = 0.05


class CutWarning(UserWarning):
    """The card's cut sits badly on the scores: all on one side of it, or many equal to it."""


def _side(flag: bool) -> str:
    return "UNSAFE" if flag else "SAFE"


def cut_ties(score: NDArray[np.float64], cut: float) -> dict[str, Any]:
    """How the scores sit at ``cut``: ``n_at_cut`` (equal to it), ``n_below``, ``n_above``,
    and ``tie_side``: where a score equal to the cut falls under the guard's rule
    (:func:`spotstop.guard.policies.unsafe_mask`, ``S ≥ t``) and under the paper's direct
    answer (:func:`~spotstop.diagnostics._metrics.direct_answer`, ``S > cut``)."""
    s = np.asarray(score, dtype=np.float64)
    at = np.array([cut], dtype=np.float64)
    return {
        "n_at_cut": int((s == cut).sum()),
        "n_below": int((s < cut).sum()),
        "n_above": int((s > cut).sum()),
        "tie_side": {
            "guard_rule": _side(bool(unsafe_mask(at, cut)[0])),
            "direct_answer": _side(bool(direct_answer(at, cut)[0])),
        },
    }


def _fmt_cut(x: float) -> str:
    return f"{x:.6g}"


def _cut_warnings(score: NDArray[np.float64], cut: float, ties: Mapping[str, Any]) -> list[str]:
    """The card's warnings about where its cut sits (also issued as :class:`CutWarning`)."""
    n = int(np.asarray(score).size)
    n_at, side = ties["n_at_cut"], ties["tie_side"]
    out = []
    if ties["n_below"] == 0 or ties["n_above"] == 0:
        where = "at or above" if ties["n_below"] == 0 else "at or below"
        out.append(
            f"All {n} scores lie {where} the cut {_fmt_cut(cut)} ({n_at} equal to it): one "
            "rule answers the same for every case. Is the cut on the score's scale? Pass the "
            "cut your guard uses with --cut."
        )
    if n and n_at / n >= TIE_SHARE_WARN:
        v = np.unique(np.asarray(score, dtype=np.float64))
        lo, hi = v[v < cut], v[v > cut]
        between = [_fmt_cut((cut + x) / 2) for x in (lo[-1:].tolist() + hi[:1].tolist())]
        hint = (
            f"; to keep them on one side for both rules, put the cut between two score values "
            f"(e.g. --cut {' or --cut '.join(between)})"
            if between
            else ""
        )
        out.append(
            f"{n_at} of {n} scores ({100 * n_at / n:.1f} %) equal the cut {_fmt_cut(cut)}: the "
            f"direct answer (S > cut; the Spot-Stop fields) counts them {side['direct_answer']}, "
            f"the guard's rule (S ≥ t; the prevalence check's fixed cut) {side['guard_rule']}"
            f"{hint}."
        )
    for msg in out:
        warnings.warn(msg, CutWarning, stacklevel=3)
    return out


def _one_class_warning(table: CaseTable) -> list[str]:
    ids = table.one_class_contrasts
    if not ids:
        return []
    shown = ", ".join(ids[:10]) + (f", … ({len(ids) - 10} more)" if len(ids) > 10 else "")
    return [
        f"{len(ids)} contrast id(s) hold cases of one class only, form no pair and are left "
        f"out of the pair statistics: {shown}. Label their missing side or drop them."
    ]


#: Spot-Stop field -> the group bootstrap's statistic
_BOOT_NAME = {
    "direct_hit_rate": "hit_rate",
    "direct_false_alarm_rate": "false_alarm_rate",
    # the engine's batch statistics are the batch mean of the fixed S: batch_frozen_iqr
    "A_batch_frozen_iqr": "A_batch",
    "batch_frozen_iqr_gain": "batch_gain",
    "batch_frozen_iqr_recovery": "batch_recovery",
}


@dataclass(frozen=True)
class Card:
    """The card's numbers: ``verdict``, ``delivered`` (None without a log), ``fields`` (key →
    :class:`Estimate`), ``checks`` (name → :class:`CheckResult`) with their titles and
    explanations in ``check_info``, the ``recommendation``, ``settings``, ``provenance``;
    ``displays`` hold the plot data."""

    verdict: tuple[VerdictItem, ...]
    delivered: Delivered | None
    fields: Mapping[str, Estimate]
    checks: Mapping[str, CheckResult]
    check_info: Mapping[str, tuple[str, str]]
    recommendation: Recommendation
    settings: Mapping[str, Any]
    provenance: Mapping[str, Any]
    displays: Mapping[str, Any] = field(repr=False, default_factory=dict)

    def summary(self) -> str:
        """The verdict, one line per sentence with its status; first, when the log does not
        say every answer the robot got (its journal and dead letter), how many and how the
        figures take them (``settings["pending"]``), and when the cases were decided under
        several fusions, whose scores the Spot-Stop fields pool (``settings["pooled_fusions"]``)."""
        lines = [f"[{v.status}] {v.topic}: {v.sentence}" for v in self.verdict]
        pooled = self.settings.get("pooled_fusions")
        if pooled:
            lines.insert(0, f"[warn] scores: {pooled}")
        pending = self.settings.get("pending")
        if pending:
            lines.insert(0, f"[warn] decision log: {pending}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``card.json``."""
        doc = _body_json(self)
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": [v.to_dict() for v in self.verdict],
            **doc,
        }


def _delivered_json(d: Delivered | None) -> dict[str, Any]:
    if d is None:
        return {
            "delivered_balanced_accuracy": None,
            "delivered_hit_rate": None,
            "delivered_false_alarm_rate": None,
            "delivered_by_policy": {},
            "delivered_note": "no decision log: a scores CSV or the simulated log holds no guard answers",
        }
    return {
        "delivered_balanced_accuracy": d.overall.balanced_accuracy.to_dict(),
        "delivered_hit_rate": d.overall.hit_rate.to_dict(),
        "delivered_false_alarm_rate": d.overall.false_alarm_rate.to_dict(),
        "delivered_by_policy": {v: p.to_dict() for v, p in d.by_policy.items()},
        "delivered_note": f"{d.n_fail_closed_labelled} labelled fail-closed decision(s) left out"
        + (f"; {d.review_note}" if d.review_note else ""),
    }


def _body_json(card: Card) -> dict[str, Any]:
    return {
        **_delivered_json(card.delivered),
        "settings": _jsonable(card.settings),
        "provenance": _jsonable(card.provenance),
        "fields": {k: v.to_dict() for k, v in card.fields.items()},
        "checks": {k: _jsonable(r.data) for k, r in card.checks.items()},
        "recommendation": card.recommendation.to_dict(),
        "explanations": {
            **EXPLANATIONS,
            **DELIVERED_EXPLANATIONS,
            **{f"checks.{k}": info[1] for k, info in card.check_info.items()},
        },
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, Estimate):
        return x.to_dict()
    if hasattr(x, "to_dict") and not isinstance(x, Mapping):
        return _jsonable(x.to_dict())
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None  # NaN and ±inf: null
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def _version() -> str:
    try:
        return metadata.version("spotstop")
    except metadata.PackageNotFoundError:
        return "unknown"


def _kernel_estimate(table: CaseTable, n_draws: int, gen: np.random.Generator) -> Estimate:
    pairs = table.pairs
    paired = pairs.weight > 0
    if pairs.n == 0:
        return nan_estimate()
    y, s, w, g = table.label[paired], table.score[paired], pairs.weight[paired], table.group[paired]
    point = kernel_reference(y, s, sample_weight=w).overlap
    ng = table.n_groups
    draws = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for _ in range(n_draws):
            counts = np.bincount(gen.integers(0, ng, ng), minlength=ng)
            wb = w * counts[g]
            keep = wb > 0
            draws.append(kernel_reference(y[keep], s[keep], sample_weight=wb[keep]).overlap)
    return Estimate(point, percentile_ci(np.asarray(draws)), pairs.n)


def _fields(
    table: CaseTable,
    cut: float,
    n_boot: int,
    n_checks: int,
    n_kernel: int,
    gen: Any,
    progress: bool,
    group_by: str = "situation",
    ray: str | bool | None = None,
    rule: BatchRule | None = None,
) -> tuple[dict[str, Estimate], Any]:
    ss = spot_stop(table, cut)
    boot = group_bootstrap(
        table, cut=cut, n_boot=n_boot, rng=gen, progress=progress, group_by=group_by, ray=ray
    )
    # the paper's batch rule refitted on every draw (a loop over draws: the checks' draws)
    batch = batch_rule_bootstrap(table, rule, cut=cut, n_boot=n_checks, rng=gen, group_by=group_by)
    out: dict[str, Estimate] = {}
    for k in FIELD_KEYS:
        if k in BATCH_FIELDS:
            out[k] = batch[k]
        elif k == "auroc_all_cases":
            out[k] = bootstrap_auroc(
                table.label, table.score, table.group, n_boot=n_checks, rng=gen
            )
        elif k == "direct_balanced_accuracy":
            out[k] = delivered_rates(
                table.label,
                direct_answer(table.score, cut).astype(np.int8),
                table.group,
                n_boot=n_checks,
                rng=gen,
                what="the direct answer",
            ).balanced_accuracy
        elif k == "kernel_overlap_reference":
            out[k] = _kernel_estimate(table, n_kernel, gen)
        elif k == "d_prime_auroc":
            out[k] = Estimate.point(ss.d_prime_auroc, ss.n_pairs, ss.d_prime_auroc_bound)
        else:
            out[k] = boot[_BOOT_NAME.get(k, k)]
    return out, ss


def compute_card(
    table: CaseTable,
    *,
    direct_cut: float = 0.0,
    direct_cut_source: str = "the direct answer",
    direct_cut_note: str = "",
    log: LogData | None = None,
    cues_dir: str | Path | None = None,
    previous: Mapping[str, Any] | None = None,
    n_boot: int = 10_000,
    n_boot_checks: int = 1000,
    n_boot_kernel: int = 200,
    alpha: float = 0.1,
    delta: float = 0.1,
    rng: np.random.Generator | int | None = None,
    provenance: Mapping[str, Any] | None = None,
    progress: bool = False,
    group_by: str = "situation",
    period: str | None = None,
    drift_baseline: str = "first",
    ray: str | bool | None = None,
) -> Card:
    """Compute the verdict, the delivered rates, every field and every check (no files).

    ``table``: the labelled cases; ``log``: the decision log they came from (None for a scores
    CSV or the simulated log: no delivered rates, no audit of a deployed cut); ``direct_cut``: the cut
    of the paper's direct answer for the Spot-Stop fields, ``direct_cut_source`` a short name
    for it (quoted by the verdict) and ``direct_cut_note`` why it is that cut; ``previous``: an earlier ``card.json`` of the same bundle (refused otherwise).
    ``n_boot`` draws for the Spot-Stop fields, ``n_boot_checks`` for the checks, the
    delivered rates and the batch rule's fields (``A_batch``, ``batch_gain``,
    ``batch_recovery``: the guard's ``BatchPolicy`` refitted on every draw, a loop over draws;
    :mod:`~spotstop.diagnostics._batch_rule`), ``n_boot_kernel`` (looped) for the kernel reference; ``alpha`` and
    ``delta``: the conformal target of the what-if computations.  Undefined quantities are
    NaN; their warnings are collected into ``settings["warnings"]``.  ``group_by``: the
    resampling unit of every group bootstrap, split and fold (``"situation"``: contrast and
    situation ids together; ``"contrast"``: contrasts alone), named in the header.
    ``period`` (``day``, ``week``, ``month``) adds the drift between periods
    (:mod:`~spotstop.diagnostics._periods`), each compared with the ``drift_baseline``
    (``first`` or ``previous``) period.  ``ray``: run the Spot-Stop fields' group bootstrap
    (the ``n_boot`` draws) as Ray tasks (True: ``$RAY_ADDRESS`` or a local Ray; a string: that
    address; see :func:`~spotstop.diagnostics.group_bootstrap`): the same card as without.
    """
    table = regroup(table, group_by)
    gen = as_rng(rng)
    prov = {
        "spotstop_version": _version(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **dict(provenance or {}),
    }
    if previous is not None:
        check_previous(previous, prov.get("bundle_ids"))
    ties = cut_ties(table.score, direct_cut)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UndefinedMetricWarning)
        warnings.simplefilter("always", CutWarning)
        cut_notes = _cut_warnings(table.score, direct_cut, ties)
        rule = batch_rule_for(table, log, fallback_cut=direct_cut)
        fields, ss = _fields(
            table,
            direct_cut,
            n_boot,
            n_boot_checks,
            n_boot_kernel,
            gen,
            progress,
            group_by,
            ray,
            rule,
        )
        ctx = CardContext(
            table=table,
            direct_cut=direct_cut,
            rng=gen,
            n_boot=n_boot_checks,
            alpha=alpha,
            delta=delta,
            log=log,
            cues_dir=None if cues_dir is None else Path(cues_dir),
            progress=progress,
            period=period,
            drift_baseline=drift_baseline,
        )
        ran = run_checks(ctx)
        dlv = None if log is None else delivered(log, n_boot=n_boot_checks, rng=gen)
        shown = ran.get("prevalence")  # the numbers the card's prevalence table shows
        rec = recommend_for_card(
            table,
            log,
            frozen_cut=direct_cut,
            rng=gen,
            prevalence=None if shown is None else shown[1].result,
        )
    checks = {k: r for k, (_, r) in ran.items()}
    info = {k: (cls.title, cls.explanation) for k, (cls, _) in ran.items()}
    fusion_keys = prov.get("fusion_keys") or []
    notes = cut_notes + sorted(
        ({str(w.message) for w in caught} | set(rec.warnings)) - set(cut_notes)
    )
    notes += _one_class_warning(table)
    decided = set() if log is None else set(log.version.tolist())
    for v, err in ({} if log is None else log.policy_errors).items():
        if v in decided:  # its decisions cannot be replayed nor audited
            notes.append(
                f"the policy document of {v}, which decided in this log, does not load ({err}): "
                "its answers are not replayed and its cut is not audited."
            )
    pooled = ""
    if len(fusion_keys) > 1:
        pooled = (
            f"the cases were decided under {len(fusion_keys)} fusions ({', '.join(fusion_keys)}); "
            "their fused scores are on different scales, pooled in the Spot-Stop fields."
        )
        notes.append(pooled)
    pending = "" if log is None else log.pending.message()
    if pending:  # what the robot received is not what the log's rows say (yet)
        notes.insert(0, f"the decision log does not say every answer the robot got: {pending}")
    settings = {
        "pending": pending,
        "pooled_fusions": pooled,
        "direct_cut": direct_cut,
        "direct_cut_source": direct_cut_source,
        "direct_cut_note": direct_cut_note or direct_cut_source,
        "convention": CONVENTION,
        "ties_at_direct_cut": ties["n_at_cut"],
        "n_at_cut": ties["n_at_cut"],
        "tie_side": ties["tie_side"],
        "cut_rules": {
            "fields": "S > cut (the paper's direct answer)",
            "checks.prevalence.frozen": "S ≥ cut (the guard's rule)",
            "checks.prevalence.batch": "S_B ≥ its batch mean, S_B Avg-2 refitted on the batch "
            "(the guard's batch policy)",
            "checks.prevalence.batch_frozen_iqr": "S ≥ batch mean (the guard's "
            "batch_frozen_iqr policy)",
            "fields.A_batch": "the guard's batch policy on each draw's cases",
            "fields.A_batch_frozen_iqr": "S ≥ batch mean of the draw (batch_frozen_iqr)",
        },
        "cut_warnings": cut_notes,
        "n_one_class_contrasts": len(table.one_class_contrasts),
        "n_boot": n_boot,
        "n_boot_checks": n_boot_checks,
        "batch_rule": None if rule is None else rule.note,
        "n_boot_kernel": n_boot_kernel,
        "alpha": alpha,
        "delta": delta,
        "n_cases": len(table),
        "n_unsafe": int(table.label.sum()),
        "n_pairs": table.pairs.n,
        "n_groups": table.n_groups,
        "group_by": group_by,
        "interval": resampling_note(table.n_groups, group_by),
        "warnings": notes,
    }
    displays = {**_displays(table, ss, fields), **{
        k: v for r in checks.values() for k, v in r.displays.items()
    }}  # fmt: skip
    deployed, version = _deployed(log)
    loaded = None if log is None or version is None else log.policies.get(version)
    deployed_policy = None if loaded is None else loaded.policy
    card = Card((), dlv, fields, checks, info, rec, settings, prov, displays)
    items = verdict(
        fields=fields,
        checks={k: r.result for k, r in checks.items()},
        recommendation=rec,
        deployed_kind=deployed,
        deployed_version=version,
        deployed_policy=deployed_policy,
        direct_cut=direct_cut,
        direct_cut_source=direct_cut_source,
        previous=previous,
        current=_body_json(card) if previous is not None else None,
        n_groups=table.n_groups,
    )
    return Card(items, dlv, fields, checks, info, rec, settings, prov, displays)


def _deployed(log: LogData | None) -> tuple[str | None, str | None]:
    """The deployed policy's kind and version: the stored policy that made the log's last
    decision (in log order; its kind from its document, else from its rows when the document
    does not load), else the last one stored; ``("unknown", None)`` when the log stores none;
    (None, None) without a log."""
    if log is None:
        return None, None
    v = log.deployed_version(loaded_only=False)
    if v is None:
        return "unknown", None
    return log.kind_of(v) or "unknown", v


def _displays(table: CaseTable, ss: Any, fields: Mapping[str, Estimate]) -> dict[str, Any]:
    """The plot data; each operating point is named with the rule it uses (the direct answer
    ``S > cut`` or the guard's ``S ≥ t``), and computed with that rule's one function."""
    pairs = table.pairs
    paired = pairs.weight > 0
    out: dict[str, Any] = {}
    mean = mean_cut(table.score)
    direct = f"direct cut (S > {ss.cut:.4g})"
    cuts = {direct: ss.cut}
    if paired.any():
        y, s, w = table.label[paired], table.score[paired], pairs.weight[paired]
        star = f"best cut A* (S > {ss.cut_star:.4g})"
        batch = f"batch_frozen_iqr: batch mean (S ≥ {mean:.4g}, the guard's rule)"
        cuts.update({star: ss.cut_star, batch: mean})
        if len(set(y.tolist())) == 2:
            flags = {
                direct: direct_answer(s, ss.cut),
                star: direct_answer(s, ss.cut_star),
                batch: unsafe_mask(s, mean),
            }
            out["roc"] = RocDisplay.from_scores(y, s, w, flags, ss.auroc)
        # ties count one half: R½ − A = threshold + overlap + within exactly (R − A adds the
        # tie part, a field of its own)
        keys = ("R_half_minus_A", "threshold_part", "overlap_part", "within_part")
        out["split"] = SplitDisplay(
            ("R½ − A", "threshold", "overlap", "within"),
            np.array([fields[k].value for k in keys]),
            np.array([fields[k].ci.low for k in keys]),
            np.array([fields[k].ci.high for k in keys]),
            fields["g_auroc"].value,
        )
    out["scores"] = ScoreDisplay.from_scores(table.label, table.score, cuts)
    return out


def write_card(table: CaseTable, out_dir: str | Path, **kwargs: Any) -> Card:
    """Compute the card (keyword arguments go to :func:`compute_card`) and write
    ``card.json``, ``card.md`` and a self-contained ``card.html`` (inline SVG plots) into
    ``out_dir`` (created if needed)."""
    card = compute_card(table, **kwargs)
    write_files(card, Path(out_dir))
    return card
