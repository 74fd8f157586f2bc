"""Experiment 7's report (demos/demo_deepchem_materials.py, figures/results_materials.json): formation energy
from the composition string alone (Materials Project), a Transformer against ridge on element fractions and
the mean, on the tutorial's slice and (extended) on the whole file.  Its figures, page (docs/07-materials.md)
and overview row; the interface is report_kit's."""
import report_kit as kit
import report_property as prop

MATERIALS_REF = {
    "tutorial|mean": dict(test_rmse=0.536, test_r2=0.0),
    "tutorial|ridge + element fractions": dict(train_r2=0.150, test_rmse=0.493, test_mae=0.337, test_r2=0.154),
    "tutorial|Transformer": dict(train_r2=-0.039, test_rmse=0.553, test_mae=0.304, test_r2=-0.063),
    "params": 43153, "order_change": 0.0270, "structure_aware_mae": 0.116,
    "sizes": (8000, 1000, 2000)}
MATBENCH_CONTEXT = {"crabnet_mae": 0.086, "dummy_mae": 1.006}   # Matbench's leaderboard, not the tutorial
REPRODUCE_TOL = 0.02    # mean and ridge "reproduce" the tutorial's table when every cell is within this
PRIORS_ROW = "Transformer + periodic-table priors"
AUGMENT_ROW = "Transformer + order augmentation"
RECIPE_ROW = "Transformer, tutorial recipe (1 sample per Adam step)"
MATERIALS_SPLITS = {"tutorial": "our reconstruction of the tutorial's slice, the file's first 16,000 rows (its highest "
                                "formation energies; chosen because their mean baseline reproduces the tutorial's)",
                    "random": "a random 11,000-row subset of the whole file",
                    "group": "that subset split by composition, no formula in two splits"}
TUTORIAL_D = 48         # the tutorial's model width: its parameter count is compared only at this width
def fig_materials_parity(meta, r, out_dir):
    return prop.grid_parity_figure(meta, r, out_dir, "materials", "Formation energy", "eV/atom")


def fig_materials_bars(meta, r, out_dir):
    return prop.bars_figure(meta, r, out_dir, "materials", "Formation energy", MATERIALS_REF, "eV/atom")


def fig_materials_curves(meta, r, out_dir):
    return prop.curves_figure(meta, r, out_dir, "materials", "Formation energy", "eV/atom")


def fig_materials_order(meta, r, out_dir):
    """Mean |Δ prediction| when test formulas are rewritten in other element orders."""
    plt = kit.plt()
    groups = _materials_order_groups(r)
    labels = [f"{split}: {model} ({kit.seeds_word(len(v)) if model.startswith('Transformer') else '0 by construction'})"
              for (split, model), v in groups.items()]
    means = [sum(v) / len(v) for v in groups.values()]
    stds = [(sum((a - m) ** 2 for a in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0 for v, m in
            zip(groups.values(), means)]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=3, color="C0")
    ax.axhline(MATERIALS_REF["order_change"], color="k", ls=":", label="tutorial's Transformer")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=7)
    ax.set(ylabel="mean |Δ prediction| (eV/atom)", title="Order sensitivity: same composition, other element order")
    ax.legend(fontsize=7)
    fig.suptitle(kit.subtitle(meta), fontsize=8)
    fig.tight_layout()
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "materials_order")


MIN_CELL_FORMULAS = 20     # an attention cell averaged over fewer test formulas than this is left blank (too thin)


def fig_materials_attention(meta, r, out_dir):
    """Last-layer attention between element tokens, 20 most frequent elements; a cell averaged over fewer than
    MIN_CELL_FORMULAS formulas (``attention.counts``) is left blank and counted in the title."""
    plt = kit.plt()
    att = r["attention"]
    el, M, counts = att["elements"], att["matrix"], att["counts"]
    data = [[float("nan") if v is None or n < MIN_CELL_FORMULAS else v for v, n in zip(row, nrow)]
            for row, nrow in zip(M, counts)]
    thin = sum(1 for row, nrow in zip(M, counts) for v, n in zip(row, nrow) if v is not None and n < MIN_CELL_FORMULAS)
    fig, ax = plt.subplots(figsize=(5.6, 4.8))
    im = ax.imshow(data, cmap="viridis")
    ax.set_xticks(range(len(el)))
    ax.set_xticklabels(el, fontsize=6.5)
    ax.set_yticks(range(len(el)))
    ax.set_yticklabels(el, fontsize=6.5)
    ax.set(xlabel="key element", ylabel="query element")
    ax.set_title(f"Last-layer attention (mean over heads, {att['n_formulas']} test formulas)\nblank: no formula or "
                 f"fewer than {MIN_CELL_FORMULAS} formulas with both elements ({thin} thin cells hidden)", fontsize=8)
    ax.grid(False)
    fig.colorbar(im, ax=ax, shrink=0.8, label="mean attention weight")
    fig.suptitle(kit.subtitle(meta), fontsize=8)
    kit.commit_stamp(fig, meta)
    return kit.save(fig, out_dir, "materials_attention")


