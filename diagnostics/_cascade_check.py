"""The card's cascade check: every word the card and its verdict say about a cascade.

The numbers are :mod:`spotstop.diagnostics._cascade`'s (the share that ran the second member,
what skipping it costs; its docstring says how each is computed). This module turns them into
the check's section (:class:`CascadeCheck`: ``card.json``'s ``checks.cascade``, the rows of
``card.md`` and ``card.html``) and into the verdict's words about a cascade, through the two
hooks every card check has (:class:`~spotstop.diagnostics._check_base.CardCheck`):

``verdict_item``
    The ``cascade`` sentence (only when a cascade policy decided in the log): per cascade
    version, the share of decisions that ran the second member against the share its band
    was fitted for, and what the cascade costs against the full pair where both ran.
    ``warn`` when a fitted share lies outside the share's exact interval (refit the band),
    when the AUROC given up is resolved and at least :data:`CASCADE_COST` (raise the share),
    or when the cost could not be measured (run the pair on a labelled sample); else ``ok``.
``policy_advice``
    The verdict's ``policy`` sentence when the deployed policy is a cascade: a cascade is a
    cost option around its cut, so the recommendation is compared with that cut and the
    advice keeps the cascade (or says what leaving it means: every scene runs both members).

The card and the verdict have no cascade branch of their own: they call these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from spotstop.diagnostics._cascade import CascadeCost, CascadeShare, cascade_cost, cascade_shares
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._recommend import Recommendation
from spotstop.diagnostics._verdict import VerdictItem
from spotstop.guard.policies import CUT_KINDS, CascadePolicy, Policy

__all__ = ["CASCADE_COST", "CascadeCheck", "CascadeResult"]

CASCADE_COST = 0.01
"""A cascade that gives up at least this much AUROC (interval excluding 0) is a warning."""


@dataclass(frozen=True)
class CascadeResult:
    """The shares and costs per cascade version, and the note in words."""

    shares: tuple[CascadeShare, ...]
    costs: tuple[CascadeCost, ...]
    note: str

    @property
    def used(self) -> bool:
        """Whether any cascade policy decided in the log."""
        return bool(self.shares)


def _policy_text(s: CascadeShare) -> str:
    if s.configured_share is None:
        return f"{s.version_id} (cascade, first {s.first or '?'}; policy document not stored)"
    return (
        f"{s.version_id} (cascade, first {s.first}, band ±{s.band:.4g} on z1 around the "
        f"{s.cut_kind} cut; fitted for share {100 * s.configured_share:.0f} %)"
    )


def _share_text(s: CascadeShare) -> str:
    if s.share.n == 0:
        return (
            f"not measured: none of its {s.n_decisions} decisions records which members ran "
            f"({s.n_unknown} logged before schema 3)"
        )
    text = (
        f"second member ran on {fmt(s.share)} % of {s.share.n} decisions ({s.n_second}; exact "
        "95 % interval)"
    )
    q = s.configured_share
    if q is not None and s.configured_inside is True:
        text += f"; the fitted share {100 * q:.0f} % lies inside the interval"
    elif q is not None and s.configured_inside is False:
        text += (
            f"; the fitted share {100 * q:.0f} % lies outside it: the first member's scores "
            "sit differently around the cut here than on the pool, refit the band "
            "(spotstop recalibrate LOG --policy cascade)"
        )
    extra = [
        f"{k} {w}"
        for k, w in ((s.n_unknown, "with members_run unknown"),
                     (s.n_first_not_run, "where the first member did not run"))
        if k
    ]  # fmt: skip
    if extra:
        text += f"; not counted: {', '.join(extra)}"
    if s.n_first_only_in_log:
        text += (
            f". The {s.n_first_only_in_log} decisions decided by the first member alone have no "
            "fused S, so the card's Spot-Stop fields (on S) leave them out"
        )
    return text


def _cost_text(c: CascadeCost) -> str:
    if math.isnan(c.auroc_pair.value):
        return c.note
    own = (
        f" ({c.n_from_cascade} more where a cascade's band chose to run the pair are left "
        "out: they sit near the cut by selection)"
        if c.n_from_cascade
        else ""
    )
    return (
        f"{c.n} labelled scenes ({c.n_unsafe} unsafe){own}; the band would send "
        f"{100 * c.simulated_share:.1f} % of them to the second member. AUROC: pair {fmt(c.auroc_pair, pct=False)}, cascade "
        f"{fmt(c.auroc_cascade, pct=False)}, cascade − pair "
        f"{fmt(c.auroc_diff, pct=False, signed=True)}; balanced accuracy at the cut: pair "
        f"{fmt(c.ba_pair)} %, cascade {fmt(c.ba_cascade)} %, cascade − pair "
        f"{fmt(c.ba_diff, signed=True)} points"
    )


def _meaning(s: CascadeShare, c: CascadeCost | None) -> str:
    """The section's sentence in words for one version."""
    if c is None or math.isnan(c.auroc_pair.value) or not c.measurable:
        why = c.note if c is not None else "no cost measured"
        return f"{s.version_id}: what the cascade gives up is {why}."
    y = s.share.value if s.share.n else c.simulated_share
    where = "of its decisions in this log" if s.share.n else "of the scenes where both ran"
    lost = -c.auroc_diff.value
    ci = c.auroc_diff.ci
    resolved = math.isfinite(ci.high) and (ci.high < 0 or ci.low > 0)
    verb = "gives up" if lost >= 0 else "gains"
    return (
        f"{s.version_id}: the cascade {verb} {abs(lost):.3f} AUROC for running the second "
        f"member on {100 * y:.1f} % {where} (cascade − pair "
        f"{fmt(c.auroc_diff, pct=False, signed=True)}, "
        f"{'resolved' if resolved else 'not resolved: the interval includes 0'}); its balanced "
        f"accuracy at the cut differs by {fmt(c.ba_diff, signed=True)} points. The paper's "
        "cascade gave up 0.002 AUROC at 90 %."
    )


