"""Benchmark of the fp16 conversion: onnxruntime's converter with a node block list vs ``to_fp16``.

    python bench/fp16_convert.py                    # builds the tiny pair, exports it (minutes)
    python bench/fp16_convert.py --bundle B32       # reuse an fp32 bundle (e.g. the tiny pair's)

For every graph of the bundle, in one run:

* baseline: ``onnxruntime.transformers.float16.convert_float_to_float16`` given the same
  float32 nodes as ``node_block_list`` (what ``spotstop.export.fp16.to_fp16`` did before), followed by
  the same removal of float16 round trips;
* ``spotstop.export.fp16.to_fp16``: the float32 islands taken out, the rest converted, the islands put
  back with their Casts in one pass.

Prints the seconds of each, the ratio, and the largest difference between the two graphs'
outputs on onnxruntime (CPU) for the same random inputs (0 means bit-identical).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def baseline_fp16(model: Any) -> Any:
    """The previous conversion: the converter handles the float32 nodes itself (quadratic)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
    from spotstop.export import fp16 as eo

    eo._scalar_constants_as_tensors(model)
    block_ops = [*DEFAULT_OP_BLOCK_LIST, *eo.FP16_FP32_OPS, "Resize", "GroupNorm", "SkipGroupNorm"]
    fp32 = set(eo.fp32_nodes(model))
    fp32.update(n.name for n in model.graph.node if n.op_type in block_ops)
    eo._follow_data_movement(model, fp32)
    float_inputs = {i.name for i in model.graph.input if i.type.tensor_type.elem_type == 1}
    m = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=block_ops, node_block_list=sorted(fp32)
    )
    eo._join_fp32_regions(m, fp32, float_inputs)
    return m


def _feeds(sess: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 8 for d in i.shape]
        if "int64" in i.type:
            hi = 2 if "index" in i.name else 50  # positions inside the sequence; small ids
            out[i.name] = rng.integers(0, hi, shape).astype(np.int64)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _run(model: Any, tmp: Path, tag: str, feeds: dict[str, np.ndarray] | None) -> tuple:
    import onnx
    import onnxruntime as ort

    path = tmp / f"{tag}.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location=f"{tag}.data")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feeds = feeds if feeds is not None else _feeds(sess, np.random.default_rng(0))
    return sess.run(None, feeds), feeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="an fp32 bundle (built if absent)")
    args = ap.parse_args(argv)

    import onnx
    from spotstop.export.fp16 import to_fp16

    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        bundle = args.bundle
        if bundle is None:
            from spotstop.export.onnx_bundle import write_onnx_bundle
            from spotstop.export.tiny import build_tiny_pair

            print("building the tiny TEST pair and exporting it at fp32 (minutes) ...", flush=True)
            pair = build_tiny_pair(tmp / "tiny", seed=0)
            bundle = write_onnx_bundle(
                list(pair.members),
                tmp / "b32",
                precision="fp32",
                buckets=[128],
                trt="off",
            ).path
        graphs = sorted((bundle / "members").glob("*/onnx/*.onnx"))
        print(
            f"{'graph':<40} {'nodes':>6} {'baseline s':>11} {'to_fp16 s':>10} {'ratio':>7}"
            f" {'max|Δ| outputs':>15}"
        )
        tot_a = tot_b = 0.0
        for g in graphs:
            t = time.perf_counter()
            a = baseline_fp16(onnx.load(str(g)))
            ta = time.perf_counter() - t
            t = time.perf_counter()
            b = to_fp16(onnx.load(str(g)))
            tb = time.perf_counter() - t
            out_a, feeds = _run(a, tmp, "a", None)
            out_b, _ = _run(b, tmp, "b", feeds)
            diff = max(float(np.max(np.abs(x - y))) for x, y in zip(out_a, out_b, strict=True))
            name = f"{g.parent.parent.name}/{g.name}"
            print(
                f"{name:<40} {len(b.graph.node):>6} {ta:>11.2f} {tb:>10.2f} "
                f"{ta / tb:>6.1f}x {diff:>15.3g}",
                flush=True,
            )
            tot_a += ta
            tot_b += tb
        print(f"{'all graphs':<40} {'':>6} {tot_a:>11.2f} {tot_b:>10.2f} {tot_a / tot_b:>6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