def _materials_order_groups(r):
    """{(split, model): [mean absolute prediction change (eV/atom) of each seed]}, in run order."""
    out = {}
    for x in r["order_sensitivity"]:
        out.setdefault((x["split"], x["model"]), []).append(x["mean_abs_change"])
    return out


def _materials_order_means(r):
    """{(split, model): mean over seeds of the order sensitivity} for the Transformer rows."""
    return {k: sum(v) / len(v) for k, v in _materials_order_groups(r).items() if k[1].startswith("Transformer")}


def _materials_split_reading(r, split):
    """One split: the Transformer against ridge (RMSE and MAE) and the mean, from results.comparisons."""
    t, rd = prop.summary_row(r, split, "Transformer"), prop.summary_row(r, split, "ridge + element fractions")
    mean = prop.summary_row(r, split, "mean")
    c_rmse, c_mae, c_mean = (kit.find_comparison(r, split, "Transformer", b, m) for b, m in
                             (("ridge + element fractions", "rmse"), ("ridge + element fractions", "mae"),
                              ("mean", "rmse")))
    (w1, ci1), (w2, ci2), (w3, ci3) = (kit.cmp_text(c, r) for c in (c_rmse, c_mae, c_mean))
    outcome = {"higher": "ridge wins on RMSE", "lower": "the Transformer wins on RMSE",
               "level": "no winner on RMSE by the paired test"}[c_rmse["verdict"]]
    key = c_rmse["verdict"]
    if kit.one_seed(c_rmse) and key != "level":
        who = outcome.split(" wins")[0]
        outcome, key = f"{who} ahead on RMSE by the paired interval alone ({kit.ONE_SEED_NOTE})", key + " (one seed)"
    return (f"on {MATERIALS_SPLITS.get(split, split)} ({kit.seeds_word(t['n_seeds'])} of the Transformer, "
            f"{c_rmse['n_items']:,} test rows), the Transformer's test RMSE "
            f"{t['test_rmse']:.3f} eV/atom (R² {t['test_r2']:.3f}) is {w1} ridge's {rd['test_rmse']:.3f} (R² "
            f"{rd['test_r2']:.3f}) {ci1}, its MAE {t['test_mae']:.3f} is {w2} ridge's {rd['test_mae']:.3f} {ci2}, and "
            f"its RMSE is {w3} the mean's {mean['test_rmse']:.3f} {ci3}: {outcome}"), key


def _short(model):
    """A Transformer row's name without its 'Transformer' prefix ('plain' for the comparison row)."""
    return model.removeprefix("Transformer").lstrip(" +,") or "plain"


def _materials_extras_reading(r):
    """Order sensitivity, order augmentation and periodic-table priors, from results.comparisons."""
    parts, sens = [], _materials_order_means(r)
    first = r["summary"][0]["split"]
    others = [f"{_short(model)} ({split} split) {v:.4f}"
              for (split, model), v in sens.items() if (split, model) != (first, "Transformer")]
    parts.append(f"rewriting a formula in another element order moves the Transformer's prediction by "
                 f"{sens[(first, 'Transformer')]:.4f} eV/atom on average on the {first} split (tutorial "
                 f"{MATERIALS_REF['order_change']}); ridge on fractions cannot move"
                 + (f"; other rows: {', '.join(others)}" if others else ""))
    for split in dict.fromkeys(x["split"] for x in r["summary"]):
        for row, b in ((AUGMENT_ROW, "Transformer"), (PRIORS_ROW, "Transformer"),
                       (PRIORS_ROW, "ridge + element fractions")):
            c = kit.find_comparison(r, split, row, b)
            if c:
                w, ci = kit.cmp_text(c, r)
                parts.append(f"{row[len('Transformer + '):]} ({split} split, {kit.seeds_word(c['n_seeds_a'])}): "
                             f"test RMSE {prop.summary_row(r, split, row)['test_rmse']:.3f}, {w} "
                             f"{'the plain Transformer' if b == 'Transformer' else 'ridge'} {ci}")
    return parts


