"""The per-draw engine of the Spot-Stop terms: weighted class curves over the sorted scores.

A draw is a vector of group multiplicities (see :mod:`spotstop.diagnostics._resample`).
Every statistic of a draw is a function of the weighted class totals at each unique score of
the paired cases, which are one sparse product per chunk of draws; AUROC, ``A*``, the
batch-mean cut and the cross-fitted cut are then cumulative sums along the sorted scores.
:class:`CurveEngine` computes all of :data:`STATISTICS` for many draws at once; the group
bootstrap (:mod:`._bootstrap`) feeds it resampled counts, :func:`cross_fitted_threshold_part`
unit counts with random halves.

The sweep (:meth:`CurveEngine._sweep`) runs score-major over *merged rows* (:class:`_Runs`):
neighbouring unique scores that hold pair weight of one class only form one row (on simulated
logs about a third as many rows as scores); a score holding both classes stays a row of its
own.  Every curve quantity at a row's end is the one at its last score; AUROC needs no more
(along unsafe-only scores the safe curve stands still), and ``D`` grows along safe-only scores
and shrinks along unsafe-only ones, so its first maximum lies at a row's end or, inside a row
of safe-only scores, at the last of them with weight in the draw: found after the sweep from
the (score, group) weights of that row, with the partial sums there
(:meth:`CurveEngine._first_best`, :meth:`CurveEngine._batch_inside` for the batch-mean cut).
The rows are cut into blocks of :data:`BLOCK_ROWS`; per block one sparse product (block ×
groups) @ (groups × draws) gives
the safe and unsafe weights of every draw (and of its fit half) at once, a blocked cumulative
sum carries the curves from block to block, and the running first argmax of ``D``, the AUROC
sum and the values at the cuts that are needed are updated; nothing (draws × unique scores)
is ever held.  Draws are swept in sub-chunks sized to a memory budget (:data:`MEMORY_BUDGET`,
1 GiB: at 1.2M cases about 110 draws a sweep; see :func:`draws_per_sweep`).  The engine
labels the groups by their first merged row (:attr:`CurveEngine.group_order`): counts made
in those labels (:func:`~spotstop.diagnostics._resample.block_draws`) need only a plain
tiled transpose to become the sweep's right-hand side, and the public methods relabel the
caller's counts once per call.  The fit halves' counts and the draws' totals are made once
per chunk and shared by the sweep and the cross-fit; the buffers are kept between chunks
(:attr:`CurveEngine.scratch`).  Every curve quantity is an integer sum of integer weights held in
float64 below 2**53, so it is exact and the results do not depend on the blocking, the
sub-chunks or the order of summation.

Conventions: the paper's direct answer, ``score > cut`` is UNSAFE (see :mod:`._metrics`), for
``L``, ``W``, ``A`` and the cuts of ``A*``; the batch-mean cut is a rule the guard would run,
so ``A_batch`` labels with the guard's own rule ``S ≥ t`` (ties UNSAFE,
:func:`spotstop.guard.policies.unsafe_mask`).  Ties count one half in ``R_half`` and AUROC; the
decomposition ``R_half - A = threshold + overlap + within`` and the null ``(1 - C - T)/2`` are
the tie-consistent ones of :mod:`._metrics`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from fractions import Fraction
from functools import cached_property
from typing import Any

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
from spotstop.guard.policies import exact_sum, float_at_or_above, n_safe

__all__ = [
    "BLOCK_ROWS",
    "MEMORY_BUDGET",
    "ROOM_TOL",
    "STATISTICS",
    "CrossFit",
    "CurveEngine",
    "cross_fitted_threshold_part",
    "draws_per_sweep",
]

#: a threshold part at or below this is no room at all (float rounding of ``A* - A``)
ROOM_TOL = 1e-9

#: unique scores per block of the sweep (a multiple of :data:`_SPLIT`)
BLOCK_ROWS = 256

#: the blocked cumulative sum splits a block into this many runs of rows
_SPLIT = 16

#: default memory budget of one sweep in bytes (see :func:`draws_per_sweep`)
MEMORY_BUDGET = 2**30

#: groups per tile of the transposed copy that builds a sweep's right-hand side
_TILE = 1024

#: the most draws swept together (larger sub-chunks only grow the cache footprint)
_MAX_DRAWS = 128

#: above this every curve total must stay for the float64 sums to be exact integers
_EXACT = 2.0**53


def draws_per_sweep(n_groups: int, memory_budget: int = MEMORY_BUDGET) -> int:
    """Draws swept together under ``memory_budget`` bytes.

    A sweep of ``b`` draws holds the (groups × 2b) float64 right-hand side (draw counts and
    fit-half counts: ``16 * n_groups`` bytes per draw) and per block about
    ``100 * BLOCK_ROWS`` bytes per draw (weights, curves, ``D`` and temporaries), so the memory
    is about ``b * (16 * n_groups + 100 * BLOCK_ROWS)`` bytes, independent of the number of
    unique scores; ``b`` is at most 128 and at least 1.
    """
    per_draw = 16 * max(n_groups, 1) + 100 * BLOCK_ROWS
    return int(max(1, min(_MAX_DRAWS, memory_budget // per_draw)))


def _cumsum_rows(x: NDArray[np.float64], carry: NDArray[np.float64]) -> None:
    """In place: ``x = carry + cumsum(x, axis=0)``, then ``carry = x[-1]``.

    ``np.cumsum(axis=0)`` walks each column with a stride (about 10 ns an element); this adds
    whole rows instead, in :data:`_SPLIT` runs and one carry step (about 1 ns an element).
    Exact for integer sums below 2**53 (any order gives the same result).
    """
    x[0] += carry
    y = x.reshape(_SPLIT, x.shape[0] // _SPLIT, x.shape[1])
    for i in range(1, y.shape[1]):
        np.add(y[:, i], y[:, i - 1], out=y[:, i])
    last = y[:, -1]
    for i in range(1, _SPLIT):
        np.add(last[i], last[i - 1], out=last[i])
    if y.shape[1] > 1:
        y[1:, :-1] += last[:-1, None]
    carry[:] = x[-1]


def _transpose_into(out: NDArray[np.float64], a: NDArray[np.float64]) -> None:
    """``out[:] = a.T`` in tiles of columns (a whole-array transposed copy misses the cache on
    every element)."""
    for g0 in range(0, a.shape[1], _TILE):
        out[g0 : g0 + _TILE] = a[:, g0 : g0 + _TILE].T


@dataclass(frozen=True)
class _Runs:
    """The unique scores merged into rows: neighbouring scores that hold pair weight of one
    class only (safe-only or unsafe-only, in the whole table) form one row; a score that holds
    both classes is a row of its own.  ``row_of[j]`` is the row of unique score ``j``;
    ``start``, ``end`` the first and last score of each row; ``safe`` (``unsafe``) marks the
    rows that hold only safe (only unsafe) weight.  ``indptr``, ``group``, ``weight``: the
    pair weight of each (unique score, group), CSR by score (for the cuts and the batch cut
    inside a merged row, :meth:`CurveEngine._within_rows`)."""

    row_of: NDArray[np.intp]
    start: NDArray[np.intp]
    end: NDArray[np.intp]
    safe: NDArray[np.bool_]
    unsafe: NDArray[np.bool_]
    indptr: NDArray[np.intp]
    group: NDArray[np.intp]
    weight: NDArray[np.float64]
    pos: NDArray[np.intp]  # the unique score of each entry

    @classmethod
    def build(
        cls,
        ws: NDArray[np.float64],
        wu: NDArray[np.float64],
        col: NDArray[np.intp],
        gi: NDArray[np.intp],
        w: NDArray[np.float64],
        ng: int,
    ) -> _Runs:
        m = ws.size
        kind = (ws > 0).astype(np.int8) + 2 * (wu > 0)  # 1 safe, 2 unsafe, 3 both
        new = np.ones(m, dtype=bool)
        new[1:] = (kind[1:] != kind[:-1]) | (kind[1:] == 3)
        start = np.flatnonzero(new)
        end = np.append(start[1:] - 1, m - 1) if m else start
        by_score = sparse.csr_matrix((w, (col, gi)), shape=(m, ng))
        by_score.sum_duplicates()
        indptr = np.asarray(by_score.indptr, dtype=np.intp)
        return cls(
            row_of=np.cumsum(new, dtype=np.intp) - 1,
            start=start,
            end=end,
            safe=kind[start] == 1,
            unsafe=kind[start] == 2,
            indptr=indptr,
            group=np.asarray(by_score.indices, dtype=np.intp),
            weight=np.asarray(by_score.data, dtype=np.float64),
            pos=np.repeat(np.arange(m, dtype=np.intp), np.diff(indptr)),
        )

    @property
    def n_rows(self) -> int:
        return int(self.start.size)

    def entries(
        self, lo: NDArray[np.intp], hi: NDArray[np.intp]
    ) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """For queries ``q`` over the unique scores ``lo[q] .. hi[q] - 1``: the query and the
        entry index of every (score, group) entry they cover, in score order."""
        a, b = self.indptr[lo], self.indptr[hi]
        n = b - a
        q = np.repeat(np.arange(lo.size), n)
        e = np.arange(int(n.sum()), dtype=np.intp) + np.repeat(a - (np.cumsum(n) - n), n)
        return q, e

    @staticmethod
    def _draw_weight(
        counts: NDArray[np.float64],
        half: NDArray[np.bool_] | None,
        in_half: bool,
        d: NDArray[np.intp],
        g: NDArray[np.intp],
    ) -> NDArray[np.float64]:
        """``counts[d, g]``, times ``half[d, g] == in_half`` when a half is given."""
        c = counts[d, g]
        return c if half is None else np.where(half[d, g] == in_half, c, 0.0)

    def tail_sum(
        self,
        counts: NDArray[np.float64],
        half: NDArray[np.bool_] | None,
        in_half: bool,
        draws: NDArray[np.intp],
        lo: NDArray[np.intp],
        hi: NDArray[np.intp],
    ) -> NDArray[np.float64]:
        """``sum_{lo <= j < hi} sum_g weight[j, g] * c[draw, g]`` per query, ``c`` the draw's
        counts (of one half: see :meth:`_draw_weight`); integer sums: exact."""
        q, e = self.entries(lo, hi)
        c = self._draw_weight(counts, half, in_half, draws[q], self.group[e])
        return np.asarray(np.bincount(q, self.weight[e] * c, minlength=lo.size), dtype=np.float64)

    def last_with_weight(
        self,
        counts: NDArray[np.float64],
        half: NDArray[np.bool_] | None,
        in_half: bool,
        draws: NDArray[np.intp],
        lo: NDArray[np.intp],
        hi: NDArray[np.intp],
    ) -> NDArray[np.intp]:
        """The last unique score in ``lo .. hi - 1`` with weight in the draw (counts as in
        :meth:`tail_sum`) per query; ``lo - 1`` where none has."""
        q, e = self.entries(lo, hi)
        c = self._draw_weight(counts, half, in_half, draws[q], self.group[e])
        pos = np.where(c > 0, self.pos[e], -1)
        out = lo - 1
        np.maximum.at(out, q, pos)
        return out


@dataclass(frozen=True)
class _Layout:
    """The paired cases row-major over the merged rows (:class:`_Runs`): one CSR matrix
    (2 rows, G) per block of rows, safe weights in its first ``rows`` rows and unsafe ones in
    the rest (a block's rows padded with empty ones to a multiple of :data:`_SPLIT`).  The
    engine numbers the groups by their first row (:attr:`CurveEngine.group_order`), so that
    about half of the product's gathers stream."""

    starts: tuple[int, ...]
    blocks: tuple[sparse.csr_matrix, ...]


def _layout(ms: sparse.csr_matrix, mu: sparse.csr_matrix, ng: int) -> _Layout:
    """The row-major blocks of the (groups, rows) safe / unsafe weights (see :class:`_Layout`)."""
    m = ms.shape[1]
    st, ut = sparse.csr_matrix(ms.T), sparse.csr_matrix(mu.T)
    starts, blocks = [], []
    for j0 in range(0, m, BLOCK_ROWS):
        rows = min(BLOCK_ROWS, m - j0)
        pad = sparse.csr_matrix((-(-rows // _SPLIT) * _SPLIT - rows, ng))
        blk = sparse.vstack([st[j0 : j0 + rows], pad, ut[j0 : j0 + rows], pad], format="csr")
        blk.sort_indices()
        starts.append(j0)
        blocks.append(blk)
    return _Layout(tuple(starts), tuple(blocks))


@dataclass(frozen=True)
class _Sweep:
    """What one sweep of the sorted scores gives per draw (see :meth:`CurveEngine._sweep`).

    ``au2 = sum_j wu_j (cs_j + cs_{j-1})`` (twice the AUROC numerator); ``dmax`` and ``k`` the
    best ``D`` and its cut index (as :meth:`CurveEngine._best`); ``batch_s``, ``batch_u`` the
    cumulative safe / unsafe weight below the cut index ``k_batch``; with halves, ``k1``
    (fitted on half 1) with half 2's cumulative weights below it (``s2_at_k1``, ``u2_at_k1``),
    and ``k2`` with half 1's (``s1_at_k2``, ``u1_at_k2``).
    """

    au2: NDArray[np.float64]
    dmax: NDArray[np.float64]
    k: NDArray[np.intp]
    batch_s: NDArray[np.float64]
    batch_u: NDArray[np.float64]
    k1: NDArray[np.intp]
    k2: NDArray[np.intp]
    s2_at_k1: NDArray[np.float64]
    u2_at_k1: NDArray[np.float64]
    s1_at_k2: NDArray[np.float64]
    u1_at_k2: NDArray[np.float64]


def _ba(
    c_s: NDArray[np.float64],
    c_u: NDArray[np.float64],
    ts: NDArray[np.float64],
    tu: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Balanced accuracy from the cumulative weights below a cut (NaN if a class is missing)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(0.5 * (c_s / ts + 1.0 - c_u / tu), dtype=np.float64)


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
    ts_g: NDArray[np.float64]  # pair-weighted safe / unsafe totals per group
    tu_g: NDArray[np.float64]
    below_s_g: NDArray[np.float64]  # the same below the direct cut index
    below_u_g: NDArray[np.float64]
    runs: _Runs
    layout: _Layout
    #: the caller's group of each of the engine's groups: the engine labels the groups by
    #: their first merged row; the public methods take counts and halves in the caller's
    #: labels (``counts[:, group_order]`` in the engine's), :meth:`statistics_in_order` in its
    #: own
    group_order: NDArray[np.intp]
    case_score: NDArray[np.float64]  # every case's score and group (exact batch means)
    case_group: NDArray[np.intp]
    memory_budget: int = MEMORY_BUDGET

    @classmethod
    def build(
        cls,
        table: CaseTable,
        cut: float,
        group: NDArray[np.intp] | None = None,
        *,
        memory_budget: int = MEMORY_BUDGET,
    ) -> CurveEngine:
        """The engine of ``table`` at the direct ``cut``; ``group`` codes 0..G-1 per case are
        the resampling unit (default :attr:`CaseTable.group`); ``memory_budget`` bytes bound
        one sweep (:func:`draws_per_sweep`)."""
        pairs = table.pairs
        g = table.group if group is None else np.asarray(group, dtype=np.intp)
        ng = int(g.max()) + 1
        s = table.score
        pg = g[pairs.safe]
        su, ss = s[pairs.unsafe], s[pairs.safe]

        def per_group(x: NDArray[np.bool_]) -> NDArray[np.float64]:
            return wbincount(pg, x.astype(np.float64), ng)

        paired = np.flatnonzero(pairs.weight > 0)
        order = np.arange(ng, dtype=np.intp)
        if paired.size:
            v, ws, wu, col = unique_class_weights(
                table.label[paired], s[paired], pairs.weight[paired]
            )
            w = pairs.weight[paired]
            y = table.label[paired]
            # the engine's own group labels: groups renumbered by their first merged row
            # (stable), so the sweep's right-hand side is a plain transpose of the counts
            row_of = _Runs.build(ws, wu, col, g[paired], w, ng).row_of
            first = np.full(ng, row_of.size, dtype=np.intp)
            np.minimum.at(first, g[paired], row_of[col])
            order = np.asarray(np.argsort(first, kind="stable"), dtype=np.intp)
            rank = np.empty(ng, dtype=np.intp)
            rank[order] = np.arange(ng, dtype=np.intp)
            g = rank[g]
            pg = g[pairs.safe]
            gi = g[paired]
            ms = sparse.csr_matrix((w * (y == 0), (gi, col)), shape=(ng, v.size))
            mu = sparse.csr_matrix((w * (y == 1), (gi, col)), shape=(ng, v.size))
            runs = _Runs.build(ws, wu, col, gi, w, ng)
            row = runs.row_of[col]
            rms = sparse.csr_matrix((w * (y == 0), (gi, row)), shape=(ng, runs.n_rows))
            rmu = sparse.csr_matrix((w * (y == 1), (gi, row)), shape=(ng, runs.n_rows))
        else:
            v = np.zeros(0)
            ms = mu = rms = rmu = sparse.csr_matrix((ng, 0))
            none = np.zeros(0, dtype=np.intp)
            runs = _Runs.build(np.zeros(0), np.zeros(0), none, none, np.zeros(0), ng)
        kd = int(np.searchsorted(v, cut, side="right"))
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
            k_direct=kd,
            ts_g=np.asarray(ms.sum(axis=1), dtype=np.float64).ravel(),
            tu_g=np.asarray(mu.sum(axis=1), dtype=np.float64).ravel(),
            below_s_g=np.asarray(ms[:, :kd].sum(axis=1), dtype=np.float64).ravel(),
            below_u_g=np.asarray(mu[:, :kd].sum(axis=1), dtype=np.float64).ravel(),
            runs=runs,
            layout=_layout(rms, rmu, ng),
            group_order=order,
            case_score=np.asarray(s, dtype=np.float64),
            case_group=np.asarray(g, dtype=np.intp),
            memory_budget=memory_budget,
        )

    #: the per-group integer totals that :meth:`_totals` sums in one product
    _TOTALS = (
        "pairs_g",
        "ordered_g",
        "tied_g",
        "lab_g",
        "wrong_g",
        "cases_g",
        "paired_s_g",
        "paired_u_g",
        "ts_g",
        "tu_g",
        "below_s_g",
        "below_u_g",
    )

    def __getstate__(self) -> dict[str, object]:
        """Pickled (e.g. into Ray's object store) without the kept buffers and caches."""
        return {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("scratch", "_stacked", "_score_sums", "_exact_sums")
        }

    @cached_property
    def scratch(self) -> dict[str, NDArray[Any]]:
        """Buffers kept between sweeps and chunks of draws (fresh pages cost a fault each; the
        engine is not shared between threads)."""
        return {}

    @cached_property
    def _stacked(self) -> NDArray[np.float64]:
        return np.column_stack([getattr(self, k) for k in self._TOTALS])

    def _totals(self, counts: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        """``counts @ x`` for every per-group integer total ``x`` of :data:`_TOTALS`, as one
        matrix product (integer sums below 2**53: exact, so equal to the single products)."""
        prod = counts @ self._stacked
        return {k[:-2]: prod[:, i] for i, k in enumerate(self._TOTALS)}

    def class_weights(
        self, counts: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(draws, m) safe and unsafe weight at each unique score, C-contiguous (for
        inspection; the statistics sweep the scores in blocks instead); ``counts`` in the
        caller's group labels."""
        c = counts[:, self.group_order]
        ws = np.ascontiguousarray(np.asarray(self.ms.T @ c.T, dtype=np.float64).T)
        wu = np.ascontiguousarray(np.asarray(self.mu.T @ c.T, dtype=np.float64).T)
        return ws, wu

    def _sweep(
        self,
        counts: NDArray[np.float64],
        halves: NDArray[np.bool_] | None,
        k_batch: NDArray[np.intp] | None,
        c1: NDArray[np.float64] | None = None,
        totals: tuple[NDArray[np.float64], ...] | None = None,
    ) -> _Sweep:
        """One pass over the sorted unique scores for the draws ``counts`` (see the module
        docstring), in sub-chunks of :func:`draws_per_sweep` draws; ``c1`` the fit-half
        counts ``counts * halves`` and ``totals`` the draws' ``(ts, tu, ts1, tu1)`` when
        already made (engine labels throughout)."""
        if halves is not None and c1 is None:
            c1 = counts * halves
        if totals is None:
            ts, tu = counts @ self.ts_g, counts @ self.tu_g
            ts1, tu1 = (ts, tu) if c1 is None else (c1 @ self.ts_g, c1 @ self.tu_g)
            totals = (ts, tu, ts1, tu1)
        step = draws_per_sweep(self.n_groups, self.memory_budget)
        # one right-hand-side buffer for all sub-chunks and calls (fresh pages cost a fault
        # each)
        size = self.n_groups * 2 * min(step, counts.shape[0])
        buf = self.scratch.get("rhs")
        if buf is None or buf.size < size:
            buf = self.scratch["rhs"] = np.empty(size)
        if counts.shape[0] <= step:
            return self._sweep_chunk(counts, halves, c1, k_batch, totals, buf)

        def cut(x: NDArray[Any] | None, i: int) -> NDArray[Any] | None:
            return None if x is None else x[i : i + step]

        parts = [
            self._sweep_chunk(
                counts[i : i + step],
                cut(halves, i),
                cut(c1, i),
                cut(k_batch, i),
                tuple(t[i : i + step] for t in totals),
                buf,
            )
            for i in range(0, counts.shape[0], step)
        ]
        return _Sweep(
            **{f.name: np.concatenate([getattr(q, f.name) for q in parts]) for f in fields(_Sweep)}
        )

    def _sweep_chunk(
        self,
        counts: NDArray[np.float64],
        halves: NDArray[np.bool_] | None,
        c1: NDArray[np.float64] | None,
        k_batch: NDArray[np.intp] | None,
        totals: tuple[NDArray[np.float64], ...],
        buf: NDArray[np.float64],
    ) -> _Sweep:
        n = counts.shape[0]
        lay, runs = self.layout, self.runs
        cf = halves is not None
        w = 2 * n if cf else n  # right-hand-side columns: the draws, then their fit halves
        nd = w + n if cf else w  # D columns: total, half 1, half 2
        rhs = buf[: self.n_groups * w].reshape(self.n_groups, w)
        _transpose_into(rhs[:, :n], counts)
        ts, tu, ts1, tu1 = totals
        if c1 is not None:
            _transpose_into(rhs[:, n:], c1)
            ts_all, tu_all = np.concatenate([ts, ts1]), np.concatenate([tu, tu1])
            ts2, tu2 = ts - ts1, tu - tu1
        else:
            ts_all, tu_all = ts, tu
        carry = np.zeros((2, w))
        cs_prev = np.zeros(n)
        au2 = np.zeros(n)
        best = np.full(nd, -np.inf)
        idx = np.zeros(nd, dtype=np.intp)  # the merged row of the best D
        at_s = np.zeros(nd)
        at_u = np.zeros(nd)
        kb = np.full(n, -1, dtype=np.intp) if k_batch is None else np.asarray(k_batch) - 1
        rb = np.where(kb >= 0, runs.row_of[np.maximum(kb, 0)], -1) if runs.n_rows else kb
        batch_s, batch_u = np.zeros(n), np.zeros(n)
        rows_max = max((b.shape[0] // 2 for b in lay.blocks), default=0)
        dbuf = np.empty((rows_max, nd))
        tbuf = np.empty((rows_max, w))
        cols = np.arange(nd)
        for j0, blk in zip(lay.starts, lay.blocks, strict=True):
            mb = blk.shape[0] // 2
            prod = np.asarray(blk @ rhs, dtype=np.float64)
            s, u = prod[:mb], prod[mb:]
            _cumsum_rows(s, carry[0])
            # AUROC: sum_j wu_j (cs_j + cs_{j-1}), with wu before its cumulative sum (a merged
            # row of unsafe-only scores has cs_j = cs_{j-1} at each of them)
            au2 += np.einsum("jb,jb->b", u[:, :n], s[:, :n])
            au2 += np.einsum("jb,jb->b", u[1:, :n], s[:-1, :n]) + u[0, :n] * cs_prev
            cs_prev = s[-1, :n].copy()
            _cumsum_rows(u, carry[1])
            d, t = dbuf[:mb], tbuf[:mb]
            # D_k = cs_k tu - cu_k ts (exact in float64 for integer weights)
            np.multiply(s, tu_all, out=d[:, :w])
            np.multiply(u, ts_all, out=t)
            np.subtract(d[:, :w], t, out=d[:, :w])
            if cf:
                t2 = t[:, :n]
                np.subtract(s[:, :n], s[:, n:], out=t2)
                np.multiply(t2, tu2, out=d[:, w:])
                np.subtract(u[:, :n], u[:, n:], out=t2)
                t2 *= ts2
                np.subtract(d[:, w:], t2, out=d[:, w:])
            r = np.argmax(d, axis=0)
            val = d[r, cols]
            up = np.flatnonzero(val > best)  # strictly: the first maximum stays
            if up.size:
                best[up] = val[up]
                idx[up] = j0 + r[up]
                if cf:
                    # fitted on half 1 (columns n..2n-1), scored on half 2 = total - half 1
                    b1 = up[(up >= n) & (up < w)] - n
                    r1 = r[n + b1]
                    at_s[n + b1] = s[r1, b1] - s[r1, n + b1]
                    at_u[n + b1] = u[r1, b1] - u[r1, n + b1]
                    # fitted on half 2 (columns 2n..3n-1), scored on half 1
                    b2 = up[up >= w] - w
                    r2 = r[w + b2]
                    at_s[w + b2] = s[r2, n + b2]
                    at_u[w + b2] = u[r2, n + b2]
            if k_batch is not None:
                sel = np.flatnonzero((rb >= j0) & (rb < j0 + mb))
                if sel.size:
                    batch_s[sel] = s[rb[sel] - j0, sel]
                    batch_u[sel] = u[rb[sel] - j0, sel]
        pos = self._first_best(counts, halves, best, idx, at_s, n)
        if k_batch is not None:
            self._batch_inside(counts, kb, rb, batch_s, batch_u)

        def cut_index(lo: int, hi: int) -> NDArray[np.intp]:
            return np.where(best[lo:hi] > 0, pos[lo:hi] + 1, 0)

        k1, k2 = cut_index(n, w), cut_index(w, nd)  # empty without halves
        return _Sweep(
            au2=au2,
            dmax=best[:n],
            k=cut_index(0, n),
            batch_s=batch_s,
            batch_u=batch_u,
            k1=k1,
            k2=k2,
            s2_at_k1=np.where(k1 == 0, 0.0, at_s[n:w]),
            u2_at_k1=np.where(k1 == 0, 0.0, at_u[n:w]),
            s1_at_k2=np.where(k2 == 0, 0.0, at_s[w:nd]),
            u1_at_k2=np.where(k2 == 0, 0.0, at_u[w:nd]),
        )

    def _first_best(
        self,
        counts: NDArray[np.float64],
        halves: NDArray[np.bool_] | None,
        best: NDArray[np.float64],
        idx: NDArray[np.intp],
        at_s: NDArray[np.float64],
        n: int,
    ) -> NDArray[np.intp]:
        """The unique score of the first best ``D`` per column, from its merged row ``idx``;
        in place: ``at_s`` of a fitted half becomes the other half's safe weight at that score.

        ``D`` grows along safe-only scores and shrinks along unsafe-only ones, so a positive
        first maximum lies at the end of a merged row or, in a row of safe-only scores, at the
        last of them with weight in the fitted draw (the scores after it add nothing to the
        fitted ``D``); the other half's safe weight there is its weight at the row's end less
        the weight of the row's later scores (integer sums: exact).
        """
        runs = self.runs
        pos = runs.end[idx] if runs.n_rows else idx.copy()
        fix = np.flatnonzero(
            (best > 0) & runs.safe[idx] & (runs.start[idx] < runs.end[idx])
            if runs.n_rows
            else np.zeros(0, dtype=bool)
        )
        if fix.size == 0:
            return pos
        part = fix // n  # 0: the total, 1: fitted on half 1, 2: fitted on half 2
        for h in range(3):
            sel = fix[part == h]
            if sel.size == 0:
                continue
            d, r = sel - h * n, idx[sel]
            end = runs.end[r] + 1
            fit = None if h == 0 else halves  # half 1: the groups in `halves`; half 2: the rest
            p = runs.last_with_weight(counts, fit, h == 1, d, runs.start[r], end)
            pos[sel] = p
            if h > 0:
                at_s[sel] -= runs.tail_sum(counts, halves, h == 2, d, p + 1, end)
        return pos

    def _batch_inside(
        self,
        counts: NDArray[np.float64],
        kb: NDArray[np.intp],
        rb: NDArray[np.intp],
        batch_s: NDArray[np.float64],
        batch_u: NDArray[np.float64],
    ) -> None:
        """In place: the cumulative weights at the batch cut's score ``kb`` where it lies inside
        a merged row (one class only): the row's end value less its later scores' weight."""
        runs = self.runs
        if runs.n_rows == 0:
            return
        inside = np.flatnonzero((kb >= 0) & (kb < runs.end[np.maximum(rb, 0)]))
        if inside.size == 0:
            return
        r = rb[inside]
        tail = runs.tail_sum(counts, None, True, inside, kb[inside] + 1, runs.end[r] + 1)
        sf = runs.safe[r]
        batch_s[inside[sf]] -= tail[sf]
        batch_u[inside[~sf]] -= tail[~sf]

    def cross_fit(
        self,
        counts: NDArray[np.float64],
        halves: NDArray[np.bool_],
    ) -> NDArray[np.float64]:
        """Cross-fitted threshold part per draw (NaN where a half lacks a class); ``counts``
        and ``halves`` in the caller's group labels."""
        c = np.ascontiguousarray(counts[:, self.group_order])
        h = np.ascontiguousarray(halves[:, self.group_order])
        return self.cross_fit_in_order(c, h)

    def cross_fit_in_order(
        self, counts: NDArray[np.float64], halves: NDArray[np.bool_]
    ) -> NDArray[np.float64]:
        """:meth:`cross_fit` for ``counts`` and ``halves`` in the engine's group labels."""
        c1 = self._fit_half(counts, halves)
        tot, tot1 = self._totals(counts), self._totals(c1)
        sw = self._sweep(counts, halves, None, c1, (tot["ts"], tot["tu"], tot1["ts"], tot1["tu"]))
        return self._cross_fit(sw, tot, tot1)

    def _fit_half(
        self, counts: NDArray[np.float64], halves: NDArray[np.bool_]
    ) -> NDArray[np.float64]:
        """``counts * halves`` (the fit half's counts) in a kept buffer."""
        size = counts.size
        buf = self.scratch.get("c1")
        if buf is None or buf.size < size:
            buf = self.scratch["c1"] = np.empty(size)
        out = buf[:size].reshape(counts.shape)
        np.multiply(counts, halves, out=out)
        return out

    def _cross_fit(
        self,
        sw: _Sweep,
        t0: dict[str, NDArray[np.float64]],
        t1: dict[str, NDArray[np.float64]],
    ) -> NDArray[np.float64]:
        """The cross-fitted threshold part from the sweep with halves and the totals of the
        draws (``t0``) and of their fit halves (``t1``)."""
        ts1, tu1 = t1["ts"], t1["tu"]
        ts2, tu2 = t0["ts"] - ts1, t0["tu"] - tu1
        # below the direct cut index: fixed, so a product with the per-group totals below it
        bs1, bu1 = t1["below_s"], t1["below_u"]
        bs2, bu2 = t0["below_s"] - bs1, t0["below_u"] - bu1
        gain2 = _ba(sw.s2_at_k1, sw.u2_at_k1, ts2, tu2) - _ba(bs2, bu2, ts2, tu2)
        gain1 = _ba(sw.s1_at_k2, sw.u1_at_k2, ts1, tu1) - _ba(bs1, bu1, ts1, tu1)
        n1 = t1["pairs"]
        n2 = t0["pairs"] - n1
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (gain1 * n1 + gain2 * n2) / (n1 + n2)
        bad = (ts1 * tu1 == 0) | (ts2 * tu2 == 0)
        return np.asarray(np.where(bad, np.nan, out), dtype=np.float64)

    def statistics(
        self, counts: NDArray[np.float64], halves: NDArray[np.bool_] | None
    ) -> dict[str, NDArray[np.float64]]:
        """All statistics of :data:`STATISTICS` for each row of ``counts`` (and of
        ``halves``, the cross-fit halves, or None: no cross-fitted part), in the caller's
        group labels."""
        c = np.ascontiguousarray(counts[:, self.group_order])
        h = None if halves is None else np.ascontiguousarray(halves[:, self.group_order])
        return self.statistics_in_order(c, h)

    def _batch_index(
        self, counts: NDArray[np.float64], cases: NDArray[np.float64]
    ) -> NDArray[np.intp]:
        """The batch-mean cut's index per draw: the number of unique scores below the mean
        score ``t`` of the draw's cases (the guard's own rule ``S >= t``, ties UNSAFE, flags a
        suffix; a ``t`` that is not finite flags all).  This is the ``batch_frozen_iqr`` rule
        (the fixed ``S``, only its mean refitted), not the paper's ``batch`` rule, which refits
        Avg-2 on the draw (:mod:`._batch_rule`).

        ``t`` is ``fsum(counts * sum_g) / cases`` (the products summed exactly), so the index
        does not depend on the order of summation (the group labels, the chunk of draws, the
        matrix-product kernel): a fast product decides it, and a draw whose mean lies within
        the product's error bound (``1e-9`` of the sum of absolute values, far above it) of a
        unique score is summed again with :func:`math.fsum`.
        """
        prod = counts @ self._score_sums
        with np.errstate(invalid="ignore", divide="ignore"):
            t = prod[:, 0] / cases
            bound = 1e-9 * prod[:, 1] / cases
        ok = np.isfinite(t)
        k = n_safe(self.v, t)  # the guard's rule, written once
        m = self.v.size
        if m:
            lo = self.v[np.clip(k - 1, 0, m - 1)]
            hi = self.v[np.clip(k, 0, m - 1)]
            near = ok & ((np.abs(t - lo) <= bound) | (np.abs(hi - t) <= bound))
            exact_g = self._exact_sums if near.any() else []
            for i in np.flatnonzero(near):
                # the guard's mean_cut: the exact mean of the draw's cases, rounded up
                c = counts[i]
                total = sum(
                    (Fraction(int(c[j])) * exact_g[j] for j in np.flatnonzero(c)), Fraction(0)
                )
                k[i] = n_safe(self.v, float_at_or_above(total / int(cases[i])))
        return np.asarray(k, dtype=np.intp)

    @cached_property
    def _exact_sums(self) -> list[Fraction]:
        """Each group's exact score sum (the float ``sum_g`` is rounded)."""
        order = np.argsort(self.case_group, kind="stable")
        bounds = np.searchsorted(self.case_group[order], np.arange(self.n_groups + 1))
        s = self.case_score[order]
        return [exact_sum(s[a:b].tolist()) for a, b in itertools.pairwise(bounds)]

    @cached_property
    def _score_sums(self) -> NDArray[np.float64]:
        return np.column_stack([self.sum_g, np.abs(self.sum_g)])

    def statistics_in_order(
        self, counts: NDArray[np.float64], halves: NDArray[np.bool_] | None
    ) -> dict[str, NDArray[np.float64]]:
        """:meth:`statistics` for ``counts`` and ``halves`` in the engine's group labels
        (:attr:`group_order`), as :func:`~spotstop.diagnostics._resample.block_draws` makes
        them: no relabelling copy."""
        tot = self._totals(counts)
        ts, tu = tot["ts"], tot["tu"]
        k_batch = self._batch_index(counts, tot["cases"])
        tot1 = None
        if halves is not None:
            c1 = self._fit_half(counts, halves)
            tot1 = self._totals(c1)
            sw = self._sweep(counts, halves, k_batch, c1, (ts, tu, tot1["ts"], tot1["tu"]))
        else:
            sw = self._sweep(counts, None, k_batch)
        with np.errstate(invalid="ignore", divide="ignore"):
            npairs = tot["pairs"]
            R = tot["ordered"] / npairs
            T = tot["tied"] / npairs
            r_half = R + T / 2
            L = tot["lab"] / npairs
            W = tot["wrong"] / npairs
            C = L + W
            A = 0.5 + L - C / 2
            # AUROC = sum_j wu_j (cs_j - ws_j / 2) / (ts tu) = sum_j wu_j (cs_j + cs_{j-1}) / 2
            au = sw.au2 / (2 * ts * tu)
            a_star = 0.5 + np.maximum(sw.dmax, 0.0) / (2 * ts * tu)
            a_batch = _ba(sw.batch_s, sw.batch_u, ts, tu)
            g = au - ndtr(ndtri(au) / math.sqrt(2.0))
            below_s = tot["below_s"]
            below_u = tot["below_u"]
            hit = 1.0 - below_u / tu
            fa = 1.0 - below_s / ts
            n_u, n_s = tot["paired_u"], tot["paired_s"]
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
        if tot1 is not None:
            out["cross_fitted_threshold_part"] = self._cross_fit(sw, tot, tot1)
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
