"""Benchmark: the vectorized card statistics against a naive sklearn bootstrap loop.

Run: ``python bench/diagnostics.py [--naive-draws 300] [--skip-card]
[--scale-cases 12000,120000,1200000] [--scale-draws 10000] [--old-draws 2000,500,50]
[--results]``.

Data: ``simulate_log(600)``: 1,200 cases in 600 one-to-one contrasts (600 groups).

* vectorized: :func:`diagnostics.group_bootstrap` with 10,000 draws (every Spot-Stop term,
  the batch-mean cut and the cross-fitted threshold part refitted in every draw, plus the
  200-split point estimate) and :func:`diagnostics.label_swap_null` with 10,000 draws.
* naive: the same group bootstrap as a Python loop over draws, each draw indexing the
  resampled cases and calling ``sklearn.metrics.roc_auc_score`` / ``roc_curve`` for AUROC,
  ``A*`` and the cross-fitted cut; only ``--naive-draws`` draws are timed and the time is
  extrapolated linearly to 10,000 (stated in the output).
* the full card (the verdict, every registered card check, the recommendation; plots and
  files excluded) is timed once for reference, on the simulated cases (no decision log).
* scale run (issue 27): :func:`diagnostics.group_bootstrap` (``keep_draws=False``, one contrast
  per situation) at ``--scale-cases`` cases with ``--scale-draws`` draws, today's engine
  against the engine of the commit before the sweep (:data:`OLD_COMMIT`, its ``_engine.py``
  and the two resampling functions it used, read from git history at run time, never kept in
  the package).  The old engine runs ``--old-draws`` draws (one per scale) and is extrapolated
  linearly to ``--scale-draws`` (said in the output); each run is its own process, so the
  peak RSS printed is that run's.  ``--results`` writes the scale section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np

#: the last commit with the (draws × unique scores) engine
OLD_COMMIT = "75525c86ab3412c482d2b63d93fbc59273a711d1"
ROOT = Path(__file__).resolve().parent.parent


def _old_modules() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """The old ``_engine``, ``_resample`` and ``_bootstrap`` modules, from git history (not
    the package)."""
    mods = []
    for name in ("_engine", "_resample", "_bootstrap"):
        src = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:diagnostics/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        mod = types.ModuleType(f"old{name}")
        sys.modules[mod.__name__] = mod
        exec(compile(src, f"{OLD_COMMIT[:7]}:diagnostics/{name}.py", "exec"), mod.__dict__)
        mods.append(mod)
    return mods[0], mods[1], mods[2]


def _one_run(which: str, n_cases: int, n_draws: int) -> dict[str, float]:
    """One timed group bootstrap in this process (called in a child process)."""
    import spotstop.diagnostics._bootstrap as bs
    from spotstop.diagnostics import simulate_log

    table = simulate_log(n_cases // 2, rng=1)
    if which == "old":
        old_engine, old_resample, bs = _old_modules()  # the old loop over chunks of draws

        class OldEngine(old_engine.CurveEngine):  # type: ignore[misc,name-defined]
            @classmethod
            def build(cls, table, cut, group=None, memory_budget=None):  # type: ignore[no-untyped-def]
                return old_engine.CurveEngine.build.__func__(cls, table, cut, group)

        bs.CurveEngine = OldEngine
        bs.draw_group_counts = old_resample.draw_group_counts
        bs.random_halves = old_resample.random_halves
    warnings.simplefilter("ignore")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = bs.group_bootstrap(table, n_boot=n_draws, rng=0, keep_draws=False)
    dt = time.perf_counter() - t0
    return {
        "seconds": dt,
        "load": (load0 + os.getloadavg()[0]) / 2,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "auroc_low": res["auroc"].ci.low,
        "A_star": res["A_star"].value,
    }


def _child(which: str, n_cases: int, n_draws: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--_one", f"{which},{n_cases},{n_draws}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def scale_run(cases: list[int], n_draws: int, old_draws: list[int]) -> list[str]:
    """Today's engine against the old one at each size; the printed lines."""
    lines = [
        f"scale run: group_bootstrap(simulate_log(n/2, rng=1), n_boot={n_draws}, rng=0, "
        f"keep_draws=False); old engine = {OLD_COMMIT[:7]} (git history: its engine, "
        "resampling and bootstrap loop); each run its own process; peak RSS = that process's "
        "maximum resident set; load = the 1-minute load average, mean of start and end of the run"
    ]
    for n, od in zip(cases, old_draws, strict=True):
        new = _child("new", n, n_draws)
        old = _child("old", n, min(od, n_draws))
        od = min(od, n_draws)
        t_old = old["seconds"] * n_draws / od
        how = (
            "measured"
            if od == n_draws
            else f"{od} draws timed in {old['seconds']:.1f} s, extrapolated linearly"
        )
        lines.append(
            f"  {n:>9,} cases, {n_draws} draws: new {new['seconds']:.1f} s "
            f"(peak RSS {new['peak_rss_mib']:.0f} MiB, load {new['load']:.1f}); old "
            f"{t_old:.1f} s ({how}; peak RSS {old['peak_rss_mib']:.0f} MiB, load "
            f"{old['load']:.1f}); old / new = {t_old / new['seconds']:.1f}x"
        )
    return lines


