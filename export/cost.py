"""Cost model of one scene: prefill FLOPs, weight bytes and the roofline lower bound per device.

``spotstop cost BUNDLE`` and :func:`bundle_cost` read a bundle alone (``manifest.yaml``, each
member's ``config.json``, ``tokenizer.json`` and rendered template): no torch, no transformers,
so the command runs on the base install.

What is counted (one scene, scene pass: the camera image + the request; no gray or text pass)
    * FLOPs = 2 x multiply-adds of every matrix product the scoring graphs run
      (export/graphs.py): linear layers, convolutions (patch embedding, the depthwise causal
      convolutions over their L + k - 1 padded outputs), attention scores and values over the
      full L x L matrix (the exported graph computes it all; a causal kernel would do about
      half), the Gated-DeltaNet's chunked algorithm as transformers' ``torch_chunk_gated_delta_rule``
      writes it for export, the reference an export is validated against (chunk size 64; the
      sequence padded to whole chunks; an exported kernel that computes the same result
      another way may do other work): the C x C
      products k_beta k^T and q k^T, the UT transform applied as two C x C products, and per
      chunk the state reads k_cumdecay S and q S, the intra-chunk product A v_new and the state
      update k^T v_new; SigLIP2's position-table resize (a matrix product); the output layer
      only at the rows the score reads: the answers' first-token rows at the last prompt
      position and one full-vocabulary row per continuation read (teacher forcing; the ONNX
      graph reads at least one such row per sequence).
    * Not counted: norms, activations, rotary embeddings, softmax, gating and other
      elementwise work, embedding gathers, and the forward substitution that builds the UT
      transform's inverse (elementwise, about C^3/3 multiply-adds per head and chunk). The
      SigLIP2 attention-pooling head is not counted: the scoring graph never reads it (the
      ONNX export drops it; the torch reference computes it).
    * Prefill only: one forward pass per continuation row over prompt + row, no generation.
    * Weight bytes per precision follow ``spotstop export`` (and ``jetson/memory_budget.py``):
      fp32 4 B, fp16 2 B per parameter; int8/int4 weight-only MatMulNBits on the matrix
      multiplies (1 / 0.5 B per weight + a float32 scale per block of 128), the token table as
      float16 (tied: the output layer's blocks plus a second copy of the scales), the rest
      float32; int4-trt int4 blocks with float16 scales on the fp16 graph (tied: the float16
      table and the blocks). One rule, :func:`stored_weight_bytes`, which
      ``jetson/memory_budget.py`` calls too.

Roofline: the lower bound of one scene on a device is ``max(FLOPs / peak, bytes / bandwidth)``
with every weight read once from memory (activations at batch one are neglected: they are a few
MB against GB of weights). fp16: fp16 weights at the fp16 dense peak; int8: int8 weights at the
int8 dense peak (a W8A8 engine: weight-only int8 computes in fp16 and is bounded by the fp16
peak); int4: int4 weights computed in fp16 (weight-only). Peaks are dense (no 2:4 sparsity).

Per-architecture formulas are registered by ``model_type`` (:data:`COST_MODELS`), like the rest
of export; tests/test_cost.py checks them against torch's FLOP counter on the tiny pair.
"""

from __future__ import annotations

import math
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from spotstop.export.cost_data import DEVICES, PAPER_TFLOPS, REAL_PAIR, REAL_SETTINGS
from spotstop.export.mixed import DEFAULT_INT4_INT8
from spotstop.export.precision import PRECISION_SPECS, get_precision
from spotstop.export.quant import BLOCK_SIZE

__all__ = [
    "ASSUMPTIONS",
    "CHUNK",
    "COST_MODELS",
    "DEVICES",
    "PRECISIONS",
    "WEIGHT_BYTES",
    "ArchCost",
    "MemberCost",
    "PairCost",
    "Params",
    "Workload",
    "bench_member_cost",
    "bundle_cost",
    "format_report",
    "get_cost_model",
    "measured_latencies",
    "member_cost",
    "paper_text_tokens",
    "real_pair_cost",
    "register",
    "report",
    "roofline",
    "stored_weight_bytes",
]

#: chunk size of transformers' torch_chunk_gated_delta_rule
CHUNK = 64
#: bytes per parameter by role and precision, as ``spotstop export`` writes them: each
#: precision's spec (export/precision.py); ``linear`` matrix-multiply weights, ``embed`` the
#: token table, ``other`` the rest.
WEIGHT_BYTES: dict[str, dict[str, float]] = {
    p: dict(s.weight_bytes) for p, s in PRECISION_SPECS.items()
}
PRECISIONS: tuple[str, ...] = tuple(WEIGHT_BYTES)


