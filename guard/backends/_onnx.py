"""The ONNX Runtime backend: a member's exported scoring graphs, no torch, no transformers.

A member folder exported by ``spotstop export`` holds ``spotstop_onnx.yaml`` (written by
``export/onnx.py``) that names its two scoring graphs (see ``export/graphs.py``):

* ``vision``: one image's preprocessed pixels at the fixed grid → its visual tokens;
* ``decoder``: right-padded token ids + visual tokens + the positions the score reads →
  ``first_logits`` (the answers' first tokens at the last prompt position) and
  ``read_logprob`` (log-softmax of later answer tokens). With a fixed-length decoder (Qwen3.5,
  exported with dynamo) there is one graph per length bucket; otherwise one graph whose
  sequence axis is dynamic, still fed at the bucket lengths.

Execution providers: ``device="cpu"`` → CPU; ``"cuda"`` / ``"cuda:N"`` → CUDA;
``"tensorrt"`` → TensorRT (with CUDA for the nodes TensorRT does not take). A requested
provider that this onnxruntime build lacks is an error, never a silent fallback to the CPU;
the provider that runs is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from guard._errors import BackendUnavailableError, MemberLoadError, ScoringError
from guard._hf import MemberFolder
from guard._prompt import ScorePlan

__all__ = ["GRAPHS_FILE", "OnnxBackend", "combine_scores", "decoder_feeds", "onnx_providers"]

logger = logging.getLogger("guard.backends.onnx")

#: The graph description in an exported member folder.
GRAPHS_FILE = "spotstop_onnx.yaml"
GRAPHS_FORMAT = "spotstop-onnx-member"
GRAPHS_VERSION = 1


def onnx_providers(device: str, available: Sequence[str]) -> list[Any]:
    """onnxruntime providers for ``device``; raises when the build lacks them (no fallback)."""
    dev = device.lower()
    if dev == "cpu":
        wanted: list[Any] = ["CPUExecutionProvider"]
    elif dev == "cuda" or dev.startswith("cuda:"):
        idx = int(dev.split(":", 1)[1]) if ":" in dev else 0
        wanted = [("CUDAExecutionProvider", {"device_id": idx})]
    elif dev == "tensorrt":
        wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    else:
        raise MemberLoadError(
            f"device for the onnx backend must be 'cpu', 'cuda', 'cuda:N' or 'tensorrt'; got {device!r}."
        )
    first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
    if first not in available:
        raise BackendUnavailableError(
            f"device {device!r} needs onnxruntime's {first}, which this onnxruntime build lacks "
            f"(available: {list(available)}). Install onnxruntime-gpu (pip install "
            "'spotstop[gpu]') on a machine with CUDA, or pass device='cpu'. spotstop does not "
            "fall back to another provider silently."
        )
    return wanted


def _reads_by_row(plan: ScorePlan) -> list[list[tuple[int, int]]]:
    """Per continuation row, the (offset, token) reads of both answers, in a fixed order."""
    rows: list[list[tuple[int, int]]] = [[] for _ in plan.rows]
    for r, j, tok in plan.continuation_reads(plan.unsafe_ids) + plan.continuation_reads(
        plan.safe_ids
    ):
        if (j, tok) not in rows[r]:
            rows[r].append((j, tok))
    return rows


def decoder_feeds(
    prompts: Sequence[Sequence[int]], plan: ScorePlan, length: int, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """The decoder graph's inputs (all but ``image_embeds``) for ``prompts`` under ``plan``.

    One sequence per (prompt, continuation row), prompt-major, right-padded to ``length``.
    ``read_index``/``read_token`` hold each row's reads in :func:`_reads_by_row` order, padded
    with harmless reads of the last prompt position.
    """
    n_rows = len(plan.rows)
    by_row = _reads_by_row(plan)
    k = max(1, *(len(x) for x in by_row))
    b = len(prompts) * n_rows
    ids = np.full((b, length), pad_id, dtype=np.int64)
    last = np.empty(b, dtype=np.int64)
    read_index = np.empty((b, k), dtype=np.int64)
    read_token = np.zeros((b, k), dtype=np.int64)
    for i, p in enumerate(prompts):
        pos0 = len(p) - 1
        for r, row in enumerate(plan.rows):
            q = i * n_rows + r
            seq = list(p) + list(row)
            if len(seq) > length:
                raise ScoringError(f"a sequence of {len(seq)} tokens does not fit length {length}.")
            ids[q, : len(seq)] = seq
            last[q] = pos0
            read_index[q] = pos0
            for c, (j, tok) in enumerate(by_row[r]):
                read_index[q, c] = pos0 + j
                read_token[q, c] = tok
    return {
        "input_ids": ids,
        "last_index": last,
        "read_index": read_index,
        "read_token": read_token,
    }


def combine_scores(
    first_logits: np.ndarray,
    read_logprob: np.ndarray,
    plan: ScorePlan,
    first_ids: Sequence[int],
) -> np.ndarray:
    """``s = log p(UNSAFE) − log p(SAFE)`` per prompt from the decoder graph's outputs."""
    n_rows = len(plan.rows)
    by_row = _reads_by_row(plan)
    first = np.asarray(first_logits, dtype=np.float64)
    logp = np.asarray(read_logprob, dtype=np.float64)
    fidx = {t: c for c, t in enumerate(first_ids)}
    n = first.shape[0] // n_rows

    def answer(i: int, ids: tuple[int, ...]) -> float:
        total = first[i * n_rows, fidx[ids[0]]]
        for r, j, tok in plan.continuation_reads(ids):
            total += logp[i * n_rows + r, by_row[r].index((j, tok))]
        return float(total)

    return np.array(
        [answer(i, plan.unsafe_ids) - answer(i, plan.safe_ids) for i in range(n)],
        dtype=np.float64,
    )


