"""Experiment 6 (the tutorial's section 10.6) - ESOL aqueous solubility (log mol/L): a small Transformer
encoder on SMILES tokens against DeepChem's fingerprint MLP, ridge on the same fingerprints, the ESOL equation
and the mean, on a scaffold split and a random split (80/10/10).

What it does
------------
* Data: ``chemdata.load_esol()`` (1128 molecules).  ``dc.molnet.load_delaney(data_dir=data/,
  save_dir=data/deepchem_save/)`` is loaded too when DeepChem is installed: its SMILES must equal
  ours, its ECFP bits are compared with ``chemdata.morgan_fingerprints`` and DeepChem's
  ``ScaffoldSplitter`` with ``chemdata.scaffold_split`` (recorded under ``deepchem_check``).
* Splits: scaffold (Bemis-Murcko groups, largest first; 902/113/113) and random (seed 0).  The split
  is the same for every model seed.
* Models (per split):
  - Transformer: TransformerEncoder d = 48, 4 heads, 2 layers, d_ff 96, sine positions, mean pooling,
    atom-level SMILES tokens with <bos>/<eos>, vocabulary from the training SMILES only; z-scored
    target; Adam (lr 2e-3, warmup 60 steps then 1/sqrt decay, clip 1.0), gradient accumulated over 16
    molecules per optimiser step (57 steps per epoch on 902 molecules), 6 epochs = 342 steps; the
    recipe's 150 warmup steps would be 44 % of that run, so 60 (18 %).  Row "Transformer": the last
    epoch (the tutorial's comparison).  Row "Transformer (best valid epoch)": the same training, the
    weights of the epoch with the lowest validation RMSE (early stopping, patience 3 epochs; every
    epoch's weights are copied by ``property_common.EpochSnapshots``); its validation numbers chose it.
  - MLP + fingerprints: DeepChem MultitaskRegressor(n_tasks=1, n_features=1024, layer_sizes=[128, 64],
    dropouts=0.3), batch 50, lr 1e-3, 200 epochs, on 1024-bit ECFP4 (Morgan radius 2), z-scored target.
    Skipped with the reason recorded when DeepChem cannot be imported.
  - ridge on the same fingerprints (pure-Python closed form), alpha picked on the validation RMSE.
  - ESOL equation, published: the dataset's own "ESOL predicted" column (fit by Delaney on all data).
  - ESOL equation, refit: the same 4-descriptor linear model (Crippen logP, MW, rotatable bonds,
    aromatic proportion, RDKit) fitted by least squares on each training split.
  - mean: the training mean.
* --extended: model seeds 0, 1, 2 for the Transformer and the MLP, and the randomized-SMILES rows
  ("Transformer + random SMILES"): n = 3 random SMILES per training molecule (the canonical one kept
  too), 2 epochs over the augmented set (= 8 passes over each molecule, 1.3x the plain run's samples),
  test prediction = mean over m = 10 random SMILES plus the canonical one.  6 plain + 6 augmented
  trainings; measured: 4.2 min per plain training and 10.3 min per augmented one (training, then
  predicting 11 SMILES per molecule of every split), 92 min in all on a 90-Mflop/s host.
* The saved model (--extended, QUICK, or --saved-model into an existing results file; ``saved_predictor``):
  the Transformer's recipe on the scaffold split (the headline's), trained on RDKit canonical SMILES (what the
  predictor reads) with seeds 0, 1, 2, each at its best validation epoch, written to
  models/esol_transformer.json as one ensemble with a 90 % split-conformal interval calibrated on the
  validation split; its errors, coverage, skill and cost measured through ``predictor.load_predictor``.  Its
  members are the extra row "Transformer on canonical SMILES (the saved ensemble's members)".

How to read results_esol.json (under "results")
--------------------------------------------------
runs[*]        {split, model, seed, metrics{train,valid,test}{rmse,mae,r2,pearson,n}, test_ids (row indices
               into the data, the same for every model of a split), y_true, y_pred, test_bias (mean of
               predicted - true), train_time_s, epoch, ...}: every metric can be recomputed from y_true/y_pred
comparisons[*] {a, b, metric, split, diff, ci_low, ci_high, n_items, verdict, ...}: test RMSE of a minus b,
               95 % paired-bootstrap interval (2000 resamples of the test molecules, seeds pooled);
               verdict lower/higher only when the interval excludes 0 AND the gap exceeds the seed spread
summary[*]     mean, std and range (max - min) over seeds per (split, model)
curves         per-epoch train/valid RMSE (log mol/L) of every Transformer run
data, splits, deepchem_check, transformer, mlp, saved_model, timings, checks (must all be True)

Run:  python demos/demo_deepchem_esol.py               (default: 9 min measured on 2 cores, Python 3.11)
      python demos/demo_deepchem_esol.py --extended    (92 min measured, Python 3.11, 90-Mflop/s host)
      python demos/demo_deepchem_esol.py --rescore     (summary and comparisons again from the stored predictions;
                                                      recorded under "updates")
      python demos/demo_deepchem_esol.py --saved-model (the saved model into the results file; "updates")
      QUICK=1 python demos/demo_deepchem_esol.py       (smoke run on 150 molecules; numbers meaningless)
"""
import csv
import os
import random
import time

