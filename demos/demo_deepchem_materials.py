"""Experiment 7 - formation energy (eV/atom) from the composition alone (Materials Project, Matbench
mp_e_form): a Transformer on formula tokens against ridge on element fractions and the mean, how much
its prediction depends on the order the elements are written in, and where its attention goes.

What it does
------------
* Data: ``chemdata.load_mp_formation_energy(seed=0)`` (132,752 rows, shuffled with the seed because the
  file is sorted by target), the first 11,000 rows.
* Splits: random = the tutorial's 8000/1000/2000 in the shuffled order; the number of test rows whose
  reduced formula also occurs in the training rows is recorded (``splits.random.test_formulas_in_train``).
  --extended adds the group split by reduced formula (``chemdata.group_split``, fractions 8/11, 1/11,
  2/11): no composition appears in two splits (checked).
* Models:
  - Transformer: TransformerEncoder d = 48, 4 heads, 2 layers, d_ff 96, sine positions, mean pooling,
    formula tokens as written in the file (alphabetical, explicit amounts: Ca1F6Ti1 -> Ca 1 F 6 Ti 1,
    with <bos>/<eos>), vocabulary from the training rows; z-scored target; Adam (lr 2e-3, warmup 100
    then 1/sqrt decay, clip 1.0), batch 32, 6 epochs (1500 steps).
  - ridge on the 89 element fractions (closed form), alpha picked on the validation RMSE.
  - mean.
* Order sensitivity: every test formula with two or more elements is rewritten in up to 3 other element
  orders; the mean absolute change of the prediction (eV/atom) is reported (ridge: 0 by construction).
* Attention: the last layer's attention (mean over heads) on test formulas, aggregated by element
  (query element row, key element column; mean weight over formulas containing both), for the 20 most
  frequent elements in the training rows; also the share of attention on element, amount and
  <bos>/<eos> tokens.
* --extended: the group split; "Transformer + order augmentation": each training formula in its own
  order and in one random other order (2x rows, 3 epochs: the same number of samples seen as 6 epochs),
  with its accuracy and order sensitivity.  Seeds per row (``extended_rows``): the two headline rows of
  the random split, the plain Transformer and the priors, get seeds 0, 1, 2; the group split and the
  order augmentation (random split only) run seed 0.  Nine trainings: measured 100 min on Python 3.13
  (10-11.5 min per training on 2 cores; about 16 min each on 3.11).  "Transformer + periodic-table
  priors" (both splits): each element token's embedding gets a learned projection W_f of 8 fixed
  element features (``chemdata.element_features``, from RDKit's periodic table: atomic number, period,
  group, f-block, weight, covalent and van der Waals radii, outer electrons), X = E[id] + F[id] W_f + P,
  with its accuracy and order sensitivity against ridge and the plain Transformer.

How to read results_materials.json (under "results"): runs, summary, curves and checks as in
results_esol.json; order_sensitivity[*] {split, model, seed, mean_abs_change, n_formulas, n_rewrites};
attention {elements, matrix, counts, share}; splits.<name> sizes and overlap counts.

Run:  python demos/demo_deepchem_materials.py               (default: about 20 min on 2 cores, Python 3.11)
      python demos/demo_deepchem_materials.py --extended
      QUICK=1 python demos/demo_deepchem_materials.py       (smoke run on 550 rows; numbers meaningless)
"""
import os
import random
import time

import common
import property_common as pc

import chemdata

tf = common.tf

UNITS = "eV/atom"
MODEL_PATH = os.path.join(common.ROOT, "models", "materials_transformer.json")

FULL = dict(n_train=8000, n_valid=1000, n_test=2000,
            transformer=dict(d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=64, pos="sine", epochs=6,
                             batch_size=32, lr=2e-3, warmup=100, clip=1.0),
            ridge_alphas=[1e-4, 1e-3, 1e-2, 0.1, 1.0], n_orders=3, n_attention=1000, top_elements=20,
            seeds_extended=[0, 1, 2], augment=dict(n_orders=1, epochs=3),
            # --extended seeds per (split, row): the headline rows (random split: plain, priors) get 3 seeds,
            # the rest 1; nine 6-epoch trainings, measured 100 min on 3.13 (~16 min per training on 3.11).
            extended_rows={"random": {"plain": [0, 1, 2], "augment": [0], "priors": [0, 1, 2]},
                           "group": {"plain": [0], "augment": [], "priors": [0]}})
QUICK_OVERRIDES = dict(n_train=400, n_valid=50, n_test=100,
                       transformer=dict(FULL["transformer"], d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                        epochs=1, warmup=5),
                       n_attention=100, seeds_extended=[0, 1], augment=dict(n_orders=1, epochs=1),
                       extended_rows={"random": {"plain": [0, 1], "augment": [0], "priors": [0]},
                                      "group": {"plain": [0], "augment": [0], "priors": [0]}})


# ----------------------------------------------------------------------------- splits


