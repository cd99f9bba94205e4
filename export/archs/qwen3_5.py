"""Qwen3.5 (``model_type`` ``qwen3_5``) on the workstation: export config, cost model, int4
roles, the recorded Qwen3.5-2B. The runtime half (image grid, preprocessing, prompt text) is
``guard/archs/qwen3_5.py``; :data:`ARCH` joins both (export/archs/__init__.py registers it).

Export facts (checked with torch 2.13 / transformers 5.24 / onnxruntime 1.32):

* The vision tower exports with the legacy TorchScript exporter (``dynamo=False``) at a fixed
  image grid (the grid-dependent position tables are traced into constants).
* The decoder exports with ``dynamo=True`` and a dynamic sequence length: ONE graph for every
  length up to the longest bucket. While it is exported,
  :meth:`Qwen35ExportConfig.decoder_patcher` swaps transformers' chunked Gated-DeltaNet
  (``torch_chunk_gated_delta_rule``: a Python loop over chunks and, when exporting, a
  row-by-row triangular solve, unrolled for one length: ~5,400 nodes per layer of the tiny
  member at 256 tokens, and one graph per length bucket) for the exact loop-free kernel of
  export/gated_delta.py (~185 nodes per layer, whatever the length). The legacy exporter cannot
  give that graph a dynamic length (its traced chunk count becomes a constant), and its graphs
  carry no module metadata, which the fp16 conversion needs to keep the delta rule float32.
* The decoder's positions are M-RoPE (:meth:`Qwen35ExportConfig.position_ids`), computed in
  the graph from the image tokens.

Cost: a ViT (Conv3d patch embedding, bidirectional attention, 2x2 patch merger) and a hybrid
decoder of Gated-DeltaNet layers (counted as transformers' chunked algorithm, chunk 64) and
gated full-attention layers (GQA). Int4 roles: the tower is ``visual``; a Gated-DeltaNet
layer's fused ``linear_attn.in_proj_qkv`` is its value projection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spotstop.export.archs._base import Architecture, RecordedMember
from spotstop.export.archs._cost_model import CHUNK, ArchCost, Params
from spotstop.export.archs._cost_model import config_value as _g
from spotstop.export.archs._export_config import (
    RESCALE_NORMALIZE,
    ExportConfig,
    FusedPatch,
    MemberRecipe,
)
from spotstop.export.mixed import MixedRoles
from spotstop.guard.archs import qwen3_5 as runtime

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch

__all__ = ["ARCH", "MIXED_ROLES", "QWEN35_2B", "Qwen35Cost", "Qwen35ExportConfig"]

# -- export config ----------------------------------------------------------------------------

_QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# Shaped like the Qwen3.5 template: images in a vision span, <think></think> when reasoning is off.
# (Literal strings inside {{ }} keep their newlines; "-" only trims the template's own layout.)
_QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


class Qwen35ExportConfig(ExportConfig):
    """Qwen3.5 (Gated-DeltaNet + full attention; Qwen3.5 vision tower, 2x2 merger)."""

    model_type = "qwen3_5"
    vision_exporter = "legacy"
    decoder_exporter = "dynamo"
    decoder_fixed_length = False
    # the Gated-DeltaNet's decay and chunked delta rule run in float32 in transformers' code
    fp32_modules = ("GatedDeltaNet",)
    member_recipe = MemberRecipe(
        config_class="Qwen3_5Config",
        model_class="Qwen3_5ForConditionalGeneration",
        tiny_config={
            "text_config": {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "layer_types": [
                    "linear_attention",
                    "linear_attention",
                    "linear_attention",
                    "full_attention",
                ],
                "max_position_embeddings": 2048,
                "initializer_range": 0.08,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [2, 1, 1],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_heads": 4,
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "out_hidden_size": 64,
                "num_position_embeddings": 64,
                "initializer_range": 0.08,
            },
            "tie_word_embeddings": False,
        },
        specials=_QWEN_SPECIALS,
        # added but not "special" in the real Qwen3.5 tokenizer (they are decoded like text)
        added=("<think>", "</think>", "<tool_call>", "</tool_call>"),
        chat_template=_QWEN_TEMPLATE,
        roles={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        additional_special_tokens=tuple(t for t in _QWEN_SPECIALS if t != "<|endoftext|>"),
        # the pre-tokenizer regex of the real Qwen3.5 tokenizer
        split_pattern=(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
            r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        corpus_seed_offset=0,
        text_token_ids={"eos_token_id": "<|im_end|>", "pad_token_id": "<|endoftext|>"},
        token_ids={
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
        },
    )

    @classmethod
    def decoder_patcher(cls, max_length: int) -> AbstractContextManager[None]:
        """The loop-free Gated-DeltaNet kernel (export/gated_delta.py), exact up to
        ``max_length`` tokens."""
        from spotstop.export.gated_delta import compact_gated_delta

        return compact_gated_delta(max_length)

    @classmethod
    def fused_patches(cls) -> list[FusedPatch]:
        """The fused graph form: transformers' Gated-DeltaNet functions and the decoder's and
        vision tower's layers on onnxruntime's fused operators (the layers below)."""
        from spotstop.export import fused
        from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

        return [
            (mod, "torch_chunk_gated_delta_rule", fused.fused_chunk_gated_delta_rule),
            (mod, "causal_conv1d_fn", fused.fused_causal_conv1d_fn),
            (mod.Qwen3_5GatedDeltaNet, "forward", _fused_gated_delta_net_forward),
            (mod.Qwen3_5VisionPatchEmbed, "forward", _fused_patch_embed_forward),
            (mod.Qwen3_5VisionAttention, "forward", _fused_vision_attention_forward),
            (mod.Qwen3_5Attention, "forward", _fused_attention_forward),
            (mod.Qwen3_5RMSNorm, "forward", _fused_rms_norm_forward),
            (mod.Qwen3_5RMSNormGated, "forward", _fused_gated_norm_forward),
            (mod.Qwen3_5DecoderLayer, "forward", _fused_layer_forward),
        ]

    @classmethod
    def position_ids(
        cls, input_ids: torch.Tensor, is_image: torch.Tensor, grid: tuple[int, int]
    ) -> torch.Tensor:
        """M-RoPE positions (3, B, L): text, then the image's (t, h, w) grid, then text again
        offset by the grid's longest side (as transformers' Qwen3.5 places them)."""
        import torch

        gh, gw = grid
        b, length = input_ids.shape
        idx = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(b, length)
        count = torch.cumsum(is_image.long(), dim=1)  # image tokens up to and including here
        k = count - 1  # rank of an image token within the image
        start = idx - k  # the image's first position (valid on image tokens)
        text = idx - count + torch.where(count > 0, max(gh, gw), 0)
        t = torch.where(is_image, start, text)
        h = torch.where(is_image, start + torch.div(k, gw, rounding_mode="floor"), text)
        w = torch.where(is_image, start + torch.remainder(k, gw), text)
        return torch.stack([t, h, w], dim=0)

    @classmethod
    def image_processor_config(
        cls, config: Mapping[str, Any], image_tokens: tuple[int, int]
    ) -> dict[str, Any]:
        # Qwen2VLImageProcessor's own pixel bounds: 1 to 1024 visual tokens
        return {
            **RESCALE_NORMALIZE,
            "image_processor_type": "Qwen2VLImageProcessor",
            "do_resize": True,
            "do_convert_rgb": True,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "size": {"shortest_edge": 32 * 32, "longest_edge": 1024 * 32 * 32},
            "resample": 3,
        }


# -- fused graph form: Qwen3.5's layers on onnxruntime's fused operators ----------------------
#
# What each layer becomes (export/fused.py has the operators; genai 0.18's model builder writes
# qwen3_5 the same way, builders/qwen.py):
#
# * Gated-DeltaNet: a depthwise ``Conv`` (+ SiLU) for the short convolution,
#   ``LinearAttentionGate`` for decay and beta (``-exp(A_log)`` a folded constant),
#   ``LinearAttention`` (update_rule="gated_delta", q/k L2-normalised before it in standard
#   nodes: genai's LpNormalization has no eps; ``q_num_heads`` the key heads, ``kv_num_heads``
#   the value heads) and ``SimplifiedLayerNormalization`` · ``silu(z)`` per value head (the
#   com.microsoft ``CausalConvWithState`` and ``GatedRMSNorm`` kernels are measured slower on
#   CPU than these standard nodes: bench/fused_ops.py).
# * attention: ``GroupQueryAttention`` without rotary: the q/k RMSNorms and the interleaved
#   M-RoPE stay before it (M-RoPE places each token at three positions, which GQA's rotary
#   cannot express; genai's ``is_fused_rope_supported`` is False for qwen3_5 too), the output
#   gate ``sigmoid(gate)`` after it.
# * RMSNorms: ``SimplifiedLayerNormalization`` with the ``1 + w`` scale folded; the residual Add
#   + post-attention norm of each layer as one ``SkipSimplifiedLayerNormalization``.
# * vision patch embedding: the Conv3d (kernel = stride = one patch) as one Linear.
# * vision attention: one ``MultiHeadAttention`` per block (one image of one frame: one
#   ``cu_seqlens`` span), the 2-D rotary before it in standard nodes.


def _fused_gated_delta_net_forward(
    self: Any,
    hidden_states: torch.Tensor,
    cache: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5GatedDeltaNet.forward`` for the scoring pass (no cache): the projections,
    the short convolution, the gates, the delta rule and the gated norm on the fused operators,
    in transformers' order and maths."""
    from spotstop.export import fused
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    if cache is not None:
        raise NotImplementedError(
            "the fused Gated-DeltaNet serves the scoring pass only (no cache)."
        )
    hidden_states = mod.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch_size, seq_len, _ = hidden_states.shape
    mixed_qkv = self.in_proj_qkv(hidden_states).transpose(1, 2)
    z = self.in_proj_z(hidden_states).reshape(batch_size, seq_len, -1, self.head_v_dim)
    b = self.in_proj_b(hidden_states)
    a = self.in_proj_a(hidden_states)
    mixed_qkv = fused.fused_causal_conv1d_fn(
        mixed_qkv, self.conv1d.weight.squeeze(1), self.conv1d.bias, activation=self.activation
    ).transpose(1, 2)
    query, key, value = mixed_qkv.split([self.key_dim, self.key_dim, self.value_dim], -1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)
    g, beta = fused.linear_attention_gate(a, self.dt_bias.float(), -self.A_log.float().exp(), b)
    core, _ = fused.fused_chunk_gated_delta_rule(
        query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch_size, seq_len, -1))


