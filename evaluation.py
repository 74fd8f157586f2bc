"""How predictions are scored and what they are compared against: metrics, the paired bootstrap, target
scaling and the simple baselines.

Every study scores with these: the property studies (experiments 6-8: RMSE, MAE, R^2 and Pearson on
their test splits against the mean and ridge baselines, the Transformer trained on a z-scored target),
and the paired bootstrap wherever two models are compared on the same items (experiments 4-8):

    1. metrics and scaling   rmse, mae, r2, pearson; paired_bootstrap (BOOTSTRAP_METRICS; resampling
                             items, or groups of them, for both models at once); seed_spread (the
                             seed half of the "better" rule); wilson_interval (a proportion's 95 %
                             interval: sampled validity, uniqueness, novelty); ZScore
    2. baselines             ridge_fit, ridge_predict (closed form, Cholesky), RidgeModel; mean_baseline

Standard library only; nothing here needs RDKit or numpy.  Callers import this module by name
(``import evaluation; evaluation.rmse(...)``); ``chemdata`` holds the data, not these names.
"""

import math
import random
from dataclasses import dataclass

__all__ = ["rmse", "mae", "r2", "pearson", "BOOTSTRAP_METRICS", "paired_bootstrap", "paired_bootstrap_statistic",
           "seed_spread", "wilson_interval", "newcombe_interval",
           "ZScore", "RidgeModel", "ridge_fit", "ridge_predict", "mean_baseline"]


# =====================================================================================
# 1. Metrics and target scaling
# =====================================================================================

def _pair(y_true, y_pred):
    """Check two equal-length, non-empty lists and return them as float lists."""
    if len(y_true) != len(y_pred) or not y_true:
        raise ValueError(f"y_true has {len(y_true)} values and y_pred {len(y_pred)} "
                         f"(need the same number, > 0)")
    return [float(v) for v in y_true], [float(v) for v in y_pred]


def rmse(y_true, y_pred):
    """Root mean squared error, in the units of y."""
    t, p = _pair(y_true, y_pred)
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(t, p)) / len(t))


def mae(y_true, y_pred):
    """Mean absolute error, in the units of y."""
    t, p = _pair(y_true, y_pred)
    return sum(abs(a - b) for a, b in zip(t, p)) / len(t)


def r2(y_true, y_pred):
    """Coefficient of determination 1 - SS_res / SS_tot (0 for the mean predictor).

    Raises ValueError if ``y_true`` is constant (SS_tot = 0).
    """
    t, p = _pair(y_true, y_pred)
    mean = sum(t) / len(t)
    ss_tot = sum((a - mean) ** 2 for a in t)
    if ss_tot == 0:
        raise ValueError(f"r2 is undefined: all {len(t)} true values equal {t[0]!r}")
    return 1 - sum((a - b) ** 2 for a, b in zip(t, p)) / ss_tot


def pearson(y_true, y_pred):
    """Pearson correlation coefficient; None if either list is constant
    (e.g. the mean baseline), so that reports stay JSON-safe."""
    t, p = _pair(y_true, y_pred)
    mt, mp = sum(t) / len(t), sum(p) / len(p)
    cov = sum((a - mt) * (b - mp) for a, b in zip(t, p))
    vt = sum((a - mt) ** 2 for a in t)
    vp = sum((b - mp) ** 2 for b in p)
    if vt == 0 or vp == 0:
        return None
    return cov / math.sqrt(vt * vp)


BOOTSTRAP_METRICS = ("rmse", "mae", "mean")


def wilson_interval(k, n, z=1.959963984540054):
    """The Wilson score interval (low, high) of a proportion k / n (95 % with the default z): the interval of
    the true rate p where |k/n - p| <= z sqrt(p (1 - p) / n).  Unlike k/n +- z * se it stays inside [0, 1] and
    is not empty at k = 0 or k = n.  (None, None) when n is 0."""
    if not n:
        return None, None
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval: k = {k} outside 0..n = {n}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_interval(k1, n1, k2, n2, z=1.959963984540054):
    """Newcombe's hybrid score interval (low, high) of the difference k1/n1 - k2/n2 of two independent
    proportions (his method 10, 95 % with the default z): built from each proportion's Wilson interval (l, u),
    low = d - sqrt((p1 - l1)^2 + (u2 - p2)^2), high = d + sqrt((u1 - p1)^2 + (p2 - l2)^2).  (None, None) when
    either n is 0."""
    if not n1 or not n2:
        return None, None
    (l1, u1), (l2, u2) = wilson_interval(k1, n1, z), wilson_interval(k2, n2, z)
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _bootstrap_terms(y_true, pred, metric):
    """Per-entry (value, weight) the metric averages: squared or absolute error, or the score itself
    (metric 'mean'; a None score, e.g. an invalid prediction under 'mean over valid', has weight 0)."""
    if metric == "mean":
        return [(0.0, 0) if v is None else (float(v), 1) for v in pred]
    t, p = _pair(y_true, pred)
    return [((a - b) ** 2 if metric == "rmse" else abs(a - b), 1) for a, b in zip(t, p)]


