"""The card's HTML in a real headless browser (Chromium): the page loads, every plot is laid
out at a real size with its legend off the data, nothing is clipped, the prevalence plot has
every level of card.json, and a screenshot is not blank.

Needs a Chromium binary (Debian: ``apt-get install -y chromium``); skipped, with that reason,
only when none is found.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from spotstop.diagnostics import read_scores_csv, write_card

pytestmark = pytest.mark.browser

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "no Chromium binary on PATH (looked for " + ", ".join(BINARIES) + "); "
        "install it with `apt-get install -y chromium` to check the card in a browser"
    )


#: measures the laid-out page and writes the result into <pre id="report"> (test harness only:
#: card.html itself has no script)
_PROBE = """
<script>
window.addEventListener("load", function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom};
  }
  function meets(a, b) {
    return a.x0 < b.x1 - 0.5 && b.x0 < a.x1 - 0.5 && a.y0 < b.y1 - 0.5 && b.y0 < a.y1 - 0.5;
  }
  var plots = [];
  document.querySelectorAll(".plots > svg").forEach(function (svg) {
    var s = box(svg);
    var axes = svg.querySelector("g[id^='axes_']");
    var patch = axes ? axes.querySelector(":scope > g[id^='patch_']") : null;
    var legend = svg.querySelector("g[id^='legend_']");
    var texts = Array.prototype.map.call(svg.querySelectorAll("text"), function (t) {
      return {text: t.textContent, box: box(t)};
    });
    var lines = axes ? axes.querySelectorAll(":scope > g[id^='line2d_']") : [];
    var yticks = axes ? Array.prototype.map.call(
      axes.querySelectorAll("g[id^='matplotlib.axis_2'] text"),
      function (t) { return t.textContent; }) : [];
    plots.push({
      svg: s,
      n_paths: svg.querySelectorAll("path").length,
      title: texts.length ? texts.map(function (t) { return t.text; }).join(" | ") : "",
      legend_meets_axes: legend && patch ? meets(box(legend), box(patch)) : null,
      has_legend: !!legend,
      clipped: texts.filter(function (t) {
        var b = t.box;
        return b.x1 - b.x0 > 0 && (b.x0 < s.x0 - 1 || b.x1 > s.x1 + 1 ||
                                   b.y0 < s.y0 - 1 || b.y1 > s.y1 + 1);
      }).map(function (t) { return t.text; }),
      markers_per_line: Array.prototype.map.call(lines, function (g) {
        return g.querySelectorAll("use").length;
      }),
      yticks: yticks
    });
  });
  var sections = {};
  document.querySelectorAll("h2").forEach(function (h) {
    var t = h.nextElementSibling;
    while (t && t.tagName !== "TABLE" && t.tagName !== "H2") { t = t.nextElementSibling; }
    if (t && t.tagName === "TABLE") {
      sections[h.textContent] = Array.prototype.map.call(t.querySelectorAll("tr"), function (r) {
        return Array.prototype.map.call(r.cells, function (c) { return c.textContent; });
      });
    }
  });
  var pre = document.createElement("pre");
  pre.id = "report";
  pre.textContent = JSON.stringify({
    ready: document.readyState, width: document.body.scrollWidth, plots: plots,
    sections: sections
  });
  document.body.appendChild(pre);
});
</script>
"""


def _benchmark_csv(path: Path) -> Path:
    """Per-case judgements of a public benchmark's shape: scores in {0, .25, .5, .75, 1},
    60 contrasts, 6 situations, no image or request columns."""
    rng = np.random.default_rng(11)
    vals = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    lines = ["case_id,label,score,contrast_id,situation_id"]
    for c in range(60):
        lines.append(f"c{c}a,safe,{rng.choice(vals, p=[0.45, 0.2, 0.2, 0.1, 0.05])},c{c},s{c % 6}")
        lines.append(
            f"c{c}b,unsafe,{rng.choice(vals, p=[0.1, 0.1, 0.3, 0.25, 0.25])},c{c},s{c % 6}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    binary = _chromium()
    d = tmp_path_factory.mktemp("browser")
    table = read_scores_csv(_benchmark_csv(d / "scores.csv"))
    card = write_card(
        table, d / "card", direct_cut=0.5, n_boot=50, n_boot_checks=50, n_boot_kernel=5, rng=0
    )
    page = (d / "card" / "card.html").read_text(encoding="utf-8")
    assert "<script" not in page  # the card itself stays script-free
    probe = d / "probe.html"
    probe.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    common = [
        binary,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={d / 'profile'}",
        "--window-size=1100,900",
        "--virtual-time-budget=3000",
    ]
    dom = subprocess.run(
        [*common, "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    m = re.search(r'<pre id="report">(.*?)</pre>', dom.stdout, flags=re.S)
    assert m, f"no report from Chromium (rc {dom.returncode}): {dom.stderr[-2000:]}"
    report = json.loads(html.unescape(m.group(1)))
    shot = d / "card.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", (d / "card" / "card.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    doc = json.loads((d / "card" / "card.json").read_text())
    return report, shot, doc, card


def test_every_plot_is_laid_out_with_its_legend_off_the_data(rendered):
    report, _, _, card = rendered
    assert report["ready"] == "complete"
    plots = report["plots"]
    assert len(plots) == len(card.displays) == 4
    for p in plots:
        w, h = p["svg"]["x1"] - p["svg"]["x0"], p["svg"]["y1"] - p["svg"]["y0"]
        assert w > 300 and h > 200, p["title"][:60]
        assert p["n_paths"] > 5, p["title"][:60]
        assert p["has_legend"], p["title"][:60]
        assert p["legend_meets_axes"] is False, f"legend over the data: {p['title'][:60]}"
        assert p["clipped"] == [], f"text outside its plot: {p['clipped']}"
    assert report["width"] <= 1100  # nothing pushes the page sideways


def test_coincident_operating_points_are_all_named_on_the_roc(rendered):
    report, _, _, card = rendered
    roc = next(p for p in report["plots"] if "ROC with operating points" in p["title"])
    points = card.displays["roc"].points
    assert len(points) == 3
    for name, (f, h) in points.items():
        assert name in roc["title"]
        assert f"false alarms {100 * f:.1f} %, hits {100 * h:.1f} %" in roc["title"]
    coincide = len(set(points.values())) < len(points)
    assert ("the same point as" in roc["title"]) == coincide


def test_the_prevalence_plot_has_every_level_on_its_whole_range(rendered):
    report, _, doc, _ = rendered
    prev = next(p for p in report["plots"] if "across prevalence" in p["title"])
    levels = [k for k in doc["checks"]["prevalence"] if k.startswith("unsafe_")]
    assert len(levels) == 6
    assert max(prev["markers_per_line"]) == len(levels)  # one marker per level of card.json
    ticks = prev["yticks"][:-1]  # the last text is the axis label
    assert ticks[0] == "0" and ticks[-1] == "100", ticks  # not zoomed in


def test_the_scene_blind_section_says_once_what_is_missing(rendered):
    report, _, _, _ = rendered
    rows = report["sections"]["Scene-blind readers"]
    assert len(rows) == 2 and rows[1][0] == "not measured"  # header row + one row
    assert "score_text" in rows[1][1] and "NaN" not in rows[1][1]


def test_the_screenshot_is_not_blank(rendered):
    from PIL import Image

    _, shot, _, _ = rendered
    assert shot.is_file(), "Chromium wrote no screenshot"
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape[0] >= 800 and rgb.shape[1] >= 1000
    dark = (rgb.sum(axis=2) < 300).mean()
    assert 0.002 < dark < 0.5  # text and lines on a white page
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50  # coloured verdict marks, plots
