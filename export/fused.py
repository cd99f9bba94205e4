"""The "fused" decoder graph form: onnxruntime's ``com.microsoft`` operators where they fit.

Two graph forms per target. ``standard`` (TensorRT, and fp16 / int4-trt) is the decoder as
export/graphs.py writes it from standard ONNX operators: Qwen3.5's Gated-DeltaNet is the loop-free
kernel of export/gated_delta.py (~185 nodes per layer), attention is MatMul/Softmax, the
short convolutions are ``Conv``. ``fused`` (onnxruntime CPU: fp32, int8, int4) replaces, while the
decoder is exported, the pieces onnxruntime has one kernel for, the way onnxruntime-genai 0.18's
model builder writes ``qwen3_5`` and ``lfm2`` (builders/qwen.py ``make_qwen_gated_delta_net``,
builders/base.py ``make_linear_attention`` / ``make_causal_conv_with_state`` /
``make_group_query_attention`` / ``make_linear_attention_gate`` / ``make_gated_rms_norm``):

=========================  =========================================================================
Qwen3.5 Gated-DeltaNet     ``LinearAttention`` (update_rule="gated_delta"), as genai: q and k
                           L2-normalised outside the op (standard nodes), ``q_num_heads`` = the
                           key heads and ``kv_num_heads`` = the value heads (each key head serves
                           ``Hv / Hk`` consecutive value heads, transformers' ``repeat_interleave``),
                           decay ``g`` and ``beta`` per value head, no past state.
Qwen3.5 conv (+ SiLU)      ``CausalConvWithState`` (activation="silu"), channels-first, weight
                           (C, 1, K), no past state.
Qwen3.5 gates              ``LinearAttentionGate``: ``decay = -exp(A_log)·softplus(a + dt_bias)``
                           (``-exp(A_log)`` a folded constant) and ``beta = sigmoid(b)`` (genai's
                           ``make_linear_attention_gate``).
Qwen3.5 gated norm         ``GatedRMSNorm`` (activation="silu"), per value head (genai's
                           ``make_gated_rms_norm``).
Qwen3.5 attention          ``GroupQueryAttention`` without rotary (``do_rotary=0``): the q/k RMSNorms
                           (``SimplifiedLayerNormalization``) and the interleaved M-RoPE stay outside,
                           before it, the output gate ``sigmoid(gate)`` after it (genai does the same:
                           ``is_fused_rope_supported`` is False for qwen3_5; M-RoPE places each token
                           at three positions, which neither GQA's rotary nor ``RotaryEmbedding``'s
                           position ids express; GQA's ``q_norm_weight``/``k_norm_weight`` inputs are
                           honoured by the CUDA and WebGPU kernels only, per its 1.32 schema).
LFM2 attention             ``GroupQueryAttention`` WITH rotary (``do_rotary=1``, half-split, not
                           interleaved): the q/k layernorms (``SimplifiedLayerNormalization``)
                           before it.
LFM2 short convolutions    ``CausalConvWithState`` (activation="none"); the ``B * x`` gate before
                           and ``C * y`` after stay standard nodes.
RMSNorms, both             ``SimplifiedLayerNormalization`` (Qwen3.5's ``1 + w`` scale folded into a
                           constant); each layer's second residual Add + RMSNorm (Qwen3.5's
                           post-attention norm, LFM2's feed-forward norm) as one
                           ``SkipSimplifiedLayerNormalization`` whose ``input_skip_bias_sum`` output is
                           the residual stream (genai also fuses the last Add of a layer with the
                           next layer's input norm; that needs the model's layer loop rewritten,
                           which this patch does not do).
=========================  =========================================================================

Why the norms are written here and not left to onnxruntime: its optimizer at ``ORT_ENABLE_ALL``
(what the guard's sessions run) makes NO ``SkipSimplifiedLayerNormalization`` in either standard
decoder, and no ``SimplifiedLayerNormalization`` at all in Qwen3.5's (its RMSNorm is exported as
Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul with the ``1 + w`` scale, a pattern the fusion does not
match); in LFM2's it makes the 11 ``SimplifiedLayerNormalization`` but leaves the residual Adds
(tiny members, onnxruntime 1.32: the standard Qwen3.5 decoder goes from 900 nodes to 892 with
0 SimplifiedLayerNormalization; the standard LFM2 one from 711 to 308 with 11
SimplifiedLayerNormalization and 0 SkipSimplifiedLayerNormalization).

Not fused: the q/k L2 norms before ``LinearAttention`` (genai writes ``LpNormalization``, which
has no ``eps``: not the reference's ``x·rsqrt(Σx² + 1e-6)``, so they stay exact standard nodes).

Padding and the mask. The decoder runs right-padded batches and passes transformers an all-ones
attention mask (export/graphs.py ``DecoderGraph``): every layer is causal, so the padding after a
sequence never reaches its positions, and the standard graph's attention is exactly causal
attention over the whole padded length. The fused attention is the same: ``GroupQueryAttention``
with ``causal=1``, ``seqlens_k = L - 1`` for every row and ``total_sequence_length = L`` (the padded
length), no ``query_seqlens``. Rows past a sequence's end are computed as in the standard graph
(causally, over the padding) and neither graph's outputs read them. The fused attention IGNORES
the mask transformers passes it; that is exact only because that mask is all ones, which is why
:func:`fused_patcher` is meant for exporting the scoring graphs of export/graphs.py and nothing
else. LFM2's fused rotary reads GQA's own
positions (0 .. L-1 of a first prompt chunk); that equals the decoder's ``position_ids`` because
LFM2's export config keeps the default ``ExportConfig.position_ids`` (0, 1, 2, ...), and
:func:`fused_patcher` refuses an architecture whose config overrides it.

Why at the torch level. While the decoder is exported under :func:`fused_patcher`, the layers call
``torch.library`` custom ops (``spotstop_fused::*``) whose ONNX translation is the com.microsoft
node: ``custom_translation_table`` for the dynamo exporter (:func:`dynamo_translations`), a
``register_custom_op_symbolic`` symbolic for the legacy exporter (registered on import). Each op
also has an eager torch implementation of the same maths, so the patched model runs in torch (and
the legacy exporter, which traces by running, computes real values). The export is validated, as
ever, against the UNPATCHED transformers model, so the parity is real.

Where the lead calls it (export/onnx.py ``export_member``), the export stage::

    export_vision(vision_t, ecfg, cases.pixels["gray"], tmp / "vision.onnx", fold, graph_form=form)
    export_decoder(decoder_t, ecfg, feeds0, case0["image_embeds"], tmp / fname, usable[-1], fold,
                   graph_form=form)       # form: "fused" for fp32/int8/int4 on onnxruntime CPU,
                                          #       "standard" for fp16 / int4-trt / TensorRT

``export_decoder`` (export/exporters.py) enters :func:`fused_patcher` (``ecfg.model_type``,
``max_length``) inside the config's own ``decoder_patcher`` and passes
:func:`dynamo_translations` to a dynamo export. Nothing else changes in ``export_member``: the
fused graph is loaded, tied, folded, validated against the same torch reference and quantized
(int8/int4 rewrite its MatMuls as they do the standard graph's) like the standard one. For the
manifest, :func:`graph_form_ops` (an ``onnx.ModelProto``, before or after quantization) gives the
fused operators a graph holds, e.g. for the tiny Qwen3.5 decoder ``{"CausalConvWithState": 3,
"GatedRMSNorm": 3, "GroupQueryAttention": 1, "LinearAttention": 3, "LinearAttentionGate": 3,
"SimplifiedLayerNormalization": 7, "SkipSimplifiedLayerNormalization": 4}``; ``{}`` for a
standard graph; e.g. ``meta["decoder"]["graph_form"] = form`` and
``meta["decoder"]["fused_ops"] = graph_form_ops(graphs[dec_files[usable[0]]])``.

fp16 (and int4-trt, which starts from fp16) must start from the STANDARD graph: export/fp16.py's
rules that keep the norms and the delta rule float32 do not know the fused operators (the fp16
conversion of the tiny fused LFM2 decoder does not load: "Type parameter (T) of Optype (Mul)
bound to different types (tensor(float) and tensor(float16))" at its first conv layer), and
TensorRT has none of them.

The vision graph: Qwen3.5's vision attention becomes one ``MultiHeadAttention`` per block
(bidirectional, no mask: the graph is traced for one image of one frame, one ``cu_seqlens``
span; the 2-D rotary stays standard nodes before it). onnxruntime's optimizer leaves that
attention decomposed (MatMul/Softmax: 2 Softmax in the tiny tower after ORT_ENABLE_ALL) while it
already fuses the towers' LayerNorms and GELUs itself. LFM2-VL's SigLIP2 tower is not fused: its
attention takes the pixel attention mask (padded patches), which a ``key_padding_mask`` would
have to carry; not done here. Call ``export_vision(..., graph_form=form)`` the same way
(export/exporters.py; for LFM2 the fused form writes the standard vision graph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
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
    "CausalConvWithState": (FUSED_DOMAIN, 2),
    "GroupQueryAttention": (FUSED_DOMAIN, 1),
    "GatedRMSNorm": (FUSED_DOMAIN, 1),
    "LinearAttentionGate": (FUSED_DOMAIN, 2),
    "MultiHeadAttention": (FUSED_DOMAIN, 1),
    "SkipSimplifiedLayerNormalization": (FUSED_DOMAIN, 4),
    "SimplifiedLayerNormalization": ("", 1),
}

#: the legacy exporter's opset the symbolics are registered at (export/configs.py legacy_opset)
_LEGACY_OPSETS = range(9, 21)


# -- the custom ops: eager maths, fake shapes ---------------------------------------------------


@torch.library.custom_op("spotstop_fused::linear_attention", mutates_args=())
def linear_attention(
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


@linear_attention.register_fake
def _(query, key, value, decay, beta, q_num_heads, kv_num_heads, scale):
    return value.new_empty(value.shape)


@torch.library.custom_op("spotstop_fused::causal_conv", mutates_args=())
def causal_conv(x: torch.Tensor, weight: torch.Tensor, silu: int) -> torch.Tensor:
    """com.microsoft ``CausalConvWithState`` (no past state, no bias): depthwise causal
    convolution of ``x`` (B, C, L) with ``weight`` (C, 1, K), zero history, SiLU after when
    ``silu`` → (B, C, L)."""
    k = weight.shape[-1]
    out = F.conv1d(x, weight, padding=k - 1, groups=x.shape[1])[..., : x.shape[-1]]
    return F.silu(out) if silu else out


@causal_conv.register_fake
def _(x, weight, silu):
    return x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::group_query_attention", mutates_args=())
def group_query_attention(
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


@group_query_attention.register_fake
def _(query, key, value, cos_cache, sin_cache, num_heads, kv_num_heads, do_rotary, scale):
    return query.new_empty(query.shape)


@torch.library.custom_op("spotstop_fused::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``SimplifiedLayerNormalization`` over the last axis: ``x · rsqrt(mean(x²) + eps) · weight``
    (float32, as the transformers RMSNorms compute it)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::skip_rms_norm", mutates_args=())
def skip_rms_norm(
    x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft ``SkipSimplifiedLayerNormalization``: ``s = x + skip`` and the RMSNorm of
    ``s``; returns (normed, s) (the op's outputs 0 and 3)."""
    total = x + skip
    return rms_norm(total, weight, eps), total