def _materials_unseen_clause(r):
    """The tutorial split's Transformer against ridge on the test rows whose reduced formula never occurs in
    training (results.unseen_formulas): does the win survive without compositions seen in training?"""
    u = (r.get("unseen_formulas") or {}).get("tutorial")
    c = u and next((x for x in u["comparisons"] if (x["a"], x["b"]) == ("Transformer", "ridge + element fractions")),
                   None)
    if not c:
        return ""
    w, ci = kit.cmp_text(c, r)
    rm = u["test_rmse"]
    return (f"; on the {u['n_test']:,} of its {u['n_test_all']:,} test rows whose reduced formula never occurs in "
            f"training, the Transformer's RMSE {rm['Transformer']:.3f} is {w} ridge's "
            f"{rm['ridge + element fractions']:.3f} {ci}"
            + (", so the win is not leakage of seen compositions" if c["verdict"] == "lower" else ""))


def _materials_recipe_sentence(r):
    """The tutorial's recipe taken literally (one Adam step per formula): does the tutorial's failure to fit
    (its training R² -0.039, test no better than the mean) reproduce?  It does when this row's test RMSE is not
    lower than the mean's by the paired test (RECIPE_ROW against the mean, results.comparisons)."""
    row, c_mean = prop.summary_row(r, "tutorial", RECIPE_ROW), kit.find_comparison(r, "tutorial", RECIPE_ROW, "mean")
    c_plain = kit.find_comparison(r, "tutorial", RECIPE_ROW, "Transformer")
    if not (row and c_mean and c_plain):
        return ("The tutorial's Transformer had a training R² of "
                f"{MATERIALS_REF['tutorial|Transformer']['train_r2']}: it did not fit its training data; the row that "
                "tests its recipe as stated (`--add-recipe`) is not in these results.")
    run = next(x for x in r["runs"] if x["model"] == RECIPE_ROW)
    steps = r["splits"]["tutorial"]["sizes"][0] // run.get("accumulation", 1) * r["transformer"]["config"]["epochs"]
    (w1, ci1), (w2, ci2) = kit.cmp_text(c_mean, r), kit.cmp_text(c_plain, r)
    plain = prop.summary_row(r, "tutorial", "Transformer")
    fails = c_mean["verdict"] != "lower"
    ours = kit.find_comparison(r, "tutorial", "Transformer", "mean")
    ours_fits = bool(ours) and ours["verdict"] == "lower"
    return (f"The tutorial's failure to fit, tested: its Transformer's training R² was "
            f"{MATERIALS_REF['tutorial|Transformer']['train_r2']} (it did not fit its training data; ours, 32 formulas "
            f"per step, {plain['train_r2']:.3f}). Its recipe taken literally, one Adam step per formula "
            f"({steps:,} steps, {kit.seeds_word(row['n_seeds'])}), reaches training R² "
            f"{row['train_r2']:.3f} and test RMSE {row['test_rmse']:.3f}, {w1} the mean's {ci1} and {w2} our "
            f"32-per-step row {ci2}: the tutorial's failure to fit "
            + (f"does not reproduce under the recipe as run here ({_recipe_as_run(r, run, row)}); §6.5's batch "
               "of 1 with gradient accumulation, the rest of its learning-rate range and other seeds were not run, so "
               "this does not show that the tutorial's optimiser settings cannot explain its failure"
               if not fails else "reproduces under its own recipe while our 32-per-step row beats the mean: "
               "an optimisation failure, not a limit of composition" if ours_fits else "reproduces, but our "
               "32-per-step row does not beat the mean either: recipe and data are not separated here")
            + " (rule: it reproduces when this row is not lower than the mean by the paired test).")


def _lr(x):
    """A learning rate as the tutorial writes it: 2e-3."""
    return f"{x:.0e}".replace("e-0", "e-")


