"""The card's verdict: four plain sentences or more, each with a status, read off the card.

Topics, in order (each a rule below, each sentence with its numbers, intervals and what to do):

leak
    The scene-blind file reader (image width, height, aspect, bytes, longest side, JPEG
    quality, format; out of fold).  ``fail`` when its AUROC interval lies above 0.5, its
    permutation p is below 0.05 and the AUROC is at least 0.7; ``warn`` for such a leak below
    0.7, or when it could not be measured, or when its interval reaches 0.7 or comes from
    fewer than 30 groups (too narrow to rule a leak out); else ``ok``.
cut
    The threshold part at the direct cut, cross-fitted.  ``fail`` when the cross-fitted part's
    interval lies above 2 points of balanced accuracy; ``warn`` when the in-sample part's
    interval lies above 0 and the cross-fitted part is above 1 point (or nothing was
    measured), or when the cross-fitted interval reaches past 2 points or comes from fewer
    than 30 groups (too narrow to rule a misplaced cut out); else ``ok``.  What recovers it: the
    situation (recentering gain over artificial situations with its interval above 0), the
    batch rule, named by its kind (``batch``, the paper's rule refitted on every draw, or
    ``batch_frozen_iqr`` where the cases hold no member scores; its recovery at this log's
    prevalence and, when the prevalence check measured the same rule, at 10 % unsafe; its
    gain, a difference, when the recovery ratio is undefined), else a refit.  When 5 % or more of the
    contrasts are tied the sentence says so (a finer readout, not a cut, orders them).
policy
    :func:`~spotstop.diagnostics._recommend.recommend_policy`'s choice.  ``ok`` when it is the
    deployed kind (or nothing is deployed), ``warn`` when it differs.
guarantee
    The conformal audit of the most recent deployed conformal cut: ``ok`` holds, ``fail``
    violated, ``warn`` not enough data; ``warn`` when no conformal cut decided (or the input
    holds no deployed policy), with the split simulation as a what-if.
a check's own sentence (only where a registered check has one to say)
    Each registered card check may add a sentence
    (:meth:`~spotstop.diagnostics._check_base.CardCheck.verdict_item`), in registry order
    (what each says and when is in the check's module). A check may also give
    the ``policy`` sentence for a deployed policy of a kind it owns
    (:meth:`~spotstop.diagnostics._check_base.CardCheck.policy_advice`).
drift (only with ``--period``)
    The latest period against its baseline (:mod:`~spotstop.diagnostics._periods`): ``fail``
    when a deployed conformal cut does not keep its stated miss rate in the latest period
    (its audit there is ``violated``, counted in situations); ``warn`` when a key field
    changed beyond its family-wise interval, when the latest period was not compared (fewer
    than 30 groups there or in its baseline), or when a cut's audit there has not enough
    data; else ``ok``.
changes (only with ``--previous``)
    Key fields compared with the previous card of the same bundle; a field changed when the
    two 95 % intervals do not overlap (values differ when an interval is missing).  ``fail``
    when the delivered hit rate fell or an audit became ``violated``; ``warn`` for any other
    change; ``ok`` when nothing changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spotstop.diagnostics._check_base import fmt, fmt_p
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._metrics import TIES_COMMON
from spotstop.diagnostics._recommend import Recommendation
from spotstop.diagnostics._resample import MIN_GROUPS
from spotstop.diagnostics._results import Estimate
from spotstop.guard.policies import Policy

__all__ = ["COMPARED", "VerdictItem", "check_previous", "verdict"]

Status = Literal["ok", "warn", "fail"]

LEAK_AUROC = 0.7
"""A resolved file-reader AUROC at or above this is a fail, below it a warning."""

CUT_ROOM = 0.02
"""A cross-fitted threshold part whose interval lies above this (2 points) is a fail."""


@dataclass(frozen=True)
class VerdictItem:
    """One sentence of the verdict: its status (ok / warn / fail), topic and text."""

    status: Status
    topic: str
    sentence: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "topic": self.topic, "sentence": self.sentence}


def _above(e: Estimate | None, x: float) -> bool:
    return e is not None and math.isfinite(e.ci.low) and e.ci.low > x


def _few(n_groups: int | None) -> bool:
    """Too few resampling groups for a percentile interval to rule a problem out."""
    return n_groups is not None and n_groups < MIN_GROUPS


def leak_item(blind: Any, n_groups: int | None = None) -> VerdictItem:
    """The ``leak`` sentence from the scene-blind readers (None when not run); ``n_groups``:
    the card's resampling groups (below :data:`MIN_GROUPS` an interval cannot rule a leak out:
    no ``ok``)."""
    fr = None if blind is None else blind.file_reader
    if fr is None or math.isnan(fr.value):
        why = getattr(blind, "file_reader_unmeasured", "") or (
            "the scene-blind readers did not run"
            if blind is None
            else "the file reader's AUROC is undefined: label more situations of both classes"
        )
        return VerdictItem(
            "warn",
            "leak",
            f"Whether the label leaks through the image files was not measured: {why}.",
        )
    ls = blind.longest_side
    rule = (
        f"; the rule 'longest side {ls.direction} {ls.cut:g}' labels {fmt(ls.accuracy)} % "
        "of held-out cases correctly"
        if ls is not None and math.isfinite(ls.accuracy.value)
        else ""
    )
    text = blind.request_only
    req = (
        f" The request alone ranks at AUROC {fmt(text, pct=False)}: the text carries the label."
        if text is not None and _above(text, LEAK_AUROC)
        else ""
    )
    if math.isnan(blind.file_reader_p):  # no contrast nor situation holds both classes
        may = "may leak" if _above(fr, 0.5) else "was not tested for leaking"
        return VerdictItem(
            "warn",
            "leak",
            f"The label {may} through the image files: a reader of image size, bytes and "
            f"format alone reaches AUROC {fmt(fr, pct=False)}, but its permutation test cannot "
            "run (no contrast nor situation holds both a safe and an unsafe case, so no label "
            f"can be swapped within one). Label contrasts (contrast_id) to test it.{req}",
        )
    what = f"AUROC {fmt(fr, pct=False)} ({fmt_p(blind.file_reader_p)})"
    if _above(fr, 0.5) and blind.file_reader_p < 0.05:
        status: Status = "fail" if fr.value >= LEAK_AUROC else "warn"
        strength = "leaks" if status == "fail" else "leaks weakly"
        return VerdictItem(
            status,
            "leak",
            f"The label {strength} through the image files: a reader of image size, bytes and "
            f"format alone reaches {what}{rule}. Control the files (e.g. letterbox every image "
            f"to one size and format) before trusting the scene score.{req}",
        )
    if fr.ci.high >= LEAK_AUROC:  # too few cases to rule out a leak
        return VerdictItem(
            "warn",
            "leak",
            "Whether the label leaks through the image files is not resolved: a reader of "
            f"image size, bytes and format alone reaches {what}, an interval that reaches "
            f"{LEAK_AUROC:g}; label more situations to tell.{req}",
        )
    if _few(n_groups):  # its interval is too narrow to rule a leak out
        return VerdictItem(
            "warn",
            "leak",
            "Whether the label leaks through the image files is not resolved: a reader of "
            f"image size, bytes and format alone reaches {what}, an interval from {n_groups} "
            f"groups, fewer than {MIN_GROUPS}, too few to rule a leak out; label more "
            f"situations to tell.{req}",
        )
    return VerdictItem(
        "ok",
        "leak",
        f"The label does not leak through the image files: a reader of image size, bytes and "
        f"format alone reaches {what}; nothing to do.{req}",
    )


def cut_item(
    fields: Mapping[str, Estimate],
    prev: Any,
    sit: Any,
    cut_source: str,
    cut: float,
    recommended: str | None = None,
    n_groups: int | None = None,
) -> VerdictItem:
    """The ``cut`` sentence from the Spot-Stop fields, the prevalence and situation checks.
    ``recommended``: the policy the card's policy line recommends (None: none), so that the two
    lines do not tell the reader to do two things. ``n_groups``: the card's resampling groups
    (below :data:`MIN_GROUPS` the intervals cannot rule a misplaced cut out: no ``ok``)."""
    tp, cf = fields["threshold_part"], fields["cross_fitted_threshold_part"]
    if math.isnan(tp.value):
        return VerdictItem(
            "warn",
            "cut",
            "Whether the cut is misplaced was not measured: the labelled cases form no "
            "contrasts (a safe and an unsafe scene of one situation); give contrast_id with "
            "the labels.",
        )
    if not (math.isfinite(cf.value) and math.isfinite(cf.ci.low) and math.isfinite(cf.ci.high)):
        return VerdictItem(  # the in-sample part alone cannot say the cut is well placed
            "warn",
            "cut",
            "Whether the cut is misplaced was not measured out of sample: the cross-fitted "
            f"threshold part needs contrasts in at least two groups (in sample the part is "
            f"{fmt(tp)} points). Label more situations.",
        )
    gain = None if sit is None else sit.ba_gain
    # the batch rule the card measured: the paper's (batch) where its fields are defined, else
    # the batch mean of the fixed S (batch_frozen_iqr); every number quoted is that rule's
    kind, rec, bgain = "batch", fields["batch_recovery"], fields.get("batch_gain")
    a_batch = fields.get("A_batch")
    if (a_batch is None or not math.isfinite(a_batch.value)) and "A_batch_frozen_iqr" in fields:
        kind = "batch_frozen_iqr"
        rec, bgain = fields["batch_frozen_iqr_recovery"], fields.get("batch_frozen_iqr_gain")
    rec10 = (
        None
        if prev is None or getattr(prev, "batch_kind", "batch_frozen_iqr") != kind
        else prev.recovery.get(0.1)
    )
    name = f"the {kind} rule"
    recover = []
    if gain is not None and math.isfinite(gain.value):
        recover.append(
            f"recentering on the situation gains {fmt(gain)} points over artificial "
            f"situations (ICC {fmt(sit.icc, pct=False)})"
        )
    if math.isfinite(rec.value):
        at10 = (
            f", {fmt(rec10)} % at 10 % unsafe"
            if rec10 is not None and math.isfinite(rec10.value)
            else ""
        )
        recover.append(f"{name} recovers {fmt(rec)} % of it here{at10}")
    elif bgain is not None and math.isfinite(bgain.value):
        recover.append(
            f"{name} adds {fmt(bgain, signed=True)} points over the direct answer here "
            "(its share of the threshold part is undefined: that part's interval reaches 0)"
        )
    if _above(cf, CUT_ROOM):
        status: Status = "fail"
        head = "The cut is misplaced"
    elif _above(tp, 0.0) and cf.value > CUT_ROOM / 2:
        status, head = "warn", "The cut may be misplaced"
    elif cf.ci.high > CUT_ROOM or _few(n_groups):  # too few to rule out a misplaced cut
        status, head = "warn", "Whether the cut is misplaced is not resolved"
    else:
        status, head = "ok", "The cut is well placed"
    if status == "ok":
        recover = recover[:1]  # the situation's gain still reads; no batch recovery of nothing
        todo = "no recalibration is needed."
    elif head.endswith("not resolved"):
        recover = recover[:1]
        todo = (
            f"the interval reaches past {100 * CUT_ROOM:g} points: label more contrasts before "
            "changing the cut."
            if cf.ci.high > CUT_ROOM
            else f"the intervals come from {n_groups} groups, fewer than {MIN_GROUPS}, too few "
            "to rule a misplaced cut out: label more situations before relying on the cut."
        )
    elif _above(gain, 0.0) and recommended in (None, "situation"):
        todo = "recentre on the situation (the situation policy)."
    elif _above(gain, 0.0):
        todo = (
            f"the situation policy would recentre it; the policy line weighs that against the "
            f"recommended {recommended} policy."
        )
    elif math.isfinite(rec.value) and rec.value >= 0.8 and rec10 is not None and rec10.value >= 0.8:
        todo = f"{name} recovers it, also at 10 % unsafe (`spotstop recalibrate --policy {kind}`)."
    else:
        todo = "refit the cut on labelled decisions (`spotstop recalibrate`, frozen or conformal)."
    ties = fields.get("tied_share")
    tied = (
        f" {fmt(ties)} % of the contrasts are tied (few distinct score values): a finer "
        "readout of the score, not another cut, would order them."
        if ties is not None and math.isfinite(ties.value) and ties.value >= TIES_COMMON
        else ""
    )
    return VerdictItem(
        status,
        "cut",
        f"{head}: at the direct cut S > {cut:.4g} ({cut_source}) one shared cut chosen on other "
        f"groups would add {fmt(cf)} points of balanced accuracy (in sample {fmt(tp)})"
        + (f"; {'; '.join(recover)}" if recover else "")
        + f"; {todo}{tied}",
    )


def policy_item(
    rec: Recommendation, deployed: str | None, version: str | None = None
) -> VerdictItem:
    """The ``policy`` sentence from the recommendation and the deployed kind (None: nothing
    is deployed, e.g. a scores CSV; ``"unknown"``: the log does not say) and version. (A check
    that owns the deployed kind may say it instead: :func:`verdict` asks them first.)"""
    reason = rec.reasons[0] if rec.reasons else ""
    which = f" ({version})" if version else ""
    if deployed is None:
        return VerdictItem(
            "ok", "policy", f"Use the {rec.policy} policy (nothing is deployed here): {reason}"
        )
    if deployed == rec.policy:
        return VerdictItem(
            "ok",
            "policy",
            f"Keep the deployed {deployed} policy{which}; it is the one to use: {reason}",
        )
    return VerdictItem(
        "warn",
        "policy",
        f"Switch from the deployed {deployed} policy{which} to {rec.policy} (`spotstop "
        f"recalibrate --policy {rec.policy}`): {reason}",
    )


def guarantee_item(audit: Any, deployed_version: str | None = None) -> VerdictItem:
    """The ``guarantee`` sentence from the conformal audit's result (None when not run); the
    deployed version, when given, says whether the audited cut still decides. The sentence
    reads the deployed version's own audit where it holds a conformal cut (a version
    activated again after a later one is still the one deciding), else the latest audited."""
    if audit is None:
        return VerdictItem("warn", "guarantee", "The conformal audit did not run.")
    sim = audit.simulation
    what_if = (
        f" A {sim.guarantee} conformal cut (alpha {sim.alpha:g}) fitted on 30 % of these cases "
        f"would miss {fmt(sim.miss_rate)} % of held-out unsafe situations (band over splits)."
        if math.isfinite(sim.miss_rate.value)
        else ""
    )
    if not audit.deployed:
        todo = (
            " Mend that document in the log (the record of the cut) to audit it."
            if getattr(audit, "unread", ())
            else " Deploy the conformal policy once enough unsafe situations are labelled to "
            "have one."
        )
        return VerdictItem(
            "warn", "guarantee", f"No miss-rate guarantee to audit: {audit.reason}.{what_if}{todo}"
        )
    a = next((b for b in audit.deployed if b.version_id == deployed_version), audit.deployed[-1])
    earlier = deployed_version is not None and deployed_version != a.version_id
    head = (
        f"The {'earlier ' if earlier else ''}conformal cut {a.version_id} ({a.policy_text()}) missed {a.misses} of "
        f"{a.n_situations} labelled unsafe situations since {a.created[:10]}, "
        f"{fmt(a.miss_rate)} % (exact 95 % interval); one-sided binomial test of miss rate ≤ "
        f"{a.alpha:g}: {fmt_p(a.p_value)}"
    )
    others = [b.version_id for b in audit.deployed if b is not a and b.status == "violated"]
    tail = f" Other versions violated it: {', '.join(others)}." if others else ""
    if earlier and deployed_version in getattr(audit, "unread", ()):
        # the deployed version's conformal cut decides, unaudited: nothing here holds for it
        return VerdictItem(
            "fail" if a.status == "violated" else "warn",
            "guarantee",
            f"{head}. It no longer decides: the deployed {deployed_version}, whose conformal "
            "cut decides now, is not audited, since its policy document in the log does not "
            f"load; mend that document (the record of the cut) to audit it.{tail}",
        )
    if earlier:
        tail += (
            f" It no longer decides: the deployed policy {deployed_version} carries no "
            "miss-rate guarantee."
        )
    if a.status == "violated":
        return VerdictItem(
            "fail",
            "guarantee",
            f"{head}: the guarantee is violated; refit the cut on recent labelled decisions "
            f"now (`spotstop recalibrate --policy conformal`).{tail}",
        )
    if a.status == "not enough data" and getattr(a, "label_note", ""):
        return VerdictItem(
            "warn",
            "guarantee",
            f"{head}: whether the guarantee holds cannot be told: {a.label_note}.{tail}",
        )
    if a.status == "not enough data":
        return VerdictItem(
            "warn",
            "guarantee",
            f"{head}: not enough data to tell (the test needs ≥ {a.n_min} situations to flag "
            f"twice alpha); label more unsafe decisions.{tail}",
        )
    marginal = (
        f" (marginal guarantee: this cut's own miss rate exceeds alpha with probability "
        f"{a.p_cut_above_alpha:.2f} over calibrations)"
        if a.guarantee == "marginal"
        else ""
    )
    return VerdictItem(
        "ok", "guarantee", f"{head}: the guarantee holds{marginal}; nothing to do.{tail}"
    )


# --------------------------------------------------------------------------------------------
# changes since a previous card


#: (label, path in card.json, True when lower is worse for safety)
COMPARED: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("delivered hit rate", ("delivered_hit_rate",), True),
    ("delivered false-alarm rate", ("delivered_false_alarm_rate",), False),
    ("delivered balanced accuracy", ("delivered_balanced_accuracy",), False),
    ("AUROC", ("fields", "auroc"), False),
    ("R − A", ("fields", "R_minus_A"), False),
    ("R½ − A", ("fields", "R_half_minus_A"), False),
    ("threshold part", ("fields", "threshold_part"), False),
    ("file reader AUROC", ("checks", "scene_blind", "file_reader_auroc"), False),
)


def _get(doc: Mapping[str, Any], path: Sequence[str]) -> Estimate | None:
    x: Any = doc
    for k in path:
        if not isinstance(x, Mapping) or x.get(k) is None:
            return None
        x = x[k]
    return Estimate.from_dict(x) if isinstance(x, Mapping) and "value" in x else None


def _changed(a: Estimate, b: Estimate) -> bool:
    if math.isnan(a.value) or math.isnan(b.value):
        return math.isnan(a.value) != math.isnan(b.value)
    if any(math.isnan(x) for x in (a.ci.low, a.ci.high, b.ci.low, b.ci.high)):
        return a.value != b.value
    return a.ci.high < b.ci.low or b.ci.high < a.ci.low


def check_previous(previous: Mapping[str, Any], bundle_ids: Sequence[str] | None) -> None:
    """Refuse a previous card that is not a version-2 card of the same bundle(s)."""
    if previous.get("schema_version") != 2:
        raise DataError(
            f"--previous is a card of schema {previous.get('schema_version')!r}; this spotstop "
            "compares cards of schema 2. Write the previous card again with this version."
        )
    prev_b = (previous.get("provenance") or {}).get("bundle_ids")
    if sorted(prev_b or []) != sorted(bundle_ids or []):
        raise DataError(
            f"--previous is a card of bundle {', '.join(prev_b or ['(none: not a log)'])}; this "
            f"card is of bundle {', '.join(bundle_ids or ['(none: not a log)'])}. Compare cards "
            "of one bundle."
        )


def _audit_status(doc: Mapping[str, Any]) -> dict[str, str]:
    dep = ((doc.get("checks") or {}).get("conformal_audit") or {}).get("deployed") or []
    return {d["version_id"]: d["status"] for d in dep}


def changes_item(previous: Mapping[str, Any], current: Mapping[str, Any]) -> VerdictItem:
    """The ``changes`` sentence: key fields of ``current`` against ``previous`` (both JSON)."""
    moved, kept, unmeasured, worse = [], [], [], False
    for label, path, lower_is_worse in COMPARED:
        a, b = _get(previous, path), _get(current, path)
        if a is None or b is None:
            continue
        if math.isnan(a.value) and math.isnan(b.value):  # undefined in both: not compared
            unmeasured.append(label)
            continue
        pct = "auroc" not in path[-1].lower()
        text = f"{label} {fmt(a, pct=pct)} → {fmt(b, pct=pct)}"
        if _changed(a, b):
            moved.append(text)
            worse |= lower_is_worse and b.value < a.value
        else:
            kept.append(label)
    old_v = sorted((previous.get("delivered_by_policy") or {}).keys())
    new_v = sorted((current.get("delivered_by_policy") or {}).keys())
    policy = (
        f"; policy versions {', '.join(old_v) or '—'} → {', '.join(new_v) or '—'}"
        if old_v != new_v
        else ""
    )
    old_a, new_a = _audit_status(previous), _audit_status(current)
    became = [v for v, s in new_a.items() if s == "violated" and old_a.get(v) != "violated"]
    worse |= bool(became)
    audit = f"; the conformal audit of {', '.join(became)} is now violated" if became else ""
    when = (previous.get("provenance") or {}).get("created_utc")
    n_prev = (previous.get("settings") or {}).get("n_cases", "?")
    head = f"Since the previous card ({str(when)[:10] if when else 'unknown date'}, {n_prev} cases)"
    undefined = f"; not measured in either card: {', '.join(unmeasured)}" if unmeasured else ""
    if not moved and not policy and not audit:
        return VerdictItem(
            "ok",
            "changes",
            f"{head} no key field moved beyond its interval ({', '.join(kept) or 'none compared'})"
            f"{undefined}; nothing to do.",
        )
    status: Status = "fail" if worse else "warn"
    todo = (
        "find out why the guard now lets more through before it runs on"
        if worse
        else "check that the change was intended"
    )
    rest = f"; within their intervals: {', '.join(kept)}" if kept else ""
    return VerdictItem(
        status,
        "changes",
        f"{head}: {'; '.join(moved) or 'no field moved beyond its interval'}{policy}{audit}{rest}"
        f"{undefined}; {todo}.",
    )


def drift_item(res: Any) -> VerdictItem | None:
    """The ``drift`` sentence from :class:`~spotstop.diagnostics._periods.PeriodsResult`."""
    if res is None or res.latest is None:
        return None
    last = res.latest
    bad = res.latest_violations()
    if bad:
        said = "; ".join(
            f"{a.version_id} missed {a.misses} of {a.n_situations} unsafe situations "
            f"(miss rate {fmt(a.miss_rate)} against alpha {a.alpha:g}, {fmt_p(a.p_value)})"
            for a in bad
        )
        return VerdictItem(
            "fail",
            "drift",
            f"In the latest {res.period} ({last.key}) the deployed cut does not keep its stated "
            f"miss rate: {said}; refit the conformal cut on recent labelled unsafe cases "
            "(`spotstop recalibrate --policy conformal`).",
        )
    if len(res.rows) < 2:
        return VerdictItem(
            "warn",
            "drift",
            f"Only one {res.period} ({last.key}) holds labelled decisions: there is no "
            "change to measure yet.",
        )
    base = "the first" if res.baseline == "first" else "the previous"
    if last.note and not last.changed:  # too few groups: the change was not tested
        return VerdictItem(
            "warn",
            "drift",
            f"Whether the latest {res.period} ({last.key}) moved against {base} {res.period} "
            f"was not tested: {last.note}; label more situations per {res.period}, or pass "
            f"a longer --period.{_drift_audits(last)}",
        )
    if last.changed:
        moved = ", ".join(
            f"{k} {fmt(last.change[k], signed=True, pct=k != 'auroc')}" for k in last.changed
        )
        return VerdictItem(
            "warn",
            "drift",
            f"The latest {res.period} ({last.key}) moved against {base} {res.period}: {moved} "
            "(family-wise intervals); look at what changed in the deployment, and refit the "
            "policy if the scenes themselves changed.",
        )
    unsure = [a for a in last.audits if a.status != "holds"]
    return VerdictItem(
        "warn" if unsure else "ok",
        "drift",
        f"No key field of the latest {res.period} ({last.key}) moved against {base} "
        f"{res.period} beyond its family-wise interval"
        + (
            f".{_drift_audits(last)}"
            if unsure
            else (
                ", and every deployed conformal cut kept its miss rate there."
                if last.audits
                else "."
            )
        ),
    )


def _drift_audits(last: Any) -> str:
    """What the latest period's conformal audits can say when none is violated: the cuts
    with too few labelled unsafe situations there to tell (an empty string when none)."""
    few = [a for a in last.audits if a.status == "not enough data"]
    if not few:
        return ""
    said = ", ".join(f"{a.version_id} {a.misses} of {a.n_situations}" for a in few)
    why = "".join(f" {a.version_id}: {a.label_note}." for a in few if getattr(a, "label_note", ""))
    return (
        f" Whether the deployed conformal cut kept its miss rate there cannot be told yet "
        f"(misses of labelled unsafe situations: {said}; the test needs ≥ {few[0].n_min}); "
        f"label more unsafe decisions.{why}"
    )


def _registered_checks() -> list[type[Any]]:
    """The registered card checks' classes, in registry order (imported now)."""
    from spotstop.diagnostics._checks import CARD_CHECKS, card_check

    return [card_check(name) for name in CARD_CHECKS]


