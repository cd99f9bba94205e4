"""The policy kinds, by name, with lazy imports: the one list everything else reads.

``spotstop recalibrate --policy``, ``spotstop policy init --kind``, the loader of
``policy.yaml`` and the card all take their choices from here, so adding a kind is its module
plus one entry below (and its tests: ``tests/guard/policies/test_policies.py`` fails for a
registered kind without a hand-computed example).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from spotstop.guard.policies._base import LoadContext, Policy, PolicyError
from spotstop.guard.validate import check_keys, check_mapping

__all__ = ["POLICY_KINDS", "policy_class", "policy_from_dict", "policy_kinds"]

#: kind → (module, class)
POLICY_KINDS: dict[str, tuple[str, str]] = {
    "direct": ("spotstop.guard.policies._direct", "DirectPolicy"),
    "frozen": ("spotstop.guard.policies._frozen", "FrozenPolicy"),
    "conformal": ("spotstop.guard.policies._conformal", "ConformalPolicy"),
    "batch": ("spotstop.guard.policies._batch", "BatchPolicy"),
    "batch_frozen_iqr": ("spotstop.guard.policies._batch_frozen_iqr", "BatchFrozenIqrPolicy"),
    "situation": ("spotstop.guard.policies._situation", "SituationPolicy"),
    "cascade": ("spotstop.guard.policies._cascade", "CascadePolicy"),
}


def policy_class(kind: str) -> type[Policy]:
    """The class registered as ``kind`` (its module is imported now)."""
    try:
        module, name = POLICY_KINDS[kind]
    except KeyError:
        raise PolicyError(
            f"policy kind must be one of {', '.join(POLICY_KINDS)}; got {kind!r}."
        ) from None
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Policy) and cls.kind == kind):
        raise PolicyError(f"registry entry {kind!r} -> {module}.{name} is not a {kind!r} Policy.")
    return cls


def policy_kinds(
    *, label_free: bool | None = None, single_scene: bool | None = None
) -> tuple[str, ...]:
    """Registered kinds, optionally only those fitted without labels / labelling one scene."""
    out = []
    for kind in POLICY_KINDS:
        cls = policy_class(kind)
        if label_free is not None and cls.label_free != label_free:
            continue
        if single_scene is not None and cls.single_scene != single_scene:
            continue
        out.append(kind)
    return tuple(out)


def policy_from_dict(
    d: Any,
    *,
    where: str,
    source: str,
    members: tuple[str, ...],
    single_scene_only: bool = False,
) -> Policy:
    """Read one ``policy:`` (or nested ``fallback:``) section, validating every key."""
    check_mapping(d, where=where, source=source, error=PolicyError)
    kinds = policy_kinds(single_scene=True) if single_scene_only else tuple(POLICY_KINDS)
    kind = d.get("kind")
    if kind not in kinds:
        hint = difflib.get_close_matches(str(kind), kinds, n=1, cutoff=0.6)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        role = "a fallback" if single_scene_only else "a policy"
        raise PolicyError(
            f"{where}.kind must name {role} kind, one of {', '.join(kinds)}; got {kind!r}."
            f"{suggestion} Set it in {source}."
        )
    cls = policy_class(kind)
    required, optional = cls.keys()
    check_keys(
        d,
        where=where,
        required=("kind", *required),
        optional=optional,
        source=source,
        error=PolicyError,
    )

    def fallback(sub: Any, sub_where: str) -> Policy:
        return policy_from_dict(
            sub, where=sub_where, source=source, members=members, single_scene_only=True
        )

    ctx = LoadContext(source=source, where=where, members=members, parse_fallback=fallback)
    try:
        return cls.from_dict(d, ctx)
    except PolicyError:
        raise
    except (TypeError, ValueError) as e:  # a constructor's own check, re-raised with the path
        raise PolicyError(f"{where}: {e} Fix it in {source}.") from e
