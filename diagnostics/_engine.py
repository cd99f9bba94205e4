"""The per-draw engine of the Spot-Stop terms: weighted class curves over the sorted scores.

A draw is a vector of group multiplicities (see :mod:`spotstop.diagnostics._resample`).
Every statistic of a draw is a function of the weighted class totals at each unique score of
the paired cases, which are one sparse product per chunk of draws; AUROC, ``A*``, the
batch-mean cut and the cross-fitted cut are then cumulative sums along the sorted scores.
:class:`CurveEngine` computes all of :data:`STATISTICS` for many draws at once; the group
bootstrap (:mod:`._bootstrap`) feeds it resampled counts, :func:`cross_fitted_threshold_part`
unit counts with random halves.

Conventions: the paper's direct answer, ``score > cut`` is UNSAFE (see :mod:`._metrics`), for
``L``, ``W``, ``A`` and the cuts of ``A*``; the batch-mean cut is a rule the guard would run,
so ``A_batch`` labels with the guard's own rule ``S ≥ t`` (ties UNSAFE,
:func:`spotstop.guard.policies.unsafe_mask`).  Ties count one half in ``R_half`` and AUROC; the
decomposition ``R_half - A = threshold + overlap + within`` and the null ``(1 - C - T)/2`` are
the tie-consistent ones of :mod:`._metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.special import ndtr, ndtri
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._metrics import (
    NAN,
    _check_cut,
    _undefined,
    direct_answer,
    unique_class_weights,
    wbincount,
)
from spotstop.diagnostics._resample import as_rng, random_halves
from spotstop.guard.policies import unsafe_mask

__all__ = ["ROOM_TOL", "STATISTICS", "CrossFit", "CurveEngine", "cross_fitted_threshold_part"]

#: a threshold part at or below this is no room at all (float rounding of ``A* - A``)
ROOM_TOL = 1e-9

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
    "tied_share",
    "R_half",
    "R_half_minus_A",
    "tie_part",
    "threshold_part",
    "overlap_part",
    "within_part",
    "g_auroc",
    "excess_beyond_g",
    "A_batch",
    "batch_gain",
    "batch_recovery",
    "hit_rate",
    "false_alarm_rate",
    "d_prime",
    "criterion",
    "cross_fitted_threshold_part",
)


@dataclass(frozen=True)
class CurveEngine:
    """Everything a draw needs, computed once from the table (see the module docstring)."""

    cut: float
    n_groups: int
    n_pairs: int
    v: NDArray[np.float64]  # sorted unique scores of the paired cases
    ms: sparse.csr_matrix  # (groups, m) pair-weighted safe totals
    mu: sparse.csr_matrix  # (groups, m) pair-weighted unsafe totals
    pairs_g: NDArray[np.float64]  # pairs per group
    ordered_g: NDArray[np.float64]
    tied_g: NDArray[np.float64]
    lab_g: NDArray[np.float64]
    wrong_g: NDArray[np.float64]
    sum_g: NDArray[np.float64]  # score sum of all cases of a group (batch mean)
    cases_g: NDArray[np.float64]
    paired_s_g: NDArray[np.float64]  # paired safe / unsafe cases per group (1/(2n) rule)
    paired_u_g: NDArray[np.float64]
    k_direct: int

    @classmethod
    def build(
        cls, table: CaseTable, cut: float, group: NDArray[np.intp] | None = None
    ) -> CurveEngine:
        """The engine of ``table`` at the direct ``cut``; ``group`` codes 0..G-1 per case are
        the resampling unit (default :attr:`CaseTable.group`)."""
        pairs = table.pairs
        g = table.group if group is None else np.asarray(group, dtype=np.intp)
        ng = int(g.max()) + 1
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
            tied_g=per_group(su == ss),
            lab_g=per_group(direct_answer(su, cut) & ~direct_answer(ss, cut)),
            wrong_g=per_group(~direct_answer(su, cut) & direct_answer(ss, cut)),
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
            T = counts @ self.tied_g / npairs
            r_half = R + T / 2
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
            # the guard's own rule (S >= t, ties UNSAFE) on the sorted unique scores: the
            # flagged ones are a suffix, so the cut index is the count of those not flagged
            flagged = unsafe_mask(self.v[None, :], batch_cut[:, None])
            k_batch = (~flagged).sum(axis=1)
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
                "null_gap": (1 - C - T) / 2,
                "R_minus_A": R - A,
                "tied_share": T,
                "R_half": r_half,
                "R_half_minus_A": r_half - A,
                "tie_part": R - r_half,
                "threshold_part": a_star - A,
                "overlap_part": au - a_star,
                "within_part": r_half - au,
                "g_auroc": g,
                "excess_beyond_g": r_half - A - g,
                "A_batch": a_batch,
                # a gain at rounding level (the batch cut labels as the direct cut) is 0
                "batch_gain": np.where(np.abs(a_batch - A) <= ROOM_TOL, 0.0, a_batch - A),
                # undefined (NaN) without threshold room (A* - A at rounding level); whether
                # the ratio is reported at all is decided on the room's interval (_bootstrap)
                "batch_recovery": np.where(
                    a_star - A > ROOM_TOL, (a_batch - A) / (a_star - A), np.nan
                ),
                "hit_rate": hit,
                "false_alarm_rate": fa,
                "d_prime": zh - zf,
                "criterion": -(zh + zf) / 2,
            }
        if halves is not None:
            out["cross_fitted_threshold_part"] = self.cross_fit(counts, halves, curves)
        return out


@dataclass(frozen=True)
class CrossFit:
    """Cross-fitted threshold part: mean over splits and the 2.5/97.5 % band over splits."""

    value: float
    low: float
    high: float
    n_splits: int


def cross_fitted_threshold_part(
    table: CaseTable,
    cut: float = 0.0,
    *,
    n_splits: int = 200,
    rng: np.random.Generator | int | None = None,
) -> CrossFit:
    """``A* - A`` with the cut chosen on half of the groups and scored on the other half.

    Each split draws a random half of the bootstrap groups (``floor(G/2)`` groups); on each
    half the cut that maximises the pair-weighted balanced accuracy is chosen and scored on
    the other half, against the direct cut on that half (the cut is placed as in
    :class:`BestCut`: at the highest fit-half score still answered SAFE).  The two halves are combined weighted
    by their number of pairs (so the result is the accuracy gain over all paired cases, each
    scored with a cut fitted without its group; the paper's plain average of the halves
    coincides when the halves hold equally many pairs).  Splits in which a half lacks a class
    are skipped; none left → NaN with :class:`UndefinedMetricWarning`.
    """
    _check_cut(cut)
    gen = as_rng(rng)
    prep = CurveEngine.build(table, cut)
    if prep.n_pairs == 0:
        v = _undefined("cross-fitted threshold part", "the table has no contrasts")
        return CrossFit(v, NAN, NAN, 0)
    counts = np.ones((n_splits, prep.n_groups))
    halves = random_halves(gen, n_splits, prep.n_groups)
    vals = prep.cross_fit(counts, halves)
    ok = vals[np.isfinite(vals)]
    if ok.size == 0:
        v = _undefined("cross-fitted threshold part", "no split has both classes in both halves")
        return CrossFit(v, NAN, NAN, 0)
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return CrossFit(float(ok.mean()), float(lo), float(hi), int(ok.size))