import common
import property_common as pc
import saved_predictor as sp

import chemdata
import evaluation
import property_features

core = common.core

UNITS = "log10(mol/L)"
PUBLISHED_ROW = "ESOL equation (published, fitted on all molecules)"   # test molecules included
BEST_ROW = "Transformer (best valid epoch)"     # the epoch early stopping keeps
SAVED_ROW = "Transformer on canonical SMILES (the saved ensemble's members)"   # saved_predictor's rule
# (a, b) pairs scored on the same test molecules: results.comparisons (paired bootstrap + seed spread)
COMPARISONS = [("Transformer", PUBLISHED_ROW), ("Transformer", "ESOL equation (refit)"),
               ("Transformer", "MLP + fingerprints"), ("Transformer", "ridge + fingerprints"),
               ("Transformer", "mean"), (BEST_ROW, PUBLISHED_ROW),
               (BEST_ROW, "ESOL equation (refit)"), (BEST_ROW, "MLP + fingerprints"),
               ("Transformer + random SMILES", "Transformer"), ("Transformer + random SMILES", "ESOL equation (refit)"),
               (SAVED_ROW, BEST_ROW), (SAVED_ROW, "mean")]
PUBLISHED_COLUMN = "ESOL predicted log solubility in mols per litre"
MODEL_PATH = os.path.join(common.ROOT, "models", "esol_transformer.json")
SAVED = sp.Study("esol", MODEL_PATH, "smiles_atom", UNITS, "ESOL log solubility", "scaffold", SAVED_ROW)

FULL = dict(n_mols=None, splits=["scaffold", "random"],
            transformer=dict(d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=256, pos="sine", epochs=6,
                             batch_size=16, lr=2e-3, warmup=60, clip=1.0, patience=3),
            mlp=dict(layer_sizes=[128, 64], dropouts=0.3, epochs=200, batch_size=50, learning_rate=1e-3,
                     n_bits=1024, radius=2),
            ridge_alphas=[1.0, 10.0, 100.0],
            seeds_extended=[0, 1, 2],
            augment=dict(n_random=3, m_test=10, epochs=2),
            saved_seeds=list(sp.SEEDS))
QUICK_OVERRIDES = dict(n_mols=150, transformer=dict(FULL["transformer"], d_model=16, n_heads=2, n_layers=1,
                                                    d_ff=32, epochs=2, warmup=5, patience=1),
                       mlp=dict(FULL["mlp"], epochs=5), ridge_alphas=[10.0], seeds_extended=[0, 1],
                       augment=dict(n_random=2, m_test=2, epochs=1), saved_seeds=[0, 1])


# ----------------------------------------------------------------------------- data


