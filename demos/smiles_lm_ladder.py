"""Experiment 4's recipe ladder (``demo_smiles_lm.py --extended``, or ``--add-ladder`` into a results file).

Is "the n-gram beats the Transformer" a statement about the model or about its recipe?  The tutorial's
own advice for small data is applied one rung at a time, at the tutorial's model size (39,360 parameters),
3 seeds per rung, every rung's test bits per molecule paired against the tuned n-gram's:

1. ``tutorial``        the tutorial's recipe (6 epochs, the loss = mean over molecules of each one's token mean);
2. ``per_token``       + the loss averaged over the batch's tokens (the metric is per token);
3. ``early_stopping``  + up to MAX_EPOCHS epochs, the epoch with the lowest validation bits/token restored
                       (``property_common.best_epoch``, patience PATIENCE: experiments 6-8's rule);
4. ``dropout``         + inverted dropout, its rate chosen on validation from DROPOUT_RATES (the tutorial's
                       §6.5 range: mean validation bits/token over the seeds);
5. ``augmentation``    + a fresh randomized SMILES spelling of each training molecule every epoch
                       (``property_features.randomized_smiles``, rng from seed, epoch and molecule); scored on the
                       test split's own spellings, as every other row.

Engine: ``torch_bridge.train_torch`` (float64, one thread per job, two jobs at a time), the same model and
recipe as ``transformer.train`` (``tests_torch_bridge`` proves the trajectories equal); the tutorial rung at
seed 0 is checked against the core's own run (``tutorial_rung_check``).  Its dropout masks come from torch's
RNG, not the core's: the dropout rungs are not bit-identical to a core run, only the same recipe.

The verdict per rung (``beats_ngram``): "better" when the paired bootstrap of (rung - n-gram) bits per
molecule, pooled over the seeds with molecules as the resampled items, lies below 0 AND the gap in test
bits/token exceeds the seeds' spread (max - min); "worse" the mirror; else "level".
"""
import copy
import io
import math
import time

import common

core = common.core
import chemdata  # noqa: E402  (imported after the sys.path set-up above)
import evaluation  # noqa: E402  (imported after the sys.path set-up above)
import property_features  # noqa: E402  (imported after the sys.path set-up above)
import property_common  # noqa: E402  (best_epoch: the one early-stopping rule)
import safe_io  # noqa: E402  (imported after the sys.path set-up above)

RUNGS = ("tutorial", "per_token", "early_stopping", "dropout", "augmentation")
SEEDS = (0, 1, 2)
MAX_EPOCHS = 40
PATIENCE = 5
DROPOUT_RATES = (0.05, 0.1, 0.2)
QUICK = dict(seeds=(0, 1), max_epochs=3, patience=1, rates=(0.1, 0.2))
LN2 = math.log(2.0)


def sizes(quick):
    """(seeds, max epochs, patience, dropout rates) of a run."""
    if quick:
        return QUICK["seeds"], QUICK["max_epochs"], QUICK["patience"], QUICK["rates"]
    return SEEDS, MAX_EPOCHS, PATIENCE, DROPOUT_RATES


def recipe(rung, config, max_epochs, rate=0.0):
    """The training recipe of one rung (each adds one change to the one before)."""
    k = RUNGS.index(rung)
    return {"rung": rung, "epochs": config["epochs"] if k < 2 else max_epochs,
            "loss_reduction": "token" if k >= 1 else "sample", "early_stopping": k >= 2,
            "dropout": rate if k >= 3 else 0.0, "augment": k >= 4}


# ----------------------------------------------------------------------------- scoring (torch, no gradient)


def molecule_nats(module, ids):
    """Summed next-token nats of each encoded molecule (targets ids[1:]), in eval mode."""
    import torch
    module.eval()
    out = []
    with torch.no_grad():
        for x in ids:
            logp = torch.log_softmax(module(list(x[:-1])), dim=-1)           # (T, V)
            out.append(-float(logp[range(len(x) - 1), list(x[1:])].sum()))
    return out


def bits_per_token(module, ids):
    """Token-weighted bits/token of a split (every target after <bos>, <eos> included)."""
    return math.fsum(molecule_nats(module, ids)) / LN2 / sum(len(x) - 1 for x in ids)


# ----------------------------------------------------------------------------- one training


def respeller(smiles, vocab):
    """augment(i, rng) for train_torch: molecule i of ``smiles`` in a fresh random spelling, encoded."""
    def augment(i, rng):
        spelled = property_features.randomized_smiles(smiles[i], 1, rng)[0]
        return vocab.encode(chemdata.tokenize_smiles(spelled))
    augment.__qualname__ = "randomized_smiles"
    return augment


