"""Reading a Hugging Face member: a local snapshot folder or a hub id.

The same code reads a real snapshot (``Qwen/Qwen3.5-2B``, a folder from
``huggingface-cli download``) and the tiny test pair. Only :func:`render_template` needs
``transformers`` (to run the member's own chat template); everything else reads JSON and
``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from spotstop.guard._arch import ArchSpec, get_arch
from spotstop.guard._errors import BackendUnavailableError, ConfigError, MemberLoadError
from spotstop.guard._prompt import IMAGE_SLOT, REQUEST_SLOT, PromptSpec, RenderedTemplate
from spotstop.guard.validate import check_keys, check_mapping, load_yaml

__all__ = ["MemberFolder", "describe_test_pair", "render_template", "resolve_member"]

#: Written by ``spotstop tiny`` into each tiny member; its presence marks a test pair.
TEST_PAIR_MARKER = "SPOTSTOP_TEST_PAIR.txt"
#: The kinds of test member, as the folder's hints record them (``test_pair_kind``, written
#: with the marker) and a bundle's manifest copies them per member: what each one is.
TEST_PAIR_KINDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "tiny": "tiny members with seeded random weights (`spotstop tiny`), whose outputs mean "
        "nothing",
        "random": "members at real dimensions with seeded random weights "
        "(`build_random_member`), whose outputs mean nothing",
        "trained": "the tiny pair trained on the toy world (`spotstop tiny --trained`), whose "
        "scores carry that world's rule only",
    }
)


def describe_test_pair(kinds: Iterable[str | None] = ()) -> str:
    """What a command prints (and a test-pair bundle's manifest says) beside a test pair's
    output, from its test members' kinds (:data:`TEST_PAIR_KINDS`; None: a folder or manifest
    written before kinds were recorded). With every kind known it says what the pair is;
    otherwise what is true of every test pair.

    >>> describe_test_pair(["trained", "trained"])[:69]
    'TEST PAIR, not a safety model: the tiny pair trained on the toy world'
    """
    seen = list(dict.fromkeys(kinds))
    if seen and all(k in TEST_PAIR_KINDS for k in seen):
        return f"TEST PAIR, not a safety model: {'; '.join(TEST_PAIR_KINDS[str(k)] for k in seen)}."
    return (
        "TEST PAIR, not a safety model: test members whose outputs say nothing about real "
        "safety (seeded random weights, tiny or at real dimensions: nothing at all; the tiny "
        "pair of `spotstop tiny --trained`: the toy world's rule only)."
    )


#: the note where the test members' kinds are not known (true of every test pair)
TEST_PAIR_NOTE = describe_test_pair()
#: Optional per-folder hints (e.g. the tiny pair's image size).
MEMBER_HINTS = "spotstop_member.yaml"
#: The files :func:`resolve_member` reads only where a member's folder holds them (the image
#: processor's mean and std, the hints, the test-pair marker): a verified bundle must list
#: each one that is there (``guard/_bundle.py``), or it would be read unchecked
OPTIONAL_MEMBER_FILES = ("preprocessor_config.json", MEMBER_HINTS, TEST_PAIR_MARKER)


@dataclass(frozen=True)
class MemberFolder:
    """A member's files on disk and what spotstop read from them."""

    source: str  # what the user passed: a folder or a hub id
    path: Path  # the local folder
    revision: str | None
    config: dict[str, Any]
    preprocessor: dict[str, Any]
    arch: ArchSpec
    test_pair: bool
    hints: dict[str, Any]
    test_pair_kind: str | None = None
    """A test member's kind (:data:`TEST_PAIR_KINDS`) from its hints; None for a real member
    or a test member whose folder predates the record."""

    @property
    def model_type(self) -> str:
        return self.arch.model_type

    @property
    def image_token_id(self) -> int:
        return int(self.config["image_token_id"])

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.path / "tokenizer.json"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as e:
        raise MemberLoadError(f"cannot read {path}: {e}. The member folder looks damaged.") from e
    if not isinstance(data, dict):
        raise MemberLoadError(f"{path} must hold a JSON object.")
    return data


