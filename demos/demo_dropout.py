"""Supplementary - dropout statistics: what inverted dropout does to a real causal attention matrix.

The library's model has no dropout on purpose (gradient checks and reruns stay deterministic), so
dropout is implemented here, in a few lines, and studied on its own.  Inverted dropout keeps each
attention weight w with probability 1 - p and rescales the survivors by 1 / (1 - p):

    w_hat = w * m / (1 - p),   m ~ Bernoulli(1 - p)   =>   E[w_hat] = w,  std(w_hat) = w sqrt(p / (1 - p)).

The attention matrix is real: head 0 of core.MultiHeadAttention(d, H, causal=True) after a forward pass
on a random 5-row input (``mha.heads[0][3]``), a 5 x 5 lower-triangular matrix whose rows sum to 1;
the values V of that head (``mha.heads[0][2]``) give the context vectors o_i = sum_j w_hat_ij V_j.
For each p, ``n_masks`` independent masks are drawn over all 25 entries, each entry's keep/drop draws from
its own stream ``core.keyed_rng("dropout masks", seed, p, i, j)``: a p's masks do not depend on the other p's,
and n masks are the first n of any larger count (a QUICK run's masks open the full run's).

Results (``results`` in figures/results_dropout.json):

``attention_matrix`` (5 x 5), ``values`` (5 x d_h): the matrices the masks act on.
``dropout`` - list of records, one per p:
    p, n_masks
    noise_scale_closed_form      sqrt(p / (1 - p)): the relative noise on every kept weight;
    noise_scale_measured         mean over the non-zero entries of std(w_hat_ij) / w_ij.
    max_abs_bias                 max over entries of |mean(w_hat_ij) - w_ij| (E[w_hat] = w: unbiased),
    max_bias_se, max_bias_in_se  the Monte Carlo standard error std(w_hat_ij)/sqrt(n_masks) of that
                                 entry, and the bias in units of it;
    max_z                        max over non-zero entries of |bias| / SE (about 2-3 for 15 entries
                                 when there is no real bias).
    rows                         list of per-row records {row, n_nonzero, sum_mean, sum_std,
                                 sum_std_closed_form (= sqrt(p/(1-p) sum_j w_ij^2)), sum_std_rel_err,
                                 sum_std_se (Monte Carlo standard error of sum_std, from the measured
                                 4th moment), sum_std_z (= |measured - closed form| / sum_std_se;
                                 None when the standard error is 0, as for row 0 at p = 0.5),
                                 zero_frac (fraction of masks that zero the whole row),
                                 zero_prob_closed_form (= p ** n_nonzero), zero_frac_z (binomial z)}.
                                 A dropped-out row no longer sums to 1: the row sum is itself noisy.
    row_sum_std_max_rel_err      max over rows of |measured - closed form| / closed form;
    row_sum_std_max_z            the same gap in Monte Carlo standard errors (max over the rows
                                 where the standard error is non-zero).
    context_var_max_rel_err      max over rows i and components c of the relative error of the
                                 measured Var(o_ic) against p/(1-p) sum_j w_ij^2 V_jc^2;
    context_var_max_z            max of that gap in Monte Carlo standard errors of the variance.
    context_rel_noise            per row i: the relative noise on the context VECTOR,
                                 sqrt(E||o_hat_i - o_i||^2) / ||o_i|| (``measured``, o_i the context
                                 without dropout) and its closed form sqrt(p/(1-p) sum_j w_ij^2 ||V_j||^2)
                                 / ||o_i||; ``closed_form_over_noise_scale`` is the same divided by
                                 sqrt(p/(1-p)), a property of the matrix alone, so the ratio between
                                 two p is exactly the ratio of their noise scales.
    context_rel_noise_mean, context_rel_noise_closed_form_mean   the same averaged over the rows.
                                 (A relative error of a few % is expected at small p: the kept/dropped
                                 noise is heavy-tailed, so a variance needs many masks to pin down.)
    masked_mean_abs              mean |w_hat| over the future (causally masked) positions, over all
                                 masks: dropout multiplies zeros, so this is exactly 0.0;
                                 masked_nonzero_count counts any non-zero value there (0).
    row_zero_frac_mean, row_zero_prob_closed_form_mean
                                 the fully-zeroed-row probability averaged over the 5 rows.
    example_mask                 the dropped-out matrix of the first mask (for a figure).
``entries`` - list of per-entry records {p, i, j, w, mean, bias, se, z} (z None for masked entries).
``checks`` - booleans for the smoke tests: masked positions exactly zero, attention rows sum to 1,
    and every Monte Carlo estimate within 5 of its standard errors of the closed form.

Usage: python demos/demo_dropout.py [--seed 0]; QUICK=1 uses 10,000 masks (output in figures/quick/).
"""
import math
import os
import random
import sys
from operator import mul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import transformer as core

