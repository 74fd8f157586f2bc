"""Experiment 1's report (demos/demo_attention_basics.py, figures/results_attention.json): why scores are
scaled by 1/√d_k, temperature, the cost of attention against the sequence length, and the gradient check;
its figures, its page (docs/01-attention.md) and its overview row.  The interface is report_kit's."""
import report_bench_core
import report_kit as kit

# The tutorial's numbers (an Apple M-series laptop, one thread, Python 3.12).  scaling: d_k -> (within-row
# variance unscaled, scaled, entropy unscaled, scaled); temperature: tau -> (entropy, max probability);
# gradcheck: module -> (params, max rel err, max abs err).
ATTENTION_REF = {
    "scaling": {2: (2.00, 0.998, 2.149, 2.390), 8: (7.54, 0.943, 1.313, 2.366), 32: (29.93, 0.935, 0.634, 2.360),
                128: (117.32, 0.917, 0.268, 2.369), 512: (489.07, 0.955, 0.141, 2.355)},
    "temperature": {0.1: (0.000, 1.000), 0.5: (0.464, 0.901), 1.0: (1.663, 0.546), 2.0: (2.526, 0.246),
                    4.0: (2.854, 0.126)},
    "cost_slopes": (1.98, 1.43), "cost_r2": 0.9986,
    "cost_ms": {"qk": {8: 0.02, 16: 0.07, 32: 0.24, 64: 1.06, 128: 4.22, 256: 16.21},
                "mha": {8: 0.62, 16: 1.33, 32: 3.00, 64: 8.24, 128: 25.4, 256: 87.2}},
    "n_keys": 16, "n_draws": 400,
    "matmul_mflops": 205, "matmul_speedup": 10, "gradcheck_rel_claim": 1e-7, "stability_sum": "1.000000000000000",
    "gradcheck": {"Linear": (35, 8.6e-13, 9.3e-13), "LayerNorm": (12, 1.6e-12, 2.9e-12),
                  "MultiHeadAttention (causal)": (288, 8.3e-8, 5.1e-10), "FeedForward": (297, 2.7e-9, 3.4e-9),
                  "TransformerLM (2 layers)": (4672, 3.3e-8, 4.9e-10), "EncoderDecoder": (6220, 4.0e-8, 7.1e-10)},
}


def fig_attention_scaling(meta, r, out_dir):
    plt = kit.plt()
    rows = r["scaling"]
    dk = [x["d_k"] for x in rows]
    ref = [ATTENTION_REF["scaling"].get(d) for d in dk]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    a.loglog(dk, [x["unscaled_within_row_var"] for x in rows], "o-", label="unscaled, within-row (as the tutorial)")
    a.loglog(dk, [x["scaled_within_row_var"] for x in rows], "s-", label="scaled, within-row (as the tutorial)")
    a.loglog(dk, [x["unscaled_var"] for x in rows], "o:", color="C0", alpha=0.6, label="unscaled, pooled")
    a.loglog(dk, [x["scaled_var"] for x in rows], "s:", color="C1", alpha=0.6, label="scaled, pooled")
    a.loglog(dk, dk, "-", color="gray", lw=0.6, label="d_k")
    kit.ref_mark(a, dk, [x and x[0] for x in ref])
    kit.ref_mark(a, dk, [x and x[1] for x in ref], label=None)
    a.set(xlabel="key dimension d_k", ylabel="variance of the score", title="Score variance")
    kit.legend_below(a)
    b.semilogx(dk, [x["unscaled_entropy"] for x in rows], "o-", label="unscaled")
    b.semilogx(dk, [x["scaled_entropy"] for x in rows], "s-", label="scaled")
    b.axhline(r["ln_n_keys"], ls=":", color="gray", label=f"uniform, ln {rows[0]['n_keys']}")
    kit.ref_mark(b, dk, [x and x[2] for x in ref])
    kit.ref_mark(b, dk, [x and x[3] for x in ref], label=None)
    b.set(xlabel="key dimension d_k", ylabel="softmax entropy (nats)", title="Attention entropy", ylim=(0, 3.0))
    kit.legend_below(b)
    fig.suptitle(f"Why attention divides by √d_k ({rows[0]['n_keys']} keys, {rows[0]['n_draws']} draws) — "
                 + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "attention_scaling")


