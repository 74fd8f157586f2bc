"""Render every figures/results_*.json into figures (PNG + SVG) and, with --readme, regenerate the
README's Speed and Results tables from the same files.

    python make_figures.py                      # figures/results_*.json -> figures/*.png, *.svg
    python make_figures.py --dir figures/quick  # the QUICK results of a smoke run
    python make_figures.py --readme             # also rewrite the generated blocks of README.md
    python make_figures.py --check-readme       # exit 1 if README.md's generated blocks are stale

The results JSON files are the single source of truth: every number in a figure or in the README's
tables is read from them here.  A missing or malformed file skips its figures with a one-line
warning; it never stops the other figures.  matplotlib (Agg backend) is the only third-party import,
and only this script uses it.
"""
import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
FIG_DIR = os.path.join(ROOT, "figures")
README = os.path.join(ROOT, "README.md")

# The tutorial's reference values (measured on an Apple M-series laptop, single thread, Python 3.12),
# from the summary of the tutorial this library accompanies.  Shown beside our measurements in the
# README; they are never written into results files.
REFERENCE = {
    "scaling": {2: (2.00, 0.998, 2.149, 2.390), 8: (7.54, 0.943, 1.313, 2.366), 32: (29.93, 0.935, 0.634, 2.360),
                128: (117.32, 0.917, 0.268, 2.369), 512: (489.07, 0.955, 0.141, 2.355)},
    "temperature": {0.1: (0.000, 1.000), 0.5: (0.464, 0.901), 1.0: (1.663, 0.546), 2.0: (2.526, 0.246),
                    4.0: (2.854, 0.126)},
    "cost_slopes": (1.98, 1.43), "cost_r2": 0.9986,
    "gradcheck": {"Linear": (35, 8.6e-13, 9.3e-13), "LayerNorm": (12, 1.6e-12, 2.9e-12),
                  "MultiHeadAttention (causal)": (288, 8.3e-8, 5.1e-10), "FeedForward": (297, 2.7e-9, 3.4e-9),
                  "TransformerLM (2 layers)": (4672, 3.3e-8, 4.9e-10), "EncoderDecoder": (6220, 4.0e-8, 7.1e-10)},
    "positional": {"addition": 5.3e-15, "inner_spread": 1.0e-15, "inner_dev": 3.9e-14, "rope": 6.1e-14,
                   "shuffle": {"none": (0.0, 2.9e-16), "sine": (0.0393, 0.18), "learned": (0.0784, 0.13),
                               "rope": (0.1474, 0.27)},
                   "sine_adjacent": 1.4718, "binary_cv": 0.31, "sine_over_learned": 35},
    "length": {"periodic": {"none": {6: .263, 16: .465, 20: .482, 26: .457, 30: .476},
                            "sine": {6: .543, 16: .826, 20: .784, 26: .648, 30: .564},
                            "learned": {6: .523, 16: .828, 20: .732, 26: .670, 30: .645},
                            "rope": {6: .530, 16: .818, 20: .845, 26: .847, 30: .815}},
               "mirror": {"none": {6: .240, 16: .152, 20: .130, 30: .104},
                          "sine": {6: .087, 16: 1.000, 20: .068, 30: .092},
                          "learned": {6: .113, 16: 1.000, 20: .106, 30: .131},
                          "rope": {6: .287, 16: .182, 20: .148, 30: .119}}},
    "tokenization": {"char": (31, 22.33, 1.000), "atom": (28, 21.58, 0.940), "BPE@32": (61, 10.70, 0.257),
                     "BPE@64": (93, 8.97, 0.184), "BPE@128": (151, 7.35, 0.125), "BPE@256": (273, 6.08, 0.089),
                     "BPE@512": (513, 4.96, 0.064), "BPE@1024": (733, 4.27, 0.053),
                     "BPE@512+eow": (508, 5.13, 0.068), "stopped_at": 830},
    "dropout": {0.05: {"noise": 0.229}, 0.1: {"noise": 0.333, "row_std": (0.2464, 0.2399)},
                0.5: {"noise": 1.000, "row_std": (0.7386, 0.7198), "zero_row": (0.193, 0.194)}},
    "speed": {"suite": "59 tests in 0.8 s", "matmul_mflops": 205, "matmul_vs_naive": 10},
}

SCHEME_COLORS = {"none": "#7f7f7f", "sine": "#1f77b4", "learned": "#ff7f0e", "rope": "#2ca02c"}


# ----------------------------------------------------------------------------- plotting helpers


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10,
                         "axes.labelsize": 9, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False, "lines.linewidth": 1.6,
                         "lines.markersize": 4.5, "svg.hashsalt": "chem-transformer"})
    return plt


def _save(fig, out_dir, name):
    """Write name.png and name.svg (SVG without a timestamp, so reruns give the same file)."""
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        paths.append(path)
    _plt().close(fig)
    return paths


def _subtitle(meta):
    return (f"{'QUICK run, ' if meta.get('quick') else ''}Python {meta.get('python', '?')}, "
            f"seed {meta.get('seed', '?')}, {meta.get('wall_time_s', 0):.0f} s")


# ----------------------------------------------------------------------------- attention


def fig_attention_scaling(meta, r, out_dir):
    plt = _plt()
    rows = r["scaling"]
    dk = [x["d_k"] for x in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    a.loglog(dk, [x["unscaled_var"] for x in rows], "o-", label="unscaled q·k")
    a.loglog(dk, [x["scaled_var"] for x in rows], "s-", label="scaled q·k / √d_k")
    a.loglog(dk, dk, ":", color="gray", label="d_k")
    a.set(xlabel="key dimension d_k", ylabel="variance of the score", title="Score variance")
    a.legend()
    b.semilogx(dk, [x["unscaled_entropy"] for x in rows], "o-", label="unscaled")
    b.semilogx(dk, [x["scaled_entropy"] for x in rows], "s-", label="scaled")
    b.axhline(r["ln_n_keys"], ls=":", color="gray", label=f"uniform, ln {rows[0]['n_keys']}")
    b.set(xlabel="key dimension d_k", ylabel="softmax entropy (nats)", title="Attention entropy", ylim=(0, None))
    b.legend()
    fig.suptitle(f"Why attention divides by √d_k ({rows[0]['n_keys']} keys, {rows[0]['n_draws']} draws) — "
                 + _subtitle(meta), fontsize=9)
    return _save(fig, out_dir, "attention_scaling")


def fig_attention_temperature(meta, r, out_dir):
    plt = _plt()
    rows = r["temperature"]
    tau = [x["tau"] for x in rows]
    fig, a = plt.subplots(figsize=(4.6, 3.2))
    a.semilogx(tau, [x["entropy"] for x in rows], "o-", label="entropy (nats)")
    a.axhline(r["ln_20"], ls=":", color="gray", label="uniform, ln 20")
    a2 = a.twinx()
    a2.semilogx(tau, [x["max_prob"] for x in rows], "s--", color="#d62728", label="max probability")
    a2.set_ylabel("max probability")
    a2.set_ylim(0, 1.05)
    a.set(xlabel="temperature τ", ylabel="entropy (nats)", title="softmax(s / τ) over 20 keys")
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, loc="center right")
    return _save(fig, out_dir, "attention_temperature")


def fig_attention_cost(meta, r, out_dir):
    plt = _plt()
    rows = r["cost"]
    T = [x["T"] for x in rows]
    fit = r["cost_fit"]
    fig, a = plt.subplots(figsize=(4.8, 3.4))
    a.loglog(T, [x["qk_ms"] for x in rows], "o-", label=f"score matrix QKᵀ (slope {fit['qk']['loglog_slope']:.2f})")
    a.loglog(T, [x["mha_ms"] for x in rows], "s-",
             label=f"full multi-head attention (slope {fit['mha']['loglog_slope']:.2f})")
    q = fit["qk"]["quadratic_fit"]
    a.loglog(T, [q["a_ms"] + q["b_ms"] * t * t for t in T], ":", color="gray",
             label=f"QKᵀ fit a + bT², R² = {q['r2']:.4f}")
    a.set(xlabel="sequence length T", ylabel="wall time (ms, median)",
          title=f"Attention cost, d = {meta['config']['cost']['d']}, {meta['config']['cost']['n_heads']} heads")
    a.legend()
    return _save(fig, out_dir, "attention_cost")


