"""export/gptq.py: GPTQ's codes against an independent sequential OBQ computation, its
identities (no error moved when H is the identity: onnxruntime's own bytes), and the recorder
that gives each graph weight its inputs' Hessian."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests._support.tolerance import sum_bound  # noqa: E402


def _obq_reference(w: np.ndarray, h: np.ndarray, bits: int, block: int, damp: float):  # type: ignore[no-untyped-def]
    """GPTQ as Frantar et al. derive it (their Eq. 2/3, Optimal Brain Quantizer order fixed):
    quantize input row i, then move its error onto the rows not yet quantized with the inverse
    of H restricted to those rows, recomputed by a plain matrix inverse at every step (no
    Cholesky, no lazy batches). Float64 throughout. Returns the (K, N) dequantized weight."""
    k, _ = w.shape
    zp, top = 1 << (bits - 1), (1 << bits) - 1
    hd = h.astype(np.float64).copy()
    hd += damp * np.mean(np.diag(hd)) * np.eye(k)
    W = w.astype(np.float64).copy()
    Q = np.zeros_like(W)
    scale = np.zeros(w.shape[1])
    for i in range(k):
        if i % block == 0:
            blk = W[i : i + block]
            idx = np.abs(blk).argmax(axis=0)
            scale = blk[idx, np.arange(blk.shape[1])] / -zp
        safe = np.where(scale == 0, 1.0, scale)
        codes = np.clip(np.round(W[i] / safe) + zp, 0, top)
        Q[i] = (codes - zp) * scale
        hinv = np.linalg.inv(hd[i:, i:])
        err = (W[i] - Q[i]) / hinv[0, 0]
        W[i:] -= np.outer(hinv[0, :], err)
    return Q


def _correlated(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    x = rng.standard_normal((n, k)) @ rng.standard_normal((k, k)) * 0.3 + rng.standard_normal(k)
    return x.astype(np.float32)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    ("k", "block"),
    # blocks inside one lazy batch of 128; blocks that do not divide it (one straddles the
    # first batch's end); one block of all K rows, cut into batches
    [(96, 32), (192, 48), (300, 300)],
)
def test_gptq_equals_the_sequential_obq_computation(bits: int, k: int, block: int) -> None:
    from spotstop.export.gptq import gptq_nbits
    from spotstop.export.nbits import dequantize_nbits

    rng = np.random.default_rng(7)
    n = 24
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = _correlated(rng, 400, k)
    h = (x.T @ x).astype(np.float64)
    packed, scales = gptq_nbits(w, h, bits, block)
    got = dequantize_nbits(packed, scales, bits, k)
    want = _obq_reference(w, h, bits, block, 0.01)
    # both in float64 (ours rounds each scale to float32, as the runtime holds it): every code
    # agrees, the values within that scale rounding
    close = np.isclose(got, want, rtol=0, atol=1e-6)
    assert close.all(), close.mean()


@pytest.mark.parametrize(("k", "n", "block", "bits"), [(512, 256, 512, 8), (300, 64, 32, 4)])
def test_gptq_writes_the_same_bytes_on_any_thread_count(
    k: int, n: int, block: int, bits: int
) -> None:
    """GPTQ moves each row's rounding error onto every row after it, so a last-bit difference
    of a threaded product flips later codes: in float32 the 512 x 256 layer below had 222 codes
    differ between 1 and 2 torch threads. In float64 the bytes are the same."""
    from spotstop.export.gptq import gptq_nbits

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    x = _correlated(rng, 4 * k, k)
    h = x.astype(np.float64).T @ x.astype(np.float64)
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got.append(gptq_nbits(w, h, bits, block))
    finally:
        torch.set_num_threads(before)
    (p1, s1), (p2, s2) = got
    assert np.array_equal(p1, p2) and np.array_equal(s1, s2)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("k", [300, 256])
def test_identity_hessian_is_onnxruntimes_rounding_byte_for_byte(bits: int, k: int) -> None:
    """With H = I no error is moved: the codes, scales and bytes (padding included) are those
    onnxruntime's own MatMulNBits kernel writes."""
    from spotstop.export.gptq import gptq_nbits
    from spotstop.export.nbits import nbits_blocks

    w = (np.random.default_rng(1).standard_normal((k, 40)) * 0.02).astype(np.float32)
    p0, s0 = nbits_blocks(w, bits, 128)
    p1, s1 = gptq_nbits(w, np.eye(k), bits, 128, damp=0.0)
    assert p0.shape == p1.shape and np.array_equal(p0, p1)
    assert np.array_equal(s0, s1)