def fig_attention_temperature(meta, r, out_dir):
    plt = kit.plt()
    rows = r["temperature"]
    tau = [x["tau"] for x in rows]
    ref = [ATTENTION_REF["temperature"].get(t) for t in tau]
    fig, a = plt.subplots(figsize=(5.0, 3.6))
    a.semilogx(tau, [x["entropy"] for x in rows], "o-", label="entropy (nats)")
    a.axhline(r["ln_20"], ls=":", color="gray", label="uniform, ln 20")
    kit.ref_mark(a, tau, [x and x[0] for x in ref], label="tutorial: entropy")
    a2 = a.twinx()
    a2.semilogx(tau, [x["max_prob"] for x in rows], "s--", color="#d62728", label="max probability")
    kit.ref_mark(a2, tau, [x and x[1] for x in ref], label="tutorial: max probability", color="#7f0000")
    a2.set_ylabel("max probability")
    a2.set_ylim(0, 1.05)
    a.set(xlabel="temperature τ", ylabel="entropy (nats)", title="softmax(s / τ) over 20 keys", ylim=(0, 3.2))
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=7, frameon=False)
    fig.suptitle(kit.subtitle(meta), fontsize=8)
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "attention_temperature")


def _ratio_axis(ax, ratios):
    """The y axis of fit / measured ratios: logarithmic with plain tick labels (0.5, 1, 2, ...) when every
    ratio is positive (wall times are; a least-squares a + bT² could still cross zero), else linear."""
    if min(ratios) <= 0:
        return
    from matplotlib.ticker import FixedLocator, NullLocator
    ax.set_yscale("log")
    lo, hi = min(ratios + [1.0]), max(ratios + [1.0])
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16) if lo / 2 < t < hi * 2]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.set_ylim(lo / 1.25, hi * 1.25)


def fig_attention_cost(meta, r, out_dir):
    plt = kit.plt()
    rows, fit = r["cost"], r["cost_fit"]
    T = [x["T"] for x in rows]
    ref = ATTENTION_REF["cost_ms"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.8, 3.6))
    for key, mk, lab in (("qk", "o", "score matrix QKᵀ"), ("mha", "s", "full multi-head attention")):
        pf = fit[key]["power_fit"]
        line, = a.loglog(T, [x[f"{key}_ms"] for x in rows], mk + "-", label=f"{lab} (slope {pf['k']:.2f})")
        a.loglog(T, [pf["c_ms"] * t ** pf["k"] for t in T], ":", color=line.get_color(),
                 label=f"c·T^k fitted in log space, R²(log t) = {pf['r2_log']:.4f}")
        kit.ref_mark(a, T, [ref[key].get(t) for t in T], label=f"tutorial: {lab}", color=line.get_color())
        for kind, ls in (("quadratic_fit", "--"), ("power_fit", ":")):
            name = "a + bT² (linear-space fit)" if kind == "quadratic_fit" else "c·T^k (log-space fit)"
            b.plot(T, fit[key][kind]["ratio_fit_over_measured"], mk + ls, color=line.get_color(),
                       label=f"{'QKᵀ' if key == 'qk' else 'MHA'}: {name}")
    a.set(xlabel="sequence length T", ylabel="wall time (ms, median)",
          title=f"Attention cost, d = {meta['config']['cost']['d']}, {meta['config']['cost']['n_heads']} heads")
    b.axhline(1.0, color="gray", lw=0.8)
    b.set_xscale("log")
    _ratio_axis(b, [v for key in ("qk", "mha") for kind in ("quadratic_fit", "power_fit")
                    for v in fit[key][kind]["ratio_fit_over_measured"]])
    b.set(xlabel="sequence length T", ylabel="fit / measured", title="Fit residuals (1 = exact)")
    from matplotlib.transforms import offset_copy
    for ax in (a, b):              # 36 points under the axes: below the x label whatever the axes' height
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, fontsize=7, frameon=False,
                  bbox_transform=offset_copy(ax.transAxes, fig=fig, y=-36, units="points"))
    fig.suptitle(kit.subtitle(meta), fontsize=8)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "attention_cost")


