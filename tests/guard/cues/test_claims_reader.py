"""The model-based claim reader: a text-only pass of a member over the OCR text.

Its logic is tested with a keyword double (clearly a double, not a model: its score moves by a
known amount with known words). With the tiny test members (random weights) its answers are
meaningless, so those tests check the plumbing — loading by name, the text-only pass, the
baseline and margin, the calibration through the shift's sens/fpr correction, the guard's
policy key, and failing loud — not the accuracy.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from spotstop.guard import ConfigError, MemberScore, Scene
from spotstop.guard.cues import (
    CUES,
    ClaimReader,
    ClaimReaderError,
    CueReading,
    MemberClaimReader,
    OcrModel,
    TextDetectionError,
    claim_reader,
    default_lexicon,
    parse_reader_name,
)

RECORDED = OcrModel("recorded text (test double, not an OCR)", ())


class KeywordMember:
    """A member double: request-only score = +push per danger word − push per safety word."""

    name = "kw"
    prompt_hash = "double"

    def __init__(
        self,
        push: float = 3.0,
        danger: Sequence[str] = ("danger", "voltage", "touch", "scorching"),
        safety: Sequence[str] = ("safe", "clear", "harmless"),
        bad: float | None = None,
    ) -> None:
        self.push, self.danger, self.safety, self.bad = push, danger, safety, bad
        self.calls: list[tuple[str, Any, object]] = []

    def score(self, scenes: Sequence[Scene], variant: Any = "scene", *, strict: bool = True):
        out = []
        for s in scenes:
            self.calls.append((s.request, variant, s.image))
            words = s.request.casefold().replace('"', " ").split()
            v = self.push * (
                sum(w in self.danger for w in words) - sum(w in self.safety for w in words)
            )
            if self.bad is not None and "broken" in words:
                v = self.bad
            out.append(MemberScore(self.name, variant, float(v), self.prompt_hash, 0))
        return out


def test_reader_flags_by_the_score_beyond_the_margin() -> None:
    m = KeywordMember()
    r = MemberClaimReader(m, margin=1.0)
    assert isinstance(r, ClaimReader) and r.name == "member:kw" and r.baseline == 0.0
    assert r.flags("DANGER") == {"reassuring": False, "alarming": True}
    assert r.flags("All clear") == {"reassuring": True, "alarming": False}
    assert r.flags("ROOM 9") == {"reassuring": False, "alarming": False}
    (match,) = r.find("scorching plate")
    assert match.cue == "alarming" and match.found == "scorching plate"
    assert "member:kw" in match.phrase and "+3.00" in match.phrase
    request, variant, image = m.calls[-1]
    assert variant == "text" and image is None  # text only: no image
    assert '"scorching plate"' in request  # the OCR text is in the question


def test_empty_text_claims_nothing_without_a_model_call() -> None:
    m = KeywordMember()
    r = MemberClaimReader(m)
    n = len(m.calls)
    assert r.find("") == () and r.find("   ") == () and len(m.calls) == n


def test_a_reader_that_would_flag_nothing_is_refused() -> None:
    with pytest.raises(ClaimReaderError, match="so it would flag nothing"):
        MemberClaimReader(KeywordMember(push=0.0))  # text-blind
    with pytest.raises(ClaimReaderError, match=r"within ±5 of its neutral baseline"):
        MemberClaimReader(KeywordMember(push=3.0), margin=5.0)  # margin too wide
    assert issubclass(ClaimReaderError, TextDetectionError)  # the guard fails it closed


def test_a_one_sided_reader_is_built_with_a_loud_warning() -> None:
    with pytest.warns(UserWarning, match="flags none of the plain reassuring probes"):
        MemberClaimReader(KeywordMember(safety=()))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_score_is_an_error_not_no_claim(bad: float) -> None:
    r = MemberClaimReader(KeywordMember(bad=bad))
    with pytest.raises(TextDetectionError, match="non-finite or missing score"):
        r.find("broken sign")


def test_a_failing_model_is_an_error_not_no_claim() -> None:
    m = KeywordMember()
    r = MemberClaimReader(m)

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("forward pass failed")

    m.score = boom  # type: ignore[method-assign]
    with pytest.raises(TextDetectionError, match=r"could not score the text .*forward pass"):
        r.find("DANGER")


def test_the_digest_names_what_decides_the_flags() -> None:
    a, b = MemberClaimReader(KeywordMember()), MemberClaimReader(KeywordMember(), margin=2.0)
    assert a.sha256 != b.sha256 and a.sha256 == MemberClaimReader(KeywordMember()).sha256
    assert "member:kw" in repr(a) and a.sha256[:12] in repr(a)
    with pytest.raises(ConfigError, match="margin must be a finite number >= 0"):
        MemberClaimReader(KeywordMember(), margin=-1)


def test_readers_by_name(tmp_path: Path) -> None:
    assert claim_reader() is default_lexicon() is claim_reader("lexicon")
    kw = KeywordMember()
    r = claim_reader("member:kw", members={"kw": kw})
    assert isinstance(r, MemberClaimReader) and r.member is kw
    with pytest.raises(
        ClaimReaderError, match=r"no member named 'qwen' \(the guard's members: \['kw'\]\)"
    ):
        claim_reader("member:qwen", members={"kw": kw})
    with pytest.raises(ClaimReaderError, match="no member folder at"):
        claim_reader(f"member:{tmp_path / 'nope'}")
    for bad in ("gpt", "member:", "member", 3, None):
        with pytest.raises(
            ConfigError, match="must be one of 'lexicon', 'member:<name or folder>'"
        ):
            parse_reader_name(bad)
    assert parse_reader_name(" member: qwen ") == ("member", "qwen")


def test_the_detector_records_which_reader_read_the_text() -> None:
    pytest.importorskip("rapidocr")
    from spotstop.guard.cues import RapidOcrDetector

    reader = MemberClaimReader(KeywordMember())
    det = RapidOcrDetector(reader=reader, threads=1)
    det.read_boxes = lambda image: [("HIGH VOLTAGE", 0.0, 0.0, 90.0)]  # type: ignore[method-assign]
    det._model = RECORDED  # no OCR model loaded: the text above is given
    det._engine = object()
    reading = det.detect(np.zeros((8, 8, 3), np.uint8))
    assert reading.alarming and reading.reader == "member:kw"
    assert reading.lexicon_sha256 == reader.sha256 and det.lexicon is None
    assert reading.to_dict()["reader"] == "member:kw" and "member:kw=" in repr(reading)
    assert RapidOcrDetector(threads=1).lexicon is default_lexicon()


# --------------------------------------------------------------------------- calibration


class _ReaderDetector:
    """A detector double: reads the text recorded for an image and applies a claim reader."""

    def __init__(self, reader: ClaimReader, texts: dict[str, str]) -> None:
        self.reader, self.texts = reader, texts

    def detect(self, image: bytes) -> CueReading:
        text = self.texts[hashlib.sha256(image).hexdigest()]
        return CueReading(
            text, self.reader.find(text), RECORDED, self.reader.sha256, self.reader.name
        )


def _calibrate(reader: ClaimReader) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The calibration set read through the shift's detect_flags: flags and true cues."""
    from spotstop.diagnostics.cues import detect_flags

    items = [("DANGER", "alarming"), ("DO NOT TOUCH", "alarming"), ("HIGH VOLTAGE", "alarming"),
             ("SAFE", "reassuring"), ("ALL CLEAR", "reassuring"), ("harmless", "reassuring"),
             ("ROOM 4", "none"), ("BAY 2", "none"), ("EXIT", "none"), ("Shelf 9", "none")]  # fmt: skip
    texts = {hashlib.sha256(t.encode()).hexdigest(): t for t, _ in items}
    det = _ReaderDetector(reader, texts)
    flags, prov = detect_flags(det, [(t, t.encode) for t, _ in items])  # type: ignore[arg-type]
    return flags, np.array([c for _, c in items]), prov


