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

__all__ = ["PrevalenceDisplay", "RocDisplay", "ScoreDisplay", "SplitDisplay", "to_svg"]


class _Display(Protocol):
    def plot(self, ax: Any = None) -> Any: ...


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.figure(figsize=(4.2, 3.2)).add_subplot()


@dataclass(frozen=True)
class RocDisplay:
    """ROC curve (pair-weighted over the paired cases) with operating points
    ``{name: (false-alarm rate, hit rate)}``."""

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
        cuts: dict[str, float],
        auroc: float,
    ) -> RocDisplay:
        """ROC of ``score > t`` for every unique cut, and the points of named cuts."""
        v = np.unique(score)
        ws = np.bincount(np.searchsorted(v, score), weights=weight * (y == 0), minlength=v.size)
        wu = np.bincount(np.searchsorted(v, score), weights=weight * (y == 1), minlength=v.size)
        fpr = np.concatenate(([1.0], 1 - np.cumsum(ws) / ws.sum()))
        tpr = np.concatenate(([1.0], 1 - np.cumsum(wu) / wu.sum()))
        pts = {}
        for name, t in cuts.items():
            if math.isfinite(t):
                flag = score > t
                pts[name] = (
                    float((weight * (y == 0) * flag).sum() / ws.sum()),
                    float((weight * (y == 1) * flag).sum() / wu.sum()),
                )
        return cls(fpr, tpr, auroc, pts)

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        ax.plot(self.fpr, self.tpr, color="black", lw=1.2, label=f"ROC (AUROC {self.auroc:.3f})")
        ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
        for (name, (f, h)), mk in zip(self.points.items(), "osD^v", strict=False):
            ax.plot([f], [h], mk, ms=6, label=name)
        ax.set(xlabel="false-alarm rate (safe flagged)", ylabel="hit rate (unsafe flagged)")
        ax.set(xlim=(0, 1), ylim=(0, 1), title="ROC with operating points")
        ax.legend(fontsize=7, loc="lower right")
        return ax


@dataclass(frozen=True)
class ScoreDisplay:
    """Histogram of the scores per class, with named cuts."""

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
        ax.set(xlabel="score (> cut: UNSAFE)", ylabel="density", title="Scores per class")
        ax.legend(fontsize=7)
        return ax


@dataclass(frozen=True)
class SplitDisplay:
    """The parts of R − A with intervals (points), and the binormal reference g."""

    names: tuple[str, ...]
    values: NDArray[np.float64]
    lows: NDArray[np.float64]
    highs: NDArray[np.float64]
    g_auroc: float

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        x = np.arange(len(self.names))
        vals = 100 * self.values
        err = 100 * np.vstack([self.values - self.lows, self.highs - self.values])
        ax.bar(x, vals, color=["0.4", "tab:orange", "tab:green", "tab:purple"][: len(x)])
        ax.errorbar(x, vals, yerr=np.nan_to_num(err), fmt="none", ecolor="black", capsize=3)
        if math.isfinite(self.g_auroc):
            ax.axhline(100 * self.g_auroc, color="tab:orange", ls="--", lw=0.9, label="g(AUROC)")
            ax.legend(fontsize=7)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x, self.names, fontsize=8)
        ax.set(ylabel="points", title="R − A and its three parts (95 % CI)")
        return ax


@dataclass(frozen=True)
class PrevalenceDisplay:
    """Per rule, balanced accuracy (π < 1) and the flag rate of unsafe scenes vs prevalence."""

    prevalence: NDArray[np.float64]
    balanced_accuracy: dict[str, NDArray[np.float64]]
    tpr: dict[str, NDArray[np.float64]]

    def plot(self, ax: Any = None) -> Any:
        ax = _axes(ax)
        for (rule, ba), color in zip(
            self.balanced_accuracy.items(), ["tab:blue", "tab:red", "tab:green"], strict=False
        ):
            ax.plot(self.prevalence, 100 * ba, "o-", color=color, ms=3, label=f"{rule}: BA")
            ax.plot(self.prevalence, 100 * self.tpr[rule], "s--", color=color, ms=3, lw=0.8,
                    label=f"{rule}: unsafe flagged")  # fmt: skip
        ax.set(xlabel="share of unsafe scenes in the batch", ylabel="%")
        ax.set(title="Threshold rules across prevalence")
        ax.legend(fontsize=6, ncol=2)
        return ax


def to_svg(display: _Display) -> str:
    """Render a display as an inline ``<svg>`` string (text as text; no external assets)."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context(
        {"svg.fonttype": "none", "font.size": 8, "svg.hashsalt": "spotstop"}
    ):
        fig = Figure(figsize=(4.2, 3.2))
        FigureCanvasSVG(fig)
        ax = fig.add_subplot()
        display.plot(ax)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # drop the RDF metadata block and its namespaces (no content, and it names URLs)
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.S)
    return re.sub(r'\s+xmlns:(dc|cc|rdf)="[^"]*"', "", svg)
