"""The cue tests' doubles (tests/_support/cues_fakes.py) behave as their docstrings say."""

from __future__ import annotations

import pytest
from spotstop.diagnostics.cues import (
    HELD_OUT,
    TEMPLATES,
    plan_edits,
    read_source_set,
)
from spotstop.guard import Scene

from tests._support.cues_fakes import (
    TextDrivenMember,
    lexicon_flags,
    rendered_doubles,
    write_source,
)


@pytest.mark.parametrize("t", [*TEMPLATES, HELD_OUT], ids=lambda t: t.name)
def test_fake_lexicon_flags_every_template_wording(t):
    assert lexicon_flags(t.texts["reassuring"]) == {"reassuring": True, "alarming": False}
    assert lexicon_flags(t.texts["alarming"]) == {"reassuring": False, "alarming": True}
    assert lexicon_flags(t.texts["neutral"]) == {"reassuring": False, "alarming": False}


def test_text_driven_member_pushes_by_the_text_it_reads(tmp_path):
    edits = plan_edits(read_source_set(write_source(tmp_path, ["UNSAFE", "SAFE"])), seed=1)
    det, base = rendered_doubles(edits, [1.0, -1.0])
    m = TextDrivenMember("m", det, base, reassuring_push=2.0, alarming_push=0.5)
    for r, img in edits.images():
        s = m.score([Scene(img, r.request)])[0].score
        expected = [1.0, -1.0][r.group]
        if r.kind in ("misleading", "agreeing"):
            expected += -2.0 if r.text in {t.texts["reassuring"] for t in edits.templates} else 0.5
        assert s == pytest.approx(expected), (r.kind, r.text)