def read_published_esol(smiles):
    """The dataset's "ESOL predicted" column, aligned with chemdata.load_esol()'s SMILES."""
    with open(chemdata.data_path("delaney-processed.csv"), newline="", encoding="utf-8") as f:
        by_smiles = {row["smiles"].strip(): float(row[PUBLISHED_COLUMN]) for row in csv.DictReader(f)}
    return [by_smiles[s] for s in smiles]


def deepchem_check(smiles, log):
    """Load ESOL through DeepChem and compare with the full chemdata.load_esol(): SMILES, ECFP4 bits
    (against chemdata.morgan_fingerprints) and DeepChem's ScaffoldSplitter (against scaffold_split)."""
    ok, info, tasks, ds = pc.deepchem_molnet("load_delaney")
    if not ok:
        return {"available": False, "reason": info}
    import deepchem as dc
    dc_smiles = [s.strip() for s in ds.ids]
    out = {"available": True, "deepchem_version": info, "tasks": list(tasks), "n": len(dc_smiles),
           "smiles_equal": dc_smiles == smiles}
    fps = chemdata.morgan_fingerprints(smiles, radius=2, n_bits=1024)
    out["ecfp_rows_identical"] = sum(1 for i, f in enumerate(fps) if list(map(int, ds.X[i])) == f) / len(fps)
    tr, va, te = dc.splits.ScaffoldSplitter().split(ds, 0.8, 0.1, 0.1)
    ours = chemdata.scaffold_split(smiles)
    out["scaffold_split_equal"] = [sorted(map(int, x)) for x in (tr, va, te)] == [sorted(x) for x in ours]
    out["deepchem_scaffold_sizes"] = [len(tr), len(va), len(te)]
    log(f"DeepChem check: SMILES equal {out['smiles_equal']}, ECFP rows identical "
        f"{out['ecfp_rows_identical']:.3f}, scaffold split equal {out['scaffold_split_equal']}")
    return out


def make_splits(smiles, names, seed):
    """{name: (train_idx, valid_idx, test_idx)} for 'scaffold' and 'random' (seed ``seed``)."""
    out = {}
    for name in names:
        out[name] = chemdata.scaffold_split(smiles) if name == "scaffold" else \
            chemdata.random_split(len(smiles), seed=seed)
    return out


# ----------------------------------------------------------------------------- models


def with_bias(rec):
    """The record with its test bias: mean(predicted - true) in log10(mol/L) (a per-seed constant offset)."""
    rec["test_bias"] = sum(p - t for p, t in zip(rec["y_pred"], rec["y_true"])) / len(rec["y_true"])
    return rec


def transformer_run(run, cfg, smiles, y, split_name, split_idx, seed, tokens_override=None):
    """Train and evaluate one Transformer; returns (record, fit dict, vocab)."""
    S, Y = pc.parts(smiles, split_idx), pc.parts(y, split_idx)
    toks = tokens_override or {p: [chemdata.tokenize_smiles(s) for s in S[p]] for p in S}
    vocab = chemdata.Vocab.build(toks["train"])
    ids = {}
    for p in ("train", "valid", "test"):
        vocab.unk_count = 0
        ids[p], _ = pc.encode(toks[p], vocab)
        ids[p + "_unk"] = vocab.unk_count
    unk = {p: ids.pop(p + "_unk") for p in ("train", "valid", "test")}
    fit = pc.train_encoder(ids, Y, cfg["transformer"], seed=seed, tag=f"esol {split_name} s{seed}",
                           vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(f"{split_name}_transformer_s{seed}"), log=run.log,
                           keep_best=True, patience=cfg["transformer"]["patience"])
    common_extra = dict(train_time_s=fit["train_time_s"], n_params=fit["n_params"], vocab_size=len(vocab),
                        unk_tokens=unk)
    rec = pc.run_record(split_name, "Transformer", seed, Y, fit["preds"], split_idx[2],
                        predict_time_s=fit["predict_time_s"], epoch=fit["curve"][-1]["epoch"], **common_extra)
    b = fit["best"]
    best = pc.run_record(split_name, BEST_ROW, seed, Y, b["preds"], split_idx[2], epoch=b["epoch"],
                         stopped_at=b["stopped_at"], patience=b["patience"], restored=b["restored"], **common_extra)
    return [with_bias(rec), with_bias(best)], fit, vocab


