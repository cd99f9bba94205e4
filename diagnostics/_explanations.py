"""The card's words: what each Spot-Stop field and each delivered rate means and what to do,
and the convention of the direct answer.  Read by the card (``card.json``'s
``explanations``) and its renderers."""

from __future__ import annotations

__all__ = ["CONVENTION", "DELIVERED_EXPLANATIONS", "EXPLANATIONS", "FIELD_KEYS"]

CONVENTION = (
    "Spot-Stop fields use the paper's convention: S > cut is the answer UNSAFE (the guard's "
    "own rule is S ≥ t, ties UNSAFE; the two differ on exact ties only). They are diagnostics "
    "of the score at one cut, not what the guard delivered: see delivered_*."
)

#: one sentence per Spot-Stop field: what it means and what to do
EXPLANATIONS: dict[str, str] = {
    "auroc": "How well the score ranks unsafe above safe scenes (0.5 chance, 1 perfect; ties "
    "count one half); low → the score itself is weak: change or pair the members, no threshold "
    "fixes it. Over the paired cases, each weighted by its number of pairs (a contrast with 2 "
    "safe and 1 unsafe scene counts its unsafe scene twice), so it shares A's scale.",
    "auroc_all_cases": "AUROC over every case, paired or not; far from `auroc` → the paired "
    "cases are not representative of the log.",
    "direct_balanced_accuracy": "Balanced accuracy of the direct answer S > cut over all "
    "cases (paper convention, at the card's direct cut; not necessarily the deployed rule: "
    "the guard's own is delivered_balanced_accuracy).",
    "R": "Ranking rate: share of contrasts whose unsafe scene scores higher (the paper's R: "
    "ties not ordered). A contrast with several safe or unsafe scenes counts each safe × "
    "unsafe pair.",
    "L": "Share of contrasts with both scenes labelled correctly by S > cut.",
    "W": "Share of contrasts with both scenes labelled wrongly; large → the scores are inverted.",
    "C": "L + W, the contrasts whose two scenes get different labels.",
    "A": "Accuracy of the direct answer on the paired cases (A = ½ + L − C/2): their balanced "
    "accuracy with each case weighted by its number of pairs.",
    "A_star": "Best balanced accuracy any single cut reaches (needs labels: a ceiling, not a "
    "rule); far above A → the cut is misplaced.",
    "G": "The Spot-Stop gap R − L.",
    "null_gap": "E[G0] = (1 − C − T)/2, the gap a label swap inside each pair would show "
    "anyway (T the tied share: a tied pair is ordered in neither orientation; the paper's "
    "(1 − C)/2 assumes no ties); subtract it before reading G.",
    "R_minus_A": "The paper's R − A (ties not ordered) = tie_part + threshold + overlap + "
    "within; with ties it is pulled down by half the tied share, so read R_half_minus_A.",
    "tied_share": "T: share of contrasts whose two scenes score exactly equal; common (≥ 5 %) "
    "→ the score takes few distinct values (discrete or hard labels): a finer readout (e.g. "
    "log-probabilities) would resolve them; a different cut would not.",
    "R_half": "Ranking rate with ties counted one half, R + T/2 (as AUROC counts them).",
    "R_half_minus_A": "Excess of ranking over labelling beyond the label-swap null, "
    "G − E[G0] = R½ − A = threshold + overlap + within (exact with ties); large → the score "
    "knows more than the answer says: read the three parts below.",
    "tie_part": "R − R½ = −T/2: what tied contrasts take off the paper's R − A; a readout "
    "artefact of discrete scores, not a misplaced cut or overlap.",
    "threshold_part": "A* − A, what one shared cut could still fix; large → recalibrate (batch "
    "mean, frozen reference or a cut fitted on labelled cases).",
    "overlap_part": "AUROC − A*, accuracy lost because safe and unsafe scores overlap; only a "
    "better score (better members, Avg-2) reduces it. Compare with g_auroc.",
    "within_part": "R½ − AUROC (ties one half on both sides), order that holds only inside a "
    "contrast; large → a reference scene from the same situation can recentre the score "
    "(situation policy).",
    "g_auroc": "Overlap an equal-variance binormal score with this AUROC would show, "
    "AUROC − Φ(Φ⁻¹(AUROC)/√2); a reference, not a bound.",
    "excess_beyond_g": "R½ − A − g(AUROC), the excess left after the gap a binormal score "
    "expects (ties one half, so tied contrasts do not pull it down); interval above 0 → the "
    "gap is more than forced choice beating yes/no.",
    "kernel_overlap_reference": "Overlap part a kernel-smoothed ROC of these scores predicts; "
    "overlap_part outside its interval → the empirical ROC has dips or ties.",
    "cross_fitted_threshold_part": "Threshold part with the cut chosen on half of the groups "
    "and scored on the other half; the honest share a recalibration can recover.",
    "A_batch": "Accuracy on the paired cases of the batch rule the card recommends (the guard's "
    "`batch` policy, BatchPolicy itself: Avg-2 refitted on the batch's member scores, medians, "
    "IQRs and weights, cut at its mean, ties UNSAFE), refitted on every bootstrap draw (the "
    "draw's cases are the batch; n_boot_checks draws); undefined without member scores (read "
    "A_batch_frozen_iqr).",
    "batch_gain": "A_batch − A, the accuracy the batch rule adds over the direct answer (a "
    "difference: defined even when the threshold part is 0).",
    "batch_recovery": "Share of the threshold part that the batch rule recovers, "
    "(A_batch − A)/(A* − A), A* the best single cut on S; undefined when the threshold part's "
    "interval reaches 0 (the ratio would be unbounded: read batch_gain); near 1 → the batch "
    "rule is enough here (watch prevalence: checks.prevalence).",
    "A_batch_frozen_iqr": "Accuracy on the paired cases of the guard's `batch_frozen_iqr` "
    "rule: the fixed S (frozen medians and IQRs) cut at the batch mean, only the mean "
    "refitted in every draw (S ≥ batch mean, ties UNSAFE). Not the paper's batch rule "
    "(A_batch), which refits the scale too.",
    "batch_frozen_iqr_gain": "A_batch_frozen_iqr − A, what the batch mean of the fixed S adds "
    "over the direct answer.",
    "batch_frozen_iqr_recovery": "Share of the threshold part the batch mean of the fixed S "
    "recovers, (A_batch_frozen_iqr − A)/(A* − A); undefined when the threshold part's interval "
    "reaches 0 (read batch_frozen_iqr_gain).",
    "direct_hit_rate": "Share of unsafe paired scenes with S > cut (paper convention); low → "
    "unsafe scenes score below the cut: lower it or use the conformal policy.",
    "direct_false_alarm_rate": "Share of safe paired scenes with S > cut (paper convention); "
    "high → the cut stops the robot needlessly: raise it.",
    "d_prime": "Equal-variance sensitivity z(H) − z(F) at the direct cut (1/(2n) clipping).",
    "criterion": "Criterion c = −(z(H) + z(F))/2 at the direct cut; far from 0 → the cut "
    "leans to one answer (positive: lenient, negative: strict): recentre.",
    "d_prime_auroc": "Sensitivity the ranking implies, √2 Φ⁻¹(AUROC). At AUROC 1 it is "
    "infinite: shown as > its value at AUROC 1 − 1/(2·n_unsafe·n_safe), half a comparison "
    'below 1 (card.json: that value with bound "lower"); at AUROC 0, < its mirror image.',
}

FIELD_KEYS = tuple(EXPLANATIONS)

DELIVERED_EXPLANATIONS: dict[str, str] = {
    "delivered_balanced_accuracy": "What the guard delivered: the mean of its hit rate and "
    "correct-allow rate, from its own logged answers (the deployed policy, ties and NaN "
    "UNSAFE) against the reviewer labels, over labelled decisions that did not fail closed.",
    "delivered_hit_rate": "Share of labelled unsafe decisions the guard answered UNSAFE; "
    "low → unsafe actions went through: lower the cut or use the conformal policy.",
    "delivered_false_alarm_rate": "Share of labelled safe decisions the guard answered "
    "UNSAFE; high → the robot stopped needlessly.",
    "delivered_by_policy": "The same per policy version (the version id the log records; "
    "'unknown (schema 1)' for rows that do not say), with a replay of the version's stored "
    "policy on its logged scores.",
}