@skip_rms_norm.register_fake
def _(x, skip, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::gated_rms_norm", mutates_args=())
def gated_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """com.microsoft ``GatedRMSNorm`` (activation="silu"): ``rms_norm(x) · weight · silu(gate)``,
    the norm over the last axis (of ``weight``'s length), float32."""
    return rms_norm(x, weight, eps) * F.silu(gate)


@gated_rms_norm.register_fake
def _(x, weight, gate, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("spotstop_fused::linear_attention_gate", mutates_args=())
def linear_attention_gate(
    a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft ``LinearAttentionGate``: ``decay = decay_scale · softplus(a + dt_bias)``
    and ``beta = sigmoid(b)``, a and b (B, T, H), dt_bias and decay_scale (H) (float32)."""
    return decay_scale * F.softplus(a + dt_bias), torch.sigmoid(b)


@linear_attention_gate.register_fake
def _(a, dt_bias, decay_scale, b):
    return a.new_empty(a.shape), b.new_empty(b.shape)


@torch.library.custom_op("spotstop_fused::multi_head_attention", mutates_args=())
def multi_head_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int, scale: float
) -> torch.Tensor:
    """com.microsoft ``MultiHeadAttention`` without mask, bias or cache: bidirectional attention,
    ``query``/``key``/``value`` (B, S, H·D) → (B, S, H·D)."""
    b, n = query.shape[0], query.shape[1]
    q, k, v = (t.reshape(b, t.shape[1], num_heads, -1).transpose(1, 2) for t in (query, key, value))
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(b, n, -1)


@multi_head_attention.register_fake
def _(query, key, value, num_heads, scale):
    return query.new_empty(query.shape)


# -- ONNX translations: dynamo (onnxscript) ----------------------------------------------------


def _register_onnx_schemas() -> None:
    """Make onnx (and so onnxscript, which builds a node from its ``onnx.defs`` schema) know the
    fused operators, with the schemas onnxruntime itself registers for them.

    onnx ships no ``com.microsoft`` schemas; onnxruntime's are read from the installed
    onnxruntime (``get_all_operator_schema``) and registered with ``onnx.defs.register_schema``,
    once per process, unless onnx knows the op already. Outputs: the ones the fused form writes
    (:data:`FUSED_OPS`: the required ones, and SkipSimplifiedLayerNormalization's
    ``input_skip_bias_sum``), because the dynamo exporter gives a node every output its schema
    lists, and the others are extras the CPU kernels do not serve (CausalConvWithState's
    ``state_update`` is CUDA-only)."""
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

    def conv(x, weight, silu):
        out, _state = ms.CausalConvWithState(x, weight, activation="silu" if silu else "none")
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

    def gated_norm(x, weight, gate, eps):
        return ms.GatedRMSNorm(x, weight, gate, activation="silu", epsilon=float(eps))

    def gate(a, dt_bias, decay_scale, b):
        decay, beta = ms.LinearAttentionGate(a, dt_bias, decay_scale, b)
        return decay, beta

    def mha(query, key, value, num_heads, scale):
        return ms.MultiHeadAttention(query, key, value, num_heads=num_heads, scale=float(scale))

    return {
        torch.ops.spotstop_fused.multi_head_attention.default: mha,
        torch.ops.spotstop_fused.linear_attention_gate.default: gate,
        torch.ops.spotstop_fused.gated_rms_norm.default: gated_norm,
        torch.ops.spotstop_fused.linear_attention.default: la,
        torch.ops.spotstop_fused.causal_conv.default: conv,
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

    @parse_args("v", "v", "i")
    def conv(g, x, weight, silu):
        out, _ = g.op(
            f"{ms}::CausalConvWithState",
            x,
            weight,
            activation_s="silu" if silu else "none",
            outputs=2,
        )
        out.setType(x.type())
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

    @parse_args("v", "v", "v", "f")
    def gated_norm(g, x, weight, gate, eps):
        out = g.op(f"{ms}::GatedRMSNorm", x, weight, gate, activation_s="silu", epsilon_f=eps)
        out.setType(x.type())
        return out

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

    for opset in _LEGACY_OPSETS:
        register_custom_op_symbolic("spotstop_fused::multi_head_attention", mha, opset)
        register_custom_op_symbolic("spotstop_fused::linear_attention_gate", gate, opset)
        register_custom_op_symbolic("spotstop_fused::gated_rms_norm", gated_norm, opset)
        register_custom_op_symbolic("spotstop_fused::rms_norm", norm, opset)
        register_custom_op_symbolic("spotstop_fused::skip_rms_norm", skip_norm, opset)
        register_custom_op_symbolic("spotstop_fused::linear_attention", la, opset)
        register_custom_op_symbolic("spotstop_fused::causal_conv", conv, opset)
        register_custom_op_symbolic("spotstop_fused::group_query_attention", gqa, opset)


_register_legacy_symbolics()


# -- the patches --------------------------------------------------------------------------------


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
    """transformers' ``causal_conv1d_fn`` (Qwen3.5 and LFM2: ``weight`` (C, K), input (B, C, L))
    as one ``CausalConvWithState`` node, SiLU fused when ``activation`` is ``"silu"``."""
    if bias is not None:
        raise NotImplementedError(
            "the fused short convolution is written without a bias (neither Qwen3.5 nor LFM2 has "
            "one); a member with conv_bias needs the bias input wired (CausalConvWithState's "
            "third input)."
        )
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError(
            f"CausalConvWithState fuses only SiLU; this layer's activation is {activation!r}."
        )
    out = torch.ops.spotstop_fused.causal_conv(
        _as(hidden_states, weight.dtype), weight.unsqueeze(1), int(activation is not None)
    )
    return _as(out, hidden_states.dtype)


def _qwen3_5_gated_delta_net_forward(
    self: Any,
    hidden_states: torch.Tensor,
    cache: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5GatedDeltaNet.forward`` for the scoring pass (no cache), genai's layer: the
    projections (MatMul), ``CausalConvWithState`` (+ SiLU), the decay/beta gates as one
    ``LinearAttentionGate`` (``-exp(A_log)`` a folded constant), ``LinearAttention``,
    ``GatedRMSNorm``, the output projection. Same maths and order as transformers' forward."""
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
    mixed_qkv = fused_causal_conv1d_fn(
        mixed_qkv, self.conv1d.weight.squeeze(1), self.conv1d.bias, activation=self.activation
    ).transpose(1, 2)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], -1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)
    g, beta = torch.ops.spotstop_fused.linear_attention_gate(
        _f32(a), self.dt_bias.float(), -self.A_log.float().exp(), _f32(b)
    )
    core, _ = fused_chunk_gated_delta_rule(
        query, key, value, g=g, beta=_as(beta, b.dtype), use_qk_l2norm_in_kernel=True
    )
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch_size, seq_len, -1))


