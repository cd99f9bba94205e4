"""The scoring configuration (``spotstop.yaml``): prompt, answers, image size, batching.

Validated on load; every error names the offending key and what is allowed. Unknown keys
are errors too (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotstop.guard._errors import ConfigError
from spotstop.guard._prompt import MAX_REQUEST_CHARS, PromptSpec
from spotstop.guard.validate import check_keys, check_mapping, load_yaml

__all__ = ["ScoringConfig", "load_scoring_config", "parse_image_size", "spotstop_home"]


def spotstop_home() -> Path:
    """Where spotstop keeps its working files: ``$SPOTSTOP_HOME``, else ``~/.cache/spotstop``.

    The demo bundle (``demo/bundle``, what ``spotstop check`` uses without ``--bundle``), the
    tiny TEST pair and other built artifacts live under it; calling this creates nothing.
    """
    return Path(os.environ.get("SPOTSTOP_HOME") or Path.home() / ".cache" / "spotstop")


#: scenes per backend call by default: the guard's batches, and the largest batch the export's
#: TensorRT profiles and Triton configs are built for (``max_batch``)
DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True)
class ScoringConfig:
    """How members score: the prompt and answers, the image grid, the batch size.

    ``visual_tokens`` holds each member's visual-token budget (a square grid of that many
    tokens), keyed by member name, model_type or its start (``{"qwen": 256, "lfm": 64}``;
    ``"*"``: every member); a budget comes before the sizes. ``image_size`` = (height, width)
    applies to every member unless a member override in ``member_image_size`` names it;
    without either, the member folder's hint, else the architecture's default budget (the
    paper's low-resolution rule: Qwen3.5 256 visual tokens, LFM2-VL 64).
    """

    prompt: PromptSpec = field(default_factory=PromptSpec)
    image_size: tuple[int, int] | None = None
    member_image_size: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    visual_tokens: Mapping[str, int] = field(default_factory=dict)
    batch_size: int = DEFAULT_BATCH_SIZE
    max_request_chars: int = MAX_REQUEST_CHARS


def parse_image_size(value: Any, where: str) -> tuple[int, int]:
    """``[h, w]``, ``"HxW"`` or a single int (square) → (h, w), validated; the error quotes
    the value as given."""
    given = value
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if isinstance(value, str):
        parts = value.lower().split("x")
        try:
            value = [int(p) for p in parts]
        except ValueError:
            value = None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(
            f"{where} must be two positive integers [height, width] (or 'HxW'); got {given!r}."
        )
    return (int(value[0]), int(value[1]))


def _positive_int(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{where} must be a positive integer; got {v!r}.")
    return v


def scoring_config_from_dict(
    d: Mapping[str, Any], *, where: str = "scoring", source: str = "the scoring config"
) -> ScoringConfig:
    """The ``scoring`` section as a :class:`ScoringConfig`; ``where`` is its key path and
    ``source`` where to fix it, both named in the :class:`ConfigError` of a bad key."""
    check_mapping(d, where=where, source=source)
    check_keys(
        d,
        where=where,
        optional=(
            "prompt",
            "visual_tokens",
            "image_size",
            "member_image_size",
            "batch_size",
            "max_request_chars",
        ),
        source=source,
    )
    prompt = PromptSpec()
    if "prompt" in d:
        p = d["prompt"]
        if not isinstance(p, Mapping):
            raise ConfigError(
                f"{where}.prompt must be a mapping with text/unsafe_answer/safe_answer."
            )
        check_keys(
            p,
            where=f"{where}.prompt",
            optional=("text", "unsafe_answer", "safe_answer"),
            source=source,
        )
        for k in p:
            if not isinstance(p[k], str):
                raise ConfigError(f"{where}.prompt.{k} must be a string; got {p[k]!r}.")
        prompt = PromptSpec(**{**prompt.__dict__, **dict(p)})
    image_size = None
    if d.get("image_size") is not None:
        image_size = parse_image_size(d["image_size"], f"{where}.image_size")
    per_member: dict[str, tuple[int, int]] = {}
    mis = d.get("member_image_size")
    mis = {} if mis is None else mis  # ([] or false is no mapping: refused below)
    if not isinstance(mis, Mapping):
        raise ConfigError(f"{where}.member_image_size must map member names to sizes.")
    for name, size in mis.items():
        per_member[str(name)] = parse_image_size(size, f"{where}.member_image_size.{name}")
    budgets: dict[str, int] = {}
    vt = d.get("visual_tokens")
    if isinstance(vt, Mapping):
        for name, n in vt.items():
            budgets[str(name)] = _positive_int(n, f"{where}.visual_tokens.{name}")
    elif vt is not None:
        budgets["*"] = _positive_int(vt, f"{where}.visual_tokens")
    return ScoringConfig(
        prompt=prompt,
        image_size=image_size,
        member_image_size=per_member,
        visual_tokens=budgets,
        batch_size=_positive_int(d.get("batch_size", DEFAULT_BATCH_SIZE), f"{where}.batch_size"),
        max_request_chars=_positive_int(
            d.get("max_request_chars", MAX_REQUEST_CHARS), f"{where}.max_request_chars"
        ),
    )


def load_scoring_config(path: str | Path) -> ScoringConfig:
    """Read and validate a scoring YAML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"scoring config {p} does not exist.") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not UTF-8
        raise ConfigError(
            f"scoring config {p} cannot be read as UTF-8 text ({type(e).__name__}: {e}). "
            "Pass the path of a YAML file."
        ) from e
    raw = load_yaml(text, source=f"scoring config {p}")  # a key twice is refused
    if raw is None:  # an empty file: every default
        raw = {}
    check_mapping(raw, where="", source=str(p))  # `false` or a list is no config
    return scoring_config_from_dict(raw, where=p.name, source=str(p))
