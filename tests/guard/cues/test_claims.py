"""The claim grammar (things × states, negation, groups) and the held-out recall floor.

The held-out claims (``tests/data/claims_eval.yaml``) were written before the grammar and never
used to build it; ``bench/claims.py`` prints the same numbers. The rule tests below use words
chosen to exercise each step of the rule, not the evaluation set's phrases.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from spotstop.guard.cues import (
    CUES,
    ClaimGrammar,
    ClaimLexicon,
    LexiconError,
    StateGroup,
    default_lexicon,
    load_lexicon,
)

from tests._support import TESTS_DIR

EVAL = TESTS_DIR / "data" / "claims_eval.yaml"

#: The floor the default lexicon holds on the held-out claims (it reached 1.000 reassuring
#: and 0.977 alarming when the grammar was written; the goal is 0.8).
RECALL_FLOOR = 0.9


def _eval() -> dict[str, list[str]]:
    doc = yaml.safe_load(EVAL.read_text(encoding="utf-8"))
    return {k: doc[k] for k in ("reassuring", "alarming", "neutral")}


def _flagged(text: str, lexicon: ClaimLexicon | None = None) -> set[str]:
    lex = lexicon or default_lexicon()
    return {c for c, f in lex.flags(text).items() if f}


# --------------------------------------------------------------------------- the floor


def test_the_evaluation_set_is_big_enough_and_apart_from_the_lexicon() -> None:
    claims = _eval()
    assert len(claims["reassuring"]) >= 40 and len(claims["alarming"]) >= 40
    assert len(claims["neutral"]) >= 20
    header = EVAL.read_text(encoding="utf-8").split("version:")[0]
    assert "written" in header and "before" in header  # it says how it was written
    lex = default_lexicon()
    phrases = {p.casefold() for p in (*lex.reassuring, *lex.alarming)}
    claims_all = [t.casefold() for k in ("reassuring", "alarming") for t in claims[k]]
    copied = [t for t in claims_all if t in phrases]
    # a claim may coincide with a stock phrase, but the set is not the lexicon's list
    assert len(copied) <= 3, copied


@pytest.mark.parametrize("cue", CUES)
def test_held_out_recall_per_cue_is_above_the_floor(cue: str) -> None:
    claims = _eval()[cue]
    hits = [cue in _flagged(t) for t in claims]
    recall = sum(hits) / len(hits)
    missed = [t for t, h in zip(claims, hits, strict=True) if not h]
    assert recall >= RECALL_FLOOR, (recall, missed)
    crossed = [t for t in claims if (set(CUES) - {cue}) & _flagged(t)]
    assert len(crossed) <= 1, crossed


def test_no_neutral_sign_is_flagged() -> None:
    flagged = [t for t in _eval()["neutral"] if _flagged(t)]
    assert flagged == []


def test_the_grammar_carries_the_recall() -> None:
    """Without its grammar the same lexicon misses most held-out claims: the floor above is
    the grammar's, not the phrase list's."""
    phrases_only = dataclasses.replace(default_lexicon(), grammar=None)
    for cue in CUES:
        claims = _eval()[cue]
        recall = sum(cue in _flagged(t, phrases_only) for t in claims) / len(claims)
        assert recall < 0.5, (cue, recall)


def test_the_worlds_sign_texts_are_read_as_their_author_meant() -> None:
    """export/world.py's sign wording, written by another hand for the test world."""
    world = pytest.importorskip("spotstop.export.world")
    for cue, texts in world.SIGN_TEXTS.items():
        for t in texts:
            assert _flagged(t) == ({cue} if cue in CUES else set()), (cue, t)


# --------------------------------------------------------------------------- the rule

GRAMMAR = ClaimGrammar(
    groups=(
        StateGroup(
            "hazards",
            nouns=("kiln", "press", "walkway"),
            reassuring=("off", "idle", "cold", "swept"),
            alarming=("on", "firing", "glowing", "slick"),
        ),
        StateGroup(
            "safeguards",
            nouns=("shield", "interlock"),
            reassuring=("on", "engaged"),
            alarming=("off", "bypassed"),
        ),
    ),
    links=("is", "the", "now", "left", "has", "been"),
    window=3,
    after_noun_only=("on", "off"),
)
LEX = ClaimLexicon(
    reassuring=("all clear",),
    alarming=("danger",),
    negation_words=("not", "no", "isnt"),
    grammar=GRAMMAR,
)