def _qwen3_5_vision_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlen: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5VisionAttention.forward`` for ONE image, the attention as one
    ``MultiHeadAttention`` (bidirectional, no mask); the qkv projection, the 2-D rotary and the
    output projection as transformers writes them.

    transformers attends within each ``cu_seqlens`` span (one per image and frame); the vision
    graph is traced for one image of one frame (export/graphs.py ``VisionGraph``), so there is
    one span, the whole sequence. More spans are refused (attention across them would be wrong)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    if cu_seqlens.shape[0] != 2:
        raise NotImplementedError(
            f"the fused vision attention serves one image of one frame; this grid has "
            f"{cu_seqlens.shape[0] - 1} attention spans. Export the vision graph with "
            "graph_form='standard'."
        )
    if position_embeddings is None:
        raise ValueError("Qwen3.5's vision attention needs its rotary position embeddings.")
    seq_length = hidden_states.shape[0]
    q, k, v = (
        self.qkv(hidden_states)
        .reshape(seq_length, 3, self.num_heads, -1)
        .permute(1, 0, 2, 3)
        .unbind(0)
    )
    cos, sin = position_embeddings
    q, k = mod.apply_rotary_pos_emb_vision(q, k, cos, sin)
    out = torch.ops.spotstop_fused.multi_head_attention(
        q.reshape(1, seq_length, -1),
        k.reshape(1, seq_length, -1),
        v.reshape(1, seq_length, -1),
        self.num_heads,
        float(self.scaling),
    )
    return self.proj(out.reshape(seq_length, -1))


