"""The mix of frame types from both text flags at once (seed 002, Sec. E.2).

Each frame is of one type: it carries reassuring text, alarming text, or neither. The detector
gives two flags per frame, so four signals (neither flag, reassuring only, alarming only,
both). On the labelled calibration set we measure, for every type ``t``, how often each signal
``s`` occurs, the rate ``R[s, t]``. A deployment's signal shares ``p`` are then a mixture
``p ≈ R w`` of the type shares ``w``, and ``w`` is estimated by least squares with ``w ≥ 0``
and ``Σ w = 1`` (the non-negative least squares of Sec. E.2, with the shares of a mix summing
to one)::

    ŵ = argmin ‖R w − p‖²  subject to  w ≥ 0, Σ_t w_t = 1

With one flag and two types this is exactly the corrected share
``clip((q − fpr)/(sens − fpr), 0, 1)`` of :func:`spotstop.diagnostics.cues.corrected_share`;
with two flags, a flag that also fires on the other cue's text (cross-flagging) is explained
by that type, instead of being counted as that cue's text one flag at a time.

The problem is a small convex quadratic programme: its minimiser solves the
equality-constrained least squares on its support, so :func:`simplex_lstsq` solves that
system on every non-empty support of the types (7 for 3 types) and keeps the feasible one with
the lowest residual (the sparsest of equal ones), for a whole batch of bootstrap draws at once.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

__all__ = ["signal_codes", "simplex_lstsq"]

_TOL = 1e-12


def signal_codes(flags: NDArray[np.bool_]) -> NDArray[np.intp]:
    """The signal of each frame, ``Σ_j flag_j · 2**j`` (0 .. 2**k − 1) for ``k`` flags."""
    f = np.asarray(flags, dtype=bool)
    return np.asarray(f @ (1 << np.arange(f.shape[1])), dtype=np.intp)


def simplex_lstsq(rates: NDArray[np.float64], shares: NDArray[np.float64]) -> NDArray[np.float64]:
    """``argmin ‖rates·w − shares‖²`` over ``w ≥ 0, Σ w = 1``, per draw.

    rates: ``(B, S, T)`` signal rates per type (each column a distribution over signals).
    shares: ``(B, S)`` the observed signal shares.
    Returns ``(B, T)``; a draw with a non-finite input gives a NaN row.
    """
    a = np.asarray(rates, dtype=np.float64)
    b = np.asarray(shares, dtype=np.float64)
    if a.ndim != 3 or b.shape != a.shape[:2]:
        raise ValueError(f"rates must be (B, S, T) and shares (B, S); got {a.shape}, {b.shape}.")
    n, _, t = a.shape
    ok: NDArray[np.bool_] = np.asarray(np.isfinite(a).all(axis=(1, 2)) & np.isfinite(b).all(axis=1))
    a0, b0 = np.where(ok[:, None, None], a, 0.0), np.where(ok[:, None], b, 0.0)
    best = np.full((n, t), np.nan)
    best_obj = np.full(n, np.inf)
    for k in range(1, t + 1):
        for support in itertools.combinations(range(t), k):
            cols = list(support)
            a_s = a0[:, :, cols]
            kkt = np.zeros((n, k + 1, k + 1))
            kkt[:, :k, :k] = np.einsum("nsi,nsj->nij", a_s, a_s)
            kkt[:, :k, k] = kkt[:, k, :k] = 1.0
            rhs = np.concatenate([np.einsum("nsi,ns->ni", a_s, b0), np.ones((n, 1))], axis=1)
            sol = np.einsum("nij,nj->ni", np.linalg.pinv(kkt), rhs)[:, :k]
            feasible = (sol >= -_TOL).all(axis=1) & np.isfinite(sol).all(axis=1)
            w = np.zeros((n, t))
            w[:, cols] = np.clip(sol, 0.0, None)
            w /= np.where(feasible, w.sum(axis=1), 1.0)[:, None]
            obj = ((np.einsum("nst,nt->ns", a0, w) - b0) ** 2).sum(axis=1)
            better = feasible & (obj < best_obj - _TOL)
            best[better] = w[better]
            best_obj[better] = obj[better]
    best[~ok] = np.nan
    return best
