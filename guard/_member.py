"""A loaded member: prompt encoder + preprocessing + a backend, scoring batches of scenes."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.guard._arch import ImageGeometry
from spotstop.guard._bundle import Bundle, BundleMember, MemberFilesWatch
from spotstop.guard._config import ScoringConfig, parse_image_size
from spotstop.guard._errors import ConfigError, MemberLoadError, RequestError, ScoringError
from spotstop.guard._hf import MemberFolder, describe_test_pair, render_template, resolve_member
from spotstop.guard._image import DecodedImage, decode_image, gray_image
from spotstop.guard._prompt import PromptEncoder, RenderedTemplate, prompt_hash
from spotstop.guard._types import VARIANTS, MemberScore, Scene, Variant
from spotstop.guard.backends import get_backend_class

__all__ = [
    "MAX_ABS_SCORE",
    "Member",
    "MemberInfo",
    "check_budget_keys",
    "load_bundle_member",
    "load_encoder",
    "load_member",
    "member_visual_tokens",
    "parse_visual_tokens",
    "resolve_image_size",
    "score_problem",
]

MAX_ABS_SCORE = 1e4
"""The largest ``|s|`` (nats) the guard takes from a member as a score.

A score is a log-probability ratio of a few answer tokens (the first a logit difference, the
rest log-softmax values); real members score within tens of nats (the tiny pair near −13).
``e^10000`` is a probability ratio no float64 holds (``e^±709``) and below what an fp16 pass
saturating at 65504 gives: a score past it is a broken pass, not an observation. Taken as one,
it would move the batch mean or a situation window for every other scene (all SAFE).
"""


def score_problem(score: float) -> str | None:
    """Why the guard cannot take ``score`` from a member (None: it can): not finite, or
    beyond :data:`MAX_ABS_SCORE`. The one rule; the scene fails closed with this reason."""
    if not np.isfinite(score):
        return f"a non-finite score ({score})"
    if abs(score) > MAX_ABS_SCORE:
        return (
            f"a score out of range ({score:.6g}; a log-probability ratio is within "
            f"±{MAX_ABS_SCORE:g} nats): a broken scoring pass"
        )
    return None


@dataclass(frozen=True)
class MemberInfo:
    """What a member is: its name, source, architecture, image grid and prompt hash."""

    name: str
    source: str
    model_type: str
    revision: str | None
    image_size: tuple[int, int]
    n_image_tokens: int
    prompt_hash: str
    backend: str
    test_pair: bool
    test_pair_kind: str | None = None
    """A test member's kind from its folder's hints (None: a real member, or not recorded)."""

    @property
    def test_pair_note(self) -> str:
        """What to print beside this member's outputs when it is a test member ('' otherwise)."""
        return describe_test_pair([self.test_pair_kind]) if self.test_pair else ""


