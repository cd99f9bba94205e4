"""The deployment card: compute every field, then write ``card.json``, ``card.md``, ``card.html``.

:func:`compute_card` returns a :class:`Card` (numbers only, no plotting); :func:`write_card`
computes it and writes the three files.  Every number in ``card.json`` is
``{"value", "ci": [low, high], "n"}`` (NaN as ``null``) under stable keys; the keys of
``fields`` are listed in :data:`FIELD_KEYS`.  All rates are fractions (0.69, not 69 %).
"""

from __future__ import annotations

import html
import json
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
from spotstop.diagnostics._bootstrap import (
    _as_rng,
    _percentile_ci,
    bootstrap_auroc,
    draw_group_counts,
    group_bootstrap,
    label_swap_null,
)
from spotstop.diagnostics._checks import (
    conformal_audit,
    prevalence_check,
    scene_blind_readers,
    situation_share,
)
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._metrics import balanced_accuracy, kernel_reference, spot_stop
from spotstop.diagnostics._plots import (
    PrevalenceDisplay,
    RocDisplay,
    ScoreDisplay,
    SplitDisplay,
    to_svg,
)
from spotstop.diagnostics._results import NAN_CI, ConfidenceInterval, Estimate

__all__ = ["EXPLANATIONS", "FIELD_KEYS", "Card", "compute_card", "write_card"]

SCHEMA_VERSION = 1

#: one sentence per field: what it means and what to do
EXPLANATIONS: dict[str, str] = {
    "auroc": "How well the score ranks unsafe above safe scenes (0.5 chance, 1 perfect); low → "
    "the score itself is weak: change or pair the members, no threshold fixes it.",
    "auroc_all_cases": "AUROC over every case, paired or not; far from `auroc` → the paired "
    "cases are not representative of the log.",
    "balanced_accuracy": "Mean of the hit rate and the correct-allow rate of the direct answer "
    "(score > policy cut) over all cases; this is what the guard delivers today.",
    "R": "Ranking rate: share of contrasts whose unsafe scene scores higher (ties not ordered).",
    "L": "Share of contrasts with both scenes labelled correctly at the policy cut.",
    "W": "Share of contrasts with both scenes labelled wrongly; large → the scores are inverted.",
    "C": "L + W, the contrasts whose two scenes get different labels.",
    "A": "Accuracy of the direct answer on the paired cases (A = ½ + L − C/2).",
    "A_star": "Best balanced accuracy any single cut reaches (needs labels: a ceiling, not a "
    "rule); far above A → the cut is misplaced.",
    "G": "The Spot-Stop gap R − L.",
    "null_gap": "E[G0] = (1 − C)/2, the gap a label swap inside each pair would show anyway; "
    "subtract it before reading G.",
    "R_minus_A": "Excess of ranking over labelling beyond the label-swap null (G − E[G0]); "
    "large → the score knows more than the answer says: read the three parts below.",
    "threshold_part": "A* − A, what one shared cut could still fix; large → recalibrate (batch "
    "mean, frozen reference or a cut fitted on labelled cases).",
    "overlap_part": "AUROC − A*, accuracy lost because safe and unsafe scores overlap; only a "
    "better score (better members, Avg-2) reduces it. Compare with g_auroc.",
    "within_part": "R − AUROC, order that holds only inside a contrast; large → a reference "
    "scene from the same situation can recentre the score (situation policy).",
    "g_auroc": "Overlap an equal-variance binormal score with this AUROC would show, "
    "AUROC − Φ(Φ⁻¹(AUROC)/√2); a reference, not a bound.",
    "excess_beyond_g": "R − A − g(AUROC), the excess left after the gap a binormal score "
    "expects; interval above 0 → the gap is more than forced choice beating yes/no.",
    "kernel_overlap_reference": "Overlap part a kernel-smoothed ROC of these scores predicts; "
    "overlap_part outside its interval → the empirical ROC has dips or ties.",
    "cross_fitted_threshold_part": "Threshold part with the cut chosen on half of the groups "
    "and scored on the other half; the honest share a recalibration can recover.",
    "A_batch": "Accuracy on the paired cases after recentering on the batch mean (refitted "
    "in every draw).",
    "batch_recovery": "Share of the threshold part that batch-mean recentering recovers on "
    "this log; near 1 → recentering is enough here (watch prevalence below).",
    "hit_rate": "Share of unsafe paired scenes flagged at the policy cut; low → the guard "
    "lets unsafe actions through: lower the cut or use the conformal policy.",
    "false_alarm_rate": "Share of safe paired scenes flagged at the policy cut; high → the "
    "robot stops needlessly: raise the cut.",
    "d_prime": "Equal-variance sensitivity z(H) − z(F) at the policy cut (1/(2n) clipping).",
    "criterion": "Criterion c = −(z(H) + z(F))/2; far from 0 → the cut leans to one answer "
    "(positive: lenient, negative: strict): recentre.",
    "d_prime_auroc": "Sensitivity the ranking implies, √2 Φ⁻¹(AUROC).",
}

