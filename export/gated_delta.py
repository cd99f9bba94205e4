"""A compact, exact Gated-DeltaNet kernel for the exported Qwen3.5 scoring graph.

transformers' ``torch_chunk_gated_delta_rule`` runs a Python loop over the chunks of the
sequence and, while a graph is exported, solves the within-chunk unit-lower-triangular system
row by row (``chunk_size - 1`` Python steps). Exported, every chunk and every row becomes its
own handful of ONNX nodes: about 5,400 nodes per Gated-DeltaNet layer at 256 tokens (tiny member),
and a graph per sequence length, since the loop is unrolled for one length.

:func:`compact_chunk_gated_delta_rule` computes the same thing (the scoring pass: no initial
recurrent state, no final state) with no Python loop over positions, rows or chunks:

* the sequence is padded to whole chunks of ``C = chunk_size`` (64, as the reference);
* within a chunk, the UT transform ``T = (I + N)⁻¹`` of the strictly lower-triangular
  ``N = tril(diag(β) K Kᵀ ⊙ D, -1)`` is inverted by recursive block doubling, all chunks at
  once: a unit-lower-triangular ``[[I + N11, 0], [N21, I + N22]]`` has the inverse
  ``[[T11, 0], [-T22 N21 T11, T22]]``, so the inverses of the s×s diagonal blocks give those of
  the 2s×2s blocks: ``log2 C`` = 6 levels of two small batched matrix products. This is
  forward substitution by blocks, so it is as accurate. (The Neumann product
  ``Π (I + (-N)^(2^k))`` is as short but can lose fp32 accuracy: with the keys of a chunk
  aligned, the entries of ``N^m`` grow like binomial coefficients, up to ~1e18 at C = 64,
  and must cancel.);
* across chunks, the state recurrence ``S_c = A_c S_{c-1} + B_c`` (``A_c = γ_c I - K̃_cᵀ W_c``,
  ``B_c = K̃_cᵀ U_c``, ``S_{-1} = 0``) is an associative scan over affine maps, kept as one
  matrix ``[A_c | B_c]`` and computed by Hillis-Steele doubling: ``ceil(log2(n_max))`` levels
  for at most ``n_max`` chunks; a level whose offset reaches past the first chunk composes
  with the identity, so the same graph is exact for every length up to ``max_length``;
* the output of chunk c reads the state entering it, ``P_c = S_{c-1}``:
  ``O_c = Q̃_c P_c + A^intra_c (U_c - W_c P_c)``.

Every shape is either static (the chunk size, head sizes) or follows the input's batch and
sequence axes, so one exported graph serves every length up to ``max_length`` (the longest
prompt the bundle allows; a longer one would need more scan levels, and the runtime refuses
it). The node count per layer does not depend on the length: exported with dynamo and
onnxscript's optimizer, a Gated-DeltaNet layer of the tiny Qwen3.5 member is ~185 nodes
(projections, conv and gated norm included), against ~5,400 for the unrolled reference at 256
tokens.

Cost: within a chunk O(C²·d) and ~C³/3 multiply-adds for the inverse, per chunk and head;
across chunks O(n log n · d_k²·(d_k + d_v)) for the scan (n = L / C chunks; Qwen3.5-2B at
1,024 tokens, 16 chunks, 16 heads of 128: ~1 GFLOP per scan level per layer, small next to its
projections). Memory: the chunked form's O(L·C) per head, never O(L²).

:func:`compact_gated_delta` is the patch (a context manager) the Qwen3.5 export config applies
while the decoder is exported; the torch reference the export is validated against is the
unpatched transformers code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "CHUNK_SIZE",
    "compact_chunk_gated_delta_rule",
    "compact_gated_delta",
    "scan_levels",
]

#: the chunk size of transformers' reference (and of the fla kernels)
CHUNK_SIZE = 64


def scan_levels(max_length: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Doubling levels of the cross-chunk scan exact for sequences up to ``max_length``."""
    n_max = max(1, math.ceil(int(max_length) / chunk_size))
    return max(0, math.ceil(math.log2(n_max)))


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # as transformers' (and fla's) l2norm
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


_CONSTANTS: dict[tuple[Any, ...], torch.Tensor] = {}


