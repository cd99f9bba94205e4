"""spotstop diagnostics: what the guard's label measures in a deployment (seed 000).

Metrics and the Spot-Stop decomposition of ``R½ - A`` into threshold, overlap and within
parts (the paper's ``R - A`` adds ``tie_part = -T/2``, T the tied share of contrasts); a vectorized group bootstrap; the label-swap null; the card checks (prevalence,
situation share, scene-blind readers, the conformal audit of deployed cuts, text in the
scene, the cascade's share and cost), each a registered module (:data:`CARD_CHECKS`); what the guard delivered, from the
log's own answers; the verdict; and the deployment card (``card.json``, ``card.md``,
``card.html``).  Work on a :class:`CaseTable` (built from arrays, :func:`read_scores_csv` or
:func:`log_cases`).

>>> from spotstop.diagnostics import simulate_log, spot_stop
>>> ss = spot_stop(simulate_log(200, rng=0))
>>> parts = ss.threshold_part + ss.overlap_part + ss.within_part
>>> abs(parts - ss.R_half_minus_A) < 1e-12  # R½ − A: ties count one half, exact with ties
True
>>> abs(ss.tie_part + parts - ss.R_minus_A) < 1e-12  # the paper's R − A adds tie_part
True
"""

from typing import TYPE_CHECKING

from spotstop.diagnostics._lazy import attach

if TYPE_CHECKING:  # the public names; imported on first use (_lazy.attach reads this block)
    from spotstop.diagnostics._bootstrap import BootstrapResult, bootstrap_auroc, group_bootstrap
    from spotstop.diagnostics._card import Card, CutWarning, compute_card, write_card
    from spotstop.diagnostics._cascade import SimulatedCascade, simulate_cascade
    from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult
    from spotstop.diagnostics._checks import CARD_CHECKS, card_check, run_checks
    from spotstop.diagnostics._conformal_audit import (
        DeployedAudit,
        SplitSimulation,
        audit_deployed,
        audit_min_n,
        binomial_upper_p,
        clopper_pearson,
        conformal_cut,
        conformal_split_simulation,
    )
    from spotstop.diagnostics._data import CaseTable, Pairs, group_codes, read_scores_csv
    from spotstop.diagnostics._delivered import (
        Delivered,
        DeliveredRates,
        PolicyDelivered,
        Replay,
        delivered,
        delivered_rates,
    )
    from spotstop.diagnostics._engine import CrossFit, cross_fitted_threshold_part
    from spotstop.diagnostics._errors import DataError, DiagnosticsError, UndefinedMetricWarning
    from spotstop.diagnostics._explanations import DELIVERED_EXPLANATIONS, EXPLANATIONS, FIELD_KEYS
    from spotstop.diagnostics._from_log import (
        UNKNOWN_VERSION,
        LogCases,
        LogData,
        case_table_from_log,
        log_cases,
        read_log,
    )
    from spotstop.diagnostics._logistic import LogisticRegression, grouped_folds
    from spotstop.diagnostics._metrics import (
        BestCut,
        KernelReference,
        PairRates,
        SignalDetection,
        SpotStop,
        TiedScoresWarning,
        auroc,
        balanced_accuracy,
        best_balanced_accuracy,
        g_auroc,
        kernel_reference,
        pair_rates,
        signal_detection,
        spot_stop,
    )
    from spotstop.diagnostics._null import NullResult, label_swap_null
    from spotstop.diagnostics._prevalence import PrevalenceCheck, RuleOutcome, prevalence_check
    from spotstop.diagnostics._recommend import (
        Recommendation,
        recommend_for_card,
        recommend_policy,
        situation_repeat_share,
    )
    from spotstop.diagnostics._resample import (
        FewGroupsWarning,
        GroupSums,
        UnboundedRatioWarning,
        draw_group_counts,
        group_sum_draws,
        percentile_ci,
    )
    from spotstop.diagnostics._results import ConfidenceInterval, Estimate, fmt_estimate
    from spotstop.diagnostics._scene_blind import (
        LongestSideRule,
        SceneBlindReaders,
        file_features,
        scene_blind_readers,
    )
    from spotstop.diagnostics._simulate import simulate_log
    from spotstop.diagnostics._situation import SituationShare, situation_share
    from spotstop.diagnostics._verdict import VerdictItem, verdict

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "CARD_CHECKS",
    "DELIVERED_EXPLANATIONS",
    "EXPLANATIONS",
    "FIELD_KEYS",
    "UNKNOWN_VERSION",
    "BestCut",
    "BootstrapResult",
    "Card",
    "CardCheck",
    "CardContext",
    "CaseTable",
    "CheckResult",
    "ConfidenceInterval",
    "CrossFit",
    "CutWarning",
    "DataError",
    "Delivered",
    "DeliveredRates",
    "DeployedAudit",
    "DiagnosticsError",
    "Estimate",
    "FewGroupsWarning",
    "GroupSums",
    "KernelReference",
    "LogCases",
    "LogData",
    "LogisticRegression",
    "LongestSideRule",
    "NullResult",
    "PairRates",
    "Pairs",
    "PolicyDelivered",
    "PrevalenceCheck",
    "Recommendation",
    "Replay",
    "RuleOutcome",
    "SceneBlindReaders",
    "SignalDetection",
    "SimulatedCascade",
    "SituationShare",
    "SplitSimulation",
    "SpotStop",
    "TiedScoresWarning",
    "UnboundedRatioWarning",
    "UndefinedMetricWarning",
    "VerdictItem",
    "audit_deployed",
    "audit_min_n",
    "auroc",
    "balanced_accuracy",
    "best_balanced_accuracy",
    "binomial_upper_p",
    "bootstrap_auroc",
    "card_check",
    "case_table_from_log",
    "clopper_pearson",
    "compute_card",
    "conformal_cut",
    "conformal_split_simulation",
    "cross_fitted_threshold_part",
    "delivered",
    "delivered_rates",
    "draw_group_counts",
    "file_features",
    "fmt_estimate",
    "g_auroc",
    "group_bootstrap",
    "group_codes",
    "group_sum_draws",
    "grouped_folds",
    "kernel_reference",
    "label_swap_null",
    "log_cases",
    "pair_rates",
    "percentile_ci",
    "prevalence_check",
    "read_log",
    "read_scores_csv",
    "recommend_for_card",
    "recommend_policy",
    "run_checks",
    "scene_blind_readers",
    "signal_detection",
    "simulate_cascade",
    "simulate_log",
    "situation_repeat_share",
    "situation_share",
    "spot_stop",
    "verdict",
    "write_card",
]