def stored_weight_bytes(
    precision: str,
    *,
    linear: float,
    table: float,
    other: float,
    tied: bool,
    linear_int8: float = 0,
    table_int8: bool = False,
) -> float:
    """Bytes of a member's weights as ``spotstop export`` stores them at ``precision``: the one
    rule the cost model and ``jetson/memory_budget.py`` both use.

    ``linear``: matrix-multiply weights (an untied output layer included); ``table``: the token
    table; ``other``: norms, convolutions, biases; ``tied``: the output layer is the token
    table. A tied table is stored once at fp32/fp16 (the Gather and the output layer read it);
    at int8/int4 it is the output layer's MatMulNBits blocks, which ``GatherBlockQuantized``
    reads with a second copy of the scales; at int4-trt (TensorRT has no quantized Gather) the
    float16 table and the int4 blocks are both stored. At int4, ``linear_int8`` of the
    ``linear`` weights and, with ``table_int8``, a tied table are kept at int8
    (export/mixed.py decides which), in int4's blocks (one MatMulNBits block per graph).
    """
    spec = get_precision(precision)
    b = WEIGHT_BYTES[precision]
    per, per_table = b["linear"], b["linear"]
    scale = spec.table_scale_bytes or 4 / BLOCK_SIZE  # a float32 scale per block
    per8 = 1.0 + scale  # an int8 weight in this precision's blocks
    if spec.nbits != 4:  # only int4 keeps some weights at 8 bits (export/mixed.py)
        linear_int8, table_int8 = 0, False
    elif table_int8:
        per_table = per8
    if not 0 <= linear_int8 <= linear:
        raise ValueError(f"linear_int8 ({linear_int8}) must lie in [0, linear ({linear})].")
    if tied and spec.tied_table == "shared":
        table_bytes = table * (per_table + scale)
    elif tied and spec.tied_table == "both":
        table_bytes = table * (b["embed"] + b["linear"])
    else:
        table_bytes = table * b["embed"]
    linear_bytes = (linear - linear_int8) * per + linear_int8 * per8
    return linear_bytes + table_bytes + other * b["other"]


#: precision -> which dense peak its compute runs at (module docstring)
_PEAK_OF = {p: s.roofline_peak for p, s in PRECISION_SPECS.items() if s.roofline_peak}
ROOFLINE_PRECISIONS: tuple[str, ...] = tuple(_PEAK_OF)


@dataclass(frozen=True)
class Params:
    """Parameter counts by role: matrix-multiply weights, the token table, the rest."""

    vision_linear: int
    vision_other: int
    text_linear: int  # without the output layer
    embed: int  # token table (vocab x hidden)
    head: int  # an untied output layer (vocab x hidden); 0 when tied to the table
    other: int  # text norms, convolutions, biases
    #: of the vision counts: weights the checkpoint holds but the scoring graph never reads
    #: (SigLIP2's attention-pooling head), as (linear, other)
    unused: tuple[int, int] = (0, 0)

    @property
    def total(self) -> int:
        """Every parameter of the checkpoint (the torch model's count)."""
        return (
            self.vision_linear
            + self.vision_other
            + self.text_linear
            + self.embed
            + self.head
            + self.other
        )

    def bytes(self, precision: str, linear_int8: int = 0, table_int8: bool = False) -> int:
        """Weight bytes as ``spotstop export`` writes them at ``precision`` (without the
        weights the scoring graph never reads); at int4, ``linear_int8`` of the linear weights
        and (``table_int8``) a tied table kept at int8 (:meth:`ArchCost.int8_linear`)."""
        return round(
            stored_weight_bytes(
                precision,
                linear=self.vision_linear - self.unused[0] + self.text_linear + self.head,
                table=self.embed,
                other=self.vision_other - self.unused[1] + self.other,
                tied=not self.head,
                linear_int8=linear_int8,
                table_int8=table_int8 and not self.head,
            )
        )


@dataclass(frozen=True)
class Workload:
    """What one scene asks of one member.

    ``images``: one (patch rows, patch columns) per vision pass (one image, or LFM2-VL's tiles);
    ``seq_len``: tokens of each decoder sequence (prompt with its visual tokens + continuation
    row); ``n_seqs``: sequences per scene (continuation rows); ``first_rows``: output-layer rows
    read at the last prompt position; ``read_rows``: full-vocabulary rows per sequence.
    """

    images: tuple[tuple[int, int], ...]
    seq_len: int
    n_seqs: int = 1
    first_rows: int = 2
    read_rows: int = 0


