"""LFM2-VL (``model_type`` ``lfm2_vl``) on the workstation: export config, cost model, int4
roles, the recorded LFM2.5-VL-3B. The runtime half (image grid, preprocessing, prompt text) is
``guard/archs/lfm2_vl.py``; :data:`ARCH` joins both (export/archs/__init__.py registers it).

Export facts (checked with torch 2.13 / transformers 5.24 / onnxruntime 1.32):

* The SigLIP2 vision tower exports with the legacy TorchScript exporter (``dynamo=False``) at a
  fixed image grid (the resized position table is traced into a constant).
* The LFM2 decoder (short convolutions + attention) exports with the legacy exporter with a
  dynamic batch and sequence length; its positions are the default 0, 1, 2, ...

Cost: the SigLIP2 NaFlex tower (linear patch embedding, resized position table, bidirectional
attention; its attention-pooling head is stored but never read) with a pixel-unshuffle
projector, and an LFM2 decoder of gated short-convolution layers and GQA attention layers.
Int4 roles: the tower is ``vision_tower`` and ``multi_modal_projector``; the feed-forward down
projection is ``feed_forward.w2``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spotstop.export.archs._base import Architecture, RecordedMember
from spotstop.export.archs._cost_model import ArchCost, Params
from spotstop.export.archs._cost_model import config_value as _g
from spotstop.export.archs._export_config import (
    RESCALE_NORMALIZE,
    ExportConfig,
    FusedPatch,
    MemberRecipe,
)
from spotstop.export.mixed import MixedRoles
from spotstop.guard.archs import lfm2_vl as runtime

if TYPE_CHECKING:
    import torch

__all__ = ["ARCH", "LFM25_VL_3B", "MIXED_ROLES", "Lfm2VlCost", "Lfm2VlExportConfig"]

# -- export config ----------------------------------------------------------------------------

_LFM_SPECIALS = (
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<|image_start|>",
    "<|image_end|>",
    "<|img_thumbnail|>",
    *[f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)],
)

# Shaped like the LFM2-VL template: BOS, ChatML turns, a bare <image> placeholder.
_LFM_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_LFM_ROLES = {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}


class Lfm2VlExportConfig(ExportConfig):
    """LFM2-VL (LFM2 short convolutions + attention; SigLIP2 vision tower, pixel unshuffle)."""

    model_type = "lfm2_vl"
    vision_exporter = "legacy"
    decoder_exporter = "legacy"
    decoder_fixed_length = False
    member_recipe = MemberRecipe(
        config_class="Lfm2VlConfig",
        model_class="Lfm2VlForConditionalGeneration",
        tiny_config={
            "text_config": {
                "model_type": "lfm2",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "layer_types": ["conv", "conv", "full_attention", "conv"],
                "initializer_range": 0.08,
                "max_position_embeddings": 2048,
            },
            "vision_config": {
                "model_type": "siglip2_vision_model",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "patch_size": 16,
                "num_patches": 64,
            },
            "projector_hidden_size": 64,
            "downsample_factor": 2,
            "tie_word_embeddings": True,
        },
        specials=_LFM_SPECIALS,
        added=(),
        chat_template=_LFM_TEMPLATE,
        roles=_LFM_ROLES,
        additional_special_tokens=tuple(t for t in _LFM_SPECIALS if t not in _LFM_ROLES.values()),
        split_pattern=None,
        corpus_seed_offset=1,
        text_token_ids={
            "pad_token_id": "<|pad|>",
            "bos_token_id": "<|startoftext|>",
            "eos_token_id": "<|im_end|>",
        },
        token_ids={"image_token_id": "<image>"},
    )

    @classmethod
    def fused_patches(cls) -> list[FusedPatch]:
        """The fused graph form: the LFM2 decoder's layers on onnxruntime's fused operators
        (the layers below)."""
        from spotstop.export import fused
        from transformers.models.lfm2 import modeling_lfm2 as mod
        from transformers.models.siglip2 import modeling_siglip2 as siglip2

        if cls.position_ids.__func__ is not ExportConfig.position_ids.__func__:  # type: ignore[attr-defined]
            raise NotImplementedError(
                "LFM2's fused attention applies rotary at GQA's own positions 0 .. L-1; its "
                "export config now computes other position ids, so the fused rotary would be "
                "wrong. Export the standard graph form, or pass the rotary outside "
                "GroupQueryAttention (do_rotary=0)."
            )
        return [
            (mod, "causal_conv1d_fn", fused.fused_causal_conv1d_fn),
            (mod.Lfm2Attention, "forward", _fused_attention_forward),
            (mod.Lfm2RMSNorm, "forward", _fused_rms_norm_forward),
            (mod.Lfm2DecoderLayer, "forward", _fused_layer_forward),
            (siglip2.Siglip2Attention, "forward", _fused_vision_attention_forward),
        ]

    @classmethod
    def image_processor_config(
        cls, config: Mapping[str, Any], image_tokens: tuple[int, int]
    ) -> dict[str, Any]:
        return {
            "image_processor_type": "Lfm2VlImageProcessor",
            "do_image_splitting": False,
            "downsample_factor": int(config.get("downsample_factor", 2)),
            "encoder_patch_size": 16,
            "min_image_tokens": image_tokens[0],
            "max_image_tokens": image_tokens[1],
            **RESCALE_NORMALIZE,
            "resample": 2,
            "use_thumbnail": False,
            "tile_size": 512,
        }


# -- fused graph form: LFM2's layers on onnxruntime's fused operators -------------------------
#
# What each layer becomes (export/fused.py has the operators; as genai 0.18 writes lfm2):
#
# * short convolutions: a left ``Pad`` and a depthwise ``Conv`` (onnxruntime's
#   ``CausalConvWithState`` is slower on CPU: bench/fused_ops.py); the ``B * x`` gate before it
#   and ``C * y`` after it stay standard nodes.
# * attention: ``GroupQueryAttention`` WITH its rotary (half-split, at GQA's own positions
#   0 .. L-1, which are the decoder's position ids: the default ones); the q/k layernorms
#   before it in ``SimplifiedLayerNormalization``.
# * RMSNorms: ``SimplifiedLayerNormalization``; the residual Add + feed-forward norm of each
#   layer as one ``SkipSimplifiedLayerNormalization``.
# * the SigLIP2 vision tower's attention: one ``MultiHeadAttention``, the pixel attention mask
#   (padded patches) as its key padding mask.


def _fused_vision_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``Siglip2Attention.forward`` with the attention as one ``MultiHeadAttention``.

    transformers passes no mask when every patch is real, else a (B, 1, S, S) mask built from
    the pixel attention mask, the same for every query (a KEY padding mask: true, or 0.0
    additive, where a key is read); its first query row is the op's ``key_padding_mask``."""
    import torch
    from spotstop.export import fused

    key_mask = None
    if attention_mask is not None:
        if attention_mask.dim() != 4:
            raise NotImplementedError(
                f"the fused SigLIP2 attention reads a (B, 1, S, S) mask; got "
                f"{tuple(attention_mask.shape)}. Export with graph_form='standard'."
            )
        row = attention_mask[:, 0, 0, :]
        key_mask = row if row.dtype == torch.bool else row == 0
    out = fused.multi_head_attention(
        self.q_proj(hidden_states),
        self.k_proj(hidden_states),
        self.v_proj(hidden_states),
        self.num_heads,
        self.scale,
        key_mask=key_mask,
    )
    return self.out_proj(out), None