def fig_attention_gradcheck(meta, r, out_dir):
    plt = _plt()
    rows = r["gradient_check"]
    names = [x["module"] for x in rows]
    y = range(len(rows))
    fig, a = plt.subplots(figsize=(6, 3.0))
    a.barh([i + 0.2 for i in y], [max(x["max_rel_err"], 1e-18) for x in rows], 0.4, label="max relative error")
    a.barh([i - 0.2 for i in y], [max(x["max_abs_err"], 1e-18) for x in rows], 0.4, label="max absolute error")
    a.axvline(1e-5, ls=":", color="#d62728", label="tolerance: rel 1e-5 / abs 1e-8")
    a.axvline(1e-8, ls=":", color="#d62728")
    a.set_xscale("log")
    a.set_yticks(list(y), [f"{n} ({x['n_params']} params)" for n, x in zip(names, rows)])
    a.invert_yaxis()
    a.set(xlabel="error vs central differences (eps = 1e-4)", title="Gradient check over every parameter")
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out_dir, "attention_gradcheck")


def fig_attention_throughput(meta, r, out_dir):
    plt = _plt()
    rows = r["throughput"]
    labels = [f"{x['n']}×{x['k']}×{x['m']}" for x in rows]
    xs = range(len(rows))
    fig, a = plt.subplots(figsize=(4.6, 3.0))
    a.bar([i - 0.2 for i in xs], [x["matmul_mflops"] for x in rows], 0.4, label=f"matmul ({r['dot_impl']})")
    a.bar([i + 0.2 for i in xs], [x["naive_mflops"] for x in rows], 0.4, label="naive triple loop")
    a.set_xticks(list(xs), labels)
    a.set(xlabel="shape n×k×m", ylabel="Mflop/s (2nkm / time)", title=f"Matmul throughput, Python {meta['python']}")
    a.legend()
    return _save(fig, out_dir, "attention_throughput")


# ----------------------------------------------------------------------------- positional


def fig_positional_ladder(meta, r, out_dir):
    plt = _plt()
    lad = r["ladder"]
    curve = lad["norm_curve"]
    t = [x["t"] for x in curve]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for key, lab in (("integer", "integer t (every dim)"), ("binary", "binary (8 bits)"),
                     ("sine", "sine/cosine"), ("learned", "learned, fresh (std 0.02)")):
        a.semilogy(t[1:], [x[key] for x in curve][1:], label=lab)
    a.axhline(lad["unit_variance_embedding_norm"], ls=":", color="gray", label="unit-variance embedding")
    a.set(xlabel="position t", ylabel="‖PE_t‖", title=f"Norm of the position code, d = {lad['d']}")
    a.legend()
    flips = lad["binary_bit_flips"]
    b.bar([x["bit"] for x in flips], [x["flip_frequency"] for x in flips])
    b.set(xlabel="bit (0 = least significant)", ylabel="flip frequency t → t+1", title="Binary code: bit flips",
          yscale="log")
    return _save(fig, out_dir, "positional_ladder")


def fig_positional_inner(meta, r, out_dir):
    plt = _plt()
    c = r["inner_product_curve"]
    k = [x["k"] for x in c]
    fig, a = plt.subplots(figsize=(4.8, 3.2))
    a.plot(k, [x["pe0_dot_pek"] for x in c], label="⟨PE_t, PE_t+k⟩ (t = 0)")
    a.plot(k, [x["closed_form"] for x in c], ":", color="k", label="Σ cos(w_i k)")
    a.set(xlabel="shift k", ylabel="inner product",
          title=f"Sine positions: a function of k only (spread over t ≤ {max(x['spread_over_t'] for x in c):.0e})")
    a.legend()
    return _save(fig, out_dir, "positional_inner_product")


def fig_positional_permutation(meta, r, out_dir):
    plt = _plt()
    rows = r["permutation"]
    fig, a = plt.subplots(figsize=(4.4, 3.0))
    vals = [max(x["rel_change"], 1e-18) for x in rows]
    a.bar([x["pos"] for x in rows], vals, color=[SCHEME_COLORS.get(x["pos"], "C0") for x in rows])
    a.set_yscale("log")
    a.axhline(1e-12, ls=":", color="gray")
    a.set(xlabel="position scheme", ylabel="relative change of the output",
          title="Shuffling the tokens (mean-pooled encoder)")
    return _save(fig, out_dir, "positional_permutation")


# ----------------------------------------------------------------------------- length generalisation


def fig_length_generalization(meta, r, out_dir):
    plt = _plt()
    tasks = r["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.4 * len(tasks), 3.3), squeeze=False)
    for a, (task, tr) in zip(axes[0], tasks.items()):
        for scheme, rows in tr["accuracy"].items():
            a.plot([x["length"] for x in rows], [x["accuracy"] for x in rows], "o-", ms=3,
                   color=SCHEME_COLORS.get(scheme), label=scheme)
        a.axhline(tr["chance"], ls=":", color="gray", label="chance")
        a.axvline(tr["train_length"], ls="--", color="k", lw=0.8, label="trained length")
        a.set(xlabel="sequence length", ylabel="next-token accuracy", title=f"{task}", ylim=(0, 1.02))
        a.legend()
    fig.suptitle("Length extrapolation by position scheme — " + _subtitle(meta), fontsize=9)
    paths = _save(fig, out_dir, "length_generalization")
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.4 * len(tasks), 3.0), squeeze=False)
    for a, (task, tr) in zip(axes[0], tasks.items()):
        for scheme, curve in tr["curves"].items():
            a.plot([x["step"] for x in curve], [x["loss"] for x in curve], color=SCHEME_COLORS.get(scheme),
                   label=scheme, lw=1.0)
        a.set(xlabel="optimizer step", ylabel="training loss (nats/token)", title=f"{task}: training", yscale="log")
        a.legend()
    return paths + _save(fig, out_dir, "length_generalization_training")


# ----------------------------------------------------------------------------- tokenization


def fig_tokenization(meta, r, out_dir):
    plt = _plt()
    sch = r["schemes"]
    bpe = [x for x in sch if x["kind"] == "bpe" and not x["end_of_word"]]
    base = {x["scheme"]: x for x in sch if x["kind"] != "bpe"}
    m = [x["merges_done"] for x in bpe]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    a.semilogx(m, [x["mean_tokens"] for x in bpe], "o-", label="BPE: mean tokens")
    a.semilogx(m, [x["p95"] for x in bpe], "s--", label="BPE: P95 tokens")
    for name, ls in (("char", ":"), ("atom", "-.")):
        if name in base:
            a.axhline(base[name]["mean_tokens"], ls=ls, color="gray", label=f"{name}: mean tokens")
    a.set(xlabel="merges learned", ylabel="tokens per molecule", title="ESOL SMILES length")
    a.legend()
    b.loglog(m, [x["sum_T2_rel_char"] for x in bpe], "o-", label="Σ T² relative to char")
    b.loglog(m, [x["vocab"] for x in bpe], "s-", label="vocabulary size")
    b.set(xlabel="merges learned", ylabel="ratio / count", title="Attention cost vs vocabulary")
    b.legend()
    fig.suptitle("Tokenization: BPE trained on the 902 training molecules — " + _subtitle(meta), fontsize=9)
    return _save(fig, out_dir, "tokenization")


# ----------------------------------------------------------------------------- dropout


def fig_dropout(meta, r, out_dir):
    plt = _plt()
    rows = r["dropout"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    width = 0.8 / len(rows)
    for k, x in enumerate(rows):
        rr = x["rows"]
        pos = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(rr))]
        a.bar(pos, [y["sum_std"] for y in rr], width, label=f"p = {x['p']} measured")
        a.plot(pos, [y["sum_std_closed_form"] for y in rr], "k_", ms=10)
    a.plot([], [], "k_", ms=10, label="closed form √(p/(1−p) Σw²)")
    top = max(y["sum_std"] for x in rows for y in x["rows"])
    a.set(xlabel="attention row (query position)", ylabel="std of the row sum", title="Row-sum noise",
          ylim=(0, 1.45 * top))
    a.legend(loc="upper right", ncol=2)
    ps = [x["p"] for x in rows]
    b.plot(ps, [x["noise_scale_measured"] for x in rows], "o", label="noise scale, measured")
    b.plot(ps, [x["noise_scale_closed_form"] for x in rows], "k:", label="√(p/(1−p))")
    b.plot(ps, [x["row_zero_frac_mean"] for x in rows], "s", label="P(row all zero), measured")
    b.plot(ps, [x["row_zero_prob_closed_form_mean"] for x in rows], "k--", lw=0.8, label="P(row zero), closed form")
    b.set(xlabel="dropout probability p", ylabel="value", title=f"{rows[0]['n_masks']:,} Monte Carlo masks")
    b.legend()
    fig.suptitle("Inverted dropout on a 5×5 causal attention matrix — " + _subtitle(meta), fontsize=9)
    return _save(fig, out_dir, "dropout")