def _g(d: Mapping[str, Any], key: str, default: Any) -> Any:
    v = d.get(key, default)
    return default if v is None else v


class ArchCost(ABC):
    """FLOP and parameter formulas of one architecture (multiply-adds; x2 for FLOPs)."""

    model_type: ClassVar[str]

    @abstractmethod
    def vision_macs(self, config: Mapping[str, Any], grid: tuple[int, int]) -> dict[str, int]:
        """Multiply-adds of one vision pass over a (rows, columns) patch grid, by item."""

    @abstractmethod
    def decoder_macs(self, config: Mapping[str, Any], length: int) -> dict[str, int]:
        """Multiply-adds of the decoder over ONE sequence of ``length`` tokens (no output
        layer), by item."""

    @abstractmethod
    def params(self, config: Mapping[str, Any]) -> Params:
        """Parameter counts by role."""

    @abstractmethod
    def visual_tokens(self, config: Mapping[str, Any], grid: tuple[int, int]) -> int:
        """Visual tokens the decoder sees for one image of that patch grid."""

    @abstractmethod
    def decoder_linears(self, config: Mapping[str, Any]) -> list[tuple[int, bool, str, int]]:
        """The decoder layers' matrix-multiply weights by role, for export/mixed.py's rule:
        (layer, a Gated-DeltaNet layer, role, parameters); together they are
        ``params(config).text_linear``."""

    def int8_linear(self, config: Mapping[str, Any], selectors: Sequence[str]) -> int:
        """Linear weights an int4 export with ``selectors`` keeps at int8 (export/mixed.py's
        rule, :func:`~spotstop.export.mixed.keeps_int8`): the decoder's chosen weights, the
        vision tower's (``vision``) and an untied output layer (``output_layer``). A tied
        output layer is the token table: :meth:`Params.bytes` takes it as ``table_int8``."""
        from spotstop.export.mixed import keeps_int8

        p = self.params(config)
        rows = self.decoder_linears(config)
        n = max((i for i, *_ in rows), default=-1) + 1
        total = sum(c for i, lin, role, c in rows if keeps_int8(selectors, role, i, n, lin))
        if keeps_int8(selectors, "vision"):
            total += p.vision_linear - p.unused[0]
        if keeps_int8(selectors, "output"):
            total += p.head
        return total

    @staticmethod
    def text(config: Mapping[str, Any]) -> Mapping[str, Any]:
        return config.get("text_config") or {}

    @staticmethod
    def vision(config: Mapping[str, Any]) -> Mapping[str, Any]:
        return config.get("vision_config") or {}

    def output_macs(self, config: Mapping[str, Any], w: Workload) -> int:
        """The output layer at the rows the score reads, for all sequences of a scene."""
        t = self.text(config)
        h, v = int(t["hidden_size"]), int(t["vocab_size"])
        return w.n_seqs * h * (w.first_rows + w.read_rows * v)

    @staticmethod
    def _attention(length: int, heads: int, head_dim: int, v_dim: int | None = None) -> int:
        """Scores and values over the full length x length matrix."""
        return heads * length * length * (head_dim + (v_dim if v_dim is not None else head_dim))


COST_MODELS: dict[str, ArchCost] = {}


def register(cls: type[ArchCost]) -> type[ArchCost]:
    """Class decorator: register an instance of ``cls`` for ``cls.model_type``."""
    COST_MODELS[cls.model_type] = cls()
    return cls


def get_cost_model(model_type: str) -> ArchCost:
    try:
        return COST_MODELS[model_type]
    except KeyError:
        raise ValueError(
            f"no cost model is registered for architecture {model_type!r}; registered: "
            f"{sorted(COST_MODELS)}. Add one in export/cost.py."
        ) from None


@register
class Qwen35Cost(ArchCost):
    """Qwen3.5: ViT (Conv3d patch embedding, bidirectional attention, 2x2 patch merger) and a
    hybrid decoder of Gated-DeltaNet layers and gated full-attention layers (GQA)."""

    model_type = "qwen3_5"

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
        layers = list(lin_check(list(t["layer_types"]), self.model_type))
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
        for i, kind in enumerate(lin_check(list(t["layer_types"]), self.model_type)):
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
        return Params(vl, vo, tl, vocab * h, 0 if tied else vocab * h, to)


def lin_check(layers: Sequence[str], model_type: str) -> Sequence[str]:
    """``layers`` after checking that every entry is a layer type the formulas know."""
    known = {
        "qwen3_5": {"linear_attention", "full_attention"},
        "lfm2_vl": {"conv", "full_attention"},
    }
    bad = sorted(set(layers) - known[model_type])
    if bad:
        raise ValueError(f"{model_type}: layer types {bad} have no cost formula in export/cost.py.")
    return layers


