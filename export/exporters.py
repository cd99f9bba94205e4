"""The ``torch.onnx`` calls that turn the scoring graphs (export/graphs.py) into ONNX files.

Each graph is exported with the exporter and opset its architecture's export config names
(export/configs.py): the legacy TorchScript exporter (``dynamo=False``) or the dynamo exporter
(``dynamo=True``, with onnxscript's optimizer). The decoder's batch and read axes are
dynamic; its sequence length too unless the config fixes it (one graph per length bucket). The
decoder is exported under its config's ``decoder_patcher`` (e.g. Qwen3.5's loop-free
Gated-DeltaNet kernel, export/gated_delta.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.export.configs import ExportConfig
from spotstop.export.weights import IMAGE_OUTPUT, PIXELS_INPUT

__all__ = ["DECODER_INPUTS", "DECODER_OUTPUTS", "export_decoder", "export_vision"]


@contextmanager
def _exporter_noise() -> Iterator[None]:
    """Silence what the exporters say about themselves (not about our graphs).

    The legacy exporter is chosen on purpose (see export/configs.py) and warns that it is
    deprecated; tracing warns that shape-dependent Python values become constants, which is
    what a fixed image grid and fixed-length buckets mean.
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # torch.export's own deprecation notices (e.g. pytree's LeafSpec) during decomposition
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
        yield


#: onnxscript rewrite rules left out of the optimizer run after a dynamo export:
#: ``SlicesSplit`` is its one pattern with several output nodes, which its matcher tries
#: against every node of the graph for every node of the graph: quadratic in the node count.
#: On the tiny Qwen3.5 decoder that is nothing; on Qwen3.5-2B's (24 layers) it ran for more than
#: ten minutes of one core. Without it, two Slices of one tensor stay two Slices.
_SLOW_REWRITE_RULES = frozenset({"SlicesSplit"})


@contextmanager
def _linear_rewrite_rules() -> Iterator[None]:
    """onnxscript's default rewrite rules without :data:`_SLOW_REWRITE_RULES`, for one export.

    ``onnxscript.optimizer.optimize_ir`` (which ``torch.onnx.export(optimize=True)`` calls) reads
    ``onnxscript.rewriter._DEFAULT_REWRITE_RULES`` when it runs and takes no rule list, so the
    module attribute is swapped while the export runs and restored after.
    """
    try:
        from onnxscript import rewriter
    except ImportError:  # no onnxscript: the dynamo exporter says so itself
        yield
        return
    rules = rewriter._DEFAULT_REWRITE_RULES
    rewriter._DEFAULT_REWRITE_RULES = tuple(
        r for r in rules if getattr(r, "name", None) not in _SLOW_REWRITE_RULES
    )
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def _exporter_options(
    cfg: type[ExportConfig], exporter: str, fold_constants: bool = True
) -> dict[str, Any]:
    """``torch.onnx.export``'s exporter switch and opset for ``exporter`` under ``cfg``.

    ``fold_constants=False`` (a member whose weights exceed what memory holds twice): the
    legacy exporter's constant folding writes a folded copy of every transposed weight
    (``Transpose(W)`` of each linear layer) while the model still holds the original, which
    doubles the peak memory; unfolded, the weights stream to external data files and
    export/weights.py ``fold_weight_transposes`` folds the transposes in the ONNX graph after.
    """
    if exporter == "legacy":
        return {
            "opset_version": cfg.legacy_opset,
            "dynamo": False,
            "do_constant_folding": fold_constants,
        }
    # onnxscript's optimizer folds the exporter's shape arithmetic and constants: the compact
    # Gated-DeltaNet layer (export/gated_delta.py) drops from ~415 to ~185 nodes, at no
    # measurable export time (it more than doubled the export time of the old, unrolled graph).
    return {"opset_version": cfg.dynamo_opset, "dynamo": True, "optimize": True}