def fig_attention_gradcheck(meta, r, out_dir):
    plt = kit.plt()
    rows = r["gradient_check"]
    y = range(len(rows))
    fig, a = plt.subplots(figsize=(6.4, 3.2))
    a.barh([i + 0.2 for i in y], [max(x["max_rel_err"], 1e-18) for x in rows], 0.4, label="max relative error")
    a.barh([i - 0.2 for i in y], [max(x["max_abs_err"], 1e-18) for x in rows], 0.4, label="max absolute error")
    refs = [_gradcheck_ref(x["module"]) for x in rows]
    kit.ref_mark(a, [rf and rf[1] for rf in refs], [i + 0.2 for i in y], label="tutorial: rel / abs")
    kit.ref_mark(a, [rf and rf[2] for rf in refs], [i - 0.2 for i in y], label=None)
    a.axvline(1e-5, ls=":", color="#d62728", label="tolerance: rel 1e-5 / abs 1e-8")
    a.axvline(1e-8, ls=":", color="#d62728")
    a.set_xscale("log")
    a.set_yticks(list(y), [f"{x['module']} ({x['n_params']} params)" for x in rows])
    a.invert_yaxis()
    a.set(xlabel="error vs central differences (eps = 1e-4)", title="Gradient check over every parameter")
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(kit.subtitle(meta), fontsize=8)
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "attention_gradcheck")


def _gradcheck_ref(module):
    """The tutorial's (params, rel, abs) for a module, matched on the first word of its name."""
    return next((v for k, v in ATTENTION_REF["gradcheck"].items() if k.split(" ")[0] == module.split(" ")[0]), None)


def fig_attention_throughput(meta, r, out_dir):
    plt = kit.plt()
    rows = r["throughput"]
    xs = range(len(rows))
    fig, a = plt.subplots(figsize=(5.0, 3.4))
    a.bar([i - 0.2 for i in xs], [x["matmul_mflops"] for x in rows], 0.4, label=f"matmul ({r['dot_impl']})")
    a.bar([i + 0.2 for i in xs], [x["naive_mflops"] for x in rows], 0.4, label="naive triple loop")
    for i, x in zip(xs, rows):
        a.annotate(f"{x['speedup']:.1f}×", (i - 0.2, x["matmul_mflops"]), ha="center", va="bottom", fontsize=7)
    a.axhline(ATTENTION_REF["matmul_mflops"], ls="--", color="k", lw=0.8,
              label=f"tutorial: matmul {ATTENTION_REF['matmul_mflops']} Mflop/s (~10× naive, M-series)")
    a.set_xticks(list(xs), [f"{x['n']}×{x['k']}×{x['m']}" for x in rows])
    a.set(xlabel="shape n×k×m", ylabel="Mflop/s (2nkm / time)", title=f"Matmul throughput, Python {meta['python']}")
    kit.legend_below(a, ncol=1)
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "attention_throughput")




# ----------------------------------------------------------------------------- the page

QUADRATIC_TOL = 0.1     # a log-log cost slope within this of 2 is "quadratic"
COLLAPSE = 0.5          # unscaled entropy at the largest d_k below this share of the smallest d_k's: "collapses"
FLAT = 0.1              # scaled entropy varying by less than this many nats over d_k: "flat"
FAR = 2.0               # a matmul speed-up more than this factor below the tutorial's is "far" from it

QUESTION = ("Why does attention divide its scores by √d_k, what does a softmax temperature do, how does the cost "
            "grow with the sequence length, and is every hand-written gradient right? The tutorial's answer: "
            "unscaled, the score variance grows like d_k and the softmax collapses onto one key; scaled, its "
            "entropy stays flat; the score matrix costs O(T²); and every module passes a finite-difference check, "
            f"with a maximum relative error below {ATTENTION_REF['gradcheck_rel_claim']:.0e}.")
FIGURES = [fig_attention_scaling, fig_attention_temperature, fig_attention_cost, fig_attention_gradcheck,
           fig_attention_throughput]
