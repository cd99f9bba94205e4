"""The claim lexicon: which text asserts safety, which asserts danger.

A lexicon lists phrases per cue (``reassuring``, ``alarming``), ``neutral`` phrases that only
shield what they contain ("fail safe", "safe working load"), and negation words. The default
ships as ``lexicon.yaml`` beside this module; :func:`load_lexicon` reads another.

The rule, in order (every step is case-, accent- and spacing-tolerant):

1. **Normalise.** Each character is NFKD-decomposed, combining marks dropped and casefolded
   (``"É"`` → ``"e"``); a Cyrillic or Greek letter drawn like a Latin one is read as that
   letter (``"SАFE"`` with a Cyrillic ``А`` → ``"safe"``). Letters and digits make words; apostrophes are dropped inside words
   (``"don't"`` → ``"dont"``); every other character separates words. The clause breaks
   ``. , ; : ! ? | / \\ •`` and the en/em dashes ``– — ―`` also end a clause (hyphens ``-`` do
   not: "non-toxic" stays one clause).
2. **Spaced letters.** A run of two or more one-character words in one clause is one word:
   ``"A L L C L E A R"`` → ``"allclear"``, ``"U N S A F E"`` → ``"unsafe"``.
3. **Glued words.** A word that is not itself in the vocabulary (every phrase with its spaces
   removed, every word of every phrase, every negation word) is split into vocabulary pieces
   when it splits into them exactly, with the fewest pieces: ``"ALLCLEAR"`` → ``allclear``,
   ``"DANGERHIGHVOLTAGE"`` → ``danger | highvoltage``, ``"NOTSAFE"`` → ``notsafe`` (the
   phrase ``not safe``; without it, ``not | safe``). A word that does not split exactly stays
   whole, so a phrase never
   matches inside a longer word: "SAFE" is not found in "UNSAFE", "SAFETY" or "FAILSAFE", and
   "HOT" not in "SHOT" or "HOTEL".
   **Digits read as letters.** A word that is still neither, and holds digits and at least as
   many letters, is read again with the digits an OCR engine gives for the letter they look
   like (``0`` o, ``1`` i or l, ``3`` e, ``4`` a, ``5`` s, ``7`` t, ``8`` b): ``"0K"`` →
   ``ok``, ``"5AFE"`` → ``safe``, ``"H0T"`` → ``hot``; the first reading that is a
   vocabulary word or splits into them is taken. ``"H07"`` (a room) and ``"100"`` stay as
   they are.
4. **Match.** A phrase matches where the letters of one or more consecutive pieces, spaces and
   punctuation removed, equal the phrase's letters: "all clear", "all  clear", "ALL-CLEAR",
   "Allclear" and "A L L C L E A R" all match ``all clear``; "Checked – OK to use" matches
   ``checked ok to use``. A phrase may span punctuation and clause breaks.
5. **Longest wins.** A match lying inside a longer match (of any cue, neutral included) is
   dropped: ``no hazard`` (reassuring) hides ``hazard``, ``not safe`` (alarming) hides
   ``safe``, ``fail safe`` (neutral) hides ``safe``.
6. **Negation.** A negation word among the ``negation.window`` pieces right before a match,
   in the same clause and not itself part of a match, turns a reassuring claim into an
   alarming one and vice versa ("not safe", "NOT 100% SAFE" → alarming; "no danger",
   "non-toxic" → reassuring). A negated neutral phrase stays neutral.

7. **Grammar** (optional ``grammar`` key, :class:`ClaimGrammar`). Nouns (things) and state
   words of each group are matched like phrases (steps 3–5; a noun also matches its plural in
   -s/-es). A state claims only about a thing: the nearest noun before it, with at most
   ``grammar.window`` link words (``grammar.links``) or negation words between, in the same
   clause ("the stove is now off", "blade guard removed": the last noun of a compound is the
   thing), else a noun right after it ("wet floor", "bare wires"; not for the states in
   ``grammar.after_noun_only``: "on floor" claims nothing). The claim's cue is the state's cue
   in the thing's group, so "off" is reassuring for a stove and alarming for a guard. Negation
   (step 6) then applies to the state ("fan is not running" → reassuring). A state without a
   thing, and a thing without a state, claim nothing ("push to open", "power tools").

Each kept match of a cue flags that cue. The lexicon does not judge whether the claim is
true, only that the text makes it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from spotstop.guard.cues._grammar import (
    ClaimGrammar,
    LexiconError,
    StateGroup,
    check_grammar_shape,
    grammar_from_dict,
)
from spotstop.guard.cues._types import CUES, Cue, CueMatch
from spotstop.guard.validate import check_keys, check_mapping, load_yaml

__all__ = [
    "LEXICON_VERSION",
    "ClaimGrammar",
    "ClaimLexicon",
    "LexiconError",
    "StateGroup",
    "default_lexicon",
    "lexicon_from_dict",
    "load_lexicon",
    "normalize_text",
]

LEXICON_VERSION: Final[int] = 1
"""The lexicon file format this module reads (the optional ``version`` key)."""

DEFAULT_LEXICON_FILE: Final[str] = "lexicon.yaml"

_APOSTROPHES: Final[frozenset[str]] = frozenset("'’‘ʼ`´")
_CLAUSE_BREAKS: Final[frozenset[str]] = frozenset(".,;:!?|/\\•–—―")
_MAX_WINDOW: Final[int] = 5
_MAX_GLUED: Final[int] = 64  # longer words are not split (the split is quadratic in length)
_TOP_KEYS: Final[tuple[str, ...]] = ("reassuring", "alarming", "negation")
_OPTIONAL_KEYS: Final[tuple[str, ...]] = ("version", "neutral", "grammar")
_LISTS: Final[tuple[str, ...]] = ("reassuring", "alarming", "neutral")
_LIST_CUE: Final[dict[str, Cue | None]] = {
    "reassuring": "reassuring",
    "alarming": "alarming",
    "neutral": None,
}


# --------------------------------------------------------------------------- normalisation


@dataclass(frozen=True)
class _Piece:
    """A normalised word (or a piece of a glued word) and where it sits in the original text."""

    text: str
    start: int  # offset of its first character in the original text
    end: int  # offset just past its last character
    clause: int


#: Cyrillic and Greek letters drawn like a Latin letter (in upper or lower case), read as that
#: letter: a sign, or an OCR engine that knows those scripts, can give "SАFE" with a Cyrillic А
_LOOKALIKE_LETTERS: Final[dict[str, str]] = {
    # Cyrillic
    "А": "a", "а": "a", "В": "b", "в": "b", "С": "c", "с": "c", "Ԁ": "d", "ԁ": "d",
    "Е": "e", "е": "e", "Һ": "h", "һ": "h", "Н": "h", "н": "h", "І": "i", "і": "i",
    "Ј": "j", "ј": "j", "К": "k", "к": "k", "М": "m", "м": "m", "О": "o", "о": "o",
    "Р": "p", "р": "p", "Ԛ": "q", "ԛ": "q", "Ѕ": "s", "ѕ": "s", "Т": "t", "т": "t",
    "Ԝ": "w", "ԝ": "w", "Х": "x", "х": "x", "У": "y", "у": "y", "Ү": "y", "ү": "y",
    # Greek
    "Α": "a", "α": "a", "Β": "b", "Ϲ": "c", "ϲ": "c", "Ε": "e", "Η": "h", "Ι": "i",
    "ι": "i", "Κ": "k", "κ": "k", "Μ": "m", "Ν": "n", "ν": "v", "Ο": "o", "ο": "o",
    "Ρ": "p", "ρ": "p", "Τ": "t", "Υ": "y", "υ": "u", "Χ": "x", "χ": "x", "Ζ": "z",
}  # fmt: skip

#: the letters an OCR engine may read a digit for (step 3's second reading), in the order tried
_DIGIT_LETTERS: Final[dict[str, str]] = {
    "0": "o", "1": "il", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b",
}  # fmt: skip
_MAX_DIGIT_READINGS: Final[int] = 16  # a word with more readings than this is read as written


def _fold(ch: str) -> str:
    decomposed = unicodedata.normalize("NFKD", ch)
    return "".join(
        _LOOKALIKE_LETTERS.get(c, c) for c in decomposed if not unicodedata.combining(c)
    ).casefold()


def _digit_readings(word: str) -> list[str]:
    """Step 3's second reading: ``word`` with each digit read as a letter it looks like, every
    combination in order (none when it holds no digit, fewer letters than digits, or more
    than :data:`_MAX_DIGIT_READINGS` readings)."""
    digits = sum(c.isdigit() for c in word)
    letters = sum(c.isalpha() for c in word)
    if not digits or letters < digits:
        return []
    options = [_DIGIT_LETTERS.get(c, c) if c.isdigit() else c for c in word]
    count = 1
    for o in options:
        count *= len(o)
    if count > _MAX_DIGIT_READINGS:
        return []
    return ["".join(combo) for combo in itertools.product(*options)]


def _words(text: str) -> list[_Piece]:
    """Steps 1 and 2 of the rule: normalised words with offsets and clause numbers."""
    words: list[_Piece] = []
    chars: list[str] = []
    start = end = clause = 0

    def flush() -> None:
        if chars:
            words.append(_Piece("".join(chars), start, end, clause))
            chars.clear()

    for i, ch in enumerate(text):
        if ch in _APOSTROPHES:
            continue
        folded = [c for c in _fold(ch) if c.isalnum()]
        if folded:
            if not chars:
                start = i
            chars.extend(folded)
            end = i + 1
            continue
        flush()
        if ch in _CLAUSE_BREAKS:
            clause += 1
    flush()
    return _merge_spaced_letters(words)


def _merge_spaced_letters(words: list[_Piece]) -> list[_Piece]:
    out: list[_Piece] = []
    i = 0
    while i < len(words):
        j = i
        while (
            j + 1 < len(words)
            and len(words[j].text) == 1
            and len(words[j + 1].text) == 1
            and words[j + 1].clause == words[i].clause
        ):
            j += 1
        if j > i:
            run = words[i : j + 1]
            out.append(
                _Piece("".join(w.text for w in run), run[0].start, run[-1].end, run[0].clause)
            )
        else:
            out.append(words[i])
        i = j + 1
    return out


def normalize_text(text: str) -> str:
    """The normalised words of ``text`` (steps 1–2 of the rule), joined by single spaces.

    >>> normalize_text("Checked – OK to use!")
    'checked ok to use'
    >>> normalize_text("A L L  C L E A R, don't")
    'allclear dont'
    """
    return " ".join(w.text for w in _words(text))


def _compact(phrase: str) -> str:
    return "".join(w.text for w in _words(phrase))


def _split_glued(word: str, vocab: frozenset[str]) -> list[str] | None:
    """Fewest vocabulary pieces that make up ``word`` exactly, or None (step 3)."""
    n = len(word)
    if n > _MAX_GLUED:
        return None
    best: list[list[str] | None] = [None] * (n + 1)
    best[0] = []
    for end in range(1, n + 1):
        for start in range(end):  # the longest last piece first among equal counts
            head = best[start]
            piece = word[start:end]
            if head is None or piece not in vocab:
                continue
            cand = [*head, piece]
            current = best[end]
            if current is None or len(cand) < len(current):
                best[end] = cand
    return best[n]


# --------------------------------------------------------------------------- the lexicon


@dataclass(frozen=True)
class _Entry:
    cue: Cue | None  # None: neutral, a noun or a state (a state's cue depends on its thing)
    phrase: str
    role: str = "phrase"  # "phrase", "noun" (a thing of group `group`) or "state"
    group: int = -1
    states: tuple[tuple[int, Cue, str], ...] = ()  # a state's (group, cue, word as written)


@dataclass(frozen=True)
class _Span:
    first: int  # index of its first piece
    last: int  # index of its last piece (inclusive)
    entry: _Entry


@dataclass(frozen=True)
class ClaimLexicon:
    """Phrases per cue, neutral phrases and negation words; :meth:`find` applies the rule.

    Validated on construction: ``reassuring`` and ``alarming`` each hold a phrase, every
    phrase must keep at least one letter or digit after
    normalisation, no phrase may appear twice (in one list or across lists, compared after
    normalisation), negation words must be single words, ``negation_window`` an int in 0..5.
    Immutable and safe to share between threads.
    """

    reassuring: tuple[str, ...]
    """Phrases that assert safety."""
    alarming: tuple[str, ...]
    """Phrases that assert danger."""
    negation_words: tuple[str, ...]
    """Words that flip the cue of a phrase right after them ("not", "no", "un", ...)."""
    negation_window: int = 2
    """How many pieces before a phrase are searched for a negation word (0: no negation)."""
    neutral: tuple[str, ...] = ()
    """Phrases that flag nothing and hide the claims inside them ("fail safe")."""
    grammar: ClaimGrammar | None = None
    """Things and their states, composed into claims (step 7); None: phrases only."""
    source: str = field(default="<constructed>", compare=False)
    """Where the lexicon came from (a file path, or ``<default>``), for messages."""
    _phrases: dict[str, _Entry] = field(init=False, repr=False, compare=False)
    _vocab: frozenset[str] = field(init=False, repr=False, compare=False)
    _negators: frozenset[str] = field(init=False, repr=False, compare=False)
    _longest: int = field(init=False, repr=False, compare=False)
    _links: frozenset[str] = field(init=False, repr=False, compare=False)
    _noun_only_after: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("reassuring", "alarming", "neutral", "negation_words"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                raise LexiconError(
                    f"{name} must be a list or tuple of strings; got {type(value).__name__} "
                    f"{value!r}. Wrap a single phrase in a list. Fix it in {self.source}."
                )
            object.__setattr__(self, name, tuple(value))
        phrases, where = _check_phrases(self)
        negators = _check_negation(self)
        collide = sorted(set(phrases) & negators)
        if collide:
            raise LexiconError(
                f"negation.words {collide} are also phrases ({where[collide[0]]}); a word "
                f"cannot both make a claim and negate one. Remove one of them in {self.source}."
            )
        links, after_only = _check_grammar(self, phrases, where, negators)
        vocab = set(phrases) | negators
        for entry in phrases.values():
            vocab.update(w.text for w in _words(entry.phrase))
        object.__setattr__(self, "_links", links)
        object.__setattr__(self, "_noun_only_after", after_only)
        object.__setattr__(self, "_phrases", phrases)
        object.__setattr__(self, "_vocab", frozenset(vocab))
        object.__setattr__(self, "_negators", negators)
        object.__setattr__(self, "_longest", max(len(p) for p in phrases))

    # -- identity -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """``lexicon``: the claim reader's name (:class:`~spotstop.guard.cues.ClaimReader`)."""
        return "lexicon"

    @functools.cached_property
    def sha256(self) -> str:
        """Digest of what the lexicon matches: normalised phrases per list, negation words and
        window (sorted; spelling variants that normalise alike give the same digest)."""
        doc = {
            "version": LEXICON_VERSION,
            **{k: sorted(normalize_text(p) for p in getattr(self, k)) for k in _LISTS},
            "negation": {
                "words": sorted(normalize_text(w) for w in self.negation_words),
                "window": self.negation_window,
            },
        }
        if self.grammar is not None:  # absent from the digest of a phrases-only lexicon
            g = self.grammar
            doc["grammar"] = {
                "groups": [
                    {
                        "name": grp.name,
                        **{
                            k: sorted(normalize_text(w) for w in getattr(grp, k))
                            for k in ("nouns", "reassuring", "alarming")
                        },
                    }
                    for grp in g.groups
                ],
                "links": sorted(normalize_text(w) for w in g.links),
                "window": g.window,
                "after_noun_only": sorted(normalize_text(w) for w in g.after_noun_only),
            }
        blob = json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    def __repr__(self) -> str:
        return (
            f"ClaimLexicon({len(self.reassuring)} reassuring, {len(self.alarming)} alarming, "
            f"{len(self.neutral)} neutral phrases; {len(self.negation_words)} negation words, "
            f"window {self.negation_window}; {self.grammar!r}; sha256={self.sha256[:12]}…; "
            f"from {self.source})"
        )

    # -- matching -----------------------------------------------------------------------------
    def find(self, text: str) -> tuple[CueMatch, ...]:
        """The claims in ``text``, in text order (the module docstring gives the rule)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}.")
        pieces = list(self._pieces(text))
        spans = _outermost(list(self._spans(pieces)))
        covered = {k for s in spans for k in range(s.first, s.last + 1)}
        nouns = [s for s in spans if s.entry.role == "noun"]
        noun_end = {s.last: s for s in nouns}
        noun_start = {s.first: s for s in nouns}
        out: list[CueMatch] = []
        for span in spans:
            if span.entry.role == "state":
                claim = self._compose(pieces, span, noun_end, noun_start, covered)
                if claim is None:
                    continue
                cue, phrase, lo, hi = claim
            elif span.entry.cue is None:
                continue  # neutral phrase or a noun: no claim of its own
            else:
                cue, phrase, lo, hi = span.entry.cue, span.entry.phrase, span.first, span.last
            negator = self._negator(pieces, span.first, covered)
            if negator is not None:
                cue = "alarming" if cue == "reassuring" else "reassuring"
            first = lo if negator is None else min(lo, negator)
            found = text[pieces[first].start : pieces[hi].end]
            out.append(CueMatch(cue=cue, phrase=phrase, found=found, negated=negator is not None))
        return tuple(out)

    def flags(self, text: str) -> dict[Cue, bool]:
        """``{cue: flagged}`` for every cue in :data:`CUES`, from :meth:`find`."""
        found = {m.cue for m in self.find(text)}
        return {cue: cue in found for cue in CUES}

    def _pieces(self, text: str) -> Iterator[_Piece]:
        for word in _words(text):
            parts = self._parts(word.text)
            if not parts:
                yield word
                continue
            offset = 0
            for part in parts:  # map each piece back to its characters in the original text
                first = _char_offset(text, word, offset)
                offset += len(part)
                yield _Piece(part, first, _char_offset(text, word, offset - 1) + 1, word.clause)

    def _parts(self, word: str) -> list[str] | None:
        """Step 3: the vocabulary pieces ``word`` is read as (None: read as written)."""
        if word in self._vocab:
            return None
        parts = _split_glued(word, self._vocab)
        if parts:
            return parts
        for reading in _digit_readings(word):  # one letter per digit: offsets stay aligned
            if reading in self._vocab:
                return [reading]
            parts = _split_glued(reading, self._vocab)
            if parts:
                return parts
        return None

    def _spans(self, pieces: Sequence[_Piece]) -> Iterator[_Span]:
        for first in range(len(pieces)):
            letters = ""
            for last in range(first, len(pieces)):
                letters += pieces[last].text
                if len(letters) > self._longest:
                    break
                entry = self._phrases.get(letters)
                if entry is not None:
                    yield _Span(first, last, entry)

    def _compose(
        self,
        pieces: Sequence[_Piece],
        state: _Span,
        noun_end: dict[int, _Span],
        noun_start: dict[int, _Span],
        covered: set[int],
    ) -> tuple[Cue, str, int, int] | None:
        """Step 7: the claim a state makes about its thing, as (cue, phrase, first, last), or
        None when no thing of a group that has this state stands beside it."""
        grammar = self.grammar
        if grammar is None:  # pragma: no cover - states exist only with a grammar
            return None
        clause = pieces[state.first].clause
        k, skipped, noun, before = state.first - 1, 0, None, True
        while k >= 0 and pieces[k].clause == clause:
            if k in noun_end:
                noun = noun_end[k]
                break
            text = pieces[k].text
            if k in covered or skipped >= grammar.window:
                break
            if text not in self._links and text not in self._negators:
                break
            skipped += 1
            k -= 1
        after = state.last + 1
        if (
            noun is None
            and _letters(state.entry.phrase) not in self._noun_only_after
            and after in noun_start
            and pieces[after].clause == clause
        ):
            noun, before = noun_start[after], False
        if noun is None:
            return None
        for group, cue, word in state.entry.states:
            if group == noun.entry.group:
                if before:
                    return cue, f"{noun.entry.phrase} {word}", noun.first, state.last
                return cue, f"{word} {noun.entry.phrase}", state.first, noun.last
        return None

    def _negator(self, pieces: Sequence[_Piece], first: int, covered: set[int]) -> int | None:
        """Index of the negation word that negates the match starting at ``first`` (step 6)."""
        clause = pieces[first].clause
        for k in range(first - 1, max(first - self.negation_window, 0) - 1, -1):
            if pieces[k].clause != clause:
                return None
            if k not in covered and pieces[k].text in self._negators:
                return k
        return None


def _char_offset(text: str, word: _Piece, index: int) -> int:
    """Offset in ``text`` of the ``index``-th normalised character of ``word``."""
    seen = 0
    for i in range(word.start, word.end):
        if text[i] in _APOSTROPHES:
            continue
        seen += sum(1 for c in _fold(text[i]) if c.isalnum())
        if seen > index:
            return i
    return word.end - 1


def _outermost(spans: list[_Span]) -> list[_Span]:
    """Step 5: drop every span that lies inside a longer one; keep text order."""
    kept = [
        s
        for s in spans
        if not any(
            o.first <= s.first and s.last <= o.last and (o.first, o.last) != (s.first, s.last)
            for o in spans
        )
    ]
    return sorted(kept, key=lambda s: (s.first, s.last))


# --------------------------------------------------------------------------- validation


def _check_phrases(lex: ClaimLexicon) -> tuple[dict[str, _Entry], dict[str, str]]:
    """Every phrase normalised, non-empty, unique across the lists → (letters → entry)."""
    phrases: dict[str, _Entry] = {}
    where: dict[str, str] = {}
    for key in _LISTS:
        for i, phrase in enumerate(getattr(lex, key)):
            here = f"{key}[{i}]"
            if not isinstance(phrase, str):
                raise LexiconError(
                    f"{here} must be a string; got {type(phrase).__name__} {phrase!r}."
                    f"{_quote_hint(phrase)} Fix it in {lex.source}."
                )
            letters = _compact(phrase)
            if not letters:
                raise LexiconError(
                    f"{here} {phrase!r} has no letters or digits, so it can match nothing. "
                    f"Remove it or write the words of the claim in {lex.source}."
                )
            if letters in phrases:
                raise LexiconError(
                    f"{here} {phrase!r} is the same phrase as {where[letters]} "
                    f"{phrases[letters].phrase!r} once case, spaces and punctuation are ignored "
                    f"(both read {letters!r}). Keep one of them in {lex.source}."
                )
            phrases[letters] = _Entry(_LIST_CUE[key], phrase)
            where[letters] = here
    if not any(e.cue is not None for e in phrases.values()):
        raise LexiconError(
            f"the lexicon has no reassuring and no alarming phrase, so it can flag nothing. "
            f"List the claims under reassuring and alarming in {lex.source}."
        )
    for key, other, sign in (
        ("reassuring", "alarming", "SAFE"),
        ("alarming", "reassuring", "DANGER"),
    ):
        if not getattr(lex, key):
            raise LexiconError(
                f"{key} is an empty list, so the lexicon reads no {key} claim of its own (a "
                f"{sign!r} sign would pass unflagged; only a negated {other} phrase could flag "
                f"it). List the {key} phrases in {lex.source}; to act on one cue only, set "
                f"the other's action to 'log' in the policy's text_in_scene."
            )
    return phrases, where


def _quote_hint(value: object) -> str:
    if isinstance(value, bool | int | float) or value is None:
        return (
            " YAML reads unquoted true/false/null and numbers as non-strings: write the word "
            "in quotes ('true')."
        )
    return ""


def _check_negation(lex: ClaimLexicon) -> frozenset[str]:
    window = lex.negation_window
    if not isinstance(window, int) or isinstance(window, bool) or not 0 <= window <= _MAX_WINDOW:
        raise LexiconError(
            f"negation.window must be an int in 0..{_MAX_WINDOW} (how many words before a "
            f"phrase may negate it); got {window!r}. Set it in {lex.source}."
        )
    words: set[str] = set()
    for i, word in enumerate(lex.negation_words):
        here = f"negation.words[{i}]"
        normalized = normalize_text(word) if isinstance(word, str) else ""
        if not normalized or " " in normalized:
            raise LexiconError(
                f"{here} must be one word (letters or digits, apostrophes allowed); got "
                f"{type(word).__name__} {word!r}.{_quote_hint(word)} Write multi-word "
                f"negations as phrases of the other cue instead (e.g. 'not safe' under "
                f"alarming). Fix it in {lex.source}."
            )
        if normalized in words:
            raise LexiconError(
                f"{here} {word!r} is listed twice (as {normalized!r}). Keep one in {lex.source}."
            )
        words.add(normalized)
    return frozenset(words)


def _letters(phrase: str) -> str:
    return _compact(phrase)


def _plural(letters: str) -> str:
    return letters + ("es" if letters.endswith(("s", "x", "z", "ch", "sh")) else "s")


def _check_grammar(
    lex: ClaimLexicon, phrases: dict[str, _Entry], where: dict[str, str], negators: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """Add the grammar's nouns (and their plurals) and states to ``phrases`` (one role per
    word: a noun or a state is never also a phrase, and a noun belongs to one group); returns
    the link words and the after-noun-only states."""
    if lex.grammar is None:
        return frozenset(), frozenset()
    grammar = check_grammar_shape(lex.grammar, lex.source)
    plurals: dict[str, _Entry] = {}
    states: dict[str, list[tuple[int, Cue, str]]] = {}
    state_where: dict[str, str] = {}
    for gi, group in enumerate(grammar.groups):
        base = f"grammar.groups[{gi}]"
        for i, noun in enumerate(group.nouns):
            letters = _grammar_word(noun, f"{base}.nouns[{i}]", lex.source)
            if letters in negators:
                raise LexiconError(
                    f"{base}.nouns[{i}] {noun!r} is also a negation word. Remove one of them "
                    f"in {lex.source}."
                )
            if letters in phrases:
                raise LexiconError(
                    f"{base}.nouns[{i}] {noun!r} is the same word as {where[letters]} "
                    f"{phrases[letters].phrase!r}; a word has one role (phrase, noun or "
                    f"state). Keep one of them in {lex.source}."
                )
            phrases[letters] = _Entry(None, noun, role="noun", group=gi)
            where[letters] = f"{base}.nouns[{i}]"
            plurals[_plural(letters)] = _Entry(None, noun, role="noun", group=gi)
        seen: dict[str, str] = {}
        for cue in CUES:
            for i, word in enumerate(getattr(group, cue)):
                here = f"{base}.{cue}[{i}]"
                letters = _grammar_word(word, here, lex.source)
                if letters in seen:
                    raise LexiconError(
                        f"{here} {word!r} is already a state of this group ({seen[letters]}); "
                        f"a state has one cue per group. Keep one in {lex.source}."
                    )
                seen[letters] = here
                states.setdefault(letters, []).append((gi, cue, word))
                state_where.setdefault(letters, here)
    for letters, here in state_where.items():
        if letters in phrases:
            raise LexiconError(
                f"{here} {states[letters][0][2]!r} is the same word as {where[letters]} "
                f"{phrases[letters].phrase!r}; a word has one role (phrase, noun or state). "
                f"Keep one of them in {lex.source}."
            )
        if letters in negators:
            raise LexiconError(
                f"{here} {states[letters][0][2]!r} is also a negation word. Remove one of "
                f"them in {lex.source}."
            )
    for letters, entries in states.items():
        phrases[letters] = _Entry(None, entries[0][2], role="state", states=tuple(entries))
        where[letters] = state_where[letters]
    for letters, entry in plurals.items():  # a plural never shadows a listed word
        phrases.setdefault(letters, entry)
    links: set[str] = set()
    for i, word in enumerate(grammar.links):
        here = f"grammar.links[{i}]"
        letters = _grammar_word(word, here, lex.source)
        if " " in normalize_text(word):
            raise LexiconError(f"{here} {word!r} must be one word. Fix it in {lex.source}.")
        if letters in phrases or letters in negators:
            other = where.get(letters, "negation.words")
            raise LexiconError(
                f"{here} {word!r} is also {other}; a link word must carry no claim and no "
                f"negation. Remove one of them in {lex.source}."
            )
        links.add(letters)
    after_only: set[str] = set()
    for i, word in enumerate(grammar.after_noun_only):
        here = f"grammar.after_noun_only[{i}]"
        letters = _grammar_word(word, here, lex.source)
        if letters not in states:
            raise LexiconError(
                f"{here} {word!r} is not a state of any group; list it under a group's "
                f"reassuring or alarming states first, or remove it in {lex.source}."
            )
        after_only.add(letters)
    return frozenset(links), frozenset(after_only)


def _grammar_word(word: object, here: str, source: str) -> str:
    letters = _compact(word) if isinstance(word, str) else ""
    if not letters:
        raise LexiconError(
            f"{here} must be a word with letters or digits; got {type(word).__name__} "
            f"{word!r}.{_quote_hint(word)} Fix it in {source}."
        )
    return letters


# --------------------------------------------------------------------------- loading


def lexicon_from_dict(doc: Any, *, source: str = "the lexicon dict") -> ClaimLexicon:
    """A :class:`ClaimLexicon` from the YAML document's mapping, every key checked."""
    check_mapping(doc, where="", source=source, error=LexiconError)
    check_keys(
        doc,
        where="",
        required=_TOP_KEYS,
        optional=_OPTIONAL_KEYS,
        source=source,
        error=LexiconError,
    )
    version = doc.get("version", LEXICON_VERSION)
    if version != LEXICON_VERSION or isinstance(version, bool):
        raise LexiconError(
            f"version must be {LEXICON_VERSION}; got {version!r}. This spotstop reads claim "
            f"lexicons of version {LEXICON_VERSION}; fix {source}."
        )
    lists: dict[str, tuple[Any, ...]] = {}
    for key in _LISTS:
        value = doc.get(key, [])
        if not isinstance(value, list):
            raise LexiconError(
                f"{key} must be a list of phrases (a YAML list, one '- phrase' per line); got "
                f"{type(value).__name__} {value!r}. Fix it in {source}."
            )
        lists[key] = tuple(value)
    negation = doc["negation"]
    check_mapping(negation, where="negation", source=source, error=LexiconError)
    check_keys(
        negation, where="negation", required=("words", "window"), source=source, error=LexiconError
    )
    if not isinstance(negation["words"], list):
        raise LexiconError(
            f"negation.words must be a list of words; got {type(negation['words']).__name__} "
            f"{negation['words']!r}. Fix it in {source}."
        )
    grammar = (
        None if doc.get("grammar") is None else grammar_from_dict(doc["grammar"], source=source)
    )
    return ClaimLexicon(
        reassuring=lists["reassuring"],
        alarming=lists["alarming"],
        neutral=lists["neutral"],
        negation_words=tuple(negation["words"]),
        negation_window=negation["window"],
        grammar=grammar,
        source=source,
    )


