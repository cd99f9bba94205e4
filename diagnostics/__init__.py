"""spotstop diagnostics: what the guard's label measures in a deployment (seed 000).

Metrics and the Spot-Stop decomposition of ``R - A`` into threshold, overlap and within
parts; a vectorized group bootstrap; the label-swap null; prevalence, situation-share,
scene-blind and conformal checks; and the deployment card (``card.json``, ``card.md``,
``card.html``).  Work on a :class:`CaseTable` (built from arrays or :func:`read_scores_csv`).

>>> from diagnostics import simulate_log, spot_stop
>>> ss = spot_stop(simulate_log(200, rng=0))
>>> abs(ss.threshold_part + ss.overlap_part + ss.within_part - ss.R_minus_A) < 1e-12
True
"""

from spotstop.diagnostics._bootstrap import (
    BootstrapResult,
    NullResult,
    bootstrap_auroc,
    draw_group_counts,
    group_bootstrap,
    label_swap_null,
)
from spotstop.diagnostics._card import EXPLANATIONS, FIELD_KEYS, Card, compute_card, write_card
from spotstop.diagnostics._checks import (
    ConformalAudit,
    LogisticRegression,
    LongestSideRule,
    PrevalenceCheck,
    RuleOutcome,
    SceneBlindReaders,
    SituationShare,
    conformal_audit,
    conformal_cut,
    file_features,
    grouped_folds,
    prevalence_check,
    scene_blind_readers,
    situation_share,
)
from spotstop.diagnostics._data import CaseTable, Pairs, read_scores_csv
from spotstop.diagnostics._errors import DataError, DiagnosticsError, UndefinedMetricWarning
from spotstop.diagnostics._from_log import (
    LogCases,
    apply_labels_file,
    case_table_from_log,
    log_cases,
)
from spotstop.diagnostics._metrics import (
    BestCut,
    CrossFit,
    KernelReference,
    PairRates,
    SignalDetection,
    SpotStop,
    auroc,
    balanced_accuracy,
    best_balanced_accuracy,
    cross_fitted_threshold_part,
    g_auroc,
    kernel_reference,
    pair_rates,
    signal_detection,
    spot_stop,
)
from spotstop.diagnostics._recommend import (
    Recommendation,
    recommend_policy,
    situation_repeat_share,
)
from spotstop.diagnostics._results import ConfidenceInterval, Estimate
from spotstop.diagnostics._simulate import simulate_log

__all__ = [
    "EXPLANATIONS",
    "FIELD_KEYS",
    "BestCut",
    "BootstrapResult",
    "Card",
    "CaseTable",
    "ConfidenceInterval",
    "ConformalAudit",
    "CrossFit",
    "DataError",
    "DiagnosticsError",
    "Estimate",
    "KernelReference",
    "LogCases",
    "LogisticRegression",
    "LongestSideRule",
    "NullResult",
    "PairRates",
    "Pairs",
    "PrevalenceCheck",
    "Recommendation",
    "RuleOutcome",
    "SceneBlindReaders",
    "SignalDetection",
    "SituationShare",
    "SpotStop",
    "UndefinedMetricWarning",
    "apply_labels_file",
    "auroc",
    "balanced_accuracy",
    "best_balanced_accuracy",
    "bootstrap_auroc",
    "case_table_from_log",
    "compute_card",
    "conformal_audit",
    "conformal_cut",
    "cross_fitted_threshold_part",
    "draw_group_counts",
    "file_features",
    "g_auroc",
    "group_bootstrap",
    "grouped_folds",
    "kernel_reference",
    "label_swap_null",
    "log_cases",
    "pair_rates",
    "prevalence_check",
    "read_scores_csv",
    "recommend_policy",
    "scene_blind_readers",
    "signal_detection",
    "simulate_log",
    "situation_repeat_share",
    "situation_share",
    "spot_stop",
    "write_card",
]