DIFFERENCES = [
    "FeedForward gradient check at d_ff = 17 (the tutorial's 297 parameters); our earlier runs used 16.",
    "Our own random draws (scores, temperature vector, cost inputs); the cost is timed on this 2-core machine "
    "under the interpreter named in the provenance line, the tutorial's on an M-series laptop.",
    "The cost figure fits in log space and shows residuals; the tutorial reports only the linear-space R².",
    "Gradient-check loss L = Σ Y ⊙ G (random G); the tutorial does not state its check loss."]


def _scaling_lines(r):
    R = ATTENTION_REF["scaling"]
    rows = []
    for x in r["scaling"]:
        rf = R.get(x["d_k"])
        rows.append([x["d_k"], f"{x['unscaled_within_row_var']:.2f} / {x['scaled_within_row_var']:.3f}",
                     f"{rf[0]:.2f} / {rf[1]:.3f}" if rf else "–", f"{x['unscaled_var']:.2f} / {x['scaled_var']:.3f}",
                     f"{x['unscaled_entropy']:.3f} / {x['scaled_entropy']:.3f}",
                     f"{rf[2]:.3f} / {rf[3]:.3f}" if rf else "–"])
    lo, hi = min(v[1] for v in R.values()), max(v[1] for v in R.values())
    return ([f"**Score variance and softmax entropy** ({r['scaling'][0]['n_keys']} keys). The tutorial's variance "
             f"is the variance *within* a row of 16 scores (its scaled values {lo:.2f}–{hi:.2f} sit at the expected "
             "15/16); ours of the same statistic stands beside it, our pooled variance (all 16 × draws scores, "
             "expectation d_k and 1) in its own column.", ""]
            + kit.table(["d_k", "within-row var, unscaled / scaled", "reference", "pooled var, unscaled / scaled",
                         "entropy, unscaled / scaled", "reference"], rows))


def _temperature_lines(r):
    R = ATTENTION_REF["temperature"]
    rows = [[f"{x['tau']:g}", f"{x['entropy']:.3f}", kit.fmt((R.get(x["tau"]) or (None, None))[0]),
             f"{x['max_prob']:.3f}", kit.fmt((R.get(x["tau"]) or (None, None))[1])] for x in r["temperature"]]
    return (["", "**Temperature**: softmax(s / τ) over 20 keys; our 20 scores are our own draw.", ""]
            + kit.table(["τ", "entropy (nats)", "reference", "max probability", "reference"], rows))


def _cost_lines(payload):
    r, ref = payload["results"], ATTENTION_REF
    q, m = r["cost_fit"]["qk"], r["cost_fit"]["mha"]
    c = payload["config"]["cost"]
    rows = [[x["T"], f"{x['mha_ms']:.2f}", f"{ref['cost_ms']['mha'].get(x['T'], float('nan')):g}"] for x in r["cost"]]
    stats = [["log-log slope of the time, QKᵀ", f"{q['loglog_slope']:.2f}", ref["cost_slopes"][0]],
             ["log-log slope of the time, full attention", f"{m['loglog_slope']:.2f}", ref["cost_slopes"][1]],
             ["R² of the fit t = a + bT², full attention", f"{m['quadratic_fit']['r2']:.4f}", ref["cost_r2"]],
             ["softmax of logits × 1e3 sums to", r["stability"]["sum_str"], ref["stability_sum"]]]
    return (["", f"**Cost** of the full multi-head attention (d = {c['d']}, {c['n_heads']} heads), median wall "
             "time:", ""] + kit.table(["T", "full attention (ms)", "reference (ms)"], rows) + [""]
            + kit.table(["statistic", "ours", "tutorial"], stats))