class Member:
    """One member model, ready to score scenes. Build it with :func:`load_member`."""

    def __init__(
        self,
        folder: MemberFolder,
        encoder: PromptEncoder,
        geometry: ImageGeometry,
        backend: Any,
        *,
        name: str,
        batch_size: int,
    ) -> None:
        self.folder = folder
        self.encoder = encoder
        self.geometry = geometry
        self.backend = backend
        self.batch_size = batch_size
        self.prompt_hash = prompt_hash(encoder.spec, encoder.template, folder.model_type)
        self.info = MemberInfo(
            name=name,
            source=folder.source,
            model_type=folder.model_type,
            revision=folder.revision,
            image_size=(geometry.height, geometry.width),
            n_image_tokens=geometry.n_image_tokens,
            prompt_hash=self.prompt_hash,
            backend=backend.name,
            test_pair=folder.test_pair,
            test_pair_kind=folder.test_pair_kind,
        )
        self._image_text = folder.arch.image_text(geometry)
        self._gray_pixels: dict[str, np.ndarray] | None = None
        # One backend call at a time: the guard's scoring thread and its text thread (a claim
        # reader that is one of the guard's own members) may call the same member at once, and
        # not every backend may be entered twice (a TensorRT engine holds one execution context
        # and one set of device buffers; on-demand sessions are released after each call).
        self._backend_lock = threading.Lock()

    def __repr__(self) -> str:
        i = self.info
        tp = " TEST PAIR" if i.test_pair else ""
        return (
            f"<Member {i.name} ({i.model_type}, {i.image_size[0]}x{i.image_size[1]} → "
            f"{i.n_image_tokens} visual tokens, backend={i.backend}, prompt {i.prompt_hash}){tp}>"
        )

    @property
    def name(self) -> str:
        return self.info.name

    # -- inputs ----------------------------------------------------------------------------
    def pixels(self, image: DecodedImage) -> dict[str, np.ndarray]:
        return self.folder.arch.preprocess(image.image, self.geometry)

    def _gray(self) -> dict[str, np.ndarray]:
        if self._gray_pixels is None:
            img = gray_image(self.geometry.width, self.geometry.height)
            self._gray_pixels = self.folder.arch.preprocess(img, self.geometry)
        return self._gray_pixels

    def prompt_ids(self, request: str, variant: Variant = "scene") -> list[int]:
        return self.encoder.prompt_ids(request, None if variant == "text" else self._image_text)

    def check_request(self, request: str) -> None:
        """Refuse a request this member cannot score (:class:`RequestError` saying why): the
        encoder's rules (empty, too long in characters, control tokens), then
        :meth:`check_fits`. The guard checks each scene with it, and ``spotstop score`` each
        row of a table, before any model work."""
        self.encoder.check_request(request)
        self.check_fits(request)

    def check_fits(self, request: str) -> None:
        """Refuse, before any model work, a request whose prompt with its image is longer than
        the member's graphs take (:class:`RequestError`): scored with others, it would fail
        every scene of its batch. The scene prompt is the longest a request gives (the
        request-only prompt has no image tokens)."""
        bucket = getattr(self.backend, "bucket", None)
        if bucket is None:  # a backend without length buckets takes any length
            return
        n = len(self.prompt_ids(request)) + self.encoder.plan.max_row_len
        try:
            bucket(n)
        except ScoringError as e:
            raise RequestError(
                f"request is too long for member {self.name}: with the scene's image tokens and "
                f"the answer it is {n} tokens, and this bundle scores at most "
                f"{self.backend.buckets[-1]}. Shorten the request, or re-export the bundle "
                "with a larger --buckets value."
            ) from e

    # -- scoring ---------------------------------------------------------------------------
    def score(
        self, scenes: Sequence[Scene], variant: Variant = "scene", *, strict: bool = True
    ) -> list[MemberScore]:
        """Teacher-forced scores of ``scenes`` (in order) for one input ``variant``.

        ``scene`` uses the camera image, ``gray`` a content-free gray image of the same grid,
        ``text`` no image (request only). Raises on bad input before any model work; a
        non-finite score raises :class:`ScoringError` (the guard turns it into UNSAFE); with
        ``strict=False`` it is returned as is, for the caller to fail that scene closed.
        """
        if variant not in VARIANTS:
            raise ConfigError(f"variant must be one of {list(VARIANTS)}; got {variant!r}.")
        prompts = [self.prompt_ids(s.request, variant) for s in scenes]
        pixels: list[dict[str, np.ndarray]] | None = None
        if variant == "scene":
            pixels = []
            for s in scenes:
                if s.image is None:
                    raise ConfigError(
                        "a scene without an image cannot be scored with variant 'scene'; "
                        "use variant 'text' for the request-only score."
                    )
                img = s.image if isinstance(s.image, DecodedImage) else decode_image(s.image)
                pixels.append(self.pixels(img))
        elif variant == "gray":
            pixels = [self._gray()] * len(scenes)
        scores = np.empty(len(scenes), dtype=np.float64)
        for start in range(0, len(scenes), self.batch_size):
            stop = start + self.batch_size
            with self._backend_lock:
                raw = self.backend.score(
                    prompts[start:stop],
                    None if pixels is None else pixels[start:stop],
                    self.encoder.plan,
                )
            chunk = np.asarray(raw, dtype=np.float64)
            want = len(prompts[start:stop])
            if chunk.shape != (want,):  # never broadcast one score onto several scenes
                raise ScoringError(
                    f"member {self.name}'s backend returned scores of shape {chunk.shape} for "
                    f"{want} scene(s); a backend must return one score per scene."
                )
            scores[start:stop] = chunk
        bad = ~np.isfinite(scores)
        if strict and bad.any():
            raise ScoringError(
                f"member {self.name} produced a non-finite score for scene(s) "
                f"{np.flatnonzero(bad).tolist()}; the guard must treat them as UNSAFE."
            )
        return [
            MemberScore(
                member=self.name,
                variant=variant,
                score=float(s),
                prompt_hash=self.prompt_hash,
                n_prompt_tokens=len(p),
                test_pair=self.info.test_pair,
            )
            for s, p in zip(scores, prompts, strict=True)
        ]