# The registry: results name -> its figure functions, and -> its README section function.  Each
# experiment's section below registers itself with FIGURES[name] = [...] and README_SECTIONS[name] = fn
# right after its functions (fn(payload) -> list of markdown lines, the payload being the whole JSON).
FIGURES = {
    "attention": [fig_attention_scaling, fig_attention_temperature, fig_attention_cost, fig_attention_gradcheck,
                  fig_attention_throughput],
    "positional": [fig_positional_ladder, fig_positional_inner, fig_positional_permutation],
    "length_generalization": [fig_length_generalization],
    "tokenization": [fig_tokenization],
    "dropout": [fig_dropout],
}
README_SECTIONS = {}
# README order of the sections registered in README_SECTIONS (the tutorial's order).
SECTION_ORDER = ["smiles_lm", "attention_chem", "esol", "materials", "hopv", "reaction"]

# ----------------------------------------------------------------------------- experiment sections
# (one block per experiment: its fig_* functions, its readme_* function, then its registration)

# ----------------------------------------------------------------------------- experiment 9: reaction

# The tutorial's experiment 9 (encoder-decoder on USPTO-50K, 800 training reactions x 3 epochs, greedy
# decoding of 150 test reactions); copy_tanimoto is the issue's figure for the copy baseline (2,000 test
# reactions), not the tutorial's.
REFERENCE["reaction"] = {"n_reactions": 3200, "params": 103160, "V": 56, "d_model": 48, "n_train": 800,
                         "epochs": 3, "train_loss": [1.760, 1.403, 1.310], "valid_token_acc": [0.527, 0.549, 0.582],
                         "test_token_acc": 0.576, "greedy_exact": 0.000, "n_test": 150, "valid": 0.087,
                         "tanimoto": 0.135, "wall_min": 8, "copy_tanimoto": 0.57}
REACTION_RUNS = {"reference": "reference setting", "strong": "strongest model"}
REACTION_BASELINES = {"copy_largest": "copy the largest reactant", "nearest_train": "nearest training reaction",
                      "nearest_train_all": "nearest reaction, whole training split"}


def _stamp(fig, meta):
    """The commit the results came from, in small print at the bottom right."""
    fig.text(0.995, 0.003, f"git {str(meta.get('git_commit', '?'))[:12]}", ha="right", va="bottom",
             fontsize=6, color="gray")


def fig_reaction_training(meta, r, out_dir):
    plt = _plt()
    ref = REFERENCE["reaction"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for name, run in r["runs"].items():
        steps_per_epoch = max(1, run["n_steps"] / max(1, len(run["epochs"])))
        a.plot([c["step"] / steps_per_epoch for c in run["curve"]], [c["loss"] for c in run["curve"]],
               lw=0.7, alpha=0.5, label=f"{REACTION_RUNS[name]}: per step")
        ep = run["epochs"]
        a.plot([e["epoch"] for e in ep], [e["train_loss"] for e in ep], "o-", label=f"{REACTION_RUNS[name]}: epoch mean")
        b.plot([e["epoch"] for e in ep], [e["valid_token_acc"] for e in ep], "o-", label=REACTION_RUNS[name])
    a.plot(range(1, 4), ref["train_loss"], "k^:", label="tutorial: epoch mean")
    b.plot(range(1, 4), ref["valid_token_acc"], "k^:", label="tutorial")
    a.set(xlabel="epoch", ylabel="train loss (nats / token)", title="Training loss")
    b.set(xlabel="epoch", ylabel="teacher-forced token accuracy", title="Validation token accuracy")
    a.legend()
    b.legend()
    fig.suptitle("Experiment 9: USPTO-50K product prediction — " + _subtitle(meta), fontsize=9)
    _stamp(fig, meta)
    return _save(fig, out_dir, "reaction_training")


def fig_reaction_topk(meta, r, out_dir):
    plt = _plt()
    fig, axes = plt.subplots(1, len(r["runs"]), figsize=(4.2 * len(r["runs"]), 3.2), squeeze=False)
    for a, (name, run) in zip(axes[0], r["runs"].items()):
        rows = run["topk_vs_width"]
        widths = [x["width"] for x in rows]
        for k in (1, 3, 5, 10):
            a.plot(widths, [x[f"top{k}"] for x in rows], "o-", label=f"top-{k}")
        for bname, style in (("copy_largest", ":"), ("nearest_train", "--")):
            a.axhline(r["baselines"][bname]["test150"]["top5"], ls=style, color="gray",
                      label=f"{REACTION_BASELINES[bname]}, top-5")
        a.set(xlabel="beam width", ylabel="exact match (canonical)", xticks=widths,
              title=f"{REACTION_RUNS[name]} ({rows[0]['n']} test reactions)", ylim=(0, None))
        a.legend(fontsize=7)
    fig.suptitle("Top-k exact match against beam width — " + _subtitle(meta), fontsize=9)
    _stamp(fig, meta)
    return _save(fig, out_dir, "reaction_topk_width")


def _reaction_methods(r):
    """[(label, metrics block)] of the beam-5 runs and the baselines, in display order."""
    w = "beam5"
    out = [(f"{REACTION_RUNS[n]}, beam 5", run["metrics"][w]) for n, run in r["runs"].items()]
    return out + [(REACTION_BASELINES[n], b) for n, b in r["baselines"].items()]


def fig_reaction_by_class(meta, r, out_dir):
    plt = _plt()
    methods = _reaction_methods(r)
    classes = sorted(methods[0][1]["by_class"], key=int)
    fig, axes = plt.subplots(2, 1, figsize=(8.4, 5.2), sharex=True)
    width = 0.8 / len(methods)
    for k, (label, m) in enumerate(methods):
        pos = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(classes))]
        for a, key in zip(axes, ("valid", "tanimoto")):
            a.bar(pos, [m["by_class"].get(c, {}).get(key) or 0 for c in classes], width, label=label)
    axes[0].set(ylabel="RDKit validity of top-1", title="Validity by reaction class", ylim=(0, 1.45))
    axes[1].set(ylabel="mean Tanimoto top-1 vs truth", title="Tanimoto by reaction class", ylim=(0, 1.05))
    n = methods[0][1]["by_class"]
    axes[1].set_xticks(range(len(classes)), [f"class {c}\n(n={n[c]['n']})" for c in classes], fontsize=7)
    axes[0].legend(fontsize=7, ncol=3, loc="upper center")
    fig.suptitle("Experiment 9 by reaction class — " + _subtitle(meta), fontsize=9)
    _stamp(fig, meta)
    return _save(fig, out_dir, "reaction_by_class")