@pytest.mark.parametrize("bits", [8, 4])
def test_gptq_lowers_the_output_error_on_its_inputs(bits: int) -> None:
    from spotstop.export.gptq import gptq_nbits
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks

    rng = np.random.default_rng(3)
    k, n = 256, 64
    w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    x = _correlated(rng, 1000, k)
    rtn = dequantize_nbits(*nbits_blocks(w, bits, 128), bits, k)
    gq = dequantize_nbits(*gptq_nbits(w, x.T @ x, bits, 128), bits, k)
    e_rtn, e_gq = np.linalg.norm(x @ (rtn - w)), np.linalg.norm(x @ (gq - w))
    assert e_gq < 0.8 * e_rtn


def test_unreached_rows_and_bad_hessians() -> None:
    from spotstop.export.gptq import gptq_nbits
    from spotstop.export.nbits import nbits_blocks

    w = (np.random.default_rng(2).standard_normal((128, 8)) * 0.02).astype(np.float32)
    h = np.zeros((128, 128))  # no calibration input reached any row: plain rounding
    p, s = gptq_nbits(w, h, 8, 128)
    p0, s0 = nbits_blocks(w, 8, 128)
    assert np.array_equal(p, p0) and np.array_equal(s, s0)
    with pytest.raises(ValueError, match="Hessian is"):
        gptq_nbits(w, np.eye(64), 8, 128)
    with pytest.raises(ValueError, match="bits"):
        gptq_nbits(w, np.eye(128), 3, 128)


def test_recorder_gives_each_graph_weight_its_inputs_hessian(tmp_path: Path) -> None:
    """Linears reading one tensor share a file; the graph's (K, N) weight finds its Linear by
    value; the Hessian is XᵀX of the inputs seen (every n-th batch row under ``stride``)."""
    from spotstop.export.gptq import CalibrationInputs, InputRecorder

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = torch.nn.Linear(16, 8)
            self.k = torch.nn.Linear(16, 8)
            self.o = torch.nn.Linear(8, 4, bias=False)
            self.unused = torch.nn.Linear(4, 4)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.o(self.q(x) * self.k(x))

    net = Net().eval()
    xs = [torch.randn(3, 5, 16), torch.randn(3, 7, 16)]
    with torch.inference_mode(), InputRecorder(net, tmp_path / "calib") as rec:
        for x in xs:
            rec.new_pass()
            with rec.stride(3):  # one row of each batch of three
                net(x)
    cal = CalibrationInputs(tmp_path / "calib")
    assert len(cal.index) == 3  # q, k, o; the unused Linear recorded nothing
    files = {e["linear"]: e["file"] for e in cal.index.values()}
    assert files["q"] == files["k"] != files["o"]
    rows = torch.cat([x[0] for x in xs]).double().numpy()
    want_q = rows.T @ rows
    got_q = cal.hessian(net.q.weight.detach().numpy().T)
    # XᵀX of the recorded float32 rows, summed in float64 by the CPU's GEMM (in its own order)
    # against float64 in another order: within twice the rounding bound of a float64 sum over
    # the rows, elementwise (an entry that cancels to near 0 has no relative accuracy)
    assert got_q is not None
    size = np.abs(rows).T @ np.abs(rows)
    bound = 2 * sum_bound(len(rows), size, np.float64)
    assert np.all(np.abs(got_q - want_q) <= bound), np.max(np.abs(got_q - want_q) / bound)
    assert cal.hessian(net.k.weight.detach().numpy().T) is got_q  # shared, computed once
    with torch.no_grad():
        mid = net.q(torch.cat([x[:1] for x in xs], 1)) * net.k(torch.cat([x[:1] for x in xs], 1))
    mid_rows = mid.reshape(-1, 8).double().numpy()
    np.testing.assert_allclose(
        cal.hessian(net.o.weight.detach().numpy().T), mid_rows.T @ mid_rows, rtol=1e-4
    )
    assert cal.hessian(np.zeros((16, 8), np.float32)) is None  # no Linear has this weight
    assert (cal.used, cal.missed) == (3, 1) and cal.tokens == 12