CHECK_EXPLANATIONS: dict[str, str] = {
    "label_swap_null": "Ranking rate and R − A under random label swaps inside contrasts; R "
    "below the null's 97.5th percentile → the score does not order these contrasts.",
    "prevalence": "Threshold rules on batches resampled to 50 %, 10 % and 100 % unsafe; the "
    "batch mean flags about half of any batch, so its hit rate falls when unsafe scenes are "
    "common → use a frozen or conformal cut where prevalence moves.",
    "situation_share": "Share of the label-adjusted score variance at situation level (ICC); "
    "high, with a recentering gain above 0 over artificial situations → use the situation "
    "policy.",
    "scene_blind": "Readers that never see the scene; a file reader AUROC well above 0.5 "
    "(e.g. 0.8) → the label leaks through the image files (size, format): control it before "
    "trusting the scene score; a high request-only AUROC → the text alone carries the label.",
    "conformal_audit": "Realized share of unsafe scenes the conformal cut allows, against its "
    "target alpha; above alpha → the calibration cases do not match the deployment.",
}

FIELD_KEYS = tuple(EXPLANATIONS)


@dataclass(frozen=True)
class Card:
    """The card's numbers: ``fields`` (key → :class:`Estimate`), ``checks`` (nested JSON-ready
    dicts), ``settings`` and ``provenance``; ``displays`` hold the plot data."""

    fields: Mapping[str, Estimate]
    checks: Mapping[str, Any]
    settings: Mapping[str, Any]
    provenance: Mapping[str, Any]
    displays: Mapping[str, Any] = field(repr=False, default_factory=dict)

    def summary(self) -> str:
        """One line: ``R - A`` and its three parts, in points."""
        f = self.fields
        return (
            f"R − A = {100 * f['R_minus_A'].value:.1f} points (threshold "
            f"{100 * f['threshold_part'].value:.1f}, overlap {100 * f['overlap_part'].value:.1f}, "
            f"within {100 * f['within_part'].value:.1f})"
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``card.json``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "settings": dict(self.settings),
            "provenance": dict(self.provenance),
            "fields": {k: v.to_dict() for k, v in self.fields.items()},
            "checks": _jsonable(self.checks),
            "explanations": {
                **EXPLANATIONS,
                **{f"checks.{k}": v for k, v in CHECK_EXPLANATIONS.items()},
            },
        }


def _jsonable(x: Any) -> Any:
    if isinstance(x, Estimate):
        return x.to_dict()
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(float(x)) else float(x)
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    return x


def _scalar(value: float, n: int) -> Estimate:
    return Estimate(float(value), NAN_CI, n)


def _version() -> str:
    try:
        return metadata.version("spotstop")
    except metadata.PackageNotFoundError:
        return "unknown"


