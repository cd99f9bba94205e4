"""The "fused" graph form: onnxruntime's ``com.microsoft`` operators where they fit.

Two graph forms per target. ``standard`` (TensorRT, and fp16 / int4-trt) is written from
standard ONNX operators (export/graphs.py; Qwen3.5's Gated-DeltaNet as the loop-free kernel of
export/gated_delta.py, attention as MatMul/Softmax, short convolutions as ``Conv``). ``fused``
(onnxruntime CPU: fp32, int8, int4) replaces, while a graph is exported, the pieces onnxruntime
has one kernel for, the way onnxruntime-genai 0.18's model builder writes the same models
(builders/base.py ``make_linear_attention``, ``make_group_query_attention``,
``make_linear_attention_gate``), except where onnxruntime's CPU kernel is measured slower than
the standard nodes it replaces: the short convolutions stay a depthwise ``Conv`` (not
``CausalConvWithState``) and the gated RMSNorm a ``SimplifiedLayerNormalization`` times
``silu(gate)`` (not ``GatedRMSNorm``); ``bench/fused_ops.py`` prints both ratios.

This module is the machinery every architecture shares; which layers of a model are replaced,
and by what, is the architecture's: ``ExportConfig.fused_patches`` in
``export/archs/<model_type>.py`` lists ``(owner, attribute, replacement)`` patches whose
replacement forwards call the functions of this module.

* The custom ops (``torch.library``, ``spotstop_fused::*``), one per com.microsoft operator
  a torch patch writes (:data:`FUSED_OPS` lists those and the GELUs below), each with an eager torch implementation of the same maths: the patched
  model runs in torch, and the legacy exporter, which traces by running, computes real values.
* Their ONNX forms: ``custom_translation_table`` entries for the dynamo exporter
  (:func:`dynamo_translations`) and ``register_custom_op_symbolic`` symbolics for the legacy
  exporter (registered on import).
* What an architecture's layers call: :func:`rms_norm`, :func:`skip_rms_norm`,
  :func:`gated_rms_norm`, :func:`linear_attention_gate`, :func:`group_query_attention`,
  :func:`multi_head_attention`, :func:`rotary_embedding`, and drop-in replacements of transformers' own functions
  (:func:`fused_chunk_gated_delta_rule`, :func:`fused_causal_conv1d_fn`).
* :func:`fused_patcher` (an architecture's patches in place for the length of an export),
  :func:`fuse_graph` (after export: each residual Add that crosses the model's layer loop and
  the RMSNorm after it as one ``SkipSimplifiedLayerNormalization``) and :func:`graph_form_ops`
  (the fused operators a graph holds, for the manifest).
* export/gelu.py's :func:`~spotstop.export.gelu.fuse_gelu`, the one rewrite of the graph the
  precision's conversion wrote (export/onnx.py's ``quantize`` stage, every fused graph of
  every architecture): the exporter's nine-node tanh GELU as ``FastGelu`` (a bias Add before
  it folded in) and the erf GELU as ``Gelu``. After the conversion, not at export, so a
  Linear's bias that the conversion splits from its Gemm folds into FastGelu too.

export/exporters.py's ``export_decoder`` and ``export_vision`` with ``graph_form="fused"``
enter :func:`fused_patcher`, pass :func:`dynamo_translations` to a dynamo export and run
:func:`fuse_graph` on the written decoder; the graph is then tied, folded, validated against
the UNPATCHED transformers model (so the parity is real) and quantized like a standard one.

Why the norms are written here and not left to onnxruntime: its optimizer at ``ORT_ENABLE_ALL``
(what the guard's sessions run) makes no ``SkipSimplifiedLayerNormalization`` in either standard
decoder, and no ``SimplifiedLayerNormalization`` in Qwen3.5's (its RMSNorm's ``1 + w`` scale
hides the pattern); in LFM2's it fuses the norms but leaves the residual Adds.

Padding and the mask. The decoder runs right-padded batches with an all-ones attention mask
(export/graphs.py ``DecoderGraph``): every layer is causal, so the padding after a sequence never
reaches its positions. The fused attention is the same: ``GroupQueryAttention`` with
``causal=1``, ``seqlens_k = L - 1`` for every row and ``total_sequence_length = L`` (the padded
length). It IGNORES the mask transformers passes it, which is exact only because that mask is
all ones: :func:`fused_patcher` is for exporting the scoring graphs of export/graphs.py and
nothing else. A fused rotary (``group_query_attention(..., rotary=...)``) reads GQA's own
positions 0 .. L-1, so an architecture that fuses it must keep the default position ids.

fp16 (and int4-trt, which starts from fp16) starts from the STANDARD graph: export/fp16.py's
rules that keep the norms and the delta rule float32 do not know the fused operators, and
TensorRT has none of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "FUSED_DOMAIN",
    "FUSED_OPS",
    "GRAPH_FORMS",
    "dynamo_translations",
    "fuse_graph",
    "fuse_graph_file",
    "fused_architectures",
    "fused_patcher",
    "graph_form_ops",
]

#: the graph forms an export can write (see the module doc)
GRAPH_FORMS: tuple[str, ...] = ("standard", "fused")

#: the domain (and opset version) of every fused operator
FUSED_DOMAIN = "com.microsoft"
FUSED_DOMAIN_VERSION = 1

#: the fused operators the "fused" form writes: op_type → (domain, outputs the form writes).
#: ``SimplifiedLayerNormalization`` is an onnxruntime contrib op registered in the ONNX domain
#: (as onnxruntime's own optimizer writes it); the others are com.microsoft ops.
FUSED_OPS: dict[str, tuple[str, int]] = {
    "LinearAttention": (FUSED_DOMAIN, 2),
    "GroupQueryAttention": (FUSED_DOMAIN, 1),
    "LinearAttentionGate": (FUSED_DOMAIN, 2),
    "MultiHeadAttention": (FUSED_DOMAIN, 1),
    "RotaryEmbedding": (FUSED_DOMAIN, 1),
    "SkipSimplifiedLayerNormalization": (FUSED_DOMAIN, 4),
    "SimplifiedLayerNormalization": ("", 1),
    # written by export/gelu.py's fuse_gelu on the converted graph (not by a torch patch)
    "FastGelu": (FUSED_DOMAIN, 1),
    "Gelu": (FUSED_DOMAIN, 1),
}

#: the legacy exporter's opset the symbolics are registered at (export/configs.py legacy_opset)
_LEGACY_OPSETS = range(9, 21)


# -- the custom ops: eager maths, fake shapes ---------------------------------------------------


@torch.library.custom_op("spotstop_fused::linear_attention", mutates_args=())
def _linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    q_num_heads: int,
    kv_num_heads: int,
    scale: float,
) -> torch.Tensor:
    """com.microsoft ``LinearAttention`` (update_rule="gated_delta", no past state), packed
    layout: query/key (B, T, Hq·dk), value (B, T, Hkv·dv), decay/beta (B, T, Hkv) → (B, T, Hkv·dv).

    Eager maths: the recurrence token by token (the op's own definition),
    ``S_t = e^g S + β k ⊗ (v − e^g Sᵀ k)``, ``o_t = scale · q_tᵀ S_t``, with key head
    ``h // (Hkv / Hq)`` serving value head ``h`` (inverse GQA, as transformers' Qwen3.5).
    """
    b, t = query.shape[0], query.shape[1]
    dk = query.shape[-1] // q_num_heads
    dv = value.shape[-1] // kv_num_heads
    rep = kv_num_heads // q_num_heads
    q = query.reshape(b, t, q_num_heads, dk).repeat_interleave(rep, 2).transpose(1, 2).float()
    k = key.reshape(b, t, q_num_heads, dk).repeat_interleave(rep, 2).transpose(1, 2).float()
    v = value.reshape(b, t, kv_num_heads, dv).transpose(1, 2).float()
    g = decay.transpose(1, 2).float().exp()
    bt = beta.transpose(1, 2).float()
    state = torch.zeros(b, kv_num_heads, dk, dv, dtype=torch.float32, device=query.device)
    outs = []
    for i in range(t):
        state = state * g[:, :, i, None, None]
        kv_mem = (state * k[:, :, i, :, None]).sum(-2)
        delta = (v[:, :, i] - kv_mem) * bt[:, :, i, None]
        state = state + k[:, :, i, :, None] * delta[:, :, None, :]
        outs.append((state * q[:, :, i, :, None]).sum(-2) * scale)
    out = torch.stack(outs, 2) if outs else v.new_zeros(b, kv_num_heads, 0, dv)
    return out.transpose(1, 2).reshape(b, t, kv_num_heads * dv).to(value.dtype)


@_linear_attention.register_fake
def _(query, key, value, decay, beta, q_num_heads, kv_num_heads, scale):
    return value.new_empty(value.shape)


@torch.library.custom_op("spotstop_fused::group_query_attention", mutates_args=())
def _group_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    do_rotary: int,
    scale: float,
) -> torch.Tensor:
    """com.microsoft ``GroupQueryAttention`` for a first prompt chunk with no cache: causal
    attention over the whole length, ``query`` (B, L, H·D), ``key``/``value`` (B, L, Hkv·D) →
    (B, L, H·D). With ``do_rotary``, q and k are first rotated (half split) at positions
    0 .. L-1 by ``cos_cache``/``sin_cache`` (≥ L, D/2); without, the caches are not read."""
    b, length = query.shape[0], query.shape[1]
    d = query.shape[-1] // num_heads
    q = query.reshape(b, length, num_heads, d).transpose(1, 2)
    k = key.reshape(b, length, kv_num_heads, d).transpose(1, 2)
    v = value.reshape(b, length, kv_num_heads, d).transpose(1, 2)
    if do_rotary:
        cos = torch.cat([cos_cache[:length]] * 2, -1)
        sin = torch.cat([sin_cache[:length]] * 2, -1)

        def rot(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x.chunk(2, -1)
            return x * cos + torch.cat([-x2, x1], -1) * sin

        q, k = rot(q), rot(k)
    rep = num_heads // kv_num_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return out.transpose(1, 2).reshape(b, length, num_heads * d)


@_group_query_attention.register_fake
def _(query, key, value, cos_cache, sin_cache, num_heads, kv_num_heads, do_rotary, scale):
    return query.new_empty(query.shape)


@torch.library.custom_op("spotstop_fused::rms_norm", mutates_args=())
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``SimplifiedLayerNormalization`` over the last axis: ``x · rsqrt(mean(x²) + eps) · weight``
    (float32, as the transformers RMSNorms compute it)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::skip_rms_norm", mutates_args=())
def _skip_rms_norm(
    x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft ``SkipSimplifiedLayerNormalization``: ``s = x + skip`` and the RMSNorm of
    ``s``; returns (normed, s) (the op's outputs 0 and 3)."""
    total = x + skip
    return _rms_norm(total, weight, eps), total


@_skip_rms_norm.register_fake
def _(x, skip, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::linear_attention_gate", mutates_args=())
def _linear_attention_gate(
    a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft ``LinearAttentionGate``: ``decay = decay_scale · softplus(a + dt_bias)``
    and ``beta = sigmoid(b)``, a and b (B, T, H), dt_bias and decay_scale (H) (float32)."""
    return decay_scale * F.softplus(a + dt_bias), torch.sigmoid(b)


@_linear_attention_gate.register_fake
def _(a, dt_bias, decay_scale, b):
    return a.new_empty(a.shape), b.new_empty(b.shape)


@torch.library.custom_op("spotstop_fused::multi_head_attention", mutates_args=())
def _multi_head_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int, scale: float
) -> torch.Tensor:
    """com.microsoft ``MultiHeadAttention`` without mask, bias or cache: bidirectional attention,
    ``query``/``key``/``value`` (B, S, H·D) → (B, S, H·D)."""
    b, n = query.shape[0], query.shape[1]
    q, k, v = (t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2) for t in (query, key, value))
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(b, n, -1)


@_multi_head_attention.register_fake
def _(query, key, value, num_heads, scale):
    return query.new_empty(query.shape)


@torch.library.custom_op("spotstop_fused::masked_multi_head_attention", mutates_args=())
def _masked_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """com.microsoft ``MultiHeadAttention`` with a key padding mask: bidirectional attention,
    ``query``/``key``/``value`` (B, S, H·D), ``key_mask`` (B, S) int32 (1: attend to that key,
    0: a padded one no query reads) → (B, S, H·D)."""
    b, n = query.shape[0], query.shape[1]
    q, k, v = (t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2) for t in (query, key, value))
    keep = key_mask.bool()[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    return out.transpose(1, 2).reshape(b, n, -1)


@_masked_multi_head_attention.register_fake
def _(query, key, value, key_mask, num_heads, scale):
    return query.new_empty(query.shape)


@torch.library.custom_op("spotstop_fused::rotary_embedding", mutates_args=())
def _rotary_embedding(
    x: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """com.microsoft ``RotaryEmbedding`` (half split, ``interleaved=0``) at positions
    0 .. S-1: ``x`` (B, S, H·D), ``cos_cache``/``sin_cache`` (≥ S, D/2) → each head's
    ``x · cos + rotate_half(x) · sin`` with ``cos = [c, c]`` of the position's row."""
    b, n = x.shape[0], x.shape[1]
    h = x.reshape(b, n, num_heads, -1)
    cos = torch.cat([cos_cache[:n]] * 2, -1).unsqueeze(1)
    sin = torch.cat([sin_cache[:n]] * 2, -1).unsqueeze(1)
    x1, x2 = h.chunk(2, -1)
    return (h * cos + torch.cat([-x2, x1], -1) * sin).reshape(x.shape)


@_rotary_embedding.register_fake
def _(x, cos_cache, sin_cache, num_heads):
    return x.new_empty(x.shape)


# -- ONNX translations: dynamo (onnxscript) ----------------------------------------------------


def _register_onnx_schemas() -> None:
    """Make onnx (and so onnxscript, which builds a node from its ``onnx.defs`` schema) know the
    fused operators, with the schemas onnxruntime itself registers for them.

    onnx ships no ``com.microsoft`` schemas; onnxruntime's are read from the installed
    onnxruntime (``get_all_operator_schema``) and registered with ``onnx.defs.register_schema``,
    once per process, unless onnx knows the op already. Outputs: the ones the fused form writes
    (:data:`FUSED_OPS`: the required ones, and SkipSimplifiedLayerNormalization's
    ``input_skip_bias_sum``), because the dynamo exporter gives a node every output its schema
    lists, and the others are extras the CPU kernels do not serve."""
    import onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    ort_schemas = {
        s.name: s
        for s in ort_c.get_all_operator_schema()
        if s.name in FUSED_OPS and s.domain == FUSED_OPS[s.name][0]
    }
    missing = set(FUSED_OPS) - set(ort_schemas)
    if missing:
        import onnxruntime

        raise RuntimeError(
            f"onnxruntime {onnxruntime.__version__} has no schema for "
            f"{sorted(missing)}; the fused graph form needs onnxruntime >= 1.32 (or export the "
            "standard graph form)."
        )
    Param = onnx.defs.OpSchema.FormalParameter
    options = {
        0: onnx.defs.OpSchema.FormalParameterOption.Single,
        1: onnx.defs.OpSchema.FormalParameterOption.Optional,
        2: onnx.defs.OpSchema.FormalParameterOption.Variadic,
    }

    def param(p: Any) -> Any:
        return Param(p.name, p.typeStr, p.description, param_option=options[int(p.option)])

    for name, s in ort_schemas.items():
        domain, n_out = FUSED_OPS[name]
        if onnx.defs.has(name, domain):
            continue
        schema = onnx.defs.OpSchema(
            name,
            domain,
            s.since_version,
            s.doc or "",
            inputs=[param(p) for p in s.inputs],
            outputs=[param(p) for p in s.outputs[:n_out]],
            type_constraints=[
                (t.type_param_str, list(t.allowed_type_strs), t.description)
                for t in s.type_constraints
            ],
            attributes=[
                onnx.defs.OpSchema.Attribute(
                    a.name,
                    getattr(onnx.defs.OpSchema.AttrType, a.type.name),
                    a.description,
                    required=bool(a.required),
                )
                for a in s.attributes.values()
            ],
        )
        onnx.defs.register_schema(schema)


def _dynamo_translations() -> dict[Any, Callable[..., Any]]:
    """The custom ops' ONNX translations for the dynamo exporter's ``custom_translation_table``.

    Each writes its com.microsoft node with the outputs onnxruntime requires (the state outputs
    are left unused: the scoring pass has no next step)."""
    import onnxscript
    from onnxscript import opset18 as op

    _register_onnx_schemas()

    ms = onnxscript.values.Opset(FUSED_DOMAIN, FUSED_DOMAIN_VERSION)

    def la(query, key, value, decay, beta, q_num_heads, kv_num_heads, scale):
        out, _state = ms.LinearAttention(
            query,
            key,
            value,
            None,
            decay,
            beta,
            q_num_heads=q_num_heads,
            kv_num_heads=kv_num_heads,
            scale=float(scale),
            update_rule="gated_delta",
        )
        return out

    def gqa(query, key, value, cos_cache, sin_cache, num_heads, kv_num_heads, do_rotary, scale):
        shape = op.Shape(query)
        length = op.Slice(shape, [1], [2])  # (1,) int64: the padded length L
        total = op.Cast(op.Squeeze(length, [0]), to=6)  # int32 scalar: L
        seqlens = op.Cast(op.Expand(op.Sub(length, [1]), op.Slice(shape, [0], [1])), to=6)  # L-1
        cos, sin = (cos_cache, sin_cache) if do_rotary else (None, None)
        out = ms.GroupQueryAttention(
            query,
            key,
            value,
            None,
            None,
            seqlens,
            total,
            cos,
            sin,
            num_heads=num_heads,
            kv_num_heads=kv_num_heads,
            do_rotary=int(do_rotary),
            rotary_interleaved=0,
            scale=float(scale),
        )
        return out  # the one output it requires (no cache: present key/value not written)

    onnx_domain = onnxscript.values.Opset("", 1)  # onnxruntime's SimplifiedLayerNormalization

    def norm(x, weight, eps):
        return onnx_domain.SimplifiedLayerNormalization(
            x, weight, axis=-1, epsilon=float(eps), stash_type=1
        )

    def skip_norm(x, skip, weight, eps):
        out, _mean, _inv_std, total = ms.SkipSimplifiedLayerNormalization(
            x, skip, weight, None, epsilon=float(eps)
        )
        return out, total

    def gate(a, dt_bias, decay_scale, b):
        decay, beta = ms.LinearAttentionGate(a, dt_bias, decay_scale, b)
        return decay, beta

    def mha(query, key, value, num_heads, scale):
        return ms.MultiHeadAttention(query, key, value, num_heads=num_heads, scale=float(scale))

    def masked_mha(query, key, value, key_mask, num_heads, scale):
        return ms.MultiHeadAttention(
            query, key, value, None, key_mask, num_heads=num_heads, scale=float(scale)
        )

    def rope(x, cos_cache, sin_cache, num_heads):
        return ms.RotaryEmbedding(
            x, op.Constant(value_ints=[0]), cos_cache, sin_cache, num_heads=num_heads, interleaved=0
        )

    return {
        torch.ops.spotstop_fused.rotary_embedding.default: rope,
        torch.ops.spotstop_fused.masked_multi_head_attention.default: masked_mha,
        torch.ops.spotstop_fused.multi_head_attention.default: mha,
        torch.ops.spotstop_fused.linear_attention_gate.default: gate,
        torch.ops.spotstop_fused.linear_attention.default: la,
        torch.ops.spotstop_fused.group_query_attention.default: gqa,
        torch.ops.spotstop_fused.rms_norm.default: norm,
        torch.ops.spotstop_fused.skip_rms_norm.default: skip_norm,
    }


#: the dynamo exporter's ``custom_translation_table`` for the fused custom ops (built once, on
#: first use: importing onnxscript is not free)
@functools.lru_cache(maxsize=1)
def dynamo_translations() -> dict[Any, Callable[..., Any]]:
    """``torch.onnx.export(..., dynamo=True, custom_translation_table=dynamo_translations())``."""
    return _dynamo_translations()


# -- ONNX translations: legacy (TorchScript symbolics) -----------------------------------------


def _register_legacy_symbolics() -> None:
    """``register_custom_op_symbolic`` for each custom op at every legacy opset we export at."""
    from torch.onnx import register_custom_op_symbolic
    from torch.onnx.symbolic_helper import parse_args

    ms = FUSED_DOMAIN

    @parse_args("v", "v", "v", "v", "v", "i", "i", "f")
    def la(g, query, key, value, decay, beta, q_num_heads, kv_num_heads, scale):
        none = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())
        out, _ = g.op(
            f"{ms}::LinearAttention",
            query,
            key,
            value,
            none,
            decay,
            beta,
            q_num_heads_i=q_num_heads,
            kv_num_heads_i=kv_num_heads,
            scale_f=scale,
            update_rule_s="gated_delta",
            outputs=2,
        )
        return out

    @parse_args("v", "v", "v", "v", "v", "i", "i", "i", "f")
    def gqa(g, query, key, value, cos_cache, sin_cache, num_heads, kv_num_heads, do_rotary, scale):
        shape = g.op("Shape", query)
        one = g.op("Constant", value_t=torch.tensor([1], dtype=torch.int64))
        zero = g.op("Constant", value_t=torch.tensor([0], dtype=torch.int64))
        two = g.op("Constant", value_t=torch.tensor([2], dtype=torch.int64))
        length = g.op("Slice", shape, one, two)
        batch = g.op("Slice", shape, zero, one)
        total = g.op("Cast", g.op("Squeeze", length, zero), to_i=6)
        seqlens = g.op("Cast", g.op("Expand", g.op("Sub", length, one), batch), to_i=6)
        none = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())
        cos, sin = (cos_cache, sin_cache) if do_rotary else (none, none)
        out = g.op(
            f"{ms}::GroupQueryAttention",
            query,
            key,
            value,
            none,
            none,
            seqlens,
            total,
            cos,
            sin,
            num_heads_i=num_heads,
            kv_num_heads_i=kv_num_heads,
            do_rotary_i=int(do_rotary),
            rotary_interleaved_i=0,
            scale_f=scale,
        )
        out.setType(query.type())
        return out

    @parse_args("v", "v", "f")
    def norm(g, x, weight, eps):
        out = g.op(
            "SimplifiedLayerNormalization", x, weight, axis_i=-1, epsilon_f=eps, stash_type_i=1
        )
        out.setType(x.type())
        return out

    @parse_args("v", "v", "v", "f")
    def skip_norm(g, x, skip, weight, eps):
        out, _mean, _inv_std, total = g.op(
            f"{ms}::SkipSimplifiedLayerNormalization", x, skip, weight, epsilon_f=eps, outputs=4
        )
        out.setType(x.type())
        total.setType(x.type())
        return out, total

    @parse_args("v", "v", "v", "v")
    def gate(g, a, dt_bias, decay_scale, b):
        decay, beta = g.op(f"{ms}::LinearAttentionGate", a, dt_bias, decay_scale, b, outputs=2)
        decay.setType(a.type())
        beta.setType(b.type())
        return decay, beta

    @parse_args("v", "v", "v", "i", "f")
    def mha(g, query, key, value, num_heads, scale):
        out = g.op(
            f"{ms}::MultiHeadAttention", query, key, value, num_heads_i=num_heads, scale_f=scale
        )
        out.setType(query.type())
        return out

    @parse_args("v", "v", "v", "v", "i", "f")
    def masked_mha(g, query, key, value, key_mask, num_heads, scale):
        none = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())
        out = g.op(
            f"{ms}::MultiHeadAttention",
            query,
            key,
            value,
            none,
            key_mask,
            num_heads_i=num_heads,
            scale_f=scale,
        )
        out.setType(query.type())
        return out

    @parse_args("v", "v", "v", "i")
    def rope(g, x, cos_cache, sin_cache, num_heads):
        offset = g.op("Constant", value_t=torch.tensor([0], dtype=torch.int64))  # positions 0..
        out = g.op(
            f"{ms}::RotaryEmbedding",
            x,
            offset,
            cos_cache,
            sin_cache,
            num_heads_i=num_heads,
            interleaved_i=0,
        )
        out.setType(x.type())
        return out

    for opset in _LEGACY_OPSETS:
        register_custom_op_symbolic("spotstop_fused::rotary_embedding", rope, opset)
        register_custom_op_symbolic(
            "spotstop_fused::masked_multi_head_attention", masked_mha, opset
        )
        register_custom_op_symbolic("spotstop_fused::multi_head_attention", mha, opset)
        register_custom_op_symbolic("spotstop_fused::linear_attention_gate", gate, opset)
        register_custom_op_symbolic("spotstop_fused::rms_norm", norm, opset)
        register_custom_op_symbolic("spotstop_fused::skip_rms_norm", skip_norm, opset)
        register_custom_op_symbolic("spotstop_fused::linear_attention", la, opset)
        register_custom_op_symbolic("spotstop_fused::group_query_attention", gqa, opset)


