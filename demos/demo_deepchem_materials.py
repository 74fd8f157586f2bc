"""Experiment 7 (the tutorial's section 10.7) - formation energy (eV/atom) from the composition alone
(Materials Project, Matbench mp_e_form): a Transformer on formula tokens against ridge on element fractions
and the mean, how much its prediction depends on the order the elements are written in, and where its
attention goes.

What it does
------------
* Data and splits.  ``mp_e_form.csv`` (132,752 rows) is sorted by target, highest first.
  - tutorial (the comparison row, default mode): ``chemdata.mp_tutorial_slice(seed=0)``, the first
    16,000 rows of the file as shipped (the tutorial's appendix C: "16000 rows"), shuffled with the seed,
    split 8000/1000/2000 in that order.  These are the entries with the highest formation energies;
    ``data.profiles`` describes them against the whole file (range, share above 0 eV/atom).
  - random (--extended, a labelled variant): ``chemdata.load_mp_formation_energy(seed=0)``, the whole
    file shuffled, its first 11,000 rows split 8000/1000/2000.
  - group (--extended): the same 11,000 rows split by reduced formula (``chemdata.group_split``,
    fractions 8/11, 1/11, 2/11): no composition appears in two splits (checked).
  The number of test rows whose reduced formula also occurs in training is recorded per split.
* Models:
  - Transformer: TransformerEncoder d = 48, 4 heads, 2 layers, d_ff 96, sine positions, mean pooling,
    formula tokens as written in the file (alphabetical, explicit amounts: Ca1F6Ti1 -> Ca 1 F 6 Ti 1,
    with <bos>/<eos>), vocabulary from the training rows; z-scored target; Adam (lr 2e-3, warmup 150
    steps = the tutorial's recipe, then 1/sqrt decay, clip 1.0); gradients of 32 samples accumulated per
    optimiser step (the tutorial's "batch size 1 + accumulation" does not say how many): 250 steps per
    epoch, 6 epochs = 1500 steps, warmup 10 % of them.
  - ridge on the element fractions (closed form), alpha picked on the validation RMSE from a grid wide
    enough that the pick is interior (recorded: ``alpha_grid``, ``alpha_at_grid_edge``).
  - mean.
* Paired comparisons (``results.comparisons``, ``property_common.compare_models``): on every split, the
  Transformer against ridge (RMSE and MAE) and against the mean, and the extended rows against the
  Transformer and ridge: a paired bootstrap over the test rows (2,000 resamples, seeds pooled) plus the
  seed-spread rule.
* Order sensitivity: every test formula with two or more elements is rewritten in up to 3 other element
  orders; the mean absolute change of the prediction (eV/atom) is reported (ridge: 0 by construction).
* Attention: the last layer's attention (mean over heads) on test formulas of the first split, aggregated by
  element (query element row, key element column; mean weight over formulas containing both), for the 20
  most frequent elements in its training rows; also the share of attention on element, amount and
  <bos>/<eos> tokens.
* --extended (``extended_rows``): tutorial split, plain Transformer seeds 0, 1, 2; random split, the plain
  Transformer and "Transformer + periodic-table priors" seeds 0, 1, 2 and "Transformer + order
  augmentation" (each training formula in its own order and in one random other order, 2x rows, 3 epochs:
  the same samples seen as 6 epochs) seed 0; group split, plain and priors seed 0.  Twelve trainings:
  measured on Python 3.13 (math.sumprod, a ~210 Mflop/s host), 7.4 min each on the slice and 8.5-9.5 min
  on the random and group splits (longer formulas: 8.7 against 7.0 ids on average), 107 min in all; on
  3.11 the default run's one training took 16.8 min on the random subset (main job of f26ca11).
  Priors: each element token's embedding gets a learned projection W_f of 8 fixed element features
  (``property_features.element_features``, from RDKit's periodic table), X = E[id] + F[id] W_f + P.
* The tutorial's recipe as stated (--extended, or --add-recipe into an existing results file; tutorial split,
  seed 0): row "Transformer, tutorial recipe (1 sample per Adam step)", the same model with the section 6.5
  recipe taken literally: one Adam step per training formula (no accumulation: 8,000 steps per epoch, 48,000
  in 6 epochs), peak lr 2e-3, the 150 warmup steps then 1/sqrt decay, clip 1.0.  It tests whether the
  tutorial's training R^2 of -0.039 (a model that did not fit its training data) comes from that
  optimisation; it is never a saved-model candidate.  One core only (one sample per step leaves nothing to
  share between processes): 96 min of training measured on Python 3.11 (--add-recipe at 928c4a3, on a host
  running other work part of the time).
* Unseen formulas (``results.unseen_formulas``): per split, the test rows whose reduced formula never occurs
  in training, each model's test RMSE there and the Transformer against ridge and the mean on them (paired):
  whether a win survives without any composition seen in training.
* The saved model (--extended, QUICK, or --saved-model into an existing results file; ``saved_predictor``): the
  plain recipe on the random split (it spans the whole file's range; the tutorial slice holds only its highest
  formation energies), seeds 0, 1, 2, each at its best validation epoch, on the formulas as the predictor reads
  them (alphabetical, explicit amounts: the file's own form), written to models/materials_transformer.json as one
  ensemble with a 90 % split-conformal interval (validation split); errors, skill, coverage and cost measured
  through ``predictor.load_predictor``.  Its members are the extra row SAVED_ROW.

How to read results_materials.json (under "results"): runs, summary, curves and checks as in
results_esol.json; comparisons[*] {a, b, metric, split, diff, ci_low, ci_high, n_items, verdict};
order_sensitivity[*] {split, model, seed, mean_abs_change, n_formulas, n_rewrites}; attention {elements,
matrix, counts, share}; splits.<name> sizes, overlap counts and data source; data.profiles (target
distribution of the whole file, of each split's rows and of the tutorial slice's test rows);
transformer.recipe (accumulation, steps, warmup share).

Run:  python demos/demo_deepchem_materials.py               (default: about 20 min on 2 cores, Python 3.11)
      python demos/demo_deepchem_materials.py --extended
      python demos/demo_deepchem_materials.py --add-recipe  (only the tutorial-recipe row, into the existing
                                                             results file; comparisons recomputed; under "updates")
      python demos/demo_deepchem_materials.py --saved-model (the saved model into the results file; "updates")
      python demos/demo_deepchem_materials.py --rescore     (summary, comparisons, checks again from the stored
                                                             predictions; "updates")
      QUICK=1 python demos/demo_deepchem_materials.py       (smoke run on 550 rows; numbers meaningless)
"""
import os
import random
import time

