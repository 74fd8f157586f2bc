"""Experiment 8 - HOPV15 organic photovoltaics: electrochemical gap (eV) from SMILES, a small
Transformer against DeepChem's fingerprint MLP, ridge on element fractions and the mean.

What it does
------------
* Data: ``chemdata.load_hopv("electrochemical_gap")``: 350 rows, those without a finite gap removed
  (117; 233 remain) and counted, duplicated molecules (RDKit canonical SMILES) reported.
  ``dc.molnet.load_hopv(data_dir=data/, save_dir=data/deepchem_save/)`` is loaded too when DeepChem is
  installed, and its row count, NaN count and SMILES compared with ours (``deepchem_check``).
* Split: ``chemdata.random_split`` (seed 0), 80/10/10 -> 186/23/24 (equal canonical SMILES would stay
  together; there are none to keep together if ``duplicates.n_repeats`` is 0).
* Models:
  - Transformer (the comparison row): TransformerEncoder 1 layer, 2 heads, d = 32, d_ff 64, sine
    positions, mean pooling, at most 128 ids per molecule (<bos> + tokens + <eos>; longer molecules are
    cut, counted); z-scored target; Adam (lr 2e-3, clip 1.0) with the tutorial's recipe: its "batch size
    1" taken literally (one molecule per optimiser step, no accumulation), 186 steps per epoch, 6 epochs
    (the tutorial's other property experiments) = 1,116 steps, warmup 150 steps (13 %) then 1/sqrt decay.
  - "Transformer, early stopping" (--extended): the same model trained up to 12 epochs; the weights of
    the epoch with the lowest validation RMSE seen before 3 epochs in a row fail to improve on it
    (``property_common.best_epoch``, patience 3) are kept and scored.  Its first 6 epochs are the
    comparison row's (same seed, same data order, a schedule that does not depend on the run's length).
  - MLP + Morgan: DeepChem MultitaskRegressor(n_tasks=1, n_features=1024, layer_sizes=[128, 64],
    dropouts=0.3), batch 50, lr 1e-3, 200 epochs, on 1024-bit Morgan radius-2 bits, z-scored target.
  - ridge on element fractions (H included), alpha picked on the validation RMSE from 1e-4 .. 1e4; the
    record says whether the pick is at the grid's edge and how much its test predictions vary
    (``test_pred_std_ratio`` = std(prediction) / std(target); near 0 = the mean in disguise).
  - mean.
* Paired comparisons (``results.comparisons``): every pair the reading names, a paired bootstrap over the
  24 test molecules (2,000 resamples, seeds pooled) plus the seed-spread rule.
* --extended: model seeds 0, 1, 2 for both Transformer rows and the MLP.

How to read results_hopv.json (under "results"): as results_esol.json (runs, summary, curves, checks),
plus data.token_lengths (distribution of tokens per molecule), data.n_cut (molecules cut to 128 ids),
data.duplicates, transformer.n_params, transformer.recipe (accumulation, steps, warmup share),
comparisons[*] {a, b, metric, split, diff, ci_low, ci_high, n_items, verdict}, early_stopping[*] {seed,
epoch, value, stopped_at, patience} and curves (every epoch trained).

Run:  python demos/demo_deepchem_hopv.py               (default: about 4 min on 2 cores, Python 3.11)
      python demos/demo_deepchem_hopv.py --extended
      QUICK=1 python demos/demo_deepchem_hopv.py       (smoke run; numbers meaningless)
"""
import os

import common
import property_common as pc

import chemdata

tf = common.tf

TASK = "electrochemical_gap"
UNITS = "eV"
MODEL_PATH = os.path.join(common.ROOT, "models", "hopv_transformer.json")

EARLY = "Transformer, early stopping"
FULL = dict(transformer=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=128, pos="sine", epochs=6,
                             batch_size=1, lr=2e-3, warmup=150, clip=1.0),
            early_stopping=dict(max_epochs=12, patience=3),
            max_tokens=128,
            mlp=dict(layer_sizes=[128, 64], dropouts=0.3, epochs=200, batch_size=50, learning_rate=1e-3,
                     n_bits=1024, radius=2),
            ridge_alphas=[1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1e3, 1e4], seeds_extended=[0, 1, 2])
QUICK_OVERRIDES = dict(transformer=dict(FULL["transformer"], d_model=8, epochs=1, warmup=5, batch_size=8),
                       early_stopping=dict(max_epochs=2, patience=1),
                       mlp=dict(FULL["mlp"], epochs=5), seeds_extended=[0, 1])


def deepchem_check(data, log):
    """Load HOPV through DeepChem and compare rows, NaN count and SMILES with chemdata.load_hopv()."""
    ok, info, tasks, ds = pc.deepchem_molnet("load_hopv")
    if not ok:
        return {"available": False, "reason": info}
    import math
    col = list(tasks).index(TASK)
    # DeepChem stores a missing value as y = 0 with weight w = 0
    finite = [i for i in range(len(ds)) if ds.w[i][col] != 0 and math.isfinite(float(ds.y[i][col]))]
    dc_smiles = [ds.ids[i].strip() for i in finite]
    out = {"available": True, "deepchem_version": info, "n_rows": len(ds), "n_nan": len(ds) - len(finite),
           "smiles_equal": dc_smiles == data.smiles}
    log(f"DeepChem check: {out['n_rows']} rows, {out['n_nan']} without {TASK}, SMILES equal {out['smiles_equal']}")
    return out


