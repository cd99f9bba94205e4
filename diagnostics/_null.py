"""The label-swap null of the pair-level rates (seed 000, Supp. C, D.1) and its card check.

:func:`label_swap_null` swaps labels inside contrasts at random and recomputes ``R``, ``L``,
``G`` and ``R - A`` draw by draw (vectorized); :class:`LabelSwapNullCheck` puts the null's
97.5th percentile and the permutation p values on the card.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt, fmt_p
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._metrics import _check_cut, direct_answer, spot_stop
from spotstop.diagnostics._resample import as_rng
from spotstop.diagnostics._results import Estimate

__all__ = ["LabelSwapNullCheck", "NullResult", "label_swap_null"]


@dataclass(frozen=True)
class NullResult:
    """The label-swap null of the pair-level rates at the direct cut (Supp. C, D.1).

    ``R0``, ``L0``, ``G0``, ``R0_minus_A0``: the null draws; ``expected_null_gap`` the closed
    form ``(1 - C - T)/2`` with ``T`` the share of tied contrasts (a tied pair is ordered in
    neither orientation, so ``E[R0] = (1 - T)/2``; the paper's ``(1 - C)/2`` is the case
    ``T = 0``); ``tied_share`` that ``T``; ``R_q975`` the 97.5th percentile of ``R0`` (the
    paper's "above the null" line); ``R0_half_minus_A0`` the null draws of the tie-consistent
    excess ``R½ - A`` (a swap inside a contrast with several cases per side can change which
    pairs tie); ``p_R`` and ``p_excess`` one-sided permutation p values
    ``(1 + #{null >= observed}) / (1 + n_draws)`` for ``R`` and for ``R½ - A`` (``= R - A +
    T/2``; the same as for the paper's ``R - A`` when every contrast is one-to-one, where the
    swaps keep ``T``).
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
    tied_share: float = 0.0
    observed_R_half_minus_A: float = math.nan
    R0_half_minus_A0: NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))

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
    gen = as_rng(rng)
    pairs = table.pairs
    if pairs.n == 0:
        warnings.warn(
            "the label-swap null is undefined: the table has no contrasts; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        e = np.zeros(0)
        nan = math.nan
        return NullResult(nan, nan, nan, e, e, e, e, nan, nan, nan, 0, nan)
    obs = spot_stop(table, cut)
    s = table.score
    # contrasts by code: one-to-one ones take the fast path
    codes = pairs.contrast
    per_code = np.bincount(codes)
    one = per_code[codes] == 1
    su1, ss1 = s[pairs.unsafe[one]], s[pairs.safe[one]]
    r_keep, r_swap = (su1 > ss1).astype(float), (ss1 > su1).astype(float)
    tied1 = float(np.sum(su1 == ss1))  # a swap keeps a one-to-one pair's tie
    au1, as1 = direct_answer(su1, cut), direct_answer(ss1, cut)
    l_keep = (au1 & ~as1).astype(float)
    w_keep = (~au1 & as1).astype(float)
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
        same = (ms[ii_a] == ms[jj_a]) & (ii_a != jj_a)
        eq = sparse.csr_matrix(
            (np.ones(int(same.sum())), (ii_a[same], jj_a[same])), shape=(mcases.size,) * 2
        )
        block_ind = sparse.csr_matrix(
            (np.ones(mcases.size), (np.arange(mcases.size), block)), shape=(mcases.size, start.size)
        )
    above = direct_answer(ms, cut).astype(float)
    n_pairs = float(pairs.n)
    R0_l, L0_l, W0_l, T0_l = [], [], [], []
    done = 0
    while done < n_draws:
        b = min(chunk_size, n_draws - done)
        flip = gen.random((b, su1.size)) < 0.5
        ordered = (np.where(flip, r_swap, r_keep)).sum(axis=1)
        lab = (np.where(flip, w_keep, l_keep)).sum(axis=1)
        wrong = (np.where(flip, l_keep, w_keep)).sum(axis=1)
        tied = np.full(b, tied1)
        if mcases.size:
            keys = gen.random((b, mcases.size)) + block[None, :]
            order = np.argsort(keys, axis=1)  # position p in block order holds case order[p]
            y = np.zeros((b, mcases.size))
            # the case at sorted position p is unsafe iff its rank within the block >= n_safe
            unsafe_at_pos = (rank_in_block >= n_safe_c[block]).astype(float)
            np.put_along_axis(y, order, np.broadcast_to(unsafe_at_pos, (b, mcases.size)), axis=1)
            ordered += np.einsum("bi,bi->b", y, np.asarray((gt @ (1 - y).T).T))
            tied += np.einsum("bi,bi->b", y, np.asarray((eq @ (1 - y).T).T))
            u_hi = np.asarray((block_ind.T @ (y * above).T).T)
            u_lo = np.asarray((block_ind.T @ (y * (1 - above)).T).T)
            s_hi = np.asarray((block_ind.T @ ((1 - y) * above).T).T)
            s_lo = np.asarray((block_ind.T @ ((1 - y) * (1 - above)).T).T)
            lab += (u_hi * s_lo).sum(axis=1)
            wrong += (u_lo * s_hi).sum(axis=1)
        R0_l.append(ordered / n_pairs)
        L0_l.append(lab / n_pairs)
        W0_l.append(wrong / n_pairs)
        T0_l.append(tied / n_pairs)
        done += b
    R0, L0, W0 = np.concatenate(R0_l), np.concatenate(L0_l), np.concatenate(W0_l)
    T0 = np.concatenate(T0_l)
    A0 = 0.5 + L0 - (L0 + W0) / 2
    excess0 = R0 + T0 / 2 - A0
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
        p_excess=float((1 + np.sum(obs.R_half_minus_A - 1e-12 <= excess0)) / (1 + R0.size)),
        n_draws=int(R0.size),
        tied_share=obs.tied_share,
        observed_R_half_minus_A=obs.R_half_minus_A,
        R0_half_minus_A0=excess0,
    )


