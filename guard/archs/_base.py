"""What every member architecture's runtime spec is: :class:`ArchSpec` and :class:`ImageGeometry`.

One subclass per Hugging Face ``model_type``, each in its own module of this package
(``guard/archs/<model_type>.py``); the package's ``__init__`` is the registry. A spec knows, from
the member's ``config.json`` and ``preprocessor_config.json``:

* the image geometry at a fixed resolution (patch size, merge factor, visual token count),
  and the grid that holds a visual-token budget (the member's own bundle setting; the default
  is the paper's low-resolution rule: Qwen3.5 256 tokens, LFM2-VL 64 without tiling);
* the numpy/Pillow preprocessing that turns an RGB image into the vision tower's input
  (tested equal to the Hugging Face image processor's output);
* what the chat template writes for an image and what the processor expands it to;
* the chat-template switches that turn reasoning off;
* the extra text inputs the member's transformers model takes besides ``input_ids`` and
  ``attention_mask`` (the torch reference backend passes them).

No torch here: the robot's runtime uses these specs too.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image
from spotstop.guard._errors import ConfigError

__all__ = ["ArchSpec", "ImageGeometry", "config_value", "to_normalized_chw"]


@dataclass(frozen=True)
class ImageGeometry:
    """A fixed image grid for one member: every scene is resized to ``height`` × ``width``."""

    height: int
    width: int
    patch_size: int
    merge: int  # spatial merge (Qwen) or downsample factor (LFM2-VL)
    n_image_tokens: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resample: int  # a PIL.Image.Resampling value

    @property
    def token_grid(self) -> tuple[int, int]:
        """(rows, columns) of visual tokens: the grid in patches, reduced by ``merge``."""
        factor = self.patch_size * self.merge
        return self.height // factor, self.width // factor


def config_value(d: Mapping[str, Any], key: str, default: Any) -> Any:
    """``d[key]``, or ``default`` where the key is missing or null (as config.json writes it)."""
    v = d.get(key, default)
    return default if v is None else v


def _norm_stats(
    pre: Mapping[str, Any],
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    mean = tuple(float(x) for x in config_value(pre, "image_mean", [0.5, 0.5, 0.5]))
    std = tuple(float(x) for x in config_value(pre, "image_std", [0.5, 0.5, 0.5]))
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ConfigError(
            f"preprocessor_config.json image_mean/image_std must be 3 numbers (std > 0); "
            f"got {mean}, {std}."
        )
    return (mean[0], mean[1], mean[2]), (std[0], std[1], std[2])


def to_normalized_chw(image: Image.Image, g: ImageGeometry) -> np.ndarray:
    """Resize to the grid, scale to [0, 1], normalize; returns float32 (3, H, W)."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != (g.width, g.height):
        image = image.resize((g.width, g.height), resample=Image.Resampling(g.resample))
    raw = np.asarray(image, dtype=np.float32) * np.float32(1 / 255)
    norm = (raw - np.asarray(g.mean, np.float32)) / np.asarray(g.std, np.float32)
    return np.ascontiguousarray(norm.transpose(2, 0, 1), dtype=np.float32)


def _token_grid(n: int, aspect: float) -> tuple[int, int] | None:
    """(rows, columns) with rows · columns = ``n`` and columns / rows closest to ``aspect``
    (exactly square for aspect 1, else within 10 %), or None."""
    best: tuple[float, int, int] | None = None
    for rows in range(1, n + 1):
        if n % rows:
            continue
        cols = n // rows
        err = abs(math.log(cols / rows / aspect))
        if best is None or err < best[0]:
            best = (err, rows, cols)
    if best is None or best[0] > (1e-9 if aspect == 1.0 else math.log(1.1)):
        return None
    return best[1], best[2]


