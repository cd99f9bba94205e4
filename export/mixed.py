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

``vision`` is also chosen by measurement (:func:`vision_weight_check`, called by
export/onnx.py for a precision whose spec ``checks_vision_weights``, int4): the export scores
its check scenes (:data:`~spotstop.export.gptq.CHECK_SCENES` of them, the calibration scenes
first) with the float32 decoder reading the 4-bit vision graph's image embeddings and again
the float32 vision graph's; over half the score tolerance (export/int8.py's
:data:`~spotstop.export.int8.VISION_SHARE`, the same rule as int8's vision activations) the
vision graph is converted again with its weights at 8 bits. The manifest records the measured
move, the bound and the choice (``quantizer.int8.vision_weights``).

The decoder's groups are chosen by measurement too (:func:`decoder_weight_check`, the same
export, in-memory members): the check scenes' scores, both passes (with the image and
request-only), with the float32 vision graph's embeddings, from the decoder at 4 bits against
the float32 decoder; over the rest of the tolerance (``1 − VISION_SHARE`` of it) each group of
:data:`DECODER_GROUPS` the architecture has is kept at 8 bits alone and measured again, and the
one whose move is smallest is kept (none when none is smaller than all-4-bit's). The manifest
records every measured move and the choice (``quantizer.int8.decoder_weights``).

The rule reads only the torch model's module names (``model.language_model.layers.7.mlp.
down_proj``), so the same function decides for the export (export/onnx.py, which finds each
ONNX weight by :func:`~spotstop.export.gptq.weight_key`) and for the torch simulation in
``bench/quant_error.py``. Where each role sits among an architecture's module names is that
architecture's :class:`MixedRoles`, in its module ``export/archs/<model_type>.py``; this module
names no architecture. The member's manifest records the selectors and how many weights each
precision holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DECODER_GROUPS",
    "DEFAULT_INT4_INT8",
    "INT8_SELECTORS",
    "Q4_K_M",
    "DecoderWeightCheck",
    "MixedRoles",
    "VisionWeightCheck",
    "decoder_weight_check",
    "int8_linears",
    "int8_weight_keys",
    "keeps_int8",
    "parse_selectors",
    "vision_weight_check",
]

#: the selectors an int4 export may keep at int8 (see the module doc)
INT8_SELECTORS = ("output_layer", "mixed_layers", "linear_attn", "vision")

#: llama.cpp's ``Q4_K_M`` mix (onnxruntime-genai's ``k_quant_mixed``): the output layer and
#: the mixed layers' value and down projections at int8
Q4_K_M: tuple[str, ...] = ("output_layer", "mixed_layers")

#: the fixed selectors of an int4 export and of the cost model: none. On the real pair's
#: dimensions (seeded random weights), :data:`Q4_K_M` moved the score further from the fp32
#: reference, not nearer (bench/RESULTS.md, ``quant-error-Qwen3.5-2B-gptq-mixed``), so its bytes
#: (the int8 token table: +0.25 GiB for Qwen3.5-2B) are not spent unmeasured. ``spotstop export
#: --precision int4`` (``--int4-int8 auto``) adds what :func:`vision_weight_check` and
#: :func:`decoder_weight_check` choose by measurement; ``--int4-int8`` fixes the selectors
DEFAULT_INT4_INT8: tuple[str, ...] = ()

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OUTPUT = re.compile(r"(^|\.)lm_head$")