def test_export_quantizes_by_gptq_and_records_it(tiny_pair: Path, tmp_path: Path) -> None:
    """An int8 export calibrates on generated scenes and chooses most weights' codes by GPTQ
    (other bytes than round-to-nearest's, same operator and shapes); ``quantizer="rtn"`` gives
    onnxruntime's rounding; both record what they did and validate."""
    import onnx
    import yaml
    from onnx import numpy_helper
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8-nbits", "buckets": [256], "name": "tiny-lfm2_vl"}
    gq = export_member(src, tmp_path / "gptq", calibration_scenes=2, **kw)  # type: ignore[arg-type]
    rn = export_member(src, tmp_path / "rtn", quantizer="rtn", **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in gq.checks) and all(c.ok for c in rn.checks)
    assert gq.quantizer is not None and rn.quantizer is not None
    assert gq.quantizer["method"] == "gptq" and rn.quantizer["method"] == "rtn"
    cal = gq.quantizer["calibration"]
    assert cal["scenes"] == 2 and cal["seed"] == 1 and cal["tokens"] > 0
    w = gq.quantizer["weights"]
    assert w["gptq"] > 0 and w["gptq"] > 5 * w["round_to_nearest"]
    assert "calibration" not in rn.quantizer
    on_disk = yaml.safe_load((tmp_path / "gptq" / "spotstop_onnx.yaml").read_text())
    assert on_disk["quantizer"] == dict(gq.quantizer)

    def codes(folder: Path) -> dict[str, np.ndarray]:
        m = onnx.load(str(folder / "onnx" / "decoder.onnx"))
        return {
            t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name.endswith("_Q8")
        }

    a, b = codes(tmp_path / "gptq"), codes(tmp_path / "rtn")
    assert a.keys() == b.keys() and a
    assert all(a[k].shape == b[k].shape for k in a)
    differ = sum(not np.array_equal(a[k], b[k]) for k in a)
    assert differ >= len(a) - w["round_to_nearest"] - 1  # the head, when not called as a Linear


def test_an_int8_export_writes_the_same_files_on_any_thread_count(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """The whole calibrated int8 export (recorded inputs, Hessians, GPTQ, smoothing, the keep
    rule, the vision rule) of one member on 1 and on 2 torch threads: the same graph files,
    byte for byte (with float32 GPTQ the vision graph's weights differed)."""
    from spotstop.export.onnx import export_member

    src = tiny_pair / "tiny-lfm2_vl"
    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl", "calibration_scenes": 2}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            export_member(src, tmp_path / str(threads), **kw)  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(before)
    files = sorted(f.name for f in (tmp_path / "1" / "onnx").iterdir())
    assert "vision.onnx.data" in files and "decoder.onnx.data" in files
    assert files == sorted(f.name for f in (tmp_path / "2" / "onnx").iterdir())
    differ = [
        f
        for f in files
        if (tmp_path / "1" / "onnx" / f).read_bytes() != (tmp_path / "2" / "onnx" / f).read_bytes()
    ]
    assert not differ


#: the CPU kernels of another machine, on this one: torch's vectorised operators without SIMD,
#: MKL, oneDNN and OpenBLAS at SSE4 (every x86 machine runs these, so the two runs differ)
_OTHER_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OPENBLAS_CORETYPE": "Nehalem",
}


