"""Experiment 2's report (demos/demo_positional.py, figures/results_positional.json): attention is blind to
token order without positions; the sine, learned and RoPE identities; the position-code ladder.  Its
figures, its page (docs/02-positional.md) and its overview row; the interface is report_kit's."""
import report_kit as kit

# The tutorial's numbers: identity errors, the shuffle test (scheme -> (mean abs change, relative change)),
# the ladder at d = 64, t = 0..255.
POSITIONAL_REF = {"addition": 5.3e-15, "inner_spread": 1.0e-15, "inner_dev": 3.9e-14, "rope": 6.1e-14,
                  "shuffle": {"none": (0.0, 2.9e-16), "sine": (0.0393, 0.18), "learned": (0.0784, 0.13),
                              "rope": (0.1474, 0.27)},
                  "sine_adjacent": 1.4718, "binary_distinct": 8, "binary_cv": 0.31, "sine_over_learned": 35,
                  "integer_norm_255": 2040, "sine_norm": 5.657, "learned_norm": 0.16,
                  "bit_flips": [1.000, 0.498, 0.247, 0.122, 0.059, 0.027, 0.012, 0.004]}
ROUNDING_LEVEL = 1e-12      # an identity or a shuffle change below this is floating-point rounding


def fig_positional_ladder(meta, r, out_dir):
    plt = kit.plt()
    lad = r["ladder"]
    RP = POSITIONAL_REF
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.6))
    curve = lad["norm_curve"]
    t = [x["t"] for x in curve]
    for key, lab in (("integer", "integer t (every dim)"), ("binary", "binary (8 bits)"),
                     ("sine", "sine/cosine"), ("learned", "learned, fresh (std 0.02)")):
        a.semilogy(t[1:], [x[key] for x in curve][1:], label=lab)
    a.axhline(lad["unit_variance_embedding_norm"], ls=":", color="gray", label="unit-variance embedding")
    kit.ref_mark(a, [255, 128, 128], [RP["integer_norm_255"], RP["sine_norm"], RP["learned_norm"]])
    a.set(xlabel="position t", ylabel="‖PE_t‖", title=f"Norm of the position code, d = {lad['d']}")
    kit.legend_below(a)
    adj = lad["adjacent_curve"]
    ta = [x["t"] for x in adj]
    b.semilogy(ta, [x["binary"] for x in adj], ".", ms=2.5, color="C1", label="binary: ‖PE_t+1 − PE_t‖")
    for k in range(1, lad["bits"] + 1):
        b.axhline(k ** 0.5, color="C1", lw=0.4, alpha=0.5)
    b.semilogy(ta, [x["sine"] for x in adj], "-", color="C2", label="sine/cosine")
    b.semilogy(ta, [x["integer"] for x in adj], "-", color="C0", label="integer (√d)")
    b.semilogy(ta, [x["learned"] for x in adj], "-", color="C3", lw=0.6, label="learned, fresh")
    kit.ref_mark(b, [255], [RP["sine_adjacent"]], label=f"tutorial: sine {RP['sine_adjacent']}")
    b.set(xlabel="position t", ylabel="adjacent distance", title="Adjacent distance (binary lines: √1 … √8)")
    kit.legend_below(b)
    flips = lad["binary_bit_flips"]
    c.bar([x["bit"] for x in flips], [x["flip_frequency"] for x in flips], label="measured")
    kit.ref_mark(c, range(len(RP["bit_flips"])), RP["bit_flips"])
    c.set(xlabel="bit (0 = least significant)", ylabel="flip frequency t → t+1", title="Binary code: bit flips",
          yscale="log")
    kit.legend_below(c)
    fig.suptitle("Position codes, t = 0..255 — " + kit.subtitle(meta), fontsize=9)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "positional_ladder")


def fig_positional_inner(meta, r, out_dir):
    plt = kit.plt()
    c = r["inner_product_curve"]
    k = [x["k"] for x in c]
    fig, a = plt.subplots(figsize=(4.8, 3.4))
    a.plot(k, [x["pe0_dot_pek"] for x in c], label="⟨PE_t, PE_t+k⟩ (t = 0)")
    a.plot(k, [x["closed_form"] for x in c], ":", color="k", label="Σ cos(w_i k)")
    a.set(xlabel="shift k", ylabel="inner product",
          title=f"Sine positions: a function of k only (spread over t ≤ {max(x['spread_over_t'] for x in c):.0e})")
    a.legend()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "positional_inner_product")


def fig_positional_permutation(meta, r, out_dir):
    plt = kit.plt()
    groups = [("random ids, d = 16", r["permutation"])]
    if r.get("permutation_esol"):
        groups.append(("ESOL test SMILES, d = 48", r["permutation_esol"]))
    fig, a = plt.subplots(figsize=(5.6, 3.4))
    width = 0.8 / len(groups)
    for g, (label, rows) in enumerate(groups):
        xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(rows))]
        a.bar(xs, [max(x["rel_change"], 1e-18) for x in rows], width, label=label, color=f"C{g}", alpha=0.85)
    schemes = [x["pos"] for x in groups[0][1]]
    kit.ref_mark(a, range(len(schemes)), [POSITIONAL_REF["shuffle"].get(p, (None, None))[1] for p in schemes])
    a.set_xticks(range(len(schemes)), schemes)
    a.set_yscale("log")
    a.set(xlabel="position scheme", ylabel="mean |Δy| / mean |y|",
          title="Shuffling the tokens (untrained mean-pooled encoder)")
    kit.legend_below(a)
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "positional_permutation")