def augmented_run(run, cfg, smiles, y, split_name, split_idx, seed):
    """Transformer trained on n random SMILES per molecule (+ the canonical one), test = mean over m."""
    aug = cfg["augment"]
    rng = random.Random(1000 + seed)
    S, Y = pc.parts(smiles, split_idx), pc.parts(y, split_idx)
    t0 = time.perf_counter()
    train_s, train_y = [], []
    for s, v in zip(S["train"], Y["train"]):
        for variant in [s] + property_features.randomized_smiles(s, aug["n_random"], rng):
            train_s.append(variant)
            train_y.append(v)
    vocab = chemdata.Vocab.build([chemdata.tokenize_smiles(s) for s in train_s])
    def enc(lst):
        return pc.encode([chemdata.tokenize_smiles(s) for s in lst], vocab)[0]
    tcfg = dict(cfg["transformer"], epochs=aug["epochs"])
    fit = pc.train_encoder({"train": enc(train_s), "valid": enc(S["valid"]), "test": enc(S["test"])},
                           {"train": train_y, "valid": Y["valid"], "test": Y["test"]}, tcfg, seed=seed,
                           tag=f"esol {split_name} aug s{seed}", vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(f"{split_name}_augmented_s{seed}"), log=run.log)
    preds = {}
    for p in ("train", "valid", "test"):
        variants = [[s] + property_features.randomized_smiles(s, aug["m_test"], rng) for s in S[p]]
        flat = pc.predict_z(fit["model"], enc([v for vs in variants for v in vs]))
        k = aug["m_test"] + 1
        preds[p] = fit["scaler"].inverse([sum(flat[i * k:(i + 1) * k]) / k for i in range(len(S[p]))])
    rec = pc.run_record(split_name, "Transformer + random SMILES", seed, Y, preds, split_idx[2],
                        train_time_s=time.perf_counter() - t0, n_params=fit["n_params"],
                        n_train_strings=len(train_s), n_random=aug["n_random"], m_test=aug["m_test"])
    return rec, fit


def baseline_runs(cfg, split_name, split_idx, y, fps, published, descriptors, run):
    """MLP (seed 0 here), ridge on fingerprints, the ESOL equation twice, and the mean."""
    Y = pc.parts(y, split_idx)
    X = pc.parts(fps, split_idx)
    test_ids = split_idx[2]
    recs = []
    best = pc.ridge_best(X, Y, cfg["ridge_alphas"])
    run.log(f"{split_name}: ridge on fingerprints, alpha {best[1]:g} (valid RMSE {best[0]:.3f})")
    recs.append(pc.run_record(split_name, "ridge + fingerprints", 0, Y, best[2], test_ids, alpha=best[1]))
    recs.append(pc.run_record(split_name, PUBLISHED_ROW, 0, Y, pc.parts(published, split_idx),
                              test_ids))
    D = pc.parts(descriptors, split_idx)
    model = evaluation.ridge_fit(D["train"], Y["train"], alpha=1e-8)
    recs.append(pc.run_record(split_name, "ESOL equation (refit)", 0, Y,
                              {p: evaluation.ridge_predict(model, D[p]) for p in D}, test_ids,
                              coefficients={"intercept": model.intercept,
                                            **dict(zip(["logP", "MW", "rotatable_bonds", "aromatic_proportion"],
                                                       model.weights))}))
    recs.append(pc.run_record(split_name, "mean", 0, Y, pc.mean_run(Y), test_ids))
    return recs