def resolve_image_size(
    folder: MemberFolder,
    config: ScoringConfig,
    name: str,
    explicit: tuple[int, int] | None = None,
    visual_tokens: int | None = None,
) -> tuple[int, int] | None:
    """The image grid for a member: ``explicit``, then the square grid of the
    ``visual_tokens`` budget, then the config's budget for the member, then the config's
    per-member and global sizes, then the folder's ``spotstop_member.yaml`` hint; None = the
    architecture's default budget (:attr:`~spotstop.guard._arch.ArchSpec.default_visual_tokens`).

    Both ``explicit`` and ``visual_tokens`` must agree when both are given.
    """
    if visual_tokens is None and explicit is None:
        visual_tokens = member_visual_tokens(config.visual_tokens, name, folder.model_type)
    budget_grid = (
        None if visual_tokens is None else folder.arch.grid_for_tokens(folder.config, visual_tokens)
    )
    if explicit is not None:
        if budget_grid is not None and tuple(explicit) != budget_grid:
            raise ConfigError(
                f"member {name}: image size {explicit[0]}x{explicit[1]} and a budget of "
                f"{visual_tokens} visual tokens ({budget_grid[0]}x{budget_grid[1]}) disagree; "
                "give one of them."
            )
        return explicit
    if budget_grid is not None:
        return budget_grid
    if name in config.member_image_size:
        return config.member_image_size[name]
    if config.image_size is not None:
        return config.image_size
    if "image_size" in folder.hints:
        return parse_image_size(
            folder.hints["image_size"], f"{folder.path}/spotstop_member.yaml:image_size"
        )
    return None


def parse_visual_tokens(value: str, where: str = "--visual-tokens") -> dict[str, int]:
    """Parse a per-member visual-token budget: ``256`` (every member) or
    ``qwen=256,lfm=64``: keys are a member's name, its ``model_type`` or the start of it."""
    out: dict[str, int] = {}
    for part in str(value).split(","):
        key, sep, num = part.strip().rpartition("=")
        key = key.strip() if sep else "*"
        try:
            n = int(num)
        except ValueError:
            n = 0
        if n <= 0 or not key:
            raise ConfigError(
                f"{where} must be a positive token count (e.g. 256) or member=count pairs "
                f"(e.g. qwen=256,lfm=64); got {value!r}."
            )
        if key in out:
            raise ConfigError(f"{where} names {key!r} twice.")
        out[key] = n
    return out


def member_visual_tokens(
    budgets: Mapping[str, int] | None, name: str, model_type: str
) -> int | None:
    """The budget ``budgets`` gives a member (see :func:`parse_visual_tokens`), or None.

    A key names the member, its ``model_type`` or the start of it (``qwen``, ``lfm``); ``*``
    every member. A member that two keys name is refused.
    """
    if not budgets:
        return None
    hits = {k: v for k, v in budgets.items() if k != "*" and _names_member(k, name, model_type)}
    if len(hits) > 1:
        raise ConfigError(f"member {name} ({model_type}) is named by several budgets: {hits}.")
    if hits:
        return next(iter(hits.values()))
    return budgets.get("*")