def _bootstrap_groups(n, groups):
    """{group: [entry indices]} in first-seen order; one group per entry without ``groups``."""
    if groups is None:
        return [[i] for i in range(n)]
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} labels for {n} predictions (need one per prediction)")
    out = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return list(out.values())


def _central_interval(diffs, ci):
    """(low, high): the central ``ci`` percentile interval of the sorted bootstrap differences (nearest rank)."""
    return tuple(diffs[min(len(diffs) - 1, max(0, round(q * (len(diffs) - 1))))] for q in ((1 - ci) / 2, (1 + ci) / 2))


def paired_bootstrap(y_true, pred_a, pred_b, metric="rmse", n_resamples=2000, seed=0, groups=None, ci=0.95):
    """Paired bootstrap of metric(a) - metric(b) over the same test items.

    Test items are drawn with replacement ``n_resamples`` times and both models are scored on every
    draw, so the interval reflects which items happen to be in the test set, paired item by item.
    ``metric``: 'rmse' or 'mae' (against ``y_true``), or 'mean' of per-item scores (top-1 accuracy,
    Tanimoto; ``y_true`` may be None; None scores are left out of the mean, as 'mean over valid').
    ``groups``: one item label per prediction when several seeds' predictions are pooled (a run of A and
    of B per seed, concatenated): an item is drawn with every prediction that carries its label.
    Returns {diff (on the full set), ci_low, ci_high (the central ``ci`` percentile interval), n_items,
    n_resamples, metric}.  Raises ValueError on an unknown metric, unequal lengths or no resamples."""
    if metric not in BOOTSTRAP_METRICS:
        raise ValueError(f"paired_bootstrap: unknown metric {metric!r} (one of {BOOTSTRAP_METRICS})")
    if len(pred_a) != len(pred_b) or not pred_a:
        raise ValueError(f"pred_a has {len(pred_a)} values and pred_b {len(pred_b)} (need the same number, > 0)")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"paired_bootstrap: n_resamples must be a positive int, got {n_resamples!r}")
    ta, tb = (_bootstrap_terms(y_true, p, metric) for p in (pred_a, pred_b))
    sums = [tuple(sum(t[i][k] for i in ix) for t in (ta, tb) for k in (0, 1))
            for ix in _bootstrap_groups(len(pred_a), groups)]
    finish = math.sqrt if metric == "rmse" else (lambda v: v)

    def score(rows):
        sa, wa, sb, wb = (sum(r[k] for r in rows) for k in range(4))
        return None if not wa or not wb else finish(sa / wa) - finish(sb / wb)

    full = score(sums)
    if full is None:
        raise ValueError("paired_bootstrap: a side has no scored prediction (every score is None)")
    rng = random.Random(seed)
    diffs = sorted(d for d in (score(rng.choices(sums, k=len(sums))) for _ in range(n_resamples))
                   if d is not None)
    lo, hi = _central_interval(diffs, ci)
    return {"metric": metric, "diff": full, "ci_low": lo, "ci_high": hi, "n_items": len(sums),
            "n_resamples": n_resamples}