def _no_cos(x: torch.Tensor) -> torch.Tensor:
    """An empty (0, 1) tensor for the rotary caches of an attention without fused rotary."""
    return x.new_zeros(0, 1)


def _qwen3_5_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``Qwen3_5Attention.forward`` for the scoring pass, attention as ``GroupQueryAttention``.

    Same projections, output gate, (1 + w) q/k RMSNorms and interleaved M-RoPE as transformers
    (standard nodes, in the (B, L, heads, D) layout); the causal attention is the fused op. The
    mask is not read: see the module doc (the decoder's mask is all ones)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    if cache is not None:
        raise NotImplementedError("the fused attention serves the scoring pass only (no cache).")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states, gate = torch.chunk(
        self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1
    )
    gate = gate.reshape(*input_shape, -1)
    query_states = self.q_norm(query_states.view(hidden_shape))
    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape))
    value_states = self.v_proj(hidden_states)
    cos, sin = position_embeddings
    query_states, key_states = mod.apply_rotary_pos_emb(
        query_states, key_states, cos, sin, unsqueeze_dim=2
    )
    n_heads = self.config.num_attention_heads
    n_kv = self.config.num_key_value_heads
    attn = torch.ops.spotstop_fused.group_query_attention(
        query_states.reshape(*input_shape, -1),
        key_states.reshape(*input_shape, -1),
        value_states,
        _no_cos(hidden_states),
        _no_cos(hidden_states),
        n_heads,
        n_kv,
        0,
        float(self.scaling),
    )
    attn = attn * torch.sigmoid(gate)
    return self.o_proj(attn), None