def mlp_run(cfg, split_name, split_idx, y, fps, seed, run):
    """DeepChem MLP record, or (None, reason)."""
    Y, X = pc.parts(y, split_idx), pc.parts(fps, split_idx)
    out, reason = pc.deepchem_mlp(X, Y, cfg["mlp"], seed, log=run.log)
    if out is None:
        return None, reason
    return pc.run_record(split_name, "MLP + fingerprints", seed, Y, out["preds"], split_idx[2],
                         train_time_s=out["train_time_s"]), None


# ----------------------------------------------------------------------------- main


def rescore(payload):
    """--rescore: ``results.summary``, ``comparisons`` and ``comparisons_within_seed`` again from the stored run
    records (nothing is trained; a file written before the within-seed test gains it)."""
    r = payload["results"]
    splits = list(dict.fromkeys(x["split"] for x in r["runs"]))
    r["summary"] = pc.summarize(r["runs"])
    r["comparisons"], r["comparisons_within_seed"] = comparisons(r["runs"], splits), within_seed(r["runs"], splits)


def extra_args(p):
    pc.rescore_arg(p)
    p.add_argument("--saved-model", action="store_true",
                   help="train the saved model (3 seeds on canonical SMILES, scaffold split), write it to models/ "
                        "and measure it through the predictor, into the existing results file; recorded under "
                        "'updates'")


