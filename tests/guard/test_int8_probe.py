"""The int8 host probe (guard/backends/_int8_probe.py): an x86 CPU with AVX2 and no VNNI adds
two u8·s8 products into a saturating int16, so an int8 member with int8 (``s8``) weights would
score wrongly there; the ONNX backend refuses such a member on such a host, and the export
writes the form the host computes exactly (``u8``: the same codes offset to uint8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from spotstop.guard import Guard, MemberLoadError
from spotstop.guard.backends import _int8_probe, _onnx
from spotstop.guard.backends._int8_probe import (
    A_ZERO,
    INT8_WEIGHT_FORMS,
    PROBE_FILE,
    W_ZERO,
    forms_exact,
    host_int8_weight_forms,
    probe_activations,
    probe_weights,
)
from spotstop.guard.backends._onnx import check_int8_host

from tests._support.guard import make_scene


def _vpmaddubsw_gemm(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The AVX2 u8·s8 kernel's arithmetic, written out: along K, each two neighbouring u8·s8
    products are added into an int16 that saturates (``vpmaddubsw``), those sums are added in
    int32, and the activation zero point's term ``128 · Σ w`` is taken off after."""
    prod = a.astype(np.int64)[:, :, None] * w.astype(np.int64)[None, :, :]  # (M, K, N)
    pairs = np.clip(prod[:, 0::2] + prod[:, 1::2], -32768, 32767)
    return (pairs.sum(axis=1) - A_ZERO * w.astype(np.int64).sum(axis=0)).astype(np.float32)