def _lfm2_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``Lfm2Attention.forward`` for the scoring pass, attention AND rotary as one
    ``GroupQueryAttention`` (``do_rotary=1``).

    The rotary caches are the first half of transformers' own cos/sin (``position_embeddings``,
    (1, L, D), computed by the model from ``position_ids`` = 0 .. L-1): row p is position p, which
    is the position GQA gives row p of a first prompt chunk. The q/k layernorms stay standard
    nodes before the op; the mask is not read (see the module doc)."""
    if cache is not None:
        raise NotImplementedError("the fused attention serves the scoring pass only (no cache).")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_layernorm(self.q_proj(hidden_states).view(*hidden_shape))
    key_states = self.k_layernorm(self.k_proj(hidden_states).view(*hidden_shape))
    value_states = self.v_proj(hidden_states)
    cos, sin = position_embeddings
    half = self.head_dim // 2
    n_heads = self.config.num_attention_heads
    n_kv = self.config.num_key_value_heads
    attn = torch.ops.spotstop_fused.group_query_attention(
        query_states.reshape(*input_shape, -1),
        key_states.reshape(*input_shape, -1),
        value_states,
        _as(cos[0, :, :half], query_states.dtype),
        _as(sin[0, :, :half], query_states.dtype),
        n_heads,
        n_kv,
        1,
        float(self.scaling),
    )
    return self.out_proj(attn), None


def _qwen3_5_rms_norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``Qwen3_5RMSNorm.forward`` as ``SimplifiedLayerNormalization`` (its scale ``1 + w``: a
    constant the exporters fold)."""
    out = torch.ops.spotstop_fused.rms_norm(_f32(x), 1.0 + self.weight.float(), float(self.eps))
    return _as(out, x.dtype)


