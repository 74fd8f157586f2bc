"""Experiment 8 (the tutorial's section 10.8) - HOPV15 organic photovoltaics: electrochemical gap (eV) from
SMILES, a small Transformer against DeepChem's fingerprint MLP, ridge on element fractions and the mean.

What it does
------------
* Data: ``chemdata.load_hopv("electrochemical_gap")``: 350 rows, those without a finite gap removed
  (117; 233 remain) and counted, duplicated molecules (RDKit canonical SMILES) reported.
  ``dc.molnet.load_hopv(data_dir=data/, save_dir=data/deepchem_save/)`` is loaded too when DeepChem is
  installed, and its row count, NaN count and SMILES compared with ours (``deepchem_check``).
* Split: ``chemdata.random_split`` (seed 0), 80/10/10 -> 186/23/24 (equal canonical SMILES would stay
  together; there are none to keep together if ``duplicates.n_repeats`` is 0).
* Models:
  - Transformer (the comparison row): TransformerEncoder in the tutorial's shape (1 layer, 2 heads, d_ff = 2d,
    sine positions, mean pooling, at most 128 ids per molecule: <bos> + tokens + <eos>; longer molecules are
    cut, counted) at the width d whose parameter count comes nearest the tutorial's "~30k" (``tutorial_width``;
    its stated d = 32 gives about 10k); z-scored target; Adam (lr 2e-3, clip 1.0), gradients of 16 molecules
    accumulated per step as in experiment 6 (12 steps per epoch, 6 epochs = 72 steps), warmup 12 steps (one
    epoch; the recipe's 150 would outlast the run) then 1/sqrt decay.
  - SMALL "Transformer, d = 32, 1 sample per Adam step" (--extended; the comparison row before): the
    tutorial's stated d = 32, d_ff 64 (9,729 parameters), its "batch size 1" taken literally (one molecule
    per optimiser step), 6 epochs = 1,116 steps, warmup 150 (13 %).
  - SMALL_EARLY "Transformer, d = 32, early stopping" (--extended): that model trained up to 12 epochs; the
    weights of the epoch with the lowest validation RMSE seen before 3 epochs in a row fail to improve on it
    (``property_common.best_epoch``, patience 3) are kept and scored.  Its first 6 epochs are SMALL's (same
    seed, same data order, a schedule that does not depend on the run's length).
  - MLP + Morgan: DeepChem MultitaskRegressor(n_tasks=1, n_features=1024, layer_sizes=[128, 64],
    dropouts=0.3), batch 50, lr 1e-3, 200 epochs, on 1024-bit Morgan radius-2 bits, z-scored target.
  - ridge on element fractions (H included), alpha picked on the validation RMSE from 1e-4 .. 1e4; the
    record says whether the pick is at the grid's edge and how much its test predictions vary
    (``test_pred_std_ratio`` = std(prediction) / std(target); near 0 = the mean in disguise).
  - mean.
* Paired comparisons (``results.comparisons``): every pair the reading names, a paired bootstrap over the
  24 test molecules (2,000 resamples, seeds pooled) plus the seed-spread rule.
* --extended: model seeds 0, 1, 2 for the three Transformer rows and the MLP.
* The saved model (--extended, QUICK, or --saved-model into an existing results file; ``saved_predictor``): the
  comparison row's recipe trained on RDKit canonical SMILES (what the predictor reads), seeds 0, 1, 2, each at
  its best validation epoch, written to models/hopv_transformer.json as one ensemble with a 90 % split-conformal
  interval (validation split); errors, skill against the training mean (paired, test), coverage and cost
  measured through ``predictor.load_predictor``.  Its members are the extra row SAVED_ROW.
* --add-tutorial-size: into an existing results file whose comparison row is still the d = 32 one-sample row
  (results written before the row changed): relabel its rows SMALL / SMALL_EARLY, train the ~30k comparison
  row (every seed of the file) and recompute the summary, comparisons and checks; recorded under "updates".

How to read results_hopv.json (under "results"): as results_esol.json (runs, summary, curves, checks),
plus data.token_lengths (distribution of tokens per molecule), data.n_cut (molecules cut to 128 ids),
data.duplicates, transformer.config / n_params / tutorial_params / recipe (accumulation, steps, warmup share)
of the comparison row, transformer.small (the d = 32 variant's config, n_params, recipe and
recipe_early_stopping), comparisons[*] {a, b, metric, split, diff, ci_low, ci_high, n_items, verdict},
early_stopping[*] {seed, best_epoch, stopped_at, patience, restored} of the d = 32 early-stopping row, curves
(every epoch trained) and updates (later additions: what, commit, wall time).

Run:  python demos/demo_deepchem_hopv.py               (default: one comparison-row training, 5.7 min with one
                                                        worker on a busy 2-core host, Python 3.11)
      python demos/demo_deepchem_hopv.py --extended
      python demos/demo_deepchem_hopv.py --add-tutorial-size
      python demos/demo_deepchem_hopv.py --saved-model  (the saved model into the results file; "updates")
      python demos/demo_deepchem_hopv.py --rescore     (summary, comparisons, checks again from the stored predictions;
                                                        "updates")
      QUICK=1 python demos/demo_deepchem_hopv.py       (smoke run; numbers meaningless)
"""
import glob
import os

