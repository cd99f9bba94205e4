"""Scene-blind readers of the label and their card check (seed 000, Sec. 2, Supp. B, D).

The file reader (a logistic regression on image-file features, out of fold over grouped
folds, with a permutation p value), the best single cut on the longest side (chosen on held-out
halves), the request-only and image-minus-gray AUROCs and the member AUROCs.  Intervals of
AUROCs are group-bootstrap intervals (``n`` = cases); the longest-side accuracy is a band over
splits.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from spotstop.diagnostics._bootstrap import bootstrap_auroc
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt, fmt_p
from spotstop.diagnostics._data import CaseTable
from spotstop.diagnostics._errors import UndefinedMetricWarning
from spotstop.diagnostics._logistic import grouped_folds, oof_scores
from spotstop.diagnostics._metrics import auroc_unchecked
from spotstop.diagnostics._resample import as_rng, band, nan_estimate, random_halves
from spotstop.diagnostics._results import Estimate

__all__ = [
    "LongestSideRule",
    "SceneBlindCheck",
    "SceneBlindReaders",
    "file_features",
    "scene_blind_readers",
]


def file_features(table: CaseTable) -> tuple[NDArray[np.float64], list[str]] | None:
    """Image-file features: log width, log height, log aspect, log bytes, log longest side,
    JPEG quality (if the column has values) and a one-hot of ``format`` (if present).

    Missing values are filled with the column median (a file reader sees every file).
    Returns None when width, height or bytes are absent (or have no value at all).
    """
    w, h, nb = table.width, table.height, table.n_bytes
    if w is None or h is None or nb is None:
        return None
    if not all(np.isfinite(x).any() for x in (w, h, nb)):
        return None  # a column with no value at all: nothing for a file reader to read
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = {
            "log_width": np.log(w),
            "log_height": np.log(h),
            "log_aspect": np.log(w / h),
            "log_bytes": np.log(nb),
            "log_longest_side": np.log(np.maximum(w, h)),
        }
    if table.jpeg_quality is not None and np.isfinite(table.jpeg_quality).any():
        cols["jpeg_quality"] = table.jpeg_quality.copy()
    if table.format is not None:
        for fmt in sorted(set(table.format.tolist()) - {""}):
            cols[f"format_{fmt}"] = (table.format == fmt).astype(float)
    X = np.column_stack(list(cols.values()))
    for j in range(X.shape[1]):
        bad = ~np.isfinite(X[:, j])
        if bad.all():
            X[:, j] = 0.0
        elif bad.any():
            X[bad, j] = np.median(X[~bad, j])
    return X, list(cols)


def _both_classes_in_a_unit(y: NDArray[np.int8], unit: NDArray[np.intp]) -> bool:
    """Whether some permutation unit (a contrast, else a situation) holds both classes."""
    inv = np.unique(unit, return_inverse=True)[1].reshape(-1)
    lo = np.full(int(inv.max()) + 1 if inv.size else 0, 2)
    hi = np.full_like(lo, -1)
    np.minimum.at(lo, inv, y)
    np.maximum.at(hi, inv, y)
    return bool((lo != hi).any())


def _swap_within(
    gen: np.random.Generator, y: NDArray[np.int8], unit: NDArray[np.intp]
) -> NDArray[np.int8]:
    """Permute labels within each unit (a contrast or, failing that, a group)."""
    keys = gen.random(y.size) + unit
    order = np.argsort(keys)
    base = np.argsort(unit, kind="stable")
    out = np.empty_like(y)
    out[order] = y[base]
    return out


@dataclass(frozen=True)
class LongestSideRule:
    """Best single cut on the longest image side, chosen on held-out halves (Supp. B).

    Over ``n_splits`` random halves of the groups, the cut and direction with the highest
    accuracy on one half are scored on the other.  ``accuracy``: mean held-out accuracy and its
    band over splits; ``cut``/``direction``: the most often chosen rule ("longest side > cut
    means unsafe" for direction ``'>'``); ``cut_share``: how often it was chosen.
    """

    accuracy: Estimate
    cut: float
    direction: str
    cut_share: float


@dataclass(frozen=True)
class SceneBlindReaders:
    """Readers that never see the scene (Sec. 2, Supp. D); None where the columns are absent.

    ``file_reader``: AUROC of the out-of-fold logistic regression on image-file features
    (grouped folds; interval: group bootstrap of the out-of-fold scores, not refitted);
    ``file_reader_p``: permutation p value from refits with labels swapped within contrasts
    (within groups for cases without a contrast).  ``request_only``: AUROC of ``score_text``;
    ``image_minus_gray``: AUROC of ``score - score_gray``; ``members``: AUROC per member score;
    ``file_reader_unmeasured``: why the file reader was not fitted, when it was not.
    """

    file_reader: Estimate | None
    file_reader_p: float
    file_features: tuple[str, ...]
    longest_side: LongestSideRule | None
    request_only: Estimate | None
    image_minus_gray: Estimate | None
    members: Mapping[str, Estimate] = field(default_factory=dict)
    #: why ``file_reader`` is None (what is missing and what to do); "" when it was measured
    file_reader_unmeasured: str = ""


def _longest_side_rule(
    table: CaseTable, longest: NDArray[np.float64], n_splits: int, gen: np.random.Generator
) -> LongestSideRule:
    y = table.label
    ok = np.isfinite(longest)
    halves = random_halves(gen, n_splits, table.n_groups)[:, table.group]
    v = np.unique(longest[ok])
    cand = np.concatenate([[-np.inf], v])  # rule: longest > t (or <= t)
    accs, rules = [], []
    for h in halves:
        fit, ev = h & ok, ~h & ok
        if fit.sum() == 0 or ev.sum() == 0:
            continue
        gt = longest[fit][None, :] > cand[:, None]
        acc_gt = (gt == (y[fit] == 1)[None, :]).mean(axis=1)
        j_gt, j_le = int(np.argmax(acc_gt)), int(np.argmax(1 - acc_gt))
        if acc_gt[j_gt] >= 1 - acc_gt[j_le]:
            t, d = cand[j_gt], ">"
            pred = longest[ev] > t
        else:
            t, d = cand[j_le], "<="
            pred = longest[ev] <= t
        accs.append(float((pred == (y[ev] == 1)).mean()))
        rules.append((float(t), d))
    if not accs:
        return LongestSideRule(nan_estimate(), math.nan, "", math.nan)
    (t, d), k = Counter(rules).most_common(1)[0]
    return LongestSideRule(band(np.asarray(accs)), t, d, k / len(rules))


def scene_blind_readers(
    table: CaseTable,
    *,
    n_folds: int = 5,
    n_permutations: int = 200,
    n_splits: int = 200,
    n_boot: int = 1000,
    rng: np.random.Generator | int | None = None,
) -> SceneBlindReaders:
    """Scene-blind readers of the label: the file reader, the longest-side rule, the
    request-only and image-minus-gray AUROCs, and the member AUROCs."""
    gen = as_rng(rng)
    y, grp = table.label, table.group
    feats = file_features(table)
    file_est: Estimate | None = None
    p = math.nan
    names: tuple[str, ...] = ()
    longest_rule = None
    n_groups = int(np.unique(grp).size)
    absent = [name for c, name in ((0, "SAFE"), (1, "UNSAFE")) if not (y == c).any()]
    if feats is None:
        unmeasured = (
            "the cases lack image width, height and bytes: log the image metadata to check it"
        )
    elif n_groups < n_folds:
        unmeasured = (
            f"these cases form {n_groups} group(s), fewer than the {n_folds} its grouped fit "
            "needs: label more situations to check it"
        )
    elif absent:
        unmeasured = (
            f"the labels hold one class only (no {' or '.join(absent)} case): label cases of "
            "both classes to check it"
        )
    else:
        unmeasured = ""
    if feats is not None and n_groups < n_folds:
        warnings.warn(
            f"the file reader needs at least n_folds={n_folds} independent groups for its "
            f"grouped out-of-fold fit; these cases form {n_groups}. Its AUROC is reported as "
            "undefined (NaN); label more contrasts/situations.",
            UndefinedMetricWarning,
            stacklevel=2,
        )
    elif feats is not None and (y == 0).any() and (y == 1).any():
        X, cols = feats
        names = tuple(cols)
        folds = grouped_folds(grp, n_folds)
        oof = oof_scores(X, y, folds)
        file_est = bootstrap_auroc(y, oof, grp, n_boot=n_boot, rng=gen)
        codes = np.unique(table.contrast_id, return_inverse=True)[1].reshape(-1)
        unit = np.where(table.contrast_id != "", codes, codes.max() + 1 + grp)
        if _both_classes_in_a_unit(y, unit):
            null = np.array(
                [
                    auroc_unchecked(yp, oof_scores(X, yp, folds))
                    for yp in (_swap_within(gen, y, unit) for _ in range(n_permutations))
                ]
            )
            p = float((1 + np.sum(null >= file_est.value)) / (1 + null.size))
        # else no swap within a unit moves a label: every draw of the null would be the
        # observed AUROC and p = 1 whatever it is; the test cannot run (p stays NaN)
        longest = np.maximum(np.asarray(table.width), np.asarray(table.height))
        longest_rule = _longest_side_rule(table, longest, n_splits, gen)

    def auc_of(values: NDArray[np.float64] | None) -> Estimate | None:
        if values is None:
            return None
        ok = np.isfinite(values)
        if ok.sum() == 0:
            return None
        return bootstrap_auroc(y[ok], values[ok], grp[ok], n_boot=n_boot, rng=gen)

    gray = None if table.score_gray is None else table.score - table.score_gray
    members = {k: auc_of(v) for k, v in table.member_scores.items()}
    return SceneBlindReaders(
        file_reader=file_est,
        file_reader_p=p,
        file_features=names,
        longest_side=longest_rule,
        request_only=auc_of(table.score_text),
        image_minus_gray=auc_of(gray),
        members=MappingProxyType({k: v for k, v in members.items() if v is not None}),
        file_reader_unmeasured=unmeasured,
    )


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


#: a file reader whose AUROC interval lies above 0.5 with a permutation p below this leaks
LEAK_P = 0.05


class SceneBlindCheck(CardCheck):
    """:func:`scene_blind_readers` on the card's cases."""

    name: ClassVar[str] = "scene_blind"
    title: ClassVar[str] = "Scene-blind readers"
    explanation: ClassVar[str] = (
        "Readers that never see the scene; a file reader AUROC well above 0.5 (e.g. 0.8) → "
        "the label leaks through the image files (size, format): control it before trusting "
        "the scene score; a high request-only AUROC → the text alone carries the label."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        blind = scene_blind_readers(ctx.table, n_boot=ctx.n_boot, rng=ctx.rng)
        ls = blind.longest_side
        data = {
            "file_reader_auroc": blind.file_reader,
            "file_reader_permutation_p": Estimate.point(blind.file_reader_p, len(ctx.table)),
            "file_features": list(blind.file_features),
            "longest_side": None
            if ls is None
            else {
                "accuracy": ls.accuracy,
                "cut": ls.cut,
                "direction": ls.direction,
                "cut_share": ls.cut_share,
            },
            "request_only_auroc": blind.request_only,
            "image_minus_gray_auroc": blind.image_minus_gray,
            "member_auroc": dict(blind.members),
        }
        has_files = file_features(ctx.table) is not None
        missing = [
            what
            for what, absent in (
                ("image-file columns (width, height, bytes)", not has_files),
                ("request-only score (score_text)", blind.request_only is None),
                ("gray-image score (score_gray)", blind.image_minus_gray is None),
            )
            if absent
        ]
        data["not_measured"] = missing
        rows: list[tuple[str, str]] = []
        if has_files:
            p_txt = "" if math.isnan(blind.file_reader_p) else f" ({fmt_p(blind.file_reader_p)})"
            fr_txt = (
                "undefined: too few groups or one class (see the warnings)"
                if blind.file_reader is None
                else f"{fmt(blind.file_reader, pct=False)}{p_txt}"
            )
            rows.append(("file reader AUROC (image size, bytes, format)", fr_txt))
            if ls is not None and not math.isnan(ls.cut):
                rows.append(
                    (
                        "longest-side rule, held-out accuracy",
                        f"{fmt(ls.accuracy)} % (longest side {ls.direction} {ls.cut:g}, chosen "
                        f"in {100 * ls.cut_share:.0f} % of splits)",
                    )
                )
        if blind.request_only is not None:
            rows.append(("request-only AUROC", fmt(blind.request_only, pct=False)))
        if blind.image_minus_gray is not None:
            rows.append(("image − gray AUROC", fmt(blind.image_minus_gray, pct=False)))
        rows += [(f"member {k} AUROC", fmt(v, pct=False)) for k, v in blind.members.items()]
        if missing:
            rows.append(
                (
                    "not measured",
                    f"the cases have no {_join(missing)}, so no reader of "
                    f"{'them' if len(missing) > 1 else 'it'} ran; add "
                    f"{'them' if len(missing) > 1 else 'it'} to the input to check whether "
                    "the label leaks there.",
                )
            )
        return CheckResult(data, tuple(rows), result=blind)