def _gradcheck_lines(r):
    rows = []
    for x in r["gradient_check"]:
        rf = _gradcheck_ref(x["module"])
        rows.append([x["module"], x["n_params"], kit.fmt_e(x["max_rel_err"]), kit.fmt_e(x["max_abs_err"]),
                     x["n_failed"], f"{rf[0]}, {rf[1]:.1e}, {rf[2]:.1e}" if rf else "–"])
    out = (["", "**Gradient check**, central differences (eps = 1e-4) over every entry of every parameter:", ""]
           + kit.table(["module", "params", "max rel err", "max abs err", "failed", "reference (params, rel, abs)"],
                       rows))
    worst = max(r["gradient_check"], key=lambda x: x["max_rel_err"])
    if worst["max_rel_err"] >= ATTENTION_REF["gradcheck_rel_claim"]:
        out += ["", f"Our worst relative error, {worst['max_rel_err']:.1e}, is on parameter "
                f"`{worst['worst_rel_param']}` of {worst['module']}, whose max *absolute* error is "
                f"{worst['worst_rel_param_abs_err']:.1e}. The "
                "central difference itself carries an O(eps²) truncation error, here up to "
                f"{max(x['max_abs_err'] for x in r['gradient_check']):.0e} in absolute terms, and on a gradient entry "
                f"of at most about {worst['worst_rel_param_abs_err'] / worst['max_rel_err']:.0e} that is a relative "
                f"error of {worst['max_rel_err']:.0e}. The backward is not the cause: the same gradients agree with "
                "PyTorch autograd within 1e-10 (`tests/tests_parity_torch.py`). Our check loss is L = Σ Y ⊙ G with "
                "unit-variance inputs and G; we did not tune it to reach the tutorial's figure."]
    ffn = next((x for x in r["gradient_check"] if x["module"] == "FeedForward"), None)
    if ffn and ffn["n_params"] == ATTENTION_REF["gradcheck"]["FeedForward"][0]:
        out += ["", f"FeedForward has the tutorial's {ffn['n_params']} parameters: 2·8·17 + 17 + 8, i.e. d = 8 and "
                "d_ff = 17 (the count the tutorial's table implies; d_ff = 16 would give 280)."]
    return out


def _speedup(r):
    """(span text, min Mflop/s, max Mflop/s, max speed-up) of matmul over the naive loop in this run."""
    sp = [x["speedup"] for x in r["throughput"]]
    mf = [x["matmul_mflops"] for x in r["throughput"]]
    span = f"{min(sp):.1f}" + (f"–{max(sp):.1f}" if f"{min(sp):.1f}" != f"{max(sp):.1f}" else "")
    return span, min(mf), max(mf), max(sp)


def _matmul_lines(r):
    span, lo, hi, _ = _speedup(r)
    ref = ATTENTION_REF
    return (["", "**Throughput** of `transformer.matmul` against the naive triple loop:", ""]
            + kit.table(["", "ours", "tutorial"], [["speed-up of matmul over the naive loop",
                                                    f"{span}× ({lo:.0f}–{hi:.0f} Mflop/s, {r['dot_impl']})",
                                                    f"about {ref['matmul_speedup']}× "
                                                    f"({ref['matmul_mflops']} Mflop/s)"]]))


def _gradient_bullets(r):
    checks = r["gradient_check"]
    n_failed = sum(x["n_failed"] for x in checks)
    worst = max(checks, key=lambda x: x["max_rel_err"])
    claim = ATTENTION_REF["gradcheck_rel_claim"]
    met = worst["max_rel_err"] < claim
    return [f"Gradients: {n_failed} failed entries over {sum(x['n_params'] for x in checks):,} parameters of "
            f"{len(checks)} modules: " + ("every entry passes the finite-difference tolerance." if not n_failed else
                                          "SOME GRADIENT CHECKS FAILED (see the failed column)."),
            f"The tutorial's maximum relative error below {claim:.0e}: " + (
                f"met (worst {worst['max_rel_err']:.1e})." if met else
                f"not met, our worst is {worst['max_rel_err']:.1e} ({worst['module']}): the truncation error of the "
                "central difference on a small gradient entry, not the backward (the note under the gradient table).")]