def check_budget_keys(
    budgets: Mapping[str, int] | None, members: Sequence[tuple[str, str]]
) -> None:
    """Refuse a budget key that names none of ``members`` ((name, model_type) pairs)."""
    for key in budgets or {}:
        if key != "*" and not any(_names_member(key, n, t) for n, t in members):
            listed = ", ".join(f"{n} ({t})" for n, t in members)
            raise ConfigError(
                f"the visual-token budget {key}= names no member; the members are {listed}."
            )


def _names_member(key: str, name: str, model_type: str) -> bool:
    return key in (name, model_type) or model_type.startswith(key)


def _check_has_weights(folder: MemberFolder, backend: str) -> None:
    """A bundle's exported member (its scoring graphs, no weights) loaded with the torch
    backend failed deep in transformers ("chat_template is not set"): say what it is."""
    from spotstop.guard.backends._graphs import GRAPHS_FILE

    path = Path(folder.path)
    if backend != "torch" or not (path / GRAPHS_FILE).is_file():
        return
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return
    raise MemberLoadError(
        f"{path} is a bundle's exported member (ONNX scoring graphs, no weights); the torch "
        "backend needs the Hugging Face folder it was exported from. Pass that folder, or "
        "judge scenes with the bundle (`spotstop check --bundle`, `verify-bundle`)."
    )


def load_member(
    source: str | os.PathLike[str],
    *,
    name: str | None = None,
    config: ScoringConfig | None = None,
    image_size: tuple[int, int] | None = None,
    visual_tokens: int | None = None,
    backend: str = "torch",
    revision: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    template: RenderedTemplate | None = None,
    threads: int | None = None,
) -> Member:
    """Load a member from a Hugging Face folder or hub id, ready to score.

    Image size precedence: ``image_size`` argument, then the square grid of the
    ``visual_tokens`` budget, then the config's per-member and global sizes, then the folder's
    ``spotstop_member.yaml`` hint, then the architecture's default budget (the paper's
    low-resolution rule: Qwen3.5 256 visual tokens = 512x512, LFM2-VL 64 = 256x256). ``template`` is the
    pre-rendered chat template (from a bundle); without it the member's own template is
    rendered with transformers. ``threads`` caps the backend's intra-op CPU threads (None:
    the library's default, all cores); a server that shares the CPU with its HTTP side runs
    faster with one core left free. The onnx backend runs a graph under 32 MiB (the tiny test
    pair's) on one thread whatever the cap (``backends/_onnx.py``: ``intra_op_threads``).
    """
    cfg = config or ScoringConfig()
    folder = resolve_member(source, revision=revision)
    member_name = name or Path(folder.path).name
    _check_has_weights(folder, backend)
    size = resolve_image_size(folder, cfg, member_name, image_size, visual_tokens)
    geometry = folder.arch.geometry(folder.config, folder.preprocessor, size)
    encoder = _prompt_encoder(folder, cfg, template)
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"threads must be a positive integer or None; got {threads!r}.")
    backend_obj = get_backend_class(backend)(folder, device=device, dtype=dtype, threads=threads)
    _check_graphs_fit(member_name, backend_obj, encoder, geometry.n_image_tokens)
    return Member(
        folder, encoder, geometry, backend_obj, name=member_name, batch_size=cfg.batch_size
    )


def _prompt_encoder(
    folder: MemberFolder, cfg: ScoringConfig, template: RenderedTemplate | None
) -> PromptEncoder:
    if template is None:  # a bundle carries it pre-rendered; a bare folder needs transformers
        template = render_template(folder, cfg.prompt)
    return PromptEncoder(
        folder.tokenizer(), template, cfg.prompt, max_request_chars=cfg.max_request_chars
    )


def load_encoder(
    source: str | os.PathLike[str],
    *,
    config: ScoringConfig | None = None,
    revision: str | None = None,
) -> PromptEncoder:
    """The prompt encoder :func:`load_member` gives a member of ``source`` (tokenizer and
    rendered template; no weights are read). Its ``check_request`` is the whole of
    :meth:`Member.check_request` for the torch backend, which takes any length: where the
    members score elsewhere (``spotstop score --ray``: in the actors), the driver refuses each
    row's request with it, by the guard's rule, before any is sent."""
    return _prompt_encoder(
        resolve_member(source, revision=revision), config or ScoringConfig(), None
    )