import common
import property_common as pc
import saved_predictor as sp

import chemdata
import property_features

core = common.core

TASK = "electrochemical_gap"
UNITS = "eV"
MODEL_PATH = os.path.join(common.ROOT, "models", "hopv_transformer.json")

PLAIN = "Transformer"
SMALL = "Transformer, d = 32, 1 sample per Adam step"       # the comparison row before; a labelled variant
SMALL_EARLY = "Transformer, d = 32, early stopping"
SAVED_ROW = "Transformer on canonical SMILES (the saved ensemble's members)"   # saved_predictor's rule
OLD_LABELS = {PLAIN: SMALL, "Transformer, early stopping": SMALL_EARLY}   # --add-tutorial-size relabels these
TUTORIAL_PARAMS = 30_000      # the tutorial's "~30k parameters"
FULL = dict(transformer=dict(d_model="nearest_30k", n_heads=2, n_layers=1, d_ff="2d", max_len=128, pos="sine",
                             epochs=6, batch_size=16, lr=2e-3, warmup=12, clip=1.0),
            small=dict(d_model=32, d_ff=64, batch_size=1, warmup=150),
            early_stopping=dict(max_epochs=12, patience=3),
            max_tokens=128,
            mlp=dict(layer_sizes=[128, 64], dropouts=0.3, epochs=200, batch_size=50, learning_rate=1e-3,
                     n_bits=1024, radius=2),
            ridge_alphas=[1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1e3, 1e4], seeds_extended=[0, 1, 2],
            saved_seeds=list(sp.SEEDS))
QUICK_OVERRIDES = dict(transformer=dict(FULL["transformer"], d_model=8, d_ff=16, epochs=1, warmup=2),
                       small=dict(FULL["small"], d_model=8, d_ff=16, batch_size=8, warmup=5),
                       early_stopping=dict(max_epochs=2, patience=1),
                       mlp=dict(FULL["mlp"], epochs=5), seeds_extended=[0, 1], saved_seeds=[0, 1])
SAVED = sp.Study("hopv", MODEL_PATH, "smiles_atom", UNITS, f"HOPV {TASK}", "random", SAVED_ROW, FULL["max_tokens"])


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


def tutorial_width(cfg, vocab_size, target=TUTORIAL_PARAMS):
    """The comparison row's model config: the tutorial's shape (1 layer, 2 heads, d_ff = 2d, sine positions) at
    the width d, a multiple of the head count, whose parameter count comes nearest ``target`` (the tutorial's
    "~30k"; its stated d = 32 gives about 10k).  A config with numbers for d_model and d_ff is kept."""
    t = dict(cfg)
    if t["d_model"] == "nearest_30k":
        def count(d):
            return core.param_count(core.TransformerEncoder(vocab_size, d_model=d, n_heads=t["n_heads"],
                                                        n_layers=t["n_layers"], d_ff=2 * d, max_len=8))
        t["d_model"] = min(range(t["n_heads"], 129, t["n_heads"]), key=lambda d: (abs(count(d) - target), d))
    if t["d_ff"] == "2d":
        t["d_ff"] = 2 * t["d_model"]
    return t


def row_config(cfg, row, vocab_size):
    """The training config of a Transformer row: PLAIN (``tutorial_width``), SMALL or SMALL_EARLY (``small``
    over it; SMALL_EARLY for up to ``early_stopping.max_epochs`` epochs)."""
    base = tutorial_width(cfg["transformer"], vocab_size)
    if row == PLAIN:
        return base
    t = dict(base, **cfg["small"])
    return dict(t, epochs=cfg["early_stopping"]["max_epochs"]) if row == SMALL_EARLY else t