def _exact(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return ((a.astype(np.int64) - A_ZERO) @ w.astype(np.int64)).astype(np.float32)


def test_the_probe_tells_a_saturating_kernel_from_an_exact_one() -> None:
    a, w = probe_activations(), probe_weights()
    assert a.dtype == np.uint8 and (a.min(), a.max()) == (0, 255)
    assert w.dtype == np.int8 and (w.min(), w.max()) == (-128, 127)
    exact = _exact(a, w)
    assert forms_exact({"s8": exact, "u8": exact}) == {"s8": True, "u8": True}
    sat = _vpmaddubsw_gemm(a, w)
    assert np.abs(sat - exact).max() > 1e4  # the probe's worst cases do saturate
    assert forms_exact({"s8": sat, "u8": exact}) == {"s8": False, "u8": True}
    bad = exact.copy()
    bad[3, 2] += 1  # one product off by one
    assert forms_exact({"s8": exact, "u8": bad}) == {"s8": True, "u8": False}
    with pytest.raises(ValueError, match=r"the probe's u8 output is \(8, 3\)"):
        forms_exact({"s8": exact, "u8": exact[:, :3]})


def test_the_shipped_probe_graph_is_the_exports_model() -> None:
    pytest.importorskip("onnx")
    from spotstop.export.int8_graph import int8_probe_model

    assert PROBE_FILE.read_bytes() == int8_probe_model().SerializeToString(), (
        "guard/backends/int8_gemm_probe.onnx is stale: python -m spotstop.export.int8_graph --write-probe"
    )


def test_this_host_multiplies_the_u8_form_exactly() -> None:
    """The u8·u8 kernel widens before it multiplies: exact on every CPU, so an export always
    has a form to write, and s8 first where both are exact."""
    host_int8_weight_forms.cache_clear()
    forms = host_int8_weight_forms()
    assert "u8" in forms and forms == tuple(f for f in INT8_WEIGHT_FORMS if f in forms)


def test_stored_codes_are_the_same_codes_in_both_forms() -> None:
    pytest.importorskip("onnx")
    from spotstop.export.int8_math import graph_codes, stored_codes

    codes = probe_weights()
    s8, u8 = stored_codes(codes, "s8"), stored_codes(codes, "u8")
    assert s8.dtype == np.int8 and u8.dtype == np.uint8
    np.testing.assert_array_equal(u8.astype(np.int64) - W_ZERO, codes)
    np.testing.assert_array_equal(graph_codes(u8), codes)
    np.testing.assert_array_equal(graph_codes(s8), codes)
    with pytest.raises(ValueError, match="must be one of"):
        stored_codes(codes, "s4")
    with pytest.raises(ValueError, match="int8 or uint8"):
        graph_codes(codes.astype(np.int16))


def _meta(form: object = None, dynamic: int = 12) -> dict:
    d: dict = {"dynamic": dynamic, "activations": "per-token"}
    if form is not None:
        d["weight_form"] = form
    return {"precision": "int8", "quantizer": {"dynamic_int8": d}}


@pytest.mark.parametrize("host", [("s8", "u8"), ("u8",), ()])
def test_a_member_the_host_would_saturate_is_refused(
    monkeypatch: pytest.MonkeyPatch, host: tuple[str, ...]
) -> None:
    monkeypatch.setattr(_onnx, "host_int8_weight_forms", lambda: host)
    where = Path("members/m")
    for form in ("s8", None):  # None: a bundle from before the record: int8 weights
        if "s8" in host:
            check_int8_host(_meta(form), where)
        else:
            with pytest.raises(MemberLoadError, match=r"in the s8 form.*--int8-weights u8"):
                check_int8_host(_meta(form), where)
    if "u8" in host:
        check_int8_host(_meta("u8"), where)
    else:
        with pytest.raises(MemberLoadError, match="exact in no form"):
            check_int8_host(_meta("u8"), where)
    # no integer GEMM (fp32, int4, int8 with float activations everywhere): nothing to check
    check_int8_host(_meta("s8", dynamic=0), where)
    check_int8_host({"precision": "fp32"}, where)
    with pytest.raises(MemberLoadError, match=r"weight_form is 's4'.*copy the bundle again"):
        check_int8_host(_meta("s4"), where)


def test_a_guard_on_a_host_that_would_saturate_refuses_the_member(
    committed_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed fp32 pair converted to int8 here: its manifests record the form this host
    multiplies exactly, and it scores. On a host that would saturate it, no member opens a
    graph: loading one raises the reason, and a guard answers every check UNSAFE, fail-closed,
    with it."""
    pytest.importorskip("onnx")
    from spotstop.export.onnx_bundle import derive_bundle
    from spotstop.guard import load_bundle
    from spotstop.guard._member import load_bundle_member

    from tests._support.make_bundle import fit_policy

    bundle = derive_bundle(committed_bundle, tmp_path / "b8", precision="int8")
    metas = sorted(bundle.glob("members/*/spotstop_onnx.yaml"))
    forms = {
        yaml.safe_load(p.read_text())["quantizer"]["dynamic_int8"]["weight_form"] for p in metas
    }
    assert len(metas) == 2 and forms == {host_int8_weight_forms()[0]}
    fit_policy(bundle)  # scores a pool with both members: they load and run here
    with Guard(bundle, log=tmp_path / "ok.sqlite", retry_load_s=None) as g:
        assert not g.check(make_scene(0)).fail_closed

    monkeypatch.setattr(_onnx, "host_int8_weight_forms", lambda: ())
    opened: list[str] = []
    monkeypatch.setattr(_onnx.OnnxBackend, "_session", lambda self, p, k: opened.append(k))
    b = load_bundle(bundle)
    with pytest.raises(MemberLoadError, match=r"does not compute exactly.*Refusing it"):
        load_bundle_member(b, b.members[0])
    with Guard(bundle, log=tmp_path / "refused.sqlite", retry_load_s=None) as g:
        d = g.check(make_scene(0))
    assert d.fail_closed and d.label == "UNSAFE"
    assert "does not compute exactly" in (d.fail_reason or "")
    assert opened == []


def test_the_probe_module_needs_no_export_extra() -> None:
    """The robot's install has numpy and onnxruntime, not onnx: the probe imports neither onnx
    nor torch."""
    src = Path(_int8_probe.__file__).read_text()
    assert "import onnx\n" not in src and "from onnx" not in src and "torch" not in src