def _check_graphs_fit(name: str, backend: Any, encoder: PromptEncoder, n_image_tokens: int) -> None:
    """Refuse at load, not on every check, a member whose exported graphs were made for another
    image grid (a hand-edited manifest) or another prompt's answer tokens (e.g. another
    member's tokenizer): each of its scores would fail closed, and no retry would mend it."""
    graph_tokens = getattr(backend, "n_image_tokens", None)
    if graph_tokens is not None and graph_tokens != n_image_tokens:
        raise MemberLoadError(
            f"member {name}: its image grid gives {n_image_tokens} visual tokens, but its graphs "
            f"were exported for {graph_tokens}; the manifest's image_size or the member's "
            "spotstop_onnx.yaml was edited. Re-export the bundle."
        )
    check = getattr(backend, "check_plan", None)
    if check is not None:
        try:
            check(encoder.plan)
        except ScoringError as e:
            raise MemberLoadError(f"member {name}: {e} (is its tokenizer.json its own?)") from e


def load_bundle_member(
    bundle: Bundle,
    member: BundleMember,
    *,
    device: str = "cpu",
    threads: int | None = None,
    backend: str | None = None,
) -> Member:
    """Load one member of a bundle with the bundle's prompt, grid, template and backend.

    What :class:`Guard` does for each member, for scoring a bundle's members without a guard
    (no policy, no log)::

        bundle = load_bundle("bundle/")
        members = [load_bundle_member(bundle, m) for m in bundle.members]

    ``backend`` overrides the backend the manifest names (``onnx`` for an exported bundle):
    ``"tensorrt"`` runs the engines built on the device from the same ONNX graphs
    (``trt/build.sh``; see :mod:`spotstop.guard.backends._trt`). Raises
    :class:`MemberLoadError` for a member whose prompt hash or visual-token budget differs
    from what the bundle recorded, or a backend the member cannot run on.
    """
    if backend is not None and backend != member.backend:
        if member.backend == "torch":
            raise MemberLoadError(
                f"member {member.name} of bundle {bundle.bundle_id} is a Hugging Face folder "
                f"(backend torch), not an exported one: it cannot run on {backend!r}. Export "
                "the bundle with `spotstop export` first."
            )
        if backend == "torch":
            raise MemberLoadError(
                f"member {member.name} is exported ({member.backend}); the torch backend needs "
                "the Hugging Face weights, which a bundle does not carry."
            )
    missing = bundle.missing_files(member)
    if missing:
        raise MemberLoadError(
            f"member {member.name} of bundle {bundle.bundle_id} is missing "
            f"{', '.join(missing[:5])}: the bundle was copied incompletely; copy it again."
        )
    bundle.check_member_files(member)  # verified once; loaded again later (a retry): again
    watch = MemberFilesWatch(bundle, member)  # the files as verified, for the sessions below
    m = load_member(
        member.path,
        name=member.name,
        config=ScoringConfig(prompt=bundle.prompt),
        image_size=member.image_size,
        backend=backend or member.backend,
        template=member.template,
        device=device,
        threads=threads,
    )
    if member.visual_tokens is not None and m.geometry.n_image_tokens != member.visual_tokens:
        raise MemberLoadError(
            f"member {member.name}: the bundle records {member.visual_tokens} visual tokens, "
            f"but its image grid {member.image_size[0]}x{member.image_size[1]} gives "
            f"{m.geometry.n_image_tokens}; the manifest was edited by hand. Re-export the bundle."
        )
    if m.prompt_hash != member.prompt_hash:
        raise MemberLoadError(
            f"member {member.name} builds prompt hash {m.prompt_hash}, but the bundle says "
            f"{member.prompt_hash}; re-export the bundle."
        )
    if hasattr(m.backend, "before_graph_load"):  # graphs opened later are checked first
        m.backend.before_graph_load = functools.partial(bundle.check_member_files, member)
        m.backend.before_graph_run = watch.check  # and files written under open sessions
    return m
