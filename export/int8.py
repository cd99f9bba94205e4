"""int8 that computes in int8: int8 weights per output column, activations quantized per call,
onnxruntime's int8 GEMM; with a measured keep rule and an optional SmoothQuant step.

Weight-only int8 (``MatMulNBits``, export/nbits.py) stores 8-bit weights but, at
``accuracy_level`` 0, multiplies in float32 after dequantizing them: on a 2-core x86 CPU one
Qwen3.5-2B-sized layer ran at half the speed of float32 (issue #24). This precision stores each
``MatMul``'s constant weight ``W`` (K, N) as int8 with one float32 scale per output column, and
quantizes the activations ``A`` on every call, in one of two ways (:data:`~spotstop.export.int8_math.ACTIVATIONS`):

* ``per-token`` (the default, :data:`~spotstop.export.int8_math.DEFAULT_ACTIVATIONS`): each row (token) ``a`` of ``A``
  gets its own range: midpoint ``μ = (max a + min a) / 2`` and step
  ``σ = max(max a − min a, 2e-30) / 254``; ``q = Round((a − μ) / σ) + 128`` as uint8 (codes
  1..255: one ``QuantizeLinear`` per axis over the rows of ``a − μ`` flattened to 2-D, 2.4-2.7x
  faster than the same arithmetic as ``Div``, ``Round``, ``Add`` and ``Cast`` and equal to it
  bit for bit, ``bench/fused_ops.py``; graphs below opset 13 keep those four nodes),
  ``MatMulIntegerToFloat(q, W_q, σ, scale, 128)`` (com.microsoft: the integer GEMM
  ``(q − 128) · W_q`` scaled per column in its output stage, then each row by its ``σ`` in
  place: the kernel takes an A scale of shape (…, 1) as one per row), then ``+ μ ⊗ c`` with ``c``
  the column sums of the dequantized weight: exactly ``deq(q) @ Ŵ`` with
  ``deq(q) = μ + (q − 128) σ``, so a row's 255 levels span its own range (one-sided rows, e.g.
  after a GELU, lose no level to the unused sign). One activation read by several weights
  (q/k/v, gate/up) is quantized once. It is the u8·s8 GEMM of onnxruntime's fused operators
  (AVX512-VNNI / AMX on x86, the int8 dot products on ARM), which accept only one activation
  zero point, hence the midpoint term after it. It equals standard ONNX ``MatMulInteger`` +
  ``Cast`` + ``Mul`` (column scales) + ``Mul`` (row steps) bit for bit, in fewer passes over
  the output (``bench/fused_ops.py`` times both).
  On request (``symmetric_slack``; ``spotstop export --int8-symmetric``), a measured layer
  whose inputs are two-sided takes the **symmetric** form instead (:data:`SYMMETRIC_SLACK`):
  ``σ = max(max a, −min a, 2e-30) / 127``, ``q = Round(a / σ) + 128`` (one ``QuantizeLinear``
  of ``a`` itself, no ``a − μ`` pass), and the GEMM's own row scaling is all that follows: one
  pass over the output instead of three (the ``μ ⊗ c`` product and its sum). It spends its 255
  levels on ``[−max|a|, max|a|]``, so a one-sided row (after a GELU) loses about a bit: a
  layer takes it only where, on its calibration rows (rotated, for a rotated layer), its
  error is at most :data:`SYMMETRIC_SLACK` above the midpoint form's and within ``keep_error``.
  Readers of one activation that chose different forms get one quantization per form.
  Off by default: a layer's own error is a poor guide to the score's. At the real pair's size
  every symmetric layer measured within 10 % of its midpoint error, yet ``verify-bundle`` on
  24 generated scenes (48 scores; the exports otherwise the same, rotations in blocks of 64)
  put the 95th percentile |Δs| and the largest at 0.321 and 0.515 with the form against 0.226
  and 0.324 without it (LFM2.5-VL-3B), and at 0.263 and 0.366 against 0.308 and 0.408
  (Qwen3.5-2B): worse by more on one member than it was better on the other, int8's
  tolerance being 0.25 (docs/limits.md).

  **Exact reads** (:data:`EXACT_READS`, per token, in a decoder graph: one with the scoring
  inputs :data:`~spotstop.export.int8_graph.READ_INPUTS`): the score reads a few rows of the decoder's output, the last
  prompt position and the answer tokens after it (``last_index``, ``read_index``), and those
  rows carry their own rounding straight into the score, where every other row's reaches them
  only mixed with many others through attention and the recurrences. So each int8 layer also
  multiplies those rows' residual ``r = a − deq(q)``, quantized again in the symmetric form
  (``σ_r = max|r| / 127``, at most ``σ / 254``): the read rows' codes are gathered by their
  flat index ``b·T + p``, their residual codes appended below the activation's own (one
  ``Concat`` of uint8 rows), ONE ``MatMulIntegerToFloat`` multiplies all of them (no second
  reader of the weight, whose packed copy onnxruntime would hold twice), the main rows are
  sliced off (one copy of the output), and the read rows' two products summed and written back
  (``ScatterND``): ``deq(q) + deq_s(r)`` (:func:`~spotstop.export.int8_math.dequantize_read_rows`), an error at most
  ``σ / 508`` on those rows, so about 16-bit activations where the score reads and 8-bit
  elsewhere. Found in torch at Qwen3.5-2B's real size (seeded random weights, float weights,
  every decoder Linear's input quantized per token, 12 scores of 6 generated scenes; an ad hoc
  hook, 2026-12-07): max |Δs| 0.317 with the read rows rounded like the rest, 0.089 with them
  float, 0.162 with them float in the first 12 of 24 layers only, 0.277 in the last 12 only,
  and 0.446 with only the read rows rounded (the rest float): the read rows' own rounding,
  early layers' most, is most of the score's error, though not additively. What the form
  does with the export's weights: ``bench/quant_error.py`` (``8:col:decoder`` against
  ``8:col:decoder:int8reads``) and ``verify-bundle`` in bench/RESULTS.md. The real-size
  int8 bundle, its decoder weights byte for byte the same, moved 48 scores up to 0.261 (95th
  percentile 0.142, Spearman 0.976) where without exact reads it moved them 0.496 (0.426,
  0.905); the tolerance is 0.25 (section ``cpu-real-int8-Qwen3.5-2B-exact-reads``).
  LFM2.5-VL-3B's bundle with exact reads moved them 0.194 (0.155), within it (section
  ``cpu-real-int8-LFM2.5-VL-3B-exact-reads``). The cost (``bench/bundle_ab.py``, section
  ``bundle-ab-int8-exact-reads``, an AMD EPYC without AMX): the decoder graph 1.03x as long,
  the scene 1.02x: each layer's output is copied once more (the ``Slice`` of the main rows)
  and written back (``ScatterND``), 2-3 % of the decoder where the GEMMs take 90 %; on a CPU
  whose int8 GEMMs are faster (AMX) the copies weigh more. ``--int8-reads int8`` is the
  faster form.
* ``per-tensor``: ``DynamicQuantizeMatMul(A, W_q, scale)`` (com.microsoft) quantizes ``A`` to
  uint8 with ONE scale and zero point for the whole tensor (``DynamicQuantizeLinear``:
  ``scale = (max(0, max A) − min(0, min A)) / 255``).

Measured on one 383 × 2048 @ 2048 × 6144 layer with one token 50 times larger than the rest
(an attention-sink token, as trained decoders have; ``bench/int8_gemm.py``): per tensor, the
other tokens' relative error is ~0.4 (their values share 255 levels with the outlier's range);
per token ~0.01, at a few per cent more time (the extra passes over ``A`` and the output).
A symmetric per-token form (``σ = max|a| / 127``, no midpoint) was tried first: on the trained
tiny LFM2 member it lost a bit on one-sided rows and failed the export's own validation (the
vision tower's noise image moved 0.89, tolerance 0.5), which per tensor passed.
Per tensor failed ``verify-bundle``'s 0.25 score tolerance on the trained tiny pair and at the
real size (bench/RESULTS.md); it stays for comparison.

The vision graph's first and last layers (the patch embedding that reads the pixels, the
projector layer that writes the embeddings the decoder reads) stay float32, at every
MatMulNBits precision too (:func:`~spotstop.export.weights.image_end_weights`; docs/export.md).

With calibration inputs, a constant no recorded Linear multiplies by (a table the exporter
folded into a constant, e.g. LFM2-VL's resized position embeddings; the output layer's
first-token rows) stays float32: its inputs are unknown, and such constants are small. (A
streamed export, whose exporter does not fold constants, computes them at run time: float32
too, so both exports agree.)

Which layers stay weight-only (``MatMulNBits`` 8-bit, ``accuracy_level`` 4: int8 activations
per block of 128, so an outlier only costs its own block):

* the output layer (the MatMul whose output the vocabulary's ``LogSoftmax`` reads): the
  scoring graph multiplies only a few read positions by it, so it is memory-bound and a dynamic GEMM
  gains nothing; and tied to the embeddings it stays ONE table, which ``GatherBlockQuantized``
  reads (export/weights.py; the Gather adds its rounding residual's 8-bit blocks), where a
  DynamicQuantizeMatMul weight would need a second copy;
* every layer whose measured error exceeds ``keep_error``, with its input rotated too (below):
  on the calibration scenes' recorded
  inputs (export/gptq.py, the same as GPTQ's), ``‖deq(Q(X)) Ŵ − X W‖ / ‖X W‖`` with ``Q``
  the activation quantization simulated over the sampled rows (per tensor: over several
  scenes at once, a range at least as wide as one call's, so the estimate errs high). Without
  calibration inputs (``quantizer="rtn"``) only the output-layer rule applies.

The rotation (per token; QuaRot's online Hadamard, Ashkboos et al. 2024, "QuaRot: Outlier-Free
4-Bit Inference in Rotated LLMs", Sec. 4): a layer over ``keep_error`` is measured again with
its input ``X`` multiplied, block by block of ``b`` channels, by ``R = diag(d) H_b / √b``
(:func:`~spotstop.export.int8_math.block_rotation`: Sylvester's Hadamard matrix, seeded signs ``d``, ``b`` the largest
power of two up to the block tried that divides K; :func:`~spotstop.export.int8_math.rotation_blocks`: 64 first, then
doubling up to ``rotate_block``, the first within the bound kept, since the rotation's cost
grows with its block) and its weight by ``Rᵀ`` (GPTQ on the
rotated weight with the rotated Hessian ``Rᵀ XᵀX R``): ``R`` is orthogonal, so
``(X R)(Rᵀ W) = X W``, while each row's few large values are spread over their block and the
row's 255 levels fit the rest. Within the bound, the layer computes in int8 and the graph
multiplies its input by the float32 ``b × b`` constant (one ``MatMul`` over the input reshaped
to ``(−1, b)``) before quantizing it; over it, the layer is kept. A feed-forward output layer's
input is a product (``silu(g) · u``), which no earlier weight can absorb a rotation into, so it
is computed at run time, as QuaRot does for that layer. At Qwen3.5-2B's real size (seeded random
weights, 2 generated scenes) the 42 layers the bound kept (24 feed-forward output layers, 18
Gated-DeltaNet output projections; per-token errors 0.023-0.039) measured 0.009-0.015 rotated in
blocks of 128 (64: 0.009-0.016; 256: 0.009-0.012): a weight-only 8-bit layer of that size ran
about 21 ms, an int8 one about 3 ms. Kept layers
  with float activations (``accuracy_level`` 0) instead were measured and not adopted: on
  Qwen3.5-2B's int8 bundle (42 kept layers, same weights) a scene took 1.41x as long,
  ``verify-bundle``'s max |Δs| went from 0.432 to 0.340 and its Spearman from 0.986 to 0.915
  (bench/int8_kept_form.py, section ``int8-kept-form`` of bench/RESULTS.md).

The vision graph as a whole (:func:`vision_activation_check`, called by export/onnx.py):
the export scores each check scene (export/gptq.py's ``CHECK_SCENES``; generated ones begin with the
calibration scenes, a frames table's are drawn apart: the largest move over the 8 scenes GPTQ fitted the weights on misses the tail) with the
float32 decoder reading the int8 vision graph's image embeddings and again with the float32
vision graph's; when the largest move is
over :data:`VISION_SHARE` of the precision's score tolerance, the vision graph is converted
again with float activations (every Linear weight-only 8-bit, ``accuracy_level`` 0; export/
precision.py's ``ConvertOptions.float_activations``). A per-layer bound does not find this:
on the trained tiny pair every layer's own error stayed under 0.0105 (bound 0.02), while the
vision graphs moved one held-out scene each by 0.32 and 0.45; each scene has its own
sensitive layer (docs/limits.md).

SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training
Quantization for Large Language Models", Sec. 4; on by default with the calibration scenes,
:data:`SMOOTH_ALPHA`): with ``smooth_alpha = α``, each set of
MatMuls that read the same activation ``X`` (q/k/v, gate/up) is given one per-channel factor
``s_j = max|X_j|^α / max|W_j|^(1−α)`` (the max over the set's weights' rows), ``X`` is divided
by ``s`` (folded into the constant that scales the producer's output per channel when the
producer feeds only this set: an RMSNorm's weight ``Mul``, a fused ``SimplifiedLayerNormalization``
or ``SkipSimplifiedLayerNormalization``'s scale, a ``LayerNormalization``'s scale and bias; else
a new ``Mul`` by the constant ``1/s``) and each ``W`` is multiplied by
``s`` row by row: ``(X/s)(sW) = XW`` exactly, while the activation's outlier channels are
moved into the weights, which are quantized per column. A weight read by MatMuls with
different inputs is not smoothed (it cannot take two factors).

Codes: GPTQ (export/gptq.py) with one block of all K rows where the calibration inputs hold the
weight's inputs (their Hessian scaled by ``1/(s sᵀ)`` after smoothing), else round to nearest
(``max|w| / 127`` per column). :class:`Int8Report` records what was done for the manifest.

Weight form (``weight_form``, the manifest's ``weight_form``; :data:`~spotstop.export.int8_math.WEIGHT_FORMS`): ``s8``
stores the codes as int8 (onnxruntime's u8·s8 kernel: the fastest with VNNI, AMX or ARM's dot
products), ``u8`` the same codes plus 128 as uint8 with a weight zero point of 128 (its u8·u8
kernel, which widens to int16 before it multiplies). On an x86 CPU with AVX2 and no VNNI the
u8·s8 kernel adds two neighbouring products into a saturating int16 and gets the output wrong,
silently; the u8·u8 kernel is exact on every CPU (and was as fast there). The export writes the
first form this host multiplies exactly (:func:`host_weight_form`); the runtime probes the host
before it opens an int8 member and refuses one whose form it would not multiply exactly
(guard/backends/_int8_probe.py). The codes, and so the scores, are the same in both forms.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from spotstop.export.gptq import CalibrationInputs
from spotstop.export.int8_graph import (
    READ_INPUTS,
    ReadRows,
    per_token_quantize,
    reached,
    read_out,
    rotate_nodes,
)
from spotstop.export.int8_math import (
    DEFAULT_ACTIVATIONS,
    HALF,
    LEVELS,
    ROTATE_BLOCK,
    ROW_FLOOR,
    SYM_LEVELS,
    block_rotation,
    channel_int8,
    check_activations,
    check_weight_form,
    layer_error,
    rotate_hessian,
    rotate_rows,
    rotate_weight,
    rotation_blocks,
    smoothing_factors,
    stored_codes,
)
from spotstop.export.weights import (
    WeightIO,
    default_opset,
    image_end_weights,
    rewrite_weight_matmuls,
    weight_initializer,
)
from spotstop.guard.backends._int8_probe import W_ZERO, host_int8_weight_forms

__all__ = [
    "EXACT_READS",
    "KEEP_ERROR",
    "SAMPLE_ROWS",
    "SMOOTH_ALPHA",
    "SYMMETRIC_SLACK",
    "VISION_SHARE",
    "Int8Report",
    "VisionActivationCheck",
    "default_smooth_alpha",
    "host_weight_form",
    "quantize_matmuls_int8",
    "vision_activation_check",
]

#: a layer whose measured relative output error at dynamic int8 exceeds this stays
#: weight-only: per-tensor activations on well-behaved inputs measure 0.5-1.5 % (gaussian rows:
#: the step of 255 levels over a range of ~9 standard deviations). Chosen on the tiny pairs,
#: random and trained (tests/export/test_int8.py): with smoothing, 0.03 let the trained LFM2
#: member's request-only score move 0.31 (tolerance 0.25); 0.02 kept two more layers and it
#: moved 0.14, and every tiny member validated
KEEP_ERROR = 0.02
#: SmoothQuant's α (the paper's default), what ``auto`` uses for per-tensor activations with the
#: calibration scenes (:func:`default_smooth_alpha`). Per tensor without it the trained tiny
#: LFM2 member failed its int8 validation at every keep bound tried (0.01-0.03: the vision
#: tower's noise-image case moved 1.15, tolerance 0.5); with it, it passed
SMOOTH_ALPHA = 0.5
#: the share of the precision's score tolerance the vision graph's int8 activations may use on
#: the calibration scenes (:func:`vision_activation_check`); the decoder's error has the rest
VISION_SHARE = 0.5
#: recorded input rows each layer's error is measured on
SAMPLE_ROWS = 2048
#: per token, on request (off by default: the module doc): a layer takes the symmetric form
#: (no midpoint) where its measured error is at most this share above the midpoint form's, and
#: within ``keep_error``. At Qwen3.5-2B's real size (seeded random weights, 2 generated
#: scenes, 282 Linears) the symmetric form measured 1.006-1.079 times the midpoint form's error
#: on two-sided inputs and 1.38-1.50 times on the vision tower's MLP down projections, whose
#: inputs follow a GELU (one-sided rows lose a bit). bench/int8_gemm.py times one layer in both
#: forms; at the real size the scene went from 1.95 s to 1.77 s (Qwen3.5-2B) and 0.80 s to
#: 0.69 s (LFM2.5-VL-3B) with it, the rotations in blocks of 64 and the fused vision pieces,
#: while verify-bundle's 95th percentile |Δs| over 48 scores moved +42 % and -15 % (the module
#: doc)
SYMMETRIC_SLACK = 0.10
#: per token, in a decoder graph (one with the scoring inputs :data:`~spotstop.export.int8_graph.READ_INPUTS`): the rows the
#: score reads (the last prompt position and the answer tokens after it) are multiplied as
#: their per-token codes plus the residual those codes leave, quantized again (the module doc's
#: exact reads). Measured in torch at Qwen3.5-2B's real size (seeded random weights, 6
#: generated scenes, 12 scores, every decoder Linear's input quantized per token, float
#: weights): max |Δs| 0.317 with every row quantized, 0.089 with the 3 read rows float
EXACT_READS = True


def default_smooth_alpha(calibrated: bool, activations: str = DEFAULT_ACTIVATIONS) -> float | None:
    """SmoothQuant's α when the export is left to choose (``smooth_alpha="auto"``).

    Per token: none. Measured on the trained tiny pair (bench/RESULTS.md, ``trained-world``):
    with α = 0.5 the factors fitted on the calibration scenes moved one request the pair had
    never seen ("pick up the knife from the counter", request only) by 1.75 nats, while every
    layer's own error at per-token int8 stayed below 0.07 on it; without smoothing the largest
    move over verify-bundle's scenes was 0.05 (Qwen) and 0.12 (LFM2). Per-token rows already
    carry their outliers' range, so smoothing only adds the calibration scenes' bias.
    Per tensor, with the calibration scenes: :data:`SMOOTH_ALPHA`."""
    check_activations(activations)
    return SMOOTH_ALPHA if calibrated and activations == "per-tensor" else None


def host_weight_form(weight_form: str | None = None) -> str:
    """The int8 weights' form for an export on this host: ``weight_form`` as asked (``s8`` or
    ``u8``), which this host's integer GEMM must multiply exactly, since the export validates
    its graphs here; None: the first of :data:`~spotstop.export.int8_math.WEIGHT_FORMS` it multiplies exactly
    (guard/backends/_int8_probe.py's probe)."""
    if weight_form is not None:
        check_weight_form(weight_form)
    host = host_int8_weight_forms()
    if not host:
        raise ValueError(
            "this host's onnxruntime int8 GEMM (MatMulIntegerToFloat) is exact in neither weight "
            "form (u8·s8, u8·u8), so no int8 bundle can be exported or run here; export with "
            "--precision int8-nbits (weight-only 8-bit) instead."
        )
    if weight_form is None:
        return host[0]
    if weight_form not in host:
        raise ValueError(
            f"int8 weights {weight_form}: this host's onnxruntime int8 GEMM does not compute "
            "that form exactly (an x86 CPU with AVX2 and no VNNI adds two u8·s8 products into a "
            "saturating int16), so the export could not validate its graphs here. Export with "
            f"--int8-weights {host[0]} (the same codes; every CPU runs it exactly), or on a host "
            "with AVX512-VNNI, AVX-VNNI, AMX or ARM."
        )
    return weight_form


@dataclass(frozen=True)
class Int8Report:
    """What :func:`quantize_matmuls_int8` did to one graph (the manifest's ``int8`` entry)."""

    #: weights now multiplied in int8 (MatMulIntegerToFloat per token, or DynamicQuantizeMatMul)
    dynamic: int
    #: weights left for the weight-only pass: output layers, and those over ``keep_error``
    head: tuple[str, ...] = ()
    kept: tuple[tuple[str, float], ...] = ()
    #: with calibration: constants no recorded Linear reads (inputs unknown): left float32
    unmeasured: tuple[str, ...] = ()
    #: the vision graph's first and last layers (export/weights.py's ``image_end_weights``):
    #: left float32
    image_ends: tuple[str, ...] = ()
    #: weights whose error was measured, and the largest and median of those errors
    measured: int = 0
    max_error: float = 0.0
    median_error: float = 0.0
    #: activation sets smoothed (with ``alpha``), and how many factors were folded into a Mul
    smoothed: int = 0
    folded: int = 0
    alpha: float | None = None
    keep_error: float = KEEP_ERROR
    gptq: int = 0
    activations: str = DEFAULT_ACTIVATIONS
    #: weights left weight-only 8-bit with float activations (``accuracy_level`` 0): a vision
    #: graph whose int8 activations failed :func:`vision_activation_check`
    float_activations: int = 0
    #: layers over ``keep_error`` that compute in int8 after an online block rotation of their
    #: input (name, error without it, error with it; counted in ``dynamic``), the largest block
    #: tried (0: none) and the rotation constants the graph holds (float32, not weights)
    rotated: tuple[tuple[str, float, float], ...] = ()
    rotate_block: int = 0
    rotations: tuple[str, ...] = ()
    #: per token: layers whose activations take the symmetric form (no midpoint; name, its
    #: error in that form, NaN unmeasured; counted in ``dynamic``), and the slack that chose them
    #: (:data:`SYMMETRIC_SLACK`; None: the form was not tried)
    symmetric: tuple[tuple[str, float], ...] = ()
    symmetric_slack: float | None = None
    #: per token, a decoder graph: layers whose read rows are multiplied with their residual's
    #: codes too (:data:`EXACT_READS`; counted in ``dynamic``)
    exact_reads: int = 0
    #: the integer GEMM's weight form (:data:`~spotstop.export.int8_math.WEIGHT_FORMS`; guard/backends/_int8_probe.py
    #: reads it before it opens the member)
    weight_form: str = "s8"
    errors: dict[str, float] = field(default_factory=dict, repr=False)

    def as_meta(self) -> dict[str, Any]:
        return {
            "dynamic": self.dynamic,
            "activations": self.activations,
            "weight_only": {
                "output_layer": len(self.head),
                "over_keep_error": len(self.kept),
                "float_activations": self.float_activations,
            },
            "float32_unmeasured": len(set(self.unmeasured)),
            "float32_image_ends": len(self.image_ends),
            "keep_error": self.keep_error,
            "measured": self.measured,
            "max_error": round(self.max_error, 6),
            "median_error": round(self.median_error, 6),
            "smooth_alpha": self.alpha,
            "smoothed_inputs": self.smoothed,
            "gptq": self.gptq,
            "rotate_block": self.rotate_block,
            "rotated": len(self.rotated),
            # the rotated layers' own errors, as they compute (each within keep_error)
            "rotated_max_error": round(max((e for _, _, e in self.rotated), default=0.0), 6),
            "symmetric_slack": self.symmetric_slack,
            "symmetric": len(self.symmetric),
            "exact_reads": self.exact_reads,
            "weight_form": self.weight_form,
            # the symmetric layers' own errors (each within keep_error)
            "symmetric_max_error": round(
                max((e for _, e in self.symmetric if math.isfinite(e)), default=0.0), 6
            ),
        }


@dataclass(frozen=True)
class VisionActivationCheck:
    """Whether the vision graph keeps int8 activations (the manifest's ``vision_activations``).

    Measured at export (export/onnx.py): each check scene's score (its scene pass)
    with the float32 decoder reading the image embeddings of the vision graph converted to
    int8, against the same with the float32 vision graph's; ``max_abs_diff`` is the largest
    |Δs| over the ``scenes``. Over ``bound`` (:data:`VISION_SHARE` of the precision's score
    tolerance), or not finite, the vision graph is converted again with float activations:
    its Linears weight-only 8-bit (``MatMulNBits``, ``accuracy_level`` 0)."""

    max_abs_diff: float
    bound: float
    scenes: int

    @property
    def float_activations(self) -> bool:
        return not self.max_abs_diff <= self.bound  # NaN: float activations

    def as_meta(self) -> dict[str, Any]:
        return {
            "rule": f"int8 activations while max |ds| <= {VISION_SHARE:g} x score tolerance",
            "max_abs_diff": round(self.max_abs_diff, 6)
            if math.isfinite(self.max_abs_diff)
            else str(self.max_abs_diff),
            "bound": round(self.bound, 6),
            "scenes": self.scenes,
            "activations": "float (weight-only 8-bit)" if self.float_activations else "int8",
        }


def vision_activation_check(
    moves: np.ndarray, score_atol: float, share: float = VISION_SHARE
) -> VisionActivationCheck:
    """The rule on the measured |Δs| of the check scenes (``moves``, one per scene) that
    the vision graph's int8 activations cause, against ``share`` of the precision's score
    tolerance ``score_atol``: the vision and decoder graphs' errors add up in a score, so the
    vision graph may take at most its share on the check scenes.

    Measured (bench/RESULTS.md, ``trained-world``; docs/limits.md): on the trained tiny pair
    the int8 vision graphs moved their check scenes up to 0.153 (Qwen3.5) and 0.160
    (LFM2) against the bound 0.125 and failed verify-bundle on a held-out world scene each
    (0.32, 0.45, tolerance 0.25); at Qwen3.5-2B's real size (seeded random weights) its int8
    vision graph moved the 32 check scenes 0.068 and the 8 calibration scenes among them 0.011
    (bench/RESULTS.md, ``cpu-real-export-int8-Qwen3.5-2B``), and the vision tower takes about
    half a scene's time there."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must lie in (0, 1]; got {share}.")
    if not score_atol > 0:
        raise ValueError(f"score_atol must be positive; got {score_atol}.")
    d = np.abs(np.asarray(moves, dtype=np.float64))
    if d.size == 0:
        raise ValueError("the vision activation check needs at least one calibration scene.")
    worst = float(d.max()) if np.isfinite(d).all() else math.nan
    return VisionActivationCheck(worst, share * score_atol, int(d.size))


def _output_layers(model: Any) -> set[str]:
    """Outputs of the nodes that feed a ``LogSoftmax`` (through at most a few Casts, Reshapes
    or Identities): the scoring graph's output layer, the full-vocabulary log-softmax at the
    read positions (export/graphs.py)."""
    consumers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    passthrough = {"Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze"}

    def feeds_log_softmax(name: str, depth: int = 4) -> bool:
        for c in consumers.get(name, []):
            if c.op_type == "LogSoftmax":
                return True
            if depth and c.op_type in passthrough and feeds_log_softmax(c.output[0], depth - 1):
                return True
        return False

    return {n.output[0] for n in model.graph.node if n.output and feeds_log_softmax(n.output[0])}


#: producers whose output's channels a constant input scales (input indices): an activation
#: they make is divided by ``s`` by dividing those constants (a LayerNorm's bias too)
_SCALED_BY = {
    "SimplifiedLayerNormalization": (1,),
    "SkipSimplifiedLayerNormalization": (2,),
    "LayerNormalization": (1, 2),
}


def _foldable(p: Any, inits: dict[str, Any], readers: dict[str, int], k: int) -> list[Any]:
    """The constants of the node ``p`` that scale its first output per channel (length ``k``,
    float32, read by ``p`` alone): one of a ``Mul``'s inputs, a fused RMSNorm's scale, a
    LayerNorm's scale and bias. Empty when there is none to fold into."""
    from onnx import TensorProto

    def ok(name: str) -> Any:
        t = inits.get(name)
        if (
            t is not None
            and t.data_type == TensorProto.FLOAT
            and list(t.dims)[-1:] == [k]
            and int(np.prod(t.dims)) == k
            and readers.get(name, 0) == 1
        ):
            return t
        return None

    if p.op_type == "Mul":
        found = [t for i in p.input if (t := ok(i)) is not None]
        return found[:1]
    idx = _SCALED_BY.get(p.op_type)
    if idx is None or max(idx) >= len(p.input):
        return []
    found = [ok(p.input[i]) for i in idx if p.input[i]]
    return [t for t in found if t is not None] if all(t is not None for t in found) else []


def quantize_matmuls_int8(
    model: Any,
    io: WeightIO | None = None,
    calibration: CalibrationInputs | None = None,
    *,
    smooth_alpha: float | None = None,
    keep_error: float = KEEP_ERROR,
    output_layers: Collection[str] = (),
    activations: str = DEFAULT_ACTIVATIONS,
    rotate_block: int = ROTATE_BLOCK,
    symmetric_slack: float | None = None,
    exact_reads: bool = EXACT_READS,
    weight_form: str | None = None,
) -> Int8Report:
    """Rewrite, in place, every ``MatMul`` with a rank-2 float initializer weight as an int8
    GEMM with ``activations`` quantized per call (see the module doc), except output layers and layers over
    ``keep_error``, which stay float ``MatMul`` (smoothed if their input is) for the weight-only
    pass that follows (export/precision.py). ``smooth_alpha`` needs ``calibration``.
    ``output_layers``: node outputs that are output layers besides those the LogSoftmax finds
    (a tied output layer, export/weights.py's ``untie_for_quantizer``: its table stays one).
    ``rotate_block``: per token, a layer over ``keep_error`` is measured again with its input
    rotated in blocks of up to this many channels (:func:`~spotstop.export.int8_math.block_rotation`; 0: never) and computes
    in int8 so when that error is within the bound. ``symmetric_slack`` (per token, measured
    layers): a layer whose error in the symmetric form is at most this share above the midpoint
    form's (and within ``keep_error``) takes the symmetric form (None, the default: never;
    :data:`SYMMETRIC_SLACK`: what ``--int8-symmetric`` asks for; ``math.inf``:
    every int8 layer, measured or not, as ``bench/int8_gemm.py`` times it). ``exact_reads``
    (per token, a graph with the scoring inputs :data:`~spotstop.export.int8_graph.READ_INPUTS`): the rows the score reads
    are multiplied with their residual's codes too (the module doc). ``weight_form``: how the
    integer GEMM's weights are stored, ``s8`` or ``u8`` (the same codes; None: the first this
    host multiplies exactly, :func:`host_weight_form`, which an export that validates here
    calls first)."""
    from onnx import TensorProto, helper

    if smooth_alpha is not None and calibration is None:
        raise ValueError(
            "SmoothQuant needs the calibration scenes' activations: export with the default "
            "quantizer 'gptq' (it records them), or without smooth_alpha."
        )
    if not keep_error > 0:
        raise ValueError(f"keep_error must be positive; got {keep_error}.")
    if rotate_block < 0:
        raise ValueError(f"rotate_block must be 0 (no rotation) or positive; got {rotate_block}.")
    if symmetric_slack is not None and not symmetric_slack >= 0:
        raise ValueError(f"symmetric_slack must be None or >= 0; got {symmetric_slack}.")
    check_activations(activations)
    if weight_form is None:
        weight_form = host_weight_form()
    else:
        check_weight_form(weight_form)
    unsigned = weight_form == "u8"
    if activations != "per-token":
        rotate_block = 0  # the rotation and the symmetric form are per token only
        symmetric_slack = None
    io = io or WeightIO()
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    heads_out = _output_layers(model) | set(output_layers)

    def weight_of(node: Any) -> Any:  # float32 weights only (a float16 one stays as it is)
        t = weight_initializer(node, inits)
        return t if t is not None and t.data_type == TensorProto.FLOAT else None

    matmuls = [(n, t) for n in g.node if (t := weight_of(n)) is not None]
    head = {t.name for n, t in matmuls if n.output[0] in heads_out}
    ends = image_end_weights(model)
    inputs_of: dict[str, set[str]] = {}
    for n, t in matmuls:
        inputs_of.setdefault(t.name, set()).add(n.input[0])

    # -- SmoothQuant: one factor per activation, over the weights that read it
    factors: dict[str, np.ndarray] = {}
    if smooth_alpha is not None and calibration is not None:
        groups: dict[str, list[Any]] = {}
        for n, t in matmuls:
            if t.name not in head and t.name not in ends and len(inputs_of[t.name]) == 1:
                groups.setdefault(n.input[0], []).append(t)
        for x_name, ts in groups.items():
            uniq = {t.name: t for t in ts}
            act, w_max = None, None
            for t in uniq.values():
                w = io.read(t)
                if act is None:
                    act = calibration.absmax(w)
                r = np.abs(w).max(axis=1)
                w_max = r if w_max is None else np.maximum(w_max, r)
                del w
            if act is not None and w_max is not None:  # never recorded: s = 1
                factors[x_name] = smoothing_factors(act, w_max, smooth_alpha)
    # a producing Mul's constant can take 1/s only when nothing else reads what it makes
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1

    # -- where each smoothed activation's 1/s goes: folded into a producing Mul, else a new Mul
    folded = 0
    smoothed_name: dict[str, str] = {}
    new_mul: dict[str, Any] = {}
    if factors:
        producer = {o: n for n in g.node for o in n.output}
        group_size = {x: sum(1 for n, _ in matmuls if n.input[0] == x) for x in factors}
        graph_outputs = {o.name for o in g.output}
        for x_name, s in factors.items():
            p = producer.get(x_name)
            consts: list[Any] = []
            if (
                p is not None
                and x_name == p.output[0]
                and readers.get(x_name, 0) == group_size[x_name]
                and x_name not in graph_outputs
            ):
                consts = _foldable(p, inits, readers, s.shape[0])
            if consts and p is not None:
                for const in consts:  # the norm's scale (and a LayerNorm's bias) take 1/s
                    arr = io.read(const) / s
                    new_t = io.add(model, arr.astype(np.float32), f"{const.name}_smoothed")
                    p.input[list(p.input).index(const.name)] = new_t.name
                smoothed_name[x_name] = x_name
                folded += 1
            else:
                inv = io.add(model, (1.0 / s).astype(np.float32), f"{x_name}_smooth_inv")
                out = f"{x_name}_smoothed"
                new_mul[x_name] = helper.make_node(
                    "Mul", [x_name, inv.name], [out], name=f"{x_name}_smooth"
                )
                smoothed_name[x_name] = out

    # -- the rewrite: DynamicQuantizeMatMul, or a (smoothed) float MatMul left for weight-only
    # weight -> (codes, column scales, column sums ("" when symmetric), rotation block, symmetric)
    done: dict[str, tuple[str, str, str, int, bool] | None] = {}
    smoothed_w: dict[str, str] = {}
    kept: list[tuple[str, float]] = []
    unmeasured: list[str] = []
    image_ends: list[str] = []
    errors: dict[str, float] = {}
    gptq_used = 0
    inserted: set[str] = set()
    token_q: dict[tuple[str, bool], tuple[str, str, str]] = {}  # (activation, symmetric) ->
    tok_consts: dict[str, str] = {}
    w_zero: list[str] = []  # the u8 form's weight zero point (its name), made once
    rotated: list[tuple[str, float, float]] = []
    symmetric: list[tuple[str, float]] = []  # (weight, its error in the symmetric form)
    # block size -> the graph's constants: R (b, b) and the shape (-1, b) the input takes
    rotations: dict[int, tuple[str, str]] = {}
    rotated_in: dict[tuple[str, int], str] = {}  # (activation, block size) -> its rotated name
    opset = default_opset(model)
    graph_inputs = {i.name for i in g.input}
    reads = (
        ReadRows(io, model, tok_consts, opset)
        if exact_reads and activations == "per-token" and set(READ_INPUTS) <= graph_inputs
        else None
    )
    # one row per token: what the token ids reach, but the read-out (the rows a Gather picks
    # at the read positions, e.g. multiplied by the answers' first-token rows)
    token_rows = (
        reached(g, READ_INPUTS[:1]) - read_out(g, READ_INPUTS[1:]) if reads is not None else set()
    )

    def rewrite(node: Any, t: Any) -> list[Any] | None:
        nonlocal gptq_used
        x_name = node.input[0]
        s = factors.get(x_name)
        pre: list[Any] = []
        if s is not None and x_name in new_mul and x_name not in inserted:
            pre.append(new_mul[x_name])
            inserted.add(x_name)
        a_in = smoothed_name.get(x_name, x_name)
        if t.name not in done:
            w = io.read(t)
            if t.name in head:
                done[t.name] = None
            elif t.name in ends:  # the vision graph's first or last layer: float32
                done[t.name] = None
                image_ends.append(t.name)
            else:
                x = calibration.sample(w, SAMPLE_ROWS) if calibration is not None else None
                h = calibration.hessian(w) if calibration is not None else None
                if s is not None:
                    if x is not None:
                        x = x / s
                    if h is not None:
                        h = h / np.outer(s, s).astype(np.float64)
                    w = w * s[:, None]
                codes, scales = channel_int8(w, h)
                gptq_used += h is not None
                err = layer_error(x, w, codes, scales, activations) if x is not None else None
                if err is not None:
                    errors[t.name] = err
                if calibration is not None and err is None:
                    # a constant no recorded Linear multiplies by (a table the exporter
                    # folded, the first-token rows): its inputs are unknown, so it stays float
                    unmeasured.append(t.name)
                    done[t.name] = None
                    if s is not None:
                        sq = io.add(model, w.astype(np.float32), f"{t.name}_sq").name
                        smoothed_w[t.name] = sq
                        unmeasured.append(sq)
                else:
                    rot = 0  # the block size its input is rotated in (0: none)
                    x_in, w_in, err_in = x, w, err  # the layer as it will compute
                    tried: set[int] = set()
                    over = x is not None and err is not None and err > keep_error
                    e1 = math.nan if err is None else err  # its error unrotated
                    for block in rotation_blocks(rotate_block) if over else ():
                        if rot or x is None:  # rotated in a smaller block already
                            break
                        r = block_rotation(w.shape[0], block)
                        if r is not None and r.shape[0] not in tried:  # measured again, rotated
                            tried.add(r.shape[0])
                            wr = rotate_weight(w, r)
                            hr = rotate_hessian(h, r) if h is not None else None
                            c2, s2 = channel_int8(wr, hr)
                            xr = rotate_rows(x, r)
                            e2 = layer_error(xr, wr, c2, s2, activations)
                            if e2 <= keep_error:
                                rot = r.shape[0]
                                if rot not in rotations:  # the graph's constants, once a size
                                    name = f"int8_rotate_{rot}"
                                    io.add(model, r.astype(np.float32), name)
                                    io.add(model, np.array([-1, rot], np.int64), f"{name}_rows")
                                    rotations[rot] = (name, f"{name}_rows")
                                codes, scales = c2, s2
                                rotated.append((t.name, e1, e2))
                                x_in, w_in, err_in = xr, wr, e2
                            del wr, hr, xr
                    if err is not None and err > keep_error and not rot:
                        kept.append((t.name, err))
                        done[t.name] = None
                        if s is not None:
                            smoothed_w[t.name] = io.add(
                                model, w.astype(np.float32), f"{t.name}_sq"
                            ).name
                    else:
                        sym = False  # the symmetric form, where it costs little error
                        if symmetric_slack is not None and x_in is not None and err_in is not None:
                            es = layer_error(x_in, w_in, codes, scales, symmetric=True)
                            sym = es <= keep_error and es <= err_in * (1 + symmetric_slack)
                            if sym:
                                symmetric.append((t.name, es))
                        elif symmetric_slack == math.inf and err_in is None:
                            sym = True  # unmeasured (no calibration): any error is within
                            symmetric.append((t.name, math.nan))
                        del x_in, w_in
                        qn, sn = f"{t.name}_int8", f"{t.name}_int8_scale"
                        io.add(model, stored_codes(codes, weight_form), qn)
                        io.add(model, scales, sn)
                        cn = ""
                        if activations == "per-token" and not sym:  # Ŵ's column sums:
                            # the midpoints' term
                            cn = f"{t.name}_int8_colsum"
                            colsum = codes.astype(np.float64).sum(axis=0) * scales.astype(
                                np.float64
                            )
                            io.add(model, colsum.astype(np.float32), cn)
                        done[t.name] = (qn, sn, cn, rot, sym)
            del w
        got = done[t.name]
        if got is None:
            if a_in == x_name and t.name not in smoothed_w:
                return None  # as it was: the weight-only pass quantizes it
            keep = helper.make_node(
                "MatMul", [a_in, smoothed_w.get(t.name, t.name)], list(node.output), name=node.name
            )
            return [*pre, keep]
        qn, sn, cn, rot, sym = got
        base = f"{node.name}_int8" if node.name else f"{node.output[0]}_int8"
        # the u8 form's weight zero point, once per graph (s8: none, the operators' default 0)
        if unsigned and not w_zero:
            w_zero.append(io.add(model, np.asarray(np.uint8(W_ZERO)), "int8_weight_zero").name)
        if activations == "per-tensor":
            return [
                *pre,
                helper.make_node(
                    "DynamicQuantizeMatMul",
                    [a_in, qn, sn, *w_zero],
                    list(node.output),
                    name=base,
                    domain="com.microsoft",
                ),
            ]
        if not tok_consts:  # the per-token constants, once per graph
            for key, arr in (
                ("floor", ROW_FLOOR),
                ("half", HALF),
                ("levels", LEVELS),
                ("zp", np.uint8(128)),
                ("axes", np.array([-1], dtype=np.int64)),  # also the 1-D shape of the steps
                *([("c128", np.float32(128))] if opset < 13 else []),
            ):
                tok_consts[key] = io.add(model, np.asarray(arr), f"int8_per_token_{key}").name
        if rot:  # the input rotated block by block, once per activation and block size
            rkey = (a_in, rot)
            if rkey not in rotated_in:
                rotated_in[rkey] = rotate_nodes(a_in, *rotations[rot], pre)
            a_in = rotated_in[rkey]
        if (sym or reads is not None) and "sym_levels" not in tok_consts:
            tok_consts["sym_levels"] = io.add(
                model, np.asarray(SYM_LEVELS), "int8_per_token_sym_levels"
            ).name
        exact = reads is not None and x_name in token_rows
        if (a_in, sym) not in token_q:  # quantized once per form, before its first reader
            zps = ""
            if reads is not None and exact:  # as (rows, K), with the graph's zero points
                reads.indices(pre)
                zps = reads.zps[0]
            token_q[a_in, sym] = per_token_quantize(
                a_in, tok_consts, pre, opset, symmetric=sym, rows=exact, zps=zps
            )
        q, sigma, mu = token_q[a_in, sym]
        y = node.output[0]
        if reads is not None and exact:  # the read rows, their residual too
            act = reads.activation(a_in, q, sigma, mu, pre)
            return [*pre, *reads.layer(act, qn, sn, cn, y, base, w_zero)]
        mk = helper.make_node
        # σ (…, 1) is the GEMM's A scale: the kernel scales each output row by it in place
        # (one pass, no node); the column scales stay in its output stage
        product = mk(
            "MatMulIntegerToFloat",
            [q, qn, sigma, sn, tok_consts["zp"], *w_zero],
            [y if sym else f"{y}_row"],
            name=base,
            domain="com.microsoft",
        )
        if sym:  # deq(q) = (q − 128) σ: the row step alone
            return [*pre, product]
        return [
            *pre,
            product,
            mk("Mul", [mu, cn], [f"{y}_mid"], name=f"{base}_mid"),
            mk("Add", [f"{y}_row", f"{y}_mid"], [y], name=f"{base}_add"),
        ]

    rewrite_weight_matmuls(model, rewrite, "int8 (dynamic)")
    if any(v is not None for v in done.values()) and not any(
        o.domain == "com.microsoft" for o in model.opset_import
    ):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    errs = sorted(errors.values())
    return Int8Report(
        dynamic=sum(v is not None for v in done.values()),
        head=tuple(sorted(head)),
        kept=tuple(kept),
        unmeasured=tuple(unmeasured),
        image_ends=tuple(image_ends),
        measured=len(errs),
        max_error=errs[-1] if errs else 0.0,
        median_error=float(np.median(errs)) if errs else 0.0,
        smoothed=len(factors),
        folded=folded,
        alpha=smooth_alpha,
        keep_error=keep_error,
        gptq=gptq_used,
        activations=activations,
        rotated=tuple(rotated),
        rotate_block=rotate_block,
        rotations=tuple(sorted(r for r, _ in rotations.values())),
        symmetric=tuple(symmetric),
        symmetric_slack=symmetric_slack,
        exact_reads=0 if reads is None else reads.layers,
        weight_form=weight_form,
        errors=errors,
    )
