"""Group bootstrap of the Spot-Stop terms and of a fixed AUROC (seed 000, Sec. 3.3, Supp. C).

The bootstrap resamples whole groups: by default :attr:`CaseTable.group`, so both scenes of a
contrast, and all scenes of a situation, stay together; ``group_by="contrast"`` resamples
contrasts (:func:`~spotstop.diagnostics._resample.resampling_groups`).  Fewer than 30 groups
→ :class:`~spotstop.diagnostics._resample.FewGroupsWarning` (percentile intervals from a handful
of clusters are too narrow).  A draw is a vector of group multiplicities
(:func:`~spotstop.diagnostics._resample.draw_group_counts`), and
:class:`~spotstop.diagnostics._engine.CurveEngine` turns a chunk of draws into every
statistic at once.

The draws come in blocks of :data:`~spotstop.diagnostics._resample.BLOCK_DRAWS` (250), each
drawn from its own seed, a child of a seed taken from the caller's generator
(:func:`~spotstop.diagnostics._resample.draw_blocks`): a block's statistics depend only on
the table, the cut and the block's seed, so the blocks run in this process one after another
(:func:`block_statistics`) or, with ``ray=``, as Ray tasks (:mod:`._bootstrap_ray`), and are
joined in block order: the same numbers either way, and whatever the memory budget or the
chunk of draws held at once.  (Since this scheme a seed gives other draws than in earlier
versions, where the draws came from the caller's generator in chunks of ``chunk_size``.)  There is no Python loop over draws, and all quantities come from the same draws, so
``threshold + overlap + within == R_half - A`` and ``tie_part + threshold + overlap + within
== R - A`` hold draw by draw.

At least 5 % tied contrasts → :class:`~spotstop.diagnostics._metrics.TiedScoresWarning`
(the card's words for what the ties mean).

Statistics that a method refits per batch are refitted in every draw: the batch-mean cut (the
mean of the fixed score ``S`` over the draw's cases: the guard's ``batch_frozen_iqr`` rule,
frozen medians and IQRs, only the mean refitted) and the cross-fitted cut (a fresh random half
of the groups in every draw, as in Supp. Table S10).  ``A_batch`` here is therefore NOT the
paper's batch rule (the guard's ``batch``, which refits the medians, IQRs and weights of
Avg-2 on every draw too): that one needs the member scores and runs the guard's
``BatchPolicy`` on every draw (:func:`~spotstop.diagnostics._batch_rule.batch_rule_bootstrap`);
the card shows this module's figures as ``A_batch_frozen_iqr``, ``batch_frozen_iqr_gain`` and
``batch_frozen_iqr_recovery``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from spotstop.diagnostics import _resample
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._engine import MEMORY_BUDGET, ROOM_TOL, STATISTICS, CurveEngine
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import (
    TIES_COMMON,
    TiedScoresWarning,
    _check_cut,
    curve_auroc,
    ties_message,
)
from spotstop.diagnostics._resample import (
    MIN_GROUPS,
    Block,
    FewGroupsWarning,
    as_rng,
    block_draws,
    draw_blocks,
    draw_group_counts,
    few_groups_message,
    nan_estimate,
    percentile_ci,
    random_halves,
    ratio_estimate,
    resampling_groups,
)
from spotstop.diagnostics._results import ConfidenceInterval, Estimate

__all__ = [
    "BootstrapResult",
    "block_statistics",
    "bootstrap_auroc",
    "draw_group_counts",
    "group_bootstrap",
]


@dataclass(frozen=True)
class BootstrapResult:
    """Point estimates with percentile intervals, and the draws they came from.

    ``estimates[name]`` is an :class:`Estimate` (value = estimate on the full data, ci = 2.5
    and 97.5 percentiles of the draws, n = pairs); ``draws[name]`` the ``n_boot`` draws (when
    kept).  ``A_batch`` is the pair accuracy of the batch mean of the fixed ``S`` refitted in
    every draw (the guard's ``batch_frozen_iqr`` rule ``S ≥ mean S``: only the mean is refitted,
    not the medians, IQRs and weights of the paper's ``batch`` rule; see the module
    docstring); ``batch_gain = A_batch - A``;
    ``batch_recovery = (A_batch - A)/(A* - A)``, undefined (NaN, with an
    :class:`~spotstop.diagnostics._resample.UnboundedRatioWarning`) when the threshold part's
    interval reaches 0; ``group_by`` the resampling unit; the point value of the cross-fitted part
    averages ``n_splits`` random splits, and every draw uses one fresh split.
    """

    estimates: Mapping[str, Estimate]
    draws: Mapping[str, NDArray[np.float64]] = field(repr=False)
    n_boot: int
    n_groups: int
    n_nan_draws: Mapping[str, int] = field(repr=False, default_factory=dict)
    group_by: str = "situation"

    def __getitem__(self, name: str) -> Estimate:
        return self.estimates[name]

    def __repr__(self) -> str:
        lines = [f"BootstrapResult(n_boot={self.n_boot}, n_groups={self.n_groups},"]
        lines += [f"  {k}={v!r}," for k, v in self.estimates.items()]
        return "\n".join(lines) + "\n)"


#: splits of the cross-fitted point estimate swept at once (fresh memory is slow to touch)
_SPLIT_CHUNK = 64


def _tidy(x: float) -> float:
    """A reported value at float-rounding level of 0 (e.g. ``A* - A`` = -1.1e-16) is 0; the
    draws themselves are kept as computed."""
    return 0.0 if abs(x) < 1e-12 else x


def _check_bootstrap(
    n_boot: int, chunk_size: int | None, n_splits: int, memory_budget: int, ray: str | bool | None
) -> None:
    for name, value, low in (
        ("n_boot", n_boot, 1),
        ("chunk_size", 1 if chunk_size is None else chunk_size, 1),
        ("memory_budget", memory_budget, 1),
    ):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"{name} must be an integer >= {low}; got {value!r}.")
    if ray is not None and not isinstance(ray, (bool, str)):
        raise DataError(
            f"ray must be None (this process), True (a local Ray or $RAY_ADDRESS) or a Ray "
            f"address string; got {ray!r}."
        )
    if not isinstance(n_splits, (int, np.integer)) or n_splits < 1:
        raise DataError(f"n_splits must be an integer >= 1; got {n_splits!r}.")


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="draw", leave=False)


def _chunk_draws(n_groups: int, chunk_size: int | None, memory_budget: int) -> int:
    """Draws generated and handed to the engine at once inside a block: ``chunk_size``, or by
    default as many as keep their counts and halves (9 bytes a group) within
    ``memory_budget``; at most a block, at least one.  The results do not depend on it."""
    if chunk_size is None:
        chunk_size = memory_budget // (9 * max(n_groups, 1))
    return int(max(1, min(_resample.BLOCK_DRAWS, chunk_size)))


def block_statistics(
    prep: CurveEngine, block: Block, chunk_size: int
) -> dict[str, NDArray[np.float64]]:
    """Every statistic of :data:`STATISTICS` for the draws of ``block`` (in draw order), their
    counts and halves generated ``chunk_size`` draws at a time
    (:func:`~spotstop.diagnostics._resample.block_draws`); the result depends only on
    ``prep`` and the block's seed."""
    parts: dict[str, list[NDArray[np.float64]]] = {k: [] for k in STATISTICS}
    draws = block_draws(
        block, prep.n_groups, chunk_size, order=prep.group_order, buffers=prep.scratch
    )
    for counts, halves in draws:
        for k, val in prep.statistics_in_order(counts, halves).items():
            parts[k].append(val)
    return {k: np.concatenate(v) for k, v in parts.items()}


