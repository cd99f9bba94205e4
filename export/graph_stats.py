"""Node counts of an exported ONNX graph, per layer type (what a graph's size is made of).

Both exporters say which module made a node: the dynamo exporter in the node's
``pkg.torch.onnx.name_scopes`` metadata (the module path, outermost first, then the op), the
legacy exporter in the node's name (``/language_model/layers.0/linear_attn/MatMul_3``). A node
belongs to a layer when its module path holds ``layers.N`` or ``blocks.N``; its layer type is
the stack and the layer's child it sits in (``language_model.layers.*.linear_attn`` for a
Gated-DeltaNet, ``*.self_attn`` for attention, ``*.mlp`` / ``*.feed_forward``, ``*.conv``
for LFM2's short convolution, ``visual.blocks.*.attn`` ...); nodes of the layer outside any
child (the residual adds) count as ``*.(layer)``. Everything else is ``(outside layers)``.

``python -m spotstop.export.graph_stats GRAPH.onnx ...`` prints the table.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GraphStats", "graph_stats", "main"]

_LAYER = re.compile(
    r"^(?P<stack>.*?\b(?:layers|blocks))\.(?P<index>\d+)(?:\.(?P<child>[A-Za-z_]\w*))?"
)
_SLICE = re.compile(r"\.slice\([^)]*\)")  # dynamo's ``layers.slice(None, 4, None).0``
OUTSIDE = "(outside layers)"


def _module_path(node: Any) -> str:
    """The dotted module path that made ``node`` ('' at the top level)."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = [str(s) for s in ast.literal_eval(p.value)]
            except (ValueError, SyntaxError):
                scopes = []
            modules = [s for s in scopes[:-1] if s]  # the last scope is the op itself
            return _SLICE.sub("", modules[-1]) if modules else ""
    parts = node.name.split("/")[1:-1]  # legacy: "/a/b.0/c/Op_3"
    return ".".join(parts)


@dataclass(frozen=True)
class GraphStats:
    """How many nodes a graph has, per layer type and per layer instance."""

    total: int
    #: layer type → node count of each of its instances, in layer order
    per_type: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: layer type → Constant nodes of each instance (the part onnxruntime folds at load)
    constants: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def max_per_layer(self, suffix: str) -> int:
        """The most nodes any instance of a layer type ending in ``suffix`` has (0: none)."""
        return max(
            (max(v) for k, v in self.per_type.items() if k.endswith(suffix) and v), default=0
        )

    def lines(self) -> list[str]:
        """The table: type, instances, nodes per instance (max; without Constants), total."""
        out = [f"  {'layer type':<50} {'n':>3} {'nodes/layer':>11} {'w/o Const':>9} {'total':>7}"]
        for name in sorted(self.per_type, key=lambda k: (k == OUTSIDE, k)):
            counts, consts = self.per_type[name], self.constants[name]
            if name == OUTSIDE:
                out.append(f"  {name:<50} {'':>3} {'':>11} {'':>9} {sum(counts):7d}")
                continue
            bare = max(c - k for c, k in zip(counts, consts, strict=True))
            out.append(
                f"  {name:<50} {len(counts):3d} {max(counts):11d} {bare:9d} {sum(counts):7d}"
            )
        out.append(f"  {'all':<50} {'':>3} {'':>11} {'':>9} {self.total:7d}")
        return out


def graph_stats(model: Any) -> GraphStats:
    """Node counts of ``model`` (an ``onnx.ModelProto`` or a path; weights are not loaded)."""
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    consts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for node in model.graph.node:
        m = _LAYER.match(_module_path(node))
        if m is None:
            kind, inst = OUTSIDE, ""
        else:
            kind = f"{m['stack']}.*.{m['child'] or '(layer)'}"
            inst = m["index"]
        counts[kind][inst] += 1
        consts[kind][inst] += node.op_type == "Constant"

    def order(d: dict[str, int]) -> tuple[int, ...]:
        return tuple(d[k] for k in sorted(d, key=lambda i: int(i) if i else -1))

    return GraphStats(
        total=len(model.graph.node),
        per_type={k: order(v) for k, v in counts.items()},
        constants={k: order(consts[k]) for k in counts},
    )


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    for p in paths:
        print(f"{Path(p).name}:")
        print("\n".join(graph_stats(p).lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
