"""bench/int8_gemm.py: every form of one linear layer, its rows, ratios and RESULTS.md section.

The real size (383 x 2048 @ 2048 x 6144) is the script's own run; here a tiny layer runs every
form for real in seconds, and the rendering is checked on figures given by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._support.bench import load_bench


def _doc(rows: list[tuple[str, float]]) -> dict[str, Any]:
    return {
        "shape": [10, 100, 1000],
        "threads": 2,
        "repeats": 3,
        "rows": [
            {
                "form": f,
                "seconds": s,
                "weight_bytes": 2**20,
                "rel_err": 0.01,
                "rel_err_outlier": 0.3,
            }
            for f, s in rows
        ],
        "read_gbs": 20.0,
        "cpu": {"model": "CPU X", "cores": 2, "flags": ["avx512_vnni"], "missing": ["amx_int8"]},
        "versions": {"onnxruntime": "1"},
        "date": "d",
    }


def test_ratios_peaks_and_the_stamp() -> None:
    g = load_bench("int8_gemm")
    doc = _doc(
        [
            (g.REF, 0.004),
            ("onnxruntime MatMulNBits 8-bit block 128 acc 4", 0.001),
            ("onnxruntime MatMulNBits 4-bit block 32 acc 0", 0.002),
            ("torch fp32", 0.008),
            (g.BF16, 0.002),
        ]
    )
    rows = {r["form"]: r for r in g.with_ratios(doc)}
    # 2 M K N = 2e6 FLOPs; 1 ms → 2 GFLOP/s; speed-up = baseline time / this time
    nb8 = rows["onnxruntime MatMulNBits 8-bit block 128 acc 4"]
    assert nb8["gflops"] == pytest.approx(2.0)
    assert nb8["vs_ort_fp32"] == pytest.approx(4.0) and nb8["vs_torch_bf16"] == pytest.approx(2.0)
    assert rows["torch fp32"]["vs_ort_fp32"] == pytest.approx(0.5)
    p = g.peaks(doc)
    assert p["fp32_gflops"] == pytest.approx(0.5)  # onnxruntime fp32 beats torch fp32 here
    assert p["bf16_gflops"] == pytest.approx(1.0)
    assert p["int8_gops"] == pytest.approx(2.0)  # acc 4: int8 dot products; acc 0 is not int8
    assert p["read_gbs"] == 20.0
    md = g.render(doc, "--repeats 3")
    assert (
        "| onnxruntime MatMulNBits 8-bit block 128 acc 4 | 1.0 ms | 2 | 1.0 MiB | 1.00e-02 | "
        "3.00e-01 | 4.00x | 2.00x |" in md
    )
    assert "Measured by `python bench/int8_gemm.py --repeats 3` (d); CPU CPU X, 2 logical" in md
    assert "flags avx512_vnni; without amx_int8;" in md
    # a run without a baseline says so instead of dividing by nothing
    lone = g.with_ratios(_doc([("torch fp32", 0.008)]))[0]
    assert lone["vs_ort_fp32"] is None and lone["vs_torch_bf16"] is None
    assert "| n/a | n/a |" in g.render(_doc([("torch fp32", 0.008)]))
    assert g.peaks(_doc([(g.PER_TOKEN, 0.001)]))["int8_gops"] == pytest.approx(2.0)


def test_every_form_runs_at_a_tiny_size_and_writes_its_section(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    g = load_bench("int8_gemm")
    f = tmp_path / "RESULTS.md"
    f.write_text("# Benchmark results\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    assert (
        g.main(["--shape", "8x256x64", "--repeats", "1", "--read-gib", "0.05", "--results", str(f)])
        == 0
    )
    text = f.read_text(encoding="utf-8")
    assert "kept" in text and "<!-- int8-gemm:begin -->" in text
    doc = g.measure((8, 256, 64), threads=1, repeats=1, read_gib=0.05)
    forms = [r["form"] for r in doc["rows"]]
    assert forms[0] == g.REF and g.BF16 in forms and "torch fp32" in forms
    assert sum("MatMulNBits" in x for x in forms) == 4
    assert any("DynamicQuantizeMatMul" in x for x in forms)
    assert any("MatMulInteger +" in x for x in forms) and g.PER_TOKEN in forms
    err = {r["form"]: r["rel_err"] for r in doc["rows"]}
    out = {r["form"]: r["rel_err_outlier"] for r in doc["rows"]}
    # one token 50x: the others keep their precision per token, not per tensor
    dq = next(f for f in forms if "DynamicQuantizeMatMul" in f)
    assert out[g.PER_TOKEN] < 0.05 < out[dq], out
    # the symmetric per-token form: its own row, an outlier token costs only itself too, and on
    # two-sided gaussian rows its error is near the midpoint form's (at 8 rows either may be
    # the smaller: a row's range is set by its two or three largest values)
    assert g.PER_TOKEN_SYMMETRIC in forms and out[g.PER_TOKEN_SYMMETRIC] < 0.05
    # exact reads: 3 of the 8 rows near exact, the others as the plain per-token form
    assert err[g.PER_TOKEN_EXACT] < err[g.PER_TOKEN], err
    assert 0.8 < err[g.PER_TOKEN_SYMMETRIC] / err[g.PER_TOKEN] < 1.2, err
    # the rotated layers compute x @ w too (Rᵀ w stored, x R computed): int8 rounding only
    rotated = [f for f in forms if "input rotated in blocks of" in f]
    assert [f.rsplit(" ", 1)[-1] for f in rotated] == ["64", "128"]
    assert all(err[f] < 0.05 and out[f] < 0.05 for f in rotated), err
    assert out[g.REF] == 0.0
    assert err[g.REF] == 0.0 and err["torch fp32"] < 1e-5
    # 8-bit weights are closer than 4-bit ones; every quantized form is within a few percent
    assert (
        err["onnxruntime MatMulNBits 8-bit block 128 acc 0"]
        < err["onnxruntime MatMulNBits 4-bit block 32 acc 0"]
    )
    # the int8 weights' two forms: the same codes, so the same output where this CPU computes
    # both exactly; the s8 forms (these two rows, DynamicQuantizeMatMul, MatMulInteger) only
    # where its u8·s8 kernel does not saturate (x86 with AVX2 and no VNNI: it does)
    from spotstop.guard.backends._int8_probe import host_int8_weight_forms

    s8_row = "onnxruntime MatMulIntegerToFloat per token, s8 weights"
    u8_row = "onnxruntime MatMulIntegerToFloat per token, u8 weights"
    assert err[u8_row] == pytest.approx(err[g.PER_TOKEN], rel=1e-3)
    s8_ok = "s8" in host_int8_weight_forms()
    if s8_ok:
        assert err[s8_row] == pytest.approx(err[u8_row], rel=1e-3)
    s8_rows = {s8_row, dq, next(f for f in forms if "MatMulInteger +" in f)}
    assert all(e < 0.2 for f, e in err.items() if s8_ok or f not in s8_rows), err
    assert doc["read_gbs"] > 0 and doc["cpu"]["cores"]


def test_the_exact_reads_form_is_the_per_token_form_with_its_read_rows_near_exact() -> None:
    """The layer with exact reads (``PER_TOKEN_EXACT``) computes the rows nobody reads as the
    plain per-token form does, and its last 3 rows (the read ones) far closer to ``x @ w``."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    g = load_bench("int8_gemm")
    rng = np.random.default_rng(3)
    m, k, n = 16, 128, 48
    x = rng.normal(size=(m, k)).astype(np.float32)
    w = rng.normal(size=(k, n)).astype(np.float32)
    got = g._exact_reads_form(w, x, threads=1).run()
    plain = ort.InferenceSession(
        g.per_token_layer(w).SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(["Y"], {"X": x})[0]
    assert got.shape == (m, n)
    np.testing.assert_allclose(got[:-3], plain[:-3], rtol=1e-6, atol=1e-6)
    exact = x.astype(np.float64) @ w
    e_read = np.abs(got[-3:] - exact[-3:]).max()
    e_plain = np.abs(plain[-3:] - exact[-3:]).max()
    # the weights' own rounding (per output channel, nearest) is what is left on the read rows
    from spotstop.export.int8_math import channel_int8

    codes, scales = channel_int8(w)
    w_hat = codes * scales.astype(np.float64)
    e_weights = np.abs(x[-3:].astype(np.float64) @ w_hat - exact[-3:]).max()
    assert e_read < e_plain and e_read < 1.5 * e_weights, (e_read, e_plain, e_weights)
    with pytest.raises(ValueError, match="at least 3 rows"):
        g._exact_reads_form(w, x[:2], threads=1)
