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
  - Transformer: TransformerEncoder 1 layer, 2 heads, d = 32, d_ff 64, sine positions, mean pooling,
    at most 128 ids per molecule (<bos> + tokens + <eos>; longer molecules are cut, counted); z-scored
    target; Adam (lr 2e-3, warmup 50 steps then 1/sqrt decay, clip 1.0), batch 8, 25 epochs.
  - MLP + Morgan: DeepChem MultitaskRegressor(n_tasks=1, n_features=1024, layer_sizes=[128, 64],
    dropouts=0.3), batch 50, lr 1e-3, 200 epochs, on 1024-bit Morgan radius-2 bits, z-scored target.
  - ridge on element fractions (H included), alpha picked on the validation RMSE.
  - mean.
* --extended: model seeds 0, 1, 2 for the Transformer and the MLP.

How to read results_hopv.json (under "results"): as results_esol.json (runs, summary, curves, checks),
plus data.token_lengths (distribution of tokens per molecule), data.n_cut (molecules cut to 128 ids),
data.duplicates, transformer.n_params.

Run:  python demos/demo_deepchem_hopv.py               (default: about 5 min on 2 cores, Python 3.11)
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

FULL = dict(transformer=dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=128, pos="sine", epochs=25,
                             batch_size=8, lr=2e-3, warmup=50, clip=1.0),
            max_tokens=128,
            mlp=dict(layer_sizes=[128, 64], dropouts=0.3, epochs=200, batch_size=50, learning_rate=1e-3,
                     n_bits=1024, radius=2),
            ridge_alphas=[1e-3, 1e-2, 0.1, 1.0], seeds_extended=[0, 1, 2])
QUICK_OVERRIDES = dict(transformer=dict(FULL["transformer"], d_model=8, epochs=1, warmup=5),
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


def transformer_run(run, cfg, tokens, y, idx, seed, smiles):
    """Train and evaluate one Transformer; returns (record, fit, vocab)."""
    T, Y, S = pc.parts(tokens, idx), pc.parts(y, idx), pc.parts(smiles, idx)
    vocab = chemdata.Vocab.build(T["train"])
    ids = {p: pc.encode(T[p], vocab, cfg["max_tokens"])[0] for p in T}
    fit = pc.train_encoder(ids, Y, cfg["transformer"], seed=seed, tag=f"hopv s{seed}", vocab_size=len(vocab),
                           pad_id=vocab.pad_id, checkpoint=run.checkpoint(f"transformer_s{seed}"), log=run.log)
    rec = pc.run_record("random", "Transformer", seed, Y, fit["preds"], S["test"],
                        train_time_s=fit["train_time_s"], predict_time_s=fit["predict_time_s"],
                        n_params=fit["n_params"], vocab_size=len(vocab))
    return rec, fit, vocab


def baselines(cfg, y, idx, smiles, fractions, run):
    """Ridge on element fractions (alpha on validation) and the mean."""
    Y, X, S = pc.parts(y, idx), pc.parts(fractions, idx), pc.parts(smiles, idx)
    best = pc.ridge_best(X, Y, cfg["ridge_alphas"])
    run.log(f"ridge on element fractions: alpha {best[1]:g} (valid RMSE {best[0]:.3f})")
    return [pc.run_record("random", "ridge + element fractions", 0, Y, best[2], S["test"], alpha=best[1]),
            pc.run_record("random", "mean", 0, Y, pc.mean_run(Y), S["test"])]


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
    runs, curves, fits, mlp_skip = [], {}, [], None
    for s in seeds:
        rec, fit, vocab = transformer_run(run, cfg, tokens, y, idx, s, smiles)
        runs.append(rec)
        curves[f"random/Transformer/seed{s}"] = fit["curve"]
        fits.append((rec["metrics"]["valid"]["rmse"], s, fit, vocab))
        out, mlp_skip = pc.deepchem_mlp(pc.parts(fps, idx), pc.parts(y, idx), cfg["mlp"], s, log=run.log)
        if out:
            runs.append(pc.run_record("random", "MLP + Morgan", s, pc.parts(y, idx), out["preds"],
                                      pc.pick(smiles, idx[2]), train_time_s=out["train_time_s"]))
    run.stage(3, 4, "baselines and the saved model")
    runs += baselines(cfg, y, idx, smiles, fractions, run)
    saved = save_best(fits, smiles, y, idx, cfg, run)
    run.stage(4, 4, "summary and checks")
    checks = pc.check_records(runs, {"random": len(idx[2])})
    checks["mean_baseline_train_r2_is_0"] = all(abs(r["metrics"]["train"]["r2"]) < 1e-9
                                               for r in runs if r["model"] == "mean")
    checks["no_molecule_in_two_splits"] = not (set(pc.pick(smiles, idx[0])) & set(pc.pick(smiles, idx[2])))
    results = {
        "data": {"n": len(smiles), "task": TASK, "units": UNITS, "info": data.info,
                 "duplicates": {k: v for k, v in dups.items() if k != "groups"},
                 "token_lengths": pc.length_stats(tokens),
                 "n_cut": sum(1 for t in tokens if len(t) + 2 > cfg["max_tokens"])},
        "splits": {"random": {"sizes": list(map(len, idx)), "splitter": "chemdata.random_split seed "
                              f"{args.seed}, canonical SMILES kept together"}},
        "deepchem_check": dc_check, "mlp": {"settings": cfg["mlp"], "skipped": mlp_skip},
        "transformer": {"config": cfg["transformer"], "n_params": runs[0]["n_params"],
                        "max_tokens": cfg["max_tokens"]},
        "seeds": seeds, "runs": runs, "summary": pc.summarize(runs), "curves": curves, "saved_model": saved,
        "checks": checks,
    }
    pc.finish(run, results)


def save_best(fits, smiles, y, idx, cfg, run):
    """Save the Transformer with the lowest validation RMSE (QUICK runs: beside their results)."""
    valid_rmse, seed, fit, vocab = min(fits, key=lambda f: f[0])
    path = MODEL_PATH if not common.QUICK else os.path.join(run.out_dir, "hopv_transformer.json")
    pc.save_predictor(fit["model"], path, tokenizer="smiles_atom", vocab=vocab, scaler=fit["scaler"], units=UNITS,
                      task=f"HOPV {TASK}", train_items=pc.pick(smiles, idx[0]), train_y=pc.pick(y, idx[0]),
                      max_tokens=cfg["max_tokens"], extra={"split": "random", "seed": seed, "valid_rmse": valid_rmse})
    run.log(f"saved seed {seed} (valid RMSE {valid_rmse:.3f}) -> {path}")
    return {"path": os.path.relpath(path, common.ROOT), "split": "random", "seed": seed, "valid_rmse": valid_rmse}


if __name__ == "__main__":
    main()
