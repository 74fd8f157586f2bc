"""The supplementary dropout study's report (demos/demo_dropout.py, figures/results_dropout.json): inverted
dropout on a causal attention matrix is unbiased, and how noisy it is.  Its figure, its page
(docs/12-dropout.md) and its overview row; the interface is report_kit's."""
import report_kit as kit

# The tutorial's numbers per p: noise scale √(p/(1−p)), row-sum std (measured, closed form), P(row zeroed)
# (measured, closed form), relative noise on the context vector
DROPOUT_REF = {0.05: {"noise": 0.229}, 0.1: {"noise": 0.333, "row_std": (0.2464, 0.2399), "context": 0.385},
               0.5: {"noise": 1.000, "row_std": (0.7386, 0.7198), "zero_row": (0.193, 0.194), "context": 1.156}}
DROPOUT_MASKS = 100_000     # the tutorial's Monte Carlo mask count
Z_ERROR = 5.0               # a reference value this many Monte Carlo SE from the closed form is likely an error


def _dropout_matrix_panel(a, r):
    A = r["attention_matrix"]
    im = a.imshow(A, cmap="Blues", vmin=0, vmax=1)
    for i, row in enumerate(A):
        for j, w in enumerate(row):
            a.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=7, color="k" if w < 0.6 else "w")
    a.set(xlabel="key position j", ylabel="query position i", title="Attention matrix (head 0, causal)")
    a.grid(False)
    return im


def _dropout_bias_panel(a, r):
    ps = sorted({e["p"] for e in r["entries"]})
    for k, p in enumerate(ps):
        es = [e for e in r["entries"] if e["p"] == p and e["z"] is not None]
        a.plot([i + 0.15 * (k - 1) for i in range(len(es))], [e["bias"] / e["se"] for e in es], "o", ms=3,
               label=f"p = {p}")
    a.axhspan(-2, 2, color="gray", alpha=0.15, label="±2 Monte Carlo SE")
    a.axhline(0, color="k", lw=0.6)
    a.set(xlabel="non-zero entry (row-major)", ylabel="bias / SE", title="Bias of E[ŵ] per entry")
    kit.legend_below(a, ncol=4)


def _dropout_rowstd_panel(a, r):
    RD = DROPOUT_REF
    for k, x in enumerate(r["dropout"]):
        rows = [y for y in x["rows"] if y["sum_std_closed_form"] > 0]
        a.errorbar([y["row"] + 0.12 * (k - 1) for y in rows],
                   [100 * (y["sum_std"] / y["sum_std_closed_form"] - 1) for y in rows],
                   yerr=[200 * (y.get("sum_std_rel_se") or 0) for y in rows], fmt="o", ms=3, capsize=2,
                   color=f"C{k}", label=f"p = {x['p']} (±2 SE)")
        rs = RD.get(x["p"], {}).get("row_std")
        if rs:
            a.axhline(100 * (rs[0] / rs[1] - 1), color=f"C{k}", ls="--", lw=0.9,
                      label=f"tutorial p = {x['p']}: +{100 * (rs[0] / rs[1] - 1):.1f} %")
    a.axhline(0, color="k", lw=0.6)
    a.set(xlabel="attention row (query position)", ylabel="row-sum std vs closed form (%)",
          title="Row-sum noise: measured / closed form − 1")
    kit.legend_below(a)


def _dropout_scale_panel(a, r):
    RD = DROPOUT_REF
    rows = r["dropout"]
    ps = [x["p"] for x in rows]
    a.plot(ps, [x["noise_scale_measured"] for x in rows], "o", label="noise scale, measured")
    a.plot(ps, [x["noise_scale_closed_form"] for x in rows], "k:", label="√(p/(1−p))")
    if "context_rel_noise_mean" in rows[0]:
        a.plot(ps, [x["context_rel_noise_mean"] for x in rows], "^", label="context vector: rel. noise (row mean)")
        a.plot(ps, [x["context_rel_noise_closed_form_mean"] for x in rows], "k--", lw=0.6, label="… closed form")
    a.plot(ps, [x["row_zero_frac_mean"] for x in rows], "s", label="P(row all zero), measured")
    kit.ref_mark(a, ps, [RD.get(p, {}).get("noise") for p in ps], label="tutorial: noise scale")
    kit.ref_mark(a, ps, [RD.get(p, {}).get("context") for p in ps], label="tutorial: context rel. noise", color="C2")
    kit.ref_mark(a, ps, [(RD.get(p, {}).get("zero_row") or (None,))[0] for p in ps], label="tutorial: P(row zero)",
              color="C3")
    a.set(xlabel="dropout probability p", ylabel="value", title=f"{rows[0]['n_masks']:,} Monte Carlo masks")
    kit.legend_below(a)


