"""``spotstop export``: members → ONNX scoring graphs → a verified, self-describing bundle.

The bundle holds, per member, the ONNX graphs at one precision, ``tokenizer.json``,
``config.json`` / ``preprocessor_config.json`` (geometry only, no Hugging Face weights), the
rendered chat templates and answer token ids (in ``manifest.yaml``) and the sha256 of every
file. ``spotstop.guard.Guard`` serves it with the ``onnx`` backend: no torch, no transformers.

``policy.yaml`` is NOT written: it is fitted for this bundle's id and prompt hash (printed
here) on an unlabelled pool (``calibrate.fit_frozen``) and dropped into the bundle folder.

TensorRT: with ``tensorrt`` importable and a CUDA GPU present, engines are built into
``trt/`` with the TensorRT Python API; otherwise ``trt/build.sh`` holds the exact
``trtexec`` commands to run on the device (``jetson/build_engines.sh`` runs it). With
``triton=True`` a Triton Inference Server model repository is laid out under ``triton/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spotstop.export._outdir import check_out_folder, replaced_whole
from spotstop.export.bundle import _write_manifest
from spotstop.export.gptq import CALIBRATION_SCENES, QUANTIZERS
from spotstop.export.memory import LARGE_BYTES, folder_fp32_bytes
from spotstop.export.mixed import parse_selectors
from spotstop.export.onnx import DEFAULT_BUCKETS, MemberExport, export_member
from spotstop.export.triton import write_triton_repository
from spotstop.export.trt import build_engines, write_trt_script
from spotstop.guard import ScoringConfig
from spotstop.guard._bundle import is_device_built, pair_prompt_hash, sha256_file
from spotstop.guard._config import DEFAULT_BATCH_SIZE
from spotstop.guard._hf import resolve_member
from spotstop.guard._member import check_budget_keys, member_visual_tokens

__all__ = ["OnnxBundle", "write_onnx_bundle"]

#: Files in a bundle folder that are not part of the exported artifact.
_NOT_LISTED = ("manifest.yaml", "policy.yaml", "decisions.sqlite")


@dataclass(frozen=True)
class OnnxBundle:
    """An exported bundle: where, its id and prompt hash, and what each member weighs."""

    path: Path
    bundle_id: str
    prompt_hash: str
    precision: str
    members: tuple[MemberExport, ...]
    trt: str  # "engines" (built here) or "script" (trt/build.sh for the device)

    @property
    def weight_bytes(self) -> int:
        return sum(m.weight_bytes for m in self.members)


def _source(src: str | os.PathLike[str]) -> str:
    """What verify-bundle loads as the torch reference: an absolute folder, or the hub id."""
    p = Path(src).expanduser()
    return str(p.resolve()) if p.exists() else str(src)


def die_with_parent() -> None:
    """In a child process: end it (SIGTERM) when the process that started it ends, so a
    killed ``spotstop export`` leaves no orphaned member export holding its memory and cores
    (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing is done)."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:  # the parent ended before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _export_quietly(src: str, out: Path, kw: dict[str, Any]) -> MemberExport:
    """:func:`export_member` in a child process; what the exporters print goes to stderr."""
    import contextlib
    import sys

    die_with_parent()
    with contextlib.redirect_stdout(sys.stderr):
        return export_member(src, out, **kw)


def _export_in_child(src: str | os.PathLike[str], out: Path, kw: dict[str, Any]) -> MemberExport:
    """Export a large member in a fresh process (spawned: no copy of this one), so all of its
    memory is returned when it ends: a 24 GB workstation holds one real member's export, not
    one and what the previous export left behind (the python heap, the tracer's caches)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_export_quietly, str(src), out, kw).result()


#: what a guard keeps beside its bundle (its decision log, the log's archives and dead
#: letter): an export never replaces a folder that holds them
_GUARD_FILES = ("decisions.sqlite*", "*.archive", "*.dead-letter.jsonl")


def _listed_files(root: Path) -> dict[str, str]:
    """The files the manifest lists, with their sha256: every file of the bundle but the
    guard's own (:data:`_NOT_LISTED`) and what the device builds."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.name.startswith(_NOT_LISTED)
        and not is_device_built(p.relative_to(root).as_posix())
    }


