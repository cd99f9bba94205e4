"""The scene-blind file reader's model: an L2-penalised logistic regression (numpy + scipy),
grouped folds and out-of-fold scores."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit, log_expit
from spotstop.diagnostics._errors import DataError

__all__ = ["LogisticRegression", "grouped_folds", "oof_scores"]


class LogisticRegression:
    """L2-penalised logistic regression on standardised features (numpy + scipy only).

    Minimises ``C · Σ logloss + ½‖w‖²`` with an unpenalised intercept, like scikit-learn's
    ``LogisticRegression(C=C)``, solved by damped Newton steps; features are standardised with the training mean and
    standard deviation (constant columns are left at 0).  Settings in the constructor, learned
    state (``coef_``, ``intercept_``, ``mean_``, ``scale_``) after :meth:`fit`.
    """

    def __init__(self, C: float = 1.0, max_iter: int = 100) -> None:
        self.C = C
        self.max_iter = max_iter

    def fit(self, X: NDArray[np.float64], y: NDArray[np.int8]) -> LogisticRegression:
        """Fit on features ``X`` (n, p) and labels ``y`` in {0, 1}."""
        X = np.asarray(X, dtype=np.float64)
        t = np.asarray(y, dtype=np.float64)
        self.mean_ = X.mean(axis=0)
        sd = X.std(axis=0)
        self.scale_ = np.where(sd > 0, sd, 1.0)
        Z = (X - self.mean_) / self.scale_
        Z1 = np.column_stack([Z, np.ones(Z.shape[0])])
        C = self.C
        pen = np.ones(Z1.shape[1])
        pen[-1] = 0.0  # the intercept is not penalised

        def objective(theta: NDArray[np.float64]) -> float:
            z = Z1 @ theta
            return -C * float(log_expit(np.where(t == 1, z, -z)).sum()) + 0.5 * float(
                (pen * theta) @ theta
            )

        theta = np.zeros(Z1.shape[1])
        obj = objective(theta)
        self.n_iter_ = 0
        # damped Newton: the objective is smooth and strictly convex in the weights
        for it in range(1, self.max_iter + 1):
            self.n_iter_ = it
            p = expit(Z1 @ theta)
            grad = C * (Z1.T @ (p - t)) + pen * theta
            hess = C * (Z1.T * (p * (1 - p))) @ Z1 + np.diag(pen)
            hess[-1, -1] += 1e-12
            step = np.linalg.solve(hess, grad)
            lam = 1.0
            while True:
                new = theta - lam * step
                new_obj = objective(new)
                if new_obj <= obj + 1e-12 or lam < 1e-8:
                    break
                lam /= 2
            theta, obj_old, obj = new, obj, new_obj
            if float(np.abs(grad).max()) < 1e-10 or obj_old - obj < 1e-13 * max(1.0, abs(obj)):
                break
        res_x = theta
        self.coef_ = res_x[:-1] / self.scale_
        self.intercept_ = float(res_x[-1] - self.coef_ @ self.mean_)
        return self

    def decision_function(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Log-odds of UNSAFE."""
        if not hasattr(self, "coef_"):
            raise DataError("LogisticRegression is not fitted yet; call .fit(X, y) first.")
        return np.asarray(np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_)


def grouped_folds(group: NDArray[np.intp], n_folds: int = 5) -> NDArray[np.intp]:
    """Fold of each case, whole groups per fold, like scikit-learn's ``GroupKFold``: groups
    sorted by size (largest first, ties by code) go to the currently smallest fold."""
    codes, inv = np.unique(group, return_inverse=True)
    sizes = np.bincount(inv.reshape(-1))
    if codes.size < n_folds:
        raise DataError(f"grouped folds need at least n_folds={n_folds} groups; got {codes.size}.")
    order = np.argsort(-sizes, kind="stable")
    load = np.zeros(n_folds)
    fold_of = np.empty(codes.size, dtype=np.intp)
    for g in order:
        f = int(np.argmin(load))
        fold_of[g] = f
        load[f] += sizes[g]
    return fold_of[inv.reshape(-1)]


def oof_scores(
    X: NDArray[np.float64], y: NDArray[np.int8], folds: NDArray[np.intp]
) -> NDArray[np.float64]:
    out = np.empty(y.size)
    for f in np.unique(folds):
        te = folds == f
        model = LogisticRegression().fit(X[~te], y[~te])
        out[te] = model.decision_function(X[te])
    return out
