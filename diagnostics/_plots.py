"""Display objects of the card: computed values first, matplotlib only in ``.plot()``.

Each display holds plain arrays; :meth:`plot` draws on a matplotlib ``Axes`` (imported
lazily), and :func:`to_svg` renders a display to a small inline SVG string (text kept as
text, no external assets).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "PeriodDisplay",
    "PrevalenceDisplay",
    "RocDisplay",
    "ScoreDisplay",
    "SplitDisplay",
    "to_svg",
]


class _Display(Protocol):
    def plot(self, ax: Any = None) -> Any: ...


# Every legend lies below its axes (``_legend_below``), never over the data; the browser test
# (tests/diagnostics/test_browser.py) checks this on the rendered page.


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.figure(figsize=(4.2, 3.2)).add_subplot()


def _intervals(ax: Any, x: Any, lo: Any, hi: Any, color: str) -> None:
    """Each 95 % interval as a capped vertical line from its low to its high end, as it is:
    a percentile interval need not hold its point estimate (error bars measured from the
    point would be negative there, and matplotlib refuses them). Undefined ends draw
    nothing."""
    x, lo, hi = (np.asarray(a, dtype=np.float64) for a in (x, lo, hi))
    ok = np.isfinite(lo) & np.isfinite(hi)
    if ok.any():
        ax.vlines(x[ok], lo[ok], hi[ok], color=color, lw=1.0)
        ax.plot(x[ok], lo[ok], "_", x[ok], hi[ok], "_", color=color, ms=6, mew=1.0)


def _legend_below(ax: Any, ncol: int = 1) -> Any:
    """Put the legend under the axes (below the x label), never over the data."""
    return ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.19),
        ncol=ncol,
        fontsize=6.5,
        frameon=False,
        borderaxespad=0.0,
    )


#: operating-point markers: shape, size; drawn hollow, largest first, so that points on the
#: same spot stay visible as nested rings
_MARKERS = (("o", 11.0), ("s", 8.0), ("D", 5.5), ("^", 7.0), ("v", 7.0))


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) < 5e-4 and abs(a[1] - b[1]) < 5e-4


@dataclass(frozen=True)
class RocDisplay:
    """ROC curve (pair-weighted over the paired cases) with operating points
    ``{name: (false-alarm rate, hit rate)}``; each name says its rule (e.g. ``S > 0.5``)."""

    fpr: NDArray[np.float64]
    tpr: NDArray[np.float64]
    auroc: float
    points: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_scores(
        cls,
        y: NDArray[np.int8],
        score: NDArray[np.float64],
        weight: NDArray[np.float64],
        flags: dict[str, NDArray[np.bool_]],
        auroc: float,
    ) -> RocDisplay:
        """ROC of ``score > t`` for every unique cut, and the points of named rules, each
        given by its UNSAFE flags on the same cases (the caller applies the rule, so that
        each point uses its own: the direct answer or the guard's ``S ≥ t``)."""
        v = np.unique(score)
        ws = np.bincount(np.searchsorted(v, score), weights=weight * (y == 0), minlength=v.size)
        wu = np.bincount(np.searchsorted(v, score), weights=weight * (y == 1), minlength=v.size)
        fpr = np.concatenate(([1.0], 1 - np.cumsum(ws) / ws.sum()))
        tpr = np.concatenate(([1.0], 1 - np.cumsum(wu) / wu.sum()))
        pts = {}
        for name, flag in flags.items():
            f = np.asarray(flag, dtype=bool)
            pts[name] = (
                float((weight * (y == 0) * f).sum() / ws.sum()),
                float((weight * (y == 1) * f).sum() / wu.sum()),
            )
        return cls(fpr, tpr, auroc, pts)

    def point_labels(self) -> list[str]:
        """One legend entry per point: its name, its rates, and the earlier point it hides."""
        out: list[str] = []
        items = list(self.points.items())
        for i, (name, (f, h)) in enumerate(items):
            same = [n for n, p in items[:i] if _close(p, (f, h))]
            tail = f"\n    the same point as {', '.join(same)}" if same else ""
            out.append(f"{name}:\n    false alarms {100 * f:.1f} %, hits {100 * h:.1f} %{tail}")
        return out

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        ax.plot(self.fpr, self.tpr, color="black", lw=1.2, label=f"ROC (AUROC {self.auroc:.3f})")
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
        colors = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange")
        for (f, h), label, (mk, ms), color in zip(
            self.points.values(), self.point_labels(), _MARKERS, colors, strict=False
        ):
            ax.plot([f], [h], mk, ms=ms, mfc="none", mec=color, mew=1.4, label=label, zorder=3)
        ax.set(xlabel="false-alarm rate (safe flagged)", ylabel="hit rate (unsafe flagged)")
        ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), title="ROC with operating points")
        _legend_below(ax)
        return ax


