"""What an architecture's cost model is: parameter roles, a scene's workload, the formulas' base.

:class:`ArchCost` is the base of every architecture's FLOP and parameter formulas (one subclass
in each ``export/archs/<model_type>.py``); :class:`Params` splits a member's parameters by role
and :func:`stored_weight_bytes` is the one bytes-per-precision rule, which
``jetson/memory_budget.py`` calls too. What is counted, and the roofline over it, is
``export/cost.py``'s docstring; no torch here (``spotstop cost`` runs on the base install).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from spotstop.export.precision import PRECISION_SPECS, get_precision
from spotstop.export.quant import BLOCK_SIZE

__all__ = [
    "CHUNK",
    "PRECISIONS",
    "WEIGHT_BYTES",
    "ArchCost",
    "Params",
    "Workload",
    "config_value",
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
    image_ends: float = 0,
) -> float:
    """Bytes of a member's weights as ``spotstop export`` stores them at ``precision``: the one
    rule the cost model and ``jetson/memory_budget.py`` both use.

    ``linear``: matrix-multiply weights (an untied output layer included); ``table``: the token
    table; ``other``: norms, convolutions, biases; ``tied``: the output layer is the token
    table. A tied table is stored once at fp32/fp16 (the Gather and the output layer read it);
    at int8/int4 it is the output layer's MatMulNBits blocks, which ``GatherBlockQuantized``
    reads with a second copy of the scales (with the precision's ``table_residual``, int8's
    and int4's, plus the 8-bit blocks of their rounding residual that a second
    ``GatherBlockQuantized`` adds, export/weights.py's ``residual_blocks``: 1 B and a scale per
    weight); at int4-trt (TensorRT has no quantized Gather) the float16 table and the int4
    blocks are both stored. At int4, ``linear_int8`` of the
    ``linear`` weights and, with ``table_int8``, a tied table are kept at int8
    (export/mixed.py decides which), in int4's blocks (one MatMulNBits block per graph).
    ``image_ends`` of the ``linear`` weights are the vision graph's first and last layers: a
    precision with ``float32_image_ends`` stores them at 4 B (``linear_int8`` excludes them).
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
    if not 0 <= image_ends <= linear:
        raise ValueError(f"image_ends ({image_ends}) must lie in [0, linear ({linear})].")
    ends_bytes = 0.0
    if spec.float32_image_ends:
        linear, ends_bytes = linear - image_ends, 4.0 * image_ends
    if not 0 <= linear_int8 <= linear:
        raise ValueError(f"linear_int8 ({linear_int8}) must lie in [0, linear ({linear})].")
    if tied and spec.tied_table == "shared":  # the blocks, their scales again, the residual
        table_bytes = table * (per_table + scale + (1.0 + scale if spec.table_residual else 0))
    elif tied and spec.tied_table == "both":
        table_bytes = table * (b["embed"] + b["linear"])
    else:
        table_bytes = table * b["embed"]
    linear_bytes = (linear - linear_int8) * per + linear_int8 * per8
    return linear_bytes + table_bytes + other * b["other"] + ends_bytes


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
    #: of ``vision_linear``: the vision graph's first and last layers (a Linear patch
    #: embedding, the projector's last), which int8 and int4 keep float32
    #: (``PrecisionSpec.float32_image_ends``)
    vision_ends: int = 0

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
                image_ends=self.vision_ends,
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


def config_value(d: Mapping[str, Any], key: str, default: Any) -> Any:
    """``d[key]``, or ``default`` where the key is missing or null (as config.json writes it)."""
    v = d.get(key, default)
    return default if v is None else v


class ArchCost(ABC):
    """FLOP and parameter formulas of one architecture (multiply-adds; x2 for FLOPs)."""

    model_type: ClassVar[str]
    #: the decoder's ``text_config.layer_types`` entries the formulas know
    layer_types: ClassVar[frozenset[str]]

    def checked_layers(self, text: Mapping[str, Any]) -> list[str]:
        """``text["layer_types"]`` after checking that every entry is a layer type the
        formulas know (:attr:`layer_types`)."""
        layers = list(text["layer_types"])
        bad = sorted(set(layers) - self.layer_types)
        if bad:
            raise ValueError(
                f"{self.model_type}: layer types {bad} have no cost formula in "
                f"export/archs/{self.model_type}.py."
            )
        return layers

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

    def int8_linear(
        self, config: Mapping[str, Any], selectors: Sequence[str], precision: str = "int4"
    ) -> int:
        """Linear weights an int4 export with ``selectors`` keeps at int8 (export/mixed.py's
        rule, :func:`~spotstop.export.mixed.keeps_int8`): the decoder's chosen weights, the
        vision tower's (``vision``) and an untied output layer (``output_layer``). A tied
        output layer is the token table: :meth:`Params.bytes` takes it as ``table_int8``.
        The vision tower's two ends are left out where ``precision`` keeps them float32
        (``PrecisionSpec.float32_image_ends``)."""
        from spotstop.export.mixed import keeps_int8

        p = self.params(config)
        rows = self.decoder_linears(config)
        n = max((i for i, *_ in rows), default=-1) + 1
        total = sum(c for i, lin, role, c in rows if keeps_int8(selectors, role, i, n, lin))
        if keeps_int8(selectors, "vision"):
            ends = p.vision_ends if get_precision(precision).float32_image_ends else 0
            total += p.vision_linear - p.unused[0] - ends
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