def transformer_run(run, cfg, tokens, y, idx, seed, smiles, early=False):
    """Train and evaluate one Transformer: the 6-epoch comparison row, or (``early``) up to
    ``early_stopping.max_epochs`` epochs with the best validation epoch's weights kept.
    Returns (record, fit, vocab)."""
    T, Y, S = pc.parts(tokens, idx), pc.parts(y, idx), pc.parts(smiles, idx)
    vocab = chemdata.Vocab.build(T["train"])
    ids = {p: pc.encode(T[p], vocab, cfg["max_tokens"])[0] for p in T}
    es = cfg["early_stopping"]
    tcfg = dict(cfg["transformer"], epochs=es["max_epochs"]) if early else cfg["transformer"]
    tag = f"{'early' if early else 'transformer'}_s{seed}"
    fit = pc.train_encoder(ids, Y, tcfg, seed=seed, tag=f"hopv {tag}", vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(tag), log=run.log, keep_best=early,
                           patience=es["patience"] if early else None)
    preds, extra = fit["preds"], {"epochs_trained": tcfg["epochs"]}
    if early:
        best = fit["best"]
        preds = best.pop("preds")
        extra.update(best_epoch=best["epoch"], stopped_at=best["stopped_at"], patience=best["patience"],
                     restored=best["restored"])
    rec = pc.run_record("random", EARLY if early else "Transformer", seed, Y, preds, S["test"],
                        train_time_s=fit["train_time_s"], predict_time_s=fit["predict_time_s"],
                        n_params=fit["n_params"], vocab_size=len(vocab), **extra)
    return rec, fit, vocab


def baselines(cfg, y, idx, smiles, fractions, run):
    """Ridge on element fractions (alpha on validation; at the grid's edge or not; spread of its test
    predictions) and the mean."""
    Y, X, S = pc.parts(y, idx), pc.parts(fractions, idx), pc.parts(smiles, idx)
    grid = cfg["ridge_alphas"]
    best = pc.ridge_best(X, Y, grid)
    edge = best[1] in (min(grid), max(grid))
    ratio = chemdata.prediction_spread(Y["test"], best[2]["test"])
    run.log(f"ridge on element fractions: alpha {best[1]:g} of {min(grid):g}..{max(grid):g}"
            f"{' (at the edge of the grid)' if edge else ''}, valid RMSE {best[0]:.3f}, "
            f"std(test prediction) / std(target) {ratio:.3f}")
    return [pc.run_record("random", "ridge + element fractions", 0, Y, best[2], S["test"], alpha=best[1],
                          alpha_grid=list(grid), alpha_at_grid_edge=edge, test_pred_std_ratio=ratio),
            pc.run_record("random", "mean", 0, Y, pc.mean_run(Y), S["test"])]


# (A, B): every claim the reading makes, on test RMSE over the same 24 molecules
COMPARISONS = [("Transformer", "mean"), ("Transformer", "MLP + Morgan"), ("Transformer", "ridge + element fractions"),
               ("MLP + Morgan", "mean"), ("ridge + element fractions", "mean"), (EARLY, "Transformer"),
               (EARLY, "mean"), (EARLY, "MLP + Morgan")]


