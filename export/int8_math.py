"""The arithmetic of int8 that computes in int8, in numpy: what export/int8.py's rule measures a
layer with and what the graphs it writes (export/int8_graph.py) are tested against.

* the activations as each form sees them after quantizing (:func:`dequantize_activations` per
  tensor, :func:`dequantize_activations_per_token`, :func:`dequantize_activations_symmetric`,
  :func:`dequantize_read_rows` for the exact reads), in float32 and in the graph's order;
* a weight's int8 codes and column scales (:func:`channel_int8`, GPTQ's or round to nearest)
  and the two forms a graph stores them in (:func:`stored_codes`, :func:`graph_codes`);
* the online block rotation (:func:`hadamard`, :func:`rotation_blocks`, :func:`block_rotation`
  and what it does to rows, weights and Hessians);
* a layer's measured error (:func:`layer_error`) and SmoothQuant's factors
  (:func:`smoothing_factors`).

The module doc of export/int8.py says what each form is, why, and what was measured.
"""

from __future__ import annotations

import math

import numpy as np
from spotstop.export.gptq import gptq_nbits
from spotstop.guard.backends._int8_probe import INT8_WEIGHT_FORMS, W_ZERO

__all__ = [
    "ACTIVATIONS",
    "DEFAULT_ACTIVATIONS",
    "HALF",
    "LEVELS",
    "ROTATE_BLOCK",
    "ROW_FLOOR",
    "SYM_LEVELS",
    "WEIGHT_FORMS",
    "block_rotation",
    "channel_int8",
    "check_activations",
    "check_weight_form",
    "dequantize_activations",
    "dequantize_activations_per_token",
    "dequantize_activations_symmetric",
    "dequantize_read_rows",
    "graph_codes",
    "hadamard",
    "layer_error",
    "rotate_hessian",
    "rotate_rows",
    "rotate_weight",
    "rotation_blocks",
    "smoothing_factors",
    "stored_codes",
]

#: the forms the integer GEMM's weights may take (guard/backends/_int8_probe.py's
#: ``INT8_WEIGHT_FORMS``): ``s8`` (int8 codes, the u8·s8 kernel) or ``u8`` (the codes + 128 as
#: uint8, the u8·u8 kernel: exact where the u8·s8 one saturates, x86 with AVX2 and no VNNI);
#: ``weight_form`` None asks the host (export/int8.py's ``host_weight_form``)
WEIGHT_FORMS = INT8_WEIGHT_FORMS
#: smallest smoothing factor (a channel no calibration row reached)
_S_MIN = 1e-5
#: the largest block of the online rotation a layer over ``keep_error`` is tried with
#: (:func:`block_rotation`; 0: none): the largest power of two up to it that divides K
ROTATE_BLOCK = 128
#: below this block a rotation mixes too few channels to tame an outlier: the layer stays kept
_ROTATE_MIN = 16
#: the first block tried (:func:`rotation_blocks`; ``--int8-rotate-block 64`` asks for 64). The
#: rotation's MatMul costs in proportion to its block (bench/int8_gemm.py times one layer
#: rotated in blocks of 64 and of 128), and at Qwen3.5-2B's real size the 42 rotated layers
#: measured 0.009-0.016 in blocks of 64 against 0.009-0.015 in blocks of 128 (seeded random
#: weights, 2 generated scenes); yet its bundle rotated in 64 put verify-bundle's 95th
#: percentile |Δs| over 48 scores at 0.308 where the one rotated in 128, its decoder otherwise
#: the same, put it at 0.211 (LFM2.5-VL-3B: 0.226 against 0.217; docs/limits.md). Each rotated
#: layer pays about 0.3 ms more in 128 (bench/int8_gemm.py)
_ROTATE_FIRST = 128
#: the rotation's signs (one seeded draw per block size: every export makes the same)
_ROTATE_SEED = 20240401
#: how activations are quantized per call (see the module doc)
ACTIVATIONS = ("per-token", "per-tensor")
DEFAULT_ACTIVATIONS = "per-token"
#: per-token: the floor of a row's range (a constant row divides by it and keeps its value)
ROW_FLOOR = np.float32(2e-30)
HALF = np.float32(0.5)
LEVELS = np.float32(254)
SYM_LEVELS = np.float32(127)


def dequantize_activations(x: np.ndarray) -> np.ndarray:
    """``x`` as onnxruntime's ``DynamicQuantizeLinear`` + dequantize gives it back: uint8, one
    scale and zero point for the whole tensor, the range widened to include 0, round half to
    even (the ONNX spec)."""
    x = np.asarray(x, dtype=np.float32)
    f = np.float32
    lo, hi = min(x.min(initial=f(0)), f(0)), max(x.max(initial=f(0)), f(0))
    scale = f(hi - lo) / f(255)  # float32 arithmetic, as the kernel's
    if scale == 0:
        return np.zeros_like(x)
    zp = np.clip(np.round(-lo / scale), 0, 255).astype(np.float32)
    q = np.clip(np.round(x / scale) + zp, 0, 255).astype(np.float32)
    return ((q - zp) * scale).astype(np.float32)


