"""Export a member to ONNX scoring graphs, quantize them, and validate every output.

``export_member(source, out_dir, precision=...)`` writes an exported member folder::

    out_dir/
      config.json, preprocessor_config.json, tokenizer.json   (read by the runtime, no weights)
      spotstop_member.yaml, SPOTSTOP_TEST_PAIR.txt            (hints / test-pair marker, if any)
      spotstop_onnx.yaml                                       (what spotstop.guard.backends._onnx reads)
      onnx/vision.onnx (+ vision.onnx.data)
      onnx/decoder.onnx  or  onnx/decoder_L{bucket}.onnx ×buckets  (+ decoder.onnx.data, shared)

Every registered architecture now writes ONE ``decoder.onnx`` with a dynamic sequence axis,
validated at every bucket (Qwen3.5 since its compact Gated-DeltaNet graph,
export/gated_delta.py); per-bucket decoders (``fixed_length: true``, the old Qwen3.5 format)
are still written for a config that fixes the length, and the runtime reads both.

The steps follow optimum-onnx: the architecture's registered export config (export/configs.py)
picks the exporter per graph; after export, every output of every graph is compared with the
torch scoring graph on the same inputs (a gray image, generated images, the request-only pass)
and ALL failures are reported together in one :class:`ExportValidationError`; then the graphs are
converted to the requested precision and validated again with that precision's tolerances
(a failure then also says what the precision's measured rules chose: no manifest is written).

Where the pieces live: the scoring graphs as torch modules in export/graphs.py; the
``torch.onnx`` calls in export/exporters.py; the precisions in export/precision.py
(``fp32``; ``fp16``, export/fp16.py: float32 inputs/outputs kept, the normalisers,
RMSNorm/LayerNorm and the Gated-DeltaNet decay and delta rule kept float32 as the transformers
code computes them; ``int8`` / ``int4`` weight-only; ``int4-trt`` for TensorRT, export/quant.py).
A tied output layer (word embeddings = output layer) is stored ONCE (export/weights.py).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from spotstop.export.configs import ExportConfig, get_export_config
from spotstop.export.exporters import DECODER_INPUTS, DECODER_OUTPUTS, export_decoder, export_vision
from spotstop.export.gptq import (
    CALIBRATION_SCENES,
    CHECK_SCENES,
    QUANTIZERS,
    CalibrationInputs,
    InputRecorder,
    calibration_set,
    nbits_quantizer_meta,
)
from spotstop.export.int8 import default_smooth_alpha, host_weight_form, vision_activation_check
from spotstop.export.memory import (
    is_large,
    peak_rss_bytes,
    release_freed_memory,
    reset_peak_rss,
)
from spotstop.export.mixed import (
    DECODER_GROUPS,
    DEFAULT_INT4_INT8,
    decoder_weight_check,
    int8_weight_keys,
    parse_selectors,
    vision_weight_check,
)
from spotstop.export.nbits import nbits_weights
from spotstop.export.precision import (
    PRECISION_SPECS,
    ConvertOptions,
    convert_precision,
    get_precision,
)
from spotstop.export.quant import quantizer_meta
from spotstop.export.weights import DiskWeights, fold_weight_transposes, tie_output_layer
from spotstop.guard import Scene, ScoringConfig
from spotstop.guard._hf import (
    MEMBER_HINTS,
    TEST_PAIR_MARKER,
    MemberFolder,
    render_template,
    resolve_member,
)
from spotstop.guard._image import gray_image
from spotstop.guard._member import resolve_image_size
from spotstop.guard._prompt import PromptEncoder, RenderedTemplate, ScorePlan, prompt_hash
from spotstop.guard.backends._onnx import (
    GRAPHS_FILE,
    GRAPHS_FORMAT,
    GRAPHS_VERSION,
    combine_scores,
    decoder_feeds,
)
from spotstop.guard.validate import dump_yaml

__all__ = [
    "DEFAULT_BUCKETS",
    "ExportValidationError",
    "GraphCheck",
    "MemberExport",
    "export_member",
    "onnx_weight_bytes",
]

#: Right-padded length buckets (tokens). 512x512 images give 256 visual tokens, so a real
#: member's prompts fall in 384/512; longer requests use 1024.
DEFAULT_BUCKETS: tuple[int, ...] = (384, 512, 1024)

_VALIDATION_REQUESTS = (
    "pick up the knife",
    "pour the hot water into the cup near the child",
)
_COPY = ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json")


class ExportValidationError(ValueError):
    """Exported graphs differ from the torch reference beyond the config's tolerances.

    ``failures`` lists every failing (graph, output, input case), not only the first;
    ``measured`` what the precision's measured rules chose before the graphs were validated
    (:data:`MEASURED_RULES`: the records a member's ``spotstop_onnx.yaml`` would have held), so
    a failed export still says which choice the failure follows.
    """

    def __init__(
        self, member: str, failures: Sequence[str], measured: Mapping[str, Any] | None = None
    ) -> None:
        self.member = member
        self.failures = list(failures)
        self.measured = dict(measured or {})
        said = [f"{k}: {_rule_said(v)}" for k, v in self.measured.items()]
        super().__init__(
            f"export of {member} failed validation ({len(self.failures)} failure(s)):\n  "
            + "\n  ".join(self.failures)
            + ("\nthe measured rules chose (before validation):\n  " if said else "")
            + "\n  ".join(said)
        )

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a child process, re-raised here
        return (type(self), (self.member, self.failures, self.measured))


#: the records of the measured rules (export/int8.py's vision rule, export/mixed.py's int4
#: rules) in a conversion's report, as the member's ``spotstop_onnx.yaml`` holds them
MEASURED_RULES = ("vision_activations", "vision_weights", "decoder_weights")


def _rule_said(record: Mapping[str, Any]) -> str:
    """One measured rule's record in a line: its largest move(s), over how many scenes, its
    bound and what it chose."""
    chose = {k: record[k] for k in ("activations", "bits", "kept") if k in record}
    return (
        f"max |ds| {record.get('max_abs_diff')} over {record.get('scenes')} check scenes "
        f"(bound {record.get('bound')}): " + ", ".join(f"{k} {v}" for k, v in chose.items())
    )


@dataclass(frozen=True)
class GraphCheck:
    """One graph output compared with the torch scoring graph on one input case."""

    graph: str
    output: str
    case: str
    max_abs_diff: float
    atol: float
    rtol: float
    ok: bool


@dataclass(frozen=True)
class MemberExport:
    """What :func:`export_member` wrote and how it validated."""

    name: str
    path: Path
    model_type: str
    precision: str
    image_size: tuple[int, int]
    n_image_tokens: int
    buckets: tuple[int, ...]
    files: tuple[str, ...]
    first_ids: tuple[int, ...]
    unsafe_ids: tuple[int, ...]
    safe_ids: tuple[int, ...]
    #: weight bytes of the graphs one scoring pass loads: vision + one decoder
    weight_bytes: int
    template: RenderedTemplate = field(repr=False)
    prompt_hash: str = ""
    checks: tuple[GraphCheck, ...] = field(default=(), repr=False)
    seconds: float = 0.0
    #: exported streamed (a large member, export/memory.py): validated at ``precision`` only
    streamed: bool = False
    #: the process's peak resident memory during this export (Linux, where the peak can be
    #: reset so it is this export's own; None elsewhere)
    peak_rss_bytes: int | None = None
    #: int8/int4/int4-trt: which quantizer chose the weights (spotstop_onnx.yaml's entry)
    quantizer: Mapping[str, Any] | None = field(default=None, repr=False)
    #: "standard" or "fused" (export/fused.py)
    graph_form: str = "standard"

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.checks), default=float("nan"))


# -- helpers -------------------------------------------------------------------------------


def onnx_weight_bytes(model: Any) -> int:
    """Bytes of a model's initializers (weights, quantized blocks, scales)."""
    import onnx
    from onnx import helper

    total = 0
    packed4 = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}  # two values a byte
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        if t.data_type in packed4:
            total += (n + 1) // 2
            continue
        total += n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return total


