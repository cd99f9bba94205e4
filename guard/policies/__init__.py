"""Threshold policies: a registry of kinds, one decision rule, the conformal rank, ``policy.yaml``.

* :mod:`._rule` — THE rule: UNSAFE when ``score ≥ threshold`` (ties and NaN UNSAFE).
* :mod:`._conformal_rule` — the conformal rank (marginal and PAC) and the one-case-per-
  situation reduction: :func:`conformal_cut`.
* :mod:`._registry` — the kinds by name (:data:`POLICY_KINDS`): ``direct``, ``frozen``,
  ``conformal``, ``batch`` (the paper's rule), ``batch_frozen_iqr``, ``situation``,
  ``cascade``; one module each, all deriving from :class:`Policy`.
* :mod:`._plan` — :class:`ScoringPlan`: what a policy asks the guard to score (which
  members, in what order, on which scenes); the guard runs it.
* :mod:`._decide` — :func:`batch_inputs`, :func:`decide_batch`, :func:`replay`.
* :mod:`._config` — :class:`PolicyConfig`, :func:`load_policy`, :func:`dump_policy`,
  :func:`policy_text`.

The runtime, ``calibrate``, ``diagnostics``, the sidecar and the CLI all call these; none
keeps a copy of a rule.
"""

from spotstop.guard.policies._base import (
    BatchInputs,
    DecisionError,
    FitContext,
    LoadContext,
    NotFittedError,
    Policy,
    PolicyError,
    PolicyMismatchError,
    SituationWindows,
    Thresholds,
    Verdict,
)
from spotstop.guard.policies._batch import BatchPolicy
from spotstop.guard.policies._batch_frozen_iqr import BatchFrozenIqrPolicy
from spotstop.guard.policies._cascade import CUT_KINDS, CascadePolicy, cascade_band
from spotstop.guard.policies._config import (
    POLICY_SCHEMA_VERSION,
    PolicyConfig,
    TextInScene,
    check_policy_fits,
    check_policy_matches,
    dump_policy,
    fusion_key,
    load_policy,
    policy_text,
)
from spotstop.guard.policies._conformal import ConformalPolicy
from spotstop.guard.policies._conformal_rule import (
    ConformalFit,
    CutChoice,
    binom_cdf,
    conformal_cut,
    conformal_min_n,
    conformal_pac_min_n,
    conformal_pac_rank,
    conformal_rank,
    one_per_situation,
)
from spotstop.guard.policies._decide import (
    Decided,
    batch_inputs,
    decide_batch,
    entered_scores,
    logged_ran,
    replay,
)
from spotstop.guard.policies._direct import DirectPolicy
from spotstop.guard.policies._frozen import MIN_FROZEN_POOL, FrozenPolicy
from spotstop.guard.policies._plan import ScoringPlan, ScoringStage
from spotstop.guard.policies._registry import (
    POLICY_KINDS,
    policy_class,
    policy_from_dict,
    policy_kinds,
)
from spotstop.guard.policies._rule import (
    Label,
    exact_sum,
    float_at_or_above,
    is_unsafe,
    label_of,
    mean_cut,
    n_safe,
    unsafe_mask,
)
from spotstop.guard.policies._situation import (
    SituationPolicy,
    check_prior_weight,
    situation_prior_weight,
)

__all__ = [
    "CUT_KINDS",
    "MIN_FROZEN_POOL",
    "POLICY_KINDS",
    "POLICY_SCHEMA_VERSION",
    "BatchFrozenIqrPolicy",
    "BatchInputs",
    "BatchPolicy",
    "CascadePolicy",
    "ConformalFit",
    "ConformalPolicy",
    "CutChoice",
    "Decided",
    "DecisionError",
    "DirectPolicy",
    "FitContext",
    "FrozenPolicy",
    "Label",
    "LoadContext",
    "NotFittedError",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "PolicyMismatchError",
    "ScoringPlan",
    "ScoringStage",
    "SituationPolicy",
    "SituationWindows",
    "TextInScene",
    "Thresholds",
    "Verdict",
    "batch_inputs",
    "binom_cdf",
    "cascade_band",
    "check_policy_fits",
    "check_policy_matches",
    "check_prior_weight",
    "conformal_cut",
    "conformal_min_n",
    "conformal_pac_min_n",
    "conformal_pac_rank",
    "conformal_rank",
    "decide_batch",
    "dump_policy",
    "entered_scores",
    "exact_sum",
    "float_at_or_above",
    "fusion_key",
    "is_unsafe",
    "label_of",
    "load_policy",
    "logged_ran",
    "mean_cut",
    "n_safe",
    "one_per_situation",
    "policy_class",
    "policy_from_dict",
    "policy_kinds",
    "policy_text",
    "replay",
    "situation_prior_weight",
    "unsafe_mask",
]