def fig_dropout_statistics(meta, r, out_dir):
    plt = kit.plt()
    fig, axes = plt.subplots(2, 2, figsize=(9.6, 8.4))
    im = _dropout_matrix_panel(axes[0][0], r)
    fig.colorbar(im, ax=axes[0][0], fraction=0.046)
    _dropout_bias_panel(axes[0][1], r)
    _dropout_rowstd_panel(axes[1][0], r)
    _dropout_scale_panel(axes[1][1], r)
    fig.suptitle("Inverted dropout on a 5×5 causal attention matrix — " + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "dropout_statistics")


def _dropout_reference_z(r):
    """[(p, excess %, z)] of the tutorial's row-sum std excess, in our Monte Carlo SE at its mask count."""
    out = []
    for x in r["dropout"]:
        ref = DROPOUT_REF.get(x["p"], {}).get("row_std")
        rows = [y for y in x["rows"] if y.get("sum_std_rel_se")]
        if not ref or not rows:
            continue
        near = min(rows, key=lambda y: abs(y["sum_std_closed_form"] - ref[1]))
        rel_se = near["sum_std_rel_se"] * (x["n_masks"] / DROPOUT_MASKS) ** 0.5   # at its mask count
        excess = ref[0] / ref[1] - 1
        out.append((x["p"], 100 * excess, excess / rel_se))
    return out



QUESTION = ("Inverted dropout zeroes each attention weight with probability p and scales the survivors by "
            "1/(1−p): does that leave the expected weights unchanged, how much noise does it add, and do masked "
            "(future) positions stay masked? The tutorial's answer, on a 5×5 causal attention matrix and "
            f"{DROPOUT_MASKS:,} masks: the bias is within Monte Carlo error, the noise scale is √(p/(1−p)), a whole "
            "row is zeroed at the closed-form rate, and masked positions stay exactly zero.")
FIGURES = [fig_dropout_statistics]
DIFFERENCES = [
    "Our own random 5×5 attention matrix (head 0 of a fresh causal attention layer); levels that depend on the "
    "matrix (row-sum std, context noise) are compared through their closed forms, not directly.",
    "Added: per-entry bias panel, the matrix itself, and the context-vector relative noise."]


def _table(r):
    rows = [[x["p"], f"{x['noise_scale_closed_form']:.3f}", f"{x['max_abs_bias']:.1e} ({x['max_bias_in_se']:.1f})",
             f"{x['row_sum_std_max_rel_err']:.3f} ({x['row_sum_std_max_z']:.1f})",
             f"{x['context_var_max_rel_err']:.3f}",
             f"{x.get('context_rel_noise_mean', float('nan')):.3f} / "
             f"{x.get('context_rel_noise_closed_form_mean', float('nan')):.3f}",
             f"{x['row_zero_frac_mean']:.4f} / {x['row_zero_prob_closed_form_mean']:.4f}", x["masked_mean_abs"]]
            for x in r["dropout"]]
    return kit.table(["p", "noise scale √(p/(1−p))", "max bias (in Monte Carlo SE)", "row-sum std rel. error (SE)",
                      "context variance rel. error", "context rel. noise: measured / closed form",
                      "P(row zeroed): measured / closed form", "masked positions"], rows)