def _recipe_as_run(r, run, row):
    """What the recipe row ran, against §6.5 and the tutorial's model: seeds, peak learning rate, accumulation,
    vocabulary (the tutorial's from its parameter count)."""
    t = r["transformer"]
    d, v = t["config"]["d_model"], run.get("vocab_size") or t.get("vocab_size")
    implied = (MATERIALS_REF["params"] - (t["n_params"] - v * d)) / d if v else 0.5
    vocab = f"a {v}-token vocabulary against the tutorial's {implied:.0f}" if implied == int(implied) else f"{v} tokens"
    return (f"{kit.seeds_word(row['n_seeds'])}, peak learning rate {_lr(t['config']['lr'])} (§6.5: 2e-3 to 4e-3), one "
            f"Adam step per formula without accumulation, {vocab}")


def reading(r):
    """Experiment 7's reading: which conclusion holds on which data (from results.comparisons), whether the
    tutorial's conclusion is reproduced and why not, then the order sensitivity and the variants."""
    parts, by = [], {}
    for split in dict.fromkeys(x["split"] for x in r["summary"]):
        if kit.find_comparison(r, split, "Transformer", "ridge + element fractions"):
            text, verdict = _materials_split_reading(r, split)
            parts.append(kit.sentence(text))
            by.setdefault(verdict, []).append(split)
    names = {"higher": "ridge ahead of the Transformer (the tutorial's negative result)",
             "lower": "the Transformer ahead of ridge", "level": "no difference detected",
             "lower (one seed)": "the Transformer below ridge by the paired interval alone (one seed)",
             "higher (one seed)": "ridge below the Transformer by the paired interval alone (one seed)"}
    summary = "; ".join(f"{names[v]} on the {', '.join(s)} split{'s' if len(s) > 1 else ''}" for v, s in by.items())
    own = kit.find_comparison(r, "tutorial", "Transformer", "ridge + element fractions")
    verdict = "" if not own else (" The tutorial drew its conclusion (composition alone cannot beat ridge) from "
                                  "RMSE and R² (its Transformer's MAE was already below ridge's, "
                                  f"{MATERIALS_REF['tutorial|Transformer']['test_mae']} against "
                                  f"{MATERIALS_REF['tutorial|ridge + element fractions']['test_mae']}); on RMSE it is "
                                  + ("reproduced" if own["verdict"] == "higher" else "not reproduced")
                                  + f" on our reconstruction of its slice{_materials_unseen_clause(r)}.")
    extras = _materials_extras_reading(r)
    return parts + [f"So, on test RMSE: {summary}.{verdict}", _materials_recipe_sentence(r),
                    kit.sentence(extras[0]) + " "
                    + (f"Variants: {'; '.join(extras[1:])}. " if extras[1:] else "") + "A verdict other than 'level "
                    "with' needs both a gap beyond the seed spread and a paired-bootstrap interval that excludes 0."
                    + prop.single_run_note(r)]


def _materials_reproduction(r):
    """How closely our mean and ridge rows on the tutorial's slice reproduce the tutorial's table."""
    near, far = [], []
    for model in ("mean", "ridge + element fractions"):
        row = prop.summary_row(r, "tutorial", model)
        for key, ref in MATERIALS_REF[f"tutorial|{model}"].items():
            ours = row.get(key)
            if ours is not None:
                cell = (f"{model} "
                        f"{key.replace('_', ' ').replace('r2', 'R²').replace('rmse', 'RMSE').replace('mae', 'MAE')} "
                        f"{ours:.3f} (tutorial {ref:.3f})")
                (near if abs(ours - ref) <= REPRODUCE_TOL else far).append(cell)
    s = f"Reproduction on the tutorial's slice (tolerance {REPRODUCE_TOL}): within it, " + (", ".join(near) or "none")
    return s + (f"; outside it, {', '.join(far)}." if far else ".")


