"""Where a weight-only int8/int4 bundle's score error comes from, simulated in torch.

``spotstop verify-bundle`` says how far a quantized bundle's scores are from the torch
reference; this says which weights put the error there. The member's torch model (float32, the
reference ``verify-bundle`` uses) scores generated scenes; then, variant by variant, a group of
its ``nn.Linear`` weights is replaced by exactly what onnxruntime's ``MatMulNBits`` multiplies
by (``export/nbits.py``: ``nbits_blocks`` quantizes with onnxruntime's own kernel,
``dequantize_nbits`` inverts it; tests/export/test_nbits.py holds ``x @ W`` equal to the
operator's output), and the scenes are scored again. The output layer (tied to the token
table in both real members) is quantized as the bundle quantizes it, unless the variant says
``nohead`` (by round to nearest in every method: the scorer multiplies by it outside the
model's modules, where no input is recorded for GPTQ), and the token embeddings are what the
bundle's Gather reads (:func:`table_read`): a tied table through the output layer's blocks,
plus the 8-bit blocks of their rounding residual where the precision has ``table_residual``
(int8's; export/weights.py's ``residual_blocks``), an untied one as its float16 copy.
``:tablefloat`` keeps the table float (what this script did before the bundle's table was
found to matter: its 8-bit blocks alone moved Qwen3.5-2B's int8 scores up to 0.23,
bench/RESULTS.md, section ``int8-graph-parts-Qwen3.5-2B``); ``:tablecoarse`` reads the output
layer's blocks alone, without the residual table: what that table buys.

Per variant it prints the largest |Δs| over the scores (the figure ``verify-bundle`` bounds),
the RMS, and the mean Δs: the part of the error common to every scene (a shift of the score,
which the robust z-score's recentring on the deployment's own scores removes, and a direct
``s > 0`` decision does not); then the SD of ``Δs − mean Δs``, the part that differs between
scenes, and its ratio to the SD of the reference scores themselves: what can reorder the
scenes (verify-bundle's Spearman check). A ratio near 1 leaves no rank correlation to keep.

    python bench/quant_error.py MEMBER_FOLDER                     # int8 and int4, all weights
    python bench/quant_error.py MEMBER_FOLDER --variants "8:128:all,8:128:vision,8:128:mlp"
    python bench/quant_error.py MEMBER_FOLDER --bias-correct      # + per-layer bias correction
    python bench/quant_error.py MEMBER_FOLDER --gptq              # + GPTQ, as the export does it
    python bench/quant_error.py MEMBER_FOLDER --results bench/RESULTS.md   # + its own section
    python bench/quant_error.py MEMBER_FOLDER --world WORLD --variants "8:col:all,8:col:vision"

A variant is ``BITS:BLOCK:GROUP[:nohead][:tablefloat|:tablecoarse]``; groups: ``all``, ``vision`` (the vision tower and
projector), ``projector`` (the projector alone: Qwen3.5's patch merger, LFM2-VL's
``multi_modal_projector``), ``decoder``, ``mlp`` (decoder feed-forward), ``mixer`` (decoder
attention, Gated-DeltaNet and short-convolution projections), ``none``. ``8:col:GROUP`` is the
``int8`` precision instead (export/int8.py): int8 weights with one scale per output column
(``channel_int8``, GPTQ's codes with ``--gptq``) and the Linear's input quantized per token
(``dequantize_activations_per_token``), the group's Linears computing exactly what
``MatMulIntegerToFloat`` gives back; the output layer then stays weight-only 8-bit, as the
export keeps it. As the export, a decoder Linear's rows that the score reads (the positions
guard/backends/_graphs.py's ``decoder_feeds`` names) take their residual's codes too
(``dequantize_read_rows``, export/int8.py's exact reads); ``8:col:GROUP:int8reads`` rounds
them like every other row (the export's ``--int8-reads int8``).

``--world DIR`` scores the scenes of a ``spotstop world`` folder (each with its image, then
request-only) instead of generated ones: the scenes a trained tiny member was trained for.
 ``--bias-correct`` also scores each
variant with every quantized Linear given the bias ``-(W_q - W) x̄`` (``x̄``: the Linear's mean
input on a second set of calibration scenes), which removes each layer's mean output shift
(bias correction, Nagel et al. 2019, "Data-Free Quantization"); the export does not do this.
``--gptq`` also scores each variant with its weights chosen by GPTQ exactly as the export
chooses them (export/gptq.py: every Linear's inputs recorded to disk on the calibration scenes,
then ``gptq_nbits`` per weight).

The torch model is held in float32 (Qwen3.5-2B 8 GiB, LFM2.5-VL-3B 12 GiB at the real
dimensions) with a copy of its Linear weights to restore between variants (bfloat16 where
that is exact, as for a bfloat16 checkpoint).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from _results import write_section  # noqa: E402

#: group -> test on a module's qualified name
_VISION = re.compile(r"(^|\.)(visual|vision_tower|multi_modal_projector)\.")
_PROJECTOR = re.compile(r"(^|\.)(merger|multi_modal_projector)\.")
GROUPS: dict[str, Callable[[str], bool]] = {
    "all": lambda n: True,
    "none": lambda n: False,
    "vision": lambda n: _VISION.search(n) is not None,
    "projector": lambda n: _PROJECTOR.search(n) is not None,
    "decoder": lambda n: _VISION.search(n) is None,
    "mlp": lambda n: (
        _VISION.search(n) is None and re.search(r"\.(mlp|feed_forward)\.", n) is not None
    ),
    "mixer": lambda n: (
        _VISION.search(n) is None and re.search(r"\.(self_attn|linear_attn|conv)\.", n) is not None
    ),
}


#: the block of ``8:col:GROUP``: the int8 precision (per-column weights, per-token activations)
COLUMN = 0

#: how a variant's token embeddings are read: as the bundle reads them, float, or through
#: the output layer's blocks alone (no residual table)
TABLES = ("bundle", "float", "coarse")


class Variant(NamedTuple):
    """One simulated variant (:func:`parse_variant`)."""

    bits: int
    block: int  # :data:`COLUMN`: the int8 precision
    group: str
    qhead: bool  # the output layer (and a tied table) quantized
    int8: tuple[str, ...]  # export/mixed.py's selectors kept at 8 bits
    exact: bool  # the int8 precision's read rows exact
    table: str = "bundle"  # one of :data:`TABLES`

    @property
    def precision(self) -> str:
        """The registered precision whose table rule this variant follows."""
        return "int8" if self.block == COLUMN else "int8-nbits" if self.bits == 8 else "int4"


def parse_variant(text: str) -> Variant:
    """``BITS:BLOCK:GROUP[:nohead][:int8=SEL+SEL][:tablefloat|:tablecoarse]`` → the
    :class:`Variant` (the selectors export/mixed.py keeps at int8 among the group's weights);
    ``8:col:GROUP[:nohead][:int8reads]`` gives block :data:`COLUMN`, its read rows exact
    unless ``int8reads``."""
    from spotstop.export.mixed import parse_selectors

    parts = text.strip().split(":")
    want = (
        "want BITS:BLOCK:GROUP[:nohead][:int8=SEL+SEL][:tablefloat|:tablecoarse], "
        "e.g. 8:128:all or 4:128:all:int8=output_layer"
    )
    if len(parts) < 3:
        raise ValueError(f"variant {text!r}: {want}.")
    tables = {"tablefloat": "float", "tablecoarse": "coarse"}
    named = [tables[p] for p in parts[3:] if p in tables]
    if len(named) > 1:
        raise ValueError(f"variant {text!r}: one of tablefloat and tablecoarse, not both.")
    table = named[0] if named else "bundle"
    parts = [p for p in parts if p not in tables]
    exact = parts[1] == "col"
    if parts[1] == "col":
        if parts[0] != "8" or parts[3:] not in (
            [],
            ["nohead"],
            ["int8reads"],
            ["nohead", "int8reads"],
        ):
            raise ValueError(
                f"variant {text!r}: per column is the int8 precision alone: "
                "8:col:GROUP[:nohead][:int8reads]."
            )
        exact = "int8reads" not in parts
        parts = [p for p in parts if p != "int8reads"]
        parts[1] = str(COLUMN)
    bits, block, group = int(parts[0]), int(parts[1]), parts[2]
    qhead = True
    int8: tuple[str, ...] = ()
    for extra in parts[3:]:
        if extra == "nohead":
            qhead = False
        elif extra.startswith("int8="):
            int8 = parse_selectors(extra[5:].replace("+", ","))
        else:
            raise ValueError(f"variant {text!r}: {want}.")
    if bits not in (4, 8):
        raise ValueError(f"variant {text!r}: bits must be 4 or 8.")
    if block != COLUMN and (block < 16 or block & (block - 1)):
        raise ValueError(f"variant {text!r}: the block must be a power of two, at least 16.")
    if group not in GROUPS:
        raise ValueError(f"variant {text!r}: group must be one of {sorted(GROUPS)}.")
    if table != "bundle" and not qhead:
        raise ValueError(f"variant {text!r}: with nohead the token table is float already.")
    return Variant(bits, block, group, qhead, int8, exact, table)


def quantized(w: Any, bits: int, block: int, rows_per_chunk: int = 8192) -> Any:
    """``w`` (out, in) torch weight → the float32 weight MatMulNBits multiplies by (the graph's
    MatMul weight is ``w.T``), a chunk of output rows at a time (the output layer is 500 M
    weights in Qwen3.5-2B)."""
    import torch
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks

    out = torch.empty(w.shape, dtype=torch.float32)
    for a in range(0, w.shape[0], rows_per_chunk):
        part = w[a : a + rows_per_chunk].float().T.contiguous().numpy()  # (K, N)
        packed, scales = nbits_blocks(part, bits, block)
        out[a : a + rows_per_chunk] = torch.from_numpy(
            dequantize_nbits(packed, scales, bits, part.shape[0]).T.copy()
        )
    return out


def table_read(
    table: Any, bits: int, block: int, residual: bool, rows_per_chunk: int = 8192
) -> Any:
    """``table`` (vocab, hidden) torch, the token table tied to the output layer → the float32
    embeddings the bundle's Gather reads (export/weights.py's ``gather_from_quantized``): the
    output layer's ``bits`` blocks along hidden, with ``residual`` plus the 8-bit blocks of
    their rounding residual (``residual_blocks``, the export's own function); a chunk of rows
    at a time."""
    import torch
    from spotstop.export.nbits import dequantize_nbits, nbits_blocks
    from spotstop.export.weights import residual_blocks

    hidden = table.shape[1]
    out = torch.empty(table.shape, dtype=torch.float32)
    for a in range(0, table.shape[0], rows_per_chunk):
        rows = table[a : a + rows_per_chunk].float().numpy()  # (rows, hidden)
        packed, scales = nbits_blocks(rows.T, bits, block)
        read = dequantize_nbits(packed, scales, bits, hidden).T
        if residual:
            codes, r_scales = residual_blocks(rows, packed, scales, bits, block)
            read = read + dequantize_nbits(codes, r_scales, 8, hidden).T
        out[a : a + rows_per_chunk] = torch.from_numpy(np.ascontiguousarray(read))
    return out


def gptq_quantized(w: Any, h: Any, bits: int, block: int) -> Any:
    """``w`` (out, in) torch weight → the float32 weight MatMulNBits multiplies by when GPTQ
    (export/gptq.py) chose its codes, with ``h`` the Hessian (numpy) of the Linear's inputs."""
    import torch
    from spotstop.export.gptq import gptq_nbits
    from spotstop.export.nbits import dequantize_nbits

    part = w.float().T.contiguous().numpy()  # (K, N)
    packed, scales = gptq_nbits(part, h, bits, block)
    return torch.from_numpy(dequantize_nbits(packed, scales, bits, part.shape[0]).T.copy())


#: the rows (batch, position) the score reads in the pass being run (:func:`_read_mask`)
_READS: list[Any] = [None]


def _read_mask(prompts: list[list[int]], plan: Any) -> Any:
    """(sequences, length) True where the decoder graph reads: the last prompt position and the
    answer tokens' (``decoder_feeds``' ``last_index`` and ``read_index``), the sequences
    prompt-major and right-padded as the torch backend runs them."""
    from spotstop.guard.backends._graphs import decoder_feeds

    length = max(len(p) + len(r) for p in prompts for r in plan.rows)
    feeds = decoder_feeds(prompts, plan, length)
    mask = np.zeros(feeds["input_ids"].shape, dtype=bool)
    rows = np.arange(mask.shape[0])
    mask[rows, feeds["last_index"]] = True
    for c in range(feeds["read_index"].shape[1]):
        mask[rows, feeds["read_index"][:, c]] = True
    return mask


def _per_token(_mod: Any, inputs: tuple[Any, ...], exact_reads: bool = False) -> tuple[Any, ...]:
    """A Linear's input as the int8 precision's GEMM reads it: quantized per token and back
    (export/int8.py's ``dequantize_activations_per_token``); ``exact_reads`` (a decoder Linear):
    the rows the score reads (:data:`_READS`) with their residual's codes too
    (``dequantize_read_rows``)."""
    import torch
    from spotstop.export.int8_math import dequantize_activations_per_token, dequantize_read_rows

    x = inputs[0]
    rows = x.detach().float().reshape(-1, x.shape[-1]).numpy()
    deq = dequantize_activations_per_token(rows)
    mask = _READS[0]
    if exact_reads and mask is not None:
        if tuple(x.shape[:-1]) != mask.shape:
            raise RuntimeError(
                f"a decoder Linear's input {tuple(x.shape)} is not one row per token of the "
                f"{mask.shape} sequences scored; the read rows cannot be found."
            )
        at = mask.reshape(-1)
        deq[at] = dequantize_read_rows(rows[at])
    return (torch.from_numpy(deq).reshape(x.shape).to(x.dtype), *inputs[1:])


#: how a variant's weights were chosen, as RESULTS.md names it
_METHODS = {"rtn": "round to nearest", "bias": "RTN + bias correction", "gptq": "GPTQ"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Variants: BITS:BLOCK:GROUP[:nohead][:int8=SEL+SEL][:tablefloat|:tablecoarse] "
        "or 8:col:GROUP[:nohead][:int8reads] (the int8 precision); groups "
        + ", ".join(GROUPS)
        + ". The token table is read as the bundle reads it unless tablefloat or tablecoarse.",
    )
    ap.add_argument("member", help="member folder (Hugging Face layout)")
    ap.add_argument("--scenes", type=int, default=4, help="generated scenes (default 4)")
    ap.add_argument(
        "--world",
        type=Path,
        default=None,
        help="score the scenes of this `spotstop world` folder instead of --scenes generated "
        "ones (calibration, with --gptq or --bias-correct, stays on generated scenes)",
    )
    ap.add_argument(
        "--variants",
        default="8:128:all,4:128:all",
        help="comma-separated variants, see below (default 8:128:all,4:128:all)",
    )
    ap.add_argument(
        "--bias-correct", action="store_true", help="also score each variant bias-corrected"
    )
    ap.add_argument(
        "--gptq",
        action="store_true",
        help="also score each variant quantized by GPTQ (export/gptq.py; Hessians of each "
        "Linear's inputs on other scenes)",
    )
    ap.add_argument(
        "--gptq-only",
        action="store_true",
        help="with --gptq: score GPTQ only, not round to nearest as well (half the time)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="also write the table into this RESULTS.md, in the member's own section "
        "(one for runs with --bias-correct, one without)",
    )
    args = ap.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variants.split(",") if v.strip()]
    except ValueError as e:
        ap.error(str(e))

    import torch
    from spotstop.export.gptq import CALIBRATION_SEED
    from spotstop.export.int8_math import channel_int8
    from spotstop.export.mixed import int8_linears
    from spotstop.export.precision import INT8_NBITS_BLOCK, get_precision
    from spotstop.export.scenes import demo_scenes
    from spotstop.export.verify import spearman
    from spotstop.guard import load_member

    if args.threads:
        torch.set_num_threads(args.threads)
    m = load_member(args.member, backend="torch", dtype="float32")
    backend: Any = m.backend
    model = backend.model
    head = backend._head_weight
    if args.world is not None:
        from spotstop.export.world import case_scene, read_world

        world = read_world(args.world)
        scenes = [case_scene(c, world.options) for c in world.cases]
        where = f"{len(scenes)} scenes of the world {args.world.name} (seed {world.seed})"
    else:
        scenes = demo_scenes(args.scenes, seed=0)
        where = f"{args.scenes} generated scenes"

    plan = m.encoder.plan

    def score(sc: list[Any]) -> np.ndarray:  # a scene at a time: its read rows are known
        out = []
        for v in ("scene", "text"):
            for one in sc:
                _READS[0] = _read_mask([m.prompt_ids(one.request, v)], plan)
                out.append(m.score([one], v)[0].score)
        _READS[0] = None
        return np.asarray(out)

    linears = [
        (n, mod)
        for n, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and mod.weight is not head
    ]
    calib: Any = None
    if args.gptq:  # each Linear's inputs on other scenes, to disk (export/gptq.py, as the export)
        import atexit
        import shutil
        import tempfile

        from spotstop.export.gptq import CalibrationInputs, InputRecorder

        calib_dir = Path(tempfile.mkdtemp(prefix="spotstop-quant-error-"))
        atexit.register(shutil.rmtree, calib_dir, True)
        with InputRecorder(model, calib_dir) as rec:
            for sc in demo_scenes(args.scenes, seed=CALIBRATION_SEED):
                rec.new_pass()
                score([sc])
        calib = CalibrationInputs(calib_dir)
        print(
            f"GPTQ: inputs of {len(calib.index)} Linear weights recorded, "
            f"{sum(f.stat().st_size for f in calib_dir.glob('*.f32')) / 2**30:.1f} GiB on disk",
            flush=True,
        )
    means: dict[str, Any] = {}
    if args.bias_correct:  # each Linear's mean input on other scenes
        sums: dict[str, list[Any]] = {n: [0.0, 0] for n, _ in linears}

        def hook(name: str) -> Callable[..., None]:
            def pre(_mod: Any, inputs: tuple[Any, ...]) -> None:
                x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
                sums[name][0] = sums[name][0] + x.sum(0)
                sums[name][1] += x.shape[0]

            return pre

        handles = [mod.register_forward_pre_hook(hook(n)) for n, mod in linears]
        score(demo_scenes(args.scenes, seed=CALIBRATION_SEED))
        for h in handles:
            h.remove()
        means = {n: s / c for n, (s, c) in sums.items() if c}  # a Linear the score never runs: none

    t = time.perf_counter()
    ref = score(scenes)
    print(
        f"{Path(args.member).name}: {len(linears)} Linear weights; {len(ref)} scores "
        f"(scene and request-only passes of {where}), reference fp32 "
        f"{ref.min():.2f} .. {ref.max():.2f}, {time.perf_counter() - t:.0f} s",
        flush=True,
    )

    def keep(w: Any) -> Any:  # bfloat16 when that is exact (a bf16 checkpoint), else float32
        half = w.detach().to(torch.bfloat16)
        return half if torch.equal(half.float(), w.detach()) else w.detach().clone()

    original = {n: keep(mod.weight) for n, mod in linears}
    biases = {n: None if mod.bias is None else mod.bias.detach().clone() for n, mod in linears}
    head_float = head.detach().clone()
    embed = model.get_input_embeddings().weight
    tied = embed.data_ptr() == head.data_ptr()
    embed_float = head_float if tied else embed.detach().clone()
    modes = (
        ([] if args.gptq and args.gptq_only else ["rtn"])
        + (["bias"] if args.bias_correct else [])
        + (["gptq"] if args.gptq else [])
    )
    ref_sd = float(np.std(ref))
    print(f"reference scores: SD {ref_sd:.3f} over the {len(ref)} scores")
    print(
        f"{'variant':>22} {'method':>9} {'max|Δs|':>8} {'rms':>7} {'mean Δs':>8} "
        f"{'SD(Δs)':>7} {'/SD(s)':>6} {'rho':>6} {'s':>5}"
    )
    rows: list[QuantError] = []
    for variant in variants:
        bits, block, group, qhead, int8, exact, table = variant
        chosen = GROUPS[group]
        # export/mixed.py's rule, on the same names the export reads (the head is ``lm_head``)
        at8 = int8_linears([n for n, _ in linears] + ["lm_head"], int8)
        # the output layer and the token table: the same in every method (round to nearest)
        head_bits = 8 if "lm_head" in at8 or block == COLUMN else bits
        head_block = INT8_NBITS_BLOCK if block == COLUMN else block  # int8 keeps it weight-only
        backend._head_weight = quantized(head_float, head_bits, head_block) if qhead else head_float
        if table == "float" or not qhead:  # nohead: the table is float too ("once")
            embed.data.copy_(embed_float)
        elif tied:  # the output layer's blocks, and their residual's where the rule says
            residual = table != "coarse" and get_precision(variant.precision).table_residual
            embed.data.copy_(table_read(head_float, head_bits, head_block, residual))
        else:  # an untied table: the bundle's float16 copy (embeddings_to_fp16)
            embed.data.copy_(embed_float.half().float())
        for mode in modes:
            t = time.perf_counter()
            hooks = []
            for n, mod in linears:
                w = original[n].float()
                b_n = 8 if n in at8 else bits
                hess = calib.hessian(w.T.numpy()) if mode == "gptq" and chosen(n) else None
                if not chosen(n):
                    wq = w
                elif block == COLUMN:  # the int8 precision: its codes, its activations
                    codes, col = channel_int8(w.T.numpy(), hess)
                    wq = torch.from_numpy((codes.astype(np.float32) * col).T.copy())
                    reads = exact and GROUPS["decoder"](n)
                    hooks.append(
                        mod.register_forward_pre_hook(
                            functools.partial(_per_token, exact_reads=reads)
                        )
                    )
                elif hess is not None:
                    wq = gptq_quantized(w, hess, b_n, block)
                else:
                    wq = quantized(w, b_n, block)
                mod.weight.data.copy_(wq)
                b = biases[n]
                if mode == "bias" and chosen(n) and n in means:
                    b = (b if b is not None else torch.zeros(w.shape[0])) - (wq - w) @ means[n]
                mod.bias = None if b is None else torch.nn.Parameter(b, requires_grad=False)
            got = score(scenes)
            for handle in hooks:
                handle.remove()
            d = got - ref
            rho = spearman(got, ref)  # verify-bundle's rank check, on these scores
            form = "per column, per token" if block == COLUMN else f"b{block}"
            if block == COLUMN and not exact:
                form += ", read rows int8"
            name = (
                f"int{bits} {form} {group}{'' if qhead else ' nohead'}"
                + {"bundle": "", "float": ", table float", "coarse": ", table blocks alone"}[table]
                + (f" (int8: {', '.join(int8)}; {len(at8)} weights)" if int8 else "")
            )
            row = QuantError.of(name, mode, d, ref_sd, rho)
            rows.append(row)
            print(
                f"{name:>22} {mode:>9} {row.max_abs:8.3f} {row.rms:7.3f} {row.mean:+8.3f} "
                f"{row.scene_sd:7.3f} {row.ratio:6.2f} {rho:6.3f} "
                f"{time.perf_counter() - t:5.0f}",
                flush=True,
            )
    if args.results:
        member = Path(args.member).name
        head_line = (
            f"{member}: {len(linears)} Linear weights, {len(ref)} scores (scene and request-only "
            f"passes of {where}), torch fp32 reference "
            f"{ref.min():.2f} .. {ref.max():.2f} (SD {ref_sd:.3f})"
            + (
                f"; {' and '.join(_METHODS[m] for m in modes if m != 'rtn')} calibrate"
                f"{'s' if len(set(modes) - {'rtn'}) == 1 else ''} on {args.scenes} other "
                f"generated scenes (seed {CALIBRATION_SEED})"
                if set(modes) - {"rtn"}
                else ""
            )
        )
        key = (
            f"quant-error-{member}"
            + "".join(f"-{m}" for m in modes if m != "rtn").replace("-bias", "-bias-corrected")
            + ("-mixed" if any(v.int8 for v in variants) else "")
            + ("-int8" if any(v.block == COLUMN for v in variants) else "")  # the int8 precision's
        )
        write_section(args.results, key, render(member, head_line, rows, argv))
    return 0