def _read_meta(folder: MemberFolder) -> dict[str, Any]:
    path = folder.path / GRAPHS_FILE
    if not path.is_file():
        raise MemberLoadError(
            f"{folder.path} has no {GRAPHS_FILE}: it is not an exported member. Export it with "
            "`spotstop export --member ... --out BUNDLE`, or use the torch backend."
        )
    meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != GRAPHS_FORMAT:
        raise MemberLoadError(f"{path} is not a spotstop ONNX member description.")
    if meta.get("version") != GRAPHS_VERSION:
        raise MemberLoadError(
            f"{path} version {meta.get('version')!r} is not supported (this spotstop reads "
            f"{GRAPHS_VERSION}); re-export the member."
        )
    for key in ("model_type", "precision", "first_ids", "image_token_id", "hidden_size"):
        if key not in meta:
            raise MemberLoadError(f"{path}: key {key!r} is missing; re-export the member.")
    if meta["model_type"] != folder.model_type:
        raise MemberLoadError(
            f"{path} describes a {meta['model_type']} export but config.json says "
            f"{folder.model_type}; the folder is mixed up."
        )
    return meta


class OnnxBackend:
    """Scores with the member's exported ONNX graphs on onnxruntime."""

    name = "onnx"

    def __init__(
        self,
        folder: MemberFolder,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
    ) -> None:
        # ``dtype`` is the torch backend's knob; an exported member's precision is fixed at
        # export time (spotstop_onnx.yaml: precision) and its inputs/outputs are float32.
        import onnxruntime as ort

        self.folder = folder
        self.meta = _read_meta(folder)
        self.precision = str(self.meta["precision"])
        self.first_ids = tuple(int(t) for t in self.meta["first_ids"])
        self.image_token_id = int(self.meta["image_token_id"])
        self.hidden_size = int(self.meta["hidden_size"])
        self.n_image_tokens = int(self.meta["n_image_tokens"])
        self.pad_id = int(self.meta.get("pad_id", 0))
        self._ort = ort
        self.providers = onnx_providers(device, ort.get_available_providers())
        self.device = device
        self._options = ort.SessionOptions()
        self._options.log_severity_level = 3
        if threads is not None:  # intra-op threads; None = onnxruntime's default (all cores)
            self._options.intra_op_num_threads = threads
        self.resident = self.meta.get("sessions", "resident") != "on-demand"
        self._vision_path = folder.path / self.meta["vision"]
        self._vision: Any = None
        dec = self.meta["decoder"]
        self.fixed_length = bool(dec["fixed_length"])
        self.buckets = tuple(sorted(int(b) for b in dec["buckets"]))
        self._decoder_files = {int(k): folder.path / v for k, v in dec["files"].items()}
        self._decoders: dict[int, Any] = {}
        for f in [folder.path / self.meta["vision"], *self._decoder_files.values()]:
            if not f.is_file():
                raise MemberLoadError(f"exported graph {f} is missing; copy the bundle again.")
        provider = self.vision.get_providers()[0]  # loads the vision graph: fail early
        logger.info(
            "member %s: onnxruntime %s on %s (%s graphs, %s sessions)",
            folder.path.name,
            ort.__version__,
            provider,
            self.precision,
            "resident" if self.resident else "on-demand",
        )
        if not self.resident:
            self.release()

    # -- sessions --------------------------------------------------------------------------
    def _session(self, path: Path) -> Any:
        try:
            sess = self._ort.InferenceSession(
                str(path), sess_options=self._options, providers=self.providers
            )
        except Exception as e:  # onnxruntime raises its own exception types; name the file
            raise MemberLoadError(
                f"onnxruntime could not load {path}: {type(e).__name__}: {e}"
            ) from e
        want = self.providers[0] if isinstance(self.providers[0], str) else self.providers[0][0]
        got = sess.get_providers()
        if not got or got[0] != want:
            raise BackendUnavailableError(
                f"onnxruntime runs {path.name} on {got} instead of {want}; refusing a silent "
                "fallback. Check the CUDA/TensorRT installation or pass device='cpu'."
            )
        return sess

    @property
    def vision(self) -> Any:
        if self._vision is None:
            self._vision = self._session(self._vision_path)
        return self._vision

    def release(self) -> None:
        """Drop the onnxruntime sessions (they are created again when next needed)."""
        self._vision = None
        self._decoders.clear()

    def _decoder(self, length: int) -> Any:
        key = length if self.fixed_length else next(iter(self._decoder_files))
        if key not in self._decoders:
            self._decoders[key] = self._session(self._decoder_files[key])
        return self._decoders[key]

    def bucket(self, length: int) -> int:
        """The smallest length bucket holding ``length`` tokens."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ScoringError(
            f"a prompt of {length} tokens is longer than the largest length bucket "
            f"({self.buckets[-1]}) this member was exported with; shorten the request or "
            "re-export with a larger --buckets value."
        )

    # -- the score -------------------------------------------------------------------------
    def image_embeds(self, pixels: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
        """Visual tokens (n, N, hidden) of each image; one vision pass per distinct image."""
        out = np.empty((len(pixels), self.n_image_tokens, self.hidden_size), np.float32)
        seen: dict[int, int] = {}
        for i, px in enumerate(pixels):
            if id(px) in seen:  # the gray variant passes one dict for every scene
                out[i] = out[seen[id(px)]]
                continue
            (emb,) = self.vision.run(
                None, {"pixel_values": np.ascontiguousarray(px["pixel_values"], np.float32)}
            )
            if emb.shape[1:] != out.shape[1:]:
                raise ScoringError(
                    f"the vision graph returned {emb.shape[1:]} visual tokens; the member's "
                    f"grid needs {out.shape[1:]}. The bundle does not match its manifest."
                )
            out[i] = emb[0]
            seen[id(px)] = i
        return out

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> np.ndarray:
        if tuple(plan.first_ids) != self.first_ids:
            raise ScoringError(
                f"the member's graphs were exported for answer first tokens {self.first_ids}, "
                f"but the prompt's answers start with {tuple(plan.first_ids)}; re-export the "
                "bundle with this prompt."
            )
        n_rows = len(plan.rows)
        length = self.bucket(max(len(p) for p in prompts) + plan.max_row_len)
        feeds = decoder_feeds(prompts, plan, length, self.pad_id)
        b = feeds["input_ids"].shape[0]
        if pixels is None:
            emb = np.zeros((b, self.n_image_tokens, self.hidden_size), np.float32)
        else:
            per_prompt = self.image_embeds(pixels)
            emb = np.repeat(per_prompt, n_rows, axis=0)
        try:
            first, logp = self._decoder(length).run(None, {**feeds, "image_embeds": emb})
        except ScoringError:
            raise
        except Exception as e:  # an onnxruntime failure is a scoring failure, with its cause
            raise ScoringError(
                f"{self.folder.model_type} decoder graph failed: {type(e).__name__}: {e}"
            ) from e
        finally:
            if not self.resident:
                self.release()
        return combine_scores(first, logp, plan, self.first_ids)