def _materials_slice_lines(r):
    """The slice described chemically against the whole file (from data.profiles)."""
    p = r["data"]["profiles"]
    w, s = p["whole_file"], p.get("tutorial_slice")
    if not s:
        return []
    share = s["n"] / w["n"]
    return [f"The tutorial's slice is the {s['n']:,} rows at the top of the file as shipped (sorted by formation "
            f"energy, highest first), i.e. the {100 * share:.0f} % of Materials Project entries at the high end of the "
            f"range: from {s['min']:.3f} to "
            f"{s['max']:.3f} eV/atom (median {s['median']:.3f}), {100 * s['share_positive']:.0f} % of them above 0 "
            f"(unstable with respect to the elements). The whole file runs from {w['min']:.3f} to {w['max']:.3f} "
            f"eV/atom (median {w['median']:.3f}) with {100 * w['share_positive']:.0f} % above 0. "
            "A model compared on the slice is "
            "compared on mostly unstable compounds with a narrow target range, and R² is not comparable across the two "
            "populations.", ""]


def _params_line(r, ref_params, label):
    """Our parameter count split into vocabulary × d and the rest, and what the tutorial's count implies."""
    t = r["transformer"]
    d, v = t["config"]["d_model"], t.get("vocab_size") or r["runs"][0]["vocab_size"]
    rest = t["n_params"] - v * d
    implied = (ref_params - rest) / d
    s = f"Parameters: {t['n_params']:,} = {v} tokens × {d} (embedding) + {rest:,} (the rest of the model)"
    if d != TUTORIAL_D:
        s += f"; the tutorial's {ref_params:,} is for width {TUTORIAL_D}, not comparable"
    elif implied == int(implied) and implied > 0:
        s += (f"; the tutorial's {ref_params:,} = {int(implied)} × {d} + the same {rest:,}, so the whole "
              f"difference is its vocabulary of {int(implied)} tokens against our {v} ({label})")
    else:
        s += f"; the tutorial's {ref_params:,} is not {rest:,} plus a whole number of {d}-wide embeddings"
    return s + "."


def _ridge_alpha_line(r):
    """Ridge's chosen alpha per split: interior to the grid, or at an edge."""
    bits = []
    for run in r["runs"]:
        if run["model"] == "ridge + element fractions" and "alpha_grid" in run:
            g = run["alpha_grid"]
            where = "at the grid's edge" if run["alpha_at_grid_edge"] else "interior"
            bits.append(f"{run['split']} {run['alpha']:g} ({where}; test predictions vary by "
                        f"{run['test_pred_std_ratio']:.2f} of the target's std)")
    return f"Ridge alpha, chosen on validation from {g[0]:g} to {g[-1]:g}: " + ", ".join(bits) + "." if bits else ""


MATERIALS_DIFFERENCES = [
    "Data of the comparison row: the tutorial does not say which 16,000 rows it used; ours are the first 16,000 of "
    "`mp_e_form.csv` as shipped (sorted, highest formation energy first), shuffled with seed 0, split "
    "8000/1000/2000 in that order, the slice whose mean baseline reproduces the tutorial's (see above). A random "
    "11,000-row subset of the whole file and its split by composition are labelled variants (extended mode).",
    "Formula tokens exactly as written in the file (alphabetical, explicit amounts such as `Ca1F6Ti1`), vocabulary "
    "from the training rows: more tokens than the tutorial's (see the parameter line); the predictor rewrites a "
    "user's formula into that style.",
    "Gradients of 32 samples accumulated per optimiser step (the tutorial: \"batch size 1 + accumulation\", size not "
    "stated), peak learning rate 2e-3 after the recipe's 150 warmup steps, inverse-square-root decay, clipping at 1.",
    "Ridge alpha chosen on the validation split from a grid wide enough to show whether the choice is interior; "
    "claims between models rest on a paired bootstrap over the test rows plus the seed spread (the tutorial "
    "compares single numbers).",
    "Beyond the tutorial (extended mode): \"Transformer + periodic-table priors\", each element token's embedding "
    "plus a learned projection of 8 fixed element features from RDKit's periodic table (the tutorial's own remedy, "
    "its §9), \"Transformer + order augmentation\", and \"Transformer, tutorial recipe (1 sample per Adam step)\" "
    "(the tutorial's §6.5 \"batch size 1\" taken literally, one Adam step per training formula, seed 0): a partial "
    "test of whether the tutorial's failure to fit is its optimisation (one seed, peak learning rate 2e-3, no gradient "
    "accumulation; §6.5's accumulation and the rest of its 2e-3 to 4e-3 range are not run).",
]


