"""A large member's streamed export (export/memory.py, export_member(streamed=...)).

The real pair (8 and 12 GiB of float32 weights) is exported streamed; here the tiny pair is
forced through the same path and must give the same graphs' answers as the in-memory export.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests._support.pair import by_arch


def test_is_large_counts_float32_bytes_without_memory() -> None:
    torch = pytest.importorskip("torch")
    from spotstop.export.memory import LARGE_BYTES, fp32_weight_bytes, is_large

    small = torch.nn.Linear(1000, 1000, device="meta")  # 1,001,000 parameters
    assert fp32_weight_bytes(small) == 4 * 1_001_000
    assert not is_large(small)
    big = torch.nn.Linear(32_768, 16_384, bias=False, device="meta")  # exactly 2 GiB
    assert fp32_weight_bytes(big) == LARGE_BYTES and not is_large(big)
    bigger = torch.nn.Linear(32_768, 16_385, bias=False, device="meta")
    assert is_large(bigger)


def _peak_resettable() -> bool:
    """Whether an export here reports its own peak RSS (else it reports None, by design)."""
    from spotstop.export.memory import reset_peak_rss

    return reset_peak_rss()


def _touched_block(nbytes: int) -> mmap.mmap:
    """An anonymous mapping with every page written: resident until ``close()`` unmaps it.

    Not a numpy array: whether malloc hands a freed block back to the OS is the
    allocator's choice (CI once kept it), and this test is about the peak, not malloc.
    """
    block = mmap.mmap(-1, nbytes)
    page = b"\x01" * mmap.PAGESIZE
    for off in range(0, nbytes, mmap.PAGESIZE):
        block[off : off + mmap.PAGESIZE] = page
    return block


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_peak_rss_is_reset_and_grows_with_an_allocation() -> None:
    from spotstop.export.memory import peak_rss_bytes, reset_peak_rss

    if not reset_peak_rss():
        pytest.skip("this kernel ignores clear_refs (reset_peak_rss reads that back)")
    before = peak_rss_bytes()
    assert before is not None
    block = _touched_block(64 * 2**20)
    grown = peak_rss_bytes()
    assert grown is not None and grown - before >= 60 * 2**20
    block.close()  # munmap: the 64 MiB leave the RSS
    assert reset_peak_rss()
    after = peak_rss_bytes()
    assert after is not None and grown - after >= 48 * 2**20


def test_a_reset_the_kernel_ignored_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.export import memory

    clear_refs, status = tmp_path / "clear_refs", tmp_path / "status"
    monkeypatch.setattr(memory, "_CLEAR_REFS", clear_refs)
    monkeypatch.setattr(memory, "_STATUS", status)
    clear_refs.write_text("")
    # the write is accepted but the peak still stands 900 MiB above the current RSS
    status.write_text("Name:\tpython\nVmHWM:\t 1048576 kB\nVmRSS:\t  126976 kB\n")
    assert memory.reset_peak_rss() is False
    assert memory.peak_rss_bytes() == 1048576 * 1024
    # a reset that took effect: the peak is the current RSS (a concurrent free within slack)
    status.write_text("VmHWM:\t  130000 kB\nVmRSS:\t  126976 kB\n")
    assert memory.reset_peak_rss() is True
    # no clear_refs (not Linux, or no /proc): no reset, no peak
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "absent" / "clear_refs")
    monkeypatch.setattr(memory, "_STATUS", tmp_path / "absent" / "status")
    assert memory.reset_peak_rss() is False and memory.peak_rss_bytes() is None


def _scores(folder: Path, name: str, template: object) -> np.ndarray:
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import load_member

    m = load_member(folder, name=name, backend="onnx", template=template)  # type: ignore[arg-type]
    scenes = demo_scenes(4, seed=3)
    return np.array([r.score for v in ("scene", "text") for r in m.score(scenes, v)])


def _quantized(folder: Path) -> list[tuple[str, str]]:
    """(op, sha256 of each quantized weight input) of every int8 node of the member's graphs."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    out = []
    for f in sorted((folder / "onnx").glob("*.onnx")):
        g = onnx.load(str(f)).graph
        inits = {t.name: t for t in g.initializer}
        for n in g.node:
            # the codes and scales (MatMulIntegerToFloat: codes, activation scale 1, scales)
            quantized = {"MatMulIntegerToFloat": 4, "DynamicQuantizeMatMul": 3, "MatMulNBits": 3}
            for i in n.input[1 : quantized.get(n.op_type, 1)]:
                arr = numpy_helper.to_array(inits[i])
                out.append((n.op_type, hashlib.sha256(arr.tobytes()).hexdigest()))
    return sorted(out)