def _fused_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``Lfm2Attention.forward`` for the scoring pass, attention AND rotary as one
    ``GroupQueryAttention``.

    The rotary caches are the first half of transformers' own cos/sin (``position_embeddings``,
    (1, L, D), computed from ``position_ids`` = 0 .. L-1): row p is position p, the position GQA
    gives row p of a first prompt chunk. The mask is not read (export/fused.py: all ones)."""
    from spotstop.export import fused

    if cache is not None:
        raise NotImplementedError("the fused attention serves the scoring pass only (no cache).")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_layernorm(self.q_proj(hidden_states).view(*hidden_shape))
    key_states = self.k_layernorm(self.k_proj(hidden_states).view(*hidden_shape))
    value_states = self.v_proj(hidden_states)
    cos, sin = position_embeddings
    half = self.head_dim // 2
    attn = fused.group_query_attention(
        query_states.reshape(*input_shape, -1),
        key_states.reshape(*input_shape, -1),
        value_states,
        self.config.num_attention_heads,
        self.config.num_key_value_heads,
        self.scaling,
        rotary=(cos[0, :, :half], sin[0, :, :half]),
    )
    return self.out_proj(attn), None


def _fused_rms_norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``Lfm2RMSNorm.forward`` as ``SimplifiedLayerNormalization``."""
    from spotstop.export import fused

    return fused.rms_norm(x, self.weight.float(), self.variance_epsilon)