FULL = {"d": 8, "n_heads": 2, "T": 5, "head": 0, "p": [0.05, 0.1, 0.5], "n_masks": 100_000}
QUICK_OVERRIDES = {"n_masks": 10_000}


def inverted_dropout_mc(A, p, n_masks, seed):
    """Inverted dropout of the matrix A under ``n_masks`` independent masks, stored entry-major:
    out[i][j] is the list over masks of w_hat_ij = A_ij * m / (1 - p), m = 1 with probability 1 - p, drawn
    from entry (i, j)'s stream keyed by (seed, p, i, j) (``core.keyed_rng``).

    (Entry-major storage keeps every inner loop a flat list comprehension: 100k masks x 25 entries
    take seconds in pure Python.)"""
    keep_scale = 1.0 / (1.0 - p)
    out = []
    for i, row in enumerate(A):
        out_row = []
        for j, w in enumerate(row):
            r = core.keyed_rng("dropout masks", seed, float(p), i, j).random
            kept = w * keep_scale
            out_row.append([kept if r() >= p else 0.0 for _ in range(n_masks)])
        out.append(out_row)
    return out


def _mean_var(xs):
    """Mean and unbiased variance via exactly rounded sums (C-level passes)."""
    n = len(xs)
    s = math.fsum(xs)
    m = s / n
    var = (math.fsum(map(mul, xs, xs)) - s * m) / (n - 1)
    return m, max(var, 0.0)


def _var_se(xs, mean, var):
    """Monte Carlo standard error of a sample variance: sqrt((m4 - var^2) / n), m4 the 4th central moment."""
    n = len(xs)
    m4 = math.fsum((x - mean) ** 4 for x in xs) / n
    return math.sqrt(max(m4 - var * var, 0.0) / n)


def _z(gap, se):
    """|gap| in standard errors; None when the standard error is 0 (e.g. a symmetric two-point
    distribution, whose sample variance has no first-order Monte Carlo error)."""
    return abs(gap) / se if se > 0 else None


def _rel(measured, closed):
    return abs(measured - closed) / closed if closed else None


def entry_stats(A, W, p, n_masks):
    """Per entry (i, j): the Monte Carlo mean of w_hat_ij against w_ij (unbiasedness) with its standard
    error; the noise-to-weight ratios std(w_hat) / w of the kept entries; and the totals over the causally
    masked (future) positions: (sum |w_hat|, number of non-zero w_hat, number of samples)."""
    T = len(A)
    entries, ratios = [], []
    masked_abs, masked_nonzero, masked_n = 0.0, 0, 0
    for i in range(T):
        for j in range(T):
            w, col = A[i][j], W[i][j]
            mean, var = _mean_var(col)
            se = math.sqrt(var / n_masks)
            bias = mean - w
            entries.append({"p": p, "i": i, "j": j, "w": w, "mean": mean, "bias": bias, "se": se,
                            "z": abs(bias) / se if w > 0 and se > 0 else None})
            if w > 0:
                ratios.append(math.sqrt(var) / w)
            else:                                              # a causally masked (future) position
                masked_abs += math.fsum(map(abs, col))
                masked_nonzero += sum(1 for x in col if x != 0.0)
                masked_n += n_masks
    return entries, ratios, (masked_abs, masked_nonzero, masked_n)


