"""spotstop calibrate: offline refits from the decision log, versioned policies, a recommendation.

* :func:`fit_frozen` — fusion statistics and the frozen cut on an unlabelled pool.
* :class:`ConformalCalibrator` — the conformal cut with its marginal and training-conditional
  (PAC) guarantees, one calibration case per situation.
* :func:`read_log` → :class:`LogData`; :class:`Recalibrator` ``.fit(data).to_config()``.
* :func:`write_policy_version`, :func:`activate_policy_version`,
  :func:`list_policy_versions` — ``policies/policy-vNNNN.yaml`` next to the active
  ``policy.yaml``.
* :func:`diff_policies`, :func:`predict_effect` — what changed, and its effect on the log.
* :func:`recommend_policy` — which policy fits, from the diagnostics, and why.
"""

from spotstop.calibrate._conformal import ConformalCalibrator, CutChoice, binom_cdf
from spotstop.calibrate._diff import (
    Change,
    PolicyDiff,
    PredictedEffect,
    diff_policies,
    predict_effect,
)
from spotstop.calibrate._frozen import FrozenFit, fit_frozen
from spotstop.calibrate._logdata import CalibrationError, LogData, parse_time, read_log
from spotstop.calibrate._recalibrate import POLICY_KINDS, Recalibrator
from spotstop.calibrate._recommend import Recommendation, recommend_policy, situation_repeat_share
from spotstop.calibrate._versions import (
    PolicyVersion,
    activate_policy_version,
    active_policy_version,
    list_policy_versions,
    resolve_policy_version,
    write_policy_version,
)

__all__ = [
    "POLICY_KINDS",
    "CalibrationError",
    "Change",
    "ConformalCalibrator",
    "CutChoice",
    "FrozenFit",
    "LogData",
    "PolicyDiff",
    "PolicyVersion",
    "PredictedEffect",
    "Recalibrator",
    "Recommendation",
    "activate_policy_version",
    "active_policy_version",
    "binom_cdf",
    "diff_policies",
    "fit_frozen",
    "list_policy_versions",
    "parse_time",
    "predict_effect",
    "read_log",
    "recommend_policy",
    "resolve_policy_version",
    "situation_repeat_share",
    "write_policy_version",
]
