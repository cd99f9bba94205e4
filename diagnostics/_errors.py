"""Errors and warnings of :mod:`diagnostics`.

Every error derives from :class:`spotstop.guard._errors.GuardError` (the project's base) and from the
builtin a caller would expect, so ``except ValueError`` keeps working.  Degenerate data is
never an error and never a silent 0: it is an :class:`UndefinedMetricWarning` and a NaN.
"""

from __future__ import annotations

from spotstop.guard import GuardError

__all__ = ["DataError", "DiagnosticsError", "UndefinedMetricWarning"]


class DiagnosticsError(GuardError):
    """Base class of the errors raised by :mod:`diagnostics`."""


class DataError(DiagnosticsError, ValueError):
    """Input data is invalid; the message names the row and column (or parameter) and the fix."""


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined on this data (one class, no contrasts, ...); its value is NaN."""
