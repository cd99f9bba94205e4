"""Text in the scene: read it (OCR) and flag the safety claims it makes, per cue.

Two cues (seed 002, Sec. 3.3):

* ``reassuring`` — text that asserts safety ("SAFE", "ALL CLEAR", "Checked – OK to use");
  it misleads on unsafe scenes.
* ``alarming`` — text that asserts danger ("DANGER", "HOT", "DO NOT TOUCH", "HIGH VOLTAGE");
  it misleads on safe scenes.

:class:`RapidOcrDetector` reads the text with RapidOCR's bundled PP-OCRv6 ONNX models (the
optional extra ``pip install 'spotstop[cues]'``; offline, CPU) and a :class:`ClaimLexicon`
(``lexicon.yaml`` by default: phrases plus a small grammar of things and their states, "the
stove is off") turns it into a :class:`CueReading`. Another claim reader can be chosen by name
(:func:`claim_reader`): ``member:<name>`` asks a guard member, text only, whether the text
claims safety or danger (:class:`MemberClaimReader`). The offline analysis
(matched edits, reliance, shift, selection) lives in ``spotstop.diagnostics``; this package is
runtime-capable and imports no other room. Importing it loads no model and imports neither
rapidocr nor OpenCV.

>>> from spotstop.guard.cues import default_lexicon
>>> default_lexicon().flags("Checked – OK to use")
{'reassuring': True, 'alarming': False}
>>> default_lexicon().flags("NOT SAFE")
{'reassuring': False, 'alarming': True}
"""

from spotstop.guard.cues._lexicon import (
    LEXICON_VERSION,
    ClaimGrammar,
    ClaimLexicon,
    LexiconError,
    StateGroup,
    default_lexicon,
    lexicon_from_dict,
    load_lexicon,
    normalize_text,
)
from spotstop.guard.cues._rapidocr import INSTALL_HINT, RapidOcrDetector
from spotstop.guard.cues._reader import (
    ClaimReaderError,
    MemberClaimReader,
    claim_reader,
    parse_reader_name,
)
from spotstop.guard.cues._types import (
    CUES,
    ClaimReader,
    Cue,
    CueMatch,
    CueReading,
    DetectorInput,
    OcrModel,
    TextDetectionError,
    TextDetector,
)

__all__ = [
    "CUES",
    "INSTALL_HINT",
    "LEXICON_VERSION",
    "ClaimGrammar",
    "ClaimLexicon",
    "ClaimReader",
    "ClaimReaderError",
    "Cue",
    "CueMatch",
    "CueReading",
    "DetectorInput",
    "LexiconError",
    "MemberClaimReader",
    "OcrModel",
    "RapidOcrDetector",
    "StateGroup",
    "TextDetectionError",
    "TextDetector",
    "claim_reader",
    "default_lexicon",
    "lexicon_from_dict",
    "load_lexicon",
    "normalize_text",
    "parse_reader_name",
]