MOVES = ROUNDING_LEVEL * 1e6     # a shuffle change above this is a real change of the output

QUESTION = ("Self-attention treats its input as a set: without positions, does shuffling the tokens leave the "
            "output unchanged, and do the sine-cosine and RoPE identities hold? The tutorial's answer: without "
            "positions the output is unchanged up to rounding, and sine, learned and RoPE positions move it; the sine "
            "table's addition theorem and shift-invariant inner product and RoPE's relative-position property hold "
            "to rounding; the sine code keeps a constant norm and a constant adjacent distance, unlike integer or "
            "binary codes.")
FIGURES = [fig_positional_ladder, fig_positional_inner, fig_positional_permutation]
DIFFERENCES = [
    "Shuffle test on ESOL test SMILES with an untrained d = 48 encoder (the tutorial's inputs and model for this "
    "test are not stated); the random-id test is kept as a second column.",
    "RoPE: the tutorial's figure is compared with our absolute error; our relative error (to ‖q‖‖k‖) is reported "
    "separately."]


def _identity_lines(r):
    idt, RP = r["identities"], POSITIONAL_REF
    rows = [["addition theorem PE_t+k = R_k PE_t", kit.fmt_e(idt["addition_max_err"]), f"{RP['addition']:.1e}"],
            ["⟨PE_t, PE_t+k⟩ spread over t", kit.fmt_e(idt["inner_spread_max"]), f"{RP['inner_spread']:.1e}"],
            ["⟨PE_t, PE_t+k⟩ vs Σ cos(w_i k)", kit.fmt_e(idt["inner_max_dev"]), f"{RP['inner_dev']:.1e}"],
            ["RoPE score under a common shift, absolute", kit.fmt_e(idt["rope_max_abs_change"]), f"{RP['rope']:.1e}"],
            ["same, relative to ‖q‖‖k‖ (ours only)", kit.fmt_e(idt["rope_max_rel_change"]), "–"]]
    return ["**Identities** of the position codes, largest error:", ""] + kit.table(
        ["identity", "max error", "reference"], rows)


def _scale_ratio(esol):
    """(tutorial relative change / ours: min, max; output scale max / min; mean |y| min, max) of the ESOL rows."""
    RP = POSITIONAL_REF["shuffle"]
    moved = [x for x in esol if x["pos"] != "none"]
    ys = [x["mean_abs_output"] for x in esol]
    ratio = [RP[x["pos"]][1] / x["rel_change"] for x in moved if x["pos"] in RP and x["rel_change"] > 0]
    return min(ratio), max(ratio), max(ys) / min(ys), min(ys), max(ys)


def _shuffle_lines(r):
    RP = POSITIONAL_REF["shuffle"]
    esol, info = r.get("permutation_esol") or [], r.get("permutation_esol_data") or {}
    rnd = {x["pos"]: x for x in r["permutation"]}
    rows = [[x["pos"], f"{x['mean_abs_change']:.4f}", f"{x['rel_change']:.2g}", f"{rnd[x['pos']]['rel_change']:.2g}",
             f"{RP[x['pos']][0]:.4f} ({RP[x['pos']][1]:.2g})" if x["pos"] in RP else "–"]
            for x in esol or r["permutation"]]
    out = ["", f"**Shuffle test** on the {info.get('n_used', '?')} ESOL scaffold-split test molecules (atom tokens, "
           f"vocabulary of {info.get('vocab_size_with_specials', '?')} built on the training SMILES, "
           f"{info.get('unknown_tokens', '?')} unknown tokens) with an **untrained** mean-pooled encoder of the "
           "tutorial's ESOL dimensions (d = 48, 4 heads, 2 layers); the random-id column is our earlier test "
           "(V = 20, length 12, d = 16, untrained).", ""]
    out += kit.table(["scheme", "ESOL: mean abs change", "ESOL: relative", "random ids: relative",
                      "reference (abs, relative)"], rows)
    if esol:
        lo, hi, scale, y0, y1 = _scale_ratio(esol)
        out += ["", f"Why the tutorial's relative changes are {lo:.1f}–{hi:.1f}× ours: 'relative' divides by mean |y|, "
                "and the output of an untrained single-output encoder is a random projection whose size varies "
                f"{scale:.1f}× between the four schemes of one seed here (mean |y| {y0:.2f}–{y1:.2f}); the tutorial "
                "does not state its model, width, output scale or inputs for this test, so the ratio is not "
                "comparable across implementations."]
    return out