_register_legacy_symbolics()


# -- what an architecture's fused layers call ---------------------------------------------------
#
# An architecture's export config lists its fused patches (``ExportConfig.fused_patches``:
# export/archs/<model_type>.py); its replacement forwards call the functions below, which cast
# to float32 where the reference computes in float32 and call the custom ops above.


def _f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, without a Cast node when it is float32 already (the legacy exporter
    writes one for every ``.float()``, and a Cast between a residual Add and its RMSNorm hides
    the pair from :func:`fuse_graph`)."""
    return x if x.dtype == torch.float32 else x.float()


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as ``dtype``, without a Cast node when it is that already."""
    return x if x.dtype == dtype else x.to(dtype)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # as transformers' Qwen3.5 l2norm (and fla's): x · rsqrt(Σx² + ε)
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An RMSNorm as ``SimplifiedLayerNormalization``: float32 inside, ``x``'s dtype out;
    ``weight`` the float32 scale the reference multiplies by (``1 + w`` or ``w``)."""
    return _as(torch.ops.spotstop_fused.rms_norm(_f32(x), weight, float(eps)), x.dtype)


def skip_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(residual + x), residual + x)`` as one ``SkipSimplifiedLayerNormalization``."""
    return torch.ops.spotstop_fused.skip_rms_norm(x, residual, weight, float(eps))