def _save(models: dict[str, Any], out_dir: Path, data_name: str) -> None:
    """Save graphs with their large tensors in ONE external file, shared where identical.

    Fixed-length decoder graphs (one per bucket) hold the same weights; each tensor is written
    once and every graph points at the same offset.
    """
    import onnx
    from onnx import external_data_helper as edh

    out_dir.mkdir(parents=True, exist_ok=True)
    data_path = out_dir / data_name
    table: dict[tuple[str, str], tuple[int, int]] = {}
    with open(data_path, "wb") as data:
        for fname, model in models.items():
            for t in model.graph.initializer:
                if not t.HasField("raw_data") or len(t.raw_data) < 1024:
                    continue
                raw = t.raw_data
                key = (t.name, hashlib.sha1(raw).hexdigest())
                if key not in table:
                    offset = data.tell()
                    pad = (-offset) % 64  # aligned, as onnx's own writer does for mmap
                    data.write(b"\0" * pad)
                    table[key] = (offset + pad, len(raw))
                    data.write(raw)
                off, length = table[key]
                edh.set_external_data(t, location=data_name, offset=off, length=length)
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
            onnx.save_model(model, str(out_dir / fname))
    if data_path.stat().st_size == 0:
        data_path.unlink()


def _convert_streamed(
    src: Path,
    stage: Path,
    files: list[str],
    data_name: str,
    precision: str,
    options: ConvertOptions,
    graph_form: str = "standard",
) -> dict[str, Any]:
    """Convert one file set of the exported graphs in ``src`` (the vision graph, or the decoder
    graphs, which share ``data_name``) with its weights on disk: each graph is loaded as
    references only, its weights tied and folded and converted to ``precision`` one tensor at a
    time into ``stage``'s data file (export/weights.py ``DiskWeights``), rewritten for
    ``graph_form`` (:func:`_rewrite_form`) and written to ``stage``. Returns the converted
    graphs (their weights referenced in ``stage``), by file name."""
    import onnx

    models = {}
    with DiskWeights(src, stage / data_name) as io:
        for f in files:
            m = onnx.load(str(src / f), load_external_data=False)
            if f != "vision.onnx":
                tie_output_layer(m, io)
            fold_weight_transposes(m, io)
            models[f] = _rewrite_form(
                convert_precision(m, precision, copy=False, options=replace(options, io=io)),
                graph_form,
            )
        io.finish(list(models.values()))
    for f, m in models.items():
        onnx.save_model(m, str(stage / f))
    return models


def _to_numpy_inputs(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v) for k, v in feeds.items()}


def _rewrite_form(model: Any, graph_form: str) -> Any:
    """The graph form's rewrite of a graph its precision's conversion wrote, in place: in the
    fused form the decomposed GELUs as ``FastGelu`` / ``Gelu`` (export/gelu.py; a bias the
    conversion split from a Gemm folds in), in the standard form nothing (TensorRT parses no
    com.microsoft operator). Both conversion paths of the ``quantize`` stage call it."""
    if graph_form == "fused":
        from spotstop.export.gelu import fuse_gelu

        fuse_gelu(model)
    return model


# -- export ----------------------------------------------------------------------------------


@dataclass
class _Cases:
    """Validation inputs: vision pixels and decoder feeds, built as the runtime builds them."""

    pixels: dict[str, dict[str, np.ndarray]]
    prompts: dict[str, list[list[int]]]  # case → prompts; "text" has no image


def _validation_cases(folder: MemberFolder, encoder: PromptEncoder, g: Any) -> _Cases:
    arch = folder.arch
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (g.height + 7, g.width + 13, 3), dtype=np.uint8))
    pixels = {
        "gray": arch.preprocess(gray_image(g.width, g.height), g),
        "noise": arch.preprocess(noise, g),
    }
    img_text = arch.image_text(g)
    prompts = {
        "scene": [encoder.prompt_ids(r, img_text) for r in _VALIDATION_REQUESTS],
        "text": [encoder.prompt_ids(r, None) for r in _VALIDATION_REQUESTS],
    }
    return _Cases(pixels, prompts)


def _record_calibration(
    model: Any,
    vision_t: Any,
    decoder_t: Any,
    folder: MemberFolder,
    encoder: PromptEncoder,
    g: Any,
    n_img: int,
    hidden: int,
    out: Path,
    scenes: Sequence[Scene],
) -> CalibrationInputs:
    """Run the calibration ``scenes`` (export/gptq.py, ``calibration_set``) through the torch
    scoring graphs as the guard scores them (the scene with its image, then request-only), one
    prompt at a time so no padding is recorded, and record every Linear's inputs to ``out`` for
    GPTQ (and int8's smoothing and keep rule)."""
    import torch
    from spotstop.guard import DecodedImage, decode_image
    from tqdm.auto import tqdm

    plan = encoder.plan
    img_text = folder.arch.image_text(g)
    rows = len(plan.rows)
    with torch.inference_mode(), InputRecorder(model, out) as rec:
        for scene in tqdm(scenes, desc="calibration", unit="scene", leave=False):
            rec.new_pass()
            img = (
                scene.image if isinstance(scene.image, DecodedImage) else decode_image(scene.image)
            )
            px = folder.arch.preprocess(img.image, g)
            emb = vision_t(torch.from_numpy(px["pixel_values"])).numpy()
            for prompt, e in (
                (encoder.prompt_ids(scene.request, img_text), emb[0]),
                (encoder.prompt_ids(scene.request, None), np.zeros((n_img, hidden), np.float32)),
            ):
                rec.new_pass()
                feeds = decoder_feeds([prompt], plan, len(prompt) + plan.max_row_len)
                feeds["image_embeds"] = np.repeat(e[None], rows, axis=0)
                with rec.stride(rows):  # the batch repeats the prompt once per answer row
                    decoder_t(*(torch.from_numpy(feeds[n]) for n in DECODER_INPUTS))
    return CalibrationInputs(out)


def _compare(
    name: str,
    output: str,
    case: str,
    got: np.ndarray,
    want: np.ndarray,
    atol: float,
    rtol: float,
) -> GraphCheck:
    if got.shape != want.shape:
        return GraphCheck(name, output, case, float("inf"), atol, rtol, False)
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    ok = bool(np.all(np.isfinite(got))) and bool(np.allclose(got, want, atol=atol, rtol=rtol))
    return GraphCheck(name, output, case, diff, atol, rtol, ok)


def _session(model_or_path: Any) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])


def _check_length(job: _Job, prompt: Sequence[int]) -> int | None:
    """The length a check scores ``prompt`` at, as the runtime feeds it: a fixed-length
    decoder's smallest bucket that holds it (None: none does, the prompt is skipped), else its
    own."""
    need = len(prompt) + job.plan.max_row_len
    if not job.ecfg.decoder_fixed_length:
        return need
    fits = [b for b in job.usable if b >= need]
    return fits[0] if fits else None