def check_bundle_out(out: str | os.PathLike[str], sources: Sequence[Path] = ()) -> None:
    """Refuse an output folder the export must not replace (ValueError saying what to do):
    one that overlaps a source folder (a member's, or the bundle derived from), a file, a
    folder that is not a bundle, or a bundle holding a guard's decision log. Nothing is
    changed; the export checks this before it writes anything."""
    root = Path(out)
    here = root.resolve()
    for src in sources:
        there = Path(src).resolve()
        if here == there or there in here.parents or here in there.parents:
            raise ValueError(
                f"the output folder {str(root)!r} overlaps the source folder {str(there)!r}; "
                "the export replaces its output whole: choose a folder apart from the sources."
            )
    check_out_folder(root, "the bundle's output")
    if not root.exists():
        return
    if any(root.iterdir()) and not (root / "manifest.yaml").is_file():
        raise ValueError(
            f"the output folder {str(root)!r} is not empty and not a spotstop bundle; the export "
            "replaces its output whole: choose a new or empty folder."
        )
    held = sorted({q.name for pattern in _GUARD_FILES for q in root.glob(pattern)})
    if held:
        raise ValueError(
            f"the output folder {str(root)!r} holds a guard's decision log ({', '.join(held)}); "
            "the export would replace it. Move the log out of the bundle folder (or export "
            "to another folder and point the guard at the new bundle)."
        )


def write_onnx_bundle(
    members: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    config: ScoringConfig | None = None,
    precision: str = "fp32",
    image_size: tuple[int, int] | None = None,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    name: str = "bundle",
    trt: str = "auto",
    triton: bool = False,
    max_batch: int = DEFAULT_BATCH_SIZE,
    sessions: str = "resident",
    progress: Callable[[str], Any] | None = None,
    visual_tokens: Mapping[str, int] | None = None,
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
) -> OnnxBundle:
    """Export ``members`` into the bundle folder ``out`` (replaced, once the new bundle is
    whole, if it is a bundle; :func:`check_bundle_out` says which folders are refused).

    ``visual_tokens``: each member's visual-token budget, keyed by member name, model_type or
    its start (``{"qwen": 256, "lfm": 64}``; ``"*"``: every member); a member without one
    keeps ``image_size`` / its configured grid, else its architecture's default budget
    (Qwen3.5 256, LFM2-VL 64 without tiling). The manifest records each member's
    ``visual_tokens``, and the bundle id changes with it.

    ``quantizer`` / ``calibration_scenes`` (int8/int4): how each member's weights are quantized,
    see :func:`~spotstop.export.onnx.export_member` (GPTQ on generated calibration scenes by
    default, or ``"rtn"``); ``calibration_frames``: a scene table of the deployment's own frames
    to calibrate on instead (:func:`~spotstop.export.gptq.calibration_set`). ``int4_int8``
    (int4): the weights kept at 8 bits, by export/mixed.py's selectors (None: chosen by its
    measured rules; ``()``: none); each member entry of the manifest records the selectors
    (``int4_int8``), its ``spotstop_onnx.yaml`` the rules' moves and choices. ``smooth_alpha`` / ``keep_error`` (int8):
    SmoothQuant's α (``"auto"``: on with the calibration scenes; None: off) and the error bound
    of export/int8.py's keep rule; ``rotate_block`` (int8): the largest block a layer over it is
    rotated in (None: the default; 0: none); ``symmetric`` (int8): True lets a measured
    layer take the symmetric form (None/False: the midpoint form on every layer);
    ``exact_reads`` (int8): False rounds the decoder's read rows like every other row (None:
    export/int8.py's ``EXACT_READS``); ``int8_weights`` (int8): the integer GEMM's
    weights as int8 (``s8``) or offset uint8 (``u8``), the same codes (None: the first this
    host multiplies exactly, export/int8.py's ``host_weight_form``). ``graph_form``:
    ``"standard"``, ``"fused"`` or None/``"auto"`` (the precision's default), see
    :func:`~spotstop.export.onnx.export_member`; a fused graph holds onnxruntime's contrib
    operators, which TensorRT cannot parse, so a fused fp32 bundle needs ``trt="off"``.

    ``sessions="on-demand"`` makes each member load its graphs when it scores and release them
    after, so the members run one after the other in one process when both do not fit.
    ``trt``: ``"auto"`` builds engines when tensorrt and a GPU are present, else writes
    ``trt/build.sh``; ``"script"`` always writes the script; ``"off"`` neither.
    """
    if trt not in ("auto", "script", "off"):
        raise ValueError(f"trt must be 'auto', 'script' or 'off'; got {trt!r}.")
    from spotstop.export.precision import get_precision
    from spotstop.guard.backends._trt_record import TRT_PRECISIONS

    if graph_form == "fused" and trt != "off" and precision in TRT_PRECISIONS:
        raise ValueError(
            f"a fused {precision} graph holds onnxruntime's contrib operators (LinearAttention, "
            "GroupQueryAttention, ...), which TensorRT cannot parse: pass trt='off' (--trt off) "
            "for an onnxruntime-only bundle, or graph_form='standard' for TensorRT."
        )
    get_precision(precision)  # an unknown precision is refused before anything is written
    if quantizer not in QUANTIZERS:  # before any member is exported
        raise ValueError(f"quantizer must be one of {list(QUANTIZERS)}; got {quantizer!r}.")
    if calibration_scenes < 1:
        raise ValueError(f"calibration_scenes must be at least 1; got {calibration_scenes}.")
    # None: export/mixed.py's measured rules choose (export_member); else exactly these
    int8_sel = None if int4_int8 is None else parse_selectors(list(int4_int8))
    if calibration_frames is not None:  # a bad table is refused before anything is replaced
        from spotstop.guard._scene_table import read_scene_table

        read_scene_table(calibration_frames)  # GuardError naming the file or row
    # the export extra before any member is looked at: without it the CLI's install hint, not
    # a member error (a member's size is read before its export imports torch)
    import onnx  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    cfg = config or ScoringConfig()
    say = progress or (lambda _msg: None)
    # budgets name members by model type too: resolve them first
    budgeted = bool(visual_tokens or cfg.visual_tokens)
    types = {str(src): resolve_member(src).model_type for src in members} if budgeted else {}
    named = [(Path(s).name, t) for s, t in types.items()]
    check_budget_keys(visual_tokens, named)
    check_budget_keys(cfg.visual_tokens, named)
    final = Path(out)
    check_bundle_out(final, [resolve_member(src).path for src in members])
    with replaced_whole(final) as root:
        b = _write_members(
            members, root, final, cfg, types, say,
            precision=precision, image_size=image_size, buckets=buckets, name=name, trt=trt,
            triton=triton, max_batch=max_batch, sessions=sessions, visual_tokens=visual_tokens,
            quantizer=quantizer, calibration_scenes=calibration_scenes,
            calibration_frames=calibration_frames, int8_sel=int8_sel,
            smooth_alpha=smooth_alpha, keep_error=keep_error, graph_form=graph_form,
            rotate_block=rotate_block, symmetric=symmetric, exact_reads=exact_reads,
            int8_weights=int8_weights,
        )  # fmt: skip
    return b


