"""A documented simulator of a deployment log, for ``spotstop card --simulated``, tests and
benchmarks (``spotstop card --demo`` reads a real log instead: the trained tiny TEST pair on a
toy world, see ``docs/world.md``).

Model (all draws from the ``rng`` passed in):

* ``n_contrasts`` situations hold one contrast each: one safe and one unsafe case.
  ``n_extra`` further cases, each its own situation and without a contrast, set the
  prevalence: they are unsafe when ``prevalence > 0.5`` and safe otherwise, so that the share
  of unsafe cases is ``prevalence`` (rounded).
* Scores are binormal with situation offsets: ``score = bias + d_prime * (y - 1/2) * sd_case
  + offset_situation + noise`` with ``offset ~ N(0, situation_sd²)`` shared by the cases of a
  situation and ``noise ~ N(0, 1 - situation_sd²)`` (so the pooled class sd is 1 and the
  pooled AUROC is about ``Φ(d_prime/√2)``; within a contrast the offset cancels, which is what
  makes ``R > AUROC``).  ``bias`` moves the direct cut away from the best cut (the threshold
  part).
* Optional file columns: ``width``/``height``/``bytes``/``format``; with ``size_leak > 0`` the
  longest side of unsafe images is larger (a scene-blind file cue), else independent of the
  label.  ``score_text`` (request only, no label signal) and ``score_gray`` (gray image: the
  situation offset without the scene) are included, and two member scores whose average is
  ``score``.
"""

from __future__ import annotations

import math

import numpy as np
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import DataError

__all__ = ["simulate_log"]


def simulate_log(
    n_contrasts: int = 600,
    *,
    prevalence: float = 0.5,
    d_prime: float = 1.5,
    bias: float = -0.6,
    situation_sd: float = 0.6,
    size_leak: float = 0.0,
    rng: np.random.Generator | int | None = None,
) -> CaseTable:
    """Simulate a labelled deployment log (see the module docstring for the model).

    ``simulate_log(600)`` gives 1,200 cases in 600 contrasts at 50 % unsafe.
    """
    if not isinstance(n_contrasts, int) or n_contrasts < 1:
        raise DataError(f"n_contrasts must be an integer >= 1; got {n_contrasts!r}.")
    if not 0.0 < prevalence < 1.0:
        raise DataError(f"prevalence must be in (0, 1); got {prevalence!r}.")
    if not 0.0 <= situation_sd < 1.0:
        raise DataError(f"situation_sd must be in [0, 1); got {situation_sd!r}.")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n_pair_cases = 2 * n_contrasts
    # extra single cases so that unsafe / total == prevalence
    if prevalence >= 0.5:
        n_extra = round((2 * prevalence - 1) * n_contrasts / (1 - prevalence))
        extra_label = 1
    else:
        n_extra = round((1 - 2 * prevalence) * n_contrasts / prevalence)
        extra_label = 0
    n = n_pair_cases + n_extra
    label = np.empty(n, dtype=np.int8)
    label[0:n_pair_cases:2] = 0
    label[1:n_pair_cases:2] = 1
    label[n_pair_cases:] = extra_label
    situation = np.concatenate(
        [np.repeat(np.arange(n_contrasts), 2), n_contrasts + np.arange(n_extra)]
    )
    offset = gen.normal(0.0, situation_sd, n_contrasts + n_extra)[situation]
    noise = gen.normal(0.0, math.sqrt(1.0 - situation_sd**2), n)
    score = bias + d_prime * (label - 0.5) + offset + noise
    contrast = np.array(
        [f"c{s:05d}" if i < n_pair_cases else "" for i, s in enumerate(situation)], dtype=object
    )
    member_diff = gen.normal(0.0, 0.5, n)
    longest = np.where(gen.random(n) < 0.5, 640.0, 1024.0)
    if size_leak > 0:
        longest = np.round(800 * np.exp(gen.normal(size_leak * (label - 0.5), 0.25, n)))
    aspect = gen.choice([4 / 3, 3 / 2, 1.0], n)
    width = longest
    height = np.round(longest / aspect)
    fmt = gen.choice(np.array(["jpeg", "png"], dtype=object), n, p=[0.8, 0.2])
    n_bytes = np.round(
        width * height * np.where(fmt == "png", 1.5, 0.25) * gen.lognormal(0, 0.2, n)
    )
    return CaseTable(
        case_id=np.array([f"x{i:06d}" for i in range(n)], dtype=object),
        label=label,
        score=score,
        contrast_id=contrast,
        situation_id=np.array([f"s{s:05d}" for s in situation], dtype=object),
        member_scores={"a": score + member_diff, "b": score - member_diff},
        score_gray=bias + offset + gen.normal(0.0, 0.3, n),
        score_text=gen.normal(bias, 1.0, n),
        width=width,
        height=height,
        n_bytes=n_bytes,
        format=fmt,
        request=np.array([f"request {s}" for s in situation], dtype=object),
    )