def export_vision(
    vision: Any,
    cfg: type[ExportConfig],
    pixels: dict[str, np.ndarray],
    path: Path,
    fold_constants: bool = True,
    graph_form: str = "standard",
) -> None:
    """Write the vision graph to ``path``, traced on ``pixels`` (its fixed grid).

    ``graph_form="fused"``: under :func:`~spotstop.export.fused.fused_patcher` (Qwen3.5's vision
    attention as ``RotaryEmbedding`` + ``MultiHeadAttention``; LFM2-VL's SigLIP2 attention as
    ``MultiHeadAttention`` with its key padding mask)."""
    import torch
    from spotstop.export.fused import GRAPH_FORMS, dynamo_translations, fused_patcher

    if graph_form not in GRAPH_FORMS:
        raise ValueError(f"graph_form must be one of {list(GRAPH_FORMS)}; got {graph_form!r}.")
    x = torch.from_numpy(pixels["pixel_values"])
    fused = graph_form == "fused"
    form = fused_patcher(cfg.model_type, int(x.shape[0])) if fused else nullcontext()
    extra: dict[str, Any] = {}
    if fused and cfg.vision_exporter == "dynamo":
        extra["custom_translation_table"] = dynamo_translations()
    with torch.no_grad(), _exporter_noise(), form:
        torch.onnx.export(
            vision,
            (x,),
            str(path),
            input_names=[PIXELS_INPUT],
            output_names=[IMAGE_OUTPUT],
            **extra,
            **_exporter_options(cfg, cfg.vision_exporter, fold_constants),
        )


#: the decoder graph's inputs and outputs, in order (the runtime feeds them by name)
DECODER_INPUTS = ["input_ids", "image_embeds", "last_index", "read_index", "read_token"]
DECODER_OUTPUTS = ["first_logits", "read_logprob"]


def _decoder_axes(fixed_length: bool) -> dict[str, dict[int, str]]:
    """The decoder inputs' dynamic axes: batch, reads and (unless fixed) the sequence length."""
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch"} if fixed_length else {0: "batch", 1: "length"},
        "image_embeds": {0: "batch"},
        "last_index": {0: "batch"},
        "read_index": {0: "batch", 1: "reads"},
        "read_token": {0: "batch", 1: "reads"},
    }
    return axes


def export_decoder(
    decoder: Any,
    cfg: type[ExportConfig],
    feeds: dict[str, np.ndarray],
    image_embeds: np.ndarray,
    path: Path,
    max_length: int | None = None,
    fold_constants: bool = True,
    graph_form: str = "standard",
) -> None:
    """Write the decoder graph to ``path``, traced on ``feeds`` + ``image_embeds``, under the
    config's :meth:`~spotstop.export.configs.ExportConfig.decoder_patcher` for sequences up to
    ``max_length`` tokens (default: the traced length).

    ``graph_form``: ``"standard"`` (standard ONNX operators: TensorRT, fp16, int4-trt) or
    ``"fused"`` (onnxruntime's com.microsoft operators where they fit, export/fused.py: also under
    :func:`~spotstop.export.fused.fused_patcher`, with its translations for a dynamo export,
    and :func:`~spotstop.export.fused.fuse_graph` on the written graph)."""
    import torch
    from spotstop.export.fused import (
        GRAPH_FORMS,
        dynamo_translations,
        fuse_graph_file,
        fused_patcher,
    )

    if graph_form not in GRAPH_FORMS:
        raise ValueError(f"graph_form must be one of {list(GRAPH_FORMS)}; got {graph_form!r}.")

    args = tuple(
        torch.from_numpy(image_embeds if n == "image_embeds" else feeds[n]) for n in DECODER_INPUTS
    )
    axes = _decoder_axes(cfg.decoder_fixed_length)
    shapes: dict[str, Any]
    if cfg.decoder_exporter == "legacy":
        outputs = {"first_logits": {0: "batch"}, "read_logprob": {0: "batch", 1: "reads"}}
        shapes = {"dynamic_axes": {**axes, **outputs}}
    else:
        from torch.export import Dim

        dims = {a: Dim(a) for a in ("batch", "reads", "length")}
        shapes = {
            "dynamic_shapes": {
                name: {axis: dims[a] for axis, a in ax.items()} for name, ax in axes.items()
            }
        }
    longest = int(max_length) if max_length is not None else int(args[0].shape[1])
    rules = _linear_rewrite_rules() if cfg.decoder_exporter == "dynamo" else nullcontext()
    fused = graph_form == "fused"
    form = fused_patcher(cfg.model_type, longest) if fused else nullcontext()
    extra: dict[str, Any] = {}
    if fused and cfg.decoder_exporter == "dynamo":
        extra["custom_translation_table"] = dynamo_translations()
    # the fused patch inside the config's own: where both replace a function, the fused one wins
    with torch.no_grad(), _exporter_noise(), cfg.decoder_patcher(longest), form, rules:
        torch.onnx.export(
            decoder,
            args,
            str(path),
            input_names=DECODER_INPUTS,
            output_names=DECODER_OUTPUTS,
            **shapes,
            **extra,
            **_exporter_options(cfg, cfg.decoder_exporter, fold_constants),
        )
    if fused:  # the residual Adds that cross the layer loop (export/fused.py fuse_graph)
        fuse_graph_file(path)
