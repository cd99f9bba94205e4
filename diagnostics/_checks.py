"""The card checks, by name, with lazy imports: the one list the card renders.

Each entry names a :class:`~spotstop.diagnostics._check_base.CardCheck` in its own module.
The card runs every registered check in this order (they draw from the card's generator in
this order) and writes each result under ``checks.<name>`` in ``card.json`` and as a section
of ``card.md`` and ``card.html``.  Adding a check is its module, one entry here and its tests
(``tests/diagnostics/test_card.py`` fails for a registered check the card does not render).
"""

from __future__ import annotations

import importlib

from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult
from spotstop.diagnostics._errors import DataError

__all__ = ["CARD_CHECKS", "card_check", "run_checks"]

#: name → (module, class)
CARD_CHECKS: dict[str, tuple[str, str]] = {
    "label_swap_null": ("spotstop.diagnostics._null", "LabelSwapNullCheck"),
    "prevalence": ("spotstop.diagnostics._prevalence", "PrevalenceCardCheck"),
    "situation_share": ("spotstop.diagnostics._situation", "SituationShareCheck"),
    "scene_blind": ("spotstop.diagnostics._scene_blind", "SceneBlindCheck"),
    "conformal_audit": ("spotstop.diagnostics._conformal_audit", "ConformalAuditCheck"),
    "text_in_scene": ("spotstop.diagnostics._text_in_scene", "TextInSceneCheck"),
    "cascade": ("spotstop.diagnostics._cascade_check", "CascadeCheck"),
    "fleet": ("spotstop.diagnostics._fleet", "FleetCheck"),
    "periods": ("spotstop.diagnostics._periods", "PeriodsCheck"),
}


def card_check(name: str) -> type[CardCheck]:
    """The check class registered as ``name`` (its module is imported now)."""
    try:
        module, cls_name = CARD_CHECKS[name]
    except KeyError:
        raise DataError(
            f"card check must be one of {', '.join(CARD_CHECKS)}; got {name!r}."
        ) from None
    cls = getattr(importlib.import_module(module), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, CardCheck) and cls.name == name):
        raise DataError(f"registry entry {name!r} -> {module}.{cls_name} is not a {name!r} check.")
    return cls


def run_checks(ctx: CardContext) -> dict[str, tuple[type[CardCheck], CheckResult]]:
    """Run every registered check on ``ctx``, in registry order."""
    out = {}
    for name in CARD_CHECKS:
        cls = card_check(name)
        out[name] = (cls, cls().run(ctx))
    return out