def row_sum_stats(i, A_i, cols, p, n_masks):
    """Row i's sum of w_hat over masks: its std against sqrt(p / (1 - p) * sum_j w_ij^2), and how often
    the whole row is dropped against p^(non-zero weights)."""
    nnz = sum(1 for w in A_i if w > 0)
    sums = list(map(sum, zip(*cols)))                      # row sum of w_hat, per mask
    s_mean, s_var = _mean_var(sums)
    s_std = math.sqrt(s_var)
    std_se = _var_se(sums, s_mean, s_var) / (2.0 * s_std)  # delta method: se(std) = se(var) / (2 std)
    sum_sq = math.fsum(w * w for w in A_i)
    closed = math.sqrt(p / (1.0 - p) * sum_sq)
    zero_frac = sum(1 for s in sums if s == 0.0) / n_masks  # weights are >= 0: sum 0 <=> all dropped
    zero_closed = p ** nnz
    return {"row": i, "n_nonzero": nnz, "sum_mean": s_mean, "sum_std": s_std,
            "sum_std_closed_form": closed, "sum_std_rel_err": _rel(s_std, closed),
            "sum_std_se": std_se, "sum_std_rel_se": std_se / s_std if s_std else None,
            "sum_std_z": _z(s_std - closed, std_se),
            "zero_frac": zero_frac, "zero_prob_closed_form": zero_closed,
            "zero_frac_z": _z(zero_frac - zero_closed, math.sqrt(zero_closed * (1 - zero_closed) / n_masks))}


def context_noise(i, A, Vh, cols, p, n_masks, noise):
    """The context vector o_i = sum_j w_hat_ij V_j under the masks: per component c its variance against
    p / (1 - p) * sum_j (w_ij V_jc)^2 (relative error, and the gap in standard errors: None where the
    standard error is 0), and the relative noise |o_i - E o_i| / |E o_i| of the whole vector.
    Returns (record of row i, [relative error per component], [z per component])."""
    T, d_h = len(A), len(Vh[0])
    errs, zs = [], []
    sq_dev, o_true_sq, closed_sq = 0.0, 0.0, 0.0            # for the relative noise on the vector o_i
    for c in range(d_h):                                   # context component o_ic = sum_j w_hat_ij V_jc
        o = [0.0] * n_masks
        for j in range(T):
            v = Vh[j][c]
            if A[i][j] > 0:
                o = [a + x * v for a, x in zip(o, cols[j])]
        o_mean, o_var = _mean_var(o)
        closed_var = p / (1.0 - p) * math.fsum((A[i][j] * Vh[j][c]) ** 2 for j in range(T))
        true_c = math.fsum(A[i][j] * Vh[j][c] for j in range(T))
        sq_dev += math.fsum((x - true_c) ** 2 for x in o) / n_masks
        o_true_sq += true_c * true_c
        closed_sq += closed_var
        errs.append(_rel(o_var, closed_var))
        zs.append(_z(o_var - closed_var, _var_se(o, o_mean, o_var)))
    record = {"row": i, "measured": math.sqrt(sq_dev / o_true_sq),
              "closed_form": math.sqrt(closed_sq / o_true_sq),
              "closed_form_over_noise_scale": math.sqrt(closed_sq / o_true_sq) / noise}
    return record, errs, zs