def paired_bootstrap_statistic(a, b, statistic, n_resamples=1000, seed=0, ci=0.95):
    """Paired bootstrap of statistic(a) - statistic(b) for a statistic of a whole sample that is no mean of
    per-item terms (a KS distance, a median): ``a[i]`` and ``b[i]`` are item i's values under A and B (None: no
    value, e.g. an invalid molecule, left out of that side); the items are drawn with replacement
    ``n_resamples`` times and ``statistic`` (a function of a list of values) is computed on both sides of each
    draw.  The same draws as ``paired_bootstrap`` with the same seed (with the mean as ``statistic`` the two
    agree).  Returns {diff (on the full set), ci_low, ci_high, n_items, n_resamples}; ValueError on unequal
    lengths, no items or a side without values."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a has {len(a)} values and b {len(b)} (need the same number, > 0)")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"paired_bootstrap_statistic: n_resamples must be a positive int, got {n_resamples!r}")
    pairs = list(zip(a, b))

    def diff(rows):
        xa, xb = [x for x, _ in rows if x is not None], [y for _, y in rows if y is not None]
        return statistic(xa) - statistic(xb) if xa and xb else None

    full = diff(pairs)
    if full is None:
        raise ValueError("paired_bootstrap_statistic: a side has no value (every value is None)")
    rng = random.Random(seed)
    diffs = sorted(d for d in (diff(rng.choices(pairs, k=len(pairs))) for _ in range(n_resamples)) if d is not None)
    lo, hi = _central_interval(diffs, ci)
    return {"diff": full, "ci_low": lo, "ci_high": hi, "n_items": len(pairs), "n_resamples": n_resamples}


class ZScore:
    """Standardise a target with the training mean and (population) standard deviation.

    ``ZScore().fit(y_train)``; ``transform(y)`` gives (y - mean) / std and
    ``inverse(z)`` maps model outputs back to the target's units, in which
    all metrics are reported.
    """

    def __init__(self, mean=None, std=None):
        """Optionally start from a known ``mean`` and ``std``."""
        self.mean = mean
        self.std = std

    def fit(self, values):
        """Learn mean and std from the training values; returns self."""
        values = [float(v) for v in values]
        if not values:
            raise ValueError("ZScore.fit needs at least one value")
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if std == 0:
            raise ValueError(f"ZScore.fit: standard deviation is 0 (all values equal {values[0]!r})")
        self.mean, self.std = mean, std
        return self

    def _check(self):
        if self.mean is None or self.std is None:
            raise ValueError("ZScore is not fitted: call fit(y_train) first")

    def transform(self, values):
        """(y - mean) / std for every value."""
        self._check()
        return [(float(v) - self.mean) / self.std for v in values]

    def inverse(self, values):
        """z * std + mean for every value (back to the target's units)."""
        self._check()
        return [float(v) * self.std + self.mean for v in values]

    def __repr__(self):
        return f"ZScore(mean={self.mean!r}, std={self.std!r})"


def seed_spread(*sides):
    """The seed spread of a comparison: over its sides (each a list of one per-seed metric value), the
    largest range max - min.  One value on a side spreads 0, so with one seed on every side the spread is 0
    and the seed half of the rule is vacuous (the reports say so).  Every study's "better" needs a gap
    beyond this AND a paired interval that excludes 0: the one definition the property studies
    (``property_common.comparison``) and the language-model ladder (``smiles_lm_ladder.beats_ngram``) use."""
    if not sides or any(len(v) == 0 for v in sides):
        raise ValueError(f"seed_spread: every side needs at least one value, got {[len(v) for v in sides]}")
    return max(max(v) - min(v) for v in sides)


# =====================================================================================
# 2. Baselines: ridge regression and the mean (pure Python)
# =====================================================================================

@dataclass
class RidgeModel:
    """A fitted ridge model: ``y = sum(weights[j] * x[j]) + intercept``."""
    weights: list
    intercept: float
    alpha: float


def _cholesky_solve(A, b):
    """Solve A x = b for a symmetric positive-definite matrix A (lists of lists)."""
    n = len(A)
    L = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = A[i][j] - sum(L[i][k] * L[j][k] for k in range(j))
            if i == j:
                if s <= 0:
                    raise ValueError(f"X^T X + alpha I is not positive definite (pivot {i} = {s!r}); "
                                     f"use a larger alpha")
                L[i][i] = math.sqrt(s)
            else:
                L[i][j] = s / L[j][j]
    z = [0.0] * n                 # L z = b
    for i in range(n):
        z[i] = (b[i] - sum(L[i][k] * z[k] for k in range(i))) / L[i][i]
    x = [0.0] * n                 # L^T x = z
    for i in reversed(range(n)):
        x[i] = (z[i] - sum(L[k][i] * x[k] for k in range(i + 1, n))) / L[i][i]
    return x


def ridge_fit(X, y, alpha=1.0, fit_intercept=True):
    """Ridge regression in closed form: solve (X^T X + alpha I) w = X^T y by Cholesky.

    ``X`` is a list of equal-length rows, ``y`` a list of floats.  The
    intercept (if fitted) is not penalised.  Zero entries are skipped when
    forming X^T X, so sparse rows such as element fractions are fast.
    """
    if not X or len(X) != len(y):
        raise ValueError(f"X has {len(X)} rows but y has {len(y)} values (need the same, > 0)")
    d = len(X[0])
    m = d + 1 if fit_intercept else d
    A = [[0.0] * m for _ in range(m)]
    b = [0.0] * m
    for i, (row, target) in enumerate(zip(X, y)):
        if len(row) != d:
            raise ValueError(f"row {i} of X has {len(row)} columns, expected {d}")
        nonzero = [(j, v) for j, v in enumerate(row) if v]
        if fit_intercept:
            nonzero.append((d, 1.0))
        for j, vj in nonzero:
            b[j] += vj * target
            row_j = A[j]
            for k, vk in nonzero:
                row_j[k] += vj * vk
    for j in range(d):
        A[j][j] += alpha
    solution = _cholesky_solve(A, b)
    return RidgeModel(weights=solution[:d], intercept=solution[d] if fit_intercept else 0.0,
                      alpha=alpha)


def ridge_predict(model, X):
    """Predictions of a ``RidgeModel`` for the rows of ``X``."""
    w, b = model.weights, model.intercept
    return [b + sum(wj * xj for wj, xj in zip(w, row) if xj) for row in X]


def mean_baseline(y_train, n):
    """Predict the training mean ``n`` times (the r2 = 0 reference)."""
    if not y_train:
        raise ValueError("mean_baseline needs at least one training value")
    return [sum(y_train) / len(y_train)] * n
