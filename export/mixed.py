"""Which weights of an int4 export are kept at int8: the mixed-precision rule, in one place.

A 4-bit weight carries about 16 times the rounding error of an 8-bit one, and some weights
pass theirs on to everything after them. The usual int4 recipes therefore keep a few weights
at 8 bits, chosen by where they sit, not by their values; spotstop uses the selectors of
onnxruntime-genai's model builder (``matmul_mixed_precision``, its
``src/python/py/models/quantization.md``), which follow llama.cpp's ``Q4_K_M`` mix
(``src/llama-quant.cpp``, ``use_more_bits``):

``output_layer`` (onnxruntime-genai's ``last_matmul``)
    the output layer (``lm_head``; in both real members it is tied to the token table, which the
    bundle then stores at 8 bits too, one table read by both).
``mixed_layers``
    in the first and last eighth of the decoder layers and every third layer between
    (``i < n/8``, ``i >= 7n/8`` or ``(i - round(n/8)) % 3 == 2`` in real division, as
    onnxruntime-genai's ``make_matmul_mixed_precision`` writes llama.cpp's ``use_more_bits``;
    llama.cpp divides integers, which picks other layers when n is not a multiple of 8): for
    Qwen3.5-2B's 24 layers 0-2, 5, 8, …, 20 and 21-23; for LFM2.5-VL-3B's 30 layers 0-3, 6, 9,
    …, 24 and 27-29. In those layers, the value projection of attention (``v_proj``; a fused
    ``qkv`` / ``in_proj_qkv`` as a whole, so a Gated-DeltaNet layer's too, which
    onnxruntime-genai leaves to ``linear_attn``) and the feed-forward down projection
    (``down_proj``; LFM2's ``feed_forward.w2``).
``linear_attn``
    every Qwen3.5 Gated-DeltaNet layer's projections and its feed-forward weights: the
    recurrence carries a rounding error along the whole sequence, with no softmax to
    normalise it.
``vision``
    the vision tower and its projector into the decoder.

The rule reads only the torch model's module names (``model.language_model.layers.7.mlp.
down_proj``), so the same function decides for the export (export/onnx.py, which finds each
ONNX weight by :func:`~spotstop.export.gptq.weight_key`) and for the torch simulation in
``bench/quant_error.py``. The member's manifest records the selectors and how many weights each
precision holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "DEFAULT_INT4_INT8",
    "INT8_SELECTORS",
    "Q4_K_M",
    "int8_linears",
    "int8_weight_keys",
    "keeps_int8",
    "parse_selectors",
]

#: the selectors an int4 export may keep at int8 (see the module doc)
INT8_SELECTORS = ("output_layer", "mixed_layers", "linear_attn", "vision")

#: llama.cpp's ``Q4_K_M`` mix (onnxruntime-genai's ``k_quant_mixed``): the output layer and
#: the mixed layers' value and down projections at int8
Q4_K_M: tuple[str, ...] = ("output_layer", "mixed_layers")

#: what ``spotstop export --precision int4`` keeps at int8 unless told otherwise: nothing. On the
#: real pair's dimensions (seeded random weights), :data:`Q4_K_M` moved the score further from
#: the fp32 reference, not nearer (bench/RESULTS.md, ``quant-error-Qwen3.5-2B-gptq-mixed``), so
#: the bytes it costs (the int8 token table: +0.25 GiB for Qwen3.5-2B) buy nothing measured;
#: ``--int4-int8`` chooses it
DEFAULT_INT4_INT8: tuple[str, ...] = ()

_VISION = re.compile(r"(^|\.)(visual|vision_tower|vision_model|multi_modal_projector)\.")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OUTPUT = re.compile(r"(^|\.)lm_head$")
#: attention's value projection (a fused q/k/v projection counts as one)
_VALUE = re.compile(r"\.(self_attn|linear_attn|attn)\.(v_proj|qkv_proj|qkv|in_proj_qkv)$")
#: the feed-forward down projection (Qwen3.5 ``mlp.down_proj``, LFM2 ``feed_forward.w2``)
_DOWN = re.compile(r"\.(mlp\.down_proj|feed_forward\.w2)$")
_FEED_FORWARD = re.compile(r"\.(mlp|feed_forward)\.")


def parse_selectors(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"output_layer,mixed_layers"`` (or a sequence; ``""``/``"none"``: none) → the
    selectors, in :data:`INT8_SELECTORS` order; an unknown one is a ValueError naming it."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    chosen = {s.strip() for s in items if s.strip() and s.strip() != "none"}
    unknown = sorted(chosen - set(INT8_SELECTORS))
    if unknown:
        raise ValueError(
            f"unknown int8 selector(s) {unknown}; choose from {list(INT8_SELECTORS)} "
            "(comma-separated), or 'none'."
        )
    return tuple(s for s in INT8_SELECTORS if s in chosen)


def _mixed_layer(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits(i, n)`` as onnxruntime-genai writes it (real division, the
    middle layers counted from ``round(n/8)``); see the module doc."""
    return i < n / 8 or i >= 7 * n / 8 or (i - round(n / 8)) % 3 == 2