def _local_blocks(
    prep: CurveEngine, blocks: tuple[Block, ...], chunk: int, progress: bool
) -> list[dict[str, NDArray[np.float64]]]:
    """The blocks one after another in this process."""
    bar = _progress(sum(b.n_draws for b in blocks), progress, "group bootstrap")
    out = []
    for b in blocks:
        out.append(block_statistics(prep, b, chunk))
        if bar is not None:
            bar.update(b.n_draws)
    if bar is not None:
        bar.close()
    return out


def group_bootstrap(
    table: CaseTable,
    *,
    cut: float = 0.0,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    n_splits: int = 200,
    chunk_size: int | None = None,
    progress: bool = False,
    keep_draws: bool = True,
    group_by: str = "situation",
    memory_budget: int = MEMORY_BUDGET,
    ray: str | bool | None = None,
) -> BootstrapResult:
    """Group bootstrap of the Spot-Stop terms (10,000 draws by default; Sec. 3.3).

    Parameters
    ----------
    table : the cases; groups are :attr:`CaseTable.group`.
    cut : the direct cut (``score > cut`` → UNSAFE).
    n_boot : number of draws.
    rng : a :class:`numpy.random.Generator` or a seed; never the global RNG.  The draws come
        in blocks of :data:`~spotstop.diagnostics._resample.BLOCK_DRAWS` (250) draws, block
        ``i`` from child ``i`` of a seed sequence whose entropy is one call of the generator
        (:func:`~spotstop.diagnostics._resample.draw_blocks`); inside a block one generator
        gives the group counts, another the cross-fit halves
        (:func:`~spotstop.diagnostics._resample.block_draws`).  The point estimate of the
        cross-fitted part uses ``n_splits`` further halves drawn from ``rng`` after that call.
        (This block scheme, new in this version, gives other draws for a seed than earlier
        versions.)
    chunk_size : draws generated at once inside a block (at most a block): a chunk holds
        ``chunk_size * groups`` float64 counts and as many one-byte cross-fit halves, about
        ``9 * chunk_size * groups`` bytes; default: as many as ``memory_budget`` holds.  The
        results do not depend on it.
    memory_budget : bytes for the engine's sweep of a chunk, independent of the number of
        unique scores (:func:`~spotstop.diagnostics._engine.draws_per_sweep`: about
        ``16 * groups + 25,600`` bytes per draw swept together), and the default chunk; the
        results do not depend on it.
    ray : None or False: the blocks run in this process; True or ``""``: as Ray tasks on
        ``$RAY_ADDRESS`` or a new local Ray (a process already connected to Ray uses that
        connection); a string: the address to connect to (``"auto"``, ``"ray://HOST:10001"``).
        Needs the ``ray`` extra; the result equals the local one to the bit.
    progress : show a tqdm bar.
    keep_draws : keep the draws in the result (needed for draw-by-draw checks and plots).
    group_by : the resampling unit, ``"situation"`` (contrast and situation ids together, the
        default) or ``"contrast"``; fewer than 30 groups → :class:`FewGroupsWarning`.

    Percentile 95 % intervals; draws with a NaN statistic (a resample that lost a class) are
    left out of that statistic's interval and counted in ``n_nan_draws``.  A table without
    contrasts → :class:`UndefinedMetricWarning` and NaN estimates.
    """
    _check_cut(cut)
    _check_bootstrap(n_boot, chunk_size, n_splits, memory_budget, ray)
    gen = as_rng(rng)
    prep = CurveEngine.build(
        table, cut, resampling_groups(table, group_by), memory_budget=memory_budget
    )
    if prep.n_pairs > 0 and prep.n_groups < MIN_GROUPS:
        n_alt = None
        if group_by != "contrast":
            n_alt = int(resampling_groups(table, "contrast").max()) + 1
        warnings.warn(
            few_groups_message(prep.n_groups, group_by, n_alt), FewGroupsWarning, stacklevel=2
        )
    if prep.n_pairs == 0:
        warnings.warn(
            "the group bootstrap is undefined: the table has no contrasts; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        nan_est = nan_estimate(0)
        return BootstrapResult(
            MappingProxyType(dict.fromkeys(STATISTICS, nan_est)),
            MappingProxyType({}),
            n_boot,
            prep.n_groups,
            group_by=group_by,
        )
    blocks = draw_blocks(gen, n_boot)
    chunk = _chunk_draws(prep.n_groups, chunk_size, memory_budget)
    if ray is None or ray is False:
        parts = _local_blocks(prep, blocks, chunk, progress)
    else:
        from spotstop.diagnostics._bootstrap_ray import ray_blocks

        address = None if ray is True or ray == "" else str(ray)
        parts = ray_blocks(prep, blocks, chunk, address=address, progress=progress)
    draws = {k: np.concatenate([p[k] for p in parts]) for k in STATISTICS}
    # point estimates: the full data (unit counts); cross-fit averaged over n_splits splits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        point = {
            k: float(v[0]) for k, v in prep.statistics(np.ones((1, prep.n_groups)), None).items()
        }
    # the splits' halves are one random_halves call's (made in chunks of at most
    # _SPLIT_CHUNK: the same stream), in the engine's group labels
    step = min(chunk, _SPLIT_CHUNK)
    ones = np.ones((min(n_splits, step), prep.n_groups))
    cf = np.concatenate(
        [
            prep.cross_fit_in_order(
                ones[:b], random_halves(gen, b, prep.n_groups, order=prep.group_order)
            )
            for b in (min(step, n_splits - i) for i in range(0, n_splits, step))
        ]
    )
    point["cross_fitted_threshold_part"] = (
        float(np.nanmean(cf)) if np.isfinite(cf).any() else math.nan
    )
    if point["tied_share"] >= TIES_COMMON:
        warnings.warn(
            ties_message(point["tied_share"], point["tie_part"], point["R_half_minus_A"]),
            TiedScoresWarning,
            stacklevel=2,
        )
    estimates = {}
    nan_draws = {}
    for k in STATISTICS:
        d = draws[k]
        nan_draws[k] = int((~np.isfinite(d)).sum())
        if k == "batch_recovery":
            estimates[k] = ratio_estimate(
                point["batch_gain"],
                point["threshold_part"],
                draws["batch_gain"],
                draws["threshold_part"],
                prep.n_pairs,
                what="batch_recovery (A_batch − A)/(A* − A)",
                instead="batch_gain = A_batch − A",
                tol=ROOM_TOL,
            )
            continue
        ci = percentile_ci(d)
        estimates[k] = Estimate(
            _tidy(point[k]), ConfidenceInterval(_tidy(ci.low), _tidy(ci.high)), prep.n_pairs
        )
    return BootstrapResult(
        estimates=MappingProxyType(estimates),
        draws=MappingProxyType(draws if keep_draws else {}),
        n_boot=n_boot,
        n_groups=prep.n_groups,
        n_nan_draws=MappingProxyType(nan_draws),
        group_by=group_by,
    )