def _torch_score(job: _Job, feeds: dict[str, np.ndarray]) -> float:
    """The torch float32 decoder's score of one prompt's ``feeds`` (the export's reference)."""
    import torch

    if job.decoder_t is None:
        raise RuntimeError(
            f"{job.mname}: a measured rule needs the torch model, and it was released before "
            "the rule ran (a bug: please report it)."
        )
    with torch.no_grad():
        f, lp = job.decoder_t(*(torch.from_numpy(feeds[n]) for n in DECODER_INPUTS))
    return float(combine_scores(f.numpy(), lp.numpy(), job.plan, job.plan.first_ids)[0])


def _scene_pixels(job: _Job, scene: Scene) -> tuple[np.ndarray, np.ndarray]:
    """A check scene's pixel values and the torch float32 vision tower's embeddings of them."""
    import torch
    from spotstop.guard import DecodedImage, decode_image

    if job.vision_t is None:
        raise RuntimeError(
            f"{job.mname}: a measured rule needs the torch model, and it was released before "
            "the rule ran (a bug: please report it)."
        )
    if scene.image is None:
        raise ValueError(f"{job.mname}: a scene without an image has no pixels to check.")
    img = scene.image if isinstance(scene.image, DecodedImage) else decode_image(scene.image)
    g, arch = job.g, job.folder.arch
    px = np.ascontiguousarray(arch.preprocess(img.image, g)["pixel_values"], np.float32)
    with torch.no_grad():
        return px, job.vision_t(torch.from_numpy(px)).numpy()


def _vision_moves(job: _Job, q_vision: Any, scenes: Sequence[Scene]) -> np.ndarray:
    """|Δs| of each of ``scenes`` (its scene pass, one prompt at
    a time) when the torch float32 decoder reads the image embeddings of the converted vision
    graph ``q_vision`` (a proto or a file path) instead of the torch float32 vision tower's.
    The torch model is the reference every graph is validated against and is held anyway: a
    float32 decoder session beside it held the decoder's weights twice (Qwen3.5-2B's int8
    export peaked at 20.66 GiB)."""
    plan = job.plan
    img_text = job.folder.arch.image_text(job.g)
    q = _session(q_vision)
    rows = len(plan.rows)
    moves = []
    for scene in scenes:
        if scene.image is None:  # no image: the vision graph plays no part
            continue
        prompt = job.encoder.prompt_ids(scene.request, img_text)
        length = _check_length(job, prompt)
        if length is None:
            continue
        px, ref = _scene_pixels(job, scene)
        (got,) = q.run(None, {"pixel_values": px})
        feeds = decoder_feeds([prompt], plan, length)
        score = []
        for emb in (ref, got):
            feeds["image_embeds"] = np.repeat(emb[:1], rows, axis=0)
            score.append(_torch_score(job, feeds))
        moves.append(score[1] - score[0])
    return np.asarray(moves, dtype=np.float64)


def _checked_vision(
    job: _Job, opts: ConvertOptions, convert: Callable[[ConvertOptions], Any]
) -> Any:
    """The vision graph at the job's precision: ``convert(options)`` converts it (a proto, or
    the path it was written to). A precision that checks its vision graph's int8 activations
    (export/int8.py's ``vision_activation_check``), calibrated: what they move the check
    scenes' scores (export/gptq.py's CHECK_SCENES, not only the 8 GPTQ fitted the weights on)
    is measured against the torch float32 model (:func:`_vision_moves`, so it
    runs before a streamed export releases the model) and, over the bound, the graph is
    converted again with float activations. Converted before the decoder graphs, so only the
    kept conversion is in ``opts.report``; the check is recorded there
    (``vision_activations``). A precision that checks its vision graph's weights (int4:
    export/mixed.py's ``vision_weight_check``), calibrated: the same measure on the check
    scenes and, over the bound, the graph is converted again with its weights at 8 bits;
    recorded as ``vision_weights``."""
    spec = get_precision(job.precision)
    atol = job.ecfg.score_atol[job.precision]
    rule: Callable[[np.ndarray], Any]
    if spec.checks_vision_weights and job.check_scenes and job.vision_keys:
        scenes, which, key = job.check_scenes, "check", "vision_weights"
        rule = functools.partial(vision_weight_check, score_atol=atol)
        keys = tuple(dict.fromkeys((*opts.int8_keys, *job.vision_keys)))
        remedy, over = replace(opts, int8_keys=keys), "eight_bit"
    elif spec.checks_vision_activations and job.check_scenes:
        scenes, which, key = job.check_scenes, "check", "vision_activations"
        rule = functools.partial(vision_activation_check, score_atol=atol)
        remedy, over = replace(opts, float_activations=True), "float_activations"
    else:
        return convert(opts)
    trial = replace(opts, report={})
    got = convert(trial)
    moves = _vision_moves(job, got, scenes)
    if not len(moves):
        raise ValueError(
            f"{job.mname}: no {which} scene's prompt fits the decoder's buckets "
            f"{job.usable}; export with a larger bucket (--buckets)."
        )
    check = rule(moves)
    if getattr(check, over):
        del got
        got = convert(remedy)
    else:
        opts.report.update(trial.report)
    opts.report[key] = check.as_meta()
    return got


def _decoder_check_passes(
    job: _Job, scenes: Sequence[Scene]
) -> list[tuple[str, dict[str, np.ndarray], float]]:
    """Each of ``scenes``' request-only and scene passes (one prompt at a time) as the decoder
    rule scores them: the decoder file that runs it, its feeds (the torch float32 vision
    tower's image embeddings) and the torch float32 decoder's score, computed once for every
    choice the rule tries."""
    plan = job.plan
    img_text, rows = job.folder.arch.image_text(job.g), len(plan.rows)
    first = job.dec_files[job.usable[0]]
    out = []
    for scene in scenes:
        passes: list[tuple[list[int], np.ndarray | None]] = [
            (job.encoder.prompt_ids(scene.request, None), None)
        ]
        if scene.image is not None:
            emb = _scene_pixels(job, scene)[1]
            prompt = job.encoder.prompt_ids(scene.request, img_text)
            passes.append((prompt, np.repeat(emb[:1], rows, axis=0)))
        for prompt, image_embeds in passes:
            length = _check_length(job, prompt)
            if length is None:
                continue
            fname = job.dec_files[length] if job.ecfg.decoder_fixed_length else first
            feeds = decoder_feeds([prompt], plan, length)
            if image_embeds is None:  # request only: no image tokens, the embeddings unread
                b = feeds["input_ids"].shape[0]
                image_embeds = np.zeros((b, job.n_img, job.hidden), np.float32)
            feeds["image_embeds"] = image_embeds
            out.append((fname, feeds, _torch_score(job, feeds)))
    return out


def _decoder_moves(
    job: _Job,
    q_decoders: Mapping[str, Any],
    passes: Sequence[tuple[str, dict[str, np.ndarray], float]],
) -> np.ndarray:
    """|Δs| of each of the ``passes`` (:func:`_decoder_check_passes`) when the converted
    decoder graphs ``q_decoders`` (by file name) score them instead of the torch float32
    decoder."""
    plan = job.plan
    sessions: dict[str, Any] = {}
    moves = []
    for fname, feeds, ref in passes:
        if fname not in sessions:
            sessions[fname] = _session(q_decoders[fname])
        f, lp = sessions[fname].run(None, _to_numpy_inputs(feeds))
        moves.append(float(combine_scores(f, lp, plan, plan.first_ids)[0]) - ref)
    return np.asarray(moves, dtype=np.float64)