def train_job(job, ctx):
    """Train one (rung, seed, rate) with torch_bridge; returns its record with per-molecule test bits."""
    import torch
    import torch_bridge as tb
    torch.set_num_threads(1)
    r, seed, config = job["recipe"], job["seed"], ctx["config"]
    model = ctx["make_model"](config, len(ctx["vocab"]), seed, dropout=r["dropout"])
    dtype = ctx.get("dtype", torch.float64)                             # experiment 10 trains in float32
    module = tb.to_torch(model, dtype=dtype)
    curve, snaps = [], {}

    def epoch_fn(mod, epoch):
        bits = bits_per_token(mod, ctx["ids"]["valid"])
        curve.append({"epoch": epoch, "valid_bits_per_token": bits})
        snaps[epoch] = copy.deepcopy(mod.state_dict())
        best = property_common.best_epoch(curve, None, key="valid_bits_per_token")["epoch"]
        stop = r["early_stopping"] and epoch - best >= ctx["patience"]    # best_epoch's patience rule, live
        return {"valid_bits_per_token": bits, "stop": stop}

    t0 = time.perf_counter()
    augment = respeller(ctx["smiles"]["train"], ctx["vocab"]) if r["augment"] else None
    tb.train_torch(module, ctx["ids"]["train"], core.lm_loss, epochs=r["epochs"], batch_size=config["batch_size"],
                   lr=config["lr"], warmup=config["warmup"], clip=config["clip"], seed=seed,
                   loss_reduction=r["loss_reduction"], augment=augment, epoch_fn=epoch_fn, verbose=False)
    chosen = (property_common.best_epoch(curve, ctx["patience"], key="valid_bits_per_token") if r["early_stopping"]
              else {"epoch": curve[-1]["epoch"], "value": curve[-1]["valid_bits_per_token"],
                    "stopped_at": curve[-1]["epoch"], "patience": None})
    module.load_state_dict(snaps[chosen["epoch"]])
    nats = molecule_nats(module, ctx["ids"]["test"])
    if job.get("save_to"):                                              # the restored epoch, for sampling later
        buf = io.BytesIO()
        torch.save(module.state_dict(), buf)
        safe_io.atomic_write(job["save_to"], buf.getvalue())
    n_tok = sum(len(x) - 1 for x in ctx["ids"]["test"])
    return {"rung": r["rung"], "seed": seed, "dropout": r["dropout"], "recipe": r, "curve": curve,
            "chosen": chosen, "valid_bits_per_token": chosen["value"],
            "test_bits_per_token": math.fsum(nats) / LN2 / n_tok, "test_molecule_bits": [x / LN2 for x in nats],
            "train_wall_time_s": time.perf_counter() - t0, "engine": f"torch_bridge (torch {torch.__version__}, "
                                                                    f"{str(dtype).split('.')[-1]}, 1 thread)",
            "weights": ({k: p.data for k, p in tb.from_torch(module).named_params().items()} if job.get("keep")
                        else None)}


def run_jobs(jobs, ctx, workers, tag):
    """Every job on forked workers (two at a time on two cores), results in job order."""
    return core.parallel_map(lambda job, rng: train_job(job, ctx), jobs, workers=workers, progress=tag)


# ----------------------------------------------------------------------------- verdicts


def verdict_of(interval, gap, spread):
    """The project's rule against the n-gram: 'better' when the paired interval lies below 0 AND the gap in
    bits/token is beyond the seed spread; 'worse' the mirror; else 'level'."""
    if interval["ci_high"] < 0 and -gap > spread:
        return "better"
    return "worse" if interval["ci_low"] > 0 and gap > spread else "level"


def beats_ngram(records, ngram_bits, ngram_bpt):
    """A rung's seeds against the n-gram: pooled paired bootstrap (rung - n-gram bits/molecule, molecules
    resampled with every seed's prediction), per-seed intervals, the gap in bits/token and the seed spread;
    verdict 'better' / 'worse' only when the interval excludes 0 AND |gap| > spread, else 'level'."""
    pooled_a = [b for r in records for b in r["test_molecule_bits"]]
    pooled_b = list(ngram_bits) * len(records)
    groups = list(range(len(ngram_bits))) * len(records)
    test = evaluation.paired_bootstrap(None, pooled_a, pooled_b, metric="mean", seed=0, groups=groups)
    per_seed = {str(r["seed"]): evaluation.paired_bootstrap(None, r["test_molecule_bits"], ngram_bits,
                                                            metric="mean", seed=0) for r in records}
    bpt = [r["test_bits_per_token"] for r in records]
    mean = sum(bpt) / len(bpt)
    gap, spread = mean - ngram_bpt, evaluation.seed_spread(bpt)     # the n-gram is deterministic: one side
    verdict = verdict_of(test, gap, spread)
    return {"paired_bootstrap": test, "per_seed": per_seed, "test_bits_per_token": {"mean": mean, "min": min(bpt),
            "max": max(bpt), "seeds": bpt}, "gap_bits_per_token": gap, "seed_spread": spread, "verdict": verdict,
            "rule": "better: pooled paired interval (bits/molecule, molecules resampled) below 0 and the gap in "
                    "bits/token larger than the seeds' spread (max - min); worse: the mirror; else level"}