# text -> (flags, [(cue, phrase, negated)])
RULES: list[tuple[str, set[str], list[tuple[str, str, bool]]]] = [
    ("KILN OFF", {"reassuring"}, [("reassuring", "kiln off", False)]),
    ("the kiln is now off", {"reassuring"}, [("reassuring", "kiln off", False)]),
    ("kiln has been left on", {"alarming"}, [("alarming", "kiln on", False)]),  # 3 links
    ("kiln has been left now on", set(), []),  # 4 links: beyond the window
    ("Kilns firing", {"alarming"}, [("alarming", "kiln firing", False)]),  # plural
    ("presses idle", {"reassuring"}, [("reassuring", "press idle", False)]),  # -es plural
    ("glowing kiln", {"alarming"}, [("alarming", "glowing kiln", False)]),  # before its thing
    ("slick walkway", {"alarming"}, [("alarming", "slick walkway", False)]),
    ("on kiln", set(), []),  # after_noun_only: never before its thing
    ("firing", set(), []),  # a state alone claims nothing
    ("kiln", set(), []),  # a thing alone claims nothing
    ("kiln. off", set(), []),  # a clause break separates them
    ("kiln room off", set(), []),  # an unlisted word between them
    ("kiln is not off", {"alarming"}, [("alarming", "kiln off", True)]),  # negation flips
    ("kiln isnt glowing", {"reassuring"}, [("reassuring", "kiln glowing", True)]),
    ("no slick walkway", {"reassuring"}, [("reassuring", "slick walkway", True)]),
    ("shield off", {"alarming"}, [("alarming", "shield off", False)]),  # group polarity
    ("kiln shield on", {"reassuring"}, [("reassuring", "shield on", False)]),  # head noun
    ("interlock bypassed", {"alarming"}, [("alarming", "interlock bypassed", False)]),
    ("interlock firing", set(), []),  # a state of another group
    ("KILNOFF", {"reassuring"}, [("reassuring", "kiln off", False)]),  # glued words split
    ("danger: kiln off", {"alarming", "reassuring"}, [("alarming", "danger", False), ("reassuring", "kiln off", False)]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "flags", "matches"), RULES, ids=[r[0] for r in RULES])
def test_grammar_rules(text: str, flags: set[str], matches: list[tuple[str, str, bool]]) -> None:
    found = LEX.find(text)
    assert [(m.cue, m.phrase, m.negated) for m in found] == matches
    assert _flagged(text, LEX) == flags


def test_found_spans_the_thing_and_its_state_from_the_negation_word() -> None:
    (m,) = LEX.find("Sign: the kiln is not  off!")
    assert m.found == "kiln is not  off" and m.negated
    (m,) = LEX.find("no slick walkway here")
    assert m.found == "no slick walkway"


def test_default_grammar_reads_states_by_group() -> None:
    lex = default_lexicon()
    assert _flagged("machine guard off") == {"alarming"}
    assert _flagged("machine off") == {"reassuring"}
    assert _flagged("brake released") == {"alarming"}
    assert _flagged("pressure released") == {"reassuring"}
    assert _flagged("OPEN 24 HOURS") == set()  # open, but nothing is open
    assert lex.grammar is not None and "hazards" in repr(lex)


# --------------------------------------------------------------------------- the YAML

GOOD = """\
reassuring: [safe]
alarming: [hot]
negation: {words: ["not"], window: 2}
"""
GRAMMAR_YAML = (
    GOOD
    + """\
grammar:
  groups:
    - name: hazards
      nouns: [kiln]
      reassuring: ["off"]
      alarming: ["on"]
  links: [is]
  window: 2
  after_noun_only: ["on"]
"""
)