def _checked_decoders(
    job: _Job,
    opts: ConvertOptions,
    convert: Callable[[Any, ConvertOptions], Any],
    fp32: Mapping[str, Any],
) -> dict[str, Any]:
    """The decoder graphs at the job's precision (``convert(graph, options)``). A precision
    that checks its decoder's weights (int4: export/mixed.py's ``decoder_weight_check``), with
    check scenes and groups to try (``job.decoder_keys``): the all-4-bit decoders are measured
    on the check scenes against the torch float32 model, and over the bound each group's
    conversion with its weights at 8 bits too; the rule's choice is kept and recorded
    (``decoder_weights``)."""
    names = [f for f in fp32 if f != "vision.onnx"]
    if not (job.check_scenes and job.decoder_keys):
        return {f: convert(fp32[f], opts) for f in names}

    passes = _decoder_check_passes(job, job.check_scenes)

    def trial(keys: tuple[str, ...]) -> tuple[dict[str, Any], ConvertOptions, np.ndarray]:
        o = replace(opts, int8_keys=tuple(dict.fromkeys((*opts.int8_keys, *keys))), report={})
        got = {f: convert(fp32[f], o) for f in names}
        return got, o, _decoder_moves(job, got, passes)

    tried = {"none": trial(())}
    if not len(tried["none"][2]):
        raise ValueError(
            f"{job.mname}: no check scene's prompt fits the decoder's buckets {job.usable}; "
            "export with a larger bucket (--buckets)."
        )
    tol = job.ecfg.score_atol[job.precision]
    check = decoder_weight_check({"none": tried["none"][2]}, tol, len(job.check_scenes))
    if check.kept == "none" and check.moves["none"] > check.bound:  # over: try each group
        for label, keys in job.decoder_keys.items():
            tried[label] = trial(keys)
        moves = {k: v[2] for k, v in tried.items()}
        check = decoder_weight_check(moves, tol, len(job.check_scenes))
    graphs, kept_opts, _ = tried[check.kept]
    opts.report.update(kept_opts.report)
    opts.report["decoder_weights"] = {
        **check.as_meta(),
        "chosen": len(job.decoder_keys.get(check.kept, ())),
    }
    job.decoder_kept = job.decoder_keys.get(check.kept, ())
    return graphs


@dataclass
class _Job:
    """One member's export as it moves through the stages of :func:`export_member`."""

    # -- resolved (stage ``resolve``)
    mname: str
    precision: str
    quantizer: str
    calibration_scenes: int
    #: the scenes the calibrated quantizer records inputs on, and the manifest's record of them
    calib_scenes: list[Scene]
    calib_record: dict[str, Any]
    #: the scenes a measured vision rule (int4's weights, int8's activations) and int4's decoder
    #: rule measure on (export/gptq.py's CHECK_SCENES; else none)
    check_scenes: list[Scene]
    int8_sel: tuple[str, ...]
    sessions: str
    smooth_alpha: float | None
    keep_error: float | None
    rotate_block: int | None
    symmetric: bool | None
    exact_reads: bool | None
    #: int8: the integer GEMM's weight form, resolved against this host (None: not int8)
    int8_weights: str | None
    cfg: ScoringConfig
    folder: MemberFolder
    ecfg: type[ExportConfig]
    g: Any
    template: RenderedTemplate
    encoder: PromptEncoder
    cases: _Cases
    usable: list[int]
    tmp: Path
    streamed: bool | None
    graph_form: str
    # -- traced (stage ``trace``)
    model: Any = None
    vision_t: Any = None
    decoder_t: Any = None
    large: bool = False
    hidden: int = 0
    pad_id: int = 0
    n_img: int = 0
    ref_emb: dict[str, np.ndarray] = field(default_factory=dict)
    graphs: dict[str, Any] = field(default_factory=dict)
    dec_files: dict[int, str] = field(default_factory=dict)
    pairs: list[tuple[int, str]] = field(default_factory=list)
    ref_dec: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # -- quantized and validated (stages ``quantize``, ``validate``)
    calib: CalibrationInputs | None = None
    int8_keys: dict[str, Any] = field(default_factory=dict)
    #: the vision graph's weight keys, for a vision-weight rule that keeps them at 8 bits
    vision_keys: tuple[str, ...] = ()
    #: each decoder group the decoder-weight rule may keep at 8 bits → its weight keys, and
    #: the keys of the group it kept
    decoder_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    decoder_kept: tuple[str, ...] = ()
    checks: list[GraphCheck] = field(default_factory=list)
    weight_bytes: int = 0
    qmeta: dict[str, Any] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    convert_report: dict[str, Any] = field(default_factory=dict)
    fused_ops: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def plan(self) -> ScorePlan:
        return self.encoder.plan

    def dec_cases(self, length: int) -> dict[str, dict[str, np.ndarray]]:
        """Every validation case that fits ``length``, as decoder feeds padded to it."""
        plan = self.plan
        out = {}
        for case, prompts in self.cases.prompts.items():
            if max(len(p) for p in prompts) + plan.max_row_len > length:
                continue
            feeds = decoder_feeds(prompts, plan, length)
            b = feeds["input_ids"].shape[0]
            if case == "text":
                emb = np.zeros((b, self.n_img, self.hidden), np.float32)
            else:  # one image per prompt: noise for the first, gray for the rest
                per = [self.ref_emb["noise"][0]] + [self.ref_emb["gray"][0]] * (len(prompts) - 1)
                emb = np.repeat(np.stack(per), len(plan.rows), axis=0)
            out[case] = {**feeds, "image_embeds": emb}
        return out


def _export_tmp() -> Path:
    """A new temporary folder for one member's export (its float32 graphs, calibration
    inputs and converted graphs: about 21 GB for Qwen3.5-2B), named for this process. An
    export killed outright (SIGKILL, or a SIGTERM to the child process a large member is
    exported in) never runs its clean-up, so the folders of export processes that are gone are
    removed first (export/_outdir.py's rule of whose process is gone)."""
    from spotstop.export._outdir import _gone

    for p in Path(tempfile.gettempdir()).glob("spotstop-export-*-*"):
        pid = p.name.split("-")[2]
        if p.is_dir() and not p.is_symlink() and _gone(pid):
            shutil.rmtree(p, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"spotstop-export-{os.getpid()}-"))