def _reference_lines(r):
    RD = DROPOUT_REF
    ctx = {x["p"]: x.get("context_rel_noise_mean") for x in r["dropout"]}
    ratio = ctx[0.5] / ctx[0.1] if ctx.get(0.1) and ctx.get(0.5) else None
    rows = [["noise scale √(p/(1−p)), p = " + ", ".join(f"{p:g}" for p in RD),
             ", ".join(f"{x['noise_scale_closed_form']:.3f}" for x in r["dropout"] if x["p"] in RD),
             ", ".join(f"{v['noise']:.3f}" for v in RD.values())],
            ["relative noise on the context vector, p = 0.1 / 0.5 (row mean)",
             f"{kit.fmt(ctx.get(0.1))} / {kit.fmt(ctx.get(0.5))}", f"{RD[0.1]['context']} / {RD[0.5]['context']}"],
            [f"ratio of the two (√(p/(1−p)) gives {(0.5 / 0.5) ** 0.5 / (0.1 / 0.9) ** 0.5:.1f} in both)",
             kit.fmt(ratio, ".2f"),
             f"{RD[0.5]['context'] / RD[0.1]['context']:.2f}"],
            ["a whole row zeroed at p = 0.5: measured vs closed form",
             " vs ".join(f"{100 * v:.1f} %" for v in next(
                 (x["row_zero_frac_mean"], x["row_zero_prob_closed_form_mean"])
                 for x in r["dropout"] if x["p"] == 0.5)),
             f"{100 * RD[0.5]['zero_row'][0]:.1f} % vs {100 * RD[0.5]['zero_row'][1]:.1f} %"]]
    return (["The tutorial measured its own 5×5 matrix: the levels of the context noise depend on the matrix and "
             "the values, their ratio between the two p does not.", ""] + kit.table(["", "ours", "tutorial"], rows))


def _reference_z_lines(r):
    zs = _dropout_reference_z(r)
    if not zs:
        return []
    bad = [f"p = {p:g}" for p, _, z in zs if z > Z_ERROR]
    agree = all(x["row_sum_std_max_z"] < Z_ERROR for x in r["dropout"])
    return ["", "The tutorial's row-sum std exceeds its closed form by " + ", ".join(
        f"{e:+.1f} % at p = {p:g} (z = {z:.0f})" for p, e, z in zs) + f", z in Monte Carlo standard errors at its "
        f"{DROPOUT_MASKS:,} masks (the relative SE of our row with the nearest closed form, rescaled to that mask "
        "count). " + (f"At {', '.join(bad)} that is above {Z_ERROR:.0f} SE while our runs agree with the closed form: "
                      "the reference value is likely an error." if bad and agree else "")]


def reading(r):
    """The dropout reading: every statistic against its closed form (Z_ERROR standard errors), the masked
    positions, and the tutorial's row-sum std."""
    ok = all(r.get("checks", {}).values())
    worst = max(x["max_bias_in_se"] for x in r["dropout"])
    masked = max(x["masked_mean_abs"] for x in r["dropout"])
    out = [f"{'Every' if ok else 'NOT every'} statistic is within {Z_ERROR:.0f} Monte Carlo standard errors of its "
           f"closed form (largest bias {worst:.1f} SE): " + (
               "inverted dropout leaves the expected attention weights unchanged and adds noise of scale √(p/(1−p))."
               if ok else "see the table."),
           f"Masked (future) positions: largest mean absolute value {masked}: "
           + ("they stay exactly zero." if masked == 0 else "NOT zero.")]
    bad = [(p, z) for p, _, z in _dropout_reference_z(r) if z > Z_ERROR]
    if bad and all(x["row_sum_std_max_z"] < Z_ERROR for x in r["dropout"]):
        out.append("The tutorial's row-sum std lies " + kit.and_join([f"{z:.0f} SE (p = {p:g})" for p, z in bad])
                   + f" above its closed form, beyond {Z_ERROR:.0f} SE while ours agree with it: likely an error in "
                   "the reference (the note under the comparison table).")
    return out


def page(payload):
    """The dropout page parts (report_kit.Page)."""
    r = payload["results"]
    comparison = (_reference_lines(r) + _reference_z_lines(r)
                  + ["", "Every statistic of our run against its closed form (the tutorial checks the same):", ""]
                  + _table(r))
    return kit.Page(comparison, reading(r), DIFFERENCES, [], ["dropout_statistics"])


def headline(r):
    """The overview row: how often a whole attention row is zeroed at p = 0.5, against the closed form."""
    row = next(x for x in r["dropout"] if x["p"] == 0.5)
    ref = DROPOUT_REF[0.5]["zero_row"]
    return (f"p = 0.5: a whole attention row zeroed {100 * row['row_zero_frac_mean']:.1f}% of the time "
            f"(closed form {100 * row['row_zero_prob_closed_form_mean']:.1f}%)",
            f"{100 * ref[0]:.1f}% ({100 * ref[1]:.1f}%)")