import common
import property_common as pc
import saved_predictor as sp

import chemdata
from formulas import element_fractions, parse_formula, reduced_formula, tokenize_formula
import property_features

core = common.core

UNITS = "eV/atom"
MODEL_PATH = os.path.join(common.ROOT, "models", "materials_transformer.json")
SAVED_ROW = "Transformer (the saved ensemble's members)"      # saved_predictor's rule, on the random split
SAVED = sp.Study("materials", MODEL_PATH, "formula", UNITS, "formation energy per atom (Materials Project)", "random",
                 SAVED_ROW, None, {"formula_style": "alphabetical_explicit"})

ALPHAS = [1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1e3, 1e4]
FULL = dict(n_train=8000, n_valid=1000, n_test=2000,
            transformer=dict(d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=64, pos="sine", epochs=6,
                             batch_size=32, lr=2e-3, warmup=150, clip=1.0),
            ridge_alphas=ALPHAS, n_orders=3, n_attention=1000, top_elements=20,
            augment=dict(n_orders=1, epochs=3),
            # the tutorial's section 6.5 recipe taken literally: one Adam step per sample (no accumulation)
            tutorial_recipe=dict(batch_size=1, lr=2e-3, warmup=150),
            # --extended seeds per (split, row): twelve 6-epoch trainings (7.4-9.5 min each on 3.13)
            extended_rows={"tutorial": {"plain": [0, 1, 2], "augment": [], "priors": [], "recipe": [0]},
                           "random": {"plain": [0, 1, 2], "augment": [0], "priors": [0, 1, 2]},
                           "group": {"plain": [0], "augment": [], "priors": [0]}},
            saved_seeds=list(sp.SEEDS))