def make_splits(formulas, cfg, seed, extended):
    """{'random': (train, valid, test)} and, in --extended, 'group' by reduced formula."""
    a, b, c = cfg["n_train"], cfg["n_valid"], cfg["n_test"]
    out = {"random": (list(range(a)), list(range(a, a + b)), list(range(a + b, a + b + c)))}
    if extended:
        n = a + b + c
        out["group"] = chemdata.group_split([chemdata.reduced_formula(f) for f in formulas],
                                            fractions=(a / n, b / n, 1 - a / n - b / n), seed=seed)
    return out


def overlap(formulas, idx):
    """Rows of valid/test whose reduced formula occurs in train, and distinct formulas shared."""
    red = [chemdata.reduced_formula(f) for f in formulas]
    train = {red[i] for i in idx[0]}
    return {"valid_rows_formula_in_train": sum(1 for i in idx[1] if red[i] in train),
            "test_formulas_in_train": sum(1 for i in idx[2] if red[i] in train),
            "distinct_formulas_shared_train_test": len(train & {red[i] for i in idx[2]}),
            "sizes": list(map(len, idx))}


# ----------------------------------------------------------------------------- Transformer


PRIORS = "priors"     # the row marker for "Transformer + periodic-table priors" in extended_rows


def transformer_run(run, cfg, formulas, y, split, idx, seed, augment=None):
    """Train one Transformer, optionally on order-augmented training rows (augment = its settings) or with
    periodic-table priors (augment = PRIORS: every element token's embedding gets a learned projection of
    fixed element features, ``chemdata.element_features``); returns (record, fit, vocab)."""
    priors = augment == PRIORS
    augment = None if priors else augment
    F, Y = pc.parts(formulas, idx), pc.parts(y, idx)
    train_f, train_y = list(F["train"]), list(Y["train"])
    tcfg, model_name = cfg["transformer"], "Transformer"
    if augment:
        rng = random.Random(500 + seed)
        for f, v in zip(F["train"], Y["train"]):
            for g in chemdata.formula_orders(f, augment["n_orders"], rng):
                train_f.append(g)
                train_y.append(v)
        tcfg, model_name = dict(tcfg, epochs=augment["epochs"]), "Transformer + order augmentation"
    vocab = chemdata.Vocab.build([chemdata.tokenize_formula(f) for f in train_f])
    enc = lambda fs: pc.encode([chemdata.tokenize_formula(f) for f in fs], vocab)[0]   # noqa: E731
    features = None
    if priors:
        elements = [t for t in vocab.itos[4:] if t[0].isalpha()]
        features = chemdata.token_feature_matrix(vocab, chemdata.element_features(elements))
        model_name = "Transformer + periodic-table priors"
    tag = f"{split}_{'augmented' if augment else ('priors' if priors else 'transformer')}_s{seed}"
    fit = pc.train_encoder({"train": enc(train_f), "valid": enc(F["valid"]), "test": enc(F["test"])},
                           {"train": train_y, "valid": Y["valid"], "test": Y["test"]}, tcfg, seed=seed,
                           tag=f"materials {tag}", vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(tag), log=run.log, token_features=features)
    if augment:      # report train metrics on the training formulas as written, like the other rows
        fit["preds"]["train"] = fit["scaler"].inverse(pc.predict_z(fit["model"], enc(F["train"])))
    rec = pc.run_record(split, model_name, seed, Y, fit["preds"], F["test"], train_time_s=fit["train_time_s"],
                        predict_time_s=fit["predict_time_s"], n_params=fit["n_params"], vocab_size=len(vocab),
                        n_train_rows=len(train_f),
                        resumed_at_steps=fit["history"].get("resumed_at_steps", []))
    fit["encode"] = enc
    return rec, fit, vocab


def order_sensitivity(fit, test_formulas, n_orders, seed):
    """Mean |prediction(rewritten) - prediction(as written)| over test formulas with >= 2 elements."""
    rng = random.Random(900 + seed)
    base, rewrites = [], []
    for i, f in enumerate(test_formulas):
        for g in chemdata.formula_orders(f, n_orders, rng):
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
        toks = ["<bos>"] + chemdata.tokenize_formula(f) + ["<eos>"]
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
        for e in chemdata.parse_formula(f):
            counts[e] = counts.get(e, 0) + 1
    return sorted(counts, key=lambda e: (-counts[e], e))[:k]


# ----------------------------------------------------------------------------- main


def baselines(cfg, formulas, y, split, idx, run):
    """Ridge on element fractions (alpha on validation) and the mean."""
    Y, X = pc.parts(y, idx), pc.parts([chemdata.element_fractions(f) for f in formulas], idx)
    best = pc.ridge_best(X, Y, cfg["ridge_alphas"])
    run.log(f"{split}: ridge on element fractions, alpha {best[1]:g} (valid RMSE {best[0]:.3f})")
    test_ids = pc.pick(formulas, idx[2])
    return [pc.run_record(split, "ridge + element fractions", 0, Y, best[2], test_ids, alpha=best[1]),
            pc.run_record(split, "mean", 0, Y, pc.mean_run(Y), test_ids)]