def transformer_run(run, cfg, tokens, y, idx, seed, smiles, row=PLAIN):
    """Train and evaluate one Transformer row (PLAIN, SMALL or SMALL_EARLY, whose best validation epoch's
    weights are kept).  Returns (record, fit, vocab)."""
    T, Y, S = pc.parts(tokens, idx), pc.parts(y, idx), pc.parts(smiles, idx)
    vocab = chemdata.Vocab.build(T["train"])
    ids = {p: pc.encode(T[p], vocab, cfg["max_tokens"])[0] for p in T}
    es, early = cfg["early_stopping"], row == SMALL_EARLY
    tcfg = row_config(cfg, row, len(vocab))
    tag = {PLAIN: "transformer", SMALL: "small", SMALL_EARLY: "small_early"}[row] + f"_s{seed}"
    fit = pc.train_encoder(ids, Y, tcfg, seed=seed, tag=f"hopv {tag}", vocab_size=len(vocab), pad_id=vocab.pad_id,
                           checkpoint=run.checkpoint(tag), log=run.log, keep_best=early,
                           patience=es["patience"] if early else None)
    preds, extra = fit["preds"], {"epochs_trained": tcfg["epochs"], "d_model": tcfg["d_model"],
                                  "accumulation": tcfg["batch_size"]}
    if early:
        best = fit["best"]
        preds = best.pop("preds")
        extra.update(best_epoch=best["epoch"], stopped_at=best["stopped_at"], patience=best["patience"],
                     restored=best["restored"])
    rec = pc.run_record("random", row, seed, Y, preds, S["test"],
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
COMPARISONS = [(PLAIN, "mean"), (PLAIN, "MLP + Morgan"), (PLAIN, "ridge + element fractions"),
               ("MLP + Morgan", "mean"), ("ridge + element fractions", "mean"), (SMALL, PLAIN), (SMALL, "mean"),
               (SMALL_EARLY, SMALL), (SMALL_EARLY, "mean"), (SMALL_EARLY, "MLP + Morgan"), (SAVED_ROW, "mean"),
               (SAVED_ROW, PLAIN)]


def recipe(t, n_train, epochs):
    """The optimiser schedule of training config ``t``: accumulation (samples per step), steps, warmup share."""
    steps = -(-n_train // t["batch_size"]) * epochs
    return {"accumulation": t["batch_size"], "epochs": epochs, "steps": steps, "warmup": t["warmup"],
            "warmup_share": t["warmup"] / steps}


def model_runs(run, cfg, tokens, y, idx, smiles, fps, seeds):
    """Every seed's Transformer rows (PLAIN; in --extended also SMALL and SMALL_EARLY) and MLP."""
    runs, curves, mlp_skip = [], {}, None
    for s in seeds:
        for row in ((PLAIN, SMALL, SMALL_EARLY) if run.extended else (PLAIN,)):
            rec, fit, _ = transformer_run(run, cfg, tokens, y, idx, s, smiles, row)
            runs.append(rec)
            curves[f"random/{rec['model']}/seed{s}"] = fit["curve"]
        out, mlp_skip = pc.deepchem_mlp(pc.parts(fps, idx), pc.parts(y, idx), cfg["mlp"], s, log=run.log)
        if out:
            runs.append(pc.run_record("random", "MLP + Morgan", s, pc.parts(y, idx), out["preds"],
                                      pc.pick(smiles, idx[2]), train_time_s=out["train_time_s"]))
    return runs, curves, mlp_skip


def derived(r, cfg, smiles, idx, seeds):
    """What the results hold beside the records, recomputed from ``r["runs"]`` and ``r["curves"]``: the models'
    configs and schedules, summary, comparisons, early-stopping choices and checks."""
    runs, curves, es = r["runs"], r["curves"], cfg["early_stopping"]
    plain = next(x for x in runs if x["model"] == PLAIN)
    tcfg = row_config(cfg, PLAIN, plain["vocab_size"])
    small = row_config(cfg, SMALL, plain["vocab_size"])
    checks = pc.check_records(runs, {"random": len(idx[2])})
    checks["mean_baseline_train_r2_is_0"] = all(abs(x["metrics"]["train"]["r2"]) < 1e-9
                                               for x in runs if x["model"] == "mean")
    checks["no_molecule_in_two_splits"] = not (set(pc.pick(smiles, idx[0])) & set(pc.pick(smiles, idx[2])))
    checks["comparison_row_near_tutorial_size"] = abs(plain["n_params"] - TUTORIAL_PARAMS) < 0.1 * TUTORIAL_PARAMS \
        or common.QUICK
    if any(x["model"] == SMALL_EARLY for x in runs):   # the early-stopping run repeats SMALL's epochs, bit for bit
        checks["early_stopping_starts_as_the_small_row"] = all(
            [c["valid_rmse"] for c in curves[f"random/{SMALL_EARLY}/seed{s}"][:small["epochs"]]]
            == [c["valid_rmse"] for c in curves[f"random/{SMALL}/seed{s}"]] for s in seeds)
    small_run = next((x for x in runs if x["model"] == SMALL), None)
    r.update({
        "transformer": {"config": tcfg, "n_params": plain["n_params"], "vocab_size": plain["vocab_size"],
                        "tutorial_params": TUTORIAL_PARAMS, "max_tokens": cfg["max_tokens"], "early_stopping": es,
                        "recipe": recipe(tcfg, len(idx[0]), tcfg["epochs"]),
                        "small": {"config": small, "n_params": small_run["n_params"] if small_run else None,
                                  "recipe": recipe(small, len(idx[0]), small["epochs"]),
                                  "recipe_early_stopping": recipe(small, len(idx[0]), es["max_epochs"])}},
        "seeds": seeds, "summary": pc.summarize(runs),
        "comparisons": [c for c in (pc.compare_models(runs, "random", a, b) for a, b in COMPARISONS) if c],
        "early_stopping": [{k: x[k] for k in ("seed", "best_epoch", "stopped_at", "patience", "restored")}
                           for x in runs if x["model"] == SMALL_EARLY],
        "checks": checks})
    return r


def main():
    args, cfg, run = common.start("hopv", __doc__, FULL, QUICK_OVERRIDES, extra=extra_args)
    data = chemdata.load_hopv(TASK)
    smiles, y = data.smiles, data.y
    if args.rescore:
        common.update_results(run.path, RESCORED, lambda payload: rescore(payload, smiles))
        return run.log(f"updated {run.path}")
    if args.add_tutorial_size:
        add_tutorial_size(run, cfg, smiles, y)
        return run.log(f"updated {run.path}")
    if args.saved_model:
        common.update_results(run.path, ADDED_SAVED, lambda payload: add_saved_model(run, cfg, payload, smiles, y))
        return run.log(f"updated {run.path}")
    run.stage(1, 4, f"{len(smiles)} molecules ({data.info['n_dropped']} of {data.info['n_rows']} rows dropped): "
                    "features, duplicates, DeepChem check")
    dups = chemdata.duplicate_report(smiles, key=chemdata.canonical_smiles)
    tokens = [chemdata.tokenize_smiles(s) for s in smiles]
    fps = chemdata.morgan_fingerprints(smiles, radius=cfg["mlp"]["radius"], n_bits=cfg["mlp"]["n_bits"])
    fractions = [property_features.molecule_element_fractions(s) for s in smiles]
    dc_check = deepchem_check(data, run.log)
    idx = chemdata.random_split(smiles, seed=args.seed, key=chemdata.canonical_smiles)
    seeds = cfg["seeds_extended"] if run.extended else [args.seed]
    run.stage(2, 4, f"split {tuple(map(len, idx))}: Transformer and MLP, seeds {seeds}")
    runs, curves, mlp_skip = model_runs(run, cfg, tokens, y, idx, smiles, fps, seeds)
    run.stage(3, 4, "baselines and the saved model" + ("" if run.extended or common.QUICK else " (skipped)"))
    runs += baselines(cfg, y, idx, smiles, fractions, run)
    saved, saved_runs = saved_model(run, cfg, smiles, y, idx)
    runs += saved_runs
    run.stage(4, 4, "comparisons, summary and checks")
    results = {
        "data": {"n": len(smiles), "task": TASK, "units": UNITS, "info": data.info,
                 "duplicates": {k: v for k, v in dups.items() if k != "groups"},
                 "token_lengths": pc.length_stats(tokens),
                 "n_cut": sum(1 for t in tokens if len(t) + 2 > cfg["max_tokens"])},
        "splits": {"random": {"sizes": list(map(len, idx)), "splitter": "chemdata.random_split seed "
                              f"{args.seed}, canonical SMILES kept together"}},
        "deepchem_check": dc_check, "mlp": {"settings": cfg["mlp"], "skipped": mlp_skip},
        "runs": runs, "curves": curves, "saved_model": saved,
    }
    results = derived(results, cfg, smiles, idx, seeds)
    results["checks"].update(saved.get("checks", {}))
    pc.finish(run, results)


ADDED_TUTORIAL_SIZE = ("the comparison row at the tutorial's ~30k parameters with 16 molecules per Adam step "
                       "trained for every seed; the former d = 32 rows relabelled as variants; summary, comparisons "
                       "and checks recomputed from the stored predictions")


def add_tutorial_size(run, cfg, smiles, y):
    """--add-tutorial-size: in an existing results file written when the comparison row was the d = 32,
    one-molecule-per-step model, relabel those rows (OLD_LABELS; the saved model's row too), train the ~30k
    comparison row for every seed of the file, and recompute what ``derived`` gives; recorded under the
    payload's ``updates`` (``common.update_results``).  The split is the file's (seed from its payload)."""
    def update(payload):
        r, done = payload["results"], payload["config"]
        if any(x["model"] == SMALL or (x["model"] == PLAIN and "d_model" in x) for x in r["runs"]):
            raise ValueError(f"--add-tutorial-size: {run.path} already has the ~30k comparison row")
        for x in r["runs"]:
            x["model"] = OLD_LABELS.get(x["model"], x["model"])
        r["curves"] = {k.replace("/Transformer, early stopping/", f"/{SMALL_EARLY}/")
                        .replace("/Transformer/", f"/{SMALL}/"): v
                       for k, v in r["curves"].items()}
        if r.get("saved_model", {}).get("row") in OLD_LABELS:
            r["saved_model"]["row"] = OLD_LABELS[r["saved_model"]["row"]]
        idx = chemdata.random_split(smiles, seed=payload["seed"], key=chemdata.canonical_smiles)
        tokens = [chemdata.tokenize_smiles(s) for s in smiles]
        new = []
        for s in r["seeds"]:
            rec, fit, _ = transformer_run(run, cfg, tokens, y, idx, s, smiles, PLAIN)
            run.log(f"{PLAIN} seed {s} ({rec['n_params']:,} parameters): "
                    f"test RMSE {rec['metrics']['test']['rmse']:.3f}, R2 {rec['metrics']['test']['r2']:.3f}")
            new.append(rec)
            r["curves"][f"random/{PLAIN}/seed{s}"] = fit["curve"]
        r["runs"] = new + r["runs"]                  # the comparison row first, as a full run writes it
        done.update(transformer=cfg["transformer"], small=cfg["small"])
        derived(r, cfg, smiles, idx, r["seeds"])
    common.update_results(run.path, ADDED_TUTORIAL_SIZE, update)
    for path in glob.glob(run.checkpoint("transformer_s*")):     # only there to resume this call: stale now
        os.remove(path)


RESCORED = pc.RESCORED


def rescore(payload, smiles):
    """--rescore: summary, comparisons and checks again from the stored run records with the payload's own
    configuration and split (nothing is trained)."""
    r = payload["results"]
    idx = chemdata.random_split(smiles, seed=payload["seed"], key=chemdata.canonical_smiles)
    before = r["checks"]
    derived(r, payload["config"], smiles, idx, r["seeds"])
    r["checks"] = dict(before, **r["checks"])       # the saved model's checks stay (nothing about it changed)


def extra_args(p):
    pc.rescore_arg(p)
    p.add_argument("--add-tutorial-size", action="store_true",
                   help="train the ~30k comparison row into an existing results file whose comparison row is the "
                        "d = 32 one-molecule-per-step model (relabelled a variant); recorded under 'updates'")
    p.add_argument("--saved-model", action="store_true",
                   help="train the saved model (3 seeds of the comparison row on canonical SMILES), write it to "
                        "models/ and measure it through the predictor, into the existing results file; recorded "
                        "under 'updates'")


SKIPPED = sp.skipped_note("models/hopv_transformer.json")
ADDED_SAVED = sp.added_note("3 seeds of the comparison row's recipe on canonical SMILES",
                            "models/hopv_transformer.json")


def saved_model(run, cfg, smiles, y, idx, force=False):
    """(results.saved_model, the members' run records): ``saved_predictor.build`` with the comparison row's
    recipe (its width from the canonical vocabulary) in --extended and QUICK runs, or when ``force``d."""
    if not (force or run.extended or common.QUICK):
        return {"skipped": SKIPPED}, []
    return sp.build(run, SAVED, lambda vocab_size: row_config(cfg, PLAIN, vocab_size), smiles, y, idx,
                    pc.pick(smiles, idx[2]), seeds=cfg["saved_seeds"])


def add_saved_model(run, cfg, payload, smiles, y):
    """--saved-model: the saved model into an existing results file (``update_results`` records the call)."""
    r = payload["results"]
    idx = chemdata.random_split(smiles, seed=payload["seed"], key=chemdata.canonical_smiles)
    r["saved_model"], new = saved_model(run, cfg, smiles, y, idx, force=True)
    r["runs"] = sp.replace_rows(r["runs"], SAVED_ROW, new)
    derived(r, cfg, smiles, idx, r["seeds"])
    r["checks"].update(r["saved_model"]["checks"])
    payload["config"]["saved_seeds"] = cfg["saved_seeds"]


if __name__ == "__main__":
    main()