def _write_members(
    members: Sequence[str | os.PathLike[str]],
    root: Path,
    final: Path,
    cfg: ScoringConfig,
    types: Mapping[str, str],
    say: Callable[[str], Any],
    *,
    precision: str,
    image_size: tuple[int, int] | None,
    buckets: Sequence[int],
    name: str,
    trt: str,
    triton: bool,
    max_batch: int,
    sessions: str,
    visual_tokens: Mapping[str, int] | None,
    quantizer: str,
    calibration_scenes: int,
    calibration_frames: str | os.PathLike[str] | None,
    int8_sel: Any,
    smooth_alpha: float | str | None,
    keep_error: float | None,
    graph_form: str | None,
    rotate_block: int | None = None,
    symmetric: bool | None = None,
    exact_reads: bool | None = None,
    int8_weights: str | None = None,
) -> OnnxBundle:
    """:func:`write_onnx_bundle`'s work, in the staging folder ``root`` (the bundle it
    returns names ``final``, where it is moved once whole)."""
    exports: list[MemberExport] = []
    for src in members:
        mname = Path(str(src)).name
        if any(e.name == mname for e in exports):
            raise ValueError(f"two members are named {mname!r}; member folder names must differ.")
        kw = {
            "config": cfg,
            "precision": precision,
            "image_size": image_size,
            "buckets": buckets,
            "name": mname,
            "sessions": sessions,
            "visual_tokens": member_visual_tokens(visual_tokens, mname, types.get(str(src), "")),
            "quantizer": quantizer,
            "calibration_scenes": calibration_scenes,
            "calibration_frames": None if calibration_frames is None else str(calibration_frames),
            "int4_int8": int8_sel,
            "smooth_alpha": smooth_alpha,
            "keep_error": keep_error,
            "graph_form": graph_form,
            "rotate_block": rotate_block,
            "symmetric": symmetric,
            "exact_reads": exact_reads,
            "int8_weights": int8_weights,
        }
        large = folder_fp32_bytes(resolve_member(src).path) > LARGE_BYTES
        say(f"exporting {mname} ({precision}{', in its own process' if large else ''}) …")
        if large:  # what one large export leaves in a process must not crowd the next one
            e = _export_in_child(src, root / "members" / mname, kw)
        else:
            e = export_member(src, root / "members" / mname, **kw)
        say(
            f"  {mname}: {len(e.files)} files, {e.weight_bytes / 2**20:.1f} MiB of weights, "
            f"max |Δ| vs torch {e.max_abs_diff:.2g}, {e.seconds:.0f} s"
        )
        exports.append(e)
    trt_mode = "off"
    if trt != "off":
        write_trt_script(root, exports, max_batch=max_batch)
        trt_mode = "script"
        if trt == "auto" and build_engines(root, exports, max_batch=max_batch, progress=say):
            trt_mode = "engines"
    if triton:
        write_triton_repository(root, exports, max_batch=max_batch)
    entries = []
    hashes = {}
    test_pair = False
    for e in exports:
        hints = e.path / "SPOTSTOP_TEST_PAIR.txt"
        tp = hints.is_file()
        test_pair = test_pair or tp
        kind = resolve_member(members[exports.index(e)]).test_pair_kind if tp else None
        hashes[e.name] = e.prompt_hash
        entries.append(
            {
                "name": e.name,
                "path": f"members/{e.name}",
                "source": _source(members[exports.index(e)]),
                "revision": None,
                "model_type": e.model_type,
                "backend": "onnx",
                "precision": e.precision,
                "image_size": [e.image_size[0], e.image_size[1]],
                "visual_tokens": e.n_image_tokens,
                "n_image_tokens": e.n_image_tokens,
                "prompt_hash": e.prompt_hash,
                "template": {
                    "with_image": e.template.with_image,
                    "without_image": e.template.without_image,
                },
                "answer_ids": {"unsafe": list(e.unsafe_ids), "safe": list(e.safe_ids)},
                "first_ids": list(e.first_ids),
                "buckets": list(e.buckets),
                "weight_bytes": e.weight_bytes,
                "quantizer": (e.quantizer or {}).get("method"),
                "graph_form": e.graph_form,
                **(
                    {"int4_int8": list((e.quantizer or {}).get("int8", {}).get("selectors", []))}
                    if e.precision == "int4"
                    else {}
                ),
                "test_pair": tp,
                **({"test_pair_kind": kind} if kind else {}),
            }
        )
    files = _listed_files(root)
    bundle_id = _write_manifest(
        root,
        entries,
        hashes,
        files,
        cfg,
        name=name,
        test_pair=test_pair,
        extra={
            "export": {
                "precision": precision,
                "trt": trt_mode,
                "triton": bool(triton),
                "weight_bytes": sum(e.weight_bytes for e in exports),
            }
        },
    )
    return OnnxBundle(
        path=final,
        bundle_id=bundle_id,
        prompt_hash=pair_prompt_hash(hashes),
        precision=precision,
        members=tuple(replace(e, path=final / "members" / e.name) for e in exports),
        trt=trt_mode,
    )