def dequantize_activations_per_token(x: np.ndarray) -> np.ndarray:
    """``x`` as the per-token graph (:func:`~spotstop.export.int8.quantize_matmuls_int8`) sees it after quantizing:
    each row (last axis) ``μ + Round((x − μ) / σ) σ`` with ``μ = (max + min) / 2`` and
    ``σ = max(max − min, 2e-30) / 254``, rounded half to even; float32 arithmetic in the
    graph's order."""
    x = np.asarray(x, dtype=np.float32)
    if x.size == 0:
        return x.copy()
    mu, sigma = _row_range(x)
    return (np.round((x - mu) / sigma) * sigma + mu).astype(np.float32)


def dequantize_activations_symmetric(x: np.ndarray) -> np.ndarray:
    """``x`` as the symmetric per-token form sees it after quantizing: each row (last axis)
    ``Round(x / σ) σ`` with ``σ = max(max x, −min x, 2e-30) / 127``, rounded half to even
    (codes 1..255 about 128, no midpoint); float32 arithmetic in the graph's order."""
    x = np.asarray(x, dtype=np.float32)
    if x.size == 0:
        return x.copy()
    sigma = _row_step_symmetric(x)
    return (np.round(x / sigma) * sigma).astype(np.float32)


def dequantize_read_rows(x: np.ndarray, *, symmetric: bool = False) -> np.ndarray:
    """A read row as the exact-reads form multiplies it: its per-token codes (the midpoint
    form, or the ``symmetric`` one) plus the residual they leave, quantized again in the
    symmetric form (:func:`dequantize_activations_symmetric`), so the error of a row is at
    most half the residual's step, ``max|r| / 254 ≤ σ / 508``."""
    x = np.asarray(x, dtype=np.float32)
    first = (dequantize_activations_symmetric if symmetric else dequantize_activations_per_token)(x)
    return (first + dequantize_activations_symmetric(x - first)).astype(np.float32)


def _row_step_symmetric(x: np.ndarray) -> np.ndarray:
    hi, lo = x.max(axis=-1, keepdims=True), x.min(axis=-1, keepdims=True)
    return np.maximum(np.maximum(hi, -lo), ROW_FLOOR) / SYM_LEVELS


