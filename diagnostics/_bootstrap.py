"""Group bootstrap of the Spot-Stop terms and the label-swap null (seed 000, Sec. 3.3, Supp. C).

The bootstrap resamples whole groups (:attr:`CaseTable.group`), so both scenes of a contrast,
and all scenes of a situation, stay together.  A draw is a vector of group multiplicities
(one multinomial call per chunk of draws).  Every statistic of a draw is a function of the
weighted class totals at each unique score, which are one sparse product per chunk; AUROC,
``A*``, the batch-mean cut and the cross-fitted cut are then cumulative sums along the sorted
scores.  There is no Python loop over draws, and all quantities come from the same draws, so
``threshold + overlap + within == R - A`` holds draw by draw.

Statistics that a method refits per batch are refitted in every draw: the batch-mean cut (the
mean score of the draw's cases) and the cross-fitted cut (a fresh random half of the groups in
every draw, as in Supp. Table S10).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.special import ndtr, ndtri
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import (
    _check_cut,
    spot_stop,
    unique_class_weights,
    wbincount,
)
from spotstop.diagnostics._results import ConfidenceInterval, Estimate

__all__ = [
    "BootstrapResult",
    "NullResult",
    "draw_group_counts",
    "group_bootstrap",
    "label_swap_null",
]

#: statistics of :func:`group_bootstrap`, in card order
STATISTICS = (
    "auroc",
    "R",
    "L",
    "W",
    "C",
    "A",
    "A_star",
    "G",
    "null_gap",
    "R_minus_A",
    "threshold_part",
    "overlap_part",
    "within_part",
    "g_auroc",
    "excess_beyond_g",
    "A_batch",
    "batch_recovery",
    "hit_rate",
    "false_alarm_rate",
    "d_prime",
    "criterion",
    "cross_fitted_threshold_part",
)


def _as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    raise DataError(
        f"rng must be a numpy Generator, an int seed or None; got {type(rng).__name__}."
    )


def _random_halves(rng: np.random.Generator, n_draws: int, n_groups: int) -> NDArray[np.bool_]:
    """Boolean (n_draws, n_groups): True for a random ``floor(G/2)`` of the groups per row."""
    ranks = np.argsort(rng.random((n_draws, n_groups)), axis=1)
    half = np.zeros((n_draws, n_groups), dtype=bool)
    np.put_along_axis(half, ranks[:, : n_groups // 2], True, axis=1)
    return half


def draw_group_counts(
    n_groups: int, n_boot: int, rng: np.random.Generator, chunk_size: int = 500
) -> Iterator[NDArray[np.float64]]:
    """Yield ``(chunk, n_groups)`` arrays of group multiplicities (each row sums to ``n_groups``).

    Each row counts ``n_groups`` groups drawn uniformly with replacement (one
    ``rng.integers`` call per chunk, then a bincount: the multinomial(G, 1/G) distribution,
    several times faster than ``rng.multinomial`` with ``size=``).
    """
    done = 0
    while done < n_boot:
        b = min(chunk_size, n_boot - done)
        picks = rng.integers(0, n_groups, size=(b, n_groups))
        picks += np.arange(b)[:, None] * n_groups
        yield (
            np.bincount(picks.ravel(), minlength=b * n_groups)
            .reshape(b, n_groups)
            .astype(np.float64)
        )
        done += b


@dataclass(frozen=True)
class _Prepared:
    """Everything a draw needs, computed once from the table (see the module docstring)."""

    cut: float
    n_groups: int
    n_pairs: int
    v: NDArray[np.float64]  # sorted unique scores of the paired cases
    ms: sparse.csr_matrix  # (groups, m) pair-weighted safe totals
    mu: sparse.csr_matrix  # (groups, m) pair-weighted unsafe totals
    pairs_g: NDArray[np.float64]  # pairs per group
    ordered_g: NDArray[np.float64]
    lab_g: NDArray[np.float64]
    wrong_g: NDArray[np.float64]
    sum_g: NDArray[np.float64]  # score sum of all cases of a group (batch mean)
    cases_g: NDArray[np.float64]
    paired_s_g: NDArray[np.float64]  # paired safe / unsafe cases per group (1/(2n) rule)
    paired_u_g: NDArray[np.float64]
    k_direct: int

    @classmethod
    def build(cls, table: CaseTable, cut: float) -> _Prepared:
        pairs = table.pairs
        g = table.group
        ng = table.n_groups
        s = table.score
        pg = g[pairs.safe]
        su, ss = s[pairs.unsafe], s[pairs.safe]

        def per_group(x: NDArray[np.bool_]) -> NDArray[np.float64]:
            return wbincount(pg, x.astype(np.float64), ng)

        paired = np.flatnonzero(pairs.weight > 0)
        if paired.size:
            v, ws, wu, col = unique_class_weights(
                table.label[paired], s[paired], pairs.weight[paired]
            )
            del ws, wu
            w = pairs.weight[paired]
            y = table.label[paired]
            gi = g[paired]
            ms = sparse.csr_matrix((w * (y == 0), (gi, col)), shape=(ng, v.size))
            mu = sparse.csr_matrix((w * (y == 1), (gi, col)), shape=(ng, v.size))
        else:
            v = np.zeros(0)
            ms = mu = sparse.csr_matrix((ng, 0))
        return cls(
            cut=cut,
            n_groups=ng,
            n_pairs=pairs.n,
            v=v,
            ms=ms,
            mu=mu,
            pairs_g=per_group(np.ones(pairs.n, dtype=bool)),
            ordered_g=per_group(su > ss),
            lab_g=per_group((su > cut) & (ss <= cut)),
            wrong_g=per_group((su <= cut) & (ss > cut)),
            sum_g=wbincount(g, s, ng),
            cases_g=np.bincount(g, minlength=ng).astype(np.float64),
            paired_s_g=wbincount(g, ((pairs.weight > 0) & (table.label == 0)).astype(float), ng),
            paired_u_g=wbincount(g, ((pairs.weight > 0) & (table.label == 1)).astype(float), ng),
            k_direct=int(np.searchsorted(v, cut, side="right")),
        )

    def class_weights(
        self, counts: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(draws, m) safe and unsafe weight at each unique score, C-contiguous."""
        ws = np.ascontiguousarray(np.asarray(self.ms.T @ counts.T, dtype=np.float64).T)
        wu = np.ascontiguousarray(np.asarray(self.mu.T @ counts.T, dtype=np.float64).T)
        return ws, wu

    def _curves(
        self, counts: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Cumulative safe / unsafe weights (draws, m) and class totals (draws, 1)."""
        ws, wu = self.class_weights(counts)
        cs = np.cumsum(ws, axis=1)
        cu = np.cumsum(wu, axis=1)
        return cs, cu, cs[:, -1:], cu[:, -1:]

    @staticmethod
    def _best(
        cs: NDArray[np.float64],
        cu: NDArray[np.float64],
        ts: NDArray[np.float64],
        tu: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
        """Best balanced accuracy and its first cut index ``k`` (0..m) per draw.

        Maximises ``D_k = cs_k tu - cu_k ts`` (``BA_k = 1/2 + D_k / (2 ts tu)``), which is
        exact in float64 for integer weights, so ties between cuts resolve exactly; ``k = 0``
        (flag everything, ``D = 0``) wins unless some cut has ``D > 0``.  A draw without one
        of the classes gives NaN.
        """
        d = cs * tu - cu * ts
        j = np.argmax(d, axis=1)
        rows = np.arange(d.shape[0])
        dmax = d[rows, j]
        k = np.where(dmax > 0, j + 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            val = 0.5 + np.maximum(dmax, 0.0) / (2 * ts[:, 0] * tu[:, 0])
        return np.asarray(val, dtype=np.float64), k

    @staticmethod
    def _ba_at(
        cs: NDArray[np.float64],
        cu: NDArray[np.float64],
        ts: NDArray[np.float64],
        tu: NDArray[np.float64],
        k: NDArray[np.intp],
    ) -> NDArray[np.float64]:
        """Balanced accuracy at cut index ``k`` per draw (``k = 0`` → 1/2; NaN if a class is
        missing)."""
        rows = np.arange(cs.shape[0])
        j = np.maximum(k - 1, 0)
        c_s = np.where(k == 0, 0.0, cs[rows, j])
        c_u = np.where(k == 0, 0.0, cu[rows, j])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(0.5 * (c_s / ts[:, 0] + 1.0 - c_u / tu[:, 0]), dtype=np.float64)

    def cross_fit(
        self,
        counts: NDArray[np.float64],
        halves: NDArray[np.bool_],
        total: tuple[NDArray[np.float64], ...] | None = None,
    ) -> NDArray[np.float64]:
        """Cross-fitted threshold part per draw (NaN where a half lacks a class)."""
        cs, cu, ts, tu = total if total is not None else self._curves(counts)
        c1 = counts * halves
        cs1, cu1, ts1, tu1 = self._curves(c1)
        cs2, cu2, ts2, tu2 = cs - cs1, cu - cu1, ts - ts1, tu - tu1
        _, k1 = self._best(cs1, cu1, ts1, tu1)
        _, k2 = self._best(cs2, cu2, ts2, tu2)
        kd = np.full(k1.shape, self.k_direct)
        gain2 = self._ba_at(cs2, cu2, ts2, tu2, k1) - self._ba_at(cs2, cu2, ts2, tu2, kd)
        gain1 = self._ba_at(cs1, cu1, ts1, tu1, k2) - self._ba_at(cs1, cu1, ts1, tu1, kd)
        n1 = c1 @ self.pairs_g
        n2 = counts @ self.pairs_g - n1
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (gain1 * n1 + gain2 * n2) / (n1 + n2)
        bad = (ts1[:, 0] * tu1[:, 0] == 0) | (ts2[:, 0] * tu2[:, 0] == 0)
        return np.asarray(np.where(bad, np.nan, out), dtype=np.float64)

    def statistics(
        self, counts: NDArray[np.float64], halves: NDArray[np.bool_] | None
    ) -> dict[str, NDArray[np.float64]]:
        """All statistics of :data:`STATISTICS` for each row of ``counts``."""
        curves = self._curves(counts)
        cs, cu, ts, tu = curves
        with np.errstate(invalid="ignore", divide="ignore"):
            npairs = counts @ self.pairs_g
            R = counts @ self.ordered_g / npairs
            L = counts @ self.lab_g / npairs
            W = counts @ self.wrong_g / npairs
            C = L + W
            A = 0.5 + L - C / 2
            wu = np.diff(cu, axis=1, prepend=0.0)
            # AUROC = sum_j wu_j (cs_j - ws_j / 2) / (ts tu) = sum_j wu_j (cs_j + cs_{j-1}) / 2
            cs_prev = cs - np.diff(cs, axis=1, prepend=0.0)
            au = np.einsum("ij,ij->i", wu, cs + cs_prev) / (2 * ts[:, 0] * tu[:, 0])
            a_star, _ = self._best(cs, cu, ts, tu)
            batch_cut = (counts @ self.sum_g) / (counts @ self.cases_g)
            k_batch = np.searchsorted(self.v, batch_cut, side="right")
            a_batch = self._ba_at(cs, cu, ts, tu, k_batch)
            g = au - ndtr(ndtri(au) / math.sqrt(2.0))
            kd = np.full(counts.shape[0], self.k_direct)
            rows = np.arange(counts.shape[0])
            below_s = np.where(kd == 0, 0.0, cs[rows, np.maximum(kd - 1, 0)])
            below_u = np.where(kd == 0, 0.0, cu[rows, np.maximum(kd - 1, 0)])
            hit = 1.0 - below_u / tu[:, 0]
            fa = 1.0 - below_s / ts[:, 0]
            n_u, n_s = counts @ self.paired_u_g, counts @ self.paired_s_g
            zh = ndtri(np.clip(hit, 1 / (2 * n_u), 1 - 1 / (2 * n_u)))
            zf = ndtri(np.clip(fa, 1 / (2 * n_s), 1 - 1 / (2 * n_s)))
            out = {
                "auroc": au,
                "R": R,
                "L": L,
                "W": W,
                "C": C,
                "A": A,
                "A_star": a_star,
                "G": R - L,
                "null_gap": (1 - C) / 2,
                "R_minus_A": R - A,
                "threshold_part": a_star - A,
                "overlap_part": au - a_star,
                "within_part": R - au,
                "g_auroc": g,
                "excess_beyond_g": R - A - g,
                "A_batch": a_batch,
                "batch_recovery": (a_batch - A) / (a_star - A),
                "hit_rate": hit,
                "false_alarm_rate": fa,
                "d_prime": zh - zf,
                "criterion": -(zh + zf) / 2,
            }
        if halves is not None:
            out["cross_fitted_threshold_part"] = self.cross_fit(counts, halves, curves)
        return out


@dataclass(frozen=True)
class BootstrapResult:
    """Point estimates with percentile intervals, and the draws they came from.

    ``estimates[name]`` is an :class:`Estimate` (value = estimate on the full data, ci = 2.5
    and 97.5 percentiles of the draws, n = pairs); ``draws[name]`` the ``n_boot`` draws (when
    kept).  ``A_batch`` is the pair accuracy of the batch-mean cut refitted in every draw;
    ``batch_recovery = (A_batch - A)/(A* - A)``; the point value of the cross-fitted part
    averages ``n_splits`` random splits, and every draw uses one fresh split.
    """

    estimates: Mapping[str, Estimate]
    draws: Mapping[str, NDArray[np.float64]] = field(repr=False)
    n_boot: int
    n_groups: int
    n_nan_draws: Mapping[str, int] = field(repr=False, default_factory=dict)

    def __getitem__(self, name: str) -> Estimate:
        return self.estimates[name]

    def __repr__(self) -> str:
        lines = [f"BootstrapResult(n_boot={self.n_boot}, n_groups={self.n_groups},"]
        lines += [f"  {k}={v!r}," for k, v in self.estimates.items()]
        return "\n".join(lines) + "\n)"


def _check_bootstrap(n_boot: int, chunk_size: int, n_splits: int) -> None:
    for name, value, low in (("n_boot", n_boot, 1), ("chunk_size", chunk_size, 1)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"{name} must be an integer >= {low}; got {value!r}.")
    if not isinstance(n_splits, (int, np.integer)) or n_splits < 1:
        raise DataError(f"n_splits must be an integer >= 1; got {n_splits!r}.")


def _percentile_ci(d: NDArray[np.float64]) -> ConfidenceInterval:
    ok = d[np.isfinite(d)]
    if ok.size == 0:
        return ConfidenceInterval(math.nan, math.nan)
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return ConfidenceInterval(float(lo), float(hi))


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="draw", leave=False)


def group_bootstrap(
    table: CaseTable,
    *,
    cut: float = 0.0,
    n_boot: int = 10_000,
    rng: np.random.Generator | int | None = None,
    n_splits: int = 200,
    chunk_size: int = 500,
    progress: bool = False,
    keep_draws: bool = True,
) -> BootstrapResult:
    """Group bootstrap of the Spot-Stop terms (10,000 draws by default; Sec. 3.3).

    Parameters
    ----------
    table : the cases; groups are :attr:`CaseTable.group`.
    cut : the direct cut (``score > cut`` → UNSAFE).
    n_boot : number of draws.
    rng : a :class:`numpy.random.Generator` or a seed; never the global RNG.  The draws consume
        the generator in this order per chunk: one multinomial call (group counts), one
        ``random`` call (cross-fit halves).  The point estimate of the cross-fitted part uses
        ``n_splits`` further halves drawn after the bootstrap.
    chunk_size : draws per chunk (memory is about ``40 * chunk_size * unique scores`` bytes).
    progress : show a tqdm bar.
    keep_draws : keep the draws in the result (needed for draw-by-draw checks and plots).

    Percentile 95 % intervals; draws with a NaN statistic (a resample that lost a class) are
    left out of that statistic's interval and counted in ``n_nan_draws``.  A table without
    contrasts → :class:`UndefinedMetricWarning` and NaN estimates.
    """
    _check_cut(cut)
    _check_bootstrap(n_boot, chunk_size, n_splits)
    gen = _as_rng(rng)
    prep = _Prepared.build(table, cut)
    if prep.n_pairs == 0:
        warnings.warn(
            "the group bootstrap is undefined: the table has no contrasts; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        nan_est = Estimate(math.nan, ConfidenceInterval(math.nan, math.nan), 0)
        return BootstrapResult(
            MappingProxyType(dict.fromkeys(STATISTICS, nan_est)),
            MappingProxyType({}),
            n_boot,
            prep.n_groups,
        )
    chunks: dict[str, list[NDArray[np.float64]]] = {k: [] for k in STATISTICS}
    bar = _progress(n_boot, progress, "group bootstrap")
    for counts in draw_group_counts(prep.n_groups, n_boot, gen, chunk_size):
        halves = _random_halves(gen, counts.shape[0], prep.n_groups)
        for k, val in prep.statistics(counts, halves).items():
            chunks[k].append(val)
        if bar is not None:
            bar.update(counts.shape[0])
    if bar is not None:
        bar.close()
    draws = {k: np.concatenate(v) for k, v in chunks.items()}
    # point estimates: the full data (unit counts); cross-fit averaged over n_splits splits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        point = {
            k: float(v[0]) for k, v in prep.statistics(np.ones((1, prep.n_groups)), None).items()
        }
    cf = prep.cross_fit(
        np.ones((n_splits, prep.n_groups)), _random_halves(gen, n_splits, prep.n_groups)
    )
    point["cross_fitted_threshold_part"] = (
        float(np.nanmean(cf)) if np.isfinite(cf).any() else math.nan
    )
    # sanity: the unit-count engine equals the direct computation
    estimates = {}
    nan_draws = {}
    for k in STATISTICS:
        d = draws[k]
        estimates[k] = Estimate(point[k], _percentile_ci(d), prep.n_pairs)
        nan_draws[k] = int((~np.isfinite(d)).sum())
    return BootstrapResult(
        estimates=MappingProxyType(estimates),
        draws=MappingProxyType(draws if keep_draws else {}),
        n_boot=n_boot,
        n_groups=prep.n_groups,
        n_nan_draws=MappingProxyType(nan_draws),
    )


# --------------------------------------------------------------------------------------------
# label-swap null


@dataclass(frozen=True)
class NullResult:
    """The label-swap null of the pair-level rates at the direct cut (Supp. C, D.1).

    ``R0``, ``L0``, ``G0``, ``R0_minus_A0``: the null draws; ``expected_null_gap`` the closed
    form ``(1 - C)/2``; ``R_q975`` the 97.5th percentile of ``R0`` (the paper's "above the
    null" line); ``p_R`` and ``p_excess`` one-sided permutation p values
    ``(1 + #{null >= observed}) / (1 + n_draws)`` for ``R`` and ``R - A``.
    """

    observed_R: float
    observed_R_minus_A: float
    expected_null_gap: float
    R0: NDArray[np.float64] = field(repr=False)
    L0: NDArray[np.float64] = field(repr=False)
    G0: NDArray[np.float64] = field(repr=False)
    R0_minus_A0: NDArray[np.float64] = field(repr=False)
    R_q975: float
    p_R: float
    p_excess: float
    n_draws: int

    @property
    def mean_G0(self) -> float:
        """Mean of the null gap over the draws (≈ ``expected_null_gap`` for one-to-one pairs)."""
        return float(self.G0.mean())


def label_swap_null(
    table: CaseTable,
    *,
    cut: float = 0.0,
    n_draws: int = 10_000,
    rng: np.random.Generator | int | None = None,
    chunk_size: int = 1000,
) -> NullResult:
    """Swap labels within contrasts at random and recompute ``R``, ``L``, ``G`` (vectorized).

    A one-to-one contrast swaps its two labels with probability 1/2.  A contrast with several
    cases per side gets a uniformly random permutation of its labels (keeping its class
    counts); then ``E[L0] = C/2`` need not hold exactly and only the simulated null is exact.
    """
    _check_cut(cut)
    if not isinstance(n_draws, (int, np.integer)) or n_draws < 1:
        raise DataError(f"n_draws must be an integer >= 1; got {n_draws!r}.")
    gen = _as_rng(rng)
    pairs = table.pairs
    if pairs.n == 0:
        warnings.warn(
            "the label-swap null is undefined: the table has no contrasts; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        e = np.zeros(0)
        return NullResult(math.nan, math.nan, math.nan, e, e, e, e, math.nan, math.nan, math.nan, 0)
    obs = spot_stop(table, cut)
    s = table.score
    # contrasts by code: one-to-one ones take the fast path
    codes = pairs.contrast
    per_code = np.bincount(codes)
    one = per_code[codes] == 1
    su1, ss1 = s[pairs.unsafe[one]], s[pairs.safe[one]]
    r_keep, r_swap = (su1 > ss1).astype(float), (ss1 > su1).astype(float)
    l_keep = ((su1 > cut) & (ss1 <= cut)).astype(float)
    w_keep = ((su1 <= cut) & (ss1 > cut)).astype(float)
    # multi-case contrasts: permute labels inside each
    multi_codes = np.unique(codes[~one])
    cid = np.full(len(table), -1)
    for c in multi_codes:
        members = np.union1d(pairs.safe[codes == c], pairs.unsafe[codes == c])
        cid[members] = c
    mcases = np.flatnonzero(cid >= 0)
    mc = cid[mcases]
    order0 = np.argsort(mc, kind="stable")
    mcases, mc = mcases[order0], mc[order0]
    _, start, size = np.unique(mc, return_index=True, return_counts=True)
    n_safe_c = np.array(
        [int((table.label[mcases[a : a + b]] == 0).sum()) for a, b in zip(start, size, strict=True)]
    )
    block = np.repeat(np.arange(start.size), size)
    rank_in_block = np.arange(mcases.size) - start[block]
    ms = s[mcases]
    # gt[i, j] = score_i > score_j inside one contrast (block-diagonal)
    ii, jj = [], []
    for a, b in zip(start, size, strict=True):
        g_i, g_j = np.meshgrid(np.arange(a, a + b), np.arange(a, a + b), indexing="ij")
        ii.append(g_i.ravel())
        jj.append(g_j.ravel())
    if mcases.size:
        ii_a, jj_a = np.concatenate(ii), np.concatenate(jj)
        keep = ms[ii_a] > ms[jj_a]
        gt = sparse.csr_matrix(
            (np.ones(int(keep.sum())), (ii_a[keep], jj_a[keep])), shape=(mcases.size,) * 2
        )
        block_ind = sparse.csr_matrix(
            (np.ones(mcases.size), (np.arange(mcases.size), block)), shape=(mcases.size, start.size)
        )
    above = (ms > cut).astype(float)
    n_pairs = float(pairs.n)
    R0_l, L0_l, W0_l = [], [], []
    done = 0
    while done < n_draws:
        b = min(chunk_size, n_draws - done)
        flip = gen.random((b, su1.size)) < 0.5
        ordered = (np.where(flip, r_swap, r_keep)).sum(axis=1)
        lab = (np.where(flip, w_keep, l_keep)).sum(axis=1)
        wrong = (np.where(flip, l_keep, w_keep)).sum(axis=1)
        if mcases.size:
            keys = gen.random((b, mcases.size)) + block[None, :]
            order = np.argsort(keys, axis=1)  # position p in block order holds case order[p]
            y = np.zeros((b, mcases.size))
            # the case at sorted position p is unsafe iff its rank within the block >= n_safe
            unsafe_at_pos = (rank_in_block >= n_safe_c[block]).astype(float)
            np.put_along_axis(y, order, np.broadcast_to(unsafe_at_pos, (b, mcases.size)), axis=1)
            ordered += np.einsum("bi,bi->b", y, np.asarray((gt @ (1 - y).T).T))
            u_hi = np.asarray((block_ind.T @ (y * above).T).T)
            u_lo = np.asarray((block_ind.T @ (y * (1 - above)).T).T)
            s_hi = np.asarray((block_ind.T @ ((1 - y) * above).T).T)
            s_lo = np.asarray((block_ind.T @ ((1 - y) * (1 - above)).T).T)
            lab += (u_hi * s_lo).sum(axis=1)
            wrong += (u_lo * s_hi).sum(axis=1)
        R0_l.append(ordered / n_pairs)
        L0_l.append(lab / n_pairs)
        W0_l.append(wrong / n_pairs)
        done += b
    R0, L0, W0 = np.concatenate(R0_l), np.concatenate(L0_l), np.concatenate(W0_l)
    A0 = 0.5 + L0 - (L0 + W0) / 2
    G0 = R0 - L0
    return NullResult(
        observed_R=obs.R,
        observed_R_minus_A=obs.R_minus_A,
        expected_null_gap=obs.null_gap,
        R0=R0,
        L0=L0,
        G0=G0,
        R0_minus_A0=R0 - A0,
        R_q975=float(np.percentile(R0, 97.5)),
        p_R=float((1 + np.sum(R0 >= obs.R - 1e-12)) / (1 + R0.size)),
        p_excess=float((1 + np.sum(obs.R_minus_A - 1e-12 <= R0 - A0)) / (1 + R0.size)),
        n_draws=int(R0.size),
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
    gen = _as_rng(rng)
    y = np.asarray(y)
    values = np.asarray(values, dtype=np.float64)
    if (y == 0).sum() == 0 or (y == 1).sum() == 0:
        warnings.warn(
            "AUROC is undefined: only one class is present; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return Estimate(math.nan, ConfidenceInterval(math.nan, math.nan), int(y.size))
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
        cs = np.cumsum(ws, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(
                np.einsum("ij,ij->i", wu, cs - 0.5 * ws) / (cs[:, -1] * wu.sum(axis=1)),
                dtype=np.float64,
            )

    point = float(auc(np.ones((1, ng)))[0])
    draws = np.concatenate([auc(c) for c in draw_group_counts(ng, n_boot, gen, chunk_size)])
    return Estimate(point, _percentile_ci(draws), int(y.size))