def load_lexicon(path: str | os.PathLike[str] | None = None) -> ClaimLexicon:
    """Read and validate a claim lexicon YAML file; ``None`` reads the packaged default.

    Raises :class:`LexiconError` (a :class:`~spotstop.guard.ConfigError`) naming the key for
    every problem: a missing file, invalid YAML, a duplicate key, an unknown key, an empty
    ``reassuring`` or ``alarming`` list, a phrase that is not a string or has no letters, a
    phrase listed twice, a bad negation entry.
    """
    if path is None:
        return default_lexicon()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LexiconError(
            f"claim lexicon {p} does not exist. Pass the path of a lexicon YAML file, or None "
            "for the packaged default."
        ) from None
    return _lexicon_from_text(text, source=str(p))


@functools.lru_cache(maxsize=1)
def default_lexicon() -> ClaimLexicon:
    """The packaged default lexicon (``spotstop/guard/cues/lexicon.yaml``), read once."""
    text = resources.files(__package__).joinpath(DEFAULT_LEXICON_FILE).read_text(encoding="utf-8")
    return _lexicon_from_text(text, source="<default>")


def _lexicon_from_text(text: str, *, source: str) -> ClaimLexicon:
    return lexicon_from_dict(load_yaml(text, source=source, error=LexiconError), source=source)