def compute_card(
    table: CaseTable,
    *,
    policy_cut: float = 0.0,
    n_boot: int = 10_000,
    n_boot_checks: int = 1000,
    n_boot_kernel: int = 200,
    alpha: float = 0.1,
    rng: np.random.Generator | int | None = None,
    provenance: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Card:
    """Compute every field and check of the card (no plotting, no files).

    ``n_boot`` draws for the Spot-Stop fields, ``n_boot_checks`` for the AUROC and
    situation-share intervals of the checks, ``n_boot_kernel`` (looped, so fewer) for the
    interval of the kernel reference.  Undefined quantities are NaN (their warnings are
    collected into ``settings["warnings"]``).
    """
    gen = _as_rng(rng)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UndefinedMetricWarning)
        ss = spot_stop(table, policy_cut)
        boot = group_bootstrap(table, cut=policy_cut, n_boot=n_boot, rng=gen, progress=progress)
        fields: dict[str, Estimate] = {}
        fields["auroc"] = boot["auroc"]
        fields["auroc_all_cases"] = bootstrap_auroc(
            table.label, table.score, table.group, n_boot=n_boot_checks, rng=gen
        )
        fields["balanced_accuracy"] = _ba_estimate(table, policy_cut, n_boot_checks, gen)
        for k in ("R", "L", "W", "C", "A", "A_star", "G", "null_gap", "R_minus_A"):
            fields[k] = boot[k]
        for k in ("threshold_part", "overlap_part", "within_part", "g_auroc", "excess_beyond_g"):
            fields[k] = boot[k]
        fields["kernel_overlap_reference"] = _kernel_estimate(table, n_boot_kernel, gen)
        for k in (
            "cross_fitted_threshold_part",
            "A_batch",
            "batch_recovery",
            "hit_rate",
            "false_alarm_rate",
            "d_prime",
            "criterion",
        ):
            fields[k] = boot[k]
        fields["d_prime_auroc"] = _scalar(ss.d_prime_auroc, ss.n_pairs)
        null = label_swap_null(table, cut=policy_cut, n_draws=n_boot, rng=gen)
        prev = prevalence_check(
            table,
            policy_cut=policy_cut,
            prevalences=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            alpha=alpha,
            rng=gen,
        )
        sit = situation_share(table, n_boot=n_boot_checks, rng=gen)
        blind = scene_blind_readers(table, n_boot=n_boot_checks, rng=gen)
        conf = conformal_audit(table, alpha=alpha, rng=gen)
    checks: dict[str, Any] = {
        "label_swap_null": {
            "R_null_q975": _scalar(null.R_q975, null.n_draws),
            "R_null_mean": _scalar(
                float(np.mean(null.R0)) if null.n_draws else math.nan, null.n_draws
            ),
            "null_gap_mean": _scalar(null.mean_G0 if null.n_draws else math.nan, null.n_draws),
            "p_R": _scalar(null.p_R, null.n_draws),
            "p_R_minus_A": _scalar(null.p_excess, null.n_draws),
        },
        "prevalence": {
            f"unsafe_{round(100 * p)}": {
                "rules": {
                    rule: {
                        "balanced_accuracy": o.balanced_accuracy,
                        "tpr": o.tpr,
                        "fpr": o.fpr,
                    }
                    for rule, o in prev.rules[p].items()
                },
                "batch_recovery": prev.recovery[p],
            }
            for p in (0.5, 0.1, 1.0, 0.25, 0.75, 0.9)
        },
        "situation_share": {
            "icc": sit.icc,
            "ba_gain_vs_artificial": sit.ba_gain,
            "auroc_gain_vs_artificial": sit.auroc_gain,
            "ba_situation": _scalar(sit.ba_real, sit.icc.n),
            "ba_artificial": _scalar(sit.ba_artificial, sit.icc.n),
            "ba_global_batch_mean": _scalar(sit.ba_global, sit.icc.n),
            "auroc_centred": _scalar(sit.auroc_real, sit.icc.n),
            "auroc_centred_artificial": _scalar(sit.auroc_artificial, sit.icc.n),
            "n_situations": sit.n_situations,
        },
        "scene_blind": {
            "file_reader_auroc": blind.file_reader,
            "file_reader_permutation_p": _scalar(blind.file_reader_p, len(table)),
            "file_features": list(blind.file_features),
            "longest_side": None
            if blind.longest_side is None
            else {
                "accuracy": blind.longest_side.accuracy,
                "cut": blind.longest_side.cut,
                "direction": blind.longest_side.direction,
                "cut_share": blind.longest_side.cut_share,
            },
            "request_only_auroc": blind.request_only,
            "image_minus_gray_auroc": blind.image_minus_gray,
            "member_auroc": dict(blind.members),
        },
        "conformal_audit": {
            "alpha": conf.alpha,
            "miss_rate": conf.miss_rate,
            "safe_allowed": conf.safe_allowed,
            "expected_miss": conf.expected_miss,
            "within_target": conf.within_target,
        },
    }
    settings = {
        "policy_cut": policy_cut,
        "n_boot": n_boot,
        "n_boot_checks": n_boot_checks,
        "n_boot_kernel": n_boot_kernel,
        "alpha": alpha,
        "n_cases": len(table),
        "n_unsafe": int(table.label.sum()),
        "n_pairs": table.pairs.n,
        "n_groups": table.n_groups,
        "interval": "95 % percentile interval of a group bootstrap (whole groups resampled)",
        "warnings": sorted({str(w.message) for w in caught}),
    }
    prov = {
        "spotstop_version": _version(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **dict(provenance or {}),
    }
    displays = _displays(table, ss, fields, prev)
    return Card(fields, checks, settings, prov, displays)


def _ba_estimate(table: CaseTable, cut: float, n_boot: int, gen: np.random.Generator) -> Estimate:
    """Balanced accuracy of ``score > cut`` on all cases with a group-bootstrap interval."""
    y, g, ng = table.label, table.group, table.n_groups
    flag = table.score > cut
    per = [np.bincount(g, weights=x.astype(float), minlength=ng) for x in (
        (y == 1) & flag, y == 1, (y == 0) & ~flag, y == 0)]  # fmt: skip
    point = balanced_accuracy(y, table.score, cut)
    draws = []
    for counts in draw_group_counts(ng, n_boot, gen):
        with np.errstate(invalid="ignore", divide="ignore"):
            draws.append(
                0.5 * (counts @ per[0] / (counts @ per[1]) + counts @ per[2] / (counts @ per[3]))
            )
    return Estimate(point, _percentile_ci(np.concatenate(draws)), len(table))


def _kernel_estimate(table: CaseTable, n_draws: int, gen: np.random.Generator) -> Estimate:
    pairs = table.pairs
    paired = pairs.weight > 0
    if pairs.n == 0:
        return Estimate(math.nan, NAN_CI, 0)
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
    d = np.asarray(draws)
    d = d[np.isfinite(d)]
    ci = ConfidenceInterval(*map(float, np.percentile(d, [2.5, 97.5]))) if d.size else NAN_CI
    return Estimate(point, ci, pairs.n)


def _displays(
    table: CaseTable, ss: Any, fields: Mapping[str, Estimate], prev: Any
) -> dict[str, Any]:
    pairs = table.pairs
    paired = pairs.weight > 0
    out: dict[str, Any] = {}
    if paired.any():
        y, s, w = table.label[paired], table.score[paired], pairs.weight[paired]
        cuts = {
            "policy cut": ss.cut,
            "best cut (A*)": ss.cut_star,
            "batch mean": float(table.score.mean()),
        }
        if len(set(y.tolist())) == 2:
            out["roc"] = RocDisplay.from_scores(y, s, w, cuts, ss.auroc)
        names = ("R − A", "threshold", "overlap", "within")
        keys = ("R_minus_A", "threshold_part", "overlap_part", "within_part")
        out["split"] = SplitDisplay(
            names,
            np.array([fields[k].value for k in keys]),
            np.array([fields[k].ci.low for k in keys]),
            np.array([fields[k].ci.high for k in keys]),
            fields["g_auroc"].value,
        )
    else:
        cuts = {"policy cut": ss.cut}
    out["scores"] = ScoreDisplay.from_scores(table.label, table.score, cuts)
    ps = np.array(sorted(prev.rules))
    out["prevalence"] = PrevalenceDisplay(
        ps,
        {
            r: np.array([prev.rules[p][r].balanced_accuracy.value for p in ps])
            for r in ("batch_mean", "frozen", "conformal")
        },
        {
            r: np.array([prev.rules[p][r].tpr.value for p in ps])
            for r in ("batch_mean", "frozen", "conformal")
        },
    )
    return out


# --------------------------------------------------------------------------------------------
# writers


def _fmt(e: Estimate | None, pct: bool = True) -> str:
    if e is None:
        return "not available"
    k = 100.0 if pct else 1.0
    if math.isnan(e.value):
        return "undefined (NaN)"
    s = f"{k * e.value:.1f}" if pct else f"{e.value:.3f}"
    if not math.isnan(e.ci.low):
        s += (
            f" [{k * e.ci.low:.1f}, {k * e.ci.high:.1f}]"
            if pct
            else f" [{e.ci.low:.3f}, {e.ci.high:.3f}]"
        )
    return s


_NOT_PCT = {"auroc", "auroc_all_cases", "d_prime", "criterion", "d_prime_auroc", "batch_recovery"}


def _field_rows(card: Card) -> list[tuple[str, str, str]]:
    return [(k, _fmt(e, pct=k not in _NOT_PCT), EXPLANATIONS[k]) for k, e in card.fields.items()]


def _check_rows(card: Card) -> list[tuple[str, str, str]]:
    c = card.checks
    rows = []
    n = c["label_swap_null"]
    rows.append(
        (
            "label_swap_null",
            f"R null 97.5 %: {_fmt(n['R_null_q975'])}; p(R) = {_fmt(n['p_R'], False)}; p(R − A) = {_fmt(n['p_R_minus_A'], False)}",
            CHECK_EXPLANATIONS["label_swap_null"],
        )
    )
    pv = c["prevalence"]
    parts = []
    for key, label in (("unsafe_50", "50 %"), ("unsafe_10", "10 %")):
        r = pv[key]["rules"]
        parts.append(
            f"{label} unsafe: BA batch {_fmt(r['batch_mean']['balanced_accuracy'])}, frozen {_fmt(r['frozen']['balanced_accuracy'])}, conformal {_fmt(r['conformal']['balanced_accuracy'])}; recovery {_fmt(pv[key]['batch_recovery'], False)}"
        )
    r = pv["unsafe_100"]["rules"]
    parts.append(
        f"all unsafe: flagged batch {_fmt(r['batch_mean']['tpr'])}, frozen {_fmt(r['frozen']['tpr'])}, conformal {_fmt(r['conformal']['tpr'])}"
    )
    rows.append(("prevalence", "<br>".join(parts), CHECK_EXPLANATIONS["prevalence"]))
    s = c["situation_share"]
    rows.append(
        (
            "situation_share",
            f"ICC {_fmt(s['icc'], False)}; BA gain vs artificial {_fmt(s['ba_gain_vs_artificial'])}; AUROC gain {_fmt(s['auroc_gain_vs_artificial'], False)}",
            CHECK_EXPLANATIONS["situation_share"],
        )
    )
    b = c["scene_blind"]
    ls = b["longest_side"]
    ls_txt = (
        "not available"
        if ls is None
        else f"{_fmt(ls['accuracy'])} (longest side {ls['direction']} {ls['cut']:g}, chosen in {100 * ls['cut_share']:.0f} % of splits)"
    )
    rows.append(
        (
            "scene_blind",
            f"file reader AUROC {_fmt(b['file_reader_auroc'], False)} (p = {_fmt(b['file_reader_permutation_p'], False)}); longest-side rule accuracy {ls_txt}; request-only AUROC {_fmt(b['request_only_auroc'], False)}; image − gray AUROC {_fmt(b['image_minus_gray_auroc'], False)}",
            CHECK_EXPLANATIONS["scene_blind"],
        )
    )
    a = c["conformal_audit"]
    rows.append(
        (
            "conformal_audit",
            f"alpha {a['alpha']:g}: miss rate {_fmt(a['miss_rate'])}, safe allowed {_fmt(a['safe_allowed'])}, expected miss {100 * a['expected_miss']:.1f}"
            if not math.isnan(a["expected_miss"])
            else "undefined",
            CHECK_EXPLANATIONS["conformal_audit"],
        )
    )
    return rows


def _markdown(card: Card) -> str:
    st = card.settings
    lines = [
        "# spotstop deployment card",
        "",
        f"{st['n_cases']} cases ({st['n_unsafe']} unsafe), {st['n_pairs']} contrasts, "
        f"{st['n_groups']} groups; policy cut {st['policy_cut']:g}; {st['interval']}, "
        f"{st['n_boot']} draws. Rates in %, AUROC and d′ as numbers.",
        "",
        "| field | value [95 % CI] | meaning and what to do |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{k}` | {v} | {e} |" for k, v, e in _field_rows(card)]
    lines += [
        "",
        "## Checks",
        "",
        "| check | result | meaning and what to do |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{k}` | {v} | {e} |" for k, v, e in _check_rows(card)]
    if st["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in st["warnings"]]
    lines += ["", "## Provenance", ""] + [f"- {k}: {v}" for k, v in card.provenance.items()]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;color:#222}"
    "table{border-collapse:collapse;width:100%;font-size:13px}td,th{border:1px solid #ccc;"
    "padding:3px 6px;vertical-align:top}th{background:#eee}code{font-size:12px}"
    ".plots{display:flex;flex-wrap:wrap;gap:8px}.plots svg{width:420px;height:auto}"
)


def _html(card: Card, svgs: Mapping[str, str]) -> str:
    st = card.settings
    e = html.escape

    def table(rows: list[tuple[str, str, str]], head: str) -> str:
        body = "".join(
            f"<tr><td><code>{e(k)}</code></td><td>{v}</td><td>{e(x)}</td></tr>" for k, v, x in rows
        )
        return f"<table><tr><th>{head}</th><th>value [95 % CI]</th><th>meaning and what to do</th></tr>{body}</table>"

    warn = "".join(f"<li>{e(w)}</li>" for w in st["warnings"])
    prov = "".join(f"<li>{e(str(k))}: {e(str(v))}</li>" for k, v in card.provenance.items())
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>spotstop card</title>"
        f"<style>{_CSS}</style></head><body><h1>spotstop deployment card</h1>"
        f"<p>{st['n_cases']} cases ({st['n_unsafe']} unsafe), {st['n_pairs']} contrasts, "
        f"{st['n_groups']} groups; policy cut {st['policy_cut']:g}; {e(st['interval'])}, "
        f"{st['n_boot']} draws. Rates in %, AUROC and d′ as numbers.</p>"
        f"<div class='plots'>{''.join(svgs.values())}</div>"
        f"{table(_field_rows(card), 'field')}<h2>Checks</h2>{table(_check_rows(card), 'check')}"
        + (f"<h2>Warnings</h2><ul>{warn}</ul>" if warn else "")
        + f"<h2>Provenance</h2><ul>{prov}</ul></body></html>\n"
    )


def write_card(
    table: CaseTable,
    out_dir: str | Path,
    *,
    policy_cut: float = 0.0,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    provenance: Mapping[str, Any] | None = None,
    progress: bool = False,
    **kwargs: Any,
) -> Card:
    """Compute the card and write ``card.json``, ``card.md`` and a self-contained
    ``card.html`` (inline SVG plots) into ``out_dir`` (created if needed).

    Extra keyword arguments go to :func:`compute_card`.
    """
    card = compute_card(
        table,
        policy_cut=policy_cut,
        n_boot=n_boot,
        rng=rng,
        provenance=provenance,
        progress=progress,
        **kwargs,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(
        json.dumps(card.to_json(), indent=1, allow_nan=False) + "\n", encoding="utf-8"
    )
    (out / "card.md").write_text(_markdown(card), encoding="utf-8")
    svgs = {k: to_svg(d) for k, d in card.displays.items()}
    (out / "card.html").write_text(_html(card, svgs), encoding="utf-8")
    return card
