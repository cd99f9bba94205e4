"""What every backend of an exported member shares, whatever runs its graphs.

A member folder exported by ``spotstop export`` holds ``spotstop_onnx.yaml`` (written by
``export/onnx.py``) that names its two scoring graphs (see ``export/graphs.py``):

* ``vision``: one image's preprocessed pixels at the fixed grid → its visual tokens;
* ``decoder``: right-padded token ids + visual tokens + the positions the score reads →
  ``first_logits`` (the answers' first tokens at the last prompt position) and
  ``read_logprob`` (log-softmax of later answer tokens). Bundles exported before the compact
  Gated-DeltaNet graph hold one fixed-length Qwen3.5 decoder per length bucket
  (``decoder_L{bucket}.onnx``, ``fixed_length: true``); otherwise there is one graph whose
  sequence axis is dynamic (``decoder.onnx``), serving every length up to the largest bucket:
  onnxruntime feeds it at the batch's own length, TensorRT at the bucket lengths its
  profiles were built for.

:class:`GraphBackend` holds everything that does not depend on the runtime: reading and
checking that description, the length bucket of a batch, the decoder's inputs, one vision
pass per distinct image, the check that the prompt's answers are the ones the graphs were
exported for, and turning the decoder's outputs into scores. A runtime (onnxruntime in
``_onnx.py``, TensorRT in ``_trt.py``) only says how one graph is loaded, run and dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._errors import MemberLoadError, ScoringError
from spotstop.guard._hf import MemberFolder
from spotstop.guard._prompt import ScorePlan
from spotstop.guard.validate import is_int, load_yaml

__all__ = [
    "DECODER_INPUTS",
    "DECODER_OUTPUTS",
    "GRAPHS_FILE",
    "GRAPHS_FORMAT",
    "GRAPHS_VERSION",
    "VISION_INPUTS",
    "VISION_OUTPUTS",
    "GraphBackend",
    "combine_scores",
    "decoder_feeds",
    "graph_files",
    "read_meta",
]

#: The graph description in an exported member folder.
GRAPHS_FILE = "spotstop_onnx.yaml"
GRAPHS_FORMAT = "spotstop-onnx-member"
GRAPHS_VERSION = 1

#: The graphs' input and output names (export/graphs.py); every runtime binds these.
VISION_INPUTS: tuple[str, ...] = ("pixel_values",)
VISION_OUTPUTS: tuple[str, ...] = ("image_embeds",)
DECODER_INPUTS: tuple[str, ...] = (
    "input_ids",
    "image_embeds",
    "last_index",
    "read_index",
    "read_token",
)
DECODER_OUTPUTS: tuple[str, ...] = ("first_logits", "read_logprob")


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


def read_meta(folder: MemberFolder) -> dict[str, Any]:
    """The member's ``spotstop_onnx.yaml``, checked against its ``config.json``."""
    path = folder.path / GRAPHS_FILE
    if not path.is_file():
        raise MemberLoadError(
            f"{folder.path} has no {GRAPHS_FILE}: it is not an exported member. Export it with "
            "`spotstop export --member ... --out BUNDLE`, or use the torch backend."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MemberLoadError(f"{path} is not UTF-8 text ({e}); re-export the member.") from e
    try:
        meta = load_yaml(text, source=str(path), error=MemberLoadError)
    except MemberLoadError as e:  # not YAML, or a key twice
        raise MemberLoadError(f"{e} Re-export the member.") from e
    if not isinstance(meta, dict) or meta.get("format") != GRAPHS_FORMAT:
        raise MemberLoadError(f"{path} is not a spotstop ONNX member description.")
    if meta.get("version") != GRAPHS_VERSION:
        raise MemberLoadError(
            f"{path} version {meta.get('version')!r} is not supported (this spotstop reads "
            f"{GRAPHS_VERSION}); re-export the member."
        )
    keys = ("model_type", "precision", "first_ids", "image_token_id", "hidden_size")
    for key in (*keys, "n_image_tokens", "vision", "decoder"):
        if key not in meta:
            raise MemberLoadError(f"{path}: key {key!r} is missing; re-export the member.")
    bad = _meta_problem(meta)
    if bad is not None:
        raise MemberLoadError(f"{path}: {bad}; the file is damaged: re-export the member.")
    if meta["model_type"] != folder.model_type:
        raise MemberLoadError(
            f"{path} describes a {meta['model_type']} export but config.json says "
            f"{folder.model_type}; the folder is mixed up."
        )
    return meta


def _meta_problem(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with the types of a member description's keys (None: nothing)."""

    def count(x: Any) -> bool:
        return is_int(x) and x > 0

    ids = meta["first_ids"]
    if not isinstance(ids, list) or not ids or not all(is_int(t) for t in ids):
        return f"first_ids must be a list of token ids; got {ids!r}"
    for key in ("image_token_id", "hidden_size", "n_image_tokens"):
        if not (is_int(meta[key]) and (key == "image_token_id" or count(meta[key]))):
            return f"{key} must be an integer; got {meta[key]!r}"
    if not isinstance(meta["vision"], str) or not meta["vision"]:
        return f"vision must name the vision graph's file; got {meta['vision']!r}"
    dec = meta["decoder"]
    if not isinstance(dec, dict) or not isinstance(dec.get("fixed_length"), bool):
        return "decoder must hold files, buckets and fixed_length (true or false)"
    files, buckets = dec.get("files"), dec.get("buckets")
    if (
        not isinstance(files, dict)
        or not files
        or not all(isinstance(v, str) and v for v in files.values())
    ):
        return f"decoder.files must map lengths to graph files; got {files!r}"
    try:
        {int(k) for k in files}
    except (TypeError, ValueError):
        return f"decoder.files must be keyed by lengths; got {list(files)!r}"
    if not isinstance(buckets, list) or not buckets or not all(count(b) for b in buckets):
        return f"decoder.buckets must be a list of positive lengths; got {buckets!r}"
    return None


def graph_files(meta: Mapping[str, Any]) -> tuple[str, dict[int, str]]:
    """The vision graph and the decoder graph(s) by length key, as paths in the member folder."""
    return str(meta["vision"]), {int(k): str(v) for k, v in meta["decoder"]["files"].items()}


class GraphBackend(ABC):
    """Scores with a member's exported graphs; a subclass says how a graph is loaded and run.

    Subclasses implement :meth:`_load_graph` (a graph file → a runnable handle),
    :meth:`_run_graph` (handle + named inputs → named outputs) and, when a handle holds
    resources that garbage collection does not free promptly, :meth:`_drop_graph`.
    """

    name = "graphs"
    #: called before any graph file is opened (the bundle's member loader sets it to check
    #: the member's files against the verified manifest again: a graph opened after load,
    #: the decoder at the first score or on-demand sessions at every score, runs no bytes
    #: that were not checked); None: nothing to check
    before_graph_load: Callable[[], None] | None = None
    #: called before every score (the bundle's member loader sets it to notice the member's
    #: files written in place under its open sessions: ``MemberFilesWatch``); None: nothing
    before_graph_run: Callable[[], None] | None = None
    #: feed a decoder with a dynamic sequence axis at the batch's own length (True) rather
    #: than at its length bucket (the buckets then only bound the length); a runtime whose
    #: engines are built for the bucket range (TensorRT profiles) keeps the buckets
    exact_length: bool = False

    def __init__(self, folder: MemberFolder) -> None:
        self.folder = folder
        self.meta = read_meta(folder)
        self.precision = str(self.meta["precision"])
        self.first_ids = tuple(int(t) for t in self.meta["first_ids"])
        self.image_token_id = int(self.meta["image_token_id"])
        self.hidden_size = int(self.meta["hidden_size"])
        self.n_image_tokens = int(self.meta["n_image_tokens"])
        self.pad_id = int(self.meta.get("pad_id", 0))
        self.resident = self.meta.get("sessions", "resident") != "on-demand"
        vision, decoders = graph_files(self.meta)
        self._vision_path = folder.path / vision
        self._vision: Any = None
        self.fixed_length = bool(self.meta["decoder"]["fixed_length"])
        self.buckets = tuple(sorted(int(b) for b in self.meta["decoder"]["buckets"]))
        self._decoder_files = {k: folder.path / v for k, v in decoders.items()}
        self._decoders: dict[int, Any] = {}
        for f in [self._vision_path, *self._decoder_files.values()]:
            if not f.is_file():
                raise MemberLoadError(f"exported graph {f} is missing; copy the bundle again.")

    # -- what a runtime implements ---------------------------------------------------------
    @abstractmethod
    def _load_graph(self, path: Path, kind: str) -> Any:
        """Load the graph at ``path`` (``kind`` is "vision" or "decoder") for running."""

    @abstractmethod
    def _run_graph(self, graph: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a loaded graph on named host arrays; its outputs by name, as host arrays."""

    def _drop_graph(self, graph: Any) -> None:  # noqa: B027 - optional hook, no-op default
        """Free what a loaded graph holds (default: nothing beyond garbage collection)."""

    # -- graphs ----------------------------------------------------------------------------
    @property
    def vision(self) -> Any:
        if self._vision is None:
            self._check_before_load()
            self._vision = self._load_graph(self._vision_path, "vision")
        return self._vision

    def _check_before_load(self) -> None:
        if self.before_graph_load is not None:
            self.before_graph_load()

    def release(self) -> None:
        """Drop the loaded graphs (they are loaded again when next needed)."""
        loaded = [self._vision, *self._decoders.values()]
        self._vision = None
        self._decoders.clear()
        for g in loaded:
            if g is not None:
                self._drop_graph(g)

    def _decoder_key(self, length: int) -> int:
        return length if self.fixed_length else next(iter(self._decoder_files))

    def _decoder(self, length: int) -> Any:
        key = self._decoder_key(length)
        if key not in self._decoders:
            self._check_before_load()
            self._decoders[key] = self._load_graph(self._decoder_files[key], "decoder")
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

    def feed_length(self, length: int) -> int:
        """The length a batch of ``length`` tokens is right-padded to: its bucket, or itself
        for a dynamic-length decoder on a runtime with :attr:`exact_length` (one graph serves
        every length up to the largest bucket); longer than every bucket is refused."""
        bucket = self.bucket(length)
        return length if self.exact_length and not self.fixed_length else bucket

    def check_plan(self, plan: ScorePlan) -> None:
        """Refuse a prompt whose answers start with other tokens than the graphs read."""
        if tuple(plan.first_ids) != self.first_ids:
            raise ScoringError(
                f"the member's graphs were exported for answer first tokens {self.first_ids}, "
                f"but the prompt's answers start with {tuple(plan.first_ids)}; re-export the "
                "bundle with this prompt."
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
            got = self._run_graph(
                self.vision,
                {"pixel_values": np.ascontiguousarray(px["pixel_values"], np.float32)},
            )
            emb = got["image_embeds"]
            if emb.shape[1:] != out.shape[1:]:
                raise ScoringError(
                    f"the vision graph returned {emb.shape[1:]} visual tokens; the member's "
                    f"grid needs {out.shape[1:]}. The bundle does not match its manifest."
                )
            out[i] = emb[0]
            seen[id(px)] = i
        return out

    def _run_decoder(
        self, length: int, feeds: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        got = self._run_graph(self._decoder(length), feeds)
        return got["first_logits"], got["read_logprob"]

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        pixels: Sequence[Mapping[str, np.ndarray]] | None,
        plan: ScorePlan,
    ) -> np.ndarray:
        self.check_plan(plan)
        if self.before_graph_run is not None:
            self.before_graph_run()
        n_rows = len(plan.rows)
        length = self.feed_length(max(len(p) for p in prompts) + plan.max_row_len)
        feeds = decoder_feeds(prompts, plan, length, self.pad_id)
        b = feeds["input_ids"].shape[0]
        try:
            if pixels is None:
                emb = np.zeros((b, self.n_image_tokens, self.hidden_size), np.float32)
            else:
                per_prompt = self.image_embeds(pixels)
                emb = np.repeat(per_prompt, n_rows, axis=0)
            first, logp = self._run_decoder(length, {**feeds, "image_embeds": emb})
        except ScoringError:
            raise
        except Exception as e:  # a runtime failure is a scoring failure, with its cause
            raise ScoringError(
                f"{self.folder.model_type} graphs failed on {self.name}: {type(e).__name__}: {e}"
            ) from e
        finally:
            if not self.resident:
                self.release()
        return combine_scores(first, logp, plan, self.first_ids)