@register
class Lfm2VlCost(ArchCost):
    """LFM2-VL: SigLIP2 NaFlex tower (linear patch embedding, resized position table,
    bidirectional attention) + pixel-unshuffle projector, and an LFM2 decoder of gated
    short-convolution layers and GQA attention layers."""

    model_type = "lfm2_vl"

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
        layers = list(lin_check(list(t["layer_types"]), self.model_type))
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
        for i, kind in enumerate(lin_check(list(t["layer_types"]), self.model_type)):
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
        return Params(vl, vo, tl, vocab * h, 0 if tied else vocab * h, to, unused)


# ---- per member, per scene -------------------------------------------------------------------


@dataclass(frozen=True)
class MemberCost:
    """One member's cost of one scene (FLOPs = 2 x multiply-adds)."""

    name: str
    model_type: str
    workload: Workload
    visual_tokens: int
    vision_flops: dict[str, int]
    decoder_flops: dict[str, int]
    output_flops: int
    params: Params
    precision: str | None = None  # the bundle's precision (None: not from a bundle)
    bundle_weight_bytes: int | None = None  # as the bundle's manifest records them
    padded_len: int | None = None  # the length bucket the ONNX graph runs at, if any
    padded_flops: int | None = None  # total FLOPs at that bucket
    #: what an int4 export of this member keeps at int8 (export/mixed.py's selectors) and the
    #: linear weights that makes (a tied output layer is the token table, not counted here)
    int4_int8: tuple[str, ...] = DEFAULT_INT4_INT8
    int4_linear_int8: int = 0

    @property
    def vision(self) -> int:
        return sum(self.vision_flops.values())

    @property
    def decoder(self) -> int:
        """Decoder prefill including the output rows read."""
        return sum(self.decoder_flops.values()) + self.output_flops

    @property
    def total(self) -> int:
        return self.vision + self.decoder

    def weight_bytes(self, precision: str) -> int:
        if get_precision(precision).nbits == 4:
            return self.params.bytes(
                precision, self.int4_linear_int8, "output_layer" in self.int4_int8
            )
        return self.params.bytes(precision)

    def as_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "name": self.name,
            "model_type": self.model_type,
            "images": [list(g) for g in w.images],
            "visual_tokens": self.visual_tokens,
            "seq_len": w.seq_len,
            "n_seqs": w.n_seqs,
            "first_rows": w.first_rows,
            "read_rows": w.read_rows,
            "vision_flops": self.vision,
            "vision_flops_by_item": self.vision_flops,
            "decoder_flops": self.decoder,
            "decoder_flops_by_item": {**self.decoder_flops, "output rows": self.output_flops},
            "total_flops": self.total,
            "params": self.params.total,
            "weight_bytes": {p: self.weight_bytes(p) for p in PRECISIONS},
            "int4_int8": list(self.int4_int8),
            "precision": self.precision,
            "bundle_weight_bytes": self.bundle_weight_bytes,
            "padded_len": self.padded_len,
            "padded_flops": self.padded_flops,
        }


def member_cost(
    name: str,
    config: Mapping[str, Any],
    workload: Workload,
    *,
    int4_int8: Sequence[str] = DEFAULT_INT4_INT8,
    **extra: Any,
) -> MemberCost:
    """A member's cost of one scene from its Hugging Face ``config`` (config.json as a dict);
    ``int4_int8``: what its int4 export keeps at int8 (export/mixed.py)."""
    model = get_cost_model(str(config["model_type"]))
    sel = tuple(int4_int8)
    vision: dict[str, int] = {}
    for grid in workload.images:
        for item, macs in model.vision_macs(config, grid).items():
            vision[item] = vision.get(item, 0) + 2 * macs
    decoder = {
        item: 2 * workload.n_seqs * macs
        for item, macs in model.decoder_macs(config, workload.seq_len).items()
    }
    return MemberCost(
        name=name,
        model_type=model.model_type,
        workload=workload,
        visual_tokens=sum(model.visual_tokens(config, g) for g in workload.images),
        vision_flops=vision,
        decoder_flops=decoder,
        output_flops=2 * model.output_macs(config, workload),
        params=model.params(config),
        int4_int8=sel,
        int4_linear_int8=model.int8_linear(config, sel),
        **extra,
    )