def _row_range(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of float32 ``x``: the midpoint μ and the step σ, as the graph computes them."""
    hi, lo = x.max(axis=-1, keepdims=True), x.min(axis=-1, keepdims=True)
    mu = (hi + lo) * HALF
    sigma = np.maximum(hi - lo, ROW_FLOOR) / LEVELS
    return mu, sigma


def hadamard(b: int) -> np.ndarray:
    """Sylvester's Hadamard matrix of order ``b`` (a power of two), entries ±1, float64."""
    if b < 1 or b & (b - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power of two; got {b}.")
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return h


def rotation_blocks(rotate_block: int = ROTATE_BLOCK) -> tuple[int, ...]:
    """The blocks a layer over ``keep_error`` is tried with, smallest first (the rotation's
    ``MatMul`` costs in proportion to its block): from :data:`_ROTATE_FIRST` (or
    ``rotate_block`` if smaller) doubling up to ``rotate_block``; () when it is 0."""
    if rotate_block <= 0:
        return ()
    out, b = [], min(_ROTATE_FIRST, rotate_block)
    while b < rotate_block:
        out.append(b)
        b *= 2
    return (*out, rotate_block)


def block_rotation(k: int, block: int = ROTATE_BLOCK) -> np.ndarray | None:
    """The orthogonal ``b × b`` matrix ``R = diag(d) H_b / √b`` (``H_b`` Hadamard, ``d`` seeded
    random signs) that rotates each block of ``b`` consecutive input channels of a layer with
    ``k`` inputs: ``b`` the largest power of two ``≤ block`` dividing ``k``; None when that is
    below 16 or ``block`` is 0 (the layer cannot be rotated). float64."""
    if block <= 0:
        return None
    b = 1
    while b * 2 <= block and k % (b * 2) == 0:
        b *= 2
    if b < _ROTATE_MIN:
        return None
    signs = np.random.default_rng([_ROTATE_SEED, b]).choice([-1.0, 1.0], size=b)
    return signs[:, None] * hadamard(b) / math.sqrt(b)


def rotate_rows(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``x`` (…, K) with each block of ``b = len(r)`` channels multiplied by ``r``: ``x · R``,
    ``R`` block-diagonal (what the graph computes before quantizing the activation)."""
    b = r.shape[0]
    return (x.reshape(-1, b) @ r).reshape(x.shape).astype(x.dtype, copy=False)


def rotate_weight(w: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``Rᵀ · w`` for ``w`` (K, N), ``R`` block-diagonal of ``r``: with :func:`rotate_rows`,
    ``(x R)(Rᵀ w) = x w`` (``R`` orthogonal)."""
    k, n = w.shape
    b = r.shape[0]
    out = np.einsum("ji,ajn->ain", r, w.reshape(k // b, b, n), optimize=True)
    return out.reshape(k, n).astype(w.dtype, copy=False)


def rotate_hessian(h: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``Rᵀ h R`` for the ``K × K`` Hessian ``XᵀX`` of a layer's inputs: that of ``X R``."""
    k = h.shape[0]
    b = r.shape[0]
    a = (h.reshape(k, k // b, b) @ r).reshape(k, k)  # h R
    return (a.T.reshape(k, k // b, b) @ r).reshape(k, k).T  # (h R)ᵀ R, transposed: Rᵀ h R


def check_activations(activations: str) -> None:
    if activations not in ACTIVATIONS:
        raise ValueError(
            f"int8 activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}."
        )


def channel_int8(w: np.ndarray, h: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``w`` (K, N) → (int8 codes (K, N), float32 scales (N,)) with ``w ≈ codes * scales``.

    ``h``: the Hessian ``XᵀX`` of the layer's inputs; given, the codes are GPTQ's (one block
    of K rows: export/gptq.py's scale from the largest-magnitude weight, so a scale may be
    negative and the codes span -128..127); else round to nearest, ``max|w| / 127``.
    """
    w = np.asarray(w, dtype=np.float32)
    k, n = w.shape
    if h is not None:
        packed, scales = gptq_nbits(w, h, 8, block_size=k)
        codes = packed.reshape(n, -1)[:, :k].astype(np.int16) - 128
        return np.ascontiguousarray(codes.T.astype(np.int8)), np.ascontiguousarray(scales[:, 0])
    scale = np.abs(w).max(axis=0) / 127.0
    safe = np.where(scale == 0, 1.0, scale)
    codes = np.clip(np.round(w / safe), -127, 127).astype(np.int8)
    return codes, scale.astype(np.float32)


def check_weight_form(weight_form: str) -> None:
    if weight_form not in WEIGHT_FORMS:
        raise ValueError(f"int8 weights must be one of {WEIGHT_FORMS}; got {weight_form!r}.")


def stored_codes(codes: np.ndarray, weight_form: str) -> np.ndarray:
    """The int8 ``codes`` as a graph stores them in ``weight_form``: as they are (``s8``) or
    plus :data:`~spotstop.guard.backends._int8_probe.W_ZERO` as uint8 (``u8``, read with that
    weight zero point); :func:`graph_codes` reads them back."""
    check_weight_form(weight_form)
    codes = np.asarray(codes)
    if codes.dtype != np.int8:
        raise ValueError(f"codes must be int8; got {codes.dtype}.")
    return codes if weight_form == "s8" else (codes.astype(np.int16) + W_ZERO).astype(np.uint8)


def graph_codes(stored: np.ndarray) -> np.ndarray:
    """The int8 codes of a weight a graph stores in either form (:func:`stored_codes`)."""
    stored = np.asarray(stored)
    if stored.dtype == np.uint8:
        return (stored.astype(np.int16) - W_ZERO).astype(np.int8)
    if stored.dtype != np.int8:
        raise ValueError(f"an int8 GEMM weight is int8 or uint8; got {stored.dtype}.")
    return stored


def layer_error(
    x: np.ndarray,
    w: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray,
    activations: str = DEFAULT_ACTIVATIONS,
    *,
    symmetric: bool = False,
) -> float:
    """Relative output error ``‖deq(Q(x)) (codes·scales) − x w‖_F / ‖x w‖_F`` of one layer at
    dynamic int8 on the input rows ``x`` (n, K), ``Q`` per ``activations`` (per token:
    ``symmetric``, the form without a midpoint); 0 when ``x w`` is all zero."""
    check_activations(activations)
    if symmetric and activations != "per-token":
        raise ValueError("the symmetric form is per token; per tensor has one range per call.")
    # float32 products (a Qwen3.5-2B export measures ~200 layers on 2,048 rows each): the
    # error measured is ~1e-2, float32's relative rounding ~1e-7
    x = np.asarray(x, dtype=np.float32)
    ref = x @ np.asarray(w, dtype=np.float32)
    deq = dequantize_activations_per_token if activations == "per-token" else dequantize_activations
    if symmetric:
        deq = dequantize_activations_symmetric
    got = deq(x) @ (codes.astype(np.float32) * scales.astype(np.float32))
    den = float(np.linalg.norm(ref.astype(np.float64)))
    diff = float(np.linalg.norm((got - ref).astype(np.float64)))
    return diff / den if den > 0 else 0.0


def smoothing_factors(act_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|X_j|^α / max|W_j|^(1−α)`` (Eq. 4), per input channel ``j``;
    a channel with no activation or no weight gets 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smooth_alpha must lie in [0, 1]; got {alpha}.")
    a = np.asarray(act_absmax, dtype=np.float64)
    b = np.asarray(w_absmax, dtype=np.float64)
    ok = (a > 0) & (b > 0)
    s = np.ones_like(a)
    s[ok] = a[ok] ** alpha / b[ok] ** (1.0 - alpha)
    return np.maximum(s, _S_MIN).astype(np.float32)