def verdict(
    *,
    fields: Mapping[str, Estimate],
    checks: Mapping[str, Any],
    recommendation: Recommendation,
    deployed_kind: str | None,
    deployed_version: str | None,
    direct_cut: float,
    deployed_policy: Policy | None = None,
    direct_cut_source: str,
    previous: Mapping[str, Any] | None = None,
    current: Mapping[str, Any] | None = None,
    n_groups: int | None = None,
) -> tuple[VerdictItem, ...]:
    """The verdict's items in order (see the module docstring).  ``checks`` maps a check name
    to its computed result (``CheckResult.result``); ``deployed_policy`` is the deployed
    policy itself (None when the input holds none), for the checks' ``policy_advice``;
    ``current`` is this card's JSON without the verdict, compared with ``previous`` when
    given; ``n_groups`` the card's resampling groups (the leak and cut sentences say ``ok``
    only from :data:`MIN_GROUPS` groups up)."""
    registered = _registered_checks()
    advice = [
        a
        for cls in registered
        if (a := cls.policy_advice(recommendation, deployed_policy, deployed_version)) is not None
    ]
    items = [
        leak_item(checks.get("scene_blind"), n_groups),
        cut_item(
            fields,
            checks.get("prevalence"),
            checks.get("situation_share"),
            direct_cut_source,
            direct_cut,
            recommendation.policy,
            n_groups,
        ),
        advice[0] if advice else policy_item(recommendation, deployed_kind, deployed_version),
        guarantee_item(checks.get("conformal_audit"), deployed_version),
    ]
    for cls in registered:
        own = cls.verdict_item(checks.get(cls.name))
        if own is not None:
            items.append(own)
    drift = drift_item(checks.get("periods"))
    if drift is not None:
        items.append(drift)
    if previous is not None and current is not None:
        items.append(changes_item(previous, current))
    return tuple(items)