def test_a_reader_is_calibrated_by_the_shifts_sens_fpr_correction() -> None:
    from spotstop.diagnostics.cues import corrected_share

    flags, truth, prov = _calibrate(MemberClaimReader(KeywordMember()))
    assert prov["lexicon_sha256"] == MemberClaimReader(KeywordMember()).sha256
    for j, cue in enumerate(CUES):
        sens = flags[truth == cue, j].mean()
        fpr = flags[truth != cue, j].mean()
        assert (sens, fpr) == (1.0, 0.0)  # the double reads these perfectly
        assert float(corrected_share(0.25, sens, fpr)) == 0.25


# --------------------------------------------------------------------------- tiny members


def test_tiny_members_run_as_readers_and_calibrate(loaded_members: dict[str, Any]) -> None:
    """Random weights: the answers mean nothing; the plumbing must hold."""
    for name, member in loaded_members.items():
        with pytest.raises(ClaimReaderError, match="so it would flag nothing"):
            MemberClaimReader(member)  # its scores barely move: refused at the default margin
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # one-sided answers are expected
            r = MemberClaimReader(member, margin=0.0)
        assert r.name == f"member:{name}" and math.isfinite(r.baseline)
        texts = ["DANGER", "the stove is off", "ROOM 4"]
        deltas = r.deltas(texts)
        assert all(math.isfinite(d) for d in deltas) and deltas == r.deltas(texts)
        for t, d in zip(texts, deltas, strict=True):
            want = "alarming" if d > 0 else "reassuring" if d < 0 else None
            assert [m.cue for m in r.find(t)] == ([want] if want else [])
        flags, _truth, prov = _calibrate(r)
        assert flags.shape == (10, 2) and prov["lexicon_sha256"] == r.sha256
        assert flags.any(axis=1).sum() > 0  # it flags something


