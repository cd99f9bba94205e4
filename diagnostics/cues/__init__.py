"""Text in the scene: cue reliance, deployment shift and model selection (seed 002, SRA).

* Matched edits (:func:`plan_edits`, Sec. 3.3): reassuring text on UNSAFE scenes, alarming
  text on SAFE ones, matched controls in the same box (agreeing and neutral text) and a
  placebo non-word, over four templates and one held-out template.
* Reliance (:func:`estimate_reliance`, Eq. 2): misleading-edit error minus matched-control
  error, per member, Avg-2 pair and guard as deployed, with group-bootstrap intervals.
"""

from spotstop.diagnostics.cues._deployed import DeployedLabels, label_as_deployed
from spotstop.diagnostics.cues._edits import EditRecord, EditSet, placebo_text, plan_edits
from spotstop.diagnostics.cues._reliance import (
    GuardSpec,
    answer_errors,
    estimate_reliance,
    probability_errors,
)
from spotstop.diagnostics.cues._results import CandidateReliance, CueReliance, RelianceResult
from spotstop.diagnostics.cues._scoring import (
    MemberSpec,
    MemberTiming,
    Scorer,
    ScoreTable,
    score_edit_set,
)
from spotstop.diagnostics.cues._source import (
    CalibrationImage,
    CalibrationSet,
    SourceScene,
    SourceSet,
    read_calibration_csv,
    read_source_set,
)
from spotstop.diagnostics.cues._templates import (
    CUES,
    HELD_OUT,
    KINDS,
    TEMPLATES,
    EditTemplate,
)

__all__ = [
    "CUES",
    "HELD_OUT",
    "KINDS",
    "TEMPLATES",
    "CalibrationImage",
    "CalibrationSet",
    "CandidateReliance",
    "CueReliance",
    "DeployedLabels",
    "EditRecord",
    "EditSet",
    "EditTemplate",
    "GuardSpec",
    "MemberSpec",
    "MemberTiming",
    "RelianceResult",
    "ScoreTable",
    "Scorer",
    "SourceScene",
    "SourceSet",
    "answer_errors",
    "estimate_reliance",
    "label_as_deployed",
    "placebo_text",
    "plan_edits",
    "probability_errors",
    "read_calibration_csv",
    "read_source_set",
    "score_edit_set",
]