def _mol_image(smiles, size=(260, 200)):
    """RDKit drawing of a SMILES as an RGB array, or None when RDKit cannot parse it."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Draw
    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    import numpy as np
    return np.asarray(Draw.MolToImage(mol, size=size).convert("RGB"))


def fig_reaction_examples(meta, r, out_dir):
    plt = _plt()
    ex = r["examples"][:4]
    fig, axes = plt.subplots(len(ex), 2, figsize=(6.4, 2.3 * len(ex)), squeeze=False)
    for row, e in zip(axes, ex):
        top1 = e["top3"][0] if e["top3"] else {"smiles": "", "valid": False, "tanimoto": 0.0, "hit": False}
        for a, smi, title in ((row[0], e["product"], f"{e['reactants'][:60]} >>\ntrue product (class {e['class']})"),
                              (row[1], top1["smiles"], f"top-1: {'HIT' if top1['hit'] else 'miss'}, "
                                                       f"Tanimoto {top1['tanimoto']:.2f}")):
            img = _mol_image(smi)
            a.axis("off")
            a.set_title(title, fontsize=7)
            if img is None:
                a.text(0.5, 0.5, "invalid SMILES:\n" + (smi[:40] or "(empty)"), ha="center", va="center", fontsize=7,
                       transform=a.transAxes, wrap=True)
            else:
                a.imshow(img)
    fig.suptitle("Reference model, beam 5: true product | top-1 — " + _subtitle(meta), fontsize=8)
    _stamp(fig, meta)
    return _save(fig, out_dir, "reaction_examples")


def _pct(x):
    return "–" if x is None else f"{x:.3f}"


def _reaction_row(label, m, ref_cols=None):
    cells = [m.get("top1"), m.get("top3"), m.get("top5"), m.get("valid"), m.get("tanimoto"), m.get("tanimoto_valid"),
             m.get("conserved")]
    return f"| {label} | {m['n']} | " + " | ".join(_pct(c) for c in cells) + " |"


def _reaction_metric_table(r):
    """Every method on the 500-reaction sample, and the tutorial's greedy row on its 150."""
    ref = REFERENCE["reaction"]
    out = ["| method | n | top-1 | top-3 | top-5 | valid | Tanimoto | Tanimoto (valid only) | atoms conserved |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, run in r["runs"].items():
        out.append(_reaction_row(f"Transformer, {REACTION_RUNS[name]}, greedy", run["metrics"]["greedy"]["test500"]))
        out.append(_reaction_row(f"Transformer, {REACTION_RUNS[name]}, beam 5", run["metrics"]["beam5"]["test500"]))
        if "beam5_constrained" in run["metrics"]:
            out.append(_reaction_row(f"Transformer, {REACTION_RUNS[name]}, beam 5 + SMILES constraint (first 150)",
                                     run["metrics"]["beam5_constrained"]["test500"]))
            out.append(_reaction_row(f"Transformer, {REACTION_RUNS[name]}, beam 5, same 150",
                                     run["metrics"]["beam5"]["test150"]))
    for name, b in r["baselines"].items():
        out.append(_reaction_row(f"baseline: {REACTION_BASELINES[name]}" + (f" ({b['n_pool']:,} reactions)"
                                                                          if "n_pool" in b else ""), b["test500"]))
    out.append(f"| *tutorial, greedy* | {ref['n_test']} | {ref['greedy_exact']:.3f} | – | – | {ref['valid']:.3f} | "
               f"{ref['tanimoto']:.3f} | – | – |")
    return out


def _reaction_reference_table(meta, r):
    """The reference row against the tutorial's numbers (150 test reactions, greedy)."""
    ref, run = REFERENCE["reaction"], r["runs"]["reference"]
    g = run["metrics"]["greedy"]["test150"]
    ep = run["epochs"]
    rows = [("training reactions × epochs", f"{run['n_train']} × {len(ep)}", f"{ref['n_train']} × {ref['epochs']}"),
            ("vocabulary V (shared)", f"{run['vocab_size']} (atom tokens)", f"{ref['V']} (characters?)"),
            ("parameters", f"{run['params']:,}", f"{ref['params']:,}"),
            ("train loss per epoch", " → ".join(f"{e['train_loss']:.3f}" for e in ep),
             " → ".join(f"{x:.3f}" for x in ref["train_loss"])),
            ("valid token accuracy per epoch", " → ".join(f"{e['valid_token_acc']:.3f}" for e in ep),
             " → ".join(f"{x:.3f}" for x in ref["valid_token_acc"])),
            ("test token accuracy (teacher forced)", f"{run['test_token_acc']:.3f}", f"{ref['test_token_acc']:.3f}"),
            (f"greedy exact match, {g['n']} test reactions", f"{g['top1']:.3f}", f"{ref['greedy_exact']:.3f}"),
            ("RDKit validity (greedy)", f"{g['valid']:.3f}", f"{ref['valid']:.3f}"),
            ("mean Tanimoto to the truth (greedy; invalid = 0)", f"{g['tanimoto']:.3f}", f"{ref['tanimoto']:.3f}"),
            ("wall time (train + all decoding)", f"{run['wall_s'] / 60:.1f} min", f"{ref['wall_min']} min (greedy only)")]
    out = ["| reference setting | ours | tutorial |", "|---|---|---|"]
    return out + [f"| {a} | {b} | {c} |" for a, b, c in rows]


def _reaction_class_table(r):
    run = r["runs"]["reference"]["metrics"]["beam5"]["by_class"]
    base = r["baselines"]
    out = ["| class | n | top-1 | top-5 | valid | Tanimoto | conserved | copy: Tanimoto | nearest: top-5 | nearest: Tanimoto |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(run, key=int):
        m, cp, nb = run[c], base["copy_largest"]["by_class"][c], base["nearest_train"]["by_class"][c]
        out.append(f"| {c} | {m['n']} | {_pct(m['top1'])} | {_pct(m['top5'])} | {_pct(m['valid'])} | "
                   f"{_pct(m['tanimoto'])} | {_pct(m['conserved'])} | {_pct(cp['tanimoto'])} | {_pct(nb['top5'])} | "
                   f"{_pct(nb['tanimoto'])} |")
    return out


def _reaction_examples_table(r):
    out = ["| # | class | reactants | true product | top-3 (valid, Tanimoto; ✔ = hit) |", "|---|---|---|---|---|"]
    for k, e in enumerate(r["examples"], 1):
        preds = "<br>".join(f"{i}. `{p['smiles'] or '(empty)'}` ({'valid' if p['valid'] else 'invalid'}, "
                            f"{p['tanimoto']:.2f}){' ✔' if p['hit'] else ''}" for i, p in enumerate(e["top3"], 1))
        out.append(f"| {k} | {e['class']} | `{e['reactants']}` | `{e['product']}` | {preds} |")
    return out


def _better(a, b, se):
    """+1 if a beats b by more than two standard errors, -1 if it loses by more, 0 otherwise."""
    if se is None or abs(a - b) <= 2 * se:
        return 0
    return 1 if a > b else -1


def _prop_se(p1, p2, n):
    """Standard error of the difference of two proportions measured on the same n reactions (unpaired bound)."""
    return ((p1 * (1 - p1) + p2 * (1 - p2)) / n) ** 0.5 if n else None


def _reaction_reading(r):
    """A computed judgement of the best Transformer run against both baselines."""
    best_name = "strong" if "strong" in r["runs"] else "reference"
    m = r["runs"][best_name]["metrics"]["beam5"]["test500"]
    copy, near = r["baselines"]["copy_largest"]["test500"], r["baselines"]["nearest_train"]["test500"]
    n = m["n"]
    se_t = ((m.get("tanimoto_se") or 0) ** 2 + (copy.get("tanimoto_se") or 0) ** 2) ** 0.5
    verdict = {1: "beats", 0: "is level with (within two standard errors)", -1: "loses to"}
    t_cmp = _better(m["tanimoto"], copy["tanimoto"], se_t)
    k_copy = _better(m["top5"], copy["top5"], _prop_se(m["top5"], copy["top5"], n))
    k_near = _better(m["top5"], near["top5"], _prop_se(m["top5"], near["top5"], n))
    goal = t_cmp == 1 and k_copy == 1 and k_near == 1
    text = (f"*Reading:* the {REACTION_RUNS[best_name]} (beam 5, {n} test reactions) {verdict[t_cmp]} the copy-the-"
            f"largest-reactant baseline on Tanimoto ({m['tanimoto']:.3f} vs {copy['tanimoto']:.3f}), and on top-5 exact "
            f"match it {verdict[k_copy]} the copy baseline ({m['top5']:.3f} vs {copy['top5']:.3f}) and "
            f"{verdict[k_near]} the nearest-training-reaction baseline ({m['top5']:.3f} vs {near['top5']:.3f}). ")
    text += ("The goal (beat the copy baseline on Tanimoto and both baselines on top-5) is met." if goal else
             "The goal (beat the copy baseline on Tanimoto and both baselines on top-5) is NOT met: "
             "at this size and training budget the Transformer is a negative result against cheap baselines.")
    if m["valid"] < 0.5:
        text += f" Only {100 * m['valid']:.0f}% of its top-1 strings are valid SMILES."
    return text


def _reaction_params_note(r):
    run, ref = r["runs"]["reference"], REFERENCE["reaction"]
    d, V = run["config"]["model"]["d_model"], run["vocab_size"]
    gap = ref["params"] - run["params"]
    why = (f"exactly the vocabulary: {ref['V']} − {V} = {ref['V'] - V} ids fewer in the source embedding, the target "
           f"embedding and the output head, (3·{d} + 1) parameters each"
           if gap == (ref["V"] - V) * (3 * d + 1) else "not only the vocabulary (check the architecture)")
    return (f"Parameters: {run['params']:,} here against the tutorial's {ref['params']:,}; the difference of {gap:,} is "
            f"{why} (atom-level tokens, one shared vocabulary built on the training reactions).")


REACTION_DIFFERENCES = [
    "Tokens are atom-level (`chemdata.tokenize_smiles`: `Cl`, `Br`, bracket atoms are one token) with one vocabulary "
    "shared by source and target, built on the training reactions; the tutorial probably used characters.",
    "The file's own train/valid/test split of USPTO-50K (Liu et al. 2017) filtered to single products with both sides "
    "at most 48 characters, instead of the tutorial's 3,200-reaction subset; training reactions are a seeded sample.",
    "Metrics on a fixed seeded sample of 500 test reactions (the tutorial's 150 are its first 150); exact match after "
    "RDKit canonicalisation of both sides, so another valid spelling of the right product counts.",
    "Beam search (width 5, length penalty 1: mean log-probability per token) with the K/V cache, besides greedy; "
    "top-k vs width and the SMILES-constrained beam on the first 150 reactions only (decoding cost).",
    "Baselines (copy the largest reactant; nearest training reaction by reactant Tanimoto), an atom-conservation "
    "check and per-class metrics, which the tutorial does not have.",
    "Batch size 8, peak learning rate 2e-3 after 100 warmup steps (the tutorial does not state its optimiser settings).",
]


def readme_reaction(payload):
    """README section of experiment 9."""
    r = payload["results"]
    d = r["data"]
    ps = d["per_split"]
    out = ["### Experiment 9 — USPTO-50K product prediction (encoder-decoder, beam search, chemical scoring)", "",
           f"{d['kept']:,} single-product reactions with both sides ≤ {d['max_chars']} characters "
           f"(train {ps['train']:,} / valid {ps['valid']:,} / test {ps['test']:,}); {r['splits_overlap']} reactions "
           f"appear in two splits. {100 * d['truth_conserved_share']:.1f}% of the sampled true products pass the "
           "atom-conservation check" + (" (the others are mostly salts whose \"product\" is a counter-ion)"
                                        if d["truth_conserved_share"] < 1 else "") +
           f". Run: {payload['mode']} mode; " + ", ".join(
               f"{REACTION_RUNS[k]} {x['wall_s'] / 60:.1f} min (training {x['train_wall_s'] / 60:.1f})"
               + (" (training resumed from its checkpoint)" if x.get("resumed_at_steps") else "")
               for k, x in r["runs"].items()) + ".", ""]
    out += _reaction_metric_table(r) + [""]
    out += [_reaction_reading(r), ""]
    out += _reaction_reference_table(payload, r) + ["", _reaction_params_note(r), ""]
    c = r["runs"]["reference"].get("constrained", {})
    if not c.get("available"):
        out += ["Constrained decoding: " + c.get("note", "not run") + ".", ""]
    out += ["Per reaction class (reference model, beam 5; baselines on the same reactions):", ""]
    out += _reaction_class_table(r) + ["", "Ten test reactions (reference model, beam 5):", ""]
    out += _reaction_examples_table(r) + ["", "Differences from the tutorial:", ""]
    out += [f"- {x}" for x in REACTION_DIFFERENCES]
    out += ["", "![training](figures/reaction_training.png) ![top-k](figures/reaction_topk_width.png)",
            "![by class](figures/reaction_by_class.png) ![examples](figures/reaction_examples.png)"]
    return out


FIGURES["reaction"] = [fig_reaction_training, fig_reaction_topk, fig_reaction_by_class, fig_reaction_examples]
README_SECTIONS["reaction"] = readme_reaction


# ----------------------------------------------------------------------------- overview (README top table)
# One row per study of the tutorial: what it teaches, its headline number here beside the tutorial's, the
# wall time here (from run_all_summary.json, else the results file) and a link to its README section.

REFERENCE["overview"] = {
    "smiles_lm": {"test_bits": 2.812, "validity_t1": 0.325},
    "attention_chem": {"ring_head": 0.040, "uniform": 0.030},
    "esol": {"transformer": 1.089, "mlp": 1.819},
    "materials": {"transformer": 0.304, "ridge": 0.337},
    "hopv": {"transformer": 0.205, "mlp": 0.440},
    "reaction": {"exact": 0.000, "valid": 0.087},
}

# (script name, results name, title, what it teaches, regex of its README heading)
STUDIES = [
    ("attention_basics", "attention", "1 · attention check-up",
     "why scores are scaled by 1/√d_k, temperature, the O(T²) cost, every gradient checked", r"Experiment 1\b"),
    ("positional", "positional", "2 · positional encodings",
     "attention is order-blind; sine, learned and RoPE positions and their identities", r"Experiment 2\b"),
    ("length_generalization", "length_generalization", "3 · length extrapolation",
     "which position scheme carries a rule to longer sequences than it was trained on", r"Experiment 3\b"),
    ("smiles_lm", "smiles_lm", "4 · SMILES language model",
     "next-token modelling of molecules; sampling, validity, and a grammar constraint", r"Experiment 4\b"),
    ("attention_chem", "attention_chem", "5 · what the heads look at",
     "reading attention maps: hypotheses, not chemical evidence", r"Experiment 5\b"),
    ("deepchem_esol", "esol", "6 · ESOL solubility",
     "a small encoder against fingerprints; scaffold vs random split", r"Experiment 6\b"),
    ("deepchem_materials", "materials", "7 · formation energy from composition",
     "what composition alone, as a string, cannot tell (negative in the tutorial)", r"Experiment 7\b"),
    ("deepchem_hopv", "hopv", "8 · HOPV photovoltaics",
     "a Transformer on a few hundred molecules against fingerprints (negative in the tutorial)", r"Experiment 8\b"),
    ("reaction_seq2seq", "reaction", "9 · reaction prediction",
     "encoder-decoder and beam search on a small slice of USPTO-50K (negative in the tutorial)", r"Experiment 9\b"),
    ("tokenization", "tokenization", "tokenization (supplementary)",
     "char, atom and BPE tokens: sequence length against vocabulary", r"Supplementary — tokeni[sz]ation"),
    ("dropout", "dropout", "dropout (supplementary)",
     "inverted dropout is unbiased and how noisy it is", r"Supplementary — dropout"),
]


def _summary_row(runs, name):
    return next((x for x in runs if x["name"] == name), None)


def _hl_attention(r):
    row = next(x for x in r["scaling"] if x["d_k"] == 512)
    ref = REFERENCE["scaling"][512]
    return (f"score variance at d_k = 512: {row['unscaled_var']:.0f} unscaled, {row['scaled_var']:.3f} scaled",
            f"{ref[0]:.0f}, {ref[1]:.3f}")


def _hl_positional(r):
    ch = {x["pos"]: x["rel_change"] for x in r["permutation"]}
    ref = REFERENCE["positional"]["shuffle"]
    return (f"output change when the input is shuffled: {ch['none']:.0e} (no positions), {ch['rope']:.3f} (RoPE)",
            f"{ref['none'][1]:.0e}, {ref['rope'][1]:.2f}")


def _hl_length(r):
    acc = {p: next(x["accuracy"] for x in rows if x["length"] == 30)
           for p, rows in r["tasks"]["periodic"]["accuracy"].items()}
    ref = REFERENCE["length"]["periodic"]
    return (f"periodic rule at length 30 (trained at 16): RoPE {acc['rope']:.3f}, sine {acc['sine']:.3f}",
            f"{ref['rope'][30]:.3f}, {ref['sine'][30]:.3f}")


def _hl_tokenization(r):
    s = {x["scheme"]: x for x in r["schemes"]}
    ref = REFERENCE["tokenization"]
    return (f"mean tokens per SMILES: char {s['char']['mean_tokens']:.2f}, BPE@512 {s['BPE@512']['mean_tokens']:.2f}",
            f"{ref['char'][1]:.2f}, {ref['BPE@512'][1]:.2f}")


def _hl_dropout(r):
    row = next(x for x in r["dropout"] if x["p"] == 0.5)
    ref = REFERENCE["dropout"][0.5]["zero_row"]
    return (f"p = 0.5: a whole attention row zeroed {100 * row['row_zero_frac_mean']:.1f}% of the time "
            f"(closed form {100 * row['row_zero_prob_closed_form_mean']:.1f}%)", f"{100 * ref[0]:.1f}% ({100 * ref[1]:.1f}%)")


def _hl_smiles_lm(r):
    ref = REFERENCE["overview"]["smiles_lm"]
    t1 = {bool(x["constrained"]): x["validity"] for x in r["sampling"] if x["temperature"] == 1.0 and not x["top_k"]}
    return (f"test {r['fit']['test']['bits_per_token']:.3f} bits/token; valid samples at τ = 1: {t1[False]:.3f}, "
            f"{t1[True]:.3f} constrained", f"{ref['test_bits']:.3f}; {ref['validity_t1']:.3f}, –")


def _summary_metric(r, split, model, key):
    return next(x[key] for x in r["summary"] if x["split"] == split and x["model"] == model)


def _hl_esol(r):
    ref = REFERENCE["overview"]["esol"]
    t, m = (_summary_metric(r, "scaffold", mdl, "test_rmse") for mdl in ("Transformer", "MLP + fingerprints"))
    return (f"scaffold test RMSE: Transformer {t:.3f}, fingerprint MLP {m:.3f}",
            f"{ref['transformer']:.3f}, {ref['mlp']:.3f}")


def _hl_materials(r):
    ref = REFERENCE["overview"]["materials"]
    t, g = (_summary_metric(r, "random", mdl, "test_mae") for mdl in ("Transformer", "ridge + element fractions"))
    return (f"test MAE (eV/atom): Transformer {t:.3f}, ridge on fractions {g:.3f}",
            f"{ref['transformer']:.3f}, {ref['ridge']:.3f}")


def _hl_hopv(r):
    ref = REFERENCE["overview"]["hopv"]
    t, m = (_summary_metric(r, "random", mdl, "test_r2") for mdl in ("Transformer", "MLP + Morgan"))
    return f"test R²: Transformer {t:.3f}, fingerprint MLP {m:.3f}", f"{ref['transformer']:.3f}, {ref['mlp']:.3f}"


def _hl_reaction(r):
    ref = REFERENCE["overview"]["reaction"]
    g = r["runs"]["reference"]["metrics"]["greedy"]["test150"]
    return (f"greedy exact match {g['top1']:.3f}, valid {g['valid']:.3f} (150 test reactions)",
            f"{ref['exact']:.3f}, {ref['valid']:.3f}")


def _hl_attention_chem(r):
    ref = REFERENCE["overview"]["attention_chem"]
    return r["headline"], f"best ring-closure head {ref['ring_head']:.3f} vs uniform {ref['uniform']:.3f}"


HEADLINES = {"attention": _hl_attention, "positional": _hl_positional, "length_generalization": _hl_length,
             "tokenization": _hl_tokenization, "dropout": _hl_dropout, "smiles_lm": _hl_smiles_lm,
             "attention_chem": _hl_attention_chem, "esol": _hl_esol, "materials": _hl_materials,
             "hopv": _hl_hopv, "reaction": _hl_reaction}


def _anchor(results_md, pattern):
    """'#anchor' of the first '### ' heading matching pattern (GitHub's slug rule), or None."""
    import re
    for line in results_md.splitlines():
        if line.startswith("### ") and re.match(pattern, line[4:]):
            slug = re.sub(r"[^\w\- ]", "", line[4:].strip().lower()).replace(" ", "-")
            return "#" + slug
    return None


def _overview_row(study, results, runs, results_md):
    """One table row: linked title, what it teaches, headline here, tutorial, wall time here."""
    script, name, title, teaches, pattern = study
    link = _anchor(results_md, pattern)
    title_md = f"[{title}]({link})" if link else title
    payload = results.get(name)
    if payload is None:
        return f"| {title_md} | {teaches} | not run yet (`demos/demo_{script}.py`) | – | – |"
    try:
        ours, ref = HEADLINES[name](payload["results"])
    except (KeyError, TypeError, ValueError, IndexError, StopIteration):
        ours, ref = "see its section", "–"
    row = _summary_row(runs, script)
    same_run = row and row.get("status") in ("ok", "current") and row.get("mode") == payload.get("mode")
    wall = row["wall_time_s"] if same_run else payload.get("wall_time_s")
    return f"| {title_md} | {teaches} | {ours} | {ref} | {'–' if wall is None else _fmt_min(wall)} |"


def _fmt_min(seconds):
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _overview_reading(summary):
    """One line on the last main job, from run_all_summary.json (budget: 90 minutes for the default mode)."""
    if not summary:
        return "_No main job recorded yet: `python demos/run_all.py` writes `figures/run_all_summary.json`._"
    runs = summary.get("experiments", [])
    done = sum(r["status"] in ("ok", "current") for r in runs if r["name"] in {s[0] for s in STUDIES})
    total = summary["total_wall_time_s"]
    verdict = ("within" if total <= 90 * 60 else "over") + " the 90-minute budget" if summary["mode"] == "default" else ""
    return (f"*Main job:* `run_all.py` ({summary['mode']} mode, {summary['interpreter']}, commit "
            f"`{str(summary['git_commit'])[:12]}`) completed {done} of {len(STUDIES)} studies in "
            f"{_fmt_min(total)} on this {summary.get('cpu_count', '?')}-core machine" + (f", {verdict}." if verdict else "."))


def readme_overview(folder, results_md):
    """Markdown for the README's top table of all studies."""
    summary = None
    path = os.path.join(folder, "run_all_summary.json")
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            print(f"warning: skipping {os.path.relpath(path, ROOT)}: {e}", file=sys.stderr)
    runs = (summary or {}).get("experiments", [])
    results = load_results(folder)
    lines = ["| study | what it teaches | headline here | tutorial | wall time here |", "|---|---|---|---|---|"]
    lines += [_overview_row(s, results, runs, results_md) for s in STUDIES]
    return "\n".join(lines + ["", _overview_reading(summary)])

# ----------------------------------------------------------------------------- end of experiment sections


def load_results(folder):
    """{name: payload} for every readable results_<name>.json in folder; warns about the rest."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "results_*.json"))):
        name = os.path.basename(path)[len("results_"):-len(".json")]
        try:
            with open(path, encoding="utf-8") as f:
                payload = json.load(f)
            if not isinstance(payload, dict) or "results" not in payload:
                raise ValueError("no 'results' key")
            out[name] = payload
        except (OSError, ValueError) as e:
            print(f"warning: skipping {os.path.relpath(path, ROOT)}: {e}", file=sys.stderr)
    return out


def render_all(folder):
    """Draw every figure whose results file is present; returns (written paths, number of failures)."""
    written, failures = [], 0
    for name, payload in load_results(folder).items():
        for fn in FIGURES.get(name, []):
            try:
                written += fn(payload, payload["results"], folder)
            except Exception as e:  # one broken figure must not stop the others
                failures += 1
                print(f"warning: {fn.__name__} failed on results_{name}.json: {type(e).__name__}: {e}",
                      file=sys.stderr)
    return written, failures


# ----------------------------------------------------------------------------- README tables


def _g(x, fmt=".3f"):
    return "–" if x is None else format(x, fmt)


def _e(x):
    return "–" if x is None else f"{x:.1e}"


def readme_speed(folder):
    """Markdown for the Speed section from figures/bench_core_py*.json: every number in a Python column was
    measured in that run; the reference column holds only the tutorial's own figures."""
    benches = []
    for path in sorted(glob.glob(os.path.join(folder, "bench_core_py*.json"))):
        with open(path, encoding="utf-8") as f:
            benches.append(json.load(f))
    if not benches:
        return "_No benchmark yet: run `python demos/bench_core.py`._"
    ref = REFERENCE["speed"]
    lines = ["Measured by `demos/bench_core.py` on this project's 2-core machine (files "
             "`figures/bench_core_py*.json`, each from one run). The reference column quotes only the tutorial's "
             "own figures (an Apple M-series laptop, Python 3.12, one thread).", "",
             "| measurement | " + " | ".join(f"Python {b['python']} ({b['dot_impl']})" for b in benches)
             + " | tutorial |", "|---|" + "---|" * len(benches) + "---|"]

    def row(label, vals, refv=""):
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {refv} |")
    row("test suite (`python tests_transformer.py`)",
        [f"{b['suite']['last_line'].split(',')[0]} in {b['suite']['wall_time_s']:.1f} s" for b in benches],
        ref["suite"])
    for i, shape in enumerate(benches[0]["matmul"]):
        row(f"`matmul` {shape['shape']}, Mflop/s (naive loop; ratio)",
            [f"{b['matmul'][i]['matmul_mflops']:.0f} ({b['matmul'][i]['naive_mflops']:.0f}; "
             f"{b['matmul'][i]['ratio']:.1f}×)" for b in benches],
            f"{ref['matmul_mflops']} (about {ref['matmul_vs_naive']}× naive)" if i == 0 else "")
    s = [b["steps"]["d48_lm"] for b in benches]
    row(f"training step, d=48 LM, T=40 ({s[0]['params']:,} params), ms", [f"{x['step_ms']:.0f}" for x in s])
    row("through `train()`, batch 16, ms per sequence: 1 worker → 2 workers (speed-up)",
        [f"{x['train_ms_per_seq_1_worker']:.0f} → {x['train_ms_per_seq_2_workers']:.0f} "
         f"({x['speedup_2_workers']:.2f}×)" if "speedup_2_workers" in x else "–" for x in s])
    row("same shape in PyTorch (CPU, 1 thread, float32), ms; pure Python is N× slower",
        [f"{x['torch_step_ms']:.1f}; {x['slowdown_vs_torch']:.0f}×" if "torch_step_ms" in x else "– (no torch)"
         for x in s])
    mg = [b["steps"]["microgpt"] for b in benches]
    row(f"training step at microgpt's shape ({mg[0]['params']:,} params), ms: lists of rows vs scalar autograd",
        [f"{x['step_ms']:.1f} vs {x['scalar_autograd_step_ms']:.0f} ({x['scalar_over_lists']:.0f}×)"
         if "scalar_autograd_step_ms" in x else f"{x['step_ms']:.1f}" for x in mg])
    lines += _speed_generation_rows(benches, row)
    ratios = ", ".join(f"{min(m['ratio'] for m in b['matmul']):.1f}–{max(m['ratio'] for m in b['matmul']):.1f}× "
                       f"on Python {b['python']}" for b in benches)
    lines += ["", f"*Finding:* `matmul` beats the naive triple loop by {ratios} here, against about "
              f"{ref['matmul_vs_naive']}× in the tutorial: how much the C-level iterators gain over a Python loop "
              "depends on the interpreter and the processor, so quote this ratio with both."]
    return "\n".join(lines)


def _speed_generation_rows(benches, row):
    """The K/V-cache and parallel_map rows of the speed table (absent from older benchmark files)."""
    g = [b.get("generation") for b in benches]
    if not any(g):
        return []
    labels = {"lm_sample_40": "sampling 40 tokens, d=48 2-layer LM",
              "seq2seq_greedy_30": "greedy 30 tokens, d=48 2+2-layer EncoderDecoder, 40-token source"}
    for key, label in labels.items():
        row(f"{label}: plain → K/V cache, s (speed-up)",
            [f"{x[key]['plain_s']:.2f} → {x[key]['cached_s']:.3f} ({x[key]['speedup']:.1f}×)" if x else "–"
             for x in g])
    row("`parallel_map`, 200 samples of 20 tokens: 1 → 2 workers, s (speed-up)",
        [f"{x['parallel_map']['one_worker_s']:.1f} → {x['parallel_map']['two_workers_s']:.1f} "
         f"({x['parallel_map']['speedup']:.2f}×)" if x else "–" for x in g])
    return []


def readme_results(results):
    """Markdown for the Results section: headline numbers next to the tutorial's, one line of reading each."""
    out = ["Generated from `figures/results_*.json` by `python make_figures.py --readme`; the tutorial's values "
           "(measured on a faster laptop) in the *reference* columns. Wall times are this 2-core machine's."]
    R = REFERENCE

    def head(name, title):
        m = results[name]
        out.extend(["", f"### {title}", "",
                    f"`figures/results_{name}.json` — {'QUICK' if m['quick'] else 'full'} run, "
                    f"Python {m['python']} ({m['dot_impl']}), seed {m['seed']}, wall time {m['wall_time_s']:.0f} s.",
                    ""])
        return m["results"]

    if "attention" in results:
        r = head("attention", "Experiment 1 — attention check-up")
        out += ["| d_k | unscaled var | scaled var | unscaled entropy | scaled entropy | reference (same columns) |",
                "|---|---|---|---|---|---|"]
        for x in r["scaling"]:
            rf = R["scaling"].get(x["d_k"])
            out.append(f"| {x['d_k']} | {x['unscaled_var']:.2f} | {x['scaled_var']:.3f} | "
                       f"{x['unscaled_entropy']:.3f} | {x['scaled_entropy']:.3f} | "
                       + (" / ".join(f"{v:g}" for v in rf) if rf else "–") + " |")
        temp = ", ".join(f"τ={x['tau']:g}: {x['entropy']:.3f} / {x['max_prob']:.3f}" for x in r["temperature"])
        reft = ", ".join(f"{v[0]:.3f} / {v[1]:.3f}" for v in R["temperature"].values())
        fit = r["cost_fit"]
        out += ["", f"Temperature (entropy / max prob over 20 keys): {temp} (reference {reft}).",
                f"Cost: log-log slope {fit['qk']['loglog_slope']:.2f} for QKᵀ and {fit['mha']['loglog_slope']:.2f} "
                f"for the full attention (reference {R['cost_slopes'][0]} and {R['cost_slopes'][1]}); "
                f"t = a + bT² fits QKᵀ with R² = {fit['qk']['quadratic_fit']['r2']:.4f} "
                f"(reference {R['cost_r2']}). Softmax of logits × 1e3 sums to {r['stability']['sum_str']}.",
                "", "| module | params | max rel err | max abs err | failed | reference (params, rel, abs) |",
                "|---|---|---|---|---|---|"]
        for x in r["gradient_check"]:
            rf = next((v for k, v in R["gradcheck"].items() if k.split(" ")[0] == x["module"].split(" ")[0]), None)
            out.append(f"| {x['module']} | {x['n_params']} | {_e(x['max_rel_err'])} | {_e(x['max_abs_err'])} | "
                       f"{x['n_failed']} | " + (f"{rf[0]}, {rf[1]:.1e}, {rf[2]:.1e}" if rf else "–") + " |")
        sc = r["scaling"]
        out += ["", f"*Reading:* without the 1/√d_k the score variance grows like d_k and the softmax collapses "
                f"(entropy {sc[0]['unscaled_entropy']:.2f} → {sc[-1]['unscaled_entropy']:.2f} nats from d_k = "
                f"{sc[0]['d_k']} to {sc[-1]['d_k']}); scaled scores keep variance ≈ 1 and entropy near "
                f"{min(x['scaled_entropy'] for x in sc):.2f}–{max(x['scaled_entropy'] for x in sc):.2f}. "
                + ("Every entry of every parameter of every module passes the finite-difference check; the "
                   "remaining errors are those of the central differences themselves (O(eps²)), since the same "
                   "gradients agree with PyTorch autograd within 1e-10 (`tests_parity_torch.py`)."
                   if all(x["n_failed"] == 0 for x in r["gradient_check"]) else
                   "SOME GRADIENT CHECKS FAILED (see the n_failed column).")]
    if "positional" in results:
        r = head("positional", "Experiment 2 — positional encodings")
        idt = r["identities"]
        out += ["| identity | max error | reference |", "|---|---|---|",
                f"| addition theorem PE_t+k = R_k PE_t | {_e(idt['addition_max_err'])} | "
                f"{R['positional']['addition']:.1e} |",
                f"| ⟨PE_t, PE_t+k⟩ spread over t | {_e(idt['inner_spread_max'])} | "
                f"{R['positional']['inner_spread']:.1e} |",
                f"| ⟨PE_t, PE_t+k⟩ vs Σ cos(w_i k) | {_e(idt['inner_max_dev'])} | {R['positional']['inner_dev']:.1e} |",
                f"| RoPE score under a common shift (relative) | {_e(idt['rope_max_rel_change'])} | "
                f"{R['positional']['rope']:.1e} |", "",
                "| shuffle test | mean abs change | relative change | reference |", "|---|---|---|---|"]
        for x in r["permutation"]:
            rf = R["positional"]["shuffle"].get(x["pos"])
            out.append(f"| {x['pos']} | {x['mean_abs_change']:.4f} | {x['rel_change']:.2g} | "
                       + (f"{rf[0]:.4f} ({rf[1]:.2g})" if rf else "–") + " |")
        enc = {e["name"]: e for e in r["ladder"]["encodings"]}
        sine = enc.get("sine", {})
        binary = enc.get("binary", {})
        out += ["", f"Ladder (d = 64, t = 0..255): sine adjacent distance constant {_g(sine.get('adjacent_dist_mean'), '.4f')} "
                f"(CV {_e(sine.get('adjacent_dist_cv'))}; reference {R['positional']['sine_adjacent']}), binary adjacent "
                f"distances CV {_g(binary.get('adjacent_dist_cv'), '.2f')} (reference {R['positional']['binary_cv']}), "
                f"sine norm / fresh learned-table norm {r['ladder']['sine_norm_over_learned_norm']:.0f}× "
                f"(reference ~{R['positional']['sine_over_learned']}×).",
                ""]
        chg = {x["pos"]: x["rel_change"] for x in r["permutation"]}
        out.append(f"*Reading:* without positions a mean-pooled encoder cannot tell a molecule from its shuffled tokens "
                   f"(relative change {chg.get('none', 0):.1g}, rounding level); "
                   + ", ".join(f"{p} {chg[p]:.2g}" for p in ("sine", "learned", "rope") if p in chg)
                   + " break the symmetry. The sine and RoPE identities hold to "
                   f"{max(idt['addition_max_err'], idt['inner_spread_max'], idt['inner_max_dev'], idt['rope_max_rel_change']):.0e}.")
    if "length_generalization" in results:
        r = head("length_generalization", "Experiment 3 — length extrapolation (trained at length 16)")
        for task, tr in r["tasks"].items():
            keys = [6, 16, 20, 26, 30] if task == "periodic" else [6, 16, 20, 30]
            out += [f"**{task}** (chance {tr['chance']:.3f}) — accuracy at length " + " / ".join(map(str, keys))
                    + ", ours vs reference:", "", "| scheme | ours | reference |", "|---|---|---|"]
            for scheme, rows in tr["accuracy"].items():
                acc = {x["length"]: x["accuracy"] for x in rows}
                rf = R["length"].get(task, {}).get(scheme, {})
                out.append(f"| {scheme} | " + " / ".join(_g(acc.get(k)) for k in keys) + " | "
                           + " / ".join(_g(rf.get(k)) for k in keys) + " |")
            out.append("")
        acc = {t: {p: {x["length"]: x["accuracy"] for x in rows} for p, rows in tr["accuracy"].items()}
               for t, tr in r["tasks"].items()}
        L0, L1 = r["train_length"], max(max(v) for v in acc["periodic"].values())
        per, mir = acc["periodic"], acc.get("mirror", {})
        best = max(per, key=lambda p: per[p][L1])
        line = (f"*Reading:* on the local periodic rule {best} extrapolates best ({per[best][L0]:.2f} at length {L0} → "
                f"{per[best][L1]:.2f} at {L1}; " + ", ".join(f"{p} {per[p][L1]:.2f}" for p in per if p != best)
                + f" at {L1}).")
        if mir:
            absolute = [p for p in ("sine", "learned") if p in mir]
            line += (" On the mirror task the absolute encodings solve the trained length ("
                     + ", ".join(f"{p} {mir[p][L0]:.2f}" for p in absolute) + f" at {L0}) and fall to "
                     + ", ".join(f"{p} {max(v for k, v in mir[p].items() if k != L0):.2f}" for p in absolute)
                     + " at best elsewhere; ")
            rel = [p for p in ("rope", "none") if p in mir]
            solved = [p for p in rel if mir[p][L0] >= 0.9]
            line += (("RoPE and no positions do not solve it (" if not solved else "but " + ", ".join(solved)
                      + " also reach ≥ 0.9 (") + ", ".join(f"{p} {mir[p][L0]:.2f}" for p in rel) + f" at {L0})"
                     + (": a relative encoding alone cannot count absolute positions." if not solved else "."))
        out.append(line)
        if r.get("reading"):
            out += ["", f"*Measured summary (written by the script):* {r['reading']}"]
    if "tokenization" in results:
        r = head("tokenization", "Supplementary — tokenization of ESOL SMILES")
        out += ["| scheme | merges | vocab | mean tokens | P95 | max | Σ T² vs char | decodable | reference (vocab, mean, ΣT²) |",
                "|---|---|---|---|---|---|---|---|---|"]
        for x in r["schemes"]:
            key = x["scheme"].replace(" + end-of-word", "+eow").replace("+end-of-word", "+eow")
            rf = R["tokenization"].get(key)
            merges = f"{x['merges_done']}" + (" (stopped)" if x.get("stopped_early") else "")
            out.append(f"| {x['scheme']} | {merges} | {x['vocab']} | {x['mean_tokens']:.2f} | {x['p95']} | {x['max']} | "
                       f"{x['sum_T2_rel_char']:.3f} | {100 * x['decodable_fraction']:.0f}% | "
                       + (f"{rf[0]}, {rf[1]:.2f}, {rf[2]:.3f}" if rf else "–") + " |")
        st, gl = r["training_stop"], r["gain_ledger"]
        top = ", ".join(f"{t['merged']} {t['gain']}" for t in r["top_subwords"][:8])
        out += ["", f"BPE training stopped by itself after {st['n_merges_done']} merges (reference "
                f"{R['tokenization']['stopped_at']}); gain ledger {gl['n_initial_tokens']} − {gl['n_final_tokens']} = "
                f"{gl['difference']} = sum of gains ({gl['model']}). Top subwords by gain: {top}.",
                ""]
        by = {x["scheme"]: x for x in r["schemes"]}
        if "char" in by and "BPE@512" in by:
            c, b = by["char"], by["BPE@512"]
            cut = b.get("molecules_with_cut_atoms")
            out.append(f"*Reading:* 512 merges shorten the average molecule {c['mean_tokens'] / b['mean_tokens']:.1f}× "
                       f"({c['mean_tokens']:.1f} → {b['mean_tokens']:.1f} tokens) and the quadratic attention cost "
                       f"Σ T² {1 / b['sum_T2_rel_char']:.0f}×; but character BPE does not know chemistry: its tokens "
                       f"can end inside an atom (e.g. `l)` from `Cl)`" + (f"; {cut} molecules at BPE@512" if cut else "")
                       + "). The reference's vocabulary column counts the distinct tokens in use; ours is the full "
                       "vocabulary (initial symbols + merges), also recorded as `distinct_tokens_used_all`.")
    if "dropout" in results:
        r = head("dropout", "Supplementary — dropout statistics on a causal attention matrix")
        out += ["| p | noise scale √(p/(1−p)) | max bias (in Monte Carlo SE) | row-sum std rel. error | "
                "context variance rel. error | P(row zeroed): measured / closed form | masked positions |",
                "|---|---|---|---|---|---|---|"]
        for x in r["dropout"]:
            out.append(f"| {x['p']} | {x['noise_scale_closed_form']:.3f} | {x['max_abs_bias']:.1e} "
                       f"({x['max_bias_in_se']:.1f}) | {x['row_sum_std_max_rel_err']:.3f} | "
                       f"{x['context_var_max_rel_err']:.3f} | {x['row_zero_frac_mean']:.4f} / "
                       f"{x['row_zero_prob_closed_form_mean']:.4f} | {x['masked_mean_abs']} |")
        out += ["", "Reference (tutorial, same setting): noise scale 0.229 / 0.333 / 1.000; at p = 0.5 the row-sum "
                "std 0.7386 vs 0.7198 closed form and a zeroed row 19.3% vs 19.4%.",
                ""]
        ok = all(r.get("checks", {}).values())
        worst = max(x["max_bias_in_se"] for x in r["dropout"])
        out.append(f"*Reading:* {'every' if ok else 'NOT every'} statistic is within 5 Monte Carlo standard errors of "
                   f"its closed form (largest bias {worst:.1f} SE): inverted dropout leaves the expected attention "
                   "weights unchanged and only adds noise of scale √(p/(1−p)); masked (future) positions stay exactly "
                   "zero. A whole attention row is dropped " + ", ".join(
                       f"{100 * x['row_zero_frac_mean']:.1f}%" for x in r["dropout"]) + " of the time at p = "
                   + " / ".join(f"{x['p']:g}" for x in r["dropout"]) + ".")
    for name in SECTION_ORDER + sorted(set(README_SECTIONS) - set(SECTION_ORDER)):
        if name in README_SECTIONS and name in results:
            try:
                out += [""] + README_SECTIONS[name](results[name])
            except Exception as e:  # a broken results file must not stop the other sections
                print(f"warning: README section {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
    return "\n".join(out)


def _replace_block(text, tag, body):
    start = text.index(f"<!-- BEGIN GENERATED: {tag}")
    start = text.index("-->", start) + 3
    end = text.index(f"<!-- END GENERATED: {tag}", start)
    return text[:start] + "\n" + body.rstrip() + "\n" + text[end:]


def readme_text(folder, text):
    text = _replace_block(text, "speed", readme_speed(folder))
    results_md = readme_results(load_results(folder))
    text = _replace_block(text, "results", results_md)
    if "<!-- BEGIN GENERATED: overview" in text:
        text = _replace_block(text, "overview", readme_overview(folder, results_md))
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=FIG_DIR, help="folder with results_*.json; figures are written there")
    p.add_argument("--readme", action="store_true", help="regenerate README.md's Speed and Results tables")
    p.add_argument("--check-readme", action="store_true", help="exit 1 if README.md's tables are out of date")
    p.add_argument("--no-plots", action="store_true", help="only the README tables")
    args = p.parse_args(argv)
    folder = os.path.abspath(args.dir)
    if not os.path.isdir(folder):
        print(f"error: no such folder {folder}", file=sys.stderr)
        return 2
    status = 0
    if args.check_readme:
        with open(README, encoding="utf-8") as f:
            text = f.read()
        if readme_text(folder, text) != text:
            print("README.md's generated tables differ from figures/*.json: run python make_figures.py --readme")
            return 1
        print("README.md's generated tables match the results files")
        return 0
    if not args.no_plots:
        written, failures = render_all(folder)
        print(f"make_figures: wrote {len(written)} files to {os.path.relpath(folder, ROOT)}"
              + (f"; {failures} figure(s) failed (see warnings)" if failures else ""))
    if args.readme:
        with open(README, encoding="utf-8") as f:
            text = f.read()
        new = readme_text(folder, text)
        if new != text:
            sys.path.insert(0, ROOT)
            from transformer import atomic_write
            atomic_write(README, new)
            print("make_figures: README.md tables regenerated")
        else:
            print("make_figures: README.md tables already up to date")
    return status


if __name__ == "__main__":
    sys.exit(main())
