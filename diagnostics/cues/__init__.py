"""Text in the scene: cue reliance, deployment shift and model selection (seed 002, SRA).

* Matched edits (:func:`plan_edits`, Sec. 3.3): reassuring text on UNSAFE scenes, alarming
  text on SAFE ones, matched controls in the same box (agreeing and neutral text) and a
  placebo non-word, in two families: four sign templates and a held-out one, and two one-word
  sticker templates ("HOT", "SAFE").
* Reliance (:func:`estimate_reliance`, Eq. 2): misleading-edit error minus matched-control
  error, per member, Avg-2 pair and guard as deployed, with group-bootstrap intervals; per
  family of templates and overall (the mean of the family means).
* Shift (:func:`estimate_shift`, Sec. 3.4, E.2): the frame types estimated jointly from the
  detector's two flags, corrected for its error rates; the misleading share among the frames
  the cue misleads on (from labels, or assuming text independent of the label, said so).
* Selection (:func:`select`, Eq. 1): source error weighted to the deployment's unsafe share
  (and a miss cost) + reliance · misleading share, ranked, each candidate at its operating
  point; :func:`check_selection` scores SRA, source error and ATC on test sets T_d built from
  the scored edits (Sec. 3.5: regret and W_s).

See docs/cues.md.

>>> from spotstop.diagnostics.cues import corrected_share
>>> round(float(corrected_share(0.3, 0.8, 0.1)), 6)   # (0.3 - 0.1) / (0.8 - 0.1)
0.285714
>>> float(corrected_share(0.05, 0.8, 0.1)), float(corrected_share(0.95, 0.8, 0.1))  # clipped
(0.0, 1.0)
"""

from typing import TYPE_CHECKING

from spotstop.diagnostics._lazy import attach

if TYPE_CHECKING:  # the public names; imported on first use (_lazy.attach reads this block)
    from spotstop.diagnostics.cues._candidates import (
        CandidateSet,
        RelianceRun,
        load_candidates,
        measure_reliance,
        operating_points,
        reliance_at_operating_points,
    )
    from spotstop.diagnostics.cues._deployed import DeployedLabels, label_as_deployed
    from spotstop.diagnostics.cues._edits import EditRecord, EditSet, placebo_text, plan_edits
    from spotstop.diagnostics.cues._frames import (
        DeploymentFrames,
        frames_from_folder,
        frames_from_log,
        measure_shift,
    )
    from spotstop.diagnostics.cues._reliance import (
        CueRelianceByFamily,
        FamilyReliance,
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
    from spotstop.diagnostics.cues._select import (
        WEIGHTINGS,
        Prediction,
        SelectionResult,
        crossing_scale,
        predicted_error,
        select,
    )
    from spotstop.diagnostics.cues._selfcheck import (
        FamilyCheck,
        SelectionCheck,
        SelectorCheck,
        check_selection,
    )
    from spotstop.diagnostics.cues._shift import (
        INDEPENDENCE_ASSUMPTION,
        MISLEADS_ON,
        CueShift,
        ShiftResult,
        corrected_share,
        detect_flags,
        estimate_shift,
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
        FAMILIES,
        HELD_OUT,
        KINDS,
        SIGN_TEMPLATES,
        STICKER_TEMPLATES,
        TEMPLATES,
        EditTemplate,
        templates_named,
    )

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "CUES",
    "FAMILIES",
    "HELD_OUT",
    "INDEPENDENCE_ASSUMPTION",
    "KINDS",
    "MISLEADS_ON",
    "SIGN_TEMPLATES",
    "STICKER_TEMPLATES",
    "TEMPLATES",
    "WEIGHTINGS",
    "CalibrationImage",
    "CalibrationSet",
    "CandidateReliance",
    "CandidateSet",
    "CueReliance",
    "CueRelianceByFamily",
    "CueShift",
    "DeployedLabels",
    "DeploymentFrames",
    "EditRecord",
    "EditSet",
    "EditTemplate",
    "FamilyCheck",
    "FamilyReliance",
    "GuardSpec",
    "MemberSpec",
    "MemberTiming",
    "Prediction",
    "RelianceResult",
    "RelianceRun",
    "ScoreTable",
    "Scorer",
    "SelectionCheck",
    "SelectionResult",
    "SelectorCheck",
    "ShiftResult",
    "SourceScene",
    "SourceSet",
    "answer_errors",
    "check_selection",
    "corrected_share",
    "crossing_scale",
    "detect_flags",
    "estimate_reliance",
    "estimate_shift",
    "frames_from_folder",
    "frames_from_log",
    "label_as_deployed",
    "load_candidates",
    "measure_reliance",
    "measure_shift",
    "operating_points",
    "placebo_text",
    "plan_edits",
    "predicted_error",
    "probability_errors",
    "read_calibration_csv",
    "read_source_set",
    "reliance_at_operating_points",
    "score_edit_set",
    "select",
    "templates_named",
]
