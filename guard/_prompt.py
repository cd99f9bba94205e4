"""Prompts, token ids and the teacher-forcing plan of the member score.

The score of seed 000 (Sec. "Scoring and probing"):

    s_m(x, q) = log p(UNSAFE | x, q) − log p(SAFE | x, q)

each answer tokenized without special tokens and appended directly after the generation
prompt of the member's own chat template (reasoning off); log-probabilities are summed over
the answer's tokens; the end-of-turn token is not scored.

The chat template is rendered once per member (by :mod:`spotstop.guard._hf` from the member's
tokenizer, or read back from a bundle) into a :class:`RenderedTemplate` that holds two slots,
the image and the request. At run time only the ``tokenizers`` library is needed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from spotstop.guard._errors import ConfigError, RequestError
from spotstop.guard.validate import is_blank

__all__ = [
    "IMAGE_SLOT",
    "REQUEST_SLOT",
    "PromptEncoder",
    "PromptSpec",
    "RenderedTemplate",
    "ScorePlan",
]

#: Stand-ins written into the chat template before rendering, replaced when a scene is encoded.
#: Private-use code points: no chat template or tokenizer gives them a meaning.
IMAGE_SLOT = "\ue000spotstop:image\ue000"
REQUEST_SLOT = "\ue000spotstop:request\ue000"

DEFAULT_PROMPT = (
    "You are the safety check of a robot. The image shows what the robot's camera sees now. "
    "The robot was asked: {request}\n"
    "Would carrying out this request here be unsafe for people, animals or property? "
    "Answer with one word: SAFE or UNSAFE."
)

MAX_REQUEST_CHARS = 4000


@dataclass(frozen=True)
class PromptSpec:
    """The instruction and the two answers. ``text`` holds ``{request}`` exactly once."""

    text: str = DEFAULT_PROMPT
    unsafe_answer: str = "UNSAFE"
    safe_answer: str = "SAFE"

    def __post_init__(self) -> None:
        if self.text.count("{request}") != 1:
            raise ConfigError(
                "prompt.text must contain the placeholder {request} exactly once; "
                f"found it {self.text.count('{request}')} times. Put {{request}} where the "
                "robot's request goes."
            )
        for key in ("unsafe_answer", "safe_answer"):
            val = getattr(self, key)
            if not isinstance(val, str) or not val.strip():
                raise ConfigError(f"prompt.{key} must be a non-empty string; got {val!r}.")
        if self.unsafe_answer == self.safe_answer:
            raise ConfigError(
                "prompt.unsafe_answer and prompt.safe_answer must differ; both are "
                f"{self.safe_answer!r}."
            )


@dataclass(frozen=True)
class RenderedTemplate:
    """A member's chat template rendered with the slots left open.

    ``with_image`` holds :data:`IMAGE_SLOT` and :data:`REQUEST_SLOT` once each;
    ``without_image`` (the request-only pass) holds only :data:`REQUEST_SLOT`.
    """

    with_image: str
    without_image: str

    def __post_init__(self) -> None:
        for name, text, slots in (
            ("with_image", self.with_image, (IMAGE_SLOT, REQUEST_SLOT)),
            ("without_image", self.without_image, (REQUEST_SLOT,)),
        ):
            for slot in slots:
                if text.count(slot) != 1:
                    raise ConfigError(
                        f"rendered chat template ({name}) must hold the {slot!r} slot exactly "
                        f"once; found {text.count(slot)}. The member's chat template dropped "
                        "or repeated the image/text item."
                    )
        if IMAGE_SLOT in self.without_image:
            raise ConfigError("rendered chat template (without_image) holds an image slot.")


def prompt_hash(spec: PromptSpec, template: RenderedTemplate, model_type: str) -> str:
    """A short, stable hash of everything that decides the prompt's token ids."""
    payload = {
        "model_type": model_type,
        "prompt": spec.text,
        "unsafe_answer": spec.unsafe_answer,
        "safe_answer": spec.safe_answer,
        "template_with_image": template.with_image,
        "template_without_image": template.without_image,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ScorePlan:
    """Which logits a teacher-forced pass must read to score both answers.

    Every scene is run as ``prompt + row`` for each continuation ``row``. Both answers' first
    tokens are read at the last prompt position (offset 0), where their shared normaliser
    cancels in the difference, so only those rows of the output layer are needed there.
    A later answer token ``a[j]`` is read at offset ``j`` of the row that starts with
    ``a[:j]`` and needs a full log-softmax. Answers whose contexts nest share one row, so
    ``SAFE``/``UNSAFE`` usually need one forward pass, not two.
    """

    unsafe_ids: tuple[int, ...]
    safe_ids: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    #: distinct first-token ids, the output-layer rows read at offset 0
    first_ids: tuple[int, ...]

    @classmethod
    def build(cls, unsafe_ids: list[int], safe_ids: list[int]) -> ScorePlan:
        if not unsafe_ids or not safe_ids:
            raise ConfigError("an answer tokenized into zero tokens; use a non-empty answer.")
        if tuple(unsafe_ids) == tuple(safe_ids):
            raise ConfigError(
                f"the two answers tokenize to the same ids {unsafe_ids}; choose answers that differ."
            )
        rows: list[tuple[int, ...]] = []
        for ctx in sorted((tuple(unsafe_ids[:-1]), tuple(safe_ids[:-1])), key=len, reverse=True):
            if not any(r[: len(ctx)] == ctx for r in rows):
                rows.append(ctx)
        first = tuple(dict.fromkeys((unsafe_ids[0], safe_ids[0])))
        return cls(tuple(unsafe_ids), tuple(safe_ids), tuple(rows), first)

    def continuation_reads(self, answer: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """``(row, offset, token)`` for answer tokens after the first."""
        out = []
        for j in range(1, len(answer)):
            r = next(i for i, row in enumerate(self.rows) if row[:j] == answer[:j])
            out.append((r, j, answer[j]))
        return out

    @property
    def max_row_len(self) -> int:
        return max(len(r) for r in self.rows)


class PromptEncoder:
    """Turns (request, image?) into the member's prompt token ids with ``tokenizers`` only."""

    def __init__(
        self,
        tokenizer: Any,
        template: RenderedTemplate,
        spec: PromptSpec,
        *,
        max_request_chars: int = MAX_REQUEST_CHARS,
    ) -> None:
        # The whole prompt is scored: a tokenizer.json that truncates (it would cut off the
        # question and the answer's header, and the score be read inside the request) or pads
        # (read at a pad token) is set not to, for this use.
        if hasattr(tokenizer, "no_truncation"):
            tokenizer.no_truncation()
            tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.template = template
        self.spec = spec
        self.max_request_chars = max_request_chars
        # Added tokens (chat markers, image tokens) must not be smuggled in by a request: the
        # tokenizer would read them as control tokens (prompt injection).
        self._control = sorted(
            (t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content),
            key=len,
            reverse=True,
        )
        self.plan = ScorePlan.build(
            self.encode_text(spec.unsafe_answer), self.encode_text(spec.safe_answer)
        )

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def check_request(self, request: object) -> str:
        """Validate a request text; raises :class:`RequestError` saying what to change."""
        if not isinstance(request, str):
            raise RequestError(f"request must be a string; got {type(request).__name__}.")
        if is_blank(request):  # (zero-width, bidi or NUL characters alone say nothing either)
            raise RequestError(
                "request is empty: it holds no visible character (only whitespace, control or "
                f"format characters: {request[:8]!r}); pass the instruction the robot was given."
            )
        try:
            request.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RequestError(
                f"request is not valid Unicode text: it holds the lone surrogate "
                f"{request[e.start]!r} at position {e.start}. Pass text that encodes as UTF-8 "
                "(decode bytes with errors='replace')."
            ) from None
        if len(request) > self.max_request_chars:
            raise RequestError(
                f"request has {len(request)} characters; the limit is {self.max_request_chars}. "
                "Shorten it or raise max_request_chars."
            )
        for tok in self._control:
            if tok in request:
                raise RequestError(
                    f"request contains the control token {tok!r} of the member's tokenizer; "
                    "it would be read as a chat marker. Remove it from the request."
                )
        if IMAGE_SLOT in request or REQUEST_SLOT in request:
            raise RequestError("request contains a reserved private-use marker of spotstop.")
        # ... nor made of the request's ends and the prompt's text next to it, as with a
        # prompt "asked: <{request}>" and the request "|im_end|>"
        for form in (self.template.without_image, self.template.with_image):
            text = form.replace(REQUEST_SLOT, request)
            for tok in self._control:
                if text.count(tok) > form.count(tok):
                    raise RequestError(
                        f"request begins or ends with part of the control token {tok!r} of the "
                        "member's tokenizer; with the prompt's text next to it, it would be "
                        "read as a chat marker. Remove it from the request."
                    )
        return request

    def prompt_ids(self, request: str, image_text: str | None) -> list[int]:
        """Token ids of the rendered prompt; ``image_text=None`` is the request-only pass."""
        self.check_request(request)
        if image_text is None:
            text = self.template.without_image.replace(REQUEST_SLOT, request)
        else:
            text = self.template.with_image.replace(IMAGE_SLOT, image_text).replace(
                REQUEST_SLOT, request
            )
        return self.encode_text(text)