QUICK_OVERRIDES = dict(n_train=400, n_valid=50, n_test=100,
                       transformer=dict(FULL["transformer"], d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                        epochs=1, warmup=5),
                       n_attention=100, augment=dict(n_orders=1, epochs=1),
                       tutorial_recipe=dict(batch_size=1, lr=2e-3, warmup=5),
                       extended_rows={"tutorial": {"plain": [0, 1], "augment": [], "priors": [], "recipe": [0]},
                                      "random": {"plain": [0, 1], "augment": [0], "priors": [0]},
                                      "group": {"plain": [0], "augment": [0], "priors": [0]}},
                       saved_seeds=[0, 1])


# ----------------------------------------------------------------------------- data and splits


def load_splits(cfg, seed, extended):
    """{split: (formulas, y, (train, valid, test))}: 'tutorial' (the first 16,000 rows of the file as
    shipped, shuffled; ``chemdata.mp_tutorial_slice``) and, in --extended, 'random' (the first rows of the
    whole file shuffled) and 'group' (the same rows split by reduced formula).  QUICK runs keep the first
    rows of each part."""
    a, b, c = cfg["n_train"], cfg["n_valid"], cfg["n_test"]
    data, idx = chemdata.mp_tutorial_slice(seed=seed)
    out = {"tutorial": (data.formulas, data.y, (idx[0][:a], idx[1][:b], idx[2][:c]))}
    if extended:
        sub = chemdata.load_mp_formation_energy(n=a + b + c, seed=seed)
        out["random"] = (sub.formulas, sub.y, (list(range(a)), list(range(a, a + b)), list(range(a + b, a + b + c))))
        n = a + b + c
        out["group"] = (sub.formulas, sub.y, chemdata.group_split([reduced_formula(f) for f in sub.formulas],
                                                                  fractions=(a / n, b / n, 1 - a / n - b / n),
                                                                  seed=seed))
    return out


SOURCES = {"tutorial": "first 16,000 rows of mp_e_form.csv as shipped (highest targets), shuffled, first 11,000 "
                       "split in order", "random": "whole file shuffled, first 11,000 rows split in order",
           "group": "the random split's 11,000 rows, split by reduced formula"}


def overlap(formulas, idx):
    """Rows of valid/test whose reduced formula occurs in train, and distinct formulas shared."""
    red = [reduced_formula(f) for f in formulas]
    train = {red[i] for i in idx[0]}
    return {"valid_rows_formula_in_train": sum(1 for i in idx[1] if red[i] in train),
            "test_formulas_in_train": sum(1 for i in idx[2] if red[i] in train),
            "distinct_formulas_shared_train_test": len(train & {red[i] for i in idx[2]}),
            "sizes": list(map(len, idx))}


def profiles(splits):
    """Target distributions (``chemdata.target_profile``): the whole file, the tutorial's 16,000-row slice, and
    each split's train+valid+test rows and test rows."""
    whole = chemdata.load_mp_formation_energy(seed=0)
    out = {"whole_file": chemdata.target_profile(whole.y),
           "tutorial_slice": chemdata.target_profile(chemdata.mp_tutorial_slice(seed=0)[0].y)}
    for name, (_, y, idx) in splits.items():
        out[name] = chemdata.target_profile(pc.pick(y, idx[0] + idx[1] + idx[2]))
        out[f"{name}_test"] = chemdata.target_profile(pc.pick(y, idx[2]))
    return out