def _fused_patch_embed_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``Qwen3_5VisionPatchEmbed.forward`` as one Linear: its Conv3d's kernel is its stride and
    each input row is one whole patch, so the convolution is a product with the flattened
    kernel. onnxruntime's CPU Conv3d took 50-120 ms for Qwen3.5-2B's 1024 patches (profiled,
    bench/real_pair.py); as a MatMul it is ~10 ms in float32, and the int8 quantizer reaches it."""
    import torch.nn.functional as F

    w = self.proj.weight
    x = hidden_states.reshape(-1, w[0].numel()).to(w.dtype)
    return F.linear(x, w.reshape(w.shape[0], -1), self.proj.bias)


def _fused_vision_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlen: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5VisionAttention.forward`` for ONE image: q, k, v split from the fused
    projection on its last axis (no reshape to heads and back), the 2-D rotary of q and k as one
    ``RotaryEmbedding`` each (the patch's own row of the cos/sin tables: positions 0 .. S-1)
    and the attention as one ``MultiHeadAttention`` (bidirectional, no mask).

    transformers attends within each ``cu_seqlens`` span (one per image and frame); the vision
    graph is traced for one image of one frame (export/graphs.py ``VisionGraph``), so there is
    one span. More spans are refused (attention across them would be wrong)."""
    from spotstop.export import fused

    if cu_seqlens.shape[0] != 2:
        raise NotImplementedError(
            f"the fused vision attention serves one image of one frame; this grid has "
            f"{cu_seqlens.shape[0] - 1} attention spans. Export the vision graph with "
            "graph_form='standard'."
        )
    if position_embeddings is None:
        raise ValueError("Qwen3.5's vision attention needs its rotary position embeddings.")
    seq_length = hidden_states.shape[0]
    qkv = self.qkv(hidden_states).unsqueeze(0)  # (1, S, 3·H·D): q, k, v in that order
    q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
    cos, sin = position_embeddings
    q = fused.rotary_embedding(q, cos, sin, self.num_heads)
    k = fused.rotary_embedding(k, cos, sin, self.num_heads)
    out = fused.multi_head_attention(q, k, v, self.num_heads, self.scaling)
    return self.proj(out.reshape(seq_length, -1))


