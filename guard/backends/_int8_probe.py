"""Does this host's int8 GEMM compute exactly? The probe an int8 member is loaded behind.

An ``int8`` bundle multiplies its layers with onnxruntime's integer GEMM
(``MatMulIntegerToFloat`` / ``DynamicQuantizeMatMul``, export/int8.py): uint8 activation codes
by 8-bit weight codes, summed in int32. Two forms of the same codes (:data:`INT8_WEIGHT_FORMS`):

* ``s8``: int8 weights, onnxruntime's u8·s8 kernel (MLAS). With AVX512-VNNI, AVX-VNNI or AMX
  on x86, and with ARM's dot products, it is exact (VNNI and AMX multiply u8·s8 natively; the
  speeds in bench/RESULTS.md were measured in this form). On an x86 CPU with
  AVX2 and no VNNI (e.g. AMD Zen 2 and Zen 3, Intel before Ice Lake / Alder Lake) it multiplies
  with ``vpmaddubsw``, which adds two neighbouring u8·s8 products into a SATURATING int16: two
  codes of 255 by two weights of -128 make -65280, kept as -32768. The output is then wrong
  by up to half its size, silently (measured on an AMD EPYC with AVX2 only, onnxruntime 1.32:
  the tiny test pair's int8 decoder moved a score 2.17, int8's tolerance being 0.25).
* ``u8``: the same codes plus 128 as uint8, with a weight zero point of 128: onnxruntime's
  u8·u8 kernel, which widens both to int16 before it multiplies (``vpmaddwd``), so it is exact
  on every CPU; on that AVX2 CPU it ran one Qwen3.5-2B-sized layer as fast as the u8·s8 form
  (109.6 ms against 111.9, 2 threads; bench/RESULTS.md, section ``int8-gemm-avx2``), while on
  a VNNI or AMX CPU the u8·s8 form is expected to be faster (not measured).

The codes, scales and so the scores are the same in both forms; only the kernel differs. An
int8 export records its form (the manifest's ``quantizer.dynamic_int8.weight_form``; ``s8`` when
absent, as every bundle before it was) and ``spotstop export`` writes ``s8`` where this host
multiplies it exactly, else ``u8`` (``--int8-weights auto``). Before the ONNX backend opens
such a member (on any device: the int8 GEMM nodes a GPU provider lacks run on onnxruntime's
CPU kernel) it runs a small graph of the bundles' own operator in both forms with the worst
cases as constants (:data:`PROBE_FILE`, built by export/int8_graph.py's ``int8_probe_model`` from
:func:`probe_weights` and :func:`probe_activations`) and compares it with the exact integer
product: a member whose form this host does not multiply exactly is refused with
:class:`~spotstop.guard._errors.MemberLoadError` (the guard then answers its fail-closed
UNSAFE), never run. This module needs only numpy and onnxruntime (the robot's install): the
graph ships as a file, written by the export side, which has ``onnx``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

__all__ = [
    "A_ZERO",
    "INT8_WEIGHT_FORMS",
    "PROBE_FILE",
    "PROBE_K",
    "PROBE_M",
    "W_ZERO",
    "forms_exact",
    "host_int8_weight_forms",
    "probe_activations",
    "probe_weights",
]

#: the forms an int8 member's integer-GEMM weights may take, the faster first where both are
#: exact: ``s8`` (int8 weights, the u8·s8 kernel) and ``u8`` (uint8 = code + 128, the u8·u8 kernel)
INT8_WEIGHT_FORMS = ("s8", "u8")
#: the probe graph (``a`` uint8 (M, K) → ``y_s8`` and ``y_u8`` float32 (M, 4)): one
#: ``MatMulIntegerToFloat`` per form with the constant weights :func:`probe_weights`,
#: per-row activation scales of 1, column scales of 1 and the activation zero point 128 (the
#: ``u8`` form's weight zero point 128), as export/int8.py writes them
PROBE_FILE = Path(__file__).with_name("int8_gemm_probe.onnx")
#: rows and inner size of the probe: several rows (a GEMM, not a one-row kernel) and an inner
#: size past one kernel's block of pairs
PROBE_M, PROBE_K = 8, 256
#: the activation zero point export/int8.py's per-token form uses
A_ZERO = 128
#: the ``u8`` form's weight zero point: its stored weight is the int8 code plus this
W_ZERO = 128


def probe_weights() -> np.ndarray:
    """The probe's int8 weight codes (K, 4): all -128, all 127, the two alternating, and
    seeded codes over the whole range (the ``u8`` form stores them plus :data:`W_ZERO`)."""
    rng = np.random.default_rng(8)
    alt = np.where(np.arange(PROBE_K) % 2 == 0, -128, 127)
    cols = [np.full(PROBE_K, -128), np.full(PROBE_K, 127), alt, rng.integers(-128, 128, PROBE_K)]
    return np.stack(cols, axis=1).astype(np.int8)


def probe_activations() -> np.ndarray:
    """The probe's uint8 activation codes (M, K): rows all 255, all 0, 255 and 0 alternating,
    1 and 255 alternating (export/int8.py's codes span 1..255), then seeded rows."""
    rng = np.random.default_rng(7)
    i = np.arange(PROBE_K)
    rows = [
        np.full(PROBE_K, 255),
        np.zeros(PROBE_K),
        np.where(i % 2 == 0, 255, 0),
        np.where(i % 2 == 0, 1, 255),
    ]
    rows += [rng.integers(0, 256, PROBE_K) for _ in range(PROBE_M - len(rows))]
    return np.stack(rows).astype(np.uint8)


def forms_exact(outputs: dict[str, np.ndarray]) -> dict[str, bool]:
    """Per form, whether its probe output (``{"s8": y, "u8": y}``, each (M, 4)) is the exact
    product ``(a − 128) · w`` (every value is an integer under 2²⁴: float32 holds it exactly,
    so exact means equal)."""
    want = (probe_activations().astype(np.int64) - A_ZERO) @ probe_weights().astype(np.int64)
    out = {}
    for form in INT8_WEIGHT_FORMS:
        y = np.asarray(outputs[form])
        if y.shape != want.shape:
            raise ValueError(f"the probe's {form} output is {y.shape}; expected {want.shape}.")
        out[form] = bool(np.all(y == want.astype(np.float32)))
    return out


@functools.cache
def host_int8_weight_forms(provider: str = "CPUExecutionProvider") -> tuple[str, ...]:
    """The weight forms (:data:`INT8_WEIGHT_FORMS`, in that order) this host's onnxruntime
    ``provider`` multiplies exactly; empty when none (no int8 member can run here). Runs
    :data:`PROBE_FILE` once a process."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(PROBE_FILE), sess_options=opts, providers=[provider])
    names = [f"y_{f}" for f in INT8_WEIGHT_FORMS]
    ys = sess.run(names, {"a": probe_activations()})
    exact = forms_exact(dict(zip(INT8_WEIGHT_FORMS, ys, strict=True)))
    return tuple(f for f in INT8_WEIGHT_FORMS if exact[f])
