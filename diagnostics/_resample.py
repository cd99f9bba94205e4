"""Resampling primitives shared by the bootstrap, the checks and the delivered rates.

Group multiplicities for a group bootstrap (:func:`draw_group_counts`), random halves of the
groups (:func:`random_halves`), the blocks of draws of a large bootstrap, each with its own
seed (:func:`draw_blocks`, :func:`block_draws`), percentile intervals and bands (:func:`percentile_ci`,
:func:`band`), and the group-bootstrap estimate of a ratio of per-case sums
(:func:`share_estimate`: a hit rate, a flagged share), the resampling unit
(:func:`resampling_groups`, :func:`regroup`, :func:`resampling_note`) and the rule for a ratio
whose denominator may be 0 (:func:`ratio_estimate`).  Nothing here knows a metric, so every
other module may import it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._data import CaseTable, group_codes
from spotstop.diagnostics._errors import DataError, UndefinedMetricWarning
from spotstop.diagnostics._results import NAN_CI, ConfidenceInterval, Estimate

__all__ = [
    "BLOCK_DRAWS",
    "GROUP_BY",
    "MIN_GROUPS",
    "Block",
    "FewGroupsWarning",
    "GroupSums",
    "UnboundedRatioWarning",
    "as_rng",
    "band",
    "block_draws",
    "draw_blocks",
    "draw_group_counts",
    "few_groups_message",
    "group_sum_draws",
    "nan_divide",
    "nan_estimate",
    "percentile_ci",
    "random_halves",
    "ratio_estimate",
    "regroup",
    "resampling_groups",
    "resampling_note",
    "share_estimate",
    "split_groups",
]

GroupBy = Literal["situation", "contrast"]

#: the resampling units a user may choose (``--group-by``); the first is the default
GROUP_BY: tuple[GroupBy, ...] = ("situation", "contrast")

#: below this many groups percentile intervals of a group bootstrap are too narrow
MIN_GROUPS = 30


class FewGroupsWarning(UndefinedMetricWarning):
    """The group bootstrap resamples fewer than :data:`MIN_GROUPS` groups: its percentile
    intervals are optimistic (too narrow)."""


class UnboundedRatioWarning(UndefinedMetricWarning):
    """A ratio is reported as undefined: its denominator's interval reaches 0, so the ratio's
    interval would be unbounded (read the numerator, a difference, instead)."""


def resampling_groups(table: CaseTable, group_by: str = "situation") -> NDArray[np.intp]:
    """Group code (0..G-1) of every case for the unit ``group_by``.

    ``"situation"`` (the default): connected components of cases sharing a contrast id or a
    situation id (:attr:`CaseTable.group`), so both scenes of a contrast and all scenes of a
    situation stay together.  ``"contrast"``: components of the contrast ids alone (each
    contrast its own group; a case without a contrast id is its own group), which ignores the
    dependence between contrasts of one situation.
    """
    if group_by == "situation":
        return np.asarray(table.group, dtype=np.intp)
    if group_by == "contrast":
        return np.asarray(group_codes(table.contrast_id), dtype=np.intp)
    raise DataError(f"group_by must be one of {', '.join(GROUP_BY)}; got {group_by!r}.")


def regroup(table: CaseTable, group_by: str = "situation") -> CaseTable:
    """``table`` itself for ``"situation"``, else a copy whose :attr:`CaseTable.group` (and so
    every group bootstrap, split and fold of the card) uses the unit ``group_by``."""
    codes = resampling_groups(table, group_by)
    if group_by == "situation":
        return table
    out = table.subset(slice(None))
    frozen = np.array(codes, copy=True)
    frozen.setflags(write=False)
    out.__dict__["group"] = frozen  # fills CaseTable.group's cached value
    return out


def resampling_note(n_groups: int, group_by: str = "situation") -> str:
    """The card header's words for the resampling unit and its count (with the warning below
    :data:`MIN_GROUPS`)."""
    unit = (
        "situation groups (both scenes of a contrast and all scenes of a situation together)"
        if group_by == "situation"
        else "contrast groups (both scenes of a contrast together; situations ignored)"
    )
    s = (
        f"95 % percentile interval of a group bootstrap that resamples whole groups: "
        f"{n_groups} {unit}, --group-by {group_by}"
    )
    if n_groups < MIN_GROUPS:
        s += (
            f"; fewer than {MIN_GROUPS} groups: percentile intervals from so few clusters are "
            "optimistic (too narrow), read them as lower bounds on the uncertainty"
        )
    return s


def few_groups_message(
    n_groups: int, group_by: str = "situation", n_contrast_groups: int | None = None
) -> str:
    """The text of :class:`FewGroupsWarning` (``n_contrast_groups``: the count the unit
    ``contrast`` would give, named when it is larger)."""
    alt = (
        f"; --group-by contrast resamples {n_contrast_groups} contrast groups instead (only "
        "if the contrasts of one situation are close to independent)"
        if n_contrast_groups is not None and n_contrast_groups > n_groups
        else ""
    )
    return (
        f"the group bootstrap resamples only {n_groups} groups (unit: {group_by}); percentile "
        f"intervals from fewer than {MIN_GROUPS} groups are optimistic (too narrow), so an "
        f"interval that excludes 0 here is weaker evidence than it looks{alt}"
    )


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator from a Generator, an int seed or None (never the global RNG)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    raise DataError(
        f"rng must be a numpy Generator, an int seed or None; got {type(rng).__name__}."
    )


#: elements of one sub-block of random numbers (the draws of a chunk are generated in
#: sub-blocks of rows: the same stream as one call, see :func:`draw_group_counts`)
_SUB_BLOCK = 2**21


def _sub_rows(n_groups: int) -> int:
    return max(1, _SUB_BLOCK // max(n_groups, 1))


def _kth_smallest(r: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """The ``k``-th smallest (1-based) value of each row of ``r`` (uniform numbers in [0, 1)).

    Exactly ``np.partition(r, k - 1, axis=1)[:, k - 1]``, found in linear time with fewer
    passes: the values in a narrow bracket around the row's ``k/G`` quantile (eight standard
    deviations of that order statistic either side) are partitioned alone when the ``k``-th
    smallest lies in it (counted); a row where it does not is partitioned whole.
    """
    nr, g = r.shape
    q = k / g
    half_width = 8.0 * math.sqrt(q * (1.0 - q) / g) + 4.0 / g
    lo, hi = q - half_width, q + half_width
    if hi - lo >= 0.5:  # few groups: the bracket saves nothing
        return np.partition(r, k - 1, axis=1)[:, k - 1]
    below = np.count_nonzero(r < lo, axis=1)
    inside = (r >= lo) & (r <= hi)
    n_in = np.count_nonzero(inside, axis=1)
    cand = r[inside]  # row by row
    first = np.cumsum(n_in) - n_in
    out = np.empty(nr)
    for i in range(nr):
        j = k - int(below[i])
        if 1 <= j <= n_in[i]:
            out[i] = np.partition(cand[first[i] : first[i] + n_in[i]], j - 1)[j - 1]
        else:
            out[i] = np.partition(r[i], k - 1)[k - 1]
    return out


def random_halves(
    rng: np.random.Generator,
    n_draws: int,
    n_groups: int,
    *,
    order: NDArray[np.intp] | None = None,
    out: NDArray[np.bool_] | None = None,
) -> NDArray[np.bool_]:
    """Boolean (n_draws, n_groups): True for a random ``floor(G/2)`` of the groups per row.

    The half is the ``floor(G/2)`` smallest of one ``rng.random((n_draws, n_groups))`` call per
    row (the first ``floor(G/2)`` of its argsort): the numbers are generated in sub-blocks of
    rows (the same stream as that one call), the ``floor(G/2)``-th smallest of a row found in
    linear time (:func:`_kth_smallest`), and the argsort itself is used in a row where a tie
    straddles the boundary, so the result is that of the argsort in every case.

    ``order``: column ``j`` of the result is group ``order[j]`` (``half[:, order]``, the
    engine's own group labels); ``out``: an ``(n_draws, n_groups)`` buffer to write into.
    """
    k = n_groups // 2
    half = np.empty((n_draws, n_groups), dtype=bool) if out is None else out[:n_draws]
    step = _sub_rows(n_groups)
    buf = np.empty((min(step, n_draws), n_groups))
    hbuf = None if order is None else np.empty((min(step, n_draws), n_groups), dtype=bool)
    for i in range(0, n_draws, step):
        r = rng.random(out=buf[: min(step, n_draws - i)])
        h = half[i : i + r.shape[0]] if hbuf is None else hbuf[: r.shape[0]]
        if k == 0:
            h[:] = False
        else:
            np.less_equal(r, _kth_smallest(r, k)[:, None], out=h)
            tied = np.flatnonzero(h.sum(axis=1) != k)
            if tied.size:
                ranks = np.argsort(r[tied], axis=1)
                rows = np.zeros((tied.size, n_groups), dtype=bool)
                np.put_along_axis(rows, ranks[:, :k], True, axis=1)
                h[tied] = rows
        if order is not None:
            np.take(h, order, axis=1, out=half[i : i + r.shape[0]])
    return half


def split_groups(rng: np.random.Generator, n_groups: int, share: float) -> NDArray[np.bool_]:
    """Random mask over groups with ``round(share * G)`` groups True (at least 1, at most
    ``G − 1``): a calibration part and the rest."""
    n_cal = max(1, min(n_groups - 1, round(share * n_groups)))
    mask = np.zeros(n_groups, dtype=bool)
    mask[rng.permutation(n_groups)[:n_cal]] = True
    return mask


def draw_group_counts(
    n_groups: int,
    n_boot: int,
    rng: np.random.Generator,
    chunk_size: int = 500,
    *,
    relabel: NDArray[np.intp] | None = None,
    out: NDArray[np.float64] | None = None,
) -> Iterator[NDArray[np.float64]]:
    """Yield ``(chunk, n_groups)`` arrays of group multiplicities (each row sums to ``n_groups``).

    Each row counts ``n_groups`` groups drawn uniformly with replacement (the integers of one
    ``rng.integers(0, G, size=(chunk, G))`` call per chunk, then a bincount per row: the
    multinomial(G, 1/G) distribution, several times faster than ``rng.multinomial`` with
    ``size=``; a bincount per row stays in cache and writes the float64 result once).  The
    integers are generated in sub-blocks of rows, as int32: numpy draws a bounded integer of a
    range below 2**32 from the generator's 32-bit stream whatever the dtype, one after another
    (a rejected number is redrawn at once; half of a 64-bit output left over is kept in the bit
    generator's state), so the sub-blocks give the same integers as the one call and leave
    the generator in the same state; only a sub-block, not a (chunk, G) array of int64, is held.

    ``relabel``: group ``g`` is counted in column ``relabel[g]`` (a permutation: the engine's
    own group labels); ``out``: a ``(chunk_size, G)`` buffer that every chunk is written into
    (each yielded array is then a view of it, valid until the next one).
    """
    step = _sub_rows(n_groups)
    dtype = np.int32 if n_groups <= 2**31 else np.int64
    lab = None if relabel is None else np.asarray(relabel, dtype=dtype)
    done = 0
    while done < n_boot:
        b = min(chunk_size, n_boot - done)
        chunk = np.empty((b, n_groups), dtype=np.float64) if out is None else out[:b]
        for i0 in range(0, b, step):
            picks = rng.integers(0, n_groups, size=(min(step, b - i0), n_groups), dtype=dtype)
            if lab is not None:
                np.take(lab, picks, out=picks)
            for i in range(picks.shape[0]):
                chunk[i0 + i] = np.bincount(picks[i], minlength=n_groups)
        yield chunk
        done += b


#: draws per block of a blocked bootstrap (:func:`draw_blocks`): a block's draws come from its
#: own seed, so blocks may run anywhere, in any order, and be chunked freely in memory
BLOCK_DRAWS = 250


@dataclass(frozen=True)
class Block:
    """One block of draws of a blocked bootstrap: its index, its first draw, its number of
    draws and its seed (a :class:`numpy.random.SeedSequence`, see :func:`draw_blocks`)."""

    index: int
    start: int
    n_draws: int
    seed: np.random.SeedSequence


def draw_blocks(rng: np.random.Generator, n_boot: int) -> tuple[Block, ...]:
    """The blocks of ``n_boot`` draws (:data:`BLOCK_DRAWS` each, the last one the rest), each
    with its own seed derived from ``rng``.

    ``rng`` is consumed once: four 32-bit words (one ``rng.integers(0, 2**32, size=4,
    dtype=np.uint64)`` call) are the entropy of a root :class:`numpy.random.SeedSequence`,
    and block ``i`` gets its child ``i`` (``SeedSequence(entropy, spawn_key=(i,))``, equal to
    ``root.spawn(n_blocks)[i]``).  So a block's draws depend only on ``rng``'s state and the
    block's index, wherever and in whatever order the blocks run.
    """
    words = rng.integers(0, 2**32, size=4, dtype=np.uint64)
    entropy = [int(x) for x in words]
    size = BLOCK_DRAWS
    return tuple(
        Block(i, a, min(size, n_boot - a), np.random.SeedSequence(entropy, spawn_key=(i,)))
        for i, a in enumerate(range(0, n_boot, size))
    )


def block_draws(
    block: Block,
    n_groups: int,
    chunk_size: int,
    *,
    order: NDArray[np.intp] | None = None,
    buffers: dict[str, NDArray[Any]] | None = None,
) -> Iterator[tuple[NDArray[np.float64], NDArray[np.bool_]]]:
    """The group counts and cross-fit halves of ``block``, ``chunk_size`` draws at a time.

    The block's seed has two children (spawn keys ``+ (0,)`` and ``+ (1,)``, as its
    ``spawn(2)`` would give, without touching the seed), each a PCG64 generator
    (:func:`numpy.random.default_rng`): the first gives the counts
    (:func:`draw_group_counts`), the second the halves (:func:`random_halves`); each consumes
    its stream in draw order whatever the chunk, so the draws do not depend on ``chunk_size``
    (only the memory held at once does).

    ``order``: the columns are the groups ``order[0], order[1], ...`` (a permutation: the
    engine's own labels, :attr:`~spotstop.diagnostics._engine.CurveEngine.group_order`);
    ``buffers``: a dict whose ``"counts"`` and ``"halves"`` arrays are reused (and made or
    grown) from call to call; the yielded arrays are then views valid until the next chunk.
    """
    seed = block.seed
    g_counts, g_halves = (
        np.random.default_rng(np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, j)))
        for j in (0, 1)
    )
    relabel = None
    if order is not None:
        relabel = np.empty(n_groups, dtype=np.intp)
        relabel[order] = np.arange(n_groups, dtype=np.intp)
    c_out = h_out = None
    if buffers is not None:
        rows = min(chunk_size, block.n_draws)
        c_out = _buffer(buffers, "counts", rows * n_groups, np.float64)
        h_out = _buffer(buffers, "halves", rows * n_groups, np.bool_)
        c_out, h_out = c_out.reshape(rows, n_groups), h_out.reshape(rows, n_groups)
    counts_iter = draw_group_counts(
        n_groups, block.n_draws, g_counts, chunk_size, relabel=relabel, out=c_out
    )
    for counts in counts_iter:
        yield counts, random_halves(g_halves, counts.shape[0], n_groups, order=order, out=h_out)


def _buffer(buffers: dict[str, NDArray[Any]], name: str, size: int, dtype: Any) -> NDArray[Any]:
    """The first ``size`` elements of the kept flat buffer ``name`` (grown when too small)."""
    buf = buffers.get(name)
    if buf is None or buf.size < size:
        buf = buffers[name] = np.empty(size, dtype=dtype)
    return buf[:size]


def percentile_ci(d: NDArray[np.float64], level: float = 0.95) -> ConfidenceInterval:
    """The central ``level`` percentile interval of the finite draws ``d`` (the 2.5 and 97.5
    percentiles by default): the interval every :class:`Estimate` of the card carries.

    Non-finite draws (a rate over a draw with no case) are left out; when none is finite the
    interval is NaN at both ends, never a zero-width one.

    >>> import numpy as np
    >>> percentile_ci(np.arange(101.0))
    ConfidenceInterval(low=2.5, high=97.5)
    """
    ok = d[np.isfinite(d)]
    if ok.size == 0:
        return NAN_CI
    lo, hi = np.percentile(ok, [50 * (1 - level), 50 * (1 + level)])
    return ConfidenceInterval(float(lo), float(hi))


def nan_divide(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a / b`` elementwise, NaN (not a warning) where ``b`` is 0: a rate over no cases."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(a / b, dtype=np.float64)


def nan_estimate(n: int = 0) -> Estimate:
    """An undefined estimate (NaN value and interval) over ``n`` units."""
    return Estimate(math.nan, NAN_CI, n)


def band(x: NDArray[np.float64], value: float | None = None) -> Estimate:
    """Mean (or ``value``) of the finite entries and their 2.5–97.5 % band; ``n`` = entries."""
    ok = x[np.isfinite(x)]
    if ok.size == 0:
        return nan_estimate()
    return Estimate(float(ok.mean()) if value is None else value, percentile_ci(ok), int(ok.size))


class GroupSums(NamedTuple):
    """What :func:`group_sum_draws` returns: ``point`` (k,), the sums over the cases, and
    ``draws`` (n_boot, k), the same sums in each group-bootstrap draw (it unpacks as
    ``point, draws``)."""

    point: NDArray[np.float64]
    draws: NDArray[np.float64]


def group_sum_draws(
    values: NDArray[np.float64], group: NDArray[np.intp], *, n_boot: int, rng: np.random.Generator
) -> GroupSums:
    """Sums of ``k`` per-case quantities over the cases and over ``n_boot`` group-bootstrap
    draws, all from the same draws: the building block of every rate of the card (a rate is
    a ratio of two sums; draw both from one resample and divide).

    ``values`` (k, n): the quantities per case (a 1-d array is one quantity); ``group`` (n,):
    each case's group code in 0..G-1 (:func:`group_codes`); groups are resampled whole, so
    cases of one situation or contrast stay together. ``rng``: the draws' randomness.

    >>> import numpy as np
    >>> hit, case = np.array([1.0, 0.0, 1.0, 1.0]), np.ones(4)
    >>> sums = group_sum_draws(np.stack([hit, case]), np.array([0, 0, 1, 2]), n_boot=200,
    ...                        rng=np.random.default_rng(0))
    >>> sums.point, sums.draws.shape
    (array([3., 4.]), (200, 2))
    >>> rate = sums.draws[:, 0] / sums.draws[:, 1]  # the hit rate in each draw
    """
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    ng = int(group.max()) + 1 if group.size else 0
    per_g = np.stack([np.bincount(group, weights=v, minlength=ng) for v in values], axis=1)
    draws = [counts @ per_g for counts in draw_group_counts(ng, n_boot, rng)]
    return GroupSums(per_g.sum(axis=0), np.concatenate(draws, axis=0))


def share_estimate(
    hit: NDArray[np.bool_],
    of: NDArray[np.bool_],
    group: NDArray[np.intp],
    *,
    n_boot: int,
    rng: np.random.Generator,
    what: str,
) -> Estimate:
    """``sum(hit & of) / sum(of)`` with a group-bootstrap percentile interval; ``n = sum(of)``.

    No case in ``of`` → :class:`UndefinedMetricWarning` naming ``what`` and NaN.
    """
    of = np.asarray(of, dtype=bool)
    n = int(of.sum())
    if n == 0:
        warnings.warn(
            f"{what} is undefined: no case to count it over; returning NaN.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return nan_estimate(0)
    num = np.asarray(hit, dtype=bool) & of
    point, draws = group_sum_draws(np.stack([num, of]), group, n_boot=n_boot, rng=rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = draws[:, 0] / draws[:, 1]
    return Estimate(float(point[0] / point[1]), percentile_ci(ratio), n)


def ratio_estimate(
    num: float,
    den: float,
    num_draws: NDArray[np.float64],
    den_draws: NDArray[np.float64],
    n: int,
    *,
    what: str,
    instead: str,
    tol: float = 1e-9,
    warn: bool = True,
) -> Estimate:
    """``num / den`` with the percentile interval of the draw-wise ratios, or undefined.

    When the denominator's value or its 2.5–97.5 % interval reaches 0 (within ``tol``), some
    draws divide by (almost) nothing and the ratio's interval is unbounded: the result is NaN
    with an :class:`UnboundedRatioWarning` that names ``what`` and the quantity to read
    ``instead`` (``warn=False``: no warning, for a caller that names several at once).
    Otherwise draws whose denominator is within ``tol`` of 0 are left out.
    """
    ci = percentile_ci(den_draws)
    reaches_zero = (
        not math.isfinite(den)
        or abs(den) <= tol
        or not (math.isfinite(ci.low) and math.isfinite(ci.high))
        or (ci.low <= tol and ci.high >= -tol)
    )
    if reaches_zero and not warn:
        return nan_estimate(n)
    if reaches_zero:
        warnings.warn(
            f"{what} is undefined: its denominator {den:.3g} has the interval "
            f"[{ci.low:.3g}, {ci.high:.3g}], which reaches 0, so the ratio is unbounded; "
            f"read {instead} instead; returning NaN.",
            UnboundedRatioWarning,
            stacklevel=2,
        )
        return nan_estimate(n)
    ok = np.isfinite(num_draws) & np.isfinite(den_draws) & (np.abs(den_draws) > tol)
    return Estimate(float(num / den), percentile_ci(num_draws[ok] / den_draws[ok]), n)
