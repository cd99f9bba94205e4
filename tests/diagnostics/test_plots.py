"""The card's plots: coincident operating points stay visible and are listed with their
rates, the prevalence axis shows the rates' whole range, and no legend lies over the data."""

from __future__ import annotations

import numpy as np
import pytest
from spotstop.diagnostics._plots import (
    PrevalenceDisplay,
    RocDisplay,
    ScoreDisplay,
    SplitDisplay,
    to_svg,
)

matplotlib = pytest.importorskip("matplotlib")


def _roc() -> RocDisplay:
    y = np.array([0, 0, 0, 1, 1, 1], dtype=np.int8)
    s = np.array([0.0, 0.25, 0.5, 0.5, 0.75, 1.0])
    w = np.ones(6)
    flags = {
        "direct cut (S > 0.5)": s > 0.5,
        "best cut A* (S > 0.25)": s > 0.25,
        "batch mean (S ≥ 0.5)": s >= 0.5,  # the same point as the best cut
    }
    return RocDisplay.from_scores(y, s, w, flags, 0.9)


def _displays() -> dict[str, object]:
    p = np.array([0.1, 0.5, 0.9, 1.0])
    ba = {"batch_mean": np.array([0.95, 0.96, 0.97, np.nan]), "frozen": np.full(4, 0.99)}
    tpr = {"batch_mean": np.array([0.94, 0.8, 0.6, 0.5]), "frozen": np.full(4, 0.996)}
    y = np.array([0, 0, 1, 1], dtype=np.int8)
    return {
        "roc": _roc(),
        "scores": ScoreDisplay.from_scores(y, np.array([0.0, 0.5, 0.5, 1.0]), {"cut": 0.5}),
        "split": SplitDisplay(
            ("R − A", "threshold", "overlap", "within"),
            np.array([0.05, 0.02, 0.02, 0.01]),
            np.array([0.0, 0.0, 0.0, -0.01]),
            np.array([0.1, 0.04, 0.04, 0.03]),
            0.03,
        ),
        "prevalence": PrevalenceDisplay(p, ba, tpr),
    }


def test_coincident_operating_points_are_listed_with_their_rates():
    roc = _roc()
    assert roc.points["best cut A* (S > 0.25)"] == roc.points["batch mean (S ≥ 0.5)"]
    labels = roc.point_labels()
    assert labels[0] == "direct cut (S > 0.5):\n    false alarms 0.0 %, hits 66.7 %"
    assert labels[2] == (
        "batch mean (S ≥ 0.5):\n    false alarms 33.3 %, hits 100.0 %"
        "\n    the same point as best cut A* (S > 0.25)"
    )


def test_coincident_markers_stay_visible(tmp_path):
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    _roc().plot(ax)
    marks = [ln for ln in ax.lines if ln.get_marker() not in ("None", None, "")]
    assert len(marks) == 3
    # hollow, of distinct shapes and sizes: nested rings, none hides another
    assert all(ln.get_markerfacecolor() == "none" for ln in marks)
    assert len({ln.get_marker() for ln in marks}) == 3
    assert len({ln.get_markersize() for ln in marks}) == 3


@pytest.mark.parametrize("name", ["roc", "scores", "split", "prevalence"])
def test_no_legend_over_the_data(name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 3.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _displays()[name].plot(ax)  # type: ignore[attr-defined]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    leg = ax.get_legend()
    assert leg is not None
    box, axes = leg.get_window_extent(r), ax.get_window_extent(r)
    assert box.y1 < axes.y0, "the legend overlaps the axes"
    xlabel = ax.xaxis.get_tightbbox(r)
    assert box.y1 <= xlabel.y0 + 1, "the legend overlaps the x axis's labels"


def test_the_prevalence_axis_shows_the_whole_range():
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    _displays()["prevalence"].plot(ax)  # type: ignore[attr-defined]
    assert ax.get_ylim() == (0.0, 100.0)  # rates of 94-99.6 % are not zoomed into
    assert "0–100" in ax.get_ylabel()


def test_svg_holds_the_legend_below_the_axes():
    svg = to_svg(_displays()["roc"])  # type: ignore[arg-type]
    assert svg.startswith("<svg") and "legend_1" in svg
    assert "the same point as best cut A*" in svg  # text kept as text


def test_an_interval_that_does_not_hold_its_point_is_drawn_as_it_is():
    """A percentile interval need not hold its point estimate (an overlap part of 0.0952 with
    the interval [0.0277, 0.0890], from 42 pairs): error bars measured from the point were
    negative and matplotlib refused them, so `spotstop card` crashed. Each interval is drawn
    from its low to its high end."""
    from matplotlib.figure import Figure
    from spotstop.diagnostics._plots import PeriodDisplay

    split = SplitDisplay(
        ("R − A", "threshold", "overlap", "within"),
        np.array([0.05, 0.02, 0.0952, 0.01]),
        np.array([0.0, 0.0, 0.0277, np.nan]),
        np.array([0.1, 0.04, 0.0890, np.nan]),
        0.03,
    )
    period = PeriodDisplay(
        ("day 1", "day 2"),
        {k: np.array([0.9, 0.5]) for k in ("delivered_balanced_accuracy", "unsafe_share", "auroc")},
        {
            k: np.array([0.92, 0.4])
            for k in ("delivered_balanced_accuracy", "unsafe_share", "auroc")
        },
        {
            k: np.array([0.95, 0.6])
            for k in ("delivered_balanced_accuracy", "unsafe_share", "auroc")
        },
    )
    for d in (split, period):
        assert to_svg(d).startswith("<svg")  # raised ValueError: 'yerr' must not be negative
    ax = Figure().add_subplot()
    split.plot(ax)
    (lines,) = ax.collections[-1:]
    segs = lines.get_segments()
    assert len(segs) == 3  # the undefined interval draws nothing
    assert segs[2][:, 1] == pytest.approx([2.77, 8.90])  # the interval itself, in points


def test_a_card_that_fails_to_render_leaves_the_last_card_whole(tmp_path, monkeypatch):
    """card.json and card.md were written before the plots: a plot that raised left them
    beside the previous run's card.html, which stated other numbers."""
    import spotstop.diagnostics._render as render
    from spotstop.diagnostics import simulate_log, write_card

    out = tmp_path / "card"
    kw = {"n_boot": 50, "n_boot_checks": 20, "n_boot_kernel": 10, "provenance": {"s": "t"}}
    write_card(simulate_log(60, rng=1), out, rng=2, **kw)
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def boom(_d):
        raise ValueError("a plot that cannot be drawn")

    monkeypatch.setattr(render, "to_svg", boom)
    with pytest.raises(ValueError, match="cannot be drawn"):
        write_card(simulate_log(60, rng=7), out, rng=3, **kw)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