#: a weight's role, as the rule sees it
ROLES = ("output", "vision", "value", "down", "feed_forward", "mixer")


def keeps_int8(
    selectors: Iterable[str],
    role: str,
    layer: int | None = None,
    n_layers: int = 0,
    linear_attention: bool = False,
) -> bool:
    """THE rule: does an int4 export with ``selectors`` keep this weight at int8?

    ``role``: ``output`` (the output layer), ``vision`` (tower and projector), ``value``
    (attention's value projection, or a fused q/k/v one), ``down`` (the feed-forward down
    projection), ``feed_forward`` (its other projections), ``mixer`` (the token mixer's other
    projections: attention, Gated-DeltaNet, short convolution); ``layer`` of ``n_layers``
    decoder layers; ``linear_attention``: the layer is a Gated-DeltaNet layer. The torch
    module names (:func:`int8_linears`) and the cost model's parameter formulas
    (export/cost.py) both decide by this function."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {list(ROLES)}; got {role!r}.")
    sel = set(selectors)
    if role == "output":
        return "output_layer" in sel
    if role == "vision":
        return "vision" in sel
    if layer is None:
        return False
    if "linear_attn" in sel and linear_attention:
        return True
    return "mixed_layers" in sel and role in ("value", "down") and _mixed_layer(layer, n_layers)


#: a Linear's role by its qualified name: the first pattern that matches (a decoder layer's
#: weight no earlier pattern names is its token mixer's)
_ROLE_OF: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("output", _OUTPUT),
    ("vision", _VISION),
    ("value", _VALUE),
    ("down", _DOWN),
    ("feed_forward", _FEED_FORWARD),
    ("mixer", _LAYER),
)


def _role(name: str) -> str | None:
    """The role of a torch Linear by its qualified name (None: not a weight the rule knows)."""
    return next((role for role, pat in _ROLE_OF if pat.search(name)), None)


def int8_linears(names: Sequence[str], selectors: Iterable[str]) -> dict[str, str]:
    """The Linear names (of ``names``: a torch model's ``nn.Linear`` qualified names) that
    ``selectors`` keep at int8 → their role (:func:`keeps_int8` decides)."""
    sel = parse_selectors(list(selectors))
    layer_of: dict[str, int] = {}
    for n in names:
        m = _LAYER.search(n)
        if m and not _VISION.search(n):
            layer_of[n] = int(m.group(1))
    n_layers = max(layer_of.values(), default=-1) + 1
    linear_layers = {i for n, i in layer_of.items() if ".linear_attn." in n}
    out: dict[str, str] = {}
    for n in names:
        role = _role(n)
        i = layer_of.get(n)
        if role is not None and keeps_int8(sel, role, i, n_layers, i in linear_layers):
            out[n] = role
    return out


def int8_weight_keys(model: Any, selectors: Iterable[str]) -> dict[str, str]:
    """A torch model's weights that ``selectors`` keep at int8, by
    :func:`~spotstop.export.gptq.weight_key` (how the export finds them among the ONNX graph's
    weights) → the Linear's name. A weight tied to another (the output layer and the token
    table) is one key."""
    import torch
    from spotstop.export.gptq import weight_key

    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    chosen = int8_linears(list(linears), selectors)
    return {weight_key(linears[n].weight.detach().float().numpy()): n for n in chosen}