def gated_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """A gated RMSNorm (SiLU gate): ``SimplifiedLayerNormalization`` · ``silu(gate)`` in
    standard nodes, float32 inside, ``x``'s dtype out. Not onnxruntime's ``GatedRMSNorm``: its
    CPU kernel took 8.8 ms on Qwen3.5-2B's (6128, 128) rows where these nodes take 0.43 ms
    (``bench/fused_ops.py``)."""
    return _as(rms_norm(_f32(x), weight, eps) * F.silu(_f32(gate)), x.dtype)


def linear_attention_gate(
    a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(decay_scale · softplus(a + dt_bias), sigmoid(b))`` as one ``LinearAttentionGate``:
    the decay in float32, beta in ``b``'s dtype."""
    g, beta = torch.ops.spotstop_fused.linear_attention_gate(_f32(a), dt_bias, decay_scale, _f32(b))
    return g, _as(beta, b.dtype)


def group_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal attention over the whole (padded) length as one ``GroupQueryAttention``, packed
    (B, L, heads·D) inputs; ``rotary``: the (cos, sin) caches (≥ L, D/2) of a half-split rotary
    applied by the op at positions 0 .. L-1, or None (the caller rotates, the op does not).

    The mask is not read: exact only for the all-ones mask of export/graphs.py's decoder (see
    the module doc)."""
    if rotary is None:
        cos, sin = query.new_zeros(0, 1), query.new_zeros(0, 1)  # not read without rotary
    else:
        cos, sin = (_as(c, query.dtype) for c in rotary)
    return torch.ops.spotstop_fused.group_query_attention(
        query, key, value, cos, sin, num_heads, kv_num_heads, int(rotary is not None), float(scale)
    )


def multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    num_heads: int,
    scale: float,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional attention as one ``MultiHeadAttention``, (B, S, H·D); ``key_mask``
    (B, S), true (or 1) where a key is read: the op's key padding mask (None: every key)."""
    if key_mask is None:
        return torch.ops.spotstop_fused.multi_head_attention(
            query, key, value, num_heads, float(scale)
        )
    return torch.ops.spotstop_fused.masked_multi_head_attention(
        query, key, value, key_mask.to(torch.int32), num_heads, float(scale)
    )