VALIDATION: list[tuple[str, str]] = [
    (GOOD + "grammar: [kiln]\n", "grammar must be a mapping"),
    (GRAMMAR_YAML.replace("links:", "linkz:"), "grammar.linkz is not a known key"),
    (GRAMMAR_YAML.replace("  groups:\n", "  groups: []\n  x:\n"), "grammar.x is not a known key"),
    (GRAMMAR_YAML.replace("nouns: [kiln]", "nouns: kiln"), "grammar.groups[0].nouns must be a list of words"),
    (GRAMMAR_YAML.replace("nouns: [kiln]", "nouns: [kiln, 5]"), "grammar.groups[0].nouns[1] must be a word with letters"),
    (GRAMMAR_YAML.replace('reassuring: ["off"]', "reassuring: [false]"), "grammar.groups[0].reassuring[0] must be a word with letters or digits; got bool False. YAML reads"),
    (GRAMMAR_YAML.replace("nouns: [kiln]", "nouns: [hot]"), "grammar.groups[0].nouns[0] 'hot' is the same word as alarming[0] 'hot'; a word has one role"),
    (GRAMMAR_YAML.replace('alarming: ["on"]', 'alarming: ["on", safe]'), "grammar.groups[0].alarming[1] 'safe' is the same word as reassuring[0] 'safe'"),
    (GRAMMAR_YAML.replace('alarming: ["on"]', 'alarming: ["off"]'), "grammar.groups[0].alarming[0] 'off' is already a state of this group (grammar.groups[0].reassuring[0])"),
    (GRAMMAR_YAML.replace('alarming: ["on"]', 'alarming: ["on", kiln]'), "grammar.groups[0].alarming[1] 'kiln' is the same word as grammar.groups[0].nouns[0]"),
    (GRAMMAR_YAML.replace("links: [is]", "links: [is, kiln]"), "grammar.links[1] 'kiln' is also grammar.groups[0].nouns[0]"),
    (GRAMMAR_YAML.replace("links: [is]", "links: [is, not]"), "grammar.links[1] 'not' is also negation.words"),
    (GRAMMAR_YAML.replace("links: [is]", "links: [is now]"), "grammar.links[0] 'is now' must be one word"),
    (GRAMMAR_YAML.replace("  window: 2", "  window: 7"), "grammar.window must be an int in 0..5"),
    (GRAMMAR_YAML.replace('after_noun_only: ["on"]', "after_noun_only: [lit]"), "grammar.after_noun_only[0] 'lit' is not a state of any group"),
    (GRAMMAR_YAML.replace("nouns: [kiln]", "nouns: []"), "grammar.groups[0] (hazards) needs at least one noun and one state"),
    (GRAMMAR_YAML.replace("  groups:\n    - name: hazards\n", "  groups:\n    - nam: hazards\n"), "grammar.groups[0].nam is not a known key"),
    (GRAMMAR_YAML.replace("  links:", "    - name: hazards\n      nouns: [oven]\n      reassuring: [cold]\n  links:"), "grammar.groups names ['hazards'] appear twice"),
    (GRAMMAR_YAML.replace("  links:", "    - name: more\n      nouns: [kiln]\n      reassuring: [cold]\n  links:"), "grammar.groups[1].nouns[0] 'kiln' is the same word as grammar.groups[0].nouns[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("yaml_text", "message"), VALIDATION)
def test_grammar_validation_names_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(LexiconError) as info:
        load_lexicon(path)
    assert message in str(info.value)


def test_a_grammar_from_yaml_reads_like_one_built_in_python(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(GRAMMAR_YAML, encoding="utf-8")
    lex = load_lexicon(path)
    assert lex.flags("kiln is on") == {"reassuring": False, "alarming": True}
    assert lex.flags("on kiln") == {"reassuring": False, "alarming": False}
    assert lex.grammar == ClaimGrammar(
        groups=(StateGroup("hazards", ("kiln",), ("off",), ("on",)),),
        links=("is",),
        window=2,
        after_noun_only=("on",),
    )


def test_existing_lexicons_without_a_grammar_keep_loading_and_their_digest(
    tmp_path: Path,
) -> None:
    """A lexicon file written before the grammar existed loads unchanged, with the digest
    spotstop gave it then (computed with the previous _lexicon.py)."""
    path = tmp_path / "old.yaml"
    path.write_text(
        "version: 1\nreassuring: [safe, all clear]\nalarming: [hot]\n"
        'negation: {words: ["not"], window: 2}\n',
        encoding="utf-8",
    )
    lex = load_lexicon(path)
    assert lex.grammar is None
    assert lex.sha256 == "3661223a1ecf1d354dcad4e8d5777e4ba306d7b4057bd99e391933e791efd106"
    assert lex.flags("not hot") == {"reassuring": True, "alarming": False}


def test_the_grammar_is_part_of_the_digest() -> None:
    a = dataclasses.replace(LEX)
    words: dict[str, Any] = {"links": ("is", "the")}
    b = dataclasses.replace(LEX, grammar=dataclasses.replace(GRAMMAR, **words))
    c = dataclasses.replace(LEX, grammar=None)
    assert a.sha256 == LEX.sha256 != b.sha256 != c.sha256