def _fused_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``Qwen3_5Attention.forward`` for the scoring pass, the causal attention as
    ``GroupQueryAttention``; projections, output gate, (1 + w) q/k RMSNorms and interleaved
    M-RoPE as transformers. The mask is not read (export/fused.py: it is all ones)."""
    from spotstop.export import fused
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    if cache is not None:
        raise NotImplementedError("the fused attention serves the scoring pass only (no cache).")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states, gate = (
        self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2).chunk(2, dim=-1)
    )
    gate = gate.reshape(*input_shape, -1)
    query_states = self.q_norm(query_states.view(hidden_shape))
    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape))
    value_states = self.v_proj(hidden_states)
    cos, sin = position_embeddings
    query_states, key_states = mod.apply_rotary_pos_emb(
        query_states, key_states, cos, sin, unsqueeze_dim=2
    )
    attn = fused.group_query_attention(
        query_states.reshape(*input_shape, -1),
        key_states.reshape(*input_shape, -1),
        value_states,
        self.config.num_attention_heads,
        self.config.num_key_value_heads,
        self.scaling,
    )
    return self.o_proj(attn * gate.sigmoid()), None


def _fused_rms_norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``Qwen3_5RMSNorm.forward`` (scale ``1 + w``) as ``SimplifiedLayerNormalization``."""
    from spotstop.export import fused

    return fused.rms_norm(x, 1.0 + self.weight.float(), self.eps)