def _verdict_item(res: Any) -> VerdictItem | None:
    """The ``cascade`` sentence from the cascade check's result (None when no cascade
    decided)."""
    if res is None or not getattr(res, "used", False):
        return None
    said, todo = [], []
    for sh, c in zip(res.shares, res.costs, strict=True):
        text = f"{sh.version_id} ran the second member on " + (
            f"{fmt(sh.share)} % of {sh.share.n} decisions"
            if sh.share.n
            else "an unknown share of its decisions (members_run not logged)"
        )
        if sh.configured_share is not None:
            text += f" (its band was fitted for {100 * sh.configured_share:.0f} %)"
        if sh.configured_inside is False:
            todo.append(
                f"refit the band of {sh.version_id} (spotstop recalibrate --policy cascade)"
            )
        if c.measurable:
            d = c.auroc_diff
            verb = "gains" if d.value > 0 else "gives up"  # (the section's own reading)
            text += (
                f" and {verb} {abs(d.value):.3f} AUROC against the full pair "
                f"({fmt(d, pct=False, signed=True)}, cascade − pair, on {c.n} labelled scenes "
                "where both ran)"
            )
            if math.isfinite(d.ci.high) and d.ci.high < 0 and -d.value >= CASCADE_COST:
                todo.append(f"raise the share of {sh.version_id} to give up less")
        else:
            text += "; what it gives up against the full pair was not measured"
            todo.append(f"run the pair on a labelled sample to measure what {sh.version_id} costs")
        said.append(text)
    return VerdictItem(
        "warn" if todo else "ok",
        "cascade",
        "The cascade policy "
        + "; ".join(said)
        + (f"; {'; '.join(todo)}." if todo else "; nothing to do."),
    )


def _policy_advice(
    rec: Recommendation, deployed: Policy | None, version: str | None
) -> VerdictItem | None:
    """The ``policy`` sentence for a deployed cascade (None for any other policy): the
    recommendation is compared with its cut, and the advice keeps the cascade."""
    if not isinstance(deployed, CascadePolicy):
        return None
    cut = deployed.cut.kind
    reason = rec.reasons[0] if rec.reasons else ""
    which = f" ({version})" if version else ""
    if rec.policy == cut:
        return VerdictItem(
            "ok",
            "policy",
            f"Keep the deployed cascade{which} around its {cut} cut; that cut is the one to use: "
            f"{reason}",
        )
    if rec.policy in CUT_KINDS:
        return VerdictItem(
            "warn",
            "policy",
            f"Keep the deployed cascade{which} but give it a {rec.policy} cut instead of "
            f"{cut} (`spotstop recalibrate --policy cascade --cut {rec.policy}`): {reason}",
        )
    return VerdictItem(
        "warn",
        "policy",
        f"Switch from the deployed cascade{which} (a {cut} cut) to {rec.policy} "
        f"(`spotstop recalibrate --policy {rec.policy}`; every scene then runs both "
        f"members): {reason}",
    )


class CascadeCheck(CardCheck):
    """The share of decisions that ran the second member, and what the cascade costs."""

    name: ClassVar[str] = "cascade"
    title: ClassVar[str] = "Cascade"
    explanation: ClassVar[str] = (
        "For a cascade policy (the second member only where the first is close to the cut): "
        "the share of decisions that ran the second member, from the log, with an exact "
        "interval, next to the share the band was fitted for; and on labelled scenes where "
        "both members ran, the full pair against the cascade at that band (AUROC and balanced "
        "accuracy, group bootstrap), simulated with the guard's own rule. A share far from "
        "the fitted one → refit the band; a cost too high → raise the share."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        if ctx.log is None:
            note = "not used: a scores CSV or the simulated log holds no guard decisions"
            shares: tuple[CascadeShare, ...] = ()
        else:
            shares = cascade_shares(ctx.log)
            note = (
                f"{len(shares)} cascade policy version(s) decided in this log"
                if shares
                else "not used: no cascade policy decided in this log"
            )
        costs = tuple(
            cascade_cost(ctx.log, s.version_id, n_boot=ctx.n_boot, rng=ctx.rng)
            for s in shares
            if ctx.log is not None
        )
        res = CascadeResult(shares, costs, note)
        data: dict[str, Any] = {"used": res.used, "note": note}
        rows: list[tuple[str, str]] = [("cascade", note)]
        if res.used:
            data["versions"] = [
                {**s.to_dict(), "cost": c.to_dict()} for s, c in zip(shares, costs, strict=True)
            ]
            for s, c in zip(shares, costs, strict=True):
                rows.append((_policy_text(s), _share_text(s)))
                rows.append(
                    (
                        f"{s.version_id}: full pair against the cascade, where both ran",
                        _cost_text(c),
                    )
                )
                rows.append(("what it means", _meaning(s, c)))
        return CheckResult(data, tuple(rows), result=res)

    @classmethod
    def verdict_item(cls, result: Any) -> VerdictItem | None:
        """The verdict's ``cascade`` sentence (see the module docstring)."""
        return _verdict_item(result)

    @classmethod
    def policy_advice(
        cls, rec: Recommendation, deployed: Policy | None, version: str | None
    ) -> VerdictItem | None:
        """The verdict's ``policy`` sentence for a deployed cascade (see the module
        docstring); None for any other policy."""
        return _policy_advice(rec, deployed, version)
