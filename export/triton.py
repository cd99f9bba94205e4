"""A Triton Inference Server model-repository layout for a bundle's graphs (option).

For fleets that serve the members from a GPU server: one Triton model per graph, on the
``onnxruntime_onnx`` platform, with the batch axis dynamic. The graphs are not copied into
the bundle twice: ``triton/populate.sh`` hard-links (or copies) them into the version
folders on the server. The score itself (``s`` from ``first_logits``/``read_logprob``) is
computed by the client exactly as ``spotstop.guard.backends._onnx.combine_scores`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spotstop.export.trt import _input_shapes
from spotstop.guard._config import DEFAULT_BATCH_SIZE

__all__ = ["write_triton_repository"]

_TYPES = {
    "pixel_values": "TYPE_FP32",
    "image_embeds": "TYPE_FP32",
    "input_ids": "TYPE_INT64",
    "last_index": "TYPE_INT64",
    "read_index": "TYPE_INT64",
    "read_token": "TYPE_INT64",
    "first_logits": "TYPE_FP32",
    "read_logprob": "TYPE_FP32",
}
_OUTPUTS = {"vision": ["image_embeds"], "decoder": ["first_logits", "read_logprob"]}


def _dims(dims: Sequence[int | str]) -> str:
    return "[ " + ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in dims) + " ]"


def write_triton_repository(
    root: Path, exports: Sequence[Any], *, max_batch: int = DEFAULT_BATCH_SIZE
) -> Path:
    """Write ``triton/<model>/config.pbtxt`` per graph and ``triton/populate.sh``."""
    repo = root / "triton"
    links = [
        "#!/usr/bin/env bash",
        "# Put the bundle's graphs into this Triton model repository (hard links where possible).",
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
    ]
    for e in exports:
        for g in sorted((e.path / "onnx").glob("*.onnx")):
            model = f"{e.name}__{g.stem}".replace(".", "_")
            kind = "vision" if g.stem == "vision" else "decoder"
            inputs = _input_shapes(g)
            lines = [
                f'name: "{model}"',
                'platform: "onnxruntime_onnx"',
                "max_batch_size: 0  # the graphs carry their own dynamic batch axis",
            ]
            for name, dims in inputs.items():
                lines.append(
                    f'input {{ name: "{name}" data_type: {_TYPES[name]} dims: {_dims(dims)} }}'
                )
            for name in _OUTPUTS[kind]:
                lines.append(f'output {{ name: "{name}" data_type: {_TYPES[name]} dims: [ -1 ] }}')
            lines.append("instance_group [ { kind: KIND_GPU, count: 1 } ]")
            (repo / model / "1").mkdir(parents=True, exist_ok=True)
            (repo / model / "config.pbtxt").write_text("\n".join(lines) + "\n", encoding="utf-8")
            src = g.relative_to(root).as_posix()
            links.append(
                f"ln -f {src} triton/{model}/1/model.onnx 2>/dev/null || cp {src} triton/{model}/1/model.onnx"
            )
            data = g.parent / ("vision.onnx.data" if kind == "vision" else "decoder.onnx.data")
            if data.is_file():
                d = data.relative_to(root).as_posix()
                links.append(
                    f"ln -f {d} triton/{model}/1/{data.name} 2>/dev/null || cp {d} triton/{model}/1/{data.name}"
                )
    script = repo / "populate.sh"
    repo.mkdir(parents=True, exist_ok=True)
    script.write_text("\n".join(links) + "\n", encoding="utf-8")
    script.chmod(0o755)
    return repo