def analyse(A, Vh, p, n_masks, seed):
    """Everything measured at dropout rate p over ``n_masks`` masks: (record, per-entry list)."""
    T = len(A)
    W = inverted_dropout_mc(A, p, n_masks, seed)
    noise = math.sqrt(p / (1.0 - p))
    entries, ratios, (masked_abs, masked_nonzero, masked_n) = entry_stats(A, W, p, n_masks)
    worst = max((e for e in entries if e["w"] > 0), key=lambda e: abs(e["bias"]))
    rows, ctx_err, ctx_z, ctx_noise = [], 0.0, 0.0, []
    for i in range(T):
        rows.append(row_sum_stats(i, A[i], W[i], p, n_masks))
        row_noise, errs, zs = context_noise(i, A, Vh, W[i], p, n_masks, noise)
        for err, z in zip(errs, zs):
            ctx_err = max(ctx_err, err)
            ctx_z = ctx_z if z is None else max(ctx_z, z)
        ctx_noise.append(row_noise)
    record = {
        "p": p, "n_masks": n_masks,
        "noise_scale_closed_form": noise,
        "noise_scale_measured": math.fsum(ratios) / len(ratios),
        "max_abs_bias": abs(worst["bias"]), "max_bias_se": worst["se"], "max_bias_in_se": worst["z"],
        "max_z": max(e["z"] for e in entries if e["z"] is not None),
        "rows": rows,
        "row_sum_std_max_rel_err": max(r["sum_std_rel_err"] for r in rows),
        "row_sum_std_max_z": max(r["sum_std_z"] for r in rows if r["sum_std_z"] is not None),
        "context_var_max_rel_err": ctx_err,
        "context_var_max_z": ctx_z,
        "context_rel_noise": ctx_noise,
        "context_rel_noise_mean": math.fsum(x["measured"] for x in ctx_noise) / T,
        "context_rel_noise_closed_form_mean": math.fsum(x["closed_form"] for x in ctx_noise) / T,
        "masked_mean_abs": masked_abs / masked_n if masked_n else None,
        "masked_nonzero_count": masked_nonzero,
        "row_zero_frac_mean": math.fsum(r["zero_frac"] for r in rows) / T,
        "row_zero_prob_closed_form_mean": math.fsum(r["zero_prob_closed_form"] for r in rows) / T,
        "example_mask": [[W[i][j][0] for j in range(T)] for i in range(T)],
    }
    return record, entries


def main():
    args, config, run = common.start("dropout", __doc__, FULL, QUICK_OVERRIDES)
    rng = random.Random(args.seed)
    n = len(config["p"]) + 2

    run.stage(1, n, "a real causal attention matrix from core.MultiHeadAttention")
    d, T = config["d"], config["T"]
    mha = core.MultiHeadAttention(d, config["n_heads"], rng=random.Random(rng.random()), causal=True)
    X = [[rng.gauss(0.0, 1.0) for _ in range(d)] for _ in range(T)]
    mha.forward(X)
    _, _, Vh, A = mha.heads[config["head"]]
    results = {"attention_matrix": A, "values": Vh,
               "attention_row_sums": [math.fsum(r) for r in A], "dropout": [], "entries": []}
    for r in A:
        run.log("  " + " ".join(f"{w:.4f}" for w in r))

    for k, p in enumerate(config["p"]):
        run.stage(k + 2, n, f"p = {p}: {config['n_masks']:,} masks")
        rec, entries = analyse(A, Vh, p, config["n_masks"], args.seed)
        results["dropout"].append(rec)
        results["entries"].extend(entries)
        run.log(f"  noise scale {rec['noise_scale_measured']:.4f} (closed form {rec['noise_scale_closed_form']:.4f}); "
                f"max bias {rec['max_abs_bias']:.2e} = {rec['max_bias_in_se']:.2f} SE; "
                f"row-sum std max rel err {rec['row_sum_std_max_rel_err']:.2e} ({rec['row_sum_std_max_z']:.2f} SE); "
                f"context var max rel err {rec['context_var_max_rel_err']:.2e} ({rec['context_var_max_z']:.2f} SE); "
                f"masked mean |w| {rec['masked_mean_abs']}; zeroed row {rec['row_zero_frac_mean']:.4f} "
                f"(closed form {rec['row_zero_prob_closed_form_mean']:.4f})")

    run.stage(n, n, "summary checks")
    recs = results["dropout"]
    results["checks"] = {
        "masked_positions_exactly_zero": all(r["masked_mean_abs"] == 0.0 and r["masked_nonzero_count"] == 0
                                             for r in recs),
        "attention_rows_sum_to_1": all(abs(s - 1.0) < 1e-12 for s in results["attention_row_sums"]),
        "unbiased_within_5_se": all(r["max_z"] < 5.0 for r in recs),
        "row_sum_std_within_5_se": all(r["row_sum_std_max_z"] < 5.0 for r in recs),
        "context_var_within_5_se": all(r["context_var_max_z"] < 5.0 for r in recs),
        "row_zero_frac_within_5_se": all(row["zero_frac_z"] < 5.0 for r in recs for row in r["rows"]
                                         if row["zero_frac_z"] is not None),
    }
    run.log(f"  checks: {results['checks']}")
    run.finish(results)


if __name__ == "__main__":
    main()
