"""What a card check is: its inputs (:class:`CardContext`), its output (:class:`CheckResult`)
and its protocol (:class:`CardCheck`).

A card check is a class in its own module, listed in the registry
(:data:`spotstop.diagnostics._checks.CARD_CHECKS`).  Its :meth:`CardCheck.run` computes from the
context and returns a :class:`CheckResult`: the JSON-ready numbers for ``card.json``
(``data``), rows for the Markdown and HTML tables (``rows``), optional plot data
(``displays``) and the computed result object (``result``, for the verdict).  The card runs
every registered check and renders every result the same way, so adding a check is its
module, one registry entry and its tests.  A check may also speak in the verdict: a sentence
of its own (:meth:`CardCheck.verdict_item`) and the ``policy`` sentence when the deployed
policy is of a kind it owns (:meth:`CardCheck.policy_advice`); the verdict asks every
registered check and has no branch per check.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._results import NAN_CI, Estimate, bound_mark

if TYPE_CHECKING:
    from spotstop.diagnostics._from_log import LogData
    from spotstop.diagnostics._recommend import Recommendation
    from spotstop.diagnostics._verdict import VerdictItem
    from spotstop.guard.policies import Policy

__all__ = ["CardCheck", "CardContext", "CheckResult", "fmt", "fmt_p"]


@dataclass(frozen=True, eq=False)
class CardContext:
    """Everything a check may read.

    table: the labelled cases (fused score ``S`` of the deciding policy). direct_cut: the cut
    of the paper's direct answer (``S > cut``) used by the Spot-Stop fields and the ``frozen``
    rule of the prevalence check. rng: the card's generator (checks draw from it in registry
    order). n_boot: draws for the checks' intervals. alpha, delta: the conformal targets of
    what-if computations (the deployed policies carry their own). log: the decision log's
    data, or None for a scores CSV or the simulated log. cues_dir: ``--cues DIR`` or None. period:
    ``--period`` (``day``, ``week``, ``month``) or None; drift_baseline: what each period is
    compared with (``first`` or ``previous``).
    """

    table: CaseTable
    direct_cut: float
    rng: np.random.Generator
    n_boot: int = 1000
    alpha: float = 0.1
    delta: float = 0.1
    log: LogData | None = None
    cues_dir: Path | None = None
    progress: bool = False
    period: str | None = None
    drift_baseline: str = "first"


@dataclass(frozen=True)
class CheckResult:
    """A check's output: ``data`` (JSON-ready; :class:`Estimate` values become
    ``{"value", "ci", "n"}``), ``rows`` ``(what, value)`` for the tables, ``displays``
    (name → display object with ``.plot``) and ``result`` (the computed object, not
    serialized)."""

    data: Mapping[str, Any]
    rows: tuple[tuple[str, str], ...]
    displays: Mapping[str, Any] = field(default_factory=dict)
    result: Any = None


class CardCheck(ABC):
    """One check of the card.

    Class attributes: ``name`` (its key under ``checks`` in ``card.json``), ``title`` (the
    section heading) and ``explanation`` (what it means and what to do, one or two sentences).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    explanation: ClassVar[str]

    @abstractmethod
    def run(self, ctx: CardContext) -> CheckResult:
        """Compute the check on ``ctx`` (no files written, no plotting)."""

    @classmethod
    def verdict_item(cls, result: Any) -> VerdictItem | None:
        """The check's own sentence in the verdict, from its computed ``result`` (None when
        the check did not run, or has nothing to say there: the default)."""
        return None

    @classmethod
    def policy_advice(
        cls, rec: Recommendation, deployed: Policy | None, version: str | None
    ) -> VerdictItem | None:
        """The verdict's ``policy`` sentence when the deployed policy (``deployed``, of
        version ``version``; None when the input holds none) is of a kind this check owns;
        None (the default): the verdict's own sentence."""
        return None


def fmt(e: Estimate | float | None, *, pct: bool = True, signed: bool = False) -> str:
    """``69.8 [66.1, 73.2]`` (percent) or ``0.812 [0.770, 0.850]``; ``undefined (NaN)``;
    ``> 6.083`` for an estimate larger than its value (``Estimate.bound``)."""
    if e is None:
        return "not available"
    if not isinstance(e, Estimate):
        e = Estimate(float(e), NAN_CI, 0)
    k = 100.0 if pct else 1.0
    if math.isnan(e.value):
        return "undefined (NaN)"
    sign = "+" if signed else ""
    spec = f"{sign}.1f" if pct else f"{sign}.3f"
    s = bound_mark(e) + format(k * e.value, spec)
    if not math.isnan(e.ci.low):
        s += f" [{format(k * e.ci.low, spec)}, {format(k * e.ci.high, spec)}]"
    return s


def fmt_p(p: float) -> str:
    """A p value: ``p = 0.031`` or ``p < 0.001``."""
    if math.isnan(p):
        return "p undefined"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
