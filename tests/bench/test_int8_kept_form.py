"""bench/int8_kept_form.py on a tiny int8 bundle with kept layers: each copy is a bundle the
guard loads (its id names its new content), with the kept layers in the form it names and
everything else as exported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spotstop.guard.validate import load_yaml

from tests._support.bench import load_bench


@pytest.fixture(scope="module")
def kept_bundle(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LFM2-VL member at int8 with a keep bound under most layers' error."""
    from spotstop.cli import main

    out = tmp_path_factory.mktemp("kept") / "b8"
    args = ["export", "--out", str(out), "--precision", "int8", "--buckets", "256"]
    args += ["--int8-keep-error", "1e-4", "--int8-rotate-block", "0"]  # kept, not rotated
    args += ["--calibration-scenes", "2", "--trt", "off"]
    assert main([*args, "--member", str(tiny_pair / "tiny-lfm2_vl")]) == 0
    return out


def _nodes(bundle: Path) -> dict[str, list[Any]]:
    import onnx

    out: dict[str, list[Any]] = {}
    for f in sorted((bundle / "members" / "tiny-lfm2_vl" / "onnx").glob("*.onnx")):
        for n in onnx.load(str(f), load_external_data=False).graph.node:
            out.setdefault(n.op_type, []).append(n)
    return out


def _scores(bundle: Path) -> np.ndarray:
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import load_bundle, load_bundle_member

    b = load_bundle(bundle)  # verifies every sha256 and that the id names the content
    member = load_bundle_member(b, b.members[0])
    return np.array([r.score for r in member.score(demo_scenes(4, seed=3))])


def _expected_int8(bundle: Path, kf: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per kept layer, the int8 weight the per-token copy should hold: the export's per-column
    rounding (``channel_int8``) of the layer's 8-bit blocks as ``MatMulNBits`` multiplies by
    them (read before any copy hard-links the data files, which onnx then refuses)."""
    import onnx
    from onnx import numpy_helper
    from spotstop.export.int8_math import channel_int8
    from spotstop.export.nbits import dequantize_nbits

    out = {}
    for f in sorted((bundle / "members" / "tiny-lfm2_vl" / "onnx").glob("*.onnx")):
        m = onnx.load(str(f))
        inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        for n in kf._kept(m):
            w = dequantize_nbits(inits[n.input[1]], inits[n.input[2]], 8, kf._attrs(n)["K"])
            out[f"{n.name}_kept_w_int8"] = channel_int8(w)
    return out


def test_each_copy_loads_with_its_kept_layers_in_the_form_it_names(
    kept_bundle: Path, tmp_path: Path
) -> None:
    import onnx
    from onnx import numpy_helper
    from spotstop.export.int8_math import graph_codes

    kf = load_bench("int8_kept_form")
    nodes = _nodes(kept_bundle)
    meta = (kept_bundle / "members" / "tiny-lfm2_vl" / "spotstop_onnx.yaml").read_text()
    weight_only = load_yaml(meta, source="spotstop_onnx.yaml")["quantizer"]["dynamic_int8"][
        "weight_only"
    ]
    kept, heads = weight_only["over_keep_error"], weight_only["output_layer"]
    assert kept > 10 and len(nodes["MatMulNBits"]) == kept + heads
    assert all(kf._attrs(n)["accuracy_level"] == 4 for n in nodes["MatMulNBits"])
    expected = _expected_int8(kept_bundle, kf)
    assert len(expected) == kept
    base = _scores(kept_bundle)

    flt = tmp_path / "float"
    assert sum(kf.float_copy(kept_bundle, flt).values()) == kept
    levels = [kf._attrs(n).get("accuracy_level", 0) for n in _nodes(flt)["MatMulNBits"]]
    assert sorted(levels) == [0] * kept + [4] * heads
    assert np.isfinite(_scores(flt)).all()

    dyn = tmp_path / "per-token"
    assert sum(kf.dynamic_copy(kept_bundle, dyn).values()) == kept
    after = _nodes(dyn)
    assert len(after["MatMulNBits"]) == heads  # the output layer alone
    n_int8 = len(nodes.get("MatMulIntegerToFloat", []))
    assert len(after["MatMulIntegerToFloat"]) == n_int8 + kept
    got = _scores(dyn)
    assert np.isfinite(got).all()
    assert not np.array_equal(got, base)  # the kept layers now multiply otherwise
    new = {}
    for f in sorted((dyn / "members" / "tiny-lfm2_vl" / "onnx").glob("*.onnx")):
        new.update({t.name: t for t in onnx.load(str(f)).graph.initializer})
    for name, (codes, scales) in expected.items():
        np.testing.assert_array_equal(graph_codes(numpy_helper.to_array(new[name])), codes)
        np.testing.assert_array_equal(numpy_helper.to_array(new[f"{name}_scale"]), scales)