def _materials_split_line(r):
    """Sizes of every split and how many test rows share a reduced formula with training."""
    bits = [f"{name} {'/'.join(map(str, sp['sizes']))} ({sp['test_formulas_in_train']} of {sp['sizes'][2]} test rows "
            f"share a reduced formula with training; {sp.get('source', '')})" for name, sp in r["splits"].items()]
    return "Splits: " + "; ".join(bits) + "."


QUESTION = ("Can a Transformer read formation energy from a composition string such as `Mg2Si` alone, without the "
            f"crystal structure? The tutorial's answer, a negative result: on its {MATERIALS_REF['sizes'][0]:,} "
            "training formulas the "
            f"Transformer's test RMSE {MATERIALS_REF['tutorial|Transformer']['test_rmse']} is worse than ridge on "
            f"element fractions ({MATERIALS_REF['tutorial|ridge + element fractions']['test_rmse']}) and the mean "
            f"({MATERIALS_REF['tutorial|mean']['test_rmse']}); composition alone, as a string, cannot tell.")
FIGURES = [fig_materials_parity, fig_materials_bars, fig_materials_curves, fig_materials_order,
           fig_materials_attention]


def _context_lines(r):
    t = prop.summary_row(r, "random", "Transformer") or prop.summary_row(r, "tutorial", "Transformer")
    sh = r["attention"]["share_of_element_queries"]
    return [f"Context (test MAE, eV/atom): our Transformer {t['test_mae']:.3f} on the {t['split']} split; on the "
            f"full Matbench `mp_e_form` (not the tutorial) composition-only CrabNet reaches "
            f"{MATBENCH_CONTEXT['crabnet_mae']} and the dummy model {MATBENCH_CONTEXT['dummy_mae']}; the tutorial "
            f"cites {MATERIALS_REF['structure_aware_mae']} for a structure-aware model.", "",
            f"Attention of element tokens in the last layer ({r['attention']['n_formulas']} test formulas of the "
            f"{r['summary'][0]['split']} split) goes {100 * sh['element']:.0f}% to element tokens, "
            f"{100 * sh['amount']:.0f}% to amounts and {100 * sh['special']:.0f}% to `<bos>`/`<eos>`."]


def page(payload):
    """Experiment 7's page parts (report_kit.Page)."""
    r = payload["results"]
    comparison = [_materials_split_line(r), "", *_materials_slice_lines(r),
                  _params_line(r, MATERIALS_REF["params"], "amounts as whole-number tokens, as written in the file")
                  + " " + prop.recipe_line(r["transformer"]["recipe"]) + " " + _ridge_alpha_line(r), ""]
    comparison += prop.summary_table(r, MATERIALS_REF, {"tutorial": "tutorial (rebuilt)"})
    if prop.summary_row(r, "tutorial", "mean"):
        comparison += ["", _materials_reproduction(r)]
    extras = prop.domain_lines(r, "eV/atom")[1:] + [""] + _context_lines(r)
    return kit.Page(comparison, reading(r), MATERIALS_DIFFERENCES + prop.saved_difference(r), extras,
                    [("parity", "materials_parity"), ("bars", "materials_bars"), ("order", "materials_order"),
                     ("attention", "materials_attention"), ("curves", "materials_curves")])


def headline(r):
    """The overview row: test RMSE and R² (the statistics the tutorial drew its conclusion from) of the
    Transformer and ridge on fractions, with the paired verdict, on the reconstructed tutorial split when run."""
    ref = MATERIALS_REF
    split = "tutorial" if prop.summary_row(r, "tutorial", "Transformer") else r["summary"][0]["split"]
    t, g = (prop.summary_row(r, split, mdl) for mdl in ("Transformer", "ridge + element fractions"))
    c = kit.find_comparison(r, split, "Transformer", "ridge + element fractions")
    judged = f"; paired: {kit.verdict_words(c).removesuffix(' than')}" if c else ""
    where = "tutorial split rebuilt: first 16,000 rows" if split == "tutorial" else f"{split} split"
    def cell(x, k):
        return f"{x[f'{k}rmse']:.3f} ({x[f'{k}r2']:.3f})"
    rt, rr = ref["tutorial|Transformer"], ref["tutorial|ridge + element fractions"]
    return (f"test RMSE (R²), {where}: Transformer {cell(t, 'test_')}, ridge {cell(g, 'test_')}"
            f"{judged}", f"{cell(rt, 'test_')}, {cell(rr, 'test_')}")