def recipe(cfg, n_train, epochs):
    """The optimiser schedule: accumulation (samples per step), steps, warmup share."""
    t = cfg["transformer"]
    steps = -(-n_train // t["batch_size"]) * epochs
    return {"accumulation": t["batch_size"], "epochs": epochs, "steps": steps, "warmup": t["warmup"],
            "warmup_share": t["warmup"] / steps}


def model_runs(run, cfg, tokens, y, idx, smiles, fps, seeds):
    """Every seed's Transformer rows (6 epochs; in --extended also early stopping) and MLP."""
    runs, curves, fits, mlp_skip = [], {}, [], None
    for s in seeds:
        for early in ((False, True) if run.extended else (False,)):
            rec, fit, vocab = transformer_run(run, cfg, tokens, y, idx, s, smiles, early)
            runs.append(rec)
            curves[f"random/{rec['model']}/seed{s}"] = fit["curve"]
            fits.append(pc.Candidate(rec["metrics"]["valid"]["rmse"], "random", s, fit, vocab, idx, row=rec["model"]))
        out, mlp_skip = pc.deepchem_mlp(pc.parts(fps, idx), pc.parts(y, idx), cfg["mlp"], s, log=run.log)
        if out:
            runs.append(pc.run_record("random", "MLP + Morgan", s, pc.parts(y, idx), out["preds"],
                                      pc.pick(smiles, idx[2]), train_time_s=out["train_time_s"]))
    return runs, curves, fits, mlp_skip


def main():
    args, cfg, run = common.start("hopv", __doc__, FULL, QUICK_OVERRIDES)
    data = chemdata.load_hopv(TASK)
    smiles, y = data.smiles, data.y
    run.stage(1, 4, f"{len(smiles)} molecules ({data.info['n_dropped']} of {data.info['n_rows']} rows dropped): "
                    "features, duplicates, DeepChem check")
    dups = chemdata.duplicate_report(smiles, key=chemdata.canonical_smiles)
    tokens = [chemdata.tokenize_smiles(s) for s in smiles]
    fps = chemdata.morgan_fingerprints(smiles, radius=cfg["mlp"]["radius"], n_bits=cfg["mlp"]["n_bits"])
    fractions = [chemdata.molecule_element_fractions(s) for s in smiles]
    dc_check = deepchem_check(data, run.log)
    idx = chemdata.random_split(smiles, seed=args.seed, key=chemdata.canonical_smiles)
    seeds = cfg["seeds_extended"] if run.extended else [args.seed]
    run.stage(2, 4, f"split {tuple(map(len, idx))}: Transformer and MLP, seeds {seeds}")
    runs, curves, fits, mlp_skip = model_runs(run, cfg, tokens, y, idx, smiles, fps, seeds)
    run.stage(3, 4, "baselines and the saved model")
    runs += baselines(cfg, y, idx, smiles, fractions, run)
    saved = save_best(fits, smiles, y, idx, cfg, run)
    run.stage(4, 4, "comparisons, summary and checks")
    checks = pc.check_records(runs, {"random": len(idx[2])})
    checks["mean_baseline_train_r2_is_0"] = all(abs(r["metrics"]["train"]["r2"]) < 1e-9
                                               for r in runs if r["model"] == "mean")
    checks["no_molecule_in_two_splits"] = not (set(pc.pick(smiles, idx[0])) & set(pc.pick(smiles, idx[2])))
    es = cfg["early_stopping"]
    if run.extended:     # the early-stopping run repeats the comparison row's epochs first, bit for bit
        n = cfg["transformer"]["epochs"]
        checks["early_stopping_starts_as_the_comparison_row"] = all(
            [c["valid_rmse"] for c in curves[f"random/{EARLY}/seed{s}"][:n]]
            == [c["valid_rmse"] for c in curves[f"random/Transformer/seed{s}"]] for s in seeds)
    results = {
        "data": {"n": len(smiles), "task": TASK, "units": UNITS, "info": data.info,
                 "duplicates": {k: v for k, v in dups.items() if k != "groups"},
                 "token_lengths": pc.length_stats(tokens),
                 "n_cut": sum(1 for t in tokens if len(t) + 2 > cfg["max_tokens"])},
        "splits": {"random": {"sizes": list(map(len, idx)), "splitter": "chemdata.random_split seed "
                              f"{args.seed}, canonical SMILES kept together"}},
        "deepchem_check": dc_check, "mlp": {"settings": cfg["mlp"], "skipped": mlp_skip},
        "transformer": {"config": cfg["transformer"], "n_params": runs[0]["n_params"], "vocab_size": runs[0]["vocab_size"],
                        "max_tokens": cfg["max_tokens"], "early_stopping": es,
                        "recipe": recipe(cfg, len(idx[0]), cfg["transformer"]["epochs"]),
                        "recipe_early_stopping": recipe(cfg, len(idx[0]), es["max_epochs"])},
        "seeds": seeds, "runs": runs, "summary": pc.summarize(runs), "curves": curves, "saved_model": saved,
        "comparisons": [c for c in (pc.compare_models(runs, "random", a, b) for a, b in COMPARISONS) if c],
        "early_stopping": [{k: r[k] for k in ("seed", "best_epoch", "stopped_at", "patience", "restored")}
                           for r in runs if r["model"] == EARLY],
        "checks": checks,
    }
    pc.finish(run, results)


def save_best(fits, smiles, y, idx, cfg, run):
    """Save the Transformer (either row) with the lowest validation RMSE (QUICK runs: beside their results)."""
    best = pc.best_candidate(fits)
    path = MODEL_PATH if not common.QUICK else os.path.join(run.out_dir, "hopv_transformer.json")
    pc.save_predictor(best.fit["model"], path, tokenizer="smiles_atom", vocab=best.vocab, scaler=best.fit["scaler"],
                      units=UNITS, task=f"HOPV {TASK}", train_items=pc.pick(smiles, idx[0]),
                      train_y=pc.pick(y, idx[0]), max_tokens=cfg["max_tokens"],
                      extra={"split": "random", "seed": best.seed, "valid_rmse": best.valid_rmse, "row": best.row})
    run.log(f"saved {best.row} seed {best.seed} (valid RMSE {best.valid_rmse:.3f}) -> {path}")
    return {"path": os.path.relpath(path, common.ROOT), "split": "random", "seed": best.seed,
            "valid_rmse": best.valid_rmse, "row": best.row,
            "domain": pc.applicability_domain(path, smiles, y, idx, best.fit["preds"])}


if __name__ == "__main__":
    main()