# --------------------------------------------------------------------------------------------
# AUROC of a fixed per-case value (request-only score, image minus gray, file reader)


def bootstrap_auroc(
    y: NDArray[np.int8],
    values: NDArray[np.float64],
    group: NDArray[np.intp],
    *,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    chunk_size: int = 500,
) -> Estimate:
    """AUROC of ``values`` with a group-bootstrap percentile interval (vectorized).

    ``n`` is the number of cases.  One class → :class:`UndefinedMetricWarning` and NaN.
    """
    gen = as_rng(rng)
    y = np.asarray(y)
    values = np.asarray(values, dtype=np.float64)
    if (y == 0).sum() == 0 or (y == 1).sum() == 0:
        warnings.warn(
            "AUROC is undefined: only one class is present; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return nan_estimate(int(y.size))
    _, gcode = np.unique(np.asarray(group), return_inverse=True)
    gcode = gcode.reshape(-1)
    ng = int(gcode.max()) + 1
    v, col = np.unique(values, return_inverse=True)
    col = col.reshape(-1)
    ms = sparse.csr_matrix(((y == 0).astype(float), (gcode, col)), shape=(ng, v.size))
    mu = sparse.csr_matrix(((y == 1).astype(float), (gcode, col)), shape=(ng, v.size))

    def auc(counts: NDArray[np.float64]) -> NDArray[np.float64]:
        ws = np.ascontiguousarray(np.asarray(ms.T @ counts.T).T)
        wu = np.ascontiguousarray(np.asarray(mu.T @ counts.T).T)
        return curve_auroc(ws, wu)

    point = float(auc(np.ones((1, ng)))[0])
    draws = np.concatenate([auc(c) for c in draw_group_counts(ng, n_boot, gen, chunk_size)])
    return Estimate(point, percentile_ci(draws), int(y.size))