def main():
    args, cfg, run = common.start("materials", __doc__, FULL, QUICK_OVERRIDES)
    n = cfg["n_train"] + cfg["n_valid"] + cfg["n_test"]
    data = chemdata.load_mp_formation_energy(n=n, seed=args.seed)
    formulas, y = data.formulas, data.y
    splits = make_splits(formulas, cfg, args.seed, run.extended)
    seeds = cfg["seeds_extended"] if run.extended else [args.seed]
    n_stages = 2 + len(splits)
    run.stage(1, n_stages, f"{n} formulas; splits {[tuple(map(len, i)) for i in splits.values()]}")
    elements = top_elements(pc.pick(formulas, splits["random"][0]), cfg["top_elements"])
    runs, curves, order, fits, attention = [], {}, [], [], None
    for k, (split, idx) in enumerate(splits.items()):
        run.stage(2 + k, n_stages, f"{split} split: Transformer seeds {seeds}, baselines, order sensitivity")
        test_f = pc.pick(formulas, idx[2])
        rows = cfg["extended_rows"][split] if run.extended else {"plain": seeds, "augment": []}
        for augment, row_seeds in ((None, rows["plain"]), (cfg["augment"], rows["augment"]),
                                   (PRIORS, rows.get("priors", []))):
            for s in row_seeds:
                rec, fit, vocab = transformer_run(run, cfg, formulas, y, split, idx, s, augment)
                sens = order_sensitivity(fit, test_f, cfg["n_orders"], s)
                run.log(f"{split} {rec['model']} seed {s}: test RMSE {rec['metrics']['test']['rmse']:.3f}, "
                        f"order sensitivity {sens['mean_abs_change']:.4f} {UNITS}")
                runs.append(rec)
                order.append(dict(split=split, model=rec["model"], seed=s, **sens))
                curves[f"{split}/{rec['model']}/seed{s}"] = fit["curve"]
                if augment is None:
                    fits.append((rec["metrics"]["valid"]["rmse"], split, s, fit, vocab, idx))
                if attention is None and augment is None and split == "random":
                    t0 = time.perf_counter()
                    attention = attention_by_element(fit["model"], vocab, test_f[:cfg["n_attention"]], elements)
                    run.log(f"attention by element over {attention['n_formulas']} formulas "
                            f"({time.perf_counter() - t0:.0f} s)")
        runs += baselines(cfg, formulas, y, split, idx, run)
        order.append(dict(split=split, model="ridge + element fractions", seed=0, mean_abs_change=0.0,
                          note="a function of the composition only: 0 by construction"))
    run.stage(n_stages, n_stages, "saved model, summary and checks")
    saved = save_best(fits, formulas, y, run)
    results = {
        "data": {"n": n, "task": data.task, "units": UNITS, "info": data.info,
                 "token_lengths": pc.length_stats([chemdata.tokenize_formula(f) for f in formulas])},
        "splits": {name: overlap(formulas, idx) for name, idx in splits.items()},
        "transformer": {"config": cfg["transformer"], "n_params": runs[0]["n_params"]},
        "seeds": seeds, "runs": runs, "summary": pc.summarize(runs), "curves": curves,
        "order_sensitivity": order, "attention": attention, "saved_model": saved,
        "element_features": {"names": list(chemdata.ELEMENT_FEATURE_NAMES), "source": chemdata.ELEMENT_FEATURE_SOURCE,
                             "standardized": "z-scored over the element tokens of each training vocabulary"},
        "checks": checks(runs, splits, formulas),
    }
    pc.finish(run, results)


def checks(runs, splits, formulas):
    """Self-checks that must all be True."""
    out = pc.check_records(runs, {name: len(idx[2]) for name, idx in splits.items()})
    out["mean_baseline_train_r2_is_0"] = all(abs(r["metrics"]["train"]["r2"]) < 1e-9
                                             for r in runs if r["model"] == "mean")
    if "group" in splits:
        red = [chemdata.reduced_formula(f) for f in formulas]
        sets = [{red[i] for i in ix} for ix in splits["group"]]
        out["group_split_no_formula_in_two_splits"] = not (sets[0] & sets[1] or sets[0] & sets[2]
                                                            or sets[1] & sets[2])
    return out


def save_best(fits, formulas, y, run):
    """Save the Transformer with the lowest validation RMSE (QUICK runs: beside their results)."""
    valid_rmse, split, seed, fit, vocab, idx = min(fits, key=lambda f: f[0])
    path = MODEL_PATH if not common.QUICK else os.path.join(run.out_dir, "materials_transformer.json")
    pc.save_predictor(fit["model"], path, tokenizer="formula", vocab=vocab, scaler=fit["scaler"], units=UNITS,
                      task="formation energy per atom (Materials Project)", train_items=pc.pick(formulas, idx[0]),
                      train_y=pc.pick(y, idx[0]),
                      extra={"split": split, "seed": seed, "valid_rmse": valid_rmse,
                             "formula_style": "alphabetical_explicit"})
    run.log(f"saved {split} seed {seed} (valid RMSE {valid_rmse:.3f}) -> {path}")
    return {"path": os.path.relpath(path, common.ROOT), "split": split, "seed": seed, "valid_rmse": valid_rmse}


if __name__ == "__main__":
    main()