def _const(
    key: tuple[Any, ...], make: Callable[[], np.ndarray], device: torch.device
) -> torch.Tensor:
    """A constant of the graph (an initializer when exported, not a chain of nodes), made once
    per ``key`` and device: every layer reads the same tensor, so the graph stores it once.

    The cache is also keyed by the kind of tensor the current mode makes (a tracer's fake
    tensor during export, a real one in eager code), and emptied around each export, so a
    fake tensor made while exporting never reaches eager code (or another export)."""
    full = (*key, str(device), type(torch.empty(0)))
    if full not in _CONSTANTS:
        _CONSTANTS[full] = torch.from_numpy(np.ascontiguousarray(make())).to(device)
    return _CONSTANTS[full]


def _pair_index(c: int, s: int) -> np.ndarray:
    """Flat indices into a C×C matrix of the lower-left s×s block of each 2s×2s diagonal block
    (the blocks that couple a pair of s×s blocks), block after block, row-major."""
    m = c // (2 * s)
    p = np.arange(m).reshape(m, 1, 1) * (2 * s)
    i = np.arange(s).reshape(1, s, 1)
    j = np.arange(s).reshape(1, 1, s)
    return ((p + s + i) * c + (p + j)).reshape(-1).astype(np.int64)


def _unit_lower_inverse(n: torch.Tensor) -> torch.Tensor:
    """``(I + n)⁻¹`` for strictly lower-triangular ``n`` (X, C, C), C a power of two.

    Recursive block doubling on the diagonal blocks only: a unit-lower-triangular
    ``[[I + N11, 0], [N21, I + N22]]`` has the inverse ``[[T11, 0], [-T22 N21 T11, T22]]``;
    from the s×s blocks' inverses (all at once, as a (X, C/s, s, s) stack) to the 2s×2s
    blocks', ``log2 C`` levels, ``2 C s²`` multiply-adds each (a dense ``T - T E T`` update
    would cost ``2 C³`` per level).
    """
    c = n.shape[-1]
    if c & (c - 1):
        raise ValueError(f"the chunk size must be a power of two; got {c}.")
    flat = n.reshape(-1, c * c)
    # s = 1: the 2×2 blocks [[1, 0], [-n21, 1]]
    n21 = torch.index_select(flat, 1, _const(("pair", c, 1), partial(_pair_index, c, 1), n.device))
    lower = _const(("lower2",), lambda: np.array([[False, False], [True, False]]), n.device)
    eye2 = _const(("eye2",), lambda: np.eye(2, dtype=np.float32), n.device)
    t = torch.where(lower, -n21.reshape(-1, c // 2, 1, 1), eye2)  # (X, C/2, 2, 2)
    s = 2
    while s < c:
        m = c // (2 * s)
        idx = _const(("pair", c, s), partial(_pair_index, c, s), n.device)
        n21 = torch.index_select(flat, 1, idx).reshape(-1, m, s, s)
        pairs = t.reshape(-1, m, 2, s, s)
        t11, t22 = pairs[:, :, 0], pairs[:, :, 1]
        x = -(t22 @ n21 @ t11)
        top = F.pad(t11, (0, s))  # [T11 | 0]
        t = torch.cat([top, torch.cat([x, t22], -1)], -2)  # (X, m, 2s, 2s)
        s *= 2
    return t.reshape(-1, c, c)


def _shift(x: torch.Tensor, by: int, fill: torch.Tensor) -> torch.Tensor:
    """``x`` (..., n, r, c) moved ``by`` places along its chunk axis, ``fill`` coming in."""
    n = x.shape[-3]
    return F.pad(x - fill, (0, 0, 0, 0, by, 0))[..., :n, :, :] + fill


def compact_chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    levels: int,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``torch_chunk_gated_delta_rule`` for the scoring pass, loop-free.

    Same arguments and layout ([batch, length, heads, dim]); ``levels``: the cross-chunk scan's
    doubling levels (:func:`scan_levels`), which bound the length it is exact for. Refuses a
    recurrent state in or out (the scoring pass has none).
    """
    if initial_state is not None or output_final_state:
        raise NotImplementedError(
            "the compact Gated-DeltaNet kernel serves the scoring pass only (no recurrent state)."
        )
    initial_dtype = query.dtype
    dev = query.device
    hk, dk = key.shape[2], key.shape[3]
    hv, dv = value.shape[2], value.shape[3]
    c = int(chunk_size)
    f32 = torch.float32
    query, key = query.to(f32), key.to(f32)
    if hk != hv:  # grouped values: each q/k head serves hv // hk consecutive value heads
        heads = _const(("heads", hk, hv), lambda: np.repeat(np.arange(hk), hv // hk), dev)
        query = torch.index_select(query, 2, heads)
        key = torch.index_select(key, 2, heads)
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * (dk**-0.5)
    # one tensor [batch, heads, length, q | k | v | g | beta], padded to whole chunks and
    # cut into them: [batch * heads * chunks, C, ...]
    x = torch.cat([query, key, value.to(f32), g.to(f32)[..., None], beta.to(f32)[..., None]], -1)
    x = x.transpose(1, 2)
    length = x.shape[2]
    x = F.pad(x, (0, 0, 0, (c - length % c) % c))
    n_chunks = x.shape[2] // c
    q, k, v, gg, b = torch.split(x.reshape(-1, c, 2 * dk + dv + 2), [dk, dk, dv, 1, 1], -1)

    # within a chunk (as the reference): decay from the chunk's start, pairwise decays
    cum = gg.cumsum(dim=1)  # (X, C, 1)
    # exp(cum_i - cum_j) for j <= i, else 0 (Trilu: no C×C mask stored; the inner one keeps
    # exp from overflowing where the outer one zeroes)
    decay = torch.tril(torch.tril(cum - cum.transpose(1, 2)).exp())
    kt = k.transpose(1, 2)
    kb = k * b
    n_mat = (kb @ kt) * decay  # its diagonal and upper part are not read
    t = _unit_lower_inverse(n_mat)  # (I + N)⁻¹, the UT transform
    wu = t @ torch.cat([kb * cum.exp(), v * b], -1)  # [W | U]: decayed keys | new values
    intra = (q @ kt) * decay
    last = cum[:, -1:, :]  # (X, 1, 1)
    kd = k * (last - cum).exp()
    # the state recurrence S_c = A_c S_{c-1} + B_c as one matrix M_c = [A_c | B_c]:
    # A_c = γ_c I - K̃ᵀ W, B_c = K̃ᵀ U
    eye_zero = _const(
        ("eye", dk, dv), lambda: np.eye(dk, dk + dv, dtype=np.float32), dev
    )  # [I | 0]
    ones_k, ones_v = np.ones(dk, np.float32), np.ones(dv, np.float32)
    sign = _const(("sign", dk, dv), lambda: np.r_[ones_k, -ones_v], dev)
    m = last.exp() * eye_zero - (kd.transpose(1, 2) @ wu) * sign
    m = m.reshape(-1, n_chunks, dk, dk + dv)  # [batch * heads, chunks, dk, dk + dv]
    # inclusive scan by doubling: M_c ← A_c · M_{c-by} + [0 | B_c], [I | 0] before chunk 0
    keep_b = _const(("keep", dk, dv), lambda: np.r_[0 * ones_k, ones_v], dev)
    for level in range(int(levels)):
        m = m[..., :dk] @ _shift(m, 1 << level, eye_zero) + m * keep_b
    zero = _const(("zero", dk, dv), lambda: np.zeros((dk, dv), np.float32), dev)
    state = _shift(m[..., dk:], 1, zero)  # S_{c-1}, S_-1 = 0
    state = state.reshape(-1, dk, dv)
    w, u = torch.split(wu, [dk, dv], -1)
    out = (q * cum.exp()) @ state + intra @ (u - w @ state)  # (X, C, dv)
    out = out.reshape(-1, hv, n_chunks * c, dv)[:, :, :length]
    return out.transpose(1, 2).contiguous().to(initial_dtype), None


@contextmanager
def compact_gated_delta(max_length: int) -> Iterator[None]:
    """Within the block, transformers' Qwen3.5 uses :func:`compact_chunk_gated_delta_rule`,
    exact for sequences up to ``max_length`` tokens (the longest the export serves)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    original = mod.torch_chunk_gated_delta_rule
    mod.torch_chunk_gated_delta_rule = partial(
        compact_chunk_gated_delta_rule, levels=scan_levels(max_length)
    )
    _CONSTANTS.clear()
    try:
        yield
    finally:
        mod.torch_chunk_gated_delta_rule = original
        _CONSTANTS.clear()
