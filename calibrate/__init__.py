"""spotstop calibrate: offline refits from the decision log, versioned policies, a recommendation.

* :func:`fit_frozen` — fusion statistics and the frozen cut on an unlabelled pool.
* :class:`ConformalCalibrator` — the conformal cut with its marginal and training-conditional
  (PAC) guarantees, one calibration case per situation.
* :func:`read_calibration_log` → :class:`CalibrationLog`; :class:`Recalibrator` ``.fit(data).to_config()``.
* :func:`write_policy_version`, :func:`activate_policy_version`,
  :func:`list_policy_versions` — ``policies/policy-vNNNN.yaml`` next to the active
  ``policy.yaml``.
* :func:`diff_policies`, :func:`predict_effect` — what changed, and its effect on the log.
* :func:`fit_pool_policy` — the first policy of a bundle, from unlabelled frames.

The kinds a recalibration can write are the guard's registered policy kinds
(``spotstop.guard.policies.POLICY_KINDS``). Needs numpy only, like the robot's runtime.
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
from spotstop.calibrate._logdata import (
    CalibrationError,
    CalibrationLog,
    parse_time,
    read_calibration_log,
)
from spotstop.calibrate._pool import fit_pool_policy, pool_scenes
from spotstop.calibrate._recalibrate import Recalibrator
from spotstop.calibrate._versions import (
    PolicyVersion,
    activate_policy_version,
    active_policy_version,
    list_policy_versions,
    resolve_policy_version,
    write_policy_version,
)

__all__ = [
    "CalibrationError",
    "CalibrationLog",
    "Change",
    "ConformalCalibrator",
    "CutChoice",
    "FrozenFit",
    "PolicyDiff",
    "PolicyVersion",
    "PredictedEffect",
    "Recalibrator",
    "activate_policy_version",
    "active_policy_version",
    "binom_cdf",
    "diff_policies",
    "fit_frozen",
    "fit_pool_policy",
    "list_policy_versions",
    "parse_time",
    "pool_scenes",
    "predict_effect",
    "read_calibration_log",
    "resolve_policy_version",
    "write_policy_version",
]
