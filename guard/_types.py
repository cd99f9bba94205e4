"""Public value types: a scene to judge and a member's score of it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from spotstop.guard._image import DecodedImage

__all__ = ["BUDGET_HEADER", "DUE_HEADER", "ImageSource", "MemberScore", "Scene", "Variant"]

#: Where a scene's image comes from: encoded bytes, a file path, or an already decoded image.
ImageSource = bytes | bytearray | memoryview | str | os.PathLike[str] | DecodedImage

#: Which input a member scored: the camera image, a content-free gray image, or no image.
Variant = Literal["scene", "gray", "text"]
VARIANTS: tuple[Variant, ...] = ("scene", "gray", "text")


#: The HTTP request header in which a caller of the sidecar says how many seconds it will wait
#: for this answer (:class:`~spotstop.guard.client.GuardClient` sends what is left of its
#: ``timeout_s``). The request's deadline is then the earlier of the sidecar's own
#: (``deadline_s`` from the body's arrival) and the caller's (from the request's arrival), so
#: that the sidecar does not log SAFE for an answer its caller has already taken as UNSAFE.
BUDGET_HEADER = "X-Spotstop-Budget-S"
#: The HTTP request header in which a caller says when its budget ends, as Unix time in
#: seconds (its own clock). The budget header counts from the request's arrival, so a delay
#: before the sidecar has the headers (a connect retried, a full accept queue) is not counted
#: by it; this one is, on a sidecar whose clock agrees (the same machine: the default). The
#: request's deadline is the earliest of the three; a clock that runs ahead only cuts sooner.
DUE_HEADER = "X-Spotstop-Due-Unix"


@dataclass(frozen=True)
class Scene:
    """One thing to judge: the camera image and the request the robot was given.

    ``situation_id`` groups scenes of the same place/task for situation recentering.
    """

    image: ImageSource | None
    request: str
    situation_id: str | None = None

    def __repr__(self) -> str:
        img = self.image
        # (total: a scene of the wrong types is shown, for the guard to fail it closed by name)
        if isinstance(img, bytes | bytearray | memoryview):
            shown = f"<{memoryview(img).nbytes} bytes>"
        elif isinstance(img, DecodedImage):
            shown = f"<{img.format} {img.width}x{img.height}>"
        elif img is None or isinstance(img, str | os.PathLike):
            shown = repr(None if img is None else os.fspath(img))
        else:  # a numpy array, a PIL image: not an ImageSource
            shown = f"<{type(img).__name__}>"
        req = self.request
        if isinstance(req, str) and len(req) > 60:
            req = req[:57] + "..."
        sit = f", situation_id={self.situation_id!r}" if self.situation_id is not None else ""
        return f"Scene(image={shown}, request={req!r}{sit})"


@dataclass(frozen=True)
class MemberScore:
    """One member's teacher-forced score of one scene.

    ``score = log p(UNSAFE | x, q) − log p(SAFE | x, q)``; ``score > 0`` is the member's direct
    answer UNSAFE. ``prompt_hash`` identifies the prompt, answers and chat template that made it.
    """

    member: str
    variant: Variant
    score: float
    prompt_hash: str
    n_prompt_tokens: int
    test_pair: bool = False

    def __repr__(self) -> str:
        tp = ", TEST PAIR" if self.test_pair else ""
        return (
            f"MemberScore({self.member}, {self.variant}, score={self.score:+.4f}, "
            f"prompt_hash={self.prompt_hash}, tokens={self.n_prompt_tokens}{tp})"
        )