@dataclass(frozen=True)
class MixedRoles:
    """Where the rule's roles sit among one architecture's torch ``nn.Linear`` names.

    Each entry is a dotted fragment of a qualified module name: ``vision`` a module the vision
    tower or its projector is (``visual``; anywhere in the name), ``value`` and ``down`` the
    module a Linear's name ends with (``self_attn.v_proj``; a fused q/k/v projection counts as
    the value projection), ``feed_forward`` the feed-forward block its other projections sit in
    (``mlp``); ``linear_attention``: the module of a Gated-DeltaNet layer's token mixer (None:
    the architecture has none). The output layer (``lm_head``) and the decoder layers
    (``layers.<i>.``) are named alike in every architecture; a decoder layer's Linear no role
    names is its token mixer's (``mixer``).
    """

    vision: tuple[str, ...]
    value: tuple[str, ...]
    down: tuple[str, ...]
    feed_forward: tuple[str, ...]
    linear_attention: str | None = None

    def role(self, name: str) -> str | None:
        """The role of the Linear ``name`` (None: not a weight the rule knows); the first that
        applies of output, vision, value, down, feed_forward, mixer."""
        dotted = f".{name}"
        if _OUTPUT.search(name):
            return "output"
        if any(f".{v}." in dotted for v in self.vision):
            return "vision"
        if any(name.endswith(f".{v}") for v in self.value):
            return "value"
        if any(name.endswith(f".{d}") for d in self.down):
            return "down"
        if any(f".{f}." in name for f in self.feed_forward):
            return "feed_forward"
        return "mixer" if _LAYER.search(name) else None

    def in_vision(self, name: str) -> bool:
        return any(f".{v}." in f".{name}" for v in self.vision)

    def in_linear_attention(self, name: str) -> bool:
        return self.linear_attention is not None and f".{self.linear_attention}." in name

    @staticmethod
    def union(roles: Iterable[MixedRoles]) -> MixedRoles:
        """One set of roles that knows every given architecture's names."""
        rs = list(roles)

        def every(field: str) -> tuple[str, ...]:
            return tuple(dict.fromkeys(x for r in rs for x in getattr(r, field)))

        linear = {r.linear_attention for r in rs} - {None}
        if len(linear) > 1:
            raise ValueError(f"architectures name their Gated-DeltaNet mixers apart: {linear}.")
        return MixedRoles(
            every("vision"),
            every("value"),
            every("down"),
            every("feed_forward"),
            next(iter(linear), None),
        )


def roles_of(model_type: str | None) -> MixedRoles:
    """``model_type``'s roles (export/archs/<model_type>.py); None: every registered
    architecture's at once."""
    from spotstop.export.archs import ARCHITECTURES, get_architecture

    if model_type is None:
        return MixedRoles.union(a.mixed_roles for a in ARCHITECTURES.values())
    return get_architecture(model_type).mixed_roles


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


def int8_linears(
    names: Sequence[str], selectors: Iterable[str], model_type: str | None = None
) -> dict[str, str]:
    """The Linear names (of ``names``: a torch model's ``nn.Linear`` qualified names) that
    ``selectors`` keep at int8 → their role (:func:`keeps_int8` decides), the roles found by
    ``model_type``'s :class:`MixedRoles` (None: every registered architecture's)."""
    sel = parse_selectors(list(selectors))
    roles = roles_of(model_type)
    layer_of: dict[str, int] = {}
    for n in names:
        m = _LAYER.search(n)
        if m and not roles.in_vision(n):
            layer_of[n] = int(m.group(1))
    n_layers = max(layer_of.values(), default=-1) + 1
    linear_layers = {i for n, i in layer_of.items() if roles.in_linear_attention(n)}
    out: dict[str, str] = {}
    for n in names:
        role = roles.role(n)
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
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    chosen = int8_linears(list(linears), selectors, model_type)
    return {weight_key(linears[n].weight.detach().float().numpy()): n for n in chosen}


@dataclass(frozen=True)
class VisionWeightCheck:
    """Whether an int4 export keeps its vision graph's weights at 8 bits (the manifest's
    ``quantizer.int8.vision_weights``).

    Measured at export (export/onnx.py): each check scene's score (its scene pass) with the
    float32 decoder reading the image embeddings of the vision graph at 4 bits, against the
    same with the float32 vision graph's; ``max_abs_diff`` is the largest |Δs| over the
    ``scenes``. Over ``bound`` (export/int8.py's ``VISION_SHARE`` of the precision's score
    tolerance), or not finite, the vision graph's weights stay at 8 bits."""

    max_abs_diff: float
    bound: float
    scenes: int

    @property
    def eight_bit(self) -> bool:
        return not self.max_abs_diff <= self.bound  # NaN: 8 bits

    def as_meta(self) -> dict[str, Any]:
        from spotstop.export.int8 import VISION_SHARE

        return {
            "rule": f"vision weights at 8 bits when max |ds| > {VISION_SHARE:g} x score tolerance",
            "max_abs_diff": round(self.max_abs_diff, 6)
            if self.max_abs_diff == self.max_abs_diff
            else str(self.max_abs_diff),
            "bound": round(self.bound, 6),
            "scenes": self.scenes,
            "bits": 8 if self.eight_bit else 4,
        }