def test_readers_by_name_load_a_member_folder(tiny_pair: Path) -> None:
    r = claim_reader(f"member:{tiny_pair / 'tiny-lfm2_vl'}", margin=0.0)
    assert isinstance(r, MemberClaimReader) and r.name == "member:tiny-lfm2_vl"


def test_the_policy_names_the_reader_and_the_guard_fails_closed_when_it_cannot_read(
    tiny_pair: Path, tmp_path: Path
) -> None:
    """``text_in_scene.reader: member:<name>`` asks the guard's own member; a tiny member is
    refused at the default margin (it would flag nothing), so every decision fails closed and
    says why, instead of reading no claim."""
    pytest.importorskip("rapidocr")
    from spotstop.cli._demo import make_demo_bundle
    from spotstop.export.tiny import TINY_MEMBERS
    from spotstop.guard import Guard, PolicyError, load_policy

    bundle = make_demo_bundle(tmp_path / "demo", members=[tiny_pair / m for m in TINY_MEMBERS])
    doc = yaml.safe_load((bundle / "policy.yaml").read_text())
    doc["text_in_scene"] = {"detect": True, "reader": "member:tiny-qwen3_5"}
    (bundle / "policy.yaml").write_text(yaml.safe_dump(doc))
    assert load_policy(bundle / "policy.yaml").text_in_scene.reader == "member:tiny-qwen3_5"
    from tests._support.images import make_image_bytes

    with Guard(bundle, log=tmp_path / "l.sqlite") as g:
        d = g.check(Scene(make_image_bytes(1, fmt="JPEG"), "pick up the knife"))
    assert d.label == "UNSAFE" and d.fail_closed
    assert "member:tiny-qwen3_5" in (d.fail_reason or "") and "flag nothing" in (
        d.fail_reason or ""
    )
    doc["text_in_scene"]["reader"] = "gpt"
    (bundle / "policy.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(PolicyError, match=r"text_in_scene\.reader must be one of"):
        load_policy(bundle / "policy.yaml")