def naive_bootstrap(table, n_draws: int, rng: np.random.Generator) -> dict[str, list[float]]:
    from sklearn.metrics import roc_auc_score, roc_curve

    y, s, g = table.label, table.score, table.group
    ng = table.n_groups
    members = [np.flatnonzero(g == k) for k in range(ng)]
    out: dict[str, list[float]] = {k: [] for k in ("auroc", "R", "A", "A_star", "A_batch", "cf")}

    def best_cut(yy, ss):
        fpr, tpr, thr = roc_curve(yy, ss)
        k = int(np.argmax(tpr - fpr))
        return thr[k], 0.5 * (tpr[k] + 1 - fpr[k])

    def pair_acc(rows, cut):
        # rows hold whole contrasts (safe, unsafe) in order: accuracy on the paired cases
        yy, flag = y[rows], s[rows] > cut
        return 0.5 * (flag[yy == 1].mean() + (~flag[yy == 0]).mean())

    for _ in range(n_draws):
        pick = rng.integers(0, ng, ng)
        rows = np.concatenate([members[k] for k in pick])
        yy, ss = y[rows], s[rows]
        su, sf = ss[yy == 1], ss[yy == 0]
        out["auroc"].append(roc_auc_score(yy, ss))
        out["R"].append(float(np.mean(su > sf)))
        out["A"].append(pair_acc(rows, 0.0))
        out["A_star"].append(best_cut(yy, ss)[1])
        out["A_batch"].append(pair_acc(rows, float(ss.mean())))
        half = rng.permutation(ng)[: ng // 2]
        in1 = np.isin(pick, half)
        r1 = np.concatenate([members[k] for k in pick[in1]])
        r2 = np.concatenate([members[k] for k in pick[~in1]])
        c1, _ = best_cut(y[r1], s[r1])
        c2, _ = best_cut(y[r2], s[r2])
        g2 = pair_acc(r2, c1 - 1e-12) - pair_acc(r2, 0.0)
        g1 = pair_acc(r1, c2 - 1e-12) - pair_acc(r1, 0.0)
        out["cf"].append((g1 * r1.size + g2 * r2.size) / (r1.size + r2.size))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--naive-draws", type=int, default=300)
    ap.add_argument("--n-boot", type=int, default=10_000)
    ap.add_argument("--skip-card", action="store_true")
    ap.add_argument("--scale-cases", default="12000,120000,1200000", help="comma list; '' skips")
    ap.add_argument("--scale-draws", type=int, default=10_000)
    ap.add_argument("--old-draws", default="2000,500,50", help="old-engine draws per scale")
    ap.add_argument("--skip-small", action="store_true", help="only the scale run")
    ap.add_argument("--results", action="store_true", help="write the scale section")
    ap.add_argument("--_one", help=argparse.SUPPRESS)
    args = ap.parse_args()

    # this file is named like the package: drop its own folder from the import path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.modules.pop("diagnostics", None)
    if args._one:
        which, n, d = args._one.split(",")
        print(json.dumps(_one_run(which, int(n), int(d))))
        return
    from spotstop.diagnostics import compute_card, group_bootstrap, label_swap_null, simulate_log

    if not args.skip_small:
        _small(args, compute_card, group_bootstrap, label_swap_null, simulate_log)
    cases = [int(x) for x in args.scale_cases.split(",") if x]
    if cases:
        olds = [int(x) for x in args.old_draws.split(",")]
        olds += [olds[-1]] * (len(cases) - len(olds))
        lines = scale_run(cases, args.scale_draws, olds[: len(cases)])
        print("\n".join(lines))
        if args.results:
            sys.path.insert(0, str(ROOT / "bench"))
            from _results import write_section

            cmd = " ".join(["python bench/diagnostics.py", *sys.argv[1:]])
            head = (
                "### Group bootstrap at scale (`bench/diagnostics.py`, issue 27)\n\n"
                f"`{cmd}` on {datetime.date.today()}, {platform.machine()} "
                f"{os.cpu_count()} CPUs, Python {platform.python_version()}\n\n"
            )
            write_section(
                ROOT / "bench" / "RESULTS.md",
                "diagnostics-scale",
                head + "```\n" + "\n".join(lines) + "\n```",
            )


def _small(args, compute_card, group_bootstrap, label_swap_null, simulate_log) -> None:  # type: ignore[no-untyped-def]
    table = simulate_log(600, rng=0, size_leak=0.3)
    print(f"data: {len(table)} cases, {table.pairs.n} contrasts, {table.n_groups} groups; "
          f"cpus visible: {os.cpu_count()}; OMP/OPENBLAS threads: "
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}/{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}")  # fmt: skip

    group_bootstrap(table, n_boot=200, rng=1)  # warm-up (imports, caches)
    t0 = time.perf_counter()
    boot = group_bootstrap(table, n_boot=args.n_boot, rng=1)
    t_boot = time.perf_counter() - t0
    t0 = time.perf_counter()
    label_swap_null(table, n_draws=args.n_boot, rng=2)
    t_null = time.perf_counter() - t0
    t_vec = t_boot + t_null
    print(
        f"vectorized group bootstrap, {args.n_boot} draws (all terms + cross-fit): {t_boot:.2f} s"
    )
    print(f"vectorized label-swap null, {args.n_boot} draws: {t_null:.2f} s")
    print(f"vectorized card statistics total: {t_vec:.2f} s (goal <= 3 s)")

    t0 = time.perf_counter()
    naive = naive_bootstrap(table, args.naive_draws, np.random.default_rng(3))
    t_naive_part = time.perf_counter() - t0
    per_draw = t_naive_part / args.naive_draws
    t_naive = per_draw * args.n_boot
    print(f"naive sklearn loop: {args.naive_draws} draws timed in {t_naive_part:.2f} s "
          f"({1e3 * per_draw:.2f} ms/draw), extrapolated to {args.n_boot} draws: {t_naive:.1f} s "
          "(bootstrap only, no null)")  # fmt: skip
    print(f"speed-up (naive bootstrap / vectorized bootstrap): {t_naive / t_boot:.0f}x; "
          f"(naive bootstrap / vectorized bootstrap + null): {t_naive / t_vec:.0f}x (goal >= 50x)")  # fmt: skip
    # sanity: the two agree in distribution
    for k, nk in (("auroc", "auroc"), ("R", "R"), ("A_star", "A_star"), ("A_batch", "A_batch"),
                  ("cross_fitted_threshold_part", "cf")):  # fmt: skip
        d = boot.draws[k]
        print(f"  {k:>28}: vectorized sd {d.std():.4f}, naive sd {np.std(naive[nk]):.4f}")
    if not args.skip_card:
        t0 = time.perf_counter()
        compute_card(table, n_boot=args.n_boot, rng=4)
        print(f"full compute_card (verdict, all registered checks, no plots/files): "
              f"{time.perf_counter() - t0:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
