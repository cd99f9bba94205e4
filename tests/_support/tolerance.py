"""How far two results may differ when they come from different computations: one place.

A test that compares results of DIFFERENT computations (a batch against single calls, the
sidecar against the library, one graph against another) compares them with a bound derived
from the arithmetic that made them, never with a constant that happens to pass on the CPU
it was written on: another CPU runs other kernels (other blocking, other summation order),
so the last bits differ, and a hand-picked bound a few roundings wide fails there.

* :func:`score_tolerance`: member scores ``s`` of one member, computed twice on its
  backend. The bound is the export config's ``score_atol`` at the backend's precision
  (``spotstop.export.configs.ExportConfig``): how far spotstop lets the same member's score
  move between two computations of its scoring pass at that precision (an exported graph
  against the torch reference, ``spotstop verify-bundle``). A batch against single calls
  is the same kind of difference: the same arithmetic, other GEMM shapes.
* :func:`fused_tolerance`: that bound carried through Avg-2. The fused score divides each
  member's deviation by the pool's IQR, so a member tolerance ``tol_m`` moves ``S`` by at
  most ``Σ w_m tol_m / IQR_m / Σ w_m``; on the tiny pair (IQRs of a few hundredths) that is
  tens of times the member bound, which is why fused scores of different computations are
  never compared with a member-sized tolerance.
* :func:`output_tolerance`: ``(atol, rtol)`` for a float tensor the scoring pass computes
  (hidden states, logits): the export config's per-output bounds at that precision.
* :func:`sum_bound`: the classical bound on the rounding error of a floating-point sum of
  ``n`` terms, in any order (Higham, *Accuracy and Stability of Numerical Algorithms*,
  Sec. 3.1): ``|fl(Σ x_i) − Σ x_i| ≤ γ_n Σ |x_i|`` with ``γ_n = n u / (1 − n u)``.

Timing: :data:`SCHEDULING_SLACK_S`, how late a loaded machine may end a wait that was due.

Comparisons of the SAME computation repeated (the same inputs, shapes and process) need
none of this: they are deterministic and compare exactly or with the tolerance of the
arithmetic that reproduces a logged number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from spotstop.export.configs import get_export_config

__all__ = [
    "SCHEDULING_SLACK_S",
    "backend_precision",
    "fused_tolerance",
    "output_tolerance",
    "score_tolerance",
    "score_tolerances",
    "sum_bound",
    "unit_roundoff",
]

#: torch dtype (as ``str(model.dtype)``) → the export precision of the same arithmetic
_TORCH_PRECISION = {"torch.float32": "fp32", "torch.float16": "fp16"}


def backend_precision(backend: Any) -> str:
    """The precision (``"fp32"``, ``"fp16"``, ``"int8"``, …) a member backend scores in.

    A graph backend (onnx, TensorRT) states it (fixed at export); the torch backend computes
    in its model's dtype.
    """
    precision = getattr(backend, "precision", None)
    if precision is not None:
        return str(precision)
    dtype = str(backend.model.dtype)
    if dtype not in _TORCH_PRECISION:
        raise ValueError(
            f"no score bound is known for a torch backend in {dtype}; known: "
            f"{sorted(_TORCH_PRECISION)}"
        )
    return _TORCH_PRECISION[dtype]


def score_tolerance(member: Any) -> float:
    """|Δs| bound for two computations of ``member``'s score on its backend."""
    cfg = get_export_config(member.info.model_type)
    return float(cfg.score_atol[backend_precision(member.backend)])


def score_tolerances(members: Mapping[str, Any]) -> dict[str, float]:
    """:func:`score_tolerance` of each member, by name (e.g. ``guard.members``)."""
    return {name: score_tolerance(m) for name, m in members.items()}


def output_tolerance(member: Any) -> tuple[float, float]:
    """``(atol, rtol)`` (``numpy.allclose`` semantics) for a float tensor of ``member``'s
    scoring pass computed two ways on its backend."""
    cfg = get_export_config(member.info.model_type)
    precision = backend_precision(member.backend)
    return float(cfg.atol[precision]), float(cfg.rtol[precision])


def fused_tolerance(fusion: Any, member_tolerance: Mapping[str, float]) -> float:
    """|ΔS| bound for an Avg-2 fusion (``Avg2Fusion``) whose member scores each move by at
    most ``member_tolerance[m]``: ``Σ w_m tol_m / IQR_m / Σ w_m``."""
    weights = fusion.weights
    num = sum(weights[m] * member_tolerance[m] / fusion.stats[m].iqr for m in fusion.members)
    return float(num / sum(weights[m] for m in fusion.members))


def unit_roundoff(dtype: Any) -> float:
    """``u``: half the distance from 1 to the next float of ``dtype`` (2⁻²⁴ for float32)."""
    return float(np.finfo(dtype).eps) / 2


def sum_bound(n: int, magnitude: Any, dtype: Any) -> Any:
    """Bound on the rounding error of a ``dtype`` sum of ``n`` terms, or of an inner product
    of length ``n`` (its products rounded too), whose terms' absolute values sum to
    ``magnitude`` (a number or an array, e.g. ``|A| @ |B|`` for ``A @ B``), whatever the
    summation order, blocking or use of FMA: ``γ_n · magnitude``, ``γ_n = n u / (1 − n u)``."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"n = {n} terms is too many for a bound in {np.dtype(dtype)}")
    return nu / (1 - nu) * magnitude


#: Seconds a loaded machine (two cores, another test run beside this one) may add to a wait
#: that ends at a deadline: thread wake-ups, GIL hand-offs, an HTTP round trip. A test that
#: asserts a call ended "with its deadline" allows this much on top, and only where the
#: failure it catches (a 30 s busy timeout, a whole slow upload or answer) takes far longer;
#: where an order of events can be asserted instead of a time, the tests assert the order.
SCHEDULING_SLACK_S = 2.0