def vision_weight_check(moves: Any, score_atol: float) -> VisionWeightCheck:
    """int4's vision rule on the measured |Δs| of the check scenes (``moves``, one per scene)
    that the vision graph's 4-bit weights cause: the rule of int8's vision activations
    (export/int8.py's :func:`~spotstop.export.int8.vision_activation_check`, called here: one
    rule), its remedy 8-bit vision weights.

    Measured (bench/RESULTS.md, ``trained-world``; docs/limits.md): on the trained tiny pair,
    ``tiny-lfm2_vl``'s 4-bit vision graph moved the 8 calibration scenes at most 0.425 and 32
    check scenes (those 8 first) 0.973 (bound 0.5); it moved a held-out world scene 1.59
    (tolerance 1.0), and with 8-bit vision weights that world's max |Δs| was 0.501.
    ``tiny-qwen3_5``'s moved both sets 0.348 and keeps 4 bits."""
    from spotstop.export.int8 import vision_activation_check

    c = vision_activation_check(moves, score_atol)
    return VisionWeightCheck(c.max_abs_diff, c.bound, c.scenes)


#: the decoder's selector groups :func:`decoder_weight_check` tries, each alone, in this order
#: (ties: the first): llama.cpp's ``Q4_K_M`` mix, and the Gated-DeltaNet layers (an
#: architecture without them has no such weights, and the group is not tried)
DECODER_GROUPS: tuple[tuple[str, ...], ...] = (Q4_K_M, ("linear_attn",))


@dataclass(frozen=True)
class DecoderWeightCheck:
    """Which decoder group an int4 export keeps at 8 bits (the manifest's
    ``quantizer.int8.decoder_weights``): ``moves`` maps each tried choice (``"none"``: every
    decoder weight at 4 bits; else the group's selectors joined by ``+``) to the largest |Δs|
    it moved the check scenes' scores (both passes, float32 vision graph); ``bound`` is the
    decoder's share of the score tolerance. ``kept``: the choice made."""

    moves: dict[str, float]
    bound: float
    scenes: int
    kept: str

    def as_meta(self) -> dict[str, Any]:
        from spotstop.export.int8 import VISION_SHARE

        return {
            "rule": (
                f"over {1 - VISION_SHARE:g} x score tolerance, the group of {list(map('+'.join, DECODER_GROUPS))} "
                "whose 8 bits move the check scenes least"
            ),
            "max_abs_diff": {k: round(v, 6) if v == v else str(v) for k, v in self.moves.items()},
            "bound": round(self.bound, 6),
            "scenes": self.scenes,
            "kept": self.kept,
        }


def decoder_weight_check(
    moves: dict[str, Any], score_atol: float, scenes: int
) -> DecoderWeightCheck:
    """int4's decoder rule on the measured |Δs| of the check scenes: ``moves["none"]`` the
    all-4-bit decoder's (one per score), and one entry per group tried (its selectors joined by
    ``+``, in :data:`DECODER_GROUPS` order). Within ``(1 − VISION_SHARE) · score_atol`` (the
    vision graph has the rest) nothing is kept; over it, the group with the smallest largest
    move, if it is smaller than all-4-bit's (a move that is not finite counts as infinite).

    Measured (bench/RESULTS.md, ``trained-world``; docs/limits.md): ``tiny-qwen3_5``'s all-4-bit
    decoder moved 32 check scenes up to 3.08; with its Gated-DeltaNet layers at 8 bits 1.07,
    with ``Q4_K_M`` more than 1.7 (the request-only pass)."""
    from spotstop.export.int8 import VISION_SHARE

    if "none" not in moves:
        raise ValueError("decoder_weight_check needs the all-4-bit decoder's moves ('none').")
    if not score_atol > 0:
        raise ValueError(f"score_atol must be positive; got {score_atol}.")

    def worst(v: Any) -> float:
        d = np.abs(np.asarray(v, dtype=np.float64))
        if d.size == 0:
            raise ValueError("the decoder check needs at least one check scene's score.")
        return float(d.max()) if np.isfinite(d).all() else math.inf

    got = {k: worst(v) for k, v in moves.items()}
    bound = (1.0 - VISION_SHARE) * score_atol
    kept = "none"
    if not got["none"] <= bound:
        best = min((k for k in got if k != "none"), key=lambda k: got[k], default=None)
        if best is not None and got[best] < got["none"]:
            kept = best
    return DecoderWeightCheck(got, bound, scenes, kept)
