"""The claim grammar: things whose state decides safety, and the states that claim it.

A :class:`ClaimGrammar` is the optional ``grammar`` key of a claim lexicon. It composes a claim
from two words instead of listing every phrase: a *thing* (a noun of a :class:`StateGroup`,
"stove", "blade", "floor", "guard") and a *state* of that group ("off", "exposed", "wet",
"removed"), each state with the cue it claims for the group's things. The matching rule is in
:mod:`spotstop.guard.cues._lexicon` (step 7); this module holds the data and reads it from YAML.

Groups give a state its polarity per kind of thing: "off" is reassuring for a stove (group
``hazards``) and alarming for a guard (group ``safeguards``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spotstop.guard._errors import ConfigError
from spotstop.guard.validate import check_keys, check_mapping

__all__ = ["ClaimGrammar", "LexiconError", "StateGroup", "grammar_from_dict"]

MAX_LINK_WINDOW: Final[int] = 5
DEFAULT_LINK_WINDOW: Final[int] = 3


class LexiconError(ConfigError):
    """The claim lexicon is invalid; the message names the key (``alarming[3]``) and the fix."""


@dataclass(frozen=True)
class StateGroup:
    """One kind of thing and its states: ``nouns`` × (``reassuring`` ∪ ``alarming``)."""

    name: str
    """A label for messages and the digest (e.g. ``hazards``, ``safeguards``)."""
    nouns: tuple[str, ...]
    """The things ("stove", "blade guard"); each also matches its plural in -s / -es."""
    reassuring: tuple[str, ...]
    """States that make the thing safe ("off", "cold", "guarded" for a hazard)."""
    alarming: tuple[str, ...]
    """States that make the thing dangerous ("on", "hot", "exposed" for a hazard)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nouns": list(self.nouns),
            "reassuring": list(self.reassuring),
            "alarming": list(self.alarming),
        }


@dataclass(frozen=True)
class ClaimGrammar:
    """Groups of things and states, the link words that may stand between a thing and its
    state, and the states that only follow their thing. Validated by the lexicon that holds
    it (every key named on error)."""

    groups: tuple[StateGroup, ...]
    links: tuple[str, ...] = ()
    """Words that may stand between a thing and its state ("is", "now", "the")."""
    window: int = DEFAULT_LINK_WINDOW
    """How many link (or negation) words may stand between a thing and its state."""
    after_noun_only: tuple[str, ...] = ()
    """States that claim only after their thing ("stove off"), never before one ("on floor")."""

    def __repr__(self) -> str:
        groups = ", ".join(
            f"{g.name}: {len(g.nouns)} nouns × {len(g.reassuring)}+{len(g.alarming)} states"
            for g in self.groups
        )
        return f"ClaimGrammar({groups}; {len(self.links)} links, window {self.window})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "links": list(self.links),
            "window": self.window,
            "after_noun_only": list(self.after_noun_only),
        }


def _word_list(doc: Mapping[str, Any], key: str, where: str, source: str) -> tuple[Any, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise LexiconError(
            f"{where}.{key} must be a list of words (a YAML list); got {type(value).__name__} "
            f"{value!r}. Fix it in {source}."
        )
    return tuple(value)


def grammar_from_dict(doc: Any, *, source: str) -> ClaimGrammar:
    """A :class:`ClaimGrammar` from the lexicon's ``grammar`` mapping (keys and types checked;
    the words themselves are checked by the lexicon that holds the grammar)."""
    where = "grammar"
    check_mapping(doc, where=where, source=source, error=LexiconError)
    check_keys(
        doc,
        where=where,
        required=("groups",),
        optional=("links", "window", "after_noun_only"),
        source=source,
        error=LexiconError,
    )
    groups_doc = doc["groups"]
    if not isinstance(groups_doc, list) or not groups_doc:
        raise LexiconError(
            f"{where}.groups must be a non-empty list of groups (name, nouns, reassuring, "
            f"alarming); got {groups_doc!r}. Fix it in {source}."
        )
    groups = []
    for i, g in enumerate(groups_doc):
        here = f"{where}.groups[{i}]"
        check_mapping(g, where=here, source=source, error=LexiconError)
        check_keys(
            g,
            where=here,
            required=("name", "nouns"),
            optional=("reassuring", "alarming"),
            source=source,
            error=LexiconError,
        )
        if not isinstance(g["name"], str) or not g["name"].strip():
            raise LexiconError(f"{here}.name must be a non-empty string; got {g['name']!r}.")
        groups.append(
            StateGroup(
                name=g["name"],
                nouns=_word_list(g, "nouns", here, source),
                reassuring=_word_list(g, "reassuring", here, source),
                alarming=_word_list(g, "alarming", here, source),
            )
        )
    return ClaimGrammar(
        groups=tuple(groups),
        links=_word_list(doc, "links", where, source),
        window=doc.get("window", DEFAULT_LINK_WINDOW),
        after_noun_only=_word_list(doc, "after_noun_only", where, source),
    )


def check_grammar_shape(grammar: Any, source: str) -> ClaimGrammar:
    """A constructed grammar's types (lists of strings, a window in range), before the words
    are checked against the phrases."""
    if not isinstance(grammar, ClaimGrammar):
        raise LexiconError(
            f"grammar must be a ClaimGrammar or None; got {type(grammar).__name__}. "
            f"Fix it in {source}."
        )
    w = grammar.window
    if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w <= MAX_LINK_WINDOW:
        raise LexiconError(
            f"grammar.window must be an int in 0..{MAX_LINK_WINDOW} (how many link words may "
            f"stand between a thing and its state); got {w!r}. Set it in {source}."
        )
    names = [g.name for g in grammar.groups]
    if not names:
        raise LexiconError(f"grammar.groups must hold at least one group. Fix it in {source}.")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LexiconError(f"grammar.groups names {dupes} appear twice. Rename them in {source}.")
    for i, g in enumerate(grammar.groups):
        for key in ("nouns", "reassuring", "alarming"):
            value: Sequence[Any] = getattr(g, key)
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                raise LexiconError(
                    f"grammar.groups[{i}].{key} must be a list of strings; got "
                    f"{type(value).__name__} {value!r}. Fix it in {source}."
                )
        if not g.nouns or not (g.reassuring or g.alarming):
            raise LexiconError(
                f"grammar.groups[{i}] ({g.name}) needs at least one noun and one state "
                f"(reassuring or alarming), or it can claim nothing. Fix it in {source}."
            )
    return grammar