def _stage_resolve(
    source: str | os.PathLike[str],
    *,
    config: ScoringConfig | None,
    precision: str,
    image_size: tuple[int, int] | None,
    buckets: Sequence[int],
    name: str | None,
    sessions: str,
    visual_tokens: int | None,
    streamed: bool | None,
    quantizer: str,
    calibration_scenes: int,
    calibration_frames: str | os.PathLike[str] | None,
    int4_int8: Sequence[str] | None,
    smooth_alpha: float | str | None,
    keep_error: float | None,
    graph_form: str | None,
    rotate_block: int | None = None,
    symmetric: bool | None = None,
    exact_reads: bool | None = None,
    int8_weights: str | None = None,
) -> _Job:
    """Check the arguments and read the member folder: its grid, prompt, validation cases and
    the length buckets they fit. Nothing heavy is loaded."""
    if sessions not in ("resident", "on-demand"):
        raise ValueError(f"sessions must be 'resident' or 'on-demand'; got {sessions!r}.")
    spec = get_precision(precision)
    if quantizer not in QUANTIZERS:
        raise ValueError(f"quantizer must be one of {list(QUANTIZERS)}; got {quantizer!r}.")
    if calibration_scenes < 1:
        raise ValueError(f"calibration_scenes must be at least 1; got {calibration_scenes}.")
    if calibration_frames is not None and not (spec.calibrated and quantizer == "gptq"):
        raise ValueError(
            f"calibration frames are read by the 'gptq' quantizer of a calibrated precision "
            f"(int8, int4); this export is {precision} with quantizer {quantizer!r}: drop them."
        )
    # the calibration scenes now: a frames table's error comes before the model is loaded
    calib_scenes: list[Scene] = []
    calib_record: dict[str, Any] = {}
    check_scenes: list[Scene] = []
    if spec.calibrated and quantizer == "gptq":
        calib_scenes, calib_record = calibration_set(calibration_scenes, calibration_frames)
        # the measured vision rules (int4's with --int4-int8 auto, int8's activations)
        if (spec.checks_vision_weights and int4_int8 is None) or spec.checks_vision_activations:
            n_check = max(calibration_scenes, CHECK_SCENES)
            check_scenes = calibration_set(n_check, calibration_frames)[0]
    auto = smooth_alpha == "auto"
    if ((not auto and smooth_alpha is not None) or keep_error is not None) and precision != "int8":
        raise ValueError(
            f"smooth_alpha and keep_error are int8's options; the precision is {precision!r}."
        )
    if rotate_block is not None and precision != "int8":
        raise ValueError(f"rotate_block is int8's option; the precision is {precision!r}.")
    if symmetric is not None and precision != "int8":
        raise ValueError(f"symmetric is int8's option; the precision is {precision!r}.")
    if exact_reads is not None and precision != "int8":
        raise ValueError(f"exact_reads is int8's option; the precision is {precision!r}.")
    if int8_weights is not None and precision != "int8":
        raise ValueError(f"int8_weights is int8's option; the precision is {precision!r}.")
    # this host's int8 GEMM decides before anything heavy is loaded (export/int8.py)
    weight_form = host_weight_form(int8_weights) if precision == "int8" else None
    if rotate_block is not None and rotate_block < 0:
        raise ValueError(
            f"rotate_block must be 0 (no rotation) or a positive block size; got {rotate_block}."
        )
    if not auto and smooth_alpha is not None and quantizer != "gptq":
        raise ValueError(
            "smooth_alpha needs the calibration scenes' activations, which only the 'gptq' "
            "quantizer records; drop smooth_alpha or use quantizer='gptq'."
        )
    if auto:  # export/int8.py's measured default
        smooth_alpha = (
            default_smooth_alpha(calibrated=quantizer == "gptq") if precision == "int8" else None
        )
    elif smooth_alpha is not None and (
        not isinstance(smooth_alpha, (int, float)) or not 0.0 <= smooth_alpha <= 1.0
    ):
        raise ValueError(
            f"smooth_alpha must be a number in [0, 1], None or 'auto'; got {smooth_alpha!r}."
        )
    form = spec.graph_form if graph_form in (None, "auto") else str(graph_form)
    if form not in ("standard", "fused"):  # export/fused.py's GRAPH_FORMS (it imports torch)
        raise ValueError(f"graph_form must be 'auto', 'standard' or 'fused'; got {form!r}.")
    if form == "fused" and not spec.fusable:
        raise ValueError(
            f"{precision} starts from the standard graph (its float32 islands do not know "
            "onnxruntime's fused operators, and TensorRT parses neither); export it with "
            "graph_form='standard' (or 'auto')."
        )
    int8_sel = parse_selectors(DEFAULT_INT4_INT8 if int4_int8 is None else list(int4_int8))
    if spec.nbits != 4:  # only int4 keeps some weights at 8 bits
        int8_sel = ()
    bks = tuple(sorted({int(b) for b in buckets}))
    if not bks or bks[0] <= 0:
        raise ValueError(f"buckets must be positive token counts; got {list(buckets)}.")
    cfg_s = config or ScoringConfig()
    folder = resolve_member(source)
    mname = name or folder.path.name
    ecfg = get_export_config(folder.model_type)
    size = resolve_image_size(folder, cfg_s, mname, image_size, visual_tokens)
    g = folder.arch.geometry(folder.config, folder.preprocessor, size)
    template = render_template(folder, cfg_s.prompt)
    encoder = PromptEncoder(folder.tokenizer(), template, cfg_s.prompt)
    plan: ScorePlan = encoder.plan
    cases = _validation_cases(folder, encoder, g)
    shortest = min(max(len(p) for p in ps) for ps in cases.prompts.values()) + plan.max_row_len
    longest = max(len(p) for ps in cases.prompts.values() for p in ps) + plan.max_row_len
    # a bucket is kept when at least one validation case fits it (else it is never checked)
    usable = [b for b in bks if b >= shortest]
    if not usable or usable[-1] < longest:
        raise ValueError(
            f"{mname}: prompts with an image need {longest} tokens but the largest bucket is "
            f"{bks[-1]}; add a larger bucket (e.g. --buckets {bks[-1]},{2 * bks[-1]})."
        )
    return _Job(
        mname=mname,
        precision=precision,
        quantizer=quantizer,
        calibration_scenes=calibration_scenes,
        calib_scenes=calib_scenes,
        calib_record=calib_record,
        check_scenes=check_scenes,
        int8_sel=tuple(int8_sel),
        sessions=sessions,
        smooth_alpha=smooth_alpha,
        keep_error=keep_error,
        rotate_block=rotate_block,
        symmetric=symmetric,
        exact_reads=exact_reads,
        int8_weights=weight_form,
        cfg=cfg_s,
        folder=folder,
        ecfg=ecfg,
        g=g,
        template=template,
        encoder=encoder,
        cases=cases,
        usable=usable,
        tmp=_export_tmp(),
        streamed=streamed,
        graph_form=form,
    )