def resolve_member(source: str | os.PathLike[str], *, revision: str | None = None) -> MemberFolder:
    """Find a member's folder: a local path, else a hub id resolved through the local cache.

    Raises :class:`MemberLoadError` saying how to get the files when neither works (no hub
    is needed when the folder exists; on a robot, always pass folders).
    """
    src = str(source)
    path = Path(src).expanduser()
    if not path.exists():
        if src.startswith((".", "/", "~")) or src.count("/") != 1:
            raise MemberLoadError(
                f"member folder {src!r} does not exist. Pass a folder holding config.json and "
                "tokenizer.json, or a hub id like 'Qwen/Qwen3.5-2B'."
            )
        try:
            from huggingface_hub import snapshot_download
        except ImportError as e:
            raise BackendUnavailableError(
                f"{src!r} is not a local folder and huggingface_hub is not installed to "
                "resolve it as a hub id. Install spotstop[export] or pass a folder."
            ) from e
        try:
            path = Path(snapshot_download(src, revision=revision))
        except Exception as e:  # any hub/network/cache failure: say what to do instead
            raise MemberLoadError(
                f"could not fetch member {src!r} (revision {revision or 'main'}) from the "
                f"Hugging Face hub or its local cache: {type(e).__name__}: {e}. On a machine "
                f"with access run `huggingface-cli download {src} --local-dir DIR` and pass DIR."
            ) from e
    if not path.is_dir():
        raise MemberLoadError(f"member source {src!r} is not a folder.")
    config = _read_json(path / "config.json")
    if not config:
        raise MemberLoadError(f"{path} has no config.json; it is not a Hugging Face model folder.")
    if not (path / "tokenizer.json").is_file():
        raise MemberLoadError(
            f"{path} has no tokenizer.json; spotstop needs the fast tokenizer file."
        )
    arch = get_arch(str(config.get("model_type")))
    hints: dict[str, Any] = {}
    if (path / MEMBER_HINTS).is_file():
        hints = _member_hints(path / MEMBER_HINTS)
    return MemberFolder(
        source=src,
        path=path,
        revision=revision,
        config=config,
        preprocessor=_read_json(path / "preprocessor_config.json"),
        arch=arch,
        test_pair=(path / TEST_PAIR_MARKER).is_file() or bool(hints.get("test_pair")),
        hints=hints,
        test_pair_kind=hints.get("test_pair_kind"),
    )


def _member_hints(path: Path) -> dict[str, Any]:
    """The member folder's hints (``image_size``, ``test_pair``, ``test_pair_kind``), each key
    checked by name: a misspelt key fell back to a default silently, and ``test_pair:
    'false'`` (quoted) was true."""
    source = str(path)
    raw = load_yaml(path.read_text(encoding="utf-8"), source=source)  # a key twice refused
    if raw is None:
        return {}
    check_mapping(raw, where="", source=source)
    check_keys(raw, where="", optional=("image_size", "test_pair", "test_pair_kind"), source=source)
    if "test_pair" in raw and not isinstance(raw["test_pair"], bool):
        raise ConfigError(
            f"test_pair must be true or false; got {raw['test_pair']!r}. Fix it in {source}."
        )
    kind = raw.get("test_pair_kind")
    if kind is not None and kind not in TEST_PAIR_KINDS:
        raise ConfigError(
            f"test_pair_kind must be one of {sorted(TEST_PAIR_KINDS)}; got {kind!r}. Fix it "
            f"in {source}."
        )
    return dict(raw)


def render_template(folder: MemberFolder, spec: PromptSpec) -> RenderedTemplate:
    """Run the member's own chat template (reasoning off, generation prompt on) with slots."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise BackendUnavailableError(
            "rendering a member's chat template needs transformers; install spotstop[export] "
            "(on the robot, use a bundle: its templates are rendered at export time)."
        ) from e
    tok = AutoTokenizer.from_pretrained(str(folder.path))
    text = spec.text.replace("{request}", REQUEST_SLOT)

    def render(with_image: bool) -> str:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if with_image:
            content.insert(0, {"type": "image"})
        messages: Any = [{"role": "user", "content": content}]
        out = tok.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            **dict(folder.arch.chat_template_kwargs),
        )
        return str(out)

    with_image = render(True)
    placeholder = folder.arch.template_image_placeholder
    if with_image.count(placeholder) != 1:
        raise MemberLoadError(
            f"the chat template of {folder.source} wrote the image placeholder {placeholder!r} "
            f"{with_image.count(placeholder)} times for one image; expected once."
        )
    with_image = with_image.replace(placeholder, IMAGE_SLOT)
    return RenderedTemplate(with_image=with_image, without_image=render(False))
