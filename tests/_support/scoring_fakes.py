"""Scorers without a model, for the scoring engines' tests (light to import: a Ray worker
imports this module to build them)."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spotstop.guard import MemberScore, Scene
from spotstop.guard._errors import RequestError
from spotstop.guard._image import DecodedImage
from spotstop.guard._member import MemberInfo


class RequestNumber:
    """s = the number at the end of the request ("scene 7" → 7.0); NaN for a request that
    ends in "fail" (a member that fails on that scene)."""

    prompt_hash = "numbers-hash"

    def __init__(self, name: str = "numbers") -> None:
        self.name = name

    @property
    def info(self) -> MemberInfo:
        """What it is, as a member says it: a test member of no recorded kind."""
        return MemberInfo(self.name, "fake", "numbers", None, (1, 1), 0, self.prompt_hash,
                          "fake", test_pair=True)  # fmt: skip

    def check_request(self, request: str) -> None:
        """Refuses a request ending in "refuse", as a member refuses one too long for it."""
        if request.rsplit(" ", 1)[-1] == "refuse":
            raise RequestError(f"request {request!r} is refused by member {self.name}.")

    def score(
        self, scenes: Sequence[Scene], variant: str = "scene", *, strict: bool = True
    ) -> list[MemberScore]:
        out = []
        for s in scenes:
            last = s.request.rsplit(" ", 1)[-1]
            v = math.nan if last == "fail" else float(last) + (0.5 if variant == "text" else 0.0)
            out.append(MemberScore(self.name, variant, v, self.prompt_hash, 0, True))  # type: ignore[arg-type]
        return out


class DiesOnCrash(RequestNumber):
    """:class:`RequestNumber`, except that the worker process dies (``os._exit``: the OOM
    killer, a segfault) on a request ending in "crash", every time it is tried."""

    def score(
        self, scenes: Sequence[Scene], variant: str = "scene", *, strict: bool = True
    ) -> list[MemberScore]:
        if any(s.request.rsplit(" ", 1)[-1] == "crash" for s in scenes):
            os._exit(1)
        return super().score(scenes, variant, strict=strict)


class PixelHash:
    """s = a number drawn from the sha256 of the scene's image bytes: equal scores mean equal
    pixels (an edit rendered in a Ray worker as on the driver)."""

    name = "pixels"
    prompt_hash = "pixels-hash"

    def score(
        self, scenes: Sequence[Scene], variant: str = "scene", *, strict: bool = True
    ) -> list[MemberScore]:
        out = []
        for s in scenes:
            img = s.image
            digest = (
                img.sha256
                if isinstance(img, DecodedImage)
                else hashlib.sha256(bytes(img)).hexdigest()  # type: ignore[arg-type]
            )
            v = int(digest[:8], 16) / 2**32
            out.append(MemberScore(self.name, "scene", v, self.prompt_hash, 0, True))
        return out


def load_numbers(source: str | os.PathLike[str], **settings: Any) -> RequestNumber:
    """Stands in for :func:`spotstop.guard.load_member`: a :class:`RequestNumber` named after
    the member folder, as ``load_member`` names a member."""
    return RequestNumber(Path(source).name)