@dataclass(frozen=True)
class PairCost:
    """Every member's cost of one scene, the scene's total and where they came from."""

    label: str
    members: tuple[MemberCost, ...]
    test_pair: bool = False
    setting: str | None = None  # the paper's setting this pair is costed at (--real)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return sum(m.total for m in self.members)

    def weight_bytes(self, precision: str) -> int:
        return sum(m.weight_bytes(precision) for m in self.members)


def roofline(flops: float, weight_bytes: float, device: str, precision: str) -> dict[str, float]:
    """Seconds: the compute bound, the memory bound and the lower bound (their max)."""
    dev = DEVICES[device]
    compute = flops / (float(dev[_PEAK_OF[precision]]) * 1e12)
    memory = weight_bytes / (float(dev["bandwidth_gbs"]) * 1e9)
    return {"compute_s": compute, "memory_s": memory, "bound_s": max(compute, memory)}


# ---- from a bundle ---------------------------------------------------------------------------

DEFAULT_REQUEST = "pick up the knife and hand it to the child"


def bundle_cost(path: str | os.PathLike[str], *, request: str = DEFAULT_REQUEST) -> PairCost:
    """Each member's cost of one scene of the bundle at ``path``, from its real token counts.

    The prompt is the bundle's own (rendered template, the member's tokenizer) with ``request``;
    the image grid is the member's; the continuation rows and the rows read follow the score
    plan of the bundle's answers. An ONNX member whose decoder has one graph per length bucket
    (or that runs on TensorRT) runs at the padded bucket: the FLOPs at that length are reported
    too (``padded_flops``); onnxruntime runs a dynamic-length decoder at the prompt's length.
    """
    import json

    import yaml
    from spotstop.guard._arch import get_arch
    from spotstop.guard._bundle import load_bundle
    from spotstop.guard._prompt import PromptEncoder

    b = load_bundle(path, verify=False)
    entries = {e["name"]: e for e in b.manifest.get("members", [])}
    members = []
    for bm in b.members:
        config = json.loads((bm.path / "config.json").read_text(encoding="utf-8"))
        pre_path = bm.path / "preprocessor_config.json"
        pre = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
        arch = get_arch(bm.model_type)
        geom = arch.geometry(config, pre, bm.image_size)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(bm.path / "tokenizer.json"))
        enc = PromptEncoder(tok, bm.template, b.prompt)
        prompt = enc.prompt_ids(request, arch.image_text(geom))
        plan = enc.plan
        rows = len(plan.rows)
        seq = len(prompt) + plan.max_row_len
        entry = entries.get(bm.name, {})
        onnx = bm.backend != "torch"
        reads = _reads_per_row(plan)
        grid = (geom.height // geom.patch_size, geom.width // geom.patch_size)
        w = Workload(
            images=(grid,),
            seq_len=seq,
            n_seqs=rows,
            first_rows=len(plan.first_ids),
            read_rows=max(1, reads) if onnx else reads,
        )
        padded_len = padded = None
        buckets = sorted(int(x) for x in entry.get("buckets") or [])
        graphs = bm.path / "spotstop_onnx.yaml"  # guard.backends._graphs.GRAPHS_FILE
        decoder: dict[str, Any] = {}
        if onnx and graphs.is_file():
            decoder = (yaml.safe_load(graphs.read_text(encoding="utf-8")) or {}).get(
                "decoder"
            ) or {}
            buckets = buckets or sorted(int(x) for x in decoder.get("buckets") or [])
        # onnxruntime runs a dynamic-length decoder at the prompt's own length; one graph per
        # bucket (the old Qwen3.5 format) and TensorRT engines run at the padded bucket
        padded_runs = bool(decoder.get("fixed_length", True)) or bm.backend == "tensorrt"
        if onnx and buckets and padded_runs:
            padded_len = next((x for x in buckets if x >= seq), buckets[-1])
            padded = member_cost(
                bm.name, config, Workload(w.images, padded_len, rows, w.first_rows, w.read_rows)
            ).total
        precision = entry.get("precision") or ("fp32" if not onnx else None)
        # what this bundle's int4 weights keep at int8, as its export recorded (an int4 bundle
        # from before the record: none); another precision's int4 figure: the default
        int8 = entry.get("int4_int8")
        sel = (
            tuple(int8) if int8 is not None else (() if precision == "int4" else DEFAULT_INT4_INT8)
        )
        members.append(
            member_cost(
                bm.name,
                config,
                w,
                int4_int8=sel,
                precision=precision,
                bundle_weight_bytes=entry.get("weight_bytes"),
                padded_len=padded_len,
                padded_flops=padded,
            )
        )
    return PairCost(
        label=b.bundle_id,
        members=tuple(members),
        test_pair=b.test_pair,
        notes=(f"request: {request!r} (its tokens count; pass --request to cost another)",),
    )


def _reads_per_row(plan: Any) -> int:
    """Full-vocabulary rows the busiest continuation row reads (the graph's K)."""
    per_row = [0] * len(plan.rows)
    seen: set[tuple[int, int, int]] = set()
    for r, j, tok in plan.continuation_reads(plan.unsafe_ids) + plan.continuation_reads(
        plan.safe_ids
    ):
        if (r, j, tok) not in seen:
            seen.add((r, j, tok))
            per_row[r] += 1
    return max(per_row, default=0)


# ---- the real pair at the paper's settings ---------------------------------------------------

#: prompt tokens besides the visual ones, for --real (no real tokenizer here): the default
#: prompt (about 45 words), a short request, the chat markers and the image delimiters
DEFAULT_TEXT_TOKENS = 72


def real_pair_cost(setting: str, *, text_tokens: int = DEFAULT_TEXT_TOKENS) -> PairCost:
    """The real pair (recorded configs, export/cost_data.py) at the paper's ``setting``
    (``low`` or ``default``): one scene, single-token answers (two first-token rows, no
    full-vocabulary row), ``text_tokens`` prompt tokens besides the visual ones."""
    if setting not in REAL_SETTINGS:
        raise ValueError(f"setting must be one of {sorted(REAL_SETTINGS)}; got {setting!r}.")
    members = []
    for name, config in REAL_PAIR.items():
        grids = tuple(REAL_SETTINGS[setting][name])
        model = get_cost_model(str(config["model_type"]))
        visual = sum(model.visual_tokens(config, g) for g in grids)
        w = Workload(grids, seq_len=visual + text_tokens, n_seqs=1, first_rows=2, read_rows=0)
        members.append(member_cost(name, config, w))
    return PairCost(
        label=f"real pair (recorded configs), paper setting {setting!r}",
        members=tuple(members),
        setting=setting,
        notes=(
            f"{text_tokens} prompt tokens besides the visual ones (assumed; --text-tokens)",
            "configs recorded, not re-read from the hub (export/cost_data.py)",
        ),
    )


def paper_text_tokens(setting: str, *, limit: int = 100_000) -> int | None:
    """The prompt text tokens (besides the visual ones) at which :func:`real_pair_cost`
    reaches the paper's TFLOPs for ``setting``; None when it exceeds them already at one
    token (this model's visual work alone is more than the paper's figure) or never does."""
    target = PAPER_TFLOPS[setting] * 1e12
    if real_pair_cost(setting, text_tokens=1).total >= target:
        return None
    if real_pair_cost(setting, text_tokens=limit).total < target:
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if real_pair_cost(setting, text_tokens=mid).total < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


#: bench/gpu.py's real-dimension run: 512x512 images (32x32 patches) for both members
BENCH_GRID = (32, 32)


def bench_member_cost(record: Mapping[str, Any]) -> MemberCost | None:
    """The real member's cost in a bench/gpu.py run (512x512, the run's median prompt
    length with its visual tokens, one row, single-token answers); None for a member or run it cannot cost."""
    config = REAL_PAIR.get(str(record.get("member")))
    tokens = record.get("prompt_tokens")
    if config is None or not tokens:
        return None
    return member_cost(str(record["member"]), config, Workload((BENCH_GRID,), int(tokens)))


# ---- measured latencies (a results file the user passes, e.g. bench/RESULTS.md) ---------------

_ROW = re.compile(
    r"^\|\s*(?P<member>[^|]+?)\s*\|\s*(?P<step>[^|]+?)\s*\|\s*(?P<figure>median latency|"
    r"prompt length)\s*\|\s*(?P<value>[0-9.eE+-]+)\s*\|"
)


def measured_latencies(
    results: str | os.PathLike[str], match: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """Median per-scene latencies in ``results`` (bench/RESULTS.md, sections as bench/gpu.py
    writes them: a ``### date — GPU — command`` heading and a ``| member | step | figure |
    value | unit |`` table) from the sections whose text ``match`` accepts. Each: member,
    step (torch / ort / trt), ms, the prompt length in tokens when the section gives it
    (else None), the section's GPU and the device of :data:`DEVICES` it names (None: none)."""
    p = Path(results)
    if not p.is_file():
        return []
    sections = re.split(r"(?m)^(?=### )", p.read_text(encoding="utf-8"))
    out = []
    for sec in sections:
        if not sec.startswith("### ") or not match(sec):
            continue
        head = sec.splitlines()[0]
        parts = [x.strip() for x in head[4:].split("—")]
        gpu = parts[1] if len(parts) > 1 else ""
        device = next((d for d in DEVICES if _names_device(gpu, d)), None)
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for line in sec.splitlines():
            m = _ROW.match(line)
            if not m:
                continue
            rec = found.setdefault(
                (m["member"], m["step"]),
                {
                    "member": m["member"],
                    "step": m["step"],
                    "ms": None,
                    "prompt_tokens": None,
                    "gpu": gpu,
                    "device": device,
                },
            )
            if m["figure"] == "median latency":
                rec["ms"] = float(m["value"])
            else:
                rec["prompt_tokens"] = int(float(m["value"]))
        out += [r for r in found.values() if r["ms"] is not None]
    return out


def _names_device(gpu: str, device: str) -> bool:
    key = device.split()[0].lower() if device.startswith(("L4", "H200")) else device.lower()
    g = gpu.lower().replace("nvidia", "").replace("jetson", "").strip()
    return bool(re.search(rf"\b{re.escape(key)}\b", g)) if key else False


# ---- report ----------------------------------------------------------------------------------


def report(
    pair: PairCost,
    *,
    devices: Sequence[str] = tuple(DEVICES),
    measured: Sequence[Mapping[str, Any]] = (),
    bound_for: Callable[[Mapping[str, Any]], MemberCost | None] | None = None,
) -> dict[str, Any]:
    """Everything ``spotstop cost`` prints, as a JSON-ready dict.

    ``measured``: records of :func:`measured_latencies`; ``bound_for(record)`` the member cost
    the measured run had (default: the pair's member of that name), None to skip the record.
    """
    rl: dict[str, Any] = {}
    for d in devices:
        rl[d] = {}
        for p in ROOFLINE_PRECISIONS:
            scene = roofline(pair.total, pair.weight_bytes(p), d, p)
            per = {m.name: roofline(m.total, m.weight_bytes(p), d, p) for m in pair.members}
            rl[d][p] = {"scene": scene, "members": per}
    ratios = []
    for r in measured:
        if bound_for is not None:
            m = bound_for(r)
        else:
            m = next((x for x in pair.members if x.name == r["member"]), None)
        if m is None or r["device"] is None:
            continue
        bound = roofline(m.total, m.weight_bytes("fp16"), r["device"], "fp16")["bound_s"]
        ratios.append(
            {
                **r,
                "precision": "fp16",
                "bound_flops": m.total,
                "bound_ms": bound * 1e3,
                "ratio": r["ms"] / (bound * 1e3),
            }
        )
    return {
        "label": pair.label,
        "test_pair": pair.test_pair,
        "setting": pair.setting,
        "notes": list(pair.notes),
        "members": [m.as_dict() for m in pair.members],
        "scene_flops": pair.total,
        "scene_weight_bytes": {p: pair.weight_bytes(p) for p in PRECISIONS},
        "paper_tflops": PAPER_TFLOPS,
        "paper_text_tokens": (
            paper_text_tokens(pair.setting) if pair.setting in PAPER_TFLOPS else None
        ),
        "roofline": rl,
        "devices": {d: DEVICES[d] for d in devices},
        "measured": ratios,
        "assumptions": ASSUMPTIONS,
    }


ASSUMPTIONS = (
    "prefill of one scene (scene pass only), no generation; FLOPs = 2 x multiply-adds",
    "counted: linear layers, convolutions, attention scores + values over the full L x L "
    "matrix, Gated-DeltaNet chunked products (chunk 64), the output layer at the rows read",
    "not counted: norms, activations, rotary, softmax, elementwise gating, gathers, the UT "
    "inverse's forward substitution, SigLIP2's unused pooling head",
    "roofline: max(FLOPs / dense peak, weight bytes / bandwidth), weights read once, "
    "activations neglected; int8 at the int8 peak (W8A8), int4 weight-only at the fp16 peak",
)


def _fmt_flops(x: float) -> str:
    if x >= 1e12:
        return f"{x / 1e12:.2f} T"
    if x >= 1e9:
        return f"{x / 1e9:.2f} G"
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x / 1e3:.2f} k"


def _fmt_bytes(x: float) -> str:
    if x >= 2**30:
        return f"{x / 2**30:.2f} GiB"
    if x >= 2**20:
        return f"{x / 2**20:.1f} MiB"
    return f"{x / 2**10:.1f} KiB"


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


def format_report(doc: Mapping[str, Any]) -> str:
    """The text ``spotstop cost`` prints for a :func:`report`."""
    lines = [f"cost of one scene: {doc['label']}"]
    if doc["test_pair"]:
        lines.append("TEST PAIR: tiny random members; only the formulas are real.")
    lines += [f"  ({n})" for n in doc["notes"]]
    lines.append("")
    hdr = (
        f"{'member':<16} {'type':<8} {'visual':>6} {'seq':>5} {'rows':>4} "
        f"{'vision':>10} {'decoder':>10} {'(output)':>10} {'total':>10}  FLOPs"
    )
    lines.append(hdr)
    for m in doc["members"]:
        out = m["decoder_flops_by_item"]["output rows"]
        lines.append(
            f"{m['name'][:16]:<16} {m['model_type']:<8} {m['visual_tokens']:>6} "
            f"{m['seq_len']:>5} {m['n_seqs']:>4} {_fmt_flops(m['vision_flops']):>10} "
            f"{_fmt_flops(m['decoder_flops']):>10} {_fmt_flops(out):>10} "
            f"{_fmt_flops(m['total_flops']):>10}"
        )
        if m["padded_len"]:
            lines.append(
                f"{'':<16} as run: decoder padded to its length bucket {m['padded_len']} → "
                f"{_fmt_flops(m['padded_flops'])}FLOPs"
            )
    lines.append(
        f"{'scene':<16} {'':<8} {'':>6} {'':>5} {'':>4} {'':>10} {'':>10} {'':>10} "
        f"{_fmt_flops(doc['scene_flops']):>10}"
    )
    paper = doc["paper_tflops"]
    lines.append(
        f"paper (real pair, equal-weight, per case): {paper['low']} TFLOPs at the lowest "
        f"resolution, {paper['default']} TFLOPs at the default; this: "
        f"{doc['scene_flops'] / 1e12:.4g} TFLOPs"
    )
    setting = doc["setting"]
    if setting in paper:
        n = doc["paper_text_tokens"]
        lines.append(
            f"this model reaches the paper's {paper[setting]} TFLOPs ({setting}) at about {n} "
            "prompt text tokens per member (the paper does not give its prompt lengths)"
            if n
            else f"this model exceeds the paper's {paper[setting]} TFLOPs ({setting}) even at "
            "one text token: the assumed image tiling is heavier than the paper's"
        )
    lines.append("")
    lines.append(
        f"{'weights':<16} {'params':>8} "
        + " ".join(f"{p:>10}" for p in PRECISIONS)
        + f" {'bundle':>14}"
    )
    for m in doc["members"]:
        bw = m["bundle_weight_bytes"]
        bundle = f"{_fmt_bytes(bw)} {m['precision']}" if bw else "-"
        lines.append(
            f"{m['name'][:16]:<16} {m['params'] / 1e6:>7.2f}M "
            + " ".join(f"{_fmt_bytes(m['weight_bytes'][p]):>10}" for p in PRECISIONS)
            + f" {bundle:>14}"
        )
    lines.append(
        f"{'pair':<16} {'':>8} "
        + " ".join(f"{_fmt_bytes(doc['scene_weight_bytes'][p]):>10}" for p in PRECISIONS)
    )
    lines.append("")
    lines.append(
        "roofline lower bound of one scene, max(FLOPs / dense peak, weight bytes / "
        "bandwidth) [bound by: c compute, m memory]"
    )
    lines.append(
        f"{'device':<15} "
        + " ".join(f"{p:>14}" for p in ROOFLINE_PRECISIONS)
        + "   peak fp16 / int8, bandwidth"
    )
    for d, per in doc["roofline"].items():
        cells = []
        for p in ROOFLINE_PRECISIONS:
            s = per[p]["scene"]
            by = "c" if s["compute_s"] >= s["memory_s"] else "m"
            cells.append(f"{_fmt_s(s['bound_s'])} {by}".rjust(14))
        dev = doc["devices"][d]
        lines.append(
            f"{d:<15} "
            + " ".join(cells)
            + f"   {dev['fp16_tflops']:g} TFLOPS / {dev['int8_tops']:g} TOPS, "
            f"{dev['bandwidth_gbs']:g} GB/s"
        )
    lines.append("")
    if doc["measured"]:
        lines.append("measured (--results) / bound (fp16):")
        for r in doc["measured"]:
            lines.append(
                f"  {r['member']} {r['step']} on {r['gpu']}: {r['ms']:.2f} ms / "
                f"{r['bound_ms']:.3f} ms = {r['ratio']:.1f}x"
            )
    else:
        lines.append(
            "measured / bound: no measured latency for this pair (pass a results file with "
            "--results)."
        )
    lines.append("")
    lines.append("assumptions: " + "; ".join(doc["assumptions"]) + ".")
    return "\n".join(lines)