def _qwen3_5_gated_norm_forward(
    self: Any, hidden_states: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """``Qwen3_5RMSNormGated.forward`` as one ``GatedRMSNorm`` (activation="silu"), float32 as
    the reference (genai's ``make_gated_rms_norm``)."""
    dtype = hidden_states.dtype
    out = torch.ops.spotstop_fused.gated_rms_norm(
        _f32(hidden_states), self.weight.float(), _f32(gate), float(self.variance_epsilon)
    )
    return _as(out, dtype)


def _lfm2_rms_norm_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``Lfm2RMSNorm.forward`` as ``SimplifiedLayerNormalization``."""
    out = torch.ops.spotstop_fused.rms_norm(
        _f32(x), self.weight.float(), float(self.variance_epsilon)
    )
    return _as(out, x.dtype)


def _skip_norm(norm: Any, x: torch.Tensor, residual: torch.Tensor) -> tuple[Any, Any]:
    """``(norm(residual + x), residual + x)`` as one ``SkipSimplifiedLayerNormalization``, for the
    RMSNorm module ``norm`` (Qwen3.5's scale is ``1 + w``, LFM2's ``w``)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    if isinstance(norm, mq.Qwen3_5RMSNorm):
        weight, eps = 1.0 + norm.weight.float(), float(norm.eps)
    else:
        weight, eps = norm.weight.float(), float(norm.variance_epsilon)
    return torch.ops.spotstop_fused.skip_rms_norm(x, residual, weight, eps)


def _qwen3_5_layer_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``Qwen3_5DecoderLayer.forward`` with the residual Add and the post-attention RMSNorm as
    one ``SkipSimplifiedLayerNormalization`` (input_skip_bias_sum is the next residual)."""
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
    hidden_states, residual = _skip_norm(self.post_attention_layernorm, hidden_states, residual)
    return residual + self.mlp(hidden_states)


def _lfm2_layer_forward(
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
    normed, hidden_states = _skip_norm(self.ffn_norm, hidden_states, residual)
    return hidden_states + self.feed_forward(normed)


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


def _qwen3_5_patches(stack: ExitStack) -> None:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    stack.enter_context(_patched(mod, "torch_chunk_gated_delta_rule", fused_chunk_gated_delta_rule))
    stack.enter_context(_patched(mod, "causal_conv1d_fn", fused_causal_conv1d_fn))
    stack.enter_context(
        _patched(mod.Qwen3_5GatedDeltaNet, "forward", _qwen3_5_gated_delta_net_forward)
    )
    stack.enter_context(
        _patched(mod.Qwen3_5VisionAttention, "forward", _qwen3_5_vision_attention_forward)
    )
    stack.enter_context(_patched(mod.Qwen3_5Attention, "forward", _qwen3_5_attention_forward))
    stack.enter_context(_patched(mod.Qwen3_5RMSNorm, "forward", _qwen3_5_rms_norm_forward))
    stack.enter_context(_patched(mod.Qwen3_5RMSNormGated, "forward", _qwen3_5_gated_norm_forward))
    stack.enter_context(_patched(mod.Qwen3_5DecoderLayer, "forward", _qwen3_5_layer_forward))


def _lfm2_patches(stack: ExitStack) -> None:
    from spotstop.export.configs import ExportConfig, get_export_config
    from transformers.models.lfm2 import modeling_lfm2 as mod

    cfg = get_export_config("lfm2_vl")
    default = ExportConfig.position_ids.__func__  # type: ignore[attr-defined]
    if cfg.position_ids.__func__ is not default:  # type: ignore[attr-defined]
        raise NotImplementedError(
            "LFM2's fused attention applies rotary at GQA's own positions 0 .. L-1; its export "
            "config now computes other position ids, so the fused rotary would be wrong. Export "
            "the standard graph form, or pass the rotary outside GroupQueryAttention (do_rotary=0)."
        )
    stack.enter_context(_patched(mod, "causal_conv1d_fn", fused_causal_conv1d_fn))
    stack.enter_context(_patched(mod.Lfm2Attention, "forward", _lfm2_attention_forward))
    stack.enter_context(_patched(mod.Lfm2RMSNorm, "forward", _lfm2_rms_norm_forward))
    stack.enter_context(_patched(mod.Lfm2DecoderLayer, "forward", _lfm2_layer_forward))


_PATCHES: dict[str, Callable[[ExitStack], None]] = {
    "qwen3_5": _qwen3_5_patches,
    "lfm2_vl": _lfm2_patches,
}


def fused_architectures() -> tuple[str, ...]:
    """The model types :func:`fused_patcher` has a fused decoder for."""
    return tuple(sorted(_PATCHES))


@contextmanager
def fused_patcher(model_type: str, max_length: int) -> Iterator[None]:
    """Within the block, the ``model_type`` model's layers (decoder and vision tower) call the
    fused custom ops (see the module doc), for sequences up to ``max_length`` tokens (nothing
    fused here depends on it: ``LinearAttention`` and ``GroupQueryAttention`` take any length;
    it is the same argument as the config's ``decoder_patcher``).

    Enter it while :class:`~spotstop.export.graphs.DecoderGraph` (or
    :class:`~spotstop.export.graphs.VisionGraph`) is exported, and pass
    :func:`dynamo_translations` to a dynamo export (export/exporters.py ``export_decoder`` with
    ``graph_form="fused"`` does both; ``export_vision`` likewise). Outside the block the model is
    the transformers model again.
    """
    if model_type not in _PATCHES:
        raise ValueError(
            f"no fused graph form for {model_type!r} (fused: {list(fused_architectures())}); "
            "export it with graph_form='standard'."
        )
    if int(max_length) <= 0:
        raise ValueError(f"max_length must be a positive token count; got {max_length}.")
    with ExitStack() as stack:
        _PATCHES[model_type](stack)
        yield


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