def _fused_gated_norm_forward(
    self: Any, hidden_states: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """``Qwen3_5RMSNormGated.forward``: ``SimplifiedLayerNormalization`` · ``silu(gate)``."""
    from spotstop.export import fused

    return fused.gated_rms_norm(hidden_states, self.weight.float(), gate, self.variance_epsilon)


def _fused_layer_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5DecoderLayer.forward`` with the residual Add and the post-attention RMSNorm as
    one ``SkipSimplifiedLayerNormalization`` (its sum output is the next residual)."""
    from spotstop.export import fused

    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    if self.block_type == "linear_attention":
        hidden_states = self.linear_attn(
            hidden_states=hidden_states, cache=cache, attention_mask=attention_mask, **kwargs
        )
    else:
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
    norm = self.post_attention_layernorm
    hidden_states, residual = fused.skip_rms_norm(
        hidden_states, residual, 1.0 + norm.weight.float(), norm.eps
    )
    return residual + self.mlp(hidden_states)


# -- cost model -------------------------------------------------------------------------------


class Qwen35Cost(ArchCost):
    """Qwen3.5: ViT (Conv3d patch embedding, bidirectional attention, 2x2 patch merger) and a
    hybrid decoder of Gated-DeltaNet layers and gated full-attention layers (GQA)."""

    model_type = "qwen3_5"
    layer_types = frozenset({"linear_attention", "full_attention"})

    def visual_tokens(self, config: Mapping[str, Any], grid: tuple[int, int]) -> int:
        m = int(_g(self.vision(config), "spatial_merge_size", 2))
        return (grid[0] // m) * (grid[1] // m)

    def vision_macs(self, config: Mapping[str, Any], grid: tuple[int, int]) -> dict[str, int]:
        v = self.vision(config)
        d, i = int(v["hidden_size"]), int(v["intermediate_size"])
        depth, p = int(v["depth"]), int(_g(v, "patch_size", 16))
        t, c = int(_g(v, "temporal_patch_size", 2)), int(_g(v, "in_channels", 3))
        m, out = int(_g(v, "spatial_merge_size", 2)), int(v["out_hidden_size"])
        n = grid[0] * grid[1]
        dm = d * m * m
        return {
            "patch embedding": n * c * t * p * p * d,
            "linear layers": depth * n * (4 * d * d + 2 * d * i),
            "attention": depth * self._attention(n, 1, d),
            "patch merger": (n // (m * m)) * (dm * dm + dm * out),
        }

    def decoder_macs(self, config: Mapping[str, Any], length: int) -> dict[str, int]:
        t = self.text(config)
        h, inter = int(t["hidden_size"]), int(t["intermediate_size"])
        layers = self.checked_layers(t)
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        hk, hv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
        dk, dv = int(t["linear_key_head_dim"]), int(t["linear_value_head_dim"])
        k = int(_g(t, "linear_conv_kernel_dim", 4))
        n_full = sum(x == "full_attention" for x in layers)
        n_lin = len(layers) - n_full
        big_l = length
        kd, vd = hk * dk, hv * dv
        conv_dim = 2 * kd + vd
        chunks = math.ceil(big_l / CHUNK)
        c = CHUNK
        gdn_core = hv * chunks * (c * c * (3 * dk + 2 * dv) + 3 * c * dk * dv)
        return {
            "MLP": len(layers) * big_l * 3 * h * inter,
            "attention projections": n_full * big_l * h * (2 * nh * hd + 2 * nkv * hd + nh * hd),
            "attention": n_full * self._attention(big_l, nh, hd),
            "Gated-DeltaNet projections": n_lin * big_l * h * (conv_dim + vd + 2 * hv + vd),
            "Gated-DeltaNet conv": n_lin * conv_dim * k * (big_l + k - 1),
            "Gated-DeltaNet chunked rule": n_lin * gdn_core,
        }

    def decoder_linears(self, config: Mapping[str, Any]) -> list[tuple[int, bool, str, int]]:
        t = self.text(config)
        h, inter = int(t["hidden_size"]), int(t["intermediate_size"])
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        hk, hv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
        kd, vd = hk * int(t["linear_key_head_dim"]), hv * int(t["linear_value_head_dim"])
        out: list[tuple[int, bool, str, int]] = []
        for i, kind in enumerate(self.checked_layers(t)):
            lin = kind == "linear_attention"
            if lin:  # in_proj_qkv (fused q/k/v); in_proj_z, in_proj_b, in_proj_a, out_proj
                out += [
                    (i, lin, "value", h * (2 * kd + vd)),
                    (i, lin, "mixer", h * (2 * vd + 2 * hv)),
                ]
            else:  # v_proj; q_proj (with its gate), k_proj, o_proj
                out += [
                    (i, lin, "value", h * nkv * hd),
                    (i, lin, "mixer", h * (3 * nh * hd + nkv * hd)),
                ]
            out += [(i, lin, "down", inter * h), (i, lin, "feed_forward", 2 * h * inter)]
        return out

    def params(self, config: Mapping[str, Any]) -> Params:
        t, v = self.text(config), self.vision(config)
        d, i = int(v["hidden_size"]), int(v["intermediate_size"])
        depth, p = int(v["depth"]), int(_g(v, "patch_size", 16))
        tp, c = int(_g(v, "temporal_patch_size", 2)), int(_g(v, "in_channels", 3))
        m, out = int(_g(v, "spatial_merge_size", 2)), int(v["out_hidden_size"])
        npos = int(_g(v, "num_position_embeddings", 2304))
        dm = d * m * m
        vl = depth * (4 * d * d + 2 * d * i) + dm * dm + dm * out
        vo = (
            depth * (4 * d + 3 * d + d + i + d)  # 2 LayerNorms, qkv/proj/fc1/fc2 biases
            + 2 * d  # merger LayerNorm
            + dm
            + out  # merger biases
            + d * c * tp * p * p
            + d  # Conv3d patch embedding
            + npos * d  # position table
        )
        h, inter, vocab = int(t["hidden_size"]), int(t["intermediate_size"]), int(t["vocab_size"])
        layers = list(t["layer_types"])
        nh, nkv = int(t["num_attention_heads"]), int(t["num_key_value_heads"])
        hd = int(_g(t, "head_dim", h // nh))
        hk, hv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
        dk, dv = int(t["linear_key_head_dim"]), int(t["linear_value_head_dim"])
        k = int(_g(t, "linear_conv_kernel_dim", 4))
        kd, vd = hk * dk, hv * dv
        bias = bool(_g(t, "attention_bias", False))
        n_full = sum(x == "full_attention" for x in layers)
        n_lin = len(layers) - n_full
        tl = len(layers) * 3 * h * inter
        tl += n_full * h * (2 * nh * hd + 2 * nkv * hd + nh * hd)
        tl += n_lin * h * (2 * kd + vd + vd + 2 * hv + vd)
        to = h + len(layers) * 2 * h  # final norm, 2 norms per layer
        to += n_full * (2 * hd + (2 * nh * hd + 2 * nkv * hd + h if bias else 0))
        to += n_lin * ((2 * kd + vd) * k + 2 * hv + dv)  # conv, dt_bias, A_log, gated norm
        tied = bool(_g(config, "tie_word_embeddings", _g(t, "tie_word_embeddings", False)))
        # the vision graph's ends: the merger's last layer (the patch embedding is a Conv)
        ends = dm * out
        return Params(vl, vo, tl, vocab * h, 0 if tied else vocab * h, to, vision_ends=ends)


# -- int4 mixed-precision roles ----------------------------------------------------------------

#: where the rule's roles sit among the torch model's Linear names (export/mixed.py)
MIXED_ROLES = MixedRoles(
    vision=("visual",),
    value=("self_attn.v_proj", "linear_attn.in_proj_qkv"),
    down=("mlp.down_proj",),
    feed_forward=("mlp",),
    linear_attention="linear_attn",
)

# -- the recorded real member ------------------------------------------------------------------

#: Qwen/Qwen3.5-2B: config values RECORDED from its ``config.json`` on the Hugging Face hub
#: (not re-read here: no model hub in this environment). Paper settings (seed 000, Supp. F.4):
#: "low" 256 visual tokens (512x512), "default" 1,024 visual tokens (1024x1024).
QWEN35_2B = RecordedMember(
    name="Qwen3.5-2B",
    hub_id="Qwen/Qwen3.5-2B",
    config={
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "text_config": {
            "vocab_size": 248320,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 24,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
            "tie_word_embeddings": True,
        },
        "vision_config": {
            "depth": 24,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
        },
    },
    settings={"low": [(32, 32)], "default": [(64, 64)]},
)

#: the registered entry (export/archs/__init__.py)
ARCH = Architecture(
    model_type="qwen3_5",
    runtime=runtime.SPEC,
    export_config=Qwen35ExportConfig,
    cost=Qwen35Cost(),
    mixed_roles=MIXED_ROLES,
    recorded=(QWEN35_2B,),
)
