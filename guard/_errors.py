"""The exception hierarchy of spotstop.

Every error that spotstop raises on purpose derives from :class:`GuardError`, and each one
also derives from the builtin exception a caller would expect (``ValueError`` for bad
values, ``FileNotFoundError`` for missing parts), so ``except ValueError`` keeps working.

Messages name what was wrong, what was allowed, what came, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "GuardError",
    "ImageError",
    "MemberLoadError",
    "RequestError",
    "ScoringError",
]


class GuardError(Exception):
    """Base class of every error spotstop raises on purpose."""


class ConfigError(GuardError, ValueError):
    """A configuration file or value is invalid; the message names the key."""


class ImageError(GuardError, ValueError):
    """An image could not be decoded or was refused (bomb, zero size, truncated, format)."""


class MemberLoadError(GuardError, OSError):
    """A member model could not be loaded from the given folder or hub id."""


class BackendUnavailableError(GuardError, ImportError):
    """A scoring backend needs a library that is not installed; the message says what to install."""


class ScoringError(GuardError, RuntimeError):
    """Scoring failed: a forward pass raised, or produced a non-finite score."""


class RequestError(GuardError, ValueError):
    """A scene's request text was refused (empty, too long, or holding control tokens)."""