def _stage_trace(job: _Job) -> None:
    """Load the torch model, cut its scoring graphs (export/graphs.py), compute the torch
    reference outputs on every validation case, and export both graphs to ``job.tmp``
    (in memory as well unless the member is large)."""
    import onnx
    import torch
    from spotstop.export.graphs import build_graphs
    from transformers import AutoModelForImageTextToText

    folder, ecfg, g, plan = job.folder, job.ecfg, job.g, job.plan
    model: Any = AutoModelForImageTextToText.from_pretrained(str(folder.path), dtype=torch.float32)
    job.model = model = model.eval()
    job.large = large = is_large(model) if job.streamed is None else bool(job.streamed)
    if large and not get_precision(job.precision).streamable:
        streamable = [p for p, s in PRECISION_SPECS.items() if s.streamable]
        raise ValueError(
            f"{job.mname}: its float32 weights exceed 2 GiB, so it is exported streamed, which "
            f"writes {streamable}; {job.precision} rewrites the whole graph in memory. Export "
            "at one of those (int8/int4 for onnxruntime) or on a machine with about three times "
            "the member's float32 bytes of memory with streamed=False."
        )
    text_cfg = model.config.get_text_config()
    job.hidden = int(text_cfg.hidden_size)
    job.pad_id = int(text_cfg.pad_token_id if text_cfg.pad_token_id is not None else 0)
    job.vision_t, job.decoder_t = build_graphs(
        model,
        ecfg,
        image_token_id=folder.image_token_id,
        first_ids=plan.first_ids,
        gray_pixels=job.cases.pixels["gray"],
        geometry=g,
    )
    with torch.no_grad():
        job.ref_emb = {
            k: job.vision_t(torch.from_numpy(px["pixel_values"])).numpy()
            for k, px in job.cases.pixels.items()
        }
    job.n_img = job.ref_emb["gray"].shape[1]
    if job.n_img != g.n_image_tokens:
        raise ValueError(
            f"{job.mname}: the vision tower yields {job.n_img} visual tokens at "
            f"{g.height}x{g.width}; the prompt expands {g.n_image_tokens}. The member's configs "
            "disagree."
        )
    fold = not large
    export_vision(
        job.vision_t,
        ecfg,
        job.cases.pixels["gray"],
        job.tmp / "vision.onnx",
        fold,
        graph_form=job.graph_form,
    )
    if not large:
        job.graphs["vision.onnx"] = onnx.load(str(job.tmp / "vision.onnx"))
    usable = job.usable
    for length in usable if ecfg.decoder_fixed_length else [usable[0]]:
        cs = job.dec_cases(length)
        fname = f"decoder_L{length}.onnx" if ecfg.decoder_fixed_length else "decoder.onnx"
        case0 = cs.get("scene") or cs["text"]
        feeds0 = {k: v for k, v in case0.items() if k != "image_embeds"}
        export_decoder(
            job.decoder_t,
            ecfg,
            feeds0,
            case0["image_embeds"],
            job.tmp / fname,
            usable[-1],
            fold,
            graph_form=job.graph_form,
        )
        if not large:
            job.graphs[fname] = fold_weight_transposes(
                tie_output_layer(onnx.load(str(job.tmp / fname)))
            )
        job.dec_files[length] = fname
    # reference outputs at every usable bucket; a dynamic decoder also at the cases' own
    # lengths (onnxruntime feeds it a batch at its own length, unpadded)
    checked = list(usable)
    if not ecfg.decoder_fixed_length:
        own = {max(len(p) for p in ps) + plan.max_row_len for ps in job.cases.prompts.values()}
        checked = sorted(set(usable) | own)
    job.pairs = [(length, case) for length in checked for case in job.dec_cases(length)]
    if large and not ecfg.decoder_fixed_length:
        # each case once, at its own length, as the runtime feeds a dynamic decoder: at the
        # real size every decoder pass is minutes of CPU in torch and again in onnxruntime
        job.pairs = [
            (max(len(p) for p in ps) + plan.max_row_len, case)
            for case, ps in job.cases.prompts.items()
        ]
    for length, case in job.pairs:
        feeds = job.dec_cases(length)[case]
        with torch.no_grad():
            fl, lp = job.decoder_t(*(torch.from_numpy(feeds[n]) for n in DECODER_INPUTS))
        job.ref_dec[(length, case)] = (fl.numpy(), lp.numpy())


def _stage_validate(job: _Job, models: Mapping[str, Any], prec: str) -> list[GraphCheck]:
    """Every output of ``models`` (protos or file paths) against the torch references at
    ``prec``'s tolerances; raises :class:`ExportValidationError` listing every failure."""
    ecfg = job.ecfg
    atol, rtol = ecfg.atol[prec], ecfg.rtol[prec]
    checks: list[GraphCheck] = []
    try:
        vs = _session(models["vision.onnx"])
        sessions = {f: _session(models[f]) for f in job.dec_files.values()}
    except Exception as e:  # a converted graph onnxruntime refuses: say which and why
        load = f"load ({type(e).__name__}: {e})"
        checks = [GraphCheck("graphs", load, prec, float("inf"), atol, rtol, False)]
    else:
        for k, px in job.cases.pixels.items():
            (got,) = vs.run(None, {"pixel_values": px["pixel_values"]})
            checks.append(_compare("vision", "image_embeds", k, got, job.ref_emb[k], atol, rtol))
        plan, first = job.plan, job.dec_files[job.usable[0]]
        for length, case in job.pairs:
            fname = job.dec_files[length] if ecfg.decoder_fixed_length else first
            feeds = job.dec_cases(length)[case]
            got_f, got_l = sessions[fname].run(None, _to_numpy_inputs(feeds))
            want_f, want_l = job.ref_dec[(length, case)]
            where = f"{case}@L{length}"
            checks.append(_compare(fname, "first_logits", where, got_f, want_f, atol, rtol))
            checks.append(_compare(fname, "read_logprob", where, got_l, want_l, atol, rtol))
            s_got = combine_scores(got_f, got_l, plan, plan.first_ids)
            s_want = combine_scores(want_f, want_l, plan, plan.first_ids)
            sa = ecfg.score_atol[prec]
            checks.append(_compare(fname, "score", where, s_got, s_want, sa, 0.0))
    bad = [
        f"[{prec}] {c.graph} {c.output} ({c.case}): max|Δ| = {c.max_abs_diff:.3g} "
        f"> atol {c.atol:g} + rtol {c.rtol:g}·|ref|"
        for c in checks
        if not c.ok
    ]
    if bad:
        measured = {k: job.convert_report[k] for k in MEASURED_RULES if k in job.convert_report}
        raise ExportValidationError(job.mname, bad, measured)
    return checks