def main():
    args, cfg, run = common.start("esol", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    if args.rescore:
        common.update_results(run.path, pc.RESCORED, rescore)
        return run.log(f"updated {run.path}")
    if args.saved_model:
        common.update_results(run.path, ADDED_SAVED, lambda payload: add_saved_model(run, cfg, payload))
        return run.log(f"updated {run.path}")
    seed = args.seed
    data, smiles, y = load(cfg, seed)
    n_stages = 4 + len(cfg["splits"])
    run.stage(1, n_stages, f"features of {len(smiles)} molecules (ECFP4 {cfg['mlp']['n_bits']} bits, "
                           "ESOL descriptors)")
    fps = chemdata.morgan_fingerprints(smiles, radius=cfg["mlp"]["radius"], n_bits=cfg["mlp"]["n_bits"])
    descriptors = [property_features.esol_descriptors(s) for s in smiles]
    published = read_published_esol(smiles)
    splits = make_splits(smiles, cfg["splits"], seed)
    run.stage(2, n_stages, "DeepChem loader and splitter check")
    dc_check = deepchem_check(data.smiles, run.log)
    seeds = cfg["seeds_extended"] if run.extended else [seed]
    runs, curves, mlp_skip = [], {}, None
    for k, (name, idx) in enumerate(splits.items()):
        run.stage(3 + k, n_stages, f"{name} split {tuple(map(len, idx))}: Transformer seeds {seeds}, baselines")
        for s in seeds:
            recs, fit, _ = transformer_run(run, cfg, smiles, y, name, idx, s)
            runs += recs
            curves[f"{name}/Transformer/seed{s}"] = fit["curve"]
            mrec, mlp_skip = mlp_run(cfg, name, idx, y, fps, s, run)
            if mrec:
                runs.append(with_bias(mrec))
        runs += [with_bias(r) for r in baseline_runs(cfg, name, idx, y, fps, published, descriptors, run)]
        if args.extended:
            for s in seeds:
                rec, fit = augmented_run(run, cfg, smiles, y, name, idx, s)
                runs.append(with_bias(rec))
                curves[f"{name}/Transformer + random SMILES/seed{s}"] = fit["curve"]
    run.stage(n_stages - 1, n_stages, "the saved model: an ensemble on canonical SMILES, measured through the predictor"
              if run.extended or common.QUICK else "the saved model: skipped (--extended or --saved-model trains it)")
    saved, saved_runs = saved_model(run, cfg, smiles, y, splits)
    runs += [with_bias(x) for x in saved_runs]
    run.stage(n_stages, n_stages, "summary and checks")
    sizes = {name: len(idx[2]) for name, idx in splits.items()}
    results = {
        "data": {"n": len(smiles), "n_full": len(data.smiles), "task": data.task, "units": UNITS,
                 "info": data.info, "token_lengths": pc.length_stats([chemdata.tokenize_smiles(s) for s in smiles])},
        "splits": {name: {"sizes": list(map(len, idx))} for name, idx in splits.items()},
        "deepchem_check": dc_check, "mlp": {"settings": cfg["mlp"], "skipped": mlp_skip},
        "transformer": {"config": cfg["transformer"], "n_params": runs[0]["n_params"]},
        "seeds": seeds, "runs": runs, "summary": pc.summarize(runs), "curves": curves, "saved_model": saved,
        "comparisons": comparisons(runs, list(splits)), "comparisons_within_seed": within_seed(runs, list(splits)),
        "checks": dict(check(runs, sizes, dc_check), **saved.get("checks", {})),
    }
    pc.finish(run, results)


def comparisons(runs, splits):
    """results.comparisons: test RMSE of every pair in COMPARISONS present on a split (seeds pooled)."""
    out = [pc.compare_models(runs, split, a, b, "rmse") for split in splits for a, b in COMPARISONS]
    return [c for c in out if c]


def within_seed(runs, splits):
    """results.comparisons_within_seed: the best validation epoch against the last epoch of the same training,
    paired per seed over the test molecules (the seed spread does not bear on a gap inside one training)."""
    return [c for split in splits for c in pc.per_seed_comparisons(runs, split, BEST_ROW, "Transformer")]


def load(cfg, seed):
    """(dataset, SMILES, targets): every molecule, or the seeded subset of ``n_mols`` (QUICK)."""
    data = chemdata.load_esol()
    smiles, y = data.smiles, data.y
    if cfg["n_mols"]:
        order = list(range(len(smiles)))
        random.Random(seed).shuffle(order)
        keep = sorted(order[:cfg["n_mols"]])
        smiles, y = pc.pick(smiles, keep), pc.pick(y, keep)
    return data, smiles, y


SKIPPED = sp.skipped_note("models/esol_transformer.json")
ADDED_SAVED = sp.added_note("3 seeds on canonical SMILES, scaffold split", "models/esol_transformer.json")


def saved_model(run, cfg, smiles, y, splits, force=False):
    """(results.saved_model, the members' run records): ``saved_predictor.build`` on the scaffold split (the
    headline's) in --extended and QUICK runs, or when ``force``d; a record saying why not otherwise."""
    if not (force or run.extended or common.QUICK):
        return {"skipped": SKIPPED}, []
    idx = splits[SAVED.split]
    return sp.build(run, SAVED, cfg["transformer"], smiles, y, idx, idx[2], seeds=cfg["saved_seeds"])


def add_saved_model(run, cfg, payload):
    """--saved-model: the saved model into an existing results file (``update_results`` records the call)."""
    r = payload["results"]
    _, smiles, y = load(dict(cfg, n_mols=payload["config"]["n_mols"]), payload["seed"])
    splits = make_splits(smiles, list(r["splits"]), payload["seed"])
    r["saved_model"], new = saved_model(run, cfg, smiles, y, splits, force=True)
    r["runs"] = sp.replace_rows(r["runs"], SAVED.row, [with_bias(x) for x in new])
    r["summary"] = pc.summarize(r["runs"])
    rescore(payload)
    r["checks"] = dict(check(r["runs"], {k: v["sizes"][2] for k, v in r["splits"].items()}, r["deepchem_check"]),
                       **r["saved_model"]["checks"])
    payload["config"]["saved_seeds"] = cfg["saved_seeds"]


def check(runs, sizes, dc_check):
    """Self-checks that must all be True."""
    out = pc.check_records(runs, sizes)
    mean_train = [r["metrics"]["train"]["r2"] for r in runs if r["model"] == "mean"]
    out["mean_baseline_train_r2_is_0"] = all(abs(v) < 1e-9 for v in mean_train)
    if dc_check.get("available"):
        out["deepchem_smiles_equal"] = dc_check["smiles_equal"]
    return out


if __name__ == "__main__":
    main()