def choose_rate(records):
    """The dropout rate with the lowest mean validation bits/token over its seeds: (rate, table)."""
    table = {}
    for r in records:
        table.setdefault(r["dropout"], []).append(r["valid_bits_per_token"])
    means = {rate: sum(v) / len(v) for rate, v in table.items()}
    best = min(sorted(means), key=means.get)
    return best, [{"rate": rate, "valid_bits_per_token": means[rate], "seeds": table[rate]} for rate in sorted(means)]


def tutorial_rung_check(ladder, core_fit):
    """The tutorial rung at seed 0 (torch) against the core's own seed-0 run: test bits/token equal to
    rounding when the two engines follow the same trajectory."""
    mine = next(r for r in ladder["runs"] if r["rung"] == "tutorial" and r["seed"] == 0)
    core_bits = core_fit["test"]["bits_per_token"]
    return {"torch": mine["test_bits_per_token"], "core": core_bits,
            "abs_diff": abs(mine["test_bits_per_token"] - core_bits),
            "agree": abs(mine["test_bits_per_token"] - core_bits) <= 1e-6}


# ----------------------------------------------------------------------------- the ladder


def run_ladder(ctx, workers, run, quick):
    """Phase 1: rungs 1-3 and every dropout rate; phase 2: augmentation at the chosen rate.  Each phase is
    resumable (``run.resumable``).  Returns the ladder record (runs, rates, rung verdicts come later)."""
    seeds, max_epochs, patience, rates = sizes(quick)
    ctx = dict(ctx, patience=patience)
    config = ctx["config"]
    jobs = [{"recipe": recipe(rung, config, max_epochs), "seed": s, "keep": s == seeds[0]}
            for rung in RUNGS[:3] for s in seeds]
    jobs += [{"recipe": recipe("dropout", config, max_epochs, rate), "seed": s, "keep": s == seeds[0]}
             for rate in rates for s in seeds]
    t0 = time.perf_counter()
    first = run.resumable("ladder_phase1", lambda: run_jobs(jobs, ctx, workers, "ladder 1-4"))
    rate, rate_table = choose_rate([r for r in first if r["rung"] == "dropout"])
    run.log(f"  ladder: dropout rate {rate} chosen on validation ({rate_table})")
    aug = [{"recipe": recipe("augmentation", config, max_epochs, rate), "seed": s, "keep": s == seeds[0]}
           for s in seeds]
    second = run.resumable(f"ladder_phase2_rate{rate}", lambda: run_jobs(aug, ctx, workers, "ladder 5"))
    runs = [r for r in first if r["rung"] != "dropout" or r["dropout"] == rate] + second
    others = [dict(r, test_molecule_bits=None, weights=None) for r in first
              if r["rung"] == "dropout" and r["dropout"] != rate]
    return {"seeds": list(seeds), "max_epochs": max_epochs, "patience": patience, "dropout_rates": list(rates),
            "dropout_rate": rate, "rate_table": rate_table, "runs": runs, "other_rates": others,
            "wall_time_s": time.perf_counter() - t0, "engine": runs[0]["engine"]}


def rung_table(ladder, ngram_bits, ngram_bpt):
    """One row per rung: its seeds' numbers and the verdict against the n-gram."""
    rows = []
    for rung in RUNGS:
        recs = [r for r in ladder["runs"] if r["rung"] == rung]
        row = {"rung": rung, "recipe": recs[0]["recipe"], "epochs_chosen": [r["chosen"]["epoch"] for r in recs],
               "valid_bits_per_token": [r["valid_bits_per_token"] for r in recs]}
        row.update(beats_ngram(recs, ngram_bits, ngram_bpt))
        rows.append(row)
    return rows


def first_better(rows):
    """The first rung whose verdict is 'better' (None when none is)."""
    return next((r["rung"] for r in rows if r["verdict"] == "better"), None)


def best_rung(rows):
    """The rung with the lowest mean test bits/token (the one sampled beside the tutorial recipe's)."""
    return min(rows, key=lambda r: r["test_bits_per_token"]["mean"])["rung"]