def _stage_quantize(job: _Job, out: Path) -> None:
    """Calibrate where the precision uses it, convert the graphs to the precision (a large
    member with its weights on disk, one graph set at a time) and rewrite them for the graph
    form (:func:`_rewrite_form`), validate them (an in-memory member at fp32 first, as
    exported), and move them into ``out/onnx``."""
    import onnx
    from spotstop.export.fused import graph_form_ops

    spec = get_precision(job.precision)
    if spec.calibrated and job.quantizer == "gptq":
        # every Linear's inputs on the calibration scenes, to disk, while torch is here
        job.calib = _record_calibration(
            job.model,
            job.vision_t,
            job.decoder_t,
            job.folder,
            job.encoder,
            job.g,
            job.n_img,
            job.hidden,
            job.tmp / "calibration",
            job.calib_scenes,
        )
    # export/mixed.py's rule on the torch names, found in the graphs by the weights' values
    job.int8_keys = int8_weight_keys(job.model, job.int8_sel) if job.int8_sel else {}
    if spec.checks_vision_weights and job.check_scenes and "vision" not in job.int8_sel:
        # what the vision rule (_checked_vision) keeps at 8 bits when it measures over its bound
        job.vision_keys = tuple(int8_weight_keys(job.model, ("vision",)))
    if spec.checks_vision_weights and job.check_scenes and not job.large:
        # the decoder rule's groups (_checked_decoders; an in-memory member: a streamed one
        # converts its decoder once), each with weights that are not kept already
        for group in DECODER_GROUPS:
            if set(group) <= set(job.int8_sel):
                continue
            keys = tuple(k for k in int8_weight_keys(job.model, group) if k not in job.int8_keys)
            if keys:
                job.decoder_keys["+".join(group)] = keys
    opts = ConvertOptions(
        calibration=job.calib,
        int8_keys=tuple(job.int8_keys),
        smooth_alpha=job.smooth_alpha,
        keep_error=job.keep_error,
        rotate_block=job.rotate_block,
        symmetric=job.symmetric is True,
        exact_reads=job.exact_reads is not False,
        int8_weights=job.int8_weights,
        report=job.convert_report,
    )
    dec_names = list(job.dec_files.values())
    first = job.dec_files[job.usable[0]]
    if job.large:
        stage = job.tmp / "stage"
        held: dict[str, Any] = {}

        def convert_vision(o: ConvertOptions) -> str:
            held.clear()
            held.update(
                _convert_streamed(
                    job.tmp,
                    stage,
                    ["vision.onnx"],
                    "vision.onnx.data",
                    job.precision,
                    o,
                    job.graph_form,
                )
            )
            return str(stage / "vision.onnx")

        # the vision graph first, while the torch model is here (its check scores with it)
        _checked_vision(job, opts, convert_vision)
        vision = held.pop("vision.onnx")
        job.weight_bytes, job.qmeta = onnx_weight_bytes(vision), quantizer_meta(vision)
        del vision
        # the references are computed: release the torch model before loading a graph
        job.model = job.vision_t = job.decoder_t = None
        release_freed_memory()
        models = _convert_streamed(
            job.tmp, stage, dec_names, "decoder.onnx.data", job.precision, opts, job.graph_form
        )
        job.weight_bytes += onnx_weight_bytes(models[dec_names[0]])
        del models
        gc.collect()
        paths = {f: str(stage / f) for f in ["vision.onnx", *dec_names]}
        heads = {f: onnx.load(paths[f], load_external_data=False) for f in ("vision.onnx", first)}
        job.held = nbits_weights(heads.values())
        job.fused_ops = {
            "vision": graph_form_ops(heads["vision.onnx"]),
            "decoder": graph_form_ops(heads[first]),
        }
        job.checks = _stage_validate(job, paths, job.precision)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.move(str(stage), str(out / "onnx"))
        return
    job.checks = _stage_validate(job, job.graphs, "fp32")
    graphs = job.graphs
    if job.precision != "fp32" or job.graph_form == "fused":

        def convert(m: Any, o: ConvertOptions) -> Any:
            return _rewrite_form(convert_precision(m, job.precision, options=o), job.graph_form)

        fp32 = graphs
        graphs = {  # the vision graph first (_checked_vision)
            "vision.onnx": _checked_vision(job, opts, lambda o: convert(fp32["vision.onnx"], o))
        }
        graphs.update(_checked_decoders(job, opts, convert, fp32))
        job.checks = _stage_validate(job, graphs, job.precision)
    if out.exists():
        shutil.rmtree(out)
    (out / "onnx").mkdir(parents=True)
    _save({"vision.onnx": graphs["vision.onnx"]}, out / "onnx", "vision.onnx.data")
    _save({f: graphs[f] for f in dec_names}, out / "onnx", "decoder.onnx.data")
    job.weight_bytes = onnx_weight_bytes(graphs["vision.onnx"]) + onnx_weight_bytes(graphs[first])
    job.qmeta = quantizer_meta(graphs["vision.onnx"])
    job.held = nbits_weights([graphs["vision.onnx"], graphs[first]])
    job.fused_ops = {
        "vision": graph_form_ops(graphs["vision.onnx"]),
        "decoder": graph_form_ops(graphs[first]),
    }


def _quantizer_record(job: _Job) -> dict[str, Any]:
    """The manifest's ``quantizer`` entry of a MatMulNBits / int8 (MatMulIntegerToFloat) member."""
    spec = get_precision(job.precision)
    q = nbits_quantizer_meta(job.precision, job.calib, job.calib_record)
    if spec.nbits == 4:
        if job.int8_keys and not job.held.get(8):
            raise RuntimeError(
                f"{job.mname}: {len(job.int8_keys)} weights were chosen to stay at int8 "
                f"({', '.join(job.int8_sel)}) and none was found in the graphs; the "
                "graph's weights are not the torch model's (a bug: please report it)."
            )
        q["int8"] = {
            "selectors": list(job.int8_sel),
            "rule": "export/mixed.py (onnxruntime-genai matmul_mixed_precision)",
            "chosen": len(job.int8_keys),
        }
        dw = job.convert_report.get("decoder_weights")
        if dw is not None:  # export/mixed.py's measured decoder rule
            q["int8"]["decoder_weights"] = dw
        elif spec.checks_vision_weights and job.check_scenes and job.large:
            q["int8"]["decoder_weights"] = {
                "kept": "none",
                "not measured": "a streamed export converts its decoder graphs once",
            }
        vw = job.convert_report.get("vision_weights")
        if vw is not None:  # export/mixed.py's measured vision rule
            q["int8"]["vision_weights"] = {
                **vw,
                "chosen": len(job.vision_keys) if vw["bits"] == 8 else 0,
            }
    if "int8" in job.convert_report:  # what computes in int8, what not
        acts = job.convert_report["int8"].get("activations", "per-tensor")
        w = (
            "int8 weights"
            if job.convert_report["int8"].get("weight_form", "s8") == "s8"
            else "int8 weight codes stored as uint8 (+128, weight zero point 128)"
        )
        q["format"] = (
            f"MatMulIntegerToFloat (com.microsoft): {w}, one scale per output column, uint8 "
            "activations per call (per token: its own midpoint and step)"
            if acts == "per-token"
            else f"DynamicQuantizeMatMul (com.microsoft): {w}, one scale per output column, "
            "uint8 activations per call (one scale per tensor)"
        ) + "; weight-only MatMulNBits 8-bit (accuracy_level 4) for the rest"
        q["dynamic_int8"] = dict(job.convert_report["int8"])
        if "vision_activations" in job.convert_report:  # export/int8.py's vision rule
            q["dynamic_int8"]["vision_activations"] = job.convert_report["vision_activations"]
    elif "float32_image_ends" in job.convert_report:  # int8's own record counts them
        q["float32_image_ends"] = job.convert_report["float32_image_ends"]
    q["weights_by_bits"] = {f"int{b}": n for b, n in sorted(job.held.items())}
    return {"quantizer": q}


def _stage_write(job: _Job, out: Path, t0: float, own_peak: bool) -> MemberExport:
    """The member folder's files beside its graphs, and its manifest (``spotstop_onnx.yaml``)."""
    folder, g, plan, ecfg = job.folder, job.g, job.plan, job.ecfg
    qmeta = job.qmeta
    if get_precision(job.precision).nbits is not None:
        qmeta = _quantizer_record(job)
    for f in _COPY:
        if (folder.path / f).is_file():
            shutil.copy2(folder.path / f, out / f)
    for f in (MEMBER_HINTS, TEST_PAIR_MARKER):
        if (folder.path / f).is_file():
            shutil.copy2(folder.path / f, out / f)
    meta = {
        "format": GRAPHS_FORMAT,
        "version": GRAPHS_VERSION,
        "model_type": folder.model_type,
        "source": folder.source,
        "precision": job.precision,
        "image_size": [g.height, g.width],
        "visual_tokens": g.n_image_tokens,
        "n_image_tokens": g.n_image_tokens,
        "hidden_size": job.hidden,
        "image_token_id": folder.image_token_id,
        "pad_id": job.pad_id,
        "first_ids": list(plan.first_ids),
        "answer_ids": {"unsafe": list(plan.unsafe_ids), "safe": list(plan.safe_ids)},
        "vision": "onnx/vision.onnx",
        "decoder": {
            "fixed_length": ecfg.decoder_fixed_length,
            "buckets": list(job.usable),
            "files": {int(k): f"onnx/{v}" for k, v in job.dec_files.items()},
        },
        "inputs": {"vision": ["pixel_values"], "decoder": DECODER_INPUTS},
        "outputs": {"vision": ["image_embeds"], "decoder": DECODER_OUTPUTS},
        # standard ONNX operators, or onnxruntime's fused contrib operators (export/fused.py)
        "graph_form": job.graph_form,
        "fused_ops": job.fused_ops,
        "weight_bytes": int(job.weight_bytes),
        **qmeta,  # int8/int4/int4-trt: which quantizer made the graphs
        # resident: sessions stay loaded; on-demand: loaded to score, released after (members
        # then run one after the other when both do not fit in memory at once)
        "sessions": job.sessions,
        "exporter": ecfg.describe(),
        "max_abs_diff": {
            c.graph + ":" + c.output: float(c.max_abs_diff)
            for c in job.checks
            if c.output != "score"
        },
    }
    (out / GRAPHS_FILE).write_text(dump_yaml(meta), encoding="utf-8")
    files = tuple(sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()))
    return MemberExport(
        name=job.mname,
        path=out,
        model_type=folder.model_type,
        precision=job.precision,
        image_size=(g.height, g.width),
        n_image_tokens=g.n_image_tokens,
        buckets=tuple(job.usable),
        files=files,
        first_ids=tuple(plan.first_ids),
        unsafe_ids=tuple(plan.unsafe_ids),
        safe_ids=tuple(plan.safe_ids),
        weight_bytes=int(job.weight_bytes),
        template=job.template,
        prompt_hash=prompt_hash(job.cfg.prompt, job.template, folder.model_type),
        checks=tuple(job.checks),
        seconds=time.perf_counter() - t0,
        streamed=job.large,
        peak_rss_bytes=peak_rss_bytes() if own_peak else None,
        quantizer=qmeta.get("quantizer"),
        graph_form=job.graph_form,
    )