def rotary_embedding(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """A half-split rotary of every head of ``x`` (B, S, H·D) at positions 0 .. S-1 as one
    ``RotaryEmbedding`` (float32, as transformers' rotary; back in ``x``'s dtype):
    ``cos``/``sin`` (S, D), each row ``[c, c]`` (two equal halves, as transformers builds
    them; the op reads the first half)."""
    half = cos.shape[-1] // 2
    out = torch.ops.spotstop_fused.rotary_embedding(
        _f32(x), _f32(cos[:, :half]), _f32(sin[:, :half]), num_heads
    )
    return _as(out, x.dtype)


def fused_chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``torch_chunk_gated_delta_rule`` (same arguments, [batch, length, heads,
    dim] layout) as one ``LinearAttention`` node; the scoring pass only (no state in or out).

    The q/k L2 norms (float32, as the reference) stay standard nodes before the op, as genai's
    ``make_l2_normalize``; the 1/sqrt(d_k) query scale is the op's ``scale``."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError(
            "the fused Gated-DeltaNet serves the scoring pass only (no recurrent state in or out)."
        )
    b, t, hk, dk = key.shape
    hv, dv = value.shape[2], value.shape[3]
    if hv % hk:
        raise ValueError(
            f"LinearAttention needs the value heads ({hv}) to be a multiple of the key heads "
            f"({hk}); this layer cannot be fused: export graph_form='standard'."
        )
    dtype = query.dtype
    q, k = _f32(query), _f32(key)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    out = torch.ops.spotstop_fused.linear_attention(
        q.reshape(b, t, hk * dk),
        k.reshape(b, t, hk * dk),
        _f32(value).reshape(b, t, hv * dv),
        _f32(g),
        _f32(beta),
        hk,
        hv,
        dk**-0.5,
    )
    return _as(out.reshape(b, t, hv, dv), dtype), None


