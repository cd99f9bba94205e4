"""One guard call's moving parts: its clock, each scene's work, and what each stage returns.

Private to :mod:`spotstop.guard._guard` and :mod:`spotstop.guard._pipeline`. A call's
:class:`_Clock` starts at its entry, so the deadline bounds the whole call (the log writer reads
it as a :class:`~spotstop.guard._log_writer.Deadline`); :class:`_Work` is one scene on its way
through decode, score, decide and log; :class:`_Scored` is what the scoring thread returns (copied into the work only
when it came in time); :class:`_Outcome` is what fusion and the policy said of a scene;
:class:`_Active` is the policy in force with its live state, log row and text detector,
swapped whole on a reload.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from spotstop.guard._errors import GuardError
from spotstop.guard._image import DecodedImage
from spotstop.guard._log_schema import PolicyRow
from spotstop.guard._state import StateStore
from spotstop.guard._types import Scene, Variant
from spotstop.guard.cues._types import CueReading, TextDetector
from spotstop.guard.policies import Label, PolicyConfig
from spotstop.guard.validate import is_real


class _Unset:
    """Marks an argument that was not given (None is a meaningful value: no deadline)."""


_UNSET = _Unset()


#: the longest deadline a call may be given: far beyond any check, and short enough for every
#: timeout the call's stages wait with (``threading`` refuses waits past ``TIMEOUT_MAX``)
MAX_DEADLINE_S = 3600.0


def check_deadline(value: object, where: str = "deadline_s") -> float | None:
    """The one rule for a call's deadline: None (no deadline) or seconds in
    (0, :data:`MAX_DEADLINE_S`]; anything else (NaN, inf, a bool, text) is a
    :class:`GuardError` naming ``where``."""
    if value is None:
        return None
    if not is_real(value) or not (0 < value <= MAX_DEADLINE_S) or math.isnan(value):
        raise GuardError(
            f"{where} must be a number of seconds in (0, {MAX_DEADLINE_S:g}] or None (no "
            f"deadline); got {value!r}."
        )
    return float(value)


class _Clock:
    """The budget of one guard call, measured from its entry on the monotonic clock."""

    def __init__(self, deadline_s: float | None) -> None:
        self.deadline_s = deadline_s
        self.due = None if deadline_s is None else time.monotonic() + deadline_s

    def remaining(self) -> float | None:
        """Seconds left (≥ 0), or None without a deadline."""
        return None if self.due is None else max(0.0, self.due - time.monotonic())

    def expired(self) -> bool:
        return self.due is not None and time.monotonic() >= self.due

    def lock_timeout(self) -> float:
        """``threading.Lock.acquire`` timeout: -1 waits forever."""
        left = self.remaining()
        return -1 if left is None else left

    def reason(self, stage: str) -> str:
        return f"deadline exceeded: the call took longer than {self.deadline_s:g} s ({stage})"


@dataclass
class _Work:
    """One scene on its way through the guard (mutable, private)."""

    scene: Scene
    decision_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    image: DecodedImage | None = None
    scores: dict[str, float] = field(default_factory=dict)
    gray: dict[str, float] = field(default_factory=dict)
    text: dict[str, float] = field(default_factory=dict)
    fail: str | None = None
    latency: dict[str, float] = field(default_factory=dict)
    raw: bytes | None = None  # encoded image, kept only when images are stored
    reading: CueReading | None = None  # the text detector's reading, when the policy asks
    ran: set[str] = field(default_factory=set)  # members run on this scene

    def fail_with(self, reason: str) -> None:
        if self.fail is None:  # keep the first cause
            self.fail = reason


@dataclass
class _Scored:
    """What the scoring thread returns for one scene (private; copied into _Work in time)."""

    scores: dict[str, float] = field(default_factory=dict)
    gray: dict[str, float] = field(default_factory=dict)
    text: dict[str, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    fail: str | None = None
    ran: set[str] = field(default_factory=set)  # members asked to score this scene

    def fail_with(self, reason: str) -> None:
        if self.fail is None:
            self.fail = reason


@dataclass(frozen=True)
class _Active:
    """The policy in force, its live state and its log row; swapped whole on reload."""

    cfg: PolicyConfig
    store: StateStore
    row: PolicyRow
    variants: tuple[Variant, ...]
    detector: TextDetector | None = None
    detector_error: str | None = None


@dataclass(frozen=True)
class _Outcome:
    """What fusion and the policy said of one scene (before faults and the log)."""

    label: Label
    fused: float
    score: float
    threshold: float
    rule: str
    detail: str
    kind: str | None  # the kind whose threshold decided (None: no policy decided)

    @classmethod
    def none(cls) -> _Outcome:
        """No policy verdict (the scene failed before it, or the policy failed)."""
        nan = float("nan")
        return cls("UNSAFE", nan, nan, nan, "", "", None)


def _read_text(
    detector: TextDetector, images: list[DecodedImage | None]
) -> list[tuple[CueReading | str, float]]:
    """The detector's reading of each image (or why it failed) and its time in ms."""
    out: list[tuple[CueReading | str, float]] = []
    for img in images:
        t = time.perf_counter()
        try:
            if img is None:
                raise GuardError("the scene has no image")
            got: CueReading | str = detector.detect(img)
            if not isinstance(got, CueReading):  # (None read as "no flags": a SAFE)
                raise GuardError(f"it returned {type(got).__name__}, not a CueReading")
            dict(got.flags)  # its flags are read here, where a fault fails only this scene
        except Exception as e:  # a scene whose text cannot be read fails closed
            got = _reason("text detector", e)
        out.append((got, (time.perf_counter() - t) * 1e3))
    return out


def _reason(stage: str, e: BaseException) -> str:
    return f"{stage}: {type(e).__name__}: {e}"


def _storable(text: str) -> str:
    """``text`` as the log can store it: a lone surrogate (not UTF-8; a request holding one
    fails closed in input checking) is written as its backslash escape, so that one bad
    string never keeps its row, and every row after it, out of the log."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