@dataclass(frozen=True)
class ArchSpec(ABC):
    """What spotstop needs to know about one member architecture."""

    model_type: str
    #: what the member's chat template writes for one image item
    template_image_placeholder: str
    #: the image token the placeholder is expanded into (its id is config.image_token_id)
    image_token: str
    #: extra chat-template variables that turn reasoning off
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: the default visual-token budget, the paper's low-resolution rule (seed 000, Table S31):
    #: the cheapest setting of each member whose development AUROC stays within 0.005
    default_visual_tokens: int = 256
    #: PIL resampling used by the member's own image processor
    resample: int = int(Image.Resampling.BICUBIC)
    #: tokens around the expanded image run, if the processor adds them
    image_prefix: str = ""
    image_suffix: str = ""

    # -- geometry ------------------------------------------------------------------------
    def token_factor(self, config: Mapping[str, Any]) -> tuple[int, int]:
        """(patch size, merge): one visual token covers ``patch × merge`` pixels per side."""
        vision = config.get("vision_config") or {}
        return int(config_value(vision, "patch_size", 16)), self._merge(config)

    def grid_for_tokens(
        self, config: Mapping[str, Any], n_tokens: int, aspect: float = 1.0
    ) -> tuple[int, int]:
        """(height, width) in pixels of the grid that holds exactly ``n_tokens`` visual tokens.

        ``aspect`` = width / height of the grid (1: square, the default of every budget). The
        grid is rows × columns of tokens with rows · columns = ``n_tokens`` (a square for
        aspect 1; columns / rows within 10 % of ``aspect`` otherwise); a budget without such a
        grid is refused, naming the nearest budgets that have one.
        """
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens <= 0:
            raise ConfigError(
                f"a visual-token budget must be a positive integer; got {n_tokens!r}."
            )
        if not aspect > 0:
            raise ConfigError(f"the grid's aspect (width / height) must be > 0; got {aspect!r}.")
        patch, merge = self.token_factor(config)
        factor = patch * merge
        rc = _token_grid(n_tokens, aspect)
        if rc is None:
            lo = next((n for n in range(n_tokens - 1, 0, -1) if _token_grid(n, aspect)), None)
            hi = next(n for n in range(n_tokens + 1, 4 * n_tokens + 8) if _token_grid(n, aspect))
            shape = "square grid" if aspect == 1.0 else f"grid of aspect {aspect:g}"
            near = f"{lo} or {hi}" if lo is not None else str(hi)
            raise ConfigError(
                f"{n_tokens} visual tokens do not fill a {shape} of {self.model_type} tokens "
                f"(each {factor}x{factor} pixels); the nearest budgets that do: {near}."
            )
        rows, cols = rc
        return rows * factor, cols * factor

    def geometry(
        self,
        config: Mapping[str, Any],
        preprocessor: Mapping[str, Any],
        size: tuple[int, int] | None = None,
    ) -> ImageGeometry:
        """The fixed image grid for this member at ``size`` = (height, width).

        ``None``: the square grid of the architecture's default visual-token budget
        (:attr:`default_visual_tokens`).
        """
        h, w = size or self.grid_for_tokens(config, self.default_visual_tokens)
        patch, merge = self.token_factor(config)
        factor = patch * merge
        if h <= 0 or w <= 0 or h % factor or w % factor:
            raise ConfigError(
                f"image_size for a {self.model_type} member must be positive multiples of "
                f"patch_size × merge = {patch} × {merge} = {factor}; got {h}x{w}. "
                f"Use e.g. {factor * max(1, round(h / factor))}x{factor * max(1, round(w / factor))}."
            )
        mean, std = _norm_stats(preprocessor)
        n_tokens = (h // factor) * (w // factor)
        return ImageGeometry(h, w, patch, merge, n_tokens, mean, std, self.resample)

    @abstractmethod
    def _merge(self, config: Mapping[str, Any]) -> int:
        """The spatial reduction between vision patches and visual tokens."""

    # -- prompt --------------------------------------------------------------------------
    def image_text(self, g: ImageGeometry) -> str:
        """The text that replaces the template's image placeholder (before tokenizing)."""
        return self.image_prefix + self.image_token * g.n_image_tokens + self.image_suffix

    # -- pixels --------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, image: Image.Image, g: ImageGeometry) -> dict[str, np.ndarray]:
        """Vision-tower inputs for ONE image (leading axis: this image).

        The keys are the keyword arguments of the transformers model's ``forward`` and
        ``get_image_features``; float arrays are pixels, integer arrays describe the grid.
        """

    # -- text inputs ---------------------------------------------------------------------
    def text_inputs(
        self, input_ids: np.ndarray, image_token_id: int, with_image: bool
    ) -> dict[str, np.ndarray]:
        """Inputs besides ``input_ids``/``attention_mask`` that the transformers model takes.

        ``input_ids`` (B, L) as passed to the model; ``with_image``: whether pixels go with
        them. None by default.
        """
        return {}