@dataclass(frozen=True)
class ScoreDisplay:
    """Histogram of the scores per class, with named cuts (each name says its rule)."""

    edges: NDArray[np.float64]
    safe: NDArray[np.float64]
    unsafe: NDArray[np.float64]
    cuts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_scores(
        cls, y: NDArray[np.int8], score: NDArray[np.float64], cuts: dict[str, float], bins: int = 30
    ) -> ScoreDisplay:
        edges = np.histogram_bin_edges(score, bins=bins)

        def dens(x: NDArray[np.float64]) -> NDArray[np.float64]:
            if x.size == 0:  # a class without cases draws as a flat zero line
                return np.zeros(edges.size - 1)
            return np.histogram(x, edges, density=True)[0]

        return cls(
            edges,
            dens(score[y == 0]),
            dens(score[y == 1]),
            {k: v for k, v in cuts.items() if math.isfinite(v)},
        )

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        ax.stairs(self.safe, self.edges, color="tab:blue", label="safe")
        ax.stairs(self.unsafe, self.edges, color="tab:red", label="unsafe")
        for (name, t), ls in zip(self.cuts.items(), ["-", "--", ":", "-."], strict=False):
            ax.axvline(t, color="0.3", ls=ls, lw=0.9, label=name)
        ax.set(xlabel="score S", ylabel="density", title="Scores per class")
        _legend_below(ax, ncol=2)
        return ax


@dataclass(frozen=True)
class SplitDisplay:
    """``R½ − A`` (ties count one half) and its three parts, threshold + overlap + within,
    which add up to it exactly also with ties, with intervals (points), and the binormal
    reference g.  The paper's ``R − A`` differs by ``tie_part = −T/2`` (a field of its own)."""

    names: tuple[str, ...]
    values: NDArray[np.float64]
    lows: NDArray[np.float64]
    highs: NDArray[np.float64]
    g_auroc: float

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        x = np.arange(len(self.names))
        vals = 100 * self.values
        ax.bar(x, vals, color=["0.4", "tab:orange", "tab:green", "tab:purple"][: len(x)])
        _intervals(ax, x, 100 * self.lows, 100 * self.highs, "black")
        if math.isfinite(self.g_auroc):
            ax.axhline(
                100 * self.g_auroc, color="tab:orange", ls="--", lw=0.9,
                label=f"g(AUROC) = {100 * self.g_auroc:.1f} points (binormal overlap reference)",
            )  # fmt: skip
            _legend_below(ax)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x, self.names, fontsize=8)
        ax.set(ylabel="points", title="R½ − A and its three parts (95 % CI)")
        return ax


@dataclass(frozen=True)
class PrevalenceDisplay:
    """Per rule, balanced accuracy (π < 1) and the flag rate of unsafe scenes vs prevalence.

    The y axis is fixed to the rates' whole range, 0–100 %, so that a difference of a point
    looks like one."""

    prevalence: NDArray[np.float64]
    balanced_accuracy: dict[str, NDArray[np.float64]]
    tpr: dict[str, NDArray[np.float64]]

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        for (rule, ba), color in zip(
            self.balanced_accuracy.items(),
            ["tab:blue", "tab:purple", "tab:red", "tab:green"],
            strict=False,
        ):
            ax.plot(self.prevalence, 100 * ba, "o-", color=color, ms=3, label=f"{rule}: BA")
            ax.plot(self.prevalence, 100 * self.tpr[rule], "s--", color=color, ms=3, lw=0.8,
                    label=f"{rule}: unsafe flagged")  # fmt: skip
        ax.set(xlabel="share of unsafe scenes in the batch", ylabel="% (whole range, 0–100)")
        ax.set(xlim=(0, 1.02), ylim=(0, 100), title="Threshold rules across prevalence")
        _legend_below(ax, ncol=2)
        return ax


@dataclass(frozen=True)
class PeriodDisplay:
    """Key fields per period (delivered balanced accuracy, unsafe share, AUROC) with their 95 %
    intervals, on a 0–100 % axis."""

    periods: tuple[str, ...]
    values: dict[str, NDArray[np.float64]]
    low: dict[str, NDArray[np.float64]]
    high: dict[str, NDArray[np.float64]]

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        x = np.arange(len(self.periods))
        names = {
            "delivered_balanced_accuracy": "delivered BA",
            "unsafe_share": "unsafe share",
            "auroc": "AUROC",
        }
        for (key, label), color in zip(
            names.items(), ["tab:blue", "tab:red", "tab:green"], strict=True
        ):
            v, lo, hi = (100 * np.asarray(d[key]) for d in (self.values, self.low, self.high))
            ax.plot(x, v, "o-", ms=3, lw=0.9, color=color, label=label)
            _intervals(ax, x, lo, hi, color)
        ax.set_xticks(x, self.periods, rotation=45 if len(x) > 4 else 0, fontsize=6.5)
        ax.set(ylabel="% (whole range, 0–100)", ylim=(0, 100), title="Key fields per period")
        _legend_below(ax, ncol=3)
        return ax


def to_svg(display: _Display) -> str:
    """Render a display as an inline ``<svg>`` string (text as text; no external assets)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context(
        {"svg.fonttype": "none", "font.size": 8, "svg.hashsalt": "spotstop"}
    ):
        # the axes keep one size; the saved page grows to hold a legend below them
        fig = Figure(figsize=(4.2, 3.2))
        FigureCanvasSVG(fig)
        ax = fig.add_subplot()
        fig.subplots_adjust(left=0.16, right=0.96, bottom=0.16, top=0.9)
        display.plot(ax)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # drop the RDF metadata block and its namespaces (no content, and it names URLs)
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.S)
    return re.sub(r'\s+xmlns:(dc|cc|rdf)="[^"]*"', "", svg)