def derive_bundle(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    precision: str,
    name: str | None = None,
    max_batch: int = DEFAULT_BATCH_SIZE,
) -> Path:
    """Convert an fp32 bundle's graphs to ``precision`` without exporting again.

    The derived bundle scores on another scale: it starts without the source's policy
    (``policy.yaml``), its stored versions (``policies/``) and the guard's live state
    (``state/``), like a fresh export; fit its own (``spotstop policy init``).

    The fp32 graphs were validated against torch at export; check the derived bundle with
    :func:`spotstop.export.verify.verify_bundle` (``spotstop verify-bundle``).
    """
    import onnx
    from spotstop.export.gptq import nbits_quantizer_meta
    from spotstop.export.nbits import nbits_weights
    from spotstop.export.onnx import _save, onnx_weight_bytes
    from spotstop.export.precision import ConvertOptions, convert_precision, get_precision
    from spotstop.export.quant import quantizer_meta
    from spotstop.guard import load_bundle
    from spotstop.guard._bundle import POLICY_VERSIONS_DIR, STATE_DIR
    from spotstop.guard.backends._onnx import GRAPHS_FILE
    from spotstop.guard.validate import dump_yaml, load_yaml

    b = load_bundle(src)
    if b.manifest.get("export", {}).get("precision") != "fp32":
        raise ValueError(f"derive_bundle needs an fp32 bundle; {src} is not one.")
    spec = get_precision(precision)
    fused = [e["name"] for e in b.manifest["members"] if e.get("graph_form") == "fused"]
    if fused and not spec.fusable:  # as export_member refuses it: onnxruntime cannot load it
        raise ValueError(
            f"{src} holds fused graphs ({', '.join(fused)}), and {precision} starts from the "
            "standard graph form: derive it from a bundle exported with --graph-form standard."
        )
    final = Path(out)
    check_bundle_out(final, [b.path])
    # what was fitted or made on the source's scores (its policy, the stored versions, the
    # guard's live state): the derived bundle scores on another scale, so it starts without
    fitted = {b.policy_path.name, POLICY_VERSIONS_DIR, STATE_DIR}
    guard_files = shutil.ignore_patterns(*_GUARD_FILES)

    def _leave_out(folder: str, names: list[str]) -> set[str]:
        top = {n for n in names if n in fitted} if Path(folder) == b.path else set()
        return top | guard_files(folder, names)

    with replaced_whole(final) as root:
        root.rmdir()  # copytree makes it
        shutil.copytree(b.path, root, ignore=_leave_out)
        entries = []
        total = 0
        for entry in b.manifest["members"]:
            mdir = root / entry["path"]
            meta = load_yaml(
                (mdir / GRAPHS_FILE).read_text(encoding="utf-8"), source=str(mdir / GRAPHS_FILE)
            )
            onnx_dir = mdir / "onnx"
            opts = ConvertOptions()  # no torch model here: no calibration, rounded to nearest
            vision = convert_precision(
                onnx.load(str(onnx_dir / "vision.onnx")), precision, options=opts
            )
            decs = {
                Path(f).name: convert_precision(onnx.load(str(mdir / f)), precision, options=opts)
                for f in meta["decoder"]["files"].values()
            }
            for f in onnx_dir.iterdir():
                f.unlink()
            _save({"vision.onnx": vision}, onnx_dir, "vision.onnx.data")
            _save(decs, onnx_dir, "decoder.onnx.data")
            wb = onnx_weight_bytes(vision) + onnx_weight_bytes(next(iter(decs.values())))
            qmeta = quantizer_meta(vision)
            spec = get_precision(precision)
            if spec.nbits is not None:  # no torch model here: rounded to nearest
                qmeta = {"quantizer": nbits_quantizer_meta(precision, None, {})}
                if spec.nbits == 4:  # no torch model to name the weights: all at int4
                    qmeta["quantizer"]["int8"] = {"selectors": [], "chosen": 0}
                if "int8" in opts.report:
                    qmeta["quantizer"]["dynamic_int8"] = opts.report["int8"]
                qmeta["quantizer"]["weights_by_bits"] = {
                    f"int{b}": n for b, n in sorted(nbits_weights([vision, *decs.values()]).items())
                }
            meta.update(precision=precision, weight_bytes=int(wb), **qmeta)
            # the parity record is the fp32 graphs': these were never run against torch
            meta.pop("max_abs_diff", None)
            meta["derived_from"] = {
                "bundle_id": b.bundle_id,
                "precision": "fp32",
                "validated": "not against torch: run spotstop verify-bundle",
            }
            (mdir / GRAPHS_FILE).write_text(dump_yaml(meta), encoding="utf-8")
            method = qmeta["quantizer"]["method"] if qmeta else None
            new = {**entry, "precision": precision, "weight_bytes": int(wb), "quantizer": method}
            new.pop("int4_int8", None)
            if spec.nbits == 4:  # no torch model to name the weights: every weight at int4
                new["int4_int8"] = []
            entries.append(new)
            total += wb
        if (root / "trt" / "build.sh").is_file():
            from types import SimpleNamespace

            exports = [
                SimpleNamespace(
                    name=e["name"], path=root / e["path"], precision=precision, buckets=e["buckets"]
                )
                for e in entries
            ]
            write_trt_script(root, exports, max_batch=max_batch)
        files = _listed_files(root)
        cfg = ScoringConfig(prompt=b.prompt)
        _write_manifest(
            root,
            entries,
            {e["name"]: e["prompt_hash"] for e in entries},
            files,
            cfg,
            name=name or b.bundle_id.rsplit("-", 1)[0],
            test_pair=b.test_pair,
            extra={
                "export": {**b.manifest["export"], "precision": precision, "weight_bytes": total}
            },
        )
    return final
