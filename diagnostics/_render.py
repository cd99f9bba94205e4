"""Writing a computed card: ``card.json``, ``card.md`` and a self-contained ``card.html``.

Both documents lead with the verdict, then what the guard delivered, the Spot-Stop fields and
one section per registered check (rendered from its rows, the same way for every check).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from spotstop.diagnostics._check_base import fmt
from spotstop.diagnostics._explanations import EXPLANATIONS
from spotstop.diagnostics._plots import to_svg
from spotstop.diagnostics._results import Estimate
from spotstop.guard._files import atomic_write_text

if TYPE_CHECKING:
    from spotstop.diagnostics._card import Card

__all__ = ["markdown", "page", "write_files"]

MARK = {"ok": "✅ ok", "warn": "⚠️ warn", "fail": "❌ fail"}
_COLOUR = {"ok": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e"}

#: fields shown as numbers, not percentages
_NOT_PCT = {"auroc", "auroc_all_cases", "d_prime", "criterion", "d_prime_auroc", "batch_recovery",
            "batch_frozen_iqr_recovery"}  # fmt: skip


def _head(card: Card) -> str:
    st = card.settings
    return (
        f"{st['n_cases']} labelled cases ({st['n_unsafe']} unsafe), {st['n_pairs']} contrasts, "
        f"{st['n_groups']} groups; {st['interval']}, {st['n_boot']} draws for the Spot-Stop "
        f"fields, {st['n_boot_checks']} for the rest. Rates in %, AUROC and d′ as numbers."
    )


def _cut_text(card: Card) -> str:
    """The card's cut, which rule each number uses, and how many scores equal the cut."""
    st = card.settings
    cut = f"{st['direct_cut']:.6g}"
    text = f"Direct cut S > {cut}: {st['direct_cut_note']}. {st['convention']}"
    n_at = st.get("n_at_cut", st.get("ties_at_direct_cut", 0))
    side = st.get("tie_side")
    if side:
        text += (
            f" {n_at} of {st['n_cases']} scores equal the cut: the direct answer (S > {cut}; "
            f"the Spot-Stop fields) counts them {side['direct_answer']}, the guard's rule "
            f"(S ≥ {cut}; the prevalence check's fixed cut) {side['guard_rule']}."
        )
    return text


def _delivered_rows(card: Card) -> list[tuple[str, ...]]:
    d = card.delivered
    if d is None:
        return []
    rows = [("all decisions", "", *(fmt(e) for e in _rates(d.overall)), "")]
    for v, p in d.by_policy.items():
        rp = p.replay
        replay = (
            rp.note
            if rp.n == 0
            else f"{rp.n_agree} of {rp.n} answers reproduced ({100 * rp.agreement:.1f} %)"
        )
        rows.append((v, p.kind or "?", *(fmt(e) for e in _rates(p.rates)), replay))
    return rows


def _delivered_intro(card: Card) -> str:
    """What the delivered table holds, with the labelled fail-closed decisions it leaves out
    (``delivered_note`` of ``card.json``)."""
    d = card.delivered
    n = 0 if d is None else d.n_fail_closed_labelled
    caution = "" if d is None or not d.review_note else f" Caution: {d.review_note}."
    return (
        "The guard's own logged answers against the reviewer labels, labelled decisions that "
        f"did not fail closed ({n} labelled fail-closed decision(s) left out; group-bootstrap "
        f"95 % intervals).{caution}"
    )


def _rates(r: object) -> tuple[Estimate, Estimate, Estimate]:
    return (r.balanced_accuracy, r.hit_rate, r.false_alarm_rate)  # type: ignore[attr-defined]


_DELIVERED_HEAD = (
    "policy version", "kind", "balanced accuracy", "hit rate", "false-alarm rate", "replay",
)  # fmt: skip


def _field_rows(card: Card) -> list[tuple[str, str, str]]:
    return [(k, fmt(e, pct=k not in _NOT_PCT), EXPLANATIONS[k]) for k, e in card.fields.items()]


