"""Benchmark: the vectorized card statistics against a naive sklearn bootstrap loop.

Run: ``python bench/diagnostics.py [--naive-draws 300] [--threads N]``.

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
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


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
    args = ap.parse_args()

    # this file is named like the package: drop its own folder from the import path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.modules.pop("diagnostics", None)
    from spotstop.diagnostics import compute_card, group_bootstrap, label_swap_null, simulate_log

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