def _p_at_least(null: NDArray[np.float64], observed: float) -> float:
    """One-sided permutation p value ``(1 + #{null >= observed}) / (1 + n)``."""
    if null.size == 0 or math.isnan(observed):
        return math.nan
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + null.size))


class LabelSwapNullCheck(CardCheck):
    """The label-swap null at the card's direct cut (``n`` = null draws)."""

    name: ClassVar[str] = "label_swap_null"
    title: ClassVar[str] = "Label-swap null"
    explanation: ClassVar[str] = (
        "Ranking rate and R − A under random label swaps inside contrasts; R below the "
        "null's 97.5th percentile → the score does not order these contrasts. The null gap's "
        "closed form (1 − C − T)/2 counts tied contrasts (share T), which no swap orders."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        null = label_swap_null(ctx.table, cut=ctx.direct_cut, n_draws=ctx.n_boot, rng=ctx.rng)
        n = null.n_draws
        values = {
            "R_null_q975": null.R_q975,
            "R_null_mean": float(np.mean(null.R0)) if n else math.nan,
            "null_gap_mean": null.mean_G0 if n else math.nan,
            "null_gap_expected": null.expected_null_gap,
            "tied_share": null.tied_share,
            "p_R": null.p_R,
            # the paper's R − A, and the tie-consistent R½ − A (equal for one-to-one contrasts)
            "p_R_minus_A": _p_at_least(null.R0_minus_A0, null.observed_R_minus_A),
            "p_R_half_minus_A": null.p_excess,
        }
        data = {k: Estimate.point(v, n) for k, v in values.items()}
        rows = (
            ("R under the null, 97.5th percentile", fmt(data["R_null_q975"])),
            ("R observed", fmt(null.observed_R)),
            (
                "null gap E[G0]: closed form (1 − C − T)/2 / mean of the swaps",
                f"{fmt(null.expected_null_gap)} / {fmt(data['null_gap_mean'])} "
                f"(tied share T {fmt(null.tied_share)})",
            ),
            (
                f"permutation p of R / of R½ − A ({n} label swaps)",
                f"{fmt_p(null.p_R)} / {fmt_p(null.p_excess)}",
            ),
        )
        return CheckResult(data, rows, result=null)