@pytest.mark.parametrize("arch", by_arch(bundle=True))
def test_streamed_export_answers_as_the_in_memory_one(
    arch: str, tiny_pair: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.export import onnx as export_onnx
    from spotstop.export.configs import get_export_config
    from spotstop.export.onnx import export_member

    src = tiny_pair / f"tiny-{arch}"
    # weight-only and rounded to nearest, so the weights compare byte for byte (without the
    # calibration scenes int8's keep rule cannot measure, and the random tiny Qwen3.5 member's
    # int8 scores then moved 0.29 > 0.25): GPTQ's codes follow the
    # recorded calibration rows, which the recorder does not reproduce bit for bit from run to
    # run, and the sets smoothing joins follow each exporter's producers (constant folding);
    # the default streamed export (GPTQ, smoothed) is checked below
    kw = {"precision": "int8-nbits", "buckets": [256], "name": f"tiny-{arch}", "quantizer": "rtn"}
    mem = export_member(src, tmp_path / "mem", streamed=False, **kw)  # type: ignore[arg-type]
    st = export_member(src, tmp_path / "st", streamed=True, **kw)  # type: ignore[arg-type]
    assert not mem.streamed and st.streamed
    assert (tmp_path / "st" / "onnx" / "decoder.onnx.data").is_file()
    # streamed: validated at int8 only; in memory: fp32 first, then int8
    assert {c.case for c in st.checks} <= {c.case for c in mem.checks}
    assert all(c.ok for c in st.checks)
    # the same int8 weights (the transposes folded in the graph instead of by the exporter):
    # every quantized array of one is in the other, byte for byte
    # (in memory, the exporter folds LFM2-VL's resized position table into a constant that
    # the rounding quantizes too: one weight, codes and scales, the streamed graph computes)
    st_q, mem_q = Counter(_quantized(tmp_path / "st")), Counter(_quantized(tmp_path / "mem"))
    assert not st_q - mem_q and sum((mem_q - st_q).values()) <= 2
    # the fused form's rewrite after the conversion runs on the streamed graphs too
    # (export/gelu.py): each vision MLP's tanh GELU as FastGelu, the projector's erf as Gelu
    from spotstop.guard.validate import load_yaml

    ops = [
        load_yaml((tmp_path / d / "spotstop_onnx.yaml").read_text(), source=d)["fused_ops"]
        for d in ("mem", "st")
    ]
    assert ops[0] == ops[1]
    assert (ops[1]["vision"]["FastGelu"], ops[1]["vision"]["Gelu"]) == (2, 1)
    # the scores: within int8's tolerance (not float rounding: int8 activations are rounded
    # per call, and a float difference of 1e-7 between the two graphs can move one code)
    a = _scores(tmp_path / "mem", f"tiny-{arch}", mem.template)
    b = _scores(tmp_path / "st", f"tiny-{arch}", st.template)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    tol = get_export_config(arch).score_atol["int8-nbits"]
    np.testing.assert_allclose(b, a, atol=tol, rtol=0)
    # a streamed export with GPTQ and SmoothQuant validates
    kw.pop("quantizer")
    kw["precision"] = "int8"
    opened: list[str] = []  # every graph onnxruntime opens during the export
    session = export_onnx._session
    monkeypatch.setattr(export_onnx, "_session", lambda m: opened.append(str(m)) or session(m))
    sm = export_member(src, tmp_path / "sm", streamed=True, smooth_alpha=0.5, **kw)  # type: ignore[arg-type]
    assert all(c.ok for c in sm.checks)  # every output against torch at int8's tolerances
    assert sm.quantizer is not None and sm.quantizer["dynamic_int8"]["smoothed_inputs"] > 0
    # the vision graph's int8 activations were measured in the streamed path too
    # (export/onnx.py's _vision_moves), against the torch model the export holds anyway: no
    # float32 decoder (nor vision) session is opened beside it (at Qwen3.5-2B's size one
    # held the decoder's weights twice, 20.66 GiB), only the converted graphs in the stage
    assert sm.quantizer["dynamic_int8"]["vision_activations"]["scenes"] > 0
    assert opened and all(Path(p).parent.name == "stage" for p in opened), opened
    if _peak_resettable():
        assert st.peak_rss_bytes is not None and st.peak_rss_bytes > 100 * 2**20


def test_export_json_reports_each_member(tiny_pair: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from spotstop.cli import main

    out = tmp_path / "b"
    rc = main(
        [
            "export",
            "--member",
            str(tiny_pair / "tiny-lfm2_vl"),
            "--out",
            str(out),
            "--precision",
            "int8",
            "--buckets",
            "256",
            "--trt",
            "off",
            "--json",
        ]
    )
    assert rc == 0
    j = json.loads(capsys.readouterr().out)
    assert j["precision"] == "int8" and Path(j["bundle"]) == out
    [m] = j["members"]
    assert m["name"] == "tiny-lfm2_vl" and m["streamed"] is False
    assert m["seconds"] > 0 and m["weight_bytes"] > 0 and m["visual_tokens"] > 0
    if _peak_resettable():
        assert m["peak_rss_bytes"] > 0


def test_validation_error_survives_a_process_boundary() -> None:
    import pickle

    from spotstop.export.onnx import ExportValidationError

    e = pickle.loads(pickle.dumps(ExportValidationError("m", ["a > b", "c > d"])))
    assert isinstance(e, ExportValidationError) and e.member == "m"
    assert e.failures == ["a > b", "c > d"] and "2 failure(s)" in str(e)


def test_folder_fp32_bytes_counts_the_safetensors_headers(tiny_pair: Path) -> None:
    torch = pytest.importorskip("torch")
    from spotstop.export.memory import folder_fp32_bytes
    from transformers import AutoModelForImageTextToText

    folder = tiny_pair / "tiny-lfm2_vl"
    model = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32)
    n = sum(p.numel() for p in model.parameters())  # a tied table counted once, as stored
    assert folder_fp32_bytes(folder) == 4 * n


def test_a_large_member_exports_in_its_own_process(tiny_pair: Path, tmp_path: Path) -> None:
    """write_onnx_bundle exports a large member in a spawned process (its memory returned
    when it ends); the result comes back whole."""
    from spotstop.export.onnx_bundle import _export_in_child

    kw = {"precision": "int8", "buckets": [256], "name": "tiny-lfm2_vl"}
    e = _export_in_child(tiny_pair / "tiny-lfm2_vl", tmp_path / "m", kw)
    assert e.name == "tiny-lfm2_vl" and e.precision == "int8" and e.checks
    assert all(c.ok for c in e.checks)
    assert (tmp_path / "m" / "onnx" / "decoder.onnx").is_file()
    if _peak_resettable():  # the child's own peak, not this process's
        assert e.peak_rss_bytes is not None and e.peak_rss_bytes > 50 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_a_member_export_child_ends_with_its_parent(tmp_path: Path) -> None:
    """A killed ``spotstop export`` leaves no orphaned member export: the spawned child arms
    ``die_with_parent`` and ends when its parent is SIGKILLed."""
    import signal
    import subprocess
    import time

    script = tmp_path / "parent.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(
        "import multiprocessing, os, sys, time\n"
        "def child(path):\n"
        "    from spotstop.export.onnx_bundle import die_with_parent\n"
        "    die_with_parent()\n"
        "    open(path, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        "    p = ctx.Process(target=child, args=(sys.argv[1],))\n"
        "    p.start()\n"
        "    time.sleep(120)\n",
        encoding="utf-8",
    )
    parent = subprocess.Popen([sys.executable, str(script), str(pidfile)])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pidfile.read_text())
        os.kill(child, 0)  # alive while its parent is
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)

        def alive(pid: int) -> bool:  # a zombie (ended, not yet reaped) counts as ended
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                return False
            return "\nState:\tZ" not in status

        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(child):
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its parent")
    finally:
        parent.kill()


def test_an_export_removes_the_temporary_folders_of_killed_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed export's temporary folder (21 GB at Qwen3.5-2B's size) filled the disk of the
    next export: the next export removes those of processes that are gone, and no other."""
    import subprocess
    import tempfile

    from spotstop.export.onnx import _export_tmp

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    gone = tmp_path / f"spotstop-export-{ended.pid}-abc123"
    alive = tmp_path / f"spotstop-export-{os.getppid()}-def456"
    unnamed = tmp_path / "spotstop-export-ghi789"  # (an older spotstop's: whose, unknown)
    for d in (gone, alive, unnamed):
        (d / "stage").mkdir(parents=True)
    new = _export_tmp()
    assert not gone.exists() and alive.is_dir() and unnamed.is_dir()
    assert new.parent == tmp_path and new.name.startswith(f"spotstop-export-{os.getpid()}-")