def fused_causal_conv1d_fn(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ``causal_conv1d_fn`` (``weight`` (C, K), input (B, C, L)) as a left
    ``Pad`` and one depthwise ``Conv`` (SiLU after when ``activation`` is ``"silu"``), standard
    operators. Not onnxruntime's ``CausalConvWithState``: its CPU kernel is 2.4 to 5.2 times
    slower than ``Conv`` at the two members' shapes (``bench/fused_ops.py``)."""
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError(
            f"the short convolution applies only SiLU; this layer's activation is {activation!r}."
        )
    x = _as(hidden_states, weight.dtype)
    k = weight.shape[-1]
    out = F.conv1d(F.pad(x, (k - 1, 0)), weight.unsqueeze(1), bias, groups=x.shape[1])
    if activation is not None:
        out = F.silu(out)
    return _as(out, hidden_states.dtype)


# -- the patcher --------------------------------------------------------------------------------


def fused_architectures() -> tuple[str, ...]:
    """The model types whose export config has a fused form (``fused_patches`` not None)."""
    from spotstop.export.configs import EXPORT_CONFIGS

    return tuple(sorted(t for t, cfg in EXPORT_CONFIGS.items() if cfg.fused_patches() is not None))


@contextmanager
def fused_patcher(model_type: str, max_length: int) -> Iterator[None]:
    """Within the block, the ``model_type`` model's layers (decoder and vision tower) call the
    fused custom ops: every ``(owner, attribute, replacement)`` of its export config's
    ``fused_patches`` is in place, for sequences up to ``max_length`` tokens (nothing fused
    depends on it: ``LinearAttention`` and ``GroupQueryAttention`` take any length; it is the
    same argument as the config's ``decoder_patcher``).

    Enter it while :class:`~spotstop.export.graphs.DecoderGraph` (or
    :class:`~spotstop.export.graphs.VisionGraph`) is exported, and pass
    :func:`dynamo_translations` to a dynamo export (export/exporters.py ``export_decoder`` with
    ``graph_form="fused"`` does both; ``export_vision`` likewise). Outside the block the model is
    the transformers model again.
    """
    if model_type not in fused_architectures():
        raise ValueError(
            f"no fused graph form for {model_type!r} (fused: {list(fused_architectures())}); "
            "export it with graph_form='standard'."
        )
    if int(max_length) <= 0:
        raise ValueError(f"max_length must be a positive token count; got {max_length}.")
    from spotstop.export.configs import get_export_config

    patches = get_export_config(model_type).fused_patches() or ()
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


def _topological(nodes: list[Any], graph_inputs: set[str]) -> list[Any]:
    """``nodes`` in an order where every node follows its inputs' producers (stable: the given
    order wherever it already is one)."""
    produced_by: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced_by[o] = i
    deps = [
        {produced_by[x] for x in n.input if x and x in produced_by and produced_by[x] != i}
        for i, n in enumerate(nodes)
    ]
    done: set[int] = set()
    order: list[Any] = []
    pending = list(range(len(nodes)))
    while pending:
        rest = []
        for i in pending:
            if deps[i] <= done:
                done.add(i)
                order.append(nodes[i])
            else:
                rest.append(i)
        if len(rest) == len(pending):
            raise ValueError("the graph has a cycle; it was not rewritten.")
        pending = rest
    return order


def fuse_graph(model: Any) -> dict[str, int]:
    """The post-export part of the fused form: each residual ``Add`` whose sum an exported
    ``SimplifiedLayerNormalization`` normalises becomes one ``SkipSimplifiedLayerNormalization``
    (its ``input_skip_bias_sum`` output replaces the Add's), in place; returns
    ``{"SkipSimplifiedLayerNormalization": n}``.

    This is the fusion genai writes between a layer's last residual Add and the next layer's
    input norm (and the final norm), which the per-layer torch patch cannot express (the sum
    crosses the model's layer loop). Only an Add of the residual stream is taken: one input the
    sum output of an earlier SkipSimplifiedLayerNormalization, the other a ``MatMul`` output
    (the layer's last projection): both (batch, length, hidden), so the op's no-broadcast
    contract holds. The first layer's input norm (its input is the embeddings) and the q/k
    norms stay ``SimplifiedLayerNormalization``. :func:`export_decoder
    <spotstop.export.exporters.export_decoder>` calls this on a fused graph; the standard form
    never."""
    from onnx import helper

    graph = model.graph
    nodes = list(graph.node)
    producer = {o: n for n in nodes for o in n.output if o}
    fused: dict[int, Any] = {}  # id(SimplifiedLayerNormalization) → its replacement
    dropped: set[int] = set()  # id(Add)
    for n in nodes:
        if n.op_type != "SimplifiedLayerNormalization" or n.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if attrs.get("axis", -1) != -1 or any(o for o in n.output[1:]):
            continue
        add = producer.get(n.input[0])
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            continue
        srcs = [producer.get(x) for x in add.input]
        if len(srcs) != 2 or any(p is None for p in srcs):
            continue
        stream = [
            i
            for i, p in enumerate(srcs)
            if p is not None
            and p.op_type == "SkipSimplifiedLayerNormalization"
            and len(p.output) > 3
            and p.output[3] == add.input[i]
        ]
        if len(stream) != 1 or srcs[1 - stream[0]].op_type != "MatMul":  # type: ignore[union-attr]
            continue
        residual, update = add.input[stream[0]], add.input[1 - stream[0]]
        fused[id(n)] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [update, residual, n.input[1]],
            [n.output[0], "", "", add.output[0]],
            name=(n.name or "norm") + "/skip",
            domain=FUSED_DOMAIN,
            epsilon=float(attrs.get("epsilon", 1e-5)),
        )
        dropped.add(id(add))
    if not fused:
        return {"SkipSimplifiedLayerNormalization": 0}
    kept = [fused.get(id(n), n) for n in nodes if id(n) not in dropped]
    inputs = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    ordered = _topological(kept, inputs)
    del graph.node[:]
    graph.node.extend(ordered)
    if not any(o.domain == FUSED_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, FUSED_DOMAIN_VERSION))
    return {"SkipSimplifiedLayerNormalization": len(fused)}


def fuse_graph_file(path: Any) -> dict[str, int]:
    """:func:`fuse_graph` on the ONNX file at ``path``, rewritten in place; its weights (external
    data or not) are not loaded or moved: only the graph is read and written."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = fuse_graph(model)
    if counts["SkipSimplifiedLayerNormalization"]:
        onnx.save_model(model, str(path))
    return counts


def graph_form_ops(model: Any) -> dict[str, int]:
    """The fused (``com.microsoft``) operators an ONNX graph holds, by op_type, counted over the
    main graph and its subgraphs; ``{}`` for a standard graph. For the manifest."""
    counts: dict[str, int] = {}

    def walk(graph: Any) -> None:
        for node in graph.node:
            if node.op_type in FUSED_OPS and node.domain == FUSED_OPS[node.op_type][0]:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(model.graph)
    return dict(sorted(counts.items()))