def _fused_layer_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Lfm2DecoderLayer.forward`` with the residual Add and the feed-forward RMSNorm as one
    ``SkipSimplifiedLayerNormalization``."""
    from spotstop.export import fused

    residual = hidden_states
    if self.is_attention_layer:
        hidden_states, _ = self.self_attn(
            hidden_states=self.operator_norm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            **kwargs,
        )
    else:
        hidden_states = self.conv(
            hidden_states=self.operator_norm(hidden_states),
            cache=cache,
            attention_mask=attention_mask,
            **kwargs,
        )
    norm = self.ffn_norm
    normed, hidden_states = fused.skip_rms_norm(
        hidden_states, residual, norm.weight.float(), norm.variance_epsilon
    )
    return hidden_states + self.feed_forward(normed)


# -- cost model -------------------------------------------------------------------------------


class Lfm2VlCost(ArchCost):
    """LFM2-VL: SigLIP2 NaFlex tower (linear patch embedding, resized position table,
    bidirectional attention) + pixel-unshuffle projector, and an LFM2 decoder of gated
    short-convolution layers and GQA attention layers."""

    model_type = "lfm2_vl"
    layer_types = frozenset({"conv", "full_attention"})

    def visual_tokens(self, config: Mapping[str, Any], grid: tuple[int, int]) -> int:
        f = int(_g(config, "downsample_factor", 2))
        return (grid[0] // f) * (grid[1] // f)

    @staticmethod
    def _ff(t: Mapping[str, Any]) -> int:
        """LFM2's MLP width (Lfm2MLP: auto-adjusted to 2/3, times the multiplier, rounded up)."""
        inter = int(t["intermediate_size"])
        if bool(_g(t, "block_auto_adjust_ff_dim", True)):
            inter = int(2 * inter / 3)
            mult = t.get("block_ffn_dim_multiplier", 1.0)
            if mult is not None:
                inter = int(float(mult) * inter)
                step = int(_g(t, "block_multiple_of", 256))
                inter = step * ((inter + step - 1) // step)
        return inter

    def vision_macs(self, config: Mapping[str, Any], grid: tuple[int, int]) -> dict[str, int]:
        v = self.vision(config)
        d, i = int(v["hidden_size"]), int(v["intermediate_size"])
        depth, p = int(v["num_hidden_layers"]), int(_g(v, "patch_size", 16))
        c, table = int(_g(v, "num_channels", 3)), int(_g(v, "num_patches", 256))
        f, ph = int(_g(config, "downsample_factor", 2)), int(config["projector_hidden_size"])
        h = int(self.text(config)["hidden_size"])
        n = grid[0] * grid[1]
        return {
            "patch embedding": n * c * p * p * d,
            "position-table resize": n * table * d,
            "linear layers": depth * n * (4 * d * d + 2 * d * i),
            "attention": depth * self._attention(n, 1, d),
            "projector": (n // (f * f)) * (d * f * f * ph + ph * h),
        }

    def decoder_macs(self, config: Mapping[str, Any], length: int) -> dict[str, int]:
        t = self.text(config)
        h = int(t["hidden_size"])
        layers = self.checked_layers(t)
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        k = int(_g(t, "conv_L_cache", 3))
        n_full = sum(x == "full_attention" for x in layers)
        n_conv = len(layers) - n_full
        big_l = length
        return {
            "MLP": len(layers) * big_l * 3 * h * self._ff(t),
            "attention projections": n_full * big_l * h * (2 * nh * hd + 2 * nkv * hd),
            "attention": n_full * self._attention(big_l, nh, hd),
            "short-conv projections": n_conv * big_l * 4 * h * h,
            "short conv": n_conv * h * k * (big_l + k - 1),
        }

    def decoder_linears(self, config: Mapping[str, Any]) -> list[tuple[int, bool, str, int]]:
        t = self.text(config)
        h, ff = int(t["hidden_size"]), self._ff(t)
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        out: list[tuple[int, bool, str, int]] = []
        for i, kind in enumerate(self.checked_layers(t)):
            if kind == "full_attention":  # v_proj; q_proj, k_proj, out_proj
                out += [
                    (i, False, "value", h * nkv * hd),
                    (i, False, "mixer", h * (2 * nh * hd + nkv * hd)),
                ]
            else:  # the short convolution's in_proj (B, C, x) and out_proj
                out.append((i, False, "mixer", 4 * h * h))
            out += [(i, False, "down", ff * h), (i, False, "feed_forward", 2 * h * ff)]
        return out

    def params(self, config: Mapping[str, Any]) -> Params:
        t, v = self.text(config), self.vision(config)
        d, i = int(v["hidden_size"]), int(v["intermediate_size"])
        depth, p = int(v["num_hidden_layers"]), int(_g(v, "patch_size", 16))
        c, table = int(_g(v, "num_channels", 3)), int(_g(v, "num_patches", 256))
        f, ph = int(_g(config, "downsample_factor", 2)), int(config["projector_hidden_size"])
        h, vocab = int(t["hidden_size"]), int(t["vocab_size"])
        df = d * f * f
        vl = c * p * p * d + depth * (4 * d * d + 2 * d * i) + df * ph + ph * h
        vo = d + table * d + depth * (4 * d + 4 * d + i + d) + 2 * d  # biases, norms, table
        if bool(_g(config, "projector_use_layernorm", True)):
            vo += 2 * df
        if bool(_g(config, "projector_bias", True)):
            vo += ph + h
        unused = (0, 0)
        if bool(_g(v, "vision_use_head", True)):  # stored in the checkpoint, never read
            unused = (4 * d * d + 2 * d * i, d + 3 * d + d + 2 * d + i + d)
            vl, vo = vl + unused[0], vo + unused[1]
        layers = list(t["layer_types"])
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        k = int(_g(t, "conv_L_cache", 3))
        cb = bool(_g(t, "conv_bias", False))
        n_full = sum(x == "full_attention" for x in layers)
        n_conv = len(layers) - n_full
        tl = len(layers) * 3 * h * self._ff(t)
        tl += n_full * h * (2 * nh * hd + 2 * nkv * hd) + n_conv * 4 * h * h
        to = h + len(layers) * 2 * h + n_full * 2 * hd
        to += n_conv * (h * k + (3 * h + h + h if cb else 0))
        tied = bool(_g(config, "tie_word_embeddings", _g(t, "tie_word_embeddings", True)))
        ends = c * p * p * d + ph * h  # the patch embedding, the projector's last layer
        return Params(vl, vo, tl, vocab * h, 0 if tied else vocab * h, to, unused, ends)


# -- int4 mixed-precision roles ----------------------------------------------------------------

#: where the rule's roles sit among the torch model's Linear names (export/mixed.py)
MIXED_ROLES = MixedRoles(
    vision=("vision_tower", "vision_model", "multi_modal_projector"),
    value=("self_attn.v_proj",),
    down=("feed_forward.w2",),
    feed_forward=("feed_forward",),
    linear_attention=None,
)

# -- the recorded real member ------------------------------------------------------------------

#: LiquidAI/LFM2.5-VL-3B (text backbone LFM2.5-2.6B): config values RECORDED from its
#: ``config.json`` on the Hugging Face hub (not re-read here: no model hub in this environment).
#: Paper settings (seed 000, Supp. F.4): "low" without tiling at 64 visual tokens (256x256; the
#: paper's 32-64); "default" with tiling, taken for a 1024x1024 image as 2x2 tiles of 512x512
#: (256 tokens each) plus a 512x512 thumbnail (256): ASSUMED, the paper does not give its
#: images' sizes. Visual tokens do not count LFM2-VL's tile markers.
LFM25_VL_3B = RecordedMember(
    name="LFM2.5-VL-3B",
    hub_id="LiquidAI/LFM2.5-VL-3B",
    config={
        "model_type": "lfm2_vl",
        "tie_word_embeddings": True,
        "downsample_factor": 2,
        "projector_hidden_size": 2560,
        "text_config": {
            "model_type": "lfm2",
            "vocab_size": 131072,
            "hidden_size": 2048,
            "intermediate_size": 10752,
            "block_ff_dim": 10752,
            "block_auto_adjust_ff_dim": False,
            "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0,
            "num_hidden_layers": 30,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "layer_types": [
                "full_attention" if i in (2, 5, 8, 11, 14, 17, 21, 25) else "conv"
                for i in range(30)
            ],
        },
        "vision_config": {
            "model_type": "siglip2_vision_model",
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "patch_size": 16,
            "num_patches": 256,
        },
    },
    settings={"low": [(16, 16)], "default": [(32, 32)] * 5},
)

#: the registered entry (export/archs/__init__.py)
ARCH = Architecture(
    model_type="lfm2_vl",
    runtime=runtime.SPEC,
    export_config=Lfm2VlExportConfig,
    cost=Lfm2VlCost(),
    mixed_roles=MIXED_ROLES,
    recorded=(LFM25_VL_3B,),
)