def recipe(cfg, n_train):
    """The optimiser schedule a run of ``n_train`` rows gets: accumulation, steps, warmup share."""
    t = cfg["transformer"]
    per_epoch = -(-n_train // t["batch_size"])
    steps = per_epoch * t["epochs"]
    return {"accumulation": t["batch_size"], "steps_per_epoch": per_epoch, "steps": steps,
            "warmup": t["warmup"], "warmup_share": t["warmup"] / steps}


# ----------------------------------------------------------------------------- Transformer


PRIORS = "priors"     # the row marker for "Transformer + periodic-table priors" in extended_rows
RECIPE = "recipe"     # the row marker for the tutorial's per-sample recipe (RECIPE_ROW) in extended_rows
RECIPE_ROW = "Transformer, tutorial recipe (1 sample per Adam step)"


def transformer_run(run, cfg, formulas, y, split, idx, seed, augment=None):
    """Train one Transformer, optionally on order-augmented training rows (augment = its settings) or with
    periodic-table priors (augment = PRIORS: every element token's embedding gets a learned projection of
    fixed element features, ``property_features.element_features``) or with the tutorial's recipe taken literally
    (augment = RECIPE: ``tutorial_recipe``, one Adam step per formula); returns (record, fit, vocab)."""
    priors, recipe_row = augment == PRIORS, augment == RECIPE
    augment = None if priors or recipe_row else augment
    F, Y = pc.parts(formulas, idx), pc.parts(y, idx)
    train_f, train_y = list(F["train"]), list(Y["train"])
    tcfg, model_name = cfg["transformer"], "Transformer"
    if recipe_row:
        tcfg, model_name = dict(tcfg, **cfg["tutorial_recipe"]), RECIPE_ROW
    if augment:
        rng = random.Random(500 + seed)
        for f, v in zip(F["train"], Y["train"]):
            for g in property_features.formula_orders(f, augment["n_orders"], rng):
                train_f.append(g)
                train_y.append(v)
        tcfg, model_name = dict(tcfg, epochs=augment["epochs"]), "Transformer + order augmentation"
    vocab = chemdata.Vocab.build([tokenize_formula(f) for f in train_f])
    def enc(fs):
        return pc.encode([tokenize_formula(f) for f in fs], vocab)[0]
    features = None
    if priors:
        elements = [t for t in vocab.itos[4:] if t[0].isalpha()]
        features = property_features.token_feature_matrix(vocab, property_features.element_features(elements))
        model_name = "Transformer + periodic-table priors"
    kind = "augmented" if augment else "priors" if priors else "recipe" if recipe_row else "transformer"
    tag = f"{split}_{kind}_s{seed}"
    fit = pc.train_encoder({"train": enc(train_f), "valid": enc(F["valid"]), "test": enc(F["test"])},
                           {"train": train_y, "valid": Y["valid"], "test": Y["test"]}, tcfg, seed=seed,
                           tag=f"materials {tag}", vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(tag), log=run.log, token_features=features)
    if augment:      # report train metrics on the training formulas as written, like the other rows
        fit["preds"]["train"] = fit["scaler"].inverse(pc.predict_z(fit["model"], enc(F["train"])))
    rec = pc.run_record(split, model_name, seed, Y, fit["preds"], F["test"], train_time_s=fit["train_time_s"],
                        predict_time_s=fit["predict_time_s"], n_params=fit["n_params"], vocab_size=len(vocab),
                        n_train_rows=len(train_f), accumulation=tcfg["batch_size"],
                        resumed_at_steps=fit["history"].get("resumed_at_steps", []))
    fit["encode"] = enc
    return rec, fit, vocab


def order_sensitivity(fit, test_formulas, n_orders, seed):
    """Mean |prediction(rewritten) - prediction(as written)| over test formulas with >= 2 elements."""
    rng = random.Random(900 + seed)
    base, rewrites = [], []
    for i, f in enumerate(test_formulas):
        for g in property_features.formula_orders(f, n_orders, rng):
            base.append(i)
            rewrites.append(g)
    if not rewrites:
        return {"mean_abs_change": 0.0, "n_formulas": 0, "n_rewrites": 0}
    std = fit["scaler"].std
    orig = pc.predict_z(fit["model"], fit["encode"](test_formulas))
    new = pc.predict_z(fit["model"], fit["encode"](rewrites))
    changes = [abs(n - orig[i]) * std for n, i in zip(new, base)]
    return {"mean_abs_change": sum(changes) / len(changes), "max_abs_change": max(changes),
            "n_formulas": len(set(base)), "n_rewrites": len(rewrites)}


def attention_by_element(model, vocab, formulas, elements):
    """Last-layer attention (mean over heads) aggregated by (query element, key element).

    For each formula, the weight from each element token to each element token is averaged over the
    heads; entry [a][b] is the mean over formulas containing a and b (a != b or a == b) of that weight.
    Also the share of the attention of element queries going to element / amount / special tokens."""
    pos = {e: k for k, e in enumerate(elements)}
    n = len(elements)
    total = [[0.0] * n for _ in range(n)]
    count = [[0] * n for _ in range(n)]
    share = {"element": 0.0, "amount": 0.0, "special": 0.0}
    n_queries = 0
    attn = model.blocks[-1].attn
    for f in formulas:
        toks = ["<bos>"] + tokenize_formula(f) + ["<eos>"]
        model.forward(vocab.encode(toks[1:-1]))
        A = [[sum(attn.heads[h][3][i][j] for h in range(len(attn.heads))) / len(attn.heads)
              for j in range(len(toks))] for i in range(len(toks))]
        for i, ti in enumerate(toks):
            if not ti[0].isalpha() or ti.startswith("<"):
                continue
            n_queries += 1
            for j, tj in enumerate(toks):
                kind = "special" if tj.startswith("<") else "element" if tj[0].isalpha() else "amount"
                share[kind] += A[i][j]
                if ti in pos and tj in pos:
                    total[pos[ti]][pos[tj]] += A[i][j]
                    count[pos[ti]][pos[tj]] += 1
    matrix = [[total[a][b] / count[a][b] if count[a][b] else None for b in range(n)] for a in range(n)]
    return {"elements": list(elements), "matrix": matrix, "counts": count, "n_formulas": len(formulas),
            "share_of_element_queries": {k: v / max(1, n_queries) for k, v in share.items()}}


def top_elements(formulas, k):
    """The k elements occurring in most formulas."""
    counts = {}
    for f in formulas:
        for e in parse_formula(f):
            counts[e] = counts.get(e, 0) + 1
    return sorted(counts, key=lambda e: (-counts[e], e))[:k]


# ----------------------------------------------------------------------------- main


def baselines(cfg, formulas, y, split, idx, run):
    """Ridge on element fractions (alpha on validation) and the mean."""
    Y, X = pc.parts(y, idx), pc.parts([element_fractions(f) for f in formulas], idx)
    best = pc.ridge_best(X, Y, cfg["ridge_alphas"])
    grid = cfg["ridge_alphas"]
    edge = best[1] in (min(grid), max(grid))
    run.log(f"{split}: ridge on element fractions, alpha {best[1]:g} of {min(grid):g}..{max(grid):g}"
            f"{' (at the edge of the grid)' if edge else ''} (valid RMSE {best[0]:.3f})")
    test_ids = pc.pick(formulas, idx[2])
    return [pc.run_record(split, "ridge + element fractions", 0, Y, best[2], test_ids, alpha=best[1],
                          alpha_grid=list(grid), alpha_at_grid_edge=edge,
                          test_pred_std_ratio=chemdata.prediction_spread(Y["test"], best[2]["test"])),
            pc.run_record(split, "mean", 0, Y, pc.mean_run(Y), test_ids)]


RIDGE, MEAN, PLAIN = "ridge + element fractions", "mean", "Transformer"
AUGMENT, PRIORS_ROW = "Transformer + order augmentation", "Transformer + periodic-table priors"
# (A, B, metric): every claim a reading makes between two models on the same test rows
COMPARISONS = [(PLAIN, RIDGE, "rmse"), (PLAIN, RIDGE, "mae"), (PLAIN, MEAN, "rmse"), (RIDGE, MEAN, "rmse"),
               (AUGMENT, PLAIN, "rmse"), (PRIORS_ROW, PLAIN, "rmse"), (PRIORS_ROW, RIDGE, "rmse"),
               (RECIPE_ROW, PLAIN, "rmse"), (RECIPE_ROW, MEAN, "rmse"), (SAVED_ROW, PLAIN, "rmse"),
               (SAVED_ROW, MEAN, "rmse")]
UNSEEN_COMPARISONS = [(PLAIN, RIDGE, "rmse"), (PLAIN, MEAN, "rmse"), (RIDGE, MEAN, "rmse")]


def unseen_formulas(runs, splits):
    """``results.unseen_formulas``: per split, the test rows whose reduced formula never occurs in training (no
    composition the models were fitted on), each model's test RMSE there (mean over seeds) and the
    UNSEEN_COMPARISONS on those rows (paired bootstrap + seed spread): whether a win survives without leakage."""
    out = {}
    for split, (formulas, _, idx) in splits.items():
        red = [reduced_formula(f) for f in formulas]
        train = {red[i] for i in idx[0]}
        keep = {formulas[i] for i in idx[2] if red[i] not in train}
        sub = pc.subset_runs([r for r in runs if r["split"] == split], keep)
        n = len(sub[0]["test_ids"]) if sub else 0
        if not n:
            continue
        rmse = {}
        for r in sub:
            rmse.setdefault(r["model"], []).append(r["metrics"]["test"]["rmse"])
        cmp = [pc.compare_models(sub, split, a, b, m) for a, b, m in UNSEEN_COMPARISONS]
        out[split] = {"n_test": n, "n_test_all": len(idx[2]),
                      "test_rmse": {m: sum(v) / len(v) for m, v in rmse.items()},
                      "comparisons": [c for c in cmp if c]}
    return out


def comparisons(runs, splits):
    """``results.comparisons``: the pairs of COMPARISONS present on each split (paired bootstrap + seed spread)."""
    out = []
    for split in splits:
        for a, b, metric in COMPARISONS:
            rec = pc.compare_models(runs, split, a, b, metric)
            if rec:
                out.append(rec)
    return out


def split_rows(cfg, split, extended, seed):
    """[(augment setting, seeds)] of the Transformer rows trained on ``split``."""
    rows = cfg["extended_rows"][split] if extended else {"plain": [seed]}
    return [(None, rows["plain"]), (cfg["augment"], rows.get("augment", [])), (PRIORS, rows.get("priors", [])),
            (RECIPE, rows.get("recipe", []))]


def split_runs(run, cfg, split, data, elements, out):
    """Every Transformer of one split (with its order sensitivity; attention of the first), then the baselines."""
    formulas, y, idx = data
    test_f = pc.pick(formulas, idx[2])
    for augment, row_seeds in split_rows(cfg, split, run.extended, run.args.seed):
        for s in row_seeds:
            rec, fit, vocab = transformer_run(run, cfg, formulas, y, split, idx, s, augment)
            sens = order_sensitivity(fit, test_f, cfg["n_orders"], s)
            run.log(f"{split} {rec['model']} seed {s}: test RMSE {rec['metrics']['test']['rmse']:.3f}, "
                    f"order sensitivity {sens['mean_abs_change']:.4f} {UNITS}")
            out["runs"].append(rec)
            out["order"].append(dict(split=split, model=rec["model"], seed=s, **sens))
            out["curves"][f"{split}/{rec['model']}/seed{s}"] = fit["curve"]
            if augment is None:
                if out["attention"] is None:
                    t0 = time.perf_counter()
                    out["attention"] = attention_by_element(fit["model"], vocab, test_f[:cfg["n_attention"]],
                                                            elements)
                    run.log(f"attention by element over {out['attention']['n_formulas']} {split}-split formulas "
                            f"({time.perf_counter() - t0:.0f} s)")
    out["runs"] += baselines(cfg, formulas, y, split, idx, run)
    out["order"].append(dict(split=split, model=RIDGE, seed=0, mean_abs_change=0.0,
                             note="a function of the composition only: 0 by construction"))


ADDED_RECIPE = ("the tutorial-recipe row (one Adam step per training formula) trained on the tutorial split with its "
                "order sensitivity; summary, comparisons, unseen-formula comparisons and checks recomputed from the "
                "stored predictions")


def add_recipe(run, cfg, seed):
    """--add-recipe: train the tutorial-recipe row (``tutorial_recipe``, tutorial split) into an existing results
    file, whose other rows are not rerun; the stored records give the summary and every comparison again.  The
    call is recorded under the payload's ``updates`` (``common.update_results``)."""
    def update(payload):
        r, done = payload["results"], payload["config"]
        if any(x["model"] == RECIPE_ROW and x["seed"] == seed for x in r["runs"]):
            raise ValueError(f"--add-recipe: {run.path} already holds the row {RECIPE_ROW!r} for seed {seed}")
        splits = load_splits(dict(cfg, **{k: done[k] for k in ("n_train", "n_valid", "n_test")}), payload["seed"],
                             "random" in r["splits"])
        formulas, y, idx = splits["tutorial"]
        rec, fit, _ = transformer_run(run, cfg, formulas, y, "tutorial", idx, seed, RECIPE)
        sens = order_sensitivity(fit, pc.pick(formulas, idx[2]), cfg["n_orders"], seed)
        run.log(f"tutorial {RECIPE_ROW} seed {seed}: train R2 {rec['metrics']['train']['r2']:.3f}, test RMSE "
                f"{rec['metrics']['test']['rmse']:.3f}, order sensitivity {sens['mean_abs_change']:.4f} {UNITS}")
        r["runs"].append(rec)
        r["order_sensitivity"].append(dict(split="tutorial", model=RECIPE_ROW, seed=seed, **sens))
        r["curves"][f"tutorial/{RECIPE_ROW}/seed{seed}"] = fit["curve"]
        r["seeds"] = sorted({x["seed"] for x in r["runs"]})
        r["summary"], r["comparisons"] = pc.summarize(r["runs"]), comparisons(r["runs"], splits)
        r["unseen_formulas"], r["checks"] = unseen_formulas(r["runs"], splits), checks(r["runs"], splits)
        done["tutorial_recipe"] = cfg["tutorial_recipe"]
        rows = done["extended_rows"] if payload["mode"] == "extended" else {}
        rows.get("tutorial", {})["recipe"] = [seed]
    common.update_results(run.path, ADDED_RECIPE, update)
    done = run.checkpoint(f"tutorial_recipe_s{seed}")       # only there to resume this call: stale now
    if os.path.exists(done):
        os.remove(done)


def rescore(payload):
    """--rescore: summary, comparisons, unseen-formula comparisons and checks again from the stored run records,
    on the payload's own splits (nothing is trained)."""
    r = payload["results"]
    splits = load_splits(payload["config"], payload["seed"], payload["mode"] == "extended")
    splits = {k: v for k, v in splits.items() if any(x["split"] == k for x in r["runs"])}
    r["summary"], r["comparisons"] = pc.summarize(r["runs"]), comparisons(r["runs"], splits)
    r["unseen_formulas"] = unseen_formulas(r["runs"], splits)
    r["checks"] = dict(r["checks"], **checks(r["runs"], splits))   # the saved model's checks stay (unchanged)


def extra_args(p):
    pc.rescore_arg(p)
    p.add_argument("--add-recipe", action="store_true",
                   help="train only the tutorial-recipe row (one Adam step per formula) into the existing results "
                        "file (in --out, or the default folder); recorded under the payload's 'updates'")
    p.add_argument("--saved-model", action="store_true",
                   help="train the saved model (3 seeds of the plain recipe on the random split), write it to models/ "
                        "and measure it through the predictor, into the existing results file; recorded under "
                        "'updates'")


def main():
    args, cfg, run = common.start("materials", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    if args.rescore:
        common.update_results(run.path, pc.RESCORED, rescore)
        return run.log(f"updated {run.path}")
    if args.add_recipe:
        add_recipe(run, cfg, args.seed)
        return run.log(f"updated {run.path}")
    if args.saved_model:
        common.update_results(run.path, ADDED_SAVED, lambda payload: add_saved_model(run, cfg, payload))
        return run.log(f"updated {run.path}")
    splits = load_splits(cfg, args.seed, run.extended)
    n_stages = 2 + len(splits)
    run.stage(1, n_stages, f"splits {[(k, tuple(map(len, v[2]))) for k, v in splits.items()]}; target profiles")
    first = splits["tutorial"]
    elements = top_elements(pc.pick(first[0], first[2][0]), cfg["top_elements"])
    out = {"runs": [], "curves": {}, "order": [], "attention": None}
    for k, (split, data) in enumerate(splits.items()):
        run.stage(2 + k, n_stages, f"{split} split: Transformer rows "
                                   f"{split_rows(cfg, split, run.extended, args.seed)}, baselines, order sensitivity")
        split_runs(run, cfg, split, data, elements, out)
    run.stage(n_stages, n_stages, "saved model, comparisons, summary and checks")
    saved, saved_runs = saved_model(run, cfg, splits)
    runs = out["runs"] = out["runs"] + saved_runs
    tokens = {name: pc.length_stats([tokenize_formula(f) for f in pc.pick(d[0], sum(d[2], []))])
              for name, d in splits.items()}
    results = {
        "data": {"n": {name: sum(map(len, d[2])) for name, d in splits.items()}, "task": "formation_energy_per_atom",
                 "units": UNITS, "profiles": profiles(splits), "token_lengths": tokens,
                 "tutorial_rows": chemdata.MP_TUTORIAL_ROWS},
        "splits": {name: dict(overlap(d[0], d[2]), source=SOURCES[name]) for name, d in splits.items()},
        "transformer": {"config": cfg["transformer"], "n_params": runs[0]["n_params"],
                        "vocab_size": runs[0]["vocab_size"],
                        "recipe": recipe(cfg, len(first[2][0]))},
        "seeds": sorted({r["seed"] for r in runs}), "runs": runs, "summary": pc.summarize(runs),
        "comparisons": comparisons(runs, splits), "curves": out["curves"],
        "order_sensitivity": out["order"], "attention": out["attention"], "saved_model": saved,
        "unseen_formulas": unseen_formulas(runs, splits),
        "element_features": {"names": list(property_features.ELEMENT_FEATURE_NAMES),
                             "source": property_features.ELEMENT_FEATURE_SOURCE,
                             "standardized": "z-scored over the element tokens of each training vocabulary"},
        "checks": dict(checks(runs, splits), **saved.get("checks", {})),
    }
    pc.finish(run, results)


def checks(runs, splits):
    """Self-checks that must all be True."""
    out = pc.check_records(runs, {name: len(d[2][2]) for name, d in splits.items()})
    out["mean_baseline_train_r2_is_0"] = all(abs(r["metrics"]["train"]["r2"]) < 1e-9
                                             for r in runs if r["model"] == MEAN)
    if not common.QUICK:
        out["tutorial_split_sizes"] = [len(i) for i in splits["tutorial"][2]] == list(chemdata.MP_TUTORIAL_SIZES)
    if "group" in splits:
        formulas, _, idx = splits["group"]
        red = [reduced_formula(f) for f in formulas]
        sets = [{red[i] for i in ix} for ix in idx]
        out["group_split_no_formula_in_two_splits"] = not (sets[0] & sets[1] or sets[0] & sets[2]
                                                            or sets[1] & sets[2])
    return out


SKIPPED = sp.skipped_note("models/materials_transformer.json",
                          "3 more trainings on the random split, which the default mode does not load")
ADDED_SAVED = sp.added_note("3 seeds of the plain recipe on the random split", "models/materials_transformer.json",
                            "summary, comparisons, unseen-formula comparisons and checks")


def saved_model(run, cfg, splits, force=False):
    """(results.saved_model, the members' run records): ``saved_predictor.build`` with the plain recipe on the
    random split (it spans the whole file's range; the tutorial slice holds only its highest energies) in
    --extended runs, or when ``force``d; QUICK runs use the tutorial split when the random one is not loaded."""
    if not (force or run.extended or common.QUICK):
        return {"skipped": SKIPPED}, []
    study = SAVED if SAVED.split in splits else SAVED._replace(split="tutorial")
    formulas, y, idx = splits[study.split]
    return sp.build(run, study, cfg["transformer"], formulas, y, idx, pc.pick(formulas, idx[2]),
                    seeds=cfg["saved_seeds"])


def add_saved_model(run, cfg, payload):
    """--saved-model: the saved model into an existing results file (``update_results`` records the call)."""
    r, done = payload["results"], payload["config"]
    splits = load_splits(dict(cfg, **{k: done[k] for k in ("n_train", "n_valid", "n_test")}), payload["seed"],
                         "random" in r["splits"])
    r["saved_model"], new = saved_model(run, cfg, splits, force=True)
    r["runs"] = sp.replace_rows(r["runs"], SAVED_ROW, new)
    r["seeds"] = sorted({x["seed"] for x in r["runs"]})
    r["summary"], r["comparisons"] = pc.summarize(r["runs"]), comparisons(r["runs"], splits)
    r["unseen_formulas"] = unseen_formulas(r["runs"], splits)
    r["checks"] = dict(checks(r["runs"], splits), **r["saved_model"]["checks"])
    done["saved_seeds"] = cfg["saved_seeds"]


if __name__ == "__main__":
    main()