def _ladder_lines(r):
    enc = {e["name"]: e for e in r["ladder"]["encodings"]}
    sine, binary, RP = enc.get("sine", {}), enc.get("binary", {}), POSITIONAL_REF
    rows = [["sine adjacent distance (CV)", f"{kit.fmt(sine.get('adjacent_dist_mean'), '.4f')} "
             f"({kit.fmt_e(sine.get('adjacent_dist_cv'))})", RP["sine_adjacent"]],
            ["binary adjacent distances: distinct values √1…√8, CV",
             f"{binary.get('adjacent_dist_n_distinct', '?')}, {kit.fmt(binary.get('adjacent_dist_cv'), '.2f')}",
             f"{RP['binary_distinct']}, {RP['binary_cv']}"],
            ["sine norm / fresh learned-table norm", f"{r['ladder']['sine_norm_over_learned_norm']:.0f}×",
             f"~{RP['sine_over_learned']}×"]]
    return (["", "**Ladder** of position codes (d = 64, t = 0..255):", ""]
            + kit.table(["quantity", "ours", "tutorial"], rows))


def reading(r):
    """Experiment 2's reading: order-blindness without positions, the schemes that move the output, the
    identities at rounding level, the tutorial's relative changes, the sine ladder."""
    idt = r["identities"]
    worst = max(idt["addition_max_err"], idt["inner_spread_max"], idt["inner_max_dev"], idt["rope_max_rel_change"])
    esol = {x["pos"]: x for x in r.get("permutation_esol") or []}
    out = []
    if esol and esol["none"]["max_abs_change"] < ROUNDING_LEVEL:
        out.append(f"Without positions, an untrained mean-pooled encoder gives the same output for each of "
                   f"{r['permutation_esol_data']['n_used']} ESOL test molecules and its shuffled atom tokens (largest "
                   f"change {esol['none']['max_abs_change']:.0e}): order-blind, at rounding level (below "
                   f"{ROUNDING_LEVEL:.0e}).")
    else:
        out.append("The position-free model is NOT order-blind in this run (or the ESOL test did not run).")
    see = [f"{p} {x['mean_abs_change']:.4f}" for p, x in esol.items() if p != "none" and x["mean_abs_change"] > MOVES]
    if see:
        out.append(f"With positions the shuffle moves the output (mean absolute change {', '.join(see)}; above "
                   f"{MOVES:.0e}): every scheme sees the order.")
    out.append(f"The sine and RoPE identities hold to {worst:.0e}: " + (
        f"rounding (below {ROUNDING_LEVEL:.0e})." if worst < ROUNDING_LEVEL else "ABOVE rounding."))
    if esol:
        lo, hi, scale, _, _ = _scale_ratio(list(esol.values()))
        out.append(f"The tutorial's relative changes are {lo:.1f}–{hi:.1f}× ours: not comparable, since an untrained "
                   f"encoder's output scale varies {scale:.1f}× between schemes here (the note under the shuffle "
                   "table).")
    sine = next((e for e in r["ladder"]["encodings"] if e["name"] == "sine"), None)
    if sine:
        out.append(f"The sine code's adjacent distance is {sine['adjacent_dist_mean']:.4f} at every t (CV "
                   f"{sine['adjacent_dist_cv']:.1e}; tutorial {POSITIONAL_REF['sine_adjacent']}): "
                   + ("constant, as the tutorial says." if sine["adjacent_dist_cv"] < ROUNDING_LEVEL else
                      "NOT constant."))
    return out


def _extras(r):
    moved = [x for x in r.get("permutation_esol") or [] if x["pos"] != "none"]
    spread = [f"{x['pos']} {x['change_over_input_spread']:.2f}" for x in moved
              if x.get("change_over_input_spread") is not None]
    return ([f"- Against the spread of y across molecules the shuffle moves y by {', '.join(spread)} standard "
             "deviations."] if spread else [])


def page(payload):
    """Experiment 2's page parts (report_kit.Page)."""
    r = payload["results"]
    return kit.Page(_identity_lines(r) + _shuffle_lines(r) + _ladder_lines(r), reading(r), DIFFERENCES, _extras(r),
                    ["positional_ladder", "positional_inner_product", "positional_permutation"])


def headline(r):
    """The overview row: the relative output change under a shuffle without positions and with RoPE, on ESOL
    test SMILES with an untrained d = 48 encoder when the results have it, else on random ids; the row says
    which, and that the tutorial's value (its model and output scale unstated) is not like for like."""
    esol = r.get("permutation_esol")
    ch = {x["pos"]: x["rel_change"] for x in (esol or r["permutation"])}
    where = ("ESOL test SMILES, untrained d = 48 encoder" if esol else "random token ids")
    ref = POSITIONAL_REF["shuffle"]
    return (f"relative output change when the input is shuffled ({where}): {ch['none']:.0e} (no positions), "
            f"{ch['rope']:.3f} (RoPE); the tutorial's not like for like: its model, output scale unstated",
            f"{ref['none'][1]:.0e}, {ref['rope'][1]:.2f}")