def markdown(card: Card) -> str:
    """``card.md``."""
    st = card.settings
    out = ["# spotstop deployment card", "", "## Verdict", ""]
    out += [f"- **{MARK[v.status]}** ({v.topic}) {v.sentence}" for v in card.verdict]
    out += ["", "## What the guard delivered", ""]
    rows = _delivered_rows(card)
    if rows:
        out += [
            _delivered_intro(card),
            "",
            "| " + " | ".join(_DELIVERED_HEAD) + " |",
            "|" + " --- |" * len(_DELIVERED_HEAD),
        ]
        out += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        out.append("Not available: a scores CSV or the simulated log holds no guard answers.")
    out += [
        "",
        "## Spot-Stop",
        "",
        f"{_head(card)} {_cut_text(card)}",
        "",
        "| field | value [95 % CI] | meaning and what to do |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{k}` | {v} | {e} |" for k, v, e in _field_rows(card)]
    for name, res in card.checks.items():
        title, explanation = card.check_info[name]
        out += ["", f"## {title}", "", f"_{explanation}_", "", "| | |", "| --- | --- |"]
        out += [f"| {a} | {b} |" for a, b in res.rows]
    if st["warnings"]:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in st["warnings"]]
    out += ["", "## Provenance", ""] + [f"- {k}: {v}" for k, v in card.provenance.items()]
    return "\n".join(out) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;color:#222}"
    "table{border-collapse:collapse;width:100%;font-size:13px;margin-bottom:1em}td,th{border:"
    "1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#eee}code{font-size:12px}"
    ".plots{display:flex;flex-wrap:wrap;gap:8px}.plots svg{width:420px;height:auto}"
    ".verdict li{margin:4px 0}.mark{font-weight:bold}"
)


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    e = html.escape
    th = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def page(card: Card, svgs: Mapping[str, str]) -> str:
    """``card.html``: one page, inline SVG plots, no external assets."""
    e = html.escape
    st = card.settings
    items = "".join(
        f"<li><span class='mark' style='color:{_COLOUR[v.status]}'>{e(MARK[v.status])}</span> "
        f"({e(v.topic)}) {e(v.sentence)}</li>"
        for v in card.verdict
    )
    rows = _delivered_rows(card)
    delivered = (
        f"<p>{e(_delivered_intro(card))}</p>" + _table(_DELIVERED_HEAD, rows)
        if rows
        else "<p>Not available: a scores CSV or the simulated log holds no guard answers.</p>"
    )
    fields = _table(
        ("field", "value [95 % CI]", "meaning and what to do"),
        [tuple(r) for r in _field_rows(card)],
    )
    checks = "".join(
        f"<h2>{e(card.check_info[n][0])}</h2><p><em>{e(card.check_info[n][1])}</em></p>"
        + _table(("", ""), [tuple(r) for r in res.rows])
        for n, res in card.checks.items()
    )
    warn = "".join(f"<li>{e(w)}</li>" for w in st["warnings"])
    prov = "".join(f"<li>{e(str(k))}: {e(str(v))}</li>" for k, v in card.provenance.items())
    cut = _cut_text(card)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>spotstop card</title>"
        f"<style>{_CSS}</style></head><body><h1>spotstop deployment card</h1>"
        f"<h2>Verdict</h2><ul class='verdict'>{items}</ul>"
        f"<h2>What the guard delivered</h2>{delivered}"
        f"<h2>Spot-Stop</h2><p>{e(_head(card))} {e(cut)}</p>"
        f"<div class='plots'>{''.join(svgs.values())}</div>{fields}{checks}"
        + (f"<h2>Warnings</h2><ul>{warn}</ul>" if warn else "")
        + f"<h2>Provenance</h2><ul>{prov}</ul></body></html>\n"
    )


def write_files(card: Card, out: Path) -> None:
    """Write ``card.json``, ``card.md`` and ``card.html`` into ``out`` (created if needed).

    All three are made first, then each replaces its file atomically: a card that fails to
    render (a plot, a number JSON cannot hold) writes nothing, so no page of an earlier card
    is left beside the numbers of this one."""
    doc = card.to_json()
    texts = {
        "card.json": json.dumps(doc, indent=1, allow_nan=False) + "\n",
        "card.md": markdown(card),
        "card.html": page(card, {k: to_svg(d) for k, d in card.displays.items()}),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        atomic_write_text(out / name, text)