def test_an_int8_export_gives_the_same_codes_on_other_cpu_kernels(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """The int8 export of one member in two processes, one on this CPU's own kernels, one on
    scalar / SSE4 kernels (what another CPU computes differs in the last bits of its float32
    sums): every code the same, every float32 value within a few float32 ulps (a scale GPTQ
    sets from weights it has updated may move one ulp). With float32 GPTQ the same pair of runs
    on the trained tiny pair gave other weights in three of four graphs (docs/export.md)."""
    import os
    import subprocess
    import sys

    import onnx
    from onnx import numpy_helper

    code = (
        "import sys; from spotstop.export.onnx import export_member; "
        "export_member(sys.argv[1], sys.argv[2], precision='int8', buckets=[256], "
        "name='tiny-lfm2_vl', calibration_scenes=2)"
    )
    src = str(tiny_pair / "tiny-lfm2_vl")
    for name, extra in (("own", {}), ("other", _OTHER_KERNELS)):
        env = {k: v for k, v in os.environ.items() if k not in _OTHER_KERNELS} | extra
        proc = subprocess.run(
            [sys.executable, "-c", code, src, str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    def tensors(folder: Path) -> dict[str, np.ndarray]:
        out = {}
        for graph in ("vision.onnx", "decoder.onnx"):
            m = onnx.load(str(folder / "onnx" / graph))
            out |= {f"{graph}:{t.name}": numpy_helper.to_array(t) for t in m.graph.initializer}
        return out

    a, b = tensors(tmp_path / "own"), tensors(tmp_path / "other")
    assert a.keys() == b.keys()
    codes = [k for k in a if a[k].dtype.kind in "iu"]
    floats = [k for k in a if a[k].dtype.kind == "f"]
    assert any(k.endswith("_int8") for k in codes)  # int8 GEMM codes are among them
    assert [k for k in codes if not np.array_equal(a[k], b[k])] == []
    ulps = 4 * np.finfo(np.float32).eps
    moved = [k for k in floats if not np.allclose(a[k], b[k], rtol=ulps, atol=0)]
    assert moved == []


def test_quantizer_is_checked_before_anything_is_written(tiny_pair: Path, tmp_path: Path) -> None:
    from spotstop.export.onnx import export_member
    from spotstop.export.onnx_bundle import write_onnx_bundle

    src = tiny_pair / "tiny-lfm2_vl"
    with pytest.raises(ValueError, match="quantizer must be one of"):
        export_member(src, tmp_path / "m", precision="int8", quantizer="awq")
    with pytest.raises(ValueError, match="calibration_scenes"):
        write_onnx_bundle([src], tmp_path / "b", precision="int8", calibration_scenes=0)
    assert not (tmp_path / "m").exists() and not (tmp_path / "b").exists()


def _frames(root: Path, n: int) -> Path:
    """A scene table of ``n`` frames, as a deployment writes one (image,request rows)."""
    from tests._support.images import make_image_bytes

    (root / "img").mkdir(parents=True)
    rows = ["image,request"]
    for i in range(n):
        (root / "img" / f"{i}.png").write_bytes(make_image_bytes(100 + i, (96, 64)))
        rows.append(f"img/{i}.png,hand me cup {i}")
    (root / "frames.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root / "frames.csv"


def test_calibration_set_draws_the_frames_and_records_them(tmp_path: Path) -> None:
    """Without frames: the generated scenes of CALIBRATION_SEED. With a table: N of its rows
    drawn without replacement by that seed (all of them when it has fewer), the same every
    time, and the record names the table by its bytes."""
    import hashlib

    from spotstop.export.gptq import CALIBRATION_SEED, calibration_set
    from spotstop.export.scenes import demo_scenes

    gen, rec = calibration_set(3)
    assert rec == {"source": "generated", "scenes": 3, "seed": CALIBRATION_SEED}
    assert [s.image for s in gen] == [s.image for s in demo_scenes(3, seed=CALIBRATION_SEED)]
    table = _frames(tmp_path, 10)
    got, rec = calibration_set(4, table)
    again, _ = calibration_set(4, table)
    rows = rec["rows"]
    assert len(rows) == len(set(rows)) == 4 and rows == sorted(rows) and max(rows) < 10
    assert [s.request for s in got] == [f"hand me cup {i}" for i in rows]
    assert [s.image.sha256 for s in got] == [s.image.sha256 for s in again]
    assert rec["table_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert (rec["source"], rec["scenes"], rec["table_rows"]) == ("frames", 4, 10)
    few, rec = calibration_set(50, table)
    assert rec["rows"] == list(range(10)) and len(few) == 10
    with pytest.raises(ValueError, match="at least 1"):
        calibration_set(0, table)


def test_export_calibrates_on_the_deployments_frames(
    tiny_pair: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calibration_frames``: GPTQ records the Linears' inputs on the table's frames, so the
    codes differ from the generated scenes'; the manifest records the table; a bad table or a
    precision that does not calibrate is refused before anything is written."""
    import onnx
    from onnx import numpy_helper
    from spotstop.export.onnx import export_member
    from spotstop.export.onnx_bundle import write_onnx_bundle
    from spotstop.guard import GuardError

    src = tiny_pair / "tiny-lfm2_vl"
    table = _frames(tmp_path / "t", 6)
    kw = {"precision": "int8-nbits", "buckets": [256], "name": "tiny-lfm2_vl"}
    gen = export_member(src, tmp_path / "gen", calibration_scenes=2, **kw)  # type: ignore[arg-type]
    fr = export_member(
        src,
        tmp_path / "fr",
        calibration_scenes=2,
        calibration_frames=table,
        **kw,  # type: ignore[arg-type]
    )
    assert all(c.ok for c in fr.checks)
    cal = fr.quantizer["calibration"]  # type: ignore[index]
    assert cal["source"] == "frames" and cal["table"] == "frames.csv" and len(cal["rows"]) == 2
    assert gen.quantizer["calibration"]["source"] == "generated"  # type: ignore[index]

    def codes(folder: Path) -> dict[str, np.ndarray]:
        m = onnx.load(str(folder / "onnx" / "decoder.onnx"))
        return {
            t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name.endswith("_Q8")
        }

    a, b = codes(tmp_path / "gen"), codes(tmp_path / "fr")
    assert a.keys() == b.keys() and sum(not np.array_equal(a[k], b[k]) for k in a) > len(a) // 2
    with pytest.raises(ValueError, match="calibration frames are read by the 'gptq'"):
        export_member(src, tmp_path / "x", precision="fp32", calibration_frames=table)
    with pytest.raises(ValueError, match="calibration frames are read by the 'gptq'"):
        export_member(src, tmp_path / "x", quantizer="rtn", calibration_frames=table, **kw)  # type: ignore[arg-type]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("an earlier bundle")
    with pytest.raises(GuardError, match=r"not a folder of images or a \.csv file"):
        write_onnx_bundle([src], tmp_path / "b", calibration_frames=tmp_path / "none.csv")
    assert (tmp_path / "b" / "keep.txt").exists() and not (tmp_path / "x").exists()
    from spotstop.cli import main

    (tmp_path / "bad.csv").write_text("image,request\nimg/nope.png,go\n")
    args = ["export", "--member", str(src), "--out", str(tmp_path / "b"), "--precision", "int8"]
    assert main([*args, "--calibration-frames", str(tmp_path / "bad.csv")]) == 2
    err = capsys.readouterr().err
    assert "--calibration-frames: " in err and "row 1" in err and "does not exist" in err
    assert (tmp_path / "b" / "keep.txt").exists()