@dataclass(frozen=True)
class QuantError:
    """One variant's score error against the fp32 reference (Δs = quantized − reference).

    max_abs, rms, mean: of Δs; scene_sd: SD of ``Δs − mean``, the part that differs between
    scenes; ref_sd: SD of the reference scores; spearman: verify-bundle's rank check.
    """

    variant: str
    method: str
    max_abs: float
    rms: float
    mean: float
    scene_sd: float
    ref_sd: float
    spearman: float

    @property
    def ratio(self) -> float:
        """``scene_sd / ref_sd`` (NaN when the reference scores do not vary at all)."""
        return self.scene_sd / self.ref_sd if self.ref_sd > 0 else float("nan")

    @classmethod
    def of(cls, variant: str, method: str, d: Any, ref_sd: float, rho: float) -> QuantError:
        d = np.asarray(d, dtype=float)
        return cls(
            variant,
            method,
            float(np.abs(d).max()),
            float(np.sqrt(np.mean(d**2))),
            float(d.mean()),
            float(np.std(d - d.mean())),
            float(ref_sd),
            float(rho),
        )


def render(
    member: str,
    head_line: str,
    rows: list[QuantError],
    argv: list[str] | None,
) -> str:
    """The RESULTS.md section of one run: the command, the reference, a row per variant."""
    cmd = " ".join(sys.argv[1:] if argv is None else argv)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### Where the quantized score error comes from: {member} (`bench/quant_error.py`)",
        "",
        f"Command `python bench/quant_error.py {cmd}`; {date}; {os.cpu_count()} cores. "
        "A torch simulation with the exact weights MatMulNBits multiplies by (per column, per "
        "token: the int8 precision's weights and its inputs quantized per token); "
        "mean Δs is the part of the error common to every scene, SD(Δs) the part that differs "
        "between scenes (SD of Δs − mean Δs), and /SD(s) its ratio to the spread of the "
        "reference scores; Spearman is verify-bundle's rank check (export/verify.py) on these "
        "scores.",
        "",
        head_line + ".",
        "",
        "| variant | method | max abs Δs | RMS Δs | mean Δs | SD(Δs) | SD(Δs) / SD(s) | Spearman |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.variant} | {_METHODS[r.method]} | {r.max_abs:.3f} | {r.rms:.3f} | "
            f"{r.mean:+.3f} | {r.scene_sd:.3f} | {r.ratio:.2f} | {r.spearman:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