def reading(r):
    """Experiment 1's reading: collapse without scaling, flat entropy with it, the cost slope, the gradient
    check and the tutorial's error claim, the matmul speed-up; thresholds at the top of this section."""
    sc, q, m = r["scaling"], r["cost_fit"]["qk"], r["cost_fit"]["mha"]
    e0, e1 = sc[0]["unscaled_entropy"], sc[-1]["unscaled_entropy"]
    spread = max(x["scaled_entropy"] for x in sc) - min(x["scaled_entropy"] for x in sc)
    quad = abs(q["loglog_slope"] - 2) <= QUADRATIC_TOL
    span, _, _, best = _speedup(r)
    out = [f"Without the 1/√d_k the softmax entropy goes from {e0:.2f} to {e1:.2f} nats between d_k = {sc[0]['d_k']} "
           f"and {sc[-1]['d_k']}: " + ("it collapses." if e1 < COLLAPSE * e0 else "it does NOT collapse in this run.")
           + f" Scaled, it varies by {spread:.3f} nats: " + (f"flat (within {FLAT})." if spread < FLAT else
                                                            f"NOT flat (more than {FLAT})."),
           f"The score matrix QKᵀ costs T^{q['loglog_slope']:.2f} (tutorial {ATTENTION_REF['cost_slopes'][0]}): "
           + (f"quadratic, within {QUADRATIC_TOL} of 2" if quad
              else f"NOT quadratic (more than {QUADRATIC_TOL} from 2)")
           + f"; the full attention T^{m['loglog_slope']:.2f} (tutorial {ATTENTION_REF['cost_slopes'][1]}): "
           + ("below quadratic at these lengths, where its projections, linear in T, still weigh."
              if m["loglog_slope"] < 2 - QUADRATIC_TOL else "quadratic too.")]
    out += _gradient_bullets(r)
    far = best < ATTENTION_REF["matmul_speedup"] / FAR
    return out + [f"matmul runs {span}× as fast as the naive triple loop here (one timing per shape) against the "
                  f"tutorial's about "
                  f"{ATTENTION_REF['matmul_speedup']}×: " + (
                      "far from it; the ratio depends on the interpreter (the C-level inner product) and on the "
                      "processor, not only on the algorithm." if far else f"within {FAR:g}× of it.")]


def _extras(r):
    q, m = r["cost_fit"]["qk"], r["cost_fit"]["mha"]
    worst = max(m["quadratic_fit"]["ratio_fit_over_measured"] + q["quadratic_fit"]["ratio_fit_over_measured"],
                key=lambda v: max(v, 1 / v))
    others = report_bench_core.speedups_text()
    return ([f"- For QKᵀ alone the fit t = a + bT² has R² = {q['quadratic_fit']['r2']:.4f}. A linear-space R² is "
             f"dominated by the largest T: the same fits miss the measured time by up to {max(worst, 1 / worst):.0f}× "
             f"at small T (right panel of `attention_cost`); fitted in log space, t = c·T^k gives R²(log t) = "
             f"{q['power_fit']['r2_log']:.4f} (QKᵀ) and {m['power_fit']['r2_log']:.4f} (full)."]
            + ([f"- matmul over the naive loop under the other interpreters on this machine (`demos/bench_core.py`): "
                f"{others}."] if others else []))


def page(payload):
    """Experiment 1's page parts (report_kit.Page)."""
    r = payload["results"]
    comparison = (_scaling_lines(r) + _temperature_lines(r) + _cost_lines(payload) + _gradcheck_lines(r)
                  + _matmul_lines(r))
    return kit.Page(comparison, reading(r), DIFFERENCES, _extras(r),
                    ["attention_scaling", "attention_temperature", "attention_cost", "attention_gradcheck",
                     "attention_throughput"])


def headline(r):
    """The overview row: the within-row score variance at d_k = 512, unscaled and scaled, beside the tutorial's
    (the same statistic over the same number of keys and draws: report_kit.beside refuses anything else)."""
    row = next(x for x in r["scaling"] if x["d_k"] == 512)
    ref = ATTENTION_REF["scaling"][512]
    what = "within-row variance of the scores at d_k = 512, unscaled and scaled"
    items = f"{row['n_keys']} keys × {row['n_draws']} draws"
    return kit.beside(
        kit.Stat(f"within-row score variance at d_k = 512: {row['unscaled_within_row_var']:.1f} unscaled, "
                 f"{row['scaled_within_row_var']:.3f} scaled", what, items),
        kit.Stat(f"{ref[0]:.0f}, {ref[1]:.3f}", what,
                 f"{ATTENTION_REF['n_keys']} keys × {ATTENTION_REF['n_draws']} draws"))