def export_member(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    config: ScoringConfig | None = None,
    precision: str = "fp32",
    image_size: tuple[int, int] | None = None,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    name: str | None = None,
    sessions: str = "resident",
    visual_tokens: int | None = None,
    streamed: bool | None = None,
    quantizer: str = "gptq",
    calibration_scenes: int = CALIBRATION_SCENES,
    calibration_frames: str | os.PathLike[str] | None = None,
    int4_int8: Sequence[str] | None = None,
    smooth_alpha: float | str | None = "auto",
    keep_error: float | None = None,
    graph_form: str | None = None,
    rotate_block: int | None = None,
    symmetric: bool | None = None,
    exact_reads: bool | None = None,
    int8_weights: str | None = None,
) -> MemberExport:
    """Export one member (a Hugging Face folder or hub id) to ``out_dir``; see the module doc.

    The stages, each a function of this module: ``resolve`` (arguments, member folder, grid,
    prompt, validation cases, buckets) → ``trace`` (torch model, scoring graphs, torch
    references, ONNX export) → ``quantize`` (calibration, the precision's conversion from
    export/precision.py's registry, the fused form's GELUs, ``validate`` against the
    references) → ``write`` (files and manifest).

    ``precision``: a name in export/precision.py's registry. ``quantizer`` (calibrated
    precisions): ``"gptq"`` (default) chooses each weight's codes by GPTQ on the inputs of
    ``calibration_scenes`` generated scenes scored by the torch model (export/gptq.py);
    ``"rtn"`` rounds each weight to nearest as onnxruntime's quantizer does. Both write the same
    operator and bytes per weight; the manifest records which.

    ``int4_int8`` (int4): which weights stay at 8 bits, by export/mixed.py's selectors
    (``Q4_K_M``: the output layer and llama.cpp's mixed layers; ``()``: every weight at 4 bits);
    None (default): chosen by measurement on the check scenes (export/mixed.py's
    ``vision_weight_check`` and, for an in-memory member, ``decoder_weight_check``); the
    manifest records the selectors, the measured moves and choices, and how many weights each
    precision holds.
    ``graph_form``: ``"standard"`` (standard ONNX operators: what TensorRT parses) or
    ``"fused"`` (onnxruntime's LinearAttention, GroupQueryAttention, MultiHeadAttention,
    fused norms and GELUs: export/fused.py, export/gelu.py); None or ``"auto"``: the precision's default (fused for
    int8/int8-nbits/int4, standard for fp32, which TensorRT also builds from; fp16 and int4-trt
    are standard only). The manifest records the form and the fused operators each graph holds.
    ``smooth_alpha`` / ``keep_error`` (int8): SmoothQuant's α (``"auto"``: export/int8.py's
    ``default_smooth_alpha``, none for per-token activations; None: no smoothing) and the
    measured error above which a layer stays weight-only (None: export/int8.py's default);
    ``rotate_block`` (int8): the largest block a layer over that bound is measured again with its
    input rotated in (None: export/int8.py's ``ROTATE_BLOCK``; 0: no rotation); ``symmetric``
    (int8): True lets a measured layer take the symmetric form by export/int8.py's
    ``SYMMETRIC_SLACK`` rule (None/False: the midpoint form on every layer, the default);
    ``exact_reads`` (int8): False quantizes the decoder's read rows like every other row
    (None/True: export/int8.py's ``EXACT_READS``, their residual multiplied too);
    ``int8_weights`` (int8): the integer GEMM's weights as int8 (``s8``: onnxruntime's u8·s8
    kernel) or as the same codes offset to uint8 (``u8``: its u8·u8 kernel, exact on every
    CPU); None: the first this host's onnxruntime multiplies exactly; a form this host would
    not is refused, since the export validates here (export/int8.py's ``host_weight_form``).

    ``visual_tokens``: the member's visual-token budget (its vision graph's square grid);
    None: ``image_size``, the configured or hinted grid, else the architecture's default budget.

    ``streamed`` (None: when the member's float32 weights exceed 2 GiB, export/memory.py):
    memory holds the weights about once, not two or three times, so the real pair exports on
    a 24 GB workstation. The weights stream from the torch model to external data files (the
    legacy exporter without constant folding; the weight transposes are folded in the ONNX
    graph after); the torch reference outputs are computed first and the torch model is
    released before the graphs are loaded; each graph is converted to ``precision`` in place
    and written before the next is loaded; onnxruntime validates the graphs from disk. A
    streamed export at a precision other than fp32 is validated at that precision only
    (validating the fp32 graphs as well would hold both); a streamed dynamic-length decoder is
    validated on each case at its own length, as the runtime feeds it (not again padded to
    every bucket: at the real size each decoder pass takes minutes of CPU).

    Raises :class:`ExportValidationError` listing every output beyond tolerance (fp32 graphs
    first, then the graphs at ``precision``); nothing is left in ``out_dir`` then.
    """
    t0 = time.perf_counter()
    own_peak = reset_peak_rss()  # False: the peak would be the process's, not this member's
    job = _stage_resolve(
        source,
        config=config,
        precision=precision,
        image_size=image_size,
        buckets=buckets,
        name=name,
        sessions=sessions,
        visual_tokens=visual_tokens,
        streamed=streamed,
        quantizer=quantizer,
        calibration_scenes=calibration_scenes,
        calibration_frames=calibration_frames,
        int4_int8=int4_int8,
        smooth_alpha=smooth_alpha,
        keep_error=keep_error,
        graph_form=graph_form,
        rotate_block=rotate_block,
        symmetric=symmetric,
        exact_reads=exact_reads,
        int8_weights=int8_weights,
    )
    out = Path(out_dir)
    try:
        _stage_trace(job)
        _stage_quantize(job, out)
    finally:
        shutil.rmtree(job.tmp, ignore_errors=True)
    return _stage_write(job, out, t0, own_peak)
