"""Benchmark: the reliance run's scenes/s next to the member scoring rate, in one run.

Run: ``python bench/cues_reliance.py [--n-sources 6] [--n-boot 10000] [--threads 2]``.

Data: ``--n-sources`` demo scenes (drawn shapes, half labelled UNSAFE) as the source set;
each gives 21 scenes (the unedited one, and per template -- four plus the held-out one -- the
misleading edit, two matched controls and the placebo). Members: the tiny TEST pair in a demo
bundle (torch backend; built once under ``$SPOTSTOP_HOME/tiny`` when absent); its scores mean
nothing, so this times the machinery, not a real pair (a real member scores far slower, which
only makes the run's own overhead smaller in proportion).

One :func:`spotstop.diagnostics.cues.measure_reliance` run, no score cache, prints:

* the run's rate: all scenes / wall time of the whole run (planning, drawing the edits,
  scoring with both members, the guard's decisions, the bootstrap of every statistic);
* each member's scoring rate: scenes / time inside that member's ``score`` calls, measured in
  the same run;
* where the rest of the time went (drawing the edits; everything else).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-sources", type=int, default=6, help="source scenes (default 6)")
    ap.add_argument("--n-boot", type=int, default=10_000, help="bootstrap draws (default 10000)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per member (default 2)")
    args = ap.parse_args()

    from spotstop.cli import make_demo_bundle
    from spotstop.diagnostics.cues import load_candidates, measure_reliance, read_source_set
    from spotstop.export.scenes import demo_scenes
    from spotstop.export.tiny import TINY_MEMBERS, build_tiny_pair
    from spotstop.guard import spotstop_home

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = spotstop_home() / "tiny"
        if not all((tiny / m / "model.safetensors").is_file() for m in TINY_MEMBERS):
            build_tiny_pair(tiny, seed=0)
        os.symlink(tiny, root / "tiny")
        bundle = make_demo_bundle(root)
        (root / "src").mkdir()
        rows = ["image,request,label"]
        for i, s in enumerate(demo_scenes(args.n_sources, seed=7)):
            (root / "src" / f"s{i}.jpg").write_bytes(bytes(s.image))  # type: ignore[arg-type]
            rows.append(f"s{i}.jpg,{s.request},{'UNSAFE' if i % 2 == 0 else 'SAFE'}")
        (root / "src" / "source.csv").write_text("\n".join(rows) + "\n")
        source = read_source_set(root / "src")
        cands = load_candidates([bundle], threads=args.threads)
        t0 = time.perf_counter()
        run = measure_reliance(cands, source, n_boot=args.n_boot, rng=0, cache_dir=None)
        wall = time.perf_counter() - t0

    res, table = run.result, run.scores
    scoring = sum(t.seconds for t in table.timings.values())
    print(
        f"reliance run: {res.n_sources} source scenes -> {res.n_scenes} scenes, "
        f"{len(table.timings)} members + the guard, {args.n_boot} bootstrap draws, "
        f"threads={args.threads} (tiny TEST pair: scores mean nothing)"
    )
    print(f"  run (plan + draw + score + decide + bootstrap): {wall:7.2f} s  "
          f"{res.n_scenes / wall:7.2f} scenes/s")  # fmt: skip
    for name, t in table.timings.items():
        print(f"  member {name:<22} scoring: {t.seconds:7.2f} s  {t.scenes_per_s:7.2f} scenes/s")
    both = res.n_scenes / scoring if scoring > 0 else float("nan")
    print(f"  both members, one after the other:  {scoring:7.2f} s  {both:7.2f} scenes/s")
    rest = wall - scoring - table.render_seconds
    print(f"  drawing the edits: {table.render_seconds:.2f} s; everything else: {rest:.2f} s "
          f"(model loading, the guard's decisions, the bootstrap)")  # fmt: skip
    print(f"  overhead beyond scoring: {100 * (wall - scoring) / wall:.0f}% of the run")


if __name__ == "__main__":
    main()
